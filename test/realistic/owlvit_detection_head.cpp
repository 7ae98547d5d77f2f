// Open-vocabulary detection head on a ViT encoder (OWL-ViT recipe): per-patch class
// embeddings scored against text queries, per-patch boxes relative to the grid cell,
// and a set-matching loss (greedy assignment, sigmoid focal + L1).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace F = torch::nn::functional;
using torch::indexing::None;
using torch::indexing::Slice;

struct OwlConfig {
  int64_t vision_width = 768, text_width = 512, embed_dim = 512;
  int64_t grid_size = 24, max_boxes = 32;
  double focal_alpha = 0.25, focal_gamma = 2.0;
  double cls_weight = 2.0, bbox_weight = 5.0;
  double lr = 2e-5, weight_decay = 0.1;
  int64_t epochs = 12, log_every = 50;
};

// Inverse-sigmoid of patch centres and a one-cell size: a zero MLP output predicts its own patch.
torch::Tensor compute_box_bias(int64_t grid) {
  auto coords = torch::arange(1, grid + 1, torch::kFloat32) / static_cast<double>(grid);
  auto xy = torch::stack(torch::meshgrid({coords, coords}, "xy"), -1).reshape({grid * grid, 2});
  xy = xy.clamp(0.0, 1.0);
  auto xy_bias = torch::log(xy + 1e-4) - torch::log1p(-xy + 1e-4);
  auto wh = torch::full_like(xy, 1.0 / grid);
  auto wh_bias = torch::log(wh + 1e-4) - torch::log1p(-wh + 1e-4);
  return torch::cat({xy_bias, wh_bias}, -1);
}

struct ClassHeadImpl : torch::nn::Module {
  explicit ClassHeadImpl(const OwlConfig& cfg)
      : dense(register_module("dense", torch::nn::Linear(cfg.vision_width, cfg.embed_dim))),
        shift(register_module("shift", torch::nn::Linear(cfg.vision_width, 1))),
        scale(register_module("scale", torch::nn::Linear(cfg.vision_width, 1))) {
    temperature = register_parameter("temperature", torch::full({1}, std::log(1.0 / 0.07)));
  }

  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& queries,
                        const torch::Tensor& query_mask) {
    auto image_class = F::normalize(dense(tokens), F::NormalizeFuncOptions().dim(-1));
    temperature.clamp_(0.0, 4.6052);  // EXPECT: tensor-inplace-on-leaf
    auto logits = torch::matmul(image_class, queries.transpose(-1, -2));
    logits = (logits + shift(tokens)) * (F::elu(scale(tokens)) + 1.0) * temperature.exp();
    // FACT: a = torch.randn(2, 3, requires_grad=True); b = torch.randn(2, 3, requires_grad=True); y = a * b; y.masked_fill_(y > 0, -1e6); y.sum().backward()
    logits.masked_fill_(query_mask.logical_not().unsqueeze(1), -1e6);  // LOOKALIKE: tensor-inplace-on-saved -- mul saves its operands, not its product
    return logits;
  }

  torch::nn::Linear dense{nullptr}, shift{nullptr}, scale{nullptr};
  torch::Tensor temperature;
};
TORCH_MODULE(ClassHead);

struct BoxHeadImpl : torch::nn::Module {
  explicit BoxHeadImpl(const OwlConfig& cfg) : grid_size(cfg.grid_size) {
    fc1 = register_module("fc1", torch::nn::Linear(cfg.vision_width, cfg.vision_width));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.vision_width, cfg.vision_width));
    out = register_module("out", torch::nn::Linear(cfg.vision_width, 4));
    torch::nn::init::zeros_(out->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under a NoGradGuard
    torch::nn::init::zeros_(out->bias);
  }

  torch::Tensor forward(const torch::Tensor& tokens) {
    auto h = F::gelu(fc1(tokens));
    h = F::gelu(fc2(h));
    auto bias = compute_box_bias(grid_size);
    return torch::sigmoid(out(h) + bias);  // EXPECT: tensor-device-mismatch
  }

  int64_t grid_size;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(BoxHead);

struct OwlDetectorImpl : torch::nn::Module {
  explicit OwlDetectorImpl(const OwlConfig& cfg) : cfg(cfg) {
    post_ln = register_module("post_ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.vision_width})));
    text_proj = register_module("text_proj", torch::nn::Linear(cfg.text_width, cfg.embed_dim));
    class_head = register_module("class_head", ClassHead(cfg));
    box_head = register_module("box_head", BoxHead(cfg));
    // Patch-level objectness (OWLv2) from a small conv over the token grid.
    objectness = register_module(
        "objectness", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.vision_width, 1, 3).padding(1)));
  }

  torch::Tensor embed_queries(const torch::Tensor& text_feats) {
    return F::normalize(text_proj(text_feats), F::NormalizeFuncOptions().dim(-1));
  }

  // The backbone output still carries the CLS token in front; OWL-ViT merges it
  // into every patch token before the heads.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(const torch::Tensor& vit_tokens,
                                                                  const torch::Tensor& queries,
                                                                  const torch::Tensor& query_mask) {
    auto cls = vit_tokens.index({Slice(), Slice(0, 1)});
    auto patches = vit_tokens.index({Slice(), Slice(1, None)});
    auto tokens = post_ln(patches * cls);
    const auto b = tokens.size(0), c = tokens.size(2), g = cfg.grid_size;
    // FACT: t = torch.randn(2, 16, 8).permute(0, 2, 1); v = t.view(2, 8, 4, 4); assert not is_contiguous(t) and is_view_of(v, t)
    auto fmap = tokens.permute({0, 2, 1}).view({b, c, g, g});  // LOOKALIKE: tensor-view-non-contiguous -- only the token dim is split, which strides can express
    return {class_head(tokens, queries, query_mask), box_head(tokens), objectness(fmap).flatten(1)};
  }

  torch::Tensor patch_grid(const torch::Tensor& vit_tokens) {
    auto patches = vit_tokens.index({Slice(), Slice(1, None)});
    // FACT: t = torch.randn(2, 17, 8)[:, 1:]; g = t.reshape(2, 4, 4, 8); assert not is_contiguous(t) and is_view_of(g, t)
    return patches.reshape({patches.size(0), cfg.grid_size, cfg.grid_size, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- dropping CLS leaves every token row dense, so splitting the token dim is a view
  }

  OwlConfig cfg;
  torch::nn::LayerNorm post_ln{nullptr};
  torch::nn::Linear text_proj{nullptr};
  ClassHead class_head{nullptr};
  BoxHead box_head{nullptr};
  torch::nn::Conv2d objectness{nullptr};
};
TORCH_MODULE(OwlDetector);

struct Sample { torch::Tensor vit_tokens, boxes, labels; };

struct Batch { torch::Tensor vit_tokens, boxes, labels; std::vector<int64_t> num_boxes; };

Sample parse_sample(torch::Tensor vit_tokens, const std::vector<double>& box_values,
                    const std::vector<int32_t>& label_values) {
  return {std::move(vit_tokens), torch::tensor(box_values, torch::kFloat64).view({-1, 4}),
          torch::tensor(label_values, torch::kInt32)};
}

Batch collate(const std::vector<Sample>& samples, const OwlConfig& cfg) {
  const auto n = static_cast<int64_t>(samples.size());
  Batch batch;
  std::vector<torch::Tensor> tokens;
  batch.boxes = torch::zeros({n, cfg.max_boxes, 4});
  batch.labels = torch::full({n, cfg.max_boxes}, -1, torch::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const auto& s = samples[i];
    const int64_t m = std::min<int64_t>(s.boxes.size(0), cfg.max_boxes);
    tokens.push_back(s.vit_tokens);
    batch.boxes[i].narrow(0, 0, m).copy_(s.boxes.narrow(0, 0, m));  // EXPECT: tensor-copy-narrowing
    batch.labels[i].narrow(0, 0, m).copy_(s.labels.narrow(0, 0, m));  // LOOKALIKE: tensor-copy-narrowing -- int32 labels widen into the int64 buffer
    batch.num_boxes.push_back(m);
  }
  batch.vit_tokens = torch::stack(tokens);
  return batch;
}

// Greedy stand-in for Hungarian matching: repeatedly take the cheapest
// (patch, target) pair and strike out its row and column.
std::vector<std::pair<int64_t, int64_t>> greedy_match(const torch::Tensor& cost) {
  // FACT: c = torch.randn(5, 3); h = c.to('cpu', copy=True); h[0].fill_(float('inf')); assert is_copy_of(h, c)
  auto host = cost.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
  const int64_t cols = host.size(1);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t k = 0; k < std::min(host.size(0), cols); ++k) {
    const int64_t flat = host.argmin().item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- host is a CPU copy, item() reads host memory
    const int64_t r = flat / cols, c = flat % cols;
    pairs.emplace_back(r, c);
    host.select(0, r).fill_(std::numeric_limits<float>::infinity());  // LOOKALIKE: tensor-alias-then-mutate -- to(..., copy=true) always returns a fresh tensor
    host.select(1, c).fill_(std::numeric_limits<float>::infinity());
  }
  return pairs;
}

torch::Tensor sigmoid_focal_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                                 const torch::Tensor& query_mask, double alpha, double gamma) {
  auto valid = query_mask.unsqueeze(1).to(logits.scalar_type());
  auto prob = torch::sigmoid(logits);
  prob.mul_(valid);  // EXPECT: tensor-inplace-on-saved
  auto ce = F::binary_cross_entropy_with_logits(
      logits, targets, F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
  auto p_t = prob * targets + (1 - prob) * (1 - targets);
  auto loss = ce * (1 - p_t).pow(gamma);
  auto alpha_t = alpha * targets + (1 - alpha) * (1 - targets);
  return (alpha_t * loss * valid).sum() / valid.sum().clamp_min(1.0);
}

struct LossParts { torch::Tensor total, cls, box; };

LossParts detection_loss(const torch::Tensor& logits, const torch::Tensor& pred_boxes,
                         const Batch& batch, const torch::Tensor& query_mask, const OwlConfig& cfg) {
  auto targets = torch::zeros_like(logits);
  std::vector<torch::Tensor> matched_pred, matched_tgt;
  for (int64_t b = 0; b < logits.size(0); ++b) {
    const int64_t m = batch.num_boxes[b];
    if (m == 0) continue;
    auto tgt_boxes = batch.boxes[b].narrow(0, 0, m);
    auto tgt_labels = batch.labels[b].narrow(0, 0, m);
    auto prob = logits[b].detach();
    prob.sigmoid_();  // EXPECT: tensor-inplace-on-detached
    auto cost_class = -prob.index_select(1, tgt_labels);
    auto cost_box = torch::cdist(pred_boxes[b].detach(), tgt_boxes, 1.0);
    auto pairs = greedy_match(cfg.cls_weight * cost_class + cfg.bbox_weight * cost_box);

    std::vector<int64_t> src, dst;
    for (const auto& p : pairs) src.push_back(p.first), dst.push_back(p.second);
    auto src_idx = torch::tensor(src, torch::kLong).to(logits.device());
    auto dst_idx = torch::tensor(dst, torch::kLong).to(logits.device());
    targets[b].index_put_({src_idx, tgt_labels.index_select(0, dst_idx)}, 1.0);
    matched_pred.push_back(pred_boxes[b].index_select(0, src_idx));
    matched_tgt.push_back(tgt_boxes.index_select(0, dst_idx));
  }
  LossParts parts;
  parts.cls = sigmoid_focal_loss(logits, targets, query_mask, cfg.focal_alpha, cfg.focal_gamma);
  parts.box = matched_pred.empty()
                  ? torch::zeros({}, logits.options())
                  : F::l1_loss(torch::cat(matched_pred), torch::cat(matched_tgt));
  parts.total = cfg.cls_weight * parts.cls + cfg.bbox_weight * parts.box;
  return parts;
}

// Per-query heatmaps over the patch grid, for the debugging dashboard.
torch::Tensor query_heatmaps(const torch::Tensor& logits, int64_t grid) {
  const auto b = logits.size(0), q = logits.size(2);
  // FACT: x = torch.randn(2, 16, 3).permute(0, 2, 1); r = x.reshape(6, 4, 4); assert is_copy_of(r, x)
  return logits.sigmoid().permute({0, 2, 1}).reshape({b * q, grid, grid});  // EXPECT: tensor-reshape-non-contiguous
}

void train(OwlDetector& model, const std::vector<std::vector<Sample>>& loader,
           const torch::Tensor& vocab_feats, const OwlConfig& cfg, torch::Device device) {
  model->to(device);
  model->train();
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    std::vector<torch::Tensor> box_losses;
    int64_t step = 0;
    for (const auto& samples : loader) {
      auto batch = collate(samples, cfg);
      auto tokens = batch.vit_tokens.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      batch.boxes = batch.boxes.to(device);
      batch.labels = batch.labels.to(device);
      auto text = vocab_feats.to(device);  // EXPECT: tensor-clone-in-loop
      auto queries = model->embed_queries(text).unsqueeze(0).expand({tokens.size(0), -1, -1});
      auto query_mask = torch::ones({tokens.size(0), queries.size(1)},
                                    torch::TensorOptions().dtype(torch::kBool).device(device));
      auto outputs = model->forward(tokens, queries, query_mask);
      auto parts = detection_loss(std::get<0>(outputs), std::get<1>(outputs), batch, query_mask, cfg);

      opt.zero_grad();
      parts.total.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();

      loss_sum += parts.total.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, so no graph is held
      box_losses.push_back(parts.box);  // EXPECT: tensor-graph-kept-across-iterations
      if (++step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step
                  << " loss " << loss_sum.item<double>() / step << "\n";  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
      }
    }
    if (!box_losses.empty())
      std::cout << "epoch " << epoch << " box loss " << torch::stack(box_losses).mean().item<double>() << "\n";
  }
}

struct Detections { torch::Tensor boxes, scores, labels, heatmaps; };

// Query embeddings are computed once per vocabulary and reused across images.
using QueryCache = std::unordered_map<std::string, torch::Tensor>;

Detections detect(OwlDetector& model, QueryCache& cache, const std::string& vocab,
                  const torch::Tensor& text_feats, const torch::Tensor& vit_tokens,
                  double threshold, double image_size, double query_sharpening) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto it = cache.find(vocab);
  if (it == cache.end()) it = cache.emplace(vocab, model->embed_queries(text_feats)).first;
  auto queries = it->second;
  // FACT: a = torch.randn(3, 8); q = a; q.mul_(1.5); assert shares_storage(q, a) and torch.equal(q, a)
  queries.mul_(query_sharpening);  // EXPECT: tensor-alias-then-mutate
  auto mask = torch::ones({1, queries.size(0)}, torch::TensorOptions().dtype(torch::kBool).device(queries.device()));
  auto outputs = model->forward(vit_tokens.unsqueeze(0), queries.unsqueeze(0), mask);

  auto scores = torch::sigmoid(std::get<0>(outputs)[0]);
  auto best = scores.max(-1);
  auto pixel_boxes = std::get<1>(outputs)[0].clone();  // EXPECT: tensor-unnecessary-clone
  pixel_boxes.mul_(image_size);
  auto cxcy = pixel_boxes.narrow(-1, 0, 2), wh = pixel_boxes.narrow(-1, 2, 2);
  auto xyxy = torch::cat({cxcy - wh / 2, cxcy + wh / 2}, -1);

  auto keep = std::get<0>(best) > threshold;
  Detections det;
  det.boxes = xyxy.index({keep}).cpu();
  det.scores = std::get<0>(best).index({keep}).cpu();
  det.labels = std::get<1>(best).index({keep}).cpu();
  det.heatmaps = query_heatmaps(std::get<0>(outputs), model->cfg.grid_size);
  return det;
}

int main() {
  OwlConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  OwlDetector model(cfg);
  auto vocab_feats = torch::randn({20, cfg.text_width});
  std::vector<std::vector<Sample>> loader(8);
  for (auto& samples : loader)
    for (int i = 0; i < 4; ++i)
      samples.push_back(parse_sample(torch::randn({1 + cfg.grid_size * cfg.grid_size, cfg.vision_width}),
                                     {0.5, 0.5, 0.2, 0.3, 0.25, 0.7, 0.1, 0.1}, {3, 11}));
  train(model, loader, vocab_feats, cfg, device);

  QueryCache cache;
  auto image = torch::randn({1 + cfg.grid_size * cfg.grid_size, cfg.vision_width}, device);
  for (double thr : {0.1, 0.3}) {
    auto det = detect(model, cache, "coco", vocab_feats.to(device), image, thr, 768.0, 1.2);
    std::cout << "thr " << thr << ": kept " << det.boxes.size(0) << " boxes\n";
  }
  return 0;
}
