// One DCGAN step: discriminator on real and detached fake images, then the generator.
#include <torch/torch.h>

struct GanStep {
  torch::nn::Sequential G, D;
  torch::optim::Adam g_opt, d_opt;
  double instance_noise;

  GanStep(torch::nn::Sequential g, torch::nn::Sequential d, double noise)
      : G(g), D(d), g_opt(g->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})),
        d_opt(d->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})), instance_noise(noise) {}

  void step(const torch::Tensor &real, int64_t nz) {
    auto B = real.size(0);
    auto z = torch::randn({B, nz, 1, 1});
    auto fake = G->forward(z);

    // discriminator: the generator must not get gradients from this part
    auto fake_in = fake.detach();
    // FACT: f = torch.tanh(torch.randn(2, 3, requires_grad=True)); d = f.detach(); d.add_(0.1); assert backward_fails(lambda: f.sum().backward())
    fake_in.add_(torch::randn_like(fake_in) * instance_noise); // EXPECT: tensor-inplace-on-detached
    auto d_loss = torch::binary_cross_entropy_with_logits(D->forward(real), torch::ones({B, 1, 1, 1})) +
                  torch::binary_cross_entropy_with_logits(D->forward(fake_in), torch::zeros({B, 1, 1, 1}));
    d_opt.zero_grad();
    d_loss.backward();
    d_opt.step();

    // generator step reuses the same fake batch
    auto g_loss = torch::binary_cross_entropy_with_logits(D->forward(fake), torch::ones({B, 1, 1, 1}));
    g_opt.zero_grad();
    g_loss.backward();
    g_opt.step();
  }
};

torch::Tensor sample_grid(torch::nn::Sequential &G, int64_t n, int64_t nz) {
  torch::NoGradGuard no_grad;
  auto imgs = G->forward(torch::randn({n, nz, 1, 1}));
  auto shown = imgs.detach().clone();  // EXPECT: tensor-unnecessary-clone -- rewritten in place at once: imgs.detach().mul(0.5) makes the same tensor in one pass
  // FACT: g = torch.randn(2, 3, requires_grad=True) * 1; s = g.detach().clone(); s.mul_(0.5); assert is_copy_of(s, g)
  shown.mul_(0.5).add_(0.5); // LOOKALIKE: tensor-inplace-on-detached -- detach().clone() is an owned copy
  return shown;
}
