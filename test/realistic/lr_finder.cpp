// Learning-rate range test: restores the initial weights after the sweep.
#include <torch/torch.h>
#include <vector>

std::vector<double> lr_range_test(torch::nn::Linear &model, const torch::Tensor &x, const torch::Tensor &y,
                                  double lr_min, double lr_max, int steps) {
  std::vector<double> losses;
  auto initial = model->weight.detach().clone();
  torch::optim::SGD opt(model->parameters(), lr_min);
  for (int i = 0; i < steps; ++i) {
    double lr = lr_min * std::pow(lr_max / lr_min, double(i) / steps);
    static_cast<torch::optim::SGDOptions &>(opt.param_groups()[0].options()).lr(lr);
    auto loss = torch::mse_loss(model->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  torch::NoGradGuard no_grad;
  model->weight.copy_(initial);
  return losses;
}

// Perturbation test: how much the loss moves with the weights shifted by eps.
double sensitivity(torch::nn::Linear &model, const torch::Tensor &x, const torch::Tensor &y, double eps) {
  auto base = torch::mse_loss(model->forward(x), y);
  auto w = model->weight.detach();
  // FACT: lin = torch.nn.Linear(3, 2); w0 = lin.weight.clone(); w = lin.weight.detach(); w.add_(0.1); assert not torch.equal(lin.weight, w0)
  w.add_(eps); // EXPECT: tensor-inplace-on-detached
  auto shifted = torch::mse_loss(model->forward(x), y);
  base.backward();
  return (shifted - base).item<double>();
}
