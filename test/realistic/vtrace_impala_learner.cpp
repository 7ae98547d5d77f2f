// IMPALA (Espeholt et al. 2018) for vector-observation tasks. Actor threads run a CPU copy of the
// policy and push unrolls of T steps, with the logits they sampled from, into a bounded queue;
// the learner pops B unrolls, runs the network over all of them at once, corrects for the
// actors' lag with V-trace targets (behaviour vs. current policy log-probs of the taken actions)
// and takes an RMSProp step. Observations are normalised with running statistics kept as buffers
// of the network, so the actors receive them together with the weights.
#include <torch/torch.h>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

struct ImpalaConfig {
  int64_t obs_dim = 64, n_actions = 9, hidden = 256, unroll = 20, batch = 32, queue_cap = 128;
  int64_t total_updates = 100000, log_every = 200;
  double gamma = 0.99, lr = 4.8e-4, rms_alpha = 0.99, rms_eps = 0.01, max_grad_norm = 40.0;
  double baseline_cost = 0.5, entropy_cost = 0.01, rho_bar = 1.0, c_bar = 1.0;
};

struct Environment {
  struct Step { torch::Tensor obs; double reward; bool done; }; // obs: [obs_dim] float
  virtual ~Environment() = default;
  virtual torch::Tensor reset() = 0;
  virtual Step step(int64_t action) = 0;
};

struct ImpalaNetImpl : torch::nn::Module {
  explicit ImpalaNetImpl(const ImpalaConfig &cfg) {
    namespace nn = torch::nn;
    torso_ = register_module("torso", nn::Sequential(nn::Linear(cfg.obs_dim, cfg.hidden), nn::ReLU(),
                                                     nn::Linear(cfg.hidden, cfg.hidden), nn::ReLU()));
    policy_ = register_module("policy", nn::Linear(cfg.hidden, cfg.n_actions));
    baseline_ = register_module("baseline", nn::Linear(cfg.hidden, 1));
    obs_mean_ = register_buffer("obs_mean", torch::zeros({cfg.obs_dim}));
    obs_var_ = register_buffer("obs_var", torch::ones({cfg.obs_dim}));
  }

  // obs [N, obs_dim] -> (policy logits [N, A], baseline [N])
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &obs) {
    // FACT: o = torch.randn(4, 3); m = torch.randn(3); x = o.clone(); x.sub_(m); assert torch.equal(x, o.sub(m)) and is_copy_of(o.sub(m), o)
    auto x = obs.clone(); // EXPECT: tensor-unnecessary-clone -- shifted in place right after: obs.sub(obs_mean_) makes the same tensor in one pass
    x.sub_(obs_mean_).div_((obs_var_ + 1e-8).sqrt()).clamp_(-5.0, 5.0);
    auto h = torso_->forward(x);
    return {policy_(h), baseline_(h).squeeze(-1)};
  }

  // Running mean and variance merged with a batch [N, obs_dim] (Chan et al.'s parallel update).
  void update_obs_stats(const torch::Tensor &x) {
    torch::NoGradGuard no_grad;
    const double n = static_cast<double>(x.size(0)), tot = count_ + n;
    auto batch_mean = x.mean(0), batch_var = x.var(0, /*unbiased=*/false);
    auto old_mean = obs_mean_;
    // FACT: m = torch.zeros(3); old = m; m.add_((torch.ones(3) - m) * 0.5); assert shares_storage(old, m) and torch.equal(old, torch.full((3,), 0.5))
    obs_mean_.add_((batch_mean - obs_mean_) * (n / tot)); // EXPECT: tensor-alias-then-mutate -- old_mean is the same tensor: the variance update below reads the new mean
    auto delta = batch_mean - old_mean;
    // FACT: l = torch.nn.BatchNorm1d(3); l.running_var.mul_(0.5); assert not l.running_var.requires_grad
    obs_var_.mul_(count_ / tot).add_(batch_var * (n / tot) + delta.pow(2) * (count_ * n / (tot * tot))); // LOOKALIKE: tensor-inplace-on-leaf -- a buffer, which requires no grad, under NoGradGuard
    count_ = tot;
  }

  torch::nn::Sequential torso_{nullptr};
  torch::nn::Linear policy_{nullptr}, baseline_{nullptr};
  torch::Tensor obs_mean_, obs_var_;
  double count_ = 1e-4;
};
TORCH_MODULE(ImpalaNet);

// One actor's unroll of T steps.
struct Unroll {
  torch::Tensor obs;              // [T + 1, obs_dim]: the last one bootstraps
  torch::Tensor actions;          // [T] int64
  torch::Tensor rewards;          // [T]
  torch::Tensor dones;            // [T] bool: the episode ended with step t
  torch::Tensor behaviour_logits; // [T, A]
};

class UnrollQueue {
public:
  explicit UnrollQueue(size_t cap) : cap_(cap) {}
  bool push(Unroll u) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return q_.size() < cap_ || closed_; });
    if (closed_)
      return false;
    q_.push_back(std::move(u));
    not_empty_.notify_one();
    return true;
  }
  std::vector<Unroll> pop_batch(size_t n) {
    std::vector<Unroll> out;
    std::unique_lock<std::mutex> lock(mu_);
    while (out.size() < n) {
      not_empty_.wait(lock, [&] { return !q_.empty(); });
      out.push_back(std::move(q_.front()));
      q_.pop_front();
      not_full_.notify_one();
    }
    return out;
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_full_.notify_all();
  }

private:
  size_t cap_;
  bool closed_ = false;
  std::deque<Unroll> q_;
  std::mutex mu_;
  std::condition_variable not_full_, not_empty_;
};

// The newest weights and observation statistics, on the host, for the actors.
class ParameterServer {
public:
  void publish(ImpalaNet &net) {
    std::vector<torch::Tensor> snap;
    for (const auto &p : net->parameters())
      snap.push_back(p.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true)); // LOOKALIKE: tensor-clone-in-loop, tensor-sync-in-loop -- a different parameter each time, and every copy is handed to the actors
    for (const auto &b : net->buffers())
      snap.push_back(b.to(torch::kCPU, false, true));
    std::lock_guard<std::mutex> lock(mu_);
    tensors_ = std::move(snap);
    ++version_;
  }

  // Copies newer weights into an actor's network; returns the version it now holds.
  int64_t pull(ImpalaNet &net, int64_t have) {
    std::lock_guard<std::mutex> lock(mu_);
    if (version_ == have)
      return have;
    torch::NoGradGuard no_grad;
    auto params = net->parameters();
    auto bufs = net->buffers();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].copy_(tensors_[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    for (size_t i = 0; i < bufs.size(); ++i)
      bufs[i].copy_(tensors_[params.size() + i]);
    return version_;
  }

private:
  std::mutex mu_;
  std::vector<torch::Tensor> tensors_;
  int64_t version_ = 0;
};

void run_actor(std::unique_ptr<Environment> env, UnrollQueue &queue, ParameterServer &server, const ImpalaConfig &cfg,
               const std::atomic<bool> &stop) {
  torch::NoGradGuard no_grad;
  ImpalaNet policy(cfg);
  int64_t version = -1;
  const auto T = cfg.unroll;
  auto obs = env->reset();
  while (!stop) {
    version = server.pull(policy, version);
    Unroll u{torch::empty({T + 1, cfg.obs_dim}), torch::empty({T}, torch::kLong), torch::empty({T}),
             torch::empty({T}, torch::kBool), torch::Tensor()};
    std::vector<torch::Tensor> logits;
    for (int64_t t = 0; t < T; ++t) {
      auto out = policy->forward(obs.unsqueeze(0));
      logits.push_back(out.first.squeeze(0)); // LOOKALIKE: tensor-graph-kept-across-iterations -- the actor runs under NoGradGuard
      const auto a = torch::multinomial(torch::softmax(out.first, -1), 1).item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- a host tensor, and the sampled action steers the environment
      auto st = env->step(a);
      u.obs[t] = obs; // LOOKALIKE: tensor-copy-narrowing -- float observations into a float buffer
      u.actions[t] = a;
      u.rewards[t] = st.reward;
      u.dones[t] = st.done;
      obs = st.done ? env->reset() : st.obs;
    }
    u.obs[T] = obs;
    u.behaviour_logits = torch::stack(logits);
    if (!queue.push(std::move(u)))
      break;
  }
}

// Batch-major, as stacked from the queue: [B, T (+ 1), ...]
struct Batch {
  torch::Tensor obs, actions, rewards, dones, behaviour_logits;
};

Batch collate(const std::vector<Unroll> &unrolls, torch::Device device) {
  std::vector<torch::Tensor> obs, actions, rewards, dones, logits;
  for (const auto &u : unrolls) {
    obs.push_back(u.obs);
    actions.push_back(u.actions);
    rewards.push_back(u.rewards);
    dones.push_back(u.dones);
    logits.push_back(u.behaviour_logits);
  }
  return {torch::stack(obs).to(device), torch::stack(actions).to(device), torch::stack(rewards).to(device),
          torch::stack(dones).to(device), torch::stack(logits).to(device)};
}

struct VTrace {
  torch::Tensor vs, pg_advantages;
};

// V-trace (Remark 1 of the paper), everything time-major [T, B]; bootstrap is V(x_T), [B].
VTrace vtrace(const torch::Tensor &behaviour_logp, const torch::Tensor &target_logp, const torch::Tensor &discounts,
              const torch::Tensor &rewards, const torch::Tensor &values, const torch::Tensor &bootstrap, double rho_bar,
              double c_bar) {
  const auto T = values.size(0);
  auto rhos = torch::exp(target_logp - behaviour_logp);
  auto cs = rhos.clamp_max(c_bar);
  // FACT: t = torch.randn(4, requires_grad=True); b = torch.randn(4); r = torch.exp(t - b); c = r.clamp_max(1.0); r.clamp_max_(1.0); assert backward_fails(lambda: (r * t + c).sum().backward())
  rhos.clamp_max_(rho_bar); // EXPECT: tensor-inplace-on-saved -- target_logp comes in with its graph: exp saved rhos, and the learner's backward() goes through it
  auto values_tp1 = torch::cat({values.narrow(0, 1, T - 1), bootstrap.unsqueeze(0)});
  auto deltas = rhos * (rewards + discounts * values_tp1 - values);
  auto acc = torch::zeros_like(bootstrap);
  std::vector<torch::Tensor> vs_minus_v(static_cast<size_t>(T));
  for (int64_t t = T - 1; t >= 0; --t) {
    acc = deltas[t] + discounts[t] * cs[t] * acc; // LOOKALIKE: tensor-graph-kept-across-iterations -- the recursion ends in vs, which the learner's loss differentiates
    vs_minus_v[static_cast<size_t>(t)] = acc; // LOOKALIKE: tensor-graph-kept-across-iterations -- returned in vs and differentiated by the learner's loss
  }
  auto vs = torch::stack(vs_minus_v) + values;
  auto vs_tp1 = torch::cat({vs.narrow(0, 1, T - 1), bootstrap.unsqueeze(0)});
  return {vs, rhos * (rewards + discounts * vs_tp1 - values)};
}

double explained_variance(const torch::Tensor &pred, const torch::Tensor &target) {
  return 1.0 - ((target - pred).var() / target.var().clamp_min(1e-8)).item<double>();
}

struct UpdateStats {
  torch::Tensor loss, return_per_unroll;
  double explained_var = 0;
};

class Learner {
public:
  Learner(ImpalaNet net, const ImpalaConfig &cfg, torch::Device device)
      : net_(std::move(net)), cfg_(cfg),
        opt_(net_->parameters(), torch::optim::RMSpropOptions(cfg.lr).alpha(cfg.rms_alpha).eps(cfg.rms_eps)) {
    net_->to(device);
  }

  UpdateStats update(const Batch &batch) {
    const auto B = batch.actions.size(0), T = batch.actions.size(1);
    // FACT: s = torch.stack([torch.randn(6, 5) for _ in range(4)]); assert is_view_of(s.flatten(0, 1), s)
    auto flat_obs = batch.obs.flatten(0, 1); // LOOKALIKE: tensor-reshape-non-contiguous -- the stacked batch is contiguous: flatten is a view
    net_->update_obs_stats(flat_obs);
    auto out = net_->forward(flat_obs);
    // time-major [T + 1, B, ...] for V-trace
    // FACT: y = torch.nn.Linear(5, 3)(torch.randn(24, 5)); v = torch.nn.Linear(5, 1)(torch.randn(24, 5)).squeeze(-1); assert is_view_of(y.view(4, 6, -1), y) and is_view_of(v.view(4, 6), v)
    auto logits = out.first.view({B, T + 1, -1}).transpose(0, 1); // LOOKALIKE: tensor-view-non-contiguous -- the policy head's output is contiguous; the transpose comes after the view
    auto values = out.second.view({B, T + 1}).transpose(0, 1); // LOOKALIKE: tensor-view-non-contiguous -- squeeze(-1) of the [N, 1] baseline output is contiguous
    auto actions = batch.actions.transpose(0, 1).unsqueeze(2);
    auto target_logits = logits.narrow(0, 0, T);
    auto target_logp = torch::log_softmax(target_logits, -1).gather(2, actions).squeeze(2);
    auto behaviour_logp = torch::log_softmax(batch.behaviour_logits.transpose(0, 1), -1).gather(2, actions).squeeze(2);
    auto discounts = batch.dones.logical_not().to(torch::kFloat).mul(cfg_.gamma).transpose(0, 1);
    auto vt = vtrace(behaviour_logp, target_logp, discounts, batch.rewards.transpose(0, 1), values.narrow(0, 0, T).detach(),
                     values[T].detach(), cfg_.rho_bar, cfg_.c_bar);

    auto pg_loss = -(target_logp * vt.pg_advantages).sum();
    auto baseline_loss = 0.5 * (vt.vs - values.narrow(0, 0, T)).pow(2).sum();
    // entropy bonus over every (step, unroll) pair
    // FACT: l = torch.randn(4 * 6, 3).view(4, 6, 3).transpose(0, 1).narrow(0, 0, 5); assert is_copy_of(l.reshape(20, -1), l)
    auto flat_logits = target_logits.reshape({T * B, -1}); // EXPECT: tensor-reshape-non-contiguous -- the time-major logits are a transpose of the net's output: reshape copies them
    auto entropy = -(torch::softmax(flat_logits, -1) * torch::log_softmax(flat_logits, -1)).sum();
    auto loss = pg_loss + cfg_.baseline_cost * baseline_loss - cfg_.entropy_cost * entropy;
    opt_.zero_grad();
    loss.backward();
    // FACT: l = torch.nn.Linear(3, 2); l(torch.randn(4, 3)).sum().backward(); torch.nn.utils.clip_grad_norm_(l.parameters(), 0.1); assert l.weight.is_leaf and float(l.weight.grad.norm()) <= 0.1 + 1e-6
    torch::nn::utils::clip_grad_norm_(net_->parameters(), cfg_.max_grad_norm); // LOOKALIKE: tensor-inplace-on-leaf -- rescales the gradients, not the parameters
    opt_.step();

    UpdateStats s;
    s.loss = loss.detach();
    s.return_per_unroll = batch.rewards.sum(1).mean();
    // FACT: v = torch.randn(24).view(4, 6).transpose(0, 1).narrow(0, 0, 5); assert raises(lambda: v.view(-1), "view size is not compatible")
    s.explained_var = explained_variance(values.narrow(0, 0, T).detach().view({-1}), vt.vs.detach().view({-1})); // EXPECT: tensor-view-non-contiguous -- values is the transposed [T + 1, B] baseline: its first T rows cannot be flattened by a view
    return s;
  }

private:
  ImpalaNet net_;
  ImpalaConfig cfg_;
  torch::optim::RMSprop opt_;
};

void run_impala(const ImpalaConfig &cfg, std::vector<std::unique_ptr<Environment>> envs) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ImpalaNet net(cfg);
  Learner learner(net, cfg, device);
  ParameterServer server;
  server.publish(net);
  UnrollQueue queue(static_cast<size_t>(cfg.queue_cap));
  std::atomic<bool> stop{false};
  std::vector<std::thread> actors;
  for (auto &env : envs)
    actors.emplace_back(run_actor, std::move(env), std::ref(queue), std::ref(server), std::cref(cfg), std::cref(stop));

  double loss_sum = 0;
  for (int64_t step = 1; step <= cfg.total_updates; ++step) {
    auto batch = collate(queue.pop_batch(static_cast<size_t>(cfg.batch)), device);
    auto stats = learner.update(batch);
    server.publish(net);
    loss_sum += stats.loss.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU after every update only to add up the loss
    if (step % cfg.log_every == 0) {
      std::cout << "update " << step << " loss " << loss_sum / cfg.log_every << " return/unroll "
                << stats.return_per_unroll.item<float>() << " ev " << stats.explained_var << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every updates
      loss_sum = 0;
    }
  }
  stop = true;
  queue.close();
  for (auto &t : actors)
    t.join();
}
