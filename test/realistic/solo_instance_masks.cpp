// SOLO instance segmentation: category grid + CoordConv mask branch, grid targets, matrix NMS.
#include <torch/torch.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
using Preds = std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>>;  // (ins, cate) per level

F::InterpolateFuncOptions bilinear() { return F::InterpolateFuncOptions().mode(torch::kBilinear).align_corners(false); }

struct SOLOConfig {
  int64_t num_classes = 80, in_channels = 256, feat_channels = 256, stacked_convs = 4;
  std::vector<int64_t> num_grids{40, 36, 24, 16, 12};
  std::vector<int64_t> strides{8, 8, 16, 32, 32};
  std::vector<std::pair<double, double>> scale_ranges{{1, 96}, {48, 192}, {96, 384}, {192, 768}, {384, 2048}};
  double sigma = 0.2, focal_alpha = 0.25, focal_gamma = 2.0, ins_loss_weight = 3.0;  // sigma: centre region of a box
  double score_thr = 0.1, mask_thr = 0.5, update_thr = 0.05, nms_sigma = 2.0;
  int64_t nms_pre = 500, max_per_img = 100;
};

void add_conv_gn(torch::nn::Sequential& seq, int64_t in, int64_t out) {
  seq->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false)));
  seq->push_back(torch::nn::GroupNorm(torch::nn::GroupNormOptions(32, out)));
  seq->push_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
}

// CoordConv: append normalised x / y coordinate channels.
torch::Tensor add_coords(const torch::Tensor& x) {
  const auto b = x.size(0), h = x.size(2), w = x.size(3);
  auto mesh = torch::meshgrid({torch::linspace(-1, 1, h), torch::linspace(-1, 1, w)}, "ij");
  auto coords = torch::stack({mesh[1], mesh[0]}).unsqueeze(0).expand({b, 2, h, w});
  return torch::cat({x, coords}, 1);  // EXPECT: tensor-device-mismatch
}

torch::Tensor points_nms(torch::Tensor heat) {
  auto hmax = F::max_pool2d(heat, F::MaxPool2dFuncOptions(2).stride(1).padding(1));
  auto keep = hmax.slice(2, 0, -1).slice(3, 0, -1) == heat;
  // FACT: f = torch.no_grad()(lambda x: torch.sigmoid(x).mul_(2.0)); y = f(torch.randn(4, requires_grad=True)); assert y.grad_fn is None
  return heat.mul_(keep);  // LOOKALIKE: tensor-inplace-on-saved -- only reached from the eval path, which runs under NoGradGuard, so sigmoid saved nothing
}

struct PyramidImpl : torch::nn::Module {  // small stand-in for ResNet-FPN, strides 4..64
  std::vector<torch::nn::Sequential> stages;
  explicit PyramidImpl(int64_t out) {
    int64_t in = 3;
    for (int i = 0; i < 5; ++i, in = out)
      stages.push_back(register_module("stage" + std::to_string(i), torch::nn::Sequential(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(i == 0 ? 4 : 2).padding(1)), torch::nn::ReLU())));
  }
  std::vector<torch::Tensor> forward(torch::Tensor x) {
    std::vector<torch::Tensor> feats;
    for (auto& s : stages) feats.push_back(x = s->forward(x));
    return feats;
  }
};
TORCH_MODULE(Pyramid);

struct SOLOHeadImpl : torch::nn::Module {
  SOLOConfig cfg;
  torch::nn::Sequential ins_convs{nullptr}, cate_convs{nullptr};
  std::vector<torch::nn::Conv2d> ins_out;
  torch::nn::Conv2d cate_out{nullptr};

  explicit SOLOHeadImpl(SOLOConfig c) : cfg(std::move(c)) {
    ins_convs = register_module("ins_convs", torch::nn::Sequential());
    cate_convs = register_module("cate_convs", torch::nn::Sequential());
    for (int64_t i = 0; i < cfg.stacked_convs; ++i) {
      add_conv_gn(ins_convs, i == 0 ? cfg.in_channels + 2 : cfg.feat_channels, cfg.feat_channels);
      add_conv_gn(cate_convs, i == 0 ? cfg.in_channels : cfg.feat_channels, cfg.feat_channels);
    }
    for (size_t l = 0; l < cfg.num_grids.size(); ++l)
      ins_out.push_back(register_module("ins_out" + std::to_string(l), torch::nn::Conv2d(torch::nn::Conv2dOptions(
          cfg.feat_channels, cfg.num_grids[l] * cfg.num_grids[l], 1))));
    cate_out = register_module("cate_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.feat_channels, cfg.num_classes, 3).padding(1)));
    for (auto& m : modules(/*include_self=*/false))
      if (auto* conv = m->as<torch::nn::Conv2d>()) torch::nn::init::normal_(conv->weight, 0.0, 0.01);
    torch::NoGradGuard no_grad;
    cate_out->bias.fill_(-std::log((1 - 0.01) / 0.01));  // LOOKALIKE: tensor-inplace-on-leaf -- the prior-probability bias is written under NoGradGuard
  }

  Preds forward(std::vector<torch::Tensor> feats, bool eval) {
    // SOLO's split: the finest level is pooled to stride 8, the coarsest resized to its neighbour.
    feats.front() = F::interpolate(feats.front(), bilinear().scale_factor(std::vector<double>{0.5, 0.5}));
    feats.back() = F::interpolate(feats.back(), bilinear().size(std::vector<int64_t>{feats[3].size(2), feats[3].size(3)}));
    const std::vector<int64_t> up{feats[0].size(2) * 2, feats[0].size(3) * 2};
    Preds out;
    for (size_t l = 0; l < feats.size(); ++l) {
      auto ins_feat = F::interpolate(ins_convs->forward(add_coords(feats[l])), bilinear().scale_factor(std::vector<double>{2.0, 2.0}));
      auto ins_pred = ins_out[l]->forward(ins_feat);
      const int64_t S = cfg.num_grids[l];
      auto cate_feat = F::interpolate(feats[l], bilinear().size(std::vector<int64_t>{S, S}));
      auto cate_pred = cate_out->forward(cate_convs->forward(cate_feat));
      if (eval) {
        ins_pred = F::interpolate(ins_pred.sigmoid(), bilinear().size(up));
        cate_pred = points_nms(cate_pred.sigmoid()).permute({0, 2, 3, 1});
      }
      out.first.push_back(ins_pred), out.second.push_back(cate_pred);
    }
    return out;
  }
};
TORCH_MODULE(SOLOHead);

struct SOLOImpl : torch::nn::Module {
  Pyramid backbone{nullptr};
  SOLOHead head{nullptr};
  explicit SOLOImpl(const SOLOConfig& cfg)
      : backbone(register_module("backbone", Pyramid(cfg.in_channels))), head(register_module("head", SOLOHead(cfg))) {}
  Preds forward(const torch::Tensor& images, bool eval) { return head->forward(backbone->forward(images), eval); }
};
TORCH_MODULE(SOLO);

// ---- targets on the grid (CPU, per image) ----
struct LevelTargets { torch::Tensor ins_label, cate_label, ins_ind; };

std::vector<LevelTargets> solo_targets(const torch::Tensor& boxes, const torch::Tensor& labels, const torch::Tensor& masks,
                                       const std::vector<std::array<int64_t, 2>>& mask_sizes, const SOLOConfig& cfg) {
  auto areas = torch::sqrt((boxes.select(1, 2) - boxes.select(1, 0)) * (boxes.select(1, 3) - boxes.select(1, 1)));
  const double img_h = masks.size(1), img_w = masks.size(2);
  std::vector<LevelTargets> out;
  for (size_t l = 0; l < cfg.num_grids.size(); ++l) {
    const int64_t S = cfg.num_grids[l], mh = mask_sizes[l][0], mw = mask_sizes[l][1];
    LevelTargets t{torch::zeros({S * S, mh, mw}, torch::kUInt8), torch::zeros({S, S}, torch::kLong),
                   torch::zeros({S * S}, torch::kBool)};
    const auto [lo, hi] = cfg.scale_ranges[l];
    auto hit = ((areas >= lo) & (areas <= hi)).nonzero().flatten();
    for (int64_t k = 0; k < hit.size(0); ++k) {
      const int64_t g = hit[k].item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- targets are built from CPU tensors, there is no device to wait for
      auto mask = masks[g].clone();  // EXPECT: tensor-unnecessary-clone
      if (mask.sum().item<int64_t>() < 10) continue;
      auto m = mask.to(torch::kFloat);
      const double mass = m.sum().item<double>();
      const double cy = (m.sum(1) * torch::arange(m.size(0), torch::kFloat)).sum().item<double>() / mass;
      const double cx = (m.sum(0) * torch::arange(m.size(1), torch::kFloat)).sum().item<double>() / mass;
      auto b = boxes[g];
      const double half_w = 0.5 * (b[2] - b[0]).item<double>() * cfg.sigma, half_h = 0.5 * (b[3] - b[1]).item<double>() * cfg.sigma;
      auto cell = [S](double v, double extent) { return std::clamp<int64_t>(static_cast<int64_t>(v / extent * S), 0, S - 1); };
      const int64_t ch = cell(cy, img_h), cw = cell(cx, img_w);
      const int64_t top = std::max(cell(cy - half_h, img_h), ch - 1), down = std::min(cell(cy + half_h, img_h), ch + 1);
      const int64_t left = std::max(cell(cx - half_w, img_w), cw - 1), right = std::min(cell(cx + half_w, img_w), cw + 1);
      t.cate_label.slice(0, top, down + 1).slice(1, left, right + 1).fill_(labels[g]);
      auto small = F::interpolate(m.unsqueeze(0).unsqueeze(0), bilinear().size(std::vector<int64_t>{mh, mw})).squeeze();
      for (int64_t i = top; i <= down; ++i)
        for (int64_t j = left; j <= right; ++j) {
          // FACT: t = torch.zeros(2, 2, dtype=torch.uint8); t.copy_(torch.full((2, 2), 0.9)); assert t.sum() == 0
          t.ins_label[i * S + j].copy_(small);  // EXPECT: tensor-copy-narrowing
          t.ins_ind[i * S + j] = true;
        }
    }
    out.push_back(t);
  }
  return out;
}

// ---- losses ----
torch::Tensor dice_loss(const torch::Tensor& input, const torch::Tensor& target) {
  // FACT: x = torch.rand(3, 4, 5).transpose(1, 2); v = x.contiguous().view(3, -1); assert is_contiguous(v) and is_copy_of(v, x)
  auto a = input.contiguous().view({input.size(0), -1});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() right before the view
  auto b = target.contiguous().view({target.size(0), -1}).to(torch::kFloat);
  return 1 - (a * b).sum(1) * 2 / ((a * a).sum(1) + (b * b).sum(1) + 2e-3);
}

torch::Tensor sigmoid_focal_loss(const torch::Tensor& logits, const torch::Tensor& labels, double alpha, double gamma) {
  auto target = torch::one_hot(labels, logits.size(1) + 1).slice(1, 1).to(logits.scalar_type());
  auto p = torch::sigmoid(logits);
  // FACT: x = torch.randn(6, requires_grad=True); p = torch.sigmoid(x); p.clamp_(1e-6, 1 - 1e-6); assert backward_fails(lambda: p.log().sum().backward())
  p.clamp_(1e-6, 1 - 1e-6);  // EXPECT: tensor-inplace-on-saved
  auto pt = torch::where(target > 0, p, 1 - p);
  return -((target * alpha + (1 - target) * (1 - alpha)) * (1 - pt).pow(gamma) * pt.log()).sum();
}

std::pair<torch::Tensor, torch::Tensor> solo_loss(const Preds& preds, const std::vector<std::vector<LevelTargets>>& targets,
                                                  const SOLOConfig& cfg) {
  const auto device = preds.first.front().device();
  std::vector<torch::Tensor> dice, flat_cate, flat_labels;
  auto num_pos = torch::zeros({}, torch::kLong);
  for (size_t l = 0; l < preds.first.size(); ++l) {
    std::vector<torch::Tensor> ins_l, ind_l, cate_l;
    for (const auto& img : targets)
      ins_l.push_back(img[l].ins_label), ind_l.push_back(img[l].ins_ind), cate_l.push_back(img[l].cate_label);
    auto ind = torch::stack(ind_l);
    num_pos += ind.sum();
    ind = ind.to(device);
    auto pos_pred = preds.first[l].index({ind});
    if (pos_pred.size(0) > 0) dice.push_back(dice_loss(torch::sigmoid(pos_pred), torch::stack(ins_l).to(device).index({ind})));
    // FACT: assert raises(lambda: torch.rand(2, 4, 5, 5).permute(0, 2, 3, 1).view(-1, 4), "view size is not compatible")
    flat_cate.push_back(preds.second[l].permute({0, 2, 3, 1}).view({-1, cfg.num_classes}));  // EXPECT: tensor-view-non-contiguous
    flat_labels.push_back(torch::stack(cate_l).flatten());
  }
  auto loss_ins = dice.empty() ? torch::zeros({}, torch::TensorOptions().device(device)) : torch::cat(dice).mean();
  auto focal = sigmoid_focal_loss(torch::cat(flat_cate), torch::cat(flat_labels).to(device), cfg.focal_alpha, cfg.focal_gamma);
  auto loss_cate = focal / (num_pos + 1);  // LOOKALIKE: tensor-device-mismatch -- num_pos is a 0-dim CPU tensor, which may mix with CUDA operands
  return {loss_ins * cfg.ins_loss_weight, loss_cate};
}

// ---- matrix NMS and post-processing (one image) ----
torch::Tensor matrix_nms(const torch::Tensor& seg_masks, const torch::Tensor& cate_labels, const torch::Tensor& cate_scores,
                         const torch::Tensor& sum_masks, double sigma) {
  const int64_t n = cate_labels.size(0);
  if (n == 0) return cate_scores;
  auto masks = seg_masks.reshape({n, -1}).to(torch::kFloat);
  auto inter = torch::mm(masks, masks.t());
  auto sum_x = sum_masks.expand({n, n});
  // FACT: s = torch.rand(4); u = s.expand(4, 4) + s.expand(4, 4).t(); u.sub_(1.0); assert is_contiguous(u) and is_copy_of(u, s)
  auto union_area = sum_x + sum_x.t();
  union_area.sub_(inter);  // LOOKALIKE: tensor-inplace-on-expanded -- the sum of the two expanded views is a new dense tensor
  auto iou = (inter / union_area).triu(1);
  auto labels_x = cate_labels.expand({n, n});
  auto decay_iou = iou * (labels_x == labels_x.t()).to(torch::kFloat).triu(1);
  auto compensate = std::get<0>(decay_iou.max(0));
  // FACT: assert raises(lambda: torch.rand(4).expand(4, 4).t().pow_(2), "more than one element")
  auto compensate_x = compensate.expand({n, n}).t();
  compensate_x.pow_(2).mul_(-sigma).exp_();  // EXPECT: tensor-inplace-on-expanded
  auto decay = torch::exp(-sigma * decay_iou.pow(2));
  return cate_scores * std::get<0>((decay / compensate_x).min(0));
}

struct Instance { torch::Tensor mask; int64_t label; float score; };

std::vector<Instance> postprocess(const Preds& preds, const SOLOConfig& cfg, int64_t img_h, int64_t img_w) {
  std::vector<torch::Tensor> cates, segs, strides;
  for (size_t l = 0; l < preds.second.size(); ++l) {
    // FACT: c = torch.rand(1, 4, 5, 5).permute(0, 2, 3, 1); r = c.squeeze(0).reshape(-1, 4); assert is_view_of(r, c) and not is_contiguous(c)
    cates.push_back(preds.second[l].squeeze(0).reshape({-1, cfg.num_classes}));  // LOOKALIKE: tensor-reshape-non-contiguous -- only the two grid dims merge, and they stay adjacent: a view
    segs.push_back(preds.first[l].squeeze(0));
    strides.push_back(torch::full({cates.back().size(0)}, static_cast<double>(cfg.strides[l]), cates.back().options()));
  }
  auto cate = torch::cat(cates), seg = torch::cat(segs), stride = torch::cat(strides);
  auto inds = (cate > cfg.score_thr).nonzero();
  if (inds.size(0) == 0) return {};
  auto cell = inds.select(1, 0), cate_labels = inds.select(1, 1);
  auto cate_scores = cate.index({cell, cate_labels});
  auto seg_preds = seg.index_select(0, cell);
  auto seg_masks = seg_preds > cfg.mask_thr;
  auto sum_masks = seg_masks.sum({1, 2}).to(torch::kFloat);
  auto keep = (sum_masks > stride.index_select(0, cell)).nonzero().squeeze(1);
  seg_preds = seg_preds.index_select(0, keep), seg_masks = seg_masks.index_select(0, keep);
  sum_masks = sum_masks.index_select(0, keep), cate_labels = cate_labels.index_select(0, keep);
  cate_scores = cate_scores.index_select(0, keep);
  auto seg_scores = (seg_preds * seg_masks.to(torch::kFloat)).sum({1, 2}) / sum_masks;
  // FACT: c = torch.rand(6, 3); i = (c > 0.5).nonzero(); s = c[i[:, 0], i[:, 1]]; s.mul_(2.0); assert is_copy_of(s, c)
  cate_scores.mul_(seg_scores);  // LOOKALIKE: tensor-alias-then-mutate -- advanced indexing gave cate_scores its own storage
  auto order = std::get<1>(cate_scores.sort(0, /*descending=*/true)).slice(0, 0, cfg.nms_pre);
  seg_masks = seg_masks.index_select(0, order), seg_preds = seg_preds.index_select(0, order);
  cate_scores = matrix_nms(seg_masks, cate_labels.index_select(0, order), cate_scores.index_select(0, order),
                           sum_masks.index_select(0, order), cfg.nms_sigma);
  cate_labels = cate_labels.index_select(0, order);
  auto top = std::get<1>(cate_scores.topk(std::min<int64_t>(cfg.max_per_img, cate_scores.size(0))));
  top = top.index_select(0, (cate_scores.index_select(0, top) >= cfg.update_thr).nonzero().squeeze(1));
  auto full = F::interpolate(seg_preds.index_select(0, top).unsqueeze(0), bilinear().size(std::vector<int64_t>{img_h, img_w}));
  auto masks_cpu = (full.squeeze(0) > cfg.mask_thr).cpu();
  auto scores_cpu = cate_scores.index_select(0, top).cpu(), labels_cpu = cate_labels.index_select(0, top).cpu();
  std::vector<Instance> result;
  for (int64_t i = 0; i < top.size(0); ++i)
    result.push_back({masks_cpu[i], labels_cpu[i].item<int64_t>(), scores_cpu[i].item<float>()});
  return result;
}

torch::Tensor preprocess(const torch::Tensor& image, const torch::Tensor& mean, const torch::Tensor& stdev, torch::Device device) {
  // FACT: a = torch.rand(3, 8, 8) * 255; x = a.to(torch.float32); x.sub_(1.0); assert shares_storage(x, a)
  auto x = image.to(device, torch::kFloat);
  x.sub_(mean).div_(stdev);  // EXPECT: tensor-alias-then-mutate
  return x.unsqueeze(0);
}

void run_inference(SOLO& model, const std::vector<torch::Tensor>& images, const SOLOConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto pixel_stats = torch::tensor({123.675f, 116.28f, 103.53f, 58.395f, 57.12f, 57.375f}).view({2, 3, 1, 1});
  for (const auto& image : images) {
    auto stats = pixel_stats.to(device);  // EXPECT: tensor-clone-in-loop
    auto instances = postprocess(model->forward(preprocess(image, stats[0], stats[1], device), true), cfg,
                                 image.size(1), image.size(2));
    auto vis = image.to(torch::kCPU, torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
    for (const auto& inst : instances) vis.masked_fill_(inst.mask.unsqueeze(0), 255.0 * (inst.label % 3) / 2);
    std::cout << instances.size() << " instances, mean intensity " << vis.mean().item<float>() << "\n";
  }
}

struct Batch { torch::Tensor images; std::vector<torch::Tensor> boxes, labels, masks; };

void train_epoch(SOLO& model, torch::optim::Optimizer& opt, const std::vector<Batch>& data, const SOLOConfig& cfg, torch::Device device) {
  model->train();
  std::vector<torch::Tensor> loss_history;
  double ins_meter = 0.0;
  for (const auto& batch : data) {
    auto preds = model->forward(batch.images.to(device), /*eval=*/false);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    std::vector<std::array<int64_t, 2>> sizes;
    for (const auto& p : preds.first) sizes.push_back({p.size(2), p.size(3)});
    std::vector<std::vector<LevelTargets>> targets;
    for (size_t i = 0; i < batch.boxes.size(); ++i)
      targets.push_back(solo_targets(batch.boxes[i], batch.labels[i], batch.masks[i], sizes, cfg));
    auto [loss_ins, loss_cate] = solo_loss(preds, targets, cfg);
    auto loss = loss_ins + loss_cate;
    opt.zero_grad(); loss.backward(); opt.step();
    loss_history.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    ins_meter += loss_ins.item<double>();  // EXPECT: tensor-sync-in-loop
  }
  std::cout << "loss " << torch::stack(loss_history).mean().item<double>() << " dice " << ins_meter / data.size() << "\n";
}

int main() {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  SOLOConfig cfg;
  SOLO model(cfg);
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(1e-4));
  auto masks = torch::zeros({2, 256, 256}, torch::kUInt8);
  masks[0].slice(0, 40, 120).slice(1, 60, 160).fill_(1);
  masks[1].slice(0, 100, 240).slice(1, 20, 200).fill_(1);
  auto boxes = torch::tensor({{60.f, 40.f, 160.f, 120.f}, {20.f, 100.f, 200.f, 240.f}});
  Batch batch{torch::rand({2, 3, 256, 256}) * 255, {boxes, boxes.flip(0)}, {torch::tensor({3, 17}), torch::tensor({17, 3})},
              {masks, masks.flip(0)}};
  train_epoch(model, opt, {batch, batch}, cfg, device);
  run_inference(model, {torch::rand({3, 256, 256}, torch::TensorOptions().device(device)) * 255}, cfg, device);
}
