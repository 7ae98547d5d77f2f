// PPO-Lagrangian for constrained RL (Safety-Gym style point-goal task). A reward critic and a
// cost critic are trained side by side; the Lagrange multiplier is learned by gradient ascent
// on (J_c - d) and enters the policy objective as a penalty on the cost advantage.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <vector>

struct Config {
  int64_t obs_dim = 60, act_dim = 2, hidden = 256;
  int64_t n_envs = 16, steps = 256, epochs = 10, minibatches = 8, iterations = 500;
  int64_t cost_window = 100;
  double gamma = 0.99, cost_gamma = 0.99, lam = 0.95, clip = 0.2, target_kl = 0.02;
  double pi_lr = 3e-4, vf_lr = 1e-3, ent_coef = 0.0, max_grad_norm = 0.5;
  double init_log_std = -0.5, min_log_std = -2.0, max_log_std = 0.5, min_std = 0.05;
  double cost_limit = 25.0, lagrange_init = 0.0, lagrange_lr = 0.035, lagrange_max = 100.0;
};

// Vectorised Safety-Gym wrapper (safety_env.cpp): float32 CPU tensors, `done` is bool.
class SafetyVecEnv {
 public:
  struct Step { torch::Tensor obs, reward, cost, done; };
  explicit SafetyVecEnv(int64_t n_envs);
  torch::Tensor reset();
  Step step(const torch::Tensor& action);
  torch::Tensor action_low() const;
  torch::Tensor action_high() const;
};

torch::nn::Sequential mlp(int64_t in, int64_t out, int64_t hidden) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::Tanh(),
                               torch::nn::Linear(hidden, hidden), torch::nn::Tanh(),
                               torch::nn::Linear(hidden, out));
}

struct GaussianPolicyImpl : torch::nn::Module {
  explicit GaussianPolicyImpl(const Config& c) : min_std(c.min_std) {
    mu_net = register_module("mu_net", mlp(c.obs_dim, c.act_dim, c.hidden));
    log_std = register_parameter("log_std", torch::full({c.act_dim}, c.init_log_std));
  }

  std::pair<torch::Tensor, torch::Tensor> distribution(const torch::Tensor& obs) {
    auto mu = mu_net->forward(obs);
    auto sigma = log_std.exp();
    // FACT: p=torch.zeros(2,requires_grad=True); s=p.exp(); s.clamp_min_(0.05); assert backward_fails(lambda: (torch.randn(4,2)/s).sum().backward())
    sigma.clamp_min_(min_std);  // EXPECT: tensor-inplace-on-saved
    return {mu, sigma.expand_as(mu)};
  }

  double min_std;
  torch::nn::Sequential mu_net{nullptr};
  torch::Tensor log_std;
};
TORCH_MODULE(GaussianPolicy);

torch::Tensor normal_log_prob(const torch::Tensor& a, const torch::Tensor& mu, const torch::Tensor& sigma) {
  return (-0.5 * ((a - mu) / sigma).pow(2) - sigma.log() - 0.5 * std::log(2.0 * M_PI)).sum(-1);
}

struct RunningMeanStd {
  torch::Tensor mean, var;
  double count = 1e-4;
  explicit RunningMeanStd(int64_t dim) : mean(torch::zeros({dim})), var(torch::ones({dim})) {}
  void update(const torch::Tensor& x) {
    auto b_mean = x.mean(0), b_var = x.var(0, /*unbiased=*/false);
    const double b_count = static_cast<double>(x.size(0)), tot = count + b_count;
    auto delta = b_mean - mean;
    mean = mean + delta * (b_count / tot);
    var = (var * count + b_var * b_count + delta.pow(2) * count * b_count / tot) / tot;
    count = tot;
  }
};

// Time-major rollout storage on the CPU.
struct Rollout {
  torch::Tensor obs, act, logp, rew, cost, done, val_r, val_c, adv_r, adv_c;
  Rollout(const Config& c)
      : obs(torch::zeros({c.steps, c.n_envs, c.obs_dim})), act(torch::zeros({c.steps, c.n_envs, c.act_dim})),
        logp(torch::zeros({c.steps, c.n_envs})), rew(torch::zeros_like(logp)), cost(torch::zeros_like(logp)),
        done(torch::zeros_like(logp)), val_r(torch::zeros_like(logp)), val_c(torch::zeros_like(logp)),
        adv_r(torch::zeros_like(logp)), adv_c(torch::zeros_like(logp)) {}
};

struct UpdateLog { double policy_loss, value_loss, clip_frac; int64_t epochs_run; };

class PpoLagrangian {
 public:
  PpoLagrangian(const Config& c, torch::Device device)
      : cfg_(c), device_(device), policy_(c), reward_critic_(mlp(c.obs_dim, 1, c.hidden)),
        cost_critic_(mlp(c.obs_dim, 1, c.hidden)), buf_(c), obs_rms_(c.obs_dim),
        ep_cost_run_(torch::zeros({c.n_envs})), recent_costs_(torch::zeros({c.cost_window}, torch::kInt)) {
    policy_->to(device_);
    reward_critic_->to(device_);
    cost_critic_->to(device_);
    std::vector<torch::Tensor> vf_params = reward_critic_->parameters();
    for (const auto& p : cost_critic_->parameters()) vf_params.push_back(p);
    pi_opt_ = std::make_unique<torch::optim::Adam>(policy_->parameters(), torch::optim::AdamOptions(c.pi_lr));
    vf_opt_ = std::make_unique<torch::optim::Adam>(vf_params, torch::optim::AdamOptions(c.vf_lr));
    lagrange_ = torch::tensor(c.lagrange_init, torch::requires_grad());
    lagrange_opt_ = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{lagrange_},
                                                         torch::optim::AdamOptions(c.lagrange_lr));
  }

  torch::Tensor normalize_obs(const torch::Tensor& obs) const {
    auto o = obs.clone();  // EXPECT: tensor-unnecessary-clone
    o.sub_(obs_rms_.mean).div_(obs_rms_.var.sqrt() + 1e-8);
    return o.clamp_(-10.0, 10.0);
  }

  void collect(SafetyVecEnv& env) {
    torch::NoGradGuard no_grad;
    for (int64_t t = 0; t < cfg_.steps; ++t) {
      obs_rms_.update(obs_);
      auto o = normalize_obs(obs_);
      auto o_dev = o.to(device_);
      auto [mu, sigma] = policy_->distribution(o_dev);
      auto a = mu + sigma * torch::randn_like(mu);
      auto a_env = torch::clamp(a, act_low_.to(device_), act_high_.to(device_));  // EXPECT: tensor-clone-in-loop
      auto step = env.step(a_env.cpu());
      buf_.obs[t].copy_(o);
      buf_.act[t].copy_(a);
      buf_.logp[t].copy_(normal_log_prob(a, mu, sigma));
      buf_.val_r[t].copy_(reward_critic_->forward(o_dev).squeeze(-1));
      buf_.val_c[t].copy_(cost_critic_->forward(o_dev).squeeze(-1));
      buf_.rew[t].copy_(step.reward);
      buf_.cost[t].copy_(step.cost);
      buf_.done[t].copy_(step.done);  // LOOKALIKE: tensor-copy-narrowing -- bool into float widens
      ep_cost_run_ += step.cost;
      auto finished = step.done.nonzero().squeeze(1);
      for (int64_t k = 0; k < finished.size(0); ++k) {
        const auto i = finished[k].item<int64_t>();
        recent_costs_[n_finished_++ % cfg_.cost_window] = ep_cost_run_[i];  // EXPECT: tensor-copy-narrowing
        ep_cost_run_[i].zero_();
      }
      obs_ = step.obs;
    }
    auto o_dev = normalize_obs(obs_).to(device_);
    last_v_r_ = reward_critic_->forward(o_dev).squeeze(-1).cpu();
    last_v_c_ = cost_critic_->forward(o_dev).squeeze(-1).cpu();
  }

  void compute_gae(const torch::Tensor& r, const torch::Tensor& v, const torch::Tensor& last_v,
                   double gamma, torch::Tensor& adv) const {
    auto running = torch::zeros({cfg_.n_envs});
    for (int64_t t = cfg_.steps - 1; t >= 0; --t) {
      auto next_v = t == cfg_.steps - 1 ? last_v : v[t + 1];
      auto not_done = 1.0 - buf_.done[t];
      auto delta = r[t] + gamma * next_v * not_done - v[t];
      running = delta + gamma * cfg_.lam * not_done * running;
      adv[t] = running;
    }
  }

  double mean_episode_cost() const {
    const int64_t n = std::min<int64_t>(n_finished_, cfg_.cost_window);
    return n == 0 ? 0.0 : recent_costs_.narrow(0, 0, n).to(torch::kFloat).mean().item<double>();
  }

  void update_multiplier(double ep_cost) {
    auto loss = -lagrange_ * (ep_cost - cfg_.cost_limit);
    lagrange_opt_->zero_grad();
    loss.backward();
    lagrange_opt_->step();
    lagrange_.data().clamp_(0.0, cfg_.lagrange_max);  // LOOKALIKE: tensor-inplace-on-detached, tensor-inplace-on-leaf -- data() projects the multiplier itself, outside autograd on purpose
  }

  UpdateLog update() {
    compute_gae(buf_.rew, buf_.val_r, last_v_r_, cfg_.gamma, buf_.adv_r);
    compute_gae(buf_.cost, buf_.val_c, last_v_c_, cfg_.cost_gamma, buf_.adv_c);
    const int64_t n = cfg_.steps * cfg_.n_envs, mb = n / cfg_.minibatches;
    // FACT: x=torch.zeros(8,4,6); assert is_view_of(x.reshape(32,6), x)
    auto obs = buf_.obs.reshape({n, cfg_.obs_dim});  // LOOKALIKE: tensor-reshape-non-contiguous -- the time-major buffer is contiguous, so this is a view
    auto act = buf_.act.reshape({n, cfg_.act_dim});
    auto logp_old = buf_.logp.reshape({n});
    // FACT: a=torch.randn(8,4); ref=a.clone(); f=a.reshape(32); f-=f.mean(); assert is_view_of(f,a) and not torch.equal(a,ref)
    auto adv_r = buf_.adv_r.reshape({n});
    adv_r -= adv_r.mean();  // EXPECT: tensor-alias-then-mutate
    adv_r /= adv_r.std() + 1e-8;  // EXPECT: tensor-alias-then-mutate
    // FACT: a=torch.randn(8,4); c=a.reshape(32)-a.mean(); c/=c.std(); assert is_copy_of(c,a)
    auto adv_c = buf_.adv_c.reshape({n}) - buf_.adv_c.mean();
    adv_c /= adv_c.std() + 1e-8;  // LOOKALIKE: tensor-alias-then-mutate -- the subtraction already made a new tensor
    auto ret_r = (buf_.adv_r + buf_.val_r).reshape({n});
    auto ret_c = (buf_.adv_c + buf_.val_c).reshape({n});

    const auto penalty = lagrange_.detach();
    auto policy_loss_sum = torch::zeros({}, device_);
    double value_loss_sum = 0.0;
    std::vector<torch::Tensor> clip_fracs;
    int64_t epoch = 0, n_mb = 0;
    bool stop = false;
    for (; epoch < cfg_.epochs && !stop; ++epoch) {
      auto perm = torch::randperm(n);
      for (int64_t s = 0; s + mb <= n; s += mb) {
        auto idx = perm.slice(0, s, s + mb);
        auto mb_obs = obs.index({idx}).to(device_);  // LOOKALIKE: tensor-clone-in-loop -- a different minibatch is moved each iteration
        auto mb_act = act.index({idx}).to(device_);
        auto mb_logp_old = logp_old.index({idx}).to(device_);
        auto mb_adv_r = adv_r.index({idx}).to(device_);
        auto mb_adv_c = adv_c.index({idx});

        auto [mu, sigma] = policy_->distribution(mb_obs);
        auto logp = normal_log_prob(mb_act, mu, sigma);
        auto ratio = (logp - mb_logp_old).exp();
        // FACT: l=torch.zeros(4,requires_grad=True); r=l.exp(); loss=(r*torch.randn(4)).mean(); d=r.detach(); d.sub_(1.0).abs_(); assert backward_fails(lambda: loss.backward())
        auto dev = ratio.detach();
        dev.sub_(1.0).abs_();  // EXPECT: tensor-inplace-on-detached
        // FACT: r=torch.randn(4,requires_grad=True).exp(); c=((r.detach()-1).abs()>0.2).float().mean(); assert c.grad_fn is None and kept_nodes(c)==0
        clip_fracs.push_back((dev > cfg_.clip).to(torch::kFloat).mean());  // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison result carries no graph
        auto surr_r = torch::min(ratio * mb_adv_r, ratio.clamp(1.0 - cfg_.clip, 1.0 + cfg_.clip) * mb_adv_r).mean();
        auto surr_c = (ratio * mb_adv_c).mean();  // EXPECT: tensor-device-mismatch
        auto entropy = (sigma.log() + 0.5 * (1.0 + std::log(2.0 * M_PI))).sum(-1).mean();
        // FACT: s=torch.ones(3,requires_grad=True); e=(s.log()+1.4).sum(-1).mean(); e.mul_(0.01); e.backward()
        entropy.mul_(cfg_.ent_coef);  // LOOKALIKE: tensor-inplace-on-saved -- mean saves no tensor for backward
        auto loss_pi = -(surr_r - penalty * surr_c) / (1.0 + penalty) - entropy;  // LOOKALIKE: tensor-device-mismatch -- penalty is a 0-dim CPU tensor, which mixes with CUDA operands
        pi_opt_->zero_grad();
        loss_pi.backward();
        torch::nn::utils::clip_grad_norm_(policy_->parameters(), cfg_.max_grad_norm);
        pi_opt_->step();
        policy_->log_std.clamp_(cfg_.min_log_std, cfg_.max_log_std);  // EXPECT: tensor-inplace-on-leaf
        policy_loss_sum += loss_pi;  // EXPECT: tensor-graph-kept-across-iterations

        auto v_r = reward_critic_->forward(mb_obs).squeeze(-1);
        auto v_c = cost_critic_->forward(mb_obs).squeeze(-1);
        auto loss_v = (v_r - ret_r.index({idx}).to(device_)).pow(2).mean() +
                      (v_c - ret_c.index({idx}).to(device_)).pow(2).mean();
        vf_opt_->zero_grad();
        loss_v.backward();
        torch::nn::utils::clip_grad_norm_(vf_opt_->param_groups()[0].params(), cfg_.max_grad_norm);
        vf_opt_->step();
        value_loss_sum += loss_v.item<double>();  // EXPECT: tensor-sync-in-loop
        ++n_mb;

        auto approx_kl = (mb_logp_old - logp).mean();
        if (approx_kl.item<double>() > 1.5 * cfg_.target_kl) {  // LOOKALIKE: tensor-sync-in-loop -- early stopping needs the value on the host
          stop = true;
          break;
        }
      }
    }
    return {policy_loss_sum.item<double>() / n_mb, value_loss_sum / n_mb,
            torch::stack(clip_fracs).mean().item<double>(), epoch};
  }

  void train(SafetyVecEnv& env) {
    obs_ = env.reset();
    act_low_ = env.action_low();
    act_high_ = env.action_high();
    for (int64_t it = 0; it < cfg_.iterations; ++it) {
      collect(env);
      const double ep_cost = mean_episode_cost();
      update_multiplier(ep_cost);
      auto log = update();
      std::cout << "iter " << it << " Jc " << ep_cost << " lambda " << lagrange_.item<double>()
                << " pi " << log.policy_loss << " vf " << log.value_loss
                << " clipfrac " << log.clip_frac << " epochs " << log.epochs_run << std::endl;
    }
  }

 private:
  Config cfg_;
  torch::Device device_;
  GaussianPolicy policy_;
  torch::nn::Sequential reward_critic_, cost_critic_;
  Rollout buf_;
  RunningMeanStd obs_rms_;
  torch::Tensor obs_, act_low_, act_high_, last_v_r_, last_v_c_;
  torch::Tensor ep_cost_run_, recent_costs_, lagrange_;
  int64_t n_finished_ = 0;
  std::unique_ptr<torch::optim::Adam> pi_opt_, vf_opt_, lagrange_opt_;
};

int main() {
  torch::manual_seed(0);
  Config cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  SafetyVecEnv env(cfg.n_envs);
  PpoLagrangian agent(cfg, device);
  agent.train(env);
}
