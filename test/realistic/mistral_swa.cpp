// Mistral-style decoder: grouped-query attention over a sliding window, RoPE,
// SwiGLU. The prompt is prefilled with a banded causal mask; decoding keeps only
// the last `sliding_window` keys/values per layer, in an fp16 rolling buffer.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace mistral {
namespace F = torch::nn::functional;
using torch::nn::Linear;
using torch::nn::LinearOptions;

struct ModelArgs {
  int64_t dim = 512, n_layers = 4, head_dim = 64, hidden_dim = 1408;
  int64_t n_heads = 8, n_kv_heads = 2, sliding_window = 128;
  int64_t vocab_size = 32000, max_pos = 4096, pad_id = 0;
  double norm_eps = 1e-5, rope_theta = 10000.0, max_embed_norm = 4.0;
};

// Keys and values of one layer, oldest first, stacked on the leading dim.
struct RollingKV {
  torch::Tensor kv;
  int64_t filled = 0;

  void push(const torch::Tensor& k, const torch::Tensor& v) {
    const auto W = kv.size(3);
    if (filled == W) {
      // FACT: kv=torch.randn(2,1,2,4,3); assert shares_storage(kv.narrow(3,0,3), kv.narrow(3,1,3)) and not raises(lambda: kv.narrow(3,0,3).copy_(kv.narrow(3,1,3)))
      kv.narrow(3, 0, W - 1).copy_(kv.narrow(3, 1, W - 1));  // EXPECT: tensor-inplace-overlap
      filled = W - 1;
    }
    kv.narrow(3, filled, 1).copy_(torch::stack({k, v}));  // EXPECT: tensor-copy-narrowing
    ++filled;
  }

  void load(const torch::Tensor& k, const torch::Tensor& v) {
    const auto T = k.size(2);
    const auto n = std::min(T, kv.size(3));
    auto tail = torch::stack({k, v}).narrow(3, T - n, n);
    // FACT: kv=torch.zeros(2,1,2,4,3,dtype=torch.half); t=torch.randn(2,1,2,6,3).narrow(3,2,4); assert not shares_storage(kv, t)
    kv.narrow(3, 0, n).copy_(tail.to(kv.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing, tensor-inplace-overlap -- the conversion is explicit, and the source is the prompt's fresh keys, not the buffer
    filled = n;
  }
};

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps) : eps_(eps) { weight = register_parameter("weight", torch::ones({dim})); }
  torch::Tensor forward(const torch::Tensor& x) {
    return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps_) * weight;
  }
  double eps_;
  torch::Tensor weight;
};
TORCH_MODULE(RMSNorm);

class RotaryImpl : public torch::nn::Module {
 public:
  RotaryImpl(int64_t head_dim, int64_t max_pos, double theta) {
    auto inv = torch::pow(theta, -torch::arange(0, head_dim, 2, torch::kFloat) / static_cast<double>(head_dim));
    auto freqs = torch::outer(torch::arange(max_pos, torch::kFloat), inv);
    cos_ = register_buffer("cos", torch::empty_like(freqs));
    sin_ = register_buffer("sin", torch::empty_like(freqs));
    cos_.copy_(freqs.cos());  // LOOKALIKE: tensor-inplace-on-leaf -- registered buffers do not require grad
    sin_.copy_(freqs.sin());
  }

  torch::Tensor apply(const torch::Tensor& x, int64_t start) const {
    const auto T = x.size(2), half = x.size(3) / 2;
    auto cos = cos_.narrow(0, start, T), sin = sin_.narrow(0, start, T);
    auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
    return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
  }

  torch::Tensor cos_, sin_;
};
TORCH_MODULE(Rotary);

torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const auto B = x.size(0), Hkv = x.size(1), S = x.size(2), Dh = x.size(3);
  // FACT: k=torch.randn(2,2,5,4); e=k.unsqueeze(2).expand(2,2,4,5,4); assert is_copy_of(e.reshape(2,8,5,4), k)
  return x.unsqueeze(2).expand({B, Hkv, n_rep, S, Dh}).reshape({B, Hkv * n_rep, S, Dh});  // EXPECT: tensor-reshape-non-contiguous
}

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelArgs& a)
      : a_(a), n_rep_(a.n_heads / a.n_kv_heads), scale_(1.0 / std::sqrt(static_cast<double>(a.head_dim))) {
    wq = register_module("wq", Linear(LinearOptions(a.dim, a.n_heads * a.head_dim).bias(false)));
    wk = register_module("wk", Linear(LinearOptions(a.dim, a.n_kv_heads * a.head_dim).bias(false)));
    wv = register_module("wv", Linear(LinearOptions(a.dim, a.n_kv_heads * a.head_dim).bias(false)));
    wo = register_module("wo", Linear(LinearOptions(a.n_heads * a.head_dim, a.dim).bias(false)));
  }

  torch::Tensor forward(const torch::Tensor& x, const Rotary& rope, int64_t start_pos, RollingKV* cache) {
    const auto B = x.size(0), T = x.size(1);
    auto q = rope->apply(wq(x).view({B, T, a_.n_heads, a_.head_dim}).transpose(1, 2), start_pos);
    auto k = rope->apply(wk(x).view({B, T, a_.n_kv_heads, a_.head_dim}).transpose(1, 2), start_pos);
    auto v = wv(x).view({B, T, a_.n_kv_heads, a_.head_dim}).transpose(1, 2);

    torch::Tensor keys = k, values = v;
    if (cache && T == 1) {
      cache->push(k, v);
      auto kv = cache->kv.clone();  // EXPECT: tensor-unnecessary-clone
      keys = kv[0].narrow(2, 0, cache->filled).to(q.scalar_type());
      values = kv[1].narrow(2, 0, cache->filled).to(q.scalar_type());
    } else if (cache) {
      cache->load(k, v);
    }
    keys = repeat_kv(keys, n_rep_);
    values = repeat_kv(values, n_rep_);

    auto keys_t = keys.transpose(-2, -1).contiguous();
    // FACT: k=torch.randn(2,8,5,4); kt=k.transpose(-2,-1).contiguous(); assert is_copy_of(kt, k)
    keys_t.mul_(scale_);  // LOOKALIKE: tensor-alias-then-mutate -- contiguous() of the transposed keys is a fresh copy; keys itself is untouched
    auto scores = torch::matmul(q, keys_t);
    if (T > 1) {
      // Query i sees keys i - W + 1 .. i.
      const auto inf = std::numeric_limits<float>::infinity();
      auto mask = torch::full({T, T}, -inf).triu(1);
      mask += torch::full({T, T}, -inf).tril(-a_.sliding_window);
      // FACT: q=torch.randn(2,3,4,requires_grad=True); s=torch.matmul(q,q.transpose(-2,-1)); s.add_(torch.zeros(3,3)); torch.softmax(s,-1).sum().backward()
      scores.add_(mask);  // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-inplace-on-saved -- matmul does not save its result and softmax saves only its output
    }
    auto probs = torch::softmax(scores, -1);
    // FACT: assert backward_fails(lambda: (lambda p: (p.nan_to_num_(0.0), p.sum().backward()))(torch.softmax(torch.randn(2,3,requires_grad=True),-1)))
    probs.nan_to_num_(0.0);  // EXPECT: tensor-inplace-on-saved
    auto out = torch::matmul(probs, values);
    // FACT: c=torch.randn(2,8,5,4).transpose(1,2).contiguous(); assert is_view_of(c.view(2,5,-1), c)
    return wo(out.transpose(1, 2).contiguous().view({B, T, -1}));  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() comes first
  }

 private:
  ModelArgs a_;
  int64_t n_rep_;
  double scale_;
  Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
};
TORCH_MODULE(Attention);

class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(const ModelArgs& a) {
    w1 = register_module("w1", Linear(LinearOptions(a.dim, a.hidden_dim).bias(false)));
    w2 = register_module("w2", Linear(LinearOptions(a.hidden_dim, a.dim).bias(false)));
    w3 = register_module("w3", Linear(LinearOptions(a.dim, a.hidden_dim).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return w2(torch::silu(w1(x)) * w3(x)); }
  Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(FeedForward);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelArgs& a) {
    attention = register_module("attention", Attention(a));
    feed_forward = register_module("feed_forward", FeedForward(a));
    attention_norm = register_module("attention_norm", RMSNorm(a.dim, a.norm_eps));
    ffn_norm = register_module("ffn_norm", RMSNorm(a.dim, a.norm_eps));
  }
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rope, int64_t start_pos, RollingKV* cache) {
    auto h = x + attention(attention_norm(x), rope, start_pos, cache);
    return h + feed_forward(ffn_norm(h));
  }
  Attention attention{nullptr};
  FeedForward feed_forward{nullptr};
  RMSNorm attention_norm{nullptr}, ffn_norm{nullptr};
};
TORCH_MODULE(Block);

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const ModelArgs& a) : args(a) {
    tok_embeddings = register_module("tok_embeddings", torch::nn::Embedding(a.vocab_size, a.dim));
    rope = register_module("rope", Rotary(a.head_dim, a.max_pos, a.rope_theta));
    for (int64_t i = 0; i < a.n_layers; ++i) layers.push_back(register_module("layer" + std::to_string(i), Block(a)));
    norm = register_module("norm", RMSNorm(a.dim, a.norm_eps));
    output = register_module("output", Linear(LinearOptions(a.dim, a.vocab_size).bias(false)));
  }

  torch::Tensor forward(const torch::Tensor& tokens, int64_t start_pos, std::vector<RollingKV>* caches) {
    auto h = tok_embeddings(tokens);
    for (size_t i = 0; i < layers.size(); ++i) h = layers[i](h, rope, start_pos, caches ? &(*caches)[i] : nullptr);
    return output(norm(h));
  }

  std::vector<RollingKV> new_caches(int64_t batch) const {
    auto opts = output->weight.options().dtype(torch::kHalf);
    std::vector<RollingKV> caches(args.n_layers);
    for (auto& c : caches) c.kv = torch::zeros({2, batch, args.n_kv_heads, args.sliding_window, args.head_dim}, opts);
    return caches;
  }

  ModelArgs args;
  torch::nn::Embedding tok_embeddings{nullptr};
  Rotary rope{nullptr};
  std::vector<Block> layers;
  RMSNorm norm{nullptr};
  Linear output{nullptr};
};
TORCH_MODULE(Transformer);

void train(Transformer& model, const std::vector<torch::Tensor>& data, int64_t steps, torch::Device device) {
  const auto& args = model->args;
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
  auto loss_ema = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t step = 0; step < steps; ++step) {
    auto batch = data[step % data.size()].to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch each step
    const auto T = batch.size(1) - 1;
    auto inputs = batch.narrow(1, 0, T), targets = batch.narrow(1, 1, T);
    auto logits = model->forward(inputs, 0, nullptr);
    // FACT: l=torch.randn(2,5,11); assert is_view_of(l.view(-1,11), l)
    auto flat_logits = logits.view({-1, args.vocab_size});  // LOOKALIKE: tensor-view-non-contiguous -- the output projection returns a contiguous tensor
    // FACT: b=torch.arange(18).view(2,9); t=b.narrow(1,1,8); assert raises(lambda: t.view(-1), 'view size is not compatible')
    auto flat_targets = targets.view(-1);  // EXPECT: tensor-view-non-contiguous
    auto loss = F::cross_entropy(flat_logits, flat_targets, F::CrossEntropyFuncOptions().ignore_index(args.pad_id));
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    model->tok_embeddings->weight.renorm_(2, 0, args.max_embed_norm);  // EXPECT: tensor-inplace-on-leaf
    loss_ema.mul_(0.98).add_(loss.detach(), 0.02);  // LOOKALIKE: tensor-graph-kept-across-iterations -- the loss is detached before it is folded in
    if (step % 100 == 0) std::cout << "step " << step << " loss(ema) " << loss_ema.item<float>() << "\n";
  }
}

torch::Tensor generate(Transformer& model, const torch::Tensor& prompts, int64_t max_new, double temperature,
                       const std::vector<int64_t>& stop_ids, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto B = prompts.size(0), P = prompts.size(1);
  auto caches = model->new_caches(B);
  auto logits = model->forward(prompts.to(device), 0, &caches);
  auto stop = torch::tensor(stop_ids, torch::kLong);
  auto finished = torch::zeros({B}, torch::TensorOptions().dtype(torch::kBool).device(device));
  auto score = torch::zeros({B}, torch::TensorOptions().device(device));
  auto out = torch::full({B, max_new}, model->args.pad_id, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t i = 0; i < max_new; ++i) {
    auto last = logits.select(1, -1);
    // FACT: l=torch.randn(2,3,10); s=l.select(1,-1); assert is_view_of(s, l)
    last.div_(temperature);  // EXPECT: tensor-alias-then-mutate
    auto next = torch::multinomial(torch::softmax(last, -1), 1);
    auto logp = torch::log_softmax(logits.select(1, -1), -1).gather(-1, next).squeeze(-1);
    score += logp.masked_fill(finished, 0.0);
    next.masked_fill_(finished.unsqueeze(-1), model->args.pad_id);
    out.select(1, i).copy_(next.squeeze(-1));
    finished.logical_or_(torch::isin(next.squeeze(-1), stop.to(device)));  // EXPECT: tensor-clone-in-loop
    if (finished.all().item<bool>()) break;  // LOOKALIKE: tensor-sync-in-loop -- the flag decides whether to stop decoding
    logits = model->forward(next, P + i, &caches);
  }
  std::cout << "mean score " << score.mean().item<double>() << "\n";
  return out.cpu();
}

}  // namespace mistral

int main() {
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  mistral::ModelArgs args;
  mistral::Transformer model(args);
  model->to(device);

  std::vector<torch::Tensor> data;
  for (int i = 0; i < 64; ++i) data.push_back(torch::randint(1, args.vocab_size, {4, 513}, torch::kLong));
  mistral::train(model, data, 500, device);

  auto prompts = torch::randint(1, args.vocab_size, {2, 300}, torch::kLong);
  auto generated = mistral::generate(model, prompts, 64, 0.7, {2}, device);
  std::cout << "generated " << generated.sizes() << "\n";
}
