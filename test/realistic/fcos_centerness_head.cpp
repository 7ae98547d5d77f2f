// FCOS (Tian et al., 2019) anchor-free detection head over a five-level feature pyramid (P3-P7).
// Every feature-map location is a sample: inside a box (with centre sampling and per-level size
// ranges) it regresses its distances to the four sides, in units of the level's stride. Classes
// are trained with a sigmoid focal loss, boxes with a GIoU loss weighted by the centerness target,
// and the centerness branch with BCE. Decoding keeps the locations above a score threshold per
// level and returns the best max_dets per image ranked by sqrt(score * centerness).
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct FcosConfig {
  int64_t num_classes = 80, in_channels = 256, num_convs = 4, gn_groups = 32, input_h = 800, input_w = 1088;
  std::vector<int64_t> strides{8, 16, 32, 64, 128};
  std::vector<double> size_lo{0, 64, 128, 256, 512}, size_hi{64, 128, 256, 512, 1e8};
  double prior_prob = 0.01, focal_alpha = 0.25, focal_gamma = 2.0, center_radius = 1.5;
  double score_thresh = 0.05, lr = 0.01, momentum = 0.9, weight_decay = 1e-4;
  int64_t pre_nms_topk = 1000, max_dets = 100, epochs = 12, log_every = 20;
};

struct GtInstances { torch::Tensor boxes, labels; };                 // [M, 4] xyxy, [M] int64 in [0, C)
struct DetBatch { torch::Tensor images; std::vector<GtInstances> targets; };
struct LevelOut { torch::Tensor cls, reg, ctr; };                    // [N, C, H, W], [N, 4, H, W], [N, 1, H, W]
struct FcosTargets { torch::Tensor labels, reg; };                   // [P] (C = background), [P, 4]
struct FcosLosses { torch::Tensor cls, box, ctr, total; };
struct Detections { torch::Tensor boxes, scores, labels; };

constexpr double kInf = 1e8;

// The backbone and FPN are a frozen, scripted feature extractor: P3-P7 at strides 8 ... 128.
using FeatureFn = std::function<std::vector<torch::Tensor>(const torch::Tensor &)>;

// A learnable scalar per level: the shared regression head serves objects of different sizes.
struct ScaleImpl : nn::Module {
  explicit ScaleImpl(double init) { scale = register_parameter("scale", torch::full({1}, init)); }
  torch::Tensor forward(const torch::Tensor &x) { return x * scale; }
  torch::Tensor scale;
};
TORCH_MODULE(Scale);

nn::Sequential make_tower(const FcosConfig &cfg) {
  nn::Sequential tower;
  for (int64_t i = 0; i < cfg.num_convs; ++i) {
    tower->push_back(nn::Conv2d(nn::Conv2dOptions(cfg.in_channels, cfg.in_channels, 3).padding(1)));
    tower->push_back(nn::GroupNorm(nn::GroupNormOptions(cfg.gn_groups, cfg.in_channels)));
    tower->push_back(nn::ReLU());
  }
  return tower;
}

struct FcosHeadImpl : nn::Module {
  explicit FcosHeadImpl(const FcosConfig &cfg) {
    cls_tower = register_module("cls_tower", make_tower(cfg));
    box_tower = register_module("box_tower", make_tower(cfg));
    cls_logits = register_module("cls_logits", nn::Conv2d(nn::Conv2dOptions(cfg.in_channels, cfg.num_classes, 3).padding(1)));
    bbox_pred = register_module("bbox_pred", nn::Conv2d(nn::Conv2dOptions(cfg.in_channels, 4, 3).padding(1)));
    centerness = register_module("centerness", nn::Conv2d(nn::Conv2dOptions(cfg.in_channels, 1, 3).padding(1)));
    for (size_t l = 0; l < cfg.strides.size(); ++l)
      scales.push_back(register_module("scale" + std::to_string(l), Scale(1.0)));
    for (auto &m : modules(/*include_self=*/false))
      if (auto *conv = m->as<nn::Conv2d>()) {
        nn::init::normal_(conv->weight, 0.0, 0.01); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own no-grad guard
        nn::init::constant_(conv->bias, 0.0);
      }
    // focal-loss prior: every location starts as background with probability 1 - prior_prob
    const double bias_value = -std::log((1.0 - cfg.prior_prob) / cfg.prior_prob);
    // FACT: c = torch.nn.Conv2d(8, 4, 3, padding=1); assert raises(lambda: c.bias.fill_(-4.59), "a leaf Variable that requires grad")
    cls_logits->bias.fill_(bias_value); // EXPECT: tensor-inplace-on-leaf
  }

  std::vector<LevelOut> forward(const std::vector<torch::Tensor> &features) {
    std::vector<LevelOut> outs;
    for (size_t l = 0; l < features.size(); ++l) {
      auto c = cls_tower->forward(features[l]), b = box_tower->forward(features[l]);
      // centerness sits on the regression tower (the FCOS follow-up's choice)
      outs.push_back({cls_logits(c), torch::exp(scales[l]->forward(bbox_pred(b))), centerness(b)});
    }
    return outs;
  }

  nn::Sequential cls_tower{nullptr}, box_tower{nullptr};
  nn::Conv2d cls_logits{nullptr}, bbox_pred{nullptr}, centerness{nullptr};
  std::vector<Scale> scales;
};
TORCH_MODULE(FcosHead);

// Centres of the cells of one level in image coordinates, row-major: [H * W, 2] as (x, y).
torch::Tensor level_locations(int64_t h, int64_t w, int64_t stride) {
  auto xs = torch::arange(0, w * stride, stride, torch::kFloat), ys = torch::arange(0, h * stride, stride, torch::kFloat);
  return torch::stack({xs.repeat({h}), ys.repeat_interleave(w)}, 1) + static_cast<double>(stride / 2);
}

std::pair<torch::Tensor, torch::Tensor> assign_image(const torch::Tensor &points, const torch::Tensor &range_lo,
                                                     const torch::Tensor &range_hi, const torch::Tensor &stride,
                                                     const GtInstances &gt, const FcosConfig &cfg) {
  const auto L = points.size(0), M = gt.boxes.size(0);
  if (M == 0)
    return {torch::full({L}, cfg.num_classes, gt.labels.options()), torch::zeros({L, 4}, points.options())};
  auto xs = points.select(1, 0).unsqueeze(1), ys = points.select(1, 1).unsqueeze(1); // [L, 1]
  auto b = gt.boxes.unsqueeze(0);                                                    // [1, M, 4]
  auto ltrb = torch::stack({xs - b.select(2, 0), ys - b.select(2, 1), b.select(2, 2) - xs, b.select(2, 3) - ys}, 2);
  auto cx = (b.select(2, 0) + b.select(2, 2)) / 2, cy = (b.select(2, 1) + b.select(2, 3)) / 2;
  auto radius = stride * cfg.center_radius;
  auto in_center = ((xs - cx).abs() < radius) & ((ys - cy).abs() < radius);
  auto in_box = std::get<0>(ltrb.min(2)) > 0;
  auto max_dist = std::get<0>(ltrb.max(2));
  auto in_level = (max_dist >= range_lo) & (max_dist <= range_hi);
  auto area = (gt.boxes.select(1, 2) - gt.boxes.select(1, 0)) * (gt.boxes.select(1, 3) - gt.boxes.select(1, 1));
  // the smallest box wins an ambiguous location; the others are priced out
  auto loc_area = area.unsqueeze(0).expand({L, M});
  auto invalid = (in_box & in_center & in_level).logical_not();
  // FACT: a = torch.rand(5); e = a.unsqueeze(0).expand(7, 5); assert raises(lambda: e.add_(torch.ones(7, 5) * 1e8), "single memory location")
  loc_area.add_(invalid.to(loc_area.scalar_type()) * kInf); // EXPECT: tensor-inplace-on-expanded
  auto [min_area, gt_idx] = loc_area.min(1);
  auto labels = gt.labels.index_select(0, gt_idx);
  // FACT: l = torch.tensor([3, 7]); i = torch.tensor([0, 1, 1]); s = l.index_select(0, i); s.masked_fill_(torch.tensor([True, False, False]), 80); assert is_copy_of(s, l) and l.tolist() == [3, 7]
  labels.masked_fill_(min_area >= kInf, cfg.num_classes); // LOOKALIKE: tensor-alias-then-mutate -- index_select gathered a new tensor; the gt labels are untouched
  return {labels, ltrb.index({torch::arange(L, gt_idx.options()), gt_idx})};
}

// Targets in the order of the flattened predictions: level-major, then image, then location.
FcosTargets assign_targets(const torch::Tensor &points, const std::vector<int64_t> &counts, const std::vector<GtInstances> &gts,
                           const FcosConfig &cfg) {
  std::vector<torch::Tensor> lo, hi, st;
  for (size_t l = 0; l < counts.size(); ++l) {
    const auto o = points.options();
    lo.push_back(torch::full({counts[l]}, cfg.size_lo[l], o)), hi.push_back(torch::full({counts[l]}, cfg.size_hi[l], o));
    st.push_back(torch::full({counts[l]}, static_cast<double>(cfg.strides[l]), o));
  }
  auto range_lo = torch::cat(lo).unsqueeze(1), range_hi = torch::cat(hi).unsqueeze(1), stride = torch::cat(st).unsqueeze(1);
  std::vector<std::vector<torch::Tensor>> labels(counts.size()), reg(counts.size());
  for (const auto &gt : gts) {
    auto [lab, ltrb] = assign_image(points, range_lo, range_hi, stride, gt, cfg);
    auto lab_l = lab.split_with_sizes(counts), reg_l = (ltrb / stride).split_with_sizes(counts);
    for (size_t l = 0; l < counts.size(); ++l)
      labels[l].push_back(lab_l[l]), reg[l].push_back(reg_l[l]);
  }
  std::vector<torch::Tensor> lab_cat, reg_cat;
  for (size_t l = 0; l < counts.size(); ++l)
    lab_cat.push_back(torch::cat(labels[l])), reg_cat.push_back(torch::cat(reg[l]));
  return {torch::cat(lab_cat), torch::cat(reg_cat)};
}

// [N, K, H, W] -> [N, H, W, K]: the order the targets use.
torch::Tensor to_nhwc(const torch::Tensor &t) { return t.permute({0, 2, 3, 1}); }

torch::Tensor sigmoid_focal_loss(const torch::Tensor &logits, const torch::Tensor &onehot, double alpha, double gamma) {
  auto p = torch::sigmoid(logits);
  // FACT: x = torch.randn(6, 3, requires_grad=True); p = torch.sigmoid(x); p.clamp_(1e-4, 1 - 1e-4); assert backward_fails(lambda: p.sum().backward())
  p.clamp_(1e-4, 1.0 - 1e-4); // EXPECT: tensor-inplace-on-saved
  auto ce = F::binary_cross_entropy_with_logits(logits, onehot, F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
  auto p_t = p * onehot + (1 - p) * (1 - onehot);
  auto a_t = alpha * onehot + (1 - alpha) * (1 - onehot);
  return (a_t * (1 - p_t).pow(gamma) * ce).sum();
}

// GIoU of boxes given as (l, t, r, b) distances from the same location, weighted per row.
torch::Tensor giou_loss(const torch::Tensor &pred, const torch::Tensor &target, const torch::Tensor &weight) {
  auto pl = pred.select(1, 0), pt = pred.select(1, 1), pr = pred.select(1, 2), pb = pred.select(1, 3);
  auto tl = target.select(1, 0), tt = target.select(1, 1), tr = target.select(1, 2), tb = target.select(1, 3);
  auto inter = (torch::min(pl, tl) + torch::min(pr, tr)) * (torch::min(pt, tt) + torch::min(pb, tb));
  auto union_area = (pl + pr) * (pt + pb) + (tl + tr) * (tt + tb) - inter;
  // FACT: x = torch.rand(6, requires_grad=True); u = (x * 2) - x * 0.5; u.clamp_min_(1e-7); r = x / u; r.sum().backward(); assert x.grad is not None
  union_area.clamp_min_(1e-7); // LOOKALIKE: tensor-inplace-on-saved -- written before the division saves it; sub saves nothing
  auto ious = inter / union_area;
  auto enclose = (torch::max(pl, tl) + torch::max(pr, tr)) * (torch::max(pt, tt) + torch::max(pb, tb)) + 1e-7;
  auto gious = ious - (enclose - union_area) / enclose;
  return ((1 - gious) * weight).sum();
}

torch::Tensor centerness_target(const torch::Tensor &ltrb) {
  auto l = ltrb.select(1, 0), t = ltrb.select(1, 1), r = ltrb.select(1, 2), b = ltrb.select(1, 3);
  return (torch::min(l, r) / torch::max(l, r) * (torch::min(t, b) / torch::max(t, b))).sqrt();
}

FcosLosses fcos_loss(const std::vector<LevelOut> &outs, const FcosTargets &tg, const FcosConfig &cfg) {
  std::vector<torch::Tensor> cls_flat, reg_flat, ctr_flat;
  for (const auto &o : outs) {
    const auto C = o.cls.size(1);
    // FACT: x = torch.randn(2, 5, 4, 6); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(-1, 5), x)
    cls_flat.push_back(to_nhwc(o.cls).reshape({-1, C})); // EXPECT: tensor-reshape-non-contiguous
    // FACT: x = torch.randn(2, 4, 4, 6); assert raises(lambda: x.permute(0, 2, 3, 1).view(-1, 4), "view size is not compatible")
    reg_flat.push_back(to_nhwc(o.reg).view({-1, 4})); // EXPECT: tensor-view-non-contiguous
    // FACT: x = torch.randn(2, 1, 4, 6); assert is_view_of(x.permute(0, 2, 3, 1).reshape(-1), x)
    ctr_flat.push_back(to_nhwc(o.ctr).reshape({-1})); // LOOKALIKE: tensor-reshape-non-contiguous -- one channel: moving it last keeps the memory order, so this is a view
  }
  auto cls = torch::cat(cls_flat), reg = torch::cat(reg_flat), ctr = torch::cat(ctr_flat);
  auto pos = (tg.labels < cfg.num_classes).nonzero().squeeze(1);
  const double num_pos = std::max<double>(1.0, static_cast<double>(pos.numel()));
  auto onehot = F::one_hot(tg.labels, cfg.num_classes + 1).narrow(1, 0, cfg.num_classes).to(cls.scalar_type());
  auto reg_t = tg.reg.index_select(0, pos);
  auto ctr_t = centerness_target(reg_t);
  FcosLosses out;
  out.cls = sigmoid_focal_loss(cls, onehot, cfg.focal_alpha, cfg.focal_gamma) / num_pos;
  out.box = giou_loss(reg.index_select(0, pos), reg_t, ctr_t) / ctr_t.sum().clamp_min(1e-6);
  out.ctr = F::binary_cross_entropy_with_logits(ctr.index_select(0, pos), ctr_t,
                                                F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum)) / num_pos;
  out.total = out.cls + out.box + out.ctr;
  return out;
}

std::vector<Detections> decode(const std::vector<LevelOut> &outs, const std::vector<torch::Tensor> &locations, int64_t img_h,
                               int64_t img_w, const FcosConfig &cfg) {
  torch::NoGradGuard no_grad;
  const auto N = outs[0].cls.size(0);
  std::vector<std::vector<torch::Tensor>> boxes(N), scores(N), labels(N);
  for (size_t l = 0; l < outs.size(); ++l) {
    const auto C = outs[l].cls.size(1);
    // FACT: x = torch.randn(2, 5, 4, 6); assert is_view_of(x.permute(0, 2, 3, 1).reshape(2, -1, 5), x)
    auto probs = to_nhwc(outs[l].cls).reshape({N, -1, C}).sigmoid(); // LOOKALIKE: tensor-reshape-non-contiguous -- merges only H and W, which stay in memory order: a view
    // FACT: c = torch.randn(2, 1, 4, 6); assert is_view_of(c.permute(0, 2, 3, 1).reshape(2, -1), c)
    auto ctr = to_nhwc(outs[l].ctr).reshape({N, -1}).sigmoid(); // LOOKALIKE: tensor-reshape-non-contiguous -- the centerness map has one channel: a view
    // FACT: x = torch.randn(2, 4, 4, 6); assert is_view_of(x.permute(0, 2, 3, 1).view(2, -1, 4), x)
    auto reg = to_nhwc(outs[l].reg).view({N, -1, 4}) * static_cast<double>(cfg.strides[l]); // LOOKALIKE: tensor-view-non-contiguous -- merges H and W only: the strides allow it
    // candidates are chosen on the class probability alone; centerness only re-ranks them
    auto ranked = probs.contiguous();
    // FACT: p = torch.rand(2, 24, 5).sigmoid(); s = p.contiguous(); s.mul_(torch.rand(2, 24, 1)); assert shares_storage(s, p)
    ranked.mul_(ctr.unsqueeze(-1)); // EXPECT: tensor-alias-then-mutate
    auto candidates = probs > cfg.score_thresh;
    for (int64_t i = 0; i < N; ++i) {
      auto cand = candidates[i].nonzero(); // [K, 2]: (location, class)
      auto sc = ranked[i].index({cand.select(1, 0), cand.select(1, 1)});
      if (sc.size(0) > cfg.pre_nms_topk) {
        auto top = std::get<1>(sc.topk(cfg.pre_nms_topk));
        cand = cand.index_select(0, top);
        sc = sc.index_select(0, top);
      }
      auto loc = locations[l].index_select(0, cand.select(1, 0));
      auto d = reg[i].index_select(0, cand.select(1, 0));
      auto bx = torch::stack({loc.select(1, 0) - d.select(1, 0), loc.select(1, 1) - d.select(1, 1),
                              loc.select(1, 0) + d.select(1, 2), loc.select(1, 1) + d.select(1, 3)}, 1);
      // FACT: l = torch.rand(5, 2); d = torch.rand(5, 4); b = torch.stack([l[:, 0] - d[:, 0], l[:, 1] - d[:, 1], l[:, 0] + d[:, 2], l[:, 1] + d[:, 3]], 1); b.narrow(1, 0, 2).clamp_min_(0); assert is_copy_of(b, l) and is_copy_of(b, d)
      bx.narrow(1, 0, 2).clamp_min_(0.0); // LOOKALIKE: tensor-alias-then-mutate -- stack made a new tensor; writing its columns is the idiom
      bx.select(1, 2).clamp_max_(static_cast<double>(img_w));
      bx.select(1, 3).clamp_max_(static_cast<double>(img_h));
      boxes[i].push_back(bx); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph
      scores[i].push_back(sc.sqrt());
      labels[i].push_back(cand.select(1, 1));
    }
  }
  std::vector<Detections> dets;
  for (int64_t i = 0; i < N; ++i) {
    auto b = torch::cat(boxes[i]), s = torch::cat(scores[i]), c = torch::cat(labels[i]);
    auto keep = std::get<1>(s.topk(std::min(cfg.max_dets, s.size(0)))); // class-aware NMS runs downstream
    dets.push_back({b.index_select(0, keep), s.index_select(0, keep), c.index_select(0, keep)});
  }
  return dets;
}

void train_fcos(const FeatureFn &fpn, FcosHead &head, const std::vector<DetBatch> &loader, const FcosConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  head->to(device);
  torch::optim::SGD opt(head->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).weight_decay(cfg.weight_decay));
  // the padded input size is fixed, and so are the locations of every level
  std::vector<torch::Tensor> locations;
  std::vector<int64_t> counts;
  int64_t h = (cfg.input_h + 7) / 8, w = (cfg.input_w + 7) / 8; // P3 of the padded input
  for (size_t l = 0; l < cfg.strides.size(); ++l, h = (h + 1) / 2, w = (w + 1) / 2)
    locations.push_back(level_locations(h, w, cfg.strides[l])), counts.push_back(h * w);
  auto all_points = torch::cat(locations);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    head->train();
    double epoch_loss = 0;
    auto epoch_box = torch::zeros({}, torch::TensorOptions().device(device)), epoch_cls = torch::zeros_like(epoch_box);
    for (const auto &batch : loader) {
      auto images = batch.images.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto points = all_points.to(device); // EXPECT: tensor-clone-in-loop
      std::vector<GtInstances> gts;
      for (const auto &t : batch.targets)
        gts.push_back({t.boxes.to(device), t.labels.to(device)});
      auto outs = head->forward(fpn(images));
      auto losses = fcos_loss(outs, assign_targets(points, counts, gts, cfg), cfg);
      opt.zero_grad();
      losses.total.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        for (auto &s : head->scales)
          s->scale.clamp_(0.1, 10.0); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard, after the step
      }
      epoch_loss += losses.total.item<double>(); // EXPECT: tensor-sync-in-loop
      epoch_box += losses.box; // EXPECT: tensor-graph-kept-across-iterations
      epoch_cls += losses.cls.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: only the value is kept
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " cls " << losses.cls.item<double>() << " box " << losses.box.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    const auto n = static_cast<double>(loader.size());
    std::cout << "epoch " << epoch << " loss " << epoch_loss / n << " cls " << epoch_cls.item<double>() / n << " giou " << epoch_box.item<double>() / n << "\n";
  }
}
