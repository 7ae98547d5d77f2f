// Actor-critic (PPO-style clipped update) on a batch of point-navigation environments simulated in
// tensors on the GPU. A rollout of T steps from E environments is stored in preallocated [T, E]
// buffers; TD(lambda) returns and GAE advantages are computed backwards over it, bootstrapping
// from the critic's value of the last observation. The critic loss clips the new value to stay
// near the rollout's value (PPO2's value clipping). The observation is a stack of the last k frames.
#include <torch/torch.h>
#include <cstdint>
#include <iostream>
#include <vector>

namespace nn = torch::nn;

struct AcConfig {
  int64_t num_envs = 256, horizon = 128, frame_stack = 4, hidden = 128, updates = 2000, epochs = 4, minibatches = 8;
  int64_t max_episode_steps = 200, log_every = 20;
  double gamma = 0.99, lambda = 0.95, lr = 3e-4, clip = 0.2, clip_value = 0.2, max_ratio = 10.0;
  double value_coef = 0.5, entropy_coef = 0.01, max_grad_norm = 0.5;
  double step_size = 0.05, goal_radius = 0.1, goal_bonus = 1.0, time_penalty = 0.01;
};

struct EnvStep {
  torch::Tensor obs, reward, done; // [E, obs_dim], [E], [E] bool
};

// E independent episodes: move in one of 5 directions towards a goal in [-1, 1]^2.
class VecPointNav {
public:
  static constexpr int64_t kActions = 5, kFrameDim = 4;

  VecPointNav(const AcConfig &cfg, torch::Device device) : cfg_(cfg), opts_(torch::TensorOptions().device(device)) {
    const auto E = cfg.num_envs;
    pos_ = torch::zeros({E, 2}, opts_);
    goal_ = torch::zeros({E, 2}, opts_);
    steps_ = torch::zeros({E}, opts_.dtype(torch::kLong));
    frames_ = torch::zeros({cfg.frame_stack, E, kFrameDim}, opts_);
    // stay, up, down, left, right
    // FACT: m = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, -1.0, -1.0, 0.0, 1.0, 0.0]); assert is_view_of(m.view(5, 2), m)
    moves_ = torch::tensor({0.0f, 0.0f, 0.0f, 1.0f, 0.0f, -1.0f, -1.0f, 0.0f, 1.0f, 0.0f}, opts_).view({kActions, 2}) * cfg.step_size; // LOOKALIKE: tensor-view-non-contiguous -- a fresh 1-D tensor
  }

  int64_t obs_dim() const { return cfg_.frame_stack * kFrameDim; }

  torch::Tensor reset() {
    pos_.uniform_(-1.0, 1.0);
    goal_.uniform_(-1.0, 1.0);
    steps_.zero_();
    frames_.zero_();
    push_frame(frame());
    return stacked();
  }

  EnvStep step(const torch::Tensor &action) {
    auto prev_dist = (pos_ - goal_).norm(2, 1);
    pos_ = (pos_ + moves_.index_select(0, action)).clamp(-1.0, 1.0);
    steps_ += 1;
    auto dist = (pos_ - goal_).norm(2, 1);
    auto reached = dist < cfg_.goal_radius;
    auto done = reached | (steps_ >= cfg_.max_episode_steps);
    auto reward = (prev_dist - dist) + reached.to(torch::kFloat) * cfg_.goal_bonus - cfg_.time_penalty;
    reset_where(done);
    push_frame(frame());
    return {stacked(), reward, done};
  }

private:
  torch::Tensor frame() const { return torch::cat({pos_, goal_ - pos_}, 1); }

  // Episodes that ended start over at a new position with a new goal and an empty history.
  void reset_where(const torch::Tensor &done) {
    const auto E = cfg_.num_envs;
    auto m = done.unsqueeze(1);
    auto new_pos = torch::rand({E, 2}, opts_) * 2.0 - 1.0; // LOOKALIKE: tensor-device-mismatch -- made with the environments' options
    auto new_goal = torch::rand({E, 2}) * 2.0 - 1.0;
    pos_ = torch::where(m, new_pos, pos_);
    goal_ = torch::where(m, new_goal, goal_); // EXPECT: tensor-device-mismatch
    steps_.masked_fill_(done, 0);
    frames_.mul_(m.logical_not().to(torch::kFloat).unsqueeze(0));
  }

  // Drops the oldest frame and appends f.
  void push_frame(const torch::Tensor &f) {
    const auto k = frames_.size(0);
    // FACT: f = torch.zeros(4, 3, 2); assert raises(lambda: f.narrow(0, 0, 3).copy_(f.narrow(0, 1, 3)), "refer to a single memory location")
    frames_.narrow(0, 0, k - 1).copy_(frames_.narrow(0, 1, k - 1)); // EXPECT: tensor-inplace-overlap
    frames_[k - 1].copy_(f);
  }

  // [E, k * kFrameDim], oldest frame first.
  torch::Tensor stacked() const {
    // FACT: f = torch.zeros(4, 3, 2); assert is_copy_of(f.permute(1, 0, 2).flatten(1), f)
    return frames_.permute({1, 0, 2}).flatten(1); // EXPECT: tensor-reshape-non-contiguous
  }

  AcConfig cfg_;
  torch::TensorOptions opts_;
  torch::Tensor pos_, goal_, steps_, frames_, moves_;
};

struct AcOutput {
  torch::Tensor logits, value; // [B, A], [B]
};

struct ActorCriticImpl : nn::Module {
  ActorCriticImpl(int64_t obs_dim, int64_t hidden, int64_t n_actions) {
    fc1 = register_module("fc1", nn::Linear(obs_dim, hidden));
    fc2 = register_module("fc2", nn::Linear(hidden, hidden));
    pi = register_module("pi", nn::Linear(hidden, n_actions));
    v = register_module("v", nn::Linear(hidden, 1));
    torch::NoGradGuard no_grad;
    nn::init::orthogonal_(pi->weight, 0.01);
    pi->bias.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    v->bias.zero_();
  }
  AcOutput forward(const torch::Tensor &obs) {
    auto h = torch::tanh(fc1(obs));
    h = torch::tanh(fc2(h));
    return {pi(h), v(h).squeeze(-1)};
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, pi{nullptr}, v{nullptr};
};
TORCH_MODULE(ActorCritic);

// One rollout, time-major: row t holds step t of every environment.
struct Rollout {
  Rollout(const AcConfig &cfg, int64_t obs_dim, torch::Device device) {
    const auto T = cfg.horizon, E = cfg.num_envs;
    auto o = torch::TensorOptions().device(device);
    obs = torch::zeros({T, E, obs_dim}, o);
    actions = torch::zeros({T, E}, o.dtype(torch::kLong));
    logp = torch::zeros({T, E}, o);
    values = torch::zeros({T, E}, o);
    rewards = torch::zeros({T, E}, o);
    dones = torch::zeros({T, E}, o.dtype(torch::kBool));
    advantages = torch::zeros({T, E}, o);
  }
  torch::Tensor obs, actions, logp, values, rewards, dones, advantages, returns;
  torch::Tensor last_value; // V(s_T), the bootstrap
};

// GAE / TD(lambda), backwards: A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}, and the
// lambda-return G_t = A_t + V(s_t) is the critic's target.
void compute_returns(Rollout &r, double gamma, double lam) {
  const auto T = r.rewards.size(0);
  // V(s_{t+1}) for every t: the bootstrap in the last row, the stored values shifted by one above it.
  auto next_values = r.last_value.unsqueeze(0).expand({T, -1});
  // FACT: v = torch.randn(3); n = v.unsqueeze(0).expand(5, -1); assert raises(lambda: n.narrow(0, 0, 4).copy_(torch.randn(4, 3)), "single memory location")
  next_values.narrow(0, 0, T - 1).copy_(r.values.narrow(0, 1, T - 1)); // EXPECT: tensor-inplace-on-expanded
  auto last_gae = torch::zeros_like(r.last_value);
  for (int64_t t = T - 1; t >= 0; --t) {
    auto nonterminal = 1.0 - r.dones.to(torch::kFloat)[t]; // EXPECT: tensor-clone-in-loop
    auto delta = r.rewards[t] + gamma * next_values[t] * nonterminal - r.values[t];
    last_gae = delta + gamma * lam * nonterminal * last_gae;
    // FACT: a = torch.zeros(4, 3); a[2].copy_(torch.ones(3)); assert a.sum() == 3
    r.advantages[t].copy_(last_gae); // LOOKALIKE: tensor-alias-then-mutate -- writing a row of the buffer through operator[] is the point
  }
  auto returns = r.advantages;
  // FACT: a = torch.randn(4, 3); v = torch.randn(4, 3); a0 = a.clone(); g = a; g += v; assert shares_storage(g, a) and not torch.equal(a, a0)
  returns += r.values; // EXPECT: tensor-alias-then-mutate
  r.returns = returns;
}

// baselines' swap_and_flatten: [T, E, ...] -> [E * T, ...], env-major, each env's steps in order.
torch::Tensor swap_and_flatten(const torch::Tensor &t) {
  std::vector<int64_t> shape{t.size(0) * t.size(1)};
  for (int64_t d = 2; d < t.dim(); ++d)
    shape.push_back(t.size(d));
  // FACT: b = torch.randn(5, 3, 4); assert raises(lambda: b.transpose(0, 1).view(15, 4), "view size is not compatible")
  return t.transpose(0, 1).view(shape); // EXPECT: tensor-view-non-contiguous
}

struct Minibatch {
  torch::Tensor obs, actions, old_logp, old_values, adv, returns;
};

struct LossParts {
  torch::Tensor policy, value, entropy;
};

LossParts ac_loss(ActorCritic &net, const Minibatch &mb, const AcConfig &cfg) {
  auto out = net->forward(mb.obs);
  auto logp_all = torch::log_softmax(out.logits, -1);
  auto logp = logp_all.gather(1, mb.actions.unsqueeze(1)).squeeze(1);
  auto ratio = torch::exp(logp - mb.old_logp);
  // FACT: x = torch.randn(5, requires_grad=True); r = torch.exp(x * 1); r.clamp_max_(2.0); assert backward_fails(lambda: r.sum().backward())
  ratio.clamp_max_(cfg.max_ratio); // EXPECT: tensor-inplace-on-saved
  auto pg = -torch::min(ratio * mb.adv, ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip) * mb.adv).mean();
  // Value clipping: the new value may move at most clip_value away from the rollout's value.
  auto v_clipped = mb.old_values + (out.value - mb.old_values).clamp(-cfg.clip_value, cfg.clip_value);
  auto v_loss = 0.5 * torch::max((out.value - mb.returns).pow(2), (v_clipped - mb.returns).pow(2)).mean();
  auto entropy = -(logp_all.exp() * logp_all).sum(-1).mean();
  return {pg, v_loss, entropy};
}

void train(const AcConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  VecPointNav env(cfg, device);
  ActorCritic net(env.obs_dim(), cfg.hidden, VecPointNav::kActions);
  net->to(device);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1e-5));
  Rollout r(cfg, env.obs_dim(), device);
  auto obs = env.reset();
  auto ep_return = torch::zeros({cfg.num_envs}, torch::TensorOptions().device(device)); // LOOKALIKE: tensor-device-mismatch -- on the environments' device
  for (int64_t update = 0; update < cfg.updates; ++update) {
    double finished_return = 0;
    auto finished = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    {
      torch::NoGradGuard no_grad;
      for (int64_t t = 0; t < cfg.horizon; ++t) {
        auto out = net->forward(obs);
        auto logp_all = torch::log_softmax(out.logits, -1);
        auto action = torch::multinomial(logp_all.exp(), 1).squeeze(1);
        // FACT: buf = torch.zeros(3, 4, 2); o = torch.randn(4, 2); buf[0].copy_(o); o = torch.randn(4, 2); assert not shares_storage(buf, o) and not torch.equal(buf[0], o)
        r.obs[t].copy_(obs); // LOOKALIKE: tensor-alias-then-mutate -- copies the values into the buffer row; obs is rebound below, the row keeps them
        // FACT: b = torch.zeros(3, 4, dtype=torch.long); a = torch.multinomial(torch.rand(4, 5), 1).squeeze(1); b[0].copy_(a); assert a.dtype == b.dtype
        r.actions[t].copy_(action); // LOOKALIKE: tensor-copy-narrowing -- multinomial gives int64, like the buffer
        r.logp[t].copy_(logp_all.gather(1, action.unsqueeze(1)).squeeze(1));
        r.values[t].copy_(out.value); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, and copied into the buffer
        auto step = env.step(action);
        r.rewards[t].copy_(step.reward);
        r.dones[t].copy_(step.done);
        ep_return += step.reward;
        finished_return += (ep_return * step.done).sum().item<double>(); // EXPECT: tensor-sync-in-loop
        finished += step.done.sum();
        ep_return.masked_fill_(step.done, 0.0);
        obs = step.obs;
      }
      r.last_value = net->forward(obs).value; // bootstrap from the observation after the last step
    }
    compute_returns(r, cfg.gamma, cfg.lambda);

    auto b_obs = swap_and_flatten(r.obs), b_actions = swap_and_flatten(r.actions);
    auto b_logp = swap_and_flatten(r.logp), b_values = swap_and_flatten(r.values), b_returns = swap_and_flatten(r.returns);
    auto b_adv = swap_and_flatten(r.advantages);
    // FACT: a = torch.randn(6); b = a; b = (b - b.mean()) / (b.std() + 1e-8); assert is_copy_of(b, a)
    b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8); // LOOKALIKE: tensor-alias-then-mutate -- out-of-place: the rollout's advantages keep their values
    const auto N = b_obs.size(0), mb_size = N / cfg.minibatches;
    auto value_loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
      auto perm = torch::randperm(N, torch::TensorOptions().dtype(torch::kLong).device(device));
      for (int64_t s = 0; s + mb_size <= N; s += mb_size) {
        auto idx = perm.narrow(0, s, mb_size);
        Minibatch mb{b_obs.index_select(0, idx),    b_actions.index_select(0, idx), b_logp.index_select(0, idx),
                     b_values.index_select(0, idx), b_adv.index_select(0, idx),     b_returns.index_select(0, idx)};
        auto parts = ac_loss(net, mb, cfg);
        auto loss = parts.policy + cfg.value_coef * parts.value - cfg.entropy_coef * parts.entropy;
        opt.zero_grad();
        loss.backward();
        nn::utils::clip_grad_norm_(net->parameters(), cfg.max_grad_norm);
        opt.step();
        value_loss_sum += parts.value.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
      }
    }
    const auto episodes = finished.item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- once per update, after the rollout
    if (update % cfg.log_every == 0)
      std::cout << "update " << update << " episodes " << episodes << " mean return "
                << (episodes > 0 ? finished_return / static_cast<double>(episodes) : 0.0) << " value loss "
                << value_loss_sum.item<double>() / static_cast<double>(cfg.epochs * cfg.minibatches) << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every updates only
  }
}
