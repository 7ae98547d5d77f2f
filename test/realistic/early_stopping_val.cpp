// Early stopping on the validation loss of an MLP classifier.
#include <torch/torch.h>
#include <limits>
#include <vector>

struct Mlp : torch::nn::Module {
  Mlp(int64_t in, int64_t classes) {
    l1 = register_module("l1", torch::nn::Linear(in, 128));
    l2 = register_module("l2", torch::nn::Linear(128, classes));
  }
  torch::Tensor forward(const torch::Tensor &x) { return l2->forward(torch::relu(l1->forward(x))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
};

// Validation under NoGradGuard: summing the loss tensors is fine here.
double val_loss(Mlp &net, const std::vector<torch::Tensor> &xs, const std::vector<torch::Tensor> &ys) {
  torch::NoGradGuard no_grad;
  torch::Tensor sum = torch::zeros({});
  for (size_t i = 0; i < xs.size(); ++i) {
    auto loss = torch::nn::functional::cross_entropy(net.forward(xs[i]), ys[i]);
    sum += loss; // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
  }
  return sum.item<double>() / xs.size();
}

// The same written by hand without the guard, as a running sum.
double val_loss_unguarded(Mlp &net, const std::vector<torch::Tensor> &xs, const std::vector<torch::Tensor> &ys) {
  auto total = torch::zeros({1});
  for (size_t i = 0; i < xs.size(); ++i) {
    auto out = net.forward(xs[i]);
    // FACT: m = torch.nn.Linear(4, 3); t = torch.zeros(1); t = t + torch.nn.functional.cross_entropy(m(torch.randn(2, 4)), torch.tensor([0, 2])); assert kept_nodes(t) > 3
    total = total + torch::nn::functional::cross_entropy(out, ys[i]); // EXPECT: tensor-graph-kept-across-iterations
  }
  return total.item<double>() / xs.size();
}

int fit(Mlp &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs, const std::vector<torch::Tensor> &ys,
        const std::vector<torch::Tensor> &vx, const std::vector<torch::Tensor> &vy, int patience) {
  double best = std::numeric_limits<double>::infinity();
  int bad = 0, epoch = 0;
  torch::Tensor best_batch_loss;
  for (; bad < patience; ++epoch) {
    net.train();
    for (size_t i = 0; i < xs.size(); ++i) {
      auto loss = torch::nn::functional::cross_entropy(net.forward(xs[i]), ys[i]);
      opt.zero_grad();
      loss.backward();
      opt.step();
      if (!best_batch_loss.defined() || loss.item<double>() < best_batch_loss.item<double>())
        best_batch_loss = loss; // LOOKALIKE: tensor-graph-kept-across-iterations -- overwrites one handle
    }
    net.eval();
    double v = val_loss(net, vx, vy);
    if (v < best) {
      best = v;
      bad = 0;
    } else {
      ++bad;
    }
  }
  return epoch;
}
