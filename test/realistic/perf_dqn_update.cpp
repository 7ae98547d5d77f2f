// DQN update step: target network, replay samples, TD loss on the GPU.
#include <torch/torch.h>
#include <deque>
#include <iostream>
#include <random>
#include <vector>

struct QNet : torch::nn::Module {
  QNet(int64_t obs, int64_t act) {
    l1 = register_module("l1", torch::nn::Linear(obs, 64));
    l2 = register_module("l2", torch::nn::Linear(64, act));
  }
  torch::Tensor forward(torch::Tensor x) { return l2->forward(torch::relu(l1->forward(x))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
};

struct Transition {
  torch::Tensor state, next_state;
  int64_t action;
  float reward;
  bool done;
};

class ReplayBuffer {
public:
  explicit ReplayBuffer(size_t cap) : cap_(cap) {}
  void push(const torch::Tensor &state, int64_t action, float reward, const torch::Tensor &next,
            bool done) {
    if (items_.size() == cap_)
      items_.pop_front();
    // The environment reuses its observation buffer: keep copies.
    items_.push_back({state.clone(), next.clone(), action, reward, done}); // LOOKALIKE: tensor-unnecessary-clone -- stored in the buffer, the caller's tensor changes
  }
  size_t size() const { return items_.size(); }
  const Transition &at(size_t i) const { return items_[i]; }

private:
  size_t cap_;
  std::deque<Transition> items_;
};

torch::Tensor td_targets(QNet &target_net, const torch::Tensor &next_states,
                         const torch::Tensor &rewards, const torch::Tensor &not_done,
                         double gamma) {
  torch::NoGradGuard no_grad;
  auto q_next = target_net.forward(next_states);
  auto best = std::get<0>(q_next.max(1));
  auto targets = rewards.clone(); // EXPECT: tensor-unnecessary-clone
  // FACT: r = torch.randn(4); b = torch.randn(4); t = r.clone(); t.add_(b * 0.9); assert torch.allclose(t, r.add(b * 0.9))
  targets.add_(best * not_done * gamma);
  return targets;
}

torch::Tensor scaled_rewards(const torch::Tensor &rewards, double scale) {
  auto r = rewards.clone(); // EXPECT: tensor-unnecessary-clone
  // FACT: r = torch.randn(4); c = r.clone(); c.mul_(0.5); assert torch.equal(c, r.mul(0.5))
  r.mul_(scale);
  return r;
}

void soft_update(QNet &target, QNet &online, double tau) {
  torch::NoGradGuard no_grad;
  auto tp = target.parameters();
  auto op = online.parameters();
  for (size_t i = 0; i < tp.size(); ++i) {
    auto mixed = op[i].clone(); // EXPECT: tensor-unnecessary-clone
    // FACT: a = torch.randn(3); b = torch.randn(3); m = a.clone(); m.mul_(0.1); assert torch.equal(m, a.mul(0.1))
    mixed.mul_(tau);
    tp[i].mul_(1 - tau).add_(mixed);
  }
}

void train(QNet &online, QNet &target, ReplayBuffer &buffer, torch::optim::Adam &opt, int steps) {
  torch::Device device(torch::kCUDA);
  online.to(device);
  target.to(device);
  std::mt19937 rng(0);
  double loss_sum = 0;
  std::vector<float> history;
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> s, ns;
    std::vector<float> r, nd;
    std::vector<int64_t> a;
    for (int k = 0; k < 32; ++k) {
      const auto &t = buffer.at(rng() % buffer.size());
      s.push_back(t.state);
      ns.push_back(t.next_state);
      a.push_back(t.action);
      r.push_back(t.reward);
      nd.push_back(t.done ? 0.f : 1.f);
    }
    auto states = torch::stack(s).to(device);
    auto next_states = torch::stack(ns).to(device);
    auto actions = torch::tensor(a).to(device);
    auto rewards = torch::tensor(r).to(device);
    auto not_done = torch::tensor(nd).to(device);
    auto targets = td_targets(target, next_states, rewards, not_done, 0.99);
    auto q = online.forward(states).gather(1, actions.unsqueeze(1)).squeeze(1);
    auto loss = torch::smooth_l1_loss(q, targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    float l = loss.item<float>(); // EXPECT: tensor-sync-in-loop
    loss_sum += l;
    history.push_back(q.detach().max().item<float>()); // LOOKALIKE: tensor-sync-in-loop -- kept as data in a host container, not only accumulated or logged
    auto mean_q = q.mean().item<float>(); // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to stop
    if (mean_q > 1e6f) {
      std::cerr << "diverged\n";
      break;
    }
    if (step % 1000 == 0)
      soft_update(target, online, 1.0);
  }
  std::cout << "mean loss " << loss_sum / steps << " over " << history.size() << " steps\n";
}
