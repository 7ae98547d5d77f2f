// Barlow Twins self-supervised pretraining: two augmented views of each image go through a
// ResNet-style encoder and an MLP projector; the loss drives the cross-correlation matrix of the
// two embeddings towards the identity. LARS is written out by hand, as in the reference code.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <vector>

namespace F = torch::nn::functional;

struct BTConfig {
  int64_t batch_size = 256, image_size = 96, epochs = 100, steps_per_epoch = 400;
  int64_t width = 64, proj_dim = 1024, max_shift = 4, log_every = 50, warmup_epochs = 10;
  double lambd = 0.0051, lr_weights = 0.2, lr_biases = 0.0048;
  double weight_decay = 1.5e-6, momentum = 0.9, eta = 0.001;
};

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(out));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      down = register_module("down", torch::nn::Sequential(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
          torch::nn::BatchNorm2d(out)));
    }
    torch::nn::init::kaiming_normal_(conv1->weight, 0.0, torch::kFanOut, torch::kReLU);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions write under NoGradGuard
    torch::nn::init::kaiming_normal_(conv2->weight, 0.0, torch::kFanOut, torch::kReLU);
    bn2->weight.zero_();  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    // FACT: (lambda x, bn: not backward_fails(lambda: (lambda o: (o.add_(x), torch.relu(o).sum().backward()))(bn(x))))(torch.randn(4, 3, requires_grad=True), torch.nn.BatchNorm1d(3))
    out += down.is_empty() ? x : down->forward(x);  // LOOKALIKE: tensor-inplace-on-saved -- batch_norm saves its input and statistics, not its output
    return torch::relu(out);
  }

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential down{nullptr};
};
TORCH_MODULE(BasicBlock);

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(int64_t w) {
    stem = register_module("stem", torch::nn::Sequential(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(3, w, 3).padding(1).bias(false)),
        torch::nn::BatchNorm2d(w), torch::nn::ReLU()));
    int64_t in = w;
    for (int64_t mult : {1, 2, 4, 8}) {
      stages->push_back(BasicBlock(in, w * mult, mult == 1 ? 1 : 2));
      in = w * mult;
    }
    register_module("stages", stages);
    out_dim = in;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return F::adaptive_avg_pool2d(stages->forward(stem->forward(x)), F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
  }
  torch::nn::Sequential stem{nullptr}, stages;
  int64_t out_dim = 0;
};
TORCH_MODULE(Encoder);

struct BarlowTwinsImpl : torch::nn::Module {
  explicit BarlowTwinsImpl(const BTConfig& c) {
    backbone = register_module("backbone", Encoder(c.width));
    const auto d = c.proj_dim;
    projector = register_module("projector", torch::nn::Sequential(
        torch::nn::Linear(torch::nn::LinearOptions(backbone->out_dim, d).bias(false)),
        torch::nn::BatchNorm1d(d), torch::nn::ReLU(),
        torch::nn::Linear(torch::nn::LinearOptions(d, d).bias(false)),
        torch::nn::BatchNorm1d(d), torch::nn::ReLU(),
        torch::nn::Linear(torch::nn::LinearOptions(d, d).bias(false))));
  }
  torch::Tensor forward(const torch::Tensor& x) { return projector->forward(backbone->forward(x)); }
  Encoder backbone{nullptr};
  torch::nn::Sequential projector{nullptr};
};
TORCH_MODULE(BarlowTwins);

torch::Tensor off_diagonal(const torch::Tensor& x) {
  const auto n = x.size(0);
  // FACT: (lambda c: is_view_of(c.flatten()[:-1].view(3, 5), c))(torch.randn(4, 4))
  // FACT: (lambda c: is_copy_of(c.flatten()[:-1].view(3, 5)[:, 1:].flatten(), c))(torch.randn(4, 4))
  auto rows = x.flatten().narrow(0, 0, n * n - 1).view({n - 1, n + 1});  // LOOKALIKE: tensor-view-non-contiguous, tensor-reshape-non-contiguous -- c is contiguous, flatten and the prefix view share its storage
  return rows.narrow(1, 1, n).flatten();  // EXPECT: tensor-reshape-non-contiguous
}

// Feature-wise standardisation over the batch (the paper's pseudo-code instead of an affine-free BN).
torch::Tensor standardize(const torch::Tensor& z) {
  return z.clone().sub_(z.mean(0)).div_(z.std({0}, /*unbiased=*/false) + 1e-5);  // EXPECT: tensor-unnecessary-clone
}

torch::Tensor barlow_loss(const torch::Tensor& z1, const torch::Tensor& z2, double lambd,
                          torch::Tensor* on_diag_out) {
  auto c = standardize(z1).t().mm(standardize(z2));
  // FACT: (lambda a, b: not backward_fails(lambda: (lambda c: (c.div_(8), c.sum().backward()))(a.t().mm(b))))(torch.randn(8, 4, requires_grad=True), torch.randn(8, 4, requires_grad=True))
  c.div_(z1.size(0));  // LOOKALIKE: tensor-inplace-on-saved -- mm saves its operands, not its result
  // FACT: (lambda c: (lambda before: (torch.diagonal(c).add_(-1), torch.equal(before, c.flatten()[:-1].view(3, 5)[:, 1:].flatten()))[1])(c.flatten()[:-1].view(3, 5)[:, 1:].flatten()))(torch.randn(4, 4))
  // FACT: (lambda a: not backward_fails(lambda: (lambda c: (torch.diagonal(c).add_(-1).pow_(2).sum() + c.flatten()[:-1].view(3, 5)[:, 1:].flatten().pow_(2).sum()).backward())(a.t().mm(a))))(torch.randn(8, 4, requires_grad=True))
  auto on_diag = torch::diagonal(c).add_(-1).pow_(2).sum();  // LOOKALIKE: tensor-alias-then-mutate, tensor-inplace-on-saved -- only the diagonal of c is rewritten and off_diagonal never reads it; nothing saved c
  auto off_diag = off_diagonal(c).pow_(2).sum();
  if (on_diag_out) *on_diag_out = on_diag.detach();
  return on_diag + lambd * off_diag;
}

// On-device augmentation of a whole batch: crop+resize, flip, colour, grayscale, small shift.
struct Augment {
  Augment(const BTConfig& c, torch::Device device, uint64_t seed) : cfg(c), rng(seed) {
    auto k = torch::tensor({1.f, 4.f, 6.f, 4.f, 1.f}) / 16.0;
    blur_kernel = (k.view({5, 1}) * k.view({1, 5})).expand({3, 1, 5, 5}).contiguous().to(device);
  }

  static void translate_(torch::Tensor& v, int64_t dy, int64_t dx) {
    const auto H = v.size(2), W = v.size(3);
    if (dy > 0) {
      // FACT: (lambda v, r: (v.narrow(2, 2, 6).copy_(v.narrow(2, 0, 6).clone()), torch.equal(v[:, :, 2:], r[:, :, :6]))[1])(torch.arange(384.).view(2, 3, 8, 8), torch.arange(384.).view(2, 3, 8, 8))
      v.narrow(2, dy, H - dy).copy_(v.narrow(2, 0, H - dy).clone());  // LOOKALIKE: tensor-inplace-overlap, tensor-unnecessary-clone -- the overlapping source is cloned first; that clone is what makes the shift correct
      v.narrow(2, 0, dy).zero_();
    }
    if (dx > 0) {
      // FACT: (lambda v, r: (v.narrow(3, 2, 6).copy_(v.narrow(3, 0, 6)), not torch.equal(v[..., 2:], r[..., :6]))[1])(torch.arange(384.).view(2, 3, 8, 8), torch.arange(384.).view(2, 3, 8, 8))
      v.narrow(3, dx, W - dx).copy_(v.narrow(3, 0, W - dx));  // EXPECT: tensor-inplace-overlap
      v.narrow(3, 0, dx).zero_();
    }
  }

  torch::Tensor view(const torch::Tensor& imgs, double blur_p) {
    const auto B = imgs.size(0), H = imgs.size(2), S = cfg.image_size;
    std::uniform_real_distribution<double> scale(0.35, 1.0);
    std::uniform_int_distribution<int64_t> shift(0, cfg.max_shift);
    const auto side = static_cast<int64_t>(H * std::sqrt(scale(rng)));
    std::uniform_int_distribution<int64_t> pos(0, H - side);
    std::vector<torch::Tensor> crops;
    for (int64_t i = 0; i < B; ++i) crops.push_back(imgs[i].narrow(1, pos(rng), side).narrow(2, pos(rng), side));
    auto v = F::interpolate(torch::stack(crops), F::InterpolateFuncOptions()
                                                     .size(std::vector<int64_t>{S, S})
                                                     .mode(torch::kBilinear).align_corners(false));
    auto opts = v.options();
    v = torch::where(torch::rand({B, 1, 1, 1}, opts) < 0.5, v.flip({3}), v);
    v.mul_(torch::empty({B, 1, 1, 1}, opts).uniform_(0.6, 1.4));  // LOOKALIKE: tensor-device-mismatch -- the jitter factors are built with the batch's options
    auto luma = torch::tensor({0.299f, 0.587f, 0.114f}).view({1, 3, 1, 1});
    auto gray = (v * luma).sum(1, true);  // EXPECT: tensor-device-mismatch
    v = torch::where(torch::rand({B, 1, 1, 1}, opts) < 0.2, gray.expand_as(v), v);
    if (std::bernoulli_distribution(blur_p)(rng)) {
      v = F::conv2d(v, blur_kernel, F::Conv2dFuncOptions().padding(2).groups(3));
    }
    translate_(v, shift(rng), shift(rng));
    return v.clamp(0.0, 1.0);
  }

  BTConfig cfg;
  std::mt19937_64 rng;
  torch::Tensor blur_kernel;
};

class LARS {
 public:
  LARS(std::vector<torch::Tensor> params, const BTConfig& c) : params_(std::move(params)), cfg_(c) {
    mu_.resize(params_.size());
  }

  void zero_grad() {
    for (auto& p : params_)
      if (p.grad().defined()) p.grad().zero_();  // LOOKALIKE: tensor-inplace-on-detached -- clearing the gradient buffer is meant to write it
  }

  // Biases and BN parameters (1-d) skip weight decay and the trust ratio.
  void step(double lr_weights, double lr_biases) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      auto dp = p.grad();
      if (!dp.defined()) continue;
      const bool adapt = p.dim() > 1;
      if (adapt) {
        dp = dp.add(p, cfg_.weight_decay);
        auto pn = p.norm(), un = dp.norm();
        auto one = torch::ones_like(pn);
        dp = dp.mul(torch::where(pn > 0, torch::where(un > 0, cfg_.eta * pn / un, one), one));
      }
      auto& mu = mu_[i];
      // FACT: (lambda g: (lambda mu: (mu.mul_(0.9).add_(g), shares_storage(mu, g) and g[0].item() != 1.0)[1])(g))(torch.ones(3))
      if (!mu.defined()) mu = dp;
      else mu.mul_(cfg_.momentum).add_(dp);  // EXPECT: tensor-alias-then-mutate
      p.add_(mu, adapt ? -lr_weights : -lr_biases);  // LOOKALIKE: tensor-inplace-on-leaf -- the update runs under NoGradGuard
    }
  }

 private:
  std::vector<torch::Tensor> params_, mu_;
  BTConfig cfg_;
};

double lr_scale(const BTConfig& c, int64_t step) {
  const double warm = c.warmup_epochs * c.steps_per_epoch, total = c.epochs * c.steps_per_epoch;
  if (step < warm) return step / warm;
  return 0.5 * (1.0 + std::cos(M_PI * (step - warm) / (total - warm))) * 0.999 + 0.001;
}

// Weighted kNN on backbone features: a cheap progress signal while pretraining.
double knn_top1(Encoder& enc, const torch::Tensor& bank_x, const torch::Tensor& bank_y,
                const torch::Tensor& test_x, const torch::Tensor& test_y, int64_t classes,
                torch::Device device) {
  torch::NoGradGuard no_grad;
  enc->eval();
  auto bank = F::normalize(enc->forward(bank_x.to(device)), F::NormalizeFuncOptions().dim(1));
  auto bank_labels = bank_y.to(device), labels = test_y.to(device);
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t s = 0; s < test_x.size(0); s += 128) {
    const auto n = std::min<int64_t>(128, test_x.size(0) - s);
    auto f = F::normalize(enc->forward(test_x.narrow(0, s, n).to(device)), F::NormalizeFuncOptions().dim(1));
    auto sim = f.mm(bank.t().contiguous());  // EXPECT: tensor-clone-in-loop
    auto top = sim.topk(20, 1);
    auto votes = torch::zeros({n, classes}, f.options())
                     .scatter_add_(1, bank_labels.take(std::get<1>(top)), std::get<0>(top).div(0.07).exp());
    correct += votes.argmax(1).eq(labels.narrow(0, s, n)).sum();
  }
  enc->train();
  return correct.item<double>() / static_cast<double>(test_x.size(0));
}

int main() {
  BTConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  torch::manual_seed(0);

  BarlowTwins model(cfg);
  model->to(device);
  LARS opt(model->parameters(), cfg);
  Augment aug(cfg, device, 17);

  // stand-ins for the unlabeled split and a small labeled monitor split
  auto bank_x = torch::rand({512, 3, cfg.image_size, cfg.image_size});
  auto bank_y = torch::randint(0, 10, {512}, torch::kLong);
  auto test_x = torch::rand({256, 3, cfg.image_size, cfg.image_size});
  auto test_y = torch::randint(0, 10, {256}, torch::kLong);

  auto preview = torch::zeros({8, 3, cfg.image_size, cfg.image_size}, torch::kUInt8);
  std::vector<torch::Tensor> epoch_losses;
  int64_t global_step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    double on_diag_sum = 0.0;
    for (int64_t step = 0; step < cfg.steps_per_epoch; ++step, ++global_step) {
      auto imgs = torch::rand({cfg.batch_size, 3, 112, 112}).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto v1 = aug.view(imgs, 1.0), v2 = aug.view(imgs, 0.1);

      torch::Tensor on_diag;
      auto loss = barlow_loss(model->forward(v1), model->forward(v2), cfg.lambd, &on_diag);
      opt.zero_grad();
      loss.backward();
      const double scale = lr_scale(cfg, global_step);
      opt.step(cfg.lr_weights * scale, cfg.lr_biases * scale);

      epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      on_diag_sum += on_diag.item<double>();  // EXPECT: tensor-sync-in-loop
      if (step % cfg.log_every == 0) {
        preview.copy_(v1.narrow(0, 0, 8).mul(255));  // EXPECT: tensor-copy-narrowing
        torch::save(preview, "views_preview.pt");
      }
    }
    auto mean_loss = torch::stack(epoch_losses).mean().item<double>();
    std::cout << "epoch " << epoch << " loss " << mean_loss << " on-diag "
              << on_diag_sum / cfg.steps_per_epoch << " knn@1 "
              << knn_top1(model->backbone, bank_x, bank_y, test_x, test_y, 10, device) << '\n';
    epoch_losses.clear();
  }
  torch::save(model->backbone, "barlow_resnet.pt");
  return 0;
}
