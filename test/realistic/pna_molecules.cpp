// Principal Neighbourhood Aggregation (Corso et al., 2020): multi-task regression on molecule batches.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace pna {

constexpr int64_t kNumAggregators = 4;  // mean, max, min, std
constexpr int64_t kNumScalers = 3;      // identity, amplification, attenuation

struct PNAConfig {
  int64_t num_atom_types = 28, num_bond_types = 4, num_tasks = 12;
  int64_t hidden = 75, towers = 5, layers = 4;
  int64_t epochs = 200, batch_size = 128;
  double dropout = 0.1, lr = 1e-3;
  double avg_deg_log = 1.0;  // mean log(d + 1) over training nodes
};

struct Molecule {
  std::vector<int64_t> atoms, bonds, bond_types;  // bonds: flattened (src, dst) pairs, both directions
  std::vector<double> targets;
};

struct MoleculeBatch {
  torch::Tensor x, edge_index, edge_attr, batch, y;
  int64_t num_graphs = 0;

  MoleculeBatch to(torch::Device d) const {
    return {x.to(d), edge_index.to(d), edge_attr.to(d), batch.to(d), y.to(d, torch::kFloat), num_graphs};
  }
};

std::vector<Molecule> load_molecules(const std::string& path, int64_t num_tasks) {
  std::ifstream in(path);
  std::vector<Molecule> out;
  int64_t n_atoms = 0, n_bonds = 0;
  while (in >> n_atoms >> n_bonds) {
    Molecule m;
    m.atoms.resize(n_atoms);
    for (auto& a : m.atoms) in >> a;
    for (int64_t k = 0; k < n_bonds; ++k) {
      int64_t i = 0, j = 0, type = 0;
      if (!(in >> i >> j >> type)) break;
      m.bonds.insert(m.bonds.end(), {i, j, j, i});
      m.bond_types.insert(m.bond_types.end(), {type, type});
    }
    m.targets.resize(num_tasks);
    for (auto& v : m.targets) in >> v;
    out.push_back(std::move(m));
  }
  return out;
}

MoleculeBatch collate(const std::vector<Molecule>& mols, size_t begin, size_t end) {
  std::vector<int64_t> atoms, src, dst, types, graph;
  std::vector<double> targets;
  int64_t offset = 0;
  for (size_t g = begin; g < end; ++g) {
    const auto& m = mols[g];
    atoms.insert(atoms.end(), m.atoms.begin(), m.atoms.end());
    for (size_t k = 0; k + 1 < m.bonds.size(); k += 2) {
      src.push_back(m.bonds[k] + offset);
      dst.push_back(m.bonds[k + 1] + offset);
    }
    types.insert(types.end(), m.bond_types.begin(), m.bond_types.end());
    graph.insert(graph.end(), m.atoms.size(), static_cast<int64_t>(g - begin));
    targets.insert(targets.end(), m.targets.begin(), m.targets.end());
    offset += static_cast<int64_t>(m.atoms.size());
  }
  MoleculeBatch b;
  b.num_graphs = static_cast<int64_t>(end - begin);
  const int64_t num_tasks = static_cast<int64_t>(targets.size()) / b.num_graphs;
  b.x = torch::tensor(atoms);
  b.edge_index = torch::stack({torch::tensor(src), torch::tensor(dst)});
  b.edge_attr = torch::tensor(types);
  b.batch = torch::tensor(graph);
  b.y = torch::from_blob(targets.data(), {b.num_graphs, num_tasks}, torch::kFloat64).clone();  // LOOKALIKE: tensor-unnecessary-clone -- from_blob only borrows the vector, which dies at return
  return b;
}

std::vector<MoleculeBatch> make_batches(const std::vector<Molecule>& mols, size_t batch_size) {
  std::vector<MoleculeBatch> out;
  for (size_t i = 0; i < mols.size(); i += batch_size)
    out.push_back(collate(mols, i, std::min(mols.size(), i + batch_size)));
  return out;
}

double average_log_degree(const std::vector<MoleculeBatch>& train) {
  auto total = torch::zeros({}, torch::kDouble);
  int64_t nodes = 0;
  for (const auto& b : train) {
    auto deg = torch::bincount(b.edge_index[1], {}, b.x.size(0)).to(torch::kDouble);
    total += torch::log(deg + 1).sum();
    nodes += b.x.size(0);
  }
  return total.item<double>() / std::max<int64_t>(nodes, 1);
}

torch::Tensor scatter_sum(const torch::Tensor& src, const torch::Tensor& index, int64_t n) {
  return torch::zeros({n, src.size(1)}, src.options()).index_add_(0, index, src);
}

torch::Tensor aggregate(const torch::Tensor& msg, const torch::Tensor& dst, int64_t n, const torch::Tensor& deg) {
  auto denom = deg.clamp_min(1).unsqueeze(-1);
  auto mean = scatter_sum(msg, dst, n) / denom;
  auto mean_sq = scatter_sum(msg * msg, dst, n) / denom;
  auto sd = torch::sqrt(torch::relu(mean_sq - mean * mean) + 1e-5);
  auto index = dst.unsqueeze(-1).expand_as(msg);
  auto init = torch::zeros({n, msg.size(1)}, msg.options());
  // FACT: i=torch.tensor([0,1,1]).unsqueeze(-1).expand(3,4); o=torch.zeros(2,4).scatter_reduce(0,i,torch.randn(3,4),"amax",include_self=False); assert i.stride(1)==0 and o.shape==(2,4)
  auto mx = init.scatter_reduce(0, index, msg, "amax", /*include_self=*/false);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded index is only read and scatter_reduce is out-of-place
  auto mn = init.scatter_reduce(0, index, msg, "amin", /*include_self=*/false);
  return torch::cat({mean, mx, mn, sd}, -1);
}

torch::Tensor scale(const torch::Tensor& agg, const torch::Tensor& deg, const torch::Tensor& avg_log) {
  auto log_deg = torch::log(deg.clamp_min(1) + 1).unsqueeze(-1);
  auto scalers = torch::stack({torch::ones_like(log_deg), log_deg / avg_log, avg_log / log_deg}, 1);  // LOOKALIKE: tensor-device-mismatch -- avg_log is a 0-dim CPU tensor, which CUDA ops accept
  // FACT: p=torch.randn(6,8).unsqueeze(1)*torch.stack([torch.rand(6,1)]*3,1); r=p.reshape(6,-1); assert is_contiguous(p) and is_view_of(r,p)
  return (agg.unsqueeze(1) * scalers).reshape({agg.size(0), -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- the broadcast product is freshly allocated and contiguous
}

torch::Tensor graph_size_norm(const torch::Tensor& batch, int64_t num_graphs) {
  auto sizes = torch::bincount(batch, {}, num_graphs).to(torch::kFloat);
  return sizes.rsqrt().index_select(0, batch).unsqueeze(-1);
}

torch::Tensor mean_pool(const torch::Tensor& h, const torch::Tensor& batch, int64_t num_graphs) {
  auto counts = torch::bincount(batch, {}, num_graphs).clamp_min(1).to(h.scalar_type()).unsqueeze(-1);
  return torch::zeros({num_graphs, h.size(1)}).index_add_(0, batch, h) / counts;  // EXPECT: tensor-device-mismatch
}

struct PNALayerImpl : torch::nn::Module {
  explicit PNALayerImpl(const PNAConfig& cfg)
      : towers_(cfg.towers), hidden_(cfg.hidden), dropout_(cfg.dropout) {
    const int64_t tower_out = cfg.hidden / cfg.towers;
    edge_emb_ = register_module("edge_emb", torch::nn::Embedding(cfg.num_bond_types, hidden_));
    for (int64_t t = 0; t < towers_; ++t) {
      pre_.push_back(register_module("pre" + std::to_string(t), torch::nn::Linear(3 * hidden_, hidden_)));
      post_.push_back(register_module("post" + std::to_string(t),
                                      torch::nn::Linear((1 + kNumAggregators * kNumScalers) * hidden_, tower_out)));
    }
    mix_ = register_module("mix", torch::nn::Linear(towers_ * tower_out, hidden_));
    norm_ = register_module("norm", torch::nn::BatchNorm1d(hidden_));
    avg_log_ = torch::tensor(cfg.avg_deg_log, torch::kFloat);
    // FACT: w=torch.nn.Linear(4,4).weight; assert raises(lambda: w.mul_(0.5), "leaf Variable")
    mix_->weight.mul_(1.0 / std::sqrt(static_cast<double>(towers_)));  // EXPECT: tensor-inplace-on-leaf
  }

  void reset_parameters() {
    torch::NoGradGuard no_grad;
    for (auto& lin : post_) lin->bias.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& edge_index,
                        const torch::Tensor& edge_attr, const torch::Tensor& snorm) {
    const int64_t n = h.size(0);
    auto src = edge_index[0], dst = edge_index[1];
    auto deg = torch::bincount(dst, {}, n).to(h.scalar_type());
    auto z = torch::cat({h.index_select(0, dst), h.index_select(0, src), edge_emb_->forward(edge_attr)}, -1);

    std::vector<torch::Tensor> outs;
    for (int64_t t = 0; t < towers_; ++t) {
      auto agg = scale(aggregate(pre_[t]->forward(z), dst, n, deg), deg, avg_log_);
      outs.push_back(post_[t]->forward(torch::cat({h, agg}, -1)));  // LOOKALIKE: tensor-graph-kept-across-iterations -- tower outputs are consumed by the stack below in the same forward
    }
    auto stacked = torch::stack(outs);
    // FACT: s=torch.stack([torch.randn(6,3) for _ in range(5)]); r=s.transpose(0,1).reshape(6,-1); assert is_copy_of(r,s)
    auto out = mix_->forward(stacked.transpose(0, 1).reshape({n, -1}));  // EXPECT: tensor-reshape-non-contiguous
    auto act = torch::relu(norm_->forward(out));
    // FACT: x=torch.randn(4,3,requires_grad=True); a=torch.relu(x); a.mul_(torch.rand(4,1)); assert backward_fails(lambda: a.sum().backward())
    act.mul_(snorm);  // EXPECT: tensor-inplace-on-saved
    return h + torch::dropout(act, dropout_, is_training());
  }

  int64_t towers_, hidden_;
  double dropout_;
  torch::nn::Embedding edge_emb_{nullptr};
  std::vector<torch::nn::Linear> pre_, post_;
  torch::nn::Linear mix_{nullptr};
  torch::nn::BatchNorm1d norm_{nullptr};
  torch::Tensor avg_log_;
};
TORCH_MODULE(PNALayer);

struct PNANetImpl : torch::nn::Module {
  explicit PNANetImpl(const PNAConfig& cfg) {
    atom_emb_ = register_module("atom_emb", torch::nn::Embedding(cfg.num_atom_types, cfg.hidden));
    for (int64_t i = 0; i < cfg.layers; ++i) {
      layers_.push_back(register_module("conv" + std::to_string(i), PNALayer(cfg)));
      layers_.back()->reset_parameters();
    }
    head_ = register_module("head", torch::nn::Sequential(
        torch::nn::Linear(cfg.hidden, cfg.hidden), torch::nn::ReLU(),
        torch::nn::Linear(cfg.hidden, cfg.hidden / 2), torch::nn::ReLU(),
        torch::nn::Linear(cfg.hidden / 2, cfg.num_tasks)));
  }

  torch::Tensor forward(const MoleculeBatch& b) {
    auto h = atom_emb_->forward(b.x);
    auto h0 = h.clone();  // EXPECT: tensor-unnecessary-clone
    auto snorm = graph_size_norm(b.batch, b.num_graphs);
    for (auto& conv : layers_) h = conv->forward(h, b.edge_index, b.edge_attr, snorm);
    return head_->forward(mean_pool(h + h0, b.batch, b.num_graphs));
  }

  torch::nn::Embedding atom_emb_{nullptr};
  std::vector<PNALayer> layers_;
  torch::nn::Sequential head_{nullptr};
};
TORCH_MODULE(PNANet);

struct TargetScaler {
  torch::Tensor mean, stddev;

  void fit(const std::vector<MoleculeBatch>& train) {
    std::vector<torch::Tensor> ys;
    for (const auto& b : train) ys.push_back(b.y);
    auto all = torch::cat(ys).to(torch::kFloat);
    mean = all.mean(0);
    stddev = (all - mean).pow(2).mean(0).sqrt().clamp_min(1e-6);
  }

  void to(torch::Device d) { mean = mean.to(d); stddev = stddev.to(d); }

  torch::Tensor transform(const MoleculeBatch& b) const {
    auto y = b.y.view({b.num_graphs, -1});
    // FACT: y=torch.randn(4,3); v=y.view(4,-1); v.sub_(1.0); assert is_view_of(v,y)
    y.sub_(mean).div_(stddev);  // EXPECT: tensor-alias-then-mutate
    return y;
  }

  torch::Tensor inverse(const torch::Tensor& z) const { return z * stddev + mean; }
};

double evaluate(PNANet& model, const std::vector<MoleculeBatch>& split, const TargetScaler& scaler,
                torch::Device device, int64_t num_tasks) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t rows = 0;
  for (const auto& b : split) rows += b.num_graphs;
  auto preds = torch::empty({rows, num_tasks});
  auto truth = torch::empty({rows, num_tasks});
  int64_t off = 0;
  for (const auto& b : split) {
    auto pred = scaler.inverse(model->forward(b.to(device)));
    preds.narrow(0, off, b.num_graphs).copy_(pred);  // LOOKALIKE: tensor-copy-narrowing -- float into float; the copy_ from the device is allowed
    truth.narrow(0, off, b.num_graphs).copy_(b.y);  // EXPECT: tensor-copy-narrowing
    off += b.num_graphs;
  }
  return (preds - truth).abs().mean(0).mean().item<double>();
}

void train(PNANet& model, const std::vector<MoleculeBatch>& train_set,
           const std::vector<MoleculeBatch>& val_set, const PNAConfig& cfg, torch::Device device) {
  TargetScaler scaler;
  scaler.fit(train_set);
  scaler.to(device);
  auto task_weights = torch::ones({cfg.num_tasks});
  task_weights.narrow(0, 0, 3).fill_(2.0);  // dipole, polarisability, HOMO are the noisy ones
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(3e-6));
  double best_val = std::numeric_limits<double>::infinity();
  for (int64_t epoch = 1; epoch <= cfg.epochs; ++epoch) {
    model->train();
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    auto abs_err = torch::zeros({cfg.num_tasks}, torch::TensorOptions().device(device));
    double worst = 0.0;
    int64_t seen = 0;
    for (const auto& b : train_set) {
      auto db = b.to(device);  // LOOKALIKE: tensor-clone-in-loop -- every step moves a different batch
      auto target = scaler.transform(db);
      auto pred = model->forward(db);
      auto w = task_weights.to(device);  // EXPECT: tensor-clone-in-loop
      auto loss = ((pred - target).pow(2) * w).mean();
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      abs_err += (scaler.inverse(pred.detach()) - db.y).abs().sum(0);
      worst = std::max(worst, (pred - target).abs().max().item<double>());  // EXPECT: tensor-sync-in-loop
      seen += db.num_graphs;
    }
    auto summary = torch::stack({epoch_loss / static_cast<double>(train_set.size()),
                                 abs_err.mean() / static_cast<double>(seen)}).cpu();  // LOOKALIKE: tensor-sync-in-loop -- one transfer per epoch, after the step loop
    const double val_mae = evaluate(model, val_set, scaler, device, cfg.num_tasks);
    std::printf("epoch %3ld  loss %.4f  train MAE %.4f  worst %.3f  val MAE %.4f\n",
                static_cast<long>(epoch), summary[0].item<double>(), summary[1].item<double>(), worst, val_mae);
    if (val_mae < best_val) {
      best_val = val_mae;
      torch::save(model, "pna_best.pt");
    }
  }
}

}  // namespace pna

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s train.txt valid.txt\n", argv[0]);
    return 1;
  }
  torch::manual_seed(0);
  pna::PNAConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto train_set = pna::make_batches(pna::load_molecules(argv[1], cfg.num_tasks), cfg.batch_size);
  auto val_set = pna::make_batches(pna::load_molecules(argv[2], cfg.num_tasks), cfg.batch_size);
  cfg.avg_deg_log = pna::average_log_degree(train_set);

  pna::PNANet model(cfg);
  model->to(device);
  pna::train(model, train_set, val_set, cfg, device);
  return 0;
}
