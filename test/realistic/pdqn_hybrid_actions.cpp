// P-DQN for a parameterised action space: an actor proposes the continuous
// parameters of every discrete action, a Q network scores the discrete actions
// given those parameters (multi-pass variant), prioritised replay, target nets
// and inverting gradients to keep the parameters inside their bounds.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <random>
#include <vector>
#include <tuple>

namespace F = torch::nn::functional;

struct PdqnConfig {
  int64_t obs_dim = 3, frames = 4, num_actions = 3, hidden = 128;
  int64_t batch_size = 64, replay_capacity = 100000, warmup = 1000, updates_per_step = 1;
  int64_t episodes = 20000, max_steps = 200, eps_decay_steps = 50000;
  double gamma = 0.99, tau_q = 0.01, tau_actor = 0.001, lr_q = 1e-3, lr_actor = 1e-4;
  double eps_start = 1.0, eps_end = 0.02, param_noise = 0.1, per_alpha = 0.6, per_beta = 0.4;
  bool multi_pass = true;
  int64_t state_dim() const { return obs_dim * frames; }
};

struct StepResult { torch::Tensor obs; double reward; bool done; };

// A toy platform task: run, hop or leap towards a goal; the parameter sets the power.
class ToyPlatformEnv {
 public:
  ToyPlatformEnv(int64_t obs_dim, int64_t max_steps)
      : state_(torch::zeros({obs_dim}, torch::kDouble)), max_steps_(max_steps) {}
  torch::Tensor reset() {
    state_.zero_();
    state_[1] = std::uniform_real_distribution<double>(0.5, 3.0)(rng_);
    steps_ = 0;
    return state_;
  }
  StepResult step(int64_t action, const torch::Tensor& params) {
    static const double gains[] = {0.05, 0.12, 0.25};
    const double power = 0.5 * (params[action].item<double>() + 1.0);
    auto previous = state_;
    // FACT: a = torch.zeros(3, dtype=torch.float64); b = a; a[0].add_(0.5); assert b[0].item() == 0.5
    state_[0].add_(gains[action] * power);  // EXPECT: tensor-alias-then-mutate
    state_[2] = power;
    ++steps_;
    const double progress = (state_[0] - previous[0]).item<double>();
    const bool reached = std::abs((state_[1] - state_[0]).item<double>()) < 0.05;
    const double reward = progress - 0.005 * static_cast<double>(action) + (reached ? 1.0 : 0.0);
    return {state_, reward, reached || steps_ >= max_steps_};
  }
 private:
  torch::Tensor state_;
  int64_t max_steps_, steps_ = 0;
  std::mt19937 rng_{7};
};

struct FrameStack {
  torch::Tensor frames;
  FrameStack(int64_t n, int64_t dim) : frames(torch::zeros({n, dim})) {}
  void reset(const torch::Tensor& obs) {
    // FACT: f = torch.zeros(4, 3); f.copy_(torch.rand(3).unsqueeze(0).expand_as(f)); assert f[3].equal(f[0])
    frames.copy_(obs.unsqueeze(0).expand_as(frames));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only the source
  }
  void push(const torch::Tensor& obs) {
    const auto n = frames.size(0);
    // FACT: f = torch.rand(4, 3); assert raises(lambda: f.narrow(0, 0, 3).copy_(f.narrow(0, 1, 3)), "some elements of the input tensor")
    frames.narrow(0, 0, n - 1).copy_(frames.narrow(0, 1, n - 1));  // EXPECT: tensor-inplace-overlap
    frames[n - 1].copy_(obs.to(frames.scalar_type()));
  }
  torch::Tensor stacked() const { return frames.reshape({-1}).clone(); }  // LOOKALIKE: tensor-unnecessary-clone -- the next push shifts the frames in place
};

struct Batch { torch::Tensor states, actions, params, rewards, next_states, dones, weights, indices; };

class PrioritisedReplay {
 public:
  PrioritisedReplay(int64_t capacity, int64_t state_dim, int64_t param_dim)
      : states_(torch::zeros({capacity, state_dim})), actions_(torch::zeros({capacity}, torch::kLong)),
        params_(torch::zeros({capacity, param_dim})), rewards_(torch::zeros({capacity})),
        next_states_(torch::zeros({capacity, state_dim})), dones_(torch::zeros({capacity})),
        priorities_(torch::zeros({capacity}, torch::kDouble)), capacity_(capacity) {}
  void push(const torch::Tensor& s, int64_t a, const torch::Tensor& p, double r, const torch::Tensor& s2, bool done) {
    states_[pos_].copy_(s);
    actions_[pos_] = a;
    params_[pos_].copy_(p);  // EXPECT: tensor-copy-narrowing
    rewards_[pos_] = r;
    next_states_[pos_].copy_(s2);
    dones_[pos_] = done ? 1.0 : 0.0;
    priorities_[pos_] = max_priority_;
    pos_ = (pos_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }
  Batch sample(int64_t n, double alpha, double beta) {
    auto probs = priorities_.narrow(0, 0, size_).pow(alpha);
    probs.div_(probs.sum());
    auto idx = torch::multinomial(probs, n, /*replacement=*/true);
    auto weights = (probs.index_select(0, idx) * static_cast<double>(size_)).pow(-beta);
    weights.div_(weights.max());
    return {states_.index_select(0, idx),      actions_.index_select(0, idx), params_.index_select(0, idx),
            rewards_.index_select(0, idx),     next_states_.index_select(0, idx), dones_.index_select(0, idx),
            weights.to(torch::kFloat), idx};
  }
  void update_priorities(const torch::Tensor& idx, const torch::Tensor& td) {
    auto prio = td.to(torch::kDouble) + 1e-3;
    priorities_.index_put_({idx}, prio);
    max_priority_ = std::max(max_priority_, prio.max().item<double>());
  }
  int64_t size() const { return size_; }
 private:
  torch::Tensor states_, actions_, params_, rewards_, next_states_, dones_, priorities_;
  int64_t capacity_, pos_ = 0, size_ = 0;
  double max_priority_ = 1.0;
};

class ParamActorImpl : public torch::nn::Module {
 public:
  ParamActorImpl(int64_t state_dim, int64_t param_dim, int64_t hidden) {
    fc1 = register_module("fc1", torch::nn::Linear(state_dim, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    out = register_module("out", torch::nn::Linear(hidden, param_dim));
    torch::nn::init::zeros_(out->weight);
    torch::nn::init::zeros_(out->bias);
  }
  // Unbounded on purpose: the bounds are enforced by inverting the gradients.
  torch::Tensor forward(const torch::Tensor& s) { return out(torch::relu(fc2(torch::relu(fc1(s))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(ParamActor);

class QNetworkImpl : public torch::nn::Module {
 public:
  QNetworkImpl(int64_t state_dim, int64_t num_actions, int64_t param_dim, int64_t hidden, bool multi_pass)
      : multi_pass_(multi_pass) {
    fc1 = register_module("fc1", torch::nn::Linear(state_dim + param_dim, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    out = register_module("out", torch::nn::Linear(hidden, num_actions));
    // Pass k only sees the parameters of action k.
    auto mask = torch::zeros({num_actions, param_dim});
    const int64_t per_action = param_dim / num_actions;
    for (int64_t k = 0; k < num_actions; ++k) mask[k].narrow(0, k * per_action, per_action).fill_(1.0);
    mask_ = register_buffer("mask", mask);
  }
  torch::Tensor forward(const torch::Tensor& state, const torch::Tensor& params) {
    if (!multi_pass_) return head(torch::cat({state, params}, 1));
    const auto B = state.size(0), K = mask_.size(0);
    auto rep_params = params.unsqueeze(1).expand({B, K, params.size(1)}) * mask_;
    // FACT: s = torch.rand(4, 12); assert is_copy_of(s.unsqueeze(1).expand(4, 3, 12).reshape(12, -1), s)
    auto rep_state = state.unsqueeze(1).expand({B, K, state.size(1)}).reshape({B * K, -1});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: p = torch.rand(4, 3); r = p.unsqueeze(1).expand(4, 3, 3) * torch.eye(3); assert is_view_of(r.reshape(12, -1), r)
    auto flat_params = rep_params.reshape({B * K, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- the masked product is a fresh contiguous tensor
    auto q_all = head(torch::cat({rep_state, flat_params}, 1));
    return q_all.reshape({B, K, K}).diagonal(0, 1, 2);
  }
  torch::Tensor head(const torch::Tensor& x) { return out(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
 private:
  bool multi_pass_;
  torch::Tensor mask_;
};
TORCH_MODULE(QNetwork);

void hard_update(torch::nn::Module& target, const torch::nn::Module& source) {
  torch::NoGradGuard no_grad;
  auto tp = target.parameters(), sp = source.parameters();
  for (size_t i = 0; i < tp.size(); ++i) tp[i].copy_(sp[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

void soft_update(torch::nn::Module& target, const torch::nn::Module& source, double tau) {
  auto tp = target.parameters(), sp = source.parameters();
  for (size_t i = 0; i < tp.size(); ++i) tp[i].mul_(1.0 - tau).add_(sp[i], tau);  // EXPECT: tensor-inplace-on-leaf
}

// Hausknecht & Stone: scale dQ/dp by the room left towards the bound it pushes to.
torch::Tensor invert_gradients(torch::Tensor grad, const torch::Tensor& params, const torch::Tensor& p_min, const torch::Tensor& p_max) {
  torch::NoGradGuard no_grad;
  auto range = p_max - p_min;
  auto upper = p_max.unsqueeze(0).expand_as(params);
  // FACT: assert raises(lambda: torch.ones(3).unsqueeze(0).expand(4, 3).sub_(torch.rand(4, 3)), "more than one element")
  upper.sub_(params).div_(range);  // EXPECT: tensor-inplace-on-expanded
  auto lower = params - p_min.unsqueeze(0).expand_as(params);
  lower.div_(range);
  grad.mul_(torch::where(grad > 0, upper, lower));
  return grad;
}

struct ActionChoice { int64_t action; torch::Tensor params; };
struct UpdateStats { double q_loss = 0.0; torch::Tensor actor_q; int64_t updates = 0; };

class PdqnAgent {
 public:
  PdqnAgent(const PdqnConfig& cfg, torch::Device device)
      : cfg_(cfg), device_(device),
        actor_(cfg.state_dim(), cfg.num_actions, cfg.hidden), actor_target_(cfg.state_dim(), cfg.num_actions, cfg.hidden),
        qnet_(cfg.state_dim(), cfg.num_actions, cfg.num_actions, cfg.hidden, cfg.multi_pass),
        q_target_(cfg.state_dim(), cfg.num_actions, cfg.num_actions, cfg.hidden, cfg.multi_pass),
        replay_(cfg.replay_capacity, cfg.state_dim(), cfg.num_actions),
        p_min_(torch::full({cfg.num_actions}, -1.0)), p_max_(torch::full({cfg.num_actions}, 1.0)),
        obs_mean_(torch::tensor({1.0f, 1.5f, 0.5f})), obs_std_(torch::tensor({1.0f, 0.8f, 0.3f})) {
    for (auto* m : std::vector<torch::nn::Module*>{actor_.get(), actor_target_.get(), qnet_.get(), q_target_.get()}) m->to(device);
    hard_update(*actor_target_, *actor_);
    hard_update(*q_target_, *qnet_);
    actor_opt_ = std::make_unique<torch::optim::Adam>(actor_->parameters(), torch::optim::AdamOptions(cfg.lr_actor));
    q_opt_ = std::make_unique<torch::optim::Adam>(qnet_->parameters(), torch::optim::AdamOptions(cfg.lr_q));
  }
  torch::Tensor normalise(const torch::Tensor& obs) const {
    auto s = obs.to(torch::kFloat);
    // FACT: o = torch.rand(3, dtype=torch.float64); assert is_copy_of(o.to(torch.float32), o)
    s.sub_(obs_mean_).div_(obs_std_);  // LOOKALIKE: tensor-alias-then-mutate -- the env reports doubles, to(kFloat) copies
    return s;
  }
  double epsilon() const {
    const double frac = std::min(1.0, static_cast<double>(steps_) / static_cast<double>(cfg_.eps_decay_steps));
    return cfg_.eps_start + frac * (cfg_.eps_end - cfg_.eps_start);
  }
  ActionChoice act(const torch::Tensor& state, bool explore) {
    torch::NoGradGuard no_grad;
    auto s = state.to(device_).unsqueeze(0);
    auto params = actor_->forward(s);
    if (explore) params.add_(torch::randn_like(params), cfg_.param_noise).clamp_(-1.0, 1.0);  // LOOKALIKE: tensor-inplace-on-saved -- no graph is recorded under NoGradGuard
    int64_t action = 0;
    if (explore && std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < epsilon())
      action = std::uniform_int_distribution<int64_t>(0, cfg_.num_actions - 1)(rng_);
    else
      action = qnet_->forward(s, params).argmax(1).item<int64_t>();
    ++steps_;
    return {action, params.squeeze(0).to(torch::kCPU, torch::kDouble)};
  }
  void remember(const torch::Tensor& s, const ActionChoice& c, double r, const torch::Tensor& s2, bool done) { replay_.push(s, c.action, c.params, r, s2, done); }
  void update(UpdateStats& stats) {
    if (replay_.size() < cfg_.warmup) return;
    for (int64_t it = 0; it < cfg_.updates_per_step; ++it) {
      auto batch = replay_.sample(cfg_.batch_size, cfg_.per_alpha, cfg_.per_beta);
      auto s = batch.states.to(device_);  // LOOKALIKE: tensor-clone-in-loop -- a new sample every iteration
      auto a = batch.actions.to(device_);
      auto p = batch.params.to(device_);
      auto r = batch.rewards.to(device_);
      auto s2 = batch.next_states.to(device_);
      auto d = batch.dones.to(device_);
      auto w = batch.weights.to(device_);
      auto bounds = torch::stack({p_min_, p_max_}).to(device_);  // EXPECT: tensor-clone-in-loop
      torch::Tensor target;
      {
        torch::NoGradGuard no_grad;
        auto next_q = q_target_->forward(s2, actor_target_->forward(s2));
        target = r + cfg_.gamma * (1.0 - d) * std::get<0>(next_q.max(1));
      }
      auto q_sa = qnet_->forward(s, p).gather(1, a.unsqueeze(1)).squeeze(1);
      auto q_loss = (w * F::smooth_l1_loss(q_sa, target, F::SmoothL1LossFuncOptions().reduction(torch::kNone))).mean();
      auto td = q_sa.detach();
      // FACT: q = torch.rand(4, requires_grad=True) * 1.0; t = torch.rand(4); l = torch.nn.functional.smooth_l1_loss(q, t); td = q.detach(); td.sub_(t).abs_(); assert backward_fails(lambda: l.backward())
      td.sub_(target).abs_();  // EXPECT: tensor-inplace-on-detached
      replay_.update_priorities(batch.indices, td.to(torch::kCPU));  // LOOKALIKE: tensor-sync-in-loop -- the host-side sampler needs the new priorities
      q_opt_->zero_grad();
      q_loss.backward();
      q_opt_->step();
      stats.q_loss += q_loss.item<double>();  // EXPECT: tensor-sync-in-loop
      // Actor: follow dQ/dparams, inverted near the bounds.
      auto action_params = actor_->forward(s);
      auto p_leaf = action_params.detach().requires_grad_(true);  // LOOKALIKE: tensor-inplace-on-detached -- requires_grad_ only flags the new leaf
      auto q_for_actor = qnet_->forward(s, p_leaf);
      q_for_actor.sum(1).mean().backward();
      stats.actor_q += q_for_actor.mean();  // EXPECT: tensor-graph-kept-across-iterations
      auto delta = invert_gradients(p_leaf.grad(), p_leaf.detach(), bounds[0], bounds[1]);
      actor_opt_->zero_grad();
      action_params.backward(-delta);
      actor_opt_->step();
      ++stats.updates;
    }
    soft_update(*actor_target_, *actor_, cfg_.tau_actor);
    soft_update(*q_target_, *qnet_, cfg_.tau_q);
  }
 private:
  PdqnConfig cfg_;
  torch::Device device_;
  ParamActor actor_, actor_target_;
  QNetwork qnet_, q_target_;
  PrioritisedReplay replay_;
  torch::Tensor p_min_, p_max_, obs_mean_, obs_std_;
  std::unique_ptr<torch::optim::Adam> actor_opt_, q_opt_;
  std::mt19937 rng_{42};
  int64_t steps_ = 0;
};

int main() {
  PdqnConfig cfg;
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ToyPlatformEnv env(cfg.obs_dim, cfg.max_steps);
  PdqnAgent agent(cfg, device);
  FrameStack stack(cfg.frames, cfg.obs_dim);
  UpdateStats stats{0.0, torch::zeros({}, device), 0};
  auto recent = torch::zeros({100}, torch::kDouble);
  for (int64_t ep = 0; ep < cfg.episodes; ++ep) {
    stack.reset(agent.normalise(env.reset()));
    auto state = stack.stacked();
    double ep_return = 0.0;
    for (bool done = false; !done;) {
      auto choice = agent.act(state, /*explore=*/true);
      auto res = env.step(choice.action, choice.params);
      stack.push(agent.normalise(res.obs));
      auto next_state = stack.stacked();
      agent.remember(state, choice, res.reward, next_state, res.done);
      agent.update(stats);
      state = next_state;
      ep_return += res.reward;
      done = res.done;
    }
    // FACT: w = torch.arange(10.); w.narrow(0, 0, 9).copy_(w.narrow(0, 1, 9).clone()); assert w[0].item() == 1.0 and w[8].item() == 9.0
    recent.narrow(0, 0, 99).copy_(recent.narrow(0, 1, 99).clone());  // LOOKALIKE: tensor-inplace-overlap, tensor-unnecessary-clone -- the clone frees the source from the buffer it is copied into
    recent[99] = ep_return;
    if (ep % 100 == 99 && stats.updates > 0) {
      std::cout << "episode " << ep + 1 << " avg return " << recent.mean().item<double>() << " eps " << agent.epsilon()
                << " q loss " << stats.q_loss / stats.updates << " actor Q " << stats.actor_q.item<double>() / stats.updates << "\n";
    }
  }
  return 0;
}
