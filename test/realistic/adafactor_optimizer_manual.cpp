// Small decoder-only LM trained with a hand-rolled Adafactor (Shazeer & Stern, 2018):
// factored second moments for matrices, update clipping, relative step size.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;

struct AdafactorOptions {
  double eps1 = 1e-30;
  double eps2 = 1e-3;
  double clip_threshold = 1.0;
  double decay_rate = -0.8;
  double beta1 = 0.0;
  double lr = 1e-2;
  bool relative_step = true;
  bool scale_parameter = true;
};

struct AdafactorState {
  int64_t step = 0;
  torch::Tensor exp_avg;
  torch::Tensor exp_avg_sq_row;
  torch::Tensor exp_avg_sq_col;
  torch::Tensor exp_avg_sq;
};

class Adafactor {
 public:
  Adafactor(std::vector<torch::Tensor> params, AdafactorOptions opts)
      : params_(std::move(params)), opts_(opts), state_(params_.size()) {}

  void zero_grad() {
    for (auto& p : params_) {
      if (!p.grad().defined()) continue;
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();  // LOOKALIKE: tensor-inplace-on-detached -- clearing the gradient buffer in place is the intent
    }
  }

  double mean_update_rms() const {
    return rms_count_ ? rms_sum_ / static_cast<double>(rms_count_) : 0.0;
  }

  void step() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (!p.grad().defined()) continue;
      auto grad = p.grad();
      if (grad.scalar_type() != torch::kFloat) grad = grad.to(torch::kFloat);

      auto& st = state_[i];
      const bool factored = grad.dim() >= 2;
      if (st.step == 0) init_state(st, grad, factored);
      st.step += 1;

      auto p32 = p.to(torch::kFloat);
      auto lr = step_size(st, p32);
      const double beta2t = 1.0 - std::pow(static_cast<double>(st.step), opts_.decay_rate);

      auto update = grad.square().add_(opts_.eps1);
      if (factored) {
        st.exp_avg_sq_row.mul_(beta2t).add_(update.mean(-1), 1.0 - beta2t);
        st.exp_avg_sq_col.mul_(beta2t).add_(update.mean(-2), 1.0 - beta2t);
        update = approx_sq_grad(st.exp_avg_sq_row, st.exp_avg_sq_col).mul_(grad);
      } else {
        st.exp_avg_sq.mul_(beta2t).add_(update, 1.0 - beta2t);
        update = st.exp_avg_sq.clone().rsqrt_().mul_(grad);  // EXPECT: tensor-unnecessary-clone
      }
      update.div_((rms(update) / opts_.clip_threshold).clamp_min_(1.0));
      update.mul_(lr);
      rms_sum_ += rms(update).item<double>();  // EXPECT: tensor-sync-in-loop
      ++rms_count_;

      if (opts_.beta1 > 0.0) {
        st.exp_avg.mul_(opts_.beta1).add_(update, 1.0 - opts_.beta1);
        update = st.exp_avg;
      }
      // FACT: p = torch.randn(8, 4); q = p.to(torch.float32); assert q is p and shares_storage(q, p)
      p32.sub_(update);  // LOOKALIKE: tensor-alias-then-mutate -- for fp32 params to() hands back p itself and updating p is the point
      if (p.scalar_type() != torch::kFloat) p.copy_(p32);  // LOOKALIKE: tensor-copy-narrowing -- deliberate write-back of the fp32 master into a bf16 parameter
    }
  }

 private:
  static torch::Tensor rms(const torch::Tensor& t) {
    return t.norm() / std::sqrt(static_cast<double>(t.numel()));
  }

  static torch::Tensor approx_sq_grad(const torch::Tensor& row, const torch::Tensor& col) {
    auto r = (row / row.mean(-1, true)).rsqrt_().unsqueeze(-1);
    auto c = col.unsqueeze(-2).rsqrt();
    return r * c;
  }

  torch::Tensor step_size(const AdafactorState& st, const torch::Tensor& p32) const {
    const double rel = opts_.relative_step
                           ? std::min(1e-2, 1.0 / std::sqrt(static_cast<double>(st.step)))
                           : opts_.lr;
    if (!opts_.scale_parameter) return torch::full({}, rel, p32.options());
    return rms(p32).clamp_min(opts_.eps2) * rel;
  }

  void init_state(AdafactorState& st, const torch::Tensor& grad, bool factored) const {
    if (factored) {
      auto row_shape = grad.sizes().vec();
      row_shape.pop_back();
      auto col_shape = grad.sizes().vec();
      col_shape.erase(col_shape.end() - 2);
      st.exp_avg_sq_row = torch::zeros(row_shape, grad.options());
      st.exp_avg_sq_col = torch::zeros(col_shape, grad.options());
    } else {
      st.exp_avg_sq = torch::zeros_like(grad);
    }
    if (opts_.beta1 > 0.0) st.exp_avg = torch::zeros_like(grad);
  }

  std::vector<torch::Tensor> params_;
  AdafactorOptions opts_;
  std::vector<AdafactorState> state_;
  double rms_sum_ = 0.0;
  int64_t rms_count_ = 0;
};

// ---------------------------------------------------------------------------
struct LMConfig {
  int64_t vocab = 512;
  int64_t d_model = 128;
  int64_t n_head = 4;
  int64_t n_layer = 2;
  int64_t max_len = 64;
  double attn_dropout = 0.1;
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const LMConfig& c) : n_head(c.n_head), attn_p(c.attn_dropout) {
    qkv = register_module("qkv", torch::nn::Linear(c.d_model, 3 * c.d_model));
    proj = register_module("proj", torch::nn::Linear(c.d_model, c.d_model));
    causal = register_buffer("causal", torch::ones({c.max_len, c.max_len}, torch::kBool).tril());
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / n_head;
    auto parts = qkv(x).chunk(3, -1);
    // FACT: qkv = torch.randn(2, 8, 192); q = qkv.chunk(3, -1)[0]; assert not is_contiguous(q) and is_view_of(q.view(2, 8, 4, 16), qkv)
    auto q = parts[0].view({B, T, n_head, D}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- only the last dim is split, which a chunk of the last dim allows
    auto k = parts[1].view({B, T, n_head, D}).transpose(1, 2);
    auto v = parts[2].view({B, T, n_head, D}).transpose(1, 2);

    auto scores = q.matmul(k.transpose(-2, -1));
    // FACT: q = torch.randn(2, 3, 4, requires_grad=True); s = q.matmul(q.transpose(-2, -1)); s.div_(2.0); torch.softmax(s, -1).sum().backward()
    scores.div_(std::sqrt(static_cast<double>(D)));  // LOOKALIKE: tensor-inplace-on-saved -- matmul saved q and k, not its result
    auto mask = causal.slice(0, 0, T).slice(1, 0, T);
    scores.masked_fill_(mask.logical_not(), -std::numeric_limits<float>::infinity());  // LOOKALIKE: tensor-device-mismatch -- causal is a registered buffer and moved with the module

    auto attn = torch::softmax(scores, -1);
    if (is_training() && attn_p > 0.0) {
      auto keep = torch::rand_like(attn) > attn_p;
      // FACT: assert backward_fails(lambda: (lambda a: (a.mul_(torch.rand_like(a) > 0.1), a.matmul(torch.randn(3, 4)).sum().backward()))(torch.softmax(torch.randn(2, 3, 3, requires_grad=True), -1)))
      attn.mul_(keep).div_(1.0 - attn_p);  // EXPECT: tensor-inplace-on-saved
    }
    auto y = attn.matmul(v);
    // FACT: y = torch.randn(2, 4, 8, 16).transpose(1, 2); assert is_copy_of(y.reshape(2, 8, 64), y)
    y = y.transpose(1, 2).reshape({B, T, C});  // EXPECT: tensor-reshape-non-contiguous
    return proj(y);
  }

  int64_t n_head;
  double attn_p;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor causal;
};
TORCH_MODULE(CausalSelfAttention);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const LMConfig& c)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})))),
        attn(register_module("attn", CausalSelfAttention(c))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})))),
        fc1(register_module("fc1", torch::nn::Linear(c.d_model, 4 * c.d_model))),
        fc2(register_module("fc2", torch::nn::Linear(4 * c.d_model, c.d_model))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln1(x));
    return x + fc2(F::gelu(fc1(ln2(x))));
  }

  torch::nn::LayerNorm ln1;
  CausalSelfAttention attn;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct TransformerLMImpl : torch::nn::Module {
  explicit TransformerLMImpl(const LMConfig& c) : cfg(c) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(c.vocab, c.d_model));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(c.max_len, c.d_model));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) blocks->push_back(Block(c));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));
    reset_parameters();
  }

  void reset_parameters() {
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) {
      if (p.dim() >= 2) p.normal_(0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- initialisation runs under NoGradGuard
    }
  }

  torch::Tensor forward(const torch::Tensor& idx) {
    const int64_t T = idx.size(1);
    auto pos = torch::arange(T, torch::kLong);
    auto x = tok_emb(idx) + pos_emb(pos);  // EXPECT: tensor-device-mismatch
    for (const auto& m : *blocks) x = m->as<Block>()->forward(x);
    return head(ln_f(x));
  }

  LMConfig cfg;
  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TransformerLM);

// ---------------------------------------------------------------------------
struct TrainConfig {
  int64_t steps = 2000;
  int64_t batch = 32;
  int64_t log_every = 100;
  int64_t unk_id = 1;
  double token_dropout = 0.05;
  double weight_decay = 1e-4;
  int64_t corpus_len = 200000;
};

// Zipf-ish synthetic corpus with some local structure so the LM has something to learn.
torch::Tensor synthetic_corpus(int64_t n, int64_t vocab) {
  auto ranks = torch::arange(1, vocab + 1, torch::kDouble);
  auto probs = ranks.pow(-1.1);
  auto base = torch::multinomial(probs / probs.sum(), n, /*replacement=*/true);
  auto shifted = (base.roll(1) * 7 + 3).remainder(vocab);
  auto copy_mask = torch::rand({n}) < 0.3;
  return torch::where(copy_mask, shifted, base);
}

void decay_weights(torch::nn::Module& m, double factor) {
  for (auto& p : m.parameters()) {
    if (p.dim() >= 2) p.mul_(1.0 - factor);  // EXPECT: tensor-inplace-on-leaf
  }
}

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  LMConfig cfg;
  TrainConfig tc;

  TransformerLM model(cfg);
  model->to(device);
  Adafactor opt(model->parameters(), AdafactorOptions{});

  auto corpus = synthetic_corpus(tc.corpus_len, cfg.vocab);
  auto freq = torch::bincount(corpus, {}, cfg.vocab).to(torch::kFloat) + 1.0;
  auto token_weights = (freq.sum() / freq).pow(0.25);
  token_weights = token_weights / token_weights.mean();
  auto windows = corpus.to(device).unfold(0, cfg.max_len + 1, 1);

  std::deque<torch::Tensor> recent;
  model->train();
  for (int64_t step = 1; step <= tc.steps; ++step) {
    auto idx = torch::randint(windows.size(0), {tc.batch},
                              torch::TensorOptions().dtype(torch::kLong).device(device));
    auto batch = windows.index_select(0, idx);
    auto inputs = batch.slice(1, 0, cfg.max_len);
    auto targets = batch.slice(1, 1, cfg.max_len + 1);
    if (tc.token_dropout > 0.0) {
      auto drop = torch::rand(inputs.sizes(), torch::TensorOptions().device(device)) < tc.token_dropout;
      // FACT: b = torch.arange(12).view(2, 6); i = b[:, :5]; t = b[:, 1:]; i.masked_fill_(i == 2, 0); assert is_view_of(i, b) and t[0, 1].item() == 0
      inputs.masked_fill_(drop, tc.unk_id);  // EXPECT: tensor-alias-then-mutate
    }

    auto logits = model->forward(inputs);
    auto class_w = token_weights.to(device);  // EXPECT: tensor-clone-in-loop
    // FACT: t = torch.arange(18).view(2, 9)[:, 1:]; assert not is_contiguous(t) and not raises(lambda: t.contiguous().view(-1))
    auto loss = F::cross_entropy(logits.view({-1, cfg.vocab}), targets.contiguous().view({-1}),  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() densifies the shifted targets before view
                                 F::CrossEntropyFuncOptions().weight(class_w));

    opt.zero_grad();
    loss.backward();
    opt.step();
    decay_weights(*model, tc.weight_decay * 1e-2);

    recent.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (recent.size() > 50) recent.pop_front();
    if (step % tc.log_every == 0) {
      auto smoothed = torch::stack(std::vector<torch::Tensor>(recent.begin(), recent.end())).mean();
      std::cout << "step " << step << " loss " << smoothed.item<float>()  // LOOKALIKE: tensor-sync-in-loop -- read only on logging steps
                << " update_rms " << opt.mean_update_rms() << std::endl;
    }
  }
  return 0;
}
