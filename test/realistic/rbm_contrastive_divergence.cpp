// Bernoulli-Bernoulli restricted Boltzmann machine on MNIST, trained with contrastive divergence
// (CD-k, Hinton 2002) or persistent CD (Tieleman 2008). There is no loss to differentiate: the
// update is the difference of data and model statistics, applied by hand under NoGradGuard with
// momentum and weight decay, following Hinton's "practical guide". Progress is watched through the
// free-energy gap between training and held-out images (it grows when the model overfits), the
// reconstruction error and a stochastic pseudo-log-likelihood; filters and samples are saved as
// 8-bit image grids.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct RbmConfig {
  int64_t n_visible = 784, n_hidden = 500, cd_k = 1, n_chains = 100, batch = 100, epochs = 50;
  int64_t log_every = 100, grid_cols = 20, sample_steps = 1000, n_probe = 1000, momentum_switch = 5;
  double lr = 0.01, momentum_init = 0.5, momentum_final = 0.9, weight_decay = 2e-4;
  bool persistent = true;
};

struct RbmImpl : nn::Module {
  explicit RbmImpl(const RbmConfig &cfg) {
    W = register_parameter("W", torch::randn({cfg.n_hidden, cfg.n_visible}) * 0.01);
    b_v = register_parameter("b_v", torch::zeros({cfg.n_visible}));
    c_h = register_parameter("c_h", torch::zeros({cfg.n_hidden}));
  }

  torch::Tensor prob_h(const torch::Tensor &v) { return torch::sigmoid(F::linear(v, W, c_h)); }
  torch::Tensor prob_v(const torch::Tensor &h) { return torch::sigmoid(F::linear(h, W.t(), b_v)); }

  // F(v) = -v.b_v - sum_j softplus(c_j + W_j.v), one value per row of v.
  torch::Tensor free_energy(const torch::Tensor &v) { return -v.matmul(b_v) - F::softplus(F::linear(v, W, c_h)).sum(1); }

  // k steps of block Gibbs sampling v -> h -> v.
  torch::Tensor gibbs_k(torch::Tensor v, int64_t k) {
    for (int64_t s = 0; s < k; ++s)
      v = torch::bernoulli(prob_v(torch::bernoulli(prob_h(v))));
    return v;
  }

  // A long chain from noise, to look at what the model has learned; returns the last mean-field image.
  torch::Tensor sample(int64_t n, int64_t steps) {
    torch::NoGradGuard no_grad;
    auto v = torch::bernoulli(torch::full({n, b_v.size(0)}, 0.5, b_v.options())); // LOOKALIKE: tensor-device-mismatch -- made with b_v's options: on the model's device
    torch::Tensor pv;
    for (int64_t s = 0; s < steps; ++s) {
      auto h = torch::bernoulli(prob_h(v));
      auto wt = W.t().contiguous(); // EXPECT: tensor-clone-in-loop -- W does not change while sampling: a full transposed copy of the weights at every Gibbs step
      pv = torch::sigmoid(torch::addmm(b_v, h, wt));
      v = torch::bernoulli(pv);
    }
    return pv;
  }

  torch::Tensor W, b_v, c_h;
};
TORCH_MODULE(Rbm);

class CdTrainer {
public:
  CdTrainer(Rbm rbm, const RbmConfig &cfg, torch::Device device) : rbm_(std::move(rbm)), cfg_(cfg) {
    for (const auto &p : rbm_->parameters())
      velocity_.push_back(torch::zeros_like(p)); // LOOKALIKE: tensor-graph-kept-across-iterations -- zeros_like makes a fresh tensor with no history
    chains_ = torch::bernoulli(torch::full({cfg.n_chains, cfg.n_visible}, 0.5, torch::TensorOptions().device(device)));
  }

  // Hinton's guide: visible biases start at log(p / (1 - p)) of the training pixel means.
  void init_visible_bias(const torch::Tensor &train_images) {
    torch::NoGradGuard no_grad;
    auto p = train_images.mean(0).clamp(1e-3, 1.0 - 1e-3);
    rbm_->b_v.copy_(torch::log(p / (1 - p))); // LOOKALIKE: tensor-inplace-on-leaf, tensor-device-mismatch -- under NoGradGuard, and copy_ may cross devices
  }

  // One CD-k / PCD-k update from the binary batch v0 [B, V]; returns the batch's reconstruction error.
  torch::Tensor step(const torch::Tensor &v0, double momentum) {
    torch::NoGradGuard no_grad;
    auto ph0 = rbm_->prob_h(v0);
    torch::Tensor vk;
    if (cfg_.persistent) {
      chains_ = rbm_->gibbs_k(chains_, cfg_.cd_k); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, and the handle is replaced, not accumulated
      vk = chains_;
    } else {
      // CD: the negative chain starts at the data.
      vk = v0;
      for (int64_t s = 0; s < cfg_.cd_k; ++s) {
        auto hk = torch::bernoulli(rbm_->prob_h(vk));
        // FACT: v0 = torch.ones(4, 6); vk = v0; vk.bernoulli_(torch.zeros(4, 6)); assert shares_storage(vk, v0) and float(v0.sum()) == 0.0
        vk.bernoulli_(rbm_->prob_v(hk)); // EXPECT: tensor-alias-then-mutate -- vk is v0: the batch is replaced by model samples, so the positive statistics and the reconstruction error below read samples
      }
    }
    auto phk = rbm_->prob_h(vk);
    const auto n = static_cast<double>(v0.size(0)), m = static_cast<double>(vk.size(0));
    std::vector<torch::Tensor> grads{ph0.t().mm(v0) / n - phk.t().mm(vk) / m, v0.mean(0) - vk.mean(0), ph0.mean(0) - phk.mean(0)};
    auto params = rbm_->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      velocity_[i].mul_(momentum).add_(grads[i], cfg_.lr);
      params[i].add_(velocity_[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
    auto diff = v0.clone(); // EXPECT: tensor-unnecessary-clone -- rewritten at once by sub_: v0 - prob_v(ph0) is the same tensor in one pass
    diff.sub_(rbm_->prob_v(ph0));
    return diff.pow(2).sum(1).mean();
  }

  // L2 decay of the weights (not the biases) after every update.
  void decay_weights() {
    // FACT: p = torch.nn.Parameter(torch.randn(5, 7)); assert raises(lambda: p.mul_(1.0 - 2e-6), "a leaf Variable that requires grad")
    rbm_->W.mul_(1.0 - cfg_.lr * cfg_.weight_decay); // EXPECT: tensor-inplace-on-leaf -- outside step()'s NoGradGuard: W requires grad and PyTorch refuses the write
  }

private:
  Rbm rbm_;
  RbmConfig cfg_;
  std::vector<torch::Tensor> velocity_;
  torch::Tensor chains_;
};

// Stochastic pseudo-log-likelihood: flip one random pixel per image and compare free energies.
double pseudo_log_likelihood(Rbm &rbm, const torch::Tensor &v) {
  torch::NoGradGuard no_grad;
  const auto B = v.size(0), V = v.size(1);
  auto rows = torch::arange(B, v.options().dtype(torch::kLong));
  auto cols = torch::randint(V, {B}, v.options().dtype(torch::kLong));
  // FACT: v = torch.bernoulli(torch.full((4, 6), 0.5)); f = v.clone(); f[torch.arange(4), torch.tensor([0, 2, 1, 5])] = 1 - v[torch.arange(4), torch.tensor([0, 2, 1, 5])]; assert is_copy_of(f, v) and not torch.equal(f, v)
  auto flipped = v.clone(); // LOOKALIKE: tensor-unnecessary-clone -- the copy is written below while v is still read
  flipped.index_put_({rows, cols}, 1 - v.index({rows, cols}));
  auto fe = rbm->free_energy(v), fe_flip = rbm->free_energy(flipped);
  return static_cast<double>(V) * F::logsigmoid(fe_flip - fe).mean().item<double>();
}

// The first filters as a grid of 28x28 tiles, each stretched to [0, 255].
torch::Tensor filter_grid(Rbm &rbm, const RbmConfig &cfg) {
  const int64_t side = 28, n = std::min<int64_t>(rbm->W.size(0), 5 * cfg.grid_cols), cols = cfg.grid_cols;
  auto grid = torch::zeros({((n + cols - 1) / cols) * side, cols * side}, torch::kUInt8);
  auto filters = rbm->W.detach().narrow(0, 0, n);
  auto lo = filters.amin(1, true), hi = filters.amax(1, true);
  // FACT: W = torch.nn.Parameter(torch.randn(6, 784)); f = W.detach().narrow(0, 0, 4); f.sub_(f.amin(1, True)).div_(1.0); assert shares_storage(f, W) and float(W.detach()[:4].min()) == 0.0
  filters.sub_(lo).div_((hi - lo).clamp_min(1e-8)); // EXPECT: tensor-inplace-on-detached -- filters is a view of the live weights: saving the picture rescales the first rows of W
  for (int64_t i = 0; i < n; ++i) {
    auto tile = grid.narrow(0, (i / cols) * side, side).narrow(1, (i % cols) * side, side);
    // FACT: W = torch.rand(6, 784); assert is_view_of(W.narrow(0, 0, 4)[1].view(28, 28), W)
    auto img = filters[i].view({side, side}); // LOOKALIKE: tensor-view-non-contiguous -- a row of the contiguous weight matrix
    // FACT: t = torch.zeros(2, 2, dtype=torch.uint8); t.copy_(torch.tensor([[254.9, 0.7], [1.5, 3.99]])); assert t.tolist() == [[254, 0], [1, 3]]
    tile.copy_(img * 255); // EXPECT: tensor-copy-narrowing -- float to uint8 truncates: every pixel rounds down
  }
  return grid;
}

torch::Tensor sample_grid(Rbm &rbm, const RbmConfig &cfg) {
  const int64_t side = 28, rows = 5, n = rows * cfg.grid_cols;
  auto probs = rbm->sample(n, cfg.sample_steps).cpu();
  auto grid = torch::zeros({rows * side, cfg.grid_cols * side}, torch::kUInt8);
  for (int64_t i = 0; i < n; ++i) {
    auto tile = grid.narrow(0, (i / cfg.grid_cols) * side, side).narrow(1, (i % cfg.grid_cols) * side, side);
    tile.copy_((probs[i].view({side, side}) * 255).round()); // LOOKALIKE: tensor-copy-narrowing -- rounded to whole levels first, in [0, 255]
  }
  return grid;
}

// images: [N, 784] grey levels in [0, 1], on the host.
void fit(Rbm &rbm, const torch::Tensor &train_images, const torch::Tensor &val_images, const RbmConfig &cfg) {
  torch::Device device(torch::kCUDA);
  rbm->to(device);
  CdTrainer trainer(rbm, cfg, device);
  trainer.init_visible_bias(train_images);
  const auto n_probe = std::min<int64_t>(cfg.n_probe, val_images.size(0));
  auto probe_train = torch::bernoulli(train_images.narrow(0, 0, n_probe)).to(device);
  auto probe_val = torch::bernoulli(val_images.narrow(0, 0, n_probe)).to(device);
  std::vector<torch::Tensor> fe_gap;
  const auto N = train_images.size(0);
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    const double momentum = epoch < cfg.momentum_switch ? cfg.momentum_init : cfg.momentum_final;
    auto perm = torch::randperm(N);
    auto w_before = rbm->W.detach().clone(); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- a snapshot: the epoch's updates change W before it is compared
    double recon_sum = 0;
    int64_t batches = 0;
    for (int64_t i = 0; i + cfg.batch <= N; i += cfg.batch) {
      auto x = train_images.index_select(0, perm.narrow(0, i, cfg.batch)).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      // Stochastic binarisation: every pass sees a fresh binary sample of the grey levels.
      auto v = (x > torch::rand(x.sizes())).to(torch::kFloat); // EXPECT: tensor-device-mismatch -- the thresholds are drawn on the host, the batch is on the GPU
      recon_sum += trainer.step(v, momentum).item<double>(); // EXPECT: tensor-sync-in-loop -- every update waits for the GPU only to sum the error
      trainer.decay_weights();
      if (++batches % cfg.log_every == 0)
        std::cout << "  batch " << batches << " recon " << recon_sum / static_cast<double>(batches) << "\n";
    }
    auto gap = rbm->free_energy(probe_val).mean() - rbm->free_energy(probe_train).mean();
    fe_gap.push_back(gap); // EXPECT: tensor-graph-kept-across-iterations -- W, b_v and c_h require grad and no NoGradGuard is active: every epoch's graph and activations stay alive
    const double dw = (rbm->W.detach() - w_before).norm().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the pass over the batches
    std::cout << "epoch " << epoch << " recon " << recon_sum / static_cast<double>(std::max<int64_t>(batches, 1)) << " |dW| " << dw
              << " free-energy gap " << gap.item<double>() // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the pass over the batches
              << " pll " << pseudo_log_likelihood(rbm, probe_val) << "\n";
    if (epoch % 10 == 9) {
      torch::save(filter_grid(rbm, cfg), "filters_" + std::to_string(epoch + 1) + ".pt");
      torch::save(sample_grid(rbm, cfg), "samples_" + std::to_string(epoch + 1) + ".pt");
    }
  }
  auto gaps = torch::stack(fe_gap).cpu();
  std::cout << "largest free-energy gap " << gaps.max().item<double>() << "\n";
}
