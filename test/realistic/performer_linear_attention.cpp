// Performer (Choromanski et al., 2021) causal language model with FAVOR+ attention: exp(q.k) is
// approximated by positive orthogonal random features phi(q).phi(k), so a causal layer costs
// O(L m d) through prefix sums over time instead of O(L^2 d). The projections are buffers redrawn
// every redraw_every steps. Training reads a time-major token stream (batchified like the
// word-language-model corpora); generation is greedy with a sliding context window.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct PerformerConfig {
  int64_t vocab = 32000, d_model = 512, n_heads = 8, n_layers = 6, n_features = 256, ffn = 2048;
  int64_t seq_len = 512, batch = 16, chunk = 64, steps = 200000, redraw_every = 1000, log_every = 100, eval_every = 5000;
  double lr = 3e-4, weight_decay = 0.1, dropout = 0.1, kernel_eps = 1e-4, clip = 1.0;
};

struct LmBatch { torch::Tensor tokens, targets; }; // [T, B] int64 each, targets one step ahead

// [N] token ids -> [N / B, B]: column b is the b-th contiguous slice of the corpus.
torch::Tensor batchify(const torch::Tensor &ids, int64_t B) {
  const auto n = ids.size(0) / B;
  // FACT: i = torch.arange(103); assert is_view_of(i.narrow(0, 0, 100).view(4, -1), i)
  return ids.narrow(0, 0, n * B).view({B, n}).t().contiguous(); // LOOKALIKE: tensor-view-non-contiguous -- a prefix of a 1-D tensor is contiguous
}

// Orthogonal Gaussian projection [m, d]: blocks of d orthonormal rows (QR in double precision),
// every row rescaled by the norm of a Gaussian vector so the marginals stay those of N(0, I).
torch::Tensor orthogonal_gaussian(int64_t m, int64_t d) {
  std::vector<torch::Tensor> blocks;
  for (int64_t done = 0; done < m; done += d) {
    auto q = std::get<0>(torch::linalg_qr(torch::randn({d, d}, torch::kDouble)));
    blocks.push_back(q.t().narrow(0, 0, std::min(d, m - done)));
  }
  return torch::cat(blocks) * torch::randn({m, d}, torch::kDouble).pow(2).sum(1, true).sqrt();
}

struct FavorAttentionImpl : nn::Module {
  explicit FavorAttentionImpl(const PerformerConfig &cfg)
      : H(cfg.n_heads), Dh(cfg.d_model / cfg.n_heads), M(cfg.n_features), chunk(cfg.chunk), eps(cfg.kernel_eps) {
    qkv = register_module("qkv", nn::Linear(cfg.d_model, 3 * cfg.d_model));
    out = register_module("out", nn::Linear(cfg.d_model, cfg.d_model));
    proj = register_buffer("proj", torch::zeros({M, Dh}));
    redraw();
  }

  void redraw() {
    torch::NoGradGuard no_grad;
    proj.copy_(orthogonal_gaussian(M, Dh).to(torch::kFloat)); // LOOKALIKE: tensor-copy-narrowing, tensor-inplace-on-leaf -- the double-precision draw is converted explicitly, into a buffer
  }

  // [B, L, D] (one chunk of the fused projection) -> [B, H, L, Dh]
  torch::Tensor split_heads(const torch::Tensor &t) const {
    // FACT: t = torch.randn(2, 5, 24).chunk(3, -1)[0]; assert is_view_of(t.view(2, 5, 2, 4), t)
    return t.view({t.size(0), t.size(1), H, Dh}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- splits the last dim of a column chunk: the strides allow it
  }

  torch::Tensor merge_heads(const torch::Tensor &o) const {
    // FACT: o = torch.randn(2, 4, 5, 3); assert is_copy_of(o.transpose(1, 2).reshape(2, 5, 12), o)
    return o.transpose(1, 2).reshape({o.size(0), o.size(2), H * Dh}); // EXPECT: tensor-reshape-non-contiguous
  }

  // FAVOR+ positive features: phi(x) = (exp(w.x - |x|^2 / 2 - stab) + eps) / sqrt(m), x scaled by d^-1/4.
  torch::Tensor features(const torch::Tensor &x, bool is_query) const {
    auto xs = x.clone(); // EXPECT: tensor-unnecessary-clone
    xs.mul_(std::pow(static_cast<double>(Dh), -0.25));
    auto wx = torch::matmul(xs, proj.t()); // [B, H, L, M]
    auto half_sq = xs.pow(2).sum(-1, true) / 2.0;
    // queries: one shift per row, keys: one per head; both cancel in the normaliser
    auto stab = is_query ? std::get<0>(wx.max(-1, true)) : wx.amax({2, 3}, true);
    auto phi = torch::exp(wx - half_sq - stab.detach());
    // FACT: x = torch.randn(5, 4, requires_grad=True); p = torch.exp(x); p.add_(1e-4); assert backward_fails(lambda: p.sum().backward())
    phi.add_(eps); // EXPECT: tensor-inplace-on-saved
    return phi / std::sqrt(static_cast<double>(M));
  }

  // Causal FAVOR+: within a chunk of time steps, cumsum; across chunks, the carried state
  // S = sum phi(k) v^T and z = sum phi(k).
  torch::Tensor forward(const torch::Tensor &x) {
    const auto B = x.size(0), L = x.size(1);
    auto parts = qkv(x).chunk(3, -1);
    auto q = features(split_heads(parts[0]), true), k = features(split_heads(parts[1]), false);
    auto v = split_heads(parts[2]);
    auto S = torch::zeros({B, H, M, Dh}, x.options());
    auto z = torch::zeros({B, H, M}, x.options());
    std::vector<torch::Tensor> outs;
    for (int64_t s = 0; s < L; s += chunk) {
      const auto n = std::min(chunk, L - s);
      auto qc = q.narrow(2, s, n), kc = k.narrow(2, s, n), vc = v.narrow(2, s, n);
      auto kv = torch::cumsum(kc.unsqueeze(-1) * vc.unsqueeze(-2), 2) + S.unsqueeze(2); // [B, H, n, M, Dh]
      auto zc = torch::cumsum(kc, 2) + z.unsqueeze(2);                                   // [B, H, n, M]
      auto num = torch::matmul(qc.unsqueeze(-2), kv).squeeze(-2);                       // [B, H, n, Dh]
      outs.push_back(num / (qc * zc).sum(-1, true));
      S = kv.select(2, n - 1); // LOOKALIKE: tensor-graph-kept-across-iterations -- the carried prefix state is part of this forward's graph, differentiated through the output
      z = zc.select(2, n - 1);
    }
    return out(merge_heads(torch::cat(outs, 2)));
  }

  int64_t H, Dh, M, chunk;
  double eps;
  nn::Linear qkv{nullptr}, out{nullptr};
  torch::Tensor proj;
};
TORCH_MODULE(FavorAttention);

struct PerformerBlockImpl : nn::Module {
  explicit PerformerBlockImpl(const PerformerConfig &cfg) {
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})));
    attn = register_module("attn", FavorAttention(cfg));
    ff1 = register_module("ff1", nn::Linear(cfg.d_model, cfg.ffn));
    ff2 = register_module("ff2", nn::Linear(cfg.ffn, cfg.d_model));
    drop = register_module("drop", nn::Dropout(cfg.dropout));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + drop(attn(ln1(x)));
    return x + drop(ff2(torch::gelu(ff1(ln2(x)))));
  }
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  FavorAttention attn{nullptr};
  nn::Linear ff1{nullptr}, ff2{nullptr};
  nn::Dropout drop{nullptr};
};
TORCH_MODULE(PerformerBlock);

struct PerformerLmImpl : nn::Module {
  explicit PerformerLmImpl(const PerformerConfig &cfg) {
    tok = register_module("tok", nn::Embedding(cfg.vocab, cfg.d_model));
    pos = register_module("pos", nn::Embedding(cfg.seq_len, cfg.d_model));
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), PerformerBlock(cfg)));
    ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})));
    head = register_module("head", nn::Linear(nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));
    nn::init::normal_(tok->weight, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own no-grad guard
    nn::init::normal_(pos->weight, 0.0, 0.02);
  }
  // tokens [T, B] time-major -> logits [B, T, V]
  torch::Tensor forward(const torch::Tensor &tokens) {
    auto ids = tokens.t();
    auto h = tok(ids) + pos(torch::arange(ids.size(1), ids.options()));
    for (auto &b : blocks)
      h = b(h);
    return head(ln_f(h));
  }
  void redraw_features() {
    for (auto &b : blocks)
      b->attn->redraw();
  }
  nn::Embedding tok{nullptr}, pos{nullptr};
  std::vector<PerformerBlock> blocks;
  nn::LayerNorm ln_f{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(PerformerLm);

double evaluate(PerformerLm &model, const torch::Tensor &val, const PerformerConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto total = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  int64_t count = 0;
  for (int64_t i = 0; i + cfg.seq_len + 1 <= val.size(0); i += cfg.seq_len) {
    auto x = val.narrow(0, i, cfg.seq_len).to(device), y = val.narrow(0, i + 1, cfg.seq_len).to(device);
    auto logits = model->forward(x);
    // FACT: y = torch.randint(0, 9, (6, 4)); c = y.t().contiguous(); assert is_contiguous(c) and is_view_of(c.view(-1), c)
    auto flat_y = y.t().contiguous().view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() made the copy first
    total += F::cross_entropy(logits.view({-1, cfg.vocab}), flat_y, F::CrossEntropyFuncOptions().reduction(torch::kSum)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    count += flat_y.numel();
  }
  model->train();
  return std::exp(total.item<double>() / static_cast<double>(count));
}

void train_lm(PerformerLm &model, const torch::Tensor &train_ids, const torch::Tensor &val_ids, const PerformerConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  auto stream = batchify(train_ids, cfg.batch), val = batchify(val_ids, cfg.batch);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  const auto N = stream.size(0);
  double nll_sum = 0;
  std::vector<torch::Tensor> window_losses;
  auto entropy_sum = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t step = 0; step < cfg.steps; ++step) {
    if (step % cfg.redraw_every == 0)
      model->redraw_features();
    const auto start = (step * cfg.seq_len) % (N - cfg.seq_len - 1);
    LmBatch batch{stream.narrow(0, start, cfg.seq_len).to(device), stream.narrow(0, start + 1, cfg.seq_len).to(device)}; // LOOKALIKE: tensor-clone-in-loop -- a different window of the stream every step
    auto logp = torch::log_softmax(model->forward(batch.tokens), -1); // [B, T, V]
    // FACT: x = torch.randn(2, 3, 5); l = torch.log_softmax(x, -1); assert is_view_of(l.view(-1, 5), l)
    auto flat_logp = logp.view({-1, cfg.vocab}); // LOOKALIKE: tensor-view-non-contiguous -- log_softmax returns a contiguous tensor
    // FACT: t = torch.randint(0, 9, (6, 4)); assert raises(lambda: t.t().view(-1), "view size is not compatible")
    auto loss = F::nll_loss(flat_logp, batch.targets.t().view({-1})); // EXPECT: tensor-view-non-contiguous
    // predictive entropy, a collapse monitor that should carry no graph
    auto probs = logp.detach();
    // FACT: x = torch.randn(4, 6, requires_grad=True); lp = torch.log_softmax(x, -1); p = lp.detach(); p.exp_(); assert shares_storage(p, lp) and backward_fails(lambda: torch.nn.functional.nll_loss(lp, torch.tensor([0, 1, 2, 3])).backward())
    probs.exp_(); // EXPECT: tensor-inplace-on-detached
    entropy_sum += -(probs * logp.detach()).sum(-1).mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- made from detached tensors: no graph
    opt.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
    opt.step();
    nll_sum += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    window_losses.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations
    if ((step + 1) % cfg.log_every == 0) {
      const double smoothed = torch::stack(window_losses).mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
      std::cout << "step " << step + 1 << " loss " << smoothed << " entropy " << entropy_sum.item<double>() / static_cast<double>(cfg.log_every) << "\n";
      window_losses.clear();
      entropy_sum.zero_();
    }
    if ((step + 1) % cfg.eval_every == 0)
      std::cout << "  train ppl " << std::exp(nll_sum / static_cast<double>(step + 1)) << " val ppl " << evaluate(model, val, cfg, device) << "\n";
  }
}

// Greedy continuation of B prompts ([T0, B] with T0 >= seq_len) through a sliding window.
torch::Tensor generate(PerformerLm &model, const torch::Tensor &prompt, const torch::Tensor &banned, int64_t new_tokens,
                       const PerformerConfig &cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto device = model->head->weight.device();
  const auto T = cfg.seq_len, B = prompt.size(1);
  auto window = torch::empty({T, B}, torch::TensorOptions().dtype(torch::kLong).device(device));
  window.copy_(prompt.narrow(0, prompt.size(0) - T, T)); // LOOKALIKE: tensor-copy-narrowing -- int64 prompt tokens into an int64 window
  auto generated = torch::empty({new_tokens, B}, window.options());
  const auto banned_dev = banned.to(device); // LOOKALIKE: tensor-clone-in-loop -- moved once, before the loop
  for (int64_t i = 0; i < new_tokens; ++i) {
    auto logits = model->forward(window).select(1, T - 1); // [B, V] at the newest position
    logits.masked_fill_(banned_dev, -1e9); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard: nothing was saved
    // FACT: o = torch.zeros(3, dtype=torch.long); o.copy_(torch.tensor([2.7, -1.5, 9.9])); assert o.tolist() == [2, -1, 9]
    generated.select(0, i).copy_(std::get<0>(logits.max(-1))); // EXPECT: tensor-copy-narrowing
    // FACT: w = torch.randint(0, 50, (8, 3)); assert raises(lambda: w[:-1].copy_(w[1:]), "single memory location")
    window.narrow(0, 0, T - 1).copy_(window.narrow(0, 1, T - 1)); // EXPECT: tensor-inplace-overlap
    // FACT: w = torch.randint(0, 50, (8, 3)); g = torch.randint(0, 50, (4, 3)); w[-1].copy_(g[1]); assert is_copy_of(w, g)
    window.select(0, T - 1).copy_(generated.select(0, i)); // LOOKALIKE: tensor-inplace-overlap -- a row of another tensor: no overlap
  }
  model->train();
  return generated.cpu();
}
