// YOLOX-style decoupled, anchor-free detection head: per-level cls / reg / obj branches,
// flattening to [B, A, 5 + C], grid + stride decoding, confidence thresholding for
// inference, and a simplified SimOTA label assignment for the training loss.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;
using torch::indexing::Slice;

struct YoloxConfig {
  int64_t num_classes = 80;
  int64_t width = 256;
  std::vector<int64_t> in_channels{256, 512, 1024};
  std::vector<int64_t> strides{8, 16, 32};
  double conf_thresh = 0.25;
  double center_radius = 2.5;
  double iou_weight = 3.0;
  int64_t dynamic_topk = 10;
};

struct BaseConvImpl : nn::Module {
  BaseConvImpl(int64_t cin, int64_t cout, int64_t k)
      : conv(nn::Conv2dOptions(cin, cout, k).padding(k / 2).bias(false)),
        bn(nn::BatchNorm2dOptions(cout).eps(1e-3).momentum(0.03)) {
    register_module("conv", conv);
    register_module("bn", bn);
  }
  torch::Tensor forward(const torch::Tensor& x) { return F::silu(bn(conv(x))); }
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
};
TORCH_MODULE(BaseConv);

struct LevelHeadImpl : nn::Module {
  LevelHeadImpl(int64_t cin, int64_t width, int64_t num_classes) {
    stem = register_module("stem", BaseConv(cin, width, 1));
    cls_convs = register_module("cls_convs", nn::Sequential(BaseConv(width, width, 3), BaseConv(width, width, 3)));
    reg_convs = register_module("reg_convs", nn::Sequential(BaseConv(width, width, 3), BaseConv(width, width, 3)));
    cls_pred = register_module("cls_pred", nn::Conv2d(nn::Conv2dOptions(width, num_classes, 1)));
    reg_pred = register_module("reg_pred", nn::Conv2d(nn::Conv2dOptions(width, 4, 1)));
    obj_pred = register_module("obj_pred", nn::Conv2d(nn::Conv2dOptions(width, 1, 1)));
  }

  // [B, 4 + 1 + C, H, W]: raw box deltas, objectness logit, class logits.
  torch::Tensor forward(const torch::Tensor& feat) {
    auto x = stem->forward(feat);
    auto reg_feat = reg_convs->forward(x);
    return torch::cat({reg_pred(reg_feat), obj_pred(reg_feat), cls_pred(cls_convs->forward(x))}, 1);
  }

  BaseConv stem{nullptr};
  nn::Sequential cls_convs{nullptr}, reg_convs{nullptr};
  nn::Conv2d cls_pred{nullptr}, reg_pred{nullptr}, obj_pred{nullptr};
};
TORCH_MODULE(LevelHead);

struct DecoupledHeadImpl : nn::Module {
  explicit DecoupledHeadImpl(const YoloxConfig& cfg) {
    for (size_t k = 0; k < cfg.in_channels.size(); ++k)
      levels.push_back(register_module("level" + std::to_string(k), LevelHead(cfg.in_channels[k], cfg.width, cfg.num_classes)));
  }
  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& feats) {
    std::vector<torch::Tensor> outs;
    for (size_t k = 0; k < levels.size(); ++k) outs.push_back(levels[k]->forward(feats[k]));
    return outs;
  }
  std::vector<LevelHead> levels;
};
TORCH_MODULE(DecoupledHead);

struct FlatOutputs {
  torch::Tensor preds;    // [B, A, 5 + C]
  torch::Tensor grids;    // [1, A, 2]  cell indices (x, y)
  torch::Tensor strides;  // [1, A, 1]
};

FlatOutputs flatten_levels(const std::vector<torch::Tensor>& outs, const std::vector<int64_t>& strides) {
  std::vector<torch::Tensor> flat, grids, stride_maps;
  for (size_t k = 0; k < outs.size(); ++k) {
    const auto& out = outs[k];
    const auto B = out.size(0), C = out.size(1), H = out.size(2), W = out.size(3);
    // FACT: x = torch.randn(2, 7, 3, 4); assert is_view_of(x.permute(0, 2, 3, 1).reshape(2, 12, 7), x)
    flat.push_back(out.permute({0, 2, 3, 1}).reshape({B, H * W, C}));  // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent after the permute: a view
    auto opts = out.options();
    auto mesh = torch::meshgrid({torch::arange(H, opts), torch::arange(W, opts)}, "ij");
    grids.push_back(torch::stack({mesh[1], mesh[0]}, -1).view({1, H * W, 2}));
    stride_maps.push_back(torch::full({1, H * W, 1}, static_cast<double>(strides[k]), opts));
  }
  return {torch::cat(flat, 1), torch::cat(grids, 1), torch::cat(stride_maps, 1)};
}

// Pixel-space anchor centres for every image of the batch, [B, A, 2].
torch::Tensor anchor_centers(const torch::Tensor& grids, const torch::Tensor& strides, int64_t batch) {
  // FACT: g = torch.zeros(1, 6, 2).expand(3, 6, 2); assert raises(lambda: g.add_(0.5), "more than one element")
  auto centers = grids.expand({batch, -1, -1});
  centers.add_(0.5);  // EXPECT: tensor-inplace-on-expanded
  return centers * strides;
}

// (cx, cy, w, h) boxes in input pixels, [B, A, 4].
torch::Tensor decode_boxes(const FlatOutputs& f) {
  const auto B = f.preds.size(0);
  // FACT: s = torch.full((1, 6, 1), 8.0).expand(3, -1, -1); g = torch.zeros(1, 6, 2).expand(3, -1, -1); y = (torch.randn(3, 6, 2) + g) * s; assert is_copy_of(y, s)
  auto strides = f.strides.expand({B, -1, -1});  // LOOKALIKE: tensor-inplace-on-expanded -- only read by the arithmetic below
  auto xy = f.preds.narrow(2, 0, 2) + f.grids;
  xy.mul_(strides);  // LOOKALIKE: tensor-inplace-on-saved -- add saves nothing, and strides does not require grad
  auto wh = f.preds.narrow(2, 2, 2).exp();
  wh.mul_(strides);  // EXPECT: tensor-inplace-on-saved
  return torch::cat({xy, wh}, 2);
}

torch::Tensor cxcywh_to_xyxy(const torch::Tensor& b) {
  auto half = b.narrow(-1, 2, 2) / 2;
  return torch::cat({b.narrow(-1, 0, 2) - half, b.narrow(-1, 0, 2) + half}, -1);
}

torch::Tensor pairwise_iou(const torch::Tensor& a, const torch::Tensor& b) {  // [N, 4] x [M, 4] xyxy -> [N, M]
  auto lt = torch::max(a.narrow(1, 0, 2).unsqueeze(1), b.narrow(1, 0, 2).unsqueeze(0));
  auto rb = torch::min(a.narrow(1, 2, 2).unsqueeze(1), b.narrow(1, 2, 2).unsqueeze(0));
  auto inter = (rb - lt).clamp_min(0).prod(-1);
  auto area_a = (a.narrow(1, 2, 2) - a.narrow(1, 0, 2)).prod(-1);
  auto area_b = (b.narrow(1, 2, 2) - b.narrow(1, 0, 2)).prod(-1);
  return inter / (area_a.unsqueeze(1) + area_b.unsqueeze(0) - inter + 1e-9);
}

struct DecodedOutputs {
  torch::Tensor boxes;     // [B, A, 4] cxcywh
  torch::Tensor obj_prob;  // [B, A, 1]
  torch::Tensor cls_prob;  // [B, A, C]
};

struct Detections {
  torch::Tensor boxes;       // [K, 4] xyxy, float
  torch::Tensor pix_boxes;   // [K, 4] int32, for drawing
  torch::Tensor crop_boxes;  // [K, 4] int32, inside the image
  torch::Tensor scores, labels, class_probs;
};

std::vector<Detections> postprocess(const DecodedOutputs& d, double conf_thresh, int64_t img_size) {
  torch::Tensor scores = d.cls_prob;
  // FACT: a = torch.rand(2, 6, 3); s = a; s *= torch.rand(2, 6, 1); assert shares_storage(s, a) and torch.equal(s, a)
  scores *= d.obj_prob;  // EXPECT: tensor-alias-then-mutate
  std::vector<Detections> results;
  for (int64_t b = 0; b < scores.size(0); ++b) {
    torch::Tensor best, labels;
    std::tie(best, labels) = scores[b].max(1);
    auto keep = best > conf_thresh;
    auto boxes = cxcywh_to_xyxy(d.boxes[b].index({keep}));
    const auto n = boxes.size(0);
    auto pix = torch::empty({n, 4}, torch::kInt);
    pix.copy_(boxes);  // EXPECT: tensor-copy-narrowing
    auto crop = torch::empty({n, 4}, torch::kInt);
    crop.copy_(boxes.round().clamp(0, img_size - 1));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to whole pixels first
    results.push_back({boxes, pix, crop, best.index({keep}), labels.index({keep}), d.cls_prob[b].index({keep})});
  }
  return results;
}

std::vector<Detections> inference(DecoupledHead& head, const std::vector<torch::Tensor>& feats, const YoloxConfig& cfg, int64_t img_size) {
  torch::NoGradGuard no_grad;
  head->eval();
  auto outs = head->forward(feats);
  std::vector<torch::Tensor> per_level;
  for (const auto& o : outs) per_level.push_back(o.flatten(2));  // [B, 5 + C, HW]
  auto preds = torch::cat(per_level, 2).permute({0, 2, 1});      // [B, A, 5 + C]
  const auto B = preds.size(0), C5 = preds.size(2);
  // FACT: x = torch.randn(2, 7, 12); assert raises(lambda: x.permute(0, 2, 1).view(-1, 7), "view size is not compatible")
  auto rows = preds.view({-1, C5});  // EXPECT: tensor-view-non-contiguous
  auto obj = rows.select(1, 4).sigmoid().view({B, -1, 1});
  auto cls = rows.narrow(1, 5, C5 - 5).sigmoid().view({B, -1, C5 - 5});

  auto f = flatten_levels(outs, cfg.strides);
  return postprocess({decode_boxes(f), obj, cls}, cfg.conf_thresh, img_size);
}

struct Assignment {
  torch::Tensor fg_mask;      // [A] bool
  torch::Tensor matched_gt;   // [num_fg] long
  torch::Tensor matched_iou;  // [num_fg]
};

Assignment simota_assign(const torch::Tensor& cls_logits, const torch::Tensor& obj_logits, const torch::Tensor& pred_boxes,
                         const torch::Tensor& gt_boxes, const torch::Tensor& gt_cls, const torch::Tensor& centers,
                         const torch::Tensor& strides, const YoloxConfig& cfg) {
  const auto A = cls_logits.size(0), G = gt_boxes.size(0);
  auto gt_xyxy = cxcywh_to_xyxy(gt_boxes);
  auto cx = centers.select(1, 0).unsqueeze(0), cy = centers.select(1, 1).unsqueeze(0);  // [1, A]
  auto in_box = (cx > gt_xyxy.select(1, 0).unsqueeze(1)) & (cx < gt_xyxy.select(1, 2).unsqueeze(1)) &
                (cy > gt_xyxy.select(1, 1).unsqueeze(1)) & (cy < gt_xyxy.select(1, 3).unsqueeze(1));
  auto radius = strides.squeeze(1).unsqueeze(0) * cfg.center_radius;
  auto in_center = ((cx - gt_boxes.select(1, 0).unsqueeze(1)).abs() < radius) &
                   ((cy - gt_boxes.select(1, 1).unsqueeze(1)).abs() < radius);

  auto ious = pairwise_iou(gt_xyxy, cxcywh_to_xyxy(pred_boxes.detach()));  // [G, A]
  auto cls_scores = cls_logits.detach();
  cls_scores.sigmoid_();  // EXPECT: tensor-inplace-on-detached
  auto joint = (cls_scores * obj_logits.detach().sigmoid()).sqrt();  // [A, C]
  auto onehot = torch::one_hot(gt_cls, cls_logits.size(1)).to(joint.dtype());  // [G, C]
  auto cls_cost = F::binary_cross_entropy(joint.unsqueeze(0).expand({G, A, -1}), onehot.unsqueeze(1).expand({G, A, -1}),
                                          F::BinaryCrossEntropyFuncOptions().reduction(torch::kNone)).sum(-1);
  auto cost = cls_cost - cfg.iou_weight * torch::log(ious + 1e-8);
  cost.masked_fill_(~(in_box & in_center), 1e5);

  auto topk_ious = std::get<0>(ious.topk(std::min<int64_t>(cfg.dynamic_topk, A), 1));
  auto dyn_k = topk_ious.sum(1).to(torch::kLong).clamp_min(1);
  auto matching = torch::zeros_like(cost);
  for (int64_t g = 0; g < G; ++g) {
    auto idx = std::get<1>(cost[g].topk(dyn_k[g].item<int64_t>(), -1, /*largest=*/false));
    matching[g].index_fill_(0, idx, 1.0);
  }
  auto multi = matching.sum(0) > 1;
  if (multi.any().item<bool>()) {
    auto cols = multi.nonzero().squeeze(1);
    auto best = cost.index_select(1, cols).argmin(0);
    matching.index_put_({Slice(), cols}, 0.0);
    matching.index_put_({best, cols}, 1.0);
  }
  auto fg = matching.sum(0) > 0;
  return {fg, matching.index({Slice(), fg}).argmax(0), (matching * ious).sum(0).index({fg})};
}

torch::Tensor yolox_loss(const std::vector<torch::Tensor>& outs, const std::vector<torch::Tensor>& targets, const YoloxConfig& cfg) {
  auto f = flatten_levels(outs, cfg.strides);
  auto boxes = decode_boxes(f);
  const auto B = f.preds.size(0);
  const auto C = cfg.num_classes;
  auto anchor_pts = anchor_centers(f.grids, f.strides, B)[0];
  auto stride_col = f.strides[0];

  auto loss_sum = torch::zeros({}, f.preds.options());
  int64_t num_fg = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto& gt = targets[b];  // [G, 5]: class, cx, cy, w, h
    auto obj_logits = f.preds[b].narrow(1, 4, 1);
    auto cls_logits = f.preds[b].narrow(1, 5, C);
    auto obj_target = torch::zeros_like(obj_logits);
    if (gt.size(0) > 0) {
      auto gt_boxes = gt.narrow(1, 1, 4).contiguous();  // LOOKALIKE: tensor-clone-in-loop -- gt changes every iteration
      auto gt_cls = gt.select(1, 0).to(torch::kLong);
      auto pts = anchor_pts.clone();  // EXPECT: tensor-clone-in-loop
      auto asg = simota_assign(cls_logits, obj_logits, boxes[b], gt_boxes, gt_cls, pts, stride_col, cfg);
      auto fg_boxes = boxes[b].index({asg.fg_mask});
      auto iou = pairwise_iou(cxcywh_to_xyxy(fg_boxes), cxcywh_to_xyxy(gt_boxes.index_select(0, asg.matched_gt))).diagonal();
      auto cls_target = torch::one_hot(gt_cls.index_select(0, asg.matched_gt), C).to(torch::kFloat) * asg.matched_iou.unsqueeze(1);
      obj_target = obj_target.index_put({asg.fg_mask}, torch::ones({1}, obj_target.options()));
      loss_sum = loss_sum + 5.0 * (1.0 - iou.pow(2)).sum() +  // LOOKALIKE: tensor-graph-kept-across-iterations -- the sum is returned and differentiated by train_step
                 F::binary_cross_entropy_with_logits(cls_logits.index({asg.fg_mask}), cls_target,
                                                     F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum));
      num_fg += asg.fg_mask.sum().item<int64_t>();
    }
    loss_sum = loss_sum + F::binary_cross_entropy_with_logits(obj_logits, obj_target,
                                                              F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum));
  }
  // FACT: p = torch.randn(2, 10, 9); assert is_view_of(p.view(-1, 9), p)
  auto rows = f.preds.view({-1, 5 + C});  // LOOKALIKE: tensor-view-non-contiguous -- preds is the contiguous result of cat
  auto reg_l2 = rows.narrow(1, 2, 2).pow(2).mean();
  return loss_sum / std::max<int64_t>(num_fg, 1) + 1e-4 * reg_l2;
}

// Per-level share of confident anchors, for the training log.
std::vector<double> level_confidence(const std::vector<torch::Tensor>& outs, double thresh) {
  std::vector<double> share;
  for (const auto& out : outs) {
    const auto C = out.size(1);
    // FACT: x = torch.randn(2, 7, 3, 4); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(-1, 7), x)
    auto rows = out.detach().permute({0, 2, 3, 1}).reshape({-1, C});  // EXPECT: tensor-reshape-non-contiguous
    auto obj = rows.select(1, 4).sigmoid();
    share.push_back((obj > thresh).to(torch::kFloat).mean().item<double>());
  }
  return share;
}

double train_step(DecoupledHead& head, torch::optim::SGD& opt, const std::vector<torch::Tensor>& feats,
                  const std::vector<torch::Tensor>& targets, const YoloxConfig& cfg, int64_t step) {
  head->train();
  auto outs = head->forward(feats);
  auto loss = yolox_loss(outs, targets, cfg);
  opt.zero_grad();
  loss.backward();
  opt.step();
  if (step % 50 == 0) {
    auto share = level_confidence(outs, cfg.conf_thresh);
    std::cout << "step " << step << " loss " << loss.item<double>();
    for (size_t k = 0; k < share.size(); ++k) std::cout << " P" << (k + 3) << " " << share[k];
    std::cout << "\n";
  }
  return loss.item<double>();
}
