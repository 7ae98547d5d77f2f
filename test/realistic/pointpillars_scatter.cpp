// PointPillars (Lang et al. 2019) for car/pedestrian/cyclist detection on KITTI-style lidar sweeps:
// points are grouped into vertical pillars on the host (padded to max_points, with counts), a
// small PointNet turns each pillar into one feature vector, the vectors are scattered back onto
// the BEV canvas by their grid coordinates, and a 2-D backbone with SSD-style anchor heads
// predicts class scores, box residuals (SECOND encoding) and a direction bin per anchor.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

constexpr double kPi = 3.14159265358979323846;

struct PillarConfig {
  std::vector<double> pc_range = {0.0, -39.68, -3.0, 69.12, 39.68, 1.0}; // x0 y0 z0 x1 y1 z1
  std::vector<double> voxel = {0.16, 0.16, 4.0};
  std::vector<double> anchor_size = {3.9, 1.6, 1.56}; // l w h of the car template
  int64_t nx = 432, ny = 496, max_points = 32, max_pillars = 12000;
  int64_t feat_dim = 64, n_classes = 3, anchors_per_loc = 2;
  double anchor_z = -1.78, pos_iou = 0.6, neg_iou = 0.45, dir_offset = 0.78539, score_thresh = 0.3, lr = 2e-3;
  int epochs = 80, log_every = 50;
};

// One collated batch: pillars of all samples stacked, coords rows are (sample, y, x).
struct PillarBatch {
  torch::Tensor pillars, num_points, coords;           // [P, N, 4] float, [P] int64, [P, 3] int64
  std::vector<torch::Tensor> gt_boxes, gt_classes;     // per sample [M, 7] float, [M] int64
  int64_t batch_size = 1;
};

// Host-side grouping of one sweep [n, 4] (x, y, z, intensity) into padded pillars.
PillarBatch pillarize(const torch::Tensor &cloud, const PillarConfig &cfg) {
  auto lo = torch::tensor({cfg.pc_range[0], cfg.pc_range[1]}, torch::kFloat);
  auto size = torch::tensor({cfg.voxel[0], cfg.voxel[1]}, torch::kFloat);
  auto cell = ((cloud.narrow(1, 0, 2) - lo) / size).floor().to(torch::kLong); // [n, 2] (ix, iy)
  auto keep = (cell.select(1, 0) >= 0) & (cell.select(1, 0) < cfg.nx) & (cell.select(1, 1) >= 0) &
              (cell.select(1, 1) < cfg.ny);
  auto pts = cloud.index({keep});
  cell = cell.index({keep});
  auto flat = cell.select(1, 1) * cfg.nx + cell.select(1, 0);
  auto [uniq, inverse, counts] = torch::_unique2(flat, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/true);

  // Slot of each point inside its pillar: rank among the points with the same cell.
  auto order = torch::argsort(inverse);
  auto grp = inverse.index({order});
  auto starts = torch::cumsum(counts, 0) - counts;
  auto slot = torch::arange(pts.size(0), torch::kLong) - starts.index({grp});
  const auto P = std::min<int64_t>(uniq.size(0), cfg.max_pillars);
  auto fits = (slot < cfg.max_points) & (grp < P);

  PillarBatch out;
  out.pillars = torch::zeros({P, cfg.max_points, pts.size(1)});
  // FACT: p = torch.zeros(3, 4, 2); c = torch.randn(5, 2); p.index_put_((torch.tensor([0, 2]), torch.tensor([1, 3])), c[:2]); assert p.dtype == c.dtype and torch.equal(p[2, 3], c[1])
  out.pillars.index_put_({grp.index({fits}), slot.index({fits})}, pts.index({order}).index({fits})); // LOOKALIKE: tensor-copy-narrowing -- float rows into a fresh float32 buffer, by tensor indices
  out.num_points = counts.narrow(0, 0, P).clamp_max(cfg.max_points);
  auto u = uniq.narrow(0, 0, P);
  out.coords = torch::stack({torch::zeros_like(u), torch::div(u, cfg.nx, "floor"), u.remainder(cfg.nx)}, 1);
  return out;
}

struct PillarFeatureNetImpl : torch::nn::Module {
  explicit PillarFeatureNetImpl(const PillarConfig &cfg) {
    linear_ = register_module("linear", torch::nn::Linear(torch::nn::LinearOptions(9, cfg.feat_dim).bias(false)));
    bn_ = register_module("bn", torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(cfg.feat_dim).eps(1e-3).momentum(0.01)));
    voxel_xy_ = register_buffer("voxel_xy", torch::tensor({cfg.voxel[0], cfg.voxel[1]}, torch::kFloat));
    offset_xy_ = register_buffer("offset_xy", torch::tensor({cfg.voxel[0] / 2 + cfg.pc_range[0], cfg.voxel[1] / 2 + cfg.pc_range[1]}, torch::kFloat));
  }

  // pillars [P, N, 4], num_points [P], coords [P, 3] -> one feature per pillar [P, C]
  torch::Tensor forward(const torch::Tensor &pillars, const torch::Tensor &num_points, const torch::Tensor &coords) {
    auto mask = torch::arange(pillars.size(1), num_points.options()).unsqueeze(0) < num_points.unsqueeze(1); // [P, N]
    auto xyz = pillars.narrow(2, 0, 3);
    auto mean = xyz.sum(1, true) / num_points.clamp_min(1).to(pillars.dtype()).view({-1, 1, 1});
    // pillar centre in metres, from (y, x) grid coordinates
    auto centre = coords.narrow(1, 1, 2).flip(1).to(pillars.dtype()) * voxel_xy_ + offset_xy_; // LOOKALIKE: tensor-device-mismatch -- buffers move with the module
    auto feats = torch::cat({pillars, xyz - mean, xyz.narrow(2, 0, 2) - centre.unsqueeze(1)}, 2);
    feats = feats * mask.unsqueeze(2).to(feats.dtype());
    auto h = torch::relu(bn_(linear_(feats).permute({0, 2, 1})).permute({0, 2, 1}));
    // the Linear has no bias but BatchNorm shifts the zero rows: padded slots must not win the max
    // FACT: lin = torch.nn.Linear(9, 4); bn = torch.nn.BatchNorm1d(4); f = torch.randn(5, 3, 9); m = torch.rand(5, 3) > 0.3; h = torch.relu(bn(lin(f).permute(0, 2, 1)).permute(0, 2, 1)); h.mul_(m.unsqueeze(2)); assert backward_fails(lambda: h.max(1)[0].sum().backward())
    h.mul_(mask.unsqueeze(2)); // EXPECT: tensor-inplace-on-saved -- relu saved its output for backward
    return std::get<0>(h.max(1));
  }

  torch::nn::Linear linear_{nullptr};
  torch::nn::BatchNorm1d bn_{nullptr};
  torch::Tensor voxel_xy_, offset_xy_;
};
TORCH_MODULE(PillarFeatureNet);

torch::nn::Sequential down_block(int64_t in, int64_t out, int64_t layers) {
  namespace nn = torch::nn;
  nn::Sequential s(nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(2).padding(1).bias(false)),
                   nn::BatchNorm2d(nn::BatchNorm2dOptions(out).eps(1e-3).momentum(0.01)), nn::ReLU());
  for (int64_t i = 0; i < layers; ++i)
    s->extend(*nn::Sequential(nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)),
                              nn::BatchNorm2d(nn::BatchNorm2dOptions(out).eps(1e-3).momentum(0.01)), nn::ReLU()));
  return s;
}

torch::nn::Sequential up_block(int64_t in, int64_t out, int64_t stride) {
  namespace nn = torch::nn;
  return nn::Sequential(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, stride).stride(stride).bias(false)),
                        nn::BatchNorm2d(nn::BatchNorm2dOptions(out).eps(1e-3).momentum(0.01)), nn::ReLU());
}

struct HeadOut {
  torch::Tensor cls, box, dir; // [B, K, n_classes], [B, K, 7], [B, K, 2]
};

struct PointPillarsImpl : torch::nn::Module {
  explicit PointPillarsImpl(const PillarConfig &cfg) : cfg_(cfg) {
    const auto C = cfg.feat_dim, A = cfg.anchors_per_loc;
    pfn_ = register_module("pfn", PillarFeatureNet(cfg));
    down1_ = register_module("down1", down_block(C, 64, 3));
    down2_ = register_module("down2", down_block(64, 128, 5));
    down3_ = register_module("down3", down_block(128, 256, 5));
    up1_ = register_module("up1", up_block(64, 128, 1));
    up2_ = register_module("up2", up_block(128, 128, 2));
    up3_ = register_module("up3", up_block(256, 128, 4));
    cls_ = register_module("cls", torch::nn::Conv2d(torch::nn::Conv2dOptions(384, A * cfg.n_classes, 1)));
    box_ = register_module("box", torch::nn::Conv2d(torch::nn::Conv2dOptions(384, A * 7, 1)));
    dir_ = register_module("dir", torch::nn::Conv2d(torch::nn::Conv2dOptions(384, A * 2, 1)));
  }

  // Pillar features [P, C] onto a zero canvas [B, C, ny, nx] at their (y, x) cells.
  torch::Tensor scatter(const torch::Tensor &feats, const torch::Tensor &coords, int64_t B) {
    const auto C = feats.size(1);
    auto flat = coords.select(1, 1) * cfg_.nx + coords.select(1, 2);
    std::vector<torch::Tensor> canvases;
    for (int64_t b = 0; b < B; ++b) {
      auto sel = coords.select(1, 0) == b;
      auto canvas = torch::zeros({C, cfg_.ny * cfg_.nx}, feats.options());
      canvas.index_put_({torch::indexing::Slice(), flat.index({sel})}, feats.index({sel}).t());
      canvases.push_back(canvas); // LOOKALIKE: tensor-graph-kept-across-iterations -- the canvases are this forward pass: stacked and returned for backward
    }
    // FACT: c = torch.stack([torch.zeros(4, 6), torch.zeros(4, 6)]); assert is_view_of(c.view(2, 4, 2, 3), c)
    return torch::stack(canvases).view({B, C, cfg_.ny, cfg_.nx}); // LOOKALIKE: tensor-view-non-contiguous -- stack returns a contiguous tensor
  }

  HeadOut forward(const PillarBatch &batch) {
    auto pf = pfn_(batch.pillars, batch.num_points, batch.coords);
    auto x1 = down1_->forward(scatter(pf, batch.coords, batch.batch_size));
    auto x2 = down2_->forward(x1);
    auto x3 = down3_->forward(x2);
    auto f = torch::cat({up1_->forward(x1), up2_->forward(x2), up3_->forward(x3)}, 1);
    const auto B = f.size(0);
    HeadOut out;
    // FACT: c = torch.randn(2, 6, 4, 5); assert is_copy_of(c.permute(0, 2, 3, 1).reshape(2, -1, 3), c)
    out.cls = cls_(f).permute({0, 2, 3, 1}).reshape({B, -1, cfg_.n_classes}); // EXPECT: tensor-reshape-non-contiguous -- (H, W, A) cannot merge after the permute: the class map is copied
    // FACT: b = torch.randn(2, 14, 4, 5); v = b.permute(0, 2, 3, 1).contiguous(); assert is_copy_of(v, b) and is_view_of(v.view(2, -1, 7), v)
    out.box = box_(f).permute({0, 2, 3, 1}).contiguous().view({B, -1, 7}); // LOOKALIKE: tensor-view-non-contiguous, tensor-reshape-non-contiguous -- contiguous() first: one explicit copy
    out.dir = dir_(f).permute({0, 2, 3, 1}).contiguous().view({B, -1, 2});
    return out;
  }

  PillarConfig cfg_;
  PillarFeatureNet pfn_{nullptr};
  torch::nn::Sequential down1_{nullptr}, down2_{nullptr}, down3_{nullptr}, up1_{nullptr}, up2_{nullptr}, up3_{nullptr};
  torch::nn::Conv2d cls_{nullptr}, box_{nullptr}, dir_{nullptr};
};
TORCH_MODULE(PointPillars);

// Anchors [H * W * A, 7] (x, y, z, l, w, h, yaw) on the head's grid: the template at 0 and 90 degrees.
torch::Tensor make_anchors(int64_t H, int64_t W, const PillarConfig &cfg) {
  const auto A = cfg.anchors_per_loc;
  auto tmpl = torch::tensor({0.0, 0.0, cfg.anchor_z, cfg.anchor_size[0], cfg.anchor_size[1], cfg.anchor_size[2], 0.0}).repeat({A, 1});
  // FACT: t = torch.randn(1, 7).repeat(2, 1); t.select(1, 6).copy_(torch.arange(2) * 1.57); assert t[1, 6].item() > 1.5 and t[0, 6].item() == 0
  tmpl.select(1, 6).copy_(torch::arange(A) * (kPi / A)); // LOOKALIKE: tensor-inplace-on-expanded -- repeat copies: the template has memory of its own
  auto grid = torch::meshgrid({torch::linspace(cfg.pc_range[1], cfg.pc_range[4], H), torch::linspace(cfg.pc_range[0], cfg.pc_range[3], W)}, "ij");
  auto xy = torch::stack({grid[1], grid[0]}, -1); // [H, W, 2]
  auto anchors = tmpl.view({1, 1, A, 7}).expand({H, W, A, 7});
  // FACT: t = torch.randn(2, 7); a = t.view(1, 1, 2, 7).expand(3, 4, 2, 7); assert raises(lambda: a.narrow(3, 0, 2).add_(torch.randn(3, 4, 1, 2)), "more than one element of the written-to tensor")
  anchors.narrow(3, 0, 2).add_(xy.view({H, W, 1, 2})); // EXPECT: tensor-inplace-on-expanded -- every cell of the expanded template is the same memory
  return anchors.contiguous().view({-1, 7}); // one [H * W * A, 7] table
}

torch::Tensor limit_period(const torch::Tensor &v, double offset, double period) {
  return v - torch::floor(v / period + offset) * period;
}

// SECOND residuals: centre offsets over the anchor's BEV diagonal, log size ratios, yaw difference.
torch::Tensor encode_boxes(const torch::Tensor &gt, const torch::Tensor &a) {
  auto diag = a.narrow(1, 3, 2).pow(2).sum(1, true).sqrt();
  auto dxy = (gt.narrow(1, 0, 2) - a.narrow(1, 0, 2)) / diag;
  auto dz = (gt.narrow(1, 2, 1) - a.narrow(1, 2, 1)) / a.narrow(1, 5, 1);
  auto dsize = torch::log(gt.narrow(1, 3, 3) / a.narrow(1, 3, 3));
  return torch::cat({dxy, dz, dsize, gt.narrow(1, 6, 1) - a.narrow(1, 6, 1)}, 1);
}

torch::Tensor decode_boxes(const torch::Tensor &d, const torch::Tensor &a) {
  auto diag = a.narrow(1, 3, 2).pow(2).sum(1, true).sqrt();
  auto xy = d.narrow(1, 0, 2) * diag + a.narrow(1, 0, 2);
  auto z = d.narrow(1, 2, 1) * a.narrow(1, 5, 1) + a.narrow(1, 2, 1);
  auto size = torch::exp(d.narrow(1, 3, 3)) * a.narrow(1, 3, 3);
  return torch::cat({xy, z, size, d.narrow(1, 6, 1) + a.narrow(1, 6, 1)}, 1);
}

// sin(a - b) = sin a cos b - cos a sin b: the yaw terms of prediction and target, for smooth L1.
std::pair<torch::Tensor, torch::Tensor> add_sin_difference(const torch::Tensor &pred, const torch::Tensor &tgt) {
  auto pr = pred.narrow(-1, 6, 1), tr = tgt.narrow(-1, 6, 1);
  return {torch::cat({pred.narrow(-1, 0, 6), torch::sin(pr) * torch::cos(tr)}, -1),
          torch::cat({tgt.narrow(-1, 0, 6), torch::cos(pr) * torch::sin(tr)}, -1)};
}

// Axis-aligned BEV IoU [K, M] between standup boxes.
torch::Tensor bev_iou(const torch::Tensor &a, const torch::Tensor &b) {
  auto ac = a.narrow(1, 0, 2).unsqueeze(1), ah = a.narrow(1, 3, 2).unsqueeze(1) / 2;
  auto bc = b.narrow(1, 0, 2).unsqueeze(0), bh = b.narrow(1, 3, 2).unsqueeze(0) / 2;
  auto inter = (torch::min(ac + ah, bc + bh) - torch::max(ac - ah, bc - bh)).clamp_min(0).prod(-1);
  auto area_a = a.narrow(1, 3, 2).prod(1), area_b = b.narrow(1, 3, 2).prod(1);
  return inter / (area_a.unsqueeze(1) + area_b.unsqueeze(0) - inter);
}

struct Targets {
  torch::Tensor labels, reg, dir; // [B, K] int64 (-1 ignore, 0 background, c + 1), [B, K, 7], [B, K] int64
};

Targets assign_targets(const torch::Tensor &anchors, const std::vector<torch::Tensor> &boxes,
                       const std::vector<torch::Tensor> &classes, const PillarConfig &cfg) {
  torch::NoGradGuard no_grad;
  const auto B = static_cast<int64_t>(boxes.size()), K = anchors.size(0);
  Targets t{torch::zeros({B, K}, anchors.options().dtype(torch::kLong))};
  t.reg = torch::zeros({B, K, 7}, anchors.options());
  t.dir = torch::zeros({B, K}, t.labels.options());
  for (int64_t b = 0; b < B; ++b) {
    if (boxes[b].size(0) == 0)
      continue;
    auto [best, match] = bev_iou(anchors, boxes[b]).max(1);
    auto pos = best >= cfg.pos_iou;
    auto lab = t.labels[b];
    // FACT: t = torch.zeros(2, 5, dtype=torch.long); lab = t[1]; lab.masked_fill_(torch.tensor([True, False, True, False, False]), -1); assert is_view_of(lab, t) and t[1, 0].item() == -1
    lab.masked_fill_((best >= cfg.neg_iou) & ~pos, -1); // LOOKALIKE: tensor-alias-then-mutate -- a row view of the targets: writing them is the point
    auto gt = boxes[b].index({match.index({pos})});
    lab.index_put_({pos}, classes[b].index({match.index({pos})}) + 1);
    t.reg[b].index_put_({pos}, encode_boxes(gt, anchors.index({pos})));
    auto bin = limit_period(gt.select(1, 6) - cfg.dir_offset, 0, 2 * kPi).div(kPi).floor().clamp(0, 1);
    t.dir[b].index_put_({pos}, bin.to(torch::kLong));
  }
  return t;
}

torch::Tensor detection_loss(const HeadOut &out, const Targets &t, const PillarConfig &cfg) {
  auto pos = t.labels > 0;
  auto n_pos = pos.sum().clamp_min(1).to(torch::kFloat);
  auto weight = (t.labels >= 0).to(torch::kFloat).unsqueeze(-1);
  auto onehot = torch::one_hot(t.labels.clamp_min(0), cfg.n_classes + 1).narrow(-1, 1, cfg.n_classes).to(torch::kFloat);
  auto p = torch::sigmoid(out.cls);
  auto pt = onehot * p + (1 - onehot) * (1 - p);
  auto alpha = onehot * 0.25 + (1 - onehot) * 0.75;
  auto bce = torch::binary_cross_entropy_with_logits(out.cls, onehot, {}, {}, at::Reduction::None);
  auto cls_loss = (alpha * (1 - pt).pow(2) * bce * weight).sum() / n_pos;
  auto enc = add_sin_difference(out.box, t.reg);
  auto reg = torch::smooth_l1_loss(enc.first, enc.second, at::Reduction::None, 1.0 / 9).sum(-1);
  auto box_loss = (reg * pos).sum() / n_pos;
  auto dir_loss = torch::nn::functional::cross_entropy(out.dir.index({pos}), t.dir.index({pos}));
  return cls_loss + 2.0 * box_loss + 0.2 * dir_loss;
}

void train(PointPillars &model, const std::vector<PillarBatch> &batches, const PillarConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  auto anchors = make_anchors(cfg.ny / 2, cfg.nx / 2, cfg);
  auto range_lo = torch::tensor({cfg.pc_range[0], cfg.pc_range[1]}, torch::kFloat);
  auto range_hi = torch::tensor({cfg.pc_range[3], cfg.pc_range[4]}, torch::kFloat);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(0.01));
  int64_t step = 0;
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double running = 0;
    for (const auto &b : batches) {
      PillarBatch in = b;
      in.pillars = b.pillars.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      in.num_points = b.num_points.to(device), in.coords = b.coords.to(device);
      std::vector<torch::Tensor> gts, cls;
      for (size_t i = 0; i < b.gt_boxes.size(); ++i) {
        auto g = b.gt_boxes[i].to(device);
        auto xy = g.narrow(1, 0, 2);
        auto inside = ((xy >= range_lo) & (xy < range_hi)).all(1); // EXPECT: tensor-device-mismatch -- the range bounds are two-element host tensors, the boxes are on the GPU
        gts.push_back(g.index({inside}));
        cls.push_back(b.gt_classes[i].to(device).index({inside}));
      }
      auto anc = anchors.to(device); // EXPECT: tensor-clone-in-loop -- the same anchor grid is uploaded at every step
      auto targets = assign_targets(anc, gts, cls, cfg);
      auto loss = detection_loss(model->forward(in), targets, cfg);
      opt.zero_grad();
      loss.backward();
      opt.step();
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- a host round trip every step just to sum the loss
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    std::cout << "epoch " << epoch << " mean loss " << running / std::max<size_t>(batches.size(), 1) << "\n";
  }
}

struct Detections { torch::Tensor boxes, scores, labels; }; // host tensors; anchors come on the model's device

std::vector<Detections> detect(PointPillars &model, const PillarBatch &batch, const torch::Tensor &anchors,
                               const PillarConfig &cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto out = model->forward(batch);
  auto scores = torch::sigmoid(out.cls);
  // FACT: l = torch.nn.Linear(3, 2); g = torch.no_grad(); g.__enter__(); s = torch.sigmoid(l(torch.randn(4, 3))); s.masked_fill_(s < 0.5, 0); g.__exit__(None, None, None); assert s.grad_fn is None and not s.requires_grad
  scores.masked_fill_(scores < cfg.score_thresh, 0); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing was saved
  std::vector<Detections> dets;
  for (int64_t b = 0; b < batch.batch_size; ++b) {
    auto [best, label] = scores[b].max(-1);
    auto keep = best > 0;
    auto boxes = decode_boxes(out.box[b].index({keep}), anchors.index({keep}));
    auto dir = out.dir[b].index({keep}).argmax(-1);
    auto yaw = boxes.select(1, 6);
    auto fixed = limit_period(yaw - cfg.dir_offset, 0, kPi) + cfg.dir_offset + kPi * dir.to(yaw.dtype());
    // FACT: b = torch.randn(5, 7); y = b.select(1, 6); f = y * 2 + 1; y.copy_(f); assert torch.equal(b[:, 6], f)
    yaw.copy_(fixed); // LOOKALIKE: tensor-inplace-overlap -- fixed is a new tensor computed from yaw, not a view of it
    dets.push_back({boxes.cpu(), best.index({keep}).cpu(), label.index({keep}).cpu()}); // LOOKALIKE: tensor-sync-in-loop, tensor-clone-in-loop -- a new sample each time, the host copies are the result
  }
  return dets;
}
