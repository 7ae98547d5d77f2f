// A plain MLP regression trainer: no tensor hazards, the common idioms written correctly.
#include <torch/torch.h>
#include <vector>

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out) {
    l1_ = register_module("l1", torch::nn::Linear(in, hidden));
    l2_ = register_module("l2", torch::nn::Linear(hidden, out));
    drop_ = register_module("drop", torch::nn::Dropout(0.1));
  }
  torch::Tensor forward(torch::Tensor x) { return l2_(drop_(torch::gelu(l1_(x)))); }
  torch::nn::Linear l1_{nullptr}, l2_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(Mlp);

std::vector<double> fit(Mlp &model, const torch::Tensor &X, const torch::Tensor &Y, int epochs, int64_t batch) {
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
  std::vector<double> history;
  auto N = X.size(0);
  for (int e = 0; e < epochs; ++e) {
    auto perm = torch::randperm(N);
    double epoch_loss = 0;
    for (int64_t i = 0; i < N; i += batch) {
      auto idx = perm.narrow(0, i, std::min(batch, N - i));
      auto xb = X.index_select(0, idx), yb = Y.index_select(0, idx);
      auto loss = torch::mse_loss(model->forward(xb), yb);
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.item<double>() * idx.size(0);
    }
    history.push_back(epoch_loss / N);
  }
  return history;
}

torch::Tensor predict(Mlp &model, const torch::Tensor &X) {
  torch::NoGradGuard no_grad;
  model->eval();
  return model->forward(X);
}
