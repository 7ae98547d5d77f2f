// CIFAR-100-LT training with batch-level augmentation: random pad-and-crop with the dataset's mean
// colour, then per batch either mixup (Zhang et al. 2018) or CutMix (Yun et al. 2019), pairing
// sample i with sample B - 1 - i as timm does. Targets are label-smoothed one-hot rows blended
// with the same lambda; the loss is a class-balanced soft-target cross entropy. An EMA copy of
// the weights is kept for evaluation.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace nn = torch::nn;

struct AugConfig {
  double mixup_alpha = 0.2, cutmix_alpha = 1.0, switch_prob = 0.5, mix_prob = 1.0, label_smoothing = 0.1;
  int64_t n_classes = 100, pad = 4, epochs = 200, batch_size = 128, width = 64;
  int64_t preview_every = 2000, log_every = 100, smooth_window = 50;
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4, ema_decay = 0.999;
  std::vector<double> mean = {0.5071, 0.4865, 0.4409}, stdev = {0.2673, 0.2564, 0.2762};
};

double sample_beta(double alpha, std::mt19937 &rng) {
  std::gamma_distribution<double> g(alpha, 1.0);
  const double a = g(rng), b = g(rng);
  return a / (a + b);
}

struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(out));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2_ = register_module("bn2", nn::BatchNorm2d(out));
    if (stride != 1 || in != out)
      shortcut_ = register_module("shortcut", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)), nn::BatchNorm2d(out)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto out = bn2_(conv2_(torch::relu(bn1_(conv1_(x)))));
    // FACT: bn = torch.nn.BatchNorm2d(4); c = torch.nn.Conv2d(4, 4, 3, padding=1); x = torch.randn(2, 4, 5, 5, requires_grad=True); o = bn(c(x)); o += x; torch.relu(o).sum().backward(); assert x.grad is not None
    out += shortcut_.is_empty() ? x : shortcut_->forward(x); // LOOKALIKE: tensor-inplace-on-saved -- BatchNorm saves its input, not its output (ResNet's order)
    return torch::relu(out);
  }
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(BasicBlock);

struct SmallResNetImpl : nn::Module {
  SmallResNetImpl(int64_t n_classes, int64_t width) {
    stem_ = register_module("stem", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, width, 3).padding(1).bias(false)), nn::BatchNorm2d(width), nn::ReLU()));
    int64_t in = width;
    for (int64_t stage = 0; stage < 3; ++stage) {
      const int64_t out = width << stage;
      blocks_->push_back(BasicBlock(in, out, stage == 0 ? 1 : 2));
      blocks_->push_back(BasicBlock(out, out, 1));
      in = out;
    }
    register_module("blocks", blocks_);
    fc_ = register_module("fc", nn::Linear(in, n_classes));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto pooled = torch::adaptive_avg_pool2d(blocks_->forward(stem_->forward(x)), {1, 1});
    // FACT: p = torch.nn.functional.adaptive_avg_pool2d(torch.randn(2, 8, 4, 4), 1); assert is_view_of(p.flatten(1), p)
    return fc_(pooled.flatten(1)); // LOOKALIKE: tensor-reshape-non-contiguous -- the pooled [B, C, 1, 1] map is contiguous: a view
  }
  nn::Sequential stem_{nullptr}, blocks_;
  nn::Linear fc_{nullptr};
};
TORCH_MODULE(SmallResNet);

// Images in [0, 1] as [N, 3, 32, 32] float, labels [N] int64.
struct ImageTensors : torch::data::datasets::Dataset<ImageTensors> {
  ImageTensors(torch::Tensor images, torch::Tensor labels) : images_(std::move(images)), labels_(std::move(labels)) {}
  torch::data::Example<> get(size_t i) override { return {images_[i], labels_[i]}; }
  torch::optional<size_t> size() const override { return labels_.size(0); }
  torch::Tensor images_, labels_;
};

struct MixResult {
  torch::Tensor images, soft_targets;
  double lam;
};

class BatchMixer {
 public:
  BatchMixer(const AugConfig &cfg, uint64_t seed) : cfg_(cfg), rng_(seed) {
    mean_ = torch::tensor(cfg.mean, torch::dtype(torch::kFloat));
    stdev_ = torch::tensor(cfg.stdev, torch::dtype(torch::kFloat));
  }
  const torch::Tensor &mean() const { return mean_; }
  const torch::Tensor &stdev() const { return stdev_; }

  // Pad by cfg.pad on every side with the mean colour, one random crop for the batch, flip half the time.
  torch::Tensor pad_crop_flip(const torch::Tensor &images) {
    const auto B = images.size(0), C = images.size(1), H = images.size(2), W = images.size(3), p = cfg_.pad;
    auto canvas = mean_.view({1, C, 1, 1}).expand({B, C, H + 2 * p, W + 2 * p});
    // FACT: m = torch.tensor([0.5, 0.4, 0.3]); c = m.view(1, 3, 1, 1).expand(2, 3, 8, 8); x = torch.rand(2, 3, 4, 4); assert raises(lambda: c.narrow(2, 2, 4).narrow(3, 2, 4).copy_(x), "more than one element of the written-to tensor")
    canvas.narrow(2, p, H).narrow(3, p, W).copy_(images); // EXPECT: tensor-inplace-on-expanded -- the canvas is one pixel per channel broadcast over B, H and W: PyTorch refuses the copy
    std::uniform_int_distribution<int64_t> shift(0, 2 * p);
    const auto dy = shift(rng_), dx = shift(rng_);
    auto crop = canvas.narrow(2, dy, H).narrow(3, dx, W);
    return uni_(rng_) < 0.5 ? crop.flip(3) : crop.contiguous();
  }

  void normalize_(torch::Tensor &x) const {
    // FACT: x = torch.rand(2, 3, 4, 4); m = torch.tensor([0.5, 0.4, 0.3]); x0 = x.clone(); x.sub_(m.view(1, -1, 1, 1).expand_as(x)); assert torch.allclose(x, x0 - m.view(1, -1, 1, 1))
    x.sub_(mean_.view({1, -1, 1, 1}).expand_as(x)).div_(stdev_.view({1, -1, 1, 1})); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded mean is only read; x has memory of its own
  }

  torch::Tensor smooth_one_hot(const torch::Tensor &labels) const {
    const double off = cfg_.label_smoothing / static_cast<double>(cfg_.n_classes);
    auto t = torch::full({labels.size(0), cfg_.n_classes}, off);
    // FACT: t = torch.full((4, 10), 0.01); t.scatter_(1, torch.tensor([1, 2, 3, 4]).unsqueeze(1), 0.9); assert bool((t.sum(1) > 0.9).all())
    t.scatter_(1, labels.unsqueeze(1), 1.0 - cfg_.label_smoothing + off); // LOOKALIKE: tensor-inplace-on-expanded -- full() allocates every element; only the index is unsqueezed
    return t;
  }

  MixResult mixup(const torch::Tensor &images, const torch::Tensor &targets) {
    const double lam = sample_beta(cfg_.mixup_alpha, rng_);
    auto mixed = images.clone(); // EXPECT: tensor-unnecessary-clone -- overwritten by mul_ at once: images.mul(lam) makes the same tensor in one pass
    mixed.mul_(lam).add_(images.flip(0), 1.0 - lam);
    return {mixed, targets.mul(lam).add(targets.flip(0), 1.0 - lam), lam};
  }

  MixResult cutmix(const torch::Tensor &images, const torch::Tensor &targets) {
    const auto H = images.size(2), W = images.size(3);
    const double cut = std::sqrt(1.0 - sample_beta(cfg_.cutmix_alpha, rng_));
    const auto ch = static_cast<int64_t>(H * cut), cw = static_cast<int64_t>(W * cut);
    std::uniform_int_distribution<int64_t> ry(0, H - 1), rx(0, W - 1);
    const auto cy = ry(rng_), cx = rx(rng_);
    const auto y1 = std::clamp<int64_t>(cy - ch / 2, 0, H), y2 = std::clamp<int64_t>(cy + ch / 2, 0, H);
    const auto x1 = std::clamp<int64_t>(cx - cw / 2, 0, W), x2 = std::clamp<int64_t>(cx + cw / 2, 0, W);
    // FACT: x = torch.rand(4, 3, 8, 8); m = x.clone(); f = x.flip(0); m[:, :, 2:5, 1:6].copy_(f[:, :, 2:5, 1:6]); assert is_copy_of(f, x) and is_copy_of(m, x) and not torch.equal(m, x)
    auto mixed = images.clone(); // LOOKALIKE: tensor-unnecessary-clone -- only a window is overwritten, through a view: the caller's batch stays intact
    auto partner = images.flip(0);
    mixed.narrow(2, y1, y2 - y1).narrow(3, x1, x2 - x1).copy_(partner.narrow(2, y1, y2 - y1).narrow(3, x1, x2 - x1)); // LOOKALIKE: tensor-inplace-overlap -- flip copies: the patch comes from another buffer
    const double lam = 1.0 - static_cast<double>((y2 - y1) * (x2 - x1)) / static_cast<double>(H * W); // the area actually kept
    return {mixed, targets.mul(lam).add(targets.flip(0), 1.0 - lam), lam};
  }

  MixResult apply(const torch::Tensor &images, const torch::Tensor &labels) {
    auto targets = smooth_one_hot(labels);
    if (uni_(rng_) >= cfg_.mix_prob)
      return {images, targets, 1.0};
    return uni_(rng_) < cfg_.switch_prob ? cutmix(images, targets) : mixup(images, targets);
  }

 private:
  AugConfig cfg_;
  std::mt19937 rng_;
  std::uniform_real_distribution<double> uni_{0.0, 1.0};
  torch::Tensor mean_, stdev_;
};

// Class-balanced weights from the effective number of samples (Cui et al. 2019), mean 1.
torch::Tensor class_balanced_weights(const torch::Tensor &labels, int64_t n_classes, double beta = 0.999) {
  auto counts = torch::bincount(labels, {}, n_classes).to(torch::kDouble);
  auto w = (1.0 - beta) / (1.0 - torch::pow(beta, counts));
  return (w * static_cast<double>(n_classes) / w.sum()).to(torch::kFloat);
}

torch::Tensor soft_target_ce(const torch::Tensor &logits, const torch::Tensor &soft, const torch::Tensor &class_w) {
  return -(soft * torch::log_softmax(logits, 1) * class_w).sum(1).mean();
}

void update_ema(SmallResNet &ema, SmallResNet &model, double decay) {
  torch::NoGradGuard no_grad;
  auto ep = ema->parameters(), mp = model->parameters();
  // FACT: p = torch.nn.Linear(3, 2).weight; q = torch.nn.Linear(3, 2).weight; exec('with torch.no_grad(): p.mul_(0.9).add_(q, alpha=0.1)'); assert p.is_leaf and p.requires_grad
  for (size_t i = 0; i < ep.size(); ++i)
    ep[i].mul_(decay).add_(mp[i], 1.0 - decay); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  auto eb = ema->buffers(), mb = model->buffers();
  // FACT: b = dict(torch.nn.BatchNorm2d(4).named_buffers()); assert b['num_batches_tracked'].dtype == torch.long and b['running_mean'].dtype == torch.float32
  for (size_t i = 0; i < eb.size(); ++i)
    eb[i].copy_(mb[i]); // LOOKALIKE: tensor-copy-narrowing -- the same buffer of the same architecture on both sides, in the same dtype
}

// An 8-bit NHWC strip of the first images of the mixed batch, to check boxes and blending by eye.
void save_preview(const torch::Tensor &mixed, const BatchMixer &mixer, const std::string &path) {
  const auto n = std::min<int64_t>(mixed.size(0), 16);
  auto img = mixed.detach().narrow(0, 0, n);
  // FACT: x = torch.rand(4, 3, 5, 5); x0 = x.clone(); v = x.detach()[:2]; v.mul_(0.2).add_(0.5); assert shares_storage(v, x) and not torch.equal(x, x0)
  img.mul_(mixer.stdev().view({1, -1, 1, 1})).add_(mixer.mean().view({1, -1, 1, 1})); // EXPECT: tensor-inplace-on-detached -- detach shares the batch's storage: the model then trains on these images un-normalised
  auto strip = torch::empty({n, mixed.size(2), mixed.size(3), mixed.size(1)}, torch::kByte);
  // FACT: p = torch.empty(3, dtype=torch.uint8); p.copy_(torch.tensor([0.4, 0.9, 0.999]) * 255); assert p.tolist() == [102, 229, 254]
  strip.copy_(img.permute({0, 2, 3, 1}) * 255); // EXPECT: tensor-copy-narrowing -- float pixels truncated toward zero into uint8 instead of rounded
  torch::save(strip, path);
}

double evaluate(SmallResNet &net, const ImageTensors &test_set, const BatchMixer &mixer, torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      ImageTensors(test_set).map(torch::data::transforms::Stack<>()), 512);
  auto hits = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t total = 0;
  for (auto &batch : *loader) {
    auto x = batch.data;
    // FACT: xs = [torch.rand(3, 4, 4) for _ in range(4)]; b = torch.stack(xs); assert all(is_copy_of(b, x) for x in xs)
    mixer.normalize_(x); // LOOKALIKE: tensor-alias-then-mutate -- Stack<> builds a fresh batch each step, and nothing else reads it
    auto logits = net->forward(x.to(device));
    hits += logits.argmax(1).eq(batch.target.to(device)).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, and a count of hits has no graph anyway
    total += batch.target.size(0);
  }
  return static_cast<double>(hits.item<int64_t>()) / static_cast<double>(total);
}

void train(SmallResNet &model, SmallResNet &ema, const ImageTensors &train_set, const ImageTensors &test_set, const AugConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  ema->to(device);
  BatchMixer mixer(cfg, 17);
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      ImageTensors(train_set).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(cfg.batch_size).workers(4).drop_last(true));
  auto class_w = class_balanced_weights(train_set.labels_, cfg.n_classes);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).weight_decay(cfg.weight_decay).nesterov(true));
  std::deque<torch::Tensor> recent; // the last smooth_window losses, for a smoothed log line
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    for (auto &batch : *loader) {
      auto images = mixer.pad_crop_flip(batch.data);
      mixer.normalize_(images);
      auto mix = mixer.apply(images, batch.target);
      if (step % cfg.preview_every == 0)
        save_preview(mix.images, mixer, "preview_" + std::to_string(step) + ".pt");
      auto x = mix.images.to(device), y = mix.soft_targets.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch each step
      auto loss = soft_target_ce(model->forward(x), y, class_w.to(device)); // EXPECT: tensor-clone-in-loop -- the same class weights cross to the GPU at every step
      opt.zero_grad();
      loss.backward();
      opt.step();
      update_ema(ema, model, cfg.ema_decay);
      // FACT: l = torch.nn.Linear(3, 2); d = [l(torch.randn(4, 3)).pow(2).mean() for _ in range(3)]; [x.backward() for x in d]; assert kept_nodes(d) >= 3 * 3
      recent.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations -- each loss drags its step's autograd graph along for smooth_window steps: a log line needs only the value
      if (static_cast<int64_t>(recent.size()) > cfg.smooth_window)
        recent.pop_front();
      if (++step % cfg.log_every == 0) {
        auto smoothed = torch::stack(std::vector<torch::Tensor>(recent.begin(), recent.end())).mean();
        std::cout << "epoch " << epoch << " step " << step << " loss " << smoothed.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      }
    }
    std::cout << "epoch " << epoch << " test acc " << evaluate(model, test_set, mixer, device) << " ema acc "
              << evaluate(ema, test_set, mixer, device) << "\n";
  }
}
