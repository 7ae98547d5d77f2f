// Unsupervised optical flow, PWC-Net style: a shared feature pyramid, a coarse-to-fine loop that
// upsamples the flow, warps the second frame's features with it, builds a local cost volume and
// refines the flow; RAFT's convex upsampling to full resolution. Backward warping samples with
// grid_sample on a [B, H, W, 2] pixel grid normalised to [-1, 1]. Loss: Charbonnier photometric
// error on non-occluded pixels (forward-backward consistency) plus edge-aware smoothness.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct FlowConfig {
  int64_t levels = 4, feat = 16, max_disp = 4, up_factor = 2;
  double smooth_weight = 0.05, edge_alpha = 10.0, charb_eps = 1e-3, charb_q = 0.4;
  double lr = 1e-4;
  int64_t log_every = 100;
};

struct FlowBatch {
  torch::Tensor img1, img2; // [B, 3, H, W] in [0, 1]
  torch::Tensor flow_gt;    // [B, 2, H, W] (evaluation sets only)
  torch::Tensor valid;      // [B, H, W] 1 where the ground truth is defined
};

// Pixel coordinates (x, y) of every position: [H, W, 2].
torch::Tensor pixel_grid(int64_t H, int64_t W, const torch::TensorOptions &opts) {
  auto mesh = torch::meshgrid({torch::arange(H, opts), torch::arange(W, opts)}, "ij");
  return torch::stack({mesh[1], mesh[0]}, -1);
}

// Backward warping: out(p) = img(p + flow(p)); img [B, C, H, W], flow [B, 2, H, W] in pixels.
class BackwardWarp {
 public:
  torch::Tensor operator()(const torch::Tensor &img, const torch::Tensor &flow) {
    const auto B = flow.size(0), H = flow.size(2), W = flow.size(3);
    if (!base_.defined() || base_.size(1) != H || base_.size(2) != W || base_.device() != flow.device())
      base_ = pixel_grid(H, W, flow.options()).unsqueeze(0); // [1, H, W, 2], reused across calls
    auto grid = base_.expand({B, H, W, 2});
    // FACT: b = torch.zeros(1, 4, 5, 2); g = b.expand(3, 4, 5, 2); f = torch.randn(3, 2, 4, 5); assert raises(lambda: g.add_(f.permute(0, 2, 3, 1)), "more than one element of the written-to tensor")
    grid += flow.permute({0, 2, 3, 1}); // EXPECT: tensor-inplace-on-expanded -- every batch entry of the cached base grid is one memory location
    auto gx = grid.select(3, 0) * (2.0 / double(W - 1)) - 1.0;
    auto gy = grid.select(3, 1) * (2.0 / double(H - 1)) - 1.0;
    return F::grid_sample(img, torch::stack({gx, gy}, 3),
                          F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kZeros).align_corners(true));
  }

 private:
  torch::Tensor base_;
};

struct FeaturePyramidImpl : nn::Module {
  FeaturePyramidImpl(int64_t levels, int64_t ch) {
    int64_t in = 3;
    for (int64_t l = 0; l < levels; ++l) {
      const int64_t out = ch << std::min<int64_t>(l, 2);
      stages_.push_back(register_module(
          "stage" + std::to_string(l),
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(2).padding(1)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.1)),
                         nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.1)))));
      channels_.push_back(out);
      in = out;
    }
  }
  std::vector<torch::Tensor> forward(torch::Tensor x) {
    std::vector<torch::Tensor> feats;
    for (auto &stage : stages_) {
      x = stage->forward(x);
      feats.push_back(x);
    }
    return feats;
  }
  std::vector<nn::Sequential> stages_;
  std::vector<int64_t> channels_;
};
TORCH_MODULE(FeaturePyramid);

// Local correlation within +-d pixels: [B, (2d+1)^2, H, W].
torch::Tensor cost_volume(const torch::Tensor &f1, const torch::Tensor &f2, int64_t d) {
  const auto H = f1.size(2), W = f1.size(3);
  auto f2p = F::pad(f2, F::PadFuncOptions({d, d, d, d}));
  std::vector<torch::Tensor> costs;
  for (int64_t dy = 0; dy <= 2 * d; ++dy)
    for (int64_t dx = 0; dx <= 2 * d; ++dx)
      costs.push_back((f1 * f2p.narrow(2, dy, H).narrow(3, dx, W)).mean(1, true)); // LOOKALIKE: tensor-graph-kept-across-iterations -- the costs are the volume this function returns
  return torch::leaky_relu(torch::cat(costs, 1), 0.1);
}

// Convex combination of the 3x3 coarse neighbours for every fine pixel (RAFT): [N, 2, rH, rW].
torch::Tensor convex_upsample(const torch::Tensor &flow, const torch::Tensor &mask_logits, int64_t r) {
  const auto N = flow.size(0), H = flow.size(2), W = flow.size(3);
  // FACT: m = torch.nn.Conv2d(4, 36, 3, padding=1)(torch.randn(2, 4, 3, 5)); assert is_view_of(m.view(2, 1, 9, 2, 2, 3, 5), m)
  auto mask = torch::softmax(mask_logits.view({N, 1, 9, r, r, H, W}), 2); // LOOKALIKE: tensor-view-non-contiguous -- the mask head's conv output is contiguous
  auto patches = F::unfold(flow * double(r), F::UnfoldFuncOptions({3, 3}).padding(1)); // [N, 2*9, H*W]
  // FACT: u = torch.nn.functional.unfold(torch.randn(2, 2, 3, 5), [3, 3], padding=1); assert tuple(u.shape) == (2, 18, 15) and is_view_of(u.view(2, 2, 9, 1, 1, 3, 5), u)
  auto up = (mask * patches.view({N, 2, 9, 1, 1, H, W})).sum(2); // LOOKALIKE: tensor-view-non-contiguous -- unfold returns a contiguous [N, C*9, L]
  // FACT: u = torch.randn(2, 2, 4, 4, 3, 5); assert is_copy_of(u.permute(0, 1, 4, 2, 5, 3).reshape(2, 2, 12, 20), u)
  return up.permute({0, 1, 4, 2, 5, 3}).reshape({N, 2, r * H, r * W}); // EXPECT: tensor-reshape-non-contiguous -- interleaving the sub-pixel offsets copies the full-resolution flow
}

struct FlowNetImpl : nn::Module {
  explicit FlowNetImpl(const FlowConfig &cfg) : cfg_(cfg) {
    pyramid_ = register_module("pyramid", FeaturePyramid(cfg.levels, cfg.feat));
    const auto cv_ch = (2 * cfg.max_disp + 1) * (2 * cfg.max_disp + 1);
    for (int64_t l = 0; l < cfg.levels; ++l) {
      const auto in = pyramid_->channels_[l] + cv_ch + 2;
      estimators_.push_back(register_module(
          "est" + std::to_string(l),
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, 64, 3).padding(1)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.1)),
                         nn::Conv2d(nn::Conv2dOptions(64, 32, 3).padding(1)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.1)),
                         nn::Conv2d(nn::Conv2dOptions(32, 2, 3).padding(1)))));
    }
    const auto r = cfg.up_factor;
    mask_head_ = register_module("mask_head", nn::Conv2d(nn::Conv2dOptions(pyramid_->channels_[0], 9 * r * r, 3).padding(1)));
  }

  // Flow at every level, coarse to fine, then at full resolution (last).
  std::vector<torch::Tensor> forward(const torch::Tensor &img1, const torch::Tensor &img2) {
    auto p1 = pyramid_->forward(img1), p2 = pyramid_->forward(img2);
    const auto B = img1.size(0);
    torch::Tensor flow;
    std::vector<torch::Tensor> flows;
    for (int64_t l = cfg_.levels - 1; l >= 0; --l) {
      const auto H = p1[l].size(2), W = p1[l].size(3);
      if (flow.defined())
        flow = 2.0 * F::interpolate(flow, F::InterpolateFuncOptions().size(std::vector<int64_t>{H, W}).mode(torch::kBilinear).align_corners(true));
      else
        flow = torch::zeros({B, 2, H, W}, img1.options()); // LOOKALIKE: tensor-device-mismatch -- made with the input's options
      auto cv = cost_volume(p1[l], warp_(p2[l], flow), cfg_.max_disp);
      flow = flow + estimators_[l]->forward(torch::cat({p1[l], cv, flow}, 1));
      flows.push_back(flow); // LOOKALIKE: tensor-graph-kept-across-iterations -- every level's flow is returned for the multi-scale loss
    }
    flows.push_back(convex_upsample(flow, mask_head_(p1[0]), cfg_.up_factor));
    return flows;
  }

  FlowConfig cfg_;
  FeaturePyramid pyramid_{nullptr};
  std::vector<nn::Sequential> estimators_;
  nn::Conv2d mask_head_{nullptr};
  BackwardWarp warp_;
};
TORCH_MODULE(FlowNet);

torch::Tensor photometric_loss(const torch::Tensor &img1, const torch::Tensor &warped, const torch::Tensor &mask, const FlowConfig &cfg) {
  auto d = img1 - warped;
  auto rho = torch::pow(d * d + cfg.charb_eps * cfg.charb_eps, cfg.charb_q).mean(1, true);
  return (rho * mask).sum() / (mask.sum() + 1.0);
}

// Forward-backward consistency (UnFlow): 1 where the warped backward flow cancels the forward flow.
torch::Tensor non_occluded(const torch::Tensor &flow_fw, const torch::Tensor &flow_bw, BackwardWarp &warp) {
  auto bw = warp(flow_bw, flow_fw);
  auto mag = (flow_fw.pow(2) + bw.pow(2)).sum(1, true);
  auto diff = (flow_fw + bw).pow(2).sum(1, true);
  return (diff < 0.01 * mag + 0.5).to(torch::kFloat).detach();
}

// Edge-aware first-order smoothness: flow gradients down-weighted across image edges.
torch::Tensor smoothness_loss(const torch::Tensor &flow, const torch::Tensor &img, const torch::Tensor &kx, const torch::Tensor &ky, double alpha) {
  const auto H = flow.size(2), W = flow.size(3);
  auto gray = img.mean(1, true);
  auto wx = torch::exp(-alpha * F::conv2d(gray, kx, F::Conv2dFuncOptions().padding(1)).abs());
  auto wy = torch::exp(-alpha * F::conv2d(gray, ky, F::Conv2dFuncOptions().padding(1)).abs());
  // FACT: img = torch.rand(1, 1, 4, 5); w = torch.exp(-10 * img); w.clamp_min_(0.05); f = torch.randn(1, 2, 4, 5, requires_grad=True); (w * f.abs()).mean().backward(); assert f.grad is not None
  wx.clamp_min_(0.05); // LOOKALIKE: tensor-inplace-on-saved -- weights of the image alone: nothing that requires grad went into exp
  wy.clamp_min_(0.05);
  auto dx = (flow.narrow(3, 1, W - 1) - flow.narrow(3, 0, W - 1)).abs();
  auto dy = (flow.narrow(2, 1, H - 1) - flow.narrow(2, 0, H - 1)).abs();
  return (wx.narrow(3, 1, W - 1) * dx).mean() + (wy.narrow(2, 1, H - 1) * dy).mean();
}

void train(FlowNet &model, const std::vector<FlowBatch> &loader, const FlowConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  // FACT: k = torch.tensor([-1., 0., 1., -2., 0., 2., -1., 0., 1.]); assert is_view_of(k.view(1, 1, 3, 3), k)
  auto sobel_x = torch::tensor({-1.f, 0.f, 1.f, -2.f, 0.f, 2.f, -1.f, 0.f, 1.f}).view({1, 1, 3, 3}) / 8.0; // LOOKALIKE: tensor-view-non-contiguous -- torch::tensor of a list is contiguous
  auto sobel_y = sobel_x.transpose(2, 3).contiguous();
  BackwardWarp warp;
  auto photo_acc = torch::zeros({}, device), smooth_acc = torch::zeros({}, device);
  int64_t step = 0;
  for (const auto &b : loader) {
    auto img1 = b.img1.to(device), img2 = b.img2.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new pair of frames every step
    auto flow_fw = model->forward(img1, img2).back();
    auto flow_bw = model->forward(img2, img1).back();
    auto photo = photometric_loss(img1, warp(img2, flow_fw), non_occluded(flow_fw, flow_bw, warp), cfg) +
                 photometric_loss(img2, warp(img1, flow_bw), non_occluded(flow_bw, flow_fw, warp), cfg);
    auto smooth = smoothness_loss(flow_fw, img1, sobel_x.to(device), sobel_y.to(device), cfg.edge_alpha); // EXPECT: tensor-clone-in-loop -- the fixed Sobel kernels are copied to the GPU every step
    auto loss = photo + cfg.smooth_weight * smooth;
    opt.zero_grad();
    loss.backward();
    opt.step();
    // FACT: m = torch.nn.Linear(3, 1); acc = torch.zeros(()); n = [kept_nodes(acc.add_(m(torch.randn(4, 3)).pow(2).mean())) for _ in range(4)]; assert n[3] > n[1] > 0
    photo_acc += photo; // EXPECT: tensor-graph-kept-across-iterations -- the running sum holds on to every step's graph until the next log
    smooth_acc += smooth.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
    if (++step % cfg.log_every == 0) {
      const double p = photo_acc.item<double>() / cfg.log_every, s = smooth_acc.item<double>() / cfg.log_every; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
      std::cout << "step " << step << " photo " << p << " smooth " << s << "\n";
      photo_acc.zero_();
      smooth_acc.zero_();
    }
  }
}

// Average end-point error over the pixels with ground truth.
double evaluate_epe(FlowNet &model, const std::vector<FlowBatch> &loader) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  auto err_sum = torch::zeros({}, device), n_valid = torch::zeros({}, device);
  for (const auto &b : loader) {
    auto flow = model->forward(b.img1.to(device), b.img2.to(device)).back();
    auto epe = (flow - b.flow_gt.to(device)).pow(2).sum(1).sqrt(); // [B, H, W]
    err_sum += (epe * b.valid).sum(); // EXPECT: tensor-device-mismatch -- the validity mask is still the loader's CPU tensor
    n_valid += b.valid.sum(); // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU sum may be added to a CUDA tensor
  }
  return (err_sum / n_valid).item<double>(); // LOOKALIKE: tensor-sync-in-loop -- read once, after the loop
}

// Dominant (camera) motion: the per-component median of all flow vectors.
torch::Tensor dominant_motion(const torch::Tensor &flow) {
  // FACT: f = torch.randn(2, 2, 3, 4); assert raises(lambda: f.permute(0, 2, 3, 1).view(-1, 2), "view size is not compatible")
  auto vecs = flow.permute({0, 2, 3, 1}).view({-1, 2}); // EXPECT: tensor-view-non-contiguous -- the network's flow is [B, 2, H, W]: (u, v) pairs are not adjacent
  return std::get<0>(vecs.median(0));
}

// Flow between consecutive frames of a clip [T, 3, H, W] with the camera's motion removed.
std::vector<torch::Tensor> clip_object_motion(FlowNet &model, const torch::Tensor &clip) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->to(torch::kCUDA);
  auto frames = clip.cuda();
  std::vector<torch::Tensor> out;
  for (int64_t t = 0; t + 1 < frames.size(0); ++t) {
    auto flow = model->forward(frames.narrow(0, t, 1), frames.narrow(0, t + 1, 1)).back(); // LOOKALIKE: tensor-device-mismatch -- the frames were moved with the model
    auto pan = dominant_motion(flow);
    // FACT: m = torch.randn(10, 2).median(0).values; assert is_view_of(m.view(1, 2, 1, 1), m)
    out.push_back((flow - pan.view({1, 2, 1, 1})).cpu()); // LOOKALIKE: tensor-sync-in-loop, tensor-clone-in-loop, tensor-view-non-contiguous -- the host copy of each new flow is the result kept; the median is a contiguous [2]
  }
  return out;
}
