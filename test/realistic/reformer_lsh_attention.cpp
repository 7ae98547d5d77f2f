// Reformer language model: angular-LSH self-attention with shared QK, chunked
// feed-forward and reversible residual blocks, trained on the duplication task.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

namespace F = torch::nn::functional;

struct ReformerConfig {
  int64_t vocab = 64;
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t depth = 4;
  int64_t bucket_size = 16;
  int64_t n_hashes = 2;
  int64_t ff_mult = 4;
  int64_t ff_chunks = 4;
  int64_t max_len = 512;
  double dropout = 0.1;
  bool causal = true;
};

// Attend to the previous chunk as well as the current one.
static torch::Tensor look_one_back(const torch::Tensor& x) {
  const auto n = x.size(1);
  auto prev = torch::cat({x.narrow(1, n - 1, 1), x.narrow(1, 0, n - 1)}, 1);
  return torch::cat({x, prev}, 2);
}

struct LSHAttentionImpl : torch::nn::Module {
  explicit LSHAttentionImpl(const ReformerConfig& c)
      : heads(c.heads), dim_head(c.dim / c.heads), bucket_size(c.bucket_size),
        n_hashes(c.n_hashes), dropout(c.dropout), causal(c.causal) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
    to_qk = register_module("to_qk", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.dim).bias(false)));
    to_v = register_module("to_v", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.dim).bias(false)));
    to_out = register_module("to_out", torch::nn::Linear(c.dim, c.dim));
  }

  torch::Tensor hash_vectors(const torch::Tensor& qk, int64_t n_buckets) {
    auto rotations = torch::randn({n_hashes, qk.size(-1), n_buckets / 2}, qk.options());
    auto rotated = torch::matmul(qk.unsqueeze(1), rotations);  // LOOKALIKE: tensor-device-mismatch -- rotations drawn with qk's options
    rotated = torch::cat({rotated, -rotated}, -1);
    auto buckets = rotated.argmax(-1);
    auto offsets = torch::arange(n_hashes).mul(n_buckets).view({1, -1, 1});
    return (buckets + offsets).reshape({qk.size(0), -1});  // EXPECT: tensor-device-mismatch
  }

  torch::Tensor forward(const torch::Tensor& x, bool reuse_buckets = false,
                        const torch::Tensor& key_mask = {}) {
    const auto b = x.size(0), t = x.size(1);
    const auto bh = b * heads;
    auto h = norm(x);

    // FACT: x = torch.randn(2, 5, 12).view(2, 5, 3, 4).transpose(1, 2); assert not is_contiguous(x) and is_copy_of(x.reshape(6, 5, 4), x)
    auto split_heads = [&](const torch::Tensor& y) {
      return y.view({b, t, heads, dim_head}).transpose(1, 2).reshape({bh, t, dim_head});  // EXPECT: tensor-reshape-non-contiguous
    };
    auto qk = split_heads(to_qk(h));
    auto v = split_heads(to_v(h));

    const auto n_buckets = std::max<int64_t>(2, t / bucket_size);
    torch::Tensor buckets;
    if (reuse_buckets && cached_buckets_.defined()) {
      buckets = cached_buckets_.to(torch::kLong);
    } else {
      buckets = hash_vectors(qk, n_buckets);
      if (!cached_buckets_.defined() || cached_buckets_.sizes() != buckets.sizes())
        cached_buckets_ = torch::empty(buckets.sizes(), buckets.options().dtype(torch::kInt));
      cached_buckets_.copy_(buckets.to(torch::kInt));  // LOOKALIKE: tensor-copy-narrowing -- the conversion is spelled out
    }
    last_buckets = buckets;

    // FACT: tk = torch.arange(8).unsqueeze(0).expand(2, 8); assert raises(lambda: tk.fmod_(4), "more than one element")
    auto ticker = torch::arange(n_hashes * t, buckets.options()).unsqueeze(0).expand_as(buckets);
    ticker.fmod_(t);  // EXPECT: tensor-inplace-on-expanded
    auto keyed = buckets * t + ticker;
    torch::Tensor sticker;
    std::tie(std::ignore, sticker) = keyed.sort(-1);
    auto undo_sort = sticker.argsort(-1, /*descending=*/false);
    auto st = sticker.fmod(t);

    auto gidx = st.unsqueeze(-1).expand({-1, -1, dim_head});
    auto sqk = qk.gather(1, gidx);
    auto sv = v.gather(1, gidx);

    const auto n_chunks = n_hashes * n_buckets;
    auto bq_t = st.view({bh, n_chunks, -1});
    // FACT: q = torch.randn(2, 8, 4); i = torch.randint(0, 8, (2, 8)); g = q.gather(1, i.unsqueeze(-1).expand(-1, -1, 4)); assert is_contiguous(g) and is_view_of(g.view(2, 2, 4, 4), g)
    auto bq = sqk.view({bh, n_chunks, -1, dim_head});  // LOOKALIKE: tensor-view-non-contiguous -- gather allocates a fresh contiguous result
    auto bk = look_one_back(F::normalize(bq, F::NormalizeFuncOptions().dim(-1)));
    auto bv = look_one_back(sv.view({bh, n_chunks, -1, dim_head}));
    auto bkv_t = look_one_back(bq_t);

    // FACT: q = torch.randn(2, 4, requires_grad=True); assert not backward_fails(lambda: [(d := torch.matmul(q, q.t()) * 0.5), d.masked_fill_(torch.eye(2, dtype=torch.bool), -1e5), torch.softmax(d, -1).sum().backward()])
    auto dots = torch::matmul(bq, bk.transpose(-1, -2)) * std::pow(static_cast<double>(dim_head), -0.5);
    if (causal) dots.masked_fill_(bq_t.unsqueeze(-1) < bkv_t.unsqueeze(-2), -1e9);
    dots.masked_fill_(bq_t.unsqueeze(-1) == bkv_t.unsqueeze(-2), -1e5);  // LOOKALIKE: tensor-inplace-on-saved -- mul by a scalar saves neither its input nor its output

    auto lse = torch::logsumexp(dots, {-1}, true);
    auto p = torch::exp(dots - lse);
    // FACT: a = torch.randn(2, 3, requires_grad=True); assert backward_fails(lambda: [(p := torch.exp(a)), (o := p.matmul(torch.randn(3, 2))), p.masked_fill_(torch.zeros(2, 3, dtype=torch.bool), 0.0), o.sum().backward()])
    if (key_mask.defined()) {
      auto mkv = look_one_back(key_mask.repeat_interleave(heads, 0).gather(1, st).view({bh, n_chunks, -1}));
      p.masked_fill_(mkv.logical_not().unsqueeze(-2), 0.0);  // EXPECT: tensor-inplace-on-saved
    }
    p = F::dropout(p, F::DropoutFuncOptions().p(dropout).training(is_training()));
    auto bo = torch::matmul(p, bv);

    auto ridx = undo_sort.unsqueeze(-1).expand({-1, -1, dim_head});
    auto o = bo.view({bh, -1, dim_head}).gather(1, ridx).view({bh, n_hashes, t, dim_head});
    auto logits = lse.view({bh, -1}).gather(1, undo_sort).view({bh, n_hashes, t, 1});
    auto probs = torch::exp(logits - torch::logsumexp(logits, {1}, true));
    auto out = (o * probs).sum(1);
    // FACT: o = torch.randn(6, 5, 4).view(2, 3, 5, 4).transpose(1, 2); assert raises(lambda: o.view(2, 5, 12), "view size is not compatible") and not raises(lambda: o.contiguous().view(2, 5, 12))
    out = out.view({b, heads, t, dim_head}).transpose(1, 2).contiguous().view({b, t, -1});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() runs before the view
    return to_out(out);
  }

  int64_t heads, dim_head, bucket_size, n_hashes;
  double dropout;
  bool causal;
  torch::Tensor cached_buckets_;
  torch::Tensor last_buckets;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear to_qk{nullptr}, to_v{nullptr}, to_out{nullptr};
};
TORCH_MODULE(LSHAttention);

struct ChunkedFeedForwardImpl : torch::nn::Module {
  explicit ChunkedFeedForwardImpl(const ReformerConfig& c) : chunks(c.ff_chunks) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
    w1 = register_module("w1", torch::nn::Linear(c.dim, c.dim * c.ff_mult));
    w2 = register_module("w2", torch::nn::Linear(c.dim * c.ff_mult, c.dim));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = norm(x);
    std::vector<torch::Tensor> outs;
    // FACT: c = torch.randn(2, 8, 6).chunk(4, 1)[0]; assert raises(lambda: c.view(-1, 6), "view size is not compatible")
    for (const auto& c : h.chunk(chunks, 1)) {
      auto rows = c.view({-1, c.size(-1)});  // EXPECT: tensor-view-non-contiguous
      outs.push_back(w2(F::gelu(w1(rows))).view(c.sizes()));
    }
    return torch::cat(outs, 1);
  }

  int64_t chunks;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear w1{nullptr}, w2{nullptr};
};
TORCH_MODULE(ChunkedFeedForward);

struct ReversibleBlockImpl : torch::nn::Module {
  explicit ReversibleBlockImpl(const ReformerConfig& c) {
    f = register_module("f", LSHAttention(c));
    g = register_module("g", ChunkedFeedForward(c));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto xs = x.chunk(2, -1);
    auto y1 = xs[0] + f(xs[1]);
    auto y2 = xs[1] + g(y1);
    return torch::cat({y1, y2}, -1);
  }

  // Recompute the block input from its output, as the reversible backward does.
  torch::Tensor inverse(const torch::Tensor& y) {
    torch::NoGradGuard no_grad;
    auto ys = y.chunk(2, -1);
    // FACT: y = torch.randn(2, 3, 8); before = y.clone(); x2 = y.chunk(2, -1)[1]; x2.sub_(1.0); assert is_view_of(x2, y) and not torch.equal(y, before)
    auto x2 = ys[1];
    x2.sub_(g(ys[0]));  // EXPECT: tensor-alias-then-mutate
    // FACT: y1 = torch.randn(2, 3, 4); x1 = y1.clone(); assert is_copy_of(x1, y1)
    auto x1 = ys[0].clone();
    x1.sub_(f->forward(x2, /*reuse_buckets=*/true));  // EXPECT: tensor-unnecessary-clone // LOOKALIKE: tensor-alias-then-mutate -- clone owns its storage, y is untouched by this write
    return torch::cat({x1, x2}, -1);
  }

  LSHAttention f{nullptr};
  ChunkedFeedForward g{nullptr};
};
TORCH_MODULE(ReversibleBlock);

struct ReformerLMImpl : torch::nn::Module {
  explicit ReformerLMImpl(const ReformerConfig& c) : cfg(c) {
    tok = register_module("tok", torch::nn::Embedding(c.vocab, c.dim));
    pe_ = register_buffer("pe", torch::empty({c.max_len, c.dim}));
    auto pos = torch::arange(c.max_len, torch::kFloat64).unsqueeze(1);
    auto inv_freq = torch::exp(torch::arange(0, c.dim, 2, torch::kFloat64) * (-std::log(10000.0) / c.dim));
    auto angles = pos * inv_freq;
    pe_.copy_(torch::stack({angles.sin(), angles.cos()}, -1).flatten(1));  // EXPECT: tensor-copy-narrowing
    for (int64_t i = 0; i < c.depth; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), ReversibleBlock(c)));
    final_norm = register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.dim})));
    head = register_module("head", torch::nn::Linear(c.dim, c.vocab));
    torch::nn::init::normal_(tok->weight, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under NoGradGuard
  }

  torch::Tensor embed(const torch::Tensor& ids) {
    auto x = tok(ids) + pe_.narrow(0, 0, ids.size(1));
    return torch::cat({x, x}, -1);
  }

  torch::Tensor readout(const torch::Tensor& h) {
    auto halves = h.chunk(2, -1);
    return head(final_norm((halves[0] + halves[1]) * 0.5));
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    auto h = embed(ids);
    for (auto& blk : blocks) h = blk(h);
    return readout(h);
  }

  ReformerConfig cfg;
  torch::Tensor pe_;
  torch::nn::Embedding tok{nullptr};
  std::vector<ReversibleBlock> blocks;
  torch::nn::LayerNorm final_norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(ReformerLM);

// Inputs are [0, s, s[:-1]], targets are [s, s]: only the second copy is scored.
static std::pair<torch::Tensor, torch::Tensor> make_copy_batch(int64_t batch, int64_t len, int64_t vocab) {
  auto seq = torch::randint(1, vocab, {batch, len});
  auto start = torch::zeros({batch, 1}, torch::kLong);
  auto inp = torch::cat({start, seq, seq.narrow(1, 0, len - 1)}, 1);
  auto tgt = torch::cat({seq, seq}, 1);
  return {inp, tgt};
}

// Largest per-layer error when the input is rebuilt from the output.
static double reconstruction_error(ReformerLM& model, const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> acts{model->embed(ids)};
  for (auto& blk : model->blocks) acts.push_back(blk(acts.back()));
  double worst = 0.0;
  auto rec = acts.back();
  for (int64_t i = static_cast<int64_t>(model->blocks.size()) - 1; i >= 0; --i) {
    rec = model->blocks[i]->inverse(rec);
    worst = std::max(worst, (rec - acts[i]).abs().max().item<double>());  // EXPECT: tensor-sync-in-loop
  }
  auto logits = model->readout(acts.back());
  std::cout << "readout norm " << logits.norm().item<double>() << "\n";
  model->train();
  return worst;
}

int main() {
  torch::manual_seed(0);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  ReformerConfig cfg;
  const int64_t batch = 16, half = 64, seq_len = 2 * half, steps = 2000;

  ReformerLM model(cfg);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4).weight_decay(0.01));

  // FACT: w = torch.ones(1, 6).expand(3, 6); assert not raises(lambda: w.narrow(1, 0, 2).zero_())
  auto weights = torch::ones({1, seq_len}).expand({batch, seq_len});
  weights.narrow(1, 0, half).zero_();  // LOOKALIKE: tensor-inplace-on-expanded -- zero_ is accepted on an expanded tensor and every row wants the same mask

  std::vector<torch::Tensor> bucket_log;
  for (int64_t step = 0; step < steps; ++step) {
    auto [inp, tgt] = make_copy_batch(batch, half, cfg.vocab);
    inp = inp.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    tgt = tgt.to(device);
    auto w = weights.to(device);  // EXPECT: tensor-clone-in-loop

    auto logits = model(inp);
    auto nll = F::cross_entropy(logits.view({-1, cfg.vocab}), tgt.view({-1}),
                                F::CrossEntropyFuncOptions().reduction(torch::kNone));
    auto loss = (nll.view_as(w) * w).sum() / w.sum();

    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();

    bucket_log.push_back(model->blocks.front()->f->last_buckets);  // LOOKALIKE: tensor-graph-kept-across-iterations -- argmax bucket ids carry no graph
    if (step % 200 == 0) {
      std::cout << "step " << step << " loss " << loss.item<double>() << "\n";
      std::cout << "reversible error " << reconstruction_error(model, inp) << "\n";
    }
  }
  std::cout << "logged " << bucket_log.size() << " bucket maps\n";
  return 0;
}
