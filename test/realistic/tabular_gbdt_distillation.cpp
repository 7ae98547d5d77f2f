// Distils a gradient-boosted tree ensemble (the teacher's raw per-class margins,
// exported next to the data) into a differentiable student: features are binned
// into uint8 codes, every (feature, bin) pair gets an embedding, and an ensemble of
// soft oblique decision trees (sigmoid routing level by level) maps them to the
// margins. Training stops early on the validation loss; per-feature importance
// comes from the gradient of the loss with respect to the bin embeddings.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;
namespace nn = torch::nn;
using torch::Tensor;

struct DistillConfig {
  int64_t n_bins = 64;
  int64_t emb_dim = 8;
  int64_t n_trees = 16;
  int64_t depth = 4;
  int64_t n_classes = 3;  // the teacher is a multiclass GBDT
  int64_t batch_size = 512;
  int64_t max_epochs = 200;
  int64_t patience = 10;
  double lr = 3e-3;
  double routing_eps = 1e-4;
};

// Per-feature bin edges fitted on the training split.
struct Quantizer {
  Tensor edges;   // [F, n_bins - 1]
  Tensor lo, hi;  // [F]

  void fit(const Tensor& x, int64_t n_bins) {
    TORCH_CHECK(n_bins >= 2 && n_bins <= 256, "codes are stored as uint8");
    auto qs = torch::linspace(0.0, 1.0, n_bins + 1).narrow(0, 1, n_bins - 1);
    edges = torch::quantile(x, qs, 0).t().contiguous();
    lo = std::get<0>(x.min(0));
    hi = std::get<0>(x.max(0));
  }

  // quantile bins: [N, F] float -> [N, F] uint8
  Tensor transform(const Tensor& x) const {
    auto codes = torch::empty({x.size(0), x.size(1)}, torch::kByte);
    for (int64_t f = 0; f < x.size(1); ++f) {
      auto col = x.select(1, f).contiguous(); // LOOKALIKE: tensor-clone-in-loop -- a different column every f
      codes.select(1, f).copy_(torch::bucketize(col, edges[f])); // LOOKALIKE: tensor-copy-narrowing -- bin ids are < n_bins <= 256
    }
    return codes;
  }

  // equal-width bins between the training min and max, for the online scorer
  Tensor transform_uniform(const Tensor& x, int64_t n_bins) const {
    Tensor scaled = x;
    scaled = (scaled - lo) / (hi - lo + 1e-12);
    // FACT: x = torch.rand(4, 3); s = x; s = (s - 0.1) / 0.8; s.mul_(63); assert is_copy_of(s, x)
    scaled.mul_(static_cast<double>(n_bins - 1)); // LOOKALIKE: tensor-alias-then-mutate -- 'scaled' was rebound to a fresh tensor first
    auto codes = torch::empty({x.size(0), x.size(1)}, torch::kByte);
    codes.copy_(scaled); // EXPECT: tensor-copy-narrowing
    return codes;
  }
};

struct BinEmbeddingImpl : nn::Module {
  BinEmbeddingImpl(int64_t n_features, int64_t n_bins, int64_t dim) {
    table_ = register_module("table", nn::Embedding(n_features * n_bins, dim));
    offsets_ = register_buffer("offsets", torch::arange(n_features) * n_bins);
    nn::init::normal_(table_->weight, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
  }

  // ids: [N, F] int64 bin ids -> [N, F, D]
  Tensor forward(const Tensor& ids) { return table_(ids + offsets_); }

  nn::Embedding table_{nullptr};
  Tensor offsets_;
};
TORCH_MODULE(BinEmbedding);

struct SoftTreeEnsembleImpl : nn::Module {
  SoftTreeEnsembleImpl(int64_t in_dim, const DistillConfig& cfg)
      : n_trees_(cfg.n_trees), depth_(cfg.depth), eps_(cfg.routing_eps) {
    n_inner_ = (int64_t(1) << depth_) - 1;
    const int64_t n_leaves = int64_t(1) << depth_;
    routers_ = register_module("routers", nn::Linear(in_dim, n_trees_ * n_inner_));
    beta_ = register_parameter("beta", torch::ones({n_trees_, n_inner_}));
    leaves_ = register_parameter("leaves", torch::randn({n_trees_, n_leaves, cfg.n_classes}) * 0.01);
  }

  // x: [N, in] -> per-tree leaf mixtures, flattened: [N, T * K]
  Tensor forward(const Tensor& x) {
    const int64_t N = x.size(0);
    auto decisions = torch::sigmoid(routers_(x).view({N, n_trees_, n_inner_}) * beta_);
    decisions.clamp_(eps_, 1.0 - eps_); // EXPECT: tensor-inplace-on-saved
    auto mu = torch::ones({N, n_trees_, 1}, x.options());
    int64_t begin = 0;
    for (int64_t level = 0; level < depth_; ++level) {
      const int64_t width = int64_t(1) << level;
      auto d = decisions.narrow(2, begin, width);
      auto route = torch::stack({d, 1.0 - d}, 3);  // [N, T, width, 2]: left, right
      // FACT: m = torch.rand(2, 3, 4).unsqueeze(3) * torch.stack([torch.rand(2, 3, 4), torch.rand(2, 3, 4)], 3); assert is_view_of(m.view(2, 3, 8), m)
      mu = (mu.unsqueeze(3) * route).view({N, n_trees_, 2 * width}); // LOOKALIKE: tensor-view-non-contiguous -- the product of contiguous operands is contiguous
      begin += width;
    }
    auto per_tree = torch::bmm(mu.transpose(0, 1), leaves_);  // [T, N, K]
    // FACT: r = torch.bmm(torch.rand(4, 5, 8), torch.rand(4, 8, 3)).transpose(0, 1); assert is_copy_of(r.reshape(5, -1), r)
    return per_tree.transpose(0, 1).reshape({N, -1}); // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t n_trees_, depth_, n_inner_;
  double eps_;
  nn::Linear routers_{nullptr};
  Tensor beta_, leaves_;
};
TORCH_MODULE(SoftTreeEnsemble);

struct StudentImpl : nn::Module {
  StudentImpl(int64_t n_features, const DistillConfig& cfg, const Tensor& base_score) {
    embed = register_module("embed", BinEmbedding(n_features, cfg.n_bins, cfg.emb_dim));
    trees = register_module("trees", SoftTreeEnsemble(n_features * cfg.emb_dim, cfg));
    head = register_module("head", nn::Linear(cfg.n_trees * cfg.n_classes, cfg.n_classes));
    base_score_ = register_buffer("base_score", base_score.clone());
  }

  Tensor forward_from_embedding(const Tensor& e) {
    // FACT: e = torch.nn.Embedding(12, 4)(torch.randint(0, 12, (5, 3))); assert is_view_of(e.flatten(1), e)
    auto out = head(trees(e.flatten(1))); // LOOKALIKE: tensor-reshape-non-contiguous -- the embedding output is contiguous
    out.add_(base_score_); // LOOKALIKE: tensor-inplace-on-saved -- a Linear does not save its output
    return out;
  }

  Tensor forward(const Tensor& ids) { return forward_from_embedding(embed(ids)); }

  BinEmbedding embed{nullptr};
  SoftTreeEnsemble trees{nullptr};
  nn::Linear head{nullptr};
  Tensor base_score_;
};
TORCH_MODULE(Student);

struct Split {
  Tensor codes;    // [N, F] uint8
  Tensor teacher;  // [N, K] raw margins of the GBDT
};

double distill(Student& student, const Split& train, const Split& val, const DistillConfig& cfg) {
  torch::optim::Adam opt(student->parameters(), torch::optim::AdamOptions(cfg.lr));
  const int64_t N = train.codes.size(0);
  double best_val = std::numeric_limits<double>::infinity();
  int64_t bad_epochs = 0;
  std::vector<Tensor> best_state;
  Tensor smoothed = torch::zeros({});

  for (int64_t epoch = 0; epoch < cfg.max_epochs; ++epoch) {
    student->train();
    auto perm = torch::randperm(N);
    for (int64_t s = 0; s < N; s += cfg.batch_size) {
      auto idx = perm.narrow(0, s, std::min(cfg.batch_size, N - s));
      auto ids = train.codes.index_select(0, idx).to(torch::kLong); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto loss = F::mse_loss(student->forward(ids), train.teacher.index_select(0, idx));
      opt.zero_grad();
      loss.backward();
      opt.step();
      smoothed = 0.98 * smoothed + 0.02 * loss; // EXPECT: tensor-graph-kept-across-iterations
    }

    double val_loss = 0.0;
    {
      torch::NoGradGuard no_grad;
      student->eval();
      auto val_pred = student->forward(val.codes.to(torch::kLong)); // EXPECT: tensor-clone-in-loop
      val_loss = F::mse_loss(val_pred, val.teacher).item<double>();
    }
    std::cout << "epoch " << epoch << " train " << smoothed.item<double>() << " val " << val_loss << "\n";

    if (val_loss < best_val - 1e-6) {
      best_val = val_loss;
      bad_epochs = 0;
      best_state.clear();
      for (const auto& p : student->parameters())
        best_state.push_back(p.detach().clone()); // LOOKALIKE: tensor-clone-in-loop, tensor-graph-kept-across-iterations -- each detached snapshot is kept on purpose
    } else if (++bad_epochs >= cfg.patience) {
      break;
    }
  }

  // roll back to the best epoch
  auto params = student->parameters();
  for (size_t i = 0; i < params.size() && i < best_state.size(); ++i)
    params[i].copy_(best_state[i]); // EXPECT: tensor-inplace-on-leaf
  return best_val;
}

// Mean |dL/d embedding| per feature, as shares that sum to one.
Tensor feature_importance(Student& student, const Split& data, int64_t batch_size) {
  student->eval();
  const int64_t N = data.codes.size(0), n_features = data.codes.size(1);
  auto importance = torch::zeros({n_features});
  for (int64_t s = 0; s < N; s += batch_size) {
    const int64_t n = std::min(batch_size, N - s);
    auto emb = student->embed(data.codes.narrow(0, s, n).to(torch::kLong));  // [n, F, D]
    auto loss = F::mse_loss(student->forward_from_embedding(emb), data.teacher.narrow(0, s, n));
    auto grad = torch::autograd::grad({loss}, {emb})[0];
    // FACT: g = torch.randn(6, 4, 3); assert raises(lambda: g.abs().transpose(0, 1).view(4, -1), "view size is not compatible")
    importance += grad.abs().transpose(0, 1).view({n_features, -1}).mean(1); // EXPECT: tensor-view-non-contiguous // LOOKALIKE: tensor-graph-kept-across-iterations -- grad() without create_graph returns no graph
  }
  auto share = importance.clone(); // EXPECT: tensor-unnecessary-clone
  share /= importance.sum();
  return share;
}

void report_importance(const Tensor& share, const std::vector<std::string>& names, int64_t top_k) {
  auto order = std::get<1>(share.sort(0, /*descending=*/true));
  auto ord = order.accessor<int64_t, 1>();
  auto val = share.accessor<float, 1>();
  for (int64_t i = 0; i < std::min<int64_t>(top_k, order.size(0)); ++i)
    std::cout << names[ord[i]] << ": " << val[ord[i]] << "\n";
}
