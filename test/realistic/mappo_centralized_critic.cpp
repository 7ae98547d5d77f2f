// MAPPO: a shared actor (own observation + one-hot agent id) and a centralised critic over all
// agents' observations. Values are learned in a normalised scale (running mean/std of returns);
// the rollout buffer is [T, n_envs, n_agents] and advantages come from GAE over it.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace nn = torch::nn;

struct MappoConfig {
  int64_t n_agents = 3, n_envs = 16, horizon = 128;
  int64_t obs_dim = 30, n_actions = 9, hidden = 128;
  double gamma = 0.99, gae_lambda = 0.95, clip = 0.2;
  double value_coef = 1.0, entropy_coef = 0.01;
  int64_t epochs = 5, minibatches = 4;
  double lr = 5e-4, max_grad_norm = 10.0;
};

// Vectorised multi-agent environment, implemented elsewhere (SMAC / MPE bindings).
struct StepResult {
  std::vector<torch::Tensor> observations;  // one [n_envs, obs_dim] tensor per agent
  std::vector<double> rewards;              // n_envs * n_agents, env-major
  torch::Tensor dones;                      // [n_envs], kBool
};

struct VecEnv {
  virtual ~VecEnv() = default;
  virtual std::vector<torch::Tensor> observations() const = 0;
  virtual torch::Tensor available_actions() const = 0;  // [n_envs, n_agents, n_actions], kBool
  virtual StepResult step(const torch::Tensor& actions) = 0;
};

// Per-agent observations -> [n_envs, n_agents, obs_dim].
torch::Tensor stack_agents(const std::vector<torch::Tensor>& per_agent) { return torch::stack(per_agent, 1); }

// Critic input: all agents' observations of one env side by side -> [n_envs, n_agents * obs_dim].
torch::Tensor build_global_state(const std::vector<torch::Tensor>& per_agent) {
  auto stacked = torch::stack(per_agent);  // [n_agents, n_envs, obs_dim]
  const int64_t n_envs = stacked.size(1);
  // FACT: s = torch.randn(3, 4, 5); assert is_copy_of(s.transpose(0, 1).reshape(4, -1), s)
  return stacked.transpose(0, 1).reshape({n_envs, -1});  // EXPECT: tensor-reshape-non-contiguous
}

// Running mean / variance of the returns (Welford over batches), kept in float64.
class RunningMeanStd {
 public:
  RunningMeanStd() : mean_(torch::zeros({1}, torch::kDouble)), var_(torch::ones({1}, torch::kDouble)) {}

  void update(const torch::Tensor& x) {
    auto flat = x.detach().reshape({-1}).to(torch::kDouble);
    auto batch_mean = flat.mean();
    auto batch_var = flat.var(/*unbiased=*/false);
    const double batch_count = static_cast<double>(flat.numel());
    const double total = count_ + batch_count;
    auto delta = batch_mean - mean_;
    mean_ = mean_ + delta * (batch_count / total);
    auto m2 = var_ * count_ + batch_var * batch_count + delta.pow(2) * (count_ * batch_count / total);
    var_ = m2 / total;
    count_ = total;
  }

  torch::Tensor mean() const { return mean_.to(torch::kFloat); }
  torch::Tensor std() const { return torch::sqrt(var_ + 1e-8).to(torch::kFloat); }

  torch::Tensor normalize(const torch::Tensor& v) const {
    // FACT: v = torch.randn(8, 3); assert is_view_of(v.reshape(-1), v)
    auto out = v.reshape({-1});
    out.sub_(mean()).div_(std());  // EXPECT: tensor-alias-then-mutate
    return out.view_as(v);
  }

 private:
  torch::Tensor mean_, var_;
  double count_ = 1e-4;
};

struct SharedActorImpl : nn::Module {
  explicit SharedActorImpl(const MappoConfig& cfg)
      : fc1(register_module("fc1", nn::Linear(cfg.obs_dim + cfg.n_agents, cfg.hidden))),
        fc2(register_module("fc2", nn::Linear(cfg.hidden, cfg.hidden))),
        head(register_module("head", nn::Linear(cfg.hidden, cfg.n_actions))) {
    for (auto& lin : {fc1, fc2}) nn::init::orthogonal_(lin->weight, std::sqrt(2.0));
    nn::init::orthogonal_(head->weight, 0.01);
  }

  // obs [B, N, D], agent_ids [N, N] one-hot -> logits [B, N, A]
  torch::Tensor forward(const torch::Tensor& obs, const torch::Tensor& agent_ids) {
    const int64_t B = obs.size(0), N = obs.size(1);
    auto ids = agent_ids.unsqueeze(0).expand({B, N, N});
    // FACT: o = torch.randn(4, 3, 5); i = torch.eye(3).unsqueeze(0).expand(4, 3, 3); assert is_contiguous(torch.cat([o, i], -1))
    auto x = torch::cat({obs, ids}, -1).view({B * N, -1});  // LOOKALIKE: tensor-view-non-contiguous -- cat returns a fresh contiguous tensor
    x = torch::tanh(fc2(torch::tanh(fc1(x))));
    return head(x).view({B, N, -1});
  }

  nn::Linear fc1, fc2, head;
};
TORCH_MODULE(SharedActor);

struct CentralCriticImpl : nn::Module {
  explicit CentralCriticImpl(const MappoConfig& cfg)
      : fc1(register_module("fc1", nn::Linear(cfg.obs_dim * cfg.n_agents, cfg.hidden))),
        fc2(register_module("fc2", nn::Linear(cfg.hidden, cfg.hidden))),
        out(register_module("out", nn::Linear(cfg.hidden, 1))) {
    torch::NoGradGuard no_grad;
    out->weight.mul_(0.1);  // LOOKALIKE: tensor-inplace-on-leaf -- small-init of the value head under NoGradGuard
    out->bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor& state) {
    auto h = torch::relu(fc2(torch::relu(fc1(state))));
    return out(h);  // [B, 1], normalised value
  }

  nn::Linear fc1, fc2, out;
};
TORCH_MODULE(CentralCritic);

struct RolloutBatch { torch::Tensor obs, avail, actions, old_logp, values, advantages, returns; };
class RolloutBuffer {
 public:
  explicit RolloutBuffer(const MappoConfig& c)
      : T_(c.horizon), E_(c.n_envs), N_(c.n_agents), D_(c.obs_dim), A_(c.n_actions),
        gamma_(c.gamma), lambda_(c.gae_lambda) {
    obs_ = torch::zeros({T_, E_, N_, D_}, torch::kFloat);
    avail_ = torch::ones({T_, E_, N_, A_}, torch::kBool);
    actions_ = torch::zeros({T_, E_, N_}, torch::kLong);
    logp_ = torch::zeros({T_, E_, N_}, torch::kFloat);
    values_ = torch::zeros({T_ + 1, E_, N_}, torch::kFloat);
    rewards_ = torch::zeros({T_, E_, N_}, torch::kFloat);
    dones_ = torch::zeros({T_, E_}, torch::kBool);
  }

  void insert(int64_t t, const torch::Tensor& obs, const torch::Tensor& avail_mask, const torch::Tensor& actions,
              const torch::Tensor& logp, const torch::Tensor& values) {
    obs_[t].copy_(obs);
    avail_[t].copy_(avail_mask);
    actions_[t].copy_(actions);  // LOOKALIKE: tensor-copy-narrowing -- sampled actions are int64, like the buffer
    logp_[t].copy_(logp);
    // FACT: x = torch.zeros(5, 3); r = x.select(0, 2); r.copy_(torch.ones(3)); assert is_view_of(r, x) and x[2].sum() == 3
    auto slot = values_.select(0, t);
    slot.copy_(values);  // LOOKALIKE: tensor-alias-then-mutate -- writing the buffer row through its view is the point
  }

  void record_outcome(int64_t t, const std::vector<double>& rewards, const torch::Tensor& dones) {
    auto r = torch::from_blob(const_cast<double*>(rewards.data()), {E_, N_}, torch::kDouble);
    rewards_[t].copy_(r);  // EXPECT: tensor-copy-narrowing
    TORCH_CHECK(dones.scalar_type() == torch::kBool, "VecEnv must report dones as kBool");
    dones_[t].copy_(dones);  // LOOKALIKE: tensor-copy-narrowing -- bool into bool, checked on the line above
  }

  void set_bootstrap(const torch::Tensor& last_values) { values_[T_].copy_(last_values); }
  void compute_gae(torch::Tensor& advantages, torch::Tensor& returns) const {
    advantages = torch::zeros_like(rewards_);
    auto last = torch::zeros({E_, N_});
    for (int64_t t = T_ - 1; t >= 0; --t) {
      auto nonterminal = 1.0 - dones_[t].to(torch::kFloat).unsqueeze(-1);  // LOOKALIKE: tensor-clone-in-loop -- row t is different every step
      auto delta = rewards_[t] + gamma_ * values_[t + 1] * nonterminal - values_[t];
      last = delta + gamma_ * lambda_ * nonterminal * last;
      advantages[t] = last;
    }
    returns = advantages + values_.narrow(0, 0, T_);
  }

  RolloutBatch flatten(const torch::Tensor& advantages, const torch::Tensor& returns) const {
    const int64_t M = T_ * E_;
    RolloutBatch b;
    b.obs = obs_.view({M, N_, D_});
    b.avail = avail_.view({M, N_, A_});
    b.actions = actions_.view({M, N_});
    b.old_logp = logp_.view({M, N_});
    // FACT: v = torch.randn(6, 4, 3); assert is_view_of(v.narrow(0, 0, 5).reshape(20, 3), v)
    b.values = values_.narrow(0, 0, T_).reshape({M, N_});  // LOOKALIKE: tensor-reshape-non-contiguous -- a leading narrow keeps the rows contiguous
    b.advantages = advantages.reshape({M, N_});
    b.returns = returns.reshape({M, N_});
    return b;
  }

  // Mean observation per agent, for the obs-normalisation diagnostics.
  torch::Tensor per_agent_obs_mean() const {
    // FACT: x = torch.randn(5, 4, 3, 6); assert is_view_of(x.permute(2, 0, 1, 3).reshape(3, -1, 6), x)
    return obs_.permute({2, 0, 1, 3}).reshape({N_, -1, D_}).mean(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- T and E stay adjacent, so this is a view
  }

 private:
  int64_t T_, E_, N_, D_, A_;
  double gamma_, lambda_;
  torch::Tensor obs_, avail_, actions_, logp_, values_, rewards_, dones_;
};

struct TrainStats { double policy_loss = 0, value_loss = 0, entropy = 0, value_mean = 0; };
class MappoTrainer {
 public:
  explicit MappoTrainer(const MappoConfig& cfg)
      : cfg_(cfg), actor_(cfg), critic_(cfg),
        actor_opt_(actor_->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1e-5)),
        critic_opt_(critic_->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1e-5)),
        buffer_(cfg), agent_ids_(torch::eye(cfg.n_agents)) {}

  void collect(VecEnv& env) {
    torch::NoGradGuard no_grad;
    auto obs = stack_agents(env.observations());
    const int64_t E = obs.size(0), N = obs.size(1);
    for (int64_t t = 0; t < cfg_.horizon; ++t) {
      auto avail_mask = env.available_actions();
      auto logits = actor_->forward(obs, agent_ids_);
      logits.masked_fill_(avail_mask.logical_not(), -1e9);
      auto probs = torch::softmax(logits, -1);
      auto actions = probs.view({E * N, -1}).multinomial(1).view({E, N});
      auto logp = torch::log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1);
      auto values = critic_->forward(build_global_state(env.observations())).expand({E, N});
      // FACT: v = torch.randn(4, 1); assert raises(lambda: v.expand(4, 3).mul_(2.0), "more than one element")
      values.mul_(ret_rms_.std()).add_(ret_rms_.mean());  // EXPECT: tensor-inplace-on-expanded
      buffer_.insert(t, obs, avail_mask, actions, logp, values);
      auto step = env.step(actions);
      buffer_.record_outcome(t, step.rewards, step.dones);
      obs = stack_agents(step.observations);
    }
    auto last_v = critic_->forward(build_global_state(env.observations())) * ret_rms_.std() + ret_rms_.mean();
    buffer_.set_bootstrap(last_v.expand({E, N}));
  }

  TrainStats update() {
    torch::Tensor advantages, returns;  // [T, E, N]
    buffer_.compute_gae(advantages, returns);
    return train_on(buffer_.flatten(advantages, returns));
  }

 private:
  TrainStats train_on(const RolloutBatch& batch) {
    const int64_t M = batch.obs.size(0);
    const int64_t mb = M / cfg_.minibatches;
    ret_rms_.update(batch.returns);
    TrainStats stats;
    torch::Tensor value_loss_sum = torch::zeros({});
    std::vector<torch::Tensor> entropies;
    double policy_loss_sum = 0.0;
    int64_t n_updates = 0;
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      auto adv = batch.advantages.clone();  // EXPECT: tensor-clone-in-loop
      adv = (adv - adv.mean()) / (adv.std() + 1e-8);
      auto perm = torch::randperm(M, torch::kLong);
      for (int64_t s = 0; s + mb <= M; s += mb) {
        auto idx = perm.narrow(0, s, mb);
        auto obs_mb = batch.obs.index_select(0, idx);
        auto avail_mb = batch.avail.index_select(0, idx);
        auto act_mb = batch.actions.index_select(0, idx);
        auto old_logp_mb = batch.old_logp.index_select(0, idx);
        auto adv_mb = adv.index_select(0, idx);
        auto ret_mb = batch.returns.index_select(0, idx);
        auto logits = actor_->forward(obs_mb, agent_ids_);
        logits.masked_fill_(avail_mb.logical_not(), -1e9);  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
        auto probs = torch::softmax(logits, -1);
        probs.clamp_min_(1e-8);  // EXPECT: tensor-inplace-on-saved
        auto log_probs = probs.log();
        auto new_logp = log_probs.gather(-1, act_mb.unsqueeze(-1)).squeeze(-1);
        auto entropy = -(probs * log_probs).sum(-1).mean();
        auto ratio = torch::exp(new_logp - old_logp_mb);
        auto surr1 = ratio * adv_mb;
        auto surr2 = ratio.clamp(1.0 - cfg_.clip, 1.0 + cfg_.clip) * adv_mb;
        auto policy_loss = -torch::min(surr1, surr2).mean();
        auto state = obs_mb.view({mb, -1});
        auto values_new = critic_->forward(state);  // [mb, 1], normalised scale
        auto vpred = values_new.detach();
        vpred.mul_(ret_rms_.std()).add_(ret_rms_.mean());  // EXPECT: tensor-inplace-on-detached
        stats.value_mean += vpred.mean().item<double>();
        auto ret_n = ret_rms_.normalize(ret_mb);
        auto value_loss = (values_new - ret_n).pow(2).mean();
        auto loss = policy_loss + cfg_.value_coef * value_loss - cfg_.entropy_coef * entropy;
        actor_opt_.zero_grad(), critic_opt_.zero_grad();
        loss.backward();
        nn::utils::clip_grad_norm_(actor_->parameters(), cfg_.max_grad_norm);
        nn::utils::clip_grad_norm_(critic_->parameters(), cfg_.max_grad_norm);
        actor_opt_.step(), critic_opt_.step();
        value_loss_sum += value_loss;  // EXPECT: tensor-graph-kept-across-iterations
        entropies.push_back(entropy.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no history kept
        policy_loss_sum += policy_loss.item<double>();
        ++n_updates;
      }
    }

    const double n = static_cast<double>(std::max<int64_t>(n_updates, 1));
    stats.policy_loss = policy_loss_sum / n;
    stats.value_loss = value_loss_sum.item<double>() / n;
    stats.entropy = torch::stack(entropies).mean().item<double>();
    stats.value_mean /= n;
    return stats;
  }

  MappoConfig cfg_;
  SharedActor actor_;
  CentralCritic critic_;
  torch::optim::Adam actor_opt_;
  torch::optim::Adam critic_opt_;
  RolloutBuffer buffer_;
  RunningMeanStd ret_rms_;
  torch::Tensor agent_ids_;
};
