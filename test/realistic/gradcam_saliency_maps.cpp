// Grad-CAM and integrated-gradients explanations for a CNN image classifier, without module hooks.
// The classifier's forward returns its last stage's activations next to the logits; the explainer
// keeps them for the batch and takes d(score)/d(activations) with torch::autograd::grad. Grad-CAM
// weights every channel by its pooled gradient, rectifies, upsamples to the image size and min-max
// normalises each map; integrated gradients average input gradients along the path from a blurred
// baseline. A batch job explains the top-k classes of every image and writes PPM overlays.
#include <torch/torch.h>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct ExplainConfig {
  int64_t num_classes = 1000, width = 64, top_k = 3, ig_steps = 32, blur_kernel = 31, log_every = 25;
  double eps = 1e-7, overlay_alpha = 0.45;
  std::string out_dir = "cams";
};

struct ClassifierOutput {
  torch::Tensor logits;   // [B, C]
  torch::Tensor features; // [B, K, h, w]: the last stage's activations
};

struct ImageBatch {
  torch::Tensor images; // [B, 3, H, W], normalised with the ImageNet mean and std
  torch::Tensor labels; // [B] int64
  std::vector<std::string> names;
};

nn::Sequential make_stage(int64_t in, int64_t out) {
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(2).padding(1).bias(false)), nn::BatchNorm2d(out), nn::ReLU(),
                        nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)), nn::BatchNorm2d(out), nn::ReLU());
}

struct CamNetImpl : nn::Module {
  explicit CamNetImpl(const ExplainConfig &cfg) {
    const auto w = cfg.width;
    stage1 = register_module("stage1", make_stage(3, w));
    stage2 = register_module("stage2", make_stage(w, 2 * w));
    stage3 = register_module("stage3", make_stage(2 * w, 4 * w));
    stage4 = register_module("stage4", make_stage(4 * w, 8 * w));
    fc = register_module("fc", nn::Linear(8 * w, cfg.num_classes));
  }
  ClassifierOutput forward(const torch::Tensor &x) {
    auto a = stage4->forward(stage3->forward(stage2->forward(stage1->forward(x))));
    auto pooled = F::adaptive_avg_pool2d(a, F::AdaptiveAvgPool2dFuncOptions(1));
    // FACT: p = torch.nn.functional.adaptive_avg_pool2d(torch.relu(torch.randn(2, 8, 4, 4)), 1); assert is_contiguous(p) and is_view_of(p.view(2, -1), p)
    return {fc(pooled.view({pooled.size(0), -1})), a}; // LOOKALIKE: tensor-view-non-contiguous -- the pooled map is contiguous
  }
  nn::Sequential stage1{nullptr}, stage2{nullptr}, stage3{nullptr}, stage4{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(CamNet);

torch::Tensor upsample(const torch::Tensor &maps, int64_t H, int64_t W) {
  return F::interpolate(maps, F::InterpolateFuncOptions().size(std::vector<int64_t>{H, W}).mode(torch::kBilinear).align_corners(false));
}

// Min-max normalisation of every map to [0, 1]; maps [N, 1, H, W].
torch::Tensor normalize_maps(const torch::Tensor &maps, double eps) {
  // FACT: m = torch.nn.functional.interpolate(torch.rand(6, 1, 4, 4), size=(8, 8), mode='bilinear', align_corners=False); assert is_view_of(m.flatten(1), m)
  auto flat = maps.flatten(1); // LOOKALIKE: tensor-reshape-non-contiguous -- the upsampled maps are contiguous: flatten is a view
  auto lo = std::get<0>(flat.min(1, /*keepdim=*/true));
  auto range = std::get<0>(flat.max(1, /*keepdim=*/true)) - lo;
  // FACT: f = torch.rand(6, 64); lo = f.min(1, keepdim=True)[0]; r = f.max(1, keepdim=True)[0] - lo; r.clamp_min_(1e-7); o = f - lo; o.div_(r); assert is_copy_of(r, f) and is_copy_of(o, f) and is_view_of(o.view(6, 1, 8, 8), o)
  range.clamp_min_(eps); // LOOKALIKE: tensor-alias-then-mutate -- the difference is a tensor of its own
  auto out = flat - lo;
  out.div_(range); // LOOKALIKE: tensor-alias-then-mutate -- flat - lo is new: the caller's maps are untouched
  return out.view_as(maps); // LOOKALIKE: tensor-view-non-contiguous -- out is contiguous
}

// Grad-CAM (Selvaraju et al. 2017) without hooks: forward once, keep the activations, and ask for
// the gradient of each class score with the graph retained.
class GradCam {
public:
  GradCam(CamNet net, const ExplainConfig &cfg) : net_(std::move(net)), cfg_(cfg) {}

  torch::Tensor attach(const torch::Tensor &images) {
    net_->eval();
    auto out = net_->forward(images);
    logits_ = out.logits;
    acts_ = out.features;
    return logits_.detach();
  }

  torch::Tensor class_gradients(const torch::Tensor &cls) {
    // FACT: t = torch.randint(0, 9, (4, 3)); s = t.select(1, 2); assert not is_contiguous(s) and is_view_of(s.view(-1, 1), t)
    auto score = logits_.gather(1, cls.view({-1, 1})).sum(); // LOOKALIKE: tensor-view-non-contiguous -- splitting one dim in two is a view even of a strided column
    return torch::autograd::grad({score}, {acts_}, {}, /*retain_graph=*/true)[0];
  }

  // ReLU(sum_k alpha_k A_k) at the activations' resolution: [B, 1, h, w].
  torch::Tensor cam(const torch::Tensor &cls) {
    auto grads = class_gradients(cls);
    auto magnitude = grads.detach();
    // FACT: g = torch.randn(2, 4, 3, 3); m = g.detach(); m.abs_(); assert shares_storage(m, g) and bool((g >= 0).all())
    magnitude.abs_(); // EXPECT: tensor-inplace-on-detached -- magnitude is grads itself: the channel weights below lose their sign
    grad_mag_ = magnitude.mean({1, 2, 3});
    auto alpha = grads.mean({2, 3}, /*keepdim=*/true);
    torch::NoGradGuard no_grad;
    torch::Tensor weighted = acts_;
    // FACT: x = torch.randn(2, 4, 3, 3, requires_grad=True); a = torch.relu(x); w = a; before = a.detach().clone(); exec("with torch.no_grad(): w.mul_(torch.rand(2, 4, 1, 1) + 1.0)"); assert shares_storage(w, a) and not torch.equal(a.detach(), before) and backward_fails(lambda: a.sum().backward())
    weighted.mul_(alpha); // EXPECT: tensor-alias-then-mutate -- weighted is the retained activations: the next class's gradient and map start from the already-weighted tensor
    return torch::relu(weighted.sum(1, /*keepdim=*/true));
  }

  // Normalised maps for the k best classes of every image: [B, k, H, W].
  torch::Tensor topk_maps(const torch::Tensor &logits, int64_t H, int64_t W) {
    const auto k = cfg_.top_k, B = logits.size(0);
    auto top = std::get<1>(logits.topk(k, 1));
    std::vector<torch::Tensor> maps;
    for (int64_t j = 0; j < k; ++j)
      maps.push_back(cam(top.select(1, j))); // LOOKALIKE: tensor-graph-kept-across-iterations -- cam computes its map under NoGradGuard
    auto stacked = torch::stack(maps); // [k, B, 1, h, w]
    // FACT: m = torch.rand(3, 4, 1, 5, 5); r = m.transpose(0, 1).reshape(12, 1, 5, 5); assert is_copy_of(r, m)
    auto per_image = stacked.transpose(0, 1).reshape({B * k, 1, stacked.size(3), stacked.size(4)}); // EXPECT: tensor-reshape-non-contiguous -- image-major order needs a full copy; torch::stack(maps, 1) gives it directly
    // FACT: u = torch.nn.functional.interpolate(torch.rand(12, 1, 5, 5), size=(8, 8), mode='bilinear', align_corners=False); assert is_view_of(u.view(4, 3, 8, 8), u)
    return normalize_maps(upsample(per_image, H, W), cfg_.eps).view({B, k, H, W}); // LOOKALIKE: tensor-view-non-contiguous -- normalize_maps returns a contiguous tensor
  }

  // Grad-CAM of the predicted class's probability; also returns the runner-up class.
  std::pair<torch::Tensor, torch::Tensor> probability_cam() {
    auto probs = torch::softmax(logits_, 1);
    auto pred = probs.argmax(1, /*keepdim=*/true);
    auto score = probs.gather(1, pred).sum();
    // FACT: x = torch.randn(2, 5, requires_grad=True); p = torch.softmax(x * 1.0, 1); i = p.argmax(1, keepdim=True); s = p.gather(1, i).sum(); p.scatter_(1, i, 0.0); assert backward_fails(lambda: torch.autograd.grad(s, x))
    probs.scatter_(1, pred, 0.0); // EXPECT: tensor-inplace-on-saved -- softmax saved its result for backward: the grad call below raises
    auto runner_up = probs.argmax(1);
    auto grads = torch::autograd::grad({score}, {acts_}, {}, /*retain_graph=*/true)[0];
    torch::NoGradGuard no_grad;
    auto map = torch::relu((grads.mean({2, 3}, true) * acts_).sum(1, true));
    return {map, runner_up};
  }

  const torch::Tensor &grad_magnitude() const { return grad_mag_; }

private:
  CamNet net_;
  ExplainConfig cfg_;
  torch::Tensor logits_, acts_, grad_mag_;
};

// Integrated gradients (Sundararajan et al. 2017), midpoint Riemann sum over cfg.ig_steps points.
torch::Tensor integrated_gradients(CamNet &net, const torch::Tensor &images, const torch::Tensor &cls, const torch::Tensor &baseline,
                                   const ExplainConfig &cfg, torch::Device device) {
  net->eval();
  auto x = images.to(device);
  auto point = torch::empty_like(x).requires_grad_(true);
  auto grad_sum = torch::zeros_like(x);
  std::vector<torch::Tensor> path_scores;
  for (int64_t s = 0; s < cfg.ig_steps; ++s) {
    const double a = (static_cast<double>(s) + 0.5) / static_cast<double>(cfg.ig_steps);
    auto base = baseline.to(device); // EXPECT: tensor-clone-in-loop -- the same baseline is copied to the device at every step
    {
      torch::NoGradGuard no_grad;
      point.copy_(base + a * (x - base)); // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard; the forward below still records
    }
    auto score = net->forward(point).logits.gather(1, cls.view({-1, 1}));
    auto g = torch::autograd::grad({score.sum()}, {point})[0];
    grad_sum += g; // LOOKALIKE: tensor-graph-kept-across-iterations -- autograd::grad without create_graph returns a gradient with no history
    path_scores.push_back(score); // EXPECT: tensor-graph-kept-across-iterations -- every step's graph stays reachable from the kept scores
  }
  auto attributions = grad_sum * (x - baseline.to(device)) / static_cast<double>(cfg.ig_steps);
  // Completeness: the attributions should add up to f(x) - f(baseline), here read off the path ends.
  auto path = torch::cat(path_scores, 1);
  auto gap = attributions.sum({1, 2, 3}) - (path.select(1, cfg.ig_steps - 1) - path.select(1, 0));
  std::cout << "integrated gradients: max completeness gap " << gap.abs().max().item<double>() << "\n";
  return attributions;
}

// Blend a "hot" colour ramp of the heatmap over the image; both [B, C, H, W] in [0, 1].
torch::Tensor overlay(const torch::Tensor &rgb, const torch::Tensor &heat, double alpha) {
  auto colour = torch::cat({heat, heat.pow(2), torch::zeros_like(heat)}, 1); // LOOKALIKE: tensor-device-mismatch -- zeros_like takes heat's device
  return rgb * (1.0 - alpha) + colour * alpha;
}

// [B, 3, H, W] in [0, 1] -> bytes for the image writer.
torch::Tensor to_bytes(const torch::Tensor &img) {
  auto bytes = torch::empty(img.sizes(), torch::TensorOptions().dtype(torch::kByte));
  // FACT: b = torch.empty(3, dtype=torch.uint8); b.copy_(torch.tensor([0.999, 0.5, 0.2]) * 255); assert b.tolist() == [254, 127, 51]
  bytes.copy_(img * 255.0); // EXPECT: tensor-copy-narrowing -- float to uint8 truncates: every pixel level is rounded down
  return bytes;
}

torch::Tensor to_hwc(const torch::Tensor &img) { return img.permute({0, 2, 3, 1}); }

void write_ppm(const std::string &path, const torch::Tensor &rows) {
  std::ofstream f(path, std::ios::binary);
  f << "P6\n" << rows.size(1) / 3 << " " << rows.size(0) << "\n255\n";
  f.write(reinterpret_cast<const char *>(rows.data_ptr<uint8_t>()), rows.numel());
}

void save_overlays(const torch::Tensor &blended, const std::vector<std::string> &names, const std::string &dir) {
  auto hwc = to_hwc(to_bytes(blended.cpu()));
  const auto B = hwc.size(0), H = hwc.size(1);
  // FACT: x = torch.zeros(2, 3, 4, 5, dtype=torch.uint8); h = x.permute(0, 2, 3, 1); assert raises(lambda: h.view(2, 4, -1), "view size is not compatible")
  auto rows = hwc.view({B, H, -1}); // EXPECT: tensor-view-non-contiguous -- a permuted NCHW image cannot merge W and C into one row: this throws
  for (int64_t b = 0; b < B; ++b)
    write_ppm(dir + "/" + names[b] + ".ppm", rows[b]);
}

void explain_loader(CamNet &net, const std::vector<ImageBatch> &loader, const ExplainConfig &cfg) {
  torch::Device device(torch::kCUDA);
  net->to(device);
  GradCam gc(net, cfg);
  auto mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1});
  auto stdv = torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}).to(device);
  auto conf_sum = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t seen = 0, step = 0;
  for (const auto &batch : loader) {
    auto x = batch.images.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
    auto logits = gc.attach(x);
    auto pct = torch::softmax(logits, 1);
    pct.mul_(100.0); // LOOKALIKE: tensor-inplace-on-saved -- attach returns detached logits: softmax recorded nothing
    auto top1 = std::get<0>(pct.max(1));
    conf_sum += top1.sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- computed from detached logits
    if (++step % cfg.log_every == 0)
      std::cout << "batch " << step << " top-1 confidence " << top1.mean().item<float>() << "%\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every batches
    auto maps = gc.topk_maps(logits, x.size(2), x.size(3));
    auto rgb = (x * stdv + mean).clamp(0.0, 1.0); // EXPECT: tensor-device-mismatch -- the mean stayed on the host while x and stdv are on the GPU
    save_overlays(overlay(rgb, maps.select(1, 0).unsqueeze(1), cfg.overlay_alpha), batch.names, cfg.out_dir);
    seen += x.size(0);
  }
  std::cout << "mean top-1 confidence " << conf_sum.item<double>() / static_cast<double>(seen) << "%\n";
}

// Debug view for one batch: integrated gradients against a box-blurred baseline next to the
// probability Grad-CAM.
void explain_debug(CamNet &net, const ImageBatch &batch, const ExplainConfig &cfg, torch::Device device) {
  net->to(device);
  const auto r = cfg.blur_kernel / 2;
  auto baseline = F::avg_pool2d(batch.images, F::AvgPool2dFuncOptions(cfg.blur_kernel).stride(1).padding(r).count_include_pad(false));
  auto ig = integrated_gradients(net, batch.images, batch.labels.to(device), baseline, cfg, device);
  GradCam gc(net, cfg);
  gc.attach(batch.images.to(device));
  auto [map, runner_up] = gc.probability_cam();
  auto ig_map = normalize_maps(ig.abs().sum(1, /*keepdim=*/true), cfg.eps);
  auto cam_map = normalize_maps(upsample(map, batch.images.size(2), batch.images.size(3)), cfg.eps);
  std::cout << "IG/Grad-CAM agreement " << F::cosine_similarity(ig_map.flatten(1), cam_map.flatten(1)).mean().item<double>()
            << ", first runner-up class " << runner_up[0].item<int64_t>() << "\n";
}
