// Real-ESRGAN style "second-order" degradation: blur -> resize -> noise -> JPEG, twice,
// then a final sinc filter + resize + JPEG, generating (LQ, GT) pairs on the fly for an
// RRDB x4 super-resolution network trained with pixel + feature losses.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace sr {

struct DegradationConfig {
  int64_t scale = 4;
  std::vector<int64_t> kernel_sizes{7, 9, 11, 13, 15, 17, 19, 21};  // padded to 21 for stacking
  double blur_sigma[2] = {3.0, 1.5};      // max blur sigma of stage 1 / stage 2
  double resize_range[2][2] = {{0.15, 1.5}, {0.3, 1.2}};
  double noise_range[2][2] = {{1.0, 30.0}, {1.0, 25.0}};
  double poisson_scale[2] = {3.0, 2.5}, jpeg_range[2] = {30.0, 95.0};
  double gaussian_noise_prob = 0.5, gray_noise_prob = 0.4;
  double second_blur_prob = 0.8, final_sinc_prob = 0.8;
};

struct Rng {
  std::mt19937 gen{1234};
  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(gen); }
  bool coin(double p) { return uniform(0.0, 1.0) < p; }
  int64_t randint(int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(gen); }
};

torch::Tensor centered_grid(int64_t ks) { return torch::arange(-(ks / 2), ks / 2 + 1, torch::kFloat64); }

// Rotated anisotropic Gaussian, normalised to sum 1.
torch::Tensor gaussian_kernel(int64_t ks, double sx, double sy, double theta) {
  auto grids = torch::meshgrid({centered_grid(ks), centered_grid(ks)}, "xy");
  auto xy = torch::stack({grids[0], grids[1]}, -1);
  const double c = std::cos(theta), s = std::sin(theta);
  auto R = torch::tensor({c, -s, s, c}, torch::kFloat64).view({2, 2});
  auto cov = R.matmul(torch::diag(torch::tensor({sx * sx, sy * sy}, torch::kFloat64))).matmul(R.t());
  auto k = torch::exp(-0.5 * (xy.matmul(torch::inverse(cov)) * xy).sum(-1));
  return (k / k.sum()).to(torch::kFloat32);
}

// Separable windowed sinc used to synthesise ringing/overshoot artifacts.
torch::Tensor sinc_kernel(double cutoff, int64_t ks) {
  auto k1 = torch::sinc(centered_grid(ks) * cutoff / M_PI) * torch::hamming_window(ks, /*periodic=*/false, torch::kFloat64);
  auto k = torch::outer(k1, k1);
  return (k / k.sum()).to(torch::kFloat32);
}

// One random kernel per sample, zero-padded to 21x21 so they stack.
torch::Tensor random_kernels(int64_t b, double max_sigma, const DegradationConfig& cfg, Rng& rng) {
  std::vector<torch::Tensor> ks;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t size = cfg.kernel_sizes[rng.randint(cfg.kernel_sizes.size())];
    const double sx = rng.uniform(0.2, max_sigma);
    const double sy = rng.coin(0.5) ? sx : rng.uniform(0.2, max_sigma);
    auto k = gaussian_kernel(size, sx, sy, rng.uniform(-M_PI, M_PI));
    const int64_t pad = (21 - size) / 2;
    ks.push_back(torch::constant_pad_nd(k, {pad, pad, pad, pad}));
  }
  return torch::stack(ks);
}

// Per-sample 2-D filtering: fold the batch into the channels and run one grouped conv.
torch::Tensor filter2d(const torch::Tensor& img, const torch::Tensor& kernel) {
  const auto b = img.size(0), c = img.size(1), h = img.size(2), w = img.size(3);
  const auto k = kernel.size(-1);
  auto padded = torch::reflection_pad2d(img, {k / 2, k / 2, k / 2, k / 2});
  // FACT: g = torch.rand(2, 8, 8, 3).permute(0, 3, 1, 2); p = torch.nn.functional.pad(g, (2, 2, 2, 2), mode="reflect"); assert is_view_of(p.view(1, 6, 12, 12), p)
  auto x = padded.view({1, b * c, padded.size(2), padded.size(3)});  // LOOKALIKE: tensor-view-non-contiguous -- reflection_pad2d returns a fresh contiguous tensor
  auto weight = kernel.view({b, 1, k, k}).repeat({1, c, 1, 1}).view({b * c, 1, k, k});
  return torch::nn::functional::conv2d(x, weight, torch::nn::functional::Conv2dFuncOptions().groups(b * c)).view({b, c, h, w});
}

// Unsharp masking of the GT (Real-ESRGAN trains on sharpened targets).
torch::Tensor usm_sharp(const torch::Tensor& img, const torch::Tensor& blur_k, double weight = 0.5) {
  const auto b = img.size(0), c = img.size(1), h = img.size(2), w = img.size(3);
  const auto k = blur_k.size(-1);
  // FACT: g = torch.randint(0, 255, (2, 8, 8, 3), dtype=torch.uint8).permute(0, 3, 1, 2).float().div(255); assert raises(lambda: g.view(6, 1, 8, 8), "view size is not compatible")
  auto planes = img.view({b * c, 1, h, w});  // EXPECT: tensor-view-non-contiguous
  auto blur = torch::conv2d(torch::reflection_pad2d(planes, {k / 2, k / 2, k / 2, k / 2}), blur_k.view({1, 1, k, k}))
                  .view({b, c, h, w});
  auto residual = img - blur;
  auto mask = (residual.abs() * 255 > 10.0).to(img.scalar_type());
  auto soft_mask = filter2d(mask, blur_k.unsqueeze(0).expand({b, k, k}));
  // FACT: g = torch.rand(2, 3, 8, 8); keep = g; sharp = g; sharp.add_(torch.rand(2, 3, 8, 8), alpha=0.5); assert shares_storage(sharp, keep)
  auto sharp = img;
  sharp.add_(residual, weight).clamp_(0.0, 1.0);  // EXPECT: tensor-alias-then-mutate
  return soft_mask * sharp + (1 - soft_mask) * img;
}
torch::Tensor random_resize(const torch::Tensor& img, std::vector<int64_t> size, int64_t mode) {
  namespace F = torch::nn::functional;
  auto opts = F::InterpolateFuncOptions().size(size);
  if (mode == 0) opts.mode(torch::kArea);
  else if (mode == 1) opts.mode(torch::kBilinear).align_corners(false);
  else opts.mode(torch::kBicubic).align_corners(false);
  return F::interpolate(img, opts);
}
torch::Tensor add_gaussian_noise(const torch::Tensor& img, const torch::Tensor& sigma, const torch::Tensor& gray) {
  const auto b = img.size(0), c = img.size(1), h = img.size(2), w = img.size(3);
  auto s = sigma.view({b, 1, 1, 1}) / 255.0;
  auto color = torch::randn_like(img) * s;
  // FACT: assert raises(lambda: torch.randn(2, 1, 4, 4).expand(2, 3, 4, 4).mul_(torch.rand(2, 1, 1, 1)), "more than one element of the written-to tensor")
  auto mono = torch::randn({b, 1, h, w}, img.options()).expand({b, c, h, w});
  mono.mul_(s);  // EXPECT: tensor-inplace-on-expanded
  return img + (1 - gray.view({b, 1, 1, 1})) * color + gray.view({b, 1, 1, 1}) * mono;
}
torch::Tensor add_poisson_noise(const torch::Tensor& img, const torch::Tensor& scale) {
  // FACT: x = torch.rand(2, 3, 4, 4); c = x.clamp(0, 1); c.mul_(255).round_(); assert is_copy_of(c, x)
  auto counts = img.clamp(0.0, 1.0);
  counts.mul_(255.0).round_();  // LOOKALIKE: tensor-alias-then-mutate -- clamp() returned a new tensor
  auto noise = (torch::poisson(counts) - counts) / 255.0;
  return img + noise * scale.view({-1, 1, 1, 1});
}
torch::Tensor noise_stage(const torch::Tensor& img, int stage, const DegradationConfig& cfg, Rng& rng) {
  const auto b = img.size(0);
  auto per_sample = [&](double lo, double hi) { return torch::empty({b}, img.options()).uniform_(lo, hi); };
  if (rng.coin(cfg.gaussian_noise_prob)) {
    auto gray = (torch::rand({b}, img.options()) < cfg.gray_noise_prob).to(img.scalar_type());
    return add_gaussian_noise(img, per_sample(cfg.noise_range[stage][0], cfg.noise_range[stage][1]), gray);
  }
  return add_poisson_noise(img, per_sample(0.05, cfg.poisson_scale[stage]));
}
torch::Tensor dct_matrix() {
  auto n = torch::arange(8, torch::kFloat64);
  auto m = torch::cos((2 * n.unsqueeze(0) + 1) * n.unsqueeze(1) * (M_PI / 16)) * std::sqrt(2.0 / 8);
  m.select(0, 0).div_(std::sqrt(2.0));
  return m.to(torch::kFloat32);
}
// Standard JPEG luma / chroma tables (Annex K), one per Y, Cb, Cr plane.
torch::Tensor quant_tables() {
  auto y = torch::tensor({16, 11, 10, 16, 24,  40,  51,  61,  12, 12, 14, 19, 26,  58,  60,  55,
                          14, 13, 16, 24, 40,  57,  69,  56,  14, 17, 22, 29, 51,  87,  80,  62,
                          18, 22, 37, 56, 68,  109, 103, 77,  24, 35, 55, 64, 81,  104, 113, 92,
                          49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99}, torch::kFloat32);
  auto c = torch::full({8, 8}, 99.0f);
  c.narrow(0, 0, 4).narrow(1, 0, 4).copy_(torch::tensor({17, 18, 24, 47, 18, 21, 26, 66, 24, 26, 56, 99, 47, 66, 99, 99}, torch::kFloat32).view({4, 4}));
  return torch::stack({y.view({8, 8}), c, c});
}
torch::Tensor rgb_to_ycbcr(const torch::Tensor& rgb) {
  const auto h = rgb.size(1), w = rgb.size(2);
  auto m = torch::tensor({0.299, 0.587, 0.114, -0.168736, -0.331264, 0.5, 0.5, -0.418688, -0.081312},
                         rgb.options()).view({3, 3});
  // FACT: r = torch.randn(3, 16, 24); assert is_view_of(r.permute(1, 2, 0).reshape(-1, 3), r)
  auto pix = rgb.permute({1, 2, 0}).reshape({-1, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- only h and w are merged and they stay adjacent: a view
  auto ycc = pix.matmul(m.t()) + torch::tensor({0.0, 0.5, 0.5}, rgb.options());
  return ycc.t().view({3, h, w});
}
torch::Tensor ycbcr_to_rgb(const torch::Tensor& ycc) {
  auto y = ycc[0], cb = ycc[1] - 0.5, cr = ycc[2] - 0.5;
  return torch::stack({y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb});
}

// JPEG-like compression: 8x8 DCT per plane, quantise with the quality-scaled tables.
torch::Tensor jpeg_like(const torch::Tensor& img, const std::vector<double>& qualities) {
  const auto b = img.size(0), h = img.size(2), w = img.size(3);
  const int64_t ph = (8 - h % 8) % 8, pw = (8 - w % 8) % 8;
  auto padded = torch::replication_pad2d(img, {0, pw, 0, ph});
  const auto H = padded.size(2), W = padded.size(3);
  const auto dct = dct_matrix(), base = quant_tables();
  auto out = torch::empty_like(padded);
  for (int64_t i = 0; i < b; ++i) {
    const double q = qualities[i];
    const double s = q < 50 ? 5000.0 / q : 200.0 - 2.0 * q;
    auto table = torch::clamp_min(torch::floor((base * s + 50) / 100), 1.0).unsqueeze(1);
    auto basis = dct.to(img.device());  // EXPECT: tensor-clone-in-loop
    auto ycc = rgb_to_ycbcr(padded[i]) * 255 - 128;
    // FACT: y = torch.randn(3, 16, 24); assert is_copy_of(y.view(3, 2, 8, 3, 8).permute(0, 1, 3, 2, 4).reshape(3, -1, 8, 8), y)
    auto blocks = ycc.view({3, H / 8, 8, W / 8, 8}).permute({0, 1, 3, 2, 4}).reshape({3, -1, 8, 8});  // EXPECT: tensor-reshape-non-contiguous
    auto coeff = basis.matmul(blocks).matmul(basis.t());
    coeff = torch::round(coeff / table) * table;  // EXPECT: tensor-device-mismatch
    auto rec = basis.t().matmul(coeff).matmul(basis);
    // FACT: rec = torch.randn(3, 6, 8, 8); t = rec.view(3, 2, 3, 8, 8).permute(0, 1, 3, 2, 4).contiguous(); assert is_copy_of(t, rec) and t.view(3, 16, 24).shape == (3, 16, 24)
    auto plane = rec.view({3, H / 8, W / 8, 8, 8}).permute({0, 1, 3, 2, 4}).contiguous().view({3, H, W});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
    out[i].copy_(ycbcr_to_rgb((plane + 128) / 255));
  }
  return out.narrow(2, 0, h).narrow(3, 0, w).clamp(0.0, 1.0);
}

struct Pair { torch::Tensor lq, gt; };

Pair degrade(const torch::Tensor& gt_raw, const torch::Tensor& usm_k, const DegradationConfig& cfg, Rng& rng) {
  const auto device = gt_raw.device();
  const auto b = gt_raw.size(0), H = gt_raw.size(2), W = gt_raw.size(3);
  auto jpeg_q = [&] { std::vector<double> q(b); for (auto& x : q) x = rng.uniform(cfg.jpeg_range[0], cfg.jpeg_range[1]); return q; };
  auto gt = usm_sharp(gt_raw, usm_k);
  auto out = gt;
  for (int stage = 0; stage < 2; ++stage) {
    if (stage == 0 || rng.coin(cfg.second_blur_prob))
      out = filter2d(out, random_kernels(b, cfg.blur_sigma[stage], cfg, rng).to(device));
    const double f = rng.uniform(cfg.resize_range[stage][0], cfg.resize_range[stage][1]) * (stage == 0 ? 1.0 : 1.0 / cfg.scale);
    const auto th = std::max<int64_t>(8, static_cast<int64_t>(H * f)), tw = std::max<int64_t>(8, static_cast<int64_t>(W * f));
    out = random_resize(out, {th, tw}, rng.randint(3));
    out = noise_stage(out, stage, cfg, rng);
    if (stage == 0) out = jpeg_like(out.clamp(0.0, 1.0), jpeg_q());
  }
  out = random_resize(out, {H / cfg.scale, W / cfg.scale}, rng.randint(3));
  if (rng.coin(cfg.final_sinc_prob)) {
    auto sk = sinc_kernel(rng.uniform(M_PI / 3, M_PI), 21).to(device).unsqueeze(0).repeat({b, 1, 1});
    // FACT: sk = torch.rand(3, 3).unsqueeze(0).repeat(2, 1, 1); sk.div_(sk.sum((1, 2), keepdim=True)); assert is_contiguous(sk) and sk.stride(0) == 9
    sk.div_(sk.sum({1, 2}, /*keepdim=*/true));  // LOOKALIKE: tensor-inplace-on-expanded -- repeat() materialised one kernel per sample
    out = filter2d(out, sk);
  }
  out = jpeg_like(out.clamp(0.0, 1.0), jpeg_q());
  return {(out * 255).round().clamp(0, 255) / 255, gt};
}
// Real-ESRGAN's training pair pool: shuffles degraded pairs across batches.
struct PairPool {
  explicit PairPool(int64_t size) : size(size) {}
  Pair swap(const Pair& in) {
    const auto b = in.lq.size(0);
    if (!lq.defined()) {
      lq = torch::zeros({size, in.lq.size(1), in.lq.size(2), in.lq.size(3)}, in.lq.options());
      gt = torch::zeros({size, in.gt.size(1), in.gt.size(2), in.gt.size(3)}, in.gt.options());
    }
    if (ptr < size) {
      lq.narrow(0, ptr, b).copy_(in.lq);
      gt.narrow(0, ptr, b).copy_(in.gt);
      ptr += b;
      return in;
    }
    auto idx = torch::randperm(size, torch::TensorOptions().dtype(torch::kLong).device(lq.device()));  // full: shuffle
    lq = lq.index_select(0, idx);
    gt = gt.index_select(0, idx);
    Pair out{lq.narrow(0, 0, b).clone(), gt.narrow(0, 0, b).clone()};  // LOOKALIKE: tensor-unnecessary-clone -- the pool rows are overwritten just below
    lq.narrow(0, 0, b).copy_(in.lq.clone());  // EXPECT: tensor-unnecessary-clone
    gt.narrow(0, 0, b).copy_(in.gt);
    return out;
  }

  int64_t size, ptr = 0;
  torch::Tensor lq, gt;
};

struct DenseBlockImpl : torch::nn::Module {
  DenseBlockImpl(int64_t nf, int64_t gc) {
    for (int64_t i = 0; i < 5; ++i)
      convs.push_back(register_module("conv" + std::to_string(i + 1),
                                      torch::nn::Conv2d(torch::nn::Conv2dOptions(nf + i * gc, i == 4 ? nf : gc, 3).padding(1))));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    std::vector<torch::Tensor> feats{x};
    for (size_t i = 0; i < 4; ++i) feats.push_back(torch::leaky_relu(convs[i](torch::cat(feats, 1)), 0.2));
    auto x5 = convs[4](torch::cat(feats, 1));
    // FACT: conv = torch.nn.Conv2d(3, 3, 3, padding=1); x = torch.randn(1, 3, 8, 8); x5 = conv(x); x5.mul_(0.2).add_(x); x5.sum().backward(); assert conv.weight.grad is not None
    return x5.mul_(0.2).add_(x);  // LOOKALIKE: tensor-inplace-on-saved -- conv's backward keeps its input and weight, not its output
  }
  std::vector<torch::nn::Conv2d> convs;
};
TORCH_MODULE(DenseBlock);

struct RRDBNetImpl : torch::nn::Module {
  RRDBNetImpl(int64_t nf, int64_t blocks) {
    auto conv = [&](const std::string& name, int64_t in, int64_t out) {
      return register_module(name, torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
    };
    first = conv("first", 3, nf), body_out = conv("body_out", nf, nf), up1 = conv("up1", nf, nf);
    up2 = conv("up2", nf, nf), hr = conv("hr", nf, nf), last = conv("last", nf, 3);
    for (int64_t i = 0; i < blocks; ++i) body->push_back(DenseBlock(nf, nf / 2));
    register_module("body", body);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    namespace F = torch::nn::functional;
    auto up = F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest);
    auto feat = first(x);
    feat = feat + body_out(body->forward(feat));
    feat = torch::leaky_relu(up1(F::interpolate(feat, up)), 0.2);
    feat = torch::leaky_relu(up2(F::interpolate(feat, up)), 0.2);
    return last(torch::leaky_relu(hr(feat), 0.2));
  }
  torch::nn::Conv2d first{nullptr}, body_out{nullptr}, up1{nullptr}, up2{nullptr}, hr{nullptr}, last{nullptr};
  torch::nn::Sequential body;
};
TORCH_MODULE(RRDBNet);

}  // namespace sr

int main() {
  using namespace sr;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  DegradationConfig cfg;
  Rng rng;
  auto dataset = torch::randint(0, 256, {512, 128, 128, 3}, torch::kUInt8);  // decoded HWC crops
  const auto usm_k = gaussian_kernel(21, 3.0, 3.0, 0.0).to(device);
  RRDBNet net(32, 4);
  net->to(device);
  auto features = torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU(),
                                        torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1)));
  features->to(device);
  for (auto& p : features->parameters()) p.requires_grad_(false);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(2e-4).betas({0.9, 0.99}));
  PairPool pool(96);
  auto preview = torch::empty({4, 3, 32, 32}, torch::kUInt8);
  double running = 0.0;
  for (int64_t step = 1; step <= 5000; ++step) {
    auto idx = torch::randint(dataset.size(0), {12}, torch::kLong);
    auto gt_raw = dataset.index_select(0, idx).to(device).permute({0, 3, 1, 2}).to(torch::kFloat32).div(255);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    auto pair = [&] {  // data generation: no graph
      torch::NoGradGuard no_grad;
      return pool.swap(degrade(gt_raw, usm_k, cfg, rng));
    }();
    auto out = net(pair.lq);
    auto loss = torch::l1_loss(out, pair.gt) + 0.1 * torch::l1_loss(features->forward(out), features->forward(pair.gt));
    // FACT: w = torch.randn(4, 3, 3, 3); o = torch.randn(1, 3, 8, 8, requires_grad=True) * 2; loss = torch.nn.functional.conv2d(o, w).abs().mean(); o.detach().clamp_(0, 1); assert backward_fails(loss.backward)
    auto out_vis = out.detach();
    out_vis.clamp_(0.0, 1.0);  // EXPECT: tensor-inplace-on-detached
    opt.zero_grad();
    loss.backward();
    opt.step();
    running += loss.item<double>();  // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- item() yields a plain double
    if (step % 200 == 0) {
      preview.copy_(pair.lq.narrow(0, 0, 4).mul(255).round());  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ may cross devices
      auto sr_u8 = out_vis.narrow(0, 0, 4).mul(255).round().to(torch::kCPU, torch::kUInt8);
      std::printf("step %lld  loss %.4f  preview %lld\n", static_cast<long long>(step), running / 200, static_cast<long long>(sr_u8.numel()));
      running = 0.0;
    }
  }
  return 0;
}
