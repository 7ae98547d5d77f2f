// FGSM / PGD adversarial examples for robustness evaluation.
#include <torch/torch.h>

torch::Tensor fgsm(torch::nn::Sequential &model, const torch::Tensor &x, const torch::Tensor &y, double eps) {
  auto x_adv = x.detach();
  // FACT: x = torch.randn(3); d = x.detach(); d.requires_grad_(True); assert shares_storage(d, x) and torch.equal(d, x)
  x_adv.requires_grad_(true); // LOOKALIKE: tensor-inplace-on-detached -- requires_grad_ sets a flag, it writes no data
  auto loss = torch::nn::functional::cross_entropy(model->forward(x_adv), y);
  loss.backward();
  return (x_adv + eps * x_adv.grad().sign()).clamp(0, 1).detach();
}

torch::Tensor pgd(torch::nn::Sequential &model, const torch::Tensor &x, const torch::Tensor &y, double eps,
                  double step, int iters) {
  auto adv = x.detach().clone();
  for (int i = 0; i < iters; ++i) {
    adv.requires_grad_(true);
    auto loss = torch::nn::functional::cross_entropy(model->forward(adv), y);
    auto grad = torch::autograd::grad({loss}, {adv})[0];
    adv = adv.detach();
    adv.add_(step * grad.sign()); // LOOKALIKE: tensor-inplace-on-detached -- adv started as a clone, its graph is discarded on purpose
    adv = torch::min(torch::max(adv, x - eps), x + eps).clamp(0, 1);
  }
  return adv;
}

// Random start for PGD, written without the clone.
torch::Tensor random_start(const torch::Tensor &x, double eps) {
  auto start = x.detach();
  // FACT: x = torch.rand(3); s = x.detach(); s.add_(1); assert x.min() >= 1
  start.add_(torch::empty_like(start).uniform_(-eps, eps)); // EXPECT: tensor-inplace-on-detached
  return torch::stack({x, start});
}
