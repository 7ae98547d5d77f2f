// GIN with a virtual node for multi-task molecular property prediction (Tox21-style
// binary tasks with missing labels). Message passing is written with index_select /
// index_add_ over edge_index; graphs in a mini-batch are told apart by a batch vector.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

const std::vector<int64_t> kAtomFeatureDims = {119, 5, 12, 12, 10, 6, 6, 2, 2};
const std::vector<int64_t> kBondFeatureDims = {5, 6, 2};

struct GinConfig {
  int64_t emb_dim = 300;
  int64_t num_layers = 5;
  int64_t num_tasks = 12;
  double drop_ratio = 0.5;
  double drop_edge = 0.1;
  std::string jk = "last";  // "last", "sum" or "concat"
  bool residual = false;
  int64_t batch_size = 32;
  int64_t epochs = 100;
  double lr = 1e-3;
};

struct MolGraph {
  torch::Tensor x, edge_index, edge_attr;
  torch::Tensor y;
};

struct MolBatch {
  torch::Tensor x, edge_index, edge_attr, batch, y;
  int64_t num_graphs = 0;
  MolBatch to(torch::Device d) const {
    return {x.to(d), edge_index.to(d), edge_attr.to(d), batch.to(d), y.to(d), num_graphs};
  }
};

MolBatch collate(const std::vector<MolGraph>& graphs, const std::vector<int64_t>& idx, int64_t num_tasks) {
  int64_t total_edges = 0;
  for (auto i : idx) total_edges += graphs[i].edge_index.size(1);
  std::vector<torch::Tensor> xs, eas, bs;
  auto edge_index = torch::empty({2, total_edges}, torch::kLong);
  auto y = torch::empty({static_cast<int64_t>(idx.size()), num_tasks}, torch::kFloat);
  int64_t node_off = 0, edge_off = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    const MolGraph& g = graphs[idx[k]];
    const int64_t n = g.x.size(0), e = g.edge_index.size(1);
    xs.push_back(g.x.clone());  // EXPECT: tensor-unnecessary-clone
    edge_index.narrow(1, edge_off, e).copy_(g.edge_index + node_off);  // LOOKALIKE: tensor-copy-narrowing -- int64 indices into an int64 buffer
    eas.push_back(g.edge_attr);
    bs.push_back(torch::full({n}, static_cast<int64_t>(k), torch::kLong));
    y[k].copy_(g.y);  // EXPECT: tensor-copy-narrowing
    node_off += n;
    edge_off += e;
  }
  return {torch::cat(xs), edge_index, torch::cat(eas), torch::cat(bs), y, static_cast<int64_t>(idx.size())};
}

// One embedding table for several categorical columns, shifted by per-column offsets.
struct MultiEmbeddingImpl : torch::nn::Module {
  torch::nn::Embedding emb{nullptr};
  torch::Tensor offsets;

  MultiEmbeddingImpl(const std::vector<int64_t>& dims, int64_t emb_dim) {
    std::vector<int64_t> offs(dims.size(), 0);
    std::partial_sum(dims.begin(), dims.end() - 1, offs.begin() + 1);
    offsets = register_buffer("offsets", torch::tensor(offs, torch::kLong));
    emb = register_module("emb", torch::nn::Embedding(offs.back() + dims.back(), emb_dim));
    torch::nn::init::xavier_uniform_(emb->weight);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // FACT: x = torch.randint(0, 2, (5, 9)); assert is_contiguous(x + torch.arange(9))
    auto flat = (x + offsets).view({-1});  // LOOKALIKE: tensor-view-non-contiguous -- the sum is a fresh contiguous tensor
    return emb(flat).view({x.size(0), x.size(1), -1}).sum(1);
  }
};
TORCH_MODULE(MultiEmbedding);

struct GINConvImpl : torch::nn::Module {
  torch::nn::Sequential mlp{nullptr};
  MultiEmbedding bond{nullptr};
  torch::Tensor eps;
  double drop_edge;

  GINConvImpl(int64_t dim, double drop_edge_p) : drop_edge(drop_edge_p) {
    mlp = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(dim, 2 * dim), torch::nn::BatchNorm1d(2 * dim),
                                                       torch::nn::ReLU(), torch::nn::Linear(2 * dim, dim)));
    bond = register_module("bond", MultiEmbedding(kBondFeatureDims, dim));
    eps = register_parameter("eps", torch::zeros({1}));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& edge_index, const torch::Tensor& edge_attr) {
    auto src = edge_index[0], dst = edge_index[1];
    // FACT: x = torch.rand(4, 3); j = x.index_select(0, torch.tensor([0, 2, 2])); j.add_(1.0); assert is_copy_of(j, x)
    auto msg = x.index_select(0, src);
    msg.add_(bond(edge_attr));  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into a new tensor, x is untouched
    msg.relu_();
    if (is_training() && drop_edge > 0.0) {
      auto keep = torch::empty({msg.size(0), 1}, msg.options()).bernoulli_(1.0 - drop_edge);
      msg.mul_(keep);  // EXPECT: tensor-inplace-on-saved
    }
    auto aggr = torch::zeros_like(x).index_add_(0, dst, msg);
    return mlp->forward((1 + eps) * x + aggr);
  }
};
TORCH_MODULE(GINConv);

torch::Tensor global_add_pool(const torch::Tensor& h, const torch::Tensor& batch, int64_t num_graphs) {
  return torch::zeros({num_graphs, h.size(1)}, h.options()).index_add_(0, batch, h);  // LOOKALIKE: tensor-device-mismatch -- allocated with h.options(), so on h's device
}

torch::Tensor global_mean_pool(const torch::Tensor& h, const torch::Tensor& batch, int64_t num_graphs) {
  auto sums = global_add_pool(h, batch, num_graphs);
  auto counts = torch::bincount(batch, {}, num_graphs).clamp_min(1).to(h.scalar_type());
  auto inv = counts.unsqueeze(1).expand_as(sums);
  // FACT: c = torch.rand(3, 1).expand(3, 4); assert raises(lambda: c.reciprocal_(), "more than one element")
  inv.reciprocal_();  // EXPECT: tensor-inplace-on-expanded
  return sums * inv;
}

struct GinVirtualNodeImpl : torch::nn::Module {
  GinConfig cfg;
  MultiEmbedding atom{nullptr};
  torch::nn::Embedding vn_emb{nullptr};
  std::vector<GINConv> convs;
  std::vector<torch::nn::BatchNorm1d> bns;
  std::vector<torch::nn::Sequential> vn_mlps;
  torch::nn::Linear head{nullptr};

  explicit GinVirtualNodeImpl(const GinConfig& c) : cfg(c) {
    const int64_t D = cfg.emb_dim;
    atom = register_module("atom", MultiEmbedding(kAtomFeatureDims, D));
    vn_emb = register_module("vn_emb", torch::nn::Embedding(1, D));
    torch::nn::init::constant_(vn_emb->weight, 0.0);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init::constant_ writes under NoGradGuard
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      convs.push_back(register_module("conv" + std::to_string(l), GINConv(D, cfg.drop_edge)));
      bns.push_back(register_module("bn" + std::to_string(l), torch::nn::BatchNorm1d(D)));
      if (l + 1 < cfg.num_layers)
        vn_mlps.push_back(register_module("vn_mlp" + std::to_string(l),
            torch::nn::Sequential(torch::nn::Linear(D, 2 * D), torch::nn::BatchNorm1d(2 * D), torch::nn::ReLU(),
                                  torch::nn::Linear(2 * D, D), torch::nn::BatchNorm1d(D), torch::nn::ReLU())));
    }
    const int64_t rep_dim = cfg.jk == "concat" ? D * (cfg.num_layers + 1) : D;
    head = register_module("head", torch::nn::Linear(rep_dim, cfg.num_tasks));
  }

  torch::Tensor forward(const MolBatch& b) {
    const int64_t G = b.num_graphs;
    const auto drop = F::DropoutFuncOptions().p(cfg.drop_ratio).training(is_training());
    auto vn = vn_emb(torch::zeros({G}, torch::kLong));  // EXPECT: tensor-device-mismatch
    std::vector<torch::Tensor> h_list{atom(b.x)};
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      h_list[l] = h_list[l] + vn.index_select(0, b.batch);
      auto h = bns[l](convs[l](h_list[l], b.edge_index, b.edge_attr));
      if (l + 1 < cfg.num_layers) h.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- batch norm saves its input and statistics, not its output
      h = F::dropout(h, drop);
      if (cfg.residual) h = h + h_list[l];
      h_list.push_back(h);
      if (l + 1 < cfg.num_layers) {
        auto vn_next = F::dropout(vn_mlps[l]->forward(global_add_pool(h_list[l], b.batch, G) + vn), drop);
        vn = cfg.residual ? vn + vn_next : vn_next;
      }
    }

    torch::Tensor node_rep;
    if (cfg.jk == "concat") {
      // FACT: s = torch.stack([torch.rand(5, 4) for _ in range(3)], 1); assert is_view_of(s.flatten(1), s)
      node_rep = torch::stack(h_list, 1).flatten(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- stack along dim 1 is contiguous, flatten is a view
    } else if (cfg.jk == "sum") {
      node_rep = h_list[0];
      // FACT: h = [torch.rand(5, 4) for _ in range(3)]; r = h[0]; r += h[1]; assert shares_storage(r, h[0])
      for (size_t l = 1; l < h_list.size(); ++l) node_rep += h_list[l];  // EXPECT: tensor-alias-then-mutate
    } else {
      node_rep = h_list.back();
    }
    return head(global_mean_pool(node_rep, b.batch, G));
  }
};
TORCH_MODULE(GinVirtualNode);

// Rank-based ROC-AUC per task over labelled molecules, averaged over tasks that have both classes.
double mean_roc_auc(const torch::Tensor& y_true, const torch::Tensor& y_score) {
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t t = 0; t < y_true.size(1); ++t) {
    auto y = y_true.select(1, t), s = y_score.select(1, t);
    auto labelled = y == y;
    y = y.masked_select(labelled);
    s = s.masked_select(labelled);
    const double n_pos = y.sum().item<double>(), n = static_cast<double>(y.numel());  // LOOKALIKE: tensor-sync-in-loop -- CPU tensors here, item() never waits on a device
    if (n_pos == 0.0 || n_pos == n) continue;
    auto ranks = torch::empty_like(s, torch::kDouble);
    ranks.index_put_({s.argsort()}, torch::arange(1, y.numel() + 1, torch::kDouble));
    total += (ranks.masked_select(y > 0.5).sum().item<double>() - n_pos * (n_pos + 1) / 2) / (n_pos * (n - n_pos));
    ++counted;
  }
  return counted ? total / counted : std::nan("");
}

torch::Tensor masked_bce(const torch::Tensor& logits, const torch::Tensor& y) {
  auto labelled = y == y;
  auto weight = labelled.to(logits.scalar_type());
  auto target = torch::where(labelled, y, torch::zeros_like(y));
  auto opts = F::BinaryCrossEntropyWithLogitsFuncOptions().weight(weight).reduction(torch::kSum);
  return F::binary_cross_entropy_with_logits(logits, target, opts) / weight.sum().clamp_min(1.0);
}

double train_epoch(GinVirtualNode& model, torch::optim::Optimizer& opt, const std::vector<MolGraph>& graphs,
                   std::vector<int64_t> idx, const GinConfig& cfg, torch::Device device, std::mt19937& rng) {
  model->train();
  std::shuffle(idx.begin(), idx.end(), rng);
  auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
  std::vector<torch::Tensor> probs_seen, labels_seen;
  for (size_t start = 0; start < idx.size(); start += cfg.batch_size) {
    std::vector<int64_t> chunk(idx.begin() + start, idx.begin() + std::min(idx.size(), start + cfg.batch_size));
    auto batch = collate(graphs, chunk, cfg.num_tasks).to(device);
    auto logits = model->forward(batch);
    auto loss = masked_bce(logits, batch.y);

    auto probs = logits.detach();
    probs.sigmoid_();  // EXPECT: tensor-inplace-on-detached
    probs_seen.push_back(probs);
    labels_seen.push_back(batch.y);

    opt.zero_grad();
    loss.backward();
    opt.step();
    epoch_loss += loss * batch.num_graphs;  // EXPECT: tensor-graph-kept-across-iterations
  }
  std::cout << "  train auc " << mean_roc_auc(torch::cat(labels_seen).cpu(), torch::cat(probs_seen).cpu()) << "\n";
  return epoch_loss.item<double>() / idx.size();
}

std::pair<double, double> evaluate(GinVirtualNode& model, const std::vector<MolGraph>& graphs,
                                   const std::vector<int64_t>& idx, const GinConfig& cfg, torch::Device device) {
  model->eval();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> preds, labels;
  double loss_sum = 0.0;
  for (size_t start = 0; start < idx.size(); start += cfg.batch_size) {
    std::vector<int64_t> chunk(idx.begin() + start, idx.begin() + std::min(idx.size(), start + cfg.batch_size));
    auto batch = collate(graphs, chunk, cfg.num_tasks).to(device);
    auto logits = model->forward(batch);
    preds.push_back(logits);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard no graph is recorded
    labels.push_back(batch.y);
    loss_sum += masked_bce(logits, batch.y).item<double>() * chunk.size();  // EXPECT: tensor-sync-in-loop
  }
  const double auc = mean_roc_auc(torch::cat(labels).cpu(), torch::cat(preds).sigmoid().cpu());
  return {loss_sum / idx.size(), auc};
}

std::vector<MolGraph> synthetic_molecules(int64_t count, int64_t num_tasks, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> atoms(5, 40);
  std::vector<MolGraph> out;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = atoms(rng);
    std::vector<torch::Tensor> cols, bond_cols;
    for (auto d : kAtomFeatureDims) cols.push_back(torch::randint(0, d, {n}, torch::kLong));
    auto a = torch::arange(n - 1), b = a + 1;
    auto edge_index = torch::stack({torch::cat({a, b}), torch::cat({b, a})});
    for (auto d : kBondFeatureDims) bond_cols.push_back(torch::randint(0, d, {2 * (n - 1)}, torch::kLong));
    auto y = torch::randint(0, 2, {num_tasks}, torch::kDouble);
    y.masked_fill_(torch::rand({num_tasks}) < 0.2, std::nan(""));
    out.push_back({torch::stack(cols, 1), edge_index, torch::stack(bond_cols, 1), y});
  }
  return out;
}

int main() {
  GinConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  std::mt19937 rng(0);
  auto graphs = synthetic_molecules(8000, cfg.num_tasks, rng);
  std::vector<int64_t> order(graphs.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> train_idx(order.begin(), order.begin() + 6400), val_idx(order.begin() + 6400, order.end());

  GinVirtualNode model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  double best_auc = 0.0;
  std::vector<torch::Tensor> best_state;
  for (int64_t epoch = 1; epoch <= cfg.epochs; ++epoch) {
    const double train_loss = train_epoch(model, opt, graphs, train_idx, cfg, device, rng);
    const auto val = evaluate(model, graphs, val_idx, cfg, device);
    std::cout << "epoch " << epoch << " loss " << train_loss << " val loss " << val.first << " val auc " << val.second << "\n";
    if (val.second > best_auc) {
      best_auc = val.second;
      best_state.clear();
      for (const auto& p : model->parameters())
        best_state.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone -- the snapshot has to survive later optimizer steps
    }
  }
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size() && i < best_state.size(); ++i) params[i].copy_(best_state[i]);
  torch::save(model, "gin_vn_best.pt");
}
