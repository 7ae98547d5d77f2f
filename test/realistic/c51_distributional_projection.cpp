// Categorical DQN (C51; Bellemare, Dabney & Munos 2017) trained from E vectorised Atari
// environments. The online network predicts a distribution over 51 fixed return atoms per
// action; the learning target is the target network's distribution for the online greedy action,
// shifted by the n-step return and projected back onto the atoms (Algorithm 1 of the paper).
// n-step transitions are assembled on the host from a window of the last n steps of all
// environments and kept in a uniform replay ring; the learner runs on the GPU. The head is
// re-drawn every reset_every iterations against the loss of plasticity (Nikishin et al. 2022).
#include <torch/torch.h>
#include <algorithm>
#include <deque>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

struct C51Config {
  int64_t n_envs = 8, n_actions = 6, n_atoms = 51, frames = 4, size = 84, n_step = 3;
  int64_t capacity = 400000, batch = 64, learn_start = 20000, grad_steps = 2;
  int64_t target_every = 2000, total_iters = 1250000, log_every = 500, reset_every = 200000;
  double v_min = -10.0, v_max = 10.0, gamma = 0.99, lr = 2.5e-4, adam_eps = 3.125e-4;
  double eps_start = 1.0, eps_end = 0.01, eps_iters = 250000;
};

// E environments stepped together: uint8 frame stacks [E, frames, 84, 84], rewards clipped to
// {-1, 0, 1} as float [E], done flags as bool [E]. A finished environment is reset by step(),
// which then returns the first frames of the next episode.
struct VecEnv {
  struct Step {
    torch::Tensor obs, reward, done;
  };
  virtual ~VecEnv() = default;
  virtual torch::Tensor reset() = 0;
  virtual Step step(const torch::Tensor &actions) = 0; // actions: int64 [E] on the host
};

struct C51NetImpl : torch::nn::Module {
  explicit C51NetImpl(const C51Config &cfg) : A_(cfg.n_actions), N_(cfg.n_atoms) {
    namespace nn = torch::nn;
    torso_ = register_module("torso", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(cfg.frames, 32, 8).stride(4)), nn::ReLU(),
                                                     nn::Conv2d(nn::Conv2dOptions(32, 64, 4).stride(2)), nn::ReLU(),
                                                     nn::Conv2d(nn::Conv2dOptions(64, 64, 3).stride(1)), nn::ReLU()));
    fc_ = register_module("fc", nn::Linear(64 * 7 * 7, 512));
    head_ = register_module("head", nn::Linear(512, cfg.n_actions * cfg.n_atoms));
    support_ = register_buffer("support", torch::linspace(cfg.v_min, cfg.v_max, cfg.n_atoms));
  }

  // log-probabilities over the atoms for every action, [B, A, N]; obs are uint8 frames
  torch::Tensor forward(const torch::Tensor &obs) {
    auto conv = torso_->forward(obs.to(torch::kFloat) / 255.0);
    // FACT: c = torch.relu(torch.nn.Conv2d(4, 8, 3)(torch.randn(2, 4, 9, 9))); assert is_view_of(c.flatten(1), c)
    auto h = torch::relu(fc_(conv.flatten(1))); // LOOKALIKE: tensor-reshape-non-contiguous -- the conv stack's output is contiguous: flatten is a view
    // FACT: y = torch.nn.Linear(5, 12)(torch.randn(3, 5)); assert is_view_of(y.view(-1, 3, 4), y)
    return torch::log_softmax(head_(h).view({-1, A_, N_}), -1); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
  }

  // expected return of every action, [B, A]
  torch::Tensor q_values(const torch::Tensor &obs) {
    return (forward(obs).exp() * support_).sum(-1); // LOOKALIKE: tensor-device-mismatch -- the support is a registered buffer: to(device) moved it with the weights
  }

  void reset_head() {
    // FACT: l = torch.nn.Linear(4, 6); l.reset_parameters(); assert l.weight.is_leaf and l.weight.requires_grad
    head_->reset_parameters(); // LOOKALIKE: tensor-inplace-on-leaf -- Linear's own reset runs its nn::init calls under NoGradGuard
    // every action should start near the uniform distribution over the atoms
    // FACT: l = torch.nn.Linear(4, 6); assert raises(lambda: l.weight.mul_(0.1), "a leaf Variable that requires grad")
    head_->weight.mul_(0.1); // EXPECT: tensor-inplace-on-leaf -- a trainable weight scaled in place with grad mode on
  }

  int64_t A_, N_;
  torch::nn::Sequential torso_{nullptr};
  torch::nn::Linear fc_{nullptr}, head_{nullptr};
  torch::Tensor support_;
};
TORCH_MODULE(C51Net);

struct Minibatch {
  torch::Tensor obs, actions, returns, next_obs, discounts;
};

// Uniform replay over a ring of transitions; E transitions are written at once, so the capacity
// is a multiple of the number of environments.
class ReplayRing {
public:
  explicit ReplayRing(const C51Config &cfg)
      : cap_(cfg.capacity), obs_(torch::zeros({cfg.capacity, cfg.frames, cfg.size, cfg.size}, torch::kUInt8)),
        next_obs_(torch::zeros({cfg.capacity, cfg.frames, cfg.size, cfg.size}, torch::kUInt8)),
        actions_(torch::zeros({cfg.capacity}, torch::kLong)),
        returns_(torch::zeros({cfg.capacity}, torch::kInt8)), // clipped rewards fit in a byte
        discounts_(torch::zeros({cfg.capacity})) {
    TORCH_CHECK(cfg.capacity % cfg.n_envs == 0, "capacity must be a multiple of n_envs");
  }

  void add(const torch::Tensor &obs, const torch::Tensor &actions, const torch::Tensor &returns,
           const torch::Tensor &next_obs, const torch::Tensor &discounts) {
    const auto E = obs.size(0);
    // FACT: r = torch.zeros(6, 3, dtype=torch.uint8); f = torch.randint(0, 256, (2, 3), dtype=torch.uint8); r.narrow(0, 2, 2).copy_(f); assert torch.equal(r[2:4], f)
    obs_.narrow(0, pos_, E).copy_(obs); // LOOKALIKE: tensor-copy-narrowing -- the environments' frames are uint8 already
    next_obs_.narrow(0, pos_, E).copy_(next_obs); // LOOKALIKE: tensor-copy-narrowing -- uint8 frames into a uint8 ring
    actions_.narrow(0, pos_, E).copy_(actions);
    // FACT: r = torch.zeros(4, dtype=torch.int8); r.copy_(torch.tensor([1.99, 0.97, -0.5, 2.9])); assert r.tolist() == [1, 0, 0, 2]
    returns_.narrow(0, pos_, E).copy_(returns); // EXPECT: tensor-copy-narrowing -- n-step returns such as 1.99 or 0.97 are no clipped rewards: the int8 ring truncates them toward zero
    discounts_.narrow(0, pos_, E).copy_(discounts);
    pos_ = (pos_ + E) % cap_;
    size_ = std::min(size_ + E, cap_);
  }

  Minibatch sample(int64_t n) const {
    auto idx = torch::randint(size_, {n}, torch::kLong);
    return {obs_.index_select(0, idx), actions_.index_select(0, idx), returns_.index_select(0, idx).to(torch::kFloat),
            next_obs_.index_select(0, idx), discounts_.index_select(0, idx)};
  }

  int64_t size() const { return size_; }

private:
  int64_t cap_, pos_ = 0, size_ = 0;
  torch::Tensor obs_, next_obs_, actions_, returns_, discounts_;
};

// The last n steps of the E environments. Once full, emit() gives the transition of the oldest
// step: (s_t, a_t, r_t + g r_t+1 + ... up to a termination, gamma^n or 0 where one ended).
class NStepWindow {
public:
  NStepWindow(int64_t n, double gamma) : n_(n), gamma_(gamma) {}

  void push(torch::Tensor obs, torch::Tensor actions, torch::Tensor rewards, torch::Tensor dones) {
    steps_.push_back({std::move(obs), std::move(actions), std::move(rewards), std::move(dones)});
    if (static_cast<int64_t>(steps_.size()) > n_)
      steps_.pop_front();
  }
  bool full() const { return static_cast<int64_t>(steps_.size()) == n_; }

  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> emit() const {
    auto ret = torch::zeros_like(steps_.front().rewards);
    auto alive = torch::ones_like(ret);
    double g = 1.0;
    for (const auto &s : steps_) {
      ret += g * alive * s.rewards; // LOOKALIKE: tensor-graph-kept-across-iterations -- environment rewards carry no graph
      alive = alive * s.dones.logical_not().to(torch::kFloat);
      g *= gamma_;
    }
    return {steps_.front().obs, steps_.front().actions, ret, alive * g};
  }

private:
  struct Step {
    torch::Tensor obs, actions, rewards, dones;
  };
  int64_t n_;
  double gamma_;
  std::deque<Step> steps_;
};

class C51Agent {
public:
  explicit C51Agent(const C51Config &cfg)
      : cfg_(cfg), device_(torch::kCUDA), online_(cfg), target_(cfg),
        opt_(online_->parameters(), torch::optim::AdamOptions(cfg.lr).eps(cfg.adam_eps)) {
    online_->to(device_);
    target_->to(device_);
    update_target();
    // row offsets into the flattened [batch, N] target, for index_add_
    offset_ = torch::arange(cfg.batch, torch::kLong).mul(cfg.n_atoms).unsqueeze(1).expand({cfg.batch, cfg.n_atoms});
  }

  // epsilon-greedy actions for the E environments, returned on the host
  torch::Tensor act(const torch::Tensor &obs, double eps) {
    torch::NoGradGuard no_grad;
    const auto E = obs.size(0);
    auto greedy = online_->q_values(obs.to(device_)).argmax(1);
    auto explore = torch::rand({E}) < eps;
    auto random = torch::randint(cfg_.n_actions, {E}, torch::kLong);
    return torch::where(explore, random, greedy).cpu(); // EXPECT: tensor-device-mismatch -- the mask and the random actions are host tensors of E values, the greedy actions are on the GPU
  }

  void update_target() {
    torch::NoGradGuard no_grad;
    auto src = online_->parameters();
    auto dst = target_->parameters();
    // FACT: a = torch.nn.Linear(3, 2); b = torch.nn.Linear(3, 2); exec('with torch.no_grad(): b.weight.copy_(a.weight)'); assert b.weight.is_leaf and torch.equal(a.weight, b.weight)
    for (size_t i = 0; i < dst.size(); ++i)
      dst[i].copy_(src[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  void reset_head() { online_->reset_head(); }

  void learn(const ReplayRing &replay) {
    const auto B = cfg_.batch, N = cfg_.n_atoms;
    const double dz = (cfg_.v_max - cfg_.v_min) / static_cast<double>(N - 1);
    for (int64_t k = 0; k < cfg_.grad_steps; ++k) {
      auto mb = replay.sample(B);
      auto obs = mb.obs.to(device_), actions = mb.actions.to(device_); // LOOKALIKE: tensor-clone-in-loop -- a new minibatch every update
      auto offset = offset_.to(device_); // EXPECT: tensor-clone-in-loop -- the fixed row offsets are uploaded again at every update
      torch::Tensor m;
      {
        torch::NoGradGuard no_grad;
        auto next_obs = mb.next_obs.to(device_);
        auto a_star = online_->q_values(next_obs).argmax(1); // double DQN: the online net picks the action
        auto next_p = target_->forward(next_obs).exp().gather(1, a_star.view({-1, 1, 1}).expand({B, 1, N})).squeeze(1);
        auto tz = (mb.returns.to(device_).unsqueeze(1) + mb.discounts.to(device_).unsqueeze(1) * online_->support_.unsqueeze(0))
                      .clamp(cfg_.v_min, cfg_.v_max);
        auto pos = (tz - cfg_.v_min) / dz;
        auto l = pos.floor().to(torch::kLong), u = pos.ceil().to(torch::kLong);
        // a target on an atom has l == u and would drop its mass: split it to a neighbour
        l = torch::where((u > 0) & (l == u), l - 1, l);
        u = torch::where((l < N - 1) & (l == u), u + 1, u);
        m = torch::zeros({B, N}, next_p.options());
        // FACT: m = torch.zeros(3, 5); l = torch.randint(0, 5, (3, 5)); o = torch.arange(3).mul(5).unsqueeze(1).expand(3, 5); v = m.view(-1); v.index_add_(0, (l + o).view(-1), torch.rand(15)); assert is_view_of(v, m) and is_contiguous(l + o) and float(m.sum()) > 0
        m.view({-1}).index_add_(0, (l + offset).view({-1}), (next_p * (u.to(torch::kFloat) - pos)).view({-1})); // LOOKALIKE: tensor-view-non-contiguous, tensor-alias-then-mutate -- m is a fresh contiguous buffer, filled through its own view on purpose
        m.view({-1}).index_add_(0, (u + offset).view({-1}), (next_p * (pos - l.to(torch::kFloat))).view({-1}));
      }
      auto log_p = online_->forward(obs);
      auto chosen = log_p.gather(1, actions.view({-1, 1, 1}).expand({B, 1, N})).squeeze(1);
      auto loss = -(m * chosen).sum(1).mean();
      // the online distribution's expected return, for the log
      auto probs = log_p.detach();
      // FACT: l = torch.nn.Linear(3, 8); lp = torch.log_softmax(l(torch.randn(4, 3)).view(4, 2, 4), -1); loss = -lp.gather(1, torch.zeros(4, 1, 4, dtype=torch.long)).sum(); p = lp.detach(); p.exp_(); assert backward_fails(lambda: loss.backward())
      probs.exp_(); // EXPECT: tensor-inplace-on-detached -- detach() shares log_p's storage, which log_softmax saved: loss.backward() below raises
      q_mean_ = (probs * online_->support_).sum(-1).amax(1).mean();
      opt_.zero_grad();
      loss.backward();
      opt_.step();
      // FACT: l = torch.nn.Linear(3, 2); c = []; exec('for _ in range(3):\n loss = l(torch.randn(4, 3)).pow(2).mean(); loss.backward(); c.append(loss)'); assert kept_nodes(c) >= 9
      loss_log_.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations -- each update's graph stays reachable until the logger drains the list
    }
  }

  double drain_loss_log() {
    if (loss_log_.empty())
      return 0.0;
    const double mean = torch::stack(loss_log_).mean().item<double>();
    loss_log_.clear();
    return mean;
  }
  const torch::Tensor &q_mean() const { return q_mean_; }

private:
  C51Config cfg_;
  torch::Device device_;
  C51Net online_, target_;
  torch::optim::Adam opt_;
  torch::Tensor offset_, q_mean_ = torch::zeros({});
  std::vector<torch::Tensor> loss_log_;
};

void train(C51Agent &agent, VecEnv &env, const C51Config &cfg) {
  ReplayRing replay(cfg);
  NStepWindow window(cfg.n_step, cfg.gamma);
  auto obs = env.reset();
  for (int64_t it = 1; it <= cfg.total_iters; ++it) {
    const double frac = std::min(1.0, static_cast<double>(it) / cfg.eps_iters);
    auto actions = agent.act(obs, cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start));
    auto st = env.step(actions);
    window.push(obs, actions, st.reward, st.done);
    if (window.full()) {
      auto [o, a, ret, disc] = window.emit();
      replay.add(o, a, ret, st.obs, disc);
    }
    obs = st.obs;

    if (replay.size() >= cfg.learn_start)
      agent.learn(replay);
    if (it % cfg.target_every == 0)
      agent.update_target();
    if (it % cfg.reset_every == 0)
      agent.reset_head();
    if (it % cfg.log_every == 0)
      std::cout << "iter " << it << " loss " << agent.drain_loss_log() << " max Q " << agent.q_mean().item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every iterations
  }
}
