// DP-SGD (Abadi et al.) for a small CIFAR-style CNN: per-sample gradients
// from microbatches of one, each clipped to clip_norm, summed, perturbed with
// Gaussian noise of std noise_multiplier * clip_norm, then averaged.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

struct DPConfig {
  double lr = 2.0, momentum = 0.0;
  double clip_norm = 1.0, noise_multiplier = 1.1, delta = 1e-5;
  double max_weight_norm = 3.0;  // norm constraint on fc1 rows, 0 disables
  double ema_decay = 0.999;
  int64_t batch_size = 256, epochs = 20, num_classes = 10;
};

// Tempered sigmoid (Papernot et al. 2021): bounded activations keep
// per-sample gradient norms small, so less signal is lost to clipping.
struct TemperedSigmoidImpl : torch::nn::Module {
  TemperedSigmoidImpl(double scale = 2.0, double temperature = 2.0, double offset = 1.0)
      : scale_(scale), temperature_(temperature), offset_(offset) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::sigmoid(x * temperature_);
    // FACT: x=torch.randn(3,requires_grad=True); y=torch.sigmoid(x*2.0); assert backward_fails(lambda: (y.mul_(2.0).sub_(1.0), y.sum().backward()))
    y.mul_(scale_).sub_(offset_);  // EXPECT: tensor-inplace-on-saved
    return y;
  }

  double scale_, temperature_, offset_;
};
TORCH_MODULE(TemperedSigmoid);

// BatchNorm mixes samples, which breaks per-sample clipping: GroupNorm instead.
struct DPConvNetImpl : torch::nn::Module {
  explicit DPConvNetImpl(int64_t num_classes) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).padding(1)));
    gn1 = register_module("gn1", torch::nn::GroupNorm(torch::nn::GroupNormOptions(4, 32)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
    gn2 = register_module("gn2", torch::nn::GroupNorm(torch::nn::GroupNormOptions(8, 64)));
    act = register_module("act", TemperedSigmoid());
    fc1 = register_module("fc1", torch::nn::Linear(64 * 8 * 8, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, num_classes));
  }

  torch::Tensor forward(torch::Tensor x) {
    // FACT: x=torch.randn(2,4,3,3,requires_grad=True); gn=torch.nn.GroupNorm(2,4); assert not backward_fails(lambda: torch.relu_(gn(x)).sum().backward())
    x = gn1(conv1(x));
    x.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- group_norm does not save its output
    x = torch::max_pool2d(x, 2);
    x = torch::max_pool2d(act(gn2(conv2(x))), 2);
    // fc1 was ported from a channels-last (NHWC) checkpoint.
    // FACT: f=torch.randn(1,4,3,3); assert is_copy_of(f.permute(0,2,3,1).reshape(1,36), f)
    x = x.permute({0, 2, 3, 1}).reshape({x.size(0), -1});  // EXPECT: tensor-reshape-non-contiguous
    x = torch::tanh(fc1(x));
    return torch::log_softmax(fc2(x), 1);
  }

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::GroupNorm gn1{nullptr}, gn2{nullptr};
  TemperedSigmoid act{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DPConvNet);

struct StepStats {
  torch::Tensor loss;            // mean per-sample loss, on the device
  torch::Tensor noise_to_signal; // ||noise|| / ||sum of clipped grads||
  int64_t clipped = 0;
};

class DPSGDTrainer {
 public:
  DPSGDTrainer(DPConvNet model, const DPConfig& cfg, torch::Device device)
      : model_(std::move(model)), cfg_(cfg), device_(device), params_(model_->parameters()),
        optimizer_(params_, torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum)),
        class_seen_(cfg.num_classes, 0) {
    for (auto& p : params_) {
      // Accumulate clipped per-sample gradients in double: hundreds of small terms.
      summed_.push_back(torch::zeros_like(p, torch::TensorOptions().dtype(torch::kDouble)));
      ema_.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone -- the EMA copy is updated in place every step
    }
  }

  StepStats train_batch(const torch::Tensor& images, const torch::Tensor& labels) {
    model_->train();
    const int64_t B = images.size(0);
    auto x_all = images.to(device_);
    for (auto& s : summed_) s.zero_();
    StepStats stats;
    std::vector<torch::Tensor> sample_losses;
    auto confidence = torch::zeros({}, torch::TensorOptions().device(device_));

    for (int64_t i = 0; i < B; ++i) {
      optimizer_.zero_grad();
      auto logp = model_->forward(x_all[i].unsqueeze(0));
      auto loss = torch::nll_loss(logp, labels[i].unsqueeze(0));  // EXPECT: tensor-device-mismatch
      class_seen_[labels[i].item<int64_t>()] += 1;  // LOOKALIKE: tensor-sync-in-loop -- labels live on the host, nothing waits on the device
      auto probs = logp.detach();
      // FACT: x=torch.randn(1,5,requires_grad=True); lp=torch.log_softmax(x,1); assert backward_fails(lambda: (lp.detach().exp_(), torch.nn.functional.nll_loss(lp, torch.tensor([3])).backward()))
      probs.exp_();  // EXPECT: tensor-inplace-on-detached
      confidence += probs.max();
      loss.backward();
      sample_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations

      std::vector<torch::Tensor> flat;
      for (auto& p : params_) {
        // FACT: w=torch.nn.Conv2d(3,4,3); w(torch.randn(1,3,5,5)).sum().backward(); assert is_contiguous(w.weight.grad) and is_view_of(w.weight.grad.flatten(), w.weight.grad)
        flat.push_back(p.grad().flatten());  // LOOKALIKE: tensor-reshape-non-contiguous -- gradients are contiguous, flatten is a view
      }
      auto norm = torch::cat(flat).norm();
      auto factor = (cfg_.clip_norm / (norm + 1e-6)).clamp_max(1.0);
      stats.clipped += norm.gt(cfg_.clip_norm).item<int64_t>();  // EXPECT: tensor-sync-in-loop
      for (size_t j = 0; j < params_.size(); ++j) {
        auto g = params_[j].grad().clone();  // EXPECT: tensor-unnecessary-clone
        g.mul_(factor);
        summed_[j].add_(g);
      }
    }

    const double noise_std = cfg_.noise_multiplier * cfg_.clip_norm;
    auto signal_sq = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
    auto noise_sq = torch::zeros_like(signal_sq);
    for (size_t j = 0; j < params_.size(); ++j) {
      auto noisy = summed_[j];
      // FACT: s=torch.zeros(3,dtype=torch.float64); n=s; n.add_(torch.randn_like(n), alpha=1.1); assert shares_storage(n, s) and s.abs().sum() > 0
      noisy.add_(torch::randn_like(noisy), noise_std);  // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-device-mismatch -- randn_like draws on the accumulator's device
      noise_sq += (noisy - summed_[j]).pow(2).sum();
      signal_sq += summed_[j].pow(2).sum();
      // FACT: g=torch.zeros(3); g.copy_(torch.tensor([1+2**-40]*3, dtype=torch.float64)); assert g.dtype==torch.float32 and g.eq(1.0).all()
      params_[j].grad().copy_(noisy.div(B));  // EXPECT: tensor-copy-narrowing
    }
    optimizer_.step();
    if (cfg_.max_weight_norm > 0) {
      // FACT: w=torch.nn.Linear(3,2).weight; assert raises(lambda: w.renorm_(2,0,1.0), "leaf Variable")
      model_->fc1->weight.renorm_(2, 0, cfg_.max_weight_norm);  // EXPECT: tensor-inplace-on-leaf
    }
    update_ema();

    stats.loss = torch::stack(sample_losses).mean().detach();
    stats.noise_to_signal = (noise_sq.sqrt() / signal_sq.sqrt().clamp_min(1e-12)).to(torch::kFloat);
    last_confidence_ = confidence / B;
    return stats;
  }

  void update_ema() {
    torch::NoGradGuard no_grad;
    for (size_t j = 0; j < params_.size(); ++j) {
      // FACT: ema=torch.nn.Linear(3,2).weight.detach().clone(); assert not ema.requires_grad and ema._base is None
      ema_[j].mul_(cfg_.ema_decay).add_(params_[j].detach(), 1.0 - cfg_.ema_decay);  // LOOKALIKE: tensor-inplace-on-detached -- ema_ holds detach().clone() copies, the model is untouched
    }
  }

  const std::vector<torch::Tensor>& ema() const { return ema_; }
  torch::Tensor last_confidence() const { return last_confidence_; }

 private:
  DPConvNet model_;
  DPConfig cfg_;
  torch::Device device_;
  std::vector<torch::Tensor> params_;
  torch::optim::SGD optimizer_;
  std::vector<torch::Tensor> summed_, ema_;
  std::vector<int64_t> class_seen_;
  torch::Tensor last_confidence_;
};

// Rough epsilon from the moments-accountant bound for the sampled Gaussian
// mechanism: eps ~ q * sqrt(T * log(1/delta)) / sigma (only for small q).
double approx_epsilon(double q, int64_t steps, double sigma, double delta) {
  return 2.0 * q * std::sqrt(static_cast<double>(steps) * std::log(1.0 / delta)) / sigma;
}

double evaluate(DPConvNet& model, const torch::Tensor& images, const torch::Tensor& labels, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> preds;
  const int64_t n = images.size(0);
  for (int64_t start = 0; start < n; start += 1000) {
    auto len = std::min<int64_t>(1000, n - start);
    auto x = images.narrow(0, start, len).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice every iteration
    preds.push_back(model->forward(x).argmax(1));  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, no graph is built
  }
  auto correct = torch::cat(preds).cpu().eq(labels).sum().item<int64_t>();
  return static_cast<double>(correct) / static_cast<double>(n);
}

void train_dp(const torch::Tensor& train_x, const torch::Tensor& train_y, const torch::Tensor& test_x,
              const torch::Tensor& test_y, const DPConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  DPConvNet model(cfg.num_classes);
  {
    // A zero-initialised classifier trains noticeably better under DP noise.
    torch::NoGradGuard no_grad;
    model->fc2->weight.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    model->fc2->bias.zero_();
  }
  model->to(device);
  DPSGDTrainer trainer(model, cfg, device);

  const int64_t n = train_x.size(0);
  const int64_t steps_per_epoch = n / cfg.batch_size;
  const double q = static_cast<double>(cfg.batch_size) / static_cast<double>(n);
  int64_t steps = 0;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(n);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    auto epoch_nsr = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t clipped = 0;
    for (int64_t b = 0; b < steps_per_epoch; ++b) {
      auto idx = perm.narrow(0, b * cfg.batch_size, cfg.batch_size);
      auto stats = trainer.train_batch(train_x.index_select(0, idx), train_y.index_select(0, idx));
      epoch_loss += stats.loss;
      epoch_nsr += stats.noise_to_signal;
      clipped += stats.clipped;
      ++steps;
    }
    double acc = evaluate(model, test_x, test_y, device);
    auto summary = torch::stack({epoch_loss / steps_per_epoch, epoch_nsr / steps_per_epoch, trainer.last_confidence()}).cpu();  // LOOKALIKE: tensor-sync-in-loop -- one transfer per epoch
    auto s = summary.accessor<float, 1>();
    std::cout << "epoch " << epoch << " loss " << s[0] << " noise/signal " << s[1]
              << " clipped " << 100.0 * clipped / (steps_per_epoch * cfg.batch_size) << "%"
              << " confidence " << s[2] << " test acc " << acc
              << " eps " << approx_epsilon(q, steps, cfg.noise_multiplier, cfg.delta) << std::endl;
  }
}
