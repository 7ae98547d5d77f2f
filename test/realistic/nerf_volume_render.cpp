// NeRF-style novel view synthesis: stratified samples along camera rays, sinusoidal positional
// encoding, an MLP for density and colour, and alpha compositing with the transmittance as an
// exclusive cumprod. Trained on random ray batches drawn from all pixels of the training views.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

struct NerfConfig {
  int64_t n_samples = 64, n_freqs_xyz = 10, n_freqs_dir = 4, hidden = 256;
  int64_t batch_rays = 1024, chunk = 8192, iters = 200000, log_every = 100;
  double near = 2.0, far = 6.0, lr = 5e-4, lr_decay = 0.1;
  bool white_bkgd = true;
};

// gamma(p) = (p, sin(2^k pi p), cos(2^k pi p)) for k < F: [..., 3] -> [..., 3 + 6F].
struct PositionalEncodingImpl : torch::nn::Module {
  explicit PositionalEncodingImpl(int64_t n_freqs) {
    freq_bands_ = register_buffer("freq_bands", torch::pow(2.0, torch::arange(n_freqs).to(torch::kFloat)) * M_PI);
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto scaled = x.unsqueeze(-1) * freq_bands_; // LOOKALIKE: tensor-device-mismatch -- a registered buffer: to(device) moves it with the module
    scaled = scaled.flatten(-2);
    return torch::cat({x, torch::sin(scaled), torch::cos(scaled)}, -1);
  }
  torch::Tensor freq_bands_;
};
TORCH_MODULE(PositionalEncoding);

struct NerfMLPImpl : torch::nn::Module {
  explicit NerfMLPImpl(const NerfConfig &cfg) {
    namespace nn = torch::nn;
    const int64_t in_xyz = 3 + 6 * cfg.n_freqs_xyz, in_dir = 3 + 6 * cfg.n_freqs_dir, W = cfg.hidden;
    pe_xyz_ = register_module("pe_xyz", PositionalEncoding(cfg.n_freqs_xyz));
    pe_dir_ = register_module("pe_dir", PositionalEncoding(cfg.n_freqs_dir));
    trunk_ = register_module("trunk", nn::Sequential(nn::Linear(in_xyz, W), nn::ReLU(), nn::Linear(W, W), nn::ReLU(),
                                                     nn::Linear(W, W), nn::ReLU(), nn::Linear(W, W), nn::ReLU()));
    sigma_ = register_module("sigma", nn::Linear(W, 1));
    feat_ = register_module("feat", nn::Linear(W, W));
    rgb_ = register_module("rgb", nn::Sequential(nn::Linear(W + in_dir, W / 2), nn::ReLU(), nn::Linear(W / 2, 3),
                                                 nn::Sigmoid()));
    // FACT: b = torch.nn.Linear(4, 1).bias; torch.nn.init.constant_(b, 0.1); assert b.requires_grad and b.is_leaf
    torch::nn::init::constant_(sigma_->bias, 0.1); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
  }

  // pts [R, S, 3], unit view directions [R, 3] -> raw [R, S, 4]: rgb in [0, 1], density >= 0.
  torch::Tensor forward(const torch::Tensor &pts, const torch::Tensor &dirs) {
    const auto R = pts.size(0), S = pts.size(1);
    // FACT: o = torch.rand(4, 1, 3); d = torch.rand(4, 1, 3); z = torch.rand(4, 5, 1); p = o + d * z; assert is_view_of(p.reshape(-1, 3), p)
    auto flat_pts = pts.reshape({-1, 3}); // LOOKALIKE: tensor-reshape-non-contiguous -- the samples are a fresh broadcast sum: merging R and S is a view
    auto viewdirs = dirs.unsqueeze(1).expand({R, S, 3});
    // FACT: d = torch.rand(4, 3); v = d.unsqueeze(1).expand(4, 5, 3); assert raises(lambda: v.view(-1, 3), "view size is not compatible")
    auto flat_dirs = viewdirs.view({-1, 3}); // EXPECT: tensor-view-non-contiguous -- the expanded directions have stride 0 along the samples
    auto h = trunk_->forward(pe_xyz_(flat_pts));
    auto sigma = torch::relu(sigma_(h));
    auto rgb = rgb_->forward(torch::cat({feat_(h), pe_dir_(flat_dirs)}, -1));
    // FACT: o = torch.cat([torch.rand(20, 3), torch.rand(20, 1)], -1); assert is_view_of(o.view(4, 5, 4), o)
    return torch::cat({rgb, sigma}, -1).view({R, S, 4}); // LOOKALIKE: tensor-view-non-contiguous -- cat returns a new contiguous tensor
  }

  PositionalEncoding pe_xyz_{nullptr}, pe_dir_{nullptr};
  torch::nn::Sequential trunk_{nullptr}, rgb_{nullptr};
  torch::nn::Linear sigma_{nullptr}, feat_{nullptr};
};
TORCH_MODULE(NerfMLP);

struct RenderOut {
  torch::Tensor rgb, depth, acc, pdf;
};

// Stratified depths between the near and far planes: [R, S].
torch::Tensor sample_depths(const torch::Tensor &rays_o, const NerfConfig &cfg, bool perturb) {
  const auto R = rays_o.size(0), S = cfg.n_samples;
  auto t = torch::linspace(0.0, 1.0, S, rays_o.options());
  auto z = (cfg.near * (1.0 - t) + cfg.far * t).expand({R, S});
  if (perturb) {
    // FACT: t = torch.linspace(0, 1, 5); z = (2.0 * (1 - t) + 6.0 * t).expand(3, 5); assert raises(lambda: z.add_((torch.rand(3, 5) - 0.5) * 0.25), "more than one element of the written-to tensor")
    z.add_((torch::rand({R, S}, rays_o.options()) - 0.5) * ((cfg.far - cfg.near) / (S - 1))); // EXPECT: tensor-inplace-on-expanded -- every ray shares the one row of depths
  }
  return z;
}

// Alpha compositing of raw [R, S, 4] at depths z [R, S] along rays_d [R, 3].
RenderOut composite(const torch::Tensor &raw, const torch::Tensor &z, const torch::Tensor &rays_d, bool white_bkgd,
                    const torch::Tensor &bg) {
  const auto R = z.size(0), S = z.size(1);
  auto deltas = z.narrow(1, 1, S - 1) - z.narrow(1, 0, S - 1);
  deltas = torch::cat({deltas, torch::full({R, 1}, 1e10, z.options())}, 1); // LOOKALIKE: tensor-device-mismatch -- the padding is made with the depths' options
  deltas = deltas * rays_d.norm(2, -1, /*keepdim=*/true);
  auto rgb = raw.narrow(-1, 0, 3);
  auto alpha = 1.0 - torch::exp(-raw.select(-1, 3) * deltas);
  // Transmittance before each sample: exclusive cumprod of (1 - alpha).
  auto trans = torch::cumprod(1.0 - alpha + 1e-10, 1);
  trans = torch::cat({torch::ones_like(trans.narrow(1, 0, 1)), trans.narrow(1, 0, S - 1)}, 1);
  auto weights = alpha * trans; // [R, S]

  RenderOut out;
  out.rgb = (weights.unsqueeze(-1) * rgb).sum(1);
  out.depth = (weights * z).sum(1);
  out.acc = weights.sum(1);
  if (white_bkgd) {
    // FACT: w = torch.rand(4, 5, requires_grad=True); c = torch.rand(4, 5, 3, requires_grad=True); r = (w.unsqueeze(-1) * c).sum(1); r.add_((1 - w.sum(1)).unsqueeze(-1) * torch.ones(3)); r.sum().backward(); assert c.grad is not None
    out.rgb.add_((1.0 - out.acc).unsqueeze(-1) * bg); // LOOKALIKE: tensor-inplace-on-saved -- sum saves only its input's sizes
  }
  // PDF for importance sampling in the fine pass: strictly positive weights.
  // FACT: a = torch.rand(4, 5, requires_grad=True); w = a * 0.5; c = torch.rand(4, 5, 3, requires_grad=True); r = (w.unsqueeze(-1) * c).sum(1); w.add_(1e-5); assert backward_fails(lambda: r.sum().backward())
  weights.add_(1e-5); // EXPECT: tensor-inplace-on-saved -- the colour sum's '*' saved 'weights' for the gradient of rgb: loss.backward() raises
  out.pdf = weights / weights.sum(1, /*keepdim=*/true);
  return out;
}

RenderOut render_rays(NerfMLP &model, const torch::Tensor &rays_o, const torch::Tensor &rays_d, const torch::Tensor &bg,
                      const NerfConfig &cfg, bool perturb) {
  auto z = sample_depths(rays_o, cfg, perturb);
  auto pts = rays_o.unsqueeze(1) + rays_d.unsqueeze(1) * z.unsqueeze(-1); // [R, S, 3]
  auto raw = model->forward(pts, rays_d / rays_d.norm(2, -1, /*keepdim=*/true));
  return composite(raw, z, rays_d, cfg.white_bkgd, bg);
}

void train(NerfMLP &model, const torch::Tensor &all_rays_o, const torch::Tensor &all_rays_d, const torch::Tensor &all_rgb,
           const torch::Tensor &background, const NerfConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  const auto n_rays = all_rays_o.size(0);
  double mse_sum = 0.0;
  for (int64_t it = 1; it <= cfg.iters; ++it) {
    auto idx = torch::randint(n_rays, {cfg.batch_rays}, torch::kLong);
    auto rays_o = all_rays_o.index_select(0, idx).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new random batch of rays every step
    auto rays_d = all_rays_d.index_select(0, idx).to(device);
    auto target = all_rgb.index_select(0, idx).to(device);
    auto bg = background.to(device); // EXPECT: tensor-clone-in-loop -- the same background colour goes to the GPU every step
    auto out = render_rays(model, rays_o, rays_d, bg, cfg, /*perturb=*/true);
    auto loss = torch::mse_loss(out.rgb, target);
    opt.zero_grad();
    loss.backward();
    opt.step();
    mse_sum += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    if (it % cfg.log_every == 0) {
      std::cout << "iter " << it << " psnr " << -10.0 * std::log10(mse_sum / cfg.log_every) << "\n";
      mse_sum = 0.0;
    }
    const double lr = cfg.lr * std::pow(cfg.lr_decay, double(it) / cfg.iters);
    for (auto &group : opt.param_groups())
      static_cast<torch::optim::AdamOptions &>(group.options()).lr(lr);
  }
}

// Renders a whole H x W view in chunks of rays (on the model's device), for the validation PSNR
// and the preview images.
torch::Tensor render_image(NerfMLP &model, const torch::Tensor &rays_o, const torch::Tensor &rays_d,
                           const torch::Tensor &bg, const NerfConfig &cfg, int64_t H, int64_t W) {
  model->eval();
  std::vector<torch::Tensor> chunks;
  const auto n = rays_o.size(0);
  for (int64_t i = 0; i < n; i += cfg.chunk) {
    const auto len = std::min(cfg.chunk, n - i);
    auto out = render_rays(model, rays_o.narrow(0, i, len), rays_d.narrow(0, i, len), bg, cfg, /*perturb=*/false);
    // FACT: m = torch.nn.Linear(3, 3); cs = [torch.sigmoid(m(torch.rand(4, 3))).sum(1) for _ in range(3)]; assert all(c.requires_grad for c in cs) and kept_nodes(cs) >= 6
    chunks.push_back(out.rgb); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every chunk keeps its graph and activations until the image is done
  }
  model->train();
  return torch::cat(chunks, 0).view({H, W, 3});
}

double validation_psnr(NerfMLP &model, const torch::Tensor &rays_o, const torch::Tensor &rays_d, const torch::Tensor &rgb,
                       const torch::Tensor &bg, const NerfConfig &cfg, int64_t H, int64_t W) {
  auto img = render_image(model, rays_o, rays_d, bg, cfg, H, W);
  auto mse = (img - rgb.view({H, W, 3})).pow(2).mean().item<double>();
  return -10.0 * std::log10(mse);
}
