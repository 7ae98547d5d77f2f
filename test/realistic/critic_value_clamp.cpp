// Actor-critic update: the critic's value head squashes its output with tanh.
#include <torch/torch.h>

struct Critic : torch::nn::Module {
  Critic(int64_t obs) {
    body = register_module("body", torch::nn::Linear(obs, 64));
    head = register_module("head", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(const torch::Tensor &obs) {
    auto h = torch::relu(body(obs));
    return torch::tanh(head(h)).squeeze(-1);
  }
  torch::Tensor features(const torch::Tensor &obs) { return body(obs) + 0.0; }
  torch::nn::Linear body{nullptr}, head{nullptr};
};

void critic_step(Critic &critic, torch::optim::Adam &opt, const torch::Tensor &obs,
                 const torch::Tensor &returns) {
  auto value = critic.forward(obs);
  // FACT: x = torch.randn(4, 1, requires_grad=True) * 1; v = torch.tanh(x).squeeze(-1); v.mul_(2); assert backward_fails(lambda: v.sum().backward())
  value.mul_(10.0);                                       // EXPECT: tensor-inplace-on-saved
  auto loss = torch::mse_loss(value, returns);
  opt.zero_grad();
  loss.backward();
  opt.step();
}

torch::Tensor advantages(Critic &critic, const torch::Tensor &obs, const torch::Tensor &returns) {
  auto baseline = critic.forward(obs).detach();
  baseline.mul_(0.99);                                    // LOOKALIKE: tensor-inplace-on-saved -- a detached copy of the value is not what tanh saved
  auto f = critic.features(obs);
  f.clamp_(-5, 5);                                        // LOOKALIKE: tensor-inplace-on-saved -- an addition saves nothing for backward
  return returns - baseline + 0 * f.sum();
}
