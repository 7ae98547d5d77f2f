// Mask R-CNN second stage (He et al. 2017) trained on cached outputs of a frozen backbone and RPN
// (one feature level, stride 16). Proposals are the top-scoring decoded anchors; each image's
// proposals (plus its ground-truth boxes) are matched to the ground truth and sampled, 512 RoIs
// with a quarter foreground. RoI max pooling is done by hand (7x7 for the box head, 14x14 for the
// mask head); the box head is two FC layers with class scores and class-specific regression, the
// mask head four 3x3 convs, a 2x deconv and one mask logit map per class.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct RoiConfig {
  int64_t num_classes = 81, channels = 256, box_pool = 7, mask_pool = 14, mask_size = 28;
  int64_t rois_per_image = 512, pre_nms_topk = 1000, max_dets = 100, log_every = 20;
  double fg_fraction = 0.25, fg_iou = 0.5, bg_iou_lo = 0.0, nms_iou = 0.5, spatial_scale = 1.0 / 16, score_thresh = 0.05, lr = 0.02;
  std::vector<double> reg_weights{10.0, 10.0, 5.0, 5.0};
};

struct ImageTargets {
  torch::Tensor boxes, labels, masks; // [G, 4] x1 y1 x2 y2 pixels; [G] int64 classes; [G, H, W] binary
};

// Pairwise IoU of [N, 4] and [M, 4] boxes, [N, M]; N is a few thousand during sampling.
torch::Tensor box_iou(const torch::Tensor &a, const torch::Tensor &b) {
  auto area = [](const torch::Tensor &x) { return (x.select(1, 2) - x.select(1, 0)) * (x.select(1, 3) - x.select(1, 1)); };
  auto lt = torch::max(a.unsqueeze(1).narrow(2, 0, 2), b.unsqueeze(0).narrow(2, 0, 2));
  auto wh = torch::min(a.unsqueeze(1).narrow(2, 2, 2), b.unsqueeze(0).narrow(2, 2, 2)) - lt;
  // FACT: a = torch.rand(3, 4); b = torch.rand(5, 4); wh = torch.min(a.unsqueeze(1)[..., 2:], b.unsqueeze(0)[..., 2:]) - torch.max(a.unsqueeze(1)[..., :2], b.unsqueeze(0)[..., :2]); wh.clamp_min_(0); assert wh.shape == (3, 5, 2) and 0 not in wh.stride()
  wh.clamp_min_(0); // LOOKALIKE: tensor-inplace-on-expanded -- the broadcast difference is a tensor of its own
  auto inter = wh.select(2, 0) * wh.select(2, 1);
  auto uni = area(a).unsqueeze(1).expand_as(inter);
  // FACT: a = torch.rand(3); i = torch.rand(3, 5); u = a.unsqueeze(1).expand_as(i); assert raises(lambda: u.add_(torch.rand(5)), "more than one element of the written-to tensor refers to a single memory location")
  uni.add_(area(b)).sub_(inter); // EXPECT: tensor-inplace-on-expanded -- every row of uni is one area repeated M times: the write is refused
  return inter / uni;
}

// (dx, dy, dw, dh) of gt relative to the reference boxes, times the regression weights.
torch::Tensor encode(const torch::Tensor &gt, const torch::Tensor &ref, const torch::Tensor &weights) {
  auto rw = ref.select(1, 2) - ref.select(1, 0), rh = ref.select(1, 3) - ref.select(1, 1);
  auto gw = gt.select(1, 2) - gt.select(1, 0), gh = gt.select(1, 3) - gt.select(1, 1);
  auto dx = (gt.select(1, 0) + 0.5 * gw - ref.select(1, 0) - 0.5 * rw) / rw;
  auto dy = (gt.select(1, 1) + 0.5 * gh - ref.select(1, 1) - 0.5 * rh) / rh;
  auto deltas = torch::stack({dx, dy, torch::log(gw / rw), torch::log(gh / rh)}, 1);
  // FACT: d = torch.randn(6, 4); w = torch.tensor([10., 10., 5., 5.]); d.mul_(w.expand_as(d)); assert d.stride() == (4, 1)
  deltas.mul_(weights.expand_as(deltas)); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded weights are only read
  return deltas;
}

torch::Tensor decode(const torch::Tensor &deltas, const torch::Tensor &ref, const torch::Tensor &weights) {
  auto d = deltas / weights;
  auto w = ref.select(1, 2) - ref.select(1, 0), h = ref.select(1, 3) - ref.select(1, 1);
  auto cx = ref.select(1, 0) + 0.5 * w + d.select(1, 0) * w;
  auto cy = ref.select(1, 1) + 0.5 * h + d.select(1, 1) * h;
  auto pw = torch::exp(d.select(1, 2).clamp_max(4.135)) * w, ph = torch::exp(d.select(1, 3).clamp_max(4.135)) * h;
  return torch::stack({cx - 0.5 * pw, cy - 0.5 * ph, cx + 0.5 * pw, cy + 0.5 * ph}, 1);
}

// RPN outputs of one level -> the top-scoring decoded anchors of every image.
std::vector<torch::Tensor> proposals_from_rpn(const torch::Tensor &objectness, const torch::Tensor &rpn_deltas,
                                              const torch::Tensor &anchors, const torch::Tensor &weights, const RoiConfig &cfg) {
  // objectness [B, A, h, w], rpn_deltas [B, A * 4, h, w], anchors [h * w * A, 4]
  torch::NoGradGuard no_grad;
  const auto B = objectness.size(0);
  // FACT: o = torch.randn(2, 3, 4, 5); v = o.permute(0, 2, 3, 1).contiguous().view(2, -1); assert v.shape == (2, 60) and is_contiguous(v)
  auto scores = objectness.permute({0, 2, 3, 1}).contiguous().view({B, -1}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
  // FACT: d = torch.randn(2, 12, 4, 5); assert raises(lambda: d.permute(0, 2, 3, 1).view(2, -1, 4), "view size is not compatible")
  auto deltas = rpn_deltas.permute({0, 2, 3, 1}).view({B, -1, 4}); // EXPECT: tensor-view-non-contiguous -- after the permute the A*4 channels are the outermost stride: no view can regroup them
  std::vector<torch::Tensor> out;
  for (int64_t b = 0; b < B; ++b) {
    auto top = std::get<1>(scores[b].topk(std::min(cfg.pre_nms_topk, scores.size(1))));
    out.push_back(decode(deltas[b].index_select(0, top), anchors.index_select(0, top), weights));
  }
  return out;
}

struct SampledRois {
  torch::Tensor rois, labels, reg_targets;         // [R, 5] (image index, box); [R] int64, 0 = background; [R, 4]
  std::vector<torch::Tensor> fg_boxes, fg_matched; // per image: foreground RoIs and their gt index
};

SampledRois sample_proposals(const std::vector<torch::Tensor> &proposals, const std::vector<ImageTargets> &targets,
                             const torch::Tensor &weights, const RoiConfig &cfg) {
  torch::NoGradGuard no_grad;
  SampledRois out;
  std::vector<torch::Tensor> rois, labels, regs;
  for (size_t b = 0; b < proposals.size(); ++b) {
    const auto &gt = targets[b];
    auto cand = torch::cat({proposals[b], gt.boxes}); // the gt boxes are always candidates
    auto best = box_iou(cand, gt.boxes).max(1);
    auto max_iou = std::get<0>(best), idx = std::get<1>(best);
    auto lab = gt.labels.index_select(0, idx);
    // FACT: l = torch.tensor([3, 5]); s = l.index_select(0, torch.tensor([0, 1, 1])); s.masked_fill_(torch.tensor([True, False, False]), 0); assert is_copy_of(s, l) and l.tolist() == [3, 5]
    lab.masked_fill_(max_iou < cfg.fg_iou, 0); // LOOKALIKE: tensor-alias-then-mutate -- index_select copies: the image's gt labels are untouched
    auto fg = torch::nonzero(lab > 0).squeeze(1);
    auto bg = torch::nonzero((lab == 0) & (max_iou >= cfg.bg_iou_lo)).squeeze(1);
    const auto n_fg = std::min<int64_t>(fg.size(0), static_cast<int64_t>(cfg.rois_per_image * cfg.fg_fraction));
    const auto n_bg = std::min<int64_t>(bg.size(0), cfg.rois_per_image - n_fg);
    fg = fg.index_select(0, torch::randperm(fg.size(0), fg.options()).narrow(0, 0, n_fg));
    bg = bg.index_select(0, torch::randperm(bg.size(0), bg.options()).narrow(0, 0, n_bg));
    auto keep = torch::cat({fg, bg});
    auto boxes = cand.index_select(0, keep);
    auto matched = idx.index_select(0, keep);
    auto r = torch::empty({keep.size(0), 5}, boxes.options());
    auto image_col = torch::full({keep.size(0)}, static_cast<int64_t>(b), keep.options());
    // FACT: r = torch.empty(3, 5); r.select(1, 0).copy_(torch.full((3,), 2, dtype=torch.long)); assert r[:, 0].tolist() == [2.0, 2.0, 2.0]
    r.select(1, 0).copy_(image_col); // LOOKALIKE: tensor-copy-narrowing -- int64 image indices into float32 are exact
    r.narrow(1, 1, 4).copy_(boxes);
    rois.push_back(r);
    labels.push_back(lab.index_select(0, keep));
    regs.push_back(encode(gt.boxes.index_select(0, matched), boxes, weights));
    out.fg_boxes.push_back(boxes.narrow(0, 0, n_fg));
    out.fg_matched.push_back(matched.narrow(0, 0, n_fg));
  }
  out.rois = torch::cat(rois);
  out.labels = torch::cat(labels);
  out.reg_targets = torch::cat(regs);
  return out;
}

// RoI max pooling by hand (Fast R-CNN): each RoI is quantised onto the feature grid, max-pooled into P x P bins.
torch::Tensor roi_pool(const torch::Tensor &features, const torch::Tensor &rois, int64_t P, double scale) {
  const auto K = rois.size(0), H = features.size(2), W = features.size(3);
  auto out = torch::zeros({K, features.size(1), P, P}, features.options());
  auto grid = torch::empty({K, 5}, torch::kLong);
  // FACT: g = torch.empty(3, dtype=torch.long); g.copy_(torch.tensor([0., 1., 1.])); assert g.tolist() == [0, 1, 1]
  grid.select(1, 0).copy_(rois.select(1, 0)); // LOOKALIKE: tensor-copy-narrowing -- image indices are whole numbers: nothing is lost
  // FACT: g = torch.empty(2, 4, dtype=torch.long); g.copy_(torch.tensor([[3.9, 0.6, 7.5, 2.99], [1.2, 1.7, 4.4, 5.5]])); assert g.tolist() == [[3, 0, 7, 2], [1, 1, 4, 5]]
  grid.narrow(1, 1, 4).copy_(rois.narrow(1, 1, 4) * scale); // EXPECT: tensor-copy-narrowing -- the corners are truncated, not rounded: RoIs shift by up to one cell
  auto g = grid.accessor<int64_t, 2>();
  for (int64_t k = 0; k < K; ++k) {
    const auto x1 = std::clamp<int64_t>(g[k][1], 0, W - 1), y1 = std::clamp<int64_t>(g[k][2], 0, H - 1);
    const auto x2 = std::clamp<int64_t>(g[k][3], x1, W - 1), y2 = std::clamp<int64_t>(g[k][4], y1, H - 1);
    auto crop = features[g[k][0]].slice(1, y1, y2 + 1).slice(2, x1, x2 + 1);
    out[k] = std::get<0>(torch::adaptive_max_pool2d(crop, {P, P}));
  }
  return out;
}

struct BoxHeadImpl : nn::Module {
  explicit BoxHeadImpl(const RoiConfig &cfg) {
    fc6_ = register_module("fc6", nn::Linear(cfg.channels * cfg.box_pool * cfg.box_pool, 1024));
    fc7_ = register_module("fc7", nn::Linear(1024, 1024));
    cls_ = register_module("cls", nn::Linear(1024, cfg.num_classes));
    bbox_ = register_module("bbox", nn::Linear(1024, cfg.num_classes * 4));
    nn::init::normal_(cls_->weight, 0.0, 0.01); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    nn::init::normal_(bbox_->weight, 0.0, 0.001);
    nn::init::zeros_(cls_->bias);
    nn::init::zeros_(bbox_->bias);
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &pooled) {
    // FACT: p = torch.randn(6, 4, 7, 7); assert is_view_of(p.flatten(1), p)
    auto x = torch::relu(fc6_(pooled.flatten(1))); // LOOKALIKE: tensor-reshape-non-contiguous -- the pooled RoIs are a fresh contiguous tensor: a view
    x = torch::relu(fc7_(x));
    return {cls_(x), bbox_(x)};
  }
  nn::Linear fc6_{nullptr}, fc7_{nullptr}, cls_{nullptr}, bbox_{nullptr};
};
TORCH_MODULE(BoxHead);

struct MaskHeadImpl : nn::Module {
  explicit MaskHeadImpl(const RoiConfig &cfg) {
    convs_ = register_module("convs", nn::Sequential());
    for (int i = 0; i < 4; ++i) {
      convs_->push_back(nn::Conv2d(nn::Conv2dOptions(cfg.channels, cfg.channels, 3).padding(1)));
      convs_->push_back(nn::ReLU(nn::ReLUOptions(true)));
    }
    deconv_ = register_module("deconv", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(cfg.channels, cfg.channels, 2).stride(2)));
    logits_ = register_module("logits", nn::Conv2d(nn::Conv2dOptions(cfg.channels, cfg.num_classes, 1)));
  }
  torch::Tensor forward(const torch::Tensor &pooled) {
    auto x = deconv_(convs_->forward(pooled));
    // FACT: d = torch.nn.ConvTranspose2d(2, 2, 2, stride=2); x = torch.randn(1, 2, 3, 3); y = d(x); y.relu_(); y.sum().backward(); assert d.weight.grad is not None
    x.relu_(); // LOOKALIKE: tensor-inplace-on-saved -- a transposed convolution does not keep its output for backward
    return logits_(x); // [F, num_classes, 2P, 2P]
  }
  nn::Sequential convs_{nullptr};
  nn::ConvTranspose2d deconv_{nullptr};
  nn::Conv2d logits_{nullptr};
};
TORCH_MODULE(MaskHead);

// Ground-truth masks cropped to each foreground RoI and resized to M x M.
torch::Tensor mask_targets(const ImageTargets &gt, const torch::Tensor &boxes, const torch::Tensor &matched, int64_t M) {
  const auto n = boxes.size(0), H = gt.masks.size(1), W = gt.masks.size(2);
  auto targets = torch::zeros({n, M, M}, gt.masks.options().dtype(torch::kUInt8));
  auto bx = boxes.round().to(torch::kLong).cpu(), mi = matched.cpu();
  auto b = bx.accessor<int64_t, 2>();
  auto m = mi.accessor<int64_t, 1>();
  for (int64_t i = 0; i < n; ++i) {
    const auto x1 = std::clamp<int64_t>(b[i][0], 0, W - 1), y1 = std::clamp<int64_t>(b[i][1], 0, H - 1);
    const auto x2 = std::clamp<int64_t>(b[i][2], x1 + 1, W), y2 = std::clamp<int64_t>(b[i][3], y1 + 1, H);
    auto crop = gt.masks[m[i]].slice(0, y1, y2).slice(1, x1, x2).to(torch::kFloat);
    auto resized = F::interpolate(crop.unsqueeze(0).unsqueeze(0),
                                  F::InterpolateFuncOptions().size(std::vector<int64_t>{M, M}).mode(torch::kBilinear).align_corners(false));
    // FACT: t = torch.zeros(2, 4, 4, dtype=torch.uint8); m = torch.zeros(1, 1, 6, 6); m[..., 1:5, 1:4] = 1; r = torch.nn.functional.interpolate(m, size=(4, 4), mode='bilinear', align_corners=False)[0, 0]; t[0] = r; assert int(t[0].sum()) < int((r >= 0.5).sum())
    targets[i] = resized.squeeze(0).squeeze(0); // EXPECT: tensor-copy-narrowing -- bilinear values in [0, 1] are truncated into uint8: every pixel below exactly 1 becomes background
  }
  return targets;
}

struct RoiLosses { torch::Tensor cls, box, mask; };

RoiLosses roi_losses(const torch::Tensor &class_logits, const torch::Tensor &box_regression, const torch::Tensor &mask_logits,
                     const SampledRois &s, const torch::Tensor &mask_tgts) {
  const auto K = class_logits.size(0);
  auto cls = F::cross_entropy(class_logits, s.labels);
  auto fg = torch::nonzero(s.labels > 0).squeeze(1);
  auto fg_labels = s.labels.index_select(0, fg);
  // FACT: r = torch.nn.Linear(8, 12)(torch.randn(5, 8)); assert is_view_of(r.view(5, -1, 4), r)
  auto per_class = box_regression.view({K, -1, 4}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
  auto pred = per_class.index({fg, fg_labels});
  auto box = F::smooth_l1_loss(pred, s.reg_targets.index_select(0, fg),
                               F::SmoothL1LossFuncOptions().reduction(torch::kSum).beta(1.0 / 9)) / K;
  // The mask head ran on the foreground RoIs only, in the same order: the logits of the gt class.
  auto probs = torch::sigmoid(mask_logits.index({torch::arange(fg.size(0), fg.options()), fg_labels}));
  // FACT: l = torch.nn.Linear(3, 4); p = torch.sigmoid(l(torch.randn(6, 3))); p.clamp_(1e-6, 1 - 1e-6); loss = torch.nn.functional.binary_cross_entropy(p, torch.rand(6, 4)); assert backward_fails(lambda: loss.backward())
  probs.clamp_(1e-6, 1.0 - 1e-6); // EXPECT: tensor-inplace-on-saved -- sigmoid keeps its result for backward: the training step's backward() raises
  auto mask = F::binary_cross_entropy(probs, mask_tgts.to(torch::kFloat));
  return {cls, box, mask};
}

// Frozen backbone features [B, C, h, w] and RPN outputs [B, A, h, w], [B, A * 4, h, w], cached on disk.
struct CachedBatch {
  torch::Tensor features, objectness, rpn_deltas;
  std::vector<ImageTargets> targets;
};

void train_roi_heads(BoxHead &box_head, MaskHead &mask_head, const std::vector<CachedBatch> &data,
                     const torch::Tensor &anchors, const RoiConfig &cfg, int64_t epochs) {
  const torch::Device device(torch::kCUDA);
  box_head->to(device);
  mask_head->to(device);
  auto params = box_head->parameters(), mask_params = mask_head->parameters();
  params.insert(params.end(), mask_params.begin(), mask_params.end());
  torch::optim::SGD opt(params, torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(1e-4));
  auto weights = torch::tensor(cfg.reg_weights).to(torch::TensorOptions().dtype(torch::kFloat).device(device));
  auto anchors_dev = anchors.to(device);

  int64_t step = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    int64_t fg_total = 0, roi_total = 0;
    for (const auto &batch : data) {
      auto feats = batch.features.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto proposals = proposals_from_rpn(batch.objectness.to(device), batch.rpn_deltas.to(device), anchors_dev, weights, cfg);
      std::vector<ImageTargets> tg;
      for (const auto &t : batch.targets)
        tg.push_back({t.boxes.to(device), t.labels.to(device), t.masks.to(device)});
      auto s = sample_proposals(proposals, tg, weights, cfg);
      auto head_out = box_head(roi_pool(feats, s.rois, cfg.box_pool, cfg.spatial_scale));
      auto fg = torch::nonzero(s.labels > 0).squeeze(1);
      auto mask_logits = mask_head(roi_pool(feats, s.rois.index_select(0, fg), cfg.mask_pool, cfg.spatial_scale));
      std::vector<torch::Tensor> mt;
      for (size_t b = 0; b < tg.size(); ++b)
        mt.push_back(mask_targets(tg[b], s.fg_boxes[b], s.fg_matched[b], cfg.mask_size));
      auto losses = roi_losses(head_out.first, head_out.second, mask_logits, s, torch::cat(mt));
      auto loss = losses.cls + losses.box + losses.mask;
      opt.zero_grad();
      loss.backward();
      opt.step();
      fg_total += (s.labels > 0).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop -- a host count of the sampled foreground waits for the GPU every step
      roi_total += s.labels.size(0);
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " cls " << losses.cls.item<float>() << " box " << losses.box.item<float>() << " mask " << losses.mask.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    std::cout << "epoch " << epoch << " foreground fraction " << static_cast<double>(fg_total) / std::max<int64_t>(roi_total, 1) << "\n";
  }
}

struct Detections { torch::Tensor boxes, scores, labels, masks; };

// Greedy NMS on the host; kept indices in descending score order.
torch::Tensor nms(const torch::Tensor &boxes, const torch::Tensor &scores, double thresh) {
  auto order = std::get<1>(scores.sort(0, /*descending=*/true)).cpu();
  auto iou = box_iou(boxes, boxes).cpu();
  auto o = order.accessor<int64_t, 1>();
  auto m = iou.accessor<float, 2>();
  std::vector<char> removed(static_cast<size_t>(order.size(0)), 0);
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < order.size(0); ++i)
    if (!removed[o[i]]) {
      keep.push_back(o[i]);
      for (int64_t j = i + 1; j < order.size(0); ++j)
        removed[o[j]] |= m[o[i]][o[j]] > thresh;
    }
  return torch::tensor(keep, torch::kLong).to(boxes.device());
}

Detections postprocess(BoxHead &box_head, MaskHead &mask_head, const torch::Tensor &features, const torch::Tensor &proposals,
                       const torch::Tensor &weights, int64_t img_h, int64_t img_w, const RoiConfig &cfg) {
  torch::NoGradGuard no_grad;
  box_head->eval();
  mask_head->eval();
  const auto K = proposals.size(0), C = cfg.num_classes;
  auto rois = torch::cat({torch::zeros({K, 1}, proposals.options()), proposals}, 1);
  auto head_out = box_head(roi_pool(features, rois, cfg.box_pool, cfg.spatial_scale));
  auto probs = torch::softmax(head_out.first, -1);
  // FACT: p = torch.softmax(torch.randn(5, 4), -1); s = p.clone(); s.masked_fill_(s < 0.3, 0); assert torch.equal(s, p.masked_fill(p < 0.3, 0)) and is_copy_of(p.masked_fill(p < 0.3, 0), p)
  auto scores = probs.clone(); // EXPECT: tensor-unnecessary-clone -- masked at once: probs.masked_fill(probs < thresh, 0) makes it in one pass
  scores.masked_fill_(scores < cfg.score_thresh, 0);
  auto boxes = decode(head_out.second.reshape({-1, 4}), proposals.repeat({1, C}).view({-1, 4}), weights).view({K, C, 4});
  for (int64_t c = 0; c < 4; ++c)
    boxes.select(2, c).clamp_(0, c % 2 == 0 ? img_w : img_h);
  auto cand = torch::nonzero(scores.narrow(1, 1, C - 1) > 0); // [N, 2]: RoI, class - 1
  auto ri = cand.select(1, 0), ci = cand.select(1, 1) + 1;
  auto det_boxes = boxes.index({ri, ci}), det_scores = scores.index({ri, ci});
  auto offsets = ci.to(det_boxes.dtype()).unsqueeze(1) * (std::max(img_h, img_w) + 1); // classes never overlap
  auto keep = nms(det_boxes + offsets, det_scores, cfg.nms_iou);
  keep = keep.narrow(0, 0, std::min<int64_t>(keep.size(0), cfg.max_dets));
  Detections det;
  det.boxes = det_boxes.index_select(0, keep);
  det.scores = det_scores.index_select(0, keep);
  det.labels = ci.index_select(0, keep);
  auto det_rois = torch::cat({torch::zeros({det.boxes.size(0), 1}, det.boxes.options()), det.boxes}, 1);
  auto mask_logits = mask_head(roi_pool(features, det_rois, cfg.mask_pool, cfg.spatial_scale));
  det.masks = torch::sigmoid(mask_logits.index({torch::arange(det.boxes.size(0), det.labels.options()), det.labels}));
  return det;
}
