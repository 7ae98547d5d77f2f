// Anchor-free detection head in the style of YOLOv8: decoupled box / class branches, DFL box
// regression, task-aligned target assignment and a small training loop on synthetic data.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct HeadConfig {
  int64_t num_classes = 20, reg_max = 16, image_size = 256, topk = 10;
  std::vector<int64_t> in_channels{64, 128, 256};
  std::vector<double> strides{8.0, 16.0, 32.0};
  double alpha = 0.5, beta = 6.0, qfl_beta = 2.0, box_gain = 7.5, cls_gain = 0.5, dfl_gain = 1.5;
};

struct ConvBnSiLUImpl : torch::nn::Module {
  ConvBnSiLUImpl(int64_t c_in, int64_t c_out, int64_t k = 3, int64_t s = 1)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(c_in, c_out, k).stride(s).padding(k / 2).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(c_out))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::silu(bn(conv(x))); }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(ConvBnSiLU);

struct TinyBackboneImpl : torch::nn::Module {
  explicit TinyBackboneImpl(const std::vector<int64_t>& ch)
      : p3(register_module("p3", torch::nn::Sequential(ConvBnSiLU(3, 32, 3, 4), ConvBnSiLU(32, ch[0], 3, 2)))),
        p4(register_module("p4", ConvBnSiLU(ch[0], ch[1], 3, 2))), p5(register_module("p5", ConvBnSiLU(ch[1], ch[2], 3, 2))) {}
  std::vector<torch::Tensor> forward(const torch::Tensor& x) {
    auto f3 = p3->forward(x), f4 = p4(f3);
    return {f3, f4, p5(f4)};
  }
  torch::nn::Sequential p3;
  ConvBnSiLU p4, p5;
};
TORCH_MODULE(TinyBackbone);

struct DetectHeadImpl : torch::nn::Module {
  explicit DetectHeadImpl(const HeadConfig& cfg) : cfg_(cfg) {
    const int64_t c2 = std::max<int64_t>({16, cfg.in_channels[0] / 4, cfg.reg_max * 4});
    const int64_t c3 = std::max<int64_t>(cfg.in_channels[0], std::min<int64_t>(cfg.num_classes, 100));
    for (size_t i = 0; i < cfg.in_channels.size(); ++i) {
      const auto c = cfg.in_channels[i];
      const auto tag = std::to_string(i);
      box_stem.push_back(register_module("box_stem" + tag, torch::nn::Sequential(ConvBnSiLU(c, c2), ConvBnSiLU(c2, c2))));
      cls_stem.push_back(register_module("cls_stem" + tag, torch::nn::Sequential(ConvBnSiLU(c, c3), ConvBnSiLU(c3, c3))));
      box_pred.push_back(register_module("box_pred" + tag, torch::nn::Conv2d(torch::nn::Conv2dOptions(c2, 4 * cfg.reg_max, 1))));
      cls_pred.push_back(register_module("cls_pred" + tag, torch::nn::Conv2d(torch::nn::Conv2dOptions(c3, cfg.num_classes, 1))));
    }
  }

  // Class logits start near "5 objects per image" so background does not swamp the loss.
  void init_bias() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < cls_pred.size(); ++i) {
      box_pred[i]->bias.fill_(1.0);  // LOOKALIKE: tensor-inplace-on-leaf -- inside NoGradGuard, the usual init idiom
      const double cells = std::pow(cfg_.image_size / cfg_.strides[i], 2);
      cls_pred[i]->bias.fill_(std::log(5.0 / cfg_.num_classes / cells));
    }
  }

  // Used when fine-tuning on a new label set: focal-style prior on every class.
  void reset_cls_prior(double prior) {
    const double b = -std::log((1.0 - prior) / prior);
    for (auto& conv : cls_pred) conv->bias.fill_(b);  // EXPECT: tensor-inplace-on-leaf
  }

  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& feats) {
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < feats.size(); ++i)
      out.push_back(torch::cat({box_pred[i](box_stem[i]->forward(feats[i])), cls_pred[i](cls_stem[i]->forward(feats[i]))}, 1));
    return out;
  }

  HeadConfig cfg_;
  std::vector<torch::nn::Sequential> box_stem, cls_stem;
  std::vector<torch::nn::Conv2d> box_pred, cls_pred;
};
TORCH_MODULE(DetectHead);

// Grid-cell centres (in grid units) and the stride of every anchor.
std::pair<torch::Tensor, torch::Tensor> make_anchors(const std::vector<torch::Tensor>& feats, const std::vector<double>& strides) {
  std::vector<torch::Tensor> points, stride_list;
  for (size_t i = 0; i < feats.size(); ++i) {
    const auto h = feats[i].size(2), w = feats[i].size(3);
    auto grid = torch::meshgrid({torch::arange(h, feats[i].options()) + 0.5, torch::arange(w, feats[i].options()) + 0.5}, "ij");
    // FACT: g = torch.meshgrid(torch.arange(3.), torch.arange(4.), indexing="ij"); assert is_contiguous(torch.stack([g[1], g[0]], -1)) and not raises(lambda: torch.stack([g[1], g[0]], -1).view(-1, 2))
    points.push_back(torch::stack({grid[1], grid[0]}, -1).view({-1, 2}));  // LOOKALIKE: tensor-view-non-contiguous -- stack writes a fresh contiguous tensor even from expanded meshgrid views
    stride_list.push_back(torch::full({h * w, 1}, strides[i], feats[i].options()));
  }
  return {torch::cat(points), torch::cat(stride_list)};
}

torch::Tensor dist2bbox(const torch::Tensor& distance, const torch::Tensor& anchor_points) {
  return torch::cat({anchor_points - distance.narrow(-1, 0, 2), anchor_points + distance.narrow(-1, 2, 2)}, -1);
}

torch::Tensor bbox2dist(const torch::Tensor& anchor_points, const torch::Tensor& bbox, double reg_max) {
  auto ltrb = torch::cat({anchor_points - bbox.narrow(-1, 0, 2), bbox.narrow(-1, 2, 2) - anchor_points}, -1);
  return ltrb.clamp_(0, reg_max - 0.01);
}

torch::Tensor bbox_diou(const torch::Tensor& box1, const torch::Tensor& box2, double eps = 1e-7) {
  auto a = box1.unbind(-1), b = box2.unbind(-1);
  auto inter = (torch::min(a[2], b[2]) - torch::max(a[0], b[0])).clamp_min(0) *
               (torch::min(a[3], b[3]) - torch::max(a[1], b[1])).clamp_min(0);
  auto uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter + eps;
  auto cw = torch::max(a[2], b[2]) - torch::min(a[0], b[0]);
  auto ch = torch::max(a[3], b[3]) - torch::min(a[1], b[1]);
  auto rho2 = ((b[0] + b[2] - a[0] - a[2]).pow(2) + (b[1] + b[3] - a[1] - a[3]).pow(2)) / 4;
  return inter / uni - rho2 / (cw.pow(2) + ch.pow(2) + eps);
}

// DFL: cross-entropy towards the two integer bins around each continuous target distance.
torch::Tensor dfl_loss(const torch::Tensor& pred_dist, const torch::Tensor& target) {
  auto tl = target.to(torch::kLong);
  auto wl = (tl + 1).to(target.scalar_type()) - target;
  auto opts = F::CrossEntropyFuncOptions().reduction(torch::kNone);
  auto ce_l = F::cross_entropy(pred_dist, tl.view({-1}), opts).view(tl.sizes());
  auto ce_r = F::cross_entropy(pred_dist, (tl + 1).view({-1}), opts).view(tl.sizes());
  return (ce_l * wl + ce_r * (1.0 - wl)).mean(-1, true);
}

struct Assignment { torch::Tensor labels, bboxes, scores, fg_mask; };

class TaskAlignedAssigner {
 public:
  TaskAlignedAssigner(int64_t topk, int64_t nc, double alpha, double beta) : topk_(topk), nc_(nc), alpha_(alpha), beta_(beta) {}

  Assignment operator()(const torch::Tensor& pd_scores, const torch::Tensor& pd_bboxes, const torch::Tensor& anc_points,
                        const torch::Tensor& gt_labels, const torch::Tensor& gt_bboxes, const torch::Tensor& mask_gt) {
    torch::NoGradGuard no_grad;
    const auto bs = pd_scores.size(0), na = pd_scores.size(1), n_max = gt_bboxes.size(1);
    auto pts = anc_points.view({1, 1, na, 2});
    auto deltas = torch::cat({pts - gt_bboxes.narrow(-1, 0, 2).unsqueeze(2), gt_bboxes.narrow(-1, 2, 2).unsqueeze(2) - pts}, -1);
    auto mask_valid = deltas.amin(-1).gt(1e-9).logical_and(mask_gt);
    auto ind0 = torch::arange(bs, gt_labels.options()).view({-1, 1}).expand({-1, n_max});
    auto bbox_scores = pd_scores.index({ind0, torch::indexing::Slice(), gt_labels.squeeze(-1)});
    auto overlaps = bbox_diou(gt_bboxes.unsqueeze(2), pd_bboxes.unsqueeze(1)).clamp_min(0);
    auto align_metric = bbox_scores.pow(alpha_) * overlaps.pow(beta_) * mask_valid;
    overlaps.mul_(mask_valid);  // LOOKALIKE: tensor-inplace-on-saved -- the assigner runs under NoGradGuard, pow saved nothing
    auto topk_idx = std::get<1>(align_metric.topk(topk_, -1));
    auto mask_pos = torch::zeros_like(align_metric).scatter_(-1, topk_idx, 1.0) * mask_valid;
    // An anchor claimed by several boxes keeps only the best-overlapping one.
    auto multi = (mask_pos.sum(-2, true) > 1).expand({-1, n_max, -1});
    mask_pos = torch::where(multi, torch::zeros_like(mask_pos).scatter_(1, overlaps.argmax(1, true), 1.0), mask_pos);
    auto fg_mask = mask_pos.sum(-2);
    auto batch_ind = torch::arange(bs, torch::kLong).unsqueeze(-1);
    auto flat_idx = mask_pos.argmax(-2) + batch_ind * n_max;  // EXPECT: tensor-device-mismatch
    auto labels = gt_labels.flatten().index({flat_idx}).clamp_(0);
    auto bboxes = gt_bboxes.view({-1, 4}).index({flat_idx});
    auto scores = torch::one_hot(labels, nc_).to(torch::kFloat).mul_(fg_mask.unsqueeze(-1) > 0);
    align_metric.mul_(mask_pos);
    auto pos_align = align_metric.amax(-1, true);
    auto pos_overlaps = (overlaps * mask_pos).amax(-1, true);
    auto norm = (align_metric * pos_overlaps / (pos_align + 1e-9)).amax(-2).unsqueeze(-1);
    return {labels, bboxes, scores.mul_(norm), fg_mask > 0};
  }

 private:
  int64_t topk_, nc_;
  double alpha_, beta_;
};

struct LossParts { torch::Tensor total, box, cls, dfl, num_fg; };

class DetectionLoss {
 public:
  explicit DetectionLoss(const HeadConfig& cfg)
      : cfg_(cfg), assigner_(cfg.topk, cfg.num_classes, cfg.alpha, cfg.beta), proj_(torch::arange(cfg.reg_max, torch::kFloat)) {}

  LossParts operator()(const std::vector<torch::Tensor>& feats, const torch::Tensor& targets, const torch::Tensor& imgsz) {
    const auto batch = feats[0].size(0), nc = cfg_.num_classes, no = nc + 4 * cfg_.reg_max;
    if (proj_.device() != feats[0].device()) proj_ = proj_.to(feats[0].device());
    std::vector<torch::Tensor> flat;
    for (const auto& f : feats) flat.push_back(f.view({batch, no, -1}));
    auto split = torch::cat(flat, 2).split_with_sizes({4 * cfg_.reg_max, nc}, 1);
    auto pred_distri = split[0].permute({0, 2, 1});
    auto pred_scores = split[1].permute({0, 2, 1});
    auto [anchor_points, stride_tensor] = make_anchors(feats, cfg_.strides);
    auto [gt_labels, gt_bboxes] = preprocess(targets, batch, imgsz);
    auto mask_gt = gt_bboxes.sum(-1, true).gt(0);
    // FACT: d = torch.randn(2, 67, 21)[:, :64].permute(0, 2, 1); assert is_view_of(d.view(2, 21, 4, 16), d)
    auto dist = pred_distri.view({batch, -1, 4, cfg_.reg_max}).softmax(3).matmul(proj_);  // LOOKALIKE: tensor-view-non-contiguous -- only splits the permuted channel dim, a view
    auto pred_bboxes = dist2bbox(dist, anchor_points);
    auto pred_px = pred_bboxes.detach();
    pred_px.mul_(stride_tensor);  // EXPECT: tensor-inplace-on-detached
    // FACT: a = torch.rand(5, 2); b = a.to(torch.float32); b.mul_(8); assert shares_storage(a, b)
    auto anc_px = anchor_points.to(gt_bboxes.scalar_type());
    anc_px.mul_(stride_tensor);  // EXPECT: tensor-alias-then-mutate
    auto assigned = assigner_(pred_scores.detach().sigmoid(), pred_px, anc_px, gt_labels, gt_bboxes, mask_gt);
    // FACT: g = torch.rand(2, 3, 4); t = g.view(-1, 4)[torch.tensor([[0, 1, 1, 2]])]; assert is_copy_of(t, g)
    auto target_bboxes = assigned.bboxes;
    target_bboxes.div_(stride_tensor);  // LOOKALIKE: tensor-alias-then-mutate -- gathered with an index tensor into new storage, assigned.bboxes is not read again
    auto target_scores = assigned.scores;
    auto target_scores_sum = target_scores.sum().clamp_min(1.0);
    // FACT: s = torch.randn(2, 67, 21)[:, 64:].permute(0, 2, 1); assert is_copy_of(s.reshape(-1, 3), s)
    auto logits = pred_scores.reshape({-1, nc});  // EXPECT: tensor-reshape-non-contiguous
    auto quality = target_scores.view({-1, nc});
    auto prob = logits.sigmoid();  // quality focal loss: |sigmoid - iou quality|^beta modulates the BCE
    // FACT: x = torch.randn(4, requires_grad=True); p = x.sigmoid(); p.clamp_(1e-4, 1 - 1e-4); assert backward_fails(lambda: (p - 0.5).abs().sum().backward())
    prob.clamp_(1e-4, 1.0 - 1e-4);  // EXPECT: tensor-inplace-on-saved
    auto modulator = (prob - quality).abs().pow(cfg_.qfl_beta);
    auto bce = F::binary_cross_entropy_with_logits(logits, quality, F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
    auto cls_loss = (bce * modulator).sum() / target_scores_sum;
    auto box_loss = torch::zeros({}, logits.options()), dfl = torch::zeros({}, logits.options());
    const auto& fg = assigned.fg_mask;
    auto num_fg = fg.sum();
    if (num_fg.item<int64_t>() > 0) {
      auto weight = target_scores.sum(-1).index({fg}).unsqueeze(-1);
      auto iou = bbox_diou(pred_bboxes.index({fg}), target_bboxes.index({fg}));
      box_loss = ((1.0 - iou).unsqueeze(-1) * weight).sum() / target_scores_sum;
      auto target_ltrb = bbox2dist(anchor_points, target_bboxes, cfg_.reg_max - 1);
      // FACT: p = torch.randn(2, 67, 5)[:, :64].permute(0, 2, 1); m = torch.tensor([[True, False, True, True, False]] * 2); assert not raises(lambda: p[m].view(-1, 16))
      auto fg_dist = pred_distri.index({fg}).view({-1, cfg_.reg_max});  // LOOKALIKE: tensor-view-non-contiguous -- boolean-mask indexing gathers a contiguous copy
      dfl = (dfl_loss(fg_dist, target_ltrb.index({fg})) * weight).sum() / target_scores_sum;
    }
    auto total = (box_loss * cfg_.box_gain + cls_loss * cfg_.cls_gain + dfl * cfg_.dfl_gain) * batch;
    return {total, box_loss, cls_loss, dfl, num_fg};
  }

 private:
  // targets rows: (image index, class, cx, cy, w, h), normalised.
  std::pair<torch::Tensor, torch::Tensor> preprocess(const torch::Tensor& targets, int64_t batch, const torch::Tensor& scale) {
    auto img_idx = targets.select(1, 0).to(torch::kLong);
    auto counts = torch::bincount(img_idx, {}, batch).cpu();
    const int64_t n_max = std::max<int64_t>(counts.max().item<int64_t>(), 1);
    auto out = torch::zeros({batch, n_max, 5}, targets.options());
    for (int64_t i = 0; i < batch; ++i) {
      const auto n = counts[i].item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- counts were brought to the host once, before the loop
      if (n > 0) out[i].narrow(0, 0, n).copy_(targets.index({img_idx == i}).narrow(1, 1, 5));
    }
    auto xywh = out.narrow(2, 1, 4) * scale;
    auto c = xywh.narrow(-1, 0, 2), half = xywh.narrow(-1, 2, 2) / 2;
    return {out.narrow(2, 0, 1).to(torch::kLong), torch::cat({c - half, c + half}, -1)};
  }

  HeadConfig cfg_;
  TaskAlignedAssigner assigner_;
  torch::Tensor proj_;
};

struct DetBatch { torch::Tensor images, targets; };

// Label rows as the annotation parser returns them: (class, cx, cy, w, h) per object.
torch::Tensor parse_label_rows(const std::vector<double>& rows) {
  const auto n = static_cast<int64_t>(rows.size()) / 5;
  return torch::from_blob(const_cast<double*>(rows.data()), {n, 5}, torch::kFloat64).clone();  // LOOKALIKE: tensor-unnecessary-clone -- from_blob only borrows the vector's buffer
}

DetBatch collate(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels) {
  int64_t total = 0, row = 0;
  for (const auto& l : labels) total += l.size(0);
  auto targets = torch::empty({total, 6});
  for (size_t i = 0; i < labels.size(); ++i) {
    auto dst = targets.narrow(0, row, labels[i].size(0));
    dst.select(1, 0).fill_(static_cast<double>(i));
    dst.narrow(1, 1, 5).copy_(labels[i]);  // EXPECT: tensor-copy-narrowing
    row += labels[i].size(0);
  }
  return {torch::stack(images), targets};
}

std::vector<DetBatch> synthetic_batches(int64_t count, int64_t batch, const HeadConfig& cfg) {
  std::vector<DetBatch> out;
  for (int64_t b = 0; b < count; ++b) {
    std::vector<torch::Tensor> images, labels;
    for (int64_t i = 0; i < batch; ++i) {
      images.push_back(torch::randint(0, 256, {3, cfg.image_size, cfg.image_size}, torch::kUInt8));
      const double c = static_cast<double>((b + i) % cfg.num_classes);
      labels.push_back(parse_label_rows({c, 0.5, 0.5, 0.2, 0.3, 0.0, 0.25, 0.7, 0.15, 0.1}));
    }
    out.push_back(collate(images, labels));
  }
  return out;
}

int main(int argc, char** argv) {
  torch::manual_seed(0);
  const torch::Device device(torch::kCUDA);
  HeadConfig cfg;
  TinyBackbone backbone(cfg.in_channels);
  DetectHead head(cfg);
  backbone->to(device);
  head->to(device);
  head->init_bias();
  if (argc > 1) head->reset_cls_prior(std::stod(argv[1]));
  auto params = backbone->parameters();
  for (auto& p : head->parameters()) params.push_back(p);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.01).momentum(0.937).nesterov(true).weight_decay(5e-4));
  DetectionLoss criterion(cfg);
  const auto batches = synthetic_batches(8, 4, cfg);
  const auto imgsz = torch::full({4}, static_cast<double>(cfg.image_size));
  for (int epoch = 0; epoch < 5; ++epoch) {
    auto epoch_loss = torch::zeros({}, device), box_running = torch::zeros({}, device);
    int64_t fg_total = 0;
    for (const auto& batch : batches) {
      // FACT: a = torch.zeros(2, 3, 4, 4, dtype=torch.uint8); assert is_copy_of(a.to(torch.float32), a)
      auto images = batch.images.to(device).to(torch::kFloat);
      images.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 -> float allocates, the batch keeps its bytes
      auto targets = batch.targets.to(device);
      auto parts = criterion(head->forward(backbone->forward(images)), targets, imgsz.to(device));  // EXPECT: tensor-clone-in-loop
      opt.zero_grad();
      parts.total.backward();
      torch::nn::utils::clip_grad_norm_(params, 10.0);
      opt.step();
      epoch_loss += parts.total;  // EXPECT: tensor-graph-kept-across-iterations
      box_running += parts.box.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, summed on the device
      fg_total += parts.num_fg.item<int64_t>();  // EXPECT: tensor-sync-in-loop
    }
    const auto n = static_cast<double>(batches.size());
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / n << " box " << box_running.item<double>() / n << " fg " << fg_total / n << "\n";
  }
  return 0;
}
