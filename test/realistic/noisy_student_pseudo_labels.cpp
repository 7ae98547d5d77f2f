// Self-training in the spirit of Noisy Student (Xie et al. 2020) with FixMatch-style confidence
// masking (Sohn et al. 2020): a small labeled set, a large unlabeled one. The teacher labels a weakly
// augmented view of each unlabeled batch; the student, noised by strong augmentation, dropout and
// stochastic depth, learns those labels where the teacher is confident. Within a generation the
// teacher follows the student as an exponential moving average; each generation's student starts
// from the teacher it will outgrow.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <random>
#include <vector>

namespace F = torch::nn::functional;

struct NoisyStudentConfig {
  int64_t n_classes = 10, width = 64, generations = 3, epochs = 100, batch = 64, log_every = 50;
  double lr = 0.03, momentum = 0.9, weight_decay = 5e-4, ema_decay = 0.999;
  double threshold = 0.95, temperature = 1.0, lambda_u = 1.0, refine_alpha = 0.3, ent_coef = 0.1;
  int64_t rampup_steps = 5000;
  double drop_path = 0.2, dropout = 0.5, noise_std = 0.05, cutout = 0.25;
};

// Pre-activation residual block with stochastic depth (per sample) as model noise.
struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t in, int64_t out, int64_t stride, double drop_path) : drop_path_(drop_path) {
    namespace nn = torch::nn;
    bn1_ = register_module("bn1", nn::BatchNorm2d(in));
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn2_ = register_module("bn2", nn::BatchNorm2d(out));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    if (in != out || stride != 1)
      shortcut_ = register_module("shortcut", nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto h = conv1_(torch::relu(bn1_(x)));
    h = conv2_(torch::relu(bn2_(h)));
    if (is_training() && drop_path_ > 0) {
      auto keep = torch::empty({x.size(0), 1, 1, 1}, x.options()).bernoulli_(1.0 - drop_path_);
      h = h * keep / (1.0 - drop_path_);
    }
    // FACT: c = torch.nn.Conv2d(3, 3, 3, padding=1); x = torch.randn(2, 3, 5, 5, requires_grad=True); k = torch.bernoulli(torch.full((2, 1, 1, 1), 0.8)); h = c(x) * k / 0.8; h += x; h.relu().sum().backward(); assert x.grad is not None
    h += shortcut_.is_empty() ? x : shortcut_(x); // LOOKALIKE: tensor-inplace-on-saved -- a convolution's output or the quotient by a number: neither is saved for backward
    return h;
  }

  double drop_path_;
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, shortcut_{nullptr};
};
TORCH_MODULE(ResBlock);

struct WideNetImpl : torch::nn::Module {
  explicit WideNetImpl(const NoisyStudentConfig &cfg) {
    namespace nn = torch::nn;
    const auto w = cfg.width;
    stem_ = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, w, 3).padding(1).bias(false)));
    blocks_ = register_module("blocks", nn::Sequential(ResBlock(w, w, 1, cfg.drop_path), ResBlock(w, 2 * w, 2, cfg.drop_path),
                                                        ResBlock(2 * w, 4 * w, 2, cfg.drop_path)));
    bn_ = register_module("bn", nn::BatchNorm2d(4 * w));
    dropout_ = register_module("dropout", nn::Dropout(cfg.dropout));
    fc_ = register_module("fc", nn::Linear(4 * w, cfg.n_classes));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::relu(bn_(blocks_->forward(stem_(x))));
    // FACT: p = torch.nn.functional.adaptive_avg_pool2d(torch.randn(4, 8, 6, 6), 1); assert is_view_of(p.flatten(1), p)
    h = torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1); // LOOKALIKE: tensor-reshape-non-contiguous -- the pooled [B, C, 1, 1] map is contiguous: a view
    return fc_(dropout_(h));
  }

  torch::nn::Conv2d stem_{nullptr};
  torch::nn::Sequential blocks_{nullptr};
  torch::nn::BatchNorm2d bn_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(WideNet);

// teacher <- decay * teacher + (1 - decay) * student; decay 0 copies the student.
void ema_update(WideNet &teacher, WideNet &student, double decay) {
  torch::NoGradGuard no_grad;
  auto tp = teacher->parameters(), sp = student->parameters();
  for (size_t i = 0; i < tp.size(); ++i)
    tp[i].mul_(decay).add_(sp[i], 1.0 - decay); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  auto tb = teacher->buffers(), sb = student->buffers();
  for (size_t i = 0; i < tb.size(); ++i)
    tb[i].copy_(sb[i]); // BatchNorm statistics are copied, not averaged
}

// Weak view: one flip and one random translation (reflect padding) for the batch.
torch::Tensor weak_augment(const torch::Tensor &images, std::mt19937 &rng) {
  const auto H = images.size(2), W = images.size(3);
  auto x = std::bernoulli_distribution(0.5)(rng) ? images.flip({3}) : images;
  auto padded = F::pad(x, F::PadFuncOptions({4, 4, 4, 4}).mode(torch::kReflect));
  std::uniform_int_distribution<int64_t> shift(0, 8);
  return padded.narrow(2, shift(rng), H).narrow(3, shift(rng), W);
}

// Strong view: per-image contrast and brightness, a cutout square, Gaussian pixel noise.
torch::Tensor strong_augment(const torch::Tensor &images, const NoisyStudentConfig &cfg) {
  const auto B = images.size(0), H = images.size(2), W = images.size(3);
  auto opts = images.options();
  auto contrast = torch::empty({B, 1, 1, 1}, opts).uniform_(0.5, 1.5);
  auto brightness = torch::empty({B, 1, 1, 1}, opts).uniform_(-0.2, 0.2);
  auto out = images.contiguous(); // the per-pixel arithmetic below wants a dense batch
  auto mean = out.mean({1, 2, 3}, /*keepdim=*/true);
  // FACT: x = torch.rand(4, 3, 8, 8); x0 = x.clone(); o = x.contiguous(); m = o.mean((1, 2, 3), True); o.sub_(m).mul_(1.5).add_(m); assert shares_storage(o, x) and not torch.equal(x, x0)
  out.sub_(mean).mul_(contrast).add_(mean + brightness); // EXPECT: tensor-alias-then-mutate -- contiguous() of the loader's dense batch is the batch itself: the caller's images are rewritten
  const double half = cfg.cutout * H / 2;
  auto cy = torch::rand({B, 1, 1}, opts) * H, cx = torch::rand({B, 1, 1}, opts) * W;
  auto yy = torch::arange(H, opts).view({1, H, 1}), xx = torch::arange(W, opts).view({1, 1, W});
  auto hole = (yy - cy).abs().lt(half).logical_and((xx - cx).abs().lt(half));
  out = out.masked_fill(hole.unsqueeze(1), 0.5);
  // FACT: x = torch.rand(2, 3, 4, 4); o = x.masked_fill(torch.rand(2, 1, 4, 4) > 0.5, 0.5); o.add_(torch.randn_like(o)).clamp_(0, 1); assert is_copy_of(o, x)
  out.add_(torch::randn_like(out) * cfg.noise_std).clamp_(0, 1); // LOOKALIKE: tensor-alias-then-mutate -- 'out' now holds masked_fill's new tensor
  return out;
}

// Hard labels of the teacher for a fixed probe set, written into `labels` (int64, on the host).
void label_probe(WideNet &teacher, const torch::Tensor &probe, torch::Tensor &labels, torch::Device device) {
  torch::NoGradGuard no_grad;
  teacher->eval();
  const int64_t chunk = 512;
  for (int64_t off = 0; off < probe.size(0); off += chunk) {
    const auto n = std::min(chunk, probe.size(0) - off);
    auto logits = teacher->forward(probe.narrow(0, off, n).to(device));
    labels.narrow(0, off, n).copy_(logits.argmax(1)); // LOOKALIKE: tensor-copy-narrowing, tensor-device-mismatch -- int64 into int64; copy_ may cross devices
  }
}

double accuracy(WideNet &model, const torch::Tensor &x, const torch::Tensor &y, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  const int64_t chunk = 512;
  for (int64_t off = 0; off < x.size(0); off += chunk) {
    const auto n = std::min(chunk, x.size(0) - off);
    auto pred = model->forward(x.narrow(0, off, n).to(device)).argmax(1);
    correct = correct + pred.eq(y.narrow(0, off, n).to(device)).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- a count of comparisons under NoGradGuard
  }
  return correct.item<double>() / x.size(0);
}

struct LabeledSet {
  torch::Tensor x, y; // [n, 3, H, W] float in [0, 1], [n] int64
};

template <typename UnlabeledLoader>
void train_generation(WideNet &student, WideNet &teacher, const LabeledSet &labeled, UnlabeledLoader &unlabeled,
                      const torch::Tensor &probe, const NoisyStudentConfig &cfg, torch::Device device, std::mt19937 &rng) {
  torch::optim::SGD opt(student->parameters(), torch::optim::SGDOptions(cfg.lr)
                                                   .momentum(cfg.momentum)
                                                   .nesterov(true)
                                                   .weight_decay(cfg.weight_decay));
  // the labeled set is small and imbalanced: inverse-frequency class weights
  auto counts = torch::bincount(labeled.y, {}, cfg.n_classes).to(torch::kFloat);
  auto class_w = counts.sum() / (counts.clamp_min(1) * cfg.n_classes);
  auto probe_labels = torch::zeros({probe.size(0)}, torch::kLong);
  label_probe(teacher, probe, probe_labels, device);

  torch::Tensor running = torch::zeros({});
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    double mask_rate = 0;
    int64_t n_steps = 0;
    for (auto &batch : *unlabeled) {
      student->train();
      auto idx = torch::randint(labeled.x.size(0), {cfg.batch}, torch::kLong);
      auto x_l = labeled.x.index_select(0, idx).to(device, /*non_blocking=*/true); // LOOKALIKE: tensor-clone-in-loop -- a new labeled batch every step
      auto y_l = labeled.y.index_select(0, idx).to(device, /*non_blocking=*/true);
      auto u = batch.data.to(device, /*non_blocking=*/true);
      auto x_s = strong_augment(u, cfg);
      auto x_w = weak_augment(u, rng);

      torch::Tensor t_logits;
      {
        torch::NoGradGuard no_grad;
        teacher->eval();
        t_logits = teacher->forward(x_w);
      }
      auto t_probs = torch::softmax(t_logits / cfg.temperature, -1);
      auto [conf, pseudo] = t_probs.max(1);
      auto confident = conf.ge(cfg.threshold);
      // FACT: m = torch.rand(6).ge(0.5); f = m.to(torch.float32); f.mul_(0.5); assert is_copy_of(f, m) and m.dtype == torch.bool
      auto weight_u = confident.to(torch::kFloat);
      weight_u.mul_(std::min(1.0, static_cast<double>(step) / cfg.rampup_steps)); // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of a bool mask is a new tensor

      auto logits = student->forward(torch::cat({x_l, x_s}));
      auto logits_l = logits.narrow(0, 0, x_l.size(0));
      auto logits_u = logits.narrow(0, x_l.size(0), x_s.size(0));
      // refine the teacher's labels with the student's own opinion (no gradient through the target)
      auto refined = logits_u.detach();
      // FACT: l = torch.nn.Linear(4, 3)(torch.randn(6, 4)); u = l.narrow(0, 2, 4); u0 = u.detach().clone(); r = u.detach(); r.mul_(0.3); assert torch.allclose(u.detach(), u0 * 0.3)
      refined.mul_(cfg.refine_alpha).add_(t_logits, 1.0 - cfg.refine_alpha); // EXPECT: tensor-inplace-on-detached -- detach() shares logits_u's storage: the student's logits in the losses below are rescaled
      pseudo = refined.argmax(1);

      auto w = class_w.to(device); // EXPECT: tensor-clone-in-loop -- the same class weights are sent to the device at every step
      auto loss_l = F::cross_entropy(logits_l, y_l, F::CrossEntropyFuncOptions().weight(w));
      auto ce_u = F::cross_entropy(logits_u, pseudo, F::CrossEntropyFuncOptions().reduction(torch::kNone));
      auto loss_u = (ce_u * weight_u).mean();
      // entropy minimisation on the unlabeled predictions
      auto p_u = torch::softmax(logits_u, -1);
      // FACT: l = torch.randn(4, 5, requires_grad=True); p = torch.softmax(l, -1); p.clamp_min_(1e-8); e = -(p * p.log()).sum(); assert backward_fails(lambda: e.backward())
      p_u.clamp_min_(1e-8); // EXPECT: tensor-inplace-on-saved -- softmax saved its result for backward: loss.backward() raises
      auto entropy = -(p_u * p_u.log()).sum(1).mean();
      auto loss = loss_l + cfg.lambda_u * loss_u + cfg.ent_coef * entropy;

      opt.zero_grad();
      loss.backward();
      opt.step();
      ema_update(teacher, student, cfg.ema_decay);

      // FACT: import functools; l = torch.nn.Linear(3, 1); r = functools.reduce(lambda acc, _: 0.98 * acc + 0.02 * l(torch.randn(4, 3)).pow(2).mean(), range(3), torch.zeros(())); assert kept_nodes(r) >= 3 * 4
      running = 0.98 * running + 0.02 * loss; // EXPECT: tensor-graph-kept-across-iterations -- the smoothed loss chains every step's graph to the next
      mask_rate += confident.to(torch::kFloat).mean().item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the device at every step for a statistic
      ++n_steps;
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << running.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps
    }
    // FACT: a = torch.randint(0, 10, (8,)); p = a.clone(); a.copy_(torch.randint(0, 10, (8,))); assert is_copy_of(p, a)
    auto previous = probe_labels.clone(); // LOOKALIKE: tensor-unnecessary-clone -- a snapshot: label_probe overwrites probe_labels next
    label_probe(teacher, probe, probe_labels, device);
    auto flips = previous.ne(probe_labels).sum().item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- host tensors, once per epoch
    std::cout << "epoch " << epoch << " mask rate " << mask_rate / std::max<int64_t>(n_steps, 1) << " label flips "
              << flips << "\n";
  }
}

struct UnlabeledImages : torch::data::datasets::Dataset<UnlabeledImages> {
  explicit UnlabeledImages(torch::Tensor images) : images_(std::move(images)) {}
  torch::data::Example<> get(size_t i) override { return {images_[i], torch::tensor(static_cast<int64_t>(i))}; }
  torch::optional<size_t> size() const override { return images_.size(0); }
  torch::Tensor images_;
};

void noisy_student(const LabeledSet &labeled, const torch::Tensor &unlabeled_images, const LabeledSet &test,
                   const NoisyStudentConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  std::mt19937 rng(0);
  auto unlabeled = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      UnlabeledImages(unlabeled_images).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(cfg.batch * 7).workers(4).drop_last(true));
  auto probe = unlabeled_images.narrow(0, 0, std::min<int64_t>(2048, unlabeled_images.size(0)));

  WideNet teacher(cfg);
  teacher->to(device);
  for (auto &p : teacher->parameters())
    p.requires_grad_(false); // LOOKALIKE: tensor-inplace-on-leaf -- only the flag: the teacher is never trained by the optimizer
  for (int64_t gen = 0; gen < cfg.generations; ++gen) {
    WideNet student(cfg);
    student->to(device);
    if (gen == 0)
      ema_update(teacher, student, 0.0); // the first teacher starts as a copy of the student
    else
      ema_update(student, teacher, 0.0); // later students start from their teacher
    train_generation(student, teacher, labeled, unlabeled, probe, cfg, device, rng);
    std::cout << "generation " << gen << " teacher " << accuracy(teacher, test.x, test.y, device) << " student "
              << accuracy(student, test.x, test.y, device) << "\n";
  }
}
