// Quantization-aware training of a small encoder-decoder segmentation net for an int8 runtime:
// moving-average min/max observers on the activations, learnable activation scales (LSQ-style)
// initialised from the observers in a calibration pass, symmetric per-channel fake quantization
// of the conv and transposed-conv weights with a straight-through estimator, QAT fine-tuning on
// the GPU, and export of int8 weights, per-channel scales and int32 biases.
#include <torch/torch.h>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct QATConfig {
  int64_t num_classes = 21, width = 32;
  double observer_momentum = 0.01, logit_ema = 0.05;
  int64_t calib_batches = 64, epochs = 10;
  double lr = 1e-4;
};

struct SegBatch {
  torch::Tensor image; // [B, 3, H, W] float
  torch::Tensor mask;  // [B, H, W] int64 class ids
};

// Symmetric fake quantization, straight-through: the forward pass sees the rounded values, the
// backward pass the identity.
torch::Tensor fake_quant_ste(const torch::Tensor &x, const torch::Tensor &scale, int64_t qmin, int64_t qmax) {
  auto q = x.to(torch::kFloat); // activations may arrive in half precision under autocast
  // FACT: c = torch.nn.Conv2d(3, 4, 3); s = torch.nn.Parameter(torch.full((1,), 0.05)); x = torch.nn.functional.hardtanh(c(torch.randn(2, 3, 5, 5)), 0.0, 6.0); q = x.to(torch.float); q.div_(s).round_().clamp_(-128, 127).mul_(s); (x + (q - x).detach()).sum().backward(); assert shares_storage(q, x) and c.weight.grad.abs().sum() == 0
  q.div_(scale).round_().clamp_(qmin, qmax).mul_(scale); // EXPECT: tensor-alias-then-mutate -- to(kFloat) returned x itself: x is rounded in place and the gradient through round_ is zero
  return x + (q - x).detach();
}

// Per-output-channel weight quantization; scale has the weight's rank with ones elsewhere.
torch::Tensor fake_quant_weight(const torch::Tensor &w, const torch::Tensor &scale) {
  auto q = (w / scale).round().clamp(-127, 127) * scale;
  return w + (q - w).detach();
}

// Moving-average min/max of what flows through (a MovingAverageMinMaxObserver).
struct MinMaxObserverImpl : nn::Module {
  explicit MinMaxObserverImpl(double momentum) : momentum_(momentum) {
    min_ = register_buffer("min_val", torch::zeros({1}));
    max_ = register_buffer("max_val", torch::zeros({1}));
  }
  void observe(const torch::Tensor &x) {
    torch::NoGradGuard no_grad;
    auto lo = x.min().reshape({1}), hi = x.max().reshape({1});
    if (!seen_) {
      min_.copy_(lo);
      max_.copy_(hi);
      seen_ = true;
      return;
    }
    // FACT: b = torch.zeros(1); x = torch.randn(5, requires_grad=True); b.lerp_(x.detach().min().reshape(1), 0.01); assert not b.requires_grad and b.grad_fn is None
    min_.lerp_(lo, momentum_); // LOOKALIKE: tensor-inplace-on-leaf -- a buffer, updated under NoGradGuard
    max_.lerp_(hi, momentum_);
  }
  double momentum_;
  bool seen_ = false;
  torch::Tensor min_, max_;
};
TORCH_MODULE(MinMaxObserver);

// Observer + learnable scale for one activation tensor.
struct ActQuantImpl : nn::Module {
  explicit ActQuantImpl(double momentum) {
    obs_ = register_module("obs", MinMaxObserver(momentum));
    scale_ = register_parameter("scale", torch::ones({1}));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    if (observe_) obs_->observe(x);
    return fake_quant_ ? fake_quant_ste(x, scale_, -128, 127) : x;
  }
  // Scale from the calibrated range: symmetric, 127 steps each side.
  void init_scale_from_observer() {
    auto amax = torch::max(obs_->min_.abs(), obs_->max_.abs()).clamp_min(1e-8);
    // FACT: p = torch.nn.Parameter(torch.ones(1)); assert raises(lambda: p.copy_(torch.tensor([0.5])), "a leaf Variable that requires grad")
    scale_.copy_(amax / 127.0); // EXPECT: tensor-inplace-on-leaf -- a registered parameter written with grad mode on
  }
  bool observe_ = false, fake_quant_ = false;
  MinMaxObserver obs_{nullptr};
  torch::Tensor scale_;
};
TORCH_MODULE(ActQuant);

struct QConv2dImpl : nn::Module {
  QConv2dImpl(int64_t in, int64_t out, int64_t k, int64_t stride, double momentum) {
    conv_ = register_module("conv", nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2)));
    act_ = register_module("act", ActQuant(momentum));
  }
  // [Cout] scales: weight is [Cout, Cin, k, k].
  torch::Tensor weight_scales() const {
    const auto cout = conv_->weight.size(0);
    // FACT: w = torch.nn.Conv2d(3, 8, 3).weight; assert is_view_of(w.detach().view(8, -1), w)
    auto amax = conv_->weight.detach().view({cout, -1}).abs().amax(1); // LOOKALIKE: tensor-view-non-contiguous -- a conv weight is contiguous
    return (amax / 127.0).clamp_min(1e-8);
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto w = fake_quant_weight(conv_->weight, weight_scales().view({-1, 1, 1, 1}));
    auto y = F::conv2d(x, w, F::Conv2dFuncOptions().bias(conv_->bias).stride(conv_->options.stride()).padding(conv_->options.padding()));
    return act_(torch::hardtanh(y, 0.0, 6.0)); // ReLU6: a bounded range quantizes well
  }
  nn::Conv2d conv_{nullptr};
  ActQuant act_{nullptr};
};
TORCH_MODULE(QConv2d);

// 2x learned upsampling; a transposed conv keeps its output channels in dim 1: [Cin, Cout, k, k].
struct QUpsampleImpl : nn::Module {
  QUpsampleImpl(int64_t in, int64_t out, double momentum) {
    deconv_ = register_module("deconv", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, 2).stride(2)));
    act_ = register_module("act", ActQuant(momentum));
  }
  torch::Tensor weight_scales() const {
    const auto cout = deconv_->weight.size(1);
    // FACT: w = torch.nn.ConvTranspose2d(4, 6, 2, stride=2).weight.detach(); assert is_copy_of(w.transpose(0, 1).reshape(6, -1), w)
    auto amax = deconv_->weight.detach().transpose(0, 1).reshape({cout, -1}).abs().amax(1); // EXPECT: tensor-reshape-non-contiguous -- the whole weight is copied on every forward just to take a max per channel
    return (amax / 127.0).clamp_min(1e-8);
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto w = fake_quant_weight(deconv_->weight, weight_scales().view({1, -1, 1, 1}));
    auto y = F::conv_transpose2d(x, w, F::ConvTranspose2dFuncOptions().bias(deconv_->bias).stride(2));
    return act_(torch::hardtanh(y, 0.0, 6.0)); // ReLU6: a bounded range quantizes well
  }
  nn::ConvTranspose2d deconv_{nullptr};
  ActQuant act_{nullptr};
};
TORCH_MODULE(QUpsample);

struct QSegNetImpl : nn::Module {
  explicit QSegNetImpl(const QATConfig &cfg) {
    const auto w = cfg.width;
    const auto m = cfg.observer_momentum;
    enc1_ = register_module("enc1", QConv2d(3, w, 3, 2, m));
    enc2_ = register_module("enc2", QConv2d(w, 2 * w, 3, 2, m));
    up_ = register_module("up", QUpsample(2 * w, w, m));
    head_ = register_module("head", nn::Conv2d(nn::Conv2dOptions(w, cfg.num_classes, 1)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto y = head_(up_(enc2_(enc1_(x))));
    return F::interpolate(y, F::InterpolateFuncOptions().size(std::vector<int64_t>{x.size(2), x.size(3)}).mode(torch::kBilinear).align_corners(false));
  }
  std::vector<ActQuant> act_quants() { return {enc1_->act_, enc2_->act_, up_->act_}; }
  void set_mode(bool observe, bool fake_quant) {
    for (auto &a : act_quants()) {
      a->observe_ = observe;
      a->fake_quant_ = fake_quant;
    }
  }
  QConv2d enc1_{nullptr}, enc2_{nullptr};
  QUpsample up_{nullptr};
  nn::Conv2d head_{nullptr};
  double logit_scale_ = 1.0;
};
TORCH_MODULE(QSegNet);

// Float model in eval mode, observers on: fills the activation ranges and the logit range.
void calibrate(QSegNet &model, const std::vector<SegBatch> &loader, const QATConfig &cfg) {
  model->eval();
  model->set_mode(/*observe=*/true, /*fake_quant=*/false);
  auto logit_absmax = torch::zeros({});
  int64_t seen = 0;
  for (const auto &b : loader) {
    auto logits = model->forward(b.image);
    // FACT: import functools; m = torch.nn.Linear(3, 2); m.eval(); ema = lambda k: functools.reduce(lambda a, x: 0.95 * a + 0.05 * m(x).abs().amax(), [torch.randn(4, 3) for _ in range(k)], torch.zeros(())); assert kept_nodes(ema(4)) > kept_nodes(ema(2)) > 0
    logit_absmax = (1.0 - cfg.logit_ema) * logit_absmax + cfg.logit_ema * logits.abs().amax(); // EXPECT: tensor-graph-kept-across-iterations -- calibration runs with grad on: the average chains every batch's graph
    if (++seen == cfg.calib_batches) break;
  }
  for (auto &a : model->act_quants()) a->init_scale_from_observer();
  model->logit_scale_ = logit_absmax.item<double>() / 127.0; // LOOKALIKE: tensor-sync-in-loop -- once, after calibration
  model->set_mode(/*observe=*/false, /*fake_quant=*/true);
}

void train_qat(QSegNet &model, const std::vector<SegBatch> &loader, const QATConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto loss_sum = torch::zeros({}, device);
    int64_t steps = 0;
    for (const auto &b : loader) {
      auto logits = model->forward(b.image.to(device));
      auto loss = F::cross_entropy(logits, b.mask.to(device));
      opt.zero_grad();
      loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        for (auto &a : model->act_quants()) a->scale_.clamp_min_(1e-8); // LOOKALIKE: tensor-inplace-on-leaf -- LSQ keeps the scales positive under NoGradGuard
      }
      loss_sum += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
      ++steps;
    }
    std::cout << "epoch " << epoch << " loss " << loss_sum.item<double>() / steps << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, beside the loop of steps
  }
}

// Pixel accuracy of the fake-quantized model.
double evaluate(QSegNet &model, const std::vector<SegBatch> &loader) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->to(torch::kCUDA);
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
  int64_t total = 0;
  for (const auto &b : loader) {
    auto pred = model->forward(b.image).argmax(1); // EXPECT: tensor-device-mismatch -- the model moved to the GPU, the images did not
    correct += pred.eq(b.mask.to(pred.device())).sum(); // LOOKALIKE: tensor-device-mismatch -- the labels follow the prediction's device
    total += b.mask.numel();
  }
  return correct.item<double>() / double(total);
}

struct Int8Layer {
  std::string name;
  torch::Tensor qweight; // int8, same shape as the float weight
  torch::Tensor scales;  // float32 per output channel
  torch::Tensor qbias;   // int32, bias / (input scale * weight scale)
};

Int8Layer export_conv(const std::string &name, QConv2d &layer, double in_scale) {
  auto s = layer->weight_scales();
  auto w = layer->conv_->weight.detach();
  // FACT: c = torch.nn.Conv2d(3, 4, 3); w = c.weight.detach(); w.div_(0.01).round_(); assert shares_storage(w, c.weight) and torch.equal(c.weight.detach(), c.weight.detach().round())
  w.div_(s.view({-1, 1, 1, 1})).round_().clamp_(-127, 127); // EXPECT: tensor-inplace-on-detached -- the model's float weights are replaced by their int8 codes
  auto qbias = torch::zeros({s.size(0)}, torch::kInt);
  // FACT: q = torch.zeros(3, dtype=torch.int32); q.copy_(torch.tensor([2.7, -1.6, 0.9])); assert q.tolist() == [2, -1, 0]
  qbias.copy_(layer->conv_->bias.detach() / (in_scale * s)); // EXPECT: tensor-copy-narrowing -- truncated toward zero instead of rounded
  return {name, w.to(torch::kChar), s, qbias};
}

Int8Layer export_upsample(const std::string &name, QUpsample &layer, double in_scale) {
  auto s = layer->weight_scales();
  auto w = layer->deconv_->weight.detach().clone();  // EXPECT: tensor-unnecessary-clone -- rewritten in place at once: weight.detach().div(...) makes the same tensor in one pass
  // FACT: c = torch.nn.ConvTranspose2d(3, 4, 2); w = c.weight.detach().clone(); w.div_(0.01).round_(); assert is_copy_of(w, c.weight)
  w.div_(s.view({1, -1, 1, 1})).round_().clamp_(-127, 127); // LOOKALIKE: tensor-inplace-on-detached -- an owned copy
  auto qbias = torch::zeros({s.size(0)}, torch::kInt);
  // FACT: q = torch.zeros(3, dtype=torch.int32); q.copy_(torch.tensor([2.7, -1.6, 0.9]).round().to(torch.int32)); assert q.tolist() == [3, -2, 1]
  qbias.copy_(torch::round(layer->deconv_->bias.detach() / (in_scale * s)).to(torch::kInt)); // LOOKALIKE: tensor-copy-narrowing -- rounded, then converted explicitly
  return {name, w.to(torch::kChar), s, qbias};
}
