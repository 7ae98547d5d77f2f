// Self-supervised monocular depth from rectified stereo pairs, Monodepth2-style: a small
// encoder-decoder predicts disparity at four scales; the other camera's image is warped into the
// target view through the predicted depth and the known baseline; the photometric loss is
// 0.85 * (1 - SSIM) / 2 + 0.15 * L1, with a per-pixel minimum against the un-warped source
// (automasking) and an edge-aware smoothness term on mean-normalised disparity. Evaluation
// median-scales depth against LiDAR; an exporter writes coloured point clouds for the viewer.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct DepthConfig {
  int64_t height = 192, width = 640, num_scales = 4, epochs = 20, log_every = 250;
  double min_depth = 0.1, max_depth = 100.0, max_eval_depth = 80.0;
  double ssim_weight = 0.85, smooth_weight = 1e-3, stereo_baseline = 0.1, lr = 1e-4;
  double fx = 0.58, fy = 1.92, cx = 0.5, cy = 0.5; // KITTI intrinsics, normalised by the image size
};

// A rectified pair in [0, 1]; side is +1 when the source is the right camera, -1 when flipped.
struct StereoBatch {
  torch::Tensor target, source, side; // [B, 3, H, W], [B, 3, H, W], [B]
};

// 4x4 pinhole intrinsics at a given resolution.
torch::Tensor intrinsics(const DepthConfig &cfg, int64_t H, int64_t W) {
  return torch::tensor({{cfg.fx * W, 0.0, cfg.cx * W, 0.0},
                        {0.0, cfg.fy * H, cfg.cy * H, 0.0},
                        {0.0, 0.0, 1.0, 0.0},
                        {0.0, 0.0, 0.0, 1.0}});
}

struct ConvEluImpl : torch::nn::Module {
  ConvEluImpl(int64_t in, int64_t out, int64_t stride = 1) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).padding_mode(torch::kReflect)));
  }
  torch::Tensor forward(const torch::Tensor &x) { return torch::elu(conv(x)); }
  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(ConvElu);

struct DepthNetImpl : torch::nn::Module {
  explicit DepthNetImpl(const DepthConfig &cfg) : min_disp_(1.0 / cfg.max_depth), max_disp_(1.0 / cfg.min_depth) {
    const std::vector<int64_t> enc_ch{32, 64, 128, 256}, dec_ch{16, 32, 64, 128};
    int64_t in = 3;
    for (size_t i = 0; i < enc_ch.size(); ++i) {
      enc_.push_back(register_module("enc" + std::to_string(i), ConvElu(in, enc_ch[i], 2)));
      in = enc_ch[i];
    }
    for (size_t i = 0; i < dec_ch.size(); ++i) {
      const auto up_in = i + 1 < dec_ch.size() ? dec_ch[i + 1] : enc_ch.back();
      const auto skip = i > 0 ? enc_ch[i - 1] : 0;
      up_.push_back(register_module("up" + std::to_string(i), ConvElu(up_in, dec_ch[i])));
      iconv_.push_back(register_module("iconv" + std::to_string(i), ConvElu(dec_ch[i] + skip, dec_ch[i])));
      disp_.push_back(register_module("disp" + std::to_string(i), torch::nn::Conv2d(torch::nn::Conv2dOptions(dec_ch[i], 1, 3).padding(1))));
    }
  }

  // x [B, 3, H, W] -> disparity per scale s ([B, 1, H / 2^s, W / 2^s]) in [1 / max_depth, 1 / min_depth]
  std::vector<torch::Tensor> forward(const torch::Tensor &x) {
    std::vector<torch::Tensor> feats;
    auto h = x;
    for (auto &e : enc_) {
      h = e(h);
      feats.push_back(h);
    }
    std::vector<torch::Tensor> disps(disp_.size());
    for (int64_t i = static_cast<int64_t>(disp_.size()) - 1; i >= 0; --i) {
      h = F::interpolate(up_[i](h), F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
      if (i > 0)
        h = torch::cat({h, feats[i - 1]}, 1);
      h = iconv_[i](h);
      auto disp = torch::sigmoid(disp_[i](h));
      // FACT: c = torch.nn.Conv2d(4, 1, 3, padding=1); d = torch.sigmoid(c(torch.randn(2, 4, 8, 8))); d.mul_(9.99).add_(0.01); assert backward_fails(lambda: d.sum().backward())
      disp.mul_(max_disp_ - min_disp_).add_(min_disp_); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its output for backward
      disps[i] = disp;
    }
    return disps;
  }

  double min_disp_, max_disp_;
  std::vector<ConvElu> enc_, up_, iconv_;
  std::vector<torch::nn::Conv2d> disp_;
};
TORCH_MODULE(DepthNet);

struct SSIMImpl : torch::nn::Module {
  SSIMImpl() {
    pool = register_module("pool", torch::nn::AvgPool2d(torch::nn::AvgPoolOptions<2>(3).stride(1)));
    pad = register_module("pad", torch::nn::ReflectionPad2d(1));
  }
  // (1 - SSIM) / 2 per pixel and channel, over 3x3 windows.
  torch::Tensor forward(const torch::Tensor &a, const torch::Tensor &b) {
    auto x = pad(a), y = pad(b);
    auto mu_x = pool(x), mu_y = pool(y);
    auto sigma_x = pool(x * x) - mu_x * mu_x;
    auto sigma_y = pool(y * y) - mu_y * mu_y;
    auto sigma_xy = pool(x * y) - mu_x * mu_y;
    auto num = (2 * mu_x * mu_y + kC1) * (2 * sigma_xy + kC2);
    auto den = (mu_x * mu_x + mu_y * mu_y + kC1) * (sigma_x + sigma_y + kC2);
    return torch::clamp((1 - num / den) / 2, 0, 1);
  }
  static constexpr double kC1 = 0.01 * 0.01, kC2 = 0.03 * 0.03;
  torch::nn::AvgPool2d pool{nullptr};
  torch::nn::ReflectionPad2d pad{nullptr};
};
TORCH_MODULE(SSIM);

torch::Tensor reprojection_loss(SSIM &ssim, const torch::Tensor &pred, const torch::Tensor &target, double alpha) {
  auto l1 = (target - pred).abs().mean(1, true);
  auto s = ssim(pred, target).mean(1, true);
  return alpha * s + (1 - alpha) * l1;
}

// Edge-aware smoothness: disparity gradients, down-weighted where the image has edges.
torch::Tensor smooth_loss(const torch::Tensor &disp, const torch::Tensor &img) {
  const auto h = disp.size(2), w = disp.size(3);
  auto gdx = (disp.narrow(3, 0, w - 1) - disp.narrow(3, 1, w - 1)).abs();
  auto gdy = (disp.narrow(2, 0, h - 1) - disp.narrow(2, 1, h - 1)).abs();
  auto gix = (img.narrow(3, 0, w - 1) - img.narrow(3, 1, w - 1)).abs().mean(1, true);
  auto giy = (img.narrow(2, 0, h - 1) - img.narrow(2, 1, h - 1)).abs().mean(1, true);
  // FACT: d = torch.rand(2, 1, 4, 5, requires_grad=True); g = (d[..., :-1] - d[..., 1:]).abs(); g *= torch.exp(-torch.rand(2, 1, 4, 4)); g.mean().backward(); assert d.grad is not None
  gdx *= torch::exp(-gix); // LOOKALIKE: tensor-inplace-on-saved -- abs saved its input (the difference), not its result
  gdy *= torch::exp(-giy);
  return gdx.mean() + gdy.mean();
}

void train(DepthNet &net, const std::vector<StereoBatch> &data, const DepthConfig &cfg) {
  torch::Device device(torch::kCUDA);
  net->to(device);
  net->train();
  SSIM ssim;
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> brightness(0.8, 1.2);

  const auto H = cfg.height, W = cfg.width;
  auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
  auto K = intrinsics(cfg, H, W);
  auto inv_K = torch::inverse(K);
  auto xs = torch::arange(W, opts).repeat({H});
  auto ys = torch::arange(H, opts).repeat_interleave(W);
  auto pix = torch::stack({xs, ys, torch::ones({H * W}, opts)}); // homogeneous pixel coordinates [3, H*W]

  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    for (const auto &batch : data) {
      auto target = batch.target.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new pair every step
      auto source = batch.source.to(device);
      const auto B = target.size(0);

      // colour augmentation for the network input only: the losses compare un-augmented images
      auto net_in = target.detach();
      // FACT: t = torch.rand(2, 3, 4, 4); t0 = t.clone(); a = t.detach(); a.mul_(1.2).clamp_(0, 1); assert shares_storage(a, t) and not torch.equal(t, t0)
      net_in.mul_(brightness(rng)).clamp_(0, 1); // EXPECT: tensor-inplace-on-detached -- detach shares the target's storage: the photometric loss compares against the jittered image
      auto disps = net->forward(net_in);

      auto inv_K_d = inv_K.to(device); // EXPECT: tensor-clone-in-loop -- the same inverse intrinsics are copied to the GPU at every step
      auto rays = inv_K_d.narrow(0, 0, 3).narrow(1, 0, 3).matmul(pix); // [3, H*W]

      // the other camera: no rotation, shifted by the baseline along x
      auto T = torch::eye(4, opts).unsqueeze(0).expand({B, 4, 4});
      // FACT: T = torch.eye(4).unsqueeze(0).expand(3, 4, 4); assert raises(lambda: T.select(1, 0).select(1, 3).copy_(torch.tensor([0.1, -0.1, 0.1])), "more than one element of the written-to tensor refers to a single memory location")
      T.select(1, 0).select(1, 3).copy_(batch.side.to(device) * cfg.stereo_baseline); // EXPECT: tensor-inplace-on-expanded -- every sample's pose is the one identity matrix: B different baselines go into one memory location
      auto P = K.matmul(T).narrow(1, 0, 3); // EXPECT: tensor-device-mismatch -- K was built on the host, the poses on the GPU

      auto identity = reprojection_loss(ssim, source, target, cfg.ssim_weight);
      identity += torch::randn(identity.sizes(), identity.options()) * 1e-5; // LOOKALIKE: tensor-device-mismatch -- the tie-breaking noise is made with the loss's options, on its device

      auto total = torch::zeros({}, opts);
      for (int64_t s = 0; s < cfg.num_scales; ++s) {
        auto up = F::interpolate(disps[s], F::InterpolateFuncOptions().size(std::vector<int64_t>{H, W}).mode(torch::kBilinear).align_corners(false));
        auto depth = 1.0 / up;
        // FACT: d = 1.0 / torch.nn.functional.interpolate(torch.rand(2, 1, 4, 5) + 0.1, size=(8, 10), mode='bilinear', align_corners=False); assert is_view_of(d.view(2, 1, -1), d)
        auto cam = depth.view({B, 1, -1}) * rays; // LOOKALIKE: tensor-view-non-contiguous -- the upsampled depth is contiguous
        auto cam_h = torch::cat({cam, torch::ones({B, 1, H * W}, opts)}, 1); // [B, 4, H*W]
        auto proj = P.matmul(cam_h);
        auto pix_coords = proj.narrow(1, 0, 2) / (proj.narrow(1, 2, 1) + 1e-7);
        // FACT: c = torch.randn(2, 3, 20); q = c[:, :2] / (c[:, 2:3] + 1e-7); assert is_view_of(q.view(2, 2, 4, 5), q)
        auto grid = pix_coords.view({B, 2, H, W}).permute({0, 2, 3, 1}); // LOOKALIKE: tensor-view-non-contiguous -- the quotient is a fresh contiguous tensor, viewed before the permute
        // FACT: c = torch.randn(2, 3, 20, requires_grad=True); q = c[:, :2] / (c[:, 2:3] + 1e-7); g = q.view(2, 2, 4, 5).permute(0, 2, 3, 1); g[..., 0].div_(4); g[..., 1].div_(3); g.sum().backward(); assert c.grad is not None
        grid.select(3, 0).div_(W - 1); // LOOKALIKE: tensor-inplace-on-saved -- division saves its operands, not its quotient
        grid.select(3, 1).div_(H - 1);
        auto warped = F::grid_sample(source, (grid - 0.5) * 2,
                                     F::GridSampleFuncOptions().padding_mode(torch::kBorder).align_corners(false));
        auto reproj = reprojection_loss(ssim, warped, target, cfg.ssim_weight);
        auto per_pixel = std::get<0>(torch::cat({identity, reproj}, 1).min(1));

        auto color = F::interpolate(target, F::InterpolateFuncOptions()
                                                .size(std::vector<int64_t>{disps[s].size(2), disps[s].size(3)})
                                                .mode(torch::kArea));
        auto norm_disp = disps[s] / (disps[s].mean({2, 3}, true) + 1e-7);
        auto scale_loss = per_pixel.mean() + cfg.smooth_weight * smooth_loss(norm_disp, color) / std::pow(2.0, s);
        total += scale_loss / cfg.num_scales; // LOOKALIKE: tensor-graph-kept-across-iterations -- summed over the scales, then differentiated below
      }
      opt.zero_grad();
      total.backward();
      opt.step();
      if (++step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << total.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once every log_every steps
    }
  }
}

struct DepthMetrics {
  double abs_rel = 0, rmse = 0, a1 = 0;
};

double mean_of(const std::vector<double> &v) { return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size(); }

// Median-scaled metrics against sparse LiDAR depth (0 where there is no return).
DepthMetrics evaluate(DepthNet &net, const std::vector<torch::Tensor> &images, const std::vector<torch::Tensor> &gt_depths,
                      const DepthConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  std::vector<double> abs_rel, rmse, a1;
  for (size_t i = 0; i < images.size(); ++i) {
    auto gt = gt_depths[i].to(device); // [1, 1, Hg, Wg]
    auto disp = net->forward(images[i].to(device))[0];
    auto pred = 1.0 / F::interpolate(disp, F::InterpolateFuncOptions()
                                               .size(std::vector<int64_t>{gt.size(2), gt.size(3)})
                                               .mode(torch::kBilinear)
                                               .align_corners(false));
    auto valid = gt.gt(cfg.min_depth).logical_and(gt.lt(cfg.max_eval_depth));
    auto g = gt.masked_select(valid);
    auto p = pred.masked_select(valid);
    // FACT: d = torch.rand(1, 1, 4, 4) + 0.1; d0 = d.clone(); p = d.masked_select(d > 0.5); p *= 2.0; assert is_copy_of(p, d) and torch.equal(d, d0)
    p *= g.median() / p.median(); // LOOKALIKE: tensor-alias-then-mutate -- masked_select copies: the predicted map is untouched
    p.clamp_(cfg.min_depth, cfg.max_eval_depth);
    auto ratio = torch::max(g / p, p / g);
    abs_rel.push_back(((p - g).abs() / g).mean().item<double>()); // LOOKALIKE: tensor-sync-in-loop -- per-image values kept for the report
    rmse.push_back((p - g).pow(2).mean().sqrt().item<double>());
    a1.push_back(ratio.lt(1.25).to(torch::kFloat).mean().item<double>());
  }
  return {mean_of(abs_rel), mean_of(rmse), mean_of(a1)};
}

// Coloured point cloud of a batch, [B * H * W, 6]: xyz in metres, rgb in [0, 1].
torch::Tensor point_cloud(const torch::Tensor &depth, const torch::Tensor &images, const torch::Tensor &inv_K) {
  const auto B = depth.size(0), H = depth.size(2), W = depth.size(3);
  auto opts = depth.options();
  auto xs = torch::arange(W, opts).repeat({H});
  auto ys = torch::arange(H, opts).repeat_interleave(W);
  auto pix = torch::stack({xs, ys, torch::ones({H * W}, opts)}, 1); // [H*W, 3]
  auto rays = pix.matmul(inv_K.narrow(0, 0, 3).narrow(1, 0, 3).t());
  // FACT: d = torch.rand(2, 1, 4, 5); assert is_view_of(d.reshape(2, -1, 1), d)
  auto xyz = rays * depth.reshape({B, -1, 1}); // LOOKALIKE: tensor-reshape-non-contiguous -- the depth maps are contiguous: a view
  // FACT: b = torch.rand(2, 3, 4, 5); assert is_copy_of(b.permute(0, 2, 3, 1).reshape(-1, 3), b)
  auto rgb = images.permute({0, 2, 3, 1}).reshape({-1, 3}); // EXPECT: tensor-reshape-non-contiguous -- channels-last rows of a batch cannot be a view: the images are copied before the cat copies them again
  // FACT: r = torch.randn(20, 3); x = r * torch.rand(2, 20, 1); assert is_view_of(x.reshape(-1, 3), x)
  return torch::cat({xyz.reshape({-1, 3}), rgb}, 1); // LOOKALIKE: tensor-reshape-non-contiguous -- the broadcast product is a fresh contiguous [B, H*W, 3]
}

int main() {
  DepthConfig cfg;
  std::vector<torch::Tensor> lefts, rights, sides, val_images, val_gt;
  torch::load(lefts, "kitti_eigen_zhou_left.pt");
  torch::load(rights, "kitti_eigen_zhou_right.pt");
  torch::load(sides, "kitti_eigen_zhou_side.pt");
  torch::load(val_images, "kitti_eigen_test_images.pt");
  torch::load(val_gt, "kitti_eigen_test_gt.pt");
  std::vector<StereoBatch> train_set;
  for (size_t i = 0; i < lefts.size(); ++i)
    train_set.push_back({lefts[i], rights[i], sides[i]});

  DepthNet net(cfg);
  train(net, train_set, cfg);
  torch::Device device(torch::kCUDA);
  auto m = evaluate(net, val_images, val_gt, cfg, device);
  std::cout << "abs_rel " << m.abs_rel << " rmse " << m.rmse << " a1 " << m.a1 << "\n";

  torch::NoGradGuard no_grad;
  auto images = val_images[0].to(device);
  auto depth = 1.0 / net->forward(images)[0];
  auto inv_K = torch::inverse(intrinsics(cfg, images.size(2), images.size(3))).to(device);
  torch::save(point_cloud(depth, images, inv_K).cpu(), "cloud_000.pt");
  torch::save(net, "depth_net.pt");
}
