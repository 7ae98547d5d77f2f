// Contrastive decoding (Li et al.): pick tokens that the expert model likes much more
// than a small amateur model does, restricted to the expert's plausible set.
// Batched greedy generation with left-padded prompts, a shared instruction prefix
// and per-model key/value caches (the amateur keeps a sliding window).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct LMConfig {
  int64_t vocab_size;
  int64_t d_model;
  int64_t n_head;
  int64_t n_layer;
  int64_t max_pos;
};

struct CDConfig {
  double alpha = 0.1;               // keep tokens with p_expert >= alpha * max p_expert
  double beta = 1.0;                // weight of the amateur log-probs
  double amateur_temperature = 0.5;
  int64_t max_new_tokens = 128;
  int64_t amateur_window = 128;
  int64_t eos_id = 2;
  int64_t pad_id = 0;
  std::vector<int64_t> banned_ids;
};

struct KVCache {
  std::vector<torch::Tensor> kv;  // one per layer, keys and values stacked in front
  int64_t len = 0;
  int64_t window = 0;             // > 0: keep only the most recent `window` positions

  KVCache(const LMConfig& cfg, int64_t batch, int64_t capacity, int64_t window_, const torch::TensorOptions& opts)
      : window(window_) {
    const auto head_dim = cfg.d_model / cfg.n_head;
    for (int64_t i = 0; i < cfg.n_layer; ++i)
      kv.push_back(torch::zeros({2, batch, cfg.n_head, capacity, head_dim}, opts));
  }

  int64_t capacity() const { return kv.front().size(3); }

  // The prefix was run once with batch 1; reuse its keys/values for every row.
  void broadcast_prefix(int64_t batch) {
    for (auto& t : kv) t = t.expand({2, batch, -1, -1, -1});
  }

  // Slot of the next `n` positions; slides the window when the cache is full.
  int64_t reserve(int64_t n) {
    if (window == 0 || len + n <= capacity()) return len;
    const auto drop = len + n - capacity();
    const auto keep = len - drop;
    // FACT: k = torch.arange(48.).view(2, 1, 1, 6, 4); d = k.narrow(3, 0, 4); s = k.narrow(3, 2, 4); assert shares_storage(d, s) and set(d.flatten().tolist()) & set(s.flatten().tolist())
    for (auto& t : kv) t.narrow(3, 0, keep).copy_(t.narrow(3, drop, keep)); // EXPECT: tensor-inplace-overlap
    len = keep;
    return len;
  }

  torch::Tensor write(int64_t layer, int64_t start, const torch::Tensor& k, const torch::Tensor& v) {
    auto& t = kv[layer];
    // FACT: c = torch.zeros(2, 1, 2, 6, 4).expand(2, 3, 2, 6, 4); assert raises(lambda: c.narrow(3, 4, 1).copy_(torch.randn(2, 3, 2, 1, 4)), "more than one element")
    t.narrow(3, start, k.size(2)).copy_(torch::stack({k, v})); // EXPECT: tensor-inplace-on-expanded
    return t.narrow(3, 0, start + k.size(2));
  }
};

class CachedAttentionImpl : public torch::nn::Module {
 public:
  explicit CachedAttentionImpl(const LMConfig& cfg) : n_head_(cfg.n_head), head_dim_(cfg.d_model / cfg.n_head) {
    c_attn = register_module("c_attn", torch::nn::Linear(cfg.d_model, 3 * cfg.d_model));
    c_proj = register_module("c_proj", torch::nn::Linear(cfg.d_model, cfg.d_model));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_mask, KVCache& cache, int64_t layer,
                        int64_t start) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto qkv = c_attn(x).chunk(3, -1);
    // FACT: x = torch.randn(2, 5, 48).chunk(3, -1)[0]; assert not is_contiguous(x) and is_view_of(x.view(2, 5, 4, 4), x)
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head_, head_dim_}).transpose(1, 2); }; // LOOKALIKE: tensor-view-non-contiguous -- splitting the last dim works on the chunk's strides
    auto q = heads(qkv[0]);
    auto kv = cache.write(layer, start, heads(qkv[1]), heads(qkv[2]));
    auto k = kv[0], v = kv[1];
    const auto S = k.size(2);

    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    // causal inside the new tokens, and no attention to left padding
    auto causal = torch::ones({T, S}, key_mask.options().dtype(torch::kBool)).tril(S - T);
    auto visible = causal.logical_and(key_mask.view({B, 1, 1, S}));
    // FACT: s = torch.randn(2, 4, 3, 5); m = (torch.rand(2, 1, 3, 5) > 0.5).expand_as(s); assert m.stride(1) == 0 and not raises(lambda: s.masked_fill_(m, float('-inf')))
    scores.masked_fill_(visible.logical_not().expand_as(scores), -std::numeric_limits<float>::infinity()); // LOOKALIKE: tensor-inplace-on-expanded -- only the mask is expanded; the scores written are dense
    auto att = torch::softmax(scores, -1);
    att.nan_to_num_(0.0); // LOOKALIKE: tensor-inplace-on-saved -- these models only run under NoGradGuard, nothing is saved for backward
    // FACT: a = torch.randn(2, 4, 3, 4).transpose(1, 2).contiguous(); assert is_contiguous(a) and is_view_of(a.view(2, 3, 16), a)
    auto out = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
    return c_proj(out);
  }

  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t n_head_, head_dim_;
};
TORCH_MODULE(CachedAttention);

class CachedBlockImpl : public torch::nn::Module {
 public:
  explicit CachedBlockImpl(const LMConfig& cfg) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    attn = register_module("attn", CachedAttention(cfg));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    fc = register_module("fc", torch::nn::Linear(cfg.d_model, 4 * cfg.d_model));
    proj = register_module("proj", torch::nn::Linear(4 * cfg.d_model, cfg.d_model));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& key_mask, KVCache& cache, int64_t layer,
                        int64_t start) {
    x = x + attn->forward(ln1(x), key_mask, cache, layer, start);
    return x + proj(F::gelu(fc(ln2(x))));
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CachedAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(CachedBlock);

class CachedLMImpl : public torch::nn::Module {
 public:
  explicit CachedLMImpl(const LMConfig& cfg) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(cfg.max_pos, cfg.d_model));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layer; ++i) blocks->push_back(CachedBlock(cfg));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab_size).bias(false)));
  }

  // ids: the new tokens; attn: validity of every position fed so far, the new ones included.
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& attn, KVCache& cache) {
    const auto T = ids.size(1), total = attn.size(1);
    const auto start = cache.reserve(T);
    auto key_mask = attn.narrow(1, total - (start + T), start + T);
    // positions count real tokens only, so left padding does not shift them
    auto pos = attn.to(torch::kLong).cumsum(1).sub_(1).clamp_min_(0).narrow(1, total - T, T);
    auto x = tok_emb(ids) + pos_emb(pos);
    for (size_t i = 0; i < blocks->size(); ++i)
      x = blocks[i]->as<CachedBlock>()->forward(x, key_mask, cache, static_cast<int64_t>(i), start);
    cache.len = start + T;
    return lm_head(ln_f(x));
  }

  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(CachedLM);

// Returns the contrastive scores (-inf outside the plausible set) and the plausible set.
std::pair<torch::Tensor, torch::Tensor> contrastive_scores(const torch::Tensor& expert_logp,
                                                           const torch::Tensor& amateur_logp, const CDConfig& cfg) {
  auto cutoff = expert_logp.amax(-1, /*keepdim=*/true) + std::log(cfg.alpha);
  auto plausible = expert_logp.ge(cutoff);
  auto scores = expert_logp;
  // FACT: e = torch.randn(2, 10).log_softmax(-1); s = e; s.sub_(torch.randn(2, 10)); assert s is e and shares_storage(s, e)
  scores.sub_(amateur_logp.mul(cfg.beta)); // EXPECT: tensor-alias-then-mutate
  // FACT: x = torch.randn(2, 5); m = x > 0; assert torch.equal(x.clone().masked_fill_(m, 0.0), x.masked_fill(m, 0.0))
  auto masked = scores.clone().masked_fill_(plausible.logical_not(), -std::numeric_limits<float>::infinity()); // EXPECT: tensor-unnecessary-clone
  return {masked, plausible};
}

struct Generation {
  torch::Tensor tokens;   // generated ids, pad after eos
  torch::Tensor logprob;  // expert log-probability of each continuation
  double mean_plausible = 0.0;
};

Generation contrastive_generate(CachedLM& expert, CachedLM& amateur, const LMConfig& ecfg, const LMConfig& acfg,
                                const torch::Tensor& prefix_ids, const torch::Tensor& prompt_ids,
                                const torch::Tensor& prompt_mask, const CDConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  expert->eval();
  amateur->eval();
  const auto B = prompt_ids.size(0), L = prompt_ids.size(1), P = prefix_ids.size(0);
  const auto bool_opts = torch::TensorOptions().dtype(torch::kBool).device(device);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  KVCache ecache(ecfg, 1, P + L + cfg.max_new_tokens, 0, expert->lm_head->weight.options());
  KVCache acache(acfg, 1, cfg.amateur_window, cfg.amateur_window, amateur->lm_head->weight.options());
  auto prefix = prefix_ids.to(device).unsqueeze(0);
  auto prefix_mask = torch::ones({1, P}, bool_opts);
  expert->forward(prefix, prefix_mask, ecache);
  amateur->forward(prefix, prefix_mask, acache);
  ecache.broadcast_prefix(B);
  acache.broadcast_prefix(B);

  auto ids = torch::empty({B, L}, torch::TensorOptions().dtype(torch::kLong).device(device));
  // FACT: d = torch.empty(2, 3, dtype=torch.long); d.copy_(torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)); assert d.dtype == torch.long and d[1, 2].item() == 6
  ids.copy_(prompt_ids); // LOOKALIKE: tensor-device-mismatch -- copy_ accepts a host source // LOOKALIKE: tensor-copy-narrowing -- the tokenizer's int32 ids widen to int64
  auto attn = torch::cat({prefix_mask.expand({B, P}), prompt_mask.to(device)}, 1);

  auto banned_cpu = torch::tensor(cfg.banned_ids, torch::kLong);
  auto generated = torch::full({B, cfg.max_new_tokens}, cfg.pad_id, torch::TensorOptions().dtype(torch::kInt).device(device));
  auto seq_logprob = torch::zeros({B}, torch::TensorOptions().device(device));
  auto finished = torch::zeros({B}, torch::kBool);
  double plausible_total = 0.0;
  int64_t steps = 0;

  auto step_ids = ids;
  for (int64_t t = 0; t < cfg.max_new_tokens; ++t) {
    steps = t + 1;
    auto e_logits = expert->forward(step_ids, attn, ecache).select(1, -1);
    auto a_logits = amateur->forward(step_ids, attn, acache).select(1, -1).to(torch::kFloat); // LOOKALIKE: tensor-clone-in-loop -- new logits every step; the conversion cannot be hoisted
    // FACT: h = torch.randn(2, 1, 10).half(); f = h.select(1, -1).float(); assert is_copy_of(f, h) and is_copy_of(f.amax(-1, keepdim=True), f)
    a_logits.sub_(a_logits.amax(-1, /*keepdim=*/true)); // LOOKALIKE: tensor-alias-then-mutate -- the amateur runs in half, so to(kFloat) made a copy (else a view of its temporary output) // LOOKALIKE: tensor-inplace-overlap -- amax returns a new tensor
    auto e_logp = torch::log_softmax(e_logits.to(torch::kFloat), -1);
    auto a_logp = torch::log_softmax(a_logits / cfg.amateur_temperature, -1);

    auto [scores, plausible] = contrastive_scores(e_logp, a_logp, cfg);
    if (banned_cpu.numel() > 0) scores.index_fill_(-1, banned_cpu.to(device), neg_inf); // EXPECT: tensor-clone-in-loop
    plausible_total += plausible.sum(-1).to(torch::kFloat).mean().item<double>(); // EXPECT: tensor-sync-in-loop

    auto next = scores.argmax(-1);
    next = torch::where(finished, torch::full_like(next, cfg.pad_id), next); // EXPECT: tensor-device-mismatch
    // FACT: g = torch.zeros(2, 3, dtype=torch.int32); g[:, 0].copy_(torch.tensor([2**33 + 5, 7])); assert g.dtype == torch.int32 and g[0, 0].item() != 2**33 + 5
    generated.select(1, t).copy_(next); // EXPECT: tensor-copy-narrowing
    seq_logprob += e_logp.gather(-1, next.unsqueeze(-1)).squeeze(-1);

    finished.logical_or_(next.eq(cfg.eos_id).cpu()); // LOOKALIKE: tensor-sync-in-loop -- the flags decide when the whole batch can stop
    if (finished.all().item<bool>()) break;
    step_ids = next.unsqueeze(1);
    attn = torch::cat({attn, torch::ones({B, 1}, bool_opts)}, 1);
  }

  Generation out;
  out.tokens = generated.cpu();
  out.logprob = seq_logprob.cpu();
  out.mean_plausible = plausible_total / static_cast<double>(std::max<int64_t>(steps, 1));
  return out;
}

// Left-pads tokenizer output into one int32 batch plus its validity mask.
std::pair<torch::Tensor, torch::Tensor> left_pad(const std::vector<std::vector<int32_t>>& prompts, int32_t pad_id) {
  size_t L = 0;
  for (const auto& p : prompts) L = std::max(L, p.size());
  const auto B = static_cast<int64_t>(prompts.size());
  auto ids = torch::full({B, static_cast<int64_t>(L)}, pad_id, torch::kInt);
  auto mask = torch::zeros({B, static_cast<int64_t>(L)}, torch::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const auto n = static_cast<int64_t>(prompts[b].size());
    ids[b].narrow(0, static_cast<int64_t>(L) - n, n).copy_(torch::tensor(prompts[b], torch::kInt));
    mask[b].narrow(0, static_cast<int64_t>(L) - n, n).fill_(true);
  }
  return {ids, mask};
}

int main(int argc, char** argv) {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const LMConfig ecfg{32000, 1024, 16, 16, 2048};
  const LMConfig acfg{32000, 384, 6, 4, 2048};
  CachedLM expert(ecfg), amateur(acfg);
  if (argc > 2) {
    torch::load(expert, argv[1]);
    torch::load(amateur, argv[2]);
  }
  expert->to(device);
  amateur->to(device, device.is_cuda() ? torch::kHalf : torch::kFloat);

  CDConfig cfg;
  cfg.banned_ids = {1, 3};
  auto prefix = torch::tensor(std::vector<int64_t>{1, 518, 25580, 29962, 3532, 14816, 29903, 6778}, torch::kLong);
  std::vector<std::vector<int32_t>> prompts = {{450, 4996, 17354, 1701, 29916}, {1724, 338, 278}, {3295, 3143, 263, 26576}};
  auto [prompt_ids, prompt_mask] = left_pad(prompts, static_cast<int32_t>(cfg.pad_id));

  auto gen = contrastive_generate(expert, amateur, ecfg, acfg, prefix, prompt_ids, prompt_mask, cfg, device);
  std::cout << gen.tokens << "\nlogprob " << gen.logprob << "\nplausible set " << gen.mean_plausible << std::endl;
  return 0;
}
