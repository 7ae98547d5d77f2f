// Decoder-only language model with rotary position embeddings (RoPE): cos/sin tables cached as
// buffers, NeoX-style rotate_half (halves) or GPT-J-style interleaved pairs, a per-layer key/value
// cache for incremental decoding, and sampling with a frequency penalty and banned tokens.
#include <torch/torch.h>
#include <cmath>
#include <limits>
#include <vector>

struct RopeConfig {
  int64_t vocab = 32000, d_model = 768, n_heads = 12, n_layers = 12, max_seq = 4096;
  double rope_base = 10000.0, temperature = 0.8, freq_penalty = 0.3;
  bool interleaved = false;
  int64_t eos_id = 2, max_new_tokens = 256;
};

struct KVCache {
  torch::Tensor k, v; // [B, H, T_past, hd], already rotated
};

// cos/sin tables [max_seq, hd]; row p holds the angles of position p, the two halves repeated.
struct RotaryEmbeddingImpl : torch::nn::Module {
  RotaryEmbeddingImpl(int64_t head_dim, int64_t max_seq, double base) {
    auto inv_freq = 1.0 / torch::pow(base, torch::arange(0, head_dim, 2).to(torch::kFloat) / double(head_dim));
    auto t = torch::arange(max_seq).to(torch::kFloat);
    auto freqs = torch::outer(t, inv_freq); // [max_seq, hd / 2]
    auto emb = torch::cat({freqs, freqs}, -1);
    cos_ = register_buffer("cos_cached", emb.cos());
    sin_ = register_buffer("sin_cached", emb.sin());
  }
  std::pair<torch::Tensor, torch::Tensor> forward(int64_t offset, int64_t T) {
    return {cos_.narrow(0, offset, T), sin_.narrow(0, offset, T)};
  }
  torch::Tensor cos_, sin_;
};
TORCH_MODULE(RotaryEmbedding);

torch::Tensor rotate_half(const torch::Tensor &x) {
  auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

// x [B, H, T, hd], cos/sin [T, hd] broadcast over batch and heads.
torch::Tensor apply_rotary(const torch::Tensor &x, const torch::Tensor &cos, const torch::Tensor &sin) {
  auto out = x.clone(); // EXPECT: tensor-unnecessary-clone -- rewritten by mul_ at once: x * cos is the same tensor in one pass
  out.mul_(cos);
  out.addcmul_(rotate_half(x), sin);
  return out;
}

// GPT-J layout: xp [B, H, T, hd / 2, 2] holds (even, odd) pairs; cos/sin [T, hd / 2].
torch::Tensor rotate_interleaved(const torch::Tensor &xp, const torch::Tensor &cos, const torch::Tensor &sin) {
  auto x0 = xp.select(-1, 0), x1 = xp.select(-1, 1);
  auto rotated = torch::stack({x0 * cos - x1 * sin, x0 * sin + x1 * cos}, -1);
  // FACT: r = torch.stack([torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)], -1); assert is_contiguous(r) and is_view_of(r.flatten(-2), r)
  return rotated.flatten(-2); // LOOKALIKE: tensor-reshape-non-contiguous -- stack allocates a contiguous result: flattening the pairs is a view
}

torch::Tensor merge_heads(const torch::Tensor &y) {
  // FACT: y = torch.randn(2, 4, 3, 5); assert raises(lambda: y.transpose(1, 2).view(2, 3, -1), "view size is not compatible")
  return y.transpose(1, 2).view({y.size(0), y.size(2), -1}); // EXPECT: tensor-view-non-contiguous -- heads and head_dim are not adjacent after the swap
}

struct RopeAttentionImpl : torch::nn::Module {
  explicit RopeAttentionImpl(const RopeConfig &cfg)
      : n_heads_(cfg.n_heads), head_dim_(cfg.d_model / cfg.n_heads), interleaved_(cfg.interleaved) {
    q_ = register_module("q", torch::nn::Linear(cfg.d_model, cfg.d_model));
    k_ = register_module("k", torch::nn::Linear(cfg.d_model, cfg.d_model));
    v_ = register_module("v", torch::nn::Linear(cfg.d_model, cfg.d_model));
    o_ = register_module("o", torch::nn::Linear(cfg.d_model, cfg.d_model));
    rotary_ = register_module("rotary", RotaryEmbedding(head_dim_, cfg.max_seq, cfg.rope_base));
  }

  // x [B, T, C]; pad_mask [B, 1, 1, L] (true = padding key) or undefined.
  torch::Tensor forward(const torch::Tensor &x, KVCache *cache, int64_t offset, const torch::Tensor &pad_mask) {
    const auto B = x.size(0), T = x.size(1);
    // FACT: y = torch.nn.Linear(8, 8)(torch.randn(2, 3, 8)); assert is_view_of(y.view(2, 3, 2, 4), y)
    auto q = q_(x).view({B, T, n_heads_, head_dim_}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous: the split comes before the transpose
    auto k = k_(x).view({B, T, n_heads_, head_dim_}).transpose(1, 2);
    auto v = v_(x).view({B, T, n_heads_, head_dim_}).transpose(1, 2);

    auto [cos, sin] = rotary_(offset, T);
    if (interleaved_) {
      auto half_cos = cos.narrow(-1, 0, head_dim_ / 2), half_sin = sin.narrow(-1, 0, head_dim_ / 2);
      // FACT: q = torch.randn(2, 5, 4, 8).transpose(1, 2); assert not is_contiguous(q) and is_view_of(q.view(2, 4, 5, 4, 2), q)
      auto qp = q.view({B, n_heads_, T, head_dim_ / 2, 2}); // LOOKALIKE: tensor-view-non-contiguous -- only the last dim (stride 1) is split
      auto kp = k.view({B, n_heads_, T, head_dim_ / 2, 2});
      q = rotate_interleaved(qp, half_cos, half_sin);
      k = rotate_interleaved(kp, half_cos, half_sin);
    } else {
      q = apply_rotary(q, cos, sin);
      k = apply_rotary(k, cos, sin);
    }
    // FACT: l = torch.nn.Linear(8, 8); x = l(torch.randn(2, 5, 8)); c = torch.randn(5, 8); q = x * c + x.flip(-1) * c; q.mul_(0.5); (q @ x.transpose(1, 2)).sum().backward(); assert l.weight.grad is not None
    q.mul_(1.0 / std::sqrt(double(head_dim_))); // LOOKALIKE: tensor-inplace-on-saved -- the rotation's sum saved nothing; the matmul below saves q after the write

    if (cache != nullptr) {
      if (cache->k.defined()) {
        k = torch::cat({cache->k, k}, 2);
        v = torch::cat({cache->v, v}, 2);
      }
      cache->k = k;
      cache->v = v;
    }
    const auto L = k.size(2);
    auto scores = torch::matmul(q, k.transpose(-2, -1)); // [B, H, T, L]
    if (T > 1) {
      auto causal = torch::ones({T, L}, x.options().dtype(torch::kBool)).triu(L - T + 1);
      scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    }
    if (pad_mask.defined())
      scores = scores.masked_fill(pad_mask, -std::numeric_limits<float>::infinity());
    auto probs = torch::softmax(scores, -1);
    if (pad_mask.defined()) {
      // FACT: q = torch.nn.Linear(4, 4)(torch.randn(2, 3, 4)); p = torch.softmax(q @ q.transpose(1, 2), -1); p.masked_fill_(torch.tensor([True, False]).view(2, 1, 1), 0.0); assert backward_fails(lambda: p.sum().backward())
      probs.masked_fill_(pad_mask.all(-1, /*keepdim=*/true), 0.0); // EXPECT: tensor-inplace-on-saved -- zeroes the NaN rows of all-padding sequences, but softmax saved its result
    }
    auto y = torch::matmul(probs, v); // [B, H, T, hd]
    return o_(merge_heads(y));
  }

  int64_t n_heads_, head_dim_;
  bool interleaved_;
  torch::nn::Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr};
  RotaryEmbedding rotary_{nullptr};
};
TORCH_MODULE(RopeAttention);

struct DecoderLayerImpl : torch::nn::Module {
  explicit DecoderLayerImpl(const RopeConfig &cfg) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    attn_ = register_module("attn", RopeAttention(cfg));
    mlp_ = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(cfg.d_model, 4 * cfg.d_model), torch::nn::GELU(),
                                                        torch::nn::Linear(4 * cfg.d_model, cfg.d_model)));
  }
  torch::Tensor forward(torch::Tensor x, KVCache *cache, int64_t offset, const torch::Tensor &pad_mask) {
    auto residual = x;
    x = ln1_(x);
    x = attn_(x, cache, offset, pad_mask);
    // FACT: x = torch.randn(2, 3, 4); r = x; x = torch.nn.Linear(4, 4)(x); x += r; assert not shares_storage(x, r)
    x += residual; // LOOKALIKE: tensor-alias-then-mutate -- x was rebound to the attention output before the write
    return x + mlp_->forward(ln2_(x));
  }
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  RopeAttention attn_{nullptr};
  torch::nn::Sequential mlp_{nullptr};
};
TORCH_MODULE(DecoderLayer);

struct RopeLMImpl : torch::nn::Module {
  explicit RopeLMImpl(const RopeConfig &cfg) {
    embed_ = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    layers_ = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      layers_->push_back(DecoderLayer(cfg));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    head_ = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));
  }
  // ids [B, T] -> logits [B, T, vocab]; caches holds one entry per layer (or is empty for training).
  torch::Tensor forward(const torch::Tensor &ids, std::vector<KVCache> &caches, int64_t offset,
                        const torch::Tensor &pad_mask = {}) {
    auto h = embed_(ids);
    for (size_t i = 0; i < layers_->size(); ++i)
      h = layers_[i]->as<DecoderLayer>()->forward(h, caches.empty() ? nullptr : &caches[i], offset, pad_mask);
    return head_(norm_(h));
  }
  torch::nn::Embedding embed_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(RopeLM);

std::vector<int64_t> generate(RopeLM &model, const std::vector<int64_t> &prompt, const std::vector<int64_t> &banned,
                              const RopeConfig &cfg) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();

  std::vector<KVCache> caches(cfg.n_layers);
  auto banned_ids = torch::tensor(banned);
  auto counts = torch::zeros({cfg.vocab});
  auto step_in = torch::tensor(prompt).unsqueeze(0).to(device);
  std::vector<int64_t> out = prompt;
  int64_t offset = 0;
  for (int64_t t = 0; t < cfg.max_new_tokens; ++t) {
    auto logits = model->forward(step_in, caches, offset).select(1, -1); // LOOKALIKE: tensor-device-mismatch -- the prompt was moved to the model's device
    offset += step_in.size(1);
    logits = logits - cfg.freq_penalty * counts; // EXPECT: tensor-device-mismatch -- the token counts were made on the CPU, the logits are on CUDA
    auto ban = banned_ids.to(device); // EXPECT: tensor-clone-in-loop -- the same banned ids are copied to the GPU at every step
    logits.index_fill_(1, ban, -std::numeric_limits<float>::infinity());
    auto probs = torch::softmax(logits / cfg.temperature, -1);
    auto next = torch::multinomial(probs, 1); // [1, 1]
    const int64_t tok = next.item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- the token decides whether to stop and is the output
    if (tok == cfg.eos_id)
      break;
    out.push_back(tok);
    counts[tok] += 1;
    step_in = next;
  }
  return out;
}

// Next-token loss of one batch from the data loader (inputs and targets shifted by one token).
torch::Tensor lm_loss(RopeLM &model, const torch::Tensor &inputs, const torch::Tensor &targets, const torch::Tensor &pad_mask) {
  std::vector<KVCache> no_cache;
  auto logits = model->forward(inputs, no_cache, 0, pad_mask);
  // FACT: l = torch.randn(2, 5, 7); assert is_view_of(l.reshape(-1, 7), l)
  return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1})); // LOOKALIKE: tensor-reshape-non-contiguous -- the head's output and the loader's targets are contiguous: views
}
