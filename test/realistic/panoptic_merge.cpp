// Panoptic post-processing in the Panoptic-FPN style: instance masks from a detector and the
// semantic head's logits are merged into one panoptic map (things first, then stuff), with
// COCO RLE export, a colour overlay and a short training loop for the semantic head.
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <tuple>
#include <vector>

namespace F = torch::nn::functional;

struct PanopticConfig {
  int64_t num_classes = 19, num_stuff = 11;  // Cityscapes train ids: 0..10 stuff, 11..18 things
  int64_t ignore_index = 255, stuff_area = 64, head_channels = 128;
  double mask_threshold = 0.5, overlap_threshold = 0.5, score_threshold = 0.5;
  std::vector<int64_t> in_channels{256, 256, 256, 256};  // P2..P5
  std::vector<int64_t> category_ids{7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33};
};

struct ConvGnReluImpl : torch::nn::Module {
  ConvGnReluImpl(int64_t cin, int64_t cout)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, 3).padding(1).bias(false)))),
        gn(register_module("gn", torch::nn::GroupNorm(32, cout))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(gn(conv(x))); }
  torch::nn::Conv2d conv;
  torch::nn::GroupNorm gn;
};
TORCH_MODULE(ConvGnRelu);

// FPN top-down pathway followed by the semantic branch: every level is refined, brought to
// 1/4 resolution and summed before the per-pixel classifier.
struct SemanticHeadImpl : torch::nn::Module {
  explicit SemanticHeadImpl(const PanopticConfig& cfg) {
    for (size_t i = 0; i < cfg.in_channels.size(); ++i) {
      lateral.push_back(register_module("lateral" + std::to_string(i), torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.in_channels[i], cfg.head_channels, 1))));
      refine.push_back(register_module("refine" + std::to_string(i), ConvGnRelu(cfg.head_channels, cfg.head_channels)));
    }
    predictor = register_module("predictor", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.head_channels, cfg.num_classes, 1)));
  }

  torch::Tensor forward(const std::vector<torch::Tensor>& feats, std::vector<int64_t> out_size) {
    const auto n = static_cast<int64_t>(feats.size());
    std::vector<torch::Tensor> lat(n);
    lat[n - 1] = lateral[n - 1](feats[n - 1]);
    for (int64_t i = n - 2; i >= 0; --i) {
      lat[i] = lateral[i](feats[i]);
      auto size = lat[i].sizes().slice(2).vec();
      // FACT: x = torch.randn(1, 2, 4, 4); w = torch.randn(3, 2, 1, 1, requires_grad=True); y = torch.nn.functional.conv2d(x, w); y += 1; assert not backward_fails(lambda: y.relu().sum().backward())
      lat[i] += F::interpolate(lat[i + 1], F::InterpolateFuncOptions().size(size).mode(torch::kNearest));  // LOOKALIKE: tensor-inplace-on-saved -- conv saves its input and weight, never its output
    }
    auto fused = refine[0](lat[0]);
    const auto fused_size = fused.sizes().slice(2).vec();
    for (int64_t i = 1; i < n; ++i) {
      auto up = F::interpolate(refine[i](lat[i]), F::InterpolateFuncOptions().size(fused_size).mode(torch::kBilinear).align_corners(false));
      // FACT: x = torch.randn(1, 4, 4, 4, requires_grad=True); r = torch.relu(torch.nn.functional.group_norm(x, 2)); r += 1; assert backward_fails(lambda: r.sum().backward())
      fused += up;  // EXPECT: tensor-inplace-on-saved
    }
    return F::interpolate(predictor(fused), F::InterpolateFuncOptions().size(out_size).mode(torch::kBilinear).align_corners(false));
  }

  std::vector<torch::nn::Conv2d> lateral;
  std::vector<ConvGnRelu> refine;
  torch::nn::Conv2d predictor{nullptr};
};
TORCH_MODULE(SemanticHead);

struct Segment {
  int64_t id, category;
  bool isthing;
  int64_t area;
  double score;
};

struct PanopticResult {
  torch::Tensor panoptic, semantic, category;
  std::vector<Segment> segments;
  std::vector<torch::Tensor> instance_masks;
};

PanopticResult merge_panoptic(const torch::Tensor& sem_logits, const torch::Tensor& inst_probs, const torch::Tensor& inst_scores,
                              const torch::Tensor& inst_classes, const torch::Tensor& temperature, const torch::Tensor& id_map,
                              const PanopticConfig& cfg) {
  torch::NoGradGuard no_grad;
  const auto h = sem_logits.size(1), w = sem_logits.size(2);
  PanopticResult out;
  out.panoptic = torch::zeros({h, w}, torch::TensorOptions().dtype(torch::kInt32).device(sem_logits.device()));
  auto sem_prob = (sem_logits / temperature).softmax(0);  // LOOKALIKE: tensor-device-mismatch -- the calibrated temperature is a 0-dim CPU tensor, which CUDA ops accept
  auto sem_pred = sem_prob.argmax(0).clone();  // EXPECT: tensor-unnecessary-clone

  // Mask rescoring: detector score times the mean mask probability inside the binary mask.
  auto bin = (inst_probs > cfg.mask_threshold).to(torch::kFloat);
  auto keep = (inst_scores >= cfg.score_threshold).to(torch::kFloat);
  // FACT: m = torch.rand(3, 4, 4); assert not raises(lambda: m.mul_(torch.rand(3).view(-1, 1, 1).expand(3, 4, 4)))
  bin.mul_(keep.view({-1, 1, 1}).expand_as(bin));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read
  // FACT: assert raises(lambda: torch.rand(3).view(-1, 1, 1).expand(3, 4, 4).mul_(torch.rand(3, 4, 4)), "more than one element")
  auto conf = inst_scores.view({-1, 1, 1}).expand_as(inst_probs);
  conf.mul_(inst_probs);  // EXPECT: tensor-inplace-on-expanded
  auto mask_score = (conf * bin).sum({1, 2}) / bin.sum({1, 2}).clamp_min(1.0);
  auto order = mask_score.argsort(0, /*descending=*/true).cpu();
  auto classes_cpu = inst_classes.cpu();
  auto scores_cpu = mask_score.cpu();

  int64_t seg_id = 0;
  for (int64_t k = 0; k < order.size(0); ++k) {
    const auto i = order[k].item<int64_t>();
    auto mask = bin[i] > 0;
    const auto area = mask.sum().item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the area decides whether the instance is kept at all
    if (area == 0) continue;
    const auto inter = mask.logical_and(out.panoptic > 0).sum().item<int64_t>();
    if (static_cast<double>(inter) / area > cfg.overlap_threshold) continue;
    // FACT: m = torch.rand(4, 4) > 0.5; v = m; v.logical_and_(torch.zeros(4, 4, dtype=torch.bool)); assert shares_storage(v, m) and not m.any()
    auto visible = mask;
    if (inter > 0) visible.logical_and_(out.panoptic == 0);  // EXPECT: tensor-alias-then-mutate
    out.panoptic.masked_fill_(visible, ++seg_id);
    out.instance_masks.push_back(mask);  // full (amodal) mask, for instance-level AP
    out.segments.push_back({seg_id, classes_cpu[i].item<int64_t>(), true, area - inter, scores_cpu[i].item<double>()});
  }

  // Stuff regions that the instances left uncovered.
  auto class_area = torch::bincount(sem_pred.flatten(), {}, cfg.num_classes).cpu();
  for (int64_t c = 0; c < cfg.num_stuff; ++c) {
    if (class_area[c].item<int64_t>() < cfg.stuff_area) continue;
    // FACT: s = torch.randint(0, 3, (4, 4)); m = (s == 1); m.logical_and_(torch.ones(4, 4, dtype=torch.bool)); assert is_copy_of(m, s)
    auto stuff = sem_pred == c;
    stuff.logical_and_(out.panoptic == 0);  // LOOKALIKE: tensor-alias-then-mutate -- == allocates a fresh mask
    const auto area = stuff.sum().item<int64_t>();
    if (area < cfg.stuff_area) continue;
    out.panoptic.masked_fill_(stuff, ++seg_id);
    out.segments.push_back({seg_id, c, false, area, 1.0});
  }

  out.semantic = torch::empty({h, w}, torch::kUInt8);
  out.semantic.copy_(sem_pred);  // EXPECT: tensor-copy-narrowing
  out.category = id_map.index({sem_pred});  // EXPECT: tensor-device-mismatch
  return out;
}

// Column-major run lengths of a binary mask, as COCO's uncompressed RLE expects.
std::vector<int64_t> mask_to_rle(const torch::Tensor& mask) {
  // FACT: m = torch.rand(4, 6) > 0.5; assert not is_contiguous(m.t()) and not raises(lambda: m.t().contiguous().view(-1))
  auto flat = mask.t().contiguous().view({-1}).cpu();  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() runs before the view
  const auto n = flat.size(0);
  auto change = flat.narrow(0, 1, n - 1) != flat.narrow(0, 0, n - 1);
  auto starts = torch::cat({torch::zeros({1}, torch::kLong), change.nonzero().flatten() + 1, torch::full({1}, n, torch::kLong)});
  const auto k = starts.size(0);
  // FACT: b = torch.tensor([0, 3, 7, 12]); assert raises(lambda: b[1:].sub_(b[:-1]), "single memory location")
  auto counts = starts.narrow(0, 1, k - 1).sub_(starts.narrow(0, 0, k - 1));  // EXPECT: tensor-inplace-overlap
  std::vector<int64_t> rle;
  if (flat[0].item<bool>()) rle.push_back(0);  // RLE always starts with a run of background
  rle.insert(rle.end(), counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
  return rle;
}

torch::Tensor colorize(const torch::Tensor& image, const torch::Tensor& panoptic, const std::vector<Segment>& segments) {
  auto vis = image.clone();  // LOOKALIKE: tensor-unnecessary-clone -- a canvas written once per segment below, the input image stays intact
  for (const auto& s : segments) {
    auto m = panoptic == s.id;
    for (int64_t c = 0; c < 3; ++c) vis[c].masked_fill_(m, ((s.category * 53 + c * 97 + s.id * 31) % 256) / 255.0);
  }
  return vis;
}

// Per-pixel weights that favour class boundaries (2 px wide) in the semantic loss.
torch::Tensor boundary_weights(const torch::Tensor& target, double boost) {
  const auto h = target.size(1), w = target.size(2);
  auto edge = torch::zeros_like(target, torch::kBool);
  edge.narrow(2, 1, w - 1).logical_or_(target.narrow(2, 1, w - 1) != target.narrow(2, 0, w - 1));
  edge.narrow(1, 1, h - 1).logical_or_(target.narrow(1, 1, h - 1) != target.narrow(1, 0, h - 1));
  // FACT: e = torch.zeros(2, 4, 6, dtype=torch.bool); e[..., 3] = True; e[..., :-1].logical_or_(e[..., 1:].clone()); assert int(e.sum()) == 16
  edge.narrow(2, 0, w - 1).logical_or_(edge.narrow(2, 1, w - 1).clone());  // LOOKALIKE: tensor-inplace-overlap -- the shifted source is cloned before the write
  return 1.0 + boost * edge.to(torch::kFloat);
}

std::pair<std::vector<torch::Tensor>, torch::Tensor> synthetic_batch(const PanopticConfig& cfg, int64_t b, int64_t h, int64_t w) {
  std::vector<torch::Tensor> feats;
  for (size_t i = 0; i < cfg.in_channels.size(); ++i) {
    const int64_t s = 4 << i;
    feats.push_back(torch::randn({b, cfg.in_channels[i], h / s, w / s}));
  }
  auto target = torch::randint(0, cfg.num_classes, {b, h / 16, w / 16}, torch::kLong);
  target = F::interpolate(target.unsqueeze(1).to(torch::kFloat), F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kNearest))
               .squeeze(1).to(torch::kLong);
  target.narrow(1, 0, 4).fill_(cfg.ignore_index);
  return {feats, target};
}

void train_semantic_head(SemanticHead head, const PanopticConfig& cfg, const torch::Device& device, int steps) {
  head->train();
  torch::optim::SGD opt(head->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(1e-4));
  const auto class_weights = torch::linspace(0.5, 2.0, cfg.num_classes);  // inverse-frequency weights, computed offline
  std::vector<torch::Tensor> epoch_logits, epoch_preds;
  auto loss_sum = torch::zeros({}, device);
  for (int step = 0; step < steps; ++step) {
    auto [feats, target] = synthetic_batch(cfg, 2, 128, 256);
    for (auto& f : feats) f = f.to(device);
    auto tgt = target.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a fresh batch every step
    auto logits = head->forward(feats, {tgt.size(1), tgt.size(2)});
    // FACT: l = torch.randn(2, 5, 4, 6); assert is_copy_of(l.permute(0, 2, 3, 1).reshape(-1, 5), l)
    auto flat_logits = logits.permute({0, 2, 3, 1}).reshape({-1, cfg.num_classes});  // EXPECT: tensor-reshape-non-contiguous
    auto ce_opts = F::CrossEntropyFuncOptions().ignore_index(cfg.ignore_index).reduction(torch::kNone);
    auto pix_loss = F::cross_entropy(flat_logits, tgt.view({-1}), ce_opts.weight(class_weights.to(device)));  // EXPECT: tensor-clone-in-loop
    auto valid = (tgt != cfg.ignore_index).sum().clamp_min(1);
    auto loss = (pix_loss * boundary_weights(tgt, 2.0).view({-1})).sum() / valid;
    opt.zero_grad();
    loss.backward();
    opt.step();
    loss_sum += loss.detach();
    epoch_logits.push_back(logits);  // EXPECT: tensor-graph-kept-across-iterations
    epoch_preds.push_back(logits.argmax(1));  // LOOKALIKE: tensor-graph-kept-across-iterations -- argmax output has no grad_fn
  }
  auto confidence = torch::cat(epoch_logits).softmax(1).amax(1).mean();
  auto class0_rate = (torch::cat(epoch_preds) == 0).to(torch::kFloat).mean();
  std::cout << "loss " << loss_sum.item<double>() / steps << " mean confidence " << confidence.item<double>()
            << " class-0 rate " << class0_rate.item<double>() << "\n";
}

int main() {
  torch::manual_seed(0);
  const torch::Device device(torch::kCUDA);
  PanopticConfig cfg;
  SemanticHead head(cfg);
  head->to(device);
  train_semantic_head(head, cfg, device, 50);

  head->eval();
  torch::NoGradGuard no_grad;
  const int64_t h = 128, w = 256, n = 6;
  auto [feats, target] = synthetic_batch(cfg, 1, h, w);
  for (auto& f : feats) f = f.to(device);
  auto sem_logits = head->forward(feats, {h, w})[0];
  // Stand-in for the detector: rectangular masks with decreasing scores.
  auto inst_probs = torch::zeros({n, h, w}, device);
  for (int64_t i = 0; i < n; ++i) inst_probs[i].narrow(0, 10 * i, 40).narrow(1, 30 * i, 60).fill_(0.9);
  auto inst_scores = torch::linspace(0.95, 0.4, n, device);
  auto inst_classes = torch::randint(cfg.num_stuff, cfg.num_classes, {n}, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto temperature = torch::tensor(1.3);
  const auto id_map = torch::tensor(cfg.category_ids);
  auto result = merge_panoptic(sem_logits, inst_probs, inst_scores, inst_classes, temperature, id_map, cfg);

  int64_t rle_len = 0;
  for (const auto& m : result.instance_masks) rle_len += static_cast<int64_t>(mask_to_rle(m).size());
  auto vis = colorize(torch::rand({3, h, w}), result.panoptic.cpu(), result.segments);
  std::cout << result.segments.size() << " segments, " << rle_len << " RLE runs, overlay mean " << vis.mean().item<double>() << "\n";
  return 0;
}
