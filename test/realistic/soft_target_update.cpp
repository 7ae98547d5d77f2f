// DDPG-style actor with a Polyak-averaged target network and a manual
// exploration-noise perturbation of the weights.
#include <torch/torch.h>

struct Actor : torch::nn::Module {
  Actor(int obs, int act) {
    l1 = register_module("l1", torch::nn::Linear(obs, 64));
    l2 = register_module("l2", torch::nn::Linear(64, act));
  }
  torch::Tensor forward(torch::Tensor s) { return torch::tanh(l2(torch::relu(l1(s)))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
};

void soft_update(Actor &target, Actor &online, double tau) {
  torch::NoGradGuard no_grad;
  auto tp = target.parameters();
  auto op = online.parameters();
  for (size_t i = 0; i < tp.size(); ++i) {
    tp[i].mul_(1.0 - tau); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    tp[i].add_(op[i], tau); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
}

void perturb(Actor &actor, double sigma) {
  for (auto &p : actor.parameters())
    // FACT: p = torch.nn.Linear(2, 2).weight; assert raises(lambda: p.add_(torch.randn(2, 2)), "leaf Variable that requires grad")
    p.add_(torch::randn_like(p) * sigma); // EXPECT: tensor-inplace-on-leaf
}

void shrink_last_layer(Actor &actor) {
  // FACT: l = torch.nn.Linear(2, 2); assert raises(lambda: l.weight.mul_(0.1), "leaf Variable that requires grad")
  actor.l2->weight.mul_(0.1); // EXPECT: tensor-inplace-on-leaf
}

int main() {
  Actor online(8, 2), target(8, 2);
  soft_update(target, online, 1.0);
  torch::optim::Adam opt(online.parameters(), 1e-3);
  for (int step = 0; step < 10; ++step) {
    auto s = torch::randn({32, 8});
    auto a = online.forward(s);
    auto loss = -(a * target.forward(s).detach()).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    soft_update(target, online, 0.005);
  }
  perturb(online, 0.01);
  shrink_last_layer(online);
}
