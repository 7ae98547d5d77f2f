// DLRM (Naumov et al. 2019) click-through-rate model on Criteo-style click logs: 13 count
// features (log-transformed) through a bottom MLP, 26 hashed categorical features through one
// sum-pooled EmbeddingBag each, then every pair of the 27 feature vectors meets in a dot product
// (the strict upper triangle of T T^T, gathered with triu indices), and the top MLP turns the
// dense vector and the interactions into one click logit. Days 1..n-1 train, the last day
// validates (log loss, accuracy, AUC).
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

struct DlrmConfig {
  int64_t n_dense = 13, emb_dim = 16;
  std::vector<int64_t> table_sizes;             // rows per categorical field (26 for Criteo)
  std::vector<int64_t> bottom = {512, 256, 64}; // then emb_dim
  std::vector<int64_t> top = {512, 256};        // then 1
  std::string interaction = "dot";              // or "cat" (plain concatenation)
  int64_t batch_size = 2048, log_every = 1024;
  double lr = 0.1, eps = 1e-7;
};

// Linear + ReLU stack, weights N(0, sqrt(2 / (fan_in + fan_out))) as in the reference DLRM.
torch::nn::Sequential make_mlp(int64_t in, const std::vector<int64_t> &sizes, bool last_relu) {
  torch::nn::Sequential mlp;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto lin = torch::nn::Linear(in, sizes[i]);
    // FACT: l = torch.nn.Linear(4, 3); torch.nn.init.normal_(l.weight, 0.0, 0.5); assert l.weight.is_leaf and l.weight.requires_grad
    torch::nn::init::normal_(lin->weight, 0.0, std::sqrt(2.0 / static_cast<double>(in + sizes[i]))); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    torch::nn::init::normal_(lin->bias, 0.0, std::sqrt(1.0 / static_cast<double>(sizes[i])));
    mlp->push_back(lin);
    if (i + 1 < sizes.size() || last_relu)
      mlp->push_back(torch::nn::ReLU());
    in = sizes[i];
  }
  return mlp;
}

struct DlrmImpl : torch::nn::Module {
  explicit DlrmImpl(const DlrmConfig &cfg) : cat_(cfg.interaction == "cat") {
    auto bottom = cfg.bottom;
    bottom.push_back(cfg.emb_dim);
    bottom_ = register_module("bottom", make_mlp(cfg.n_dense, bottom, true));
    for (size_t k = 0; k < cfg.table_sizes.size(); ++k) {
      auto bag = torch::nn::EmbeddingBag(
          torch::nn::EmbeddingBagOptions(cfg.table_sizes[k], cfg.emb_dim).mode(torch::kSum));
      const double bound = std::sqrt(1.0 / static_cast<double>(cfg.table_sizes[k]));
      // FACT: e = torch.nn.EmbeddingBag(10, 4, mode='sum'); assert raises(lambda: e.weight.uniform_(-0.3, 0.3), "a leaf Variable that requires grad")
      bag->weight.uniform_(-bound, bound); // EXPECT: tensor-inplace-on-leaf -- the table's weight requires grad and grad mode is on
      tables_.push_back(register_module("emb" + std::to_string(k), bag));
    }
    const int64_t F = static_cast<int64_t>(cfg.table_sizes.size()) + 1;
    auto tri = torch::triu_indices(F, F, 1); // [2, F (F - 1) / 2], kept on the host
    rows_ = tri[0];
    cols_ = tri[1];
    const int64_t n_top = cat_ ? F * cfg.emb_dim : cfg.emb_dim + F * (F - 1) / 2;
    auto top = cfg.top;
    top.push_back(1);
    top_ = register_module("top", make_mlp(n_top, top, false));
  }

  // dense [B, n_dense] log counts, ids [B, n_fields] int64 -> click logits [B]
  torch::Tensor forward(const torch::Tensor &dense, const torch::Tensor &ids) {
    auto x = bottom_->forward(dense);
    std::vector<torch::Tensor> feats{x};
    for (size_t k = 0; k < tables_.size(); ++k) {
      // FACT: ids = torch.randint(0, 9, (8, 26)); c = ids[:, 3]; assert not c.is_contiguous() and is_view_of(c.view(-1, 1), ids)
      auto bag_ids = ids.select(1, static_cast<int64_t>(k)).view({-1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- a strided column, but the view only adds a unit dim
      feats.push_back(tables_[k]->forward(bag_ids));
    }
    auto T = torch::stack(feats).transpose(0, 1); // [F, B, D] -> [B, F, D]
    torch::Tensor R;
    if (cat_) {
      // FACT: f = [torch.randn(4, 3) for _ in range(5)]; T = torch.stack(f).transpose(0, 1); r = T.reshape(T.size(0), -1); assert not T.is_contiguous() and is_copy_of(r, T) and torch.equal(r, torch.cat(f, 1))
      R = T.reshape({T.size(0), -1}); // EXPECT: tensor-reshape-non-contiguous -- the feature and batch dims are swapped: a full copy every step
    } else {
      auto Z = torch::bmm(T, T.transpose(1, 2));
      // FACT: Z = torch.randn(2, 4, 4); ri, ci = torch.triu_indices(4, 4, 1); assert Z[:, ri, ci].shape == (2, 6)
      auto pairs = Z.index({torch::indexing::Slice(), rows_, cols_}); // LOOKALIKE: tensor-device-mismatch -- host index tensors may index a CUDA tensor
      R = torch::cat({x, pairs}, 1);
    }
    // FACT: o = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))(torch.randn(5, 6)); assert is_view_of(o.view(-1), o)
    return top_->forward(R).view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear's [B, 1] output is contiguous
  }

  // Tables exported by the embedding service, loaded before fine-tuning.
  void load_tables(const std::vector<torch::Tensor> &weights) {
    torch::NoGradGuard no_grad;
    // FACT: e = torch.nn.EmbeddingBag(10, 4, mode='sum'); exec('with torch.no_grad(): e.weight.copy_(torch.ones(10, 4))'); assert e.weight.is_leaf and e.weight.requires_grad
    for (size_t k = 0; k < tables_.size(); ++k)
      tables_[k]->weight.copy_(weights[k]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  bool cat_;
  torch::nn::Sequential bottom_{nullptr}, top_{nullptr};
  std::vector<torch::nn::EmbeddingBag> tables_;
  torch::Tensor rows_, cols_;
};
TORCH_MODULE(Dlrm);

// One day of the log on the host: click, 13 counts, 26 categoricals as 8-digit hex hashes.
struct ClickLog {
  torch::Tensor dense;       // [N, 13] float32 raw counts
  torch::Tensor ids;         // [N, 26] int32, reduced modulo each table's size
  std::vector<float> clicks; // [N]
};

ClickLog parse_day(const std::vector<std::string> &lines, const DlrmConfig &cfg) {
  const auto N = static_cast<int64_t>(lines.size());
  const auto n_sparse = static_cast<int64_t>(cfg.table_sizes.size());
  ClickLog log;
  log.dense = torch::zeros({N, cfg.n_dense});
  auto hashes = torch::zeros({N, n_sparse}, torch::kLong);
  auto d = log.dense.accessor<float, 2>();
  auto h = hashes.accessor<int64_t, 2>();
  log.clicks.resize(lines.size());
  for (int64_t i = 0; i < N; ++i) {
    std::istringstream row(lines[i]);
    std::string tok;
    std::getline(row, tok, '\t');
    log.clicks[i] = std::stof(tok);
    for (int64_t j = 0; j < cfg.n_dense; ++j) {
      std::getline(row, tok, '\t');
      d[i][j] = tok.empty() ? 0.0f : std::stof(tok);
    }
    for (int64_t j = 0; j < n_sparse; ++j) {
      std::getline(row, tok, '\t');
      h[i][j] = tok.empty() ? 0 : static_cast<int64_t>(std::stoull(tok, nullptr, 16));
    }
  }
  // int32 ids halve the host memory of a day (45M rows x 26 fields).
  auto ids = torch::empty({N, n_sparse}, torch::kInt);
  // FACT: h = torch.tensor([0xdeadbeef, 12345]); i = torch.empty(2, dtype=torch.int); i.copy_(h); assert i.tolist() == [0xdeadbeef - 2**32, 12345]
  ids.copy_(hashes); // EXPECT: tensor-copy-narrowing -- 32-bit hashes above 2^31 wrap to negative int32 before the modulo
  ids.remainder_(torch::tensor(cfg.table_sizes).to(torch::kInt));
  log.ids = ids;
  return log;
}

struct ClickBatch {
  torch::Tensor dense, ids; // host tensors
  std::vector<float> clicks;
};

ClickBatch slice_batch(const ClickLog &log, int64_t start, int64_t n) {
  ClickBatch b;
  b.dense = torch::log1p(log.dense.narrow(0, start, n).clamp_min(0.0)); // missing counts are -1 in some days
  b.ids = log.ids.narrow(0, start, n).to(torch::kLong);
  b.clicks.assign(log.clicks.begin() + start, log.clicks.begin() + start + n);
  return b;
}

void train_day(Dlrm &model, torch::optim::Optimizer &opt, const ClickLog &day, const DlrmConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  const int64_t N = day.dense.size(0);
  auto smoothed = torch::zeros({}, device);
  auto day_loss = torch::zeros({}, device);
  int64_t step = 0;
  for (int64_t start = 0; start + cfg.batch_size <= N; start += cfg.batch_size, ++step) {
    auto b = slice_batch(day, start, cfg.batch_size);
    auto dense = b.dense.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    auto ids = b.ids.to(device);
    auto y = torch::tensor(b.clicks).to(device);
    auto p = torch::sigmoid(model->forward(dense, ids));
    // FACT: x = torch.randn(6, requires_grad=True); p = torch.sigmoid(x * 2); p.clamp_(1e-7, 1 - 1e-7); l = torch.nn.functional.binary_cross_entropy(p, torch.ones(6)); assert backward_fails(lambda: l.backward())
    p.clamp_(cfg.eps, 1.0 - cfg.eps); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its result for backward
    auto loss = torch::binary_cross_entropy(p, y); // LOOKALIKE: tensor-device-mismatch -- the labels were moved to the GPU too
    opt.zero_grad();
    loss.backward();
    opt.step();
    // FACT: l = torch.nn.Linear(3, 1); s = torch.zeros(()); exec('for _ in range(3):\n loss = l(torch.randn(4, 3)).sigmoid().mean(); loss.backward(); s = 0.98 * s + 0.02 * loss'); assert s.requires_grad and kept_nodes(s) >= 3 * 3
    smoothed = 0.98 * smoothed + 0.02 * loss; // EXPECT: tensor-graph-kept-across-iterations -- the running average reaches every step's graph
    // FACT: l = torch.nn.Linear(3, 1); s = torch.zeros(()); loss = l(torch.randn(4, 3)).pow(2).mean(); s += loss.detach(); assert not s.requires_grad and kept_nodes(s) == 0
    day_loss += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph kept
    if (step % cfg.log_every == 0)
      std::cout << "step " << step << " smoothed loss " << smoothed.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
  }
  std::cout << "day mean loss " << (day_loss / std::max<int64_t>(step, 1)).item<float>() << "\n";
}

// Area under the ROC curve by the rank-sum formula (ties ignored), host tensors [N].
double auc(const torch::Tensor &scores, const torch::Tensor &labels) {
  const int64_t n = scores.size(0);
  auto order = std::get<1>(scores.sort());
  auto ranks = torch::empty({n}, torch::kLong);
  // FACT: n = 5; r = torch.empty(n, dtype=torch.long); r.index_put_((torch.randperm(n),), torch.arange(1, n + 1)); assert r.dtype == torch.long and sorted(r.tolist()) == [1, 2, 3, 4, 5]
  ranks.index_put_({order}, torch::arange(1, n + 1)); // LOOKALIKE: tensor-copy-narrowing -- int64 ranks into an int64 tensor
  auto pos = labels > 0.5;
  const double n_pos = pos.sum().item<double>(), n_neg = static_cast<double>(n) - n_pos;
  if (n_pos == 0 || n_neg == 0)
    return 0.5;
  const double rank_sum = ranks.masked_select(pos).sum().item<double>();
  return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg);
}

struct EvalResult {
  double logloss = 0, accuracy = 0, auc = 0;
};

EvalResult evaluate(Dlrm &model, const ClickLog &day, const DlrmConfig &cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  torch::Device device(torch::kCUDA);
  const int64_t N = day.dense.size(0);
  std::vector<torch::Tensor> scores;
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  double logloss = 0.0;
  for (int64_t start = 0; start < N; start += cfg.batch_size) {
    const auto n = std::min(cfg.batch_size, N - start);
    auto b = slice_batch(day, start, n);
    auto p = torch::sigmoid(model->forward(b.dense.to(device), b.ids.to(device)));
    auto y = torch::tensor(b.clicks);
    logloss += torch::binary_cross_entropy(p, y.to(device), {}, at::Reduction::Sum).item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every batch to add up the loss
    correct += ((p > 0.5) == (y > 0.5)).sum(); // EXPECT: tensor-device-mismatch -- y is still on the host
    scores.push_back(p.cpu()); // LOOKALIKE: tensor-sync-in-loop, tensor-graph-kept-across-iterations -- the host scores are kept for the AUC; under NoGradGuard
  }
  EvalResult r;
  r.logloss = logloss / static_cast<double>(N);
  r.accuracy = correct.item<double>() / static_cast<double>(N);
  r.auc = auc(torch::cat(scores), torch::tensor(day.clicks));
  return r;
}

void run(const std::vector<std::vector<std::string>> &days, const DlrmConfig &cfg,
         const std::vector<torch::Tensor> &pretrained_tables) {
  Dlrm model(cfg);
  if (!pretrained_tables.empty())
    model->load_tables(pretrained_tables);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr));
  std::vector<ClickLog> logs;
  for (const auto &lines : days)
    logs.push_back(parse_day(lines, cfg));
  for (size_t d = 0; d + 1 < logs.size(); ++d)
    train_day(model, opt, logs[d], cfg);
  const auto r = evaluate(model, logs.back(), cfg);
  std::cout << "validation: log loss " << r.logloss << " accuracy " << r.accuracy << " AUC " << r.auc << "\n";
}
