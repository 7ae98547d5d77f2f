// T5-style encoder pre-training: relative position buckets, attention with a
// learned bias per head, RMS layer norm (no bias, no mean subtraction) and
// a span-corruption objective on token ids.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;
using torch::Tensor;

struct T5Config {
  int64_t vocab = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t n_heads = 8;
  int64_t d_ff = 1024;
  int64_t n_layers = 6;
  int64_t num_buckets = 32;
  int64_t max_distance = 128;
  double dropout = 0.1;
  double eps = 1e-6;
  int64_t pad_id = 0;
  int64_t sentinel_id = 32099;
  double noise_density = 0.15;
};

// Bucket index for each relative distance (memory - query), bidirectional.
Tensor relative_position_bucket(const Tensor &rel, int64_t num_buckets, int64_t max_distance) {
  int64_t half = num_buckets / 2;
  auto ret = (rel > 0).to(torch::kLong) * half;
  auto n = rel.abs();
  int64_t max_exact = half / 2;
  auto is_small = n < max_exact;
  auto large = max_exact + (torch::log(n.to(torch::kFloat) / max_exact) /
                            std::log(static_cast<double>(max_distance) / max_exact) *
                            (half - max_exact))
                               .to(torch::kLong);
  large = torch::clamp_max(large, half - 1);
  return ret + torch::where(is_small, n, large);
}

struct T5RMSNormImpl : torch::nn::Module {
  T5RMSNormImpl(int64_t d, double eps) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({d}));
  }
  Tensor forward(const Tensor &x) {
    auto variance = x.pow(2).mean(-1, /*keepdim=*/true);
    // FACT: x = torch.randn(2, 3); h = x; h = h * 2.0; assert is_copy_of(h, x)
    Tensor h = x;
    h = h * torch::rsqrt(variance + eps_); // LOOKALIKE: tensor-alias-then-mutate -- h is rebound out of place, x is never written
    return weight * h;
  }
  Tensor weight;
  double eps_;
};
TORCH_MODULE(T5RMSNorm);

struct T5AttentionImpl : torch::nn::Module {
  T5AttentionImpl(const T5Config &cfg, bool has_bias) : cfg_(cfg), has_bias_(has_bias) {
    int64_t inner = cfg.n_heads * cfg.d_kv;
    q = register_module("q", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, inner).bias(false)));
    k = register_module("k", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, inner).bias(false)));
    v = register_module("v", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, inner).bias(false)));
    o = register_module("o", torch::nn::Linear(torch::nn::LinearOptions(inner, cfg.d_model).bias(false)));
    if (has_bias_)
      rel_bias = register_module("rel_bias", torch::nn::Embedding(cfg.num_buckets, cfg.n_heads));
  }

  Tensor compute_bias(int64_t qlen, int64_t klen, torch::Device dev) {
    auto ctx = torch::arange(qlen, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(1);
    auto mem = torch::arange(klen, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(0);
    auto buckets = relative_position_bucket(mem - ctx, cfg_.num_buckets, cfg_.max_distance);
    auto values = rel_bias(buckets);             // [q, k, heads]
    return values.permute({2, 0, 1}).unsqueeze(0); // [1, heads, q, k]
  }

  // Returns the output and the position bias so later layers can reuse it.
  std::pair<Tensor, Tensor> forward(const Tensor &x, const Tensor &mask, Tensor position_bias) {
    const int64_t B = x.size(0), T = x.size(1);
    const int64_t H = cfg_.n_heads, D = cfg_.d_kv;
    auto split = [&](const Tensor &t) {
      // FACT: t = torch.randn(2, 5, 32); assert is_view_of(t.view(2, 5, 4, 8).transpose(1, 2), t)
      return t.view({B, T, H, D}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous, the view comes before the transpose
    };
    auto qs = split(q(x)), ks = split(k(x)), vs = split(v(x));
    // T5 does not scale the scores: the init of q absorbs 1/sqrt(d_kv).
    auto scores = torch::matmul(qs, ks.transpose(-2, -1));
    if (!position_bias.defined()) {
      position_bias = compute_bias(T, T, x.device());
      // additive mask: 0 for tokens, -inf-ish for padding
      position_bias = position_bias + (1.0 - mask.to(scores.dtype())).view({B, 1, 1, T}) * -1e9;
    }
    scores = scores + position_bias;
    auto attn = torch::softmax(scores, -1);
    if (head_mask_.defined())
      attn.mul_(head_mask_); // EXPECT: tensor-inplace-on-saved
    attn = F::dropout(attn, F::DropoutFuncOptions().p(cfg_.dropout).training(is_training()));
    auto ctx = torch::matmul(attn, vs); // [B, H, T, D]
    // FACT: c = torch.randn(2, 4, 5, 8); r = c.transpose(1, 2).reshape(2, 5, 32); assert is_copy_of(r, c)
    auto merged = ctx.transpose(1, 2).reshape({B, T, H * D}); // EXPECT: tensor-reshape-non-contiguous
    last_attn_ = attn.detach();
    return {o(merged), position_bias};
  }

  T5Config cfg_;
  bool has_bias_;
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  torch::nn::Embedding rel_bias{nullptr};
  Tensor head_mask_;
  Tensor last_attn_;
};
TORCH_MODULE(T5Attention);

struct T5BlockImpl : torch::nn::Module {
  T5BlockImpl(const T5Config &cfg, bool has_bias) : drop_p(cfg.dropout) {
    attn = register_module("attn", T5Attention(cfg, has_bias));
    ln1 = register_module("ln1", T5RMSNorm(cfg.d_model, cfg.eps));
    ln2 = register_module("ln2", T5RMSNorm(cfg.d_model, cfg.eps));
    wi0 = register_module("wi0", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.d_ff).bias(false)));
    wi1 = register_module("wi1", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.d_ff).bias(false)));
    wo = register_module("wo", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_ff, cfg.d_model).bias(false)));
  }

  std::pair<Tensor, Tensor> forward(Tensor h, const Tensor &mask, const Tensor &bias) {
    auto out = attn->forward(ln1(h), mask, bias);
    h = h + F::dropout(out.first, F::DropoutFuncOptions().p(drop_p).training(is_training()));
    auto n = ln2(h);
    auto g = torch::gelu(wi0(n), "tanh");
    g.mul_(wi1(n)); // LOOKALIKE: tensor-inplace-on-saved -- gelu saves its input, not its result
    h = h + F::dropout(wo(g), F::DropoutFuncOptions().p(drop_p).training(is_training()));
    return {h, out.second};
  }

  double drop_p;
  T5Attention attn{nullptr};
  T5RMSNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear wi0{nullptr}, wi1{nullptr}, wo{nullptr};
};
TORCH_MODULE(T5Block);

struct T5EncoderImpl : torch::nn::Module {
  explicit T5EncoderImpl(const T5Config &cfg) : cfg_(cfg) {
    embed = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), T5Block(cfg, i == 0)));
    final_ln = register_module("final_ln", T5RMSNorm(cfg.d_model, cfg.eps));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));
  }

  Tensor forward(const Tensor &ids) {
    auto mask = ids.ne(cfg_.pad_id);
    auto h = embed(ids);
    Tensor bias;
    for (auto &blk : blocks) {
      auto r = blk->forward(h, mask, bias);
      h = r.first;
      bias = r.second;
    }
    h = final_ln(h) * std::pow(static_cast<double>(cfg_.d_model), -0.5);
    return lm_head(h);
  }

  T5Config cfg_;
  torch::nn::Embedding embed{nullptr};
  std::vector<T5Block> blocks;
  T5RMSNorm final_ln{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(T5Encoder);

struct Corrupted {
  Tensor inputs;
  Tensor labels;
};

// Span corruption in its encoder-only form: masked positions get the sentinel
// and the loss is taken only there.
Corrupted corrupt_spans(const Tensor &ids, const T5Config &cfg) {
  auto noise = torch::rand(ids.sizes()) < cfg.noise_density;
  noise = noise & ids.ne(cfg.pad_id);
  auto labels = ids;
  // FACT: ids = torch.randint(1, 50, (2, 6)); labels = ids; labels.masked_fill_(ids > 25, -100); assert shares_storage(labels, ids)
  labels.masked_fill_(noise.logical_not(), -100); // EXPECT: tensor-alias-then-mutate
  auto inputs = ids.masked_fill(noise, cfg.sentinel_id);
  return {inputs, labels};
}

// Eval-time variant that keeps the caller's batch intact.
Tensor mask_for_probe(const Tensor &ids, const Tensor &probe_mask, int64_t sentinel) {
  auto probed = ids.clone(); // EXPECT: tensor-unnecessary-clone
  probed.masked_fill_(probe_mask, sentinel);
  return probed;
}

double attention_entropy(T5Encoder &model, const Tensor &ids) {
  torch::NoGradGuard no_grad;
  model->forward(ids);
  auto probs = model->blocks[0]->attn->last_attn_; // [B, H, T, T]
  const int64_t B = probs.size(0), T = probs.size(2);
  // FACT: p = torch.rand(2, 4, 5, 5); assert raises(lambda: p.transpose(1, 2).view(2, 5, -1), "view size is not compatible")
  auto per_token = probs.transpose(1, 2).view({B, T, -1}); // EXPECT: tensor-view-non-contiguous
  auto ent = -(per_token * (per_token + 1e-9).log()).sum(-1);
  return ent.mean().item<double>();
}

void pretrain(T5Encoder &model, const std::vector<Tensor> &batches, const T5Config &cfg, int epochs) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-4));
  const double weight_decay = 0.01, lr = 1e-4;

  auto token_weight = torch::ones({cfg.vocab}, torch::kDouble);
  token_weight[cfg.sentinel_id] = 0.5;

  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    Tensor epoch_loss = torch::zeros({}, device);
    double running = 0.0;
    int64_t step = 0;
    for (const auto &raw : batches) {
      auto c = corrupt_spans(raw, cfg);
      auto inputs = c.inputs.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
      auto labels = c.labels.to(device);
      auto logits = model->forward(inputs);
      const int64_t V = logits.size(-1);
      // FACT: l = torch.nn.Linear(8, 30)(torch.randn(2, 5, 8)); assert is_view_of(l.reshape(-1, 30), l)
      auto flat = logits.reshape({-1, V}); // LOOKALIKE: tensor-reshape-non-contiguous -- the lm_head output is contiguous, reshape is a view
      auto loss = F::cross_entropy(flat, labels.reshape({-1}),
                                   F::CrossEntropyFuncOptions()
                                       .ignore_index(-100)
                                       .weight(token_weight.to(torch::kFloat))); // EXPECT: tensor-clone-in-loop
      opt.zero_grad();
      loss.backward();
      for (auto &p : model->parameters())
        p.mul_(1.0 - lr * weight_decay); // EXPECT: tensor-inplace-on-leaf
      opt.step();
      epoch_loss += loss; // EXPECT: tensor-graph-kept-across-iterations
      if (++step % 100 == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every 100 steps
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- item() gives a host double, no graph
    }
    {
      torch::NoGradGuard no_grad;
      for (auto &p : model->parameters())
        if (p.grad().defined())
          p.grad().zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient, not the leaf, and under no-grad
    }
    std::cout << "epoch " << epoch << " mean " << epoch_loss.item<double>() / batches.size()
              << " avg " << running / batches.size() << "\n";
  }
}

int main() {
  T5Config cfg;
  cfg.vocab = 1000;
  cfg.sentinel_id = 999;
  cfg.n_layers = 2;
  T5Encoder model(cfg);
  std::vector<Tensor> batches;
  for (int i = 0; i < 4; ++i)
    batches.push_back(torch::randint(1, cfg.vocab - 1, {8, 64}));
  pretrain(model, batches, cfg, 1);
  auto probe = mask_for_probe(batches[0], torch::rand(batches[0].sizes()) < 0.2, cfg.sentinel_id);
  std::cout << attention_entropy(model, probe) << "\n";
}
