// FT-Transformer for tabular data: every numeric feature and every categorical field becomes a
// d_token embedding, a [CLS] token is prepended, and pre-norm attention blocks read the
// prediction off the [CLS] output. Standardisation statistics are fitted on the training split.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <numeric>
#include <vector>

struct FTConfig {
  int64_t n_num = 8;
  std::vector<int64_t> cardinalities{4, 12, 7};
  int64_t d_token = 192, n_heads = 8, n_blocks = 3, n_classes = 2;
  double attn_dropout = 0.2, lr = 1e-4, weight_decay = 1e-5;
};

struct TabularBatch {
  torch::Tensor x_num, x_cat, y; // [B, n_num] float, [B, n_cat] int64, [B] int64
};

// Fitted on the training split, applied to every split.
struct StandardScaler {
  torch::Tensor mean_, std_;

  void fit(const torch::Tensor &x) {
    mean_ = x.nanmean(0);
    std_ = (x - mean_).nan_to_num(0.0).std(0).clamp_min(1e-6);
  }

  torch::Tensor transform(const torch::Tensor &x) const {
    auto out = x.contiguous(); // one dense block for the tokenizer
    // FACT: x = torch.randn(5, 3); o = x.contiguous(); x0 = x.clone(); o.sub_(x.mean(0)).div_(x.std(0)); assert shares_storage(o, x) and not torch.equal(x, x0)
    out.sub_(mean_).div_(std_); // EXPECT: tensor-alias-then-mutate -- contiguous() returned the batch itself: the stored split is standardised again every epoch
    return out;
  }

  // Missing numeric values (NaN in the CSV) become the training mean.
  torch::Tensor impute(const torch::Tensor &x) const {
    auto missing = torch::isnan(x);
    auto fill = mean_.expand_as(x);
    // FACT: m = torch.randn(3); x = torch.randn(4, 3); f = m.expand_as(x); assert raises(lambda: f.mul_(torch.isnan(x)), "more than one element of the written-to tensor")
    fill.mul_(missing); // EXPECT: tensor-inplace-on-expanded -- the mean where a value is missing, 0 elsewhere
    return torch::nan_to_num(x, 0.0) + fill;
  }
};

struct NumericTokenizerImpl : torch::nn::Module {
  NumericTokenizerImpl(int64_t n, int64_t d) {
    weight_ = register_parameter("weight", torch::empty({n, d}));
    bias_ = register_parameter("bias", torch::empty({n, d}));
    const double bound = 1.0 / std::sqrt(double(d));
    // FACT: w = torch.nn.Parameter(torch.empty(3, 4)); torch.nn.init.kaiming_uniform_(w, a=5 ** 0.5); assert w.is_leaf and w.requires_grad
    torch::nn::init::kaiming_uniform_(weight_, std::sqrt(5.0)); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    // FACT: b = torch.nn.Parameter(torch.empty(3, 4)); assert raises(lambda: b.uniform_(-0.5, 0.5), "a leaf Variable that requires grad")
    bias_.uniform_(-bound, bound); // EXPECT: tensor-inplace-on-leaf -- a registered parameter, written with grad mode on
  }
  torch::Tensor forward(const torch::Tensor &x_num) { // [B, n] -> [B, n, d]
    return x_num.unsqueeze(-1) * weight_ + bias_;
  }
  torch::Tensor weight_, bias_;
};
TORCH_MODULE(NumericTokenizer);

struct CategoricalTokenizerImpl : torch::nn::Module {
  CategoricalTokenizerImpl(const std::vector<int64_t> &cards, int64_t d) {
    std::vector<int64_t> offs(cards.size(), 0);
    std::partial_sum(cards.begin(), cards.end() - 1, offs.begin() + 1);
    offsets_ = register_buffer("offsets", torch::tensor(offs, torch::kLong));
    const auto total = std::accumulate(cards.begin(), cards.end(), int64_t{0});
    emb_ = register_module("emb", torch::nn::Embedding(total, d));
    bias_ = register_parameter("bias", torch::zeros({int64_t(cards.size()), d}));
  }
  torch::Tensor forward(const torch::Tensor &x_cat) { // [B, n_cat] -> [B, n_cat, d]
    // FACT: x = torch.randint(0, 4, (5, 3)); o = torch.tensor([0, 4, 16]); i = x.clone(); i += o; assert torch.equal(i, x + o) and i.dtype == (x + o).dtype
    auto ids = x_cat.clone(); // EXPECT: tensor-unnecessary-clone -- x_cat + offsets_ makes the shifted ids in one pass
    ids += offsets_;
    return emb_(ids) + bias_;
  }
  torch::Tensor offsets_, bias_;
  torch::nn::Embedding emb_{nullptr};
};
TORCH_MODULE(CategoricalTokenizer);

struct FTAttentionImpl : torch::nn::Module {
  FTAttentionImpl(int64_t d, int64_t heads, double dropout) : n_heads_(heads) {
    qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
    out_ = register_module("out", torch::nn::Linear(d, d));
    drop_ = register_module("drop", torch::nn::Dropout(dropout));
  }

  // [B, T, d] -> [B * heads, T, d / heads], as in the reference implementation.
  torch::Tensor split_heads(const torch::Tensor &x) const {
    const auto B = x.size(0), T = x.size(1), dh = x.size(2) / n_heads_;
    // FACT: y = torch.randn(2, 5, 36); x = y.chunk(3, -1)[0]; assert is_copy_of(x.reshape(2, 5, 3, 4).transpose(1, 2).reshape(6, 5, 4), y)
    return x.reshape({B, T, n_heads_, dh}).transpose(1, 2).reshape({B * n_heads_, T, dh}); // EXPECT: tensor-reshape-non-contiguous
  }

  // Returns the block output and the attention probabilities [B * heads, T, T].
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    const auto B = x.size(0), T = x.size(1), d = x.size(2);
    auto qkv = qkv_(x).chunk(3, -1);
    auto q = split_heads(qkv[0]), k = split_heads(qkv[1]), v = split_heads(qkv[2]);
    auto probs = torch::softmax(torch::bmm(q, k.transpose(1, 2)) / std::sqrt(double(d / n_heads_)), -1);
    auto ctx = torch::bmm(drop_(probs), v);
    // FACT: c = torch.randn(6, 5, 4); m = c.view(2, 3, 5, 4).transpose(1, 2); mc = m.contiguous(); assert not is_contiguous(m) and is_copy_of(mc, c) and is_view_of(mc.view(2, 5, 12), mc)
    auto merged = ctx.view({B, n_heads_, T, -1}).transpose(1, 2).contiguous().view({B, T, d}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
    return {out_(merged), probs};
  }

  int64_t n_heads_;
  torch::nn::Linear qkv_{nullptr}, out_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(FTAttention);

struct FTTransformerImpl : torch::nn::Module {
  explicit FTTransformerImpl(const FTConfig &cfg) : n_heads_(cfg.n_heads) {
    num_ = register_module("num", NumericTokenizer(cfg.n_num, cfg.d_token));
    cat_ = register_module("cat", CategoricalTokenizer(cfg.cardinalities, cfg.d_token));
    cls_ = register_parameter("cls", torch::randn({1, 1, cfg.d_token}) / std::sqrt(double(cfg.d_token)));
    for (int64_t i = 0; i < cfg.n_blocks; ++i) {
      norms_.push_back(register_module("norm" + std::to_string(i), torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_token}))));
      attn_.push_back(register_module("attn" + std::to_string(i), FTAttention(cfg.d_token, cfg.n_heads, cfg.attn_dropout)));
    }
    head_norm_ = register_module("head_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_token})));
    head_ = register_module("head", torch::nn::Linear(cfg.d_token, cfg.n_classes));
  }

  torch::Tensor forward(const torch::Tensor &x_num, const torch::Tensor &x_cat) {
    const auto B = x_num.size(0);
    auto h = torch::cat({cls_.expand({B, 1, -1}), num_(x_num), cat_(x_cat)}, 1);
    for (size_t i = 0; i < attn_.size(); ++i) {
      // The first block skips its norm: the tokenizers' output is already well scaled.
      auto [y, probs] = attn_[i]->forward(i == 0 ? h : norms_[i](h));
      last_probs_ = probs;
      h = h + y;
    }
    return head_(torch::relu(head_norm_(h.select(1, 0))));
  }

  // Mean [CLS] attention of the last block, per token: a cheap feature-importance score.
  torch::Tensor cls_attention() const {
    const auto T = last_probs_.size(-1);
    // FACT: p = torch.softmax(torch.randn(6, 5, 5), -1); assert is_view_of(p.view(-1, 3, 5, 5), p)
    auto per_head = last_probs_.view({-1, n_heads_, T, T}); // LOOKALIKE: tensor-view-non-contiguous -- softmax returns a contiguous tensor
    return per_head.select(2, 0).mean(0).mean(0);
  }

  int64_t n_heads_;
  NumericTokenizer num_{nullptr};
  CategoricalTokenizer cat_{nullptr};
  torch::Tensor cls_, last_probs_;
  std::vector<torch::nn::LayerNorm> norms_;
  std::vector<FTAttention> attn_;
  torch::nn::LayerNorm head_norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(FTTransformer);

void fit(FTTransformer &model, StandardScaler &scaler, const std::vector<TabularBatch> &train,
         const std::vector<TabularBatch> &valid, const FTConfig &cfg, int epochs) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    torch::Tensor epoch_loss = torch::zeros({}, device);
    for (const auto &b : train) {
      auto x_num = scaler.transform(b.x_num).to(device);
      auto logits = model->forward(x_num, b.x_cat.to(device)); // LOOKALIKE: tensor-device-mismatch -- both inputs are moved with the model
      auto loss = torch::nn::functional::cross_entropy(logits, b.y.to(device));
      opt.zero_grad();
      loss.backward();
      opt.step();
      // FACT: m = torch.nn.Linear(3, 2); ls = [m(torch.randn(4, 3)).pow(2).mean() for _ in range(3)]; [l.backward() for l in ls]; s = torch.zeros(()); [s.add_(l) for l in ls]; assert s.requires_grad and kept_nodes(s) > 2 * kept_nodes(ls[0])
      epoch_loss += loss; // EXPECT: tensor-graph-kept-across-iterations -- only read for the log line
    }
    torch::Tensor val_loss = torch::zeros({}, device);
    {
      torch::NoGradGuard no_grad;
      model->eval();
      for (const auto &b : valid) {
        auto logits = model->forward(scaler.transform(b.x_num).to(device), b.x_cat.to(device));
        val_loss += torch::nn::functional::cross_entropy(logits, b.y.to(device)); // LOOKALIKE: tensor-graph-kept-across-iterations -- the validation pass runs under NoGradGuard
      }
    }
    std::cout << "epoch " << epoch << " train " << epoch_loss.item<double>() / train.size() << " valid "
              << val_loss.item<double>() / valid.size() << "\n";
  }
}

// Scoring rows from an external CSV (NaN where a value is missing).
torch::Tensor predict_proba(FTTransformer &model, const StandardScaler &scaler, const torch::Tensor &x_num_raw,
                            const torch::Tensor &x_cat, double clip, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto x = scaler.transform(scaler.impute(x_num_raw));
  // FACT: r = torch.randn(4, 3); r[1, 2] = float('nan'); m = torch.zeros(3); t = torch.nan_to_num(r, 0.0) + m.expand_as(r) * torch.isnan(r); x = t.contiguous(); x.clamp_(-5, 5); assert is_copy_of(x, r) and torch.isnan(r).any()
  x.clamp_(-clip, clip); // LOOKALIKE: tensor-alias-then-mutate -- impute() made a new tensor: the raw block keeps its NaNs for the rate below
  auto missing_rate = torch::isnan(x_num_raw).to(torch::kFloat).mean(1);
  auto probs = torch::softmax(model->forward(x.to(device), x_cat.to(device)), -1).cpu();
  auto importance = model->cls_attention();
  std::cout << "most attended token " << importance.argmax().item<int64_t>() << ", mean missing rate "
            << missing_rate.mean().item<float>() << "\n";
  return probs;
}
