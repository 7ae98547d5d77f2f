// A small regression MLP trained with a hand-written SGD step.
#include <torch/torch.h>
#include <iostream>

struct Mlp : torch::nn::Module {
  Mlp(int in, int hidden, int out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
    torch::nn::init::kaiming_uniform_(fc1->weight); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
    torch::nn::init::zeros_(fc1->bias); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

void sgd_step(Mlp &model, double lr) {
  for (auto &p : model.parameters()) {
    if (!p.grad().defined())
      continue;
    // FACT: p = torch.nn.Linear(2, 2).weight; p.grad = torch.ones(2, 2); assert raises(lambda: p.sub_(0.1 * p.grad), "leaf Variable that requires grad")
    p.sub_(lr * p.grad()); // EXPECT: tensor-inplace-on-leaf
    p.grad().zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient is not the leaf
  }
}

void sgd_step_guarded(Mlp &model, double lr) {
  torch::NoGradGuard no_grad;
  for (auto &p : model.parameters()) {
    // FACT: p = torch.nn.Linear(2, 2).weight; p.grad = torch.ones(2, 2); exec("with torch.no_grad():\n p.sub_(0.1 * p.grad)")
    p.sub_(lr * p.grad()); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
}

int main() {
  Mlp model(4, 16, 1);
  auto x = torch::randn({64, 4});
  auto y = x.sum(1, true);
  for (int epoch = 0; epoch < 20; ++epoch) {
    auto loss = torch::mse_loss(model.forward(x), y);
    loss.backward();
    if (epoch % 2 == 0)
      sgd_step(model, 0.01);
    else
      sgd_step_guarded(model, 0.01);
    for (auto &p : model.parameters())
      p.mutable_grad().zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient is not the leaf
    std::cout << epoch << " " << loss.item<double>() << "\n";
  }
}
