// RoIAlign as a CPU reference op (forward and backward through accessors), wrapped in a custom
// autograd::Function, and the box head of a two-stage detector that pools proposals with it.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RoIAlignParams {
  int64_t pooled_h = 7, pooled_w = 7;
  double spatial_scale = 1.0 / 16;
  int64_t sampling_ratio = 2;
  bool aligned = true;
};

namespace {
struct BilinearTap { int64_t y0 = 0, x0 = 0, y1 = 0, x1 = 0; float w00 = 0, w01 = 0, w10 = 0, w11 = 0; bool valid = false; };

BilinearTap bilinear_tap(float y, float x, int64_t height, int64_t width) {
  BilinearTap t;
  if (y < -1.f || y > height || x < -1.f || x > width) return t;
  y = std::max(y, 0.f), x = std::max(x, 0.f);
  t.y0 = static_cast<int64_t>(y), t.x0 = static_cast<int64_t>(x);
  if (t.y0 >= height - 1) { t.y0 = t.y1 = height - 1; y = static_cast<float>(t.y0); } else { t.y1 = t.y0 + 1; }
  if (t.x0 >= width - 1) { t.x0 = t.x1 = width - 1; x = static_cast<float>(t.x0); } else { t.x1 = t.x0 + 1; }
  const float ly = y - t.y0, lx = x - t.x0, hy = 1.f - ly, hx = 1.f - lx;
  t.w00 = hy * hx; t.w01 = hy * lx; t.w10 = ly * hx; t.w11 = ly * lx;
  t.valid = true;
  return t;
}

// Box of roi k on the feature map, in feature-map pixels.
struct RoiGeom { int64_t batch; float y1, x1, bin_h, bin_w; int64_t grid_h, grid_w; };

RoiGeom roi_geometry(const torch::TensorAccessor<float, 1>& r, const RoIAlignParams& p) {
  const float off = p.aligned ? 0.5f : 0.f, s = static_cast<float>(p.spatial_scale);
  RoiGeom g;
  g.batch = static_cast<int64_t>(r[0]);
  g.x1 = r[1] * s - off, g.y1 = r[2] * s - off;
  float roi_w = r[3] * s - off - g.x1, roi_h = r[4] * s - off - g.y1;
  if (!p.aligned) { roi_w = std::max(roi_w, 1.f); roi_h = std::max(roi_h, 1.f); }
  g.bin_h = roi_h / p.pooled_h, g.bin_w = roi_w / p.pooled_w;
  g.grid_h = p.sampling_ratio > 0 ? p.sampling_ratio : static_cast<int64_t>(std::ceil(g.bin_h));
  g.grid_w = p.sampling_ratio > 0 ? p.sampling_ratio : static_cast<int64_t>(std::ceil(g.bin_w));
  return g;
}
}  // namespace

// Calls fn(k, i, j, batch, tap, 1 / samples) for every valid sampling point of every bin of every roi.
using SampleFn = std::function<void(int64_t, int64_t, int64_t, int64_t, const BilinearTap&, float)>;
void for_each_sample(const torch::Tensor& rois, const RoIAlignParams& p, int64_t H, int64_t W, const SampleFn& fn) {
  auto r_a = rois.accessor<float, 2>();
  for (int64_t k = 0; k < rois.size(0); ++k) {
    const RoiGeom g = roi_geometry(r_a[k], p);
    const float inv = 1.f / static_cast<float>(std::max<int64_t>(g.grid_h * g.grid_w, 1));
    for (int64_t i = 0; i < p.pooled_h; ++i)
      for (int64_t j = 0; j < p.pooled_w; ++j)
        for (int64_t iy = 0; iy < g.grid_h; ++iy)
          for (int64_t ix = 0; ix < g.grid_w; ++ix) {
            const float y = g.y1 + i * g.bin_h + (iy + 0.5f) * g.bin_h / g.grid_h;
            const float x = g.x1 + j * g.bin_w + (ix + 0.5f) * g.bin_w / g.grid_w;
            const BilinearTap t = bilinear_tap(y, x, H, W);
            if (t.valid) fn(k, i, j, g.batch, t, inv);
          }
  }
}

torch::Tensor roi_align_forward_cpu(const torch::Tensor& input, const torch::Tensor& rois, const RoIAlignParams& p) {
  TORCH_CHECK(input.dim() == 4 && rois.dim() == 2 && rois.size(1) == 5, "roi_align: bad shapes");
  TORCH_CHECK(input.scalar_type() == torch::kFloat && rois.scalar_type() == torch::kFloat, "roi_align: float32 only");
  auto in = input.contiguous();
  const int64_t C = in.size(1), H = in.size(2), W = in.size(3);
  auto out = torch::zeros({rois.size(0), C, p.pooled_h, p.pooled_w}, in.options());
  auto in_a = in.accessor<float, 4>();
  auto out_a = out.accessor<float, 4>();
  for_each_sample(rois, p, H, W, [&](int64_t k, int64_t i, int64_t j, int64_t b, const BilinearTap& t, float inv) {
    for (int64_t c = 0; c < C; ++c) {
      auto plane = in_a[b][c];
      out_a[k][c][i][j] += inv * (t.w00 * plane[t.y0][t.x0] + t.w01 * plane[t.y0][t.x1] +
                                  t.w10 * plane[t.y1][t.x0] + t.w11 * plane[t.y1][t.x1]);
    }
  });
  return out;
}

torch::Tensor roi_align_backward_cpu(const torch::Tensor& grad_out, const torch::Tensor& rois,
                                     const std::vector<int64_t>& input_shape, const RoIAlignParams& p) {
  auto grad_in = torch::zeros(input_shape, grad_out.options());
  const int64_t C = input_shape[1], H = input_shape[2], W = input_shape[3];
  auto go_a = grad_out.accessor<float, 4>();  // strided access: no need for contiguous()
  auto gi_a = grad_in.accessor<float, 4>();
  for_each_sample(rois, p, H, W, [&](int64_t k, int64_t i, int64_t j, int64_t b, const BilinearTap& t, float inv) {
    for (int64_t c = 0; c < C; ++c) {
      const float g = go_a[k][c][i][j] * inv;
      auto plane = gi_a[b][c];
      plane[t.y0][t.x0] += g * t.w00, plane[t.y0][t.x1] += g * t.w01;
      plane[t.y1][t.x0] += g * t.w10, plane[t.y1][t.x1] += g * t.w11;
    }
  });
  return grad_in;
}

class RoIAlignFunction : public torch::autograd::Function<RoIAlignFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input, const torch::Tensor& rois,
                               int64_t pooled_h, int64_t pooled_w, double spatial_scale,
                               int64_t sampling_ratio, bool aligned) {
    ctx->save_for_backward({rois});
    ctx->saved_data["input_shape"] = input.sizes().vec();
    ctx->saved_data["ints"] = std::vector<int64_t>{pooled_h, pooled_w, sampling_ratio, aligned ? 1 : 0};
    ctx->saved_data["spatial_scale"] = spatial_scale;
    const RoIAlignParams p{pooled_h, pooled_w, spatial_scale, sampling_ratio, aligned};
    return roi_align_forward_cpu(input, rois, p);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto rois = ctx->get_saved_variables()[0];
    const auto ints = ctx->saved_data["ints"].toIntVector();
    const RoIAlignParams p{ints[0], ints[1], ctx->saved_data["spatial_scale"].toDouble(), ints[2], ints[3] != 0};
    auto shape = ctx->saved_data["input_shape"].toIntVector();
    auto grad_in = roi_align_backward_cpu(grad_outputs[0], rois, shape, p);
    return {grad_in, {}, {}, {}, {}, {}, {}};
  }
};

torch::Tensor roi_align(const torch::Tensor& features, const torch::Tensor& rois, const RoIAlignParams& p) {
  return RoIAlignFunction::apply(features, rois, p.pooled_h, p.pooled_w, p.spatial_scale, p.sampling_ratio, p.aligned);
}

// Clamps (x1, y1, x2, y2) boxes to the image, in place.
void clip_boxes_(torch::Tensor boxes, int64_t height, int64_t width) {
  // FACT: b = torch.rand(3, 4) * 20 - 5; b.select(1, 0).clamp_(0, 9); assert b[:, 0].min() >= 0 and b[:, 0].max() <= 9
  boxes.select(1, 0).clamp_(0, width - 1);  // LOOKALIKE: tensor-alias-then-mutate -- writing its argument is this function's job
  boxes.select(1, 1).clamp_(0, height - 1);
  boxes.select(1, 2).clamp_(0, width - 1);
  boxes.select(1, 3).clamp_(0, height - 1);
}

// Training-time augmentation: Gaussian jitter of (x1, y1, x2, y2) by a fraction of the box size, in place.
void jitter_boxes_(torch::Tensor boxes, double frac) {
  auto wh = (boxes.narrow(1, 2, 2) - boxes.narrow(1, 0, 2)).repeat({1, 2});
  boxes.add_(torch::randn_like(boxes) * wh * frac);
}

// [K, 5] rois (batch index, x1, y1, x2, y2) from per-roi image indices and boxes.
torch::Tensor build_rois(const torch::Tensor& boxes, const torch::Tensor& image_idx, int64_t height, int64_t width,
                         double jitter) {
  torch::Tensor jittered = boxes;
  // FACT: a = torch.rand(3, 4); a0 = a.clone(); b = a; b.add_(torch.randn(3, 4) * 0.1 + 0.01); assert shares_storage(a, b) and not torch.equal(a, a0)
  if (jitter > 0) jitter_boxes_(jittered, jitter);  // EXPECT: tensor-alias-then-mutate
  auto rois = torch::cat({image_idx.to(torch::kFloat).unsqueeze(1), jittered}, 1);
  // FACT: r = torch.rand(3, 5) * 20; v = r.narrow(1, 1, 4); v.clamp_(0, 9); assert is_view_of(v, r) and r[:, 1:].max() <= 9
  clip_boxes_(rois.narrow(1, 1, 4), height, width);  // LOOKALIKE: tensor-alias-then-mutate -- clips the fresh cat result through an explicit view
  return rois;
}

torch::Tensor box_iou(const torch::Tensor& a, const torch::Tensor& b) {
  auto area_a = (a.select(1, 2) - a.select(1, 0)) * (a.select(1, 3) - a.select(1, 1));
  auto area_b = (b.select(1, 2) - b.select(1, 0)) * (b.select(1, 3) - b.select(1, 1));
  auto lt = torch::max(a.unsqueeze(1).narrow(2, 0, 2), b.unsqueeze(0).narrow(2, 0, 2));
  auto rb = torch::min(a.unsqueeze(1).narrow(2, 2, 2), b.unsqueeze(0).narrow(2, 2, 2));
  auto wh = (rb - lt).clamp_min(0);
  auto inter = wh.select(2, 0) * wh.select(2, 1);
  return inter / (area_a.unsqueeze(1) + area_b.unsqueeze(0) - inter);
}

struct RoiLosses { torch::Tensor cls, box; };

RoiLosses fast_rcnn_loss(const torch::Tensor& class_logits, const torch::Tensor& box_deltas,
                         const torch::Tensor& proposals, const torch::Tensor& gt_boxes,
                         const torch::Tensor& gt_classes, double fg_iou) {
  const int64_t K = proposals.size(0), num_classes = class_logits.size(1);
  auto best = box_iou(proposals, gt_boxes).max(1);
  auto fg = std::get<0>(best) >= fg_iou;
  auto matched = std::get<1>(best);
  auto labels = torch::zeros({K}, torch::kLong);
  labels.copy_(gt_classes.index_select(0, matched));  // LOOKALIKE: tensor-copy-narrowing -- class ids are int64 on both sides
  labels.masked_fill_(fg.logical_not(), 0);

  auto m = gt_boxes.index_select(0, matched);
  auto pw = proposals.select(1, 2) - proposals.select(1, 0), ph = proposals.select(1, 3) - proposals.select(1, 1);
  auto px = proposals.select(1, 0) + 0.5 * pw, py = proposals.select(1, 1) + 0.5 * ph;
  auto gw = m.select(1, 2) - m.select(1, 0), gh = m.select(1, 3) - m.select(1, 1);
  auto gx = m.select(1, 0) + 0.5 * gw, gy = m.select(1, 1) + 0.5 * gh;
  auto targets = torch::stack({(gx - px) / pw * 10.0, (gy - py) / ph * 10.0,
                               torch::log(gw / pw) * 5.0, torch::log(gh / ph) * 5.0}).t();  // [K, 4]

  // FACT: d = torch.randn(6, 3 * 4); assert is_view_of(d.view(6, 3, 4), d)
  auto deltas = box_deltas.view({K, num_classes, 4});  // LOOKALIKE: tensor-view-non-contiguous -- Linear output, only the last dim is split
  auto sel = deltas.gather(1, labels.view({-1, 1, 1}).expand({K, 1, 4})).squeeze(1);
  // FACT: s = torch.randn(6, 1, 4).squeeze(1); assert is_view_of(s.reshape(-1), s)
  auto flat_pred = sel.reshape({-1});  // LOOKALIKE: tensor-reshape-non-contiguous -- gather returns a contiguous tensor
  // FACT: t = torch.stack([torch.randn(6) for _ in range(4)]).t(); assert raises(lambda: t.view(-1), "view size is not compatible")
  auto flat_tgt = targets.view({-1});  // EXPECT: tensor-view-non-contiguous
  auto weights = fg.to(torch::kFloat).repeat_interleave(4);
  auto per_coord = F::smooth_l1_loss(flat_pred, flat_tgt,
                                     F::SmoothL1LossFuncOptions().reduction(torch::kNone).beta(1.0 / 9));
  return {F::cross_entropy(class_logits, labels), (per_coord * weights).sum() / std::max<int64_t>(K, 1)};
}

struct BoxHeadConfig {
  int64_t in_channels = 256, hidden = 1024, num_classes = 81;
  RoIAlignParams pool;
  bool tf_flatten_order = false;  // checkpoints converted from TF flatten (H, W, C)
  bool residual_fc = false;
};

struct HeadOutput { torch::Tensor class_logits, box_deltas; };

struct TwoStageBoxHeadImpl : torch::nn::Module {
  explicit TwoStageBoxHeadImpl(const BoxHeadConfig& cfg)
      : cfg_(cfg),
        fc6(cfg.in_channels * cfg.pool.pooled_h * cfg.pool.pooled_w, cfg.hidden),
        fc7(cfg.hidden, cfg.hidden),
        cls_score(cfg.hidden, cfg.num_classes),
        bbox_pred(cfg.hidden, cfg.num_classes * 4) {
    register_module("fc6", fc6);
    register_module("fc7", fc7);
    register_module("cls_score", cls_score);
    register_module("bbox_pred", bbox_pred);
    torch::nn::init::normal_(cls_score->weight, 0.0, 0.01);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
    torch::nn::init::constant_(cls_score->bias, 0.0);
    bbox_pred->weight.normal_(0.0, 0.001);  // EXPECT: tensor-inplace-on-leaf
    torch::nn::init::zeros_(bbox_pred->bias);
  }

  HeadOutput forward(const torch::Tensor& features, const torch::Tensor& rois) {
    auto pooled = roi_align(features, rois, cfg_.pool);  // [K, C, ph, pw]
    const int64_t K = pooled.size(0);
    torch::Tensor flat;
    if (cfg_.tf_flatten_order) {
      // FACT: x = torch.randn(3, 4, 5, 6); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(3, -1), x)
      flat = pooled.permute({0, 2, 3, 1}).reshape({K, -1});  // EXPECT: tensor-reshape-non-contiguous
    } else {
      // FACT: x = torch.randn(3, 4, 5, 6); assert is_view_of(x.view(3, -1), x)
      flat = pooled.view({K, -1});  // LOOKALIKE: tensor-view-non-contiguous -- roi_align returns a fresh contiguous tensor
    }
    auto h = torch::relu(fc6(flat));
    auto h2 = torch::relu(fc7(h));
    if (cfg_.residual_fc) h2 += h;  // EXPECT: tensor-inplace-on-saved
    return {cls_score(h2), bbox_pred(h2)};
  }

  BoxHeadConfig cfg_;
  torch::nn::Linear fc6, fc7, cls_score, bbox_pred;
};
TORCH_MODULE(TwoStageBoxHead);

struct DetBatch {
  torch::Tensor features;                // [N, C, H/16, W/16] from the frozen backbone
  torch::Tensor proposals, image_idx;    // [K, 4] from the RPN, [K]
  torch::Tensor gt_boxes, gt_classes;    // [M, 4], [M] int64
  int64_t height, width;
};

void train_box_head(TwoStageBoxHead& head, const std::vector<DetBatch>& batches, torch::optim::SGD& opt, int64_t epochs) {
  head->train();
  std::vector<torch::Tensor> loss_history;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    for (const auto& b : batches) {
      auto rois = build_rois(b.proposals, b.image_idx, b.height, b.width, 0.05);
      auto out = head->forward(b.features, rois);
      auto losses = fast_rcnn_loss(out.class_logits, out.box_deltas, rois.narrow(1, 1, 4), b.gt_boxes, b.gt_classes, 0.5);
      auto total = losses.cls + losses.box;
      opt.zero_grad();
      total.backward();
      opt.step();
      loss_history.push_back(total);  // EXPECT: tensor-graph-kept-across-iterations
    }
    std::cout << "epoch " << epoch << " mean loss " << torch::stack(loss_history).mean().item<double>() << "\n";
  }
}

struct Detections { torch::Tensor boxes_xywh, scores, labels; };

Detections postprocess(const HeadOutput& out, const torch::Tensor& boxes, double score_thresh) {
  torch::NoGradGuard no_grad;
  auto probs = torch::softmax(out.class_logits, 1);
  auto fg = probs.slice(1, 1);  // drop background
  auto scores = fg.clone();  // EXPECT: tensor-unnecessary-clone
  scores.masked_fill_(fg < score_thresh, 0.0);
  auto best = scores.max(1);
  auto keep = (std::get<0>(best) > 0).nonzero().squeeze(1);

  auto coco = boxes.index_select(0, keep);  // index_select copies: writing coco leaves boxes alone
  // FACT: b = torch.rand(5, 4); w = b[:, 2:4] - b[:, 0:2]; b.narrow(1, 2, 2).sub_(b.narrow(1, 0, 2)); assert torch.equal(b[:, 2:4], w)
  coco.narrow(1, 2, 2).sub_(coco.narrow(1, 0, 2));  // LOOKALIKE: tensor-inplace-overlap -- disjoint column ranges
  Detections d;
  d.boxes_xywh = coco;
  d.scores = std::get<0>(best).index_select(0, keep);
  d.labels = std::get<1>(best).index_select(0, keep) + 1;
  return d;
}
