// A byte-level Mamba language model (Gu & Dao 2023), reference implementation without the fused
// CUDA kernel: each block projects the input into a gated branch and an SSM branch, runs a causal
// depthwise conv1d over time, computes the input-dependent step size dt and the B, C matrices,
// and runs the selective scan h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t, y_t = C_t h_t sequentially.
// Training uses gradient accumulation; evaluation reports bits per byte; generation runs the
// recurrent form one byte at a time with a cache of the conv window and the SSM state.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct MambaConfig {
  int64_t d_model = 512, n_layers = 8, d_state = 16, d_conv = 4, expand = 2, dt_rank = 32, vocab = 256;
  int64_t seq_len = 512, batch = 16, accum = 4, steps = 20000, log_every = 100;
  double dt_min = 1e-3, dt_max = 0.1, dt_floor = 1e-4;
  double lr = 6e-4, weight_decay = 0.1, clip = 1.0;
};

// Per-layer state for recurrent decoding of a single stream.
struct InferenceCache {
  torch::Tensor conv; // [d_conv, d_inner]: the last d_conv inputs of the conv, oldest first
  torch::Tensor ssm;  // [d_inner, d_state]
};

// Sequential selective scan over u [B, L, D] with delta [B, L, D], A [D, N], Bm / Cm [B, L, N].
torch::Tensor selective_scan(const torch::Tensor &u, const torch::Tensor &delta, const torch::Tensor &A,
                             const torch::Tensor &Bm, const torch::Tensor &Cm) {
  const auto Bsz = u.size(0), L = u.size(1), D = u.size(2), N = A.size(1);
  auto dA = torch::exp(delta.unsqueeze(-1) * A);                       // [B, L, D, N]
  auto dBu = delta.unsqueeze(-1) * Bm.unsqueeze(2) * u.unsqueeze(-1);  // [B, L, D, N]
  auto h = torch::zeros({Bsz, D, N}, u.options());
  std::vector<torch::Tensor> ys;
  ys.reserve(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) {
    // FACT: A = torch.randn(3, 4, requires_grad=True); C = torch.randn(2, 4, requires_grad=True); h = torch.zeros(2, 3, 4); h.mul_(A.exp()).add_(1.0); y0 = torch.matmul(h, C.unsqueeze(-1)); h.mul_(A.exp()).add_(1.0); assert backward_fails(lambda: y0.sum().backward())
    h.mul_(dA.select(1, t)).add_(dBu.select(1, t)); // EXPECT: tensor-inplace-on-saved -- the previous step's matmul saved h for C's gradient: backward raises
    ys.push_back(torch::matmul(h, Cm.select(1, t).unsqueeze(-1)).squeeze(-1)); // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked and returned: the loss differentiates through every step
  }
  return torch::stack(ys, 1); // [B, L, D]
}

struct MambaMixerImpl : nn::Module {
  explicit MambaMixerImpl(const MambaConfig &c)
      : d_inner_(c.expand * c.d_model), d_state_(c.d_state), dt_rank_(c.dt_rank), d_conv_(c.d_conv) {
    in_proj_ = register_module("in_proj", nn::Linear(nn::LinearOptions(c.d_model, 2 * d_inner_).bias(false)));
    conv_ = register_module("conv1d", nn::Conv1d(nn::Conv1dOptions(d_inner_, d_inner_, d_conv_).groups(d_inner_).padding(d_conv_ - 1)));
    x_proj_ = register_module("x_proj", nn::Linear(nn::LinearOptions(d_inner_, dt_rank_ + 2 * d_state_).bias(false)));
    dt_proj_ = register_module("dt_proj", nn::Linear(dt_rank_, d_inner_));
    out_proj_ = register_module("out_proj", nn::Linear(nn::LinearOptions(d_inner_, c.d_model).bias(false)));
    // S4D-real initialisation: A = -[1, ..., N] in every channel, stored as log(-A).
    A_log_ = register_parameter("A_log", torch::log(torch::arange(1, d_state_ + 1, torch::kFloat).repeat({d_inner_, 1})));
    D_ = register_parameter("D", torch::ones({d_inner_}));
    const double std = 1.0 / std::sqrt(static_cast<double>(dt_rank_));
    nn::init::uniform_(dt_proj_->weight, -std, std); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    // dt_proj's bias is the inverse softplus of dt drawn log-uniformly in [dt_min, dt_max].
    auto dt = torch::exp(torch::rand({d_inner_}) * (std::log(c.dt_max) - std::log(c.dt_min)) + std::log(c.dt_min)).clamp_min(c.dt_floor);
    auto inv_dt = dt + torch::log(-torch::expm1(-dt));
    // FACT: b = torch.nn.Linear(4, 6).bias; assert raises(lambda: b.copy_(torch.rand(6)), "a leaf Variable that requires grad")
    dt_proj_->bias.copy_(inv_dt); // EXPECT: tensor-inplace-on-leaf -- the reference does this under torch.no_grad(); here grad mode is on and the bias requires grad
  }

  // u [B, L, d_model] -> [B, L, d_model]
  torch::Tensor forward(const torch::Tensor &u) {
    const auto Bsz = u.size(0), L = u.size(1);
    auto xz = in_proj_(u).chunk(2, -1);
    auto x = xz[0], z = xz[1];
    // Causal depthwise conv over time: channels first, drop the right padding.
    auto xc = F::silu(conv_(x.transpose(1, 2)).narrow(2, 0, L)).transpose(1, 2); // [B, L, D]
    // FACT: x = torch.randn(2, 6, 4); c = torch.nn.Conv1d(4, 4, 3, groups=4, padding=2); xc = torch.nn.functional.silu(c(x.transpose(1, 2))[..., :6]).transpose(1, 2); assert not is_contiguous(xc) and is_copy_of(xc.reshape(12, 4), xc)
    auto x_dbl = x_proj_(xc.reshape({Bsz * L, d_inner_})); // EXPECT: tensor-reshape-non-contiguous -- xc is the conv output transposed back to [B, L, D]: merging B and L copies the whole activation
    // FACT: y = torch.nn.Linear(4, 7, bias=False)(torch.randn(12, 4)); assert is_view_of(y.view(2, 6, -1), y)
    x_dbl = x_dbl.view({Bsz, L, -1}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto delta = F::softplus(dt_proj_(x_dbl.narrow(-1, 0, dt_rank_)));
    auto Bm = x_dbl.narrow(-1, dt_rank_, d_state_);
    auto Cm = x_dbl.narrow(-1, dt_rank_ + d_state_, d_state_);
    auto y = selective_scan(xc, delta, -torch::exp(A_log_), Bm, Cm);
    y = y + xc * D_;
    return out_proj_(y * F::silu(z));
  }

  InferenceCache make_cache(const torch::TensorOptions &opts) const {
    return {torch::zeros({d_conv_, d_inner_}, opts), torch::zeros({d_inner_, d_state_}, opts)};
  }

  // One byte of one stream: u [d_model] -> [d_model]; advances the cache.
  torch::Tensor step(const torch::Tensor &u, InferenceCache &cache) {
    torch::NoGradGuard no_grad;
    auto xz = in_proj_(u);
    auto x = xz.narrow(0, 0, d_inner_), z = xz.narrow(0, d_inner_, d_inner_);
    const auto K = cache.conv.size(0);
    // FACT: c = torch.zeros(4, 6); assert raises(lambda: c.narrow(0, 0, 3).copy_(c.narrow(0, 1, 3)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    cache.conv.narrow(0, 0, K - 1).copy_(cache.conv.narrow(0, 1, K - 1)); // EXPECT: tensor-inplace-overlap -- shifting the window inside its own buffer: rows 0..K-2 and 1..K-1 overlap, PyTorch refuses
    // FACT: c = torch.zeros(4, 6); x = torch.randn(12)[:6]; c[3].copy_(x); assert is_copy_of(c, x) and torch.equal(c[3], x)
    cache.conv[K - 1].copy_(x); // LOOKALIKE: tensor-inplace-overlap -- the newest input comes from in_proj, not from the window
    auto w = conv_->weight.squeeze(1).t(); // [K, D]
    auto xc = F::silu((cache.conv * w).sum(0) + conv_->bias);
    auto x_dbl = x_proj_(xc);
    auto dt = F::softplus(dt_proj_(x_dbl.narrow(0, 0, dt_rank_)));
    auto Bt = x_dbl.narrow(0, dt_rank_, d_state_), Ct = x_dbl.narrow(0, dt_rank_ + d_state_, d_state_);
    auto dA = torch::exp(dt.unsqueeze(-1) * -torch::exp(A_log_));
    cache.ssm.mul_(dA).add_(dt.unsqueeze(-1) * xc.unsqueeze(-1) * Bt.unsqueeze(0)); // LOOKALIKE: tensor-inplace-on-saved -- decoding runs under NoGradGuard: nothing is saved
    auto y = torch::mv(cache.ssm, Ct) + xc * D_;
    return out_proj_(y * F::silu(z));
  }

  int64_t d_inner_, d_state_, dt_rank_, d_conv_;
  nn::Linear in_proj_{nullptr}, x_proj_{nullptr}, dt_proj_{nullptr}, out_proj_{nullptr};
  nn::Conv1d conv_{nullptr};
  torch::Tensor A_log_, D_;
};
TORCH_MODULE(MambaMixer);

struct RMSNormImpl : nn::Module {
  explicit RMSNormImpl(int64_t d, double eps = 1e-5) : eps_(eps) { weight_ = register_parameter("weight", torch::ones({d})); }
  torch::Tensor forward(const torch::Tensor &x) { return x * torch::rsqrt(x.pow(2).mean(-1, true) + eps_) * weight_; }
  double eps_;
  torch::Tensor weight_;
};
TORCH_MODULE(RMSNorm);

struct ResidualBlockImpl : nn::Module {
  explicit ResidualBlockImpl(const MambaConfig &c) {
    norm_ = register_module("norm", RMSNorm(c.d_model));
    mixer_ = register_module("mixer", MambaMixer(c));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor residual = x;
    x = mixer_(norm_(x));
    // FACT: x = torch.randn(2, 3); r = x; x = torch.nn.Linear(3, 3, bias=False)(x); x += r; assert is_copy_of(x, r)
    x += residual; // LOOKALIKE: tensor-alias-then-mutate, tensor-inplace-on-saved -- x was rebound to the mixer's output (out_proj saves no output) before the write
    return x;
  }
  torch::Tensor step(const torch::Tensor &x, InferenceCache &cache) { return x + mixer_->step(norm_(x), cache); }
  RMSNorm norm_{nullptr};
  MambaMixer mixer_{nullptr};
};
TORCH_MODULE(ResidualBlock);

struct MambaLMImpl : nn::Module {
  explicit MambaLMImpl(const MambaConfig &c) {
    embedding_ = register_module("embedding", nn::Embedding(c.vocab, c.d_model));
    for (int64_t i = 0; i < c.n_layers; ++i)
      layers_.push_back(register_module("layer" + std::to_string(i), ResidualBlock(c)));
    norm_f_ = register_module("norm_f", RMSNorm(c.d_model));
    // GPT-2 style: scale the residual branch outputs by 1/sqrt(n_layers).
    torch::NoGradGuard no_grad;
    for (auto &layer : layers_)
      layer->mixer_->out_proj_->weight.div_(std::sqrt(static_cast<double>(c.n_layers))); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  // tokens [B, L] int64 -> logits [B, L, vocab] (the output head is tied to the embedding).
  torch::Tensor forward(const torch::Tensor &tokens) {
    auto h = embedding_(tokens);
    for (auto &layer : layers_)
      h = layer(h);
    return F::linear(norm_f_(h), embedding_->weight);
  }
  std::vector<InferenceCache> make_caches(torch::Device device) const {
    std::vector<InferenceCache> caches;
    for (const auto &layer : layers_)
      caches.push_back(layer->mixer_->make_cache(torch::TensorOptions().device(device)));
    return caches;
  }
  // token [1] int64 -> logits [vocab]
  torch::Tensor step(const torch::Tensor &token, std::vector<InferenceCache> &caches) {
    torch::NoGradGuard no_grad;
    auto h = embedding_(token).squeeze(0);
    for (size_t i = 0; i < layers_.size(); ++i)
      h = layers_[i]->step(h, caches[i]);
    return F::linear(norm_f_(h), embedding_->weight);
  }
  nn::Embedding embedding_{nullptr};
  std::vector<ResidualBlock> layers_;
  RMSNorm norm_f_{nullptr};
};
TORCH_MODULE(MambaLM);

// Random windows of the byte corpus: inputs and next-byte targets, both [B, L].
std::pair<torch::Tensor, torch::Tensor> sample_batch(const torch::Tensor &corpus, const MambaConfig &cfg, torch::Device device) {
  const auto L = cfg.seq_len;
  auto starts = torch::randint(corpus.size(0) - L - 1, {cfg.batch, 1});
  auto chunk = corpus.index({starts + torch::arange(L + 1)}).to(device, torch::kLong); // [B, L + 1]
  return {chunk.narrow(1, 0, L), chunk.narrow(1, 1, L)};
}

void train(MambaLM &model, const torch::Tensor &corpus, const MambaConfig &cfg, torch::Device device) {
  model->to(device);
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).betas({0.9, 0.95}).weight_decay(cfg.weight_decay));
  for (int64_t step = 0; step < cfg.steps; ++step) {
    opt.zero_grad();
    auto total = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t micro = 0; micro < cfg.accum; ++micro) {
      auto [x, y] = sample_batch(corpus, cfg, device);
      auto logits = model->forward(x);
      // FACT: l = torch.nn.functional.linear(torch.randn(2, 5, 4), torch.randn(9, 4)); assert is_view_of(l.view(-1, 9), l)
      auto loss = F::cross_entropy(logits.view({-1, cfg.vocab}), // LOOKALIKE: tensor-view-non-contiguous -- the tied head's output is contiguous
                                   // FACT: d = torch.arange(100); c = d[torch.randint(0, 80, (4, 1)) + torch.arange(9)]; y = c.narrow(1, 1, 8); assert raises(lambda: y.view(-1), "view size is not compatible")
                                   y.view({-1})); // EXPECT: tensor-view-non-contiguous -- the targets are columns 1..L of a [B, L + 1] window: their rows are not adjacent, view throws
      total = total + loss / static_cast<double>(cfg.accum); // LOOKALIKE: tensor-graph-kept-across-iterations -- the sum of the micro-batches is what backward() runs on below
    }
    total.backward();
    nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
    opt.step();
    if (step % cfg.log_every == 0)
      std::cout << "step " << step << " loss " << total.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
  }
}

// Bits per byte on held-out text, in windows of seq_len.
double evaluate_bpb(MambaLM &model, const torch::Tensor &corpus, const MambaConfig &cfg, torch::Device device) {
  model->eval();
  const auto L = cfg.seq_len;
  auto nll = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t count = 0;
  for (int64_t off = 0; off + L + 1 <= corpus.size(0); off += L) {
    auto window = corpus.narrow(0, off, L + 1).to(device, torch::kLong);
    auto logits = model->forward(window.narrow(0, 0, L).unsqueeze(0)).squeeze(0);
    nll += F::cross_entropy(logits, window.narrow(0, 1, L), F::CrossEntropyFuncOptions().reduction(torch::kSum)); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every window's graph and activations stay alive through nll
    count += L;
  }
  model->train();
  return nll.item<double>() / static_cast<double>(count) / std::log(2.0);
}

std::string generate(MambaLM &model, const std::string &prompt, int64_t n_new, double temperature, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto caches = model->make_caches(device);
  // Control bytes never occur in the training text: never sample them.
  auto banned = torch::zeros({256}, torch::kBool);
  for (int c = 0; c < 32; ++c)
    if (c != '\n' && c != '\t')
      banned[c] = true;
  torch::Tensor logits;
  for (unsigned char ch : prompt)
    logits = model->step(torch::tensor({static_cast<int64_t>(ch)}).to(device), caches);
  std::string out = prompt;
  for (int64_t i = 0; i < n_new; ++i) {
    auto mask = banned.to(device); // EXPECT: tensor-clone-in-loop -- the same mask is copied to the device for every generated byte
    auto probs = torch::softmax(logits.masked_fill(mask, -std::numeric_limits<float>::infinity()) / temperature, -1);
    auto next = torch::multinomial(probs, 1);
    out.push_back(static_cast<char>(next.item<int64_t>())); // LOOKALIKE: tensor-sync-in-loop -- the sampled byte is the output and the next input
    logits = model->step(next, caches);
  }
  return out;
}
