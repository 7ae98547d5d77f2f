// E(n)-equivariant graph network (Satorras et al., 2021) for molecular energies and forces:
// forces are -dE/dx of the predicted energy; after training the model relaxes a geometry.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

struct EGNNConfig {
  int64_t num_atom_types = 10;
  int64_t hidden = 128;
  int64_t num_layers = 4;
  int64_t num_rbf = 16;
  double cutoff = 5.0;
  double coords_range = 15.0;
  double force_weight = 100.0;
  double lr = 5e-4;
  int64_t epochs = 100;
  int64_t batch_size = 16;
  double ema_decay = 0.999;
};

struct Molecule {
  torch::Tensor z, pos, energy, forces;
};

struct GraphBatch {
  torch::Tensor z, pos, batch, edge_index, energy, forces, num_atoms;
  int64_t num_graphs = 0;
};

struct EnergyStats {
  double mean = 0.0;  // per atom
  double std = 1.0;
};

Molecule molecule_from_arrays(const std::vector<int64_t>& numbers, const std::vector<double>& coords,
                              const std::vector<double>& gradient, double energy) {
  const auto n = static_cast<int64_t>(numbers.size());
  Molecule m;
  m.z = torch::tensor(numbers, torch::kLong);
  m.pos = torch::empty({n, 3});
  m.pos.copy_(torch::from_blob(const_cast<double*>(coords.data()), {n, 3}, torch::kFloat64));  // EXPECT: tensor-copy-narrowing
  m.forces = torch::from_blob(const_cast<double*>(gradient.data()), {n, 3}, torch::kFloat64)
                 .neg()
                 .to(torch::kFloat32);  // LOOKALIKE: tensor-copy-narrowing -- the conversion to float32 is explicit
  m.energy = torch::tensor({static_cast<float>(energy)});
  return m;
}

// Toy reference data: a smooth pair potential evaluated in double precision.
std::vector<Molecule> synthetic_molecules(int64_t count, std::mt19937& rng) {
  std::uniform_int_distribution<int> natoms(5, 12), species(0, 4);
  std::normal_distribution<double> coord(0.0, 1.3);
  const int64_t kinds[] = {1, 6, 7, 8, 9};
  std::vector<Molecule> out;
  for (int64_t k = 0; k < count; ++k) {
    const int n = natoms(rng);
    std::vector<int64_t> numbers(n);
    std::vector<double> xyz(3 * n), grad(3 * n, 0.0);
    for (auto& zi : numbers) zi = kinds[species(rng)];
    for (auto& c : xyz) c = coord(rng);
    double energy = 0.0;
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j) {
        double d[3], r2 = 0.0;
        for (int a = 0; a < 3; ++a) d[a] = xyz[3 * i + a] - xyz[3 * j + a], r2 += d[a] * d[a];
        const double c = 0.1 * numbers[i] * numbers[j] * std::exp(-r2);
        energy += c;
        for (int a = 0; a < 3; ++a) grad[3 * i + a] -= 2.0 * c * d[a], grad[3 * j + a] += 2.0 * c * d[a];
      }
    out.push_back(molecule_from_arrays(numbers, xyz, grad, energy));
  }
  return out;
}

torch::Tensor radius_graph(const torch::Tensor& pos, double cutoff) {
  auto dist = torch::cdist(pos, pos);
  auto self_loop = torch::eye(pos.size(0), pos.options().dtype(torch::kBool));
  return dist.lt(cutoff).logical_and(self_loop.logical_not()).nonzero().t();
}

GraphBatch collate(const std::vector<Molecule>& mols, size_t begin, size_t end, double cutoff) {
  std::vector<torch::Tensor> z, pos, batch, edges, energy, forces;
  std::vector<int64_t> counts;
  int64_t offset = 0;
  for (size_t i = begin; i < end; ++i) {
    const auto& m = mols[i];
    const int64_t n = m.z.size(0);
    z.push_back(m.z), pos.push_back(m.pos), energy.push_back(m.energy), forces.push_back(m.forces);
    batch.push_back(torch::full({n}, static_cast<int64_t>(i - begin), torch::kLong));
    edges.push_back(radius_graph(m.pos, cutoff) + offset);
    counts.push_back(n);
    offset += n;
  }
  return {torch::cat(z), torch::cat(pos), torch::cat(batch), torch::cat(edges, 1), torch::cat(energy),
          torch::cat(forces), torch::tensor(counts).to(torch::kFloat32), static_cast<int64_t>(end - begin)};
}

EnergyStats fit_energy_stats(const std::vector<GraphBatch>& batches) {
  std::vector<torch::Tensor> per_atom;
  for (const auto& b : batches) per_atom.push_back(b.energy / b.num_atoms);
  auto e = torch::cat(per_atom);
  return {e.mean().item<double>(), e.std().item<double>()};
}

struct EGCLImpl : torch::nn::Module {
  EGCLImpl(int64_t hidden, int64_t edge_features, double coords_range, double cutoff)
      : coords_range_(coords_range), cutoff_(cutoff) {
    edge_mlp = register_module("edge_mlp", torch::nn::Sequential(
        torch::nn::Linear(2 * hidden + 1 + edge_features, hidden), torch::nn::SiLU(),
        torch::nn::Linear(hidden, hidden), torch::nn::SiLU()));
    node_mlp = register_module("node_mlp", torch::nn::Sequential(
        torch::nn::Linear(2 * hidden, hidden), torch::nn::SiLU(), torch::nn::Linear(hidden, hidden)));
    coord_hidden = register_module("coord_hidden", torch::nn::Linear(hidden, hidden));
    coord_out = register_module("coord_out", torch::nn::Linear(torch::nn::LinearOptions(hidden, 1).bias(false)));
    torch::nn::init::xavier_uniform_(coord_out->weight, 0.001);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes the parameter under no_grad
  }

  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& h, const torch::Tensor& x,
                                                   const torch::Tensor& edge_index,
                                                   const torch::Tensor& edge_attr) {
    auto row = edge_index[0];
    auto col = edge_index[1];
    auto coord_diff = x.index_select(0, row) - x.index_select(0, col);
    auto dist = coord_diff.pow(2).sum(-1, true).add(1e-8).sqrt();

    // Smooth cosine cutoff; no gradient through the envelope.
    // FACT: x=torch.randn(6,3,requires_grad=True); d=x.pow(2).sum(-1,keepdim=True).sqrt(); r=d.detach(); r.div_(5.0); assert backward_fails(lambda: torch.cat([x,d],1).sum().backward())
    auto r = dist.detach();
    r.div_(cutoff_);  // EXPECT: tensor-inplace-on-detached
    auto envelope = 0.5 * (torch::cos(r * M_PI) + 1.0) * r.lt(1.0);

    auto m = edge_mlp->forward(
        torch::cat({h.index_select(0, row), h.index_select(0, col), dist, edge_attr}, 1));
    m = m * envelope;

    // FACT: x=torch.randn(5,4,requires_grad=True); assert backward_fails(lambda: (torch.tanh(x).mul_(15.0)).sum().backward())
    auto w = torch::tanh(coord_out(torch::silu(coord_hidden(m))));
    w.mul_(coords_range_);  // EXPECT: tensor-inplace-on-saved
    auto trans = coord_diff / (dist + 1.0) * w;
    // FACT: c=torch.zeros(3); c.index_add_(0, torch.tensor([0,2,2]), torch.ones(1).expand(3)); assert c.tolist()==[1.0,0.0,2.0]
    auto deg = torch::zeros({x.size(0)}, x.options())
                   .index_add_(0, row, torch::ones({1}, x.options()).expand({row.size(0)}));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded ones are only the source being read
    auto agg_x = torch::zeros_like(x).index_add_(0, row, trans);
    auto x_new = x + agg_x / deg.clamp_min(1.0).unsqueeze(-1);

    auto agg_h = torch::zeros({h.size(0), m.size(1)}, h.options()).index_add_(0, row, m);
    auto h_new = h + node_mlp->forward(torch::cat({h, agg_h}, 1));
    return {h_new, x_new};
  }

  double coords_range_, cutoff_;
  torch::nn::Sequential edge_mlp{nullptr}, node_mlp{nullptr};
  torch::nn::Linear coord_hidden{nullptr}, coord_out{nullptr};
};
TORCH_MODULE(EGCL);

struct EGNNImpl : torch::nn::Module {
  explicit EGNNImpl(const EGNNConfig& cfg) : cutoff_(cfg.cutoff) {
    embed = register_module("embed", torch::nn::Embedding(cfg.num_atom_types, cfg.hidden));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.num_layers; ++i)
      layers->push_back(EGCL(cfg.hidden, cfg.num_rbf, cfg.coords_range, cfg.cutoff));
    head = register_module("head", torch::nn::Sequential(
        torch::nn::Linear(cfg.hidden, cfg.hidden), torch::nn::SiLU(), torch::nn::Linear(cfg.hidden, 1)));
    rbf_centers = register_buffer("rbf_centers", torch::linspace(0.0, cfg.cutoff, cfg.num_rbf));
    atom_ref = torch::zeros({cfg.num_atom_types});
  }

  void set_atom_reference(const torch::Tensor& ref) { atom_ref = ref.to(torch::kFloat32); }

  torch::Tensor forward(const torch::Tensor& z, const torch::Tensor& pos, const torch::Tensor& batch,
                        const torch::Tensor& edge_index, int64_t num_graphs) {
    auto h = embed(z);
    auto d0 = (pos.index_select(0, edge_index[0]) - pos.index_select(0, edge_index[1]))
                  .pow(2).sum(-1, true).sqrt();
    const double gamma = 10.0 / cutoff_;
    auto edge_attr = torch::exp(-gamma * (d0 - rbf_centers).pow(2));  // LOOKALIKE: tensor-device-mismatch -- rbf_centers is a registered buffer and follows model->to(device)
    auto x = pos;
    for (const auto& layer : *layers) {
      std::tie(h, x) = layer->as<EGCL>()->forward(h, x, edge_index, edge_attr);
    }
    auto atom_energy = head->forward(h).squeeze(-1) + atom_ref.index_select(0, z);  // EXPECT: tensor-device-mismatch
    return torch::zeros({num_graphs}, atom_energy.options()).index_add_(0, batch, atom_energy);
  }

  double cutoff_;
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::nn::Sequential head{nullptr};
  torch::Tensor rbf_centers, atom_ref;
};
TORCH_MODULE(EGNN);

std::pair<torch::Tensor, torch::Tensor> energy_and_forces(EGNN& model, const torch::Tensor& z, torch::Tensor pos,
                                                          const torch::Tensor& batch, const torch::Tensor& edge_index,
                                                          int64_t num_graphs, bool training) {
  pos.requires_grad_(true);
  // Work in the centre-of-mass frame of every molecule.
  auto counts = torch::bincount(batch, {}, num_graphs).to(pos.scalar_type());
  auto com = torch::zeros({num_graphs, 3}, pos.options()).index_add_(0, batch, pos) / counts.unsqueeze(-1);
  pos.sub_(com.index_select(0, batch));  // EXPECT: tensor-inplace-on-leaf
  auto energy = model->forward(z, pos, batch, edge_index, num_graphs);
  auto grads = torch::autograd::grad({energy.sum()}, {pos}, {}, /*retain_graph=*/training,
                                     /*create_graph=*/training);
  auto forces = grads[0].clone().neg_();  // EXPECT: tensor-unnecessary-clone
  return {energy, forces};
}

void train(EGNN& model, std::vector<GraphBatch>& batches, const EGNNConfig& cfg, const EnergyStats& stats,
           torch::Device device) {
  model->to(device);
  model->train();
  auto params = model->parameters();
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(cfg.lr).weight_decay(1e-12));
  std::vector<torch::Tensor> ema;
  for (const auto& p : params) ema.push_back(p.detach().clone());
  auto energy_scale = torch::tensor(stats.std);

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    torch::Tensor epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    double force_mae = 0.0;
    for (auto& b : batches) {
      auto z = b.z.to(device);
      auto batch = b.batch.to(device);
      auto edge_index = b.edge_index.to(device);
      // FACT: e=torch.randn(4); assert shares_storage(e.to('cpu'), e) and shares_storage(e.to(torch.float32), e)
      torch::Tensor target_e = b.energy.to(device);
      target_e.sub_(b.num_atoms.to(device) * stats.mean).div_(stats.std);  // EXPECT: tensor-alias-then-mutate
      auto target_f = b.forces.to(device) / energy_scale;  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may be mixed with CUDA tensors

      auto [pred_e, pred_f] = energy_and_forces(model, z, b.pos.to(device), batch, edge_index, b.num_graphs, true);
      auto loss = torch::mse_loss(pred_e, target_e) + cfg.force_weight * torch::mse_loss(pred_f, target_f);

      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(params, 10.0);
      opt.step();
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i)
          ema[i].mul_(cfg.ema_decay).add_(params[i], 1.0 - cfg.ema_decay);  // LOOKALIKE: tensor-inplace-on-detached -- ema holds detach().clone() copies, not the live parameters
      }
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      force_mae += (pred_f - target_f).abs().mean().item<double>() * stats.std;  // EXPECT: tensor-sync-in-loop
    }
    std::printf("epoch %3lld  loss %.5f  force MAE %.4f\n", static_cast<long long>(epoch),
                epoch_loss.item<double>() / batches.size(), force_mae / batches.size());
  }

  // Evaluate with the averaged weights.
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(ema[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- parameters are overwritten under NoGradGuard
}

double energy_mae(EGNN& model, const std::vector<GraphBatch>& batches, const EnergyStats& stats,
                  torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto abs_err = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t count = 0;
  for (const auto& b : batches) {
    auto pred = model->forward(b.z.to(device), b.pos.to(device), b.batch.to(device), b.edge_index.to(device),
                               b.num_graphs);
    auto n = b.num_atoms.to(device);
    abs_err += (pred * stats.std + n * stats.mean - b.energy.to(device)).abs().sum();  // LOOKALIKE: tensor-sync-in-loop -- summed on the device and read once after the loop
    count += b.num_graphs;
  }
  return abs_err.item<double>() / static_cast<double>(count);
}

torch::Tensor relax(EGNN& model, const Molecule& mol, const EGNNConfig& cfg, torch::Device device,
                    int64_t max_steps = 500, double step = 0.01, double fmax = 0.05) {
  model->eval();
  torch::Tensor pos = mol.pos.to(torch::TensorOptions().device(device), /*non_blocking=*/false, /*copy=*/true);
  auto batch = torch::zeros({mol.z.size(0)}, torch::TensorOptions().dtype(torch::kLong).device(device));
  std::vector<torch::Tensor> trajectory{pos.clone()};
  for (int64_t it = 0; it < max_steps; ++it) {
    auto z = mol.z.to(device);  // EXPECT: tensor-clone-in-loop
    auto edge_index = radius_graph(pos, cfg.cutoff);
    auto [energy, forces] = energy_and_forces(model, z, pos.detach(), batch, edge_index, 1, false);
    const double worst = forces.pow(2).sum(-1).sqrt().max().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to stop
    if (worst < fmax) break;
    {
      torch::NoGradGuard no_grad;
      pos.add_(forces.clamp(-0.2 / step, 0.2 / step), step);
    }
    trajectory.push_back(pos.clone());  // LOOKALIKE: tensor-clone-in-loop -- pos moves every step, each snapshot needs its own copy
  }
  return torch::stack(trajectory);
}

int main() {
  torch::manual_seed(0);
  std::mt19937 rng(0);
  EGNNConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto molecules = synthetic_molecules(512, rng);
  std::vector<GraphBatch> batches;
  for (size_t i = 0; i + cfg.batch_size <= molecules.size(); i += cfg.batch_size)
    batches.push_back(collate(molecules, i, i + cfg.batch_size, cfg.cutoff));
  const auto stats = fit_energy_stats(batches);

  EGNN model(cfg);
  model->set_atom_reference(torch::zeros({cfg.num_atom_types}, torch::kFloat64));
  train(model, batches, cfg, stats, device);
  std::printf("train energy MAE %.4f\n", energy_mae(model, batches, stats, device));

  auto traj = relax(model, molecules.front(), cfg, device);
  std::printf("relaxation took %lld steps\n", static_cast<long long>(traj.size(0) - 1));
  return 0;
}
