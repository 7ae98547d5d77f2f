// Distil a trained NeRF MLP (teacher) into a dense voxel grid (student) for real-time viewing.
// The student stores a density channel and three colour channels on an R^3 lattice and is
// queried with hand-written trilinear interpolation; empty voxels are pruned as training goes.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

constexpr double kPi = 3.14159265358979323846;

struct DistillConfig {
  int64_t grid_res = 128;
  int64_t rays_per_step = 4096;
  int64_t samples_per_ray = 64;
  double near = 2.0;
  double far = 6.0;
  double scene_radius = 1.5;
  double tv_weight = 1e-4;
  double lr = 0.1;
  int64_t steps = 20000;
  int64_t prune_every = 1000;
  double prune_sigma = 0.01;
};

struct TeacherNeRFImpl : torch::nn::Module {
  TeacherNeRFImpl(int64_t n_freq, int64_t width) : n_freq_(n_freq) {
    const int64_t in = 3 + 3 * 2 * n_freq;
    trunk = register_module(
        "trunk", torch::nn::Sequential(torch::nn::Linear(in, width), torch::nn::ReLU(),
                                       torch::nn::Linear(width, width), torch::nn::ReLU()));
    sigma_head = register_module("sigma_head", torch::nn::Linear(width, 1));
    rgb_head = register_module("rgb_head", torch::nn::Linear(width + 3, 3));
  }

  torch::Tensor encode(const torch::Tensor& p) const {
    std::vector<torch::Tensor> feats{p};
    for (int64_t i = 0; i < n_freq_; ++i) {
      auto s = p * (std::pow(2.0, static_cast<double>(i)) * kPi);
      feats.push_back(torch::sin(s));
      feats.push_back(torch::cos(s));
    }
    return torch::cat(feats, -1);
  }

  // pts, dirs: [P, 3] -> [P, 4] = (sigma, r, g, b)
  torch::Tensor forward(const torch::Tensor& pts, const torch::Tensor& dirs) {
    auto h = trunk->forward(encode(pts));
    auto sigma = F::softplus(sigma_head(h));
    auto rgb = torch::sigmoid(rgb_head(torch::cat({h, dirs}, -1)));
    return torch::cat({sigma, rgb}, -1);
  }

  int64_t n_freq_;
  torch::nn::Sequential trunk{nullptr};
  torch::nn::Linear sigma_head{nullptr}, rgb_head{nullptr};
};
TORCH_MODULE(TeacherNeRF);

// Trilinear lookup into a dense [C, R, R, R] grid at normalised coordinates u in [0, 1]^3.
torch::Tensor trilinear(const torch::Tensor& grid, const torch::Tensor& u) {
  const int64_t C = grid.size(0), R = grid.size(1), P = u.size(0);
  auto g = u.clamp(0.0, 1.0) * static_cast<double>(R - 1);  // [P, 3]
  auto base = g.floor().clamp_max(static_cast<double>(R - 2));
  auto frac = g - base;
  auto i0 = base.to(torch::kLong);
  auto flat = grid.reshape({C, -1});  // [C, R^3]
  auto out = torch::zeros({C, P}, grid.options());
  for (int64_t corner = 0; corner < 8; ++corner) {
    const int64_t dx = corner & 1, dy = (corner >> 1) & 1, dz = (corner >> 2) & 1;
    auto lin = ((i0.select(1, 0) + dx) * R + (i0.select(1, 1) + dy)) * R + (i0.select(1, 2) + dz);
    auto wx = dx ? frac.select(1, 0) : 1.0 - frac.select(1, 0);
    auto wy = dy ? frac.select(1, 1) : 1.0 - frac.select(1, 1);
    auto wz = dz ? frac.select(1, 2) : 1.0 - frac.select(1, 2);
    out = out + flat.index_select(1, lin) * (wx * wy * wz).unsqueeze(0);
  }
  return out.t();  // [P, C]
}

// Dilate an occupancy mask by one voxel along x so thin surfaces survive pruning.
void smooth_occupancy(torch::Tensor occ) {
  const int64_t R = occ.size(0);
  // FACT: o = torch.rand(6, 6, 6); assert raises(lambda: o.narrow(0, 1, 5).add_(o.narrow(0, 0, 5)), "some elements of the input tensor")
  occ.narrow(0, 1, R - 1).add_(occ.narrow(0, 0, R - 1));  // EXPECT: tensor-inplace-overlap
  occ.clamp_max_(1.0);
}

struct RayBatch {
  torch::Tensor origins;  // [N, 3]
  torch::Tensor dirs;     // [N, 3], unit length
};

RayBatch random_rays(int64_t n, double radius) {
  auto dirs = F::normalize(torch::randn({n, 3}), F::NormalizeFuncOptions().dim(-1));
  auto origins = -dirs * (2.5 * radius) + 0.1 * torch::randn({n, 3});
  return {origins, dirs};
}

// Stratified samples along each ray: flattened [N*S, 3] points and view directions.
std::pair<torch::Tensor, torch::Tensor> sample_along(const RayBatch& rays, const torch::Tensor& t_base,
                                                     double dt) {
  const int64_t N = rays.origins.size(0), S = t_base.size(0);
  auto t = t_base.unsqueeze(0).expand({N, S});
  // FACT: t = torch.linspace(2, 6, 8).unsqueeze(0).expand(4, 8); assert raises(lambda: t.add_(torch.rand(4, 8)), "more than one element")
  t += torch::rand({N, S}) * dt;  // EXPECT: tensor-inplace-on-expanded
  // FACT: o = torch.randn(4, 3).unsqueeze(1).expand(4, 5, 3); p = o + torch.randn(4, 1, 3) * torch.rand(4, 5, 1); assert o.stride(1) == 0 and p.shape == (4, 5, 3)
  auto o = rays.origins.unsqueeze(1).expand({N, S, 3});  // LOOKALIKE: tensor-inplace-on-expanded -- only read by the addition below
  auto pts = o + rays.dirs.unsqueeze(1) * t.unsqueeze(-1);
  auto view_dirs = rays.dirs.unsqueeze(1).expand({N, S, 3});
  // FACT: o = torch.randn(4, 3).unsqueeze(1).expand(4, 5, 3); p = o + torch.randn(4, 1, 3) * torch.rand(4, 5, 1); assert is_contiguous(p) and is_view_of(p.view(-1, 3), p)
  auto flat_pts = pts.view({-1, 3});  // LOOKALIKE: tensor-view-non-contiguous -- pts is a fresh broadcast result, contiguous
  // FACT: d = torch.randn(4, 3).unsqueeze(1).expand(4, 5, 3); assert raises(lambda: d.view(-1, 3), "view size is not compatible")
  auto flat_dirs = view_dirs.view({-1, 3});  // EXPECT: tensor-view-non-contiguous
  return {flat_pts, flat_dirs};
}

class VoxelGridImpl : public torch::nn::Module {
 public:
  VoxelGridImpl(int64_t res, double voxel_size) : res_(res), voxel_size_(voxel_size) {
    density_ = register_parameter("density", torch::full({res, res, res}, 0.1));
    color_ = register_parameter("color", torch::zeros({3, res, res, res}));
    alive_ = register_buffer("alive", torch::ones({res, res, res}, torch::kBool));
  }

  // u: [P, 3] in the unit cube -> [P, 4] = (sigma, r, g, b)
  torch::Tensor forward(const torch::Tensor& u) {
    auto grid = torch::cat({density_.unsqueeze(0), color_}, 0);  // [4, R, R, R]
    auto feat = trilinear(grid, u);
    auto sigma = F::softplus(feat.narrow(1, 0, 1));
    auto rgb = torch::sigmoid(feat.narrow(1, 1, 3));
    return torch::cat({sigma, rgb}, 1);
  }

  torch::Tensor total_variation() const {
    const int64_t R = res_;
    // FACT: g = torch.randn(5, 5, 5); d = g.narrow(0, 1, 4) - g.narrow(0, 0, 4); assert is_copy_of(d, g)
    auto dx = density_.narrow(0, 1, R - 1) - density_.narrow(0, 0, R - 1);  // LOOKALIKE: tensor-inplace-overlap -- out-of-place difference, nothing is written
    auto dy = density_.narrow(1, 1, R - 1) - density_.narrow(1, 0, R - 1);
    auto dz = density_.narrow(2, 1, R - 1) - density_.narrow(2, 0, R - 1);
    return dx.pow(2).mean() + dy.pow(2).mean() + dz.pow(2).mean();
  }

  // Standardised densities for the training-log histogram.
  torch::Tensor density_zscore() const {
    auto d = density_.detach();
    d.sub_(d.mean()).div_(d.std() + 1e-6);  // EXPECT: tensor-inplace-on-detached
    return d;
  }

  // Kill voxels whose density stayed below the threshold; they never come back.
  int64_t prune(double sigma_thresh) {
    torch::NoGradGuard no_grad;
    auto sigma = F::softplus(density_);
    auto occ = (sigma > sigma_thresh).to(torch::kFloat);
    // FACT: s = torch.rand(4, 4, 4); m = s > 0.5; o = m.to(torch.float); assert is_copy_of(o, m)
    smooth_occupancy(occ);  // LOOKALIKE: tensor-alias-then-mutate -- a bool mask converted to float is a new tensor
    alive_.logical_and_(occ > 0);
    density_.masked_fill_(alive_.logical_not(), -10.0);  // LOOKALIKE: tensor-inplace-on-leaf -- under the NoGradGuard above
    return alive_.sum().item<int64_t>();
  }

  // Interleaved RGBA bytes for the WebGL viewer's 3D texture.
  torch::Tensor export_rgba8() const {
    torch::NoGradGuard no_grad;
    auto alpha = 1.0 - torch::exp(-F::softplus(density_) * voxel_size_);
    auto all = torch::cat({torch::sigmoid(color_), alpha.unsqueeze(0)}, 0).cpu();  // [4, R, R, R]
    // FACT: g = torch.randn(4, 5, 5, 5); assert is_copy_of(g.permute(1, 2, 3, 0).flatten(), g)
    auto interleaved = all.permute({1, 2, 3, 0}).flatten();  // EXPECT: tensor-reshape-non-contiguous
    auto bytes = torch::empty({interleaved.size(0)}, torch::kByte);
    bytes.copy_(interleaved * 255.0);  // EXPECT: tensor-copy-narrowing
    return bytes;
  }

  // [R^3, 4] table of (sigma, r, g, b) for the surviving voxels, for the mesh extractor.
  torch::Tensor voxel_table() const {
    torch::NoGradGuard no_grad;
    auto all = torch::cat({density_.unsqueeze(0), color_}, 0);
    // FACT: g = torch.randn(4, 5, 5, 5); assert is_view_of(g.permute(1, 2, 3, 0).reshape(-1, 4), g)
    auto table = all.permute({1, 2, 3, 0}).reshape({-1, 4});  // LOOKALIKE: tensor-reshape-non-contiguous -- the spatial dims merge in order: a view
    auto keep = alive_.flatten();
    auto q = torch::empty({keep.sum().item<int64_t>(), 4}, torch::kByte);
    q.copy_((table.index({keep}).sigmoid() * 255.0).round().clamp(0, 255));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to whole bytes
    return q;
  }

  int64_t res_;
  double voxel_size_;
  torch::Tensor density_, color_, alive_;
};
TORCH_MODULE(VoxelGrid);

void distill(TeacherNeRF teacher, VoxelGrid grid, const torch::Tensor& scene_box,
             const DistillConfig& cfg) {
  torch::Device device(torch::kCUDA);
  teacher->to(device);
  teacher->eval();
  for (auto& p : teacher->parameters()) p.requires_grad_(false);
  grid->to(device);
  const int64_t R = cfg.grid_res;

  // seed the student's densities from the teacher at the voxel centres
  {
    torch::NoGradGuard no_grad;
    auto lin = torch::linspace(0.0, 1.0, R);
    auto mesh = torch::meshgrid({lin, lin, lin}, "ij");
    auto unit = torch::stack({mesh[0], mesh[1], mesh[2]}, -1).view({-1, 3});
    auto world = scene_box[0] + unit * (scene_box[1] - scene_box[0]);
    auto up = torch::zeros_like(world);
    up.select(1, 2).fill_(1.0);
    auto seed = teacher->forward(world, up);  // EXPECT: tensor-device-mismatch
    // FACT: c = torch.randn(64, 4).select(1, 0); assert not is_contiguous(c) and is_view_of(c.view(4, 4, 4), c)
    auto seed_sigma = seed.select(1, 0).view({R, R, R});  // LOOKALIKE: tensor-view-non-contiguous -- splitting one strided dim is always a view
    grid->density_.copy_(torch::log(torch::expm1(seed_sigma.clamp_min(1e-4))));  // LOOKALIKE: tensor-inplace-on-leaf -- inside the NoGradGuard block
  }

  torch::optim::Adam opt(grid->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto t_base = torch::linspace(cfg.near, cfg.far, cfg.samples_per_ray);
  const double dt = (cfg.far - cfg.near) / static_cast<double>(cfg.samples_per_ray);

  torch::Tensor best_density;
  double best_loss = std::numeric_limits<double>::infinity();
  for (int64_t step = 0; step < cfg.steps; ++step) {
    auto rays = random_rays(cfg.rays_per_step, cfg.scene_radius);
    auto sampled = sample_along(rays, t_base, dt);
    auto pts = sampled.first.to(device);
    auto dirs = sampled.second.to(device);
    auto box = scene_box.to(device);  // EXPECT: tensor-clone-in-loop
    auto u = (pts - box[0]) / (box[1] - box[0]);

    torch::Tensor target;
    {
      torch::NoGradGuard no_grad;
      target = teacher->forward(pts, dirs);
    }
    auto pred = grid->forward(u);
    auto loss = F::mse_loss(pred, target) + cfg.tv_weight * grid->total_variation();
    opt.zero_grad();
    loss.backward();
    opt.step();

    if ((step + 1) % cfg.prune_every == 0) {
      const int64_t alive = grid->prune(cfg.prune_sigma);
      const double l = loss.item<double>();
      auto z = grid->density_zscore();
      std::cout << "step " << step + 1 << " loss " << l << " alive " << alive << " / " << R * R * R
                << " dense share " << (z > 1.0).to(torch::kFloat).mean().item<double>() << std::endl;
      if (l < best_loss) {
        best_loss = l;
        best_density = grid->density_.detach().clone();  // LOOKALIKE: tensor-clone-in-loop -- kept past the iteration as the best checkpoint
      }
    }
  }
  torch::save(best_density.cpu(), "best_density.pt");
}
