// Differentiable 3-D Gaussian splatting in plain LibTorch ops: projection, per-tile
// front-to-back alpha compositing and a small photometric fitting loop.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <tuple>
#include <vector>

namespace nn = torch::nn;

struct SplatConfig {
  int64_t width = 256;
  int64_t height = 192;
  int64_t tile = 16;
  double near_plane = 0.2;
  double lowpass = 0.3;        // dilation added to the 2-D covariance (anti-aliasing)
  double max_scale = 0.5;
  int64_t iterations = 3000;
  int64_t opacity_reset_every = 1000;
  double lr = 1e-2;
};

struct Camera {
  torch::Tensor viewmat;  // [4, 4] world -> camera
  double fx = 0, fy = 0, cx = 0, cy = 0;
};

struct GaussiansImpl : nn::Module {
  explicit GaussiansImpl(const torch::Tensor& init_points) {
    const auto n = init_points.size(0);
    means = register_parameter("means", init_points.clone()); // LOOKALIKE: tensor-unnecessary-clone -- the copy becomes the parameter; it must not share the caller's point cloud
    log_scales = register_parameter("log_scales", torch::full({n, 3}, -3.0));
    quats = register_parameter("quats", torch::cat({torch::ones({n, 1}), torch::zeros({n, 3})}, 1));
    opacity_logits = register_parameter("opacity_logits", torch::full({n, 1}, -2.0));
    colors = register_parameter("colors", torch::rand({n, 3}));
  }
  torch::Tensor means, log_scales, quats, opacity_logits, colors;
};
TORCH_MODULE(Gaussians);

torch::Tensor quat_to_rotmat(const torch::Tensor& quats) {
  auto q = quats / quats.norm(2, -1, /*keepdim=*/true);
  auto w = q.select(1, 0), x = q.select(1, 1), y = q.select(1, 2), z = q.select(1, 3);
  auto R = torch::stack({1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                         2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                         2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)}, -1);
  return R.view({-1, 3, 3});
}

torch::Tensor look_at(const torch::Tensor& eye, const torch::Tensor& target) {
  auto fwd = target - eye;
  fwd = fwd / fwd.norm();
  auto right = torch::cross(torch::tensor({0.f, 1.f, 0.f}), fwd, 0);
  right = right / right.norm();
  auto down = torch::cross(fwd, right, 0);
  auto R = torch::stack({right, down, fwd});
  auto view = torch::eye(4);
  view.narrow(0, 0, 3).narrow(1, 0, 3).copy_(R);
  view.narrow(0, 0, 3).select(1, 3).copy_(-R.matmul(eye));
  return view;
}

// Small pose jitter used as augmentation while fitting.
Camera perturb_camera(const Camera& cam, const torch::Tensor& delta_t) {
  Camera out = cam;
  auto t = out.viewmat.narrow(0, 0, 3).select(1, 3);
  // FACT: v = torch.eye(4); w = v; t = w.narrow(0, 0, 3).select(1, 3); t += torch.ones(3); assert v[0, 3] == 1
  t += delta_t; // EXPECT: tensor-alias-then-mutate
  return out;
}

struct Projected {
  torch::Tensor uv;      // [N, 2] pixel centres
  torch::Tensor depth;   // [N]
  torch::Tensor conic;   // [N, 3] inverse 2-D covariance (a, b, c)
  torch::Tensor radius;  // [N] 3-sigma extent in pixels
};

Projected project_gaussians(const Gaussians& g, const Camera& cam, const SplatConfig& cfg) {
  const auto N = g->means.size(0);
  auto R_wc = cam.viewmat.narrow(0, 0, 3).narrow(1, 0, 3);
  auto t_wc = cam.viewmat.narrow(0, 0, 3).select(1, 3);
  auto p_cam = torch::matmul(g->means, R_wc.t()) + t_wc;
  auto x = p_cam.select(1, 0), y = p_cam.select(1, 1);
  auto z = p_cam.select(1, 2).clamp_min(cfg.near_plane);
  auto uv = torch::stack({cam.fx * x / z + cam.cx, cam.fy * y / z + cam.cy}, -1);

  auto rot = quat_to_rotmat(g->quats);
  auto M = rot * torch::exp(g->log_scales).unsqueeze(1);  // R * diag(s)
  auto cov3d = torch::matmul(M, M.transpose(1, 2));

  auto zero = torch::zeros_like(z);
  auto J = torch::stack({cam.fx / z, zero, -cam.fx * x / (z * z),
                         zero, cam.fy / z, -cam.fy * y / (z * z)}, -1).view({N, 2, 3});
  auto T = torch::matmul(J, R_wc);
  auto cov2d = torch::matmul(torch::matmul(T, cov3d), T.transpose(1, 2));
  auto a = cov2d.select(2, 0).select(1, 0) + cfg.lowpass;
  auto b = cov2d.select(2, 1).select(1, 0);
  auto c = cov2d.select(2, 1).select(1, 1) + cfg.lowpass;
  auto det = a * c - b * b;
  auto mid = 0.5 * (a + c);
  auto lambda_max = mid + torch::sqrt((mid * mid - det).clamp_min(0.1));
  return {uv, p_cam.select(1, 2), torch::stack({c / det, -b / det, a / det}, -1), 3.0 * torch::sqrt(lambda_max)};
}

torch::Tensor tile_pixel_centers(int64_t x0, int64_t y0, int64_t tw, int64_t th, const torch::TensorOptions& opts) {
  auto xs = torch::arange(tw, opts) + (x0 + 0.5);
  auto ys = torch::arange(th, opts) + (y0 + 0.5);
  auto gx = xs.unsqueeze(0).expand({th, tw});
  auto gy = ys.unsqueeze(1).expand({th, tw});
  // FACT: gx = torch.arange(4.).unsqueeze(0).expand(3, 4); assert raises(lambda: gx.view(-1), "view size is not compatible")
  return torch::stack({gx.view({-1}), gy.view({-1})}, -1); // EXPECT: tensor-view-non-contiguous
}

// Largest blending weight each (depth-sorted) gaussian reached over a tile's pixels.
torch::Tensor max_blend_weight(const torch::Tensor& alpha) {
  torch::NoGradGuard no_grad;
  const auto M = alpha.size(0);
  auto trans = (1 - alpha).cumprod(0);
  // exclusive product: shift every row down by one
  // FACT: t = torch.rand(4, 5); assert raises(lambda: t.narrow(0, 1, 3).copy_(t.narrow(0, 0, 3)), "some elements of the input tensor")
  trans.narrow(0, 1, M - 1).copy_(trans.narrow(0, 0, M - 1)); // EXPECT: tensor-inplace-overlap
  trans.select(0, 0).fill_(1.0);
  return (alpha * trans).amax(1);
}

class TileRasterizer {
 public:
  explicit TileRasterizer(const SplatConfig& cfg) : cfg_(cfg) {}

  void begin_stats(int64_t n, torch::Device device) { contrib_ = torch::zeros({n}, torch::TensorOptions().device(device)); }
  const torch::Tensor& contribution() const { return contrib_; }

  torch::Tensor render(const Gaussians& g, const Camera& cam, const torch::Tensor& background) {
    const auto H = cfg_.height, W = cfg_.width, ts = cfg_.tile;
    auto proj = project_gaussians(g, cam, cfg_);
    auto in_front = (proj.depth > cfg_.near_plane).to(torch::kFloat).unsqueeze(1);
    auto opacity = torch::sigmoid(g->opacity_logits);
    opacity.mul_(in_front); // EXPECT: tensor-inplace-on-saved

    auto order = std::get<1>(proj.depth.sort());
    auto uv = proj.uv.index_select(0, order);
    auto conic = proj.conic.index_select(0, order);
    auto opac = opacity.index_select(0, order);
    auto rgb = g->colors.index_select(0, order);

    auto rect = torch::empty({uv.size(0), 4}, torch::TensorOptions().dtype(torch::kLong).device(uv.device()));
    {
      torch::NoGradGuard no_grad;
      auto r = proj.radius.index_select(0, order).unsqueeze(1);
      rect.narrow(1, 0, 2).copy_(((uv - r) / static_cast<double>(ts)).floor().clamp_min(0)); // LOOKALIKE: tensor-copy-narrowing -- floor() then an integer bound: whole numbers
      rect.narrow(1, 2, 2).copy_(((uv + r) / static_cast<double>(ts)).floor());
    }

    auto canvas = background.view({1, 1, 3}).expand({H, W, 3}).clone();
    const auto tiles_x = (W + ts - 1) / ts, tiles_y = (H + ts - 1) / ts;
    for (int64_t ty = 0; ty < tiles_y; ++ty) {
      for (int64_t tx = 0; tx < tiles_x; ++tx) {
        const auto x0 = tx * ts, y0 = ty * ts;
        const auto tw = std::min(ts, W - x0), th = std::min(ts, H - y0);
        auto hit = (rect.select(1, 0) <= tx) & (rect.select(1, 2) >= tx) & (rect.select(1, 1) <= ty) &
                   (rect.select(1, 3) >= ty);
        auto sel = hit.nonzero().squeeze(1);
        if (sel.numel() == 0) continue;  // nothing here: the tile keeps the background

        auto pix = tile_pixel_centers(x0, y0, tw, th, uv.options());
        auto d = pix.unsqueeze(0) - uv.index_select(0, sel).unsqueeze(1);  // [M, P, 2]
        auto dx = d.select(2, 0), dy = d.select(2, 1);
        auto cs = conic.index_select(0, sel);
        auto power = -0.5 * (cs.select(1, 0).unsqueeze(1) * dx * dx + cs.select(1, 2).unsqueeze(1) * dy * dy) -
                     cs.select(1, 1).unsqueeze(1) * dx * dy;
        auto alpha = opac.index_select(0, sel) * torch::exp(power.clamp_max(0.0));
        // FACT: o = torch.rand(3, 1, requires_grad=True); a = o * torch.exp(torch.randn(3, 4, requires_grad=True)); a.clamp_max_(0.99); (a * 2).sum().backward()
        alpha.clamp_max_(0.99); // LOOKALIKE: tensor-inplace-on-saved -- mul saved its operands, not its result
        if (contrib_.defined()) contrib_.index_add_(0, order.index_select(0, sel), max_blend_weight(alpha.detach()));

        auto trans = torch::cat({torch::ones({1, alpha.size(1)}, alpha.options()), (1 - alpha).cumprod(0)}, 0);
        auto weights = alpha * trans.narrow(0, 0, alpha.size(0));
        auto color = weights.t().matmul(rgb.index_select(0, sel)) + trans.select(0, -1).unsqueeze(1) * background;
        // FACT: w = torch.rand(5, 12); out = w.t().matmul(torch.rand(5, 3)) + torch.rand(12, 1) * torch.rand(3); assert is_view_of(out.view(3, 4, 3), out)
        auto tile_img = color.view({th, tw, 3}); // LOOKALIKE: tensor-view-non-contiguous -- the sum is a fresh contiguous tensor, whatever w.t() was
        // FACT: bg = torch.rand(3); c = bg.view(1, 1, 3).expand(4, 5, 3).clone(); c.narrow(0, 0, 2).narrow(1, 0, 2).copy_(torch.zeros(2, 2, 3)); assert c.stride() == (15, 3, 1)
        canvas.narrow(0, y0, th).narrow(1, x0, tw).copy_(tile_img); // LOOKALIKE: tensor-inplace-on-expanded -- canvas is a clone of the expanded background
      }
    }
    return canvas;
  }

 private:
  SplatConfig cfg_;
  torch::Tensor contrib_;
};

// Number of training views in which each gaussian lands inside the image (used to find floaters).
torch::Tensor count_views(const torch::Tensor& means, const std::vector<Camera>& cams, const SplatConfig& cfg) {
  torch::NoGradGuard no_grad;
  const auto C = static_cast<int64_t>(cams.size());
  const auto N = means.size(0);
  std::vector<torch::Tensor> mats;
  for (const auto& cam : cams) mats.push_back(cam.viewmat);
  auto viewmats = torch::stack(mats);
  auto means_h = torch::cat({means, torch::ones({N, 1}, means.options())}, 1);
  auto cam_pts = torch::matmul(viewmats, means_h.t()).transpose(1, 2);  // [C, N, 4]
  // FACT: m = torch.randn(3, 4, 4).matmul(torch.randn(4, 6)).transpose(1, 2); assert is_copy_of(m.reshape(18, 4), m)
  auto flat = cam_pts.reshape({C * N, 4}); // EXPECT: tensor-reshape-non-contiguous
  auto z = flat.select(1, 2).clamp_min(cfg.near_plane);
  auto u = cams[0].fx * flat.select(1, 0) / z + cams[0].cx;
  auto v = cams[0].fy * flat.select(1, 1) / z + cams[0].cy;
  auto inside = (flat.select(1, 2) > cfg.near_plane) & (u >= 0) & (u < cfg.width) & (v >= 0) & (v < cfg.height);
  return inside.view({C, N}).sum(0);
}

// Penalises a global colour cast: per-channel mean and spread should match the target's.
torch::Tensor channel_stats_loss(const torch::Tensor& pred, const torch::Tensor& gt) {
  // FACT: p = torch.randn(6, 5, 3); assert is_view_of(p.permute(2, 0, 1).view(3, -1), p) and is_view_of(p.permute(2, 0, 1).reshape(3, -1), p)
  auto pc = pred.permute({2, 0, 1}).view({3, -1}); // LOOKALIKE: tensor-view-non-contiguous -- HWC->CHW keeps H and W adjacent and in order: merging them is a view
  auto gc = gt.permute({2, 0, 1}).reshape({3, -1});
  return torch::mse_loss(pc.mean(1), gc.mean(1)) + torch::mse_loss(pc.std(1), gc.std(1));
}

torch::Tensor to_uint8(const torch::Tensor& img) {
  auto shown = img.clone(); // EXPECT: tensor-unnecessary-clone
  shown.clamp_(0.0, 1.0);
  return shown.mul(255.0).round().to(torch::kByte);
}

void fit(Gaussians& model, const std::vector<Camera>& cams, const std::vector<torch::Tensor>& images,
         const SplatConfig& cfg) {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  std::vector<Camera> cams_d;
  for (auto cam : cams) {
    cam.viewmat = cam.viewmat.to(device);
    cams_d.push_back(cam);
  }
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  TileRasterizer raster(cfg);
  torch::Tensor background = torch::full({3}, 1.0);
  std::vector<float> loss_log;

  for (int64_t it = 0; it < cfg.iterations; ++it) {
    const auto idx = static_cast<size_t>(it) % cams_d.size();
    auto cam = perturb_camera(cams_d[idx], torch::randn({3}, torch::TensorOptions().device(device)) * 1e-3);
    auto gt = images[idx].to(device); // LOOKALIKE: tensor-clone-in-loop -- a different image every step
    auto pred = raster.render(model, cam, background.to(device)); // EXPECT: tensor-clone-in-loop
    auto loss = (pred - gt).abs().mean() + 0.05 * channel_stats_loss(pred, gt);
    opt.zero_grad();
    loss.backward();
    opt.step();
    {
      torch::NoGradGuard no_grad;
      model->quats.div_(model->quats.norm(2, -1, /*keepdim=*/true)); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      auto scales = model->log_scales;
      // FACT: p = torch.nn.Parameter(torch.randn(3)); g = torch.no_grad(); g.__enter__(); s = p; s.clamp_max_(0.0); g.__exit__(None, None, None); assert p.max() <= 0
      scales.clamp_max_(std::log(cfg.max_scale)); // LOOKALIKE: tensor-alias-then-mutate -- a plain handle to the parameter: changing it is the point
    }
    if ((it + 1) % cfg.opacity_reset_every == 0) {
      model->opacity_logits.fill_(-4.6); // EXPECT: tensor-inplace-on-leaf
      raster.begin_stats(model->means.size(0), device);
    }
    loss_log.push_back(loss.item<float>()); // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- a host float keeps no graph
    if (it % 100 == 0) std::cout << "iter " << it << " loss " << loss_log.back() << "\n";
  }
  auto seen = count_views(model->means.detach(), cams_d, cfg);
  auto weak = raster.contribution().defined() ? (raster.contribution() < 0.01).sum().item<int64_t>() : 0;
  std::cout << "never visible: " << (seen == 0).sum().item<int64_t>() << ", low contribution: " << weak << "\n";
}

int main() {
  SplatConfig cfg;
  cfg.iterations = 300;
  cfg.opacity_reset_every = 100;
  Gaussians model(torch::randn({2000, 3}) * 0.5);

  std::vector<Camera> cams;
  std::vector<torch::Tensor> images;
  for (int i = 0; i < 8; ++i) {
    const double ang = 2.0 * M_PI * i / 8.0;
    Camera cam;
    cam.viewmat = look_at(torch::tensor({3.0f * static_cast<float>(std::cos(ang)), 0.5f, 3.0f * static_cast<float>(std::sin(ang))}),
                          torch::zeros({3}));
    cam.fx = cam.fy = 0.8 * cfg.width;
    cam.cx = 0.5 * cfg.width;
    cam.cy = 0.5 * cfg.height;
    cams.push_back(cam);
    images.push_back(torch::rand({cfg.height, cfg.width, 3}));
  }
  fit(model, cams, images, cfg);

  torch::NoGradGuard no_grad;
  TileRasterizer raster(cfg);
  auto preview = to_uint8(raster.render(model, cams[0], torch::ones({3}, model->means.options())).cpu());
  std::cout << "preview " << preview.sizes() << "\n";
  return 0;
}
