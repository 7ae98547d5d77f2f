// Panoptic-DeepLab style bottom-up panoptic segmentation: semantic logits, a class-agnostic
// instance center heatmap and per-pixel center offsets, grouped into instances at inference.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
using torch::indexing::Slice;

struct PanopticConfig {
  int64_t num_classes = 19, ignore_label = 255, label_divisor = 1000;
  std::vector<int64_t> thing_ids = {11, 12, 13, 14, 15, 16, 17, 18};
  std::vector<double> class_weights = std::vector<double>(19, 1.0);
  double sigma = 8.0, center_threshold = 0.1;
  int64_t nms_kernel = 7, top_k = 200, stuff_area = 2048;
  double center_loss_weight = 200.0, offset_loss_weight = 0.01;
  int64_t batch_size = 8, epochs = 60, log_every = 50;
};

struct Segment {
  int64_t id, category;
  bool is_thing, crowd;
};

struct PanopticSample {
  torch::Tensor image, panoptic;
  std::vector<Segment> segments;
};

struct Targets {
  torch::Tensor semantic, center, center_weights, offset, offset_weights;
};

class PanopticTargetGenerator {
 public:
  explicit PanopticTargetGenerator(const PanopticConfig& cfg) : cfg_(cfg) {
    radius_ = std::lround(3 * cfg.sigma);
    auto x = torch::arange(2 * radius_ + 1, torch::kFloat) - double(radius_);
    auto g1 = torch::exp(-x * x / (2 * cfg.sigma * cfg.sigma));
    gaussian_ = g1.view({-1, 1}).expand({2 * radius_ + 1, 2 * radius_ + 1});
    // FACT: g = torch.rand(5); assert raises(lambda: g.view(-1, 1).expand(5, 5).mul_(g.view(1, -1)), "more than one element")
    gaussian_.mul_(g1.view({1, -1}));  // EXPECT: tensor-inplace-on-expanded
  }

  Targets operator()(const torch::Tensor& pan, const std::vector<Segment>& segments) const {
    const int64_t H = pan.size(0), W = pan.size(1);
    Targets t;
    t.semantic = torch::full({H, W}, cfg_.ignore_label, torch::kLong);
    t.center = torch::zeros({1, H, W});
    t.center_weights = torch::ones({1, H, W});
    t.offset = torch::zeros({2, H, W});
    t.offset_weights = torch::zeros({1, H, W});
    auto ys = torch::arange(H, torch::kFloat).view({H, 1}).expand({H, W});
    auto xs = torch::arange(W, torch::kFloat).view({1, W}).expand({H, W});
    auto thing_mask = torch::zeros({H, W}, torch::kBool);
    for (const auto& seg : segments) {
      auto mask = pan == seg.id;
      t.semantic.masked_fill_(mask, seg.category);
      if (seg.crowd) t.center_weights[0].masked_fill_(mask, 0.0);
      if (!seg.is_thing || seg.crowd) continue;
      auto py = ys.index({mask}), px = xs.index({mask});
      if (py.numel() == 0) continue;
      thing_mask.logical_or_(mask);
      const double cy = py.mean().item<double>(), cx = px.mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- targets are built on the host, item() on a CPU tensor does not stall a device
      t.offset[0].index_put_({mask}, cy - py);
      t.offset[1].index_put_({mask}, cx - px);
      const int64_t iy = std::lround(cy), ix = std::lround(cx);
      const int64_t y0 = std::max<int64_t>(iy - radius_, 0), y1 = std::min(iy + radius_ + 1, H);
      const int64_t x0 = std::max<int64_t>(ix - radius_, 0), x1 = std::min(ix + radius_ + 1, W);
      auto patch = t.center[0].index({Slice(y0, y1), Slice(x0, x1)});
      auto g = gaussian_.index({Slice(y0 - iy + radius_, y1 - iy + radius_), Slice(x0 - ix + radius_, x1 - ix + radius_)});
      // FACT: p = torch.zeros(8, 8); q = p[2:5, 2:5]; assert is_copy_of(torch.maximum(q, torch.rand(3, 3)), p)
      patch.copy_(torch::maximum(patch, g));  // LOOKALIKE: tensor-inplace-overlap -- maximum() writes a new tensor, the copy source does not alias the patch
    }
    t.offset_weights[0].copy_(thing_mask);  // LOOKALIKE: tensor-copy-narrowing -- bool into float is a widening conversion
    return t;
  }

 private:
  PanopticConfig cfg_;
  int64_t radius_;
  torch::Tensor gaussian_;
};

struct ConvBnReluImpl : torch::nn::Module {
  ConvBnReluImpl(int64_t cin, int64_t cout, int64_t k, int64_t stride)
      : conv(torch::nn::Conv2dOptions(cin, cout, k).stride(stride).padding(k / 2).bias(false)), bn(cout) {
    register_module("conv", conv);
    register_module("bn", bn);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(bn(conv(x))); }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(ConvBnRelu);

struct PanopticOutput {
  torch::Tensor semantic, center, offset;
};

struct PanopticNetImpl : torch::nn::Module {
  explicit PanopticNetImpl(const PanopticConfig& cfg)
      : stem(3, 32, 3, 2), layer2(32, 64, 3, 2), layer3(64, 128, 3, 2), layer4(128, 256, 3, 2),
        aspp(256, 128, 1, 1), skip(64, 32, 1, 1), fuse(160, 128, 3, 1),
        sem_head(torch::nn::Conv2dOptions(128, cfg.num_classes, 1)),
        center_head(torch::nn::Conv2dOptions(128, 1, 1)),
        offset_head(torch::nn::Conv2dOptions(128, 2, 1)) {
    register_module("stem", stem);
    register_module("layer2", layer2);
    register_module("layer3", layer3);
    register_module("layer4", layer4);
    register_module("aspp", aspp);
    register_module("skip", skip);
    register_module("fuse", fuse);
    register_module("sem_head", sem_head);
    register_module("center_head", center_head);
    register_module("offset_head", offset_head);
  }

  PanopticOutput forward(const torch::Tensor& x) {
    auto f4 = layer2(stem(x));
    auto f16 = aspp(layer4(layer3(f4)));
    auto up = F::interpolate(f16, F::InterpolateFuncOptions()
                                      .size(std::vector<int64_t>{f4.size(2), f4.size(3)})
                                      .mode(torch::kBilinear)
                                      .align_corners(false));
    auto y = fuse(torch::cat({up, skip(f4)}, 1));
    // FACT: assert backward_fails(lambda: [x := torch.randn(2, 4, 6, 6, requires_grad=True), y := torch.relu(x * 2), y.add_(1.0), y.sum().backward()])
    y.add_(up);  // EXPECT: tensor-inplace-on-saved
    auto full = F::InterpolateFuncOptions()
                    .size(std::vector<int64_t>{x.size(2), x.size(3)})
                    .mode(torch::kBilinear)
                    .align_corners(false);
    PanopticOutput out{F::interpolate(sem_head(y), full), F::interpolate(center_head(y), full),
                       F::interpolate(offset_head(y), full)};
    // FACT: assert not backward_fails(lambda: [x := torch.randn(2, 2, 4, 4, requires_grad=True), y := torch.nn.functional.interpolate(x * 2, size=(8, 8), mode="bilinear", align_corners=False), y.mul_(2.0), y.sum().backward()])
    out.offset.mul_(double(x.size(2)) / double(y.size(2)));  // LOOKALIKE: tensor-inplace-on-saved -- bilinear upsampling saves only sizes, its output is free to rescale
    return out;
  }

  ConvBnRelu stem, layer2, layer3, layer4, aspp, skip, fuse;
  torch::nn::Conv2d sem_head, center_head, offset_head;
};
TORCH_MODULE(PanopticNet);

struct LossParts {
  torch::Tensor total, semantic, center, offset;
};

LossParts panoptic_loss(const PanopticOutput& out, const Targets& t, const torch::Tensor& class_weights,
                        const PanopticConfig& cfg) {
  auto sem = F::cross_entropy(out.semantic, t.semantic,
                              F::CrossEntropyFuncOptions().ignore_index(cfg.ignore_label).weight(class_weights));
  auto ctr = (F::mse_loss(out.center, t.center, F::MSELossFuncOptions().reduction(torch::kNone)) * t.center_weights)
                 .sum() / t.center_weights.sum().clamp_min(1.0);
  auto fg = (t.offset_weights > 0).view({-1});
  // FACT: x = torch.rand(2, 2, 4, 4).permute(0, 2, 3, 1); assert raises(lambda: x.view(-1, 2), "view size is not compatible")
  auto pred = out.offset.permute({0, 2, 3, 1}).view({-1, 2}).index({fg});  // EXPECT: tensor-view-non-contiguous
  // FACT: x = torch.rand(2, 2, 4, 4).permute(0, 2, 3, 1); assert is_contiguous(x.contiguous()) and not raises(lambda: x.contiguous().view(-1, 2))
  auto target = t.offset.permute({0, 2, 3, 1}).contiguous().view({-1, 2}).index({fg});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() materialises the permuted layout first
  auto off = F::l1_loss(pred, target, F::L1LossFuncOptions().reduction(torch::kSum)) / fg.sum().clamp_min(1);
  return {sem + cfg.center_loss_weight * ctr + cfg.offset_loss_weight * off, sem, ctr, off};
}

torch::Tensor find_instance_centers(const torch::Tensor& center, const PanopticConfig& cfg) {
  auto ctr = center.squeeze(0);
  // FACT: h = torch.rand(1, 8, 8); c = h.squeeze(0); assert is_view_of(c, h)
  ctr.masked_fill_(ctr < cfg.center_threshold, -1.0);  // EXPECT: tensor-alias-then-mutate
  auto pooled = F::max_pool2d(ctr.unsqueeze(0), F::MaxPool2dFuncOptions(cfg.nms_kernel).stride(1).padding(cfg.nms_kernel / 2));
  auto peaks = ((ctr == pooled.squeeze(0)) & (ctr > 0)).nonzero();
  if (peaks.size(0) > cfg.top_k) {
    auto scores = ctr.index({peaks.select(1, 0), peaks.select(1, 1)});
    peaks = peaks.index({std::get<1>(scores.topk(cfg.top_k))});
  }
  return peaks.to(torch::kFloat);
}

torch::Tensor group_pixels(const torch::Tensor& offsets, const torch::Tensor& centers) {
  const int64_t H = offsets.size(1), W = offsets.size(2);
  auto grid = torch::meshgrid({torch::arange(H, offsets.options()), torch::arange(W, offsets.options())}, "ij");
  auto coords = torch::stack(grid, -1).view({-1, 2});
  // FACT: x = torch.rand(2, 4, 4).permute(1, 2, 0); assert is_view_of(x.reshape(-1, 2), x)
  auto votes = coords + offsets.permute({1, 2, 0}).reshape({-1, 2});  // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent after the permute, the reshape is a view
  auto dist = torch::cdist(votes.unsqueeze(0), centers.unsqueeze(0)).squeeze(0);
  return dist.argmin(1).view({H, W}) + 1;
}

int64_t panoptic_inference(const PanopticOutput& out, const PanopticConfig& cfg, torch::Tensor& panoptic) {
  auto sem = out.semantic.argmax(1).squeeze(0);
  auto counts = torch::bincount(sem.flatten(), {}, cfg.num_classes);
  // FACT: x = torch.rand(1, 3, 4, 4); assert is_copy_of(x.argmax(1).squeeze(0), x)
  sem.masked_fill_((counts < cfg.stuff_area).index({sem}), cfg.ignore_label);  // LOOKALIKE: tensor-alias-then-mutate -- sem views a fresh argmax result that nothing else holds
  auto thing_ids = torch::tensor(cfg.thing_ids);
  auto is_thing = (sem.unsqueeze(-1) == thing_ids).any(-1);  // EXPECT: tensor-device-mismatch
  auto centers = find_instance_centers(out.center.squeeze(0), cfg);
  auto instance = torch::zeros_like(sem);
  if (centers.size(0) > 0) instance = group_pixels(out.offset.squeeze(0), centers).masked_fill(~is_thing, 0);
  panoptic.copy_(sem * cfg.label_divisor + instance);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ may cross devices
  return centers.size(0);
}

torch::Tensor count_peaks(const torch::Tensor& heat, const PanopticConfig& cfg) {
  auto pooled = F::max_pool2d(heat, F::MaxPool2dFuncOptions(cfg.nms_kernel).stride(1).padding(cfg.nms_kernel / 2));
  return ((heat == pooled) & (heat > cfg.center_threshold)).sum();
}

std::vector<PanopticSample> load_split(const std::string& root, int64_t count) {
  std::vector<PanopticSample> out;
  for (int64_t i = 0; i < count; ++i) {
    PanopticSample s;
    torch::Tensor table;
    torch::load(s.image, root + "/image_" + std::to_string(i) + ".pt");
    torch::load(s.panoptic, root + "/pan_" + std::to_string(i) + ".pt");
    torch::load(table, root + "/segments_" + std::to_string(i) + ".pt");
    auto acc = table.accessor<int64_t, 2>();
    for (int64_t k = 0; k < table.size(0); ++k) s.segments.push_back({acc[k][0], acc[k][1], acc[k][2] != 0, acc[k][3] != 0});
    out.push_back(std::move(s));
  }
  return out;
}

std::pair<torch::Tensor, Targets> make_batch(const std::vector<PanopticSample>& data, const std::vector<size_t>& idx,
                                             const PanopticTargetGenerator& gen, torch::Device device) {
  std::vector<torch::Tensor> img, sem, ctr, ctr_w, off, off_w;
  for (auto i : idx) {
    auto t = gen(data[i].panoptic, data[i].segments);
    img.push_back(data[i].image);
    sem.push_back(t.semantic), ctr.push_back(t.center), ctr_w.push_back(t.center_weights);
    off.push_back(t.offset), off_w.push_back(t.offset_weights);
  }
  Targets t{torch::stack(sem).to(device), torch::stack(ctr).to(device), torch::stack(ctr_w).to(device),
            torch::stack(off).to(device), torch::stack(off_w).to(device)};
  return {torch::stack(img).to(device), t};
}

void evaluate(PanopticNet& model, const std::vector<PanopticSample>& val, const PanopticTargetGenerator& gen,
              const PanopticConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  double center_mse = 0.0;
  int64_t instances = 0;
  for (size_t i = 0; i < val.size(); ++i) {
    auto out = model->forward(val[i].image.unsqueeze(0).to(device));
    auto t = gen(val[i].panoptic, val[i].segments);
    center_mse += F::mse_loss(out.center.squeeze(0), t.center.to(device)).item<double>();  // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-clone-in-loop -- every image brings its own target
    auto panoptic = torch::empty({val[i].panoptic.size(0), val[i].panoptic.size(1)}, torch::kInt);
    instances += panoptic_inference(out, cfg, panoptic);
    if (i == 0) torch::save(out.center.cpu(), "center_debug.pt");
  }
  std::printf("val: center mse %.5f, %.1f instances per image\n", center_mse / val.size(),
              double(instances) / val.size());
  model->train();
}

int main(int argc, char** argv) {
  PanopticConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  const std::string root = argc > 1 ? argv[1] : "data/cityscapes";
  auto train = load_split(root + "/train", 2975), val = load_split(root + "/val", 500);
  PanopticTargetGenerator gen(cfg);
  PanopticNet model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto class_weights = torch::tensor(cfg.class_weights, torch::kFloat);
  std::vector<size_t> order(train.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(0);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<torch::Tensor> epoch_losses;
    auto num_peaks = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    for (size_t start = 0; start + cfg.batch_size <= order.size(); start += cfg.batch_size) {
      std::vector<size_t> idx(order.begin() + start, order.begin() + start + cfg.batch_size);
      auto [images, targets] = make_batch(train, idx, gen, device);
      auto out = model->forward(images);
      auto losses = panoptic_loss(out, targets, class_weights.to(device), cfg);  // EXPECT: tensor-clone-in-loop
      auto heat = out.center.detach();
      // FACT: assert backward_fails(lambda: [x := torch.randn(2, 1, 4, 4, requires_grad=True), y := x * 2, l := torch.nn.functional.mse_loss(y, torch.rand(2, 1, 4, 4), reduction="none").sum(), y.detach().clamp_(0, 1), l.backward()])
      heat.clamp_(0.0, 1.0);  // EXPECT: tensor-inplace-on-detached
      num_peaks += count_peaks(heat, cfg);
      opt.zero_grad();
      losses.total.backward();
      opt.step();
      epoch_losses.push_back(losses.total);  // EXPECT: tensor-graph-kept-across-iterations
      if (++step % cfg.log_every == 0)
        std::printf("step %ld  loss %.4f\n", long(step), losses.total.item<double>());  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps, not every step
    }
    std::printf("epoch %ld  mean loss %.4f  peaks/batch %.1f\n", long(epoch),
                torch::stack(epoch_losses).mean().item<double>(),
                num_peaks.item<double>() / std::max<size_t>(epoch_losses.size(), 1));
    evaluate(model, val, gen, cfg, device);
    torch::save(model, "panoptic_deeplab.pt");
  }
  return 0;
}
