// Generative Adversarial Imitation Learning (Ho & Ermon, 2016) for continuous control.
//
// A discriminator D(s, a) is trained to tell expert state-action pairs from the
// policy's; the policy is then trained with PPO on the surrogate reward
// r(s, a) = -log(1 - D(s, a)) = softplus(logit), with GAE advantages.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct GailConfig {
  int64_t obs_dim = 11, act_dim = 3, hidden = 64, disc_hidden = 100;
  int64_t horizon = 2048, iterations = 500;
  int64_t disc_steps = 5, disc_batch = 256, ppo_epochs = 10, minibatch = 64;
  double disc_eps = 1e-6, reward_clip = 10.0;
  double clip_eps = 0.2, gamma = 0.99, lam = 0.95, vf_coef = 0.5, ent_coef = 0.0;
  double lr_policy = 3e-4, lr_disc = 1e-4;
};

struct Transition {
  torch::Tensor next_obs;
  bool done = false;
};

class Env {
 public:
  virtual ~Env() = default;
  virtual torch::Tensor reset() = 0;
  virtual Transition step(const torch::Tensor& action) = 0;  // true reward unused by GAIL
};

class DiscriminatorImpl : public nn::Module {
 public:
  DiscriminatorImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden)
      : fc1_(register_module("fc1", nn::Linear(obs_dim + act_dim, hidden))),
        fc2_(register_module("fc2", nn::Linear(hidden, hidden))),
        out_(register_module("out", nn::Linear(hidden, 1))) {}
  // logit of "this pair comes from the expert"
  torch::Tensor forward(const torch::Tensor& obs, const torch::Tensor& act) {
    auto h = torch::tanh(fc1_->forward(torch::cat({obs, act}, 1)));
    h = torch::tanh(fc2_->forward(h));
    auto logits = out_->forward(h);
    logits.clamp_(-20.0, 20.0);  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    return logits;
  }

 private:
  nn::Linear fc1_, fc2_, out_;
};
TORCH_MODULE(Discriminator);

class GaussianPolicyImpl : public nn::Module {
 public:
  GaussianPolicyImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden) {
    fc1_ = register_module("fc1", nn::Linear(obs_dim, hidden));
    fc2_ = register_module("fc2", nn::Linear(hidden, hidden));
    mu_ = register_module("mu", nn::Linear(hidden, act_dim));
    log_std = register_parameter("log_std", torch::full({act_dim}, -0.5));
    // small initial actions: scale the last layer down
    torch::NoGradGuard no_grad;
    auto w = mu_->weight.data();
    w.mul_(0.01);  // LOOKALIKE: tensor-inplace-on-detached -- meant to write the weight, under NoGradGuard
    mu_->bias.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- initialisation under NoGradGuard
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs) {
    auto h = torch::tanh(fc1_->forward(obs));
    h = torch::tanh(fc2_->forward(h));
    return {mu_->forward(h), log_std.expand({obs.size(0), -1})};
  }
  torch::Tensor log_prob(const torch::Tensor& obs, const torch::Tensor& act) {
    auto [mu, log_std_b] = forward(obs);
    auto z = (act - mu) / log_std_b.exp();
    return (-0.5 * z.pow(2) - log_std_b - 0.5 * std::log(2.0 * M_PI)).sum(-1);
  }
  torch::Tensor entropy() const { return (log_std + 0.5 * (1.0 + std::log(2.0 * M_PI))).sum(); }
  torch::Tensor log_std;

 private:
  nn::Linear fc1_{nullptr}, fc2_{nullptr}, mu_{nullptr};
};
TORCH_MODULE(GaussianPolicy);

class ValueNetImpl : public nn::Module {
 public:
  ValueNetImpl(int64_t obs_dim, int64_t hidden)
      : net_(register_module("net", nn::Sequential(nn::Linear(obs_dim, hidden), nn::Tanh(),
                                                   nn::Linear(hidden, hidden), nn::Tanh(),
                                                   nn::Linear(hidden, 1)))) {}
  torch::Tensor forward(const torch::Tensor& obs) { return net_->forward(obs).squeeze(-1); }

 private:
  nn::Sequential net_;
};
TORCH_MODULE(ValueNet);

// Expert demonstrations, stored row-wise as float64 [obs | act] by the recorder.
class ExpertDataset {
 public:
  ExpertDataset(const std::vector<double>& flat, int64_t obs_dim, int64_t act_dim) {
    const int64_t n = static_cast<int64_t>(flat.size()) / (obs_dim + act_dim);
    auto raw = torch::from_blob(const_cast<double*>(flat.data()), {n, obs_dim + act_dim},
                                torch::kDouble);
    obs_ = torch::empty({n, obs_dim});
    obs_.copy_(raw.narrow(1, 0, obs_dim));  // EXPECT: tensor-copy-narrowing
    auto act = raw.narrow(1, obs_dim, act_dim).to(torch::kFloat);
    // FACT: r = torch.randn(5, 6, dtype=torch.float64); a = r.narrow(1, 4, 2).to(torch.float32); assert is_copy_of(a, r)
    act.clamp_(-1.0, 1.0);  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of float64 data makes a copy
    act_ = act;
  }
  const torch::Tensor& obs() const { return obs_; }
  const torch::Tensor& act() const { return act_; }

 private:
  torch::Tensor obs_, act_;
};

struct Rollout {
  torch::Tensor obs, act, logp, values, dones;  // values has horizon + 1 entries
};

struct RewardStats {
  double mean_logit = 0.0;
  double policy_acc = 0.0;
};

Rollout collect_rollout(Env& env, GaussianPolicy& policy, ValueNet& value, torch::Tensor& obs,
                        const GailConfig& cfg) {
  const torch::Device device(torch::kCUDA);
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> obs_buf, act_buf, logp_buf, val_buf, done_buf;
  for (int64_t t = 0; t < cfg.horizon; ++t) {
    auto obs_d = obs.to(device).unsqueeze(0);
    auto [mu, log_std] = policy->forward(obs_d);
    auto noise = torch::randn({cfg.act_dim});
    auto action = mu + log_std.exp() * noise;  // EXPECT: tensor-device-mismatch
    obs_buf.push_back(obs_d.squeeze(0));
    act_buf.push_back(action.squeeze(0));
    logp_buf.push_back(policy->log_prob(obs_d, action).squeeze(0));
    val_buf.push_back(value->forward(obs_d).squeeze(0));
    auto tr = env.step(action.squeeze(0).cpu());
    done_buf.push_back(torch::full({}, tr.done ? 1.0 : 0.0, obs_d.options()));
    obs = tr.done ? env.reset() : tr.next_obs;
  }
  val_buf.push_back(value->forward(obs.to(device).unsqueeze(0)).squeeze(0));
  return {torch::stack(obs_buf), torch::stack(act_buf), torch::stack(logp_buf),
          torch::stack(val_buf), torch::stack(done_buf)};
}

double update_discriminator(Discriminator& disc, torch::optim::Adam& opt,
                            const torch::Tensor& expert_obs, const torch::Tensor& expert_act,
                            const Rollout& ro, const GailConfig& cfg, torch::Device device) {
  const auto B = cfg.disc_batch;
  const auto n_expert = expert_obs.size(0);
  const auto n_policy = ro.obs.size(0);
  auto labels_cpu = torch::cat({torch::ones({B, 1}), torch::zeros({B, 1})}, 0);
  std::vector<torch::Tensor> disc_losses;
  for (int64_t k = 0; k < cfg.disc_steps; ++k) {
    auto idx_e = torch::randint(0, n_expert, {B}, torch::kLong);
    auto e_obs = expert_obs.index_select(0, idx_e).to(device);  // LOOKALIKE: tensor-clone-in-loop -- new rows every step
    auto e_act = expert_act.index_select(0, idx_e).to(device);
    auto idx_p = torch::randint(0, n_policy, {B}, torch::dtype(torch::kLong).device(ro.obs.device()));
    auto p_obs = ro.obs.index_select(0, idx_p);
    auto p_act = ro.act.index_select(0, idx_p);
    auto labels = labels_cpu.to(device);  // EXPECT: tensor-clone-in-loop
    auto logits = torch::cat({disc->forward(e_obs, e_act), disc->forward(p_obs, p_act)}, 0);
    auto probs = torch::sigmoid(logits);
    probs.clamp_(cfg.disc_eps, 1.0 - cfg.disc_eps);  // EXPECT: tensor-inplace-on-saved
    auto d_loss = F::binary_cross_entropy(probs, labels);  // LOOKALIKE: tensor-device-mismatch -- labels were moved to the device
    opt.zero_grad();
    d_loss.backward();
    opt.step();
    disc_losses.push_back(d_loss);  // EXPECT: tensor-graph-kept-across-iterations
  }
  return torch::stack(disc_losses).mean().item<double>();
}

std::pair<torch::Tensor, RewardStats> gail_rewards(Discriminator& disc, const Rollout& ro,
                                                   double clip) {
  auto obs = ro.obs.clone();  // EXPECT: tensor-unnecessary-clone
  auto logits = disc->forward(obs, ro.act).squeeze(-1);  // [T]
  auto rewards = logits.detach();
  rewards.clamp_(-clip, clip);  // EXPECT: tensor-inplace-on-detached
  RewardStats st;
  st.mean_logit = logits.mean().item<double>();
  st.policy_acc = (logits < 0).to(torch::kFloat).mean().item<double>();
  // -log(1 - sigmoid(l)) == softplus(l)
  return {F::softplus(rewards), st};
}

torch::Tensor compute_gae(const torch::Tensor& rewards, const torch::Tensor& values,
                          const torch::Tensor& dones, double gamma, double lam) {
  const auto T = rewards.size(0);
  auto adv = torch::zeros_like(rewards);
  torch::Tensor last = torch::zeros({}, rewards.options());
  for (int64_t t = T - 1; t >= 0; --t) {
    auto nonterminal = 1.0 - dones[t];
    auto delta = rewards[t] + gamma * values[t + 1] * nonterminal - values[t];
    last = delta + gamma * lam * nonterminal * last;  // LOOKALIKE: tensor-graph-kept-across-iterations -- rewards and values carry no graph (no-grad rollout, detached rewards)
    adv[t] = last;
  }
  return adv;
}

torch::Tensor normalize_advantages(const torch::Tensor& adv) {
  torch::Tensor out = adv;
  // FACT: a = torch.randn(6); b = a; b.sub_(b.mean()).div_(b.std() + 1e-8); assert shares_storage(a, b) and abs(float(a.mean())) < 1e-5
  out.sub_(out.mean()).div_(out.std() + 1e-8);  // EXPECT: tensor-alias-then-mutate
  return out;
}

struct PPOStats {
  double approx_kl = 0.0, clip_frac = 0.0, log_std_drift = 0.0;
};

PPOStats ppo_update(GaussianPolicy& policy, ValueNet& value, torch::optim::Adam& opt,
                    const Rollout& ro, const torch::Tensor& adv, const torch::Tensor& returns,
                    const GailConfig& cfg) {
  const auto T = ro.obs.size(0);
  auto log_std_before = policy->log_std.clone();  // LOOKALIKE: tensor-unnecessary-clone -- snapshot: opt.step() changes log_std
  double approx_kl = 0.0, clip_frac = 0.0;
  int64_t n_mb = 0;
  for (int64_t epoch = 0; epoch < cfg.ppo_epochs; ++epoch) {
    auto perm = torch::randperm(T, torch::dtype(torch::kLong).device(ro.obs.device()));
    for (int64_t start = 0; start < T; start += cfg.minibatch) {
      auto mb = perm.narrow(0, start, std::min(cfg.minibatch, T - start));
      auto obs = ro.obs.index_select(0, mb);
      auto act = ro.act.index_select(0, mb);
      auto old_logp = ro.logp.index_select(0, mb);
      auto adv_mb = adv.index_select(0, mb);
      auto ret_mb = returns.index_select(0, mb);
      auto logp = policy->log_prob(obs, act);
      auto ratio = torch::exp(logp - old_logp);
      auto surr = torch::min(ratio * adv_mb,
                             ratio.clamp(1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps) * adv_mb);
      auto v_loss = F::mse_loss(value->forward(obs), ret_mb);
      auto loss = -surr.mean() + cfg.vf_coef * v_loss - cfg.ent_coef * policy->entropy();
      opt.zero_grad();
      loss.backward();
      opt.step();
      approx_kl += (old_logp - logp).mean().item<double>();  // LOOKALIKE: tensor-graph-kept-across-iterations -- item() keeps no graph
      clip_frac += ((ratio - 1.0).abs() > cfg.clip_eps).to(torch::kFloat).mean().item<double>();
      ++n_mb;
    }
  }
  PPOStats s;
  s.approx_kl = approx_kl / std::max<int64_t>(n_mb, 1);
  s.clip_frac = clip_frac / std::max<int64_t>(n_mb, 1);
  s.log_std_drift = (policy->log_std - log_std_before).abs().max().item<double>();
  return s;
}

void run_gail(Env& env, const std::vector<double>& expert_flat, const GailConfig& cfg) {
  const torch::Device device(torch::kCUDA);
  ExpertDataset expert(expert_flat, cfg.obs_dim, cfg.act_dim);
  GaussianPolicy policy(cfg.obs_dim, cfg.act_dim, cfg.hidden);
  ValueNet value(cfg.obs_dim, cfg.hidden);
  Discriminator disc(cfg.obs_dim, cfg.act_dim, cfg.disc_hidden);
  policy->to(device);
  value->to(device);
  disc->to(device);
  auto ac_params = policy->parameters();
  for (const auto& p : value->parameters()) ac_params.push_back(p);
  torch::optim::Adam pol_opt(ac_params, torch::optim::AdamOptions(cfg.lr_policy));
  torch::optim::Adam disc_opt(disc->parameters(), torch::optim::AdamOptions(cfg.lr_disc));
  auto obs = env.reset();
  for (int64_t it = 0; it < cfg.iterations; ++it) {
    auto ro = collect_rollout(env, policy, value, obs, cfg);
    const double d_loss =
        update_discriminator(disc, disc_opt, expert.obs(), expert.act(), ro, cfg, device);
    auto [rewards, rstats] = gail_rewards(disc, ro, cfg.reward_clip);
    auto advantages = compute_gae(rewards, ro.values, ro.dones, cfg.gamma, cfg.lam);
    auto adv_n = normalize_advantages(advantages);
    auto returns = advantages + ro.values.narrow(0, 0, advantages.size(0));
    auto ps = ppo_update(policy, value, pol_opt, ro, adv_n, returns, cfg);
    std::cout << "iter " << it << " d_loss " << d_loss << " D(policy) logit " << rstats.mean_logit
              << " disc acc on policy " << rstats.policy_acc << " gail reward "
              << rewards.mean().item<double>() << " kl " << ps.approx_kl << " clip "
              << ps.clip_frac << " log_std drift " << ps.log_std_drift << std::endl;
  }
}
