// CenterNet ("Objects as Points") on a small stride-4 backbone: class heatmap, box size and
// sub-pixel offset heads, Gaussian target rendering, the penalty-reduced focal loss, and
// decoding with 3x3 max-pool NMS and a top-k over the flattened [C, H, W] heatmap.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;

struct CenterNetConfig {
  int64_t in_channels = 3;
  int64_t num_classes = 80;
  int64_t head_conv = 64;
  int64_t down_ratio = 4;
  int64_t topk = 100;
  double min_overlap = 0.7;
  double wh_weight = 0.1;
  double off_weight = 1.0;
  double lr = 1.25e-4;
  int64_t epochs = 70;
  int64_t log_every = 50;
  float score_thresh = 0.3f;
};

struct HeadOutputs {
  torch::Tensor hm;   // [B, C, H, W] probabilities
  torch::Tensor wh;   // [B, 2, H, W]
  torch::Tensor reg;  // [B, 2, H, W]
};

struct Batch {
  torch::Tensor image;     // [B, 3, H, W] float
  torch::Tensor hm;        // [B, C, H/4, W/4]
  torch::Tensor wh;        // [B, K, 2]
  torch::Tensor reg;       // [B, K, 2]
  torch::Tensor ind;       // [B, K] flat index y * W + x (int64)
  torch::Tensor reg_mask;  // [B, K] 1 for real objects
};

struct Detection {
  float score, x0, y0, x1, y1;
  int64_t cls;
};

static void conv_bn_relu(torch::nn::Sequential& seq, int64_t in, int64_t out, int64_t stride) {
  seq->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
  seq->push_back(torch::nn::BatchNorm2d(out));
  seq->push_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
}

struct CenterNetImpl : torch::nn::Module {
  explicit CenterNetImpl(const CenterNetConfig& cfg) {
    torch::nn::Sequential stem;
    conv_bn_relu(stem, cfg.in_channels, 32, 2);
    conv_bn_relu(stem, 32, 64, 2);
    conv_bn_relu(stem, 64, 64, 1);
    conv_bn_relu(stem, 64, 128, 1);
    backbone = register_module("backbone", stem);
    hm_trunk = register_module("hm_trunk", trunk(128, cfg.head_conv));
    wh_trunk = register_module("wh_trunk", trunk(128, cfg.head_conv));
    reg_trunk = register_module("reg_trunk", trunk(128, cfg.head_conv));
    hm_out = register_module("hm_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.head_conv, cfg.num_classes, 1)));
    wh_out = register_module("wh_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.head_conv, 2, 1)));
    reg_out = register_module("reg_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.head_conv, 2, 1)));

    // Focal-loss prior from the paper: every location starts at p ~= 0.1.
    hm_out->bias.fill_(-2.19);  // EXPECT: tensor-inplace-on-leaf
    torch::nn::init::constant_(wh_out->bias, 0.0);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
    torch::nn::init::constant_(reg_out->bias, 0.0);
  }

  static torch::nn::Sequential trunk(int64_t in, int64_t mid) {
    return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, mid, 3).padding(1)),
                                 torch::nn::ReLU(torch::nn::ReLUOptions(true)));
  }

  HeadOutputs forward(const torch::Tensor& x) {
    auto feat = backbone->forward(x);
    auto hm = torch::sigmoid(hm_out->forward(hm_trunk->forward(feat)));
    // FACT: x = torch.randn(4, requires_grad=True); h = torch.sigmoid(x); h.clamp_(1e-4, 1 - 1e-4); assert backward_fails(lambda: h.sum().backward())
    hm.clamp_(1e-4, 1.0 - 1e-4);  // EXPECT: tensor-inplace-on-saved
    auto wh = wh_out->forward(wh_trunk->forward(feat));
    auto reg = reg_out->forward(reg_trunk->forward(feat));
    return {hm, wh, reg};
  }

  torch::nn::Sequential backbone{nullptr}, hm_trunk{nullptr}, wh_trunk{nullptr}, reg_trunk{nullptr};
  torch::nn::Conv2d hm_out{nullptr}, wh_out{nullptr}, reg_out{nullptr};
};
TORCH_MODULE(CenterNet);

// ---------------------------------------------------------------- targets

double gaussian_radius(double height, double width, double min_overlap) {
  const double b1 = height + width;
  const double c1 = width * height * (1 - min_overlap) / (1 + min_overlap);
  const double r1 = (b1 + std::sqrt(b1 * b1 - 4 * c1)) / 2;
  const double b2 = 2 * (height + width);
  const double c2 = (1 - min_overlap) * width * height;
  const double r2 = (b2 + std::sqrt(b2 * b2 - 16 * c2)) / 2;
  const double a3 = 4 * min_overlap;
  const double b3 = -2 * min_overlap * (height + width);
  const double c3 = (min_overlap - 1) * width * height;
  const double r3 = (b3 + std::sqrt(b3 * b3 - 4 * a3 * c3)) / 2;
  return std::min({r1, r2, r3});
}

torch::Tensor gaussian_2d(int64_t radius, double sigma) {
  auto r = torch::arange(-radius, radius + 1, torch::kFloat);
  auto g = torch::exp(-(r.view({-1, 1}).pow(2) + r.view({1, -1}).pow(2)) / (2 * sigma * sigma));
  g.masked_fill_(g < std::numeric_limits<float>::epsilon() * g.max(), 0.0);  // LOOKALIKE: tensor-inplace-on-saved -- built from arange, nothing requires grad
  return g;
}

// Splats a Gaussian peak into one class plane [H, W] of the target heatmap, keeping the max.
void draw_gaussian(torch::Tensor plane, int64_t cx, int64_t cy, int64_t radius) {
  auto g = gaussian_2d(radius, (2 * radius + 1) / 6.0);
  const int64_t H = plane.size(0), W = plane.size(1);
  const int64_t left = std::min(cx, radius), right = std::min(W - cx, radius + 1);
  const int64_t top = std::min(cy, radius), bottom = std::min(H - cy, radius + 1);
  if (left + right <= 0 || top + bottom <= 0) return;
  auto region = plane.narrow(0, cy - top, top + bottom).narrow(1, cx - left, left + right);
  auto patch = g.narrow(0, radius - top, top + bottom).narrow(1, radius - left, left + right);
  // FACT: h = torch.zeros(6, 6); r = h.narrow(0, 1, 3).narrow(1, 2, 2); r.copy_(torch.max(r, torch.ones(3, 2))); assert h.sum() == 6 and is_view_of(r, h)
  region.copy_(torch::max(region, patch));  // LOOKALIKE: tensor-alias-then-mutate -- region is an explicit narrow view; writing the heatmap is the point
}

// boxes: [N, 4] x0,y0,x1,y1 in output-map pixels, labels: [N] int64.
void render_heatmap(torch::Tensor hm, const torch::Tensor& boxes, const torch::Tensor& labels,
                    const CenterNetConfig& cfg) {
  auto b = boxes.accessor<float, 2>();
  auto l = labels.accessor<int64_t, 1>();
  for (int64_t i = 0; i < boxes.size(0); ++i) {
    const double h = b[i][3] - b[i][1], w = b[i][2] - b[i][0];
    if (h <= 0 || w <= 0) continue;
    auto radius = std::max<int64_t>(0, static_cast<int64_t>(gaussian_radius(h, w, cfg.min_overlap)));
    const auto cx = static_cast<int64_t>((b[i][0] + b[i][2]) / 2);
    const auto cy = static_cast<int64_t>((b[i][1] + b[i][3]) / 2);
    draw_gaussian(hm[l[i]], cx, cy, radius);
  }
}

// ---------------------------------------------------------------- losses

torch::Tensor transpose_and_gather(const torch::Tensor& feat, const torch::Tensor& ind) {
  const auto B = feat.size(0), C = feat.size(1);
  // FACT: x = torch.randn(2, 3, 4, 5); assert is_view_of(x.permute(0, 2, 3, 1).view(2, -1, 3), x)
  auto flat = feat.permute({0, 2, 3, 1}).view({B, -1, C});  // LOOKALIKE: tensor-view-non-contiguous -- only H and W merge, and they stay adjacent after the permute
  auto idx = ind.unsqueeze(2).expand({B, ind.size(1), C});
  return flat.gather(1, idx);
}

torch::Tensor focal_loss(const torch::Tensor& pred, const torch::Tensor& gt) {
  auto pos = gt.eq(1).to(torch::kFloat);
  auto neg_weights = torch::pow(1 - gt, 4);
  auto pos_loss = (torch::log(pred) * torch::pow(1 - pred, 2) * pos).sum();
  auto neg_loss = (torch::log(1 - pred) * torch::pow(pred, 2) * neg_weights * (1 - pos)).sum();
  auto num_pos = pos.sum().clamp_min(1.0);
  return -(pos_loss + neg_loss) / num_pos;
}

torch::Tensor reg_l1_loss(const torch::Tensor& output, const torch::Tensor& mask, const torch::Tensor& ind,
                          const torch::Tensor& target) {
  auto pred = transpose_and_gather(output, ind);
  auto m = mask.unsqueeze(2).expand_as(pred).to(pred.scalar_type());
  auto loss = F::l1_loss(pred * m, target * m, F::L1LossFuncOptions().reduction(torch::kSum));
  return loss / (m.sum() + 1e-4);
}

// ---------------------------------------------------------------- decoding

torch::Tensor nms_heatmap(const torch::Tensor& heat) {
  auto hmax = F::max_pool2d(heat, F::MaxPool2dFuncOptions(3).stride(1).padding(1));
  auto keep = (hmax == heat).to(heat.scalar_type());
  torch::Tensor suppressed = heat;
  // FACT: a = torch.rand(2, 3, 4, 4); b = a; b *= (a > 0.5).float(); assert shares_storage(a, b) and (a <= 0.5).sum() == (a == 0).sum()
  suppressed *= keep;  // EXPECT: tensor-alias-then-mutate
  return suppressed;
}

// Every output pixel as a candidate box, [B * H * W, 4], for the dense export path.
torch::Tensor dense_boxes(const HeadOutputs& out, int64_t down_ratio) {
  const auto H = out.wh.size(2), W = out.wh.size(3);
  auto ys = torch::arange(H, out.wh.options()).view({1, H, 1}).expand({-1, -1, W});
  auto xs = torch::arange(W, out.wh.options()).view({1, 1, W}).expand({-1, H, -1});
  auto centers = torch::stack({xs, ys}, -1).reshape({-1, 2});
  // FACT: x = torch.randn(2, 2, 4, 5); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(-1, 2), x)
  auto wh_flat = out.wh.permute({0, 2, 3, 1}).reshape({-1, 2});  // EXPECT: tensor-reshape-non-contiguous
  auto ctr = centers.repeat({out.wh.size(0), 1});
  return torch::cat({ctr - wh_flat / 2, ctr + wh_flat / 2}, 1) * down_ratio;
}

std::vector<std::vector<Detection>> decode(const HeadOutputs& out, const CenterNetConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto raw = out.hm.clone();  // LOOKALIKE: tensor-unnecessary-clone -- nms_heatmap writes out.hm in place; raw keeps the pre-NMS map
  auto heat = nms_heatmap(out.hm);
  const auto B = heat.size(0), H = heat.size(2), W = heat.size(3);
  const int64_t K = std::min<int64_t>(cfg.topk, heat[0].numel());
  auto [scores, inds] = torch::topk(heat.view({B, -1}), K);
  auto classes = torch::div(inds, H * W, "floor");
  auto pix = inds - classes * (H * W);
  auto ys = torch::div(pix, W, "floor").to(torch::kFloat);
  auto xs = (pix % W).to(torch::kFloat);
  auto reg = transpose_and_gather(out.reg, pix);
  auto wh = transpose_and_gather(out.wh, pix);
  xs = xs + reg.select(2, 0);
  ys = ys + reg.select(2, 1);
  auto half_w = wh.select(2, 0) / 2, half_h = wh.select(2, 1) / 2;
  auto boxes = torch::stack({xs - half_w, ys - half_h, xs + half_w, ys + half_h}, 2) * cfg.down_ratio;

  auto boxes_c = boxes.cpu();
  auto scores_c = scores.cpu();
  auto classes_c = classes.cpu();
  auto peak = raw.amax({1, 2, 3}).cpu();
  auto bx = boxes_c.accessor<float, 3>();
  auto sc = scores_c.accessor<float, 2>();
  auto cl = classes_c.accessor<int64_t, 2>();
  std::vector<std::vector<Detection>> dets(B);
  for (int64_t b = 0; b < B; ++b) {
    if (peak[b].item<float>() < cfg.score_thresh) continue;
    for (int64_t k = 0; k < K; ++k) {
      if (sc[b][k] < cfg.score_thresh) break;
      dets[b].push_back({sc[b][k], bx[b][k][0], bx[b][k][1], bx[b][k][2], bx[b][k][3], cl[b][k]});
    }
  }
  return dets;
}

// ---------------------------------------------------------------- training

void train(CenterNet& model, const std::vector<Batch>& batches, const CenterNetConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto pixel_mean = torch::tensor({0.408f, 0.447f, 0.470f}).view({1, 3, 1, 1});
  auto pixel_std = torch::tensor({0.289f, 0.274f, 0.278f}).view({1, 3, 1, 1}).to(device);

  torch::Tensor epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> hm_hist;
    double running = 0.0;
    int64_t step = 0;
    for (const auto& b : batches) {
      auto images = b.image.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
      images = (images - pixel_mean.to(device)) / pixel_std;  // EXPECT: tensor-clone-in-loop
      auto out = model->forward(images);

      auto hm_loss = focal_loss(out.hm, b.hm.to(device));
      auto mask = b.reg_mask.to(device);
      auto ind = b.ind.to(device);
      auto wh_loss = reg_l1_loss(out.wh, mask, ind, b.wh.to(device));
      auto off_loss = reg_l1_loss(out.reg, mask, ind, b.reg.to(device));
      auto loss = hm_loss + cfg.wh_weight * wh_loss + cfg.off_weight * off_loss;

      opt.zero_grad();
      loss.backward();
      opt.step();

      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      hm_hist.push_back(hm_loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph kept
      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      if (++step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step << " hm " << hm_loss.item<float>()  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
                  << " wh " << wh_loss.item<float>() << " off " << off_loss.item<float>() << '\n';
      }
    }
    const double hm_mean = hm_hist.empty() ? 0.0 : torch::stack(hm_hist).mean().item<double>();
    std::cout << "epoch " << epoch << " loss " << running / std::max<int64_t>(step, 1) << " hm " << hm_mean
              << " cumulative " << epoch_loss.item<double>() << std::endl;
  }
}
