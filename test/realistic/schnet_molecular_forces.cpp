// SchNet-style interatomic potential: continuous-filter convolutions over a radius
// graph, per-molecule energies by scatter-sum, forces as -dE/dR for force matching.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct SchNetConfig {
  int64_t num_species = 100;
  int64_t hidden = 128;
  int64_t filters = 128;
  int64_t num_rbf = 50;
  int64_t interactions = 3;
  double cutoff = 5.0;
  double rbf_gamma = 10.0;
  double force_weight = 100.0;
  double lr = 5e-4;
  int64_t log_every = 50;
};

// Several molecules packed into one graph; mol_index says which molecule an atom is in.
struct MoleculeBatch {
  torch::Tensor species;    // [N] int64 atomic numbers
  torch::Tensor pos;        // [N, 3] Angstrom
  torch::Tensor mol_index;  // [N] int64
  torch::Tensor energy;     // [M] reference energies
  torch::Tensor forces;     // [N, 3] reference forces
  int64_t num_molecules = 0;
};

struct EnergyStats {
  double mean = 0.0;
  double scale = 1.0;
};

struct RadiusGraph {
  torch::Tensor src, dst, dist;
};

inline torch::Tensor shifted_softplus(const torch::Tensor& x) {
  return F::softplus(x) - std::log(2.0);
}

inline torch::Tensor cosine_cutoff(const torch::Tensor& d, double rc) {
  return 0.5 * (torch::cos(d * M_PI / rc) + 1.0) * (d < rc).to(d.scalar_type());
}

inline torch::Tensor gaussian_expand(const torch::Tensor& d, const torch::Tensor& centers, double gamma) {
  auto diff = d.unsqueeze(-1) - centers;  // [E, K]
  return torch::exp(-gamma * diff.pow(2));
}

// All ordered pairs of distinct atoms of the same molecule closer than the cutoff.
RadiusGraph radius_graph(const torch::Tensor& pos, const torch::Tensor& mol_index, double cutoff) {
  torch::Tensor keep;
  {
    torch::NoGradGuard no_grad;  // the neighbour search itself is not differentiated
    auto all = torch::cdist(pos, pos);
    keep = (mol_index.unsqueeze(1) == mol_index.unsqueeze(0)) & (all < cutoff);
    keep.fill_diagonal_(false);
  }
  auto pairs = keep.nonzero();
  RadiusGraph g;
  g.src = pairs.select(1, 0);
  g.dst = pairs.select(1, 1);
  // recomputed from the gathered pairs so that d|r|/dr is finite (no zero self-distances)
  g.dist = (pos.index_select(0, g.src) - pos.index_select(0, g.dst)).norm(2, -1);
  return g;
}

struct InteractionImpl : nn::Module {
  explicit InteractionImpl(const SchNetConfig& c) : cutoff_(c.cutoff) {
    filter1_ = register_module("filter1", nn::Linear(c.num_rbf, c.filters));
    filter2_ = register_module("filter2", nn::Linear(c.filters, c.filters));
    in2f_ = register_module("in2f", nn::Linear(nn::LinearOptions(c.hidden, c.filters).bias(false)));
    f2out_ = register_module("f2out", nn::Linear(c.filters, c.hidden));
    dense_ = register_module("dense", nn::Linear(c.hidden, c.hidden));
  }

  torch::Tensor forward(const torch::Tensor& h, const RadiusGraph& g, const torch::Tensor& rbf) {
    auto W = filter2_(shifted_softplus(filter1_(rbf)));  // [E, F] continuous filter
    W.mul_(cosine_cutoff(g.dist, cutoff_).unsqueeze(-1));  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    auto x = in2f_(h);
    auto messages = x.index_select(0, g.src) * W;
    auto agg = torch::zeros_like(x);
    agg.index_add_(0, g.dst, messages);  // LOOKALIKE: tensor-inplace-on-leaf -- a fresh zeros buffer, not a leaf that requires grad
    auto v = dense_(shifted_softplus(f2out_(agg)));
    return h + v;
  }

  double cutoff_;
  nn::Linear filter1_{nullptr}, filter2_{nullptr}, in2f_{nullptr}, f2out_{nullptr}, dense_{nullptr};
};
TORCH_MODULE(Interaction);

struct SchNetImpl : nn::Module {
  explicit SchNetImpl(const SchNetConfig& c) : cfg_(c) {
    embed_ = register_module("embed", nn::Embedding(nn::EmbeddingOptions(c.num_species, c.hidden).padding_idx(0)));
    for (int64_t i = 0; i < c.interactions; ++i)
      blocks_.push_back(register_module("interaction" + std::to_string(i), Interaction(c)));
    out1_ = register_module("out1", nn::Linear(c.hidden, c.hidden / 2));
    out2_ = register_module("out2", nn::Linear(c.hidden / 2, 1));
    centers_ = register_buffer("centers", torch::linspace(0.0, c.cutoff, c.num_rbf));
  }

  // Energies [M] in normalised units.
  torch::Tensor forward(const torch::Tensor& species, const torch::Tensor& pos,
                        const torch::Tensor& mol_index, int64_t num_molecules) {
    auto g = radius_graph(pos, mol_index, cfg_.cutoff);
    auto rbf = gaussian_expand(g.dist, centers_, cfg_.rbf_gamma);
    rbf.mul_(cosine_cutoff(g.dist, cfg_.cutoff).unsqueeze(-1));  // EXPECT: tensor-inplace-on-saved

    torch::Tensor h = embed_(species);
    for (auto& block : blocks_) h = block->forward(h, g, rbf);

    auto e_atom = out2_(shifted_softplus(out1_(h))).squeeze(-1);  // [N]
    auto energy = torch::zeros({num_molecules}, e_atom.options());
    return energy.index_add(0, mol_index, e_atom);
  }

  SchNetConfig cfg_;
  nn::Embedding embed_{nullptr};
  std::vector<Interaction> blocks_;
  nn::Linear out1_{nullptr}, out2_{nullptr};
  torch::Tensor centers_;
};
TORCH_MODULE(SchNet);

// Remove the centroid of every molecule before the random rotation used for augmentation.
MoleculeBatch centre_and_rotate(const MoleculeBatch& raw, const torch::Tensor& rotation) {
  MoleculeBatch out = raw;
  auto pos = raw.pos.to(torch::kFloat);
  auto counts = torch::bincount(raw.mol_index, {}, raw.num_molecules).to(torch::kFloat);
  // FACT: c = torch.bincount(torch.tensor([0, 0, 1, 2, 2])); f = c.to(torch.float32); assert is_copy_of(f, c)
  counts.clamp_min_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- bincount is int64, to(kFloat) makes a new tensor
  auto sums = torch::zeros({raw.num_molecules, 3}, pos.options()).index_add_(0, raw.mol_index, pos);
  auto centroid = (sums / counts.unsqueeze(1)).index_select(0, raw.mol_index);
  // FACT: p = torch.randn(6, 3); q = p.to(torch.float32); q -= q.mean(0, keepdim=True); assert shares_storage(p, q)
  pos -= centroid;  // EXPECT: tensor-alias-then-mutate
  out.pos = pos.matmul(rotation);
  out.forces = raw.forces.matmul(rotation);
  return out;
}

EnergyStats fit_energy_stats(const std::vector<MoleculeBatch>& data) {
  std::vector<torch::Tensor> per_atom;
  for (const auto& mb : data) {
    auto n_atoms = torch::bincount(mb.mol_index, {}, mb.num_molecules).to(torch::kFloat);
    per_atom.push_back(mb.energy / n_atoms);
  }
  auto all = torch::cat(per_atom);
  EnergyStats s;
  s.mean = all.mean().item<double>();
  s.scale = all.std().item<double>() + 1e-6;
  return s;
}

// Energies and forces (-dE/dR). With create_graph the forces stay differentiable,
// which force matching needs: the loss on F is backpropagated into the weights.
std::pair<torch::Tensor, torch::Tensor> energy_and_forces(SchNet& model, const MoleculeBatch& mb, bool create_graph) {
  auto pos = mb.pos.clone();  // LOOKALIKE: tensor-unnecessary-clone -- requires_grad_ must not turn the batch's own tensor into a leaf
  pos.requires_grad_(true);
  auto energy = model->forward(mb.species, pos, mb.mol_index, mb.num_molecules);
  auto grads = torch::autograd::grad({energy.sum()}, {pos}, /*grad_outputs=*/{},
                                     /*retain_graph=*/create_graph, /*create_graph=*/create_graph);
  return {energy, -grads[0]};
}

void train_force_field(SchNet& model, const std::vector<MoleculeBatch>& train_set,
                       const SchNetConfig& cfg, int64_t epochs) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  const EnergyStats stats = fit_energy_stats(train_set);

  std::vector<torch::Tensor> epoch_losses;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    double running = 0.0;
    int64_t step = 0;
    for (const auto& mb : train_set) {
      MoleculeBatch dev = mb;
      dev.species = mb.species.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
      dev.pos = mb.pos.to(device);
      dev.mol_index = mb.mol_index.to(device);
      dev.energy = mb.energy.to(device);
      dev.forces = mb.forces.to(device);

      auto ef = energy_and_forces(model, dev, /*create_graph=*/true);
      auto e_target = dev.energy.clone();  // EXPECT: tensor-unnecessary-clone
      e_target -= stats.mean;
      e_target /= stats.scale;
      auto f_target = dev.forces / stats.scale;

      auto loss = F::mse_loss(ef.first, e_target) + cfg.force_weight * F::mse_loss(ef.second, f_target);
      opt.zero_grad();
      loss.backward();
      opt.step();

      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      epoch_losses.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph kept
      if (++step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    std::cout << "epoch " << epoch << " mean loss " << running / std::max<int64_t>(step, 1) << "\n";
  }
  std::cout << "best epoch-step loss " << torch::stack(epoch_losses).min().item<double>() << "\n";
}

// Rank conformers by predicted energy; forces are not needed here.
int64_t lowest_energy_conformer(SchNet& model, const std::vector<MoleculeBatch>& conformers) {
  model->eval();
  std::vector<torch::Tensor> energies;
  for (const auto& c : conformers) {
    auto e = model->forward(c.species, c.pos, c.mol_index, c.num_molecules);
    energies.push_back(e);  // EXPECT: tensor-graph-kept-across-iterations
  }
  auto all = torch::cat(energies);
  return all.argmin().item<int64_t>();
}

// Steepest-descent relaxation on the learnt surface.
torch::Tensor relax_geometry(SchNet& model, const MoleculeBatch& mol, int64_t max_steps, double step_size, double fmax) {
  model->eval();
  auto pos = mol.pos.detach().clone().requires_grad_(true);
  for (int64_t it = 0; it < max_steps; ++it) {
    auto e = model->forward(mol.species, pos, mol.mol_index, mol.num_molecules);
    auto grad = torch::autograd::grad({e.sum()}, {pos})[0];
    if (grad.abs().max().item<double>() < fmax) break;  // LOOKALIKE: tensor-sync-in-loop -- the value decides when to stop
    torch::NoGradGuard no_grad;
    pos -= step_size * grad;  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  return pos.detach();
}

// Short NVE rollout with velocity Verlet to check energy conservation of a trained model.
std::vector<double> run_nve(SchNet& model, const MoleculeBatch& mol, const torch::Tensor& masses,
                            double dt, int64_t n_steps) {
  model->eval();
  auto pos = mol.pos.detach().clone().requires_grad_(true);
  auto vel = torch::zeros(pos.sizes(), pos.options().dtype(torch::kDouble));
  auto forces_at = [&](const torch::Tensor& p) {
    auto e = model->forward(mol.species, p, mol.mol_index, mol.num_molecules);
    auto g = torch::autograd::grad({e.sum()}, {p})[0];
    return std::make_pair(e.detach(), g.neg());
  };

  auto state = forces_at(pos);
  std::vector<double> total_energy;
  total_energy.reserve(n_steps);
  for (int64_t step = 0; step < n_steps; ++step) {
    auto inv_m = 1.0 / masses.to(torch::kDouble).unsqueeze(-1);  // EXPECT: tensor-clone-in-loop
    vel += 0.5 * dt * state.second.to(torch::kDouble) * inv_m;  // LOOKALIKE: tensor-clone-in-loop -- the forces change every step
    pos += dt * vel.to(torch::kFloat);  // EXPECT: tensor-inplace-on-leaf
    state = forces_at(pos);
    vel += 0.5 * dt * state.second.to(torch::kDouble) * inv_m;
    auto kinetic = 0.5 * (vel.pow(2) / inv_m).sum();
    total_energy.push_back(state.first.sum().item<double>() + kinetic.item<double>());
  }
  return total_energy;
}
