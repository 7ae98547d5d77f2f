// 3-D Gaussian splatting: adaptive density control (clone / split / prune) with the matching
// surgery on Adam's moments, so survivors keep their optimiser history and new points start at zero.
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace gs {

constexpr double kC0 = 0.28209479177387814;
constexpr double kC1 = 0.4886025119029199;

struct DensifyConfig {
  int64_t iterations = 30000, densify_from = 500, densify_until = 15000, densify_every = 100;
  int64_t opacity_reset_every = 3000, psnr_window = 50, sh_degree = 3;
  double grad_threshold = 2e-4, percent_dense = 0.01, min_opacity = 0.005;
  double lr_xyz = 1.6e-4, lr_feature = 2.5e-3, lr_opacity = 5e-2, lr_scaling = 5e-3, lr_rotation = 1e-3;
};

// Poses live on the device; ground-truth images stay on the host until used.
struct Camera { torch::Tensor world_view, full_proj, center, image, alpha; };

struct PointCloud { std::vector<double> xyz; std::vector<uint8_t> rgb; };
struct RasterOut { torch::Tensor image, radii, viewspace_points; };

// From the COLMAP reader and the CUDA rasteriser extension.
std::vector<Camera> load_cameras(const std::string& dir, torch::Device device);
PointCloud load_points3d(const std::string& dir);
RasterOut rasterize_gaussians(const Camera& cam, const torch::Tensor& means3d, const torch::Tensor& means2d,
                              const torch::Tensor& colors, const torch::Tensor& opacity, const torch::Tensor& scales,
                              const torch::Tensor& rotations, const torch::Tensor& background);

inline torch::Tensor inverse_sigmoid(const torch::Tensor& x) { return torch::log(x / (1 - x)); }

torch::Tensor build_rotation(const torch::Tensor& q) {
  auto n = q / q.norm(2, 1, true);
  auto r = n.select(1, 0), x = n.select(1, 1), y = n.select(1, 2), z = n.select(1, 3);
  return torch::stack({1 - 2 * (y * y + z * z), 2 * (x * y - r * z), 2 * (x * z + r * y),
                       2 * (x * y + r * z), 1 - 2 * (x * x + z * z), 2 * (y * z - r * x),
                       2 * (x * z - r * y), 2 * (y * z + r * x), 1 - 2 * (x * x + y * y)}, 1).view({-1, 3, 3});
}

torch::Tensor mean_knn_sq_dist(const torch::Tensor& pts, int64_t k = 3) {
  torch::NoGradGuard no_grad;
  auto d2 = torch::cdist(pts, pts).pow(2);
  return std::get<0>(d2.topk(k + 1, 1, /*largest=*/false)).narrow(1, 1, k).mean(1);
}

class GaussianModel {
 public:
  GaussianModel(int64_t max_sh_degree, torch::Device device) : max_sh_degree(max_sh_degree), device_(device) {}

  void create_from_pcd(const PointCloud& pcd) {
    const int64_t N = static_cast<int64_t>(pcd.xyz.size() / 3);
    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device_);
    auto points = torch::empty({N, 3}, opts);
    points.copy_(torch::from_blob(const_cast<double*>(pcd.xyz.data()), {N, 3}, torch::kDouble));  // EXPECT: tensor-copy-narrowing
    auto colors = torch::empty({N, 3}, opts);
    colors.copy_(torch::from_blob(const_cast<uint8_t*>(pcd.rgb.data()), {N, 3}, torch::kUInt8));  // LOOKALIKE: tensor-copy-narrowing -- uint8 into float32 is exact
    colors.div_(255.0);
    const int64_t K = (max_sh_degree + 1) * (max_sh_degree + 1);
    auto features = torch::zeros({N, 3, K}, opts);
    features.select(2, 0).copy_((colors - 0.5) / kC0);
    xyz = points.requires_grad_();
    f_dc = features.narrow(2, 0, 1).transpose(1, 2).contiguous().requires_grad_();
    f_rest = features.narrow(2, 1, K - 1).transpose(1, 2).contiguous().requires_grad_();
    scaling = torch::log(torch::sqrt(mean_knn_sq_dist(points).clamp_min(1e-7))).unsqueeze(1).repeat({1, 3});
    scaling.requires_grad_();
    rotation = torch::zeros({N, 4}, opts.requires_grad(true));
    // FACT: r = torch.zeros(4,4, requires_grad=True); assert raises(lambda: r.select(1,0).fill_(1.0), "leaf Variable")
    rotation.select(1, 0).fill_(1.0);  // EXPECT: tensor-inplace-on-leaf
    opacity = inverse_sigmoid(torch::full({N, 1}, 0.1, opts)).requires_grad_();
    reset_stats(N);
  }

  void training_setup(const DensifyConfig& cfg, double spatial_lr_scale) {
    using torch::optim::AdamOptions;
    const std::array<double, 6> lrs{cfg.lr_xyz * spatial_lr_scale, cfg.lr_feature, cfg.lr_feature / 20.0,
                                    cfg.lr_opacity, cfg.lr_scaling, cfg.lr_rotation};
    std::vector<torch::optim::OptimizerParamGroup> groups;
    auto slots = param_slots();
    for (size_t g = 0; g < slots.size(); ++g) {
      groups.emplace_back(std::vector<torch::Tensor>{*slots[g]},
                          std::make_unique<AdamOptions>(AdamOptions(lrs[g]).eps(1e-15)));
    }
    optimizer = std::make_unique<torch::optim::Adam>(std::move(groups), AdamOptions(0.0).eps(1e-15));
  }

  torch::Tensor get_scaling() const { return torch::exp(scaling); }
  torch::Tensor get_opacity() const { return torch::sigmoid(opacity); }
  torch::Tensor get_features() const { return torch::cat({f_dc, f_rest}, 1); }
  void add_densification_stats(const torch::Tensor& screen_grad, const torch::Tensor& visible) {
    auto g = screen_grad.index({visible}).narrow(1, 0, 2).norm(2, -1, true);
    // FACT: a = torch.zeros(5,1); v = torch.tensor([True,False,True,False,True]); assert is_copy_of(a[v] + 1, a)
    xyz_grad_accum.index_put_({visible}, xyz_grad_accum.index({visible}) + g);  // LOOKALIKE: tensor-inplace-overlap -- the source is a fresh gathered copy, not a view of the accumulator
    denom.index_put_({visible}, denom.index({visible}) + 1);
  }

  void densify_and_prune(double max_grad, double min_opacity, const torch::Tensor& extent, int64_t max_screen) {
    auto grads = xyz_grad_accum / denom;
    grads.masked_fill_(grads.isnan(), 0.0);
    densify_and_clone(grads, max_grad, extent);
    densify_and_split(grads, max_grad, extent, 2);
    auto prune_mask = (get_opacity() < min_opacity).squeeze(1);
    if (max_screen > 0) {
      auto big_ws = std::get<0>(get_scaling().max(1)).gt(extent * 0.1);  // LOOKALIKE: tensor-device-mismatch -- extent is a 0-dim host tensor, which may mix with device tensors
      prune_mask = prune_mask.logical_or(max_radii2d > max_screen).logical_or(big_ws);
    }
    auto keep = prune_mask;
    // FACT: m = torch.tensor([True, False, True]); k = m; k.logical_not_(); assert shares_storage(k, m) and m.sum() == 1
    keep.logical_not_();  // EXPECT: tensor-alias-then-mutate
    prune_points(keep);
    std::cout << "densify: pruned " << prune_mask.sum().item<int64_t>() << ", " << xyz.size(0) << " left\n";
  }

  void reset_opacity() {
    torch::NoGradGuard no_grad;
    opacity.copy_(inverse_sigmoid(torch::clamp_max(get_opacity(), 0.01)));  // LOOKALIKE: tensor-inplace-on-leaf -- written under the NoGradGuard at the top of the function
    auto& st = adam_state(3);
    auto m = st.exp_avg();
    // FACT: s = {"m": torch.ones(3)}; m = s["m"]; m.zero_(); assert shares_storage(m, s["m"]) and s["m"].sum() == 0
    m.zero_();  // LOOKALIKE: tensor-alias-then-mutate -- clearing the optimiser's stored moment through the handle is the intent
    st.exp_avg_sq().zero_();
  }

  void export_attributes(const std::string& path) const {
    torch::NoGradGuard no_grad;
    // FACT: f = torch.randn(5,1,3); assert is_view_of(f.transpose(1,2).flatten(1), f)
    auto dc = f_dc.detach().transpose(1, 2).flatten(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- the DC band has one coefficient, so the transpose only moves a size-1 dim and flatten is a view
    // FACT: f = torch.randn(5,15,3); assert is_copy_of(f.transpose(1,2).flatten(1), f)
    auto rest = f_rest.detach().transpose(1, 2).flatten(1);  // EXPECT: tensor-reshape-non-contiguous
    auto table = torch::cat({xyz.detach(), dc, rest, opacity.detach(), scaling.detach(), rotation.detach()}, 1)
                     .to(torch::kCPU).contiguous();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(table.data_ptr<float>()), table.numel() * sizeof(float));
  }

  torch::Tensor xyz, f_dc, f_rest, scaling, rotation, opacity;
  torch::Tensor xyz_grad_accum, denom, max_radii2d;
  std::unique_ptr<torch::optim::Adam> optimizer;
  int64_t active_sh_degree = 0, max_sh_degree;

 private:
  std::array<torch::Tensor*, 6> param_slots() { return {&xyz, &f_dc, &f_rest, &opacity, &scaling, &rotation}; }
  void reset_stats(int64_t n) {
    xyz_grad_accum = torch::zeros({n, 1}, xyz.options());
    denom = torch::zeros({n, 1}, xyz.options());
    max_radii2d = torch::zeros({n}, xyz.options());
  }

  torch::optim::AdamParamState& adam_state(size_t g) {
    const auto& p = optimizer->param_groups()[g].params()[0];
    auto& st = optimizer->state().at(c10::guts::to_string(p.unsafeGetTensorImpl()));
    return static_cast<torch::optim::AdamParamState&>(*st);
  }

  // Swap group g's parameter for `fresh`, carrying Adam's moments through `fn`.
  torch::Tensor replace_in_optimizer(size_t g, torch::Tensor fresh,
                                     const std::function<torch::Tensor(const torch::Tensor&)>& fn) {
    auto& group = optimizer->param_groups()[g];
    auto& states = optimizer->state();
    auto it = states.find(c10::guts::to_string(group.params()[0].unsafeGetTensorImpl()));
    fresh.requires_grad_();
    if (it != states.end()) {
      auto& old = static_cast<torch::optim::AdamParamState&>(*it->second);
      auto moved = std::make_unique<torch::optim::AdamParamState>();
      moved->step(old.step());
      moved->exp_avg(fn(old.exp_avg()));
      moved->exp_avg_sq(fn(old.exp_avg_sq()));
      states.erase(it);
      states[c10::guts::to_string(fresh.unsafeGetTensorImpl())] = std::move(moved);
    }
    group.params()[0] = fresh;
    return fresh;
  }

  void densification_postfix(const std::array<torch::Tensor, 6>& ext) {
    auto slots = param_slots();
    for (size_t g = 0; g < slots.size(); ++g) {
      const auto& e = ext[g];
      *slots[g] = replace_in_optimizer(g, torch::cat({slots[g]->detach(), e}), [&e](const torch::Tensor& s) {
        return torch::cat({s, torch::zeros(e.sizes())});  // EXPECT: tensor-device-mismatch
      });
    }
    reset_stats(xyz.size(0));
  }

  void prune_points(const torch::Tensor& keep) {
    auto slots = param_slots();
    for (size_t g = 0; g < slots.size(); ++g) {
      *slots[g] = replace_in_optimizer(g, slots[g]->detach().index({keep}),
                                       [&keep](const torch::Tensor& s) { return s.index({keep}); });
    }
    xyz_grad_accum = xyz_grad_accum.index({keep});
    denom = denom.index({keep});
    max_radii2d = max_radii2d.index({keep});
  }

  void densify_and_clone(const torch::Tensor& grads, double threshold, const torch::Tensor& extent) {
    auto selected = grads.norm(2, -1).ge(threshold).logical_and(
        std::get<0>(get_scaling().max(1)).le(extent * percent_dense));
    auto new_xyz = xyz.index({selected}).clone();  // EXPECT: tensor-unnecessary-clone
    densification_postfix({new_xyz, f_dc.index({selected}), f_rest.index({selected}), opacity.index({selected}),
                           scaling.index({selected}), rotation.index({selected})});
  }

  void densify_and_split(const torch::Tensor& grads, double threshold, const torch::Tensor& extent, int64_t N) {
    auto padded = torch::zeros({xyz.size(0)}, grads.options());
    padded.narrow(0, 0, grads.size(0)).copy_(grads.squeeze(1));
    auto selected = padded.ge(threshold).logical_and(std::get<0>(get_scaling().max(1)).gt(extent * percent_dense));
    auto stds = get_scaling().index({selected}).repeat({N, 1});
    auto samples = torch::randn_like(stds).mul_(stds);
    auto rots = build_rotation(rotation.index({selected})).repeat({N, 1, 1});
    auto new_xyz = xyz.index({selected}).repeat({N, 1});
    // FACT: x = torch.randn(4,3); r = x.repeat(2,1); r.add_(1.0); assert is_copy_of(r, x) and is_contiguous(r)
    new_xyz.add_(torch::bmm(rots, samples.unsqueeze(-1)).squeeze(-1));  // LOOKALIKE: tensor-inplace-on-expanded -- repeat() materialises every copy, unlike expand()
    densification_postfix({new_xyz, f_dc.index({selected}).repeat({N, 1, 1}), f_rest.index({selected}).repeat({N, 1, 1}),
                           opacity.index({selected}).repeat({N, 1}), torch::log(stds / (0.8 * N)),
                           rotation.index({selected}).repeat({N, 1})});
    const int64_t added = N * selected.sum().item<int64_t>();
    prune_points(torch::cat({selected, torch::zeros({added}, selected.options())}).logical_not());
  }

  double percent_dense = 0.01;
  torch::Device device_;
};

torch::Tensor eval_sh(int64_t deg, const torch::Tensor& sh, const torch::Tensor& dirs) {
  auto result = kC0 * sh.select(2, 0);
  if (deg > 0) {
    auto x = dirs.narrow(1, 0, 1), y = dirs.narrow(1, 1, 1), z = dirs.narrow(1, 2, 1);
    result = result - kC1 * y * sh.select(2, 1) + kC1 * z * sh.select(2, 2) - kC1 * x * sh.select(2, 3);
  }
  return result;
}

RasterOut render(const Camera& cam, GaussianModel& g, const torch::Tensor& bg) {
  auto screen = torch::zeros_like(g.xyz, torch::TensorOptions().requires_grad(true)) + 0;
  screen.retain_grad();
  auto feats = g.get_features();
  // FACT: f = torch.randn(5,16,3); assert is_view_of(f.transpose(1,2).view(-1,3,16), f)
  auto shs_view = feats.transpose(1, 2).view({-1, 3, feats.size(1)});  // LOOKALIKE: tensor-view-non-contiguous -- the view keeps every transposed dim as it is, nothing is merged
  auto dirs = g.xyz - cam.center;
  dirs = dirs / dirs.norm(2, 1, true);
  auto colors = torch::clamp_min(eval_sh(g.active_sh_degree, shs_view, dirs) + 0.5, 0.0);
  return rasterize_gaussians(cam, g.xyz, screen, colors, g.get_opacity(), g.get_scaling(), g.rotation, bg);
}

void train(GaussianModel& g, const std::vector<Camera>& cams, const DensifyConfig& cfg, torch::Device device) {
  std::vector<torch::Tensor> centers;
  for (const auto& c : cams) centers.push_back(c.center.cpu());
  auto all_centers = torch::stack(centers);  // NeRF++-style scene radius
  const auto extent = 1.1 * (all_centers - all_centers.mean(0, true)).norm(2, 1).max();
  g.training_setup(cfg, extent.item<double>());
  auto background = torch::tensor({1.0f, 1.0f, 1.0f});
  const int64_t W = cfg.psnr_window;
  auto psnr_window = torch::zeros({W}, torch::TensorOptions().device(device));
  auto snapshot = g.xyz.detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- Adam rewrites xyz in place every step, the snapshot must own its storage
  double ema_loss = 0.0;
  std::mt19937 rng(0);
  std::uniform_int_distribution<size_t> pick(0, cams.size() - 1);
  for (int64_t it = 1; it <= cfg.iterations; ++it) {
    if (it % 1000 == 0 && g.active_sh_degree < g.max_sh_degree) ++g.active_sh_degree;
    const auto& cam = cams[pick(rng)];
    auto gt = cam.image.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different camera's image every iteration
    auto alpha = cam.alpha.to(device);
    auto bg = background.to(device);  // EXPECT: tensor-clone-in-loop
    auto fill = bg.view({3, 1, 1}).expand_as(gt);
    // FACT: f = torch.ones(3).view(3,1,1).expand(3,4,5); assert raises(lambda: f.mul_(torch.rand(1,4,5)), "more than one element")
    fill.mul_(1.0 - alpha);  // EXPECT: tensor-inplace-on-expanded
    gt = gt * alpha + fill;
    auto out = render(cam, g, bg);
    auto loss = torch::l1_loss(out.image, gt);
    loss.backward();
    torch::NoGradGuard no_grad;
    ema_loss = 0.4 * loss.item<double>() + 0.6 * ema_loss;  // EXPECT: tensor-sync-in-loop
    // FACT: w = torch.zeros(6); assert raises(lambda: w.narrow(0,0,5).copy_(w.narrow(0,1,5)), "single memory location")
    psnr_window.narrow(0, 0, W - 1).copy_(psnr_window.narrow(0, 1, W - 1));  // EXPECT: tensor-inplace-overlap
    psnr_window[W - 1] = -10.0 * torch::log10((out.image - gt).pow(2).mean());
    if (it % 100 == 0) {
      std::cout << "it " << it << " loss " << ema_loss << " psnr " << psnr_window.mean().item<double>()
                << " n " << g.xyz.size(0) << std::endl;
    }
    if (it == cfg.densify_from) {
      std::cout << "warm-up drift " << (g.xyz.detach() - snapshot).norm(2, 1).mean().item<double>() << std::endl;
    }
    if (it < cfg.densify_until) {
      auto visible = out.radii > 0;
      g.max_radii2d.index_put_({visible}, torch::max(g.max_radii2d.index({visible}),
                                                     out.radii.index({visible}).to(torch::kFloat)));
      g.add_densification_stats(out.viewspace_points.grad(), visible);
      if (it > cfg.densify_from && it % cfg.densify_every == 0) {
        g.densify_and_prune(cfg.grad_threshold, cfg.min_opacity, extent, it > cfg.opacity_reset_every ? 20 : 0);
      }
      if (it % cfg.opacity_reset_every == 0) g.reset_opacity();
    }
    g.optimizer->step();
    g.optimizer->zero_grad();
  }
  g.export_attributes("point_cloud.bin");
}

}  // namespace gs

int main(int argc, char** argv) {
  const std::string scene = argc > 1 ? argv[1] : "data/garden";
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  gs::DensifyConfig cfg;
  gs::GaussianModel gaussians(cfg.sh_degree, device);
  gaussians.create_from_pcd(gs::load_points3d(scene));
  gs::train(gaussians, gs::load_cameras(scene, device), cfg, device);
  return 0;
}
