// Variational autoencoder: encoder, reparameterisation, decoder and the ELBO.
#include <torch/torch.h>

struct VaeImpl : torch::nn::Module {
  VaeImpl(int64_t in, int64_t hidden, int64_t latent) {
    enc_ = register_module("enc", torch::nn::Linear(in, hidden));
    mu_ = register_module("mu", torch::nn::Linear(hidden, latent));
    logvar_ = register_module("logvar", torch::nn::Linear(hidden, latent));
    dec1_ = register_module("dec1", torch::nn::Linear(latent, hidden));
    dec2_ = register_module("dec2", torch::nn::Linear(hidden, in));
  }

  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    // FACT: x = torch.randn(2, 1, 4, 4); assert is_view_of(x.view(2, -1), x)
    auto h = torch::relu(enc_(x.view({x.size(0), -1}))); // LOOKALIKE: tensor-view-non-contiguous -- input batches are contiguous
    auto mu = mu_(h), logvar = logvar_(h);
    auto z = mu + torch::randn_like(mu) * torch::exp(0.5 * logvar);
    return {torch::sigmoid(dec2_(torch::relu(dec1_(z)))), mu, logvar};
  }

  torch::nn::Linear enc_{nullptr}, mu_{nullptr}, logvar_{nullptr}, dec1_{nullptr}, dec2_{nullptr};
};
TORCH_MODULE(Vae);

torch::Tensor elbo(Vae &vae, const torch::Tensor &x, double beta) {
  auto [recon, mu, logvar] = vae->forward(x);
  auto bce = torch::binary_cross_entropy(recon, x.view({x.size(0), -1}), {}, at::Reduction::Sum);
  auto kld = -0.5 * torch::sum(1 + logvar - mu.pow(2) - logvar.exp());
  // clipped reconstruction kept for the preview grid
  auto preview = recon.detach();
  // FACT: r = torch.sigmoid(torch.randn(2, 3, requires_grad=True)); p = r.detach(); p.mul_(2); assert backward_fails(lambda: r.sum().backward())
  preview.mul_(255).round_(); // EXPECT: tensor-inplace-on-detached
  auto loss = bce + beta * kld;
  loss.backward();
  return preview;
}
