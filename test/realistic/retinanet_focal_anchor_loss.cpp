// RetinaNet: shared class/box heads over FPN levels, anchor generation and
// IoU matching, sigmoid focal loss, and the train / eval loops.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct RetinaConfig {
  int64_t num_classes = 80, num_anchors = 9, fpn_channels = 256;
  double prior = 0.01, alpha = 0.25, gamma = 2.0;
  double fg_iou = 0.5, bg_iou = 0.4, score_thresh = 0.05;
  std::vector<int64_t> strides{8, 16, 32, 64, 128};
};

// Stand-in backbone + FPN: a patchify stem (stride 8) and five stages giving P3..P7.
struct TinyFPNImpl : nn::Module {
  explicit TinyFPNImpl(int64_t out_ch) {
    stem_ = register_module("stem", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, 256, 8).stride(8)), nn::ReLU()));
    for (int i = 0; i < 5; ++i)
      down_.push_back(register_module("down" + std::to_string(i),
          nn::Conv2d(nn::Conv2dOptions(i == 0 ? 256 : out_ch, out_ch, 3).stride(i == 0 ? 1 : 2).padding(1))));
  }
  std::vector<torch::Tensor> forward(const torch::Tensor& images) {
    std::vector<torch::Tensor> feats;
    auto x = stem_->forward(images);
    for (auto& conv : down_) feats.push_back(x = torch::relu(conv->forward(x)));
    return feats;
  }
  nn::Sequential stem_{nullptr};
  std::vector<nn::Conv2d> down_;
};
TORCH_MODULE(TinyFPN);

struct HeadImpl : nn::Module {
  HeadImpl(int64_t ch, int64_t outputs, double bias_init) {
    tower_ = register_module("tower", nn::Sequential());
    for (int i = 0; i < 4; ++i) {
      tower_->push_back(nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1)));
      tower_->push_back(nn::ReLU());
    }
    pred_ = register_module("pred", nn::Conv2d(nn::Conv2dOptions(ch, outputs, 3).padding(1)));
    torch::NoGradGuard no_grad;
    for (auto& p : parameters())
      if (p.dim() == 4) p.normal_(0.0, 0.01);
    pred_->bias.fill_(bias_init); // LOOKALIKE: tensor-inplace-on-leaf -- inside the NoGradGuard block
  }
  torch::Tensor forward(const torch::Tensor& f) { return pred_->forward(tower_->forward(f)); }
  nn::Sequential tower_{nullptr};
  nn::Conv2d pred_{nullptr};
};
TORCH_MODULE(Head);

// [B, A*K, H, W] -> [B, H*W*A, K] in the anchor generator's (y, x, anchor) order.
torch::Tensor flatten_head(const torch::Tensor& out, int64_t K) {
  const auto B = out.size(0);
  // FACT: o = torch.randn(2, 9 * 3, 4, 5); assert is_copy_of(o.permute(0, 2, 3, 1).reshape(2, -1, 3), o)
  return out.permute({0, 2, 3, 1}).reshape({B, -1, K}); // EXPECT: tensor-reshape-non-contiguous
}

struct RetinaOutput {
  torch::Tensor cls_logits, box_deltas;  // [B, N, K], [B, N, 4]
};

struct RetinaNetImpl : nn::Module {
  explicit RetinaNetImpl(const RetinaConfig& cfg) : cfg_(cfg) {
    fpn_ = register_module("fpn", TinyFPN(cfg.fpn_channels));
    const double prior_bias = -std::log((1.0 - cfg.prior) / cfg.prior);
    cls_head_ = register_module("cls_head", Head(cfg.fpn_channels, cfg.num_anchors * cfg.num_classes, prior_bias));
    box_head_ = register_module("box_head", Head(cfg.fpn_channels, cfg.num_anchors * 4, 0.0));
  }
  RetinaOutput forward(const torch::Tensor& images) {
    std::vector<torch::Tensor> cls, box;
    for (auto& f : fpn_->forward(images)) {
      cls.push_back(flatten_head(cls_head_->forward(f), cfg_.num_classes)); // LOOKALIKE: tensor-graph-kept-across-iterations -- concatenated into the returned output
      const auto B = f.size(0);
      auto b = box_head_->forward(f);
      // FACT: b = torch.randn(2, 36, 4, 5); assert is_contiguous(b.permute(0, 2, 3, 1).contiguous().view(2, -1, 4))
      box.push_back(b.permute({0, 2, 3, 1}).contiguous().view({B, -1, 4})); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() before the view
    }
    return {torch::cat(cls, 1), torch::cat(box, 1)};
  }
  RetinaConfig cfg_;
  TinyFPN fpn_{nullptr};
  Head cls_head_{nullptr}, box_head_{nullptr};
};
TORCH_MODULE(RetinaNet);

torch::Tensor cell_anchors(int64_t stride) {
  std::vector<float> v;
  for (double octave : {0.0, 1.0 / 3, 2.0 / 3})
    for (double ratio : {0.5, 1.0, 2.0}) {
      const double size = 4.0 * stride * std::pow(2.0, octave);
      const double w = size / std::sqrt(ratio), h = size * std::sqrt(ratio);
      v.insert(v.end(), {float(-w / 2), float(-h / 2), float(w / 2), float(h / 2)});
    }
  return torch::tensor(v).view({-1, 4});
}

torch::Tensor anchors_for(int64_t img_h, int64_t img_w, const RetinaConfig& cfg) {
  std::vector<torch::Tensor> levels;
  for (auto stride : cfg.strides) {
    const int64_t h = (img_h + stride - 1) / stride, w = (img_w + stride - 1) / stride;
    auto sx = (torch::arange(w, torch::kFloat) + 0.5) * stride;
    auto sy = (torch::arange(h, torch::kFloat) + 0.5) * stride;
    auto xs = sx.repeat({h});
    auto ys = sy.repeat_interleave(w);
    auto shifts = torch::stack({xs, ys, xs, ys}, 1);  // [h*w, 4]
    // FACT: s = torch.randn(20, 4); c = torch.randn(9, 4); a = s.view(-1, 1, 4) + c.view(1, -1, 4); assert is_view_of(a.reshape(-1, 4), a)
    levels.push_back((shifts.view({-1, 1, 4}) + cell_anchors(stride).view({1, -1, 4})).reshape({-1, 4})); // LOOKALIKE: tensor-reshape-non-contiguous -- the broadcast sum is a fresh contiguous tensor
  }
  return torch::cat(levels, 0);
}

torch::Tensor box_iou(const torch::Tensor& a, const torch::Tensor& b) {
  auto area = [](const torch::Tensor& x) { return (x.select(1, 2) - x.select(1, 0)) * (x.select(1, 3) - x.select(1, 1)); };
  auto lt = torch::max(a.unsqueeze(1).narrow(2, 0, 2), b.unsqueeze(0).narrow(2, 0, 2));
  auto rb = torch::min(a.unsqueeze(1).narrow(2, 2, 2), b.unsqueeze(0).narrow(2, 2, 2));
  auto wh = (rb - lt).clamp_min(0);
  auto inter = wh.select(2, 0) * wh.select(2, 1);
  return inter / (area(a).unsqueeze(1) + area(b).unsqueeze(0) - inter);
}

// xyxy -> (cx, cy, w, h) in a copy of the boxes.
torch::Tensor to_cxcywh(const torch::Tensor& boxes) {
  auto out = boxes.clone(); // LOOKALIKE: tensor-unnecessary-clone -- written through views below, the caller's boxes stay xyxy
  auto wh = out.narrow(1, 2, 2);
  // FACT: b = torch.rand(6, 4); e = b.clone(); wh = b.narrow(1, 2, 2); wh.sub_(b.narrow(1, 0, 2)); assert torch.equal(wh, e[:, 2:] - e[:, :2])
  wh.sub_(out.narrow(1, 0, 2)); // LOOKALIKE: tensor-inplace-overlap -- columns 0-1 and 2-3 are disjoint
  out.narrow(1, 0, 2).add_(wh * 0.5);
  return out;
}

torch::Tensor encode(const torch::Tensor& gt, const torch::Tensor& anchors) {
  auto g = to_cxcywh(gt), a = to_cxcywh(anchors);
  auto a_wh = a.narrow(1, 2, 2);
  auto d_xy = (g.narrow(1, 0, 2) - a.narrow(1, 0, 2)) / a_wh;
  auto d_wh = torch::log(g.narrow(1, 2, 2) / a_wh);
  return torch::cat({d_xy / 0.1, d_wh / 0.2}, 1);
}

// Rescales annotation boxes from the source image to the network input size.
torch::Tensor to_input_coords(const torch::Tensor& boxes, double sx, double sy) {
  auto scale = torch::tensor({float(sx), float(sy), float(sx), float(sy)});
  auto out = boxes.contiguous();
  // FACT: b = torch.rand(5, 4); o = b.contiguous(); o.mul_(2.0); assert shares_storage(o, b)
  out.mul_(scale); // EXPECT: tensor-alias-then-mutate
  return out;
}

struct MatchTargets {
  torch::Tensor cls, box, state;  // [A, K] one-hot, [A, 4] deltas, [A] 1 fg / 0 bg / -1 ignored
};

MatchTargets match_anchors(const torch::Tensor& anchors, const torch::Tensor& gt_boxes,
                           const torch::Tensor& gt_labels, const RetinaConfig& cfg) {
  const auto A = anchors.size(0);
  MatchTargets t{torch::zeros({A, cfg.num_classes}), torch::zeros({A, 4}), torch::zeros({A}, torch::kLong)};
  if (gt_boxes.size(0) == 0) return t;
  auto iou = box_iou(gt_boxes, anchors);  // [G, A]
  auto [max_iou, argmax] = iou.max(0);
  auto best_for_gt = std::get<0>(iou.max(1, true));  // low-quality matches keep each gt's best anchor
  auto forced = (iou == best_for_gt).any(0);
  t.state.masked_fill_((max_iou >= cfg.bg_iou).logical_and(max_iou < cfg.fg_iou), -1);
  t.state.masked_fill_((max_iou >= cfg.fg_iou).logical_or(forced), 1);
  auto fg = t.state.eq(1).nonzero().squeeze(1);
  auto matched = argmax.index_select(0, fg);
  t.cls.index_put_({fg, gt_labels.index_select(0, matched)}, 1.0);
  t.box.index_copy_(0, fg, encode(gt_boxes.index_select(0, matched), anchors.index_select(0, fg)));
  return t;
}

torch::Tensor sigmoid_focal_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                                 const torch::Tensor& valid, double alpha, double gamma) {
  auto p = torch::sigmoid(logits);
  p.clamp_(1e-4, 1.0 - 1e-4); // EXPECT: tensor-inplace-on-saved
  auto ce = -(targets * torch::log(p) + (1 - targets) * torch::log(1 - p));
  auto p_t = p * targets + (1 - p) * (1 - targets);
  auto a_t = alpha * targets + (1 - alpha) * (1 - targets);
  auto loss = a_t * ce * torch::pow(1 - p_t, gamma);
  return (loss.sum(-1) * valid).sum();
}

// Ring buffer of per-epoch losses, for plateau detection.
struct LossWindow {
  explicit LossWindow(int64_t k) : values_(torch::zeros({k}, torch::kDouble)) {}
  void push(double v) {
    const auto k = values_.size(0);
    // FACT: w = torch.zeros(20, dtype=torch.double); assert raises(lambda: w.narrow(0, 0, 19).copy_(w.narrow(0, 1, 19)), "some elements of the input tensor")
    values_.narrow(0, 0, k - 1).copy_(values_.narrow(0, 1, k - 1)); // EXPECT: tensor-inplace-overlap
    values_[k - 1] = v;
    filled_ = std::min(filled_ + 1, k);
  }
  double mean() const { return filled_ ? values_.narrow(0, values_.size(0) - filled_, filled_).mean().item<double>() : 0.0; }
  torch::Tensor values_;  int64_t filled_ = 0;
};

struct DetBatch {
  torch::Tensor images;                            // [B, 3, H, W] float
  std::vector<torch::Tensor> boxes, labels;        // per image, source-image coordinates
  double sx = 1.0, sy = 1.0;
};

class Trainer {
 public:
  Trainer(RetinaNet model, const RetinaConfig& cfg)
      : model_(model), cfg_(cfg),
        opt_(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(1e-4)) {}

  void fit(std::vector<DetBatch>& loader, int64_t epochs) {
    torch::Device device(torch::kCUDA, 0);
    model_->to(device);
    model_->train();
    auto mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}).to(device);
    auto stdv = torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}).to(device);
    int64_t step = 0;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      for (auto& batch : loader) {
        auto images = (batch.images.to(device) - mean) / stdv; // LOOKALIKE: tensor-clone-in-loop, tensor-device-mismatch -- a new batch each step; mean/std were moved to the device
        auto anchors = anchors_for(images.size(2), images.size(3), cfg_);
        std::vector<torch::Tensor> cls_t, box_t, state_t;
        for (size_t i = 0; i < batch.boxes.size(); ++i) {
          auto m = match_anchors(anchors, to_input_coords(batch.boxes[i], batch.sx, batch.sy), batch.labels[i], cfg_);
          cls_t.push_back(m.cls);
          box_t.push_back(m.box);
          state_t.push_back(m.state);
        }
        auto cls_targets = torch::stack(cls_t).to(device);
        auto box_targets = torch::stack(box_t).to(device);
        auto state = torch::stack(state_t).to(device);

        auto out = model_->forward(images);
        auto fg = state.eq(1);
        auto num_fg = fg.sum().clamp_min(1).to(torch::kFloat);
        auto cls_loss = sigmoid_focal_loss(out.cls_logits, cls_targets, state.ge(0).to(torch::kFloat), cfg_.alpha, cfg_.gamma) / num_fg;
        auto box_loss = F::l1_loss(out.box_deltas.index({fg}), box_targets.index({fg}), F::L1LossFuncOptions(torch::kSum)) / num_fg;
        auto loss = cls_loss + box_loss;
        if (!std::isfinite(loss.item<float>())) continue; // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to step
        opt_.zero_grad();
        loss.backward();
        opt_.step();
        step_losses_.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations
        std::printf("\repoch %ld step %ld loss %.4f", long(epoch), long(step), loss.item<float>()); // EXPECT: tensor-sync-in-loop
        ++step;
      }
      window_.push(recent_loss());
      std::cout << "\nepoch " << epoch << " recent " << recent_loss() << " smoothed " << window_.mean() << std::endl;
    }
  }

  double recent_loss() const {
    if (step_losses_.empty()) return 0.0;
    const size_t n = std::min<size_t>(step_losses_.size(), 50);
    std::vector<torch::Tensor> tail(step_losses_.end() - n, step_losses_.end());
    return torch::stack(tail).mean().item<double>();
  }

 private:
  RetinaNet model_;
  RetinaConfig cfg_;
  torch::optim::SGD opt_;
  std::vector<torch::Tensor> step_losses_;
  LossWindow window_{10};
};

// Integer pixel boxes for the overlay renderer.
torch::Tensor to_pixel_boxes(const torch::Tensor& dets, double scale) {
  auto pix = torch::empty({dets.size(0), 4}, torch::kInt32);
  pix.copy_(dets.narrow(1, 0, 4) * scale); // EXPECT: tensor-copy-narrowing
  return pix;
}

// Detections as float64 records (x1, y1, x2, y2, score) for the JSON writer.
torch::Tensor to_records(const torch::Tensor& dets) {
  auto rec = torch::empty({dets.size(0), 5}, torch::kFloat64);
  rec.copy_(dets.narrow(1, 0, 5)); // LOOKALIKE: tensor-copy-narrowing -- float32 into float64 widens
  return rec;
}

std::vector<torch::Tensor> evaluate(RetinaNet model, const std::vector<DetBatch>& val, const RetinaConfig& cfg,
                                    std::vector<torch::Tensor>& records) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA, 0);
  model->to(device);
  model->eval();
  auto box_std = torch::tensor({0.1f, 0.1f, 0.2f, 0.2f});
  std::vector<torch::Tensor> pixel_boxes;
  for (const auto& batch : val) {
    auto images = batch.images.to(device);
    auto anchors = to_cxcywh(anchors_for(images.size(2), images.size(3), cfg).to(device));
    auto out = model->forward(images);
    auto deltas = out.box_deltas * box_std; // EXPECT: tensor-device-mismatch
    auto ctr = anchors.narrow(1, 0, 2) + deltas.narrow(2, 0, 2) * anchors.narrow(1, 2, 2);
    auto wh = torch::exp(deltas.narrow(2, 2, 2)) * anchors.narrow(1, 2, 2);
    auto boxes = torch::cat({ctr - 0.5 * wh, ctr + 0.5 * wh}, 2);
    auto scores = std::get<0>(torch::sigmoid(out.cls_logits).max(2));
    for (int64_t i = 0; i < boxes.size(0); ++i) {
      auto keep = scores[i] > cfg.score_thresh;
      auto dets = torch::cat({boxes[i].index({keep}), scores[i].index({keep}).unsqueeze(1)}, 1).cpu();
      pixel_boxes.push_back(to_pixel_boxes(dets, 1.0 / batch.sx));
      records.push_back(to_records(dets));
    }
  }
  return pixel_boxes;
}
