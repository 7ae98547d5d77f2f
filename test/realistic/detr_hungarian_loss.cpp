// DETR-style set prediction loss (Deformable-DETR flavour: sigmoid focal classification).
// Matching uses a greedy stand-in for the Hungarian algorithm (queries >> targets in practice),
// boxes are (cx, cy, w, h) normalised to [0, 1].
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct DetrLossConfig {
  int64_t num_classes = 91;
  double cost_class = 2.0;
  double cost_bbox = 5.0;
  double cost_giou = 2.0;
  double weight_ce = 2.0;
  double weight_bbox = 5.0;
  double weight_giou = 2.0;
  double focal_alpha = 0.25;
  double focal_gamma = 2.0;
  bool aux_loss = true;
};

struct Target {
  torch::Tensor labels;  // [n] int64
  torch::Tensor boxes;   // [n, 4] cxcywh
};

struct DetrOutput {
  torch::Tensor pred_logits;  // [B, Q, C]
  torch::Tensor pred_boxes;   // [B, Q, 4]
  std::vector<std::pair<torch::Tensor, torch::Tensor>> aux;  // earlier decoder layers
};

struct Match {
  torch::Tensor pred_idx;
  torch::Tensor tgt_idx;
  double mean_cost = 0.0;
};

torch::Tensor box_cxcywh_to_xyxy(const torch::Tensor& b) {
  auto parts = b.unbind(-1);
  const auto &cx = parts[0], &cy = parts[1], &w = parts[2], &h = parts[3];
  return torch::stack({cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h}, -1);
}

torch::Tensor box_area(const torch::Tensor& b) {
  return (b.select(-1, 2) - b.select(-1, 0)) * (b.select(-1, 3) - b.select(-1, 1));
}

// Pairwise generalized IoU of [N, 4] and [M, 4] xyxy boxes -> [N, M].
torch::Tensor generalized_box_iou(const torch::Tensor& a, const torch::Tensor& b) {
  auto area_a = box_area(a);
  auto area_b = box_area(b);
  auto a_lo = a.unsqueeze(1).narrow(-1, 0, 2), a_hi = a.unsqueeze(1).narrow(-1, 2, 2);
  auto b_lo = b.unsqueeze(0).narrow(-1, 0, 2), b_hi = b.unsqueeze(0).narrow(-1, 2, 2);
  auto wh = (torch::min(a_hi, b_hi) - torch::max(a_lo, b_lo)).clamp_min(0);
  auto inter = wh.select(-1, 0) * wh.select(-1, 1);
  auto uni = area_a.unsqueeze(1) + area_b.unsqueeze(0) - inter;
  auto iou = inter / uni;
  auto wh_c = (torch::max(a_hi, b_hi) - torch::min(a_lo, b_lo)).clamp_min(0);
  auto area_c = wh_c.select(-1, 0) * wh_c.select(-1, 1);
  return iou - (area_c - uni) / area_c;
}

// Cost of assigning each query of one image to each of its targets: [Q, n].
torch::Tensor matching_cost(const torch::Tensor& logits, const torch::Tensor& boxes,
                            const Target& tgt, const DetrLossConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto prob = logits.sigmoid();
  prob.clamp_(1e-6, 1.0 - 1e-6); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is recorded for backward
  auto neg = (1 - cfg.focal_alpha) * prob.pow(cfg.focal_gamma) * -(1 - prob).log();
  auto pos = cfg.focal_alpha * (1 - prob).pow(cfg.focal_gamma) * -prob.log();
  auto cost_class = (pos - neg).index_select(1, tgt.labels);
  auto cost_bbox = torch::cdist(boxes, tgt.boxes, 1.0);
  auto cost_giou = -generalized_box_iou(box_cxcywh_to_xyxy(boxes), box_cxcywh_to_xyxy(tgt.boxes));
  return cfg.cost_bbox * cost_bbox + cfg.cost_class * cost_class + cfg.cost_giou * cost_giou;
}

// Targets in order of their cheapest query each take the best query still free.
Match greedy_match(const torch::Tensor& cost) {
  const int64_t num_targets = cost.size(1);
  const float inf = std::numeric_limits<float>::infinity();
  auto order = std::get<0>(cost.min(0)).argsort();
  // FACT: c = torch.rand(6, 3); w = c.to(torch.float32); w.index_fill_(0, torch.tensor([1]), float("inf")); assert shares_storage(w, c) and torch.isinf(c[1]).all()
  torch::Tensor work = cost.to(torch::kFloat);  // cost may come in as half under autocast
  std::vector<int64_t> rows, cols;
  rows.reserve(num_targets);
  cols.reserve(num_targets);
  for (int64_t k = 0; k < num_targets; ++k) {
    const int64_t j = order[k].item<int64_t>();
    const int64_t i = work.select(1, j).argmin().item<int64_t>();
    rows.push_back(i);
    cols.push_back(j);
    work.index_fill_(0, torch::tensor({i}), inf); // EXPECT: tensor-alias-then-mutate
  }
  Match m;
  m.pred_idx = torch::tensor(rows);
  m.tgt_idx = torch::tensor(cols);
  if (num_targets > 0) m.mean_cost = cost.index({m.pred_idx, m.tgt_idx}).mean().item<double>();
  return m;
}

// Sigmoid focal loss summed over classes, normalised by the number of boxes.
torch::Tensor sigmoid_focal_loss(const torch::Tensor& logits, const torch::Tensor& onehot,
                                 double alpha, double gamma, double num_boxes) {
  auto prob = torch::sigmoid(logits);
  // FACT: l = torch.randn(4, 3, requires_grad=True); p = l.sigmoid(); p.clamp_(1e-6, 1 - 1e-6); assert backward_fails(lambda: p.sum().backward())
  prob.clamp_(1e-6, 1.0 - 1e-6); // EXPECT: tensor-inplace-on-saved
  auto ce = F::binary_cross_entropy_with_logits(
      logits, onehot, F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
  auto p_t = prob * onehot + (1 - prob) * (1 - onehot);
  auto loss = ce * (1 - p_t).pow(gamma);
  auto alpha_t = alpha * onehot + (1 - alpha) * (1 - onehot);
  return (alpha_t * loss).mean(1).sum() / num_boxes;
}

class SetCriterionImpl : public torch::nn::Module {
 public:
  explicit SetCriterionImpl(DetrLossConfig cfg) : cfg_(cfg) {}

  std::map<std::string, torch::Tensor> layer_losses(const torch::Tensor& logits,
                                                    const torch::Tensor& boxes,
                                                    const std::vector<Target>& targets,
                                                    double num_boxes) {
    const int64_t bs = logits.size(0), nq = logits.size(1), nc = logits.size(2);
    std::vector<torch::Tensor> batch_idx, src_idx, tgt_labels, tgt_boxes;
    for (int64_t b = 0; b < bs; ++b) {
      auto cost = matching_cost(logits[b].detach(), boxes[b].detach(), targets[b], cfg_);
      auto m = greedy_match(cost);
      matched_cost_ += m.mean_cost;
      batch_idx.push_back(torch::full_like(m.pred_idx, b));
      src_idx.push_back(m.pred_idx);
      tgt_labels.push_back(targets[b].labels.index_select(0, m.tgt_idx));
      auto tb = targets[b].boxes.to(boxes.device()); // LOOKALIKE: tensor-clone-in-loop -- a different image's targets each iteration
      tgt_boxes.push_back(tb.index_select(0, m.tgt_idx.to(boxes.device())));
    }
    auto bi = torch::cat(batch_idx).to(logits.device());
    auto si = torch::cat(src_idx).to(logits.device());
    auto onehot = torch::zeros({bs, nq, nc}, logits.options());
    onehot.index_put_({bi, si, torch::cat(tgt_labels).to(logits.device())}, 1.0);

    auto loss_ce = sigmoid_focal_loss(logits, onehot, cfg_.focal_alpha, cfg_.focal_gamma, num_boxes) * nq;
    auto src_boxes = boxes.index({bi, si});
    auto tgt = torch::cat(tgt_boxes);
    auto loss_bbox = F::l1_loss(src_boxes, tgt, F::L1LossFuncOptions().reduction(torch::kSum)) / num_boxes;
    auto giou = generalized_box_iou(box_cxcywh_to_xyxy(src_boxes), box_cxcywh_to_xyxy(tgt));
    auto loss_giou = (1 - giou.diagonal()).sum() / num_boxes;
    return {{"loss_ce", loss_ce}, {"loss_bbox", loss_bbox}, {"loss_giou", loss_giou}};
  }

  torch::Tensor weighted(const std::map<std::string, torch::Tensor>& l) const {
    return cfg_.weight_ce * l.at("loss_ce") + cfg_.weight_bbox * l.at("loss_bbox") +
           cfg_.weight_giou * l.at("loss_giou");
  }

  torch::Tensor forward(const DetrOutput& out, const std::vector<Target>& targets) {
    double num_boxes = 0;
    for (const auto& t : targets) num_boxes += static_cast<double>(t.labels.size(0));
    num_boxes = std::max(num_boxes, 1.0);
    auto total = weighted(layer_losses(out.pred_logits, out.pred_boxes, targets, num_boxes));
    if (cfg_.aux_loss) {
      for (const auto& aux : out.aux) {
        auto aux_l = layer_losses(aux.first, aux.second, targets, num_boxes);
        total = total + weighted(aux_l); // LOOKALIKE: tensor-graph-kept-across-iterations -- the sum over decoder layers is returned and backpropagated
      }
    }
    return total;
  }

  double matched_cost_ = 0.0;

 private:
  DetrLossConfig cfg_;
};
TORCH_MODULE(SetCriterion);

class DetrHeadImpl : public torch::nn::Module {
 public:
  DetrHeadImpl(int64_t d_model, int64_t num_classes) {
    class_embed_ = register_module("class_embed", torch::nn::Linear(d_model, num_classes));
    bbox_fc1_ = register_module("bbox_fc1", torch::nn::Linear(d_model, d_model));
    bbox_fc2_ = register_module("bbox_fc2", torch::nn::Linear(d_model, d_model));
    bbox_out_ = register_module("bbox_out", torch::nn::Linear(d_model, 4));
    const double prior_prob = 0.01;
    const double bias_value = -std::log((1.0 - prior_prob) / prior_prob);
    class_embed_->bias.fill_(bias_value); // EXPECT: tensor-inplace-on-leaf
    torch::nn::init::constant_(bbox_out_->weight, 0.0); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    torch::nn::init::constant_(bbox_out_->bias, 0.0);
  }

  // hs: decoder states [L, Q, B, D], sequence-first as the transformer returns them.
  DetrOutput forward(const torch::Tensor& hs) {
    const int64_t L = hs.size(0), Q = hs.size(1), B = hs.size(2), D = hs.size(3);
    auto states = hs.permute({0, 2, 1, 3});  // [L, B, Q, D]
    // FACT: hs = torch.randn(3, 5, 2, 8); assert is_copy_of(hs.permute(0, 2, 1, 3).reshape(30, 8), hs)
    auto flat = states.reshape({L * B * Q, D}); // EXPECT: tensor-reshape-non-contiguous
    // FACT: f = torch.randn(30, 8); y = torch.nn.Linear(8, 5)(f); assert is_view_of(y.view(3, 2, 5, -1), y)
    auto logits = class_embed_->forward(flat).view({L, B, Q, -1}); // LOOKALIKE: tensor-view-non-contiguous -- Linear output is contiguous
    auto h = torch::relu(bbox_fc1_->forward(flat));
    h = torch::relu(bbox_fc2_->forward(h));
    auto boxes = bbox_out_->forward(h).sigmoid().view({L, B, Q, 4});

    DetrOutput out;
    out.pred_logits = logits[L - 1];
    out.pred_boxes = boxes[L - 1];
    for (int64_t l = 0; l + 1 < L; ++l) out.aux.emplace_back(logits[l], boxes[l]);
    return out;
  }

 private:
  torch::nn::Linear class_embed_{nullptr}, bbox_fc1_{nullptr}, bbox_fc2_{nullptr}, bbox_out_{nullptr};
};
TORCH_MODULE(DetrHead);

struct DecoderBatch {
  torch::Tensor hs;
  std::vector<Target> targets;
};

double train_epoch(DetrHead& head, SetCriterion& criterion, torch::optim::Optimizer& opt,
                   const std::vector<DecoderBatch>& data, double max_norm) {
  head->train();
  torch::Tensor epoch_loss = torch::zeros({});
  for (const auto& batch : data) {
    auto out = head->forward(batch.hs);
    auto loss = criterion->forward(out, batch.targets);
    opt.zero_grad();
    loss.backward();
    if (max_norm > 0) torch::nn::utils::clip_grad_norm_(head->parameters(), max_norm);
    opt.step();
    epoch_loss += loss; // EXPECT: tensor-graph-kept-across-iterations
  }
  return epoch_loss.item<double>() / std::max<size_t>(data.size(), 1);
}

struct Detection {
  torch::Tensor scores, labels, boxes, centers;
};

// Top-k (query, class) pairs per image, boxes in pixels of the original image.
std::vector<Detection> postprocess(const DetrOutput& out,
                                   const std::vector<std::pair<int64_t, int64_t>>& image_hw,
                                   int64_t top_k) {
  torch::NoGradGuard no_grad;
  const int64_t B = out.pred_logits.size(0), C = out.pred_logits.size(2);
  auto sizes = torch::empty({B, 2}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    sizes[b][0] = image_hw[b].second;
    sizes[b][1] = image_hw[b].first;
  }
  auto prob = out.pred_logits.sigmoid();
  // FACT: p = torch.rand(2, 5, 4).sigmoid(); assert is_view_of(p.flatten(1), p)
  auto flat = prob.flatten(1); // LOOKALIKE: tensor-reshape-non-contiguous -- sigmoid output is contiguous, flatten is a view
  auto top = flat.topk(top_k, 1);
  auto scores = std::get<0>(top);
  auto idx = std::get<1>(top);
  auto query = idx.div(C, "floor");
  auto labels = idx.remainder(C);
  // FACT: b = torch.rand(2, 5, 4); x = torch.stack([b[..., 0] - b[..., 2] / 2, b[..., 1]], -1); assert is_copy_of(x, b)
  auto boxes = box_cxcywh_to_xyxy(out.pred_boxes);
  boxes.clamp_(0.0, 1.0); // LOOKALIKE: tensor-alias-then-mutate -- the conversion stacks into new storage

  std::vector<Detection> dets;
  for (int64_t b = 0; b < B; ++b) {
    auto wh = sizes.to(torch::kFloat); // EXPECT: tensor-clone-in-loop
    auto scale = wh[b].repeat({2});
    auto xyxy = boxes[b].index_select(0, query[b]);
    auto abs_boxes = xyxy.clone(); // EXPECT: tensor-unnecessary-clone
    abs_boxes.mul_(scale);
    auto pix = torch::empty({top_k, 4}, torch::kInt);
    pix.copy_(abs_boxes); // EXPECT: tensor-copy-narrowing
    auto centers = torch::empty({top_k, 2}, torch::kLong);
    auto mid = (abs_boxes.narrow(1, 0, 2) + abs_boxes.narrow(1, 2, 2)) * 0.5;
    centers.copy_(mid.round()); // LOOKALIKE: tensor-copy-narrowing -- rounded to whole numbers first
    auto s = scores[b].clone(); // LOOKALIKE: tensor-unnecessary-clone -- the copy escapes so results do not pin the whole batch
    dets.push_back({s, labels[b], pix, centers});
  }
  return dets;
}
