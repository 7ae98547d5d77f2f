// Supervised stereo matching on KITTI-style rectified pairs (PSMNet / GwcNet lineage, reduced).
// A shared residual feature extractor runs on the left and right image at 1/4 resolution, a row
// attention lets left features look along the epipolar line, and a correlation cost volume built
// by shifting over disparities is aggregated with 3D convolutions. Soft-argmin regresses a coarse
// disparity, refined over a few candidates around it; training uses a masked smooth-L1 loss,
// evaluation reports end-point error and D1, and the test split is written as 16-bit PNG values.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct StereoConfig {
  int64_t max_disp = 192, feat_ch = 32, refine_k = 9, epochs = 300, log_every = 50, eval_every = 10, hist_bins = 48;
  double lr = 1e-3, eval_downscale = 2.0, refine_step = 0.5, coarse_weight = 0.3;
};

// Images [B, 3, H, W] in [0, 1]; disparity [B, H, W] in pixels, 0 where there is no LiDAR point.
struct StereoBatch { torch::Tensor left, right, disp; };
struct StereoOutput { torch::Tensor coarse, fine, confidence; };

torch::Tensor imagenet_mean() { return torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}); }
torch::Tensor imagenet_std() { return torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}); }
torch::Tensor normalize_rgb(const torch::Tensor &img, const torch::Tensor &mean, const torch::Tensor &stdv) {
  return (img - mean) / stdv;
}

struct ResBlockImpl : nn::Module {
  explicit ResBlockImpl(int64_t ch) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", nn::BatchNorm2d(ch));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", nn::BatchNorm2d(ch));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto out = bn2(conv2(torch::relu(bn1(conv1(x)))));
    // FACT: c = torch.nn.Conv2d(4, 4, 3, padding=1); b = torch.nn.BatchNorm2d(4); x = torch.randn(2, 4, 6, 6); o = b(c(x)); o += x; o.relu().sum().backward(); assert c.weight.grad is not None
    out += x; // LOOKALIKE: tensor-inplace-on-saved -- batch norm does not save its output; relu comes after the sum
    return torch::relu(out);
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(ResBlock);

// Shared by both views: two stride-2 convolutions then residual blocks, [B, C, H/4, W/4].
struct FeatureNetImpl : nn::Module {
  explicit FeatureNetImpl(int64_t ch) {
    stem = register_module("stem", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, ch, 3).stride(2).padding(1).bias(false)),
                                                  nn::BatchNorm2d(ch), nn::ReLU(),
                                                  nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).stride(2).padding(1).bias(false)),
                                                  nn::BatchNorm2d(ch), nn::ReLU()));
    blocks = register_module("blocks", nn::Sequential(ResBlock(ch), ResBlock(ch), ResBlock(ch)));
  }
  torch::Tensor forward(const torch::Tensor &x) { return blocks->forward(stem->forward(x)); }
  nn::Sequential stem{nullptr}, blocks{nullptr};
};
TORCH_MODULE(FeatureNet);

// [B, C, H, W] -> [B, H, W, C]: one sequence of W tokens per image row (the epipolar line).
torch::Tensor to_rows(const torch::Tensor &x) { return x.permute({0, 2, 3, 1}); }

struct RowAttentionImpl : nn::Module {
  explicit RowAttentionImpl(int64_t ch) : scale_(1.0 / std::sqrt(static_cast<double>(ch))) {
    q_proj = register_module("q_proj", nn::Linear(ch, ch));
    k_proj = register_module("k_proj", nn::Linear(ch, ch));
  }
  torch::Tensor forward(const torch::Tensor &fl, const torch::Tensor &fr) {
    const auto B = fl.size(0), C = fl.size(1), H = fl.size(2), W = fl.size(3);
    // FACT: x = torch.randn(2, 8, 4, 6); assert raises(lambda: x.permute(0, 2, 3, 1).view(8, 6, 8), "view size is not compatible")
    auto q = q_proj(to_rows(fl).view({B * H, W, C})); // EXPECT: tensor-view-non-contiguous
    // FACT: x = torch.randn(2, 8, 4, 6); r = x.permute(0, 2, 3, 1).contiguous(); assert is_view_of(r.view(8, 6, 8), r)
    auto k = k_proj(to_rows(fr).contiguous().view({B * H, W, C})); // LOOKALIKE: tensor-view-non-contiguous -- the explicit copy is contiguous
    auto att = torch::softmax(torch::bmm(q, k.transpose(1, 2)) * scale_, -1);
    auto ctx = torch::bmm(att, k);
    // FACT: a = torch.softmax(torch.randn(8, 6, 6), -1); c = torch.bmm(a, torch.randn(8, 6, 4)); assert is_view_of(c.view(2, 4, 6, 4), c)
    return fl + ctx.view({B, H, W, C}).permute({0, 3, 1, 2}); // LOOKALIKE: tensor-view-non-contiguous -- bmm returns a contiguous tensor
  }
  double scale_;
  nn::Linear q_proj{nullptr}, k_proj{nullptr};
};
TORCH_MODULE(RowAttention);

// Soft-argmin over the aggregated cost [B, D, h, w]; also a peak-sharpness confidence map.
struct DisparityRegressionImpl : nn::Module {
  explicit DisparityRegressionImpl(int64_t max_disp) {
    disp_values_ = register_buffer("disp_values", torch::arange(max_disp, torch::kFloat));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &cost) {
    auto prob = torch::softmax(-cost, 1);
    auto conf = prob.detach();
    // FACT: c = torch.randn(2, 5, 3, 3, requires_grad=True); p = torch.softmax(-c, 1); q = p.detach(); q.pow_(2); d = (p * torch.arange(5.).view(1, 5, 1, 1)).sum(1); assert shares_storage(q, p) and backward_fails(lambda: d.sum().backward())
    conf.pow_(2); // EXPECT: tensor-inplace-on-detached
    // FACT: v = torch.arange(48, dtype=torch.float32); assert is_view_of(v.view(1, -1, 1, 1), v)
    auto disp = (prob * disp_values_.view({1, -1, 1, 1})).sum(1); // LOOKALIKE: tensor-view-non-contiguous -- arange buffer is contiguous
    return {disp, conf.sum(1)};
  }
  torch::Tensor disp_values_;
};
TORCH_MODULE(DisparityRegression);

// Correlation volume [B, D, h, w]: mean over channels of left * right shifted by d (differentiable).
torch::Tensor build_correlation(const torch::Tensor &fl, const torch::Tensor &fr, int64_t D) {
  const auto B = fl.size(0), H = fl.size(2), W = fl.size(3);
  auto cost = torch::zeros({B, D, H, W}, fl.options());
  for (int64_t d = 0; d < D; ++d) {
    auto corr = (fl.narrow(3, d, W - d) * fr.narrow(3, 0, W - d)).mean(1);
    // FACT: cost = torch.zeros(2, 4, 3, 8); l = torch.randn(2, 5, 3, 8); r = torch.randn(2, 5, 3, 8); cost.select(1, 2).narrow(2, 2, 6).copy_((l[..., 2:] * r[..., :6]).mean(1)); assert is_copy_of(cost, l) and is_copy_of(cost, r)
    cost.select(1, d).narrow(2, d, W - d).copy_(corr); // LOOKALIKE: tensor-inplace-overlap, tensor-copy-narrowing -- the volume and the features are separate float32 tensors
  }
  return cost;
}

// Deployment path: no shifted copies per disparity, the right features move one column per step.
torch::Tensor correlation_volume_fast(const torch::Tensor &fl, const torch::Tensor &fr, int64_t D) {
  torch::NoGradGuard no_grad;
  const auto B = fl.size(0), H = fl.size(2), W = fl.size(3);
  auto cost = torch::zeros({B, D, H, W}, fl.options());
  auto shifted = fr.clone(); // LOOKALIKE: tensor-unnecessary-clone -- shifted in place below; fr is the caller's feature map
  for (int64_t d = 0; d < D; ++d) {
    if (d > 0) {
      // FACT: x = torch.randn(2, 3, 4, 16); e = x[..., :15].clone(); x.narrow(3, 1, 15).copy_(x.narrow(3, 0, 15)); assert not torch.equal(x[..., 1:], e)
      shifted.narrow(3, 1, W - 1).copy_(shifted.narrow(3, 0, W - 1)); // EXPECT: tensor-inplace-overlap
      shifted.select(3, 0).zero_();
    }
    cost.select(1, d).copy_((fl * shifted).mean(1));
  }
  return cost;
}

// Candidate disparities around the coarse estimate: [B, K, h, w].
torch::Tensor candidate_range(const torch::Tensor &coarse, const torch::Tensor &offsets) {
  auto cand = coarse.unsqueeze(1).expand({-1, offsets.size(0), -1, -1});
  // FACT: c = torch.rand(2, 4, 6); o = torch.linspace(-2, 2, 5); e = c.unsqueeze(1).expand(-1, 5, -1, -1); assert raises(lambda: e.add_(o.view(1, -1, 1, 1)), "single memory location")
  cand.add_(offsets.view({1, -1, 1, 1})); // EXPECT: tensor-inplace-on-expanded
  return cand.clamp_min(0.0);
}

torch::Tensor upsample_disp(const torch::Tensor &d, int64_t H, int64_t W) {
  const double ratio = static_cast<double>(W) / static_cast<double>(d.size(-1));
  auto up = F::interpolate(d.unsqueeze(1), F::InterpolateFuncOptions().size(std::vector<int64_t>{H, W}).mode(torch::kBilinear).align_corners(false));
  return up.squeeze(1) * ratio; // disparities scale with the width
}

struct StereoNetImpl : nn::Module {
  explicit StereoNetImpl(const StereoConfig &cfg) : D_(cfg.max_disp / 4) {
    features = register_module("features", FeatureNet(cfg.feat_ch));
    row_att = register_module("row_att", RowAttention(cfg.feat_ch));
    aggregate = register_module("aggregate", nn::Sequential(nn::Conv3d(nn::Conv3dOptions(1, 16, 3).padding(1).bias(false)), nn::BatchNorm3d(16), nn::ReLU(),
                                                            nn::Conv3d(nn::Conv3dOptions(16, 16, 3).padding(1).bias(false)), nn::BatchNorm3d(16), nn::ReLU(),
                                                            nn::Conv3d(nn::Conv3dOptions(16, 1, 3).padding(1))));
    regress = register_module("regress", DisparityRegression(D_));
    refine = register_module("refine", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(cfg.feat_ch + 1, 64, 3).padding(1)), nn::ReLU(),
                                                      nn::Conv2d(nn::Conv2dOptions(64, cfg.refine_k, 3).padding(1))));
    offsets_ = register_buffer("offsets", (torch::arange(cfg.refine_k, torch::kFloat) - (cfg.refine_k - 1) / 2.0) * cfg.refine_step);
    init_weights();
  }

  // He initialisation as in the reference PSMNet code.
  void init_weights() {
    for (auto &m : modules(/*include_self=*/false)) {
      if (auto *conv = m->as<nn::Conv2d>()) {
        const auto &k = conv->options.kernel_size();
        const double n = static_cast<double>((*k)[0] * (*k)[1] * conv->options.out_channels());
        // FACT: c = torch.nn.Conv2d(3, 8, 3); assert raises(lambda: c.weight.normal_(0.0, 0.1), "a leaf Variable that requires grad")
        conv->weight.normal_(0.0, std::sqrt(2.0 / n)); // EXPECT: tensor-inplace-on-leaf
      } else if (auto *conv3 = m->as<nn::Conv3d>()) {
        torch::NoGradGuard no_grad;
        const auto &k = conv3->options.kernel_size();
        const double n = static_cast<double>((*k)[0] * (*k)[1] * (*k)[2] * conv3->options.out_channels());
        conv3->weight.normal_(0.0, std::sqrt(2.0 / n)); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      } else if (auto *bn = m->as<nn::BatchNorm2d>()) {
        nn::init::ones_(bn->weight); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
        nn::init::zeros_(bn->bias);
      }
    }
  }

  torch::Tensor cost_volume(const torch::Tensor &fl, const torch::Tensor &fr) {
    return aggregate->forward(build_correlation(row_att(fl, fr), fr, D_).unsqueeze(1)).squeeze(1);
  }

  StereoOutput forward(const torch::Tensor &left, const torch::Tensor &right) {
    const auto H = left.size(2), W = left.size(3);
    auto fl = features(left), fr = features(right);
    auto [coarse, confidence] = regress(cost_volume(fl, fr));
    auto cand = candidate_range(coarse, offsets_);
    auto logits = refine->forward(torch::cat({fl, coarse.unsqueeze(1)}, 1));
    auto fine = (torch::softmax(logits, 1) * cand).sum(1);
    return {upsample_disp(coarse, H, W), upsample_disp(fine, H, W), confidence};
  }

  // Coarse disparity only, for the evaluation and submission passes.
  torch::Tensor infer(const torch::Tensor &left, const torch::Tensor &right) {
    torch::NoGradGuard no_grad;
    auto fl = features(left), fr = features(right);
    auto cost = aggregate->forward(correlation_volume_fast(row_att(fl, fr), fr, D_).unsqueeze(1)).squeeze(1);
    return upsample_disp(regress(cost).first, left.size(2), left.size(3));
  }

  int64_t D_;
  FeatureNet features{nullptr};
  RowAttention row_att{nullptr};
  nn::Sequential aggregate{nullptr}, refine{nullptr};
  DisparityRegression regress{nullptr};
  torch::Tensor offsets_;
};
TORCH_MODULE(StereoNet);

struct PairMetrics { torch::Tensor epe, d1; }; // 0-dim, on the model's device

// End-point error and KITTI D1 (error > 3 px and > 5 %) at the evaluation resolution.
PairMetrics evaluate_pair(StereoNet &model, const StereoBatch &b, const torch::Tensor &mean, const torch::Tensor &stdv,
                          const StereoConfig &cfg, torch::Device device) {
  const double s = cfg.eval_downscale;
  const auto h = static_cast<int64_t>(static_cast<double>(b.left.size(2)) / s);
  const auto w = static_cast<int64_t>(static_cast<double>(b.left.size(3)) / s);
  auto resize = F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false);
  auto left = normalize_rgb(F::interpolate(b.left, resize).to(device), mean, stdv);
  auto right = normalize_rgb(F::interpolate(b.right, resize).to(device), mean, stdv);
  // FACT: d = torch.rand(2, 6, 8) * 64; g = d.contiguous(); g /= 2.0; assert shares_storage(g, d) and d.max() <= 32
  auto gt = b.disp.contiguous();
  gt /= s; // EXPECT: tensor-alias-then-mutate
  gt = F::interpolate(gt.unsqueeze(1), F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kNearest)).squeeze(1).to(device);
  auto pred = model->infer(left, right);
  auto valid = (gt > 0) & (gt < cfg.max_disp / s);
  auto err = (pred - gt).abs();
  auto bad = (err > 3.0) & (err > 0.05 * gt) & valid;
  auto n = valid.sum().clamp_min(1);
  return {err.masked_select(valid).sum() / n, bad.sum() / n};
}

std::pair<double, double> evaluate(StereoNet &model, const std::vector<StereoBatch> &val, const StereoConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto mean = imagenet_mean().to(device), stdv = imagenet_std().to(device); // LOOKALIKE: tensor-clone-in-loop -- moved once, before the loop
  auto epe = torch::zeros({}, torch::TensorOptions().device(device)), d1 = torch::zeros({}, torch::TensorOptions().device(device));
  for (const auto &b : val) {
    auto m = evaluate_pair(model, b, mean, stdv, cfg, device);
    epe += m.epe; // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    d1 += m.d1;
  }
  const auto n = static_cast<double>(val.size());
  return {epe.item<double>() / n, d1.item<double>() / n};
}

// KITTI submission format: disparity * 256 as 16-bit values, 0 = invalid.
torch::Tensor to_kitti_png(const torch::Tensor &disp) {
  auto png = torch::zeros(disp.sizes(), torch::kInt32);
  png.copy_(disp.clamp(0.0, 255.0) * 256.0); // EXPECT: tensor-copy-narrowing
  return png;
}

void train_stereo(StereoNet &model, const std::vector<StereoBatch> &train_set, const std::vector<StereoBatch> &val_set, const StereoConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.9, 0.999}));
  const auto mean = imagenet_mean(), stdv = imagenet_std();
  const auto stage_w = torch::tensor({static_cast<float>(cfg.coarse_weight), 1.0f}, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    auto disp_hist = torch::zeros({cfg.hist_bins});
    for (const auto &b : train_set) {
      auto mean_d = mean.to(device), std_d = stdv.to(device); // EXPECT: tensor-clone-in-loop
      auto left = normalize_rgb(b.left.to(device), mean_d, std_d);
      auto right = normalize_rgb(b.right.to(device), mean_d, std_d);
      auto gt = b.disp.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto valid = (gt > 0) & (gt < cfg.max_disp);
      auto out = model->forward(left, right);
      auto l_coarse = F::smooth_l1_loss(out.coarse.masked_select(valid), gt.masked_select(valid));
      auto l_fine = F::smooth_l1_loss(out.fine.masked_select(valid), gt.masked_select(valid));
      auto loss = (torch::stack({l_coarse, l_fine}) * stage_w).sum(); // LOOKALIKE: tensor-device-mismatch -- the stage weights were made on the device
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
      disp_hist += torch::histc(out.fine.detach(), cfg.hist_bins, 0, cfg.max_disp); // EXPECT: tensor-device-mismatch
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / static_cast<double>(train_set.size()) // LOOKALIKE: tensor-sync-in-loop -- once per epoch
              << " disparity histogram peak bin " << disp_hist.argmax().item<int64_t>() << "\n";
    if ((epoch + 1) % cfg.eval_every == 0) {
      const auto [epe, d1] = evaluate(model, val_set, cfg, device);
      std::cout << "  val EPE " << epe << " px, D1 " << 100.0 * d1 << " %\n";
    }
  }
}
