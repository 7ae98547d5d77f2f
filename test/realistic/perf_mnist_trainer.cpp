// MNIST-style classifier trained on the GPU, with a running loss for the log.
#include <torch/torch.h>
#include <cstdio>
#include <iostream>
#include <vector>

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1->forward(x.view({x.size(0), 784})));
    return torch::log_softmax(fc2->forward(x), 1);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct Batch {
  torch::Tensor data, target;
};

double train_epoch(Net &model, torch::optim::Optimizer &opt, const std::vector<Batch> &batches) {
  torch::Device device(torch::kCUDA);
  model.to(device);
  model.train();
  double running_loss = 0.0;
  int64_t correct = 0;
  for (const auto &batch : batches) {
    auto data = batch.data.to(device);
    auto target = batch.target.to(device);
    opt.zero_grad();
    auto output = model.forward(data);
    auto loss = torch::nll_loss(output, target);
    loss.backward();
    opt.step();
    // FACT: acc = torch.zeros(()); ls = [torch.tensor(0.25), torch.tensor(0.5)]; [acc := acc + l.detach() for l in ls]; assert abs(acc.item() - 0.75) < 1e-6
    running_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    auto pred = output.argmax(1);
    correct += pred.eq(target).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop
  }
  std::printf("train: loss %.4f, %lld correct\n", running_loss / batches.size(), (long long)correct);
  return running_loss;
}

double evaluate(Net &model, const std::vector<Batch> &batches) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  model.eval();
  double total = 0;
  size_t step = 0;
  for (const auto &batch : batches) {
    auto data = batch.data.to(device), target = batch.target.to(device);
    auto output = model.forward(data);
    auto loss = torch::nll_loss(output, target, {}, torch::Reduction::Sum);
    if (++step % 50 == 0)
      std::cout << "eval step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every 50th step
    total += loss.item<double>(); // EXPECT: tensor-sync-in-loop
  }
  return total;
}

// Early stopping on the training loss: the value decides whether to go on.
int train_until(Net &model, torch::optim::Optimizer &opt, const Batch &batch, double tol) {
  torch::Device device(torch::kCUDA);
  auto data = batch.data.to(device), target = batch.target.to(device);
  int it = 0;
  for (; it < 1000; ++it) {
    opt.zero_grad();
    auto loss = torch::nll_loss(model.forward(data), target);
    loss.backward();
    opt.step();
    if (loss.item<double>() < tol) // LOOKALIKE: tensor-sync-in-loop -- the value decides control flow
      break;
  }
  return it;
}

// Inputs as given: the device is whatever the caller chose.
double sum_losses(Net &model, const std::vector<Batch> &batches) {
  double s = 0;
  for (const auto &b : batches) {
    auto loss = torch::nll_loss(model.forward(b.data), b.target);
    s += loss.item<double>(); // LOOKALIKE: tensor-sync-in-loop -- the tensors' device is not known (CPU unless the caller moved them)
  }
  return s;
}

// A snapshot of the best weights, kept while training goes on.
struct BestKeeper {
  std::vector<torch::Tensor> best;
  double best_loss = 1e9;
  void offer(Net &model, double loss) {
    if (loss >= best_loss)
      return;
    best_loss = loss;
    best.clear();
    for (const auto &p : model.parameters())
      best.push_back(p.detach().clone()); // LOOKALIKE: tensor-unnecessary-clone -- stored: must not follow the live weights
  }
};
