// Mosaic / letterbox augmentation for a YOLOv8-style detector, plus the training driver using it.
#include <torch/torch.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
using torch::indexing::Slice;
using Sizes = std::vector<std::array<int64_t, 2>>;

struct AugConfig {
  int64_t img_size = 640, max_shift = 64;
  double pad_value = 114.0, flip_prob = 0.5, brightness = 0.4;
  int close_mosaic = 10;  // last epochs run on plain letterboxed images
};

struct Sample { torch::Tensor image, boxes, classes; };  // boxes are xyxy in pixels

struct Batch {
  torch::Tensor images;
  std::vector<torch::Tensor> boxes, classes;
};

torch::Tensor channel_mean(const torch::Tensor& hwc) {
  // FACT: x = torch.zeros(8, 8, 3, dtype=torch.uint8).permute(2, 0, 1); assert is_view_of(x.flatten(1), x)
  return hwc.permute({2, 0, 1}).flatten(1).to(torch::kFloat).mean(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent after the permute, flatten(1) is a view
}

std::vector<Sample> load_samples(const std::string& root, int64_t count) {
  std::vector<Sample> out;
  auto mean = torch::zeros({3});
  for (int64_t i = 0; i < count; ++i) {
    torch::Tensor hwc, boxes, classes;
    const auto id = std::to_string(i);
    torch::load(hwc, root + "/img_" + id + ".pt");
    torch::load(boxes, root + "/box_" + id + ".pt");
    torch::load(classes, root + "/cls_" + id + ".pt");
    mean += channel_mean(hwc) / double(count);
    out.push_back({hwc.permute({2, 0, 1}).contiguous(), boxes.to(torch::kFloat), classes.to(torch::kLong)});
  }
  std::cout << "loaded " << out.size() << " images, mean rgb " << mean << "\n";
  return out;
}

torch::Tensor resize_f(const torch::Tensor& img, int64_t h, int64_t w) {
  auto opts = F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false);
  return F::interpolate(img.unsqueeze(0).to(torch::kFloat), opts).squeeze(0);
}

Sample letterbox(const torch::Tensor& img, const torch::Tensor& boxes, const torch::Tensor& classes,
                 int64_t size, double pad_value) {
  const int64_t h = img.size(1), w = img.size(2);
  const double r = std::min(double(size) / h, double(size) / w);
  const int64_t nh = std::lround(h * r), nw = std::lround(w * r);
  const int64_t top = (size - nh) / 2, left = (size - nw) / 2;
  auto resized = resize_f(img, nh, nw);
  auto canvas = torch::full({3, size, size}, pad_value, img.options());
  canvas.index({Slice(), Slice(top, top + nh), Slice(left, left + nw)}).copy_(resized);  // EXPECT: tensor-copy-narrowing
  auto offset = torch::tensor({double(left), double(top), double(left), double(top)}, boxes.options());
  auto out = boxes.to(torch::kFloat);
  // FACT: b = torch.rand(5, 4); assert shares_storage(b.to(torch.float32), b)
  out.mul_(r).add_(offset);  // EXPECT: tensor-alias-then-mutate
  return {canvas, out, classes};
}

Sample load_mosaic(const std::array<const Sample*, 4>& four, const AugConfig& cfg, std::mt19937& rng) {
  const int64_t s = cfg.img_size;
  std::uniform_int_distribution<int64_t> centre(s / 2, 3 * s / 2);
  const int64_t xc = centre(rng), yc = centre(rng);
  auto canvas = torch::full({3, 1, 1}, cfg.pad_value, torch::kUInt8).expand({3, 2 * s, 2 * s});
  std::vector<torch::Tensor> boxes, classes;
  for (int i = 0; i < 4; ++i) {
    const Sample& smp = *four[i];
    const int64_t h0 = smp.image.size(1), w0 = smp.image.size(2);
    const double r = double(s) / std::max(h0, w0);
    const int64_t h = std::lround(h0 * r), w = std::lround(w0 * r);
    auto img = resize_f(smp.image, h, w).round_().clamp_(0, 255).to(torch::kUInt8);
    const bool right = i & 1, bottom = i & 2;
    const int64_t x1a = right ? xc : std::max<int64_t>(xc - w, 0), x2a = right ? std::min(xc + w, 2 * s) : xc;
    const int64_t y1a = bottom ? yc : std::max<int64_t>(yc - h, 0), y2a = bottom ? std::min(yc + h, 2 * s) : yc;
    const int64_t x1b = right ? 0 : w - (x2a - x1a), y1b = bottom ? 0 : h - (y2a - y1a);
    const int64_t x2b = x1b + (x2a - x1a), y2b = y1b + (y2a - y1a);
    // FACT: assert raises(lambda: torch.full((3, 1, 1), 114, dtype=torch.uint8).expand(3, 16, 16)[:, 2:6, 2:6].copy_(torch.zeros(3, 4, 4, dtype=torch.uint8)), "more than one element")
    canvas.index({Slice(), Slice(y1a, y2a), Slice(x1a, x2a)}).copy_(img.index({Slice(), Slice(y1b, y2b), Slice(x1b, x2b)}));  // EXPECT: tensor-inplace-on-expanded // LOOKALIKE: tensor-copy-narrowing -- the tile was rounded and converted to uint8 above
    const double padw = double(x1a - x1b), padh = double(y1a - y1b);
    boxes.push_back(smp.boxes * r + torch::tensor({padw, padh, padw, padh}, smp.boxes.options()));
    classes.push_back(smp.classes);
  }
  auto b = torch::cat(boxes).sub_(double(s / 2)).clamp_(0, double(s));
  auto c = torch::cat(classes);
  auto keep = ((b.select(1, 2) - b.select(1, 0)) > 2) & ((b.select(1, 3) - b.select(1, 1)) > 2);
  auto crop = canvas.narrow(1, s / 2, s).narrow(2, s / 2, s).contiguous();
  return {crop, b.index({keep}), c.index({keep})};
}

void random_translate(Sample& smp, int64_t dx, double pad_value) {
  if (dx <= 0) return;
  const int64_t w = smp.image.size(2);
  // FACT: x = torch.arange(30.).view(3, 1, 10); x.narrow(2, 2, 8).copy_(x.narrow(2, 0, 8)); assert not torch.equal(x[0, 0, 2:], torch.arange(8.))
  smp.image.narrow(2, dx, w - dx).copy_(smp.image.narrow(2, 0, w - dx));  // EXPECT: tensor-inplace-overlap
  smp.image.narrow(2, 0, dx).fill_(pad_value);
  smp.boxes.select(1, 0).add_(dx);
  smp.boxes.select(1, 2).add_(dx).clamp_max_(double(w));
}

void random_hflip(Sample& smp, std::mt19937& rng, double p) {
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  if (coin(rng) >= p) return;
  const double w = double(smp.image.size(2));
  smp.image = smp.image.flip({2}).clone();  // EXPECT: tensor-unnecessary-clone
  auto x1 = w - smp.boxes.select(1, 2);
  auto x2 = w - smp.boxes.select(1, 0);
  // FACT: b = torch.rand(5, 4); x1 = 8 - b.select(1, 2); assert is_copy_of(x1, b)
  smp.boxes.select(1, 0).copy_(x1);  // LOOKALIKE: tensor-inplace-overlap -- both sources were computed out of place before either write
  smp.boxes.select(1, 2).copy_(x2);
}

torch::Tensor random_brightness(const torch::Tensor& img, double gain) {
  auto f = img.to(torch::kFloat);
  // FACT: a = torch.zeros(3, 8, 8, dtype=torch.uint8); assert is_copy_of(a.to(torch.float32), a)
  f.mul_(gain).clamp_(0, 255);  // LOOKALIKE: tensor-alias-then-mutate -- images are uint8, so to(kFloat) allocates a new tensor
  return f.to(torch::kUInt8);
}

Batch next_batch(const std::vector<Sample>& samples, const AugConfig& cfg, int64_t batch_size, bool mosaic,
                 std::mt19937& rng) {
  std::uniform_int_distribution<size_t> pick(0, samples.size() - 1);
  std::uniform_int_distribution<int64_t> shift(0, cfg.max_shift);
  std::uniform_real_distribution<double> gain(1.0 - cfg.brightness, 1.0 + cfg.brightness);
  Batch out;
  std::vector<torch::Tensor> images;
  for (int64_t k = 0; k < batch_size; ++k) {
    Sample smp;
    if (mosaic) {
      std::array<const Sample*, 4> four{};
      for (auto& p : four) p = &samples[pick(rng)];
      smp = load_mosaic(four, cfg, rng);
      random_translate(smp, shift(rng), cfg.pad_value);
    } else {
      const Sample& src = samples[pick(rng)];
      smp = letterbox(src.image, src.boxes, src.classes, cfg.img_size, cfg.pad_value);
    }
    random_hflip(smp, rng, cfg.flip_prob);
    images.push_back(random_brightness(smp.image, gain(rng)));
    out.boxes.push_back(smp.boxes);
    out.classes.push_back(smp.classes);
  }
  out.images = torch::stack(images);
  return out;
}

struct ConvBnActImpl : torch::nn::Module {
  ConvBnActImpl(int64_t cin, int64_t cout, int64_t k, int64_t s)
      : conv(torch::nn::Conv2dOptions(cin, cout, k).stride(s).padding(k / 2).bias(false)), bn(cout) {
    register_module("conv", conv);
    register_module("bn", bn);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::silu(bn(conv(x))); }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(ConvBnAct);

struct BottleneckImpl : torch::nn::Module {
  explicit BottleneckImpl(int64_t c) : cv1(c, c, 3, 1), cv2(c, c, 3, 1) {
    register_module("cv1", cv1);
    register_module("cv2", cv2);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = cv2(cv1(x));
    // FACT: assert not backward_fails(lambda: [x := torch.randn(2, 4, 6, 6, requires_grad=True), y := torch.nn.functional.silu(x * 2), y.add_(x), y.sum().backward()])
    return y.add_(x);  // LOOKALIKE: tensor-inplace-on-saved -- SiLU saves its input, not its output, so the residual add can run in place
  }
  ConvBnAct cv1, cv2;
};
TORCH_MODULE(Bottleneck);

struct DetectImpl : torch::nn::Module {
  DetectImpl(int64_t nc, const std::vector<int64_t>& channels, std::vector<double> strides)
      : nc(nc), strides(std::move(strides)) {
    for (size_t i = 0; i < channels.size(); ++i) {
      box_convs.push_back(register_module("box" + std::to_string(i), torch::nn::Conv2d(channels[i], 4, 1)));
      cls_convs.push_back(register_module("cls" + std::to_string(i), torch::nn::Conv2d(channels[i], nc, 1)));
    }
  }
  void bias_init() {
    {
      torch::NoGradGuard no_grad;
      // FACT: assert raises(lambda: torch.nn.Conv2d(8, 4, 1).bias.fill_(1.0), "leaf Variable")
      for (auto& conv : box_convs) conv->bias.fill_(1.0);  // LOOKALIKE: tensor-inplace-on-leaf -- inside the NoGradGuard scope
    }
    for (size_t i = 0; i < cls_convs.size(); ++i)
      cls_convs[i]->bias.fill_(std::log(5.0 / nc / std::pow(640.0 / strides[i], 2)));  // EXPECT: tensor-inplace-on-leaf
  }
  torch::Tensor forward(const std::vector<torch::Tensor>& feats) {
    std::vector<torch::Tensor> outs;
    for (size_t i = 0; i < feats.size(); ++i)
      outs.push_back(torch::cat({box_convs[i]->forward(feats[i]), cls_convs[i]->forward(feats[i])}, 1).flatten(2));
    return torch::cat(outs, 2);
  }

  int64_t nc;
  std::vector<double> strides;
  std::vector<torch::nn::Conv2d> box_convs, cls_convs;
};
TORCH_MODULE(Detect);

struct TinyYoloImpl : torch::nn::Module {
  explicit TinyYoloImpl(int64_t nc)
      : backbone(ConvBnAct(3, 32, 3, 4), Bottleneck(32), ConvBnAct(32, 64, 3, 2)), p4(64, 128, 3, 2),
        p5(128, 256, 3, 2), head(nc, std::vector<int64_t>{64, 128, 256}, std::vector<double>{8, 16, 32}) {
    register_module("backbone", backbone);
    register_module("p4", p4);
    register_module("p5", p5);
    register_module("head", head);
  }
  torch::Tensor forward(const torch::Tensor& x, Sizes& sizes) {
    auto f3 = backbone->forward(x);
    auto f4 = p4(f3);
    auto f5 = p5(f4);
    sizes.clear();
    for (const auto& f : {f3, f4, f5}) sizes.push_back({f.size(2), f.size(3)});
    return head(std::vector<torch::Tensor>{f3, f4, f5});
  }
  torch::nn::Sequential backbone;
  ConvBnAct p4, p5;
  Detect head;
};
TORCH_MODULE(TinyYolo);

std::pair<torch::Tensor, torch::Tensor> make_anchors(const Sizes& sizes, const std::vector<double>& strides) {
  std::vector<torch::Tensor> points, stride_list;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto sy = torch::arange(sizes[i][0], torch::kFloat) + 0.5;
    auto sx = torch::arange(sizes[i][1], torch::kFloat) + 0.5;
    auto grid = torch::meshgrid({sy, sx}, "ij");
    // FACT: g = torch.meshgrid(torch.arange(4.), torch.arange(5.), indexing="ij"); s = torch.stack([g[1], g[0]], -1); assert is_contiguous(s) and is_view_of(s.view(-1, 2), s)
    points.push_back(torch::stack({grid[1], grid[0]}, -1).view({-1, 2}));  // LOOKALIKE: tensor-view-non-contiguous -- stack returns a fresh contiguous tensor
    stride_list.push_back(torch::full({sizes[i][0] * sizes[i][1], 1}, strides[i]));
  }
  return {torch::cat(points), torch::cat(stride_list)};
}

torch::Tensor detection_loss(const torch::Tensor& raw, const Batch& batch, const Sizes& sizes,
                             const std::vector<double>& strides, int64_t nc) {
  const int64_t B = raw.size(0), A = raw.size(2);
  auto [anchor_pts, stride_t] = make_anchors(sizes, strides);
  auto centers = anchor_pts * stride_t;
  auto pred = raw.permute({0, 2, 1});
  auto ltrb = pred.narrow(2, 0, 4);
  auto logits = pred.narrow(2, 4, nc);
  auto pred_boxes = torch::cat({centers - ltrb.narrow(2, 0, 2) * stride_t, centers + ltrb.narrow(2, 2, 2) * stride_t}, -1);  // EXPECT: tensor-device-mismatch
  auto target_scores = torch::zeros({B, A, nc});
  auto target_boxes = torch::zeros({B, A, 4});
  auto fg = torch::zeros({B, A}, torch::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const auto& gb = batch.boxes[b];
    if (gb.size(0) == 0) continue;
    auto inside = (centers.unsqueeze(0) > gb.narrow(1, 0, 2).unsqueeze(1)).all(-1) &
                  (centers.unsqueeze(0) < gb.narrow(1, 2, 2).unsqueeze(1)).all(-1);
    auto area = (gb.select(1, 2) - gb.select(1, 0)) * (gb.select(1, 3) - gb.select(1, 1));
    // FACT: a = torch.rand(3, 1).expand(3, 5); assert is_copy_of(a.masked_fill(torch.rand(3, 5) > 0.5, 1e9), a)
    auto cost = area.unsqueeze(1).expand_as(inside).masked_fill(~inside, std::numeric_limits<float>::infinity());  // LOOKALIKE: tensor-inplace-on-expanded -- out-of-place masked_fill allocates its result
    auto best = cost.min(0);
    auto idx = torch::isfinite(std::get<0>(best)).nonzero().squeeze(1);
    auto gt_idx = std::get<1>(best).index({idx});
    fg[b].index_put_({idx}, true);
    target_boxes[b].index_put_({idx}, gb.index({gt_idx}));
    target_scores[b].index_put_({idx, batch.classes[b].index({gt_idx})}, 1.0);
  }
  const auto n_fg = std::max<int64_t>(fg.sum().item<int64_t>(), 1);
  auto fg_d = fg.to(raw.device());
  auto t = target_scores.to(raw.device()).view({-1, nc});
  // FACT: x = torch.rand(2, 4 + 3, 20).permute(0, 2, 1).narrow(2, 4, 3); assert is_copy_of(x.reshape(-1, 3), x)
  auto scores = logits.reshape({-1, nc}).sigmoid();  // EXPECT: tensor-reshape-non-contiguous
  // FACT: assert backward_fails(lambda: [s := torch.randn(4, 3, requires_grad=True).sigmoid(), s.clamp_(1e-4, 1 - 1e-4), s.log().sum().backward()])
  scores.clamp_(1e-4, 1.0 - 1e-4);  // EXPECT: tensor-inplace-on-saved
  auto cls_loss = -(t * scores.log() + (1 - t) * (1 - scores).log()).sum() / double(n_fg);
  auto box_loss = F::l1_loss(pred_boxes.index({fg_d}), target_boxes.to(raw.device()).index({fg_d}),
                             F::L1LossFuncOptions().reduction(torch::kSum)) / double(n_fg);
  return cls_loss + 0.05 * box_loss;
}

int main(int argc, char** argv) {
  AugConfig cfg;
  const int64_t nc = 80, epochs = 100;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  std::mt19937 rng(0);
  const auto samples = load_samples(argc > 1 ? argv[1] : "data/train", 512);
  const int64_t batch_size = 16, steps = int64_t(samples.size()) / batch_size;
  TinyYolo model(nc);
  model->to(device);
  model->head->bias_init();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.937).nesterov(true));
  Sizes sizes;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    const bool mosaic = epoch < epochs - cfg.close_mosaic;
    double running_loss = 0.0;
    for (int64_t it = 0; it < steps; ++it) {
      Batch batch = next_batch(samples, cfg, batch_size, mosaic, rng);
      auto images = batch.images.to(device).to(torch::kFloat) / 255.0;  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step, the transfer cannot be hoisted
      auto raw = model->forward(images, sizes);
      auto loss = detection_loss(raw, batch, sizes, model->head->strides, nc);
      opt.zero_grad();
      loss.backward();
      opt.step();
      running_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- item() keeps a double, the graph is released
    }
    std::printf("epoch %d  mosaic=%d  loss %.4f\n", int(epoch), int(mosaic), running_loss / std::max<int64_t>(steps, 1));
    torch::save(model, "tiny_yolo.pt");
  }
  return 0;
}
