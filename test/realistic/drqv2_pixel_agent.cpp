// DrQ-v2 agent for pixel-based continuous control (port of facebookresearch/drqv2).
// Random-shift augmentation, n-step returns, clipped double-Q with an EMA target critic.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <memory>
#include <vector>

namespace F = torch::nn::functional;

struct DrQConfig {
  int64_t num_envs = 8, frame_stack = 3, channels = 3, image_size = 84, action_dim = 6;
  int64_t feature_dim = 50, hidden_dim = 1024, pad = 4, nstep = 3, batch_size = 256;
  int64_t capacity_steps = 125000, num_seed_frames = 4000, num_expl_steps = 2000;
  int64_t num_train_steps = 1000000, update_every = 2, log_every = 1000, std_duration = 500000;
  double action_scale = 1.0, discount = 0.99, critic_tau = 0.01, lr = 1e-4, stddev_clip = 0.3;
  double feature_noise = 0.0, std_init = 1.0, std_final = 0.1;
};

double stddev_schedule(const DrQConfig& cfg, int64_t step) {
  const double mix = std::clamp(static_cast<double>(step) / cfg.std_duration, 0.0, 1.0);
  return (1.0 - mix) * cfg.std_init + mix * cfg.std_final;
}

// dm_control bridge (dmc_bridge.cpp); pixels are rendered into the env's own buffer.
struct VecTimeStep {
  torch::Tensor pixels;
  std::vector<double> rewards;
  std::vector<float> discounts;
  bool last = false;
};
struct VecPixelEnv {
  virtual ~VecPixelEnv() = default;
  virtual VecTimeStep reset() = 0;
  virtual VecTimeStep step(const std::vector<float>& actions) = 0;
};
std::unique_ptr<VecPixelEnv> make_vec_env(const std::string& name, int64_t num_envs, int64_t seed);

void weight_init(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  if (auto* lin = m.as<torch::nn::Linear>()) {
    torch::nn::init::orthogonal_(lin->weight);
    lin->bias.fill_(0.0);  // LOOKALIKE: tensor-inplace-on-leaf -- runs under the NoGradGuard above
  } else if (auto* conv = m.as<torch::nn::Conv2d>()) {
    torch::nn::init::orthogonal_(conv->weight, torch::nn::init::calculate_gain(torch::kReLU));
    torch::nn::init::zeros_(conv->bias);
  }
}

struct RandomShiftsAugImpl : torch::nn::Module {
  explicit RandomShiftsAugImpl(int64_t pad) : pad_(pad) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const auto n = x.size(0), h = x.size(2), w = x.size(3);
    auto padded = F::pad(x, F::PadFuncOptions({pad_, pad_, pad_, pad_}).mode(torch::kReplicate));
    const double eps = 1.0 / (h + 2 * pad_);
    auto arange = torch::linspace(-1.0 + eps, 1.0 - eps, h + 2 * pad_, x.options()).narrow(0, 0, h);
    auto ax = arange.unsqueeze(0).repeat({h, 1}).unsqueeze(2);
    auto base_grid = torch::cat({ax, ax.transpose(0, 1)}, 2);
    auto shift = torch::randint(0, 2 * pad_ + 1, {n, 1, 1, 2}, x.options());
    // FACT: g=torch.zeros(1,6,6,2).expand(4,6,6,2); assert raises(lambda: g.add_(torch.rand(4,1,1,2)), "more than one element")
    auto grid = base_grid.unsqueeze(0).expand({n, h, w, 2});
    grid.add_(shift * (2.0 / (h + 2 * pad_)));  // EXPECT: tensor-inplace-on-expanded
    return F::grid_sample(padded, grid, F::GridSampleFuncOptions().padding_mode(torch::kZeros).align_corners(false));
  }
  int64_t pad_;
};
TORCH_MODULE(RandomShiftsAug);

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(int64_t in_channels) {
    for (int i = 0; i < 4; ++i) {
      convnet_->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(i ? 32 : in_channels, 32, 3).stride(i ? 1 : 2)));
      convnet_->push_back(torch::nn::ReLU());
    }
    register_module("convnet", convnet_);
  }
  torch::Tensor forward(const torch::Tensor& obs) {
    auto h = convnet_->forward(obs);
    // FACT: h=torch.relu(torch.nn.Conv2d(3,4,3,stride=2)(torch.rand(2,3,9,9))); assert is_view_of(h.view(2,-1), h)
    return h.view({h.size(0), -1});  // LOOKALIKE: tensor-view-non-contiguous -- conv output is contiguous
  }
  torch::nn::Sequential convnet_;
};
TORCH_MODULE(Encoder);

torch::nn::Sequential make_trunk(int64_t repr_dim, int64_t feature_dim) {
  return torch::nn::Sequential(torch::nn::Linear(repr_dim, feature_dim),
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({feature_dim})), torch::nn::Tanh());
}
torch::nn::Sequential make_mlp(int64_t in, int64_t hidden, int64_t out) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, out));
}

struct ActorImpl : torch::nn::Module {
  ActorImpl(int64_t repr_dim, const DrQConfig& cfg) : action_scale_(cfg.action_scale) {
    trunk_ = register_module("trunk", make_trunk(repr_dim, cfg.feature_dim));
    policy_ = register_module("policy", make_mlp(cfg.feature_dim, cfg.hidden_dim, cfg.action_dim));
  }
  torch::Tensor forward(const torch::Tensor& obs) {
    auto mu = torch::tanh(policy_->forward(trunk_->forward(obs)));
    // FACT: x=torch.rand(2,3,requires_grad=True); m=torch.tanh(x); m.mul_(2.0); assert backward_fails(lambda: m.sum().backward())
    mu.mul_(action_scale_);  // EXPECT: tensor-inplace-on-saved
    return mu;
  }
  double action_scale_;
  torch::nn::Sequential trunk_{nullptr}, policy_{nullptr};
};
TORCH_MODULE(Actor);

struct CriticImpl : torch::nn::Module {
  CriticImpl(int64_t repr_dim, const DrQConfig& cfg) {
    trunk_ = register_module("trunk", make_trunk(repr_dim, cfg.feature_dim));
    q1_ = register_module("q1", make_mlp(cfg.feature_dim + cfg.action_dim, cfg.hidden_dim, 1));
    q2_ = register_module("q2", make_mlp(cfg.feature_dim + cfg.action_dim, cfg.hidden_dim, 1));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs, const torch::Tensor& action) {
    auto h_action = torch::cat({trunk_->forward(obs), action}, -1);
    return {q1_->forward(h_action), q2_->forward(h_action)};
  }
  torch::nn::Sequential trunk_{nullptr}, q1_{nullptr}, q2_{nullptr};
};
TORCH_MODULE(Critic);

torch::Tensor sample_clipped(const torch::Tensor& mu, double stddev, double clip, double limit) {
  auto eps = torch::randn_like(mu) * stddev;
  auto x = mu + (clip > 0.0 ? eps.clamp(-clip, clip) : eps);
  return x - x.detach() + x.detach().clamp(-limit + 1e-6, limit - 1e-6);  // straight-through clamp
}

struct NStepBatch { torch::Tensor obs, action, reward, discount, next_obs; };

class NStepReplay {
 public:
  NStepReplay(const DrQConfig& cfg, torch::Device device)
      : nstep_(cfg.nstep), num_envs_(cfg.num_envs), capacity_(cfg.capacity_steps), device_(device) {
    obs_ = torch::zeros({capacity_, num_envs_, cfg.frame_stack * cfg.channels, cfg.image_size, cfg.image_size},
                        torch::kUInt8);
    actions_ = torch::zeros({capacity_, num_envs_, cfg.action_dim});
    rewards_ = torch::zeros({capacity_, num_envs_});
    discounts_ = torch::ones({capacity_, num_envs_});
    gamma_powers_ = torch::pow(torch::full({nstep_}, cfg.discount), torch::arange(nstep_, torch::kFloat));
    gamma_n_ = torch::scalar_tensor(std::pow(cfg.discount, static_cast<double>(nstep_)));
  }
  void add(const torch::Tensor& obs, const torch::Tensor& action, const torch::Tensor& reward, const torch::Tensor& discount) {
    obs_[t_].copy_(obs);  // LOOKALIKE: tensor-copy-narrowing -- stacked frames are already uint8
    actions_[t_].copy_(action);
    rewards_[t_].copy_(reward);  // EXPECT: tensor-copy-narrowing
    discounts_[t_].copy_(discount);
    t_ = (t_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }
  NStepBatch sample(int64_t batch_size) const {
    auto t = torch::randint(0, size_ - nstep_, {batch_size}, torch::kLong);
    auto e = torch::randint(0, num_envs_, {batch_size}, torch::kLong);
    auto steps = t.unsqueeze(1) + torch::arange(nstep_);
    auto r = rewards_.index({steps, e.unsqueeze(1)}).to(device_);
    auto alive = discounts_.index({steps, e.unsqueeze(1)}).to(device_).cumprod(1);
    auto alive_before = torch::cat({torch::ones_like(alive.narrow(1, 0, 1)), alive.narrow(1, 0, nstep_ - 1)}, 1);
    NStepBatch b;
    b.obs = obs_.index({t, e}).to(device_);
    b.action = actions_.index({t, e}).to(device_);
    b.reward = (r * alive_before * gamma_powers_).sum(1, true);  // EXPECT: tensor-device-mismatch
    b.discount = alive.select(1, nstep_ - 1).unsqueeze(1) * gamma_n_;  // LOOKALIKE: tensor-device-mismatch -- gamma_n_ is a 0-dim CPU tensor, which CUDA ops accept
    b.next_obs = obs_.index({t + nstep_, e}).to(device_);
    return b;
  }
 private:
  int64_t nstep_, num_envs_, capacity_, t_ = 0, size_ = 0;
  torch::Device device_;
  torch::Tensor obs_, actions_, rewards_, discounts_, gamma_powers_, gamma_n_;
};

struct UpdateInfo { torch::Tensor critic_loss, actor_loss, q_mean; };

class DrQV2Agent {
 public:
  DrQV2Agent(const DrQConfig& cfg, torch::Device device)
      : cfg_(cfg), device_(device), aug_(cfg.pad), encoder_(cfg.frame_stack * cfg.channels) {
    torch::NoGradGuard no_grad;
    const auto c = cfg.frame_stack * cfg.channels;
    const auto repr_dim = encoder_->forward(torch::zeros({1, c, cfg.image_size, cfg.image_size})).size(1);
    actor_ = Actor(repr_dim, cfg);
    critic_ = Critic(repr_dim, cfg);
    critic_target_ = Critic(repr_dim, cfg);
    for (auto* m : std::vector<torch::nn::Module*>{encoder_.get(), actor_.get(), critic_.get()}) {
      m->apply(weight_init);
      m->to(device_);
    }
    critic_target_->to(device_);
    auto src = critic_->parameters(), dst = critic_target_->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]).set_requires_grad(false);
    encoder_opt_ = std::make_unique<torch::optim::Adam>(encoder_->parameters(), torch::optim::AdamOptions(cfg.lr));
    actor_opt_ = std::make_unique<torch::optim::Adam>(actor_->parameters(), torch::optim::AdamOptions(cfg.lr));
    critic_opt_ = std::make_unique<torch::optim::Adam>(critic_->parameters(), torch::optim::AdamOptions(cfg.lr));
  }

  torch::Tensor preprocess(const torch::Tensor& obs) const {
    auto x = obs.to(device_, torch::kFloat32);
    // FACT: o=torch.randint(0,255,(2,3,8,8),dtype=torch.uint8); assert is_copy_of(o.to(torch.float32), o)
    x.div_(255.0).sub_(0.5);  // LOOKALIKE: tensor-alias-then-mutate -- obs is uint8, so to() returned a new float tensor
    return x;
  }

  torch::Tensor act(const torch::Tensor& obs, int64_t step) {
    torch::NoGradGuard no_grad;
    auto mu = actor_->forward(encoder_->forward(preprocess(obs)));
    if (step < cfg_.num_expl_steps) return torch::empty_like(mu).uniform_(-cfg_.action_scale, cfg_.action_scale);
    return sample_clipped(mu, stddev_schedule(cfg_, step), /*clip=*/0.0, cfg_.action_scale);
  }

  torch::Tensor probe_value(const torch::Tensor& obs) {
    torch::NoGradGuard no_grad;
    auto feat = encoder_->forward(preprocess(obs));
    auto q = critic_->forward(feat, actor_->forward(feat));
    return torch::min(q.first, q.second).mean();
  }

  UpdateInfo update(const NStepReplay& replay, int64_t step) {
    const double stddev = stddev_schedule(cfg_, step);
    auto batch = replay.sample(cfg_.batch_size);
    auto feat = encoder_->forward(aug_->forward(preprocess(batch.obs)));
    torch::Tensor target_q;
    {
      torch::NoGradGuard no_grad;
      auto next_feat = encoder_->forward(aug_->forward(preprocess(batch.next_obs)));
      auto next_action = sample_clipped(actor_->forward(next_feat), stddev, cfg_.stddev_clip, cfg_.action_scale);
      auto tq = critic_target_->forward(next_feat, next_action);
      auto target_v = torch::min(tq.first, tq.second);
      target_q = target_v.clone().mul_(batch.discount).add_(batch.reward);  // EXPECT: tensor-unnecessary-clone // LOOKALIKE: tensor-inplace-on-saved -- the target is built under NoGradGuard, nothing is saved
    }
    auto actor_feat = feat.detach();
    // FACT: x=torch.rand(2,3,9,9,requires_grad=True); f=torch.relu(torch.nn.Conv2d(3,4,3)(x)).flatten(1); d=f.detach(); d.add_(torch.randn_like(d)); assert backward_fails(lambda: f.sum().backward())
    if (cfg_.feature_noise > 0.0) actor_feat.add_(torch::randn_like(actor_feat) * cfg_.feature_noise);  // EXPECT: tensor-inplace-on-detached

    UpdateInfo info;
    auto q = critic_->forward(feat, batch.action);
    info.critic_loss = F::mse_loss(q.first, target_q) + F::mse_loss(q.second, target_q);
    info.q_mean = q.first.detach().mean();
    encoder_opt_->zero_grad();
    critic_opt_->zero_grad();
    info.critic_loss.backward();
    critic_opt_->step();
    encoder_opt_->step();
    auto action = sample_clipped(actor_->forward(actor_feat), stddev, cfg_.stddev_clip, cfg_.action_scale);
    auto q_pi = critic_->forward(actor_feat, action);
    auto actor_loss = -torch::min(q_pi.first, q_pi.second).mean();
    actor_opt_->zero_grad();
    actor_loss.backward();
    actor_opt_->step();
    info.actor_loss = actor_loss.detach();
    torch::NoGradGuard no_grad;
    auto src = critic_->parameters(), dst = critic_target_->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      dst[i].mul_(1.0 - cfg_.critic_tau).add_(src[i], cfg_.critic_tau);  // LOOKALIKE: tensor-inplace-on-leaf -- EMA under NoGradGuard; target params do not require grad
    return info;
  }

 private:
  DrQConfig cfg_;
  torch::Device device_;
  RandomShiftsAug aug_;
  Encoder encoder_;
  Actor actor_{nullptr};
  Critic critic_{nullptr}, critic_target_{nullptr};
  std::unique_ptr<torch::optim::Adam> encoder_opt_, actor_opt_, critic_opt_;
};

int main(int argc, char** argv) {
  TORCH_CHECK(torch::cuda::is_available(), "DrQ-v2 training needs a CUDA device");
  torch::Device device(torch::kCUDA);
  DrQConfig cfg;
  auto env = make_vec_env(argc > 1 ? argv[1] : "walker_walk", cfg.num_envs, /*seed=*/1);
  DrQV2Agent agent(cfg, device);
  NStepReplay replay(cfg, device);
  auto ts = env->reset();
  std::deque<torch::Tensor> frames(cfg.frame_stack, ts.pixels.clone());
  torch::Tensor probe_obs;
  std::vector<torch::Tensor> critic_losses;
  auto actor_loss_acc = torch::zeros({}, device);
  double q_mean_sum = 0.0;
  for (int64_t step = 0; step < cfg.num_train_steps; ++step) {
    auto stack = torch::stack(std::vector<torch::Tensor>(frames.begin(), frames.end()));
    // FACT: f=torch.rand(3,4,3,8,8); assert is_copy_of(f.transpose(0,1).reshape(4,-1,8,8), f)
    auto obs = stack.transpose(0, 1).reshape({cfg.num_envs, -1, cfg.image_size, cfg.image_size});  // EXPECT: tensor-reshape-non-contiguous
    auto actions = agent.act(obs.to(device), step);  // LOOKALIKE: tensor-clone-in-loop -- a new observation every step
    auto host_actions = actions.to(torch::kCPU);
    const float* a = host_actions.data_ptr<float>();
    ts = env->step(std::vector<float>(a, a + host_actions.numel()));
    auto reward = torch::from_blob(ts.rewards.data(), {cfg.num_envs}, torch::kFloat64).clone();  // LOOKALIKE: tensor-unnecessary-clone -- from_blob does not own the vector's memory
    auto discount = torch::from_blob(ts.discounts.data(), {cfg.num_envs}, torch::kFloat32).clone();
    replay.add(obs, host_actions, reward, discount);
    const bool new_episode = ts.last;
    if (new_episode) ts = env->reset();
    frames.pop_front();
    frames.push_back(ts.pixels.clone());
    if (new_episode) std::fill(frames.begin(), frames.end(), frames.back());
    if (step * cfg.num_envs < cfg.num_seed_frames || step % cfg.update_every != 0) continue;
    if (!probe_obs.defined()) probe_obs = replay.sample(64).obs.cpu();
    auto info = agent.update(replay, step);
    critic_losses.push_back(info.critic_loss);  // EXPECT: tensor-graph-kept-across-iterations
    actor_loss_acc += info.actor_loss;  // LOOKALIKE: tensor-graph-kept-across-iterations -- update returns the actor loss detached
    q_mean_sum += info.q_mean.item<double>();  // EXPECT: tensor-sync-in-loop

    if (step % cfg.log_every == 0) {
      auto probe_q = agent.probe_value(probe_obs.to(device));  // EXPECT: tensor-clone-in-loop
      const auto n = static_cast<double>(critic_losses.size());
      std::cout << "step " << step << " critic_loss " << torch::stack(critic_losses).mean().item<double>()
                << " actor_loss " << actor_loss_acc.item<double>() / n << " q " << q_mean_sum / n
                << " probe_q " << probe_q.item<double>() << std::endl;
      critic_losses.clear();
      actor_loss_acc.zero_();
      q_mean_sum = 0.0;
    }
  }
  return 0;
}
