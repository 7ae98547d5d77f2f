// Cascade R-CNN box head: three stages refine the proposals in turn, each sampled with a
// stricter IoU threshold for foreground (0.5, 0.6, 0.7) and its own delta normalisation.
// RoI features come from an affine-grid crop, so the head needs nothing beyond LibTorch.
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <iostream>
#include <tuple>
#include <vector>

namespace cascade {

namespace F = torch::nn::functional;

struct StageConfig {
  double iou_thresh;
  double loss_weight;
  std::array<double, 4> reg_weights;
};

struct CascadeConfig {
  int64_t in_channels = 256, pool = 7, fc_dim = 1024;
  int64_t num_classes = 80;  // foreground classes, background is class 0
  int64_t rois_per_image = 512;
  double fg_fraction = 0.25;
  double spatial_scale = 1.0 / 16.0;
  bool channels_last_fc = false;  // fc1 weights ported from a checkpoint that flattens HWC
  std::vector<StageConfig> stages = {{0.5, 1.0, {10.0, 10.0, 5.0, 5.0}},
                                     {0.6, 0.5, {20.0, 20.0, 10.0, 10.0}},
                                     {0.7, 0.25, {30.0, 30.0, 15.0, 15.0}}};
};

struct ImageTarget {
  torch::Tensor boxes_xywh;  // as stored in the annotation file
  torch::Tensor labels;
};

torch::Tensor gt_xyxy(const ImageTarget& t) {
  // FACT: p = torch.rand(3, 4); assert p.to(torch.float32) is p
  // FACT: b = torch.tensor([[1., 2., 3., 4.]]); b[:, 2:].add_(b[:, :2]); assert b.tolist() == [[1., 2., 4., 6.]]
  auto boxes = t.boxes_xywh.to(torch::kFloat);
  boxes.slice(1, 2, 4).add_(boxes.slice(1, 0, 2));  // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-inplace-overlap -- the size and corner columns are disjoint
  return boxes;
}

torch::Tensor box_area(const torch::Tensor& b) {
  return (b.select(1, 2) - b.select(1, 0)).clamp_min(0) * (b.select(1, 3) - b.select(1, 1)).clamp_min(0);
}

torch::Tensor pairwise_iou(const torch::Tensor& a, const torch::Tensor& b) {
  auto lt = torch::maximum(a.unsqueeze(1).slice(2, 0, 2), b.unsqueeze(0).slice(2, 0, 2));
  auto rb = torch::minimum(a.unsqueeze(1).slice(2, 2, 4), b.unsqueeze(0).slice(2, 2, 4));
  auto wh = (rb - lt).clamp_min(0);
  auto inter = wh.select(2, 0) * wh.select(2, 1);
  return inter / (box_area(a).unsqueeze(1) + box_area(b).unsqueeze(0) - inter).clamp_min(1e-6);
}

torch::Tensor encode_deltas(const torch::Tensor& gt, const torch::Tensor& rois, const std::array<double, 4>& w) {
  auto pw = rois.select(1, 2) - rois.select(1, 0), ph = rois.select(1, 3) - rois.select(1, 1);
  auto px = rois.select(1, 0) + 0.5 * pw, py = rois.select(1, 1) + 0.5 * ph;
  auto gw = gt.select(1, 2) - gt.select(1, 0), gh = gt.select(1, 3) - gt.select(1, 1);
  auto gx = gt.select(1, 0) + 0.5 * gw, gy = gt.select(1, 1) + 0.5 * gh;
  auto d = torch::stack({(gx - px) / pw, (gy - py) / ph, torch::log(gw / pw), torch::log(gh / ph)}, 1);
  return d * torch::tensor({w[0], w[1], w[2], w[3]}, torch::kDouble);  // EXPECT: tensor-device-mismatch
}

// Crop-and-resize of every RoI from one image's feature map.
torch::Tensor roi_crop(const torch::Tensor& feat, const torch::Tensor& rois, int64_t out, double scale) {
  const int64_t R = rois.size(0), C = feat.size(1);
  const double H = feat.size(2), W = feat.size(3);
  auto b = rois * scale;
  auto x1 = b.select(1, 0), y1 = b.select(1, 1), x2 = b.select(1, 2), y2 = b.select(1, 3);
  auto zero = torch::zeros_like(x1);
  auto theta = torch::stack({(x2 - x1) / W, zero, (x1 + x2) / W - 1.0,
                             zero, (y2 - y1) / H, (y1 + y2) / H - 1.0}, 1).view({R, 2, 3});
  auto grid = F::affine_grid(theta, {R, C, out, out}, /*align_corners=*/false);
  // FACT: f = torch.randn(1, 2, 5, 5).expand(3, -1, -1, -1); g = torch.rand(3, 2, 2, 2) * 2 - 1; o = torch.nn.functional.grid_sample(f, g, align_corners=False); assert is_copy_of(o, f)
  return F::grid_sample(feat.expand({R, -1, -1, -1}), grid, F::GridSampleFuncOptions().align_corners(false));  // LOOKALIKE: tensor-inplace-on-expanded -- grid_sample only reads the expanded map
}

struct Sampled {
  torch::Tensor rois, labels, reg_targets;
  int64_t num_fg = 0;
};

Sampled sample_rois(const torch::Tensor& proposals, const torch::Tensor& gt_boxes, const torch::Tensor& gt_labels,
                    const StageConfig& sc, const CascadeConfig& cfg) {
  auto props = torch::cat({proposals, gt_boxes}, 0);
  auto best = pairwise_iou(props, gt_boxes).max(1);
  auto max_iou = std::get<0>(best), matched = std::get<1>(best);
  auto fg_idx = max_iou.ge(sc.iou_thresh).nonzero().squeeze(1);
  auto bg_idx = max_iou.lt(sc.iou_thresh).nonzero().squeeze(1);
  const int64_t num_fg = std::min<int64_t>(fg_idx.size(0), cfg.rois_per_image * cfg.fg_fraction);
  const int64_t num_bg = std::min<int64_t>(bg_idx.size(0), cfg.rois_per_image - num_fg);
  fg_idx = fg_idx.index_select(0, torch::randperm(fg_idx.size(0), fg_idx.options()).slice(0, 0, num_fg));
  bg_idx = bg_idx.index_select(0, torch::randperm(bg_idx.size(0), bg_idx.options()).slice(0, 0, num_bg));

  Sampled s;
  s.num_fg = num_fg;
  s.rois = props.index_select(0, torch::cat({fg_idx, bg_idx}));
  auto fg_gt = matched.index_select(0, fg_idx);
  s.labels = torch::zeros({s.rois.size(0)}, gt_labels.options());
  s.labels.narrow(0, 0, num_fg).copy_(gt_labels.index_select(0, fg_gt));  // LOOKALIKE: tensor-copy-narrowing -- labels are built with gt_labels' own options
  s.reg_targets = torch::zeros({s.rois.size(0), 4}, props.options());
  auto encoded = encode_deltas(gt_boxes.index_select(0, fg_gt).to(torch::kDouble),
                               s.rois.narrow(0, 0, num_fg).to(torch::kDouble), sc.reg_weights);
  // FACT: t = torch.zeros(2, 4); t.copy_(torch.full((2, 4), 0.1, dtype=torch.float64)); assert t.dtype == torch.float32 and t[0, 0].item() != 0.1
  s.reg_targets.narrow(0, 0, num_fg).copy_(encoded);  // EXPECT: tensor-copy-narrowing
  return s;
}

struct CascadeStageImpl : torch::nn::Module {
  CascadeStageImpl(const CascadeConfig& cfg, const StageConfig& sc)
      : fc1(register_module("fc1", torch::nn::Linear(cfg.in_channels * cfg.pool * cfg.pool, cfg.fc_dim))),
        fc2(register_module("fc2", torch::nn::Linear(cfg.fc_dim, cfg.fc_dim))),
        cls(register_module("cls", torch::nn::Linear(cfg.fc_dim, cfg.num_classes + 1))),
        reg(register_module("reg", torch::nn::Linear(cfg.fc_dim, 4 * (cfg.num_classes + 1)))),
        channels_last_fc(cfg.channels_last_fc) {
    reg_w = register_buffer("reg_w", torch::tensor({sc.reg_weights[0], sc.reg_weights[1], sc.reg_weights[2],
                                                    sc.reg_weights[3]}, torch::kFloat));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& roi_feats) {
    torch::Tensor x;
    if (channels_last_fc) {
      // FACT: r = torch.randn(3, 5, 7, 7); assert is_copy_of(r.permute(0, 2, 3, 1).flatten(1), r)
      x = roi_feats.permute({0, 2, 3, 1}).flatten(1);  // EXPECT: tensor-reshape-non-contiguous
    } else {
      // FACT: o = torch.nn.functional.grid_sample(torch.randn(3, 2, 5, 5), torch.rand(3, 2, 2, 2) * 2 - 1, align_corners=False); assert is_view_of(o.flatten(1), o)
      x = roi_feats.flatten(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- grid_sample returns a contiguous map, flatten is a view
    }
    x = fc1->forward(x);
    x.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- addmm saves its inputs, not its output
    x = torch::relu(fc2->forward(x));
    return {cls->forward(x), reg->forward(x)};
  }

  torch::Tensor decode(const torch::Tensor& deltas, const torch::Tensor& rois) const {
    auto d = deltas / reg_w;  // LOOKALIKE: tensor-device-mismatch -- reg_w is a registered buffer and moves with the module
    const double clamp = std::log(1000.0 / 16.0);
    auto pw = rois.select(1, 2) - rois.select(1, 0), ph = rois.select(1, 3) - rois.select(1, 1);
    auto cx = rois.select(1, 0) + 0.5 * pw + d.select(1, 0) * pw;
    auto cy = rois.select(1, 1) + 0.5 * ph + d.select(1, 1) * ph;
    auto w = pw * d.select(1, 2).clamp_max(clamp).exp(), h = ph * d.select(1, 3).clamp_max(clamp).exp();
    return torch::stack({cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h}, 1);
  }

  torch::nn::Linear fc1, fc2, cls, reg;
  torch::Tensor reg_w;
  bool channels_last_fc;
};
TORCH_MODULE(CascadeStage);

struct TrainOutput {
  std::vector<torch::Tensor> loss_cls, loss_reg;
  torch::Tensor fg_ratio;
};

struct CascadeHeadImpl : torch::nn::Module {
  explicit CascadeHeadImpl(CascadeConfig cfg) : cfg_(std::move(cfg)) {
    for (size_t s = 0; s < cfg_.stages.size(); ++s) {
      stages.push_back(register_module("stage" + std::to_string(s), CascadeStage(cfg_, cfg_.stages[s])));
    }
  }

  TrainOutput forward_train(const torch::Tensor& feat, torch::Tensor proposals, const ImageTarget& target) {
    TrainOutput out;
    const int64_t K = cfg_.num_classes + 1;
    auto gt_cpu = gt_xyxy(target);
    auto gt_labels = target.labels.to(feat.device());
    auto bounds = torch::tensor({feat.size(3) / cfg_.spatial_scale, feat.size(2) / cfg_.spatial_scale,
                                 feat.size(3) / cfg_.spatial_scale, feat.size(2) / cfg_.spatial_scale},
                                proposals.options());
    std::vector<torch::Tensor> fg_ratios;
    for (size_t s = 0; s < stages.size(); ++s) {
      auto gt_boxes = gt_cpu.to(feat.device());  // EXPECT: tensor-clone-in-loop
      auto smp = sample_rois(proposals, gt_boxes, gt_labels, cfg_.stages[s], cfg_);
      const int64_t R = smp.rois.size(0);
      auto heads = stages[s]->forward(roi_crop(feat, smp.rois, cfg_.pool, cfg_.spatial_scale));

      auto log_p = torch::log_softmax(heads.first, 1);
      out.loss_cls.push_back(F::nll_loss(log_p, smp.labels));
      auto ref_labels = torch::where(smp.labels.eq(0), std::get<1>(heads.first.detach().slice(1, 1).max(1)) + 1,
                                     smp.labels);
      // FACT: d = torch.randn(6, 8); assert is_view_of(d.view(6, 2, 4), d)
      auto sel = heads.second.view({R, K, 4}).index({torch::arange(R, smp.labels.options()), ref_labels});  // LOOKALIKE: tensor-view-non-contiguous -- the linear output is contiguous
      out.loss_reg.push_back(F::smooth_l1_loss(sel.narrow(0, 0, smp.num_fg), smp.reg_targets.narrow(0, 0, smp.num_fg),
                                               F::SmoothL1LossFuncOptions().reduction(torch::kSum)) / R);

      // FACT: x = torch.randn(3, 4, requires_grad=True); lp = torch.log_softmax(x, 1); l = torch.nn.functional.nll_loss(lp, torch.tensor([0, 1, 2])); lp.exp_(); assert backward_fails(l.backward)
      auto probs = log_p.exp_();  // EXPECT: tensor-inplace-on-saved
      fg_ratios.push_back(probs.slice(1, 1).sum(1).gt(0.5).to(torch::kFloat).mean());

      auto d = sel.detach();
      // FACT: x = torch.randn(6, 8, requires_grad=True); s = x.view(6, 2, 4)[torch.arange(6), torch.zeros(6, dtype=torch.long)]; l = torch.nn.functional.smooth_l1_loss(s[:3], torch.zeros(3, 4)); s.detach()[:, 2:].clamp_max_(4.0); assert backward_fails(l.backward)
      d.narrow(1, 2, 2).clamp_max_(std::log(1000.0 / 16.0));  // EXPECT: tensor-inplace-on-detached
      auto decoded = stages[s]->decode(d, smp.rois);
      proposals = decoded.detach();
      proposals.clamp_min_(0.0);  // LOOKALIKE: tensor-inplace-on-detached -- decoded comes from detached deltas, no graph holds it
      proposals = torch::minimum(proposals, bounds);
    }
    out.fg_ratio = torch::stack(fg_ratios).mean();
    return out;
  }

  CascadeConfig cfg_;
  std::vector<CascadeStage> stages;
};
TORCH_MODULE(CascadeHead);

struct Sample {
  torch::Tensor features, proposals;
  ImageTarget target;
};

std::vector<Sample> make_dataset(const CascadeConfig& cfg, int64_t n) {
  std::vector<Sample> data;
  for (int64_t i = 0; i < n; ++i) {
    auto xy = torch::rand({4, 2}) * 400;
    auto wh = torch::rand({4, 2}) * 200 + 32;
    auto gt = torch::cat({xy, xy + wh}, 1);
    auto jitter = torch::randn({200, 4}) * 24;
    auto props = (gt.repeat({50, 1}) + jitter).clamp_min(0);
    props = torch::cat({props.slice(1, 0, 2), torch::maximum(props.slice(1, 2, 4), props.slice(1, 0, 2) + 8)}, 1);
    data.push_back({torch::randn({1, cfg.in_channels, 40, 40}), props,
                    {torch::cat({xy, wh}, 1), torch::randint(1, cfg.num_classes + 1, {4}, torch::kLong)}});
  }
  return data;
}

void train(const CascadeConfig& cfg, int64_t iters) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  CascadeHead head(cfg);
  head->to(device);
  torch::optim::SGD opt(head->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(1e-4));
  auto dataset = make_dataset(cfg, 16);

  std::vector<torch::Tensor> loss_history;
  auto window = torch::zeros({20}, torch::TensorOptions().device(device));
  double fg_ratio_sum = 0.0;
  for (int64_t it = 0; it < iters; ++it) {
    auto& sample = dataset[it % dataset.size()];
    auto feat = sample.features.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different image every iteration
    auto out = head->forward_train(feat, sample.proposals.to(device), sample.target);

    std::vector<torch::Tensor> stage_losses;
    for (size_t s = 0; s < cfg.stages.size(); ++s) {
      stage_losses.push_back(cfg.stages[s].loss_weight * (out.loss_cls[s] + out.loss_reg[s]));  // LOOKALIKE: tensor-graph-kept-across-iterations -- the vector lives for one step and is summed into this step's loss
    }
    auto total = torch::stack(stage_losses).sum();
    opt.zero_grad();
    total.backward();
    opt.step();

    loss_history.push_back(total);  // EXPECT: tensor-graph-kept-across-iterations
    // FACT: h = torch.rand(5); assert raises(lambda: h[:-1].copy_(h[1:]), "some elements of the input tensor")
    window.slice(0, 0, -1).copy_(window.slice(0, 1));  // EXPECT: tensor-inplace-overlap
    window[-1].copy_(total.detach());
    fg_ratio_sum += out.fg_ratio.item<double>();  // EXPECT: tensor-sync-in-loop
    if ((it + 1) % 20 == 0) {
      std::cout << "iter " << it + 1 << " smoothed loss " << window.mean().item<double>() << " fg "
                << fg_ratio_sum / static_cast<double>(it + 1) << std::endl;
    }
  }
  std::cout << "last loss " << loss_history.back().item<double>() << std::endl;
}

}  // namespace cascade

int main() {
  cascade::CascadeConfig cfg;
  cfg.in_channels = 64;
  cfg.fc_dim = 256;
  cascade::train(cfg, 100);
}
