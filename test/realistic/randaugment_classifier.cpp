// RandAugment on GPU-resident image batches: for every sample, N ops are drawn
// from the policy (rotate, shear, translate, posterize, solarize, colour
// jitter) at a global magnitude M, and the augmented batch feeds a small
// conv + token-mixing classifier trained with label smoothing.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

namespace {

struct TrainConfig {
  int64_t num_ops = 2;
  int64_t magnitude = 9;
  int64_t num_bins = 31;
  int64_t num_classes = 10;
  int64_t width = 128;
  int64_t train_size = 8192;
  int64_t val_size = 2048;
  int64_t val_subset = 1024;
  int64_t batch_size = 128;
  int64_t epochs = 30;
  int64_t log_every = 20;
  double lr = 0.1;
  double label_smoothing = 0.1;
  double max_head_norm = 3.0;
};

enum AugOp : int64_t {
  kIdentity, kRotate, kShearX, kTranslateX, kTranslateY,
  kPosterize, kSolarize, kBrightness, kContrast, kSaturation, kNumOps
};

torch::Tensor rotate(const torch::Tensor& img, double degrees) {
  const double rad = degrees * M_PI / 180.0;
  auto theta = torch::tensor({std::cos(rad), -std::sin(rad), 0.0, std::sin(rad), std::cos(rad), 0.0},
                             torch::kFloat).view({1, 2, 3});
  auto grid = F::affine_grid(theta, {1, img.size(0), img.size(1), img.size(2)});
  return F::grid_sample(img.unsqueeze(0), grid, F::GridSampleFuncOptions().align_corners(false))[0];  // EXPECT: tensor-device-mismatch
}

torch::Tensor shear_x(const torch::Tensor& img, double shear) {
  auto theta = torch::tensor({1.0, shear, 0.0, 0.0, 1.0, 0.0}, img.options()).view({1, 2, 3});
  auto grid = F::affine_grid(theta, {1, img.size(0), img.size(1), img.size(2)});
  return F::grid_sample(img.unsqueeze(0), grid, F::GridSampleFuncOptions().align_corners(false))[0];
}

// Shift right by `shift` pixels, black fill on the left.
torch::Tensor translate_x(const torch::Tensor& img, int64_t shift) {
  const int64_t w = img.size(2);
  auto out = img.clone();  // LOOKALIKE: tensor-unnecessary-clone -- out is the returned image and must not be the caller's tensor; zeros_like would allocate just the same
  // FACT: x = torch.arange(16.).view(1, 2, 8); ref = x[..., :6].clone(); x.narrow(2, 2, 6).copy_(x.narrow(2, 0, 6)); assert shares_storage(x.narrow(2, 2, 6), x) and not torch.equal(x[..., 2:], ref)
  out.narrow(2, shift, w - shift).copy_(out.narrow(2, 0, w - shift));  // EXPECT: tensor-inplace-overlap
  out.narrow(2, 0, shift).zero_();
  return out;
}

// Shift down by `shift` pixels, black fill on top.
torch::Tensor translate_y(const torch::Tensor& img, int64_t shift) {
  const int64_t h = img.size(1);
  auto out = torch::zeros_like(img);
  // FACT: x = torch.arange(48.).view(3, 4, 4); o = torch.zeros_like(x); o.narrow(1, 1, 3).copy_(x.narrow(1, 0, 3)); assert is_copy_of(o, x) and torch.equal(o[:, 1:], x[:, :3])
  out.narrow(1, shift, h - shift).copy_(img.narrow(1, 0, h - shift));  // LOOKALIKE: tensor-inplace-overlap -- reads img and writes a separate zeros_like buffer
  return out;
}

torch::Tensor posterize(const torch::Tensor& img, int64_t bits) {
  auto q = torch::empty(img.sizes(), img.options().dtype(torch::kUInt8));
  // FACT: q = torch.empty(4, dtype=torch.uint8); q.copy_(torch.tensor([0.2, 0.7, 1.9, 254.99])); assert q.tolist() == [0, 0, 1, 254]
  q.copy_(img * 255.0);  // EXPECT: tensor-copy-narrowing
  q.bitwise_and_(static_cast<int64_t>((0xFF << (8 - bits)) & 0xFF));
  auto out = q.to(torch::kFloat);
  // FACT: q = torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8); o = q.to(torch.float32); o.div_(255); assert is_copy_of(o, q)
  return out.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- q is uint8, so to(kFloat) had to allocate
}

torch::Tensor solarize(const torch::Tensor& img, double threshold) {
  return torch::where(img >= threshold, 1.0 - img, img);
}

torch::Tensor grayscale(const torch::Tensor& img) {
  auto lum = torch::tensor({0.299, 0.587, 0.114}, img.options());
  // FACT: x = torch.rand(3, 4, 4); v = x.permute(1, 2, 0).view(-1, 3); assert is_view_of(v, x)
  auto gray = img.permute({1, 2, 0}).view({-1, 3}).matmul(lum);  // LOOKALIKE: tensor-view-non-contiguous -- H and W keep their order after the permute, so they merge and view() works
  return gray.view({1, img.size(1), img.size(2)});
}

torch::Tensor brightness(const torch::Tensor& img, double factor) {
  return (img * factor).clamp_(0.0, 1.0);
}

torch::Tensor contrast(const torch::Tensor& img, double factor) {
  auto mean = grayscale(img).mean();
  auto out = img * factor;
  // FACT: x = torch.rand(3, 4, 4); m = x.mean(); o = x * 0.5; o.add_(m.expand_as(o), alpha=0.5); assert is_copy_of(o, x)
  return out.add_(mean.expand_as(out), 1.0 - factor).clamp_(0.0, 1.0);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded mean is only read; the write goes into out
}

torch::Tensor saturation(const torch::Tensor& img, double factor) {
  auto gray = grayscale(img).expand_as(img);
  // FACT: g = torch.rand(1, 4, 4).expand(3, 4, 4); assert raises(lambda: g.mul_(0.5), "single memory location")
  return gray.mul_(1.0 - factor).add_(img, factor).clamp_(0.0, 1.0);  // EXPECT: tensor-inplace-on-expanded
}

class RandAugment {
 public:
  RandAugment(int64_t num_ops, int64_t magnitude, int64_t num_bins)
      : num_ops_(num_ops), level_(static_cast<double>(magnitude) / (num_bins - 1)) {}

  torch::Tensor apply(torch::Tensor img) const {
    for (int64_t k = 0; k < num_ops_; ++k) {
      const auto op = torch::randint(kNumOps, {1}).item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- a CPU tensor, item() waits for no device
      const double sign = torch::randint(2, {1}).item<int64_t>() == 0 ? -1.0 : 1.0;
      img = apply_op(img, op, sign);
    }
    return img;
  }

 private:
  torch::Tensor apply_op(const torch::Tensor& img, int64_t op, double sign) const {
    const int64_t max_shift = static_cast<int64_t>(0.45 * level_ * img.size(2));
    switch (op) {
      case kRotate: return rotate(img, sign * 30.0 * level_);
      case kShearX: return shear_x(img, sign * 0.3 * level_);
      case kTranslateX: return max_shift > 0 ? translate_x(img, max_shift) : img;
      case kTranslateY: return max_shift > 0 ? translate_y(img, max_shift) : img;
      case kPosterize: return posterize(img, 8 - static_cast<int64_t>(4 * level_));
      case kSolarize: return solarize(img, 1.0 - level_);
      case kBrightness: return brightness(img, 1.0 + sign * 0.9 * level_);
      case kContrast: return contrast(img, 1.0 + sign * 0.9 * level_);
      case kSaturation: return saturation(img, 1.0 + sign * 0.9 * level_);
      default: return img;
    }
  }

  int64_t num_ops_;
  double level_;
};

struct ConvBnReluImpl : torch::nn::Module {
  ConvBnReluImpl(int64_t in, int64_t out, int64_t stride)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3)
                                                           .stride(stride).padding(1).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(out))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = bn(conv(x));
    // FACT: bn = torch.nn.BatchNorm2d(4); y = bn(torch.randn(2, 4, 3, 3, requires_grad=True)); y.relu_(); y.sum().backward(); assert bn.weight.grad is not None
    return y.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- batch norm saves its input, not its output; relu_ then saves its own result
  }

  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(ConvBnRelu);

struct HybridClassifierImpl : torch::nn::Module {
  HybridClassifierImpl(int64_t classes, int64_t width)
      : stem(register_module("stem", ConvBnRelu(3, width / 2, 1))),
        down1(register_module("down1", ConvBnRelu(width / 2, width, 2))),
        down2(register_module("down2", ConvBnRelu(width, width, 2))),
        token_norm(register_module("token_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        token_mlp(register_module("token_mlp", torch::nn::Linear(width, width))),
        head(register_module("head", torch::nn::Linear(width, classes))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto f = down2(down1(stem(x)));
    const int64_t n = f.size(0);
    const int64_t c = f.size(1);
    auto tokens = f.flatten(2).transpose(1, 2);
    // FACT: f = torch.randn(2, 8, 4, 4); t = f.flatten(2).transpose(1, 2); assert is_copy_of(t.reshape(-1, 8), f)
    auto flat = tokens.reshape({-1, c});  // EXPECT: tensor-reshape-non-contiguous
    auto mixed = flat + token_mlp(torch::gelu(token_norm(flat)));
    return head(mixed.view({n, -1, c}).mean(1));
  }

  ConvBnRelu stem, down1, down2;
  torch::nn::LayerNorm token_norm;
  torch::nn::Linear token_mlp, head;
};
TORCH_MODULE(HybridClassifier);

}  // namespace

int main() {
  TORCH_CHECK(torch::cuda::is_available(), "augmentation and training run on the GPU");
  const torch::Device device(torch::kCUDA);
  torch::manual_seed(0);
  TrainConfig cfg;

  // The whole (synthetic) dataset lives on the device; augmentation runs there too.
  const auto opts = torch::TensorOptions().device(device);
  auto train_images = torch::rand({cfg.train_size, 3, 32, 32}, opts);
  auto train_labels = torch::randint(cfg.num_classes, {cfg.train_size}, opts.dtype(torch::kLong));
  auto val_images = torch::rand({cfg.val_size, 3, 32, 32}, opts);
  auto val_labels = torch::randint(cfg.num_classes, {cfg.val_size}, opts.dtype(torch::kLong));

  const auto pixel_mean = torch::tensor({0.4914, 0.4822, 0.4465}, torch::kFloat).view({3, 1, 1});
  const auto pixel_std = torch::tensor({0.2470, 0.2435, 0.2616}, torch::kFloat).view({3, 1, 1});
  auto normalize = [&](const torch::Tensor& x) {
    return (x - pixel_mean.to(x.device())) / pixel_std.to(x.device());  // EXPECT: tensor-clone-in-loop
  };

  HybridClassifier model(cfg.num_classes, cfg.width);
  model->to(device);
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(cfg.lr).momentum(0.9).nesterov(true).weight_decay(5e-4));
  const RandAugment policy(cfg.num_ops, cfg.magnitude, cfg.num_bins);

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto epoch_loss = torch::zeros({}, opts);
    int64_t correct = 0;
    int64_t step = 0;
    for (int64_t start = 0; start + cfg.batch_size <= cfg.train_size; start += cfg.batch_size, ++step) {
      auto images = train_images.narrow(0, start, cfg.batch_size);
      auto y = train_labels.narrow(0, start, cfg.batch_size);
      for (int64_t k = 0; k < cfg.batch_size; ++k) {
        // FACT: d = torch.rand(6, 3, 4, 4); b = d.narrow(0, 2, 3); b[0].copy_(torch.zeros(3, 4, 4)); assert is_view_of(b, d) and d[2].sum() == 0
        images[k].copy_(policy.apply(images[k]));  // EXPECT: tensor-alias-then-mutate
      }

      auto logits = model->forward(normalize(images));
      auto log_probs = torch::log_softmax(logits, 1);
      const double eps = cfg.label_smoothing;
      auto targets = torch::full({cfg.batch_size, cfg.num_classes}, eps / cfg.num_classes, opts)
                         .scatter_(1, y.unsqueeze(1), 1.0 - eps + eps / cfg.num_classes);
      auto loss = -(targets * log_probs).sum(1).mean();

      if (step % cfg.log_every == 0) {
        // FACT: w = torch.randn(4, 3, requires_grad=True); lp = torch.log_softmax(torch.randn(2, 4) @ w, 1); loss = -(torch.rand(2, 3) * lp).sum(1).mean(); p = lp.detach(); p.exp_(); assert backward_fails(loss.backward)
        auto probs = log_probs.detach();
        probs.exp_();  // EXPECT: tensor-inplace-on-detached
        std::cout << "epoch " << epoch << " step " << step << " mean confidence "
                  << std::get<0>(probs.max(1)).mean().item<double>() << "\n";
      }

      opt.zero_grad();
      loss.backward();
      opt.step();
      model->head->weight.detach().renorm_(2, 0, cfg.max_head_norm);  // LOOKALIKE: tensor-inplace-on-detached -- a max-norm constraint meant to rewrite the weight, after step() and before the next forward

      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      correct += (logits.argmax(1) == y).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    }

    torch::NoGradGuard no_grad;
    model->eval();
    auto subset = torch::randperm(cfg.val_size).narrow(0, 0, cfg.val_subset);
    auto vx = val_images.index({subset});  // LOOKALIKE: tensor-device-mismatch -- advanced indexing moves CPU indices to the indexed tensor's device
    auto vy = val_labels.index({subset});
    auto val_loss = torch::zeros({}, opts);
    auto val_correct = torch::zeros({}, opts.dtype(torch::kLong));
    for (int64_t s = 0; s < cfg.val_subset; s += cfg.batch_size) {
      const int64_t len = std::min(cfg.batch_size, cfg.val_subset - s);
      auto out = model->forward(normalize(vx.narrow(0, s, len)));
      val_loss += F::cross_entropy(out, vy.narrow(0, s, len));  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard nothing records a graph
      val_correct += (out.argmax(1) == vy.narrow(0, s, len)).sum();
    }
    const double batches = std::ceil(static_cast<double>(cfg.val_subset) / cfg.batch_size);
    std::cout << "epoch " << epoch << " train loss " << epoch_loss.item<double>() / step
              << " train acc " << static_cast<double>(correct) / (step * cfg.batch_size)
              << " val loss " << val_loss.item<double>() / batches
              << " val acc " << val_correct.item<double>() / cfg.val_subset << "\n";
  }
  return 0;
}
