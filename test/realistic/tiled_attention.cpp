// Memory-efficient attention in plain LibTorch: keys and values are visited block by block
// with an online softmax (running max, running sum), so the full score matrix never exists.
// A small harness checks it against the naive softmax(QK^T)V before a causal LM trains with it.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;

struct AttentionConfig {
  int64_t block_q = 64;
  int64_t block_k = 64;
  bool causal = true;
  double dropout = 0.0;
};

struct ModelConfig {
  int64_t vocab_size = 512;
  int64_t d_model = 256;
  int64_t n_heads = 8;
  int64_t n_layers = 4;
  int64_t seq_len = 512;
  int64_t batch_size = 8;
  int64_t steps = 3000;
  int64_t log_every = 100;
  double lr = 3e-4;
  double weight_decay = 0.05;
  double max_loss_spike = 8.0;
  AttentionConfig attn{64, 128, true, 0.1};
};

torch::Tensor naive_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    const int64_t T = q.size(-2), S = k.size(-2);
    auto future = torch::ones({T, S}, torch::kBool).triu(S - T + 1);
    scores = scores.masked_fill(future.to(scores.device()), -std::numeric_limits<double>::infinity()); // LOOKALIKE: tensor-device-mismatch -- the mask is moved to the scores' device first
  }
  return torch::matmul(torch::softmax(scores, -1), v);
}

torch::Tensor tiled_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const AttentionConfig& cfg, bool training) {
  const int64_t T = q.size(-2), S = k.size(-2), D = q.size(-1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  auto out = torch::empty(q.sizes(), q.options());

  for (int64_t i0 = 0; i0 < T; i0 += cfg.block_q) {
    const int64_t bq = std::min(cfg.block_q, T - i0);
    auto qb = q.narrow(-2, i0, bq);
    // FACT: q=torch.randn(2,3,8,4); qb=q.narrow(-2,0,4); assert is_view_of(qb,q)
    qb.mul_(scale); // EXPECT: tensor-alias-then-mutate
    auto stat_shape = qb.sizes().vec();
    stat_shape.back() = 1;
    auto m = torch::full(stat_shape, neg_inf, q.options());
    auto l = torch::zeros(stat_shape, q.options());
    auto acc = torch::zeros(qb.sizes(), q.options());

    const int64_t k_end = cfg.causal ? std::min(S, i0 + bq + (S - T)) : S;
    for (int64_t j0 = 0; j0 < k_end; j0 += cfg.block_k) {
      const int64_t bk = std::min(cfg.block_k, k_end - j0);
      auto kb = k.narrow(-2, j0, bk);
      auto vb = v.narrow(-2, j0, bk);
      // FACT: q=torch.randn(2,3,8,4); qb=q.narrow(-2,0,4); assert not is_contiguous(qb) and is_copy_of(qb.contiguous(), q)
      auto s = torch::matmul(qb.contiguous(), kb.transpose(-2, -1)); // EXPECT: tensor-clone-in-loop
      if (cfg.causal && j0 + bk - 1 > i0 + (S - T)) {
        auto qi = torch::arange(i0 + (S - T), i0 + (S - T) + bq, torch::kLong).unsqueeze(1);
        auto kj = torch::arange(j0, j0 + bk, torch::kLong).unsqueeze(0);
        s.masked_fill_(kj > qi, neg_inf); // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not the scores it returns
      }
      auto m_new = torch::maximum(m, s.amax(-1, true));
      auto p = torch::exp(s - m_new);
      auto corr = torch::exp(m - m_new);
      l = l * corr + p.sum(-1, true);
      if (training && cfg.dropout > 0.0) {
        auto keep = torch::bernoulli(torch::full_like(p, 1.0 - cfg.dropout));
        // FACT: s=torch.randn(2,3,requires_grad=True); p=torch.exp(s); p.mul_(torch.ones(2,3)); assert backward_fails(lambda: p.sum().backward())
        p.mul_(keep / (1.0 - cfg.dropout)); // EXPECT: tensor-inplace-on-saved
      }
      acc = acc * corr + torch::matmul(p, vb);
      m = m_new;
    }
    out.narrow(-2, i0, bq).copy_(acc / l);
  }
  return out;
}

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const ModelConfig& cfg) : cfg_(cfg) {
    qkv = register_module("qkv", torch::nn::Linear(cfg.d_model, 3 * cfg.d_model));
    proj = register_module("proj", torch::nn::Linear(cfg.d_model, cfg.d_model));
    {
      torch::NoGradGuard no_grad;
      proj->weight.mul_(1.0 / std::sqrt(2.0 * cfg.n_layers)); // LOOKALIKE: tensor-inplace-on-leaf -- scaled inside a NoGradGuard scope
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    const int64_t H = cfg_.n_heads, Dh = C / H;
    // FACT: a=torch.randn(2,5,24); assert is_view_of(a.view(2,5,3,8), a)
    auto packed = qkv(x).view({B, T, 3, C}); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous; the permute comes after the view
    // FACT: a=torch.randn(2,5,24); p=a.view(2,5,3,8).permute(2,0,1,3); assert not is_contiguous(p) and is_view_of(p.reshape(3,2,5,4,2), a)
    auto heads = packed.permute({2, 0, 1, 3}).reshape({3, B, T, H, Dh}).transpose(2, 3); // LOOKALIKE: tensor-reshape-non-contiguous -- only splits the last dim, still unit-stride: a view
    auto y = tiled_attention(heads[0], heads[1], heads[2], cfg_.attn, is_training());
    // FACT: o=torch.randn(2,4,8,3); assert is_copy_of(o.transpose(1,2).reshape(2,8,12), o)
    return proj(y.transpose(1, 2).reshape({B, T, C})); // EXPECT: tensor-reshape-non-contiguous
  }

  ModelConfig cfg_;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const ModelConfig& cfg) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    attn = register_module("attn", CausalSelfAttention(cfg));
    mlp = register_module("mlp", torch::nn::Sequential(
        torch::nn::Linear(cfg.d_model, 4 * cfg.d_model), torch::nn::GELU(),
        torch::nn::Linear(4 * cfg.d_model, cfg.d_model)));
  }

  torch::Tensor forward(torch::Tensor x) {
    auto residual = x.clone(); // EXPECT: tensor-unnecessary-clone
    x = attn(ln1(x));
    x = residual + x;
    return x + mlp->forward(ln2(x));
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Sequential mlp{nullptr};
};
TORCH_MODULE(Block);

struct TinyGPTImpl : torch::nn::Module {
  explicit TinyGPTImpl(const ModelConfig& cfg) {
    tok = register_module("tok", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
    pos = register_parameter("pos", torch::zeros({1, cfg.seq_len, cfg.d_model}));
    torch::nn::init::normal_(pos, 0.0, 0.02);
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      blocks.push_back(register_module("h" + std::to_string(i), Block(cfg)));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab_size).bias(false)));
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    auto x = tok(ids) + pos.narrow(1, 0, ids.size(1));
    for (auto& blk : blocks) x = blk(x);
    return head(ln_f(x));
  }

  torch::nn::Embedding tok{nullptr};
  torch::Tensor pos;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TinyGPT);

struct Case {
  int64_t B, H, T, S, D;
  bool causal;
};

bool check_against_naive(const AttentionConfig& base, torch::Device device) {
  torch::NoGradGuard no_grad;
  const std::vector<Case> cases = {
      {2, 4, 128, 128, 32, true}, {1, 2, 100, 100, 64, true}, {2, 3, 64, 192, 16, false}, {1, 1, 37, 37, 8, true}};
  auto max_err = torch::zeros({static_cast<int64_t>(cases.size())}, torch::TensorOptions().device(device));
  auto causal_err = torch::zeros({}, torch::TensorOptions().device(device));
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& cs = cases[c];
    AttentionConfig cfg = base;
    cfg.causal = cs.causal;
    cfg.dropout = 0.0;
    auto q = torch::randn({cs.B, cs.H, cs.T, cs.D}).to(device); // LOOKALIKE: tensor-clone-in-loop -- fresh random inputs for every case
    auto k = torch::randn({cs.B, cs.H, cs.S, cs.D}).to(device);
    auto v = torch::randn_like(k);

    auto got = tiled_attention(q, k, v, cfg, /*training=*/false);
    if (cs.causal) {
      auto k2 = k.clone(); // LOOKALIKE: tensor-unnecessary-clone -- k is still needed by the reference below; only one row of the copy changes
      k2.narrow(-2, cs.S - 1, 1).normal_();
      auto got2 = tiled_attention(q, k2, v, cfg, /*training=*/false);
      auto early = (got.narrow(-2, 0, cs.T - 1) - got2.narrow(-2, 0, cs.T - 1)).abs().max();
      causal_err = torch::maximum(causal_err, early);
    }
    auto ref = naive_attention(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble), cs.causal);
    auto err = (got.to(torch::kDouble) - ref).abs().max();
    max_err.narrow(0, static_cast<int64_t>(c), 1).copy_(err); // EXPECT: tensor-copy-narrowing
  }
  auto errs = max_err.cpu();
  for (size_t c = 0; c < cases.size(); ++c)
    std::cout << "case " << c << " max |tiled - naive| = " << errs[c].item<float>() << std::endl;
  std::cout << "future-key leak " << causal_err.item<double>() << std::endl;
  return errs.max().item<float>() < 1e-4f && causal_err.item<double>() < 1e-6;
}

void train(TinyGPT& model, const torch::Tensor& data, const ModelConfig& cfg, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.9, 0.95}));
  auto offsets = torch::arange(cfg.seq_len, torch::kLong).unsqueeze(0);
  auto window_loss = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t skipped = 0;
  model->train();
  for (int64_t step = 0; step < cfg.steps; ++step) {
    auto starts = torch::randint(0, data.size(0) - cfg.seq_len - 1, {cfg.batch_size, 1}, torch::kLong);
    auto pos = starts + offsets;
    auto x = data.index({pos}).to(device);
    auto y = data.index({pos + 1}).to(device);

    auto logits = model->forward(x);
    auto loss = F::cross_entropy(logits.view({-1, cfg.vocab_size}), y.view({-1}));
    if (loss.item<double>() > cfg.max_loss_spike) { // LOOKALIKE: tensor-sync-in-loop -- the value decides whether this step is applied
      ++skipped;
      continue;
    }
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    // FACT: p=torch.nn.Parameter(torch.randn(3)); assert raises(lambda: p.mul_(0.99), "leaf Variable that requires grad")
    for (auto& p : model->parameters()) p.mul_(1.0 - cfg.lr * cfg.weight_decay); // EXPECT: tensor-inplace-on-leaf

    window_loss += loss; // EXPECT: tensor-graph-kept-across-iterations
    if ((step + 1) % cfg.log_every == 0) {
      std::cout << "step " << step + 1 << " loss " << window_loss.item<double>() / cfg.log_every
                << " skipped " << skipped << std::endl;
      window_loss = torch::zeros({}, torch::TensorOptions().device(device));
    }
  }
}

int main() {
  torch::manual_seed(0);
  ModelConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  if (!check_against_naive(cfg.attn, device)) {
    std::cerr << "tiled attention does not match the reference" << std::endl;
    return 1;
  }
  auto data = torch::randint(0, cfg.vocab_size, {1 << 20}, torch::kLong);
  TinyGPT model(cfg);
  model->to(device);
  train(model, data, cfg, device);
  torch::save(model, "tiny_gpt_tiled.pt");
  return 0;
}
