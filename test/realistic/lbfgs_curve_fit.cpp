// Fitting a small model with LBFGS: the optimizer calls a closure that recomputes the loss, one
// or more times per step; a second pass logs every step with a closure kept for later.
#include <torch/torch.h>
#include <functional>
#include <iostream>
#include <vector>

torch::Tensor features(const torch::Tensor &x) {
  return torch::cat({x, x.pow(2), torch::sin(x)}, 1); // fresh storage: not a view of x
}

torch::Tensor fit(const torch::Tensor &x, const torch::Tensor &y, int epochs) {
  auto w = torch::zeros({3, 1}, torch::requires_grad());
  torch::optim::LBFGS opt({w}, torch::optim::LBFGSOptions(0.5).max_iter(20));
  torch::Tensor design = features(x);
  std::vector<std::function<double()>> reports;
  for (int e = 0; e < epochs; ++e) {
    auto closure = [&] {
      opt.zero_grad();
      auto target = y.clone(); // EXPECT: tensor-clone-in-loop
      auto inputs = design.clone(); // EXPECT: tensor-clone-in-loop
      auto loss = torch::mse_loss(inputs.matmul(w), target);
      loss.backward();
      return loss;
    };
    opt.step(closure);
    auto residual = [&] { return (design.matmul(w) - y.clone()).abs().mean().item<double>(); }; // LOOKALIKE: tensor-clone-in-loop -- kept for later, never run in this loop
    reports.push_back(residual);
  }
  return w.detach();
}

torch::Tensor refine(torch::Tensor w, const torch::Tensor &x, int rounds) {
  torch::optim::LBFGS opt({w}, torch::optim::LBFGSOptions(0.1));
  torch::Tensor moved = torch::zeros({});
  for (int r = 0; r < rounds; ++r) {
    auto before = w.detach().clone(); // LOOKALIKE: tensor-clone-in-loop -- w is the optimizer's parameter: step() moves it
    opt.step([&] {
      opt.zero_grad();
      auto loss = x.matmul(w).pow(2).sum();
      auto scale = w.clone(); // EXPECT: tensor-unnecessary-clone
      loss = loss + x.matmul(scale.detach()).mean();
      loss.backward();
      return loss;
    });
    moved = moved + (w.detach() - before).abs().sum();
  }
  return moved;
}

// On the GPU when there is one, printing the loss of every closure evaluation.
torch::Tensor fit_verbose(const torch::Tensor &x, const torch::Tensor &y, int epochs) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto w = torch::zeros({x.size(1), 1}, torch::TensorOptions().device(device).requires_grad(true));
  torch::optim::LBFGS opt({w}, torch::optim::LBFGSOptions(0.5));
  for (int e = 0; e < epochs; ++e) {
    opt.step([&] {
      opt.zero_grad();
      auto loss = torch::mse_loss(x.to(device).matmul(w), y.to(device)); // EXPECT: tensor-clone-in-loop
      loss.backward();
      std::cout << "loss " << loss.item<double>() << "\n"; // EXPECT: tensor-sync-in-loop
      return loss;
    });
    if (e % 10 == 0)
      std::cout << "epoch " << e << " |w| " << w.norm().item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every tenth epoch
  }
  return w.detach();
}
