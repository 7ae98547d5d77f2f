// Epoch loop of a tabular regressor; the epoch loss is reported per epoch.
#include <torch/torch.h>
#include <iostream>
#include <vector>

struct RegressorImpl : torch::nn::Module {
  RegressorImpl(int64_t in, int64_t hidden) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Regressor);

void fit(Regressor &model, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs,
         const std::vector<torch::Tensor> &ys, int epochs) {
  for (int epoch = 0; epoch < epochs; ++epoch) {
    torch::Tensor epoch_loss = torch::zeros({});
    for (size_t i = 0; i < xs.size(); ++i) {
      auto pred = model->forward(xs[i]);
      auto loss = torch::mse_loss(pred, ys[i]);
      opt.zero_grad();
      loss.backward();
      opt.step();
      // FACT: m = torch.nn.Linear(4, 1); t = torch.zeros(()); [t.add_(torch.nn.functional.mse_loss(m(torch.randn(2, 4)), torch.zeros(2, 1))) for _ in range(5)]; assert kept_nodes(t) > 5
      epoch_loss += loss; // EXPECT: tensor-graph-kept-across-iterations
    }
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<float>() / xs.size() << "\n";
  }
}

// The same loop written the usual way: the loss is read out as a number.
double fit_one_epoch(Regressor &model, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs,
                     const std::vector<torch::Tensor> &ys) {
  double running = 0.0;
  torch::Tensor running_t = torch::zeros({});
  for (size_t i = 0; i < xs.size(); ++i) {
    auto loss = torch::mse_loss(model->forward(xs[i]), ys[i]);
    opt.zero_grad();
    loss.backward();
    opt.step();
    running += loss.item<double>(); // LOOKALIKE: tensor-graph-kept-across-iterations -- item() is a plain number
    // FACT: m = torch.nn.Linear(4, 1); t = torch.zeros(()); [t.add_(m(torch.randn(2, 4)).sum().detach()) for _ in range(5)]; assert kept_nodes(t) == 0
    running_t += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph
  }
  std::cout << "check " << running_t.item<double>() << "\n";
  return running / xs.size();
}

// Keeps the last batch's loss for the progress bar.
torch::Tensor last_loss(Regressor &model, const std::vector<torch::Tensor> &xs, const std::vector<torch::Tensor> &ys) {
  torch::Tensor last;
  for (size_t i = 0; i < xs.size(); ++i) {
    auto loss = torch::mse_loss(model->forward(xs[i]), ys[i]);
    loss.backward();
    // FACT: m = torch.nn.Linear(4, 1); ls = [m(torch.randn(2, 4)).sum() for _ in range(5)]; assert kept_nodes(ls[-1]) < kept_nodes(ls)
    last = loss; // LOOKALIKE: tensor-graph-kept-across-iterations -- overwritten each iteration: one graph at a time
  }
  return last;
}
