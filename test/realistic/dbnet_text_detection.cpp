// DBNet scene-text detector: FPN features, probability and threshold maps joined by
// differentiable binarization, shrunk-polygon targets, and box extraction at inference.
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

struct DBConfig {
  double shrink_ratio = 0.4, thresh_min = 0.3, thresh_max = 0.7;
  double bin_thresh = 0.3, box_thresh = 0.6, unclip_ratio = 1.5, k_init = 50.0;
  double ohem_ratio = 3.0, alpha = 1.0, beta = 10.0;
  double lr = 1e-3, weight_decay = 1e-4;
  int64_t batch_size = 8, epochs = 300, min_area = 9, ignore_pad = 2;
};

struct DBTargets {
  torch::Tensor shrink_map, shrink_mask, thresh_map, thresh_mask;
  DBTargets to(torch::Device d) const { return {shrink_map.to(d), shrink_mask.to(d), thresh_map.to(d), thresh_mask.to(d)}; }
};

struct TextSample { torch::Tensor image; DBTargets targets; };

torch::Tensor segment_distance(const torch::Tensor& pts, const torch::Tensor& a, const torch::Tensor& b) {
  auto ab = b - a;
  auto t = ((pts - a) * ab).sum(1) / ab.pow(2).sum().clamp_min(1e-6);
  return (pts - (a + t.clamp(0.0, 1.0).unsqueeze(1) * ab)).norm(2, 1);
}

torch::Tensor inside_polygon(const torch::Tensor& pts, const torch::Tensor& poly) {
  auto px = pts.select(1, 0), py = pts.select(1, 1);
  auto inside = torch::zeros({pts.size(0)}, torch::kBool);
  for (int64_t i = 0, n = poly.size(0); i < n; ++i) {
    auto a = poly[i], b = poly[(i + 1) % n];
    auto crosses = ((a[1] > py) != (b[1] > py)) & (px < (b[0] - a[0]) * (py - a[1]) / (b[1] - a[1] + 1e-9) + a[0]);
    inside.logical_xor_(crosses);
  }
  return inside;
}

void pad_mask_(torch::Tensor& m, int64_t iters) {
  const int64_t h = m.size(0), w = m.size(1);
  for (int64_t i = 0; i < iters; ++i) {
    // FACT: m = torch.zeros(6, 5, dtype=torch.bool); assert raises(lambda: m.narrow(0, 1, 5).logical_or_(m.narrow(0, 0, 5)), "some elements of the input tensor")
    m.narrow(0, 1, h - 1).logical_or_(m.narrow(0, 0, h - 1));  // EXPECT: tensor-inplace-overlap
    // FACT: m = torch.zeros(6, 5, dtype=torch.bool); s = m.narrow(1, 0, 4).clone(); assert is_copy_of(s, m)
    m.narrow(1, 1, w - 1).logical_or_(m.narrow(1, 0, w - 1).clone());  // LOOKALIKE: tensor-inplace-overlap, tensor-unnecessary-clone -- the shifted source must be its own copy, or the write would read columns it has already changed
  }
}

DBTargets make_targets(int64_t H, int64_t W, const torch::Tensor& polys, const torch::Tensor& ignore,
                       const DBConfig& cfg) {
  DBTargets t{torch::zeros({H, W}), torch::ones({H, W}), torch::zeros({H, W}), torch::zeros({H, W})};
  auto ignored = torch::zeros({H, W}, torch::kBool);
  for (int64_t k = 0; k < polys.size(0); ++k) {
    auto poly = polys[k];
    auto px = poly.select(1, 0), py = poly.select(1, 1);
    const double area = 0.5 * std::abs((px * py.roll(-1) - px.roll(-1) * py).sum().item<double>());
    const double perimeter = (poly - poly.roll(-1, 0)).norm(2, 1).sum().item<double>();
    const double d = area * (1 - cfg.shrink_ratio * cfg.shrink_ratio) / std::max(perimeter, 1e-6);
    auto lo = std::get<0>(poly.min(0)), hi = std::get<0>(poly.max(0));
    const int64_t x0 = std::max<int64_t>(std::floor(lo[0].item<double>() - d), 0);
    const int64_t y0 = std::max<int64_t>(std::floor(lo[1].item<double>() - d), 0);
    const int64_t x1 = std::min<int64_t>(std::ceil(hi[0].item<double>() + d) + 1, W);
    const int64_t y1 = std::min<int64_t>(std::ceil(hi[1].item<double>() + d) + 1, H);
    if (x1 <= x0 || y1 <= y0) continue;
    const int64_t h = y1 - y0, w = x1 - x0;
    auto xs = torch::arange(x0, x1, torch::kFloat).view({1, w}).expand({h, w});
    auto ys = torch::arange(y0, y1, torch::kFloat).view({h, 1}).expand({h, w});
    // FACT: x = torch.arange(5.).view(1, 5).expand(4, 5); assert is_copy_of(x.reshape(-1), x)
    auto pts = torch::stack({xs.reshape({-1}), ys.reshape({-1})}, 1);  // EXPECT: tensor-reshape-non-contiguous
    std::vector<torch::Tensor> edge;
    for (int64_t i = 0; i < poly.size(0); ++i) edge.push_back(segment_distance(pts, poly[i], poly[(i + 1) % poly.size(0)]));
    auto dist = torch::stack(edge, 1).amin(1).view({h, w});
    auto inside = inside_polygon(pts, poly).view({h, w});
    auto win = [&](const torch::Tensor& m) { return m.index({Slice(y0, y1), Slice(x0, x1)}); };
    if (ignore[k].item<bool>() || d < 1.0) {
      win(ignored).logical_or_(inside);
      continue;
    }
    auto sm = win(t.shrink_map);
    sm.copy_(sm.logical_or(inside & (dist >= d)));  // LOOKALIKE: tensor-copy-narrowing -- bool into float widens
    auto band = dist < d;
    auto tm = win(t.thresh_map);
    tm.index_put_({band}, torch::maximum(tm.index({band}), 1.0 - dist.index({band}) / d));
    win(t.thresh_mask).masked_fill_(band | inside, 1.0);
  }
  pad_mask_(ignored, cfg.ignore_pad);
  t.shrink_mask.masked_fill_(ignored, 0.0);
  t.thresh_map = t.thresh_map * (cfg.thresh_max - cfg.thresh_min) + cfg.thresh_min;
  return t;
}

torch::Tensor normalize_image(const torch::Tensor& hwc) {
  static const auto mean = torch::tensor({123.7, 116.3, 103.5}).view({3, 1, 1});
  static const auto stdev = torch::tensor({58.4, 57.1, 57.4}).view({3, 1, 1});
  auto x = hwc.permute({2, 0, 1}).to(torch::kFloat);
  // FACT: a = torch.zeros(8, 8, 3, dtype=torch.uint8); assert is_copy_of(a.permute(2, 0, 1).to(torch.float32), a)
  x.sub_(mean).div_(stdev);  // LOOKALIKE: tensor-alias-then-mutate -- the image is uint8, to(kFloat) returns a new tensor
  return x;
}

struct ConvBnReluImpl : torch::nn::Module {
  ConvBnReluImpl(int64_t cin, int64_t cout, int64_t stride)
      : conv(torch::nn::Conv2dOptions(cin, cout, 3).stride(stride).padding(1).bias(false)), bn(cout) {
    register_module("conv", conv);
    register_module("bn", bn);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(bn(conv(x))); }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(ConvBnRelu);

torch::nn::Sequential make_head(int64_t cin) {
  using namespace torch::nn;
  return Sequential(Conv2d(Conv2dOptions(cin, cin / 4, 3).padding(1).bias(false)), BatchNorm2d(cin / 4), ReLU(),
                    ConvTranspose2d(ConvTranspose2dOptions(cin / 4, cin / 4, 2).stride(2)), BatchNorm2d(cin / 4), ReLU(),
                    ConvTranspose2d(ConvTranspose2dOptions(cin / 4, 1, 2).stride(2)));
}

struct DBOutput { torch::Tensor prob, thresh, binary; };

struct DBNetImpl : torch::nn::Module {
  explicit DBNetImpl(const DBConfig& cfg)
      : c2(torch::nn::Sequential(ConvBnRelu(3, 32, 2), ConvBnRelu(32, 64, 2))), c3(64, 128, 2), c4(128, 256, 2),
        c5(256, 256, 2), prob_head(make_head(128)), thresh_head(make_head(128)) {
    register_module("c2", c2);
    register_module("c3", c3);
    register_module("c4", c4);
    register_module("c5", c5);
    const std::vector<int64_t> chans = {64, 128, 256, 256};
    for (size_t i = 0; i < chans.size(); ++i) {
      lateral.push_back(register_module("in" + std::to_string(i), torch::nn::Conv2d(torch::nn::Conv2dOptions(chans[i], 128, 1).bias(false))));
      smooth.push_back(register_module("out" + std::to_string(i), torch::nn::Conv2d(torch::nn::Conv2dOptions(128, 32, 3).padding(1).bias(false))));
    }
    register_module("prob_head", prob_head);
    register_module("thresh_head", thresh_head);
    k = register_parameter("k", torch::full({1}, cfg.k_init));
    for (auto& m : modules(false))
      if (auto* conv = m->as<torch::nn::Conv2d>()) torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under their own NoGradGuard
  }

  DBOutput forward(const torch::Tensor& x) {
    auto f2 = c2->forward(x), f3 = c3(f2), f4 = c4(f3), f5 = c5(f4);
    auto up = [](const torch::Tensor& t, double s) {
      return F::interpolate(t, F::InterpolateFuncOptions().scale_factor(std::vector<double>{s, s}).mode(torch::kNearest));
    };
    std::vector<torch::Tensor> feats{f2, f3, f4, f5}, p(4);
    p[3] = lateral[3](f5);
    for (int i = 2; i >= 0; --i) {
      p[i] = lateral[i](feats[i]);
      // FACT: assert not backward_fails(lambda: [x := torch.randn(2, 8, 4, 4, requires_grad=True), c := torch.nn.Conv2d(8, 8, 1), p := c(x), p.add_(torch.nn.functional.interpolate(c(x)[:, :, :2, :2], scale_factor=2.0)), p.sum().backward()])
      p[i].add_(up(p[i + 1], 2));  // LOOKALIKE: tensor-inplace-on-saved -- a convolution saves its input, not its output, and nearest upsampling saves nothing
    }
    auto fuse = torch::cat({up(smooth[3](p[3]), 8), up(smooth[2](p[2]), 4), up(smooth[1](p[1]), 2), smooth[0](p[0])}, 1);
    auto prob = torch::sigmoid(prob_head->forward(fuse));
    auto thresh = torch::sigmoid(thresh_head->forward(fuse));
    auto e = torch::exp(-k * (prob - thresh));
    // FACT: assert backward_fails(lambda: [x := torch.randn(2, 1, 4, 4, requires_grad=True), e := torch.exp(-50 * x), e.add_(1.0), e.reciprocal().sum().backward()])
    e.add_(1.0);  // EXPECT: tensor-inplace-on-saved
    return {prob, thresh, e.reciprocal()};
  }

  torch::nn::Sequential c2;
  ConvBnRelu c3, c4, c5;
  std::vector<torch::nn::Conv2d> lateral, smooth;
  torch::nn::Sequential prob_head, thresh_head;
  torch::Tensor k;
};
TORCH_MODULE(DBNet);

torch::Tensor balanced_bce(const torch::Tensor& pred, const torch::Tensor& gt, const torch::Tensor& mask, double ratio) {
  auto positive = gt * mask, negative = (1 - gt) * mask;
  const auto pos = positive.sum().item<int64_t>();
  const auto neg = std::min<int64_t>(negative.sum().item<int64_t>(), int64_t(pos * ratio));
  auto loss = F::binary_cross_entropy(pred, gt, F::BinaryCrossEntropyFuncOptions().reduction(torch::kNone));
  auto hard_neg = std::get<0>((loss * negative).view({-1}).topk(neg));
  return ((loss * positive).sum() + hard_neg.sum()) / double(pos + neg + 1e-6);
}

torch::Tensor dice_loss(const torch::Tensor& pred, const torch::Tensor& gt, const torch::Tensor& mask) {
  const int64_t C = pred.size(1);
  // FACT: x = torch.rand(2, 1, 4, 4); assert is_view_of(x.transpose(0, 1).reshape(1, -1), x)
  auto per_channel = [C](const torch::Tensor& t) { return t.transpose(0, 1).reshape({C, -1}); };  // LOOKALIKE: tensor-reshape-non-contiguous -- callers pass one-channel maps, swapping a size-1 dim leaves the layout contiguous
  auto p = per_channel(pred), g = per_channel(gt), m = per_channel(mask);
  auto inter = (p * g * m).sum(1);
  return (1 - 2 * inter / ((p * m).sum(1) + (g * m).sum(1) + 1e-6)).mean();
}

struct DBLoss { torch::Tensor total, prob, thresh, binary; };

DBLoss db_loss(const DBOutput& out, const DBTargets& t, const DBConfig& cfg) {
  auto l_prob = balanced_bce(out.prob.squeeze(1), t.shrink_map, t.shrink_mask, cfg.ohem_ratio);
  auto target = t.thresh_map.clone();  // EXPECT: tensor-unnecessary-clone
  target.mul_(t.thresh_mask);
  auto l_thresh = (out.thresh.squeeze(1) * t.thresh_mask - target).abs().sum() / (t.thresh_mask.sum() + 1e-6);
  auto l_bin = dice_loss(out.binary, t.shrink_map.unsqueeze(1), t.shrink_mask.unsqueeze(1));
  return {l_prob + cfg.alpha * l_bin + cfg.beta * l_thresh, l_prob, l_thresh, l_bin};
}

torch::Tensor batch_fscore(const torch::Tensor& prob, const torch::Tensor& gt, double thresh) {
  auto pred = prob.detach().squeeze(1);
  // FACT: assert backward_fails(lambda: [x := torch.randn(2, 1, 4, 4, requires_grad=True), p := torch.sigmoid(x), l := p.sum(), p.detach().ge_(0.3), l.backward()])
  pred.ge_(thresh);  // EXPECT: tensor-inplace-on-detached
  auto tp = (pred * gt).sum();
  return 2 * tp / (pred.sum() + gt.sum() + 1e-6);
}

torch::Tensor connected_components(const torch::Tensor& bitmap) {
  auto fg = bitmap > 0;
  auto labels = torch::arange(1, bitmap.numel() + 1, bitmap.options()).view_as(bitmap) * fg;
  for (int it = 0; it < 512; ++it) {
    auto grown = F::max_pool2d(labels.unsqueeze(0), F::MaxPool2dFuncOptions(3).stride(1).padding(1)).squeeze(0) * fg;
    if (torch::equal(grown, labels)) break;
    labels = grown;
  }
  return labels;
}

std::pair<torch::Tensor, torch::Tensor> boxes_from_bitmap(const torch::Tensor& prob, const DBConfig& cfg, double sx, double sy) {
  auto bitmap = prob.contiguous();
  // FACT: p = torch.rand(1, 1, 8, 8); b = p[0][0].contiguous(); assert shares_storage(b, p)
  bitmap.gt_(cfg.bin_thresh);  // EXPECT: tensor-alias-then-mutate
  auto labels = connected_components(bitmap).cpu();
  auto ids = std::get<0>(torch::_unique(labels.flatten()));
  auto boxes = torch::zeros({ids.size(0), 4}, torch::kInt);
  auto scores = torch::zeros({ids.size(0)});
  int64_t n = 0;
  for (int64_t k = 0; k < ids.size(0); ++k) {
    if (ids[k].item<float>() == 0) continue;
    auto score_map = prob.to(torch::kCPU);  // EXPECT: tensor-clone-in-loop
    auto mask = labels == ids[k];
    auto yx = mask.nonzero();
    if (yx.size(0) < cfg.min_area) continue;
    const float score = score_map.index({mask}).mean().item<float>();  // LOOKALIKE: tensor-sync-in-loop -- score_map lives on the host, item() does not wait on a device
    if (score < cfg.box_thresh) continue;
    auto lo = std::get<0>(yx.min(0)).to(torch::kFloat), hi = std::get<0>(yx.max(0)).to(torch::kFloat) + 1;
    const double w = (hi[1] - lo[1]).item<double>(), h = (hi[0] - lo[0]).item<double>();
    const double d = w * h * cfg.unclip_ratio / (2 * (w + h));
    auto unclipped = torch::stack({lo[1] - d, lo[0] - d, hi[1] + d, hi[0] + d}) * torch::tensor({sx, sy, sx, sy});
    boxes[n].copy_(unclipped);  // EXPECT: tensor-copy-narrowing
    scores[n++] = score;
  }
  return {boxes.narrow(0, 0, n), scores.narrow(0, 0, n)};
}

std::vector<TextSample> load_icdar(const std::string& root, int64_t count, const DBConfig& cfg) {
  std::vector<TextSample> out;
  for (int64_t i = 0; i < count; ++i) {
    torch::Tensor hwc, polys, ignore;
    torch::load(hwc, root + "/img_" + std::to_string(i) + ".pt");
    torch::load(polys, root + "/poly_" + std::to_string(i) + ".pt");
    torch::load(ignore, root + "/ignore_" + std::to_string(i) + ".pt");
    out.push_back({normalize_image(hwc), make_targets(hwc.size(0), hwc.size(1), polys.to(torch::kFloat), ignore, cfg)});
  }
  return out;
}

int main(int argc, char** argv) {
  DBConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  const std::string root = argc > 1 ? argv[1] : "data/icdar2015";
  auto train = load_icdar(root + "/train", 1000, cfg);
  DBNet model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::vector<size_t> order(train.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(7);
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    auto parts = torch::zeros({3}, torch::TensorOptions().device(device));
    auto fscore = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t steps = 0;
    for (size_t start = 0; start + cfg.batch_size <= order.size(); start += cfg.batch_size, ++steps) {
      std::vector<torch::Tensor> imgs, sm, smk, tm, tmk;
      for (size_t j = start; j < start + cfg.batch_size; ++j) {
        const auto& s = train[order[j]];
        imgs.push_back(s.image), sm.push_back(s.targets.shrink_map), smk.push_back(s.targets.shrink_mask);
        tm.push_back(s.targets.thresh_map), tmk.push_back(s.targets.thresh_mask);
      }
      auto images = torch::stack(imgs).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto targets = DBTargets{torch::stack(sm), torch::stack(smk), torch::stack(tm), torch::stack(tmk)}.to(device);
      auto out = model->forward(images);
      auto losses = db_loss(out, targets, cfg);
      fscore += batch_fscore(out.prob, targets.shrink_map, cfg.bin_thresh);
      opt.zero_grad();
      losses.total.backward();
      opt.step();
      model->k.clamp_(1.0, 100.0);  // EXPECT: tensor-inplace-on-leaf
      for (auto& p : model->parameters())
        if (p.dim() > 1) p.detach().mul_(1.0 - cfg.lr * cfg.weight_decay);  // LOOKALIKE: tensor-inplace-on-detached, tensor-inplace-on-leaf -- decoupled weight decay writes the weights on purpose, after step() and outside any graph
      // FACT: t = torch.zeros(()); [t.add_((torch.rand(3, requires_grad=True) * 2).sum()) for _ in range(3)]; assert t.requires_grad and kept_nodes(t) >= 9
      epoch_loss += losses.total;  // EXPECT: tensor-graph-kept-across-iterations
      parts += torch::stack({losses.prob, losses.thresh, losses.binary}).detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
    }
    parts /= double(std::max<int64_t>(steps, 1));
    std::printf("epoch %ld  loss %.4f (prob %.4f thresh %.4f bin %.4f)  f1 %.3f\n", long(epoch),
                epoch_loss.item<double>() / std::max<int64_t>(steps, 1), parts[0].item<double>(),
                parts[1].item<double>(), parts[2].item<double>(), fscore.item<double>() / std::max<int64_t>(steps, 1));
    if (epoch % 10 == 0) {
      torch::NoGradGuard no_grad;
      model->eval();
      auto out = model->forward(train[0].image.unsqueeze(0).to(device));
      auto det = boxes_from_bitmap(out.prob[0][0], cfg, 1.0, 1.0);
      std::printf("  sample 0: %ld boxes\n", long(det.first.size(0)));
      model->train();
      torch::save(model, "dbnet.pt");
    }
  }
  return 0;
}
