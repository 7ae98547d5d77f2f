// Small decoder-only language model with ALiBi attention.
// Attention is computed one key chunk at a time with a running max / running sum
// (online softmax), so the full T x T score matrix is never materialised.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct LMConfig {
  int64_t vocab_size = 8192;
  int64_t d_model = 384;
  int64_t n_head = 8;
  int64_t n_layer = 6;
  int64_t chunk = 64;
  int64_t max_len = 1024;
  int64_t pad_id = 0;
  double dropout = 0.1;
};

struct TrainConfig {
  int64_t steps = 5000;
  int64_t batch_size = 16;
  int64_t seq_len = 512;
  int64_t log_every = 50;
  int64_t eval_every = 500;
  int64_t eval_batches = 20;
  double lr = 3e-4;
  double weight_decay = 0.1;
  uint64_t seed = 1234;
};

// Geometric head slopes from the ALiBi paper (n_head a power of two).
torch::Tensor alibi_slopes(int64_t n_head) {
  const double start = std::pow(2.0, -8.0 / static_cast<double>(n_head));
  std::vector<float> s(n_head);
  for (int64_t h = 0; h < n_head; ++h) s[h] = static_cast<float>(std::pow(start, h + 1));
  return torch::tensor(s);
}

class ChunkedAlibiAttentionImpl : public torch::nn::Module {
 public:
  explicit ChunkedAlibiAttentionImpl(const LMConfig& cfg)
      : n_head_(cfg.n_head),
        head_dim_(cfg.d_model / cfg.n_head),
        chunk_(cfg.chunk),
        scale_(1.0 / std::sqrt(static_cast<double>(cfg.d_model / cfg.n_head))),
        slopes_(alibi_slopes(cfg.n_head)) {
    c_attn = register_module("c_attn", torch::nn::Linear(cfg.d_model, 3 * cfg.d_model));
    c_proj = register_module("c_proj", torch::nn::Linear(cfg.d_model, cfg.d_model));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    const auto n_chunks = (T + chunk_ - 1) / chunk_;
    const auto T_pad = n_chunks * chunk_;
    // Padded keys come after every real query, so the causal mask already hides them.
    auto h = T_pad == T ? x : torch::constant_pad_nd(x, {0, 0, 0, T_pad - T});
    // FACT: y = torch.nn.Linear(16, 48)(torch.randn(2, 8, 16)); assert is_contiguous(y) and is_view_of(y.view(2, 8, 3, 4, 4), y)
    auto qkv = c_attn(h).view({B, T_pad, 3, n_head_, head_dim_}).permute({2, 0, 3, 1, 4}); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous; the permute comes after the view
    auto q = qkv[0];
    // FACT: x = torch.randn(2, 8, 3, 4, 4).permute(2, 0, 3, 1, 4)[1]; assert not is_contiguous(x) and is_view_of(x.reshape(2, 4, 2, 4, 4), x)
    auto split_chunks = [&](const torch::Tensor& t) { return t.reshape({B, n_head_, n_chunks, chunk_, head_dim_}); }; // LOOKALIKE: tensor-reshape-non-contiguous -- only splits the time dim, which strides can express: a view
    auto k_chunks = split_chunks(qkv[1]);
    auto v_chunks = split_chunks(qkv[2]);

    const auto idx = torch::TensorOptions().dtype(torch::kLong).device(x.device());
    const float neg_inf = -std::numeric_limits<float>::infinity();
    auto q_pos = torch::arange(T_pad, idx).view({T_pad, 1});
    auto m = torch::full({B, n_head_, T_pad, 1}, neg_inf, q.options());
    auto l = torch::zeros({B, n_head_, T_pad, 1}, q.options());
    auto acc = torch::zeros({B, n_head_, T_pad, head_dim_}, q.options());

    for (int64_t c = 0; c < n_chunks; ++c) {
      auto k_c = k_chunks.select(2, c);
      auto v_c = v_chunks.select(2, c);
      auto k_pos = torch::arange(c * chunk_, (c + 1) * chunk_, idx).view({1, chunk_});
      auto dist = (k_pos - q_pos).to(q.scalar_type()); // LOOKALIKE: tensor-clone-in-loop -- the distances differ for every chunk
      auto slopes = slopes_.to(x.device()).view({1, n_head_, 1, 1}); // EXPECT: tensor-clone-in-loop
      // FACT: q = torch.randn(2, 3, requires_grad=True); k = torch.randn(3, 4, requires_grad=True); s = torch.matmul(q, k).mul_(0.5); s.sum().backward()
      auto s = torch::matmul(q, k_c.transpose(-2, -1)).mul_(scale_); // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
      s.add_(slopes * dist);
      s.masked_fill_(dist.gt(0), neg_inf);

      auto s_max = std::get<0>(s.max(-1, /*keepdim=*/true)).detach();
      auto m_prev = m;
      // FACT: m = torch.full((2, 1), float('-inf')); m_prev = m; m.copy_(torch.maximum(m, torch.zeros(2, 1))); assert shares_storage(m_prev, m) and bool((m_prev - m).eq(0).all())
      m.copy_(torch::maximum(m, s_max)); // EXPECT: tensor-alias-then-mutate
      auto alpha = torch::exp(m_prev - m);
      auto p = torch::exp(s - m);
      // FACT: x = torch.randn(2, 3, requires_grad=True); p = torch.exp(x); p.nan_to_num_(0.0); assert backward_fails(lambda: p.sum().backward())
      p.nan_to_num_(0.0); // EXPECT: tensor-inplace-on-saved
      l = l * alpha + p.sum(-1, /*keepdim=*/true);
      acc = acc * alpha + torch::matmul(p, v_c);
    }
    // FACT: a = torch.randn(2, 4, 8, 4); assert is_copy_of(a.transpose(1, 2).reshape(2, 8, 16), a)
    auto out = (acc / l).transpose(1, 2).reshape({B, T_pad, C}).narrow(1, 0, T); // EXPECT: tensor-reshape-non-contiguous
    return c_proj(out);
  }

  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t n_head_, head_dim_, chunk_;
  double scale_;
  torch::Tensor slopes_;
};
TORCH_MODULE(ChunkedAlibiAttention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const LMConfig& cfg) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    attn = register_module("attn", ChunkedAlibiAttention(cfg));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    fc = register_module("fc", torch::nn::Linear(cfg.d_model, 4 * cfg.d_model));
    proj = register_module("proj", torch::nn::Linear(4 * cfg.d_model, cfg.d_model));
    drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x + drop(attn(ln1(x)));
    return x + drop(proj(F::gelu(fc(ln2(x)))));
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  ChunkedAlibiAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, proj{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Block);

class TinyLMImpl : public torch::nn::Module {
 public:
  explicit TinyLMImpl(const LMConfig& cfg) : cfg(cfg) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layer; ++i) blocks->push_back(Block(cfg));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab_size).bias(false)));
    init_weights();
    // FACT: w = torch.nn.Embedding(10, 4).weight; assert raises(lambda: w[0].zero_(), "view of a leaf Variable")
    tok_emb->weight[cfg.pad_id].zero_(); // EXPECT: tensor-inplace-on-leaf
  }

  void init_weights() {
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      if (p.key().find("ln") != std::string::npos) continue;
      if (p.value().dim() >= 2) p.value().normal_(0.0, 0.02); else p.value().zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- initialisation runs under NoGradGuard
    }
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    auto x = tok_emb(ids);
    for (auto& b : *blocks) x = b->as<Block>()->forward(x);
    return lm_head(ln_f(x));
  }

  LMConfig cfg;
  torch::nn::Embedding tok_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TinyLM);

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& tokens, int64_t pad_id) {
  const auto T = tokens.size(1), V = logits.size(-1);
  auto shift_logits = logits.narrow(1, 0, T - 1);
  // FACT: t = torch.randint(0, 9, (2, 6)); s = t[:, 1:].contiguous(); assert is_contiguous(s) and is_view_of(s.view(-1), s)
  auto shift_labels = tokens.narrow(1, 1, T - 1).contiguous().view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() makes the copy before the view
  // FACT: l = torch.randn(2, 6, 10); assert raises(lambda: l[:, :5].view(-1, 10), "view size is not compatible")
  return F::cross_entropy(shift_logits.view({-1, V}), shift_labels, F::CrossEntropyFuncOptions().ignore_index(pad_id)); // EXPECT: tensor-view-non-contiguous
}

// Token ids stored as little-endian int32, as written by the tokenizer script.
torch::Tensor load_tokens(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  TORCH_CHECK(in, "cannot open ", path);
  const auto bytes = static_cast<size_t>(in.tellg());
  std::vector<int32_t> buf(bytes / sizeof(int32_t));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size() * sizeof(int32_t)));
  return torch::from_blob(buf.data(), {static_cast<int64_t>(buf.size())}, torch::kInt).to(torch::kLong);
}

torch::Tensor sample_batch(const torch::Tensor& corpus, int64_t batch, int64_t len, std::mt19937_64& rng,
                           torch::Device device) {
  std::uniform_int_distribution<int64_t> pick(0, corpus.size(0) - len - 1);
  std::vector<torch::Tensor> rows;
  rows.reserve(batch);
  for (int64_t b = 0; b < batch; ++b) rows.push_back(corpus.narrow(0, pick(rng), len)); // LOOKALIKE: tensor-graph-kept-across-iterations -- token ids carry no autograd graph
  return torch::stack(rows).to(device);
}

double evaluate(TinyLM& model, const torch::Tensor& corpus, const LMConfig& cfg, const TrainConfig& tc,
                torch::Device device) {
  model->eval();
  std::mt19937_64 rng(tc.seed + 1);
  auto total = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t i = 0; i < tc.eval_batches; ++i) {
    auto tokens = sample_batch(corpus, tc.batch_size, tc.seq_len, rng, device);
    total += lm_loss(model->forward(tokens), tokens, cfg.pad_id); // EXPECT: tensor-graph-kept-across-iterations
  }
  model->train();
  return total.item<double>() / static_cast<double>(tc.eval_batches);
}

void train(TinyLM& model, const torch::Tensor& corpus, const LMConfig& cfg, const TrainConfig& tc,
           torch::Device device) {
  model->to(device);
  model->train();
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(tc.lr).betas({0.9, 0.95}).weight_decay(tc.weight_decay));
  std::mt19937_64 rng(tc.seed);
  double running = 0.0;
  for (int64_t step = 1; step <= tc.steps; ++step) {
    auto tokens = sample_batch(corpus, tc.batch_size, tc.seq_len, rng, device);
    opt.zero_grad();
    auto loss = lm_loss(model->forward(tokens), tokens, cfg.pad_id);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    running += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    if (step % tc.log_every == 0) {
      std::cout << "step " << step << " loss " << running / static_cast<double>(tc.log_every) << std::endl;
      running = 0.0;
    }
    if (step % tc.eval_every == 0) {
      std::cout << "step " << step << " val loss " << evaluate(model, corpus, cfg, tc, device) << std::endl;
      torch::save(model, "alibi_lm_" + std::to_string(step) + ".pt");
    }
  }
}

struct Generation {
  torch::Tensor tokens;
  torch::Tensor logits;  // tempered logits of every sampled step
};

Generation generate(TinyLM& model, const torch::Tensor& prompt, int64_t max_new, double temperature,
                    int64_t eos_id) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto max_len = model->cfg.max_len;
  auto tokens = prompt.to(model->lm_head->weight.device());
  std::vector<torch::Tensor> step_logits;
  for (int64_t i = 0; i < max_new; ++i) {
    const auto n = tokens.size(1);
    auto ctx = n > max_len ? tokens.narrow(1, n - max_len, max_len) : tokens;
    auto logits = model->forward(ctx).select(1, -1);
    // FACT: y = torch.randn(1, 3, 10); l = y.select(1, -1); l.div_(0.7); assert is_view_of(l, y)
    logits.div_(temperature); // LOOKALIKE: tensor-alias-then-mutate -- writes the model's output, a temporary nothing else reads
    step_logits.push_back(logits); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard the logits carry no graph
    auto next = torch::multinomial(torch::softmax(logits, -1), 1);
    tokens = torch::cat({tokens, next}, 1);
    if (next.item<int64_t>() == eos_id) break; // LOOKALIKE: tensor-sync-in-loop -- the sampled token decides whether generation stops
  }
  return {tokens.cpu(), torch::stack(step_logits, 1).cpu()};
}

int main(int argc, char** argv) {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  LMConfig cfg;
  TrainConfig tc;
  auto corpus = argc > 1 ? load_tokens(argv[1]) : torch::randint(1, cfg.vocab_size, {1 << 20}, torch::kLong);

  TinyLM model(cfg);
  std::cout << "parameters: " << [&] {
    int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    return n;
  }() << std::endl;

  train(model, corpus, cfg, tc, device);

  auto prompt = corpus.narrow(0, 0, 32).unsqueeze(0);
  auto gen = generate(model, prompt, 128, 0.8, /*eos_id=*/2);
  std::cout << gen.tokens << std::endl;
  return 0;
}
