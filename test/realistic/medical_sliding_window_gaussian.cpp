// Sliding-window inference for 3-D CT segmentation (nnU-Net style): overlapping patches,
// Gaussian importance weighting, accumulation into output and count maps, mirror TTA.
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct SlidingWindowConfig {
  std::array<int64_t, 3> patch{128, 128, 128};
  double overlap = 0.5;
  double sigma_scale = 0.125;
  int64_t num_classes = 3;
  size_t sw_batch_size = 2;
  bool mirror_tta = true;
  std::vector<std::vector<int64_t>> mirror_axes{{2}, {3}, {4}, {2, 3}, {2, 4}, {3, 4}, {2, 3, 4}};
  float window_lo = -1000.f;  // HU
  float window_hi = 1000.f;
  std::vector<float> class_prior{1.f, 1.f, 1.f};
};

// Stand-in for the trained 3-D U-Net (the weights come from a checkpoint).
struct SegNetImpl : torch::nn::Module {
  SegNetImpl(int64_t in_ch, int64_t width, int64_t num_classes)
      : enc(torch::nn::Conv3dOptions(in_ch, width, 3).padding(1)),
        mid(torch::nn::Conv3dOptions(width, width, 3).padding(1)),
        out(torch::nn::Conv3dOptions(width, num_classes, 1)),
        norm(torch::nn::InstanceNorm3dOptions(width).affine(true)) {
    register_module("enc", enc);
    register_module("mid", mid);
    register_module("out", out);
    register_module("norm", norm);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = F::leaky_relu(norm(enc(x)), F::LeakyReLUFuncOptions().negative_slope(0.01));
    h = F::leaky_relu(norm(mid(h)), F::LeakyReLUFuncOptions().negative_slope(0.01));
    return out(h);
  }
  torch::nn::Conv3d enc, mid, out;
  torch::nn::InstanceNorm3d norm;
};
TORCH_MODULE(SegNet);

// Window-level CT intensities into [0, 1].
torch::Tensor ct_window(const torch::Tensor& image, float lo, float hi) {
  torch::Tensor vol = image;
  // FACT: a = torch.randn(1, 1, 4, 4, 4) * 1500; b = a; b.clamp_(-1000, 1000).sub_(-1000).div_(2000); assert shares_storage(a, b) and a.min() >= 0
  vol.clamp_(lo, hi).sub_(lo).div_(hi - lo);  // EXPECT: tensor-alias-then-mutate
  return vol;
}

// Separable Gaussian, peak 1 at the patch centre, no zero weights.
torch::Tensor gaussian_importance_map(const std::array<int64_t, 3>& patch, double sigma_scale) {
  std::vector<torch::Tensor> axes;
  for (int64_t n : patch) {
    auto c = torch::arange(n, torch::kFloat) - (n - 1) / 2.0;
    const double sigma = n * sigma_scale;
    axes.push_back(torch::exp(-(c * c) / (2.0 * sigma * sigma)));
  }
  // FACT: g = torch.rand(5); assert is_view_of(g.view(-1, 1, 1), g) and is_view_of(g.view(1, 1, -1), g)
  auto g = axes[0].view({-1, 1, 1}) * axes[1].view({1, -1, 1}) * axes[2].view({1, 1, -1});  // LOOKALIKE: tensor-view-non-contiguous -- views of contiguous 1-D tensors
  g /= g.max();
  // Zero weights at the border would make the count map divide by zero.
  const float min_pos = g.masked_select(g > 0).min().item<float>();
  g.clamp_min_(min_pos);
  return g;
}

// Evenly spread window starts along one axis (first at 0, last flush with the end).
std::vector<int64_t> window_starts(int64_t size, int64_t patch, double overlap) {
  if (size <= patch) return {0};
  const double target_step = patch * (1.0 - overlap);
  const int64_t n = static_cast<int64_t>(std::ceil((size - patch) / target_step)) + 1;
  const double actual = n > 1 ? static_cast<double>(size - patch) / (n - 1) : 0.0;
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < n; ++i) starts.push_back(static_cast<int64_t>(std::llround(i * actual)));
  return starts;
}

struct SegmentationResult {
  torch::Tensor probs;      // [C, D, H, W]
  torch::Tensor labels;     // [D, H, W], int64
  torch::Tensor fg_permille;  // [D, H, W], int16, for the viewer
  torch::Tensor preview;    // [D, H, W], uint8
  double tta_spread = 0.0;
};

SegmentationResult sliding_window_inference(SegNet& net, const torch::Tensor& image,
                                            const SlidingWindowConfig& cfg) {
  torch::NoGradGuard no_grad;
  net->eval();
  torch::Device device(torch::kCUDA);
  net->to(device);

  auto vol = ct_window(image, cfg.window_lo, cfg.window_hi).to(device);  // [1, 1, D, H, W]
  const int64_t D0 = vol.size(2), H0 = vol.size(3), W0 = vol.size(4);
  const int64_t pz = cfg.patch[0], py = cfg.patch[1], px = cfg.patch[2];
  // Pad small volumes up to one patch (F::pad lists the last dimension first).
  std::vector<int64_t> pad{0, std::max<int64_t>(px - W0, 0), 0, std::max<int64_t>(py - H0, 0), 0,
                           std::max<int64_t>(pz - D0, 0)};
  vol = F::pad(vol, F::PadFuncOptions(pad).mode(torch::kConstant));
  const int64_t D = vol.size(2), H = vol.size(3), W = vol.size(4);

  auto gmap = gaussian_importance_map(cfg.patch, cfg.sigma_scale);  // [pz, py, px]
  auto out_map = torch::zeros({cfg.num_classes, D, H, W}, vol.options());
  auto count = torch::zeros({D, H, W}, vol.options());

  std::vector<std::array<int64_t, 3>> corners;
  for (int64_t z : window_starts(D, pz, cfg.overlap))
    for (int64_t y : window_starts(H, py, cfg.overlap))
      for (int64_t x : window_starts(W, px, cfg.overlap)) corners.push_back({z, y, x});

  double tta_spread = 0.0;
  for (size_t b = 0; b < corners.size(); b += cfg.sw_batch_size) {
    const size_t e = std::min(corners.size(), b + cfg.sw_batch_size);
    std::vector<torch::Tensor> patches;
    for (size_t i = b; i < e; ++i)
      patches.push_back(vol.narrow(2, corners[i][0], pz).narrow(3, corners[i][1], py).narrow(4, corners[i][2], px));
    auto batch = torch::cat(patches, 0);  // [n, 1, pz, py, px]

    // Mirror TTA in one forward: the flipped copies ride along in the batch dimension.
    std::vector<torch::Tensor> views{batch};
    if (cfg.mirror_tta)
      for (const auto& axes : cfg.mirror_axes) views.push_back(batch.flip(axes));
    auto logits = net->forward(torch::cat(views, 0));
    auto chunks = torch::softmax(logits, 1).chunk(static_cast<int64_t>(views.size()), 0);
    std::vector<torch::Tensor> unflipped{chunks[0]};
    for (size_t a = 1; a < chunks.size(); ++a)
      unflipped.push_back(chunks[a].flip(cfg.mirror_axes[a - 1]));  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    auto stacked = torch::stack(unflipped);  // [1 + A, n, C, pz, py, px]
    auto probs = stacked.mean(0);
    tta_spread += stacked.var(0).mean().item<double>();  // EXPECT: tensor-sync-in-loop

    auto g = gmap.to(device);  // EXPECT: tensor-clone-in-loop
    for (size_t i = b; i < e; ++i) {
      const int64_t z = corners[i][0], y = corners[i][1], x = corners[i][2];
      auto region = out_map.narrow(1, z, pz).narrow(2, y, py).narrow(3, x, px);
      // FACT: o = torch.zeros(3, 6, 6, 6); r = o.narrow(1, 1, 4).narrow(2, 0, 4).narrow(3, 2, 4); r.add_(1); assert is_view_of(r, o) and o.sum() == 3 * 64
      region.add_(probs[static_cast<int64_t>(i - b)] * g);  // LOOKALIKE: tensor-alias-then-mutate -- an explicit view of the accumulator, written on purpose
      count.narrow(0, z, pz).narrow(1, y, py).narrow(2, x, px).add_(g);  // LOOKALIKE: tensor-device-mismatch -- g was moved to the device
    }
  }

  auto probs = (out_map / count).narrow(1, 0, D0).narrow(2, 0, H0).narrow(3, 0, W0);
  auto prior = torch::tensor(cfg.class_prior).view({-1, 1, 1, 1});
  probs = probs * prior;  // EXPECT: tensor-device-mismatch
  probs = probs / probs.sum(0, true);

  SegmentationResult r;
  r.probs = probs;
  r.labels = probs.argmax(0);
  r.tta_spread = tta_spread / std::max<size_t>(1, corners.size());

  auto fg = probs.narrow(0, 1, cfg.num_classes - 1).sum(0);
  auto permille = torch::empty({D0, H0, W0}, torch::kInt16);
  permille.copy_(fg * 1000);  // EXPECT: tensor-copy-narrowing
  r.fg_permille = permille;
  auto preview = torch::empty({D0, H0, W0}, torch::kUInt8);
  preview.copy_((fg * 255).round().clamp(0, 255));  // LOOKALIKE: tensor-copy-narrowing -- whole numbers in [0, 255]
  r.preview = preview;
  return r;
}

// Mean foreground Dice over classes 1..C-1 on CPU label maps.
double mean_dice(const torch::Tensor& pred_labels, const torch::Tensor& gt_labels,
                 int64_t num_classes, int64_t ignore_index) {
  auto valid = gt_labels != ignore_index;
  auto gt = gt_labels.clone();  // LOOKALIKE: tensor-unnecessary-clone -- first use is index_put_, which has no out-of-place twin here
  gt.index_put_({~valid}, 0);
  double total = 0.0;
  for (int64_t c = 1; c < num_classes; ++c) {
    auto p = (pred_labels == c) & valid;
    auto t = (gt == c) & valid;
    const double inter = (p & t).sum().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- CPU label maps, no device to wait for
    const double denom = p.sum().item<double>() + t.sum().item<double>();
    total += denom > 0 ? 2.0 * inter / denom : 1.0;
  }
  return total / std::max<int64_t>(num_classes - 1, 1);
}

void segment_cases(SegNet& net, const std::vector<torch::Tensor>& images,
                   const std::vector<torch::Tensor>& gts, const SlidingWindowConfig& cfg) {
  double dice_sum = 0.0;
  for (size_t i = 0; i < images.size(); ++i) {
    auto res = sliding_window_inference(net, images[i], cfg);
    auto labels_cpu = res.labels.cpu();
    const double d = mean_dice(labels_cpu, gts[i], cfg.num_classes, 255);
    dice_sum += d;
    std::cout << "case " << i << " dice " << d << " tta spread " << res.tta_spread << "\n";
  }
  std::cout << "mean dice " << dice_sum / std::max<size_t>(1, images.size()) << "\n";
}
