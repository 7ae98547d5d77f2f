// N-HiTS: neural hierarchical interpolation for multi-horizon forecasting.
//
// Each block max-pools its input at its own rate, predicts a handful of knots
// for the backcast and the forecast, and interpolates them back to full
// resolution.  Blocks run on the residual left by the blocks before them and
// their forecasts are summed.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

namespace F = torch::nn::functional;

struct NHiTSConfig {
  int64_t input_size = 96;
  int64_t horizon = 24;
  int64_t channels = 4;
  std::vector<int64_t> pool_kernels{8, 4, 1};
  std::vector<int64_t> downsample{12, 4, 1};
  int64_t hidden = 256;
  double horizon_decay = 0.98;

  int epochs = 30;
  int64_t batch_size = 64;
  int64_t batches_per_epoch = 100;
  double lr = 1e-3;
  double scale_eps = 1e-3;
};

class NHiTSBlockImpl : public torch::nn::Module {
 public:
  NHiTSBlockImpl(const NHiTSConfig& cfg, int64_t pool_kernel, int64_t ratio)
      : L_(cfg.input_size), H_(cfg.horizon), C_(cfg.channels), kernel_(pool_kernel) {
    nb_ = std::max<int64_t>(L_ / ratio, 1);
    nf_ = std::max<int64_t>(H_ / ratio, 1);
    const int64_t pooled_len = (L_ + kernel_ - 1) / kernel_;
    fc1 = register_module("fc1", torch::nn::Linear(C_ * pooled_len, cfg.hidden));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.hidden, cfg.hidden));
    theta = register_module("theta", torch::nn::Linear(cfg.hidden, C_ * (nb_ + nf_)));
    torch::nn::init::zeros_(theta->bias);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under their own NoGradGuard
    theta->weight.mul_(0.1);  // EXPECT: tensor-inplace-on-leaf
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& residual) {
    const int64_t b = residual.size(0);
    auto pooled = F::max_pool1d(residual.transpose(1, 2),
                                F::MaxPool1dFuncOptions(kernel_).stride(kernel_).ceil_mode(true));
    // FACT: p=torch.nn.functional.max_pool1d(torch.randn(2,12,3).transpose(1,2),4,4,ceil_mode=True); assert is_contiguous(p) and is_view_of(p.reshape(2,-1), p)
    // FACT: w=torch.randn(5,4,requires_grad=True); h=torch.nn.functional.linear(torch.randn(3,4), w).relu_(); h.pow(2).sum().backward(); assert w.grad is not None
    auto h = fc1->forward(pooled.reshape({b, -1})).relu_();  // LOOKALIKE: tensor-reshape-non-contiguous -- the pooled output is freshly allocated and contiguous // LOOKALIKE: tensor-inplace-on-saved -- addmm does not save its output, relu_ on it is safe
    h = fc2->forward(h).relu_();
    auto coeffs = theta->forward(h);

    // FACT: t=torch.randn(4,30); k=t.narrow(1,6,24); assert not is_contiguous(k) and is_view_of(k.view(4,3,8), t)
    auto back_knots = coeffs.narrow(1, 0, C_ * nb_).view({b, C_, nb_});  // LOOKALIKE: tensor-view-non-contiguous -- narrowing the last dim keeps it unit-stride, splitting it is still a view
    auto fore_knots = coeffs.narrow(1, C_ * nb_, C_ * nf_).view({b, C_, nf_});

    auto backcast = F::interpolate(back_knots, F::InterpolateFuncOptions()
                                                   .size(std::vector<int64_t>{L_})
                                                   .mode(torch::kLinear)
                                                   .align_corners(true));
    auto forecast = F::interpolate(fore_knots, F::InterpolateFuncOptions()
                                                   .size(std::vector<int64_t>{H_})
                                                   .mode(torch::kLinear)
                                                   .align_corners(true));
    return {backcast.transpose(1, 2), forecast.transpose(1, 2)};
  }

  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, theta{nullptr};

 private:
  int64_t L_, H_, C_, kernel_;
  int64_t nb_ = 1, nf_ = 1;
};
TORCH_MODULE(NHiTSBlock);

class NHiTSImpl : public torch::nn::Module {
 public:
  explicit NHiTSImpl(const NHiTSConfig& cfg) : cfg_(cfg) {
    for (size_t i = 0; i < cfg.pool_kernels.size(); ++i) {
      blocks_->push_back(NHiTSBlock(cfg, cfg.pool_kernels[i], cfg.downsample[i]));
    }
    register_module("blocks", blocks_);
    auto steps = torch::arange(cfg.horizon, torch::kFloat32);
    auto w = torch::pow(cfg.horizon_decay, steps);
    horizon_weights = register_buffer("horizon_weights", (w / w.mean()).view({1, -1, 1}));
  }

  torch::Tensor forward(torch::Tensor insample) {
    torch::Tensor residual = insample;
    auto forecast = torch::zeros({insample.size(0), cfg_.horizon, cfg_.channels}, insample.options());
    for (const auto& module : *blocks_) {
      auto out = module->as<NHiTSBlockImpl>()->forward(residual);
      // FACT: x=torch.randn(2,12,3); keep=x.clone(); r=x; r.sub_(torch.ones(2,12,3)); assert shares_storage(r, x) and not torch.equal(x, keep)
      // FACT: r=torch.randn(2,12,3); w=torch.randn(12,3,requires_grad=True); r.sub_(w); p=torch.nn.functional.max_pool1d(r.transpose(1,2),4,4); assert backward_fails(lambda: (r.sub_(w), p.sum().backward()))
      residual.sub_(out.first);  // EXPECT: tensor-alias-then-mutate, tensor-inplace-on-saved
      forecast = forecast + out.second;
    }
    return forecast;
  }

  torch::Tensor horizon_weights;

 private:
  NHiTSConfig cfg_;
  torch::nn::ModuleList blocks_;
};
TORCH_MODULE(NHiTS);

// Sliding windows over a multivariate series, normalised per channel.
struct WindowSampler {
  torch::Tensor series;
  torch::Tensor mean, stdev;
  int64_t L, H;

  std::pair<torch::Tensor, torch::Tensor> batch(const torch::Tensor& starts) const {
    std::vector<torch::Tensor> xs, ys;
    for (int64_t i = 0; i < starts.size(0); ++i) {
      const int64_t s = starts[i].item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- starts is a host index tensor, item() reads host memory
      // FACT: s=torch.randn(50,3,dtype=torch.float64); w=s.narrow(0,5,20).to(torch.float32); assert is_copy_of(w, s)
      auto w = series.narrow(0, s, L + H).to(torch::kFloat32);
      w.sub_(mean).div_(stdev);  // LOOKALIKE: tensor-alias-then-mutate -- series is float64, to(kFloat32) converts into new storage
      xs.push_back(w.narrow(0, 0, L));
      ys.push_back(w.narrow(0, L, H));
    }
    return {torch::stack(xs), torch::stack(ys)};
  }
};

torch::Tensor scaled_errors(const torch::Tensor& pred, const torch::Tensor& target, const torch::Tensor& scale) {
  auto err = (pred - target) / scale;
  auto sq = err.pow(2);
  // FACT: e=torch.randn(2,4,3,requires_grad=True)*1.0; sq=e.pow(2); assert backward_fails(lambda: (sq + e.abs_()).sum().backward())
  err.abs_();  // EXPECT: tensor-inplace-on-saved
  return sq + err;
}

torch::Tensor target_scale(const torch::Tensor& x, const torch::Tensor& y, double eps) {
  auto scale = x.abs().mean(1, /*keepdim=*/true).expand_as(y);
  // FACT: assert raises(lambda: torch.rand(2,1,3).expand(2,4,3).clamp_min_(1e-3), "more than one element")
  scale.clamp_min_(eps);  // EXPECT: tensor-inplace-on-expanded
  return scale;
}

void train(NHiTS& model, const WindowSampler& sampler, int64_t n_windows, const NHiTSConfig& cfg,
           torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::vector<torch::Tensor> epoch_losses;
    for (int64_t step = 0; step < cfg.batches_per_epoch; ++step) {
      auto starts = torch::randint(n_windows, {cfg.batch_size}, torch::kLong);
      auto batch = sampler.batch(starts);
      auto x = batch.first.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch is moved every step
      auto y = batch.second.to(device);

      auto scale = x.abs().mean(1, /*keepdim=*/true);
      // FACT: s=torch.rand(2,1,3); s.clamp_min_(1e-3); assert s.stride(1) != 0 and (torch.randn(2,4,3) / s).shape == (2,4,3)
      scale.clamp_min_(cfg.scale_eps);  // LOOKALIKE: tensor-inplace-on-expanded -- keepdim result is a real tensor, broadcasting happens later in the division

      auto pred = model->forward(x);
      auto loss = (scaled_errors(pred, y, scale) * model->horizon_weights).mean();  // LOOKALIKE: tensor-device-mismatch -- horizon_weights is a registered buffer, model->to(device) moved it
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    }
    std::cout << "epoch " << epoch << " loss " << torch::stack(epoch_losses).mean().item<double>() << "\n";
  }
}

void evaluate(NHiTS& model, const WindowSampler& sampler, const torch::Tensor& starts,
              const NHiTSConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto per_step = torch::zeros({cfg.horizon});
  auto per_series = torch::zeros({cfg.channels});
  int64_t batches = 0;
  for (int64_t s = 0; s < starts.size(0); s += cfg.batch_size) {
    const int64_t len = std::min(cfg.batch_size, starts.size(0) - s);
    auto batch = sampler.batch(starts.narrow(0, s, len));
    auto x = batch.first.to(device);
    auto y = batch.second.to(device);
    auto err = (model->forward(x) - y).abs() / target_scale(x, y, cfg.scale_eps);
    per_step += err.mean(torch::IntArrayRef{0, 2});  // EXPECT: tensor-device-mismatch
    // FACT: e=torch.randn(2,6,3); assert raises(lambda: e.transpose(1,2).view(6,6), "view size is not compatible")
    auto rows = err.transpose(1, 2).view({len * cfg.channels, cfg.horizon});  // EXPECT: tensor-view-non-contiguous
    per_series += rows.mean(1).view({len, cfg.channels}).mean(0).cpu();
    ++batches;
  }
  per_step /= batches;
  per_series /= batches;
  std::cout << "scaled MAE by horizon step: " << per_step << "\nby series: " << per_series << "\n";
  model->train();
}

// Recursive multi-horizon rollout beyond the trained horizon.
torch::Tensor rollout(NHiTS& model, const torch::Tensor& context, int64_t rounds, const NHiTSConfig& cfg) {
  torch::NoGradGuard no_grad;
  const int64_t L = cfg.input_size, H = cfg.horizon;
  auto window = context.clone();  // LOOKALIKE: tensor-unnecessary-clone -- window is a scratch buffer rewritten every round, context must stay intact
  std::vector<torch::Tensor> outs;
  for (int64_t r = 0; r < rounds; ++r) {
    auto pred = model->forward(window);
    // FACT: w=torch.zeros(1,12,3); assert raises(lambda: w.narrow(1,0,8).copy_(w.narrow(1,4,8)), "some elements")
    window.narrow(1, 0, L - H).copy_(window.narrow(1, H, L - H));  // EXPECT: tensor-inplace-overlap
    window.narrow(1, L - H, H).copy_(pred);
    outs.push_back(pred);
  }
  return torch::cat(outs, 1);
}

torch::Tensor synthetic_series(int64_t length, int64_t channels) {
  auto t = torch::arange(length, torch::kFloat64).unsqueeze(1);
  auto period = torch::tensor({24.0, 168.0, 12.0, 48.0}, torch::kFloat64).narrow(0, 0, channels);
  auto trend = t * 1e-3;
  auto season = torch::sin(2.0 * M_PI * t / period) + 0.3 * torch::cos(4.0 * M_PI * t / period);
  return season + trend + 0.1 * torch::randn({length, channels}, torch::kFloat64);
}

int main() {
  torch::manual_seed(0);
  NHiTSConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  const int64_t length = 8760;
  auto series = synthetic_series(length, cfg.channels);
  const int64_t split = length * 8 / 10;
  auto train_part = series.narrow(0, 0, split);
  WindowSampler train_sampler{series, train_part.mean(0).to(torch::kFloat32),
                              train_part.std(0).to(torch::kFloat32), cfg.input_size, cfg.horizon};
  const int64_t n_train = split - cfg.input_size - cfg.horizon;

  NHiTS model(cfg);
  model->to(device);
  train(model, train_sampler, n_train, cfg, device);

  auto test_starts = torch::arange(split, length - cfg.input_size - cfg.horizon, cfg.horizon, torch::kLong);
  evaluate(model, train_sampler, test_starts, cfg, device);

  auto context = train_sampler.batch(test_starts.narrow(0, 0, 1)).first.to(device);
  auto long_range = rollout(model, context, 4, cfg);
  std::cout << "rollout " << long_range.sizes() << "\n";
  return 0;
}
