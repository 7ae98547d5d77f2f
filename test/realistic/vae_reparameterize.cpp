// A small VAE encoder with the reparameterisation trick.
#include <torch/torch.h>

struct Encoder : torch::nn::Module {
  Encoder(int64_t in, int64_t latent) {
    hidden = register_module("hidden", torch::nn::Linear(in, 64));
    mu = register_module("mu", torch::nn::Linear(64, latent));
    logvar = register_module("logvar", torch::nn::Linear(64, latent));
    dec = register_module("dec", torch::nn::Linear(latent, in));
  }
  torch::nn::Linear hidden{nullptr}, mu{nullptr}, logvar{nullptr}, dec{nullptr};
};

int main() {
  Encoder enc(32, 8);
  torch::optim::Adam opt(enc.parameters(), 1e-3);
  for (int step = 0; step < 10; ++step) {
    auto x = torch::rand({16, 32});
    auto h = enc.hidden(x);
    h.relu_(); // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    auto m = enc.mu(h);
    auto lv = enc.logvar(h);
    auto std = torch::exp(0.5 * lv);
    // FACT: v = torch.randn(3, requires_grad=True) * 1; assert backward_fails(lambda: (lambda s: (s.mul_(torch.randn(3)), s.sum().backward()))(torch.exp(v)))
    std.mul_(torch::randn_like(std)); // EXPECT: tensor-inplace-on-saved
    auto z = m + std;
    auto recon = torch::sigmoid(enc.dec(z));
    auto kl = -0.5 * torch::mean(1 + lv - m.pow(2) - lv.exp());
    auto loss = torch::binary_cross_entropy(recon, x) + kl;
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}
