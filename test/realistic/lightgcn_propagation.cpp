// LightGCN (He et al., SIGIR 2020) for implicit-feedback recommendation in LibTorch.
// Users and items are nodes of one bipartite graph; embeddings are smoothed over K
// hops of the symmetric-normalised adjacency (no weights, no non-linearity), the
// layer outputs averaged, and the model trained with BPR on sampled negatives.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct GcnConfig {
  int64_t n_users = 0, n_items = 0, dim = 64, n_layers = 3;
  int64_t batch = 2048, n_neg = 1, topk = 20, eval_chunk = 1024, epochs = 400;
  double lr = 1e-3, reg = 1e-4;
  bool concat_layers = false;  // NGCF-style concatenation of the layers instead of the mean
};

// D^-1/2 A D^-1/2 of the user-item graph as a sparse [U + I, U + I] matrix.
torch::Tensor normalized_adjacency(const torch::Tensor& users, const torch::Tensor& items,
                                   int64_t n_users, int64_t n_items) {
  const int64_t N = n_users + n_items;
  auto item_nodes = items + n_users;
  auto rows = torch::cat({users, item_nodes});
  auto cols = torch::cat({item_nodes, users});
  auto counts = torch::bincount(rows, {}, N);
  // FACT: c = torch.bincount(torch.tensor([0, 1, 1, 3])); assert is_copy_of(c.to(torch.float64), c)
  auto deg = counts.to(torch::kDouble);
  deg.clamp_min_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- bincount counts are int64: to(kDouble) is a copy
  auto dinv = deg.rsqrt();
  auto vals = torch::empty({rows.size(0)});
  vals.copy_(dinv.index_select(0, rows) * dinv.index_select(0, cols));  // EXPECT: tensor-copy-narrowing
  std::cout << "graph: " << N << " nodes, " << (counts == 0).sum().item<int64_t>() << " isolated\n";
  return torch::sparse_coo_tensor(torch::stack({rows, cols}), vals, {N, N}).coalesce();
}

struct LightGCNImpl : nn::Module {
  LightGCNImpl(const GcnConfig& c, torch::Tensor adj)
      : cfg(c),
        adj_(std::move(adj)),
        user_emb(register_module("user_emb", nn::Embedding(c.n_users, c.dim))),
        item_emb(register_module("item_emb", nn::Embedding(c.n_items, c.dim))) {
    nn::init::normal_(user_emb->weight, 0.0, 0.1);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    nn::init::normal_(item_emb->weight, 0.0, 0.1);
  }

  // Item vectors from a content encoder (titles, descriptions) as a warm start.
  void load_item_vectors(const torch::Tensor& item_vecs) {
    TORCH_CHECK(item_vecs.size(0) == cfg.n_items && item_vecs.size(1) == cfg.dim, "item table shape");
    item_emb->weight.copy_(item_vecs);  // EXPECT: tensor-inplace-on-leaf
  }

  // Items without interactions get a fresh small random vector after each refresh.
  void reinit_cold_items(const torch::Tensor& item_ids) {
    torch::NoGradGuard no_grad;
    auto fresh = torch::randn({item_ids.size(0), cfg.dim}) * 0.1;
    item_emb->weight.index_copy_(0, item_ids, fresh);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  // Final [U + I, D'] embeddings: layers 0..K combined.
  torch::Tensor propagate() {
    auto ego = torch::cat({user_emb->weight, item_emb->weight}, 0);
    std::vector<torch::Tensor> layers{ego};
    for (int64_t k = 0; k < cfg.n_layers; ++k) {
      ego = adj_.is_sparse() ? torch::mm(adj_, ego) : adj_.matmul(ego);
      layers.push_back(ego);  // LOOKALIKE: tensor-graph-kept-across-iterations -- combined into the returned embeddings, which the loss differentiates
    }
    auto stacked = torch::stack(layers, 0);
    if (!cfg.concat_layers) return stacked.mean(0);
    // FACT: s = torch.randn(4, 6, 5); assert is_copy_of(s.transpose(0, 1).reshape(6, 20), s)
    return stacked.transpose(0, 1).reshape({stacked.size(1), -1});  // EXPECT: tensor-reshape-non-contiguous
  }

  torch::Tensor bpr_loss(const torch::Tensor& users, const torch::Tensor& pos, const torch::Tensor& neg) {
    auto all = propagate();
    const int64_t B = users.size(0), D = all.size(1);
    auto user_all = all.narrow(0, 0, cfg.n_users);
    auto item_all = all.narrow(0, cfg.n_users, cfg.n_items);
    // unit-norm item table for the online retrieval index, refreshed every step
    auto unit = item_all.detach();
    unit.div_(unit.norm(2, 1, true).clamp_min(1e-12));  // EXPECT: tensor-inplace-on-detached
    item_cache_ = unit;
    auto u = user_all.index_select(0, users);
    auto p = item_all.index_select(0, pos);
    // FACT: w = torch.randn(10, 4); i = torch.randint(0, 8, (6,)); n = w.narrow(0, 2, 8).index_select(0, i).view(3, 2, 4); assert is_contiguous(n)
    auto n = item_all.index_select(0, neg.reshape({-1})).view({B, -1, D});  // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a new contiguous tensor
    auto pos_scores = (u * p).sum(1, true);
    auto neg_scores = (u.unsqueeze(1) * n).sum(-1);
    auto bpr = -F::logsigmoid(pos_scores - neg_scores).mean();
    auto l2 = user_emb(users).pow(2).sum() + item_emb(pos).pow(2).sum() + item_emb(neg).pow(2).sum();
    return bpr + cfg.reg * l2 / (2.0 * B);
  }

  GcnConfig cfg;
  torch::Tensor adj_, item_cache_;
  nn::Embedding user_emb, item_emb;
};
TORCH_MODULE(LightGCN);

double train_epoch(LightGCN& model, torch::optim::Optimizer& opt, const torch::Tensor& train_users,
                   const torch::Tensor& train_items, const GcnConfig& cfg) {
  model->train();
  const int64_t n = train_users.size(0);
  auto perm = torch::randperm(n);
  std::vector<torch::Tensor> batch_losses;
  torch::Tensor last_loss;
  for (int64_t s = 0; s < n; s += cfg.batch) {
    auto idx = perm.narrow(0, s, std::min(cfg.batch, n - s));
    auto users = train_users.index_select(0, idx);
    auto pos = train_items.index_select(0, idx);
    auto neg = torch::randint(cfg.n_items, {idx.size(0), cfg.n_neg}, torch::kLong);
    auto loss = model->bpr_loss(users, pos, neg);
    opt.zero_grad();
    loss.backward();
    opt.step();
    batch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    last_loss = loss;  // LOOKALIKE: tensor-graph-kept-across-iterations -- one handle overwritten each step: one graph at a time
  }
  std::cout << "last batch loss " << last_loss.item<double>() << "\n";
  return torch::stack(batch_losses).mean().item<double>();
}

struct EvalResult {
  double recall = 0.0, hit_ratio = 0.0;
};

// Recall@k over held-out interactions, ranking all items except the user's training items.
EvalResult evaluate(LightGCN& model, const std::vector<std::vector<int64_t>>& train_pos,
                    const std::vector<std::vector<int64_t>>& test_pos, const GcnConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  torch::Device dev(torch::kCUDA);
  auto all = model->propagate();
  auto users_all = all.narrow(0, 0, cfg.n_users);
  auto items = all.narrow(0, cfg.n_users, cfg.n_items).to(dev);
  auto per_user = torch::zeros({cfg.n_users}, torch::TensorOptions().dtype(torch::kDouble).device(dev));
  double hits_total = 0.0;
  for (int64_t s = 0; s < cfg.n_users; s += cfg.eval_chunk) {
    const int64_t m = std::min(cfg.eval_chunk, cfg.n_users - s);
    auto u = users_all.narrow(0, s, m).to(dev);  // LOOKALIKE: tensor-clone-in-loop -- a different block of users each pass
    auto items_t = items.t().contiguous();  // EXPECT: tensor-clone-in-loop
    auto rating = torch::mm(u, items_t);
    std::vector<int64_t> sr, sc, tr, tc;
    for (int64_t r = 0; r < m; ++r) {
      for (auto it : train_pos[s + r]) sr.push_back(r), sc.push_back(it);
      for (auto it : test_pos[s + r]) tr.push_back(r), tc.push_back(it);
    }
    auto seen = torch::zeros({m, cfg.n_items});
    seen.index_put_({torch::tensor(sr), torch::tensor(sc)}, 1.0);
    auto truth = torch::zeros({m, cfg.n_items}, torch::TensorOptions().dtype(torch::kBool).device(dev));
    truth.index_put_({torch::tensor(tr), torch::tensor(tc)}, true);  // LOOKALIKE: tensor-device-mismatch -- CPU index tensors may index a CUDA tensor
    rating = rating - seen * 1e9;  // EXPECT: tensor-device-mismatch
    auto top = std::get<1>(rating.topk(cfg.topk, 1));
    auto hits = truth.gather(1, top).sum(1).to(torch::kFloat);
    auto n_test = truth.sum(1).clamp_min(1).to(torch::kFloat);
    per_user.narrow(0, s, m).copy_(hits / n_test.clamp_max(cfg.topk));  // LOOKALIKE: tensor-copy-narrowing -- float32 into float64 widens
    hits_total += hits.sum().item<double>();  // EXPECT: tensor-sync-in-loop
  }
  EvalResult res;
  res.recall = per_user.mean().item<double>();
  res.hit_ratio = hits_total / static_cast<double>(cfg.n_users * cfg.topk);
  return res;
}

void fit(const torch::Tensor& train_users, const torch::Tensor& train_items,
         const std::vector<std::vector<int64_t>>& train_pos, const std::vector<std::vector<int64_t>>& test_pos,
         const GcnConfig& cfg) {
  auto adj = normalized_adjacency(train_users, train_items, cfg.n_users, cfg.n_items);
  LightGCN model(cfg, adj);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  double best = 0.0;
  for (int64_t epoch = 1; epoch <= cfg.epochs; ++epoch) {
    const double loss = train_epoch(model, opt, train_users, train_items, cfg);
    if (epoch % 20 != 0) continue;
    auto res = evaluate(model, train_pos, test_pos, cfg);
    best = std::max(best, res.recall);
    std::cout << "epoch " << epoch << " loss " << loss << " recall@" << cfg.topk << " " << res.recall
              << " hr " << res.hit_ratio << " best " << best << "\n";
  }
}
