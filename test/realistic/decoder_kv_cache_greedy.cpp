// Greedy decoding for a small decoder-only language model with a per-layer key/value cache
// and a CTRL-style repetition penalty.
#include <torch/torch.h>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

struct DecoderConfig {
  int64_t vocab = 32000, d_model = 512, n_head = 8, n_layer = 6, max_pos = 2048;
  int64_t eos_id = 2;
  double repetition_penalty = 1.2;
};

struct KVCache {
  torch::Tensor k, v; // [B, H, T_past, hd]
};

struct CachedAttentionImpl : torch::nn::Module {
  explicit CachedAttentionImpl(const DecoderConfig &cfg) : n_head_(cfg.n_head), d_model_(cfg.d_model) {
    qkv_ = register_module("qkv", torch::nn::Linear(cfg.d_model, 3 * cfg.d_model));
    out_ = register_module("out", torch::nn::Linear(cfg.d_model, cfg.d_model));
  }

  torch::Tensor forward(const torch::Tensor &x, KVCache &cache) {
    const auto B = x.size(0), T = x.size(1), hd = d_model_ / n_head_;
    auto parts = qkv_(x).chunk(3, -1);
    // FACT: y = torch.randn(2, 3, 24); q = y.chunk(3, -1)[0]; assert not is_contiguous(q) and is_view_of(q.reshape(2, 3, 4, 2), y)
    auto q = parts[0].reshape({B, T, n_head_, hd}).transpose(1, 2); // LOOKALIKE: tensor-reshape-non-contiguous -- splitting the last dim of a chunk is a view
    auto k = parts[1].reshape({B, T, n_head_, hd}).transpose(1, 2);
    auto v = parts[2].reshape({B, T, n_head_, hd}).transpose(1, 2);
    if (cache.k.defined()) {
      k = torch::cat({cache.k, k}, 2);
      v = torch::cat({cache.v, v}, 2);
    }
    cache.k = k;
    cache.v = v;

    // FACT: k = torch.randn(2, 3, 4, 5).transpose(1, 2); kt = k.transpose(-2, -1).contiguous(); kt.mul_(0.5); assert is_copy_of(kt, k)
    auto kt = k.transpose(-2, -1).contiguous();
    kt.mul_(1.0 / std::sqrt(double(hd))); // LOOKALIKE: tensor-alias-then-mutate -- contiguous() of a transpose is a copy, the cache is untouched
    auto scores = torch::matmul(q, kt); // [B, H, T, T_past + T]
    if (T > 1) {
      const auto Tk = k.size(2);
      auto future = torch::ones({T, Tk}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(Tk - T + 1);
      scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    }
    auto y = torch::matmul(torch::softmax(scores, -1), v); // [B, H, T, hd]
    // FACT: y = torch.randn(2, 4, 3, 5); assert raises(lambda: y.transpose(1, 2).view(2, 3, 20), "view size is not compatible")
    return out_(y.transpose(1, 2).view({B, T, d_model_})); // EXPECT: tensor-view-non-contiguous -- throws on the prompt pass (T > 1)
  }

  int64_t n_head_, d_model_;
  torch::nn::Linear qkv_{nullptr}, out_{nullptr};
};
TORCH_MODULE(CachedAttention);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const DecoderConfig &cfg) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    attn_ = register_module("attn", CachedAttention(cfg));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    mlp_ = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(cfg.d_model, 4 * cfg.d_model), torch::nn::GELU(),
                                                        torch::nn::Linear(4 * cfg.d_model, cfg.d_model)));
  }
  torch::Tensor forward(torch::Tensor x, KVCache &cache) {
    x = x + attn_->forward(ln1_(x), cache);
    return x + mlp_->forward(ln2_(x));
  }
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CachedAttention attn_{nullptr};
  torch::nn::Sequential mlp_{nullptr};
};
TORCH_MODULE(Block);

struct TinyLMImpl : torch::nn::Module {
  explicit TinyLMImpl(const DecoderConfig &cfg) {
    tok_ = register_module("tok", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    pos_ = register_module("pos", torch::nn::Embedding(cfg.max_pos, cfg.d_model));
    for (int64_t i = 0; i < cfg.n_layer; ++i)
      blocks_.push_back(register_module("block" + std::to_string(i), Block(cfg)));
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    head_ = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));
  }
  // Logits of the last position only; every cache grows by ids.size(1) positions.
  torch::Tensor forward(const torch::Tensor &ids, std::vector<KVCache> &caches) {
    const int64_t past = caches[0].k.defined() ? caches[0].k.size(2) : 0;
    auto pos = torch::arange(past, past + ids.size(1), ids.options());
    auto h = tok_(ids) + pos_(pos);
    for (size_t i = 0; i < blocks_.size(); ++i)
      h = blocks_[i]->forward(h, caches[i]);
    return head_(ln_f_(h.select(1, -1))); // [B, vocab]
  }
  torch::nn::Embedding tok_{nullptr}, pos_{nullptr};
  std::vector<Block> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(TinyLM);

torch::Tensor penalize_repeats(const torch::Tensor &logits, const torch::Tensor &generated, double penalty) {
  auto scores = logits.to(torch::kFloat); // the head may run in half precision
  auto prev = scores.gather(1, generated);
  prev = torch::where(prev > 0, prev / penalty, prev * penalty);
  // FACT: l = torch.randn(2, 5); s = l.to(torch.float32); s.scatter_(1, torch.tensor([[0], [1]]), 0.0); assert shares_storage(s, l) and l[0, 0] == 0
  scores.scatter_(1, generated, prev); // EXPECT: tensor-alias-then-mutate -- float32 logits: to() returned them, the caller's logits are penalised
  return scores;
}

struct Generation {
  torch::Tensor tokens, logprob;
};

Generation greedy_decode(TinyLM &model, const torch::Tensor &prompt, const DecoderConfig &cfg, int64_t max_new) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->to(torch::kCUDA);
  auto tokens = prompt.to(torch::kCUDA); // [B, P]
  const auto B = tokens.size(0);
  std::vector<KVCache> caches(cfg.n_layer);
  auto logprob = torch::zeros({B}, tokens.options().dtype(torch::kFloat));
  auto finished = torch::zeros({B}, torch::kBool);
  auto logits = model->forward(tokens, caches); // LOOKALIKE: tensor-device-mismatch -- the prompt is moved with the model
  for (int64_t step = 0; step < max_new; ++step) {
    auto scores = penalize_repeats(logits, tokens, cfg.repetition_penalty);
    auto next = scores.argmax(-1); // [B]
    finished = finished | (next == cfg.eos_id); // EXPECT: tensor-device-mismatch -- 'finished' was made on the CPU
    logprob += torch::log_softmax(logits, -1).gather(1, next.unsqueeze(1)).squeeze(1);
    tokens = torch::cat({tokens, next.unsqueeze(1)}, 1);
    if (finished.all().item<bool>()) // LOOKALIKE: tensor-sync-in-loop -- the value decides when to stop
      break;
    logits = model->forward(next.unsqueeze(1), caches);
  }
  return {tokens.cpu(), logprob.cpu()};
}
