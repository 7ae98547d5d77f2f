// Gradient accumulation written with a summed loss, and a per-sample weighted loss.
#include <torch/torch.h>
#include <iostream>
#include <vector>

void train_micro_batches(torch::nn::Sequential &model, torch::optim::Optimizer &opt,
                         const std::vector<std::vector<torch::Tensor>> &steps,
                         const std::vector<std::vector<torch::Tensor>> &targets) {
  for (size_t s = 0; s < steps.size(); ++s) {
    torch::Tensor total_loss = torch::zeros({});
    for (size_t m = 0; m < steps[s].size(); ++m) {
      auto out = model->forward(steps[s][m]);
      total_loss += torch::mse_loss(out, targets[s][m]) / static_cast<double>(steps[s].size()); // LOOKALIKE: tensor-graph-kept-across-iterations -- differentiated after the inner loop: gradient accumulation
    }
    opt.zero_grad();
    total_loss.backward();
    opt.step();
  }
}

// Per-sample losses stacked for a weighted mean, then one backward.
void train_weighted(torch::nn::Sequential &model, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs,
                    const std::vector<torch::Tensor> &ys, const torch::Tensor &weights) {
  std::vector<torch::Tensor> losses;
  for (size_t i = 0; i < xs.size(); ++i)
    losses.push_back(torch::mse_loss(model->forward(xs[i]), ys[i])); // LOOKALIKE: tensor-graph-kept-across-iterations -- torch::stack(losses) is differentiated below
  auto loss = (torch::stack(losses) * weights).sum() / weights.sum();
  opt.zero_grad();
  loss.backward();
  opt.step();
}

// Logging the per-step gradient norms: the norms come from .grad(), which has no graph.
std::vector<torch::Tensor> grad_norms(torch::nn::Sequential &model, torch::optim::Optimizer &opt,
                                      const std::vector<torch::Tensor> &xs, const std::vector<torch::Tensor> &ys) {
  std::vector<torch::Tensor> norms, losses;
  for (size_t i = 0; i < xs.size(); ++i) {
    auto loss = torch::mse_loss(model->forward(xs[i]), ys[i]);
    opt.zero_grad();
    loss.backward();
    norms.push_back(model->parameters()[0].grad().norm()); // LOOKALIKE: tensor-graph-kept-across-iterations -- gradients do not require grad
    opt.step();
    // FACT: m = torch.nn.Linear(3, 1); ls = []; [ls.append(m(torch.randn(2, 3)).pow(2).mean()) for _ in range(3)]; [l.backward() for l in ls]; assert kept_nodes(ls) >= 3
    losses.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations
  }
  std::cout << torch::stack(losses).mean().item<double>() << "\n";
  return norms;
}
