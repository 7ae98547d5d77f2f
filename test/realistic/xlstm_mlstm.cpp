// mLSTM language model (xLSTM): matrix memory C, normaliser n and stabiliser m
// with exponential input and forget gates. Training uses the stabilised parallel
// form; prefill and generation use the recurrent form with a carried state.
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace xlstm {
namespace F = torch::nn::functional;

struct Config {
  int64_t vocab = 1024, embed_dim = 256, num_heads = 4;
  int64_t conv_kernel = 4, num_blocks = 4, context = 256;
  double proj_factor = 2.0;
  int64_t inner() const { return static_cast<int64_t>(proj_factor * embed_dim); }
};

struct MLSTMState {
  torch::Tensor C, n, m;
  torch::Tensor conv;
};

torch::Tensor parallel_mlstm(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& igate, const torch::Tensor& fgate, double eps = 1e-6) {
  const auto T = q.size(2), Dh = q.size(3);
  auto causal = torch::ones({T, T}, q.options().dtype(torch::kBool)).tril();
  auto log_f_cum = torch::cumsum(torch::log_sigmoid(fgate), -1);
  auto log_d = log_f_cum.unsqueeze(-1) - log_f_cum.unsqueeze(-2);
  // FACT: assert not raises(lambda: (torch.randn(2,4,1)-torch.randn(2,1,4)).add_(torch.randn(2,1,4).expand(2,4,4)))
  log_d.add_(igate.unsqueeze(-2).expand_as(log_d));  // LOOKALIKE: tensor-inplace-on-expanded -- only the source is expanded; log_d is a fresh full-size tensor
  auto m = std::get<0>(log_d.masked_fill(~causal, -std::numeric_limits<float>::infinity()).max(-1, true));
  auto d = torch::exp(log_d - m);
  // FACT: assert backward_fails(lambda: (lambda d: (d.masked_fill_(torch.ones(3,3).triu(1).bool(), 0.0), d.sum().backward()))(torch.exp(torch.randn(3,3, requires_grad=True))))
  d.masked_fill_(~causal, 0.0);  // EXPECT: tensor-inplace-on-saved
  auto qk = torch::matmul(q, k.transpose(-2, -1));
  // FACT: q=torch.randn(2,3,4,requires_grad=True); s=torch.matmul(q,q.transpose(-2,-1)); s.div_(2.0); (s*torch.rand(3,3)).sum().backward()
  qk.div_(std::sqrt(static_cast<double>(Dh)));  // LOOKALIKE: tensor-inplace-on-saved -- matmul does not save its result; the mul below saves the scaled one
  auto c = qk * d;
  auto normaliser = torch::maximum(c.sum(-1, true).abs(), torch::exp(-m));
  return torch::matmul(c / (normaliser + eps), v);
}

std::tuple<torch::Tensor, MLSTMState> recurrent_mlstm(const torch::Tensor& q, const torch::Tensor& k,
                                                      const torch::Tensor& v, const torch::Tensor& igate,
                                                      const torch::Tensor& fgate, MLSTMState state) {
  const auto B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3);
  if (!state.C.defined()) {
    // Empty memory is the same for every sequence until the first write.
    state.C = torch::zeros({1, H, Dh, Dh}, q.options()).expand({B, H, Dh, Dh});
    state.n = torch::zeros({1, H, Dh}, q.options()).expand({B, H, Dh});
    state.m = torch::zeros({B, H, 1}, q.options());
  }
  auto log_f = torch::log_sigmoid(fgate);
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  std::vector<torch::Tensor> hs;
  for (int64_t t = 0; t < T; ++t) {
    auto q_t = q.select(2, t), k_t = k.select(2, t) * scale, v_t = v.select(2, t);
    auto lf = log_f.select(2, t).unsqueeze(-1), ig = igate.select(2, t).unsqueeze(-1);
    auto m_new = torch::maximum(lf + state.m, ig);
    auto i_t = torch::exp(ig - m_new);
    auto f_t = torch::exp(lf + state.m - m_new);
    // FACT: assert raises(lambda: torch.zeros(1,2,4,4).expand(3,2,4,4).mul_(torch.rand(3,2,1,1)), 'more than one element')
    state.C.mul_(f_t.unsqueeze(-1)).add_(i_t.unsqueeze(-1) * v_t.unsqueeze(-1) * k_t.unsqueeze(-2));  // EXPECT: tensor-inplace-on-expanded
    state.n = f_t * state.n + i_t * k_t;
    state.m = m_new;
    auto num = torch::matmul(state.C, q_t.unsqueeze(-1)).squeeze(-1);
    auto den = torch::maximum((state.n * q_t).sum(-1, true).abs(), torch::exp(-state.m));
    hs.push_back(num / (den + 1e-6));
  }
  return {torch::stack(hs, 2), state};
}

class MLSTMLayerImpl : public torch::nn::Module {
 public:
  explicit MLSTMLayerImpl(const Config& cfg) : heads_(cfg.num_heads), inner_(cfg.inner()), K_(cfg.conv_kernel) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.embed_dim})));
    up = register_module("up", torch::nn::Linear(cfg.embed_dim, 2 * inner_));
    conv = register_module("conv", torch::nn::Conv1d(
        torch::nn::Conv1dOptions(inner_, inner_, K_).groups(inner_).padding(K_ - 1)));
    q_proj = register_module("q_proj", torch::nn::Linear(inner_, inner_));
    k_proj = register_module("k_proj", torch::nn::Linear(inner_, inner_));
    v_proj = register_module("v_proj", torch::nn::Linear(inner_, inner_));
    igate = register_module("igate", torch::nn::Linear(3 * inner_, heads_));
    fgate = register_module("fgate", torch::nn::Linear(3 * inner_, heads_));
    outnorm = register_module("outnorm", torch::nn::GroupNorm(heads_, inner_));
    skip = register_parameter("skip", torch::ones({inner_}));
    down = register_module("down", torch::nn::Linear(inner_, cfg.embed_dim));
    torch::NoGradGuard no_grad;
    fgate->bias.copy_(torch::linspace(3.0, 6.0, heads_));  // LOOKALIKE: tensor-inplace-on-leaf -- init under NoGradGuard
    igate->bias.normal_(0.0, 0.1);
  }

  torch::Tensor heads(const torch::Tensor& x) const {
    return x.view({x.size(0), x.size(1), heads_, -1}).transpose(1, 2);
  }

  torch::Tensor forward(const torch::Tensor& x, MLSTMState* state = nullptr) {
    const auto B = x.size(0), T = x.size(1);
    auto residual = x.clone();  // EXPECT: tensor-unnecessary-clone
    auto xz = up(norm(x)).chunk(2, -1);
    auto x_in = xz[0], z = xz[1];
    auto x_conv = torch::silu(conv(x_in.transpose(1, 2)).narrow(2, 0, T).transpose(1, 2));
    auto qp = q_proj(x_conv), kp = k_proj(x_conv), vp = v_proj(x_in);
    auto gate_in = torch::cat({qp, kp, vp}, -1);
    auto i_pre = igate(gate_in).transpose(1, 2);
    auto f_pre = fgate(gate_in).transpose(1, 2);
    if (track_gates) {
      auto f_seen = f_pre.detach();
      forget_open = f_seen.sigmoid_().mean();  // EXPECT: tensor-inplace-on-detached
    }
    torch::Tensor h;
    if (state) {
      std::tie(h, *state) = recurrent_mlstm(heads(qp), heads(kp), heads(vp), i_pre, f_pre, *state);
      // FACT: x=torch.randn(2,6,8); c=torch.zeros(2,8,4); assert not shares_storage(c, x.narrow(1,2,4).transpose(1,2))
      state->conv.copy_(x_in.narrow(1, T - K_, K_).transpose(1, 2));  // LOOKALIKE: tensor-inplace-overlap -- the source is this call's activations, not the state buffer
    } else {
      h = parallel_mlstm(heads(qp), heads(kp), heads(vp), i_pre, f_pre);
    }
    // FACT: h=torch.randn(2,4,5,8).transpose(1,2); assert is_copy_of(h.reshape(2,5,32), h)
    auto h_flat = h.transpose(1, 2).reshape({B, T, inner_});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: h=torch.randn(2,5,32); assert is_view_of(h.view(10,32), h)
    auto hn = outnorm(h_flat.view({B * T, inner_})).view({B, T, inner_});  // LOOKALIKE: tensor-view-non-contiguous -- reshape just produced a contiguous tensor
    return residual + down((hn + skip * x_conv) * torch::silu(z));
  }

  torch::Tensor step(const torch::Tensor& x_t, MLSTMState& state) {
    const auto B = x_t.size(0);
    auto xz = up(norm(x_t)).chunk(2, -1);
    auto x_in = xz[0].squeeze(1), z = xz[1].squeeze(1);
    // FACT: b=torch.randn(2,6,4); assert shares_storage(b.narrow(2,0,3), b.narrow(2,1,3)) and not raises(lambda: b.narrow(2,0,3).copy_(b.narrow(2,1,3)))
    state.conv.narrow(2, 0, K_ - 1).copy_(state.conv.narrow(2, 1, K_ - 1));  // EXPECT: tensor-inplace-overlap
    state.conv.select(2, K_ - 1).copy_(x_in);
    auto x_conv = torch::silu((state.conv * conv->weight.squeeze(1)).sum(-1) + conv->bias);
    auto qp = q_proj(x_conv), kp = k_proj(x_conv), vp = v_proj(x_in);
    auto gate_in = torch::cat({qp, kp, vp}, -1);
    auto i_pre = igate(gate_in).unsqueeze(-1), f_pre = fgate(gate_in).unsqueeze(-1);
    torch::Tensor h;
    std::tie(h, state) = recurrent_mlstm(heads(qp.unsqueeze(1)), heads(kp.unsqueeze(1)),
                                         heads(vp.unsqueeze(1)), i_pre, f_pre, state);
    // FACT: h=torch.randn(2,4,1,8).transpose(1,2); assert is_view_of(h.reshape(2,1,32), h)
    auto h_flat = h.transpose(1, 2).reshape({B, 1, inner_});  // LOOKALIKE: tensor-reshape-non-contiguous -- one step: the transposed dim has size 1, so this is a view
    auto hn = outnorm(h_flat.view({B, inner_}));
    return x_t + down((hn + skip * x_conv) * torch::silu(z)).unsqueeze(1);
  }

  MLSTMState init_state(int64_t batch) const {
    return {{}, {}, {}, torch::zeros({batch, inner_, K_}, skip.options())};
  }

  bool track_gates = false;
  torch::Tensor forget_open;
  int64_t heads_, inner_, K_;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};
  torch::nn::Linear igate{nullptr}, fgate{nullptr}, down{nullptr};
  torch::nn::Conv1d conv{nullptr};
  torch::nn::GroupNorm outnorm{nullptr};
  torch::Tensor skip;
};
TORCH_MODULE(MLSTMLayer);

class MLSTMModelImpl : public torch::nn::Module {
 public:
  explicit MLSTMModelImpl(const Config& cfg) {
    embed = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.embed_dim));
    for (int64_t i = 0; i < cfg.num_blocks; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), MLSTMLayer(cfg)));
    post_norm = register_module("post_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.embed_dim})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.embed_dim, cfg.vocab).bias(false)));
  }

  torch::Tensor forward(const torch::Tensor& tokens, std::vector<MLSTMState>* states = nullptr) {
    auto x = embed(tokens);
    for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i](x, states ? &(*states)[i] : nullptr);
    return head(post_norm(x));
  }

  torch::Tensor step(const torch::Tensor& token, std::vector<MLSTMState>& states) {
    auto x = embed(token);
    for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->step(x, states[i]);
    return head(post_norm(x));
  }

  std::vector<MLSTMState> init_states(int64_t batch) {
    std::vector<MLSTMState> s;
    for (auto& b : blocks) s.push_back(b->init_state(batch));
    return s;
  }

  torch::nn::Embedding embed{nullptr};
  std::vector<MLSTMLayer> blocks;
  torch::nn::LayerNorm post_norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(MLSTMModel);

// Streams fixed windows out of a token file; int32 staging halves the H2D traffic.
class TokenLoader {
 public:
  TokenLoader(std::vector<int64_t> ids, int64_t batch, int64_t context)
      : ids_(std::move(ids)), batch_(batch), context_(context) {}

  torch::Tensor next() {
    auto opts = torch::TensorOptions().dtype(torch::kInt32).pinned_memory(torch::cuda::is_available());
    auto buf = torch::empty({batch_, context_ + 1}, opts);
    for (int64_t b = 0; b < batch_; ++b) {
      if (cursor_ + context_ + 1 > static_cast<int64_t>(ids_.size())) cursor_ = 0;
      auto window = torch::from_blob(ids_.data() + cursor_, {context_ + 1}, torch::kLong);
      buf[b].copy_(window);  // EXPECT: tensor-copy-narrowing
      cursor_ += context_;
    }
    return buf;
  }

 private:
  std::vector<int64_t> ids_;
  int64_t batch_, context_, cursor_ = 0;
};

void ema_update(MLSTMModel& ema, const MLSTMModel& model, double decay) {
  torch::NoGradGuard no_grad;
  auto dst = ema->parameters();
  auto src = model->parameters();
  for (size_t i = 0; i < dst.size(); ++i)
    dst[i].detach().mul_(decay).add_(src[i].detach(), 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-detached -- the EMA copy is written on purpose, under NoGradGuard
}

void train(MLSTMModel& model, MLSTMModel& ema, TokenLoader& loader, int64_t steps, int64_t pad_id,
           torch::Device device) {
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  std::vector<torch::Tensor> losses;
  int64_t tokens_seen = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const bool log_now = step % 100 == 0;
    model->blocks.front()->track_gates = log_now;
    auto batch = loader.next().to(device, torch::kLong, /*non_blocking=*/true);
    const auto T = batch.size(1) - 1;
    auto inputs = batch.narrow(1, 0, T), targets = batch.narrow(1, 1, T);
    auto logits = model->forward(inputs);
    auto mask = targets.ne(pad_id);
    auto nll = F::cross_entropy(logits.transpose(1, 2), targets, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    auto loss = (nll * mask).sum() / mask.sum().clamp_min(1);
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    ema_update(ema, model, 0.999);
    losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    tokens_seen += mask.sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    if (log_now) {
      std::cout << "step " << step << " loss " << loss.item<float>()  // LOOKALIKE: tensor-sync-in-loop -- read only on logging steps
                << " forget-open " << model->blocks.front()->forget_open.item<float>() << " tokens " << tokens_seen
                << "\n";
    }
  }
  std::cout << "mean loss " << torch::stack(losses).mean().item<double>() << "\n";
}

torch::Tensor generate(MLSTMModel& model, const torch::Tensor& prompts, int64_t max_new, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto tokens = prompts;
  auto states = model->init_states(prompts.size(0));
  auto logits = model->forward(tokens.to(device), &states);
  for (int64_t i = 0; i < max_new; ++i) {
    auto next = logits.select(1, -1).argmax(-1, /*keepdim=*/true);
    tokens = torch::cat({tokens, next}, 1);  // EXPECT: tensor-device-mismatch
    logits = model->step(next, states);
  }
  return tokens;
}

}  // namespace xlstm

int main() {
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  xlstm::Config cfg;
  xlstm::MLSTMModel model(cfg), ema(cfg);
  model->to(device);
  ema->to(device);
  xlstm::ema_update(ema, model, 0.0);

  std::vector<int64_t> corpus(1 << 20);
  for (auto& t : corpus) t = std::rand() % cfg.vocab;
  xlstm::TokenLoader loader(std::move(corpus), 16, cfg.context);
  xlstm::train(model, ema, loader, 1000, /*pad_id=*/0, device);
  auto prompts = torch::randint(1, cfg.vocab, {4, 16}, torch::kLong);
  auto text = xlstm::generate(ema, prompts, 64, device);
  std::cout << "generated " << text.sizes() << "\n";
}
