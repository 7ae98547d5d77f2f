// Conservative Q-learning (Kumar et al. 2020, the CQL(H) variant) on a fixed dataset of logged
// robot transitions: a tanh-Gaussian SAC actor, two critics with Polyak-averaged targets, and a
// penalty that pushes Q down on actions drawn from a uniform proposal and from the current policy
// (a logsumexp over sampled actions, importance-weighted by their densities) and up on the logged
// actions. A Lagrange multiplier keeps the gap near a target. The simulator is only used to
// evaluate the policy.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

constexpr double kLogSqrt2Pi = 0.91893853320467274178;

struct CqlConfig {
  int64_t obs_dim = 17, act_dim = 6, hidden = 256;
  int64_t batch_size = 256, n_action_samples = 10, steps = 1000000;
  int64_t log_every = 1000, eval_every = 10000, eval_episodes = 10, probe_size = 1024;
  double gamma = 0.99, tau = 0.005, actor_lr = 1e-4, critic_lr = 3e-4, alpha = 0.2, reward_scale = 1.0;
  double cql_weight = 5.0, cql_temp = 1.0, target_gap = 10.0, alpha_prime_lr = 3e-4;
  bool lagrange = true;
};

struct StepResult {
  std::vector<float> obs;
  double reward = 0.0;
  bool terminal = false, truncated = false;
};

struct Env {
  virtual ~Env() = default;
  virtual std::vector<float> reset() = 0;
  virtual StepResult step(const std::vector<float> &action) = 0;
};

struct OfflineDataset {
  torch::Tensor observations, actions, rewards, next_observations, terminals; // [N, ...] float32, host
  torch::Tensor obs_mean, obs_std, mc_returns;
  int64_t size() const { return observations.size(0); }
};

// Discounted return-to-go of every transition, for the Q-value sanity plot.
torch::Tensor returns_to_go(const torch::Tensor &rewards, const torch::Tensor &terminals, double gamma) {
  auto rtg = rewards.flatten();
  auto term = terminals.flatten();
  const auto n = rtg.size(0);
  // FACT: r = torch.randn(6, 1); r0 = r.clone(); g = r.flatten(); g[4] += 0.99 * g[5]; assert is_view_of(g, r) and not torch.equal(r, r0)
  for (int64_t i = n - 2; i >= 0; --i)
    rtg[i] += gamma * rtg[i + 1] * (1 - term[i]); // EXPECT: tensor-alias-then-mutate -- flatten of the [N, 1] rewards is a view: the dataset's rewards are turned into returns, and training reads them
  return rtg;
}

OfflineDataset load_dataset(const std::string &path, double gamma) {
  OfflineDataset ds;
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  archive.read("observations", ds.observations);
  archive.read("actions", ds.actions);
  archive.read("rewards", ds.rewards);
  archive.read("next_observations", ds.next_observations);
  archive.read("terminals", ds.terminals);
  ds.obs_mean = ds.observations.mean(0);
  ds.obs_std = ds.observations.std(0) + 1e-3;
  ds.observations = (ds.observations - ds.obs_mean) / ds.obs_std;
  ds.next_observations = (ds.next_observations - ds.obs_mean) / ds.obs_std;
  ds.mc_returns = returns_to_go(ds.rewards, ds.terminals, gamma);
  return ds;
}

struct Batch {
  torch::Tensor obs, actions, rewards, next_obs, terminals;
};

Batch sample_batch(const OfflineDataset &ds, int64_t n, double reward_scale, torch::Device device) {
  auto idx = torch::randint(0, ds.size(), {n});
  auto rewards = ds.rewards.index_select(0, idx);
  // FACT: r = torch.randn(10, 1); r0 = r.clone(); b = r.index_select(0, torch.randint(0, 10, (4,))); b.mul_(5.0); assert is_copy_of(b, r) and torch.equal(r, r0)
  rewards.mul_(reward_scale); // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into new memory: the dataset's rewards are untouched
  return {ds.observations.index_select(0, idx).to(device), ds.actions.index_select(0, idx).to(device), rewards.to(device),
          ds.next_observations.index_select(0, idx).to(device), ds.terminals.index_select(0, idx).to(device)};
}

struct PolicySample {
  torch::Tensor actions, log_probs; // [n, B, A] in (-1, 1), [n, B]
};

struct TanhGaussianPolicyImpl : torch::nn::Module {
  TanhGaussianPolicyImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden) {
    trunk_ = register_module("trunk", torch::nn::Sequential(torch::nn::Linear(obs_dim, hidden), torch::nn::ReLU(),
                                                            torch::nn::Linear(hidden, hidden), torch::nn::ReLU()));
    mean_ = register_module("mean", torch::nn::Linear(hidden, act_dim));
    log_std_ = register_module("log_std", torch::nn::Linear(hidden, act_dim));
  }

  // n reparameterised samples per state.
  PolicySample sample(const torch::Tensor &obs, int64_t n) {
    auto h = trunk_->forward(obs);
    auto mu = mean_(h);
    auto log_std = torch::clamp(log_std_(h), -5.0, 2.0);
    auto eps = torch::randn({n, mu.size(0), mu.size(1)}, mu.options());
    auto u = mu.unsqueeze(0) + log_std.exp().unsqueeze(0) * eps;
    auto a = torch::tanh(u);
    auto gauss = (-0.5 * eps.pow(2) - log_std.unsqueeze(0) - kLogSqrt2Pi).sum(-1);
    return {a, gauss - torch::log(1 - a.pow(2) + 1e-6).sum(-1)};
  }

  torch::Tensor deterministic(const torch::Tensor &obs) { return torch::tanh(mean_(trunk_->forward(obs))); }

  torch::nn::Sequential trunk_{nullptr};
  torch::nn::Linear mean_{nullptr}, log_std_{nullptr};
};
TORCH_MODULE(TanhGaussianPolicy);

struct CriticImpl : torch::nn::Module {
  CriticImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden) {
    net_ = register_module("net", torch::nn::Sequential(torch::nn::Linear(obs_dim + act_dim, hidden), torch::nn::ReLU(),
                                                        torch::nn::Linear(hidden, hidden), torch::nn::ReLU(),
                                                        torch::nn::Linear(hidden, hidden), torch::nn::ReLU(),
                                                        torch::nn::Linear(hidden, 1)));
  }
  torch::Tensor forward(const torch::Tensor &obs, const torch::Tensor &act) { return net_->forward(torch::cat({obs, act}, -1)); }
  torch::nn::Sequential net_{nullptr};
};
TORCH_MODULE(Critic);

void polyak_update(torch::nn::Module &target, const torch::nn::Module &online, double tau) {
  torch::NoGradGuard no_grad;
  auto t = target.parameters();
  auto o = online.parameters();
  // FACT: t = torch.nn.Linear(3, 2); o = torch.nn.Linear(3, 2); torch.no_grad()(t.weight.lerp_)(o.weight, 0.005); assert t.weight.is_leaf and t.weight.requires_grad
  for (size_t i = 0; i < t.size(); ++i)
    t[i].lerp_(o[i], tau); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

// [n, B, A] policy samples -> [B * n, A], rows grouped by state like the repeated observations.
torch::Tensor batch_major(const torch::Tensor &samples) {
  // FACT: x = torch.randn(5, 4, 2); assert is_copy_of(x.transpose(0, 1).reshape(-1, 2), x)
  return samples.transpose(0, 1).reshape({-1, samples.size(2)}); // EXPECT: tensor-reshape-non-contiguous -- B and n are swapped: every policy sample is copied, twice per update
}

// Q of n actions per state: rows of [B * n, A] grouped by state -> [B, n].
torch::Tensor q_per_state(Critic &q, const torch::Tensor &obs_rep, const torch::Tensor &actions, int64_t B) {
  // FACT: q = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))(torch.randn(20, 5)); assert is_view_of(q.view(4, -1), q)
  return q(obs_rep, actions).view({B, -1}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear's [B * n, 1] output is contiguous
}

// E_s[ T * logsumexp(Q(s, a_i) / T) - Q(s, a_data) ] for one critic.
torch::Tensor conservative_gap(const torch::Tensor &cat_q, const torch::Tensor &q_data, double temp) {
  auto lse = torch::logsumexp(cat_q / temp, 1);
  // FACT: q = torch.nn.Linear(3, 4)(torch.randn(5, 3)); l = torch.logsumexp(q / 2.0, 1); l.mul_(2.0); assert backward_fails(lambda: l.mean().backward())
  lse.mul_(temp); // EXPECT: tensor-inplace-on-saved -- logsumexp saved its result for backward: the critic loss's backward raises
  return (lse - q_data.squeeze(1)).mean();
}

struct UpdateInfo {
  torch::Tensor critic_loss, cql_gap, q_data, alpha_prime; // detached
};

class ConservativeQLearner {
public:
  ConservativeQLearner(const CqlConfig &cfg, torch::Device device)
      : cfg_(cfg), actor_(cfg.obs_dim, cfg.act_dim, cfg.hidden), q1_(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        q2_(cfg.obs_dim, cfg.act_dim, cfg.hidden), q1_target_(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        q2_target_(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        log_alpha_prime_(torch::zeros({1}, torch::TensorOptions().device(device).requires_grad(true))),
        actor_opt_(actor_->parameters(), torch::optim::AdamOptions(cfg.actor_lr)),
        critic_opt_(critic_params(), torch::optim::AdamOptions(cfg.critic_lr)),
        alpha_prime_opt_({log_alpha_prime_}, torch::optim::AdamOptions(cfg.alpha_prime_lr)) {
    for (auto *m : std::vector<torch::nn::Module *>{actor_.get(), q1_.get(), q2_.get(), q1_target_.get(), q2_target_.get()})
      m->to(device);
    polyak_update(*q1_target_, *q1_, 1.0); // lerp with weight 1 copies
    polyak_update(*q2_target_, *q2_, 1.0);
  }

  UpdateInfo update(const Batch &b) {
    const auto B = b.obs.size(0), N = cfg_.n_action_samples, A = cfg_.act_dim;
    // FACT: a = torch.randn(8, 6); c = a.clone(); assert torch.equal(c, a) and is_copy_of(c, a)
    auto data_actions = b.actions.clone(); // EXPECT: tensor-unnecessary-clone -- only ever read: nothing writes the batch's actions or the copy
    torch::Tensor target;
    {
      torch::NoGradGuard no_grad;
      auto next = actor_->sample(b.next_obs, 1);
      auto next_a = next.actions.squeeze(0);
      auto next_v = torch::min(q1_target_(b.next_obs, next_a), q2_target_(b.next_obs, next_a));
      // FACT: l = torch.nn.Linear(3, 1); x = torch.randn(4, 3); v = torch.no_grad()(lambda: torch.min(l(x), l(x) * 2))(); v.sub_(0.2); assert v.grad_fn is None and not v.requires_grad
      next_v.sub_(cfg_.alpha * next.log_probs.t()); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is recorded for backward
      target = b.rewards + cfg_.gamma * (1 - b.terminals) * next_v;
    }

    auto q1_data = q1_(b.obs, data_actions);
    auto q2_data = q2_(b.obs, data_actions);
    auto bellman = torch::mse_loss(q1_data, target) + torch::mse_loss(q2_data, target);

    // Conservative penalty over N uniform actions, N policy actions at s and N at s' (all scored at s).
    // FACT: o = torch.randn(4, 3); rep = o.unsqueeze(1).repeat(1, 5, 1); assert is_contiguous(rep) and is_view_of(rep.view(20, -1), rep)
    auto obs_rep = b.obs.unsqueeze(1).repeat({1, N, 1}).view({B * N, -1}); // LOOKALIKE: tensor-view-non-contiguous -- repeat returns a new contiguous tensor
    auto rand_a = torch::rand({B * N, A}, b.obs.options()) * 2 - 1; // LOOKALIKE: tensor-device-mismatch -- made with the batch's options, on its device
    const double log_unif = -static_cast<double>(A) * std::log(2.0);
    auto cur = actor_->sample(b.obs, N);
    auto nxt = actor_->sample(b.next_obs, N);
    auto cur_a = batch_major(cur.actions), nxt_a = batch_major(nxt.actions);
    auto cur_lp = cur.log_probs.t().detach(), nxt_lp = nxt.log_probs.t().detach();

    auto cat_q1 = torch::cat({q_per_state(q1_, obs_rep, rand_a, B) - log_unif, q_per_state(q1_, obs_rep, nxt_a, B) - nxt_lp,
                              q_per_state(q1_, obs_rep, cur_a, B) - cur_lp}, 1);
    auto cat_q2 = torch::cat({q_per_state(q2_, obs_rep, rand_a, B) - log_unif, q_per_state(q2_, obs_rep, nxt_a, B) - nxt_lp,
                              q_per_state(q2_, obs_rep, cur_a, B) - cur_lp}, 1);
    auto gap = 0.5 * (conservative_gap(cat_q1, q1_data, cfg_.cql_temp) + conservative_gap(cat_q2, q2_data, cfg_.cql_temp));

    torch::Tensor penalty = cfg_.cql_weight * gap;
    torch::Tensor alpha_prime = log_alpha_prime_.exp().clamp(0.0, 1e6);
    if (cfg_.lagrange)
      penalty = alpha_prime.detach() * (cfg_.cql_weight * gap - cfg_.target_gap);
    auto critic_loss = bellman + penalty;
    critic_opt_.zero_grad();
    critic_loss.backward();
    critic_opt_.step();

    if (cfg_.lagrange) {
      auto alpha_prime_loss = -alpha_prime * (cfg_.cql_weight * gap.detach() - cfg_.target_gap);
      alpha_prime_opt_.zero_grad();
      alpha_prime_loss.backward();
      alpha_prime_opt_.step();
      torch::NoGradGuard no_grad;
      // FACT: a = torch.zeros(1, requires_grad=True); torch.no_grad()(a.clamp_)(-10.0, 10.0); assert a.is_leaf and a.requires_grad
      log_alpha_prime_.clamp_(-10.0, 10.0); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }

    auto pi = actor_->sample(b.obs, 1);
    auto pi_a = pi.actions.squeeze(0);
    auto q_pi = torch::min(q1_(b.obs, pi_a), q2_(b.obs, pi_a));
    auto actor_loss = (cfg_.alpha * pi.log_probs.t() - q_pi).mean();
    actor_opt_.zero_grad();
    actor_loss.backward();
    actor_opt_.step();

    polyak_update(*q1_target_, *q1_, cfg_.tau);
    polyak_update(*q2_target_, *q2_, cfg_.tau);
    return {critic_loss.detach(), gap.detach(), q1_data.mean().detach(), alpha_prime.detach()};
  }

  TanhGaussianPolicy &actor() { return actor_; }
  Critic &critic1() { return q1_; }

private:
  std::vector<torch::Tensor> critic_params() {
    auto p = q1_->parameters();
    for (auto &t : q2_->parameters())
      p.push_back(t);
    return p;
  }

  CqlConfig cfg_;
  TanhGaussianPolicy actor_;
  Critic q1_, q2_, q1_target_, q2_target_;
  torch::Tensor log_alpha_prime_;
  torch::optim::Adam actor_opt_, critic_opt_, alpha_prime_opt_;
};

double evaluate(TanhGaussianPolicy &actor, Env &env, const OfflineDataset &ds, const CqlConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  actor->eval();
  double total = 0;
  for (int64_t ep = 0; ep < cfg.eval_episodes; ++ep) {
    auto obs = env.reset();
    bool done = false;
    while (!done) {
      auto o = torch::tensor(obs).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new observation every step
      auto mean = ds.obs_mean.to(device); // EXPECT: tensor-clone-in-loop -- the dataset statistics never change, yet are sent to the device at every env step
      auto stdev = ds.obs_std.to(device); // EXPECT: tensor-clone-in-loop
      auto a = actor->deterministic(((o - mean) / stdev).unsqueeze(0)).squeeze(0).cpu();
      auto st = env.step(std::vector<float>(a.data_ptr<float>(), a.data_ptr<float>() + a.numel()));
      total += st.reward;
      obs = st.obs;
      done = st.terminal || st.truncated;
    }
  }
  actor->train();
  return total / static_cast<double>(cfg.eval_episodes);
}

void train_offline(const std::string &dataset_path, Env &env, const CqlConfig &cfg) {
  const torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto ds = load_dataset(dataset_path, cfg.gamma);
  std::cout << ds.size() << " transitions, mean return-to-go " << ds.mc_returns.mean().item<double>() << "\n";
  ConservativeQLearner learner(cfg, device);
  auto probe = sample_batch(ds, cfg.probe_size, cfg.reward_scale, device); // fixed states to watch Q diverge
  std::vector<torch::Tensor> probe_q, gaps;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto batch = sample_batch(ds, cfg.batch_size, cfg.reward_scale, device);
    auto info = learner.update(batch);
    if (step % cfg.log_every == 0) {
      gaps.push_back(info.cql_gap); // LOOKALIKE: tensor-graph-kept-across-iterations -- update() returns detached values
      // FACT: c = torch.nn.Linear(3, 1); qs = [c(torch.randn(8, 3)).mean() for _ in range(3)]; assert all(q.requires_grad for q in qs) and kept_nodes(qs) >= 3 * 3
      probe_q.push_back(learner.critic1()->forward(probe.obs, probe.actions).mean()); // EXPECT: tensor-graph-kept-across-iterations -- grad mode is on: each entry keeps a critic forward over the probe set, activations included
      std::cout << "step " << step << " critic " << info.critic_loss.item<float>() << " gap " << info.cql_gap.item<float>() // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
                << " Q(data) " << info.q_data.item<float>() << " alpha' " << info.alpha_prime.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- same statement, every log_every steps
    }
    if (step % cfg.eval_every == 0)
      std::cout << "step " << step << " eval return " << evaluate(learner.actor(), env, ds, cfg, device) << "\n";
  }
  auto q_curve = torch::stack(probe_q).cpu();
  auto gap_curve = torch::stack(gaps).cpu();
  std::cout << "probe Q " << q_curve[0].item<float>() << " -> " << q_curve[-1].item<float>() << ", gap "
            << gap_curve[0].item<float>() << " -> " << gap_curve[-1].item<float>() << "\n";
  torch::save(learner.actor(), "cql_actor.pt");
}
