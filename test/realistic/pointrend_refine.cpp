// PointRend-style segmentation refinement: a coarse semantic head, a point-wise
// MLP that re-predicts the most uncertain locations, and iterative subdivision
// at inference time.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct PointRendConfig {
  int64_t num_classes = 21;
  int64_t fine_channels = 128;
  int64_t fc_dim = 256;
  int64_t num_fc = 3;
  int64_t train_points = 14 * 14;
  double oversample_ratio = 3.0;
  double importance_ratio = 0.75;
  int64_t subdivision_steps = 3;
  int64_t subdivision_points = 28 * 28;
  double logit_clip = 20.0;
  int64_t ignore_label = 255;
};

// Bilinear lookup of `input` at normalized [0, 1] point coordinates.
torch::Tensor point_sample(const torch::Tensor& input, const torch::Tensor& coords,
                           bool nearest = false) {
  // FACT: c = torch.rand(2, 5, 2); g = 2.0 * c.unsqueeze(2); assert is_copy_of(g, c)
  auto grid = 2.0 * coords.unsqueeze(2);
  grid.sub_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- 2.0 * coords allocates a new tensor; sub_ only writes that temporary
  auto opts = F::GridSampleFuncOptions().align_corners(false);
  if (nearest) opts.mode(torch::kNearest);
  return F::grid_sample(input, grid, opts).squeeze(3);
}

// Larger value == less certain. For a single-channel (class-agnostic) map the
// logit magnitude is used; otherwise the gap between the two best classes.
torch::Tensor calculate_uncertainty(const torch::Tensor& logits) {
  if (logits.size(1) == 1) {
    // FACT: l = torch.randn(2, 1, 4, 4); assert shares_storage(l.contiguous(), l)
    auto u = logits.contiguous();
    return u.abs_().neg_();  // EXPECT: tensor-alias-then-mutate
  }
  auto top2 = std::get<0>(logits.topk(2, /*dim=*/1));
  return (top2.select(1, 1) - top2.select(1, 0)).unsqueeze(1);
}

// Jittered cell centres on a g x g grid, one set per image.
torch::Tensor stratified_points(int64_t n, int64_t g, const torch::TensorOptions& opts) {
  auto ticks = (torch::arange(g, opts) + 0.5) / static_cast<double>(g);
  auto centres = torch::stack({ticks.repeat({g}), ticks.repeat_interleave(g)}, -1);
  // FACT: c = torch.rand(1, 9, 2).expand(2, 9, 2); assert raises(lambda: c.add_(torch.rand(2, 9, 2)), 'more than one element')
  auto pts = centres.unsqueeze(0).expand({n, g * g, 2});
  pts.add_((torch::rand({n, g * g, 2}, opts) - 0.5) / static_cast<double>(g));  // EXPECT: tensor-inplace-on-expanded
  return pts;
}

// Training-time sampler: oversample, keep the most uncertain, top up with
// stratified random points.
torch::Tensor uncertain_points_with_randomness(const torch::Tensor& coarse_logits,
                                               const PointRendConfig& cfg) {
  const int64_t n = coarse_logits.size(0);
  const int64_t num_sampled = static_cast<int64_t>(cfg.train_points * cfg.oversample_ratio);
  const int64_t num_uncertain = static_cast<int64_t>(cfg.importance_ratio * cfg.train_points);
  const auto grid = static_cast<int64_t>(std::sqrt(static_cast<double>(cfg.train_points - num_uncertain)));

  auto point_coords = torch::rand({n, num_sampled, 2});
  auto point_logits = point_sample(coarse_logits, point_coords);  // EXPECT: tensor-device-mismatch
  auto uncertainty = calculate_uncertainty(point_logits).squeeze(1);

  auto idx = std::get<1>(uncertainty.topk(num_uncertain, 1));
  auto shift = num_sampled * torch::arange(n, idx.options());
  idx = idx + shift.unsqueeze(1);
  // FACT: p = torch.rand(2, 12, 2); assert is_view_of(p.view(-1, 2), p)
  auto picked = point_coords.view({-1, 2}).index_select(0, idx.view({-1}));  // LOOKALIKE: tensor-view-non-contiguous -- rand() output is contiguous, view is valid
  picked = picked.view({n, num_uncertain, 2});
  if (grid > 0) {
    auto extra = stratified_points(n, grid, coarse_logits.options());
    picked = torch::cat({picked, extra}, 1);  // LOOKALIKE: tensor-device-mismatch -- extra is built with the logits' options, same device
  }
  return picked;
}

// Inference-time sampler: the top-k uncertain cells of a regular grid.
std::pair<torch::Tensor, torch::Tensor> uncertain_grid_points(const torch::Tensor& uncertainty,
                                                              int64_t num_points) {
  const int64_t n = uncertainty.size(0), h = uncertainty.size(2), w = uncertainty.size(3);
  num_points = std::min(num_points, h * w);
  auto idx = std::get<1>(uncertainty.view({n, h * w}).topk(num_points, 1));
  auto xs = (torch::remainder(idx, w).to(torch::kFloat) + 0.5) / static_cast<double>(w);
  auto ys = (torch::div(idx, w, "floor").to(torch::kFloat) + 0.5) / static_cast<double>(h);
  return {idx, torch::stack({xs, ys}, 2)};
}

struct SegBackboneImpl : torch::nn::Module {
  SegBackboneImpl(int64_t fine_channels, int64_t num_classes)
      : stem(torch::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3)),
        down1(torch::nn::Conv2dOptions(64, fine_channels, 3).stride(2).padding(1)),
        down2(torch::nn::Conv2dOptions(fine_channels, fine_channels, 3).stride(2).padding(1)),
        down3(torch::nn::Conv2dOptions(fine_channels, fine_channels, 3).stride(2).padding(1)),
        context(torch::nn::Conv2dOptions(fine_channels, fine_channels, 3).padding(1)),
        classifier(torch::nn::Conv2dOptions(fine_channels, num_classes, 1)) {
    register_module("stem", stem);
    register_module("down1", down1);
    register_module("down2", down2);
    register_module("down3", down3);
    register_module("context", context);
    register_module("classifier", classifier);
  }

  // Returns {fine features, coarse logits}.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& images) {
    auto x = torch::relu(stem(images));
    auto fine = torch::relu(down1(x));
    auto c = torch::relu(down3(torch::relu(down2(fine))));
    auto ctx = torch::relu(context(c));
    // FACT: conv = torch.nn.Conv2d(4, 4, 3, padding=1); c = torch.relu(torch.randn(1, 4, 5, 5, requires_grad=True)); assert backward_fails(lambda: torch.relu(conv(c)).add_(c).sum().backward())
    ctx.add_(c);  // EXPECT: tensor-inplace-on-saved
    return {fine, classifier(ctx)};
  }

  torch::nn::Conv2d stem, down1, down2, down3, context, classifier;
};
TORCH_MODULE(SegBackbone);

struct PointHeadImpl : torch::nn::Module {
  explicit PointHeadImpl(const PointRendConfig& cfg) {
    int64_t in = cfg.fine_channels + cfg.num_classes;
    for (int64_t k = 0; k < cfg.num_fc; ++k) {
      fcs->push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(in, cfg.fc_dim, 1)));
      in = cfg.fc_dim + cfg.num_classes;
    }
    register_module("fcs", fcs);
    predictor = register_module(
        "predictor", torch::nn::Conv1d(torch::nn::Conv1dOptions(in, cfg.num_classes, 1)));
    predictor->weight.normal_(0.0, 0.001);  // EXPECT: tensor-inplace-on-leaf
    {
      torch::NoGradGuard no_grad;
      predictor->bias.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard
    }
  }

  torch::Tensor forward(const torch::Tensor& fine_pts, const torch::Tensor& coarse_pts) {
    auto x = torch::cat({fine_pts, coarse_pts}, 1);
    torch::Tensor prev;
    for (const auto& m : *fcs) {
      auto h = m->as<torch::nn::Conv1d>()->forward(x);
      // FACT: conv = torch.nn.Conv1d(4, 4, 1); x = torch.randn(2, 4, 5); assert not backward_fails(lambda: torch.relu(conv(x).add_(x)).sum().backward())
      if (prev.defined()) h.add_(prev);  // LOOKALIKE: tensor-inplace-on-saved -- the conv output is not saved by convolution backward; relu comes after
      h = torch::relu(h);
      prev = h;
      x = torch::cat({h, coarse_pts}, 1);
    }
    return predictor(x);
  }

  torch::nn::ModuleList fcs;
  torch::nn::Conv1d predictor{nullptr};
};
TORCH_MODULE(PointHead);

// Iterative subdivision: upsample x2, re-predict the most uncertain cells.
torch::Tensor subdivide(PointHead& head, const torch::Tensor& fine, const torch::Tensor& coarse,
                        const PointRendConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto logits = coarse;
  for (int64_t step = 0; step < cfg.subdivision_steps; ++step) {
    logits = F::interpolate(logits, F::InterpolateFuncOptions()
                                        .scale_factor(std::vector<double>{2.0, 2.0})
                                        .mode(torch::kBilinear)
                                        .align_corners(false));
    const int64_t n = logits.size(0), c = logits.size(1);
    const int64_t h = logits.size(2), w = logits.size(3);
    auto [idx, coords] = uncertain_grid_points(calculate_uncertainty(logits), cfg.subdivision_points);
    auto point_logits = head(point_sample(fine, coords), point_sample(coarse, coords));
    // FACT: x = torch.randn(2, 3, 4, 5); assert is_view_of(x.reshape(2, 3, 20), x)
    auto flat = logits.reshape({n, c, h * w});
    // FACT: t = torch.zeros(2, 3, 8); i = torch.tensor([[1, 4], [0, 2]]); t.scatter_(2, i.unsqueeze(1).expand(-1, 3, -1), torch.ones(2, 3, 2)); assert t.sum() == 12
    flat.scatter_(2, idx.unsqueeze(1).expand({-1, c, -1}), point_logits);  // LOOKALIKE: tensor-alias-then-mutate -- writes the freshly interpolated logits on purpose // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is the index, only read
  }
  return logits;
}

// Per-pixel logits for an external CRF: one row of classes per pixel.
torch::Tensor pixel_rows(const torch::Tensor& logits) {
  const int64_t n = logits.size(0), c = logits.size(1);
  // FACT: x = torch.randn(2, 3, 4, 5); assert is_view_of(x.permute(0, 2, 3, 1).reshape(2, 20, 3), x)
  return logits.permute({0, 2, 3, 1}).reshape({n, -1, c});  // LOOKALIKE: tensor-reshape-non-contiguous -- only h and w are merged; they stay adjacent after the permute, so this is a view
}

struct Batch {
  torch::Tensor images;
  torch::Tensor labels;
};

Batch synthetic_batch(int64_t n, int64_t size, int64_t num_classes) {
  return {torch::randn({n, 3, size, size}),
          torch::randint(0, num_classes, {n, size, size}, torch::kLong)};
}

void train(SegBackbone& backbone, PointHead& head, const PointRendConfig& cfg,
           torch::Device device, int64_t steps) {
  std::vector<torch::Tensor> params = backbone->parameters();
  for (auto& p : head->parameters()) params.push_back(p);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(1e-4));
  const auto ce = F::CrossEntropyFuncOptions().ignore_index(cfg.ignore_label);

  torch::Tensor epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t step = 0; step < steps; ++step) {
    auto batch = synthetic_batch(4, 128, cfg.num_classes);
    auto images = batch.images.to(device);
    auto labels = batch.labels.to(device);

    auto [fine, coarse] = backbone(images);
    auto coarse_for_sampling = coarse.detach();
    coarse_for_sampling.clamp_(-cfg.logit_clip, cfg.logit_clip);  // EXPECT: tensor-inplace-on-detached
    auto points = uncertain_points_with_randomness(coarse_for_sampling, cfg);

    auto coarse_up = F::interpolate(coarse, F::InterpolateFuncOptions()
                                                .size(std::vector<int64_t>{labels.size(1), labels.size(2)})
                                                .mode(torch::kBilinear)
                                                .align_corners(false));
    auto coarse_loss = F::cross_entropy(coarse_up, labels, ce);

    auto point_logits = head(point_sample(fine, points), point_sample(coarse, points));
    auto label_map = labels.unsqueeze(1).to(torch::kFloat).clone();  // EXPECT: tensor-unnecessary-clone
    auto point_labels = point_sample(label_map, points, /*nearest=*/true).squeeze(1).to(torch::kLong);
    // FACT: x = torch.randn(2, 5, 7); assert is_copy_of(x.transpose(1, 2).reshape(-1, 5), x)
    auto flat_logits = point_logits.transpose(1, 2).reshape({-1, cfg.num_classes});  // EXPECT: tensor-reshape-non-contiguous
    auto point_loss = F::cross_entropy(flat_logits, point_labels.view({-1}), ce);

    auto loss = coarse_loss + point_loss;
    opt.zero_grad();
    loss.backward();
    opt.step();

    epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
    if (step % 50 == 0) {
      std::cout << "step " << step << " loss " << loss.item<double>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- read once every 50 steps for logging
    }
  }
  std::cout << "mean loss " << (epoch_loss / static_cast<double>(steps)).item<double>() << "\n";
}

double evaluate(SegBackbone& backbone, PointHead& head, const PointRendConfig& cfg,
                torch::Device device, int64_t batches) {
  torch::NoGradGuard no_grad;
  backbone->eval();
  head->eval();
  auto probe = stratified_points(1, 16, torch::TensorOptions().dtype(torch::kFloat));
  torch::Tensor correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t total = 0;
  for (int64_t b = 0; b < batches; ++b) {
    auto batch = synthetic_batch(2, 128, cfg.num_classes);
    auto labels = batch.labels.to(device);
    auto [fine, coarse] = backbone(batch.images.to(device));
    auto refined = subdivide(head, fine, coarse, cfg);
    auto pts = probe.to(device);  // EXPECT: tensor-clone-in-loop
    auto pred = point_sample(refined, pts.expand({labels.size(0), -1, -1})).argmax(1);
    auto gt = point_sample(labels.unsqueeze(1).to(torch::kFloat),
                           pts.expand({labels.size(0), -1, -1}), true).squeeze(1).to(torch::kLong);
    correct += (pred == gt).sum();
    total += gt.numel();
    if (b == 0) torch::save(pixel_rows(refined).cpu(), "pixel_rows.pt");
  }
  return correct.item<double>() / static_cast<double>(total);
}

int main() {
  torch::manual_seed(0);
  PointRendConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  SegBackbone backbone(cfg.fine_channels, cfg.num_classes);
  PointHead head(cfg);
  backbone->to(device);
  head->to(device);
  train(backbone, head, cfg, device, 200);
  std::cout << "point accuracy " << evaluate(backbone, head, cfg, device, 8) << "\n";
  return 0;
}
