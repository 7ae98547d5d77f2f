// TD3+BC (Fujimoto & Gu, 2021) trained on a logged dataset, with a running
// mean/std observation normaliser that is shared with evaluation rollouts.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <utility>

struct TD3BCConfig {
  int64_t obs_dim = 17, act_dim = 6, hidden = 256;
  int64_t batch_size = 256, max_steps = 1000000, policy_freq = 2;
  int64_t eval_every = 5000, eval_episodes = 10, log_every = 1000;
  double gamma = 0.99, tau = 0.005;
  double policy_noise = 0.2, noise_clip = 0.5;
  double alpha = 2.5, max_action = 1.0, lr = 3e-4;
  std::string dataset_path = "halfcheetah_medium.pt";
};

class RunningMeanStd {
 public:
  RunningMeanStd(int64_t dim, torch::Device device, double clip = 10.0)
      : mean_(torch::zeros({dim}, torch::TensorOptions().dtype(torch::kFloat64).device(device))),
        var_(torch::ones({dim}, torch::TensorOptions().dtype(torch::kFloat64).device(device))),
        clip_(clip) {
    refresh();
  }

  void update(const torch::Tensor& x) {
    auto xd = x.to(torch::kFloat64);
    auto batch_mean = xd.mean(0);
    auto batch_var = xd.var(0, /*unbiased=*/false);
    double batch_count = static_cast<double>(xd.size(0));

    auto delta = batch_mean - mean_;
    double total = count_ + batch_count;
    auto new_mean = mean_ + delta * (batch_count / total);
    auto m2 = var_ * count_ + batch_var * batch_count + delta.pow(2) * (count_ * batch_count / total);
    mean_.copy_(new_mean);  // LOOKALIKE: tensor-copy-narrowing -- new_mean is float64 like mean_
    var_.copy_(m2 / total);
    count_ = total;
    refresh();
  }

  torch::Tensor normalize(const torch::Tensor& x) const {
    auto out = x.to(mean_f_.device());
    // FACT: x = torch.randn(8, 3); assert shares_storage(x.to("cpu"), x)
    out.sub_(mean_f_).div_(std_f_);  // EXPECT: tensor-alias-then-mutate
    return out.clamp_(-clip_, clip_);
  }

 private:
  void refresh() {
    mean_f_ = mean_.to(torch::kFloat32);
    std_f_ = (var_ + 1e-8).sqrt().to(torch::kFloat32);
  }

  torch::Tensor mean_, var_, mean_f_, std_f_;
  double count_ = 1e-4;
  double clip_;
};

struct Transitions {
  torch::Tensor state, action, next_state, reward, not_done;
};

// Collectors write time-major float64 rollouts from several envs; training wants each
// env's trajectory stored contiguously, in float32.
static torch::Tensor env_major(const torch::Tensor& x) {
  // FACT: x = torch.randn(6, 3, 4).narrow(0, 0, 5); assert is_copy_of(x.transpose(0, 1).reshape(-1, 4), x)
  return x.transpose(0, 1).reshape({-1, x.size(2)});  // EXPECT: tensor-reshape-non-contiguous
}

static torch::Tensor env_major_flat(const torch::Tensor& x) {
  // FACT: assert raises(lambda: torch.randn(6, 3).narrow(0, 0, 5).t().view(-1), "view size is not compatible")
  return x.t().view({-1});  // EXPECT: tensor-view-non-contiguous
}

static torch::Tensor to_device_buffer(const torch::Tensor& x, torch::Device device) {
  auto buf = torch::empty(x.sizes(), torch::TensorOptions().dtype(torch::kFloat32).device(device));
  buf.copy_(x);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ is allowed to cross devices
  return buf;
}

class OfflineDataset {
 public:
  static OfflineDataset load(const std::string& path, torch::Device device) {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    torch::Tensor obs, act, rew, term;
    archive.read("observations", obs);
    archive.read("actions", act);
    archive.read("rewards", rew);
    archive.read("terminals", term);

    const int64_t T = obs.size(0);
    OfflineDataset ds;
    ds.state_ = to_device_buffer(env_major(obs.narrow(0, 0, T - 1)), device);
    ds.next_state_ = to_device_buffer(env_major(obs.narrow(0, 1, T - 1)), device);
    ds.action_ = to_device_buffer(env_major(act.narrow(0, 0, T - 1)), device);
    ds.reward_ = to_device_buffer(env_major_flat(rew.narrow(0, 0, T - 1)), device);
    ds.not_done_ = 1.0 - to_device_buffer(env_major_flat(term.narrow(0, 0, T - 1)), device);
    return ds;
  }

  Transitions sample(int64_t n) const {
    auto idx = torch::randint(size(), {n}, torch::TensorOptions().dtype(torch::kLong).device(state_.device()));
    return {state_.index_select(0, idx), action_.index_select(0, idx), next_state_.index_select(0, idx),
            reward_.index_select(0, idx), not_done_.index_select(0, idx)};
  }

  int64_t size() const { return state_.size(0); }

 private:
  torch::Tensor state_, action_, next_state_, reward_, not_done_;
};

struct ActorImpl : torch::nn::Module {
  ActorImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden, double max_action)
      : l1(register_module("l1", torch::nn::Linear(obs_dim, hidden))),
        l2(register_module("l2", torch::nn::Linear(hidden, hidden))),
        l3(register_module("l3", torch::nn::Linear(hidden, act_dim))),
        max_action(max_action) {}

  torch::Tensor forward(const torch::Tensor& s) {
    auto h = torch::relu(l1(s));
    h = torch::relu(l2(h));
    auto a = torch::tanh(l3(h));
    return a.mul_(max_action);  // EXPECT: tensor-inplace-on-saved
  }

  torch::nn::Linear l1, l2, l3;
  double max_action;
};
TORCH_MODULE(Actor);

struct CriticImpl : torch::nn::Module {
  CriticImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden)
      : q1_l1(register_module("q1_l1", torch::nn::Linear(obs_dim + act_dim, hidden))),
        q1_l2(register_module("q1_l2", torch::nn::Linear(hidden, hidden))),
        q1_l3(register_module("q1_l3", torch::nn::Linear(hidden, 1))),
        q2_l1(register_module("q2_l1", torch::nn::Linear(obs_dim + act_dim, hidden))),
        q2_l2(register_module("q2_l2", torch::nn::Linear(hidden, hidden))),
        q2_l3(register_module("q2_l3", torch::nn::Linear(hidden, 1))) {}

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& s, const torch::Tensor& a) {
    auto sa = torch::cat({s, a}, 1);
    auto q2 = q2_l3(torch::relu(q2_l2(torch::relu(q2_l1(sa)))));
    return {q1(s, a), q2.view({-1})};
  }

  torch::Tensor q1(const torch::Tensor& s, const torch::Tensor& a) {
    auto sa = torch::cat({s, a}, 1);
    auto q = q1_l3(torch::relu(q1_l2(torch::relu(q1_l1(sa)))));
    // FACT: assert not raises(lambda: torch.nn.Linear(3, 1)(torch.randn(4, 3)).view(-1))
    return q.view({-1});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
  }

  torch::nn::Linear q1_l1, q1_l2, q1_l3, q2_l1, q2_l2, q2_l3;
};
TORCH_MODULE(Critic);

static void polyak(torch::nn::Module& target, const torch::nn::Module& source, double tau) {
  auto tp = target.parameters();
  auto sp = source.parameters();
  for (size_t i = 0; i < tp.size(); ++i) {
    tp[i].data().mul_(1.0 - tau).add_(sp[i].data(), tau);  // LOOKALIKE: tensor-inplace-on-detached -- the Polyak update is meant to write the target's weights
  }
}

static void copy_weights(torch::nn::Module& target, const torch::nn::Module& source) {
  torch::NoGradGuard no_grad;
  auto tp = target.parameters();
  auto sp = source.parameters();
  for (size_t i = 0; i < tp.size(); ++i) tp[i].copy_(sp[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- runs under NoGradGuard
}

class TD3BC {
 public:
  TD3BC(const TD3BCConfig& cfg, torch::Device device)
      : cfg_(cfg), device_(device),
        actor_(cfg.obs_dim, cfg.act_dim, cfg.hidden, cfg.max_action),
        actor_target_(cfg.obs_dim, cfg.act_dim, cfg.hidden, cfg.max_action),
        critic_(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        critic_target_(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        rms_(cfg.obs_dim, device) {
    actor_->to(device);
    actor_target_->to(device);
    critic_->to(device);
    critic_target_->to(device);
    copy_weights(*actor_target_, *actor_);
    copy_weights(*critic_target_, *critic_);
    actor_opt_ = std::make_unique<torch::optim::Adam>(actor_->parameters(), torch::optim::AdamOptions(cfg.lr));
    critic_opt_ = std::make_unique<torch::optim::Adam>(critic_->parameters(), torch::optim::AdamOptions(cfg.lr));
    reset_stats();
  }

  void train_step(const Transitions& b) {
    ++total_it_;
    auto s = rms_.normalize(b.state);
    auto ns = rms_.normalize(b.next_state);

    torch::Tensor target_q;
    {
      torch::NoGradGuard no_grad;
      // FACT: a = torch.randn(4, 2); n = torch.randn_like(a); assert is_copy_of(n, a)
      auto noise = torch::randn_like(b.action);
      noise.mul_(cfg_.policy_noise).clamp_(-cfg_.noise_clip, cfg_.noise_clip);  // LOOKALIKE: tensor-alias-then-mutate -- randn_like allocated a new tensor
      auto next_action = (actor_target_->forward(ns) + noise).clamp(-cfg_.max_action, cfg_.max_action);
      auto tq = critic_target_->forward(ns, next_action);
      target_q = torch::min(tq.first, tq.second);
      target_q.mul_(b.not_done).mul_(cfg_.gamma).add_(b.reward);  // LOOKALIKE: tensor-inplace-on-saved -- computed under NoGradGuard, nothing is saved
    }

    auto q = critic_->forward(s, b.action);
    auto critic_loss = torch::mse_loss(q.first, target_q) + torch::mse_loss(q.second, target_q);
    critic_opt_->zero_grad();
    critic_loss.backward();
    critic_opt_->step();

    critic_loss_acc_ += critic_loss;  // EXPECT: tensor-graph-kept-across-iterations
    q_mean_acc_ += q.first.mean().item<double>();  // EXPECT: tensor-sync-in-loop
    ++n_critic_;

    if (total_it_ % cfg_.policy_freq == 0) {
      auto pi = actor_->forward(s);
      auto q_pi = critic_->q1(s, pi);
      auto lmbda = cfg_.alpha / q_pi.abs().mean().detach();
      auto bc = torch::mse_loss(pi, b.action);
      auto actor_loss = -lmbda * q_pi.mean() + bc;
      actor_opt_->zero_grad();
      actor_loss.backward();
      actor_opt_->step();

      bc_acc_ += bc.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
      ++n_actor_;
      polyak(*critic_target_, *critic_, cfg_.tau);
      polyak(*actor_target_, *actor_, cfg_.tau);
    }

    // keep the statistics following the data the agent is trained on
    rms_.update(b.state);
  }

  void log(int64_t it) {
    std::cout << "it " << it << " critic " << critic_loss_acc_.item<double>() / std::max<int64_t>(n_critic_, 1)
              << " bc " << bc_acc_.item<double>() / std::max<int64_t>(n_actor_, 1)
              << " q " << q_mean_acc_ / std::max<int64_t>(n_critic_, 1) << '\n';
    reset_stats();
  }

  Actor& actor() { return actor_; }
  const RunningMeanStd& normalizer() const { return rms_; }

 private:
  void reset_stats() {
    critic_loss_acc_ = torch::zeros({}, torch::TensorOptions().device(device_));
    bc_acc_ = torch::zeros({}, torch::TensorOptions().device(device_));
    q_mean_acc_ = 0.0;
    n_critic_ = n_actor_ = 0;
  }

  TD3BCConfig cfg_;
  torch::Device device_;
  Actor actor_, actor_target_;
  Critic critic_, critic_target_;
  std::unique_ptr<torch::optim::Adam> actor_opt_, critic_opt_;
  RunningMeanStd rms_;
  int64_t total_it_ = 0;
  torch::Tensor critic_loss_acc_, bc_acc_;
  double q_mean_acc_ = 0.0;
  int64_t n_critic_ = 0, n_actor_ = 0;
};

class ContinuousEnv {
 public:
  virtual ~ContinuousEnv() = default;
  virtual torch::Tensor reset() = 0;
  virtual torch::Tensor step(const torch::Tensor& action, double& reward, bool& done) = 0;
  virtual torch::Tensor action_low() const = 0;
  virtual torch::Tensor action_high() const = 0;
};

double evaluate(TD3BC& agent, ContinuousEnv& env, int64_t episodes, torch::Device device) {
  torch::NoGradGuard no_grad;
  agent.actor()->eval();
  const auto low = env.action_low();
  const auto high = env.action_high();
  double total = 0.0;
  for (int64_t ep = 0; ep < episodes; ++ep) {
    auto obs = env.reset();
    bool done = false;
    while (!done) {
      auto s = agent.normalizer().normalize(obs.to(device, torch::kFloat32));  // LOOKALIKE: tensor-clone-in-loop -- a new observation every step
      auto a = agent.actor()->forward(s.unsqueeze(0)).squeeze(0);
      a = torch::max(torch::min(a, high.to(device)), low.to(device));  // EXPECT: tensor-clone-in-loop
      auto a_host = a.to(torch::kCPU);  // LOOKALIKE: tensor-sync-in-loop -- the simulator needs the action itself each step
      double r = 0.0;
      obs = env.step(a_host, r, done);
      total += r;
    }
  }
  agent.actor()->train();
  return total / static_cast<double>(episodes);
}

void run(const TD3BCConfig& cfg, ContinuousEnv& env) {
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto data = OfflineDataset::load(cfg.dataset_path, device);
  TD3BC agent(cfg, device);

  for (int64_t it = 1; it <= cfg.max_steps; ++it) {
    agent.train_step(data.sample(cfg.batch_size));
    if (it % cfg.log_every == 0) agent.log(it);
    if (it % cfg.eval_every == 0) std::cout << "eval " << evaluate(agent, env, cfg.eval_episodes, device) << '\n';
  }
}
