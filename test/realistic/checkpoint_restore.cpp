// Restores a classifier from a flat map of tensors saved by a Python script.
#include <torch/torch.h>
#include <map>
#include <string>

struct Classifier : torch::nn::Module {
  Classifier() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)));
    bn = register_module("bn", torch::nn::BatchNorm2d(8));
    head = register_module("head", torch::nn::Linear(8, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn(conv(x)));
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return head(x);
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear head{nullptr};
};

void load_params(Classifier &model, const std::map<std::string, torch::Tensor> &state) {
  for (auto &item : model.named_parameters()) {
    auto it = state.find(item.key());
    if (it != state.end())
      // FACT: p = torch.nn.Linear(2, 2).weight; assert raises(lambda: p.copy_(torch.zeros(2, 2)), "leaf Variable that requires grad")
      item.value().copy_(it->second); // EXPECT: tensor-inplace-on-leaf
  }
}

void load_params_no_grad(Classifier &model, const std::map<std::string, torch::Tensor> &state) {
  torch::NoGradGuard guard;
  for (auto &item : model.named_parameters())
    item.value().copy_(state.at(item.key())); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

void load_head(Classifier &model, const torch::Tensor &w, const torch::Tensor &b) {
  // FACT: p = torch.nn.Linear(2, 2).weight; p.data.copy_(torch.zeros(2, 2))
  model.head->weight.data().copy_(w); // LOOKALIKE: tensor-inplace-on-leaf -- .data() is not the leaf
  model.head->bias.copy_(b); // EXPECT: tensor-inplace-on-leaf
}

void load_stats(Classifier &model, const torch::Tensor &mean, const torch::Tensor &var) {
  // FACT: bn = torch.nn.BatchNorm2d(2); bn.running_mean.copy_(torch.ones(2))
  model.bn->running_mean.copy_(mean); // LOOKALIKE: tensor-inplace-on-leaf -- buffers do not require grad
  model.bn->running_var.copy_(var); // LOOKALIKE: tensor-inplace-on-leaf -- buffers do not require grad
}

int main() {
  Classifier model;
  std::map<std::string, torch::Tensor> state;
  for (auto &item : model.named_parameters())
    state[item.key()] = torch::randn_like(item.value());
  load_params_no_grad(model, state);
  load_stats(model, torch::zeros({8}), torch::ones({8}));
  auto out = model.forward(torch::randn({2, 3, 16, 16}));
  out.sum().backward();
}
