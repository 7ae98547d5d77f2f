// CapsNet (Sabour, Frosst & Hinton 2017) on MNIST-sized digits. A 9x9 convolution feeds the
// primary capsules (32 maps of 8-D vectors), squashed and routed to 10 digit capsules of 16-D by
// routing-by-agreement. Capsule lengths are the class scores (margin loss); a fully connected
// decoder reconstructs the input from the digit capsules masked by the true class (the predicted
// one at test time) as a regulariser. Training shifts the digits by up to two pixels; evaluation
// reports accuracy, a confusion matrix and the mean length of the winning capsule.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct CapsConfig {
  int64_t image = 28, conv_ch = 256, prim_maps = 32, prim_dim = 8, num_classes = 10, digit_dim = 16;
  int64_t routing_iters = 3, epochs = 50, log_every = 100, max_shift = 2;
  double lr = 1e-3, lr_decay = 0.96, m_plus = 0.9, m_minus = 0.1, lambda_neg = 0.5, recon_weight = 0.0005;
  double pixel_mean = 0.1307, pixel_std = 0.3081;
};

// images [B, 1, 28, 28] standardised with the MNIST mean/std; labels [B] int64.
struct DigitBatch { torch::Tensor images, labels; };
struct CapsOutput { torch::Tensor digits, lengths, recon; };

// v = |s|^2 / (1 + |s|^2) * s / |s|: short vectors shrink to ~0, long ones to just under 1.
torch::Tensor squash(const torch::Tensor &s, int64_t dim) {
  auto sq = s.pow(2).sum(dim, /*keepdim=*/true);
  auto scale = sq / (1 + sq) / torch::sqrt(sq + 1e-8);
  auto v = s.clone(); // EXPECT: tensor-unnecessary-clone
  // FACT: s = torch.randn(2, 10, 16); v = s.clone(); v.mul_(0.5); assert is_copy_of(v, s)
  v.mul_(scale); // LOOKALIKE: tensor-alias-then-mutate -- v is a clone: s is left as it was
  return v;
}

struct PrimaryCapsImpl : nn::Module {
  PrimaryCapsImpl(int64_t in_ch, int64_t maps, int64_t dim) : maps_(maps), dim_(dim) {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(in_ch, maps * dim, 9).stride(2)));
  }
  // [B, maps * dim, g, g] -> [B, maps, g * g, dim]: the 8-D vectors of each map, position-major.
  torch::Tensor to_capsule_grid(const torch::Tensor &h) const {
    // FACT: h = torch.randn(2, 32 * 8, 6, 6); assert is_view_of(h.view(2, 32, 8, 36), h)
    return h.view({h.size(0), maps_, dim_, h.size(2) * h.size(3)}).transpose(2, 3); // LOOKALIKE: tensor-view-non-contiguous -- the conv output is contiguous
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto caps = to_capsule_grid(conv(x));
    // FACT: h = torch.randn(2, 32 * 8, 6, 6); c = h.view(2, 32, 8, 36).transpose(2, 3); assert raises(lambda: c.view(2, -1, 8), "view size is not compatible")
    return squash(caps.view({x.size(0), -1, dim_}), -1); // EXPECT: tensor-view-non-contiguous
  }
  int64_t maps_, dim_;
  nn::Conv2d conv{nullptr};
};
TORCH_MODULE(PrimaryCaps);

struct DigitCapsImpl : nn::Module {
  DigitCapsImpl(int64_t n_in, int64_t in_dim, int64_t n_out, int64_t out_dim, int64_t iters) : iters_(iters) {
    W = register_parameter("W", 0.01 * torch::randn({1, n_in, n_out, out_dim, in_dim}));
    b_prior = register_buffer("b_prior", torch::zeros({1, n_in, n_out, 1}));
  }
  // u [B, n_in, in_dim] -> v [B, n_out, out_dim]
  torch::Tensor forward(const torch::Tensor &u) {
    auto u_hat = torch::matmul(W, u.unsqueeze(2).unsqueeze(-1)).squeeze(-1); // [B, n_in, n_out, out_dim]
    auto b = b_prior.expand({u.size(0), -1, -1, -1});                       // routing logits per example
    torch::Tensor v;
    for (int64_t r = 0; r < iters_; ++r) {
      auto c = torch::softmax(b, 2); // coupling coefficients over the parent capsules
      if (r + 1 == iters_) {
        v = squash((c * u_hat).sum(1), -1);
        break;
      }
      // Intermediate iterations do not backpropagate through the predictions.
      auto u_stop = u_hat.detach().clone(); // EXPECT: tensor-clone-in-loop
      auto v_stop = squash((c * u_stop).sum(1, /*keepdim=*/true), -1);
      // FACT: p = torch.zeros(1, 12, 3, 1); b = p.expand(2, -1, -1, -1); assert raises(lambda: b.add_(torch.randn(2, 12, 3, 1)), "single memory location")
      // FACT: b = torch.zeros(2, 6, 3, 1); u = torch.randn(2, 6, 3, 5, requires_grad=True); c = torch.softmax(b, 2); s = (c * u).sum(1); b += torch.randn(2, 6, 3, 1); s.sum().backward(); assert u.grad is not None
      b += (u_stop * v_stop).sum(-1, /*keepdim=*/true); // EXPECT: tensor-inplace-on-expanded // LOOKALIKE: tensor-inplace-on-saved -- softmax saves its result, not b
    }
    return v;
  }
  int64_t iters_;
  torch::Tensor W, b_prior;
};
TORCH_MODULE(DigitCaps);

struct DecoderImpl : nn::Module {
  DecoderImpl(int64_t in, int64_t pixels) {
    fc1 = register_module("fc1", nn::Linear(in, 512));
    fc2 = register_module("fc2", nn::Linear(512, 1024));
    fc3 = register_module("fc3", nn::Linear(1024, pixels));
  }
  torch::Tensor forward(const torch::Tensor &x) { return torch::sigmoid(fc3(torch::relu(fc2(torch::relu(fc1(x)))))); }
  nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Decoder);

struct CapsNetImpl : nn::Module {
  explicit CapsNetImpl(const CapsConfig &cfg) : n_classes_(cfg.num_classes) {
    const int64_t grid = (cfg.image - 8 - 9) / 2 + 1; // after the 9x9 conv and the stride-2 9x9 conv
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, cfg.conv_ch, 9)));
    primary = register_module("primary", PrimaryCaps(cfg.conv_ch, cfg.prim_maps, cfg.prim_dim));
    digits = register_module("digits", DigitCaps(cfg.prim_maps * grid * grid, cfg.prim_dim, cfg.num_classes, cfg.digit_dim, cfg.routing_iters));
    decoder = register_module("decoder", Decoder(cfg.num_classes * cfg.digit_dim, cfg.image * cfg.image));
    torch::NoGradGuard no_grad;
    for (auto &p : named_parameters())
      if (p.key().find("bias") != std::string::npos)
        p.value().zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  // Labels given: the decoder sees only the true class's capsule; otherwise the longest one.
  CapsOutput forward(const torch::Tensor &x, const torch::Tensor &labels = {}) {
    auto v = digits(primary(torch::relu(conv1(x)))); // [B, 10, 16]
    auto lengths = (v.pow(2).sum(-1) + 1e-9).sqrt();
    auto cls = labels.defined() ? labels : lengths.argmax(1);
    auto mask = F::one_hot(cls, n_classes_).to(v.dtype()).unsqueeze(-1);
    // FACT: v = torch.randn(4, 10, 16); m = torch.nn.functional.one_hot(torch.randint(0, 10, (4,)), 10).float().unsqueeze(-1); p = v * m; assert is_view_of(p.flatten(1), p)
    auto recon = decoder((v * mask).flatten(1)); // LOOKALIKE: tensor-reshape-non-contiguous -- the masked product is a new contiguous tensor
    return {v, lengths, recon};
  }

  int64_t n_classes_;
  nn::Conv2d conv1{nullptr};
  PrimaryCaps primary{nullptr};
  DigitCaps digits{nullptr};
  Decoder decoder{nullptr};
};
TORCH_MODULE(CapsNet);

// L_k = T_k max(0, m+ - |v_k|)^2 + lambda (1 - T_k) max(0, |v_k| - m-)^2, summed over classes.
torch::Tensor margin_loss(const torch::Tensor &lengths, const torch::Tensor &labels, const CapsConfig &cfg) {
  auto T = F::one_hot(labels, cfg.num_classes).to(lengths.dtype());
  auto present = torch::relu(cfg.m_plus - lengths);
  // FACT: l = torch.rand(4, 10, requires_grad=True); p = torch.relu(0.9 - l); p.pow_(2); assert backward_fails(lambda: p.sum().backward())
  present.pow_(2); // EXPECT: tensor-inplace-on-saved
  auto absent = torch::relu(lengths - cfg.m_minus).pow(2); // LOOKALIKE: tensor-inplace-on-saved -- out-of-place pow
  return (T * present + cfg.lambda_neg * (1 - T) * absent).sum(1).mean();
}

// The decoder outputs pixels in [0, 1]: undo the input standardisation for the target.
torch::Tensor recon_target(const torch::Tensor &images, const CapsConfig &cfg) {
  auto t = images.flatten(1);
  // FACT: x = torch.randn(4, 1, 28, 28); t = x.flatten(1); t.mul_(0.3081).add_(0.1307); assert shares_storage(t, x)
  t.mul_(cfg.pixel_std).add_(cfg.pixel_mean); // EXPECT: tensor-alias-then-mutate
  return t;
}

// Random translation by up to max_shift pixels, padding with the standardised background value.
torch::Tensor random_shift(const torch::Tensor &images, int64_t max_shift, double background) {
  const auto H = images.size(2), W = images.size(3);
  auto padded = F::pad(images, F::PadFuncOptions({max_shift, max_shift, max_shift, max_shift}).value(background));
  const auto dy = torch::randint(0, 2 * max_shift + 1, {1}).item<int64_t>();
  const auto dx = torch::randint(0, 2 * max_shift + 1, {1}).item<int64_t>();
  // FACT: p = torch.nn.functional.pad(torch.randn(4, 1, 28, 28), (2, 2, 2, 2)); c = p.narrow(2, 1, 28).narrow(3, 3, 28); assert not is_contiguous(c) and is_copy_of(c.contiguous(), p)
  return padded.narrow(2, dy, H).narrow(3, dx, W).contiguous(); // LOOKALIKE: tensor-alias-then-mutate -- the crop is not contiguous: contiguous() copies
}

void train_capsnet(CapsNet &model, const std::vector<DigitBatch> &train_set, const std::vector<DigitBatch> &test_set, const CapsConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  const int64_t C = cfg.num_classes;
  const double background = -cfg.pixel_mean / cfg.pixel_std;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    for (auto &group : opt.param_groups())
      static_cast<torch::optim::AdamOptions &>(group.options()).lr(cfg.lr * std::pow(cfg.lr_decay, static_cast<double>(epoch)));
    auto epoch_margin = torch::zeros({}, torch::TensorOptions().device(device));
    auto epoch_recon = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto &b : train_set) {
      auto x = random_shift(b.images, cfg.max_shift, background).to(device);
      auto y = b.labels.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto out = model->forward(x, y);
      auto margin = margin_loss(out.lengths, y, cfg);
      auto recon_l = F::mse_loss(out.recon, recon_target(x, cfg), F::MSELossFuncOptions().reduction(torch::kSum)) / x.size(0);
      auto loss = margin + cfg.recon_weight * recon_l;
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_margin += margin; // EXPECT: tensor-graph-kept-across-iterations
      epoch_recon += recon_l.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    const auto n = static_cast<double>(train_set.size());
    std::cout << "epoch " << epoch << " margin " << epoch_margin.item<double>() / n << " recon " << epoch_recon.item<double>() / n << "\n";

    // Test pass: accuracy, confusion matrix, mean length of the winning capsule.
    torch::NoGradGuard no_grad;
    model->eval();
    auto confusion = torch::zeros({C, C}, torch::kLong);
    std::vector<torch::Tensor> win_lengths;
    int64_t correct = 0, seen = 0;
    torch::Tensor sample;
    for (const auto &b : test_set) {
      auto x = b.images.to(device), y = b.labels.to(device);
      auto out = model->forward(x);
      auto pred = out.lengths.argmax(1);
      correct += (pred == y).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop
      seen += y.size(0);
      // FACT: y = torch.randint(0, 10, (32,)); p = torch.randint(0, 10, (32,)); h = torch.bincount(y * 10 + p, minlength=100); assert is_view_of(h.view(10, 10), h)
      confusion += torch::bincount(y * C + pred, {}, C * C).view({C, C}); // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-view-non-contiguous -- bincount returns a contiguous tensor
      win_lengths.push_back(std::get<0>(out.lengths.max(1))); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
      // FACT: d = torch.nn.Linear(16, 784); r = torch.sigmoid(d(torch.randn(4, 16))); assert is_view_of(r.view(-1, 1, 28, 28), r)
      if (!sample.defined())
        sample = out.recon.view({-1, 1, cfg.image, cfg.image}).cpu(); // LOOKALIKE: tensor-view-non-contiguous -- the decoder's sigmoid output is contiguous
    }
    std::cout << "  test accuracy " << static_cast<double>(correct) / static_cast<double>(seen) << ", mean winning length "
              << torch::cat(win_lengths).mean().item<double>() << "\n  confusion\n"
              << confusion << "\n  reconstructions " << sample.sizes() << "\n";
  }
}
