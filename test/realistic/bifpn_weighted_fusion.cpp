// EfficientDet-style detector: small strided backbone, BiFPN neck with fast normalised fusion,
// shared box/class heads over P3..P7, anchor decoding and a fixed-size detection record.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
namespace nn = torch::nn;

struct DetConfig {
  int64_t channels = 64;
  int64_t bifpn_layers = 3;
  int64_t head_depth = 3;
  int64_t num_classes = 90;
  int64_t num_anchors = 9;
  int64_t max_det = 100;
  double score_thresh = 0.05;
  double fusion_eps = 1e-4;
  double anchor_scale = 4.0;
  std::vector<int64_t> strides{8, 16, 32, 64, 128};
};

struct SeparableConvImpl : nn::Module {
  explicit SeparableConvImpl(int64_t ch)
      : dw(register_module("dw", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1).groups(ch).bias(false)))),
        pw(register_module("pw", nn::Conv2d(nn::Conv2dOptions(ch, ch, 1)))),
        bn(register_module("bn", nn::BatchNorm2d(nn::BatchNorm2dOptions(ch).momentum(0.01).eps(1e-3)))) {}
  torch::Tensor forward(const torch::Tensor& x) { return bn(pw(dw(x))); }
  nn::Conv2d dw, pw;
  nn::BatchNorm2d bn;
};
TORCH_MODULE(SeparableConv);

inline torch::Tensor swish(const torch::Tensor& x) { return x * torch::sigmoid(x); }

torch::Tensor resize_to(const torch::Tensor& x, const torch::Tensor& ref) {
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<int64_t>{ref.size(2), ref.size(3)})
                               .mode(torch::kNearest));
}

torch::Tensor downsample_to(const torch::Tensor& x, const torch::Tensor& ref) {
  auto y = F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
  if (y.size(2) != ref.size(2) || y.size(3) != ref.size(3)) y = resize_to(y, ref);
  return y;
}

// One BiFPN layer over P3..P7. Top-down nodes fuse two inputs, bottom-up nodes three (P7: two).
struct BiFPNLayerImpl : nn::Module {
  BiFPNLayerImpl(int64_t ch, double eps) : eps_(eps) {
    for (int i = 0; i < 4; ++i) {
      td.push_back(register_module("td" + std::to_string(i), SeparableConv(ch)));
      bu.push_back(register_module("bu" + std::to_string(i), SeparableConv(ch)));
    }
    w_td = register_parameter("w_td", torch::ones({4, 2}));
    w_bu = register_parameter("w_bu", torch::ones({4, 3}));
  }

  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& feats) {
    auto p3_in = feats[0], p4_in = feats[1], p5_in = feats[2], p6_in = feats[3], p7_in = feats[4];
    // Fast normalised fusion: O = sum_i w_i * I_i / (eps + sum_j w_j), with w = relu(w).
    auto wt = torch::relu(w_td);
    wt.div_(wt.sum(1, true) + eps_); // EXPECT: tensor-inplace-on-saved
    auto wb = torch::relu(w_bu);
    wb = wb / (wb.sum(1, true) + eps_); // LOOKALIKE: tensor-inplace-on-saved -- out-of-place, relu's result is untouched

    // Top-down path.
    torch::Tensor p6_td = p6_in;
    // FACT: a = torch.randn(2, 4, 3, 3); b = a; b = b * 0.5 + 1.0; assert is_copy_of(b, a)
    p6_td = p6_td * wt[0][0] + resize_to(p7_in, p6_in) * wt[0][1]; // LOOKALIKE: tensor-alias-then-mutate -- rebound by an out-of-place op, p6_in untouched
    p6_td = td[0]->forward(swish(p6_td));
    auto p5_td = td[1]->forward(swish(wt[1][0] * p5_in + wt[1][1] * resize_to(p6_td, p5_in)));
    torch::Tensor p4_td = p4_in;
    // FACT: a = torch.randn(2, 4, 6, 6); b = a; b.mul_(0.5).add_(torch.ones(2, 4, 6, 6)); assert shares_storage(a, b) and torch.equal(a, b)
    p4_td.mul_(wt[2][0]).add_(resize_to(p5_td, p4_in) * wt[2][1]); // EXPECT: tensor-alias-then-mutate
    p4_td = td[2]->forward(swish(p4_td));
    auto p3_out = td[3]->forward(swish(wt[3][0] * p3_in + wt[3][1] * resize_to(p4_td, p3_in)));

    // Bottom-up path: every node also sees its level's input again.
    auto p4_out = bu[0]->forward(
        swish(wb[0][0] * p4_in + wb[0][1] * p4_td + wb[0][2] * downsample_to(p3_out, p4_in)));
    auto p5_out = bu[1]->forward(
        swish(wb[1][0] * p5_in + wb[1][1] * p5_td + wb[1][2] * downsample_to(p4_out, p5_in)));
    auto p6_out = bu[2]->forward(
        swish(wb[2][0] * p6_in + wb[2][1] * p6_td + wb[2][2] * downsample_to(p5_out, p6_in)));
    auto p7_out = bu[3]->forward(swish(wb[3][0] * p7_in + wb[3][1] * downsample_to(p6_out, p7_in)));
    return {p3_out, p4_out, p5_out, p6_out, p7_out};
  }

  double eps_;
  std::vector<SeparableConv> td, bu;
  torch::Tensor w_td, w_bu;
};
TORCH_MODULE(BiFPNLayer);

struct HeadImpl : nn::Module {
  HeadImpl(int64_t ch, int64_t out_per_anchor, int64_t anchors, int64_t depth) {
    for (int64_t d = 0; d < depth; ++d)
      convs.push_back(register_module("conv" + std::to_string(d), SeparableConv(ch)));
    pred = register_module("pred", nn::Conv2d(nn::Conv2dOptions(ch, anchors * out_per_anchor, 3).padding(1)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& c : convs) x = swish(c->forward(x));
    return pred(x);
  }
  std::vector<SeparableConv> convs;
  nn::Conv2d pred{nullptr};
};
TORCH_MODULE(Head);

struct DetOutput {
  torch::Tensor box;  // [B, N, 4]
  torch::Tensor cls;  // [B, N, K]
};

struct EfficientDetImpl : nn::Module {
  explicit EfficientDetImpl(const DetConfig& c) : cfg(c) {
    const int64_t C = c.channels;
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, C, 3).stride(8).padding(1)));
    c4 = register_module("c4", nn::Conv2d(nn::Conv2dOptions(C, C, 3).stride(2).padding(1)));
    c5 = register_module("c5", nn::Conv2d(nn::Conv2dOptions(C, C, 3).stride(2).padding(1)));
    c6 = register_module("c6", nn::Conv2d(nn::Conv2dOptions(C, C, 3).stride(2).padding(1)));
    for (int64_t i = 0; i < c.bifpn_layers; ++i)
      bifpn.push_back(register_module("bifpn" + std::to_string(i), BiFPNLayer(C, c.fusion_eps)));
    box_head = register_module("box_head", Head(C, 4, c.num_anchors, c.head_depth));
    cls_head = register_module("cls_head", Head(C, c.num_classes, c.num_anchors, c.head_depth));
    nn::init::constant_(cls_head->pred->bias, -std::log((1.0 - 0.01) / 0.01)); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
  }

  DetOutput forward(const torch::Tensor& images) {
    auto p3 = torch::relu(stem(images));
    auto p4 = torch::relu(c4(p3));
    auto p5 = torch::relu(c5(p4));
    auto p6 = c6(p5);
    auto p7 = F::max_pool2d(p6, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
    std::vector<torch::Tensor> feats{p3, p4, p5, p6, p7};
    for (auto& layer : bifpn) feats = layer->forward(feats);

    const int64_t B = images.size(0);
    std::vector<torch::Tensor> boxes, logits;
    for (const auto& f : feats) {
      auto b = box_head(f);
      // FACT: b = torch.randn(2, 36, 5, 6); assert is_copy_of(b.permute(0, 2, 3, 1).reshape(2, -1, 4), b)
      boxes.push_back(b.permute({0, 2, 3, 1}).reshape({B, -1, 4})); // EXPECT: tensor-reshape-non-contiguous // LOOKALIKE: tensor-graph-kept-across-iterations -- the level list is concatenated and returned for the loss
      auto c = cls_head(f);
      // FACT: c = torch.randn(2, 18, 5, 6).permute(0, 2, 3, 1).contiguous(); assert is_contiguous(c) and c.view(2, -1, 2).shape == (2, 270, 2)
      logits.push_back(c.permute({0, 2, 3, 1}).contiguous().view({B, -1, cfg.num_classes})); // LOOKALIKE: tensor-view-non-contiguous, tensor-graph-kept-across-iterations -- contiguous() copies before the view; the list is returned
    }
    return {torch::cat(boxes, 1), torch::cat(logits, 1)};
  }

  DetConfig cfg;
  nn::Conv2d stem{nullptr}, c4{nullptr}, c5{nullptr}, c6{nullptr};
  std::vector<BiFPNLayer> bifpn;
  Head box_head{nullptr}, cls_head{nullptr};
};
TORCH_MODULE(EfficientDet);

// Anchors (cy, cx, h, w) in input pixels, in the heads' order: level, cell, anchor.
torch::Tensor generate_anchors(const DetConfig& cfg, int64_t image_h, int64_t image_w) {
  const float octave[3] = {1.0f, 1.2599f, 1.5874f};
  const float aspect[3][2] = {{1.0f, 1.0f}, {1.4f, 0.7f}, {0.7f, 1.4f}};
  std::vector<torch::Tensor> levels;
  for (int64_t stride : cfg.strides) {
    const int64_t fh = (image_h + stride - 1) / stride, fw = (image_w + stride - 1) / stride;
    auto ys = (torch::arange(fh, torch::kFloat) + 0.5) * stride;
    auto xs = (torch::arange(fw, torch::kFloat) + 0.5) * stride;
    auto cy = ys.repeat_interleave(fw);
    auto cx = xs.repeat({fh});
    std::vector<float> hw;
    for (float o : octave)
      for (const auto& a : aspect) {
        hw.push_back(static_cast<float>(cfg.anchor_scale * stride) * o * a[0]);
        hw.push_back(static_cast<float>(cfg.anchor_scale * stride) * o * a[1]);
      }
    auto sizes = torch::tensor(hw).view({-1, 2});
    const int64_t cells = fh * fw, A = sizes.size(0);
    auto ctr = torch::stack({cy, cx}, 1).unsqueeze(1).expand({cells, A, 2});
    auto sz = sizes.unsqueeze(0).expand({cells, A, 2});
    // FACT: t = torch.cat([torch.rand(6, 1, 2).expand(6, 9, 2), torch.rand(1, 9, 2).expand(6, 9, 2)], 2); assert is_contiguous(t) and is_view_of(t.reshape(-1, 4), t)
    levels.push_back(torch::cat({ctr, sz}, 2).reshape({-1, 4})); // LOOKALIKE: tensor-reshape-non-contiguous -- cat's output is contiguous: a view
  }
  return torch::cat(levels, 0);
}

// reg: [B, N, 4] (dy, dx, dh, dw) in anchor units; anchors: [N, 4]. Returns (y1, x1, y2, x2).
torch::Tensor decode_boxes(const torch::Tensor& reg, const torch::Tensor& anchors) {
  const int64_t B = reg.size(0);
  auto a_ctr = anchors.narrow(1, 0, 2).unsqueeze(0);
  auto a_size = anchors.narrow(1, 2, 2).unsqueeze(0).expand({B, -1, -1});
  auto ctr = reg.narrow(2, 0, 2) * a_size;
  // FACT: c = torch.zeros(3, 5, 2); c.add_(torch.rand(5, 2).unsqueeze(0).expand(3, -1, -1)); assert c.shape == (3, 5, 2)
  ctr.add_(a_ctr.expand_as(ctr)); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded anchors are only read
  // FACT: s = torch.rand(5, 2).unsqueeze(0).expand(3, -1, -1); assert raises(lambda: s.mul_(torch.rand(3, 5, 2)), "more than one element")
  a_size.mul_(reg.narrow(2, 2, 2).exp()); // EXPECT: tensor-inplace-on-expanded
  return torch::cat({ctr - 0.5 * a_size, ctr + 0.5 * a_size}, 2);
}

struct Detections {
  torch::Tensor boxes_px;      // [max_det, 4] int32
  torch::Tensor labels;        // [max_det] int64, -1 = empty
  torch::Tensor scores_milli;  // [max_det] int16, score * 1000
  int64_t count = 0;
};
// One image: boxes [N, 4], logits [N, K]. NMS runs downstream in the serving graph.
Detections postprocess(const torch::Tensor& boxes, const torch::Tensor& logits, const DetConfig& cfg) {
  auto probs = torch::sigmoid(logits);
  auto [scores, labels] = probs.max(1);
  auto keep = torch::nonzero(scores > cfg.score_thresh).squeeze(1);
  auto order = scores.index_select(0, keep).argsort(0, /*descending=*/true);
  keep = keep.index_select(0, order.narrow(0, 0, std::min<int64_t>(cfg.max_det, order.size(0))));
  const int64_t n = keep.size(0);
  Detections det;
  det.boxes_px = torch::zeros({cfg.max_det, 4}, torch::kInt);
  det.labels = torch::full({cfg.max_det}, -1, torch::kLong);
  det.scores_milli = torch::zeros({cfg.max_det}, torch::kShort);
  det.count = n;
  det.boxes_px.narrow(0, 0, n).copy_(boxes.index_select(0, keep).round()); // LOOKALIKE: tensor-copy-narrowing -- rounded to whole pixels first
  det.labels.narrow(0, 0, n).copy_(labels.index_select(0, keep)); // LOOKALIKE: tensor-copy-narrowing -- int64 indices into int64
  det.scores_milli.narrow(0, 0, n).copy_(scores.index_select(0, keep) * 1000.0); // EXPECT: tensor-copy-narrowing
  return det;
}

Detections detect_one(EfficientDet& model, const torch::Tensor& image, const DetConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->to(torch::kCUDA);
  model->eval();
  auto x = image.unsqueeze(0).cuda();
  auto out = model->forward(x);
  auto anchors = generate_anchors(cfg, image.size(1), image.size(2)).cuda();
  auto boxes = decode_boxes(out.box, anchors).squeeze(0);
  const float H = static_cast<float>(image.size(1)), W = static_cast<float>(image.size(2));
  auto limits = torch::tensor({H - 1.0f, W - 1.0f, H - 1.0f, W - 1.0f});
  boxes = torch::min(boxes, limits).clamp_min(0.0); // EXPECT: tensor-device-mismatch
  return postprocess(boxes.cpu(), out.cls.squeeze(0).cpu(), cfg);
}

double mean_detections(EfficientDet& model, const std::vector<torch::Tensor>& batches, const DetConfig& cfg) {
  torch::Device dev(torch::kCUDA);
  model->to(dev);
  model->eval();
  torch::NoGradGuard no_grad;
  auto anchors = generate_anchors(cfg, batches.front().size(2), batches.front().size(3));
  int64_t kept = 0, images = 0;
  for (const auto& batch : batches) {
    auto x = batch.to(dev); // LOOKALIKE: tensor-clone-in-loop -- a different batch each iteration
    auto out = model->forward(x);
    auto anc = anchors.to(dev); // EXPECT: tensor-clone-in-loop
    auto boxes = decode_boxes(out.box, anc);
    for (int64_t i = 0; i < x.size(0); ++i)
      kept += postprocess(boxes[i].cpu(), out.cls[i].cpu(), cfg).count;
    images += x.size(0);
  }
  return images > 0 ? static_cast<double>(kept) / static_cast<double>(images) : 0.0;
}

struct TrainBatch {
  torch::Tensor images;  // [B, 3, H, W]
  torch::Tensor cls;     // [B, N] int64, -1 = ignore / background
  torch::Tensor box;     // [B, N, 4] regression targets
  torch::Tensor pos;     // [B, N] bool
};
torch::Tensor focal_loss(const torch::Tensor& logits, const torch::Tensor& onehot, double alpha, double gamma) {
  auto p = torch::sigmoid(logits);
  auto ce = F::binary_cross_entropy_with_logits(
      logits, onehot, F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
  auto p_t = p * onehot + (1 - p) * (1 - onehot);
  auto a_t = alpha * onehot + (1 - alpha) * (1 - onehot);
  return (a_t * (1 - p_t).pow(gamma) * ce).sum();
}

void train(EfficientDet& model, const std::vector<TrainBatch>& data, const DetConfig& cfg, int64_t epochs) {
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.08).momentum(0.9).weight_decay(4e-5));
  torch::Tensor cls_total = torch::zeros({}), box_total = torch::zeros({});
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    for (const auto& ex : data) {
      auto out = model->forward(ex.images);
      auto onehot = F::one_hot(ex.cls.clamp_min(0), cfg.num_classes).to(torch::kFloat) *
                    (ex.cls >= 0).unsqueeze(-1).to(torch::kFloat);
      auto num_pos = ex.pos.sum().clamp_min(1).to(torch::kFloat);
      auto cls_loss = focal_loss(out.cls, onehot, 0.25, 2.0) / num_pos;
      auto m = ex.pos.unsqueeze(-1).to(torch::kFloat);
      auto box_loss = (F::smooth_l1_loss(out.box, ex.box, F::SmoothL1LossFuncOptions().reduction(torch::kNone)) * m).sum() / num_pos;
      auto loss = cls_loss + 50.0 * box_loss;
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), 10.0);
      opt.step();
      cls_total += cls_loss; // EXPECT: tensor-graph-kept-across-iterations
      box_total += box_loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no history kept
    }
    std::cout << "epoch " << epoch << " cls " << cls_total.item<double>() / data.size()
              << " box " << box_total.item<double>() / data.size() << '\n';
    cls_total = torch::zeros({}), box_total = torch::zeros({});
  }
}
