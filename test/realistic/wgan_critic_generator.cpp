// WGAN with weight clipping: n_critic critic steps per generator step, one RMSprop optimizer each.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <vector>

struct WganConfig {
  int64_t nz = 100, ngf = 64, ndf = 64, channels = 3;
  int64_t n_critic = 5;
  double clip = 0.01, lr = 5e-5, noise_std = 0.1;
  int64_t log_every = 100;
};

struct GeneratorImpl : torch::nn::Module {
  explicit GeneratorImpl(const WganConfig &cfg) : ngf_(cfg.ngf), noise_std_(cfg.noise_std) {
    using torch::nn::ConvTranspose2dOptions;
    fc_ = register_module("fc", torch::nn::Linear(cfg.nz, 4 * cfg.ngf * 4 * 4));
    up1_ = register_module("up1", torch::nn::ConvTranspose2d(
                                      ConvTranspose2dOptions(4 * cfg.ngf, 2 * cfg.ngf, 4).stride(2).padding(1).bias(false)));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(2 * cfg.ngf));
    up2_ = register_module("up2", torch::nn::ConvTranspose2d(
                                      ConvTranspose2dOptions(2 * cfg.ngf, cfg.ngf, 4).stride(2).padding(1).bias(false)));
    bn2_ = register_module("bn2", torch::nn::BatchNorm2d(cfg.ngf));
    out_ = register_module("out", torch::nn::ConvTranspose2d(
                                      ConvTranspose2dOptions(cfg.ngf, cfg.channels, 4).stride(2).padding(1)));
  }

  torch::Tensor forward(const torch::Tensor &z) {
    // FACT: y = torch.nn.Linear(3, 32)(torch.randn(2, 3)); assert is_view_of(y.view(2, 2, 4, 4), y)
    auto h = fc_(z).view({z.size(0), 4 * ngf_, 4, 4}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    h = torch::relu(bn1_(up1_(h)));
    // Noise injection for more varied samples.
    // FACT: h = torch.relu(torch.nn.BatchNorm2d(2)(torch.randn(2, 2, 3, 3, requires_grad=True))); h.add_(torch.randn_like(h) * 0.1); assert backward_fails(lambda: h.sum().backward())
    h.add_(torch::randn_like(h) * noise_std_); // EXPECT: tensor-inplace-on-saved -- relu saved its result; the generator's backward raises
    h = torch::relu(bn2_(up2_(h)));
    return torch::tanh(out_(h));
  }

  int64_t ngf_;
  double noise_std_;
  torch::nn::Linear fc_{nullptr};
  torch::nn::ConvTranspose2d up1_{nullptr}, up2_{nullptr}, out_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
};
TORCH_MODULE(Generator);

struct CriticImpl : torch::nn::Module {
  explicit CriticImpl(const WganConfig &cfg) {
    using torch::nn::Conv2dOptions;
    c1_ = register_module("c1", torch::nn::Conv2d(Conv2dOptions(cfg.channels, cfg.ndf, 4).stride(2).padding(1)));
    c2_ = register_module("c2", torch::nn::Conv2d(Conv2dOptions(cfg.ndf, 2 * cfg.ndf, 4).stride(2).padding(1)));
    c3_ = register_module("c3", torch::nn::Conv2d(Conv2dOptions(2 * cfg.ndf, 4 * cfg.ndf, 4).stride(2).padding(1)));
    fc_ = register_module("fc", torch::nn::Linear(4 * cfg.ndf * 4 * 4, 1));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::leaky_relu(c1_(x), 0.2);
    h = torch::leaky_relu(c2_(h), 0.2);
    h = torch::leaky_relu(c3_(h), 0.2);
    // FACT: h = torch.nn.functional.leaky_relu(torch.nn.Conv2d(3, 4, 3)(torch.randn(2, 3, 6, 6)), 0.2); assert is_view_of(h.flatten(1), h)
    return fc_(h.flatten(1)); // LOOKALIKE: tensor-reshape-non-contiguous -- the conv activations are contiguous, flatten is a view
  }

  torch::nn::Conv2d c1_{nullptr}, c2_{nullptr}, c3_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(Critic);

std::vector<torch::Tensor> train_wgan(Generator &G, Critic &D, const std::vector<torch::Tensor> &batches,
                                      const WganConfig &cfg, int epochs) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  G->to(device);
  D->to(device);
  torch::optim::RMSprop g_opt(G->parameters(), torch::optim::RMSpropOptions(cfg.lr));
  torch::optim::RMSprop d_opt(D->parameters(), torch::optim::RMSpropOptions(cfg.lr));
  std::vector<torch::Tensor> previews;

  for (int epoch = 0; epoch < epochs; ++epoch) {
    torch::Tensor g_loss_sum = torch::zeros({}, device);
    int64_t g_steps = 0;
    for (size_t i = 0; i + cfg.n_critic <= batches.size(); i += cfg.n_critic) {
      // Critic: maximise D(real) - D(fake), then clip its weights.
      double w_dist = 0;
      for (int64_t c = 0; c < cfg.n_critic; ++c) {
        auto real = batches[i + c].to(device);
        auto z = torch::randn({real.size(0), cfg.nz}, real.options());
        auto fake = G->forward(z).detach();
        auto d_loss = D->forward(fake).mean() - D->forward(real).mean();
        d_opt.zero_grad();
        d_loss.backward();
        d_opt.step();
        // FACT: p = torch.nn.Parameter(torch.randn(3)); p.data.clamp_(-0.01, 0.01); assert p.abs().max() <= 0.01 and p.is_leaf and p.requires_grad
        for (auto &p : D->parameters())
          p.data().clamp_(-cfg.clip, cfg.clip); // LOOKALIKE: tensor-inplace-on-detached, tensor-inplace-on-leaf -- WGAN weight clipping through data(), a direct chain
        w_dist -= d_loss.item<double>(); // EXPECT: tensor-sync-in-loop -- every critic step waits for the GPU just to add up
      }

      // Generator: one step on a fresh batch of samples.
      auto z = torch::randn({batches[i].size(0), cfg.nz}, torch::TensorOptions().device(device));
      auto fake = G->forward(z);
      auto preview = fake.detach();
      // FACT: f = torch.tanh(torch.randn(2, 3, requires_grad=True)); p = f.detach(); p.mul_(0.5).add_(0.5); assert backward_fails(lambda: f.sum().backward())
      preview.mul_(0.5).add_(0.5); // EXPECT: tensor-inplace-on-detached -- rescales 'fake' itself, whose tanh result the generator's backward needs
      auto g_loss = -D->forward(fake).mean();
      g_opt.zero_grad();
      g_loss.backward();
      g_opt.step();
      // FACT: m = torch.nn.Linear(3, 1); s = torch.zeros(()); exec('for _ in range(3):\n l = -m(torch.randn(2, 3)).mean(); l.backward(); s = s + l'); assert kept_nodes(s) >= 6
      g_loss_sum = g_loss_sum + g_loss; // EXPECT: tensor-graph-kept-across-iterations -- only printed at the end of the epoch
      if (++g_steps % cfg.log_every == 0) {
        std::cout << "W " << w_dist / cfg.n_critic << " G " << g_loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every generator steps
        previews.push_back(preview.cpu());
      }
    }
    std::cout << "epoch " << epoch << " mean G loss "
              << (g_loss_sum / std::max<int64_t>(g_steps, 1)).item<float>() << "\n";
  }
  return previews;
}
