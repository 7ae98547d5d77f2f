// DDPG actor-critic: Polyak-averaged target networks.
#include <torch/torch.h>

struct ActorImpl : torch::nn::Module {
  ActorImpl(int64_t s, int64_t a) {
    l1_ = register_module("l1", torch::nn::Linear(s, 256));
    l2_ = register_module("l2", torch::nn::Linear(256, a));
  }
  torch::Tensor forward(torch::Tensor x) { return torch::tanh(l2_(torch::relu(l1_(x)))); }
  torch::nn::Linear l1_{nullptr}, l2_{nullptr};
};
TORCH_MODULE(Actor);

void soft_update(torch::nn::Module &target, const torch::nn::Module &source, double tau) {
  torch::NoGradGuard no_grad;
  auto t_params = target.parameters();
  auto s_params = source.parameters();
  for (size_t i = 0; i < t_params.size(); ++i) {
    auto t = t_params[i].data();
    t.mul_(1.0 - tau); // LOOKALIKE: tensor-inplace-on-detached -- Polyak update of the target under NoGradGuard
    t.add_(s_params[i], tau);
  }
}

// Written without the guard: it still writes the target on purpose, through the leaf's data.
void hard_update(Actor &target, Actor &source) {
  auto t_params = target->parameters();
  auto s_params = source->parameters();
  for (size_t i = 0; i < t_params.size(); ++i)
    t_params[i].data().copy_(s_params[i].data()); // LOOKALIKE: tensor-inplace-on-detached -- direct chain that means to write the target
}

torch::Tensor exploration_action(Actor &actor, const torch::Tensor &state, double noise_std) {
  auto a = actor->forward(state);
  auto noisy = a.detach();
  // FACT: a = torch.tanh(torch.randn(3, requires_grad=True)); n = a.detach(); n.add_(1); assert backward_fails(lambda: a.sum().backward())
  noisy.add_(torch::randn_like(noisy) * noise_std); // EXPECT: tensor-inplace-on-detached
  // the deterministic action is kept for the actor's own regulariser
  auto reg = a.pow(2).mean();
  reg.backward();
  return noisy.clamp(-1, 1);
}
