// NeRF-in-the-wild style renderer: coarse and fine MLPs, per-image appearance codes,
// stratified + inverse-transform (pdf) sampling and volume rendering, trained on random
// batches of rays drawn from all images of a photo collection.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct NerfWConfig {
  int64_t n_images = 1;
  int64_t appearance_dim = 48;
  int64_t xyz_freqs = 10, dir_freqs = 4;
  int64_t width = 256, depth = 8, skip = 4;
  int64_t n_coarse = 64, n_fine = 128;
  double noise_std = 1.0;  // sigma regularisation noise while training
  bool perturb = true;
  int64_t batch_rays = 1024;
  int64_t steps = 300000;
  int64_t log_every = 100;
  double lr = 5e-4;
};

torch::Tensor positional_encoding(const torch::Tensor& x, int64_t n_freqs) {
  std::vector<torch::Tensor> parts{x};
  for (int64_t i = 0; i < n_freqs; ++i) {
    const double f = std::pow(2.0, static_cast<double>(i));
    parts.push_back(torch::sin(f * x));
    parts.push_back(torch::cos(f * x));
  }
  return torch::cat(parts, -1);
}

struct NerfMLPImpl : torch::nn::Module {
  NerfMLPImpl(const NerfWConfig& c, bool use_appearance) : skip(c.skip) {
    const int64_t in_xyz = 3 + 6 * c.xyz_freqs, in_dir = 3 + 6 * c.dir_freqs;
    for (int64_t i = 0; i < c.depth; ++i) {
      const int64_t in = i == 0 ? in_xyz : (i == c.skip ? c.width + in_xyz : c.width);
      layers.push_back(register_module("xyz" + std::to_string(i), torch::nn::Linear(in, c.width)));
    }
    sigma_head = register_module("sigma", torch::nn::Linear(c.width, 1));
    feature = register_module("feature", torch::nn::Linear(c.width, c.width));
    const int64_t dir_in = c.width + in_dir + (use_appearance ? c.appearance_dim : 0);
    rgb_hidden = register_module("rgb_hidden", torch::nn::Linear(dir_in, c.width / 2));
    rgb_out = register_module("rgb_out", torch::nn::Linear(c.width / 2, 3));
  }

  // Returns [P, 4]: rgb in [0, 1] and raw (pre-activation) density.
  torch::Tensor forward(const torch::Tensor& xyz_enc, const torch::Tensor& dir_enc,
                        const torch::Tensor& appearance) {
    torch::Tensor h = xyz_enc;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (static_cast<int64_t>(i) == skip) h = torch::cat({xyz_enc, h}, -1);
      h = F::relu(layers[i](h));
    }
    auto sigma = sigma_head(h);
    std::vector<torch::Tensor> rgb_in{feature(h), dir_enc};
    if (appearance.defined()) rgb_in.push_back(appearance);
    auto rgb = torch::sigmoid(rgb_out(F::relu(rgb_hidden(torch::cat(rgb_in, -1)))));
    return torch::cat({rgb, sigma}, -1);
  }

  int64_t skip;
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear sigma_head{nullptr}, feature{nullptr}, rgb_hidden{nullptr}, rgb_out{nullptr};
};
TORCH_MODULE(NerfMLP);

// Depths in [near, far] per ray, jittered inside each bin while training. near/far: [R, 1].
torch::Tensor stratified_depths(const torch::Tensor& near, const torch::Tensor& far, int64_t n, bool perturb) {
  const int64_t R = near.size(0);
  auto t = torch::linspace(0.0, 1.0, n, near.options()).unsqueeze(0).expand({R, n});
  if (perturb) {
    // FACT: t = torch.linspace(0., 1., 8).unsqueeze(0).expand(4, 8); assert raises(lambda: t.add_(torch.rand(4, 8) / 7), "more than one element")
    t.add_(torch::rand({R, n}, near.options()) / static_cast<double>(n - 1));  // EXPECT: tensor-inplace-on-expanded
    t.clamp_max_(1.0);
  }
  return near * (1.0 - t) + far * t;
}

// Inverse-transform sampling of n_samples depths from the piecewise-constant pdf given by
// weights [R, B] over bins [R, B + 1].
torch::Tensor sample_pdf(const torch::Tensor& bins, const torch::Tensor& weights, int64_t n_samples, bool det) {
  const int64_t R = weights.size(0);
  auto pdf = weights / weights.sum(-1, true);
  auto cdf = torch::cumsum(pdf, -1);
  cdf = torch::cat({torch::zeros_like(cdf.narrow(1, 0, 1)), cdf}, -1);  // [R, B + 1]
  const int64_t nb = cdf.size(1);

  torch::Tensor u;
  if (det)
    u = torch::linspace(0.0, 1.0, n_samples, cdf.options()).expand({R, n_samples}).contiguous();
  else
    u = torch::rand({R, n_samples}, cdf.options());
  // Keep u strictly below the last cdf entry so searchsorted never runs past the end.
  // FACT: u = torch.linspace(0., 1., 8).expand(4, 8).contiguous(); u.clamp_(0., 1. - 1e-6); assert is_contiguous(u) and u.stride(0) == 8
  u.clamp_(0.0, 1.0 - 1e-6);  // LOOKALIKE: tensor-inplace-on-expanded -- contiguous() gave the expanded grid memory of its own; rand is dense

  auto inds = torch::searchsorted(cdf, u, /*out_int32=*/false, /*right=*/true);
  auto below = (inds - 1).clamp_min(0);
  auto above = inds.clamp_max(nb - 1);
  auto inds_g = torch::stack({below, above}, -1);  // [R, n, 2]
  // FACT: c = torch.rand(4, 9); e = c.unsqueeze(1).expand(4, 16, 9); g = torch.gather(e, 2, torch.zeros(4, 16, 2, dtype=torch.long)); assert e.stride(1) == 0 and is_copy_of(g, c)
  auto cdf_g = torch::gather(cdf.unsqueeze(1).expand({R, n_samples, nb}), 2, inds_g);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded cdf is only read by gather
  auto bins_g = torch::gather(bins.unsqueeze(1).expand({R, n_samples, nb}), 2, inds_g);

  auto denom = cdf_g.select(-1, 1) - cdf_g.select(-1, 0);
  denom = torch::where(denom < 1e-5, torch::ones_like(denom), denom);
  auto t = (u - cdf_g.select(-1, 0)) / denom;
  return bins_g.select(-1, 0) + t * (bins_g.select(-1, 1) - bins_g.select(-1, 0));
}

struct Composite {
  torch::Tensor rgb, depth, acc, weights;
};

// raw: [R, S, 4]; z_vals: [R, S]; rays_d: [R, 3] (not normalised: deltas become metric).
Composite composite(const torch::Tensor& raw, const torch::Tensor& z_vals, const torch::Tensor& rays_d,
                    double noise_std) {
  const int64_t R = raw.size(0), S = raw.size(1);
  auto deltas = z_vals.narrow(1, 1, S - 1) - z_vals.narrow(1, 0, S - 1);
  deltas = torch::cat({deltas, torch::full({R, 1}, 1e10, deltas.options())}, -1);
  deltas = deltas * rays_d.norm(2, -1, true);

  auto rgb = raw.narrow(-1, 0, 3);
  // FACT: r = torch.randn(4, 5, requires_grad=True); s = torch.relu(r); s.add_(1.0); assert backward_fails(lambda: s.sum().backward())
  auto sigma = torch::relu(raw.select(-1, 3));
  if (noise_std > 0.0)
    sigma.add_(torch::randn_like(sigma) * noise_std);  // EXPECT: tensor-inplace-on-saved
  auto alphas = 1.0 - torch::exp(-deltas * sigma);
  auto ones = torch::ones({R, 1}, alphas.options());
  auto trans = torch::cumprod(torch::cat({ones, 1.0 - alphas + 1e-10}, -1), -1).narrow(1, 0, S);

  Composite out;
  out.weights = alphas * trans;
  out.rgb = (out.weights.unsqueeze(-1) * rgb).sum(-2);
  out.depth = (out.weights * z_vals).sum(-1);
  out.acc = out.weights.sum(-1);
  return out;
}

// Composites a rendered colour over a background colour ([3] or [R, 3]).
torch::Tensor over_background(const torch::Tensor& rgb, const torch::Tensor& acc, const torch::Tensor& bg) {
  return rgb + (1.0 - acc.unsqueeze(-1)) * bg;  // EXPECT: tensor-device-mismatch
}

struct RenderOutput {
  torch::Tensor rgb_coarse, acc_coarse, rgb_fine, acc_fine, depth_fine;
};

struct NerfWRendererImpl : torch::nn::Module {
  explicit NerfWRendererImpl(const NerfWConfig& c) : cfg(c) {
    appearance = register_module("appearance", torch::nn::Embedding(c.n_images, c.appearance_dim));
    coarse = register_module("coarse", NerfMLP(c, false));
    fine = register_module("fine", NerfMLP(c, true));
  }

  torch::Tensor run_mlp(NerfMLP& mlp, const torch::Tensor& pts, const torch::Tensor& viewdirs,
                        const torch::Tensor& app) {
    const int64_t R = pts.size(0), S = pts.size(1);
    // FACT: o = torch.rand(4, 1, 3); d = torch.rand(4, 1, 3); z = torch.rand(4, 6, 1); p = o + d * z; assert is_contiguous(p) and is_view_of(p.reshape(-1, 3), p)
    auto xyz = positional_encoding(pts.reshape({-1, 3}), cfg.xyz_freqs);  // LOOKALIKE: tensor-reshape-non-contiguous -- the sample points are a fresh broadcast result, contiguous: a view
    auto dirs = positional_encoding(viewdirs.repeat_interleave(S, 0), cfg.dir_freqs);
    torch::Tensor a;
    if (app.defined()) a = app.repeat_interleave(S, 0);
    // FACT: o = torch.cat((torch.rand(24, 3), torch.rand(24, 1)), -1); assert is_view_of(o.view(4, 6, 4), o)
    return mlp(xyz, dirs, a).view({R, S, 4});  // LOOKALIKE: tensor-view-non-contiguous -- the MLP's final cat is a fresh contiguous [R*S, 4]
  }

  // rays: [R, 8] = origin, direction, near, far; img_idx: [R] int64.
  RenderOutput forward(const torch::Tensor& rays, const torch::Tensor& img_idx) {
    const int64_t Nc = cfg.n_coarse, Nf = cfg.n_fine;
    const bool train = is_training();
    auto rays_o = rays.narrow(1, 0, 3);
    auto rays_d = rays.narrow(1, 3, 3);
    auto near = rays.narrow(1, 6, 1), far = rays.narrow(1, 7, 1);

    // FACT: r = torch.rand(4, 8); d = r.narrow(1, 3, 3); v = d; v /= v.norm(2, -1, True); assert shares_storage(v, r)
    torch::Tensor viewdirs = rays_d;
    viewdirs /= viewdirs.norm(2, -1, true);  // EXPECT: tensor-alias-then-mutate

    const double noise = train ? cfg.noise_std : 0.0;
    auto z_c = stratified_depths(near, far, Nc, train && cfg.perturb);
    auto pts_c = rays_o.unsqueeze(1) + rays_d.unsqueeze(1) * z_c.unsqueeze(-1);
    auto coarse_out = composite(run_mlp(coarse, pts_c, viewdirs, {}), z_c, rays_d, noise);

    // Resample where the coarse pass found density; no gradient through the new depths.
    auto z_mids = 0.5 * (z_c.narrow(1, 1, Nc - 1) + z_c.narrow(1, 0, Nc - 1));
    auto w = coarse_out.weights.detach();
    // FACT: a = torch.rand(3, 4, requires_grad=True); r = torch.rand(3, 4, 3, requires_grad=True); w = a * 2; m = (w.unsqueeze(-1) * r).sum(); d = w.detach(); d += 1e-5; assert backward_fails(lambda: m.backward())
    w += 1e-5;  // EXPECT: tensor-inplace-on-detached
    auto z_new = sample_pdf(z_mids, w.narrow(1, 1, Nc - 2), Nf, !train);
    auto z_f = std::get<0>(torch::sort(torch::cat({z_c, z_new.detach()}, -1), -1));
    auto pts_f = rays_o.unsqueeze(1) + rays_d.unsqueeze(1) * z_f.unsqueeze(-1);
    auto fine_out = composite(run_mlp(fine, pts_f, viewdirs, appearance(img_idx)), z_f, rays_d, noise);

    return {coarse_out.rgb, coarse_out.acc, fine_out.rgb, fine_out.acc, fine_out.depth};
  }

  NerfWConfig cfg;
  torch::nn::Embedding appearance{nullptr};
  NerfMLP coarse{nullptr}, fine{nullptr};
};
TORCH_MODULE(NerfWRenderer);

struct RayDataset {
  torch::Tensor rays;     // [N, 6] origin + direction, float, host memory
  torch::Tensor rgba;     // [N, 4] colour and alpha in [0, 1]
  torch::Tensor img_idx;  // [N] int64 image of every ray
  torch::Tensor bounds;   // [n_images, 2] near/far per image (from the SfM depths)
};

void train(NerfWRenderer& model, const RayDataset& data, const NerfWConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));

  const int64_t total = data.rays.size(0), B = cfg.batch_rays;
  auto rays_gpu = torch::empty({B, 8}, torch::TensorOptions().device(device));
  double running = 0.0;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto sel = torch::randint(total, {B}, torch::kLong);
    auto idx_gpu = data.img_idx.index_select(0, sel).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new random batch every step
    auto bounds = data.bounds.to(device);  // EXPECT: tensor-clone-in-loop
    rays_gpu.narrow(1, 0, 6).copy_(data.rays.index_select(0, sel));  // LOOKALIKE: tensor-device-mismatch -- copy_ from host into the device buffer is allowed
    rays_gpu.narrow(1, 6, 2).copy_(bounds.index_select(0, idx_gpu));

    // Random background per step, so the model cannot bake the background into density.
    auto bg = torch::rand({3});
    auto rgba = data.rgba.index_select(0, sel);
    auto alpha = rgba.narrow(1, 3, 1);
    auto target = (rgba.narrow(1, 0, 3) * alpha + (1.0 - alpha) * bg).to(device);

    auto out = model->forward(rays_gpu, idx_gpu);
    auto loss = F::mse_loss(over_background(out.rgb_coarse, out.acc_coarse, bg), target) +
                F::mse_loss(over_background(out.rgb_fine, out.acc_fine, bg), target);
    opt.zero_grad();
    loss.backward();
    opt.step();

    running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
    if (step % cfg.log_every == 0) {
      auto psnr = -10.0 * torch::log10(F::mse_loss(out.rgb_fine.detach(), target));
      std::cout << "step " << step << " loss " << running / static_cast<double>(cfg.log_every)
                << " psnr(fine, no bg) " << psnr.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      running = 0.0;
    }
  }
}

// Renders one view with its image's appearance code: HxWx3 uint8 and depth in millimetres.
std::pair<torch::Tensor, torch::Tensor> render_view(NerfWRenderer& model, const torch::Tensor& rays,
                                                    int64_t img_id, int64_t H, int64_t W, int64_t chunk) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto image = torch::empty({H * W, 3}, torch::kByte);
  auto depth_mm = torch::empty({H * W}, torch::kInt32);
  const auto id_opts = torch::TensorOptions().dtype(torch::kLong).device(rays.device());
  for (int64_t s = 0; s < H * W; s += chunk) {
    const int64_t n = std::min(chunk, H * W - s);
    auto out = model->forward(rays.narrow(0, s, n), torch::full({n}, img_id, id_opts));
    image.narrow(0, s, n).copy_(out.rgb_fine * 255.0);  // EXPECT: tensor-copy-narrowing
    depth_mm.narrow(0, s, n).copy_((out.depth_fine * 1000.0).round());  // LOOKALIKE: tensor-copy-narrowing -- rounded to whole millimetres before the int32 store
  }
  // FACT: i = torch.empty(12, 3, dtype=torch.uint8); assert is_view_of(i.view(3, 4, 3), i)
  return {image.view({H, W, 3}), depth_mm.view({H, W})};  // LOOKALIKE: tensor-view-non-contiguous -- freshly allocated contiguous buffers
}
