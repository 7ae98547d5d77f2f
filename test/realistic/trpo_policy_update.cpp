// TRPO with a diagonal-Gaussian policy: natural gradient via conjugate gradient on
// Fisher-vector products, backtracking line search under a KL trust region, and a
// separately fitted value baseline (GAE).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

struct TRPOConfig {
  int64_t obs_dim = 8, act_dim = 2, hidden = 64;
  int64_t num_envs = 16, horizon = 256;
  int iterations = 300;
  double gamma = 0.99, lam = 0.97;
  double max_kl = 0.01, damping = 0.1;
  int cg_iters = 10, backtracks = 10;
  double accept_ratio = 0.1;
  int64_t fvp_stride = 5;  // Fisher products on every 5th step, as in baselines
  int vf_epochs = 5;  int64_t vf_minibatch = 512;
  double vf_lr = 3e-4;
  double min_std = 1e-2;
};

static const double kLog2Pi = std::log(2.0 * M_PI);

struct GaussianPolicyImpl : torch::nn::Module {
  GaussianPolicyImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden, double min_std)
      : fc1(register_module("fc1", torch::nn::Linear(obs_dim, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        mu(register_module("mu", torch::nn::Linear(hidden, act_dim))),
        min_std_(min_std) {
    log_std = register_parameter("log_std", torch::full({act_dim}, -0.5));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(torch::Tensor obs) {
    auto h = fc1->forward(obs);
    // FACT: l=torch.nn.Linear(3,4); h=l(torch.randn(2,3)); h.tanh_(); assert not backward_fails(lambda: h.sum().backward())
    h.tanh_();  // LOOKALIKE: tensor-inplace-on-saved -- the linear layer saves its input and weight, not its output
    h = torch::tanh(fc2->forward(h));
    auto mean = mu->forward(h);
    auto stddev = log_std.exp();
    // FACT: assert backward_fails(lambda: (lambda s: (s.add_(0.01), s.sum().backward()))(torch.zeros(2, requires_grad=True).exp()))
    stddev.add_(min_std_);  // EXPECT: tensor-inplace-on-saved
    return {mean, stddev.expand_as(mean)};
  }

  torch::nn::Linear fc1, fc2, mu;
  torch::Tensor log_std;
  double min_std_;
};
TORCH_MODULE(GaussianPolicy);

struct ValueNetImpl : torch::nn::Module {
  ValueNetImpl(int64_t obs_dim, int64_t hidden)
      : net(register_module("net", torch::nn::Sequential(
                                       torch::nn::Linear(obs_dim, hidden), torch::nn::Tanh(),
                                       torch::nn::Linear(hidden, hidden), torch::nn::Tanh(),
                                       torch::nn::Linear(hidden, 1)))) {}
  torch::Tensor forward(torch::Tensor obs) { return net->forward(obs).squeeze(-1); }
  torch::nn::Sequential net;
};
TORCH_MODULE(ValueNet);

torch::Tensor gaussian_log_prob(const torch::Tensor& mean, const torch::Tensor& stddev,
                                const torch::Tensor& act) {
  auto z = (act - mean) / stddev;
  return (-0.5 * z.pow(2) - stddev.log() - 0.5 * kLog2Pi).sum(-1);
}

torch::Tensor gaussian_kl(const torch::Tensor& mean0, const torch::Tensor& std0,
                          const torch::Tensor& mean1, const torch::Tensor& std1) {
  auto kl = torch::log(std1 / std0) + (std0.pow(2) + (mean0 - mean1).pow(2)) / (2.0 * std1.pow(2)) - 0.5;
  return kl.sum(-1).mean();
}

torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : m.parameters()) flat.push_back(p.view(-1));
  return torch::cat(flat);
}

void set_flat_params(torch::nn::Module& m, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : m.parameters()) {
    const int64_t n = p.numel();
    p.copy_(flat.narrow(0, offset, n).view_as(p));  // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard
    offset += n;
  }
}

torch::Tensor flat_grad(const torch::Tensor& y, const std::vector<torch::Tensor>& params,
                        bool create_graph) {
  auto grads = torch::autograd::grad({y}, params, {}, /*retain_graph=*/true, create_graph);
  std::vector<torch::Tensor> flat;
  flat.reserve(grads.size());
  // FACT: l=torch.nn.Linear(3,4); gs=torch.autograd.grad(l(torch.randn(5,3)).tanh().sum(), list(l.parameters()), create_graph=True); assert all(is_contiguous(g) for g in gs)
  for (auto& g : grads) flat.push_back(g.view(-1));  // LOOKALIKE: tensor-view-non-contiguous -- autograd hands back contiguous parameter-shaped grads
  return torch::cat(flat);
}

torch::Tensor conjugate_gradient(const std::function<torch::Tensor(const torch::Tensor&)>& Avp,
                                 const torch::Tensor& b, int iters, double tol = 1e-10) {
  auto x = torch::zeros_like(b);
  auto r = b;
  auto p = b.clone();  // LOOKALIKE: tensor-unnecessary-clone -- p is never written, but r shares b's storage and r.sub_ below rewrites it
  auto rr = r.dot(r);
  for (int i = 0; i < iters; ++i) {
    auto Ap = Avp(p);
    auto alpha = rr / (p.dot(Ap) + 1e-8);
    x.add_(alpha * p);
    // FACT: b=torch.randn(6); b0=b.clone(); r=b; r.sub_(0.5*torch.ones(6)); assert shares_storage(r, b) and not torch.equal(b, b0)
    r.sub_(alpha * Ap);  // EXPECT: tensor-alias-then-mutate
    auto rr_new = r.dot(r);
    if (rr_new.item<double>() < tol) break;  // LOOKALIKE: tensor-sync-in-loop -- the residual decides when CG stops
    p = r + (rr_new / rr) * p;
    rr = rr_new;
  }
  return x;
}

// Vectorised point-mass task; the simulator runs on the CPU.
struct PointMassEnv {
  PointMassEnv(int64_t n, int64_t obs_dim, int64_t act_dim) : n_(n), obs_dim_(obs_dim) {
    mix_ = torch::randn({act_dim, obs_dim}) * 0.1;
    reset();
  }
  void reset() { state_ = torch::randn({n_, obs_dim_}); goal_ = torch::randn({n_, obs_dim_}); t_ = 0; }
  torch::Tensor observe() const { return state_ - goal_; }
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> step(const torch::Tensor& action) {
    state_ = state_ + torch::matmul(action, mix_);
    auto reward = -(state_ - goal_).pow(2).sum(-1) - 0.01 * action.pow(2).sum(-1);
    auto done = torch::zeros({n_});
    if (++t_ == 200) { done.fill_(1.0); reset(); }
    return {observe(), reward, done};
  }
  int64_t n_, obs_dim_, t_ = 0;
  torch::Tensor state_, goal_, mix_;
};

struct RolloutBuffer {
  explicit RolloutBuffer(const TRPOConfig& c)
      : obs(torch::zeros({c.horizon, c.num_envs, c.obs_dim})),
        actions(torch::zeros({c.horizon, c.num_envs, c.act_dim})),
        rewards(torch::zeros({c.horizon, c.num_envs})), dones(torch::zeros_like(rewards)),
        values(torch::zeros({c.horizon + 1, c.num_envs})), adv(torch::zeros_like(rewards)),
        returns(torch::zeros_like(rewards)) {}
  torch::Tensor obs, actions, rewards, dones, values, adv, returns;
};

double collect_rollout(GaussianPolicy& policy, ValueNet& vf, PointMassEnv& env, RolloutBuffer& buf,
                       torch::Tensor& obs, const TRPOConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  auto act_bound = torch::ones({cfg.act_dim});
  double value_sum = 0.0;
  for (int64_t t = 0; t < cfg.horizon; ++t) {
    auto obs_dev = obs.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new observation arrives every step
    auto [mean, stddev] = policy->forward(obs_dev);
    auto action = mean + stddev * torch::randn_like(mean);
    action = torch::min(torch::max(action, -act_bound), act_bound);  // EXPECT: tensor-device-mismatch
    auto v = vf->forward(obs_dev);
    value_sum += v.mean().item<double>();  // EXPECT: tensor-sync-in-loop
    buf.obs[t].copy_(obs);
    buf.actions[t].copy_(action);  // LOOKALIKE: tensor-device-mismatch -- copy_ is allowed across devices
    buf.values[t].copy_(v);
    auto [next_obs, reward, done] = env.step(buf.actions[t]);
    buf.rewards[t].copy_(reward);
    buf.dones[t].copy_(done);
    obs = next_obs;
  }
  buf.values[cfg.horizon].copy_(vf->forward(obs.to(device)));
  return value_sum / static_cast<double>(cfg.horizon);
}

void compute_gae(RolloutBuffer& buf, const TRPOConfig& cfg) {
  // Long horizons with gamma*lambda near one drift in single precision.
  auto rewards = torch::empty(buf.rewards.sizes(), torch::kFloat64);
  rewards.copy_(buf.rewards);  // LOOKALIKE: tensor-copy-narrowing -- float32 into float64 only widens
  auto values = buf.values.to(torch::kFloat64);
  auto notdone = 1.0 - buf.dones.to(torch::kFloat64);
  auto adv = torch::zeros_like(rewards);
  auto last = torch::zeros({cfg.num_envs}, torch::kFloat64);
  for (int64_t t = cfg.horizon - 1; t >= 0; --t) {
    auto delta = rewards[t] + cfg.gamma * values[t + 1] * notdone[t] - values[t];
    last = delta + cfg.gamma * cfg.lam * notdone[t] * last;
    adv[t] = last;
  }
  buf.adv.copy_(adv);  // EXPECT: tensor-copy-narrowing
  buf.returns.copy_((adv + values.slice(0, 0, cfg.horizon)).to(torch::kFloat32));
}

struct UpdateStats {
  double surr_gain = 0.0, kl = 0.0, vf_loss = 0.0, value_mean = 0.0;
  bool accepted = false;
};

bool line_search(GaussianPolicy& policy, const RolloutBuffer& buf, const torch::Tensor& old_params,
                 const torch::Tensor& full_step, double expected_improve,
                 const torch::Tensor& old_logp, const torch::Tensor& old_mean,
                 const torch::Tensor& old_std, const torch::Tensor& adv, double old_surr,
                 const TRPOConfig& cfg, torch::Device device, UpdateStats& stats) {
  torch::NoGradGuard no_grad;
  auto act = buf.actions.reshape({-1, cfg.act_dim}).to(device);
  for (int k = 0; k < cfg.backtracks; ++k) {
    const double frac = std::pow(0.5, k);
    set_flat_params(*policy, old_params + frac * full_step);
    auto obs = buf.obs.reshape({-1, cfg.obs_dim}).to(device);  // EXPECT: tensor-clone-in-loop
    auto [mean, stddev] = policy->forward(obs);
    auto ratio = torch::exp(gaussian_log_prob(mean, stddev, act) - old_logp);
    const double improve = (ratio * adv).mean().item<double>() - old_surr;
    const double kl = gaussian_kl(old_mean, old_std, mean, stddev).item<double>();
    if (kl <= 1.5 * cfg.max_kl && improve > 0.0 && improve / (expected_improve * frac) > cfg.accept_ratio) {
      stats.kl = kl; stats.surr_gain = improve;
      return true;
    }
  }
  set_flat_params(*policy, old_params);
  return false;
}

UpdateStats trpo_step(GaussianPolicy& policy, RolloutBuffer& buf, const TRPOConfig& cfg,
                      torch::Device device) {
  UpdateStats stats;
  // FACT: o=torch.randn(16,4,3); assert is_view_of(o.reshape(-1,3), o)
  auto obs = buf.obs.reshape({-1, cfg.obs_dim}).to(device);  // LOOKALIKE: tensor-reshape-non-contiguous -- the time-major buffer is contiguous, so this is a view
  auto act = buf.actions.reshape({-1, cfg.act_dim}).to(device);
  auto adv = buf.adv.reshape({-1}).to(device);
  // FACT: a=torch.randn(16,4); b=a.reshape(-1); b=(b-b.mean())/(b.std()+1e-8); assert is_copy_of(b, a)
  adv = (adv - adv.mean()) / (adv.std() + 1e-8);  // LOOKALIKE: tensor-alias-then-mutate -- out-of-place, buf.adv keeps the raw advantages
  // FACT: o=torch.randn(16,4,3); assert is_copy_of(o[::5].reshape(-1,3), o)
  auto fvp_obs = buf.obs.slice(0, 0, cfg.horizon, cfg.fvp_stride).reshape({-1, cfg.obs_dim}).to(device);  // EXPECT: tensor-reshape-non-contiguous

  auto params = policy->parameters();
  torch::Tensor old_logp, old_mean, old_std, sub_mean, sub_std;
  {
    torch::NoGradGuard no_grad;
    std::tie(old_mean, old_std) = policy->forward(obs);
    old_logp = gaussian_log_prob(old_mean, old_std, act);
    std::tie(sub_mean, sub_std) = policy->forward(fvp_obs);
  }

  auto [mean, stddev] = policy->forward(obs);
  auto ratio = torch::exp(gaussian_log_prob(mean, stddev, act) - old_logp);
  auto surr = (ratio * adv).mean();
  auto g = flat_grad(surr, params, /*create_graph=*/false);

  auto fvp = [&](const torch::Tensor& v) {
    auto [m, s] = policy->forward(fvp_obs);
    auto kl_grad = flat_grad(gaussian_kl(sub_mean, sub_std, m, s), params, /*create_graph=*/true);
    return flat_grad((kl_grad * v).sum(), params, /*create_graph=*/false) + cfg.damping * v;
  };

  auto step_dir = conjugate_gradient(fvp, g, cfg.cg_iters);
  auto shs = 0.5 * step_dir.dot(fvp(step_dir));
  auto full_step = step_dir / torch::sqrt(shs / cfg.max_kl);
  const double expected = g.dot(full_step).item<double>();
  auto old_params = flat_params(*policy).clone();  // EXPECT: tensor-unnecessary-clone

  stats.accepted = line_search(policy, buf, old_params, full_step, expected, old_logp, old_mean,
                               old_std, adv, surr.item<double>(), cfg, device, stats);
  policy->log_std.clamp_(-5.0, 1.0);  // EXPECT: tensor-inplace-on-leaf
  return stats;
}

double update_value(ValueNet& vf, torch::optim::Adam& opt, const RolloutBuffer& buf,
                    const TRPOConfig& cfg, torch::Device device) {
  auto obs = buf.obs.reshape({-1, cfg.obs_dim}).to(device);
  auto ret = buf.returns.reshape({-1}).to(device);
  const int64_t n = obs.size(0);
  auto epoch_loss = torch::zeros({}, obs.options());
  int64_t batches = 0;
  for (int e = 0; e < cfg.vf_epochs; ++e) {
    auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(device));
    for (int64_t i = 0; i < n; i += cfg.vf_minibatch) {
      auto idx = perm.slice(0, i, std::min(i + cfg.vf_minibatch, n));
      auto loss = torch::mse_loss(vf->forward(obs.index_select(0, idx)), ret.index_select(0, idx));
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      ++batches;
    }
  }
  return epoch_loss.item<double>() / static_cast<double>(batches);
}

int main() {
  torch::manual_seed(0);
  TRPOConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  GaussianPolicy policy(cfg.obs_dim, cfg.act_dim, cfg.hidden, cfg.min_std);
  ValueNet vf(cfg.obs_dim, cfg.hidden);
  policy->to(device);
  vf->to(device);
  torch::optim::Adam vf_opt(vf->parameters(), torch::optim::AdamOptions(cfg.vf_lr));

  PointMassEnv env(cfg.num_envs, cfg.obs_dim, cfg.act_dim);
  RolloutBuffer buf(cfg);
  auto obs = env.observe();

  for (int it = 0; it < cfg.iterations; ++it) {
    const double value_mean = collect_rollout(policy, vf, env, buf, obs, cfg, device);
    compute_gae(buf, cfg);
    auto stats = trpo_step(policy, buf, cfg, device);
    stats.value_mean = value_mean;
    stats.vf_loss = update_value(vf, vf_opt, buf, cfg, device);
    if (it % 10 == 0) {
      std::printf("iter %4d  return/step %.3f  V %.3f  kl %.5f  gain %.4f  vf %.4f  %s\n", it,
                  buf.rewards.mean().item<double>(), stats.value_mean, stats.kl, stats.surr_gain,
                  stats.vf_loss, stats.accepted ? "accepted" : "rejected");
    }
  }
  return 0;
}
