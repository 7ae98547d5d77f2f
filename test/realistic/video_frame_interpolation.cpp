// RIFE-style video frame interpolation: a coarse-to-fine stack of IFBlocks estimates the
// bidirectional intermediate flow and a fusion mask, both input frames are backward-warped
// with grid_sample and blended. Trained with a Charbonnier photometric loss plus a first-order
// flow smoothness term, on CUDA when the machine has one.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct VFIConfig {
  std::vector<int64_t> channels{240, 150, 90};
  std::vector<double> scales{4.0, 2.0, 1.0};
  double lr = 3e-4;
  double weight_decay = 1e-4;
  double smooth_weight = 0.01;
  int64_t epochs = 30;
};

struct Triplet {
  torch::Tensor frame0, frame1, frame_t;  // [1, 3, H, W] floats in [0, 1]
  double t = 0.5;
};

struct ConvPReLUImpl : nn::Module {
  ConvPReLUImpl(int64_t cin, int64_t cout, int64_t stride)
      : conv(nn::Conv2dOptions(cin, cout, 3).stride(stride).padding(1)), act(nn::PReLUOptions().num_parameters(cout)) {
    register_module("conv", conv);
    register_module("act", act);
  }
  torch::Tensor forward(const torch::Tensor& x) { return act(conv(x)); }
  nn::Conv2d conv;
  nn::PReLU act;
};
TORCH_MODULE(ConvPReLU);

torch::Tensor resize(const torch::Tensor& x, double factor) {
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .scale_factor(std::vector<double>{factor, factor})
                               .mode(torch::kBilinear)
                               .align_corners(false));
}

// Samples img at (x + flow): flow in pixels, [B, 2, H, W].
torch::Tensor backward_warp(const torch::Tensor& img, const torch::Tensor& flow) {
  const auto B = img.size(0), H = img.size(2), W = img.size(3);
  // FACT: xs = torch.linspace(-1, 1, 5).view(1, 1, 1, 5).expand(2, 1, 3, 5); y = torch.cat([xs, xs], 1); assert is_copy_of(y, xs) and y.is_contiguous()
  auto xs = torch::linspace(-1.0, 1.0, W, img.options()).view({1, 1, 1, W}).expand({B, 1, H, W});  // LOOKALIKE: tensor-inplace-on-expanded -- the base grid is only read by cat
  auto ys = torch::linspace(-1.0, 1.0, H, img.options()).view({1, 1, H, 1}).expand({B, 1, H, W});
  auto base = torch::cat({xs, ys}, 1);
  auto norm_flow = torch::cat({flow.narrow(1, 0, 1) * (2.0 / (W - 1)), flow.narrow(1, 1, 1) * (2.0 / (H - 1))}, 1);
  auto grid = (base + norm_flow).permute({0, 2, 3, 1});  // [B, H, W, 2]
  return F::grid_sample(img, grid, F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kBorder).align_corners(true));
}

struct IFBlockImpl : nn::Module {
  IFBlockImpl(int64_t in_planes, int64_t c) {
    conv0 = register_module("conv0", nn::Sequential(ConvPReLU(in_planes, c / 2, 2), ConvPReLU(c / 2, c, 2)));
    convblock = register_module("convblock", nn::Sequential());
    for (int i = 0; i < 6; ++i) convblock->push_back(ConvPReLU(c, c, 1));
    lastconv = register_module("lastconv", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(c, 5, 4).stride(2).padding(1)));
  }

  // Returns (flow [B, 4, H, W], mask logit [B, 1, H, W]) at full resolution.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& flow, double scale) {
    auto inp = scale != 1.0 ? resize(x, 1.0 / scale) : x;
    if (flow.defined()) inp = torch::cat({inp, resize(flow, 1.0 / scale) * (1.0 / scale)}, 1);
    auto feat = conv0->forward(inp);
    feat = convblock->forward(feat) + feat;
    auto tmp = resize(lastconv(feat), scale * 2.0);
    return {tmp.narrow(1, 0, 4) * (scale * 2.0), tmp.narrow(1, 4, 1)};
  }

  nn::Sequential conv0{nullptr}, convblock{nullptr};
  nn::ConvTranspose2d lastconv{nullptr};
};
TORCH_MODULE(IFBlock);

struct Interpolation {
  torch::Tensor merged, flow, mask, warped0, warped1;
};

struct IFNetImpl : nn::Module {
  explicit IFNetImpl(const VFIConfig& cfg) : scales(cfg.scales) {
    for (size_t i = 0; i < cfg.channels.size(); ++i) {
      const int64_t in_planes = i == 0 ? 7 : 7 + 3 + 3 + 1 + 4;
      blocks.push_back(register_module("block" + std::to_string(i), IFBlock(in_planes, cfg.channels[i])));
    }
  }

  Interpolation forward(const torch::Tensor& img0, const torch::Tensor& img1, double t) {
    const auto B = img0.size(0), H = img0.size(2), W = img0.size(3);
    auto timestep = torch::full({B, 1, H, W}, t, img0.options());
    torch::Tensor flow, mask, warped0, warped1;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (!flow.defined()) {
        std::tie(flow, mask) = blocks[i]->forward(torch::cat({img0, img1, timestep}, 1), torch::Tensor(), scales[i]);
      } else {
        auto res = blocks[i]->forward(torch::cat({img0, img1, warped0, warped1, timestep, mask}, 1), flow, scales[i]);
        flow = flow + res.first;
        mask = mask + res.second;
      }
      warped0 = backward_warp(img0, flow.narrow(1, 0, 2));
      warped1 = backward_warp(img1, flow.narrow(1, 2, 2));
    }
    auto m = torch::sigmoid(mask);
    m.clamp_(0.01, 0.99);  // EXPECT: tensor-inplace-on-saved
    auto merged = warped0 * m + warped1 * (1.0 - m);
    merged.clamp_(0.0, 1.0);  // LOOKALIKE: tensor-inplace-on-saved -- the sum of the two products is saved by nothing
    return {merged, flow, mask, warped0, warped1};
  }

  std::vector<double> scales;
  std::vector<IFBlock> blocks;
};
TORCH_MODULE(IFNet);

torch::Tensor charbonnier(const torch::Tensor& pred, const torch::Tensor& target, double eps = 1e-3) {
  return torch::sqrt((pred - target).pow(2) + eps * eps).mean();
}

torch::Tensor flow_smoothness(const torch::Tensor& flow) {
  auto dx = flow.narrow(3, 1, flow.size(3) - 1) - flow.narrow(3, 0, flow.size(3) - 1);
  auto dy = flow.narrow(2, 1, flow.size(2) - 1) - flow.narrow(2, 0, flow.size(2) - 1);
  return dx.abs().mean() + dy.abs().mean();
}

double psnr(const torch::Tensor& pred, const torch::Tensor& target) {
  auto mse = (pred - target).pow(2).mean().item<double>();
  return -10.0 * std::log10(mse + 1e-10);
}

// Gamma and brightness jitter, written into the caller's frame.
void photometric_jitter_(torch::Tensor img, double gain, double gamma) {
  img.pow_(gamma).mul_(gain).clamp_(0.0, 1.0);
}

Triplet augment(const Triplet& in, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double gain = 0.9 + 0.2 * u(rng), gamma = 0.8 + 0.4 * u(rng);
  // FACT: x = torch.rand(1, 3, 4, 4); assert shares_storage(x.to(torch.float32), x)
  auto f0 = in.frame0.to(torch::kFloat);
  photometric_jitter_(f0, gain, gamma);  // EXPECT: tensor-alias-then-mutate
  auto f1 = in.frame1.to(torch::kFloat);
  photometric_jitter_(f1, gain, gamma);  // EXPECT: tensor-alias-then-mutate
  // FACT: x = torch.rand(1, 3, 4, 4); assert is_copy_of(x.clone(), x)
  auto ft = in.frame_t.clone();
  photometric_jitter_(ft, gain, gamma);  // LOOKALIKE: tensor-alias-then-mutate -- clone owns its storage
  if (u(rng) < 0.5) return {f1.flip({3}), f0.flip({3}), ft.flip({3}), in.t};  // horizontal flip
  if (u(rng) < 0.5) return {f1, f0, ft, 1.0 - in.t};                          // temporal reversal
  return {f0, f1, ft, in.t};
}

void train(IFNet& model, const std::vector<Triplet>& data, const VFIConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  std::mt19937 rng(1234);
  auto rgb_mean = torch::tensor({0.45, 0.43, 0.40}).view({1, 3, 1, 1});

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double running = 0.0;
    std::vector<torch::Tensor> recent;
    for (const auto& sample : data) {
      auto trip = augment(sample, rng);
      auto img0 = trip.frame0.to(device), img1 = trip.frame1.to(device), gt = trip.frame_t.to(device);
      auto shift = rgb_mean.to(device);  // EXPECT: tensor-clone-in-loop
      auto out = model->forward(img0 - shift, img1 - shift, trip.t);
      auto loss = charbonnier(out.merged + shift, gt) + cfg.smooth_weight * flow_smoothness(out.flow);

      opt.zero_grad();
      loss.backward();
      opt.step();

      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      recent.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
    }
    const auto n_last = std::min<int64_t>(100, static_cast<int64_t>(recent.size()));
    std::cout << "epoch " << epoch << " loss " << running / static_cast<double>(data.size()) << " last-100 "
              << torch::stack(recent).narrow(0, static_cast<int64_t>(recent.size()) - n_last, n_last).mean().item<double>() << "\n";
  }
}

double evaluate(IFNet& model, const std::vector<Triplet>& data, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  double total = 0.0;
  for (const auto& trip : data) {
    auto gt = trip.frame_t.to(device);
    auto out = model->forward(trip.frame0.to(device), trip.frame1.to(device), trip.t);
    auto ref = gt.clone();  // EXPECT: tensor-unnecessary-clone
    total += psnr(out.merged, ref);
  }
  return total / static_cast<double>(data.size());
}

// Writes n_mid evenly spaced in-between frames after every input frame (slow motion export).
std::vector<torch::Tensor> interpolate_sequence(IFNet& model, const std::vector<torch::Tensor>& frames, int64_t n_mid, int64_t border) {
  torch::NoGradGuard no_grad;
  const torch::Device dev(torch::kCUDA);
  model->to(dev);
  model->eval();
  auto ts = torch::linspace(0.0, 1.0, n_mid + 2);
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    auto a = frames[i].to(dev), b = frames[i + 1].to(dev);
    const auto H = a.size(2), W = a.size(3);
    auto valid = torch::zeros({1, 1, H, W});
    valid.narrow(2, border, H - 2 * border).narrow(3, border, W - 2 * border).fill_(1.0);
    out.push_back(frames[i]);
    for (int64_t j = 1; j <= n_mid; ++j) {
      const double t = ts[j].item<double>();  // LOOKALIKE: tensor-sync-in-loop -- ts lives on the CPU, and t steers the model
      auto res = model->forward(a, b, t);
      auto blend = a * (1.0 - ts[j]) + b * ts[j];  // LOOKALIKE: tensor-device-mismatch -- ts[j] is a 0-dim CPU scalar
      auto frame = res.merged * valid + blend * (1.0 - valid);  // EXPECT: tensor-device-mismatch
      out.push_back(frame.cpu());
    }
  }
  out.push_back(frames.back());
  return out;
}

// Keeps the last K decoded frames on the device for online interpolation.
class StreamingInterpolator {
 public:
  StreamingInterpolator(IFNet model, int64_t window, int64_t H, int64_t W, torch::Device device)
      : model_(std::move(model)), window_(torch::zeros({window, 3, H, W}, torch::TensorOptions().device(device))) {
    TORCH_CHECK(window >= 3, "StreamingInterpolator needs a window of at least 3 frames");
  }

  torch::Tensor push(const torch::Tensor& frame) {
    torch::NoGradGuard no_grad;
    const auto k = window_.size(0);
    // FACT: w = torch.randn(4, 3, 2, 2); assert raises(lambda: w.narrow(0, 0, 3).copy_(w.narrow(0, 1, 3)), "some elements of the input tensor")
    window_.narrow(0, 0, k - 1).copy_(window_.narrow(0, 1, k - 1));  // EXPECT: tensor-inplace-overlap
    window_[k - 1].copy_(frame.squeeze(0));
    auto res = model_->forward(window_[k - 2].unsqueeze(0), window_[k - 1].unsqueeze(0), 0.5);
    if (last_flow_.defined()) {
      auto diff = last_flow_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- written through a view, last_flow_ must keep its values
      // FACT: f = torch.randn(2, 4, 3, 3); e = f[:, :2] + f[:, 2:]; f.narrow(1, 0, 2).add_(f.narrow(1, 2, 2)); assert torch.equal(f[:, :2], e)
      diff.narrow(1, 0, 2).add_(diff.narrow(1, 2, 2));  // LOOKALIKE: tensor-inplace-overlap -- channels 0-1 and 2-3 are disjoint
      motion_ = diff.narrow(1, 0, 2).abs().mean().item<double>();
    }
    last_flow_ = res.flow;
    return res.merged;
  }

  double motion() const { return motion_; }

 private:
  IFNet model_;
  torch::Tensor window_, last_flow_;
  double motion_ = 0.0;
};
