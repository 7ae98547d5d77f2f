// DQN agent: online and target Q-networks, epsilon-greedy acting and a TD update.
#include <torch/torch.h>
#include <random>

struct QNetImpl : torch::nn::Module {
  QNetImpl(int64_t obs_dim, int64_t n_actions) {
    fc1_ = register_module("fc1", torch::nn::Linear(obs_dim, 128));
    fc2_ = register_module("fc2", torch::nn::Linear(128, n_actions));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2_(torch::relu(fc1_(x))); }
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(QNet);

struct DqnAgent {
  DqnAgent(int64_t obs_dim, int64_t n_actions)
      : online(obs_dim, n_actions), target(obs_dim, n_actions),
        opt(online->parameters(), torch::optim::AdamOptions(1e-3)), n_actions_(n_actions) {}

  int64_t act(const torch::Tensor &obs, double epsilon) {
    if (std::uniform_real_distribution<double>(0, 1)(rng_) < epsilon)
      return std::uniform_int_distribution<int64_t>(0, n_actions_ - 1)(rng_);
    torch::NoGradGuard no_grad;
    return online->forward(obs.unsqueeze(0)).argmax(1).item<int64_t>();
  }

  double update(const torch::Tensor &obs, const torch::Tensor &actions, const torch::Tensor &rewards,
                const torch::Tensor &next_obs, const torch::Tensor &dones, double gamma) {
    auto q_next = target->forward(next_obs).amax(1);
    auto td_target = q_next.detach();
    // FACT: a = torch.randn(4, requires_grad=True); d = a.detach(); d.mul_(2); assert shares_storage(d, a)
    td_target.mul_(gamma * (1 - dones)).add_(rewards); // LOOKALIKE: tensor-inplace-on-detached -- q_next is never used again
    auto q = online->forward(obs).gather(1, actions.unsqueeze(1)).squeeze(1);
    auto loss = torch::smooth_l1_loss(q, td_target);
    opt.zero_grad();
    loss.backward();
    opt.step();
    return loss.item<double>();
  }

  void sync_target() {
    torch::NoGradGuard no_grad;
    auto src = online->parameters();
    auto dst = target->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      dst[i].data().copy_(src[i]); // LOOKALIKE: tensor-inplace-on-detached -- the target copy is meant to be overwritten
  }

  QNet online, target;
  torch::optim::Adam opt;
  int64_t n_actions_;
  std::mt19937 rng_{0};
};
