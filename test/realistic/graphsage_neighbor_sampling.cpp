// GraphSAGE (Hamilton et al. 2017) node classification on a citation graph: uniform neighbour
// sampling with a fixed fanout per layer, mean aggregators, minibatches of seed nodes, and
// layer-wise full-neighbourhood inference for evaluation. Inputs are bag-of-words counts
// (log-scaled, unit rows) next to a learnable embedding per node kept inside the unit ball.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace nn = torch::nn;

struct SageConfig {
  std::vector<int64_t> fanouts = {15, 10, 5}; // first layer first
  int64_t hidden = 256, n_classes = 40, emb_dim = 64, batch_size = 1024, epochs = 30;
  int64_t eval_every = 2, log_every = 50, plateau_window = 4;
  double lr = 3e-3, dropout = 0.5, max_emb_norm = 1.0;
  bool log_counts = true;
};

struct CsrGraph {
  torch::Tensor rowptr, col; // int64 [N + 1], [E]: the in-neighbours of v are col[rowptr[v] : rowptr[v + 1]]
  torch::Tensor x, y;        // [N, F] word counts (float), [N] int64 labels
  torch::Tensor train_idx, val_idx, test_idx;
  int64_t num_nodes() const { return rowptr.size(0) - 1; }
};

// CSR from an edge list of messages src -> dst, grouped by destination.
void build_csr(CsrGraph &g, const torch::Tensor &src, const torch::Tensor &dst, int64_t n) {
  auto order = torch::argsort(dst);
  g.col = src.index_select(0, order);
  auto deg = torch::bincount(dst, {}, n);
  g.rowptr = torch::zeros({n + 1}, torch::kLong);
  // FACT: deg = torch.tensor([2, 0, 3]); r = torch.zeros(4, dtype=torch.long); r[1:].copy_(deg.cumsum(0)); assert r.tolist() == [0, 2, 2, 5]
  g.rowptr.slice(0, 1).copy_(deg.cumsum(0)); // LOOKALIKE: tensor-inplace-overlap, tensor-copy-narrowing -- the source is cumsum's own int64 tensor, not a slice of rowptr
}

// Model inputs from the raw counts: log(1 + count), then unit L2 rows.
torch::Tensor prepare_features(const CsrGraph &g, const SageConfig &cfg) {
  auto x = g.x.to(torch::kFloat);
  // FACT: c = torch.randint(0, 5, (4, 6)).float(); c0 = c.clone(); x = c.to(torch.float); x.log1p_(); assert shares_storage(x, c) and not torch.equal(c, c0)
  if (cfg.log_counts)
    x.log1p_(); // EXPECT: tensor-alias-then-mutate -- the counts are float already: to() returned g.x itself, and the next call takes the log of the logs
  x.div_(x.norm(2, 1, true).clamp_min(1e-12)); // EXPECT: tensor-alias-then-mutate -- the normalisation lands in g.x too
  return x;
}

struct Block {
  torch::Tensor dst_pos, nbr_pos; // rows of this layer's input for its outputs [n_dst] and their samples [n_dst, k]
};
struct Subgraph {
  torch::Tensor input_nodes; // global ids of the first layer's input rows
  std::vector<Block> blocks; // blocks[0] feeds the first layer
};

class NeighborSampler {
 public:
  NeighborSampler(const CsrGraph &g, std::vector<int64_t> fanouts) : rowptr_(g.rowptr), col_(g.col), fanouts_(std::move(fanouts)) {}

  Subgraph sample(const torch::Tensor &seeds) const {
    std::vector<Block> blocks;
    auto nodes = seeds;
    for (auto it = fanouts_.rbegin(); it != fanouts_.rend(); ++it) { // outwards from the seeds: the last layer first
      const int64_t k = *it, n = nodes.size(0);
      auto start = rowptr_.index_select(0, nodes);
      auto deg = rowptr_.index_select(0, nodes + 1) - start;
      auto offs = (torch::rand({n, k}) * deg.unsqueeze(1)).to(torch::kLong); // uniform, with replacement
      auto picked = col_.take((start.unsqueeze(1) + offs).clamp_max(col_.size(0) - 1));
      auto nbrs = torch::where(deg.unsqueeze(1) > 0, picked, nodes.unsqueeze(1)); // isolated nodes average themselves
      // FACT: a = torch.randint(0, 9, (4, 3)); w = torch.where(torch.rand(4, 1) > 0.5, a, torch.arange(4).unsqueeze(1)); assert is_view_of(w.flatten(), w)
      auto [uniq, inv] = torch::_unique(torch::cat({nodes, nbrs.flatten()}), /*sorted=*/true, /*return_inverse=*/true); // LOOKALIKE: tensor-reshape-non-contiguous -- where's result is a fresh contiguous tensor: flatten is a view
      // FACT: i = torch.arange(4 + 4 * 3); assert is_view_of(i.narrow(0, 4, 12).view(4, 3), i)
      blocks.push_back({inv.narrow(0, 0, n), inv.narrow(0, n, n * k).view({n, k})}); // LOOKALIKE: tensor-view-non-contiguous -- a slice of a 1-D tensor is contiguous
      nodes = uniq;
    }
    std::reverse(blocks.begin(), blocks.end());
    return {nodes, blocks};
  }

 private:
  torch::Tensor rowptr_, col_;
  std::vector<int64_t> fanouts_;
};

struct SageConvImpl : nn::Module {
  SageConvImpl(int64_t in, int64_t out) {
    lin_self_ = register_module("lin_self", nn::Linear(in, out));
    lin_nbr_ = register_module("lin_nbr", nn::Linear(nn::LinearOptions(in, out).bias(false)));
  }
  // h: rows of the block's input nodes -> [n_dst, out]
  torch::Tensor forward(const torch::Tensor &h, const Block &b) {
    const auto n = b.nbr_pos.size(0), k = b.nbr_pos.size(1);
    // FACT: s = torch.randn(10, 6).index_select(0, torch.randint(0, 10, (12,))); assert is_view_of(s.view(4, 3, -1), s)
    auto nbr = h.index_select(0, b.nbr_pos.flatten()).view({n, k, -1}); // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a new contiguous tensor
    return lin_self_(h.index_select(0, b.dst_pos)) + lin_nbr_(nbr.mean(1));
  }
  nn::Linear lin_self_{nullptr}, lin_nbr_{nullptr};
};
TORCH_MODULE(SageConv);

struct GraphSageImpl : nn::Module {
  GraphSageImpl(int64_t n_nodes, int64_t in_feats, const SageConfig &cfg) : dropout_(cfg.dropout) {
    emb_ = register_module("emb", nn::Embedding(n_nodes, cfg.emb_dim));
    // FACT: e = torch.nn.Embedding(10, 4); torch.nn.init.normal_(e.weight, 0, 0.1); assert e.weight.is_leaf and e.weight.requires_grad
    nn::init::normal_(emb_->weight, 0.0, 0.1); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    int64_t in = in_feats + cfg.emb_dim;
    for (size_t l = 0; l < cfg.fanouts.size(); ++l) {
      const int64_t out = l + 1 == cfg.fanouts.size() ? cfg.n_classes : cfg.hidden;
      layers_.push_back(register_module("sage" + std::to_string(l), SageConv(in, out)));
      in = out;
    }
  }

  torch::Tensor forward(const torch::Tensor &feats, const torch::Tensor &nodes, const std::vector<Block> &blocks) {
    auto h = torch::cat({feats, emb_(nodes)}, 1);
    for (size_t l = 0; l < layers_.size(); ++l) {
      h = layers_[l]->forward(h, blocks[l]);
      if (l + 1 < layers_.size())
        h = torch::dropout(torch::relu(h), dropout_, is_training());
    }
    return h;
  }

  // Every node's logits from its full neighbourhood, one layer at a time over the whole graph.
  torch::Tensor inference(const CsrGraph &g, const torch::Tensor &feats) {
    torch::NoGradGuard no_grad;
    const auto N = g.num_nodes();
    auto rowptr = g.rowptr.to(feats.device()), col = g.col.to(feats.device());
    auto deg = rowptr.slice(0, 1) - rowptr.slice(0, 0, -1);
    auto dst = torch::repeat_interleave(torch::arange(N, rowptr.options()), deg);
    auto has_nbrs = (deg > 0).unsqueeze(1);
    auto inv_deg = deg.clamp_min(1).to(feats.scalar_type()).reciprocal().unsqueeze(1);
    auto h = torch::cat({feats, emb_->weight}, 1);
    for (size_t l = 0; l < layers_.size(); ++l) {
      auto sum = torch::zeros({N, h.size(1)}, h.options()).index_add_(0, dst, h.index_select(0, col));
      auto agg = torch::where(has_nbrs, sum * inv_deg, h); // LOOKALIKE: tensor-device-mismatch -- degrees and mask come from the moved rowptr, on the features' device
      h = layers_[l]->lin_self_(h) + layers_[l]->lin_nbr_(agg);
      if (l + 1 < layers_.size())
        h.relu_(); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard, and an add saves nothing
    }
    return h;
  }

  double dropout_;
  nn::Embedding emb_{nullptr};
  std::vector<SageConv> layers_;
};
TORCH_MODULE(GraphSage);

// Validation losses of the last evaluations; a plateau when the newest is no better than any of them.
class PlateauWatch {
 public:
  explicit PlateauWatch(int64_t window)
      : hist_(torch::full({window + 1}, std::numeric_limits<double>::infinity(), torch::kDouble)) {}
  bool update(double val_loss) {
    const auto K = hist_.size(0);
    // FACT: h = torch.arange(5.0); assert raises(lambda: h[:-1].copy_(h[1:]), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    hist_.slice(0, 0, K - 1).copy_(hist_.slice(0, 1)); // EXPECT: tensor-inplace-overlap -- both slices are views of one buffer, one element apart: PyTorch refuses the shift
    hist_[K - 1] = val_loss;
    return val_loss >= hist_.slice(0, 0, K - 1).min().item<double>();
  }

 private:
  torch::Tensor hist_;
};

void train(GraphSage &model, const CsrGraph &g, const SageConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  auto feats = prepare_features(g, cfg);
  auto x_dev = feats.to(device); // the whole feature matrix stays on the GPU
  auto val_idx = g.val_idx.to(device), y_val = g.y.index_select(0, g.val_idx).to(device);
  NeighborSampler sampler(g, cfg.fanouts);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  PlateauWatch plateau(cfg.plateau_window);
  const auto n_train = g.train_idx.size(0);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double loss_sum = 0;
    auto order = g.train_idx.index_select(0, torch::randperm(n_train));
    for (int64_t s = 0; s < n_train; s += cfg.batch_size) {
      auto seeds = order.narrow(0, s, std::min(cfg.batch_size, n_train - s));
      auto sub = sampler.sample(seeds);
      auto nodes = sub.input_nodes.to(device);
      std::vector<Block> blocks;
      for (const auto &b : sub.blocks)
        blocks.push_back({b.dst_pos.to(device), b.nbr_pos.to(device)}); // LOOKALIKE: tensor-clone-in-loop -- this batch's blocks, each copy kept
      auto logits = model->forward(x_dev.index_select(0, nodes), nodes, blocks);
      auto loss = nn::functional::cross_entropy(logits, g.y.index_select(0, seeds).to(device));
      opt.zero_grad();
      loss.backward();
      opt.step();
      // FACT: e = torch.nn.Embedding(10, 4); assert raises(lambda: e.weight.renorm_(2, 0, 1.0), "a leaf Variable that requires grad")
      model->emb_->weight.renorm_(2, 0, cfg.max_emb_norm); // EXPECT: tensor-inplace-on-leaf -- the embedding table requires grad and grad mode is on: PyTorch refuses
      loss_sum += loss.item<double>() * static_cast<double>(seeds.size(0)); // EXPECT: tensor-sync-in-loop -- waits for the GPU at every minibatch only to add the loss up
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    std::cout << "epoch " << epoch << " train loss " << loss_sum / static_cast<double>(n_train) << "\n";

    if ((epoch + 1) % cfg.eval_every == 0) {
      model->eval();
      auto val_logits = model->inference(g, feats.to(device)).index_select(0, val_idx); // EXPECT: tensor-clone-in-loop -- the features are on the GPU already (x_dev): the whole matrix crosses again at every evaluation
      const double val_loss = nn::functional::cross_entropy(val_logits, y_val).item<double>(); // LOOKALIKE: tensor-sync-in-loop -- once per evaluation, and the value steers the learning rate
      const double val_acc = val_logits.argmax(1).eq(y_val).to(torch::kFloat).mean().item<double>(); // LOOKALIKE: tensor-device-mismatch, tensor-sync-in-loop -- the labels were moved with the indices before the loop; one read per evaluation, not per step
      std::cout << "epoch " << epoch << " val loss " << val_loss << " acc " << val_acc << "\n";
      if (plateau.update(val_loss)) {
        for (auto &group : opt.param_groups()) {
          auto &o = static_cast<torch::optim::AdamOptions &>(group.options());
          o.lr(o.lr() * 0.5);
        }
      }
    }
  }
}

double test_accuracy(GraphSage &model, const CsrGraph &g, const SageConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  auto logits = model->inference(g, prepare_features(g, cfg).to(device));
  auto pred = logits.argmax(1).index_select(0, g.test_idx.to(device));
  return pred.eq(g.y.index_select(0, g.test_idx)).to(torch::kFloat).mean().item<double>(); // EXPECT: tensor-device-mismatch -- the predictions are on the GPU, the labels stay on the host
}
