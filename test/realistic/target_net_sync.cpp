// SAC-style critic with twin target networks updated by Polyak averaging.
#include <torch/torch.h>

struct CriticImpl : torch::nn::Module {
  CriticImpl(int64_t s, int64_t a) {
    q1_ = register_module("q1", torch::nn::Sequential(torch::nn::Linear(s + a, 256), torch::nn::ReLU(), torch::nn::Linear(256, 1)));
    q2_ = register_module("q2", torch::nn::Sequential(torch::nn::Linear(s + a, 256), torch::nn::ReLU(), torch::nn::Linear(256, 1)));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &s, const torch::Tensor &a) {
    auto sa = torch::cat({s, a}, 1);
    return {q1_->forward(sa), q2_->forward(sa)};
  }
  torch::nn::Sequential q1_{nullptr}, q2_{nullptr};
};
TORCH_MODULE(Critic);

void polyak(Critic &target, Critic &online, double tau) {
  torch::NoGradGuard no_grad;
  auto tp = target->named_parameters();
  auto op = online->named_parameters();
  for (auto &item : tp) {
    auto &src = op[item.key()];
    item.value().mul_(1 - tau).add_(src, tau); // LOOKALIKE: tensor-inplace-on-detached -- a parameter updated under NoGradGuard
  }
}

torch::Tensor critic_target(Critic &target, const torch::Tensor &next_s, const torch::Tensor &next_a,
                            const torch::Tensor &reward, const torch::Tensor &done, double gamma,
                            double alpha, const torch::Tensor &next_logp) {
  torch::NoGradGuard no_grad;
  auto [q1, q2] = target->forward(next_s, next_a);
  auto q = torch::min(q1, q2);
  // FACT: a, b = torch.randn(3), torch.randn(3); q = torch.min(a, b); assert is_copy_of(q, a) and is_copy_of(q, b)
  q.sub_(alpha * next_logp); // LOOKALIKE: tensor-alias-then-mutate -- min() returned a fresh tensor nobody else holds
  return reward + gamma * (1 - done) * q;
}
