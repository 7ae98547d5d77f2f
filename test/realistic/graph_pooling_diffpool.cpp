// Hierarchical graph classification with DiffPool (Ying et al., NeurIPS 2018).
//
// Graphs are collated into dense, zero-padded batches: node features [B, N, F], adjacency
// [B, N, N] and a node mask [B, N]. Each pooling level runs two GNN stacks on the same graph,
// one producing embeddings Z and one producing soft assignments S = softmax(GNN_pool(X, A)),
// and coarsens the graph to X' = S^T Z, A' = S^T A S. Two auxiliary losses keep the
// assignment sensible: link prediction ||A - S S^T||_F and the per-node assignment entropy.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct DiffPoolConfig {
  int64_t in_features = 16;
  int64_t hidden = 64;
  int64_t num_classes = 2;
  std::vector<int64_t> clusters = {24, 6};
  double link_weight = 1.0;
  double entropy_weight = 0.1;
  double lr = 1e-3;
  int epochs = 40;
  int log_every = 25;
};

struct GraphBatch {
  torch::Tensor x;     // [B, N, F] node features, zero rows for padding
  torch::Tensor adj;   // [B, N, N] dense adjacency, symmetric, 0/1
  torch::Tensor mask;  // [B, N] 1 for real nodes
  torch::Tensor y;     // [B] graph labels (int64)
};

// Adds the identity to every adjacency matrix of the batch.
void add_self_loops(torch::Tensor adj) {
  auto eye = torch::eye(adj.size(-1), adj.options());
  adj.add_(eye);
}

// Symmetric normalisation D^-1/2 (A + I) D^-1/2 used by every GCN layer of the network.
torch::Tensor normalise_adjacency(const torch::Tensor& adj_in) {
  torch::Tensor adj = adj_in;
  // FACT: a = torch.zeros(2, 3, 3); b = a; b.add_(torch.eye(3)); assert shares_storage(a, b) and a.sum() == 6
  add_self_loops(adj);  // EXPECT: tensor-alias-then-mutate
  auto deg = adj.sum(-1).clamp_min(1.0).pow(-0.5);
  return deg.unsqueeze(-1) * adj * deg.unsqueeze(-2);
}

// Dense GCN layer: H = Linear(A X / deg), with padded nodes zeroed afterwards.
struct DenseGCNImpl : nn::Module {
  DenseGCNImpl(int64_t in, int64_t out) : lin(register_module("lin", nn::Linear(in, out))) {
    nn::init::xavier_uniform_(lin->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& adj, const torch::Tensor& mask) {
    auto agg = torch::matmul(adj, x);
    auto deg = adj.sum(-1, /*keepdim=*/true).clamp_min(1.0);
    agg.div_(deg);  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
    auto h = lin(agg);
    return h * mask.unsqueeze(-1);
  }

  nn::Linear lin;
};
TORCH_MODULE(DenseGCN);

struct PoolOutput {
  torch::Tensor x;        // [B, C, H]
  torch::Tensor adj;      // [B, C, C]
  torch::Tensor assign;   // [B, N, C]
  torch::Tensor link_loss;
  torch::Tensor entropy_loss;
};

struct DiffPoolLayerImpl : nn::Module {
  DiffPoolLayerImpl(int64_t in, int64_t hidden, int64_t clusters)
      : embed1(register_module("embed1", DenseGCN(in, hidden))),
        embed2(register_module("embed2", DenseGCN(hidden, hidden))),
        assign1(register_module("assign1", DenseGCN(in, hidden))),
        assign2(register_module("assign2", DenseGCN(hidden, clusters))) {}

  PoolOutput forward(const torch::Tensor& x, const torch::Tensor& adj, const torch::Tensor& mask) {
    auto z = embed2(torch::relu(embed1(x, adj, mask)), adj, mask);
    auto logits = assign2(torch::relu(assign1(x, adj, mask)), adj, mask);
    auto probs = torch::softmax(logits, -1);
    probs.clamp_min_(1e-12);  // EXPECT: tensor-inplace-on-saved
    auto s = probs * mask.unsqueeze(-1);
    auto st = s.transpose(1, 2);

    PoolOutput out;
    out.x = torch::matmul(st, z);
    out.adj = torch::matmul(torch::matmul(st, adj), s);
    out.assign = s;
    auto residual = adj - torch::matmul(s, st);
    out.link_loss = residual.pow(2).sum().sqrt() / static_cast<double>(adj.numel());
    auto entropy = -(probs * torch::log(probs)).sum(-1);
    out.entropy_loss = (entropy * mask).sum() / mask.sum().clamp_min(1.0);
    return out;
  }

  DenseGCN embed1, embed2, assign1, assign2;
};
TORCH_MODULE(DiffPoolLayer);

struct ReadoutHeadImpl : nn::Module {
  ReadoutHeadImpl(int64_t in, int64_t hidden, int64_t classes)
      : fc1(register_module("fc1", nn::Linear(in, hidden))),
        fc2(register_module("fc2", nn::Linear(hidden, classes))) {
    fc2->bias.fill_(0.0);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(F::dropout(torch::relu(fc1(x)), F::DropoutFuncOptions().p(0.3).training(is_training())));
  }

  nn::Linear fc1, fc2;
};
TORCH_MODULE(ReadoutHead);

struct DiffPoolOutput {
  torch::Tensor logits;
  std::vector<PoolOutput> levels;
};

struct DiffPoolNetImpl : nn::Module {
  explicit DiffPoolNetImpl(const DiffPoolConfig& cfg) {
    int64_t in = cfg.in_features;
    for (size_t i = 0; i < cfg.clusters.size(); ++i) {
      pools.push_back(register_module("pool" + std::to_string(i), DiffPoolLayer(in, cfg.hidden, cfg.clusters[i])));
      in = cfg.hidden;
    }
    head = register_module("head", ReadoutHead(cfg.clusters.back() * cfg.hidden, cfg.hidden, cfg.num_classes));
  }

  DiffPoolOutput forward(const GraphBatch& g) {
    torch::Tensor h = g.x;
    h = h * g.mask.unsqueeze(-1);
    // FACT: x = torch.randn(2, 5, 3); h = x; h = h * torch.ones(2, 5, 1); assert is_copy_of(h, x)
    h.nan_to_num_(0.0);  // LOOKALIKE: tensor-alias-then-mutate -- h was rebound to a fresh product first
    auto adj = normalise_adjacency(g.adj);
    auto mask = g.mask;

    DiffPoolOutput out;
    for (auto& pool : pools) {
      auto level = pool->forward(h, adj, mask);
      h = level.x;
      adj = level.adj;
      mask = torch::ones({h.size(0), h.size(1)}, h.options());
      out.levels.push_back(level);
    }
    // FACT: s = torch.rand(2, 5, 3); z = torch.randn(2, 5, 4); assert is_contiguous(torch.matmul(s.transpose(1, 2), z))
    auto flat = h.flatten(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- S^T Z comes out of matmul contiguous
    out.logits = head(flat);
    return out;
  }

  std::vector<DiffPoolLayer> pools;
  ReadoutHead head{nullptr};
};
TORCH_MODULE(DiffPoolNet);

// Share of real nodes each cluster receives, one row per (graph, cluster).
torch::Tensor cluster_usage(const torch::Tensor& s, const torch::Tensor& mask) {
  const int64_t n = s.size(1);
  const int64_t c = s.size(2);
  // FACT: s = torch.rand(2, 5, 3); assert raises(lambda: s.transpose(1, 2).view(-1, 5), "view size is not compatible")
  auto rows = s.transpose(1, 2).view({-1, n});  // EXPECT: tensor-view-non-contiguous
  auto m = mask.repeat_interleave(c, 0);
  return (rows * m).sum(-1) / m.sum(-1).clamp_min(1.0);
}

void standardise_features(std::vector<GraphBatch>& data) {
  std::vector<torch::Tensor> rows;
  for (auto& g : data) {
    // FACT: x = torch.randn(4, 6, 3); assert is_view_of(x.view(-1, 3), x)
    auto flat = g.x.view({-1, g.x.size(-1)});  // LOOKALIKE: tensor-view-non-contiguous -- collated node features are contiguous
    auto real = g.mask.reshape({-1}).to(torch::kBool);
    rows.push_back(flat.index({real}));
  }
  auto all = torch::cat(rows, 0);
  auto mean = all.mean(0);
  auto stdev = all.std(0).clamp_min(1e-6);
  for (auto& g : data) g.x = (g.x - mean) / stdev * g.mask.unsqueeze(-1);
}

GraphBatch to_device(const GraphBatch& b, torch::Device device) {
  return {b.x.to(device), b.adj.to(device), b.mask.to(device), b.y.to(device)};
}

double train_epoch(DiffPoolNet& model, torch::optim::Optimizer& opt, const std::vector<GraphBatch>& batches,
                   const DiffPoolConfig& cfg, const torch::Tensor& class_weights, torch::Device device) {
  model->train();
  torch::Tensor running = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (const auto& b : batches) {
    auto x = b.x.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
    GraphBatch g{x, b.adj.to(device), b.mask.to(device), b.y.to(device)};
    auto out = model->forward(g);
    auto ce = F::cross_entropy(out.logits, g.y, F::CrossEntropyFuncOptions().weight(class_weights.to(device)));  // EXPECT: tensor-clone-in-loop

    std::vector<torch::Tensor> reg_terms;
    for (const auto& level : out.levels) {
      reg_terms.push_back(cfg.link_weight * level.link_loss + cfg.entropy_weight * level.entropy_loss);  // LOOKALIKE: tensor-graph-kept-across-iterations -- summed into this step's loss and differentiated
    }
    auto loss = ce + torch::stack(reg_terms).sum();

    opt.zero_grad();
    loss.backward();
    opt.step();

    running += loss;  // EXPECT: tensor-graph-kept-across-iterations
    if (++step % cfg.log_every == 0) {
      std::cout << "  step " << step << " loss " << loss.item<double>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
  }
  return running.item<double>() / static_cast<double>(std::max<int64_t>(step, 1));
}

struct EvalResult {
  double accuracy = 0.0;
  torch::Tensor usage;  // [sum over batches of B * C1]
};

EvalResult evaluate(DiffPoolNet& model, const std::vector<GraphBatch>& batches, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t total = 0;
  std::vector<torch::Tensor> usages;
  for (const auto& b : batches) {
    auto g = to_device(b, device);
    auto out = model->forward(g);
    correct += out.logits.argmax(-1).eq(g.y).sum();
    total += g.y.size(0);
    usages.push_back(cluster_usage(out.levels.front().assign, g.mask).cpu());  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, no graph is recorded
  }
  EvalResult r;
  r.accuracy = total > 0 ? static_cast<double>(correct.item<int64_t>()) / static_cast<double>(total) : 0.0;
  r.usage = torch::cat(usages);
  return r;
}

// Two classes of random graphs: sparse (label 0) and dense (label 1), variable sizes.
std::vector<GraphBatch> make_dataset(const DiffPoolConfig& cfg, int64_t num_batches, int64_t batch_size,
                                     int64_t max_nodes) {
  std::vector<GraphBatch> data;
  for (int64_t i = 0; i < num_batches; ++i) {
    auto y = torch::randint(0, cfg.num_classes, {batch_size}, torch::kLong);
    auto p = 0.1 + 0.25 * y.to(torch::kFloat);
    auto sizes = torch::randint(max_nodes / 2, max_nodes + 1, {batch_size}, torch::kLong);
    auto mask = (torch::arange(max_nodes).unsqueeze(0) < sizes.unsqueeze(1)).to(torch::kFloat);
    auto upper = torch::triu((torch::rand({batch_size, max_nodes, max_nodes}) < p.view({-1, 1, 1})).to(torch::kFloat), 1);
    auto adj = (upper + upper.transpose(1, 2)) * mask.unsqueeze(1) * mask.unsqueeze(2);
    auto x = torch::randn({batch_size, max_nodes, cfg.in_features}) * mask.unsqueeze(-1);
    data.push_back({x, adj, mask, y});
  }
  return data;
}

int main() {
  torch::manual_seed(0);
  DiffPoolConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto train_set = make_dataset(cfg, 32, 16, 48);
  auto val_set = make_dataset(cfg, 8, 16, 48);
  standardise_features(train_set);
  standardise_features(val_set);

  std::vector<torch::Tensor> labels;
  for (const auto& b : train_set) labels.push_back(b.y);
  auto counts = torch::bincount(torch::cat(labels), {}, cfg.num_classes).to(torch::kFloat);
  auto class_weights = counts.sum() / (counts.clamp_min(1.0) * static_cast<double>(cfg.num_classes));

  DiffPoolNet model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(1e-5));

  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    const double loss = train_epoch(model, opt, train_set, cfg, class_weights, device);
    auto res = evaluate(model, val_set, device);
    std::cout << "epoch " << epoch << " train loss " << loss << " val acc " << res.accuracy
              << " max cluster share " << res.usage.max().item<double>() << "\n";
  }
  return 0;
}
