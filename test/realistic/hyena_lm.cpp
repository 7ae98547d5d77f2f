// Hyena-style long-convolution language model: implicit filters evaluated by a small
// sine MLP, FFT convolution and multiplicative gating, trained on byte-level token batches.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct HyenaConfig {
  int64_t vocab_size = 256;
  int64_t d_model = 128;
  int64_t n_layers = 4;
  int64_t seq_len = 256;
  int64_t order = 2;
  int64_t filter_emb = 33;
  int64_t filter_hidden = 64;
  int64_t short_kernel = 3;
  double decay_min = 0.3;
  double decay_max = 1.5;
  double filter_gain = 1.0;
  bool normalize_filters = true;
  double token_drop = 0.05;
  int64_t unk_id = 0;
  int64_t batch_size = 16;
  int64_t epochs = 3;
  double lr = 6e-4;
  double weight_decay = 0.1;
  int64_t log_every = 50;
  double temperature = 0.8;
};

struct SinImpl : torch::nn::Module {
  explicit SinImpl(int64_t dim, double w = 10.0) {
    freq_ = register_parameter("freq", torch::full({1, dim}, w));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::sin(freq_ * x); }
  torch::Tensor freq_;
};
TORCH_MODULE(Sin);

// Implicit long filter: h(t) = MLP(PE(t)) * exp(-|delta| t), one filter per order and channel.
struct HyenaFilterImpl : torch::nn::Module {
  explicit HyenaFilterImpl(const HyenaConfig& cfg) : cfg_(cfg) {
    const int64_t L = cfg.seq_len;
    const int64_t bands = (cfg.filter_emb - 1) / 2;
    auto t = torch::linspace(0, 1, L).unsqueeze(1);
    auto w = 2 * M_PI * torch::arange(L).to(torch::kFloat).unsqueeze(1) / L;
    auto f = torch::linspace(1e-4, bands - 1, bands).unsqueeze(0);
    z_ = register_buffer("z", torch::cat({t, torch::cos(f * w), torch::sin(f * w)}, 1));
    t_ = register_buffer("t", t);

    const int64_t channels = cfg.order * cfg.d_model;
    mlp = register_module("mlp", torch::nn::Sequential(
        torch::nn::Linear(cfg.filter_emb, cfg.filter_hidden), Sin(cfg.filter_hidden),
        torch::nn::Linear(cfg.filter_hidden, cfg.filter_hidden), Sin(cfg.filter_hidden),
        torch::nn::Linear(torch::nn::LinearOptions(cfg.filter_hidden, channels).bias(false))));
    const double fast = std::log(1e-2) / cfg.decay_min;
    const double slow = std::log(1e-2) / cfg.decay_max;
    deltas_ = register_parameter("deltas", torch::linspace(fast, slow, channels));
  }

  torch::Tensor forward(int64_t L) {
    auto z = z_.narrow(0, 0, L);
    auto t = t_.narrow(0, 0, L);
    auto h = mlp->forward(z);
    auto decay = torch::exp(-t * deltas_.abs()); // LOOKALIKE: tensor-device-mismatch -- t_ is a registered buffer and follows model->to(device)
    h = h * decay;
    // FACT: a=torch.randn(8,4,requires_grad=True); d=torch.rand(8,4,requires_grad=True); h=a*d; h.mul_(0.5); assert not backward_fails(lambda: h.sum().backward())
    h.mul_(cfg_.filter_gain); // LOOKALIKE: tensor-inplace-on-saved -- MulBackward keeps the operands, not the product
    if (cfg_.normalize_filters) {
      // FACT: a=torch.randn(8,4,requires_grad=True); h=a*2; h.div_(h.norm(2,0,True)); assert backward_fails(lambda: h.sum().backward())
      h.div_(h.norm(2, {0}, true)); // EXPECT: tensor-inplace-on-saved
    }
    // FACT: h=torch.randn(16,2*8); assert is_view_of(h.t().reshape(2,8,16), h)
    return h.t().reshape({cfg_.order, cfg_.d_model, L}); // LOOKALIKE: tensor-reshape-non-contiguous -- only splits the transposed channel dim: still a view
  }

  HyenaConfig cfg_;
  torch::nn::Sequential mlp{nullptr};
  torch::Tensor z_, t_, deltas_;
};
TORCH_MODULE(HyenaFilter);

torch::Tensor fft_long_conv(const torch::Tensor& u, const torch::Tensor& k, const torch::Tensor& skip) {
  const int64_t L = u.size(-1);
  const int64_t n = 2 * L;
  auto k_f = torch::fft::rfft(k, n) / n;
  auto u_f = torch::fft::rfft(u, n);
  auto full = torch::fft::irfft(u_f * k_f, n, -1, "forward");
  auto y = full.narrow(-1, 0, L);
  // FACT: f=torch.fft.irfft(torch.randn(2,4,9,dtype=torch.cfloat),16); y=f.narrow(-1,0,8); assert is_view_of(y,f)
  y.add_(u * skip.view({1, -1, 1})); // LOOKALIKE: tensor-alias-then-mutate -- y views a temporary irfft result nothing else holds
  return y;
}

struct HyenaOperatorImpl : torch::nn::Module {
  explicit HyenaOperatorImpl(const HyenaConfig& cfg) : cfg_(cfg) {
    const int64_t D = cfg.d_model;
    const int64_t inner = (cfg.order + 1) * D;
    in_proj = register_module("in_proj", torch::nn::Linear(D, inner));
    out_proj = register_module("out_proj", torch::nn::Linear(D, D));
    short_filter = register_module("short_filter", torch::nn::Conv1d(
        torch::nn::Conv1dOptions(inner, inner, cfg.short_kernel).padding(cfg.short_kernel - 1).groups(inner)));
    filter = register_module("filter", HyenaFilter(cfg));
    skip_ = register_parameter("skip", torch::randn({cfg.order, D}));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), L = x.size(1), D = cfg_.d_model;
    auto u = in_proj->forward(x).transpose(1, 2);
    auto uc = short_filter->forward(u).narrow(-1, 0, L);
    // FACT: c=torch.randn(2,6,10).narrow(-1,0,8); assert not is_contiguous(c) and is_view_of(c.view(2,3,2,8), c)
    auto parts = uc.view({B, cfg_.order + 1, D, L}).unbind(1); // LOOKALIKE: tensor-view-non-contiguous -- the causal narrow leaves the channel dim splittable
    auto k = filter->forward(L);
    auto v = parts.back();
    for (int64_t o = 0; o < cfg_.order; ++o) {
      v = fft_long_conv(v, k[o], skip_[o]);
      v = v * parts[o];
    }
    return out_proj->forward(v.transpose(1, 2));
  }

  HyenaConfig cfg_;
  torch::nn::Linear in_proj{nullptr}, out_proj{nullptr};
  torch::nn::Conv1d short_filter{nullptr};
  HyenaFilter filter{nullptr};
  torch::Tensor skip_;
};
TORCH_MODULE(HyenaOperator);

struct HyenaBlockImpl : torch::nn::Module {
  explicit HyenaBlockImpl(const HyenaConfig& cfg) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    mixer = register_module("mixer", HyenaOperator(cfg));
    mlp = register_module("mlp", torch::nn::Sequential(
        torch::nn::Linear(cfg.d_model, 4 * cfg.d_model), torch::nn::GELU(),
        torch::nn::Linear(4 * cfg.d_model, cfg.d_model)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + mixer->forward(ln1->forward(x));
    return x + mlp->forward(ln2->forward(x));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  HyenaOperator mixer{nullptr};
  torch::nn::Sequential mlp{nullptr};
};
TORCH_MODULE(HyenaBlock);

struct HyenaLMImpl : torch::nn::Module {
  explicit HyenaLMImpl(const HyenaConfig& cfg) {
    tok = register_module("tok", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layers; ++i) blocks->push_back(HyenaBlock(cfg));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab_size).bias(false)));

    torch::nn::init::normal_(tok->weight, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under its own NoGradGuard
    const double residual_scale = std::sqrt(2.0 * cfg.n_layers);
    for (auto& item : named_parameters()) {
      const auto& name = item.key();
      const bool out_proj = name.find("out_proj.weight") != std::string::npos;
      const bool mlp_out = name.find("mlp.2.weight") != std::string::npos;
      if (out_proj || mlp_out) item.value().div_(residual_scale); // EXPECT: tensor-inplace-on-leaf
    }
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    auto x = tok->forward(ids);
    for (const auto& blk : *blocks) x = blk->as<HyenaBlock>()->forward(x);
    return head->forward(ln_f->forward(x));
  }

  torch::nn::Embedding tok{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(HyenaLM);

torch::Tensor batchify(const torch::Tensor& stream, int64_t batch_size) {
  const int64_t cols = stream.size(0) / batch_size;
  // FACT: d=torch.arange(100); assert is_view_of(d.narrow(0,0,96).view(4,24), d)
  return stream.narrow(0, 0, cols * batch_size).view({batch_size, cols}); // LOOKALIKE: tensor-view-non-contiguous -- a leading narrow of a 1-D stream is contiguous
}

std::pair<torch::Tensor, torch::Tensor> get_batch(const torch::Tensor& source, int64_t offset, int64_t len,
                                                  double drop_p, int64_t unk_id) {
  auto chunk = source.narrow(1, offset, len + 1);
  auto inputs = chunk.narrow(1, 0, len);
  auto targets = chunk.narrow(1, 1, len);
  if (drop_p > 0.0) {
    auto drop = torch::rand(inputs.sizes()) < drop_p;
    // FACT: b=torch.arange(20).view(2,10); c=b.narrow(1,2,6); i=c.narrow(1,0,5); t=c.narrow(1,1,5); assert is_view_of(i,b) and shares_storage(i,t)
    inputs.masked_fill_(drop, unk_id); // EXPECT: tensor-alias-then-mutate
  }
  return {inputs, targets};
}

double evaluate(HyenaLM& model, const torch::Tensor& data, const HyenaConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto source = batchify(data, cfg.batch_size);
  const int64_t windows = (source.size(1) - 1) / cfg.seq_len;
  double total = 0.0;
  int64_t count = 0;
  for (int64_t w = 0; w < windows; ++w) {
    auto batch = get_batch(source, w * cfg.seq_len, cfg.seq_len, 0.0, cfg.unk_id);
    // FACT: s=torch.arange(40).view(4,10); t=s.narrow(1,1,5); assert raises(lambda: t.view(-1), "view size is not compatible")
    auto targets = batch.second.view({-1}).to(device); // EXPECT: tensor-view-non-contiguous
    auto logits = model->forward(batch.first.to(device));
    auto nll = F::cross_entropy(logits.view({-1, cfg.vocab_size}), targets,
                                F::CrossEntropyFuncOptions().reduction(torch::kSum));
    total += nll.item<double>(); // EXPECT: tensor-sync-in-loop
    count += targets.numel();
  }
  return std::exp(total / std::max<int64_t>(count, 1));
}

void train(HyenaLM& model, const torch::Tensor& train_data, const torch::Tensor& val_data,
           const HyenaConfig& cfg, torch::Device device) {
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay).betas({0.9, 0.95}));
  auto source = batchify(train_data, cfg.batch_size);
  const int64_t windows = (source.size(1) - 1) / cfg.seq_len;
  auto loss_acc = torch::zeros({}, torch::TensorOptions().device(device));
  std::vector<torch::Tensor> epoch_losses;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    for (int64_t w = 0; w < windows; ++w, ++step) {
      auto batch = get_batch(source, w * cfg.seq_len, cfg.seq_len, cfg.token_drop, cfg.unk_id);
      auto inputs = batch.first.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new window of the corpus every step
      // FACT: s=torch.arange(40).view(4,10); t=s.narrow(1,1,5); assert not is_contiguous(t) and is_copy_of(t.reshape(-1), s)
      auto targets = batch.second.reshape({-1}).to(device); // EXPECT: tensor-reshape-non-contiguous

      auto logits = model->forward(inputs);
      auto loss = F::cross_entropy(logits.view({-1, cfg.vocab_size}), targets);
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();

      loss_acc += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is accumulated
      epoch_losses.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations
      if ((step + 1) % cfg.log_every == 0) {
        const double mean = loss_acc.item<double>() / cfg.log_every; // LOOKALIKE: tensor-sync-in-loop -- read once per logging interval, not per step
        loss_acc.zero_();
        std::cout << "step " << step + 1 << " loss " << mean << std::endl;
      }
    }
    const double epoch_mean = torch::stack(epoch_losses).mean().item<double>();
    epoch_losses.clear();
    std::cout << "epoch " << epoch << " train " << epoch_mean
              << " val ppl " << evaluate(model, val_data, cfg, device) << std::endl;
  }
}

torch::Tensor generate(HyenaLM& model, const torch::Tensor& prompt, int64_t n_new, const HyenaConfig& cfg,
                       const torch::Tensor& banned_ids, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto ctx = prompt;
  for (int64_t s = 0; s < n_new; ++s) {
    const int64_t len = std::min(ctx.size(1), cfg.seq_len);
    auto window = ctx.narrow(1, ctx.size(1) - len, len);
    auto logits = model->forward(window.to(device));
    auto scaled = logits.select(1, -1).clone().div_(cfg.temperature); // EXPECT: tensor-unnecessary-clone
    auto banned = banned_ids.to(device); // EXPECT: tensor-clone-in-loop
    scaled.index_fill_(-1, banned, -std::numeric_limits<float>::infinity());
    auto next = torch::multinomial(torch::softmax(scaled, -1), 1);
    ctx = torch::cat({ctx, next}, 1); // EXPECT: tensor-device-mismatch
  }
  return ctx;
}

torch::Tensor synthetic_corpus(int64_t n, int64_t vocab) {
  // A first-order Markov chain over bytes: enough structure for the loss to go down.
  auto cdf = torch::softmax(torch::randn({vocab, vocab}) * 3.0, -1).cumsum(-1).contiguous();
  auto draws = torch::rand({n});
  auto out = torch::empty({n}, torch::kLong);
  const float* table = cdf.data_ptr<float>();
  const float* r = draws.data_ptr<float>();
  int64_t* ids = out.data_ptr<int64_t>();
  int64_t cur = 1;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = table + cur * vocab;
    cur = std::min<int64_t>(std::lower_bound(row, row + vocab, r[i]) - row, vocab - 1);
    ids[i] = cur;
  }
  return out;
}

int main() {
  torch::manual_seed(0);
  HyenaConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto corpus = synthetic_corpus(400000, cfg.vocab_size);
  const int64_t split = corpus.size(0) * 9 / 10;
  auto train_data = corpus.narrow(0, 0, split);
  auto val_data = corpus.narrow(0, split, corpus.size(0) - split);

  HyenaLM model(cfg);
  model->to(device);
  train(model, train_data, val_data, cfg, device);

  auto prompt = corpus.narrow(0, 0, 32).unsqueeze(0);
  auto banned = torch::tensor({cfg.unk_id}, torch::kLong);
  auto sample = generate(model, prompt, 128, cfg, banned, device);
  std::cout << "generated " << sample.size(1) - prompt.size(1) << " tokens" << std::endl;
  torch::save(model, "hyena_lm.pt");
  return 0;
}
