// Lift-Splat-Shoot (Philion & Fidler, 2020) BEV vehicle segmentation from a six-camera rig.
// Each camera's features are "lifted" into a frustum of D depth bins by the outer product of a
// per-pixel categorical depth distribution and a context vector; the frustum points are moved into
// the ego frame with the (augmented) intrinsics and extrinsics and "splatted" into a 200x200 BEV
// grid by sum pooling; a small BEV CNN predicts vehicle occupancy logits. A BEVDepth-style loss on
// projected lidar returns supervises the depth bins. Batches hold B samples of N cameras each.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct LssConfig {
  int64_t n_cams = 6, img_h = 128, img_w = 352, downsample = 16, feat_c = 64, bev_c = 64;
  double d_min = 4.0, d_max = 45.0, d_step = 1.0;
  double x_min = -50.0, x_max = 50.0, y_min = -50.0, y_max = 50.0, z_min = -10.0, z_max = 10.0, cell = 0.5;
  int64_t epochs = 30, log_every = 50, batch = 4;
  double lr = 1e-3, weight_decay = 1e-7, pos_weight = 2.13, depth_weight = 3.0, near_range = 20.0;
  int64_t depth_bins() const { return std::llround((d_max - d_min) / d_step); }
  int64_t nx() const { return std::llround((x_max - x_min) / cell); }
  int64_t ny() const { return std::llround((y_max - y_min) / cell); }
};

// Calibration of the rigs in a batch: rots/intrins/post_rots [B, N, 3, 3], trans/post_trans [B, N, 3].
struct CameraRig {
  torch::Tensor rots, trans, intrins, post_rots, post_trans;
  CameraRig to(torch::Device d) const { return {rots.to(d), trans.to(d), intrins.to(d), post_rots.to(d), post_trans.to(d)}; }
};

struct CameraBatch {
  torch::Tensor images;      // [B, N, 3, H, W]
  CameraRig rig;
  torch::Tensor lidar_depth; // [B, N, H, W], 0 where no lidar return
  torch::Tensor bev_target;  // [B, 1, nx, ny] vehicle occupancy in {0, 1}
};

void conv_bn_relu(nn::Sequential &seq, int64_t in, int64_t out, int64_t stride) {
  seq->push_back(nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
  seq->push_back(nn::BatchNorm2d(out));
  seq->push_back(nn::ReLU(nn::ReLUOptions(true)));
}

// Image trunk at stride 16 and a 1x1 head with D depth logits and C context channels.
struct CamEncoderImpl : nn::Module {
  CamEncoderImpl(int64_t D, int64_t C) : D_(D), C_(C) {
    nn::Sequential stages;
    conv_bn_relu(stages, 3, 32, 2);
    conv_bn_relu(stages, 32, 64, 2);
    conv_bn_relu(stages, 64, 128, 2);
    conv_bn_relu(stages, 128, 256, 2);
    trunk = register_module("trunk", stages);
    head = register_module("head", nn::Conv2d(nn::Conv2dOptions(256, D + C, 1)));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    auto out = head(trunk->forward(x));
    return {out.narrow(1, 0, D_), out.narrow(1, D_, C_)};
  }
  int64_t D_, C_;
  nn::Sequential trunk{nullptr};
  nn::Conv2d head{nullptr};
};
TORCH_MODULE(CamEncoder);

struct LssOutput {
  torch::Tensor logits; // [B, 1, nx, ny]
  torch::Tensor depth;  // [B*N, D, fh, fw] depth distribution
};

struct LiftSplatShootImpl : nn::Module {
  explicit LiftSplatShootImpl(const LssConfig &cfg)
      : cfg_(cfg), D_(cfg.depth_bins()), fh_(cfg.img_h / cfg.downsample), fw_(cfg.img_w / cfg.downsample) {
    camencode = register_module("camencode", CamEncoder(D_, cfg.feat_c));
    nn::Sequential bev;
    conv_bn_relu(bev, cfg.feat_c, cfg.bev_c, 1);
    conv_bn_relu(bev, cfg.bev_c, cfg.bev_c, 1);
    bev->push_back(nn::Conv2d(nn::Conv2dOptions(cfg.bev_c, 1, 1)));
    bevencode = register_module("bevencode", bev);
    frustum_ = register_buffer("frustum", make_frustum());
  }

  // [D, fh, fw, 3] grid of (u, v, depth) in the augmented image plane.
  torch::Tensor make_frustum() const {
    auto ds = torch::arange(cfg_.d_min, cfg_.d_max, cfg_.d_step).view({-1, 1, 1}).expand({D_, fh_, fw_});
    auto xs = torch::linspace(0, cfg_.img_w - 1, fw_).view({1, 1, fw_}).expand({D_, fh_, fw_});
    auto ys = torch::linspace(0, cfg_.img_h - 1, fh_).view({1, fh_, 1}).expand({D_, fh_, fw_});
    return torch::stack({xs, ys, ds}, -1);
  }

  // Ego-frame (x, y, z) of every frustum point: [B, N, D, fh, fw, 3].
  torch::Tensor geometry(const CameraRig &rig) {
    const auto B = rig.trans.size(0), N = rig.trans.size(1);
    auto pts = frustum_.expand({B, N, D_, fh_, fw_, 3});
    // FACT: f = torch.rand(4, 2, 3, 3); p = f.expand(2, 5, 4, 2, 3, 3); assert raises(lambda: p.sub_(torch.rand(2, 5, 1, 1, 1, 3)), "single memory location")
    pts.sub_(rig.post_trans.view({B, N, 1, 1, 1, 3})); // EXPECT: tensor-inplace-on-expanded -- pts is the shared frustum broadcast over B and N: the write raises
    pts = torch::inverse(rig.post_rots).view({B, N, 1, 1, 1, 3, 3}).matmul(pts.unsqueeze(-1));
    // pixel coordinates to camera rays scaled by depth: (u d, v d, d)
    pts = torch::cat({pts.narrow(5, 0, 2) * pts.narrow(5, 2, 1), pts.narrow(5, 2, 1)}, 5);
    auto combine = rig.rots.matmul(torch::inverse(rig.intrins));
    pts = combine.view({B, N, 1, 1, 1, 3, 3}).matmul(pts).squeeze(-1);
    // FACT: f = torch.rand(4, 2, 3, 3); p = f.expand(2, 5, 4, 2, 3, 3); p = torch.eye(3).view(1, 1, 1, 1, 1, 3, 3).matmul(p.unsqueeze(-1)).squeeze(-1); p += torch.rand(2, 5, 1, 1, 1, 3); assert is_copy_of(p, f) and is_contiguous(p)
    pts += rig.trans.view({B, N, 1, 1, 1, 3}); // LOOKALIKE: tensor-inplace-on-expanded -- pts now holds matmul's fresh result, not the broadcast frustum
    return pts;
  }

  // Lift: depth distribution (outer product) context -> frustum features [B, N, D, fh, fw, C].
  std::pair<torch::Tensor, torch::Tensor> lift(const torch::Tensor &images) {
    const auto B = images.size(0), N = images.size(1);
    // FACT: x = torch.randn(2, 3, 3, 8, 8); assert is_view_of(x.view(6, 3, 8, 8), x)
    auto x = images.view({B * N, images.size(2), images.size(3), images.size(4)}); // LOOKALIKE: tensor-view-non-contiguous -- the camera batch from the loader is contiguous
    auto enc = camencode->forward(x);
    auto depth = torch::softmax(enc.first, 1);
    // FACT: l = torch.randn(2, 5, 3, requires_grad=True); d = torch.softmax(l, 1); d.clamp_min_(1e-6); assert backward_fails(lambda: (d.log().sum() + d.sum()).backward())
    depth.clamp_min_(1e-6); // EXPECT: tensor-inplace-on-saved -- softmax saved its output: backward through the lift fails
    auto feats = depth.unsqueeze(1) * enc.second.unsqueeze(2); // [B*N, C, D, fh, fw]
    // FACT: f = torch.rand(6, 1, 4, 2, 3) * torch.randn(6, 5, 1, 2, 3); assert is_view_of(f.view(2, 3, 5, 4, 2, 3), f)
    auto lifted = feats.view({B, N, cfg_.feat_c, D_, fh_, fw_}); // LOOKALIKE: tensor-view-non-contiguous -- the broadcast product is a fresh contiguous tensor
    return {lifted.permute({0, 1, 3, 4, 5, 2}), depth};
  }

  // Splat: sum-pool every frustum feature into its BEV cell -> [B, C, nx, ny].
  torch::Tensor splat(const torch::Tensor &geom, const torch::Tensor &feats) {
    const auto B = feats.size(0), C = feats.size(5), nx = cfg_.nx(), ny = cfg_.ny();
    // FACT: f = (torch.rand(6, 1, 4, 2, 3) * torch.randn(6, 5, 1, 2, 3)).view(2, 3, 5, 4, 2, 3).permute(0, 1, 3, 4, 5, 2); assert is_copy_of(f.reshape(-1, 5), f)
    auto x = feats.reshape({-1, C}); // EXPECT: tensor-reshape-non-contiguous -- channels were permuted last: the whole frustum (B N D fh fw C floats) is copied every forward
    auto lower = torch::tensor({cfg_.x_min, cfg_.y_min, cfg_.z_min}, geom.options());
    auto extent = torch::tensor({cfg_.cell, cfg_.cell, cfg_.z_max - cfg_.z_min}, geom.options());
    auto coords = torch::empty({x.size(0), 3}, geom.options().dtype(torch::kLong));
    // FACT: c = torch.empty(3, dtype=torch.long); c.copy_(torch.tensor([-0.6, 0.4, 1.7])); assert c.tolist() == [0, 0, 1]
    // FACT: g = torch.randn(2, 3, 4, 2, 3, 3); assert is_view_of(g.reshape(-1, 3), g)
    coords.copy_((geom.reshape({-1, 3}) - lower) / extent); // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-reshape-non-contiguous -- the geometry is a fresh matmul result: reshape is a view
    auto per_sample = x.size(0) / B;
    auto batch_ix = torch::div(torch::arange(x.size(0), coords.options()), per_sample, "floor");
    auto cx = coords.select(1, 0), cy = coords.select(1, 1), cz = coords.select(1, 2);
    auto kept = ((cx >= 0) & (cx < nx) & (cy >= 0) & (cy < ny) & (cz == 0)).nonzero().squeeze(1);
    auto cell_ix = (batch_ix * nx + cx) * ny + cy;
    auto bev = torch::zeros({B * nx * ny, C}, x.options());
    bev.index_add_(0, cell_ix.index_select(0, kept), x.index_select(0, kept));
    // FACT: b = torch.zeros(2 * 3 * 4, 5); assert is_view_of(b.view(2, 3, 4, 5).permute(0, 3, 1, 2), b)
    return bev.view({B, nx, ny, C}).permute({0, 3, 1, 2}); // LOOKALIKE: tensor-view-non-contiguous -- the canvas was made by zeros: contiguous
  }

  LssOutput forward(const torch::Tensor &images, const CameraRig &rig) {
    auto lifted = lift(images);
    auto bev = splat(geometry(rig), lifted.first);
    return {bevencode->forward(bev), lifted.second};
  }

  LssConfig cfg_;
  int64_t D_, fh_, fw_;
  CamEncoder camencode{nullptr};
  nn::Sequential bevencode{nullptr};
  torch::Tensor frustum_;
};
TORCH_MODULE(LiftSplatShoot);

// BEVDepth-style target: the nearest lidar return of each ds x ds patch as a depth bin, -1 where none.
torch::Tensor depth_targets(const torch::Tensor &lidar, const LssConfig &cfg) {
  const auto BN = lidar.size(0) * lidar.size(1), ds = cfg.downsample;
  const auto h = lidar.size(2) / ds, w = lidar.size(3) / ds;
  // FACT: l = torch.rand(2, 3, 8, 12); assert is_view_of(l.view(6, 2, 4, 3, 4), l)
  auto patches = lidar.view({BN, h, ds, w, ds}).permute({0, 1, 3, 2, 4}); // LOOKALIKE: tensor-view-non-contiguous -- the lidar depth images are contiguous
  // FACT: g = torch.rand(6, 2, 4, 3, 4).permute(0, 1, 3, 2, 4); assert raises(lambda: g.view(-1, 16), "view size is not compatible")
  auto flat = patches.view({-1, ds * ds}); // EXPECT: tensor-view-non-contiguous -- the patch pixels are scattered over ds rows: view throws (BEVDepth calls contiguous() first)
  auto nearest = torch::where(flat > 0, flat, torch::full_like(flat, 1e5)).amin(-1).view({BN, h, w});
  auto bin = ((nearest - cfg.d_min) / cfg.d_step).floor();
  auto valid = (bin >= 0) & (bin < static_cast<double>(cfg.depth_bins()));
  return torch::where(valid, bin, torch::full_like(bin, -1.0)).to(torch::kLong);
}

// Cached samples; images are resized on load, so the intrinsics are rescaled with them.
class RigDataset {
public:
  struct Sample {
    torch::Tensor images, rots, trans, intrins, lidar_depth, bev_target;
  };
  RigDataset(std::vector<Sample> samples, const LssConfig &cfg, double sx, double sy) : samples_(std::move(samples)), cfg_(cfg) {
    resize_rows_ = torch::tensor({sx, sy, 1.0}).view({1, 3, 1});
  }
  size_t size() const { return samples_.size(); }

  Sample load(size_t i) const {
    const auto &s = samples_[i];
    auto K = s.intrins; // [N, 3, 3]
    // FACT: a = torch.rand(6, 3, 3); a0 = a.clone(); k = a; k.mul_(torch.tensor([0.5, 0.5, 1.0]).view(1, 3, 1)); assert shares_storage(k, a) and not torch.equal(a, a0)
    K.mul_(resize_rows_); // EXPECT: tensor-alias-then-mutate -- K is the cached calibration: every load shrinks the stored intrinsics again
    auto imgs = F::interpolate(s.images, F::InterpolateFuncOptions()
                                             .size(std::vector<int64_t>{cfg_.img_h, cfg_.img_w})
                                             .mode(torch::kBilinear)
                                             .align_corners(false));
    // FACT: x = torch.rand(2, 3, 8, 8); y = torch.nn.functional.interpolate(x, size=(4, 4), mode='bilinear', align_corners=False); y.sub_(0.5); assert is_copy_of(y, x)
    imgs.sub_(0.45).div_(0.225); // LOOKALIKE: tensor-alias-then-mutate -- interpolate returned a new tensor
    return {imgs, s.rots, s.trans, K, s.lidar_depth, s.bev_target};
  }

  CameraBatch batch(size_t first, int64_t b) const {
    std::vector<torch::Tensor> im, ro, tr, in, li, ta;
    for (int64_t k = 0; k < b; ++k) {
      auto s = load(first + static_cast<size_t>(k));
      im.push_back(s.images), ro.push_back(s.rots), tr.push_back(s.trans), in.push_back(s.intrins);
      li.push_back(s.lidar_depth), ta.push_back(s.bev_target);
    }
    auto rots = torch::stack(ro);
    const auto N = rots.size(1);
    CameraRig rig{rots, torch::stack(tr), torch::stack(in), torch::eye(3).repeat({b, N, 1, 1}), torch::zeros({b, N, 3})};
    return {torch::stack(im), rig, torch::stack(li), torch::stack(ta)};
  }

private:
  std::vector<Sample> samples_;
  LssConfig cfg_;
  torch::Tensor resize_rows_;
};

// Validation: IoU of the vehicle class at several thresholds, and the mean loss.
std::pair<torch::Tensor, double> evaluate(LiftSplatShoot &model, const RigDataset &val, const LssConfig &cfg, torch::Device device) {
  model->eval();
  auto thresholds = torch::tensor({0.3, 0.4, 0.5, 0.6});
  auto inter = torch::zeros({4}, torch::TensorOptions().dtype(torch::kLong).device(device)), uni = torch::zeros_like(inter);
  std::vector<torch::Tensor> losses;
  for (size_t i = 0; i + cfg.batch <= val.size(); i += cfg.batch) {
    auto b = val.batch(i, cfg.batch);
    auto out = model->forward(b.images.to(device), b.rig.to(device));
    auto target = b.bev_target.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
    losses.push_back(F::binary_cross_entropy_with_logits(out.logits, target)); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every batch's graph and activations stay alive to the end
    auto th = thresholds.to(device).view({-1, 1, 1, 1, 1}); // EXPECT: tensor-clone-in-loop -- the same four thresholds are copied to the device for every batch
    auto pred = torch::sigmoid(out.logits).unsqueeze(0) > th;
    auto tgt = (target > 0.5).unsqueeze(0);
    inter += (pred & tgt).sum({1, 2, 3, 4}); // LOOKALIKE: tensor-graph-kept-across-iterations -- counts of a comparison carry no gradient
    uni += (pred | tgt).sum({1, 2, 3, 4});
  }
  model->train();
  auto iou = inter.to(torch::kDouble).cpu() / uni.to(torch::kDouble).cpu().clamp_min(1.0);
  return {iou, torch::stack(losses).mean().item<double>()}; // LOOKALIKE: tensor-sync-in-loop -- once, after the loop
}

void train_lss(LiftSplatShoot &model, const RigDataset &train, const RigDataset &val, const LssConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));
  auto pos_weight = torch::full({1}, cfg.pos_weight, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    for (size_t i = 0; i + cfg.batch <= train.size(); i += cfg.batch) {
      auto b = train.batch(i, cfg.batch);
      auto out = model->forward(b.images.to(device), b.rig.to(device));
      auto seg = F::binary_cross_entropy_with_logits(out.logits, b.bev_target.to(device),
                                                     F::BinaryCrossEntropyWithLogitsFuncOptions().pos_weight(pos_weight)); // LOOKALIKE: tensor-clone-in-loop -- pos_weight was put on the device once, before the loop
      auto bins = depth_targets(b.lidar_depth.to(device), cfg);
      auto depth_loss = F::nll_loss(out.depth.log(), bins, F::NLLLossFuncOptions().ignore_index(-1));
      auto loss = seg + cfg.depth_weight * depth_loss;
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), 5.0);
      opt.step();
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " seg " << seg.item<double>() << " depth " << depth_loss.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    auto res = evaluate(model, val, cfg, device);
    std::cout << "epoch " << epoch << " val loss " << res.second << " IoU@0.4 " << res.first[1].item<double>() << "\n";
  }
}

// Deployment check: expected occupied cells within near_range metres of the ego vehicle, per sample.
torch::Tensor near_occupancy(LiftSplatShoot &model, const CameraBatch &b, const LssConfig &cfg) {
  torch::NoGradGuard no_grad;
  const torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  auto probs = torch::sigmoid(model->forward(b.images.to(device), b.rig.to(device)).logits); // [B, 1, nx, ny]
  auto xs = torch::linspace(cfg.x_min + 0.5 * cfg.cell, cfg.x_max - 0.5 * cfg.cell, cfg.nx());
  auto ys = torch::linspace(cfg.y_min + 0.5 * cfg.cell, cfg.y_max - 0.5 * cfg.cell, cfg.ny());
  auto near = ((xs.view({-1, 1}).pow(2) + ys.view({1, -1}).pow(2)).sqrt() < cfg.near_range).to(torch::kFloat);
  return (probs * near).sum({1, 2, 3}) / near.sum(); // EXPECT: tensor-device-mismatch -- the range mask was built on the host, the probabilities are on the GPU
}
