// Sampling from a small decoder-only LM with an int8 KV cache.
//
// Keys are quantized per channel with scales calibrated on the prompt (keys have
// a few outlier channels, so a per-token scale wastes most of the int8 range);
// values are quantized per token. When the cache is full we keep a handful of
// "attention sink" tokens plus the most recent window, StreamingLLM style.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

using torch::indexing::Slice;

struct DecodeConfig {
  int64_t vocab = 32000;
  int64_t d_model = 512;
  int64_t n_heads = 8;
  int64_t n_layers = 6;
  int64_t ffn_hidden = 1408;
  int64_t cache_capacity = 512;
  int64_t sink_tokens = 4;
  int64_t recent_window = 448;
  int64_t max_new_tokens = 128;
  double temperature = 0.7;
  double key_headroom = 1.25;
  double rope_base = 10000.0;
  int64_t eos_id = 2;
};

// ----------------------------------------------------------------------------
// int8 helpers

// FACT: q = torch.zeros(1, 8, 6, 64, dtype=torch.int8); assert is_copy_of(q.to(torch.float32), q)
torch::Tensor dequantize(const torch::Tensor& q, const torch::Tensor& scale) {
  auto x = q.to(torch::kFloat);
  x.mul_(scale);  // LOOKALIKE: tensor-alias-then-mutate -- int8 -> float always allocates a new tensor
  return x;
}

class QuantizedKVCache {
 public:
  QuantizedKVCache(int64_t batch, int64_t heads, int64_t head_dim, const DecodeConfig& cfg,
                   torch::Device device)
      : capacity_(cfg.cache_capacity), headroom_(cfg.key_headroom) {
    auto i8 = torch::TensorOptions().dtype(torch::kChar).device(device);
    auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
    k_q_ = torch::zeros({batch, heads, capacity_, head_dim}, i8);
    v_q_ = torch::zeros({batch, heads, capacity_, head_dim}, i8);
    k_scale_ = torch::ones({batch, heads, 1, head_dim}, f32);
    v_scale_ = torch::ones({batch, heads, capacity_, 1}, f32);
  }

  bool empty() const { return len_ == 0; }
  int64_t size() const { return len_; }

  // Per-channel absmax over the prompt tokens, with some headroom for later keys.
  void calibrate(const torch::Tensor& k) {
    auto amax = k.abs().amax({2}, /*keepdim=*/true);
    k_scale_.copy_((amax * headroom_ / 127.0).clamp_min(1e-6));
  }

  void append(const torch::Tensor& k, const torch::Tensor& v) {
    const int64_t n = k.size(2);
    TORCH_CHECK(len_ + n <= capacity_, "kv cache overflow, evict first");
    k_q_.narrow(2, len_, n).copy_((k / k_scale_).round());  // EXPECT: tensor-copy-narrowing

    auto v_scale = (v.abs().amax(-1, /*keepdim=*/true) / 127.0).clamp_min(1e-8);
    v_scale_.narrow(2, len_, n).copy_(v_scale);
    v_q_.narrow(2, len_, n).copy_((v / v_scale).round().clamp(-127, 127).to(torch::kChar));  // LOOKALIKE: tensor-copy-narrowing -- rounded, clamped and converted explicitly
    len_ += n;
  }

  std::pair<torch::Tensor, torch::Tensor> dequantized() const {
    return {dequantize(k_q_.narrow(2, 0, len_), k_scale_), values()};
  }

  torch::Tensor values() const {
    return dequantize(v_q_.narrow(2, 0, len_), v_scale_.narrow(2, 0, len_));
  }

  // Single-token step: fold the per-channel key scale into the query instead of
  // dequantizing every cached key.
  // FACT: c = torch.zeros(1, 8, 32, 64, dtype=torch.int8); assert is_view_of(c.narrow(2, 0, 7).view(8, 7, 64), c)
  torch::Tensor decode_scores(const torch::Tensor& q) const {
    const int64_t B = k_q_.size(0), H = k_q_.size(1), D = k_q_.size(3);
    auto keys = k_q_.narrow(2, 0, len_).view({B * H, len_, D});  // LOOKALIKE: tensor-view-non-contiguous -- only the token axis is narrowed, batch and heads still merge
    auto qs = (q * k_scale_).view({B * H, 1, D});
    return torch::bmm(qs, keys.to(torch::kFloat).transpose(1, 2)).view({B, H, 1, len_});
  }

  // Keep the first `sink` tokens and the last `window` ones.
  // FACT: c = torch.zeros(1, 8, 32, 64); a = c.narrow(2, 2, 20); b = c.narrow(2, 8, 20); assert shares_storage(a, b) and b.storage_offset() - a.storage_offset() < 20 * a.stride(2) and not raises(lambda: a.copy_(b))
  // FACT: c = torch.zeros(1, 8, 32, 64, dtype=torch.int8); assert is_copy_of(c.narrow(2, 8, 20).clone(), c)
  void evict(int64_t sink, int64_t window) {
    if (len_ <= sink + window) return;
    const int64_t drop = len_ - sink - window;
    k_q_.narrow(2, sink, window).copy_(k_q_.narrow(2, sink + drop, window));  // EXPECT: tensor-inplace-overlap
    v_q_.narrow(2, sink, window).copy_(v_q_.narrow(2, sink + drop, window).clone());  // LOOKALIKE: tensor-inplace-overlap, tensor-unnecessary-clone -- the clone gives the shifted source its own storage
    v_scale_.narrow(2, sink, window).copy_(v_scale_.narrow(2, sink + drop, window).clone());
    len_ = sink + window;
  }

  // Fraction of cached key rows that reach the int8 limit, i.e. outgrew the calibration.
  // FACT: c = torch.zeros(1, 8, 32, 64, dtype=torch.int8); assert raises(lambda: c.narrow(2, 0, 7).view(-1, 64), "view size is not compatible")
  double saturation() const {
    auto rows = k_q_.narrow(2, 0, len_).view({-1, k_q_.size(3)});  // EXPECT: tensor-view-non-contiguous
    return rows.abs().ge(127).any(-1).to(torch::kFloat).mean().item<double>();
  }

 private:
  int64_t capacity_;
  double headroom_;
  int64_t len_ = 0;
  torch::Tensor k_q_, v_q_, k_scale_, v_scale_;
};

// ----------------------------------------------------------------------------
// model

struct RMSNormImpl : torch::nn::Module {
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({dim}));
  }
  // FACT: x = torch.randn(1, 5, 512); assert shares_storage(x.to(torch.float32), x)
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x.to(torch::kFloat);
    h.mul_(torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_));  // EXPECT: tensor-alias-then-mutate
    return (h * weight).to(x.scalar_type());
  }
  torch::Tensor weight;
  double eps_;
};
TORCH_MODULE(RMSNorm);

struct RotaryImpl : torch::nn::Module {
  RotaryImpl(int64_t head_dim, double base) {
    inv_freq_ = 1.0 / torch::pow(base, torch::arange(0, head_dim, 2, torch::kFloat) / head_dim);
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& positions) {
    auto freqs = torch::outer(positions.to(torch::kFloat), inv_freq_);  // EXPECT: tensor-device-mismatch
    auto cos = freqs.cos(), sin = freqs.sin();
    const int64_t d = x.size(-1);
    auto x1 = x.slice(-1, 0, d, 2), x2 = x.slice(-1, 1, d, 2);
    return torch::stack({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1).flatten(-2);
  }
  torch::Tensor inv_freq_;
};
TORCH_MODULE(Rotary);

struct CachedAttentionImpl : torch::nn::Module {
  explicit CachedAttentionImpl(const DecodeConfig& cfg)
      : n_heads_(cfg.n_heads), head_dim_(cfg.d_model / cfg.n_heads) {
    qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, 3 * cfg.d_model).bias(false)));
    out = register_module("out", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.d_model).bias(false)));
    rope = register_module("rope", Rotary(head_dim_, cfg.rope_base));
    causal_ = register_buffer("causal", torch::ones({cfg.cache_capacity, cfg.cache_capacity}, torch::kBool).triu(1));
  }

  // FACT: c = torch.randn(1, 8, 1, 64); assert is_view_of(c.transpose(1, 2).reshape(1, 1, 512), c)
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& positions, QuantizedKVCache& cache) {
    const int64_t B = x.size(0), T = x.size(1);
    auto parts = qkv->forward(x).view({B, T, 3, n_heads_, head_dim_}).unbind(2);
    auto q = rope->forward(parts[0].transpose(1, 2), positions);
    auto k = rope->forward(parts[1].transpose(1, 2), positions);
    auto v = parts[2].transpose(1, 2);
    if (cache.empty()) cache.calibrate(k);
    cache.append(k, v);
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));

    if (T == 1) {
      auto attn = torch::softmax(cache.decode_scores(q) * scale, -1);
      auto ctx = torch::matmul(attn, cache.values());
      return out->forward(ctx.transpose(1, 2).reshape({B, 1, -1}));  // LOOKALIKE: tensor-reshape-non-contiguous -- with one query token the transpose moves a size-1 dim, still a view
    }
    // prefill: the cache holds exactly the prompt
    // FACT: c = torch.randn(1, 8, 5, 64); assert is_copy_of(c.transpose(1, 2).reshape(1, 5, 512), c)
    auto [keys, values] = cache.dequantized();
    auto scores = torch::matmul(q, keys.transpose(-2, -1)) * scale;
    scores.masked_fill_(causal_.index({Slice(0, T), Slice(0, T)}), -INFINITY);  // LOOKALIKE: tensor-device-mismatch -- registered buffer, moved by model->to(device)
    auto ctx = torch::matmul(torch::softmax(scores, -1), values);
    return out->forward(ctx.transpose(1, 2).reshape({B, T, -1}));  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t n_heads_, head_dim_;
  torch::nn::Linear qkv{nullptr}, out{nullptr};
  Rotary rope{nullptr};
  torch::Tensor causal_;
};
TORCH_MODULE(CachedAttention);

struct DecoderBlockImpl : torch::nn::Module {
  explicit DecoderBlockImpl(const DecodeConfig& cfg) {
    norm1 = register_module("norm1", RMSNorm(cfg.d_model));
    attn = register_module("attn", CachedAttention(cfg));
    norm2 = register_module("norm2", RMSNorm(cfg.d_model));
    fc1 = register_module("fc1", torch::nn::Linear(cfg.d_model, cfg.ffn_hidden));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.ffn_hidden, cfg.d_model));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& positions, QuantizedKVCache& cache) {
    x = x + attn->forward(norm1->forward(x), positions, cache);
    return x + fc2->forward(torch::silu(fc1->forward(norm2->forward(x))));
  }
  RMSNorm norm1{nullptr}, norm2{nullptr};
  CachedAttention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DecoderBlock);

struct TinyLMImpl : torch::nn::Module {
  explicit TinyLMImpl(const DecodeConfig& cfg) {
    embed = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), DecoderBlock(cfg)));
    norm = register_module("norm", RMSNorm(cfg.d_model));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& positions,
                        std::vector<QuantizedKVCache>& caches) {
    auto h = embed->forward(ids);
    for (size_t i = 0; i < blocks.size(); ++i) h = blocks[i]->forward(h, positions, caches[i]);
    return lm_head->forward(norm->forward(h));
  }
  torch::nn::Embedding embed{nullptr};
  std::vector<DecoderBlock> blocks;
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TinyLM);

// ----------------------------------------------------------------------------
// weights

void init_weights(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.dim() == 2) p.normal_(0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
}

// Simulate W8A16 serving: round every matrix through per-output-channel int8.
void fake_quantize_weights(torch::nn::Module& model) {
  for (auto& p : model.parameters()) {
    if (p.dim() != 2) continue;
    auto scale = p.abs().amax(1, /*keepdim=*/true).clamp_min(1e-8) / 127.0;
    p.div_(scale).round_().mul_(scale);  // EXPECT: tensor-inplace-on-leaf
  }
}

// ----------------------------------------------------------------------------
// decoding

std::vector<int64_t> generate(TinyLM& model, const torch::Tensor& prompt, const DecodeConfig& cfg) {
  c10::InferenceMode guard;
  const auto device = prompt.device();
  const int64_t B = prompt.size(0), T0 = prompt.size(1);
  std::vector<QuantizedKVCache> caches;
  for (int64_t i = 0; i < cfg.n_layers; ++i)
    caches.emplace_back(B, cfg.n_heads, cfg.d_model / cfg.n_heads, cfg, device);

  auto positions = torch::arange(T0, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto logits = model->forward(prompt, positions, caches).select(1, -1);

  // never sample padding / BOS
  auto banned = torch::zeros({cfg.vocab}, torch::kBool);
  banned.index_put_({Slice(0, 2)}, true);

  std::vector<int64_t> generated;
  double total_logprob = 0.0;
  int64_t pos = T0;
  for (int64_t step = 0; step < cfg.max_new_tokens; ++step) {
    auto scaled = logits.clone();
    scaled.div_(cfg.temperature);  // EXPECT: tensor-unnecessary-clone
    scaled.masked_fill_(banned.to(device), -INFINITY);  // EXPECT: tensor-clone-in-loop
    auto logp = torch::log_softmax(scaled, -1);
    auto next = torch::multinomial(logp.exp(), 1);
    total_logprob += logp.gather(-1, next).sum().item<double>();  // EXPECT: tensor-sync-in-loop

    const int64_t tok = next[0][0].item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the host needs the id to stop at EOS
    generated.push_back(tok);
    if (tok == cfg.eos_id) break;

    for (auto& c : caches)
      if (c.size() == cfg.cache_capacity) c.evict(cfg.sink_tokens, cfg.recent_window);
    auto step_pos = torch::full({1}, pos++, positions.options());
    logits = model->forward(next, step_pos, caches).select(1, -1);
  }

  std::cout << "avg logprob " << total_logprob / std::max<size_t>(generated.size(), 1)
            << "  key saturation (layer 0) " << caches[0].saturation() << "\n";
  return generated;
}

int main() {
  torch::manual_seed(0);
  DecodeConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  TinyLM model(cfg);
  init_weights(*model);
  fake_quantize_weights(*model);
  model->to(device);
  model->eval();

  std::vector<torch::Tensor> prompts;
  for (int64_t i = 0; i < 4; ++i) prompts.push_back(torch::randint(3, cfg.vocab, {1, 16 + 24 * i}));

  for (const auto& p : prompts) {
    auto ids = generate(model, p.to(device), cfg);  // LOOKALIKE: tensor-clone-in-loop -- a different prompt every iteration
    std::cout << "generated " << ids.size() << " tokens\n";
  }
  return 0;
}
