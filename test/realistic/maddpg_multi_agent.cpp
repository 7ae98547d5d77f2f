// MADDPG (Lowe et al. 2017) for multi-agent particle environments. Every agent has its own actor
// over its own observation and its own centralised critic over all observations and actions.
// Discrete agents act with a straight-through Gumbel-softmax (one-hot forward, soft gradient),
// continuous ones with tanh plus Gaussian exploration noise. One replay buffer keeps a tensor
// per agent for observations, actions and rewards; targets come from target actors and critics
// that follow the online networks by Polyak averaging.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <memory>
#include <numeric>
#include <vector>

namespace nn = torch::nn;

struct MaddpgConfig {
  std::vector<int64_t> obs_dims{8, 10, 10}, act_dims{5, 5, 2};
  std::vector<bool> discrete{true, true, false};
  int64_t hidden = 64, batch = 1024, capacity = 1000000, warmup = 50000;
  int64_t episodes = 25000, max_steps = 25, update_every = 4, log_every = 1000;
  double gamma = 0.95, tau = 0.01, lr_actor = 1e-2, lr_critic = 1e-2, grad_clip = 0.5;
  double gumbel_temp = 1.0, noise_std = 0.1;
};

struct StepResult {
  std::vector<torch::Tensor> obs; // one [obs_dim_i] float tensor per agent
  std::vector<float> rewards;
  bool done = false;
};

class ParticleEnv {
public:
  virtual ~ParticleEnv() = default;
  virtual std::vector<torch::Tensor> reset() = 0;
  virtual StepResult step(const std::vector<torch::Tensor> &actions) = 0;
};

// Running mean / variance of one agent's observations, merged batch by batch.
struct RunningNorm {
  explicit RunningNorm(int64_t dim) : mean(torch::zeros({dim})), var(torch::ones({dim})) {}

  void update(const torch::Tensor &batch) {
    const double n = static_cast<double>(batch.size(0)), total = count + n;
    auto delta = batch.mean(0) - mean;
    auto batch_var = (batch - batch.mean(0)).pow(2).mean(0);
    var = (var * count + batch_var * n + delta.pow(2) * (count * n / total)) / total;
    mean = mean + delta * (n / total);
    count = total;
  }

  torch::Tensor apply(const torch::Tensor &obs) const {
    auto x = obs.contiguous();
    // FACT: o = torch.randn(3, 4); o0 = o.clone(); x = o.contiguous(); x.sub_(o0.mean(0)).div_(o0.std(0)); assert shares_storage(x, o) and not torch.equal(o, o0)
    x.sub_(mean).div_((var + 1e-8).sqrt()); // EXPECT: tensor-alias-then-mutate -- contiguous() of the env's observation is that observation: the raw obs stored in the buffer gets normalised too
    return x.clamp(-5.0, 5.0);
  }

  torch::Tensor mean, var;
  double count = 1e-4;
};

struct ActorImpl : nn::Module {
  ActorImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden) {
    fc1 = register_module("fc1", nn::Linear(obs_dim, hidden));
    fc2 = register_module("fc2", nn::Linear(hidden, hidden));
    out = register_module("out", nn::Linear(hidden, act_dim));
    // FACT: l = torch.nn.Linear(64, 5); assert raises(lambda: l.weight.uniform_(-3e-3, 3e-3), "a leaf Variable that requires grad")
    out->weight.uniform_(-3e-3, 3e-3); // EXPECT: tensor-inplace-on-leaf -- the small output-layer init of DDPG, written on a parameter with grad mode on
  }
  // Logits for a discrete agent, pre-tanh means for a continuous one.
  torch::Tensor forward(const torch::Tensor &obs) { return out(torch::relu(fc2(torch::relu(fc1(obs))))); }
  nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(Actor);

struct CentralCriticImpl : nn::Module {
  CentralCriticImpl(int64_t joint_obs, int64_t joint_act, int64_t hidden) {
    fc1 = register_module("fc1", nn::Linear(joint_obs + joint_act, hidden));
    fc2 = register_module("fc2", nn::Linear(hidden, hidden));
    q = register_module("q", nn::Linear(hidden, 1));
    nn::init::uniform_(q->weight, -3e-3, 3e-3); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
  }
  // One [B, obs_dim_j] and one [B, act_dim_j] tensor per agent -> Q [B, 1]
  torch::Tensor forward(const std::vector<torch::Tensor> &obs, const std::vector<torch::Tensor> &acts) {
    auto x = torch::cat({torch::cat(obs, 1), torch::cat(acts, 1)}, 1);
    return q(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, q{nullptr};
};
TORCH_MODULE(CentralCritic);

// Straight-through Gumbel-softmax: the forward value is one-hot, the gradient that of the soft sample.
torch::Tensor gumbel_softmax(const torch::Tensor &logits, double temp) {
  auto u = torch::rand_like(logits);
  auto y = torch::softmax((logits - torch::log(-torch::log(u + 1e-20) + 1e-20)) / temp, -1);
  auto idx = y.argmax(-1, /*keepdim=*/true);
  auto one_hot = y.detach();
  // FACT: l = torch.randn(4, 5, requires_grad=True); y = torch.softmax(l, -1); h = y.detach(); i = y.argmax(-1, True); h.zero_().scatter_(-1, i, 1.0); assert shares_storage(h, y) and backward_fails(lambda: (h - y.detach() + y).sum().backward())
  one_hot.zero_().scatter_(-1, idx, 1.0); // EXPECT: tensor-inplace-on-detached -- detach() shares y's storage: the soft sample, which softmax saved, becomes the one-hot
  return one_hot - y.detach() + y;
}

struct Agent {
  Actor actor{nullptr}, target_actor{nullptr};
  CentralCritic critic{nullptr}, target_critic{nullptr};
  std::unique_ptr<torch::optim::Adam> actor_opt, critic_opt;
  bool discrete = true;
};

// target <- (1 - tau) target + tau source; tau = 1 copies.
void polyak(nn::Module &target, const nn::Module &source, double tau) {
  torch::NoGradGuard no_grad;
  auto t = target.parameters();
  auto s = source.parameters();
  for (size_t k = 0; k < t.size(); ++k)
    t[k].lerp_(s[k], tau); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

struct JointBatch {
  std::vector<torch::Tensor> obs, acts, rews, next_obs;
  torch::Tensor done;
};

class MultiAgentReplay {
public:
  explicit MultiAgentReplay(const MaddpgConfig &cfg) : cap_(cfg.capacity) {
    for (size_t i = 0; i < cfg.obs_dims.size(); ++i) {
      obs_.push_back(torch::zeros({cap_, cfg.obs_dims[i]}));
      next_obs_.push_back(torch::zeros({cap_, cfg.obs_dims[i]}));
      acts_.push_back(torch::zeros({cap_, cfg.act_dims[i]}));
      rews_.push_back(torch::zeros({cap_}));
    }
    done_ = torch::zeros({cap_});
  }

  void add(const std::vector<torch::Tensor> &obs, const std::vector<torch::Tensor> &acts,
           const std::vector<float> &rews, const std::vector<torch::Tensor> &next_obs, bool done) {
    for (size_t i = 0; i < obs_.size(); ++i) {
      obs_[i][ptr_].copy_(obs[i]); // LOOKALIKE: tensor-copy-narrowing -- float observations into a float32 buffer
      next_obs_[i][ptr_].copy_(next_obs[i]);
      acts_[i][ptr_].copy_(acts[i]);
      rews_[i][ptr_] = rews[i];
    }
    done_[ptr_] = done ? 1.0 : 0.0;
    ptr_ = (ptr_ + 1) % cap_;
    size_ = std::min(size_ + 1, cap_);
  }

  int64_t size() const { return size_; }

  JointBatch sample(int64_t n) const {
    auto idx = torch::randint(size_, {n}, torch::kLong);
    JointBatch b;
    for (size_t i = 0; i < obs_.size(); ++i) {
      b.obs.push_back(obs_[i].index_select(0, idx));
      b.acts.push_back(acts_[i].index_select(0, idx));
      b.rews.push_back(rews_[i].index_select(0, idx));
      b.next_obs.push_back(next_obs_[i].index_select(0, idx));
    }
    b.done = done_.index_select(0, idx);
    return b;
  }

private:
  int64_t cap_, ptr_ = 0, size_ = 0;
  std::vector<torch::Tensor> obs_, next_obs_, acts_, rews_;
  torch::Tensor done_;
};

// One exploring episode; transitions go to the buffer. Returns the summed reward of all agents.
double run_episode(std::vector<Agent> &agents, std::vector<RunningNorm> &norms, ParticleEnv &env,
                   MultiAgentReplay &buffer, const MaddpgConfig &cfg) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  const auto n = agents.size();
  auto obs = env.reset();
  std::vector<std::vector<torch::Tensor>> seen(n);
  double ret = 0;
  for (int64_t t = 0; t < cfg.max_steps; ++t) {
    std::vector<torch::Tensor> acts;
    for (size_t i = 0; i < n; ++i) {
      auto out = agents[i].actor->forward(norms[i].apply(obs[i]).unsqueeze(0).to(device));
      torch::Tensor a;
      if (agents[i].discrete)
        a = gumbel_softmax(out, cfg.gumbel_temp);
      else
        a = (torch::tanh(out) + cfg.noise_std * torch::randn({1, cfg.act_dims[i]})).clamp(-1.0, 1.0); // EXPECT: tensor-device-mismatch -- the exploration noise is drawn on the host, the action on the GPU
      acts.push_back(a.squeeze(0).cpu()); // LOOKALIKE: tensor-sync-in-loop -- the environment needs the actions on the host
      seen[i].push_back(obs[i]); // LOOKALIKE: tensor-graph-kept-across-iterations -- observations from the env, under NoGradGuard
    }
    auto res = env.step(acts);
    buffer.add(obs, acts, res.rewards, res.obs, res.done);
    ret += std::accumulate(res.rewards.begin(), res.rewards.end(), 0.0);
    obs = std::move(res.obs);
    if (res.done)
      break;
  }
  for (size_t i = 0; i < n; ++i)
    norms[i].update(torch::stack(seen[i]));
  return ret;
}

void maddpg_update(std::vector<Agent> &agents, const JointBatch &host, const MaddpgConfig &cfg) {
  torch::Device device(torch::kCUDA);
  const auto n = agents.size();
  std::vector<torch::Tensor> obs, next_obs, acts, next_acts;
  for (size_t j = 0; j < n; ++j) {
    obs.push_back(host.obs[j].to(device)); // LOOKALIKE: tensor-clone-in-loop -- a different agent's batch each time, each copy kept
    next_obs.push_back(host.next_obs[j].to(device));
    acts.push_back(host.acts[j].to(device));
  }
  {
    torch::NoGradGuard no_grad;
    for (size_t j = 0; j < n; ++j) {
      auto out = agents[j].target_actor->forward(next_obs[j]);
      next_acts.push_back(agents[j].discrete ? gumbel_softmax(out, cfg.gumbel_temp) : torch::tanh(out)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    }
  }
  for (size_t i = 0; i < n; ++i) {
    auto &ag = agents[i];
    auto rew = host.rews[i].to(device); // LOOKALIKE: tensor-clone-in-loop -- each agent's own rewards
    auto done = host.done.to(device); // EXPECT: tensor-clone-in-loop -- the same done flags are copied to the GPU once per agent
    torch::Tensor next_q;
    {
      torch::NoGradGuard no_grad;
      next_q = ag.target_critic->forward(next_obs, next_acts).squeeze(1);
    }
    auto target = rew.clone(); // EXPECT: tensor-unnecessary-clone -- the bootstrap is added in place right after: rew + ... is one pass
    target.add_(cfg.gamma * (1.0 - done) * next_q);
    auto critic_loss = torch::mse_loss(ag.critic->forward(obs, acts).squeeze(1), target);
    ag.critic_opt->zero_grad();
    critic_loss.backward();
    nn::utils::clip_grad_norm_(ag.critic->parameters(), cfg.grad_clip);
    ag.critic_opt->step();

    // Actor: this agent's fresh (differentiable) action, the others' from the buffer.
    auto out = ag.actor->forward(obs[i]);
    auto joint = acts;
    joint[i] = ag.discrete ? gumbel_softmax(out, cfg.gumbel_temp) : torch::tanh(out); // LOOKALIKE: tensor-copy-narrowing -- handle assignment into a std::vector: no copy, no conversion
    auto actor_loss = -ag.critic->forward(obs, joint).mean() + 1e-3 * out.pow(2).mean();
    ag.actor_opt->zero_grad();
    actor_loss.backward();
    nn::utils::clip_grad_norm_(ag.actor->parameters(), cfg.grad_clip);
    ag.actor_opt->step();
  }
  for (auto &ag : agents) {
    polyak(*ag.target_actor, *ag.actor, cfg.tau);
    polyak(*ag.target_critic, *ag.critic, cfg.tau);
  }
}

std::vector<Agent> make_agents(const MaddpgConfig &cfg) {
  torch::Device device(torch::kCUDA);
  const auto joint_obs = std::accumulate(cfg.obs_dims.begin(), cfg.obs_dims.end(), int64_t{0});
  const auto joint_act = std::accumulate(cfg.act_dims.begin(), cfg.act_dims.end(), int64_t{0});
  std::vector<Agent> agents(cfg.obs_dims.size());
  for (size_t i = 0; i < agents.size(); ++i) {
    auto &ag = agents[i];
    ag.actor = Actor(cfg.obs_dims[i], cfg.act_dims[i], cfg.hidden);
    ag.target_actor = Actor(cfg.obs_dims[i], cfg.act_dims[i], cfg.hidden);
    ag.critic = CentralCritic(joint_obs, joint_act, cfg.hidden);
    ag.target_critic = CentralCritic(joint_obs, joint_act, cfg.hidden);
    ag.actor->to(device), ag.target_actor->to(device), ag.critic->to(device), ag.target_critic->to(device);
    polyak(*ag.target_actor, *ag.actor, 1.0);
    polyak(*ag.target_critic, *ag.critic, 1.0);
    ag.actor_opt = std::make_unique<torch::optim::Adam>(ag.actor->parameters(), torch::optim::AdamOptions(cfg.lr_actor));
    ag.critic_opt = std::make_unique<torch::optim::Adam>(ag.critic->parameters(), torch::optim::AdamOptions(cfg.lr_critic));
    ag.discrete = cfg.discrete[i];
  }
  return agents;
}

void train(ParticleEnv &env, const MaddpgConfig &cfg) {
  auto agents = make_agents(cfg);
  std::vector<RunningNorm> norms;
  for (auto d : cfg.obs_dims)
    norms.emplace_back(d);
  MultiAgentReplay buffer(cfg);
  double recent = 0;
  for (int64_t ep = 0; ep < cfg.episodes; ++ep) {
    recent += run_episode(agents, norms, env, buffer, cfg);
    if (buffer.size() >= cfg.warmup && (ep + 1) % cfg.update_every == 0)
      maddpg_update(agents, buffer.sample(cfg.batch), cfg);
    if ((ep + 1) % cfg.log_every == 0) {
      std::cout << "episode " << ep + 1 << " mean return " << recent / static_cast<double>(cfg.log_every) << "\n";
      recent = 0;
    }
  }
}
