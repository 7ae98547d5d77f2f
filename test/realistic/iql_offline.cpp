// Implicit Q-Learning (Kostrikov, Nair, Levine 2021) trained on a fixed set of logged rollouts.
// V is fit by expectile regression against the target critics, the twin Q critics by TD against V,
// and the policy by advantage-weighted regression onto the dataset actions.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

struct IQLConfig {
  int64_t obs_dim = 17, act_dim = 6, hidden = 256;
  double gamma = 0.99, expectile = 0.7, beta = 3.0, polyak = 0.005;
  double max_action = 1.0, log_std_min = -5.0, log_std_max = 2.0, lr = 3e-4;
  int64_t batch_size = 256, steps = 1000000, log_every = 5000, eval_episodes = 10;
  bool antmaze = false;
};

// Rollouts as the collector writes them: time-major over a set of parallel envs.
struct RawLog {
  int64_t horizon = 0, num_envs = 0, obs_dim = 0, act_dim = 0;
  std::vector<double> obs, actions, rewards, dones;
};

RawLog load_rollouts(const std::string& path);  // rollout_io.cpp

struct Batch {
  torch::Tensor obs, actions, rewards, next_obs, dones;
  Batch to(torch::Device d) const {
    return {obs.to(d), actions.to(d), rewards.to(d), next_obs.to(d), dones.to(d)};
  }
};

class OfflineDataset {
 public:
  OfflineDataset(RawLog& log, bool antmaze)
      : antmaze_(antmaze), episodes_(log.num_envs), horizon_(log.horizon) {
    const int64_t T = log.horizon, E = log.num_envs, D = log.obs_dim, A = log.act_dim;
    auto obs_tm = torch::empty({T + 1, E, D});
    obs_tm.copy_(torch::from_blob(log.obs.data(), {T + 1, E, D}, torch::kFloat64));  // EXPECT: tensor-copy-narrowing
    auto act_tm = torch::empty({T, E, A});
    act_tm.copy_(torch::from_blob(log.actions.data(), {T, E, A}, torch::kFloat64).to(act_tm.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- converted explicitly to the destination dtype first
    // Episode-major transitions, so each episode is a run of consecutive rows.
    // FACT: o = torch.randn(6, 3, 4).permute(1, 0, 2); assert is_copy_of(o.narrow(1, 0, 5).reshape(-1, 4), o)
    auto obs_em = obs_tm.permute({1, 0, 2});
    observations_ = obs_em.narrow(1, 0, T).reshape({-1, D});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: o = torch.randn(6, 3, 4).permute(1, 0, 2).narrow(1, 1, 5).contiguous(); assert not raises(lambda: o.view(-1, 4))
    next_observations_ = obs_em.narrow(1, 1, T).contiguous().view({-1, D});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() runs before the view
    actions_ = act_tm.transpose(0, 1).contiguous().view({-1, A});
    rewards_ = torch::from_blob(log.rewards.data(), {T, E}, torch::kFloat64).to(torch::kFloat32).t().contiguous().view({-1});
    dones_ = torch::from_blob(log.dones.data(), {T, E}, torch::kFloat64).to(torch::kFloat32).t().contiguous().view({-1});
    obs_mean_ = observations_.mean(0);
    obs_std_ = observations_.std(0).clamp_min(1e-3);
  }

  int64_t size() const { return observations_.size(0); }
  int64_t num_episodes() const { return episodes_; }
  const torch::Tensor& rewards() const { return rewards_; }
  const torch::Tensor& obs_mean() const { return obs_mean_; }
  const torch::Tensor& obs_std() const { return obs_std_; }
  void set_rewards(torch::Tensor r) { rewards_ = std::move(r); }

  double mean_return() const { return rewards_.view({episodes_, horizon_}).sum(1).mean().item<double>(); }

  Batch sample(int64_t n) const {
    auto idx = torch::randint(size(), {n}, torch::kLong);
    auto r = rewards_.index_select(0, idx);
    // FACT: r = torch.randn(10); s = r.index_select(0, torch.tensor([1, 3])); assert is_copy_of(s, r)
    if (antmaze_) r.sub_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into new storage
    return {observations_.index_select(0, idx), actions_.index_select(0, idx), r.unsqueeze(1),
            next_observations_.index_select(0, idx), dones_.index_select(0, idx).unsqueeze(1)};
  }

 private:
  bool antmaze_;
  int64_t episodes_, horizon_;
  torch::Tensor observations_, next_observations_, actions_, rewards_, dones_;
  torch::Tensor obs_mean_, obs_std_;
};

// Locomotion reward scaling from the IQL paper: r * 1000 / (max_return - min_return).
torch::Tensor scale_rewards(const OfflineDataset& ds) {
  auto returns = ds.rewards().view({ds.num_episodes(), -1}).sum(1);
  const double span = (returns.max() - returns.min()).item<double>();
  auto r = ds.rewards();
  // FACT: a = torch.ones(12); r = a; r.mul_(2.0); assert shares_storage(a, r) and bool((a == 2).all())
  r.mul_(1000.0 / span);  // EXPECT: tensor-alias-then-mutate
  return r;
}

torch::nn::Sequential mlp(int64_t in, int64_t hidden, int64_t out) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::ReLU(),
                               torch::nn::Linear(hidden, hidden), torch::nn::ReLU(),
                               torch::nn::Linear(hidden, out));
}

struct TwinQImpl : torch::nn::Module {
  TwinQImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden)
      : q1(register_module("q1", mlp(obs_dim + act_dim, hidden, 1))),
        q2(register_module("q2", mlp(obs_dim + act_dim, hidden, 1))) {}

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs, const torch::Tensor& act) {
    auto x = torch::cat({obs, act}, -1);
    return {q1->forward(x), q2->forward(x)};
  }
  torch::nn::Sequential q1, q2;
};
TORCH_MODULE(TwinQ);

struct ValueNetImpl : torch::nn::Module {
  ValueNetImpl(int64_t obs_dim, int64_t hidden) : net(register_module("net", mlp(obs_dim, hidden, 1))) {}

  torch::Tensor forward(const torch::Tensor& obs) { return net->forward(obs.reshape({obs.size(0), -1})); }
  torch::nn::Sequential net;
};
TORCH_MODULE(ValueNet);

struct GaussianPolicyImpl : torch::nn::Module {
  explicit GaussianPolicyImpl(const IQLConfig& cfg) : cfg_(cfg) {
    trunk = register_module("trunk", torch::nn::Sequential(
        torch::nn::Linear(cfg.obs_dim, cfg.hidden), torch::nn::ReLU(),
        torch::nn::Linear(cfg.hidden, cfg.hidden), torch::nn::ReLU()));
    mean_head = register_module("mean_head", torch::nn::Linear(cfg.hidden, cfg.act_dim));
    log_std = register_parameter("log_std", torch::zeros({cfg.act_dim}));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs) {
    auto mu = torch::tanh(mean_head->forward(trunk->forward(obs)));
    // FACT: p = torch.nn.Parameter(torch.zeros(3)); assert raises(lambda: p.clamp_(-5.0, 2.0), "leaf Variable")
    log_std.clamp_(cfg_.log_std_min, cfg_.log_std_max);  // EXPECT: tensor-inplace-on-leaf
    return {mu, log_std.expand_as(mu)};
  }

  IQLConfig cfg_;
  torch::nn::Sequential trunk{nullptr};
  torch::nn::Linear mean_head{nullptr};
  torch::Tensor log_std;
};
TORCH_MODULE(GaussianPolicy);

torch::Tensor gaussian_log_prob(const torch::Tensor& mu, const torch::Tensor& log_std, const torch::Tensor& act) {
  static const double kHalfLog2Pi = 0.5 * std::log(2.0 * 3.14159265358979323846);
  auto z = (act - mu) * torch::exp(-log_std);
  return (-0.5 * z.pow(2) - log_std - kHalfLog2Pi).sum(-1, /*keepdim=*/true);
}

torch::Tensor expectile_loss(const torch::Tensor& diff, double tau) {
  auto tau_t = torch::tensor(tau);
  auto weight = torch::abs(tau_t - (diff < 0).to(diff.scalar_type()));  // LOOKALIKE: tensor-device-mismatch -- tau_t is a 0-dim CPU tensor, which mixes with CUDA operands
  return (weight * diff.pow(2)).mean();
}

struct StepLosses { torch::Tensor q, v, pi, q1_mean, td_abs; };

class IQLAgent {
 public:
  IQLAgent(const IQLConfig& cfg, torch::Device device)
      : cfg_(cfg),
        q_(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        q_target_(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        value_(cfg.obs_dim, cfg.hidden),
        policy_(cfg),
        q_opt_(q_->parameters(), torch::optim::AdamOptions(cfg.lr)),
        v_opt_(value_->parameters(), torch::optim::AdamOptions(cfg.lr)),
        pi_opt_(policy_->parameters(), torch::optim::AdamOptions(cfg.lr)) {
    q_->to(device), q_target_->to(device);
    value_->to(device), policy_->to(device);
    soft_update(1.0);
  }

  void soft_update(double tau) {
    torch::NoGradGuard no_grad;
    auto online = q_->parameters();
    auto target = q_target_->parameters();
    for (size_t i = 0; i < online.size(); ++i) {
      target[i].mul_(1.0 - tau).add_(online[i], tau);  // LOOKALIKE: tensor-inplace-on-leaf -- Polyak update under NoGradGuard
    }
  }

  StepLosses update(const Batch& b) {
    torch::Tensor q_t;
    {
      torch::NoGradGuard no_grad;
      auto q_pair = q_target_->forward(b.obs, b.actions);
      q_t = torch::min(q_pair.first, q_pair.second);
    }

    // Value step: upper expectile of the target Q under the data distribution.
    auto v = value_->forward(b.obs);
    auto diff = q_t - v;
    auto v_loss = expectile_loss(diff, cfg_.expectile);
    auto exp_adv = diff.detach();
    // FACT: v = torch.randn(4, requires_grad=True); d = torch.ones(4) - v; l = d.pow(2).mean(); assert backward_fails(lambda: (d.detach().mul_(3.0), l.backward()))
    exp_adv.mul_(cfg_.beta).exp_().clamp_max_(100.0);  // EXPECT: tensor-inplace-on-detached
    v_opt_.zero_grad();
    v_loss.backward();
    v_opt_.step();

    // Critic step: TD toward r + gamma * V(s').
    torch::Tensor target;
    {
      torch::NoGradGuard no_grad;
      target = value_->forward(b.next_obs);
      target.mul_(1.0 - b.dones).mul_(cfg_.gamma).add_(b.rewards);  // LOOKALIKE: tensor-inplace-on-saved -- built under NoGradGuard, nothing records it
    }
    auto q_pair = q_->forward(b.obs, b.actions);
    auto q_loss = torch::mse_loss(q_pair.first, target) + torch::mse_loss(q_pair.second, target);
    auto td = (q_pair.first - target).detach();
    td.abs_();  // LOOKALIKE: tensor-inplace-on-detached -- the difference is a fresh tensor no backward node saved
    q_opt_.zero_grad();
    q_loss.backward();
    q_opt_.step();
    soft_update(cfg_.polyak);

    // Policy step: advantage-weighted regression onto dataset actions.
    auto out = policy_->forward(b.obs);
    auto mu = out.first;
    // FACT: x = torch.randn(4, 2, requires_grad=True); assert backward_fails(lambda: torch.tanh(x).mul_(2.0).sum().backward())
    mu.mul_(cfg_.max_action);  // EXPECT: tensor-inplace-on-saved
    auto log_prob = gaussian_log_prob(mu, out.second, b.actions);
    auto pi_loss = -(exp_adv * log_prob).mean();
    pi_opt_.zero_grad();
    pi_loss.backward();
    pi_opt_.step();

    return {q_loss, v_loss, pi_loss, q_pair.first.detach().mean(), td.mean()};
  }

  GaussianPolicy& policy() { return policy_; }

 private:
  IQLConfig cfg_;
  TwinQ q_, q_target_;
  ValueNet value_;
  GaussianPolicy policy_;
  torch::optim::Adam q_opt_, v_opt_, pi_opt_;
};

struct Env {  // env_bridge.cpp wraps the simulator
  virtual ~Env() = default;
  virtual std::vector<float> reset() = 0;
  virtual std::tuple<std::vector<float>, double, bool> step(const std::vector<float>& action) = 0;
};
std::unique_ptr<Env> make_env(const std::string& name);

double evaluate(GaussianPolicy& policy, Env& env, const OfflineDataset& ds, const IQLConfig& cfg,
                torch::Device device) {
  torch::NoGradGuard no_grad;
  policy->eval();
  double total = 0.0;
  for (int64_t ep = 0; ep < cfg.eval_episodes; ++ep) {
    auto obs = env.reset();
    bool done = false;
    while (!done) {
      auto o = torch::tensor(obs).to(device);
      o = (o - ds.obs_mean()) / ds.obs_std();  // EXPECT: tensor-device-mismatch
      auto mu = policy->forward(o.unsqueeze(0)).first;
      auto a = (mu * cfg.max_action).squeeze(0).to(torch::kCPU);  // LOOKALIKE: tensor-sync-in-loop -- env.step needs the action on the host
      std::vector<float> act(a.data_ptr<float>(), a.data_ptr<float>() + a.numel());
      auto [next_obs, reward, terminal] = env.step(act);
      obs = std::move(next_obs);
      total += reward;
      done = terminal;
    }
  }
  policy->train();
  return total / static_cast<double>(cfg.eval_episodes);
}

void train(IQLAgent& agent, const OfflineDataset& ds, Env& env, const IQLConfig& cfg, torch::Device device) {
  std::vector<torch::Tensor> q_loss_history;
  auto v_loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
  double q_mean_running = 0.0;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto batch = ds.sample(cfg.batch_size).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch is drawn every step
    auto stats = torch::stack({ds.obs_mean(), ds.obs_std()}).to(device);  // EXPECT: tensor-clone-in-loop
    batch.obs = (batch.obs - stats[0]) / stats[1];
    batch.next_obs = (batch.next_obs - stats[0]) / stats[1];

    auto losses = agent.update(batch);
    // FACT: x = torch.randn(3, requires_grad=True); hist = [(x * 2).pow(2).mean() for _ in range(3)]; assert kept_nodes(hist) >= 3
    q_loss_history.push_back(losses.q);  // EXPECT: tensor-graph-kept-across-iterations
    v_loss_sum += losses.v.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
    q_mean_running += losses.q1_mean.item<double>();  // EXPECT: tensor-sync-in-loop

    if (step % cfg.log_every == 0) {
      std::printf("step %lld  v_loss %.4f  q_mean %.3f  |td| %.3f  return %.1f\n",
                  static_cast<long long>(step), v_loss_sum.item<double>() / cfg.log_every,
                  q_mean_running / cfg.log_every, losses.td_abs.item<double>(),
                  evaluate(agent.policy(), env, ds, cfg, device));
      v_loss_sum.zero_();
      q_mean_running = 0.0;
    }
  }
}

int main(int argc, char** argv) {
  IQLConfig cfg;
  torch::manual_seed(0);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  RawLog log = load_rollouts(argc > 1 ? argv[1] : "halfcheetah-medium.bin");
  OfflineDataset ds(log, cfg.antmaze);
  cfg.obs_dim = log.obs_dim, cfg.act_dim = log.act_dim;
  if (!cfg.antmaze) {
    auto scaled = scale_rewards(ds);
    std::printf("dataset mean return %.1f over %lld episodes\n", ds.mean_return(),
                static_cast<long long>(ds.num_episodes()));
    ds.set_rewards(scaled);
  }

  auto env = make_env(argc > 2 ? argv[2] : "HalfCheetah-v4");
  IQLAgent agent(cfg, device);
  train(agent, ds, *env, cfg, device);
  torch::save(agent.policy(), "iql_policy.pt");
  return 0;
}
