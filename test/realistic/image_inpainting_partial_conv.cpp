// Image inpainting with partial convolutions (Liu et al. 2018): each conv sees
// only valid pixels, renormalises by the fraction of the window that was
// valid, and passes an updated mask to the next layer.
#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
namespace nn = torch::nn;
using torch::Tensor;

struct InpaintConfig {
  int64_t in_ch = 3;
  int64_t base = 64;
  double lr = 2e-4;
  double hole_weight = 6.0;
  double valid_weight = 1.0;
  double tv_weight = 0.1;
  int64_t log_every = 200;
  int64_t grid_cols = 4;
};

struct PartialConvImpl : nn::Module {
  PartialConvImpl(int64_t in, int64_t out, int64_t k, int64_t stride)
      : k_(k), stride_(stride), pad_((k - 1) / 2) {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad_).bias(true)));
    nn::init::kaiming_normal_(conv->weight); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
    conv->bias.zero_(); // EXPECT: tensor-inplace-on-leaf
    // Buffer: a ones kernel that counts valid pixels per window (one mask channel).
    mask_kernel_ = register_buffer("mask_kernel", torch::empty({1, 1, k, k}));
    mask_kernel_.fill_(1.0); // LOOKALIKE: tensor-inplace-on-leaf -- a buffer, it does not require grad
    window_ = static_cast<double>(k * k);
  }

  // x: [B, C, H, W], mask: [B, 1, H, W] with 1 = known pixel.
  std::pair<Tensor, Tensor> forward(const Tensor &x, const Tensor &mask) {
    Tensor valid_count;
    {
      torch::NoGradGuard no_grad;
      valid_count = F::conv2d(mask, mask_kernel_, F::Conv2dFuncOptions().stride(stride_).padding(pad_));
    }
    auto ratio = window_ / (valid_count + 1e-8);
    auto new_mask = (valid_count > 0).to(x.dtype());
    ratio = ratio * new_mask;

    auto raw = conv(x * mask);
    auto b = conv->bias.view({1, -1, 1, 1});
    auto out = (raw - b) * ratio;
    // FACT: o = torch.randn(2, 4, 3, 3); b = torch.randn(4).view(1, -1, 1, 1); o.add_(b.expand_as(o)); assert b.expand_as(o).stride(0) == 0
    out.add_(b.expand_as(out)); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded bias is only read
    out.mul_(new_mask); // LOOKALIKE: tensor-inplace-on-saved -- '*' saves its operands, not its result
    return {out, new_mask};
  }

  int64_t k_, stride_, pad_;
  double window_;
  nn::Conv2d conv{nullptr};
  Tensor mask_kernel_;
};
TORCH_MODULE(PartialConv);

struct PConvBlockImpl : nn::Module {
  PConvBlockImpl(int64_t in, int64_t out, int64_t k, int64_t stride, bool use_bn) : use_bn_(use_bn) {
    pconv = register_module("pconv", PartialConv(in, out, k, stride));
    if (use_bn_)
      bn = register_module("bn", nn::BatchNorm2d(out));
  }
  std::pair<Tensor, Tensor> forward(const Tensor &x, const Tensor &mask) {
    auto r = pconv->forward(x, mask);
    auto h = use_bn_ ? bn(r.first) : r.first;
    h = torch::relu(h);
    h.mul_(r.second); // EXPECT: tensor-inplace-on-saved
    return {h, r.second};
  }
  bool use_bn_;
  PartialConv pconv{nullptr};
  nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(PConvBlock);

struct PConvUNetImpl : nn::Module {
  explicit PConvUNetImpl(const InpaintConfig &cfg) {
    int64_t c = cfg.base;
    enc1 = register_module("enc1", PConvBlock(cfg.in_ch, c, 7, 2, false));
    enc2 = register_module("enc2", PConvBlock(c, 2 * c, 5, 2, true));
    enc3 = register_module("enc3", PConvBlock(2 * c, 4 * c, 3, 2, true));
    dec3 = register_module("dec3", PConvBlock(4 * c + 2 * c, 2 * c, 3, 1, true));
    dec2 = register_module("dec2", PConvBlock(2 * c + c, c, 3, 1, true));
    dec1 = register_module("dec1", PartialConv(c + cfg.in_ch, cfg.in_ch, 3, 1));
  }

  Tensor up(const Tensor &t, const Tensor &ref) {
    return F::interpolate(t, F::InterpolateFuncOptions()
                                 .size(std::vector<int64_t>{ref.size(2), ref.size(3)})
                                 .mode(torch::kNearest));
  }

  Tensor forward(const Tensor &img, const Tensor &mask) {
    auto e1 = enc1->forward(img, mask);
    auto e2 = enc2->forward(e1.first, e1.second);
    auto e3 = enc3->forward(e2.first, e2.second);
    auto d3 = dec3->forward(torch::cat({up(e3.first, e2.first), e2.first}, 1),
                            torch::cat({up(e3.second, e2.second), e2.second}, 1).amax(1, true));
    auto d2 = dec2->forward(torch::cat({up(d3.first, e1.first), e1.first}, 1),
                            torch::cat({up(d3.second, e1.second), e1.second}, 1).amax(1, true));
    auto d1 = dec1->forward(torch::cat({up(d2.first, img), img}, 1),
                            torch::cat({up(d2.second, mask), mask}, 1).amax(1, true));
    return d1.first;
  }

  PConvBlock enc1{nullptr}, enc2{nullptr}, enc3{nullptr}, dec3{nullptr}, dec2{nullptr};
  PartialConv dec1{nullptr};
};
TORCH_MODULE(PConvUNet);

struct InpaintLosses {
  Tensor hole, valid, tv;
};

InpaintLosses inpaint_losses(const Tensor &pred, const Tensor &target, const Tensor &mask) {
  // mask is [B, 1, H, W]; make it cover every channel for the per-pixel L1 terms.
  auto valid = mask.expand({-1, pred.size(1), -1, -1});
  // FACT: m = torch.rand(2, 1, 4, 4); e = m.expand(-1, 3, -1, -1); assert raises(lambda: e.clamp_(0.0, 1.0), "more than one element")
  valid.clamp_(0.0, 1.0); // EXPECT: tensor-inplace-on-expanded
  auto hole = 1.0 - valid;
  InpaintLosses l;
  l.hole = F::l1_loss(hole * pred, hole * target);
  l.valid = F::l1_loss(valid * pred, valid * target);
  // FACT: p = torch.randn(2, 3, 4, 4); c = p; c = c * 0.5 + 1.0; assert is_copy_of(c, p)
  Tensor comp = pred; // LOOKALIKE: tensor-alias-then-mutate -- comp is rebound out of place below, pred is never written
  comp = comp * hole + target * valid;
  auto dh = (comp.narrow(2, 1, comp.size(2) - 1) - comp.narrow(2, 0, comp.size(2) - 1)).abs().mean();
  auto dw = (comp.narrow(3, 1, comp.size(3) - 1) - comp.narrow(3, 0, comp.size(3) - 1)).abs().mean();
  l.tv = dh + dw;
  return l;
}

// Per-channel mean colour of the filled-in pixels, for the training log.
Tensor hole_color_stats(const Tensor &pred, const Tensor &mask) {
  const int64_t C = pred.size(1);
  // FACT: p = torch.randn(2, 3, 4, 5); assert raises(lambda: p.permute(0, 2, 3, 1).view(-1, 3), "view size is not compatible")
  auto pixels = pred.permute({0, 2, 3, 1}).view({-1, C}); // EXPECT: tensor-view-non-contiguous
  auto sel = (mask.view({-1}) < 0.5);
  return pixels.index({sel}).mean(0);
}

// Gram-style colour covariance per image, used only for logging.
Tensor color_covariance(const Tensor &pred) {
  const int64_t B = pred.size(0), C = pred.size(1);
  // FACT: p = torch.randn(2, 3, 4, 5); assert is_view_of(p.permute(0, 2, 3, 1).view(2, -1, 3), p)
  auto per_pixel = pred.permute({0, 2, 3, 1}).view({B, -1, C}); // LOOKALIKE: tensor-view-non-contiguous -- H and W stay adjacent in memory, so they merge as a view
  // FACT: p = torch.randn(2, 3, 4, 5); assert is_view_of(p.reshape(2, 3, -1), p)
  auto flat = pred.reshape({B, C, -1}); // LOOKALIKE: tensor-reshape-non-contiguous -- pred is contiguous, reshape is a view
  auto centered = flat - flat.mean(-1, true);
  return torch::bmm(centered, per_pixel) / per_pixel.size(1);
}

// Tile [N, C, H, W] images in [0, 1] into one HWC uint8 image for the log.
Tensor to_uint8_grid(const Tensor &imgs, int64_t cols) {
  const int64_t N = imgs.size(0), C = imgs.size(1), H = imgs.size(2), W = imgs.size(3);
  const int64_t rows = N / cols;
  auto used = imgs.narrow(0, 0, rows * cols);
  // FACT: x = torch.rand(4, 3, 5, 6); g = x.view(2, 2, 3, 5, 6).permute(0, 3, 1, 4, 2).reshape(10, 12, 3); assert is_copy_of(g, x)
  auto grid = used.view({rows, cols, C, H, W}).permute({0, 3, 1, 4, 2}).reshape({rows * H, cols * W, C}); // EXPECT: tensor-reshape-non-contiguous
  auto out = torch::empty({rows * H, cols * W, C}, torch::kByte);
  out.copy_(grid * 255.0); // EXPECT: tensor-copy-narrowing
  return out;
}

Tensor to_uint8_image(const Tensor &img) {
  auto hwc = img.detach().permute({1, 2, 0}).contiguous();
  auto out = torch::empty({img.size(1), img.size(2), img.size(0)}, torch::kByte);
  out.copy_((hwc * 255.0).round().clamp(0, 255)); // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to [0, 255]: whole numbers in range
  return out;
}

void train(PConvUNet &net, torch::data::datasets::TensorDataset &ds, const Tensor &val_imgs,
           const InpaintConfig &cfg, int64_t epochs) {
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto loader = torch::data::make_data_loader(
      ds.map(torch::data::transforms::Stack<torch::data::TensorExample>()), torch::data::DataLoaderOptions().batch_size(8));
  // One fixed hole pattern for the validation snapshots (stored as bytes on disk).
  auto fixed_val_mask = torch::randint(0, 2, {val_imgs.size(0), 1, val_imgs.size(2), val_imgs.size(3)}, torch::kByte);
  std::vector<Tensor> hole_history;
  std::vector<Tensor> snapshots;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    net->train();
    double running_hole = 0.0;
    for (auto &batch : *loader) {
      auto img = batch.data;
      auto mask = (torch::rand({img.size(0), 1, img.size(2), img.size(3)}) > 0.25).to(torch::kFloat);
      auto pred = net->forward(img * mask, mask);
      auto l = inpaint_losses(pred, img, mask);
      auto loss = cfg.hole_weight * l.hole + cfg.valid_weight * l.valid + cfg.tv_weight * l.tv;
      opt.zero_grad();
      loss.backward();
      opt.step();
      hole_history.push_back(l.hole); // EXPECT: tensor-graph-kept-across-iterations
      running_hole += l.hole.item<double>(); // LOOKALIKE: tensor-graph-kept-across-iterations -- item() is a host double
      if (++step % cfg.log_every == 0) {
        std::cout << "step " << step << " hole " << running_hole / cfg.log_every
                  << " color " << hole_color_stats(pred.detach(), mask)
                  << " cov " << color_covariance(pred.detach()).mean().item<double>() << "\n";
        running_hole = 0.0;
      }
    }
    // Validation snapshots: each image with the fixed holes.
    torch::NoGradGuard no_grad;
    net->eval();
    for (int64_t i = 0; i < val_imgs.size(0); ++i) {
      auto vmask = fixed_val_mask.to(torch::kFloat); // EXPECT: tensor-clone-in-loop
      auto vimg = val_imgs[i].unsqueeze(0).to(torch::kFloat); // LOOKALIKE: tensor-clone-in-loop -- a different image each iteration, and already float32: no copy
      auto m = vmask[i].unsqueeze(0);
      auto out = net->forward(vimg * m, m);
      snapshots.push_back(to_uint8_image(out[0] * (1 - m[0]) + vimg[0] * m[0]));
    }
  }
  auto grid = to_uint8_grid(val_imgs, cfg.grid_cols);
  std::cout << "logged " << snapshots.size() << " snapshots, grid " << grid.sizes()
            << ", last hole loss " << hole_history.back().item<double>() << "\n";
}

int main() {
  InpaintConfig cfg;
  cfg.base = 16;
  PConvUNet net(cfg);
  auto images = torch::rand({32, 3, 64, 64});
  torch::data::datasets::TensorDataset ds({images});
  auto val = torch::rand({8, 3, 64, 64});
  train(net, ds, val, cfg, 1);
}
