// Bootstrapped DQN with an ensemble of Q-heads and randomized prior functions
// (Osband et al. 2016, "Deep Exploration via Bootstrapped DQN"; 2018, "Randomized Prior Functions").
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct BDQNConfig {
  int64_t num_envs = 16, num_heads = 10, hidden = 256, batch_size = 128, capacity = 500000;
  int64_t warmup = 5000, train_every = 4, grad_steps = 1, target_every = 2000;
  int64_t total_steps = 2000000, log_every = 5000;
  double gamma = 0.99, lr = 1e-4, prior_scale = 3.0, mask_prob = 0.5, head_init_scale = 0.1;
};

// Vectorised environment pool (env_pool.cpp); finished episodes reset automatically.
struct VecStep { torch::Tensor obs, reward, done; };
class VecEnv {
 public:
  virtual ~VecEnv() = default;
  virtual torch::Tensor reset() = 0;
  virtual VecStep step(const torch::Tensor& actions) = 0;
  virtual int64_t obs_dim() const = 0;
  virtual int64_t num_actions() const = 0;
};
std::unique_ptr<VecEnv> make_vec_env(const std::string& id, int64_t num_envs);

struct EnsembleQImpl : torch::nn::Module {
  EnsembleQImpl(int64_t obs_dim, int64_t hidden, int64_t num_actions, int64_t num_heads, double head_init_scale)
      : torso(torch::nn::Linear(obs_dim, hidden), torch::nn::ReLU()) {
    register_module("torso", torso);
    for (int64_t k = 0; k < num_heads; ++k) {
      torch::nn::Linear out(hidden, num_actions);
      // FACT: lin=torch.nn.Linear(4,3); assert raises(lambda: lin.weight.mul_(0.1), "leaf Variable")
      out->weight.mul_(head_init_scale);  // EXPECT: tensor-inplace-on-leaf
      heads.push_back(register_module("head" + std::to_string(k),
                                      torch::nn::Sequential(torch::nn::Linear(hidden, hidden), torch::nn::ReLU(), out)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto feat = torso->forward(x);
    // The shared torso receives gradients from every head; Osband et al. rescale them by 1/K.
    // FACT: x=torch.rand(4,6,requires_grad=True); f=torch.relu(torch.nn.Linear(6,8)(x)); f.div_(5); g=torch.nn.Linear(8,3)(f); assert backward_fails(lambda: g.sum().backward())
    feat.div_(static_cast<double>(heads.size()));  // EXPECT: tensor-inplace-on-saved
    std::vector<torch::Tensor> qs;
    qs.reserve(heads.size());
    for (auto& head : heads) qs.push_back(head->forward(feat));
    return torch::stack(qs);
  }

  torch::nn::Sequential torso;
  std::vector<torch::nn::Sequential> heads;
};
TORCH_MODULE(EnsembleQ);

// K random MLPs that never train, evaluated together with batched matmuls.
struct RandomPriorImpl : torch::nn::Module {
  RandomPriorImpl(int64_t obs_dim, int64_t hidden, int64_t num_actions, int64_t num_heads, double scale) {
    w1 = register_buffer("w1", torch::randn({num_heads, obs_dim, hidden}) / std::sqrt(static_cast<double>(obs_dim)));
    b1 = register_buffer("b1", 0.1 * torch::randn({num_heads, 1, hidden}));
    w2 = register_buffer("w2", torch::randn({num_heads, hidden, num_actions}) / std::sqrt(static_cast<double>(hidden)));
    w2.mul_(scale);  // LOOKALIKE: tensor-inplace-on-leaf -- registered buffers do not require grad
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto xk = x.unsqueeze(0).expand({w1.size(0), x.size(0), x.size(1)});
    return torch::bmm(torch::relu(torch::baddbmm(b1, xk, w1)), w2);
  }

  torch::Tensor w1, b1, w2;
};
TORCH_MODULE(RandomPrior);

struct RPFEnsembleImpl : torch::nn::Module {
  RPFEnsembleImpl(int64_t obs_dim, const BDQNConfig& cfg, int64_t num_actions)
      : trainable(obs_dim, cfg.hidden, num_actions, cfg.num_heads, cfg.head_init_scale),
        prior(obs_dim, cfg.hidden, num_actions, cfg.num_heads, cfg.prior_scale) {
    register_module("trainable", trainable);
    register_module("prior", prior);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto q = trainable->forward(x);
    torch::Tensor p;
    {
      torch::NoGradGuard no_grad;
      p = prior->forward(x);
    }
    // FACT: x=torch.rand(3,4,requires_grad=True); q=torch.stack([x*2, x*3]); q.add_(torch.rand(2,3,4)); assert not backward_fails(lambda: q.sum().backward())
    q.add_(p);  // LOOKALIKE: tensor-inplace-on-saved -- stack does not save its output and the prior is a constant
    return q;
  }

  EnsembleQ trainable;
  RandomPrior prior;
};
TORCH_MODULE(RPFEnsemble);

struct Batch { torch::Tensor obs, actions, rewards, next_obs, dones, masks; };

class ReplayBuffer {
 public:
  ReplayBuffer(int64_t capacity, int64_t obs_dim, int64_t num_heads, double mask_prob)
      : capacity_(capacity), num_heads_(num_heads), mask_prob_(mask_prob),
        obs_(torch::zeros({capacity, 2, obs_dim}, torch::kHalf)), actions_(torch::zeros({capacity}, torch::kLong)),
        rewards_(torch::zeros({capacity})), dones_(torch::zeros({capacity})),
        masks_(torch::zeros({capacity, num_heads})) {}

  void add(const torch::Tensor& obs, const torch::Tensor& actions, const torch::Tensor& rewards,
           const torch::Tensor& next_obs, const torch::Tensor& dones) {
    const auto n = obs.size(0);
    auto idx = (torch::arange(n) + pos_) % capacity_;
    obs_.index_put_({idx}, torch::stack({obs, next_obs}, 1));  // EXPECT: tensor-copy-narrowing
    actions_.index_put_({idx}, actions);
    rewards_.index_put_({idx}, rewards);
    dones_.index_put_({idx}, dones.to(torch::kFloat32));
    masks_.index_put_({idx}, torch::bernoulli(torch::full({n, num_heads_}, mask_prob_)));  // LOOKALIKE: tensor-copy-narrowing -- float masks into float storage
    pos_ = (pos_ + n) % capacity_;
    size_ = std::min(size_ + n, capacity_);
  }

  Batch sample(int64_t batch_size, torch::Device device) const {
    auto idx = torch::randint(0, size_, {batch_size}, torch::kLong);
    auto both = obs_.index_select(0, idx).to(device);
    return {both.select(1, 0), actions_.index_select(0, idx).to(device), rewards_.index_select(0, idx).to(device),
            both.select(1, 1), dones_.index_select(0, idx).to(device), masks_.index_select(0, idx).to(device)};
  }

 private:
  int64_t capacity_, num_heads_;
  double mask_prob_;
  int64_t pos_ = 0, size_ = 0;
  torch::Tensor obs_, actions_, rewards_, dones_, masks_;
};

class BootstrappedDQN {
 public:
  BootstrappedDQN(const BDQNConfig& cfg, int64_t obs_dim, int64_t num_actions, torch::Device device)
      : cfg_(cfg), device_(device), online_(obs_dim, cfg, num_actions), target_(obs_dim, cfg, num_actions) {
    online_->to(device_);
    target_->to(device_);
    torch::NoGradGuard no_grad;
    auto src_b = online_->buffers(), dst_b = target_->buffers();
    for (size_t i = 0; i < src_b.size(); ++i) dst_b[i].copy_(src_b[i]);
    for (auto& p : target_->parameters()) p.set_requires_grad(false);
    sync_target();
    opt_ = std::make_unique<torch::optim::Adam>(online_->parameters(), torch::optim::AdamOptions(cfg.lr));
    head_scale_ = torch::full({1, cfg.num_heads}, 1.0 / cfg.num_heads, device_);
    input_ = torch::zeros({cfg.num_envs, obs_dim}, device_);
    obs_mean_ = torch::zeros({obs_dim});
    obs_var_ = torch::ones({obs_dim});
    obs_std_ = torch::ones({obs_dim});
  }

  void update_obs_stats(const torch::Tensor& obs) {
    const double n = obs.size(0), total = count_ + n;
    auto delta = obs.mean(0) - obs_mean_;
    obs_mean_ += delta * (n / total);
    obs_var_ = (obs_var_ * count_ + obs.var(0, false) * n + delta.pow(2) * (count_ * n / total)) / total;
    obs_std_ = (obs_var_ + 1e-8).sqrt();
    count_ = total;
  }

  // Each env follows the greedy policy of its own head for the whole episode.
  torch::Tensor act(const torch::Tensor& obs, const torch::Tensor& heads) {
    torch::NoGradGuard no_grad;
    auto x = obs.contiguous();
    // FACT: o=torch.rand(1,10); x=o.contiguous(); x.sub_(0.5); assert shares_storage(x,o)
    x.sub_(obs_mean_).div_(obs_std_);  // EXPECT: tensor-alias-then-mutate
    input_.copy_(x);  // LOOKALIKE: tensor-device-mismatch -- copy_ moves the data across devices
    auto q_all = online_->forward(input_);
    const auto E = q_all.size(1), K = q_all.size(0);
    // FACT: q=torch.rand(5,4,3); assert raises(lambda: q.transpose(0,1).view(20,3), "view size is not compatible")
    auto rows = q_all.transpose(0, 1).view({E * K, -1});  // EXPECT: tensor-view-non-contiguous
    auto pick = heads.to(device_) + torch::arange(E, torch::TensorOptions(device_).dtype(torch::kLong)) * K;
    return rows.index_select(0, pick).argmax(1);
  }

  torch::Tensor learn(const ReplayBuffer& replay) {
    auto normalise = [this](const torch::Tensor& stored) {
      auto x = stored.to(torch::kFloat32);
      // FACT: o=torch.rand(2,10).half(); assert is_copy_of(o.to(torch.float32), o)
      x.sub_(obs_mean_).div_(obs_std_);  // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-alias-then-mutate -- stored obs are half, so to() made a float copy
      return x;
    };
    torch::Tensor loss;
    for (int64_t g = 0; g < cfg_.grad_steps; ++g) {
      auto batch = replay.sample(cfg_.batch_size, device_);
      auto obs = normalise(batch.obs), next_obs = normalise(batch.next_obs);
      auto q_all = online_->forward(obs);
      // FACT: a=torch.randint(0,3,(8,)); assert is_view_of(a.view(1,-1,1), a)
      auto act_idx = batch.actions.view({1, -1, 1}).expand({q_all.size(0), -1, 1});  // LOOKALIKE: tensor-view-non-contiguous -- sampled actions are contiguous
      auto q_sa = q_all.gather(2, act_idx).squeeze(2);
      torch::Tensor target;
      {
        torch::NoGradGuard no_grad;
        auto a_star = online_->forward(next_obs).argmax(2, true);
        auto next_q = target_->forward(next_obs).gather(2, a_star).squeeze(2);
        target = batch.rewards.unsqueeze(0) + cfg_.gamma * (1.0 - batch.dones).unsqueeze(0) * next_q;
      }
      auto per_head = F::smooth_l1_loss(q_sa, target, F::SmoothL1LossFuncOptions().reduction(torch::kNone));
      auto weights = head_scale_.expand({cfg_.batch_size, cfg_.num_heads});
      // FACT: w=torch.full((1,5),0.2).expand(3,5); assert raises(lambda: w.mul_(torch.bernoulli(torch.full((3,5),0.5))), "more than one element")
      weights.mul_(batch.masks);  // EXPECT: tensor-inplace-on-expanded
      // FACT: l=torch.rand(5,8); assert is_copy_of(l.t().reshape(-1), l)
      loss = (per_head.t().reshape({-1}) * weights.flatten()).sum() / cfg_.batch_size;  // EXPECT: tensor-reshape-non-contiguous
      opt_->zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(online_->parameters(), 10.0);
      opt_->step();
      last_td_ = (q_sa - target).detach().abs().mean();
    }
    return loss;
  }

  void sync_target() {
    torch::NoGradGuard no_grad;
    auto src = online_->parameters(), dst = target_->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i].clone());  // EXPECT: tensor-unnecessary-clone
  }

  torch::Tensor last_td_error() const { return last_td_; }

 private:
  BDQNConfig cfg_;
  torch::Device device_;
  RPFEnsemble online_, target_;
  std::unique_ptr<torch::optim::Adam> opt_;
  torch::Tensor head_scale_, input_, obs_mean_, obs_var_, obs_std_, last_td_;
  double count_ = 1e-4;
};

int main(int argc, char** argv) {
  torch::Device device(torch::kCUDA);
  BDQNConfig cfg;
  auto env = make_vec_env(argc > 1 ? argv[1] : "deep_sea_20", cfg.num_envs);
  BootstrappedDQN agent(cfg, env->obs_dim(), env->num_actions(), device);
  ReplayBuffer replay(cfg.capacity, env->obs_dim(), cfg.num_heads, cfg.mask_prob);

  auto obs = env->reset();
  auto heads = torch::randint(0, cfg.num_heads, {cfg.num_envs}, torch::kLong);
  auto episode_return = torch::zeros({cfg.num_envs});
  std::deque<torch::Tensor> loss_window, td_window;
  std::deque<double> return_window;
  for (int64_t step = 0; step < cfg.total_steps; ++step) {
    agent.update_obs_stats(obs);
    auto actions = agent.act(obs, heads).cpu();  // LOOKALIKE: tensor-sync-in-loop -- the env needs the actions on the host
    auto next = env->step(actions);
    replay.add(obs, actions, next.reward, next.obs, next.done);
    episode_return += next.reward;
    if (next.done.any().item<bool>()) {
      return_window.push_back(episode_return.index({next.done}).mean().item<double>());
      episode_return.index_put_({next.done}, 0.0);
      heads = torch::where(next.done, torch::randint(0, cfg.num_heads, {cfg.num_envs}, torch::kLong), heads);
      if (return_window.size() > 100) return_window.pop_front();
    }
    obs = next.obs;

    if (step >= cfg.warmup && step % cfg.train_every == 0) {
      loss_window.push_back(agent.learn(replay));  // EXPECT: tensor-graph-kept-across-iterations
      td_window.push_back(agent.last_td_error());  // LOOKALIKE: tensor-graph-kept-across-iterations -- learn() stores a detached TD error
      if (loss_window.size() > 100) {
        loss_window.pop_front();
        td_window.pop_front();
      }
    }
    if (step % cfg.target_every == 0) agent.sync_target();
    if (step % cfg.log_every == 0 && !loss_window.empty()) {
      double mean_return = 0.0;
      for (double r : return_window) mean_return += r / return_window.size();
      std::cout << "step " << step << " loss "
                << torch::stack(std::vector<torch::Tensor>(loss_window.begin(), loss_window.end())).mean().item<double>()
                << " |td| "
                << torch::stack(std::vector<torch::Tensor>(td_window.begin(), td_window.end())).mean().item<double>()
                << " return " << mean_return << std::endl;
    }
  }
  return 0;
}
