// SAC + Hindsight Experience Replay ("future" strategy) on a vectorised Fetch-style reach
// task. The simulator runs on the CPU in double precision; the networks run on the GPU.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <memory>
#include <iostream>
#include <vector>
namespace F = torch::nn::functional;

struct Config {
  int64_t obs_dim = 10, goal_dim = 3, act_dim = 4, hidden = 256;
  int64_t horizon = 50, n_envs = 8, buffer_episodes = 20000, batch_size = 256;
  int64_t epochs = 50, cycles = 10, updates_per_cycle = 40;
  double gamma = 0.98, tau = 0.005, lr = 1e-3, init_alpha = 0.2;
  double future_p = 0.8, success_dist = 0.05, clip_obs = 200.0;
  std::vector<double> action_high{1.0, 1.0, 1.0, 1.0};
};

// Thin wrapper over the MuJoCo reach simulator (reach_env.cpp): CPU, double precision.
class ReachEnv {
 public:
  struct Obs { torch::Tensor observation, achieved_goal, desired_goal; };
  explicit ReachEnv(int64_t n_envs);
  Obs reset();
  Obs step(const torch::Tensor& action);
  void set_goal(const torch::Tensor& goal);
};

class Normalizer {
 public:
  Normalizer(int64_t size, double clip, torch::Device device)
      : sum_(torch::zeros({size}, torch::kDouble)), sumsq_(torch::zeros({size}, torch::kDouble)),
        mean_(torch::zeros({size}, device)), std_(torch::ones({size}, device)),
        clip_(clip), device_(device) {}

  void update(const torch::Tensor& x) {
    sum_ += x.sum(0);
    sumsq_ += x.pow(2).sum(0);
    count_ += x.size(0);
    auto mean = sum_ / count_;
    auto var = (sumsq_ / count_ - mean.pow(2)).clamp_min(1e-4);
    mean_ = mean.to(device_, torch::kFloat);
    std_ = var.sqrt().to(device_, torch::kFloat);
  }

  torch::Tensor normalize(const torch::Tensor& x) const {
    auto out = x;
    // FACT: a=torch.randn(4,3); ref=a.clone(); out=a; out.sub_(a.mean(0)); assert shares_storage(out,a) and not torch.equal(a,ref)
    out.sub_(mean_).div_(std_);  // EXPECT: tensor-alias-then-mutate
    return out.clamp_(-clip_, clip_);  // EXPECT: tensor-alias-then-mutate
  }
 private:
  torch::Tensor sum_, sumsq_, mean_, std_;
  int64_t count_ = 0;
  double clip_;
  torch::Device device_;
};

struct GaussianActorImpl : torch::nn::Module {
  explicit GaussianActorImpl(const Config& c) {
    const auto in = c.obs_dim + c.goal_dim;
    trunk = register_module("trunk", torch::nn::Sequential(
        torch::nn::Linear(in, c.hidden), torch::nn::ReLU(),
        torch::nn::Linear(c.hidden, c.hidden), torch::nn::ReLU()));
    mu = register_module("mu", torch::nn::Linear(c.hidden, c.act_dim));
    log_std = register_module("log_std", torch::nn::Linear(c.hidden, c.act_dim));
    action_scale_ = register_buffer("action_scale", torch::tensor(c.action_high, torch::kFloat));
  }

  std::pair<torch::Tensor, torch::Tensor> sample(const torch::Tensor& x, bool deterministic = false) {
    auto h = trunk->forward(x);
    auto m = mu(h);
    auto ls = log_std(h).clamp(-20.0, 2.0);
    auto sigma = ls.exp();
    auto u = deterministic ? m : m + sigma * torch::randn_like(m);
    auto action = torch::tanh(u);
    auto logp = (-0.5 * ((u - m) / sigma).pow(2) - ls - 0.5 * std::log(2.0 * M_PI)).sum(-1, true);
    // FACT: u=torch.randn(5,4,requires_grad=True); a=torch.tanh(u); lp=(-0.5*u.pow(2)).sum(-1,keepdim=True); lp-=torch.log(1-a.pow(2)+1e-6).sum(-1,keepdim=True); lp.mean().backward()
    logp -= torch::log(1.0 - action.pow(2) + 1e-6).sum(-1, true);  // LOOKALIKE: tensor-inplace-on-saved -- logp is a sum's output, which autograd does not save
    // FACT: u=torch.randn(3,4,requires_grad=True); a=torch.tanh(u); a.mul_(torch.ones(4)*2); assert backward_fails(lambda: a.sum().backward())
    action.mul_(action_scale_);  // EXPECT: tensor-inplace-on-saved // LOOKALIKE: tensor-device-mismatch -- action_scale_ is a registered buffer and follows actor->to(device)
    return {action, logp};
  }

  torch::nn::Sequential trunk{nullptr};
  torch::nn::Linear mu{nullptr}, log_std{nullptr};
  torch::Tensor action_scale_;
};
TORCH_MODULE(GaussianActor);

struct TwinQImpl : torch::nn::Module {
  explicit TwinQImpl(const Config& c) {
    const auto in = c.obs_dim + c.goal_dim + c.act_dim;
    auto mlp = [&] {
      return torch::nn::Sequential(
          torch::nn::Linear(in, c.hidden), torch::nn::ReLU(),
          torch::nn::Linear(c.hidden, c.hidden), torch::nn::ReLU(),
          torch::nn::Linear(c.hidden, 1));
    };
    q1 = register_module("q1", mlp());
    q2 = register_module("q2", mlp());
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& og, const torch::Tensor& a) {
    auto x = torch::cat({og, a}, -1);
    return {q1->forward(x), q2->forward(x)};
  }

  torch::nn::Sequential q1{nullptr}, q2{nullptr};
};
TORCH_MODULE(TwinQ);

struct Batch { torch::Tensor obs, next_obs, act, g, reward; };
class HerBuffer {
 public:
  HerBuffer(const Config& c)
      : cfg_(c), obs_(torch::zeros({c.buffer_episodes, c.horizon + 1, c.obs_dim})),
        ag_(torch::zeros({c.buffer_episodes, c.horizon + 1, c.goal_dim})),
        g_(torch::zeros({c.buffer_episodes, c.horizon, c.goal_dim})),
        act_(torch::zeros({c.buffer_episodes, c.horizon, c.act_dim})) {}

  // Rollouts arrive time-major (one row per env at each step).
  void store(const torch::Tensor& obs, const torch::Tensor& ag, const torch::Tensor& g,
             const torch::Tensor& act) {
    const int64_t n = obs.size(1);
    if (ptr_ + n > cfg_.buffer_episodes) ptr_ = 0;
    obs_.narrow(0, ptr_, n).copy_(obs.transpose(0, 1));  // EXPECT: tensor-copy-narrowing
    ag_.narrow(0, ptr_, n).copy_(ag.transpose(0, 1).to(ag_.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the double-to-float conversion is spelled out
    // FACT: b=torch.zeros(2,4,3); g=torch.randn(2,3); b.copy_(g.unsqueeze(0).expand(4,2,3).transpose(0,1)); assert torch.equal(b[:,3],g)
    g_.narrow(0, ptr_, n).copy_(g.transpose(0, 1));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded goals are only the source; the destination is the buffer
    act_.narrow(0, ptr_, n).copy_(act.transpose(0, 1));
    ptr_ += n;
    size_ = std::min(size_ + n, cfg_.buffer_episodes);
  }

  Batch sample(int64_t B) const {
    const int64_t T = cfg_.horizon;
    auto ep = torch::randint(size_, {B}, torch::kLong);
    auto t = torch::randint(T, {B}, torch::kLong);
    auto offset = (torch::rand({B}) * (T - t).to(torch::kFloat)).to(torch::kLong);
    auto future_t = t + 1 + offset;
    auto her = torch::rand({B}) < cfg_.future_p;
    Batch b;
    b.obs = obs_.index({ep, t});
    b.next_obs = obs_.index({ep, t + 1});
    b.act = act_.index({ep, t});
    auto ag_next = ag_.index({ep, t + 1});
    auto g = g_.index({ep, t});
    auto future_ag = ag_.index({ep, future_t});
    auto relabeled = g.clone();  // EXPECT: tensor-unnecessary-clone
    relabeled.index_put_({her}, future_ag.index({her}));
    b.g = relabeled;
    auto dist = (ag_next - b.g).norm(2, -1, true);
    b.reward = -(dist > cfg_.success_dist).to(torch::kFloat);
    return b;
  }
 private:
  Config cfg_;
  torch::Tensor obs_, ag_, g_, act_;
  int64_t ptr_ = 0, size_ = 0;
};

struct UpdateStats { torch::Tensor critic_loss, actor_loss, q_mean; };
class SacHerAgent {
 public:
  SacHerAgent(const Config& c, torch::Device device)
      : cfg_(c), device_(device), actor_(c), critic_(c), critic_target_(c), buffer_(c),
        obs_norm_(c.obs_dim, c.clip_obs, device), goal_norm_(c.goal_dim, c.clip_obs, device),
        target_entropy_(-static_cast<double>(c.act_dim)) {
    actor_->to(device_);
    critic_->to(device_);
    critic_target_->to(device_);
    soft_update(/*tau=*/1.0);
    for (auto& p : critic_target_->parameters()) p.set_requires_grad(false);
    log_alpha_ = torch::zeros({1}, torch::TensorOptions().device(device_).requires_grad(true));
    log_alpha_.fill_(std::log(cfg_.init_alpha));  // EXPECT: tensor-inplace-on-leaf
    using torch::optim::Adam, torch::optim::AdamOptions;
    actor_opt_ = std::make_unique<Adam>(actor_->parameters(), AdamOptions(c.lr));
    critic_opt_ = std::make_unique<Adam>(critic_->parameters(), AdamOptions(c.lr));
    alpha_opt_ = std::make_unique<Adam>(std::vector<torch::Tensor>{log_alpha_}, AdamOptions(c.lr));
  }

  torch::Tensor preprocess(const torch::Tensor& obs, const torch::Tensor& goal) const {
    return torch::cat({obs_norm_.normalize(obs), goal_norm_.normalize(goal)}, -1);
  }

  void collect(ReachEnv& env) {
    torch::NoGradGuard no_grad;
    auto ob = env.reset();
    const auto T = cfg_.horizon;
    std::vector<torch::Tensor> obs{ob.observation}, ags{ob.achieved_goal}, acts;
    auto g_dev = ob.desired_goal.to(device_, torch::kFloat);
    for (int64_t t = 0; t < T; ++t) {
      auto o_dev = ob.observation.to(device_, torch::kFloat);  // LOOKALIKE: tensor-clone-in-loop -- the observation changes every step
      auto a = actor_->sample(preprocess(o_dev, g_dev)).first;
      // FACT: a=torch.rand(2,4); e=a.to(torch.float64); e.clamp_(-0.5,0.5); assert is_copy_of(e,a)
      auto a_env = a.to(torch::kCPU, torch::kDouble);
      a_env.clamp_(-1.0, 1.0);  // LOOKALIKE: tensor-alias-then-mutate -- to(kDouble) of the float action is a fresh tensor
      ob = env.step(a_env);
      obs.push_back(ob.observation);
      ags.push_back(ob.achieved_goal);
      acts.push_back(a);
    }
    auto obs_t = torch::stack(obs);
    auto goal_seq = ob.desired_goal.to(torch::kFloat).unsqueeze(0).expand({T, cfg_.n_envs, cfg_.goal_dim});
    buffer_.store(obs_t, torch::stack(ags), goal_seq, torch::stack(acts).cpu());
    // FACT: x=torch.stack([torch.randn(3,10,dtype=torch.float64) for _ in range(5)]); assert is_view_of(x.reshape(-1,10),x)
    obs_norm_.update(obs_t.reshape({-1, cfg_.obs_dim}));  // LOOKALIKE: tensor-reshape-non-contiguous -- the stacked rollout is contiguous; reshape is a view
    goal_norm_.update(ob.desired_goal);
  }

  UpdateStats update() {
    auto b = buffer_.sample(cfg_.batch_size);
    auto obs = b.obs.to(device_), next_obs = b.next_obs.to(device_);
    auto g = b.g.to(device_), act = b.act.to(device_);
    auto og = preprocess(obs, g);
    auto og2 = preprocess(next_obs, g);
    torch::Tensor y;
    {
      torch::NoGradGuard no_grad;
      auto [a2, logp2] = actor_->sample(og2);
      auto [qt1, qt2] = critic_target_->forward(og2, a2);
      auto alpha = log_alpha_.exp();
      y = b.reward + cfg_.gamma * (torch::min(qt1, qt2) - alpha * logp2);  // EXPECT: tensor-device-mismatch
      y.clamp_(-1.0 / (1.0 - cfg_.gamma), 0.0);
    }
    auto [q1, q2] = critic_->forward(og, act);
    auto critic_loss = F::mse_loss(q1, y) + F::mse_loss(q2, y);
    critic_opt_->zero_grad();
    critic_loss.backward();
    critic_opt_->step();

    auto [pi, logp] = actor_->sample(og);
    auto [q1_pi, q2_pi] = critic_->forward(og, pi);
    auto alpha = log_alpha_.exp();
    auto actor_loss = (alpha * logp - torch::min(q1_pi, q2_pi)).mean();
    // FACT: u=torch.randn(4,requires_grad=True); la=torch.zeros(1,requires_grad=True); lp=(u*u).sum(-1,keepdim=True); l=(la.exp()*lp).mean(); d=lp.detach(); d.add_(-4.0); assert backward_fails(lambda: l.backward())
    auto entropy_gap = logp.detach();
    entropy_gap.add_(target_entropy_);  // EXPECT: tensor-inplace-on-detached
    auto alpha_loss = -(log_alpha_ * entropy_gap).mean();
    actor_opt_->zero_grad();
    actor_loss.backward();
    actor_opt_->step();
    alpha_opt_->zero_grad();
    alpha_loss.backward();
    alpha_opt_->step();
    return {critic_loss, actor_loss, q1.detach().mean()};
  }

  void soft_update(double tau) {
    torch::NoGradGuard no_grad;
    auto src = critic_->parameters();
    auto dst = critic_target_->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      dst[i].mul_(1.0 - tau).add_(src[i], tau);  // LOOKALIKE: tensor-inplace-on-leaf -- Polyak averaging runs under NoGradGuard
  }

  double evaluate(ReachEnv& env, int episodes) {
    torch::NoGradGuard no_grad;
    double success = 0.0;
    for (int e = 0; e < episodes; ++e) {
      auto ob = env.reset();
      // FACT: g=torch.tensor([1.45,0.8,0.6],dtype=torch.float64).unsqueeze(0).expand(8,3); assert raises(lambda: g.clamp_(1.05,1.55), "more than one element of the written-to tensor")
      auto goals = torch::tensor({1.45, 0.80, 0.60}, torch::kDouble).unsqueeze(0).expand({cfg_.n_envs, cfg_.goal_dim});
      goals.clamp_(1.05, 1.55);  // EXPECT: tensor-inplace-on-expanded
      env.set_goal(goals);
      auto g_dev = goals.to(device_, torch::kFloat);
      for (int64_t t = 0; t < cfg_.horizon; ++t) {
        auto o_dev = ob.observation.to(device_, torch::kFloat);
        auto a = actor_->sample(preprocess(o_dev, g_dev), /*deterministic=*/true).first;
        ob = env.step(a.to(torch::kCPU, torch::kDouble));
      }
      auto dist = (ob.achieved_goal - ob.desired_goal).norm(2, -1);
      success += (dist < cfg_.success_dist).to(torch::kDouble).mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- simulator tensors live on the CPU
    }
    return success / episodes;
  }

  void train(ReachEnv& env) {
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      std::vector<torch::Tensor> critic_losses;
      auto actor_loss_sum = torch::zeros({}, device_);
      double q_sum = 0.0;
      const int64_t n_updates = cfg_.cycles * cfg_.updates_per_cycle;
      for (int64_t cycle = 0; cycle < cfg_.cycles; ++cycle) {
        collect(env);
        for (int64_t u = 0; u < cfg_.updates_per_cycle; ++u) {
          auto stats = update();
          critic_losses.push_back(stats.critic_loss);  // EXPECT: tensor-graph-kept-across-iterations
          actor_loss_sum += stats.actor_loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, accumulated on the device
          q_sum += stats.q_mean.item<double>();  // EXPECT: tensor-sync-in-loop
        }
        soft_update(cfg_.tau);
      }
      std::cout << "epoch " << epoch << " critic " << torch::stack(critic_losses).mean().item<double>()
                << " actor " << (actor_loss_sum / n_updates).item<double>() << " q " << q_sum / n_updates
                << " success " << evaluate(env, 5) << std::endl;
    }
  }
 private:
  Config cfg_;
  torch::Device device_;
  GaussianActor actor_;
  TwinQ critic_, critic_target_;
  HerBuffer buffer_;
  Normalizer obs_norm_, goal_norm_;
  double target_entropy_;
  torch::Tensor log_alpha_;
  std::unique_ptr<torch::optim::Adam> actor_opt_, critic_opt_, alpha_opt_;
};

int main() {
  torch::manual_seed(0);
  Config cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ReachEnv env(cfg.n_envs);
  SacHerAgent agent(cfg, device);
  agent.train(env);
}
