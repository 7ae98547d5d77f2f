// Energy-based image model trained by contrastive divergence with short-run Langevin dynamics
// (Du & Mordatch 2019, Nijkamp et al. 2019). Negatives come from a replay buffer of persistent
// chains (a few restarted from uniform noise each step), advanced by K steps of
//   x <- x - (step / 2) * dE/dx + sigma * N(0, I),  clamped to the range of the normalised data.
// Loss: E(x+) - E(x-) + alpha * (E(x+)^2 + E(x-)^2), with the negatives self-normalised by their
// energy. The energy is a conv net's scalar head plus a learned quadratic form f^T A f on its
// pooled features; A is projected back to a symmetric matrix after every update.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

struct EbmConfig {
  int64_t channels = 3, image_size = 32, width = 64, feat_dim = 128;
  int64_t buffer_size = 10000, batch_size = 128, sgld_steps = 60, sample_steps = 400, epochs = 100, log_every = 50;
  double step_size = 10.0, noise_std = 0.005, reinit_prob = 0.05, alpha = 1.0, temperature = 1.0;
  double lr = 1e-4, grad_clip = 0.1, grad_tol = 1e-5;
  std::vector<double> mean{0.4914, 0.4822, 0.4465}, stdev{0.2470, 0.2435, 0.2616}; // CIFAR-10
};

struct EnergyNetImpl : torch::nn::Module {
  explicit EnergyNetImpl(const EbmConfig &cfg) {
    namespace nn = torch::nn;
    const auto W = cfg.width;
    features_ = register_module("features", nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(cfg.channels, W, 3).padding(1)), nn::SiLU(),
        nn::Conv2d(nn::Conv2dOptions(W, 2 * W, 4).stride(2).padding(1)), nn::SiLU(),
        nn::Conv2d(nn::Conv2dOptions(2 * W, 4 * W, 4).stride(2).padding(1)), nn::SiLU(),
        nn::Conv2d(nn::Conv2dOptions(4 * W, 4 * W, 4).stride(2).padding(1)), nn::SiLU(),
        nn::AdaptiveAvgPool2d(1), nn::Flatten(), nn::Linear(4 * W, cfg.feat_dim)));
    head_ = register_module("head", nn::Linear(cfg.feat_dim, 1));
    A_ = register_parameter("A", torch::eye(cfg.feat_dim) * 1e-2);
  }

  // x [B, C, H, W] -> energy [B]; low energy = likely image.
  torch::Tensor forward(const torch::Tensor &x) {
    auto f = features_->forward(x);
    return head_(f).squeeze(1) + 0.5 * (f.matmul(A_) * f).sum(1);
  }

  // Only the symmetric part of A enters f^T A f: the projection keeps A itself meaningful.
  void symmetrize() {
    torch::NoGradGuard no_grad;
    // FACT: A = torch.randn(4, 4); assert raises(lambda: A.add_(A.t()), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    A_.add_(A_.t()).mul_(0.5); // EXPECT: tensor-inplace-overlap -- A and its transpose are the same memory in another order: PyTorch refuses the write
  }

  // The symmetric part of A, for the analysis notebook.
  torch::Tensor quadratic_form() const {
    // FACT: A = torch.randn(4, 4); S = A.clone(); S.add_(A.t()).mul_(0.5); assert torch.equal(S, A.add(A.t()).mul_(0.5)) and is_copy_of(S, A)
    auto S = A_.detach().clone(); // EXPECT: tensor-unnecessary-clone -- overwritten by add_ at once: A.add(A.t()) makes the same tensor in one pass
    // FACT: A = torch.randn(4, 4); S = A.clone(); S.add_(A.t()); assert torch.allclose(S, A + A.t()) and not shares_storage(S, A)
    S.add_(A_.detach().t()).mul_(0.5); // LOOKALIKE: tensor-inplace-overlap -- the clone has storage of its own: A's transpose does not overlap it
    return S;
  }

  torch::nn::Sequential features_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::Tensor A_;
};
TORCH_MODULE(EnergyNet);

// [0, 1] images -> the normalised range, with uniform noise of one grey level (8-bit sources).
torch::Tensor dequantize(const torch::Tensor &images, const torch::Tensor &mean, const torch::Tensor &stdev) {
  auto x = images.contiguous(); // decoders may hand over channels-last views
  // FACT: i = torch.rand(2, 3, 4, 4); i0 = i.clone(); x = i.contiguous(); x.add_(torch.rand_like(x) / 256).sub_(torch.full((1, 3, 1, 1), 0.5)); assert shares_storage(x, i) and not torch.equal(i, i0)
  x.add_(torch::rand_like(x) / 256.0).sub_(mean).div_(stdev); // EXPECT: tensor-alias-then-mutate -- the images are contiguous: contiguous() returned the caller's tensor, which is noised and normalised in place
  return x;
}

// Persistent chains on the host: [buffer_size, C, H, W] in the normalised range.
class ReplayBuffer {
public:
  ReplayBuffer(const EbmConfig &cfg, const torch::Tensor &lo, const torch::Tensor &hi)
      : reinit_prob_(cfg.reinit_prob), lo_(lo), hi_(hi) {
    data_ = lo + (hi - lo) * torch::rand({cfg.buffer_size, cfg.channels, cfg.image_size, cfg.image_size}); // LOOKALIKE: tensor-device-mismatch -- the bounds and the draw are host tensors
  }

  // n chains and their slots; reinit_prob of them restart from uniform noise.
  std::pair<torch::Tensor, torch::Tensor> sample(int64_t n) {
    auto idx = torch::randint(0, data_.size(0), {n});
    auto x = data_.index_select(0, idx);
    auto restart = torch::rand({n}) < reinit_prob_;
    auto fresh = lo_ + (hi_ - lo_) * torch::rand_like(x);
    // FACT: d = torch.rand(6, 2); d0 = d.clone(); x = d.index_select(0, torch.tensor([1, 4])); x.index_put_((torch.tensor([True, False]),), torch.zeros(1, 2)); assert is_copy_of(x, d) and torch.equal(d, d0)
    x.index_put_({restart}, fresh.index({restart})); // LOOKALIKE: tensor-alias-then-mutate -- index_select copied the rows: the buffer is not written
    return {x, idx};
  }

  void update(const torch::Tensor &idx, const torch::Tensor &samples) { data_.index_copy_(0, idx, samples.cpu()); }

private:
  double reinit_prob_;
  torch::Tensor lo_, hi_, data_;
};

class EbmTrainer {
public:
  EbmTrainer(EnergyNet model, const EbmConfig &cfg, torch::Tensor train_images, torch::Tensor test_images)
      : model_(std::move(model)), cfg_(cfg), device_(torch::kCUDA),
        mean_(torch::tensor(cfg.mean, torch::kFloat).view({1, -1, 1, 1})),
        stdev_(torch::tensor(cfg.stdev, torch::kFloat).view({1, -1, 1, 1})),
        lo_(-mean_ / stdev_), hi_((1 - mean_) / stdev_), buffer_(cfg, lo_, hi_),
        train_images_(std::move(train_images)), test_images_(std::move(test_images)) {
    model_->to(device_);
    opt_ = std::make_unique<torch::optim::Adam>(model_->parameters(),
                                                torch::optim::AdamOptions(cfg.lr).betas({0.0, 0.999}));
  }

  // Short-run SGLD from x_init (on the device): the negatives of one training step.
  torch::Tensor langevin(const torch::Tensor &x_init, int64_t steps) {
    // FACT: i = torch.randn(2, 3); i0 = i.clone(); x = i.clone(); x.requires_grad_(True); exec('with torch.no_grad(): x.sub_(1.0)'); assert torch.equal(i, i0) and not torch.equal(x.detach(), i0)
    auto x = x_init.clone(); // LOOKALIKE: tensor-unnecessary-clone -- x is stepped in place below: the caller's chains must stay as they are
    x.requires_grad_(true);
    for (int64_t k = 0; k < steps; ++k) {
      auto energy = model_->forward(x).sum();
      auto grad = torch::autograd::grad({energy}, {x})[0];
      if (grad.abs().max().item<double>() < cfg_.grad_tol) // LOOKALIKE: tensor-sync-in-loop -- the value decides whether the chain stops
        break;
      torch::NoGradGuard no_grad;
      // FACT: x = torch.randn(2, 3, requires_grad=True); exec('with torch.no_grad(): x.sub_(0.5).add_(torch.randn(2, 3))'); assert x.is_leaf and x.requires_grad
      x.sub_(0.5 * cfg_.step_size * grad); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      x.add_(cfg_.noise_std * torch::randn_like(x));
      x.clamp_(lo_.to(device_), hi_.to(device_)); // EXPECT: tensor-clone-in-loop -- the same per-channel bounds are copied to the GPU at every Langevin step
    }
    return x.detach();
  }

  // Long-run chains from noise, for the sample grid.
  torch::Tensor generate(int64_t n, int64_t steps) {
    const auto C = cfg_.channels, S = cfg_.image_size;
    model_->eval();
    auto lo = lo_.to(device_), hi = hi_.to(device_);
    auto x = torch::empty({n, C, S, S}, torch::TensorOptions().device(device_).requires_grad(true));
    auto init = lo + (hi - lo) * torch::rand({n, C, S, S}); // EXPECT: tensor-device-mismatch -- the bounds are on the GPU, the uniform draw on the CPU
    {
      torch::NoGradGuard no_grad;
      x.copy_(init); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
    for (int64_t k = 0; k < steps; ++k) {
      auto energy = model_->forward(x).sum();
      auto grad = torch::autograd::grad({energy}, {x})[0];
      // FACT: x = torch.empty(2, 3, requires_grad=True); assert raises(lambda: x.sub_(torch.ones(2, 3)), "a leaf Variable that requires grad is being used in an in-place operation")
      x.sub_(0.5 * cfg_.step_size * grad).add_(cfg_.noise_std * torch::randn_like(x)).clamp_(lo, hi); // EXPECT: tensor-inplace-on-leaf -- x requires grad for the energy gradient and grad mode is on
    }
    model_->train();
    return x.detach();
  }

  // Held-out images against fresh samples: a collapsing model drives the gap to zero.
  double held_out_gap() {
    const auto n = std::min<int64_t>(test_images_.size(0), cfg_.batch_size);
    auto x = dequantize(test_images_.narrow(0, 0, n), mean_, stdev_).to(device_);
    auto samples = generate(n, cfg_.sample_steps);
    torch::NoGradGuard no_grad;
    return (model_->forward(samples).mean() - model_->forward(x).mean()).item<double>();
  }

  void fit() {
    auto loader = torch::data::make_data_loader(
        torch::data::datasets::TensorDataset(train_images_).map(torch::data::transforms::Stack<torch::data::TensorExample>()),
        torch::data::DataLoaderOptions(cfg_.batch_size).workers(4));
    auto gap_ema = torch::zeros({}, device_);
    int64_t step = 0;
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      for (auto &batch : *loader) {
        auto x_pos = dequantize(batch.data, mean_, stdev_).to(device_);
        auto chains = buffer_.sample(x_pos.size(0));
        auto x_neg = langevin(chains.first.to(device_), cfg_.sgld_steps); // LOOKALIKE: tensor-clone-in-loop -- new chains every step
        buffer_.update(chains.second, x_neg);

        auto e_pos = model_->forward(x_pos);
        auto e_neg = model_->forward(x_neg);
        // Self-normalised weights on the negatives: the low-energy ones count more.
        auto w = e_neg.detach();
        // FACT: l = torch.nn.Linear(3, 1); e = l(torch.randn(4, 3)).squeeze(1); e0 = e.detach().clone(); w = e.detach(); w.mul_(-1.0); assert shares_storage(w, e) and torch.equal(e.detach(), -e0)
        w.mul_(-1.0 / cfg_.temperature); // EXPECT: tensor-inplace-on-detached -- e_neg itself is negated: the loss and the regulariser read the changed energies
        w = torch::softmax(w, 0);
        auto cd = e_pos.mean() - (w * e_neg).sum();
        auto reg = cfg_.alpha * (e_pos.pow(2).mean() + e_neg.pow(2).mean());
        auto loss = cd + reg;
        opt_->zero_grad();
        loss.backward();
        torch::nn::utils::clip_grad_norm_(model_->parameters(), cfg_.grad_clip);
        opt_->step();
        model_->symmetrize();

        // FACT: l = torch.nn.Linear(3, 1); g = torch.zeros(()); exec('for _ in range(3):\n e = l(torch.randn(4, 3)); g = 0.99 * g + 0.01 * e.mean()'); assert g.requires_grad and kept_nodes(g) >= 3 * 3
        gap_ema = 0.99 * gap_ema + 0.01 * (e_neg.mean() - e_pos.mean()); // EXPECT: tensor-graph-kept-across-iterations -- the running gap chains every step's graph to the next
        last_loss_ = loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, and one value at a time
        if (++step % cfg_.log_every == 0)
          std::cout << "step " << step << " loss " << loss.item<float>() << " gap " << gap_ema.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      }
      std::cout << "epoch " << epoch << " held-out gap " << held_out_gap() << "\n";
    }
  }

  torch::Tensor sample_grid(int64_t n) { return generate(n, cfg_.sample_steps).mul(stdev_.to(device_)).add(mean_.to(device_)).clamp(0, 1).cpu(); }

private:
  EnergyNet model_;
  EbmConfig cfg_;
  torch::Device device_;
  torch::Tensor mean_, stdev_, lo_, hi_;
  ReplayBuffer buffer_;
  torch::Tensor train_images_, test_images_, last_loss_;
  std::unique_ptr<torch::optim::Adam> opt_;
};
