// Instant-NGP (Mueller et al., 2022) radiance field for synthetic RGBA scenes. Positions in the
// scene box go through a multiresolution hash grid (16 levels, 2 features each, trilinear
// interpolation of the 8 cell corners), a tiny density MLP, and a colour MLP conditioned on
// spherical-harmonics view directions. Rays are sampled in the box; samples in empty space are
// skipped with a 128^3 occupancy grid whose densities decay and are re-measured every few steps.
// Training composites onto a random background colour and minimises the L2 error.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct NgpConfig {
  int64_t n_levels = 16, feats_per_level = 2, log2_table = 19, base_res = 16, finest_res = 2048;
  int64_t hidden = 64, geo_feat = 15, grid_res = 128, n_samples = 128, batch_rays = 4096;
  int64_t iters = 30000, occ_every = 16, log_every = 500;
  double occ_decay = 0.95, occ_thresh = 0.01, max_density = 1e4, lr = 1e-2, table_decay = 1e-6;
};

struct RayBatch { torch::Tensor origins, dirs, rgba; }; // [B, 3], [B, 3] unit, [B, 4] in [0, 1]
struct RenderOut { torch::Tensor rgb, opacity; };      // [B, 3], [B]

struct HashGridImpl : nn::Module {
  explicit HashGridImpl(const NgpConfig &cfg)
      : n_levels_(cfg.n_levels), feats_(cfg.feats_per_level), table_size_(int64_t{1} << cfg.log2_table) {
    const double growth = std::exp((std::log(static_cast<double>(cfg.finest_res)) - std::log(static_cast<double>(cfg.base_res))) /
                                   static_cast<double>(cfg.n_levels - 1));
    for (int64_t l = 0; l < n_levels_; ++l)
      resolutions_.push_back(static_cast<int64_t>(std::floor(static_cast<double>(cfg.base_res) * std::pow(growth, l))));
    auto init = torch::empty({n_levels_ * table_size_, feats_});
    init.uniform_(-1e-4, 1e-4); // LOOKALIKE: tensor-inplace-on-leaf -- written before register_parameter makes it require grad
    table = register_parameter("table", init);
    primes = register_buffer("primes", torch::tensor({int64_t{1}, int64_t{2654435761}, int64_t{805459861}}));
    std::vector<int64_t> bits;
    for (int64_t c = 0; c < 8; ++c)
      for (int64_t d = 0; d < 3; ++d)
        bits.push_back((c >> d) & 1);
    // FACT: b = torch.tensor([0, 1] * 12); assert is_view_of(b.view(8, 3), b)
    offsets = register_buffer("offsets", torch::tensor(bits).view({8, 3})); // LOOKALIKE: tensor-view-non-contiguous -- a fresh 1-D tensor
  }

  // Rows of the level's table for integer corners [B, 8, 3]: a dense index while the level's
  // grid fits into the table, the spatial hash of the paper otherwise.
  torch::Tensor corner_index(const torch::Tensor &corners, int64_t level) const {
    const int64_t side = resolutions_[level] + 1;
    torch::Tensor idx;
    if (side * side * side <= table_size_) {
      idx = corners.select(-1, 0) + corners.select(-1, 1) * side + corners.select(-1, 2) * (side * side);
    } else {
      idx = corners.select(-1, 0) * primes[0];
      idx.bitwise_xor_(corners.select(-1, 1) * primes[1]);
      idx.bitwise_xor_(corners.select(-1, 2) * primes[2]);
      idx.bitwise_and_(table_size_ - 1);
    }
    return idx + level * table_size_;
  }

  // x: [B, 3] in [0, 1]^3 -> [B, n_levels * feats]
  torch::Tensor forward(const torch::Tensor &x) {
    const auto B = x.size(0);
    std::vector<torch::Tensor> levels;
    const auto upper = offsets.to(torch::kBool).unsqueeze(0); // LOOKALIKE: tensor-clone-in-loop -- converted once, before the level loop
    for (int64_t l = 0; l < n_levels_; ++l) {
      auto pos = x * static_cast<double>(resolutions_[l]);
      auto base = pos.floor();
      auto frac = pos - base;
      auto corners = offsets.unsqueeze(0).expand({B, 8, 3});
      // FACT: o = torch.randint(0, 2, (8, 3)); c = o.unsqueeze(0).expand(5, 8, 3); assert raises(lambda: c.add_(torch.randint(0, 9, (5, 1, 3))), "single memory location")
      corners.add_(base.to(torch::kLong).unsqueeze(1)); // EXPECT: tensor-inplace-on-expanded
      auto idx = corner_index(corners, l);
      // FACT: t = torch.randn(50, 2); i = torch.randint(0, 50, (4, 8)); f = t.index_select(0, i.view(-1)); assert is_view_of(f.view(4, 8, 2), f)
      auto feats = table.index_select(0, idx.view({-1})).view({B, 8, feats_}); // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a fresh contiguous tensor
      auto w = torch::where(upper, frac.unsqueeze(1), 1.0 - frac.unsqueeze(1)).prod(-1); // trilinear corner weights
      levels.push_back((feats * w.unsqueeze(-1)).sum(1));
    }
    // level-major like the fused kernel's output buffer, then one row per point
    // FACT: l = [torch.randn(6, 2) for _ in range(4)]; s = torch.stack(l).permute(1, 0, 2); assert is_copy_of(s.reshape(6, -1), s)
    return torch::stack(levels).permute({1, 0, 2}).reshape({B, -1}); // EXPECT: tensor-reshape-non-contiguous
  }

  // L2 decay of the table alone: Adam's weight decay would also shrink the MLPs.
  void decay(double rate) {
    // FACT: p = torch.nn.Parameter(torch.randn(16, 2)); assert raises(lambda: p.mul_(1 - 1e-6), "a leaf Variable that requires grad")
    table.mul_(1.0 - rate); // EXPECT: tensor-inplace-on-leaf
  }

  int64_t out_dim() const { return n_levels_ * feats_; }

  int64_t n_levels_, feats_, table_size_;
  std::vector<int64_t> resolutions_;
  torch::Tensor table, primes, offsets;
};
TORCH_MODULE(HashGrid);

// Real spherical harmonics up to degree 2 of unit directions: [B, 3] -> [B, 9].
torch::Tensor sh_encode(const torch::Tensor &d) {
  auto x = d.select(1, 0), y = d.select(1, 1), z = d.select(1, 2);
  return torch::stack({torch::full_like(x, 0.28209479), -0.48860251 * y, 0.48860251 * z, -0.48860251 * x, 1.09254843 * x * y,
                       -1.09254843 * y * z, 0.31539157 * (3 * z * z - 1), -1.09254843 * x * z, 0.54627421 * (x * x - y * y)},
                      1);
}

struct NgpFieldImpl : nn::Module {
  explicit NgpFieldImpl(const NgpConfig &cfg) : cfg_(cfg) {
    grid = register_module("grid", HashGrid(cfg));
    density_net = register_module("density_net", nn::Sequential(nn::Linear(grid->out_dim(), cfg.hidden), nn::ReLU(),
                                                                nn::Linear(cfg.hidden, 1 + cfg.geo_feat)));
    color_net = register_module("color_net", nn::Sequential(nn::Linear(9 + cfg.geo_feat, cfg.hidden), nn::ReLU(),
                                                            nn::Linear(cfg.hidden, cfg.hidden), nn::ReLU(), nn::Linear(cfg.hidden, 3)));
  }

  // Density (exp activation) and the geometry features handed to the colour MLP.
  std::pair<torch::Tensor, torch::Tensor> density(const torch::Tensor &x) {
    auto h = density_net->forward(grid->forward(x));
    auto sigma = torch::exp(h.select(1, 0));
    // FACT: x = torch.randn(6, requires_grad=True); s = torch.exp(x); s.clamp_max_(3.0); assert backward_fails(lambda: s.sum().backward())
    sigma.clamp_max_(cfg_.max_density); // EXPECT: tensor-inplace-on-saved
    return {sigma, h.narrow(1, 1, cfg_.geo_feat)};
  }

  torch::Tensor color(const torch::Tensor &dirs, const torch::Tensor &geo) {
    return torch::sigmoid(color_net->forward(torch::cat({sh_encode(dirs), geo}, 1)));
  }

  NgpConfig cfg_;
  HashGrid grid{nullptr};
  nn::Sequential density_net{nullptr}, color_net{nullptr};
};
TORCH_MODULE(NgpField);

// Occupancy of the unit cube in grid_res^3 cells, kept as decayed maxima of measured density.
class OccupancyGrid {
public:
  OccupancyGrid(const NgpConfig &cfg, torch::Device device) : cfg_(cfg) {
    const auto G = cfg.grid_res;
    density_ = torch::zeros({G * G * G}, torch::TensorOptions().device(device));
    occupied_ = torch::ones({G * G * G}, torch::TensorOptions().dtype(torch::kBool).device(device));
    auto i = torch::arange(G * G * G, torch::TensorOptions().dtype(torch::kLong).device(device));
    cells_ = torch::stack({torch::div(i, G * G, "floor"), torch::remainder(torch::div(i, G, "floor"), G), torch::remainder(i, G)}, 1);
  }

  void update(NgpField &field) {
    torch::NoGradGuard no_grad;
    const auto G = cfg_.grid_res, n = cells_.size(0);
    const int64_t chunk = int64_t{1} << 18;
    auto fresh = torch::empty_like(density_);
    for (int64_t i = 0; i < n; i += chunk) {
      auto c = cells_.narrow(0, i, std::min(chunk, n - i));
      auto x = (c.to(torch::kFloat) + torch::rand({c.size(0), 3}, density_.options())) / static_cast<double>(G); // LOOKALIKE: tensor-clone-in-loop -- a different block of cells each chunk
      // FACT: f = torch.empty(10); d = torch.rand(10); f.narrow(0, 2, 4).copy_(d.narrow(0, 2, 4)); assert is_copy_of(f, d)
      fresh.narrow(0, i, c.size(0)).copy_(field->density(x).first); // LOOKALIKE: tensor-inplace-overlap -- a block of another tensor: the source cannot overlap it
    }
    auto before = density_; // meant as the densities of the last update, to count the cells that grew
    // FACT: d = torch.rand(8); d0 = d.clone(); b = d; d.mul_(0.95); assert shares_storage(b, d) and not torch.equal(b, d0)
    density_.mul_(cfg_.occ_decay); // EXPECT: tensor-alias-then-mutate
    density_ = torch::max(density_, fresh);
    grown_ = (density_ > before).sum();
    const double mean = density_.mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- once per occupancy update, outside any loop here
    auto was_occupied = occupied_;
    // FACT: d = torch.rand(8); o = d > 0.3; w = o; o = d > 0.1; assert not shares_storage(w, o)
    occupied_ = density_ > std::min(mean, cfg_.occ_thresh); // LOOKALIKE: tensor-alias-then-mutate -- occupied_ is rebound to a new tensor, was_occupied keeps the old one
    flipped_ = (was_occupied != occupied_).sum();
  }

  // x: [P, 3] in [0, 1] -> [P] bool
  torch::Tensor occupied_at(const torch::Tensor &x) const {
    const auto G = cfg_.grid_res;
    auto c = (x * static_cast<double>(G)).to(torch::kLong);
    // FACT: x = torch.rand(5, 3); c = (x * 128).to(torch.long); c.clamp_(0, 127); assert is_copy_of(c, x)
    c.clamp_(0, G - 1); // LOOKALIKE: tensor-alias-then-mutate -- float to int64 is a copy
    return occupied_.index_select(0, (c.select(1, 0) * G + c.select(1, 1)) * G + c.select(1, 2));
  }

  double occupied_fraction() const { return occupied_.to(torch::kFloat).mean().item<double>(); }
  const torch::Tensor &grown() const { return grown_; }

private:
  NgpConfig cfg_;
  torch::Tensor density_, occupied_, cells_, grown_, flipped_;
};

RenderOut render_rays(NgpField &field, const OccupancyGrid &grid, const RayBatch &rays, const torch::Tensor &aabb, const NgpConfig &cfg) {
  const auto B = rays.origins.size(0), S = cfg.n_samples;
  auto lo = aabb.narrow(0, 0, 3), hi = aabb.narrow(0, 3, 3);
  // slab test: entry and exit distance of each ray through the box
  auto inv = rays.dirs.reciprocal();
  auto t0 = (lo - rays.origins) * inv, t1 = (hi - rays.origins) * inv;
  auto near = std::get<0>(torch::min(t0, t1).max(1)).clamp_min(0.0);
  auto far = std::get<0>(torch::max(t0, t1).min(1));
  auto opts = rays.origins.options();
  auto u = (torch::arange(S, opts) + torch::rand({B, S}, opts)) / static_cast<double>(S); // stratified
  auto t = near.unsqueeze(1) + (far - near).unsqueeze(1) * u;
  auto pts = rays.origins.unsqueeze(1) + rays.dirs.unsqueeze(1) * t.unsqueeze(-1); // [B, S, 3]
  // FACT: o = torch.randn(4, 1, 3); d = torch.randn(4, 1, 3); p = o + d * torch.rand(4, 6, 1); assert is_view_of(p.view(-1, 3), p)
  auto xn = ((pts - lo) / (hi - lo)).view({-1, 3}); // LOOKALIKE: tensor-view-non-contiguous -- the broadcast result is a new contiguous tensor
  auto dirs = rays.dirs.unsqueeze(1).expand({B, S, 3});
  // FACT: d = torch.randn(4, 3); assert raises(lambda: d.unsqueeze(1).expand(4, 6, 3).view(-1, 3), "view size is not compatible")
  auto dirs_flat = dirs.view({-1, 3}); // EXPECT: tensor-view-non-contiguous
  auto sel = grid.occupied_at(xn).nonzero().squeeze(1);
  auto [sigma_sel, geo] = field->density(xn.index_select(0, sel));
  auto rgb_sel = field->color(dirs_flat.index_select(0, sel), geo);
  auto sigma = torch::zeros({B * S}, opts).index_copy(0, sel, sigma_sel).view({B, S});
  auto colors = torch::zeros({B * S, 3}, opts).index_copy(0, sel, rgb_sel).view({B, S, 3});
  auto delta = (far - near).unsqueeze(1) / static_cast<double>(S);
  auto alpha = 1.0 - torch::exp(-sigma * delta);
  // exclusive transmittance: shifted right by one sample, built out of place
  auto trans = torch::cumprod(1.0 - alpha + 1e-10, 1);
  // FACT: c = torch.rand(4, 6).cumprod(1); t = torch.cat([torch.ones(4, 1), c.narrow(1, 0, 5)], 1); assert is_copy_of(t, c)
  trans = torch::cat({torch::ones({B, 1}, opts), trans.narrow(1, 0, S - 1)}, 1); // LOOKALIKE: tensor-inplace-overlap -- the shift is a cat into a new tensor, not a copy_ within trans
  auto weights = alpha * trans;
  return {(weights.unsqueeze(-1) * colors).sum(1), weights.sum(1)};
}

void train_ngp(NgpField &field, const torch::Tensor &origins, const torch::Tensor &dirs, const torch::Tensor &rgba,
               const torch::Tensor &aabb, const NgpConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  field->to(device);
  OccupancyGrid grid(cfg, device);
  torch::optim::Adam opt(field->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.9, 0.99}).eps(1e-15));
  const auto R = origins.size(0);
  double loss_sum = 0;
  std::vector<torch::Tensor> recent;
  for (int64_t it = 0; it < cfg.iters; ++it) {
    if (it % cfg.occ_every == 0)
      grid.update(field);
    auto idx = torch::randint(R, {cfg.batch_rays});
    RayBatch rays{origins.index_select(0, idx).to(device), dirs.index_select(0, idx).to(device),
                  rgba.index_select(0, idx).to(device)}; // LOOKALIKE: tensor-clone-in-loop -- a new random batch of rays every step
    auto box = aabb.to(device); // EXPECT: tensor-clone-in-loop
    auto out = render_rays(field, grid, rays, box, cfg);
    // a random background per ray keeps the field from painting the background into the scene
    auto bg = torch::rand({cfg.batch_rays, 3});
    auto a = rays.rgba.narrow(1, 3, 1);
    auto loss = F::mse_loss(out.rgb + (1.0 - out.opacity).unsqueeze(1) * bg, rays.rgba.narrow(1, 0, 3) * a + bg * (1.0 - a)); // EXPECT: tensor-device-mismatch
    opt.zero_grad();
    loss.backward();
    opt.step();
    field->grid->decay(cfg.table_decay);
    loss_sum += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    recent.push_back(loss.detach()); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
    if ((it + 1) % cfg.log_every == 0) {
      const double mse = loss_sum / static_cast<double>(cfg.log_every);
      const double worst = torch::stack(recent).max().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
      std::cout << "iter " << it + 1 << " psnr " << -10.0 * std::log10(mse) << " worst " << worst << " occupied " << grid.occupied_fraction()
                << " grown cells " << grid.grown().item<int64_t>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- logging every log_every steps
      loss_sum = 0;
      recent.clear();
    }
  }
}
