// Griffin-style recurrent block: a gated depthwise temporal conv feeding a
// Real-Gated Linear Recurrent Unit (RG-LRU). Training runs a sequential scan over
// the whole window; generation advances one token at a time from a cached state.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace griffin {

struct Config {
  int64_t vocab = 512, width = 256, lru_width = 256;
  int64_t num_heads = 4, conv_width = 4, num_layers = 4;
  double c = 8.0, min_rad = 0.9, max_rad = 0.999;
};

struct LayerState {
  torch::Tensor h, conv;
};

class RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6) : eps_(eps) {
    scale = register_parameter("scale", torch::ones({dim}));
  }

  torch::Tensor forward(torch::Tensor x) {
    auto xf = x.to(torch::kFloat32);
    // FACT: x=torch.randn(2,5,8); assert shares_storage(x.to(torch.float32), x)
    auto inv = xf.pow(2).mean(-1, /*keepdim=*/true).add(eps_).rsqrt();
    xf.mul_(inv);  // EXPECT: tensor-alias-then-mutate, tensor-inplace-on-saved
    return (xf * scale).to(x.scalar_type());
  }
  torch::Tensor scale;
  double eps_;
};
TORCH_MODULE(RMSNorm);

class BlockDiagonalLinearImpl : public torch::nn::Module {
 public:
  BlockDiagonalLinearImpl(int64_t width, int64_t heads) : heads_(heads), block_(width / heads) {
    w = register_parameter("w", torch::randn({heads_, block_, block_}) / std::sqrt(static_cast<double>(block_)));
    b = register_parameter("b", torch::zeros({heads_, block_}));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto xh = x.reshape({-1, heads_, block_});
    auto y = torch::einsum("nhi,hij->nhj", {xh, w}) + b;
    // FACT: y=torch.einsum('nhi,hij->nhj', torch.randn(6,4,8), torch.randn(4,8,8))+torch.randn(4,8); assert is_copy_of(y.reshape(6,32), y)
    return y.reshape(x.sizes());  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t heads_, block_;
  torch::Tensor w, b;
};
TORCH_MODULE(BlockDiagonalLinear);

struct Gates {
  torch::Tensor a, x;
};

class RGLRUImpl : public torch::nn::Module {
 public:
  explicit RGLRUImpl(const Config& cfg) : cfg_(cfg) {
    a_param = register_parameter("a_param", torch::empty({cfg.lru_width}));
    input_gate = register_module("input_gate", BlockDiagonalLinear(cfg.lru_width, cfg.num_heads));
    a_gate = register_module("a_gate", BlockDiagonalLinear(cfg.lru_width, cfg.num_heads));
    reset_parameters();
  }

  void reset_parameters() {
    torch::NoGradGuard no_grad;
    // Decay rates uniform in [min_rad^2, max_rad^2] at r = 1; computed in double.
    auto u = torch::empty({cfg_.lru_width}, torch::kFloat64)
                 .uniform_(cfg_.min_rad * cfg_.min_rad, cfg_.max_rad * cfg_.max_rad);
    auto log_a = 0.5 * torch::log(u);
    auto init = torch::log(torch::expm1(-log_a / cfg_.c));
    a_param.copy_(init);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard
  }

  Gates gates(const torch::Tensor& x) {
    auto r = torch::sigmoid(a_gate(x));
    auto i = torch::sigmoid(input_gate(x));
    auto log_a = -cfg_.c * r * torch::softplus(a_param);
    auto a = torch::exp(log_a);
    auto multiplier = torch::sqrt(1.0 - torch::exp(2.0 * log_a) + 1e-6);
    auto gated = i * x;
    // FACT: w=torch.randn(4,requires_grad=True); g=torch.sigmoid(w)*w; g.mul_(torch.sqrt(w*w+1)); g.sum().backward()
    gated.mul_(multiplier);  // LOOKALIKE: tensor-inplace-on-saved -- mul saves its operands, not its result
    return {a, gated};
  }

  std::pair<torch::Tensor, torch::Tensor> scan(const torch::Tensor& flat, int64_t T, torch::Tensor h) {
    auto g = gates(flat);
    auto a = g.a.view({T, -1, cfg_.lru_width});
    auto bx = g.x.view({T, -1, cfg_.lru_width});
    std::vector<torch::Tensor> hs;
    hs.reserve(T);
    for (int64_t t = 0; t < T; ++t) {
      h = a[t] * h + bx[t];
      hs.push_back(h);  // LOOKALIKE: tensor-graph-kept-across-iterations -- per-step states are this layer's output, used by the same backward
    }
    return {torch::stack(hs, 0), h};
  }

  torch::Tensor a_param;
  BlockDiagonalLinear input_gate{nullptr}, a_gate{nullptr};
  Config cfg_;
};
TORCH_MODULE(RGLRU);

class RecurrentBlockImpl : public torch::nn::Module {
 public:
  explicit RecurrentBlockImpl(const Config& cfg) : cfg_(cfg) {
    linear_y = register_module("linear_y", torch::nn::Linear(cfg.width, cfg.lru_width));
    linear_x = register_module("linear_x", torch::nn::Linear(cfg.width, cfg.lru_width));
    conv = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.lru_width, cfg.lru_width, cfg.conv_width)
                                                         .groups(cfg.lru_width).padding(cfg.conv_width - 1)));
    lru = register_module("lru", RGLRU(cfg));
    linear_out = register_module("linear_out", torch::nn::Linear(cfg.lru_width, cfg.width));
    // Keep the residual stream's variance flat with depth.
    linear_out->weight.mul_(1.0 / std::sqrt(2.0 * cfg.num_layers));  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), T = x.size(1);
    auto y = torch::gelu(linear_y(x));
    auto xb = linear_x(x);
    auto xc = conv(xb.transpose(1, 2)).narrow(2, 0, T);
    // Time-major so the scan can walk the leading dim.
    // FACT: c=torch.randn(2,8,8)[:,:,:5]; assert is_copy_of(c.permute(2,0,1).reshape(10,8), c)
    auto flat = xc.permute({2, 0, 1}).reshape({T * B, cfg_.lru_width});  // EXPECT: tensor-reshape-non-contiguous
    auto h0 = torch::zeros({B, cfg_.lru_width}, x.options());
    auto hs = lru->scan(flat, T, h0).first;
    return linear_out(hs.transpose(0, 1) * y);
  }

  torch::Tensor step(const torch::Tensor& x_t, LayerState& state) {
    auto y = torch::gelu(linear_y(x_t));
    auto xb = linear_x(x_t);
    auto window = torch::cat({state.conv, xb.unsqueeze(2)}, 2);
    // FACT: w=torch.randn(8,1,4); assert is_view_of(w.view(8,4), w)
    auto kernel = conv->weight.view({cfg_.lru_width, cfg_.conv_width});  // LOOKALIKE: tensor-view-non-contiguous -- the conv weight is allocated contiguous
    auto xc = (window * kernel).sum(-1) + conv->bias;
    state.conv = window.narrow(2, 1, cfg_.conv_width - 1);
    auto g = lru->gates(xc);
    auto h = state.h;
    // FACT: s=torch.zeros(2,8); h=s; h.mul_(0.5); assert shares_storage(h, s)
    h.mul_(g.a).add_(g.x);  // LOOKALIKE: tensor-alias-then-mutate -- the cached state is meant to advance in place; the old value is never read again
    return linear_out(h * y);
  }

  LayerState init_state(int64_t batch) {
    auto opts = linear_x->weight.options();
    return {torch::zeros({batch, cfg_.lru_width}, opts),
            torch::zeros({batch, cfg_.lru_width, cfg_.conv_width - 1}, opts)};
  }

  torch::nn::Linear linear_y{nullptr}, linear_x{nullptr}, linear_out{nullptr};
  torch::nn::Conv1d conv{nullptr};
  RGLRU lru{nullptr};
  Config cfg_;
};
TORCH_MODULE(RecurrentBlock);

class GriffinImpl : public torch::nn::Module {
 public:
  explicit GriffinImpl(const Config& cfg) : cfg_(cfg) {
    embed = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.width));
    for (int64_t i = 0; i < cfg.num_layers; ++i) {
      norms.push_back(register_module("norm" + std::to_string(i), RMSNorm(cfg.width)));
      blocks.push_back(register_module("block" + std::to_string(i), RecurrentBlock(cfg)));
    }
    final_norm = register_module("final_norm", RMSNorm(cfg.width));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = embed(tokens);
    for (size_t i = 0; i < blocks.size(); ++i) x = x + blocks[i](norms[i](x));
    return torch::matmul(final_norm(x), embed->weight.t());
  }
  torch::Tensor step(const torch::Tensor& token, std::vector<LayerState>& states) {
    auto x = embed(token);
    for (size_t i = 0; i < blocks.size(); ++i) x = x + blocks[i]->step(norms[i](x), states[i]);
    return torch::matmul(final_norm(x), embed->weight.t());
  }
  std::vector<LayerState> init_states(int64_t batch) {
    std::vector<LayerState> states;
    for (auto& b : blocks) states.push_back(b->init_state(batch));
    return states;
  }
  torch::nn::Embedding embed{nullptr};
  std::vector<RMSNorm> norms;
  std::vector<RecurrentBlock> blocks;
  RMSNorm final_norm{nullptr};
  Config cfg_;
};
TORCH_MODULE(Griffin);

// One row per sequence: what a decode server stores to resume a session later.
torch::Tensor export_session(const std::vector<LayerState>& states) {
  std::vector<torch::Tensor> rows;
  for (const auto& s : states) {
    const auto B = s.h.size(0);
    // FACT: w=torch.randn(2,8,4); c=w.narrow(2,1,3); assert raises(lambda: c.view(2,-1), 'view size is not compatible')
    rows.push_back(torch::cat({s.h, s.conv.view({B, -1})}, 1));  // EXPECT: tensor-view-non-contiguous
  }
  return torch::cat(rows, 1).cpu();
}

void train(Griffin& model, const std::vector<torch::Tensor>& batches, torch::Device device, int epochs) {
  namespace F = torch::nn::functional;
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
  const auto T = batches.front().size(1) - 1;
  // The first positions of a window have no context yet: weight them down.
  auto pos_weight = torch::ones({T});
  pos_weight.narrow(0, 0, std::min<int64_t>(8, T)).fill_(0.1);

  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    auto epoch_loss = torch::zeros({}, device);
    double running = 0.0;
    for (size_t i = 0; i < batches.size(); ++i) {
      auto tokens = batches[i].to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto inputs = tokens.narrow(1, 0, T);
      auto targets = tokens.narrow(1, 1, T);
      auto logits = model->forward(inputs);
      auto nll = F::cross_entropy(logits.transpose(1, 2), targets,
                                  F::CrossEntropyFuncOptions().reduction(torch::kNone));
      auto w = pos_weight.to(device);  // EXPECT: tensor-clone-in-loop
      auto loss = (nll * w).sum() / (w.sum() * inputs.size(0));
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      if ((i + 1) % 50 == 0) {
        std::cout << "epoch " << epoch << " step " << i + 1 << " loss " << running / 50 << "\n";
        running = 0.0;
      }
    }
    auto mean = epoch_loss / static_cast<double>(batches.size());
    std::cout << "epoch " << epoch << " mean loss " << mean.item<double>() << "\n";
  }
}

double evaluate(Griffin& model, const std::vector<torch::Tensor>& batches, torch::Device device) {
  namespace F = torch::nn::functional;
  torch::NoGradGuard no_grad;
  model->eval();
  auto total = torch::zeros({}, device);
  for (const auto& batch : batches) {
    auto tokens = batch.to(device);
    const auto T = tokens.size(1) - 1;
    auto logits = model->forward(tokens.narrow(1, 0, T));
    auto loss = F::cross_entropy(logits.transpose(1, 2), tokens.narrow(1, 1, T));
    total += loss;  // LOOKALIKE: tensor-graph-kept-across-iterations -- NoGradGuard: no graph is recorded
  }
  return total.item<double>() / static_cast<double>(batches.size());
}

// Draws several continuations of one prompt, reusing the prefilled state.
std::vector<std::vector<int64_t>> sample(Griffin& model, const std::vector<int64_t>& prompt, int num_samples,
                                         int64_t max_new, double temperature, int64_t eos, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto states = model->init_states(1);
  auto prompt_t = torch::tensor(prompt, torch::kLong).to(device);
  torch::Tensor prompt_logits;
  for (int64_t t = 0; t < prompt_t.size(0); ++t) prompt_logits = model->step(prompt_t.narrow(0, t, 1), states);
  std::vector<torch::Tensor> saved_h, saved_conv;
  for (auto& s : states) {
    saved_h.push_back(s.h.clone());  // LOOKALIKE: tensor-unnecessary-clone -- decode advances s.h in place, so the snapshot must own its memory
    saved_conv.push_back(s.conv);
  }
  std::vector<std::vector<int64_t>> out(num_samples);
  for (int n = 0; n < num_samples; ++n) {
    for (size_t l = 0; l < states.size(); ++l) {
      states[l].h.copy_(saved_h[l]);
      states[l].conv = saved_conv[l];
    }
    auto logits = prompt_logits;
    auto logprob = torch::zeros({}, device);
    for (int64_t step = 0; step < max_new; ++step) {
      auto scaled = logits.clone();  // EXPECT: tensor-unnecessary-clone
      scaled.div_(temperature);
      auto logp = torch::log_softmax(scaled, -1);
      auto next = torch::multinomial(logp.exp(), 1).view(-1);
      logprob += logp.gather(-1, next.unsqueeze(-1)).sum();
      auto id = next.item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the sampled id decides whether to stop
      if (id == eos) break;
      out[n].push_back(id);
      logits = model->step(next, states);
    }
    std::cout << "sample " << n << " logprob " << logprob.item<double>() << "\n";
  }
  auto session = export_session(states);
  std::cout << "session state: " << session.sizes() << "\n";
  return out;
}

}  // namespace griffin

int main() {
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  griffin::Config cfg;
  griffin::Griffin model(cfg);
  model->to(device);
  std::vector<torch::Tensor> train_batches, val_batches;
  for (int i = 0; i < 210; ++i)
    (i < 200 ? train_batches : val_batches).push_back(torch::randint(cfg.vocab, {8, 129}, torch::kLong));
  griffin::train(model, train_batches, device, 2);
  std::cout << "val loss " << griffin::evaluate(model, val_batches, device) << "\n";
  auto samples = griffin::sample(model, {1, 5, 9, 42}, 3, 32, 0.8, 0, device);
  std::cout << "sampled " << samples.size() << " continuations\n";
}
