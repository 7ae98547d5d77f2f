// Atari DQN (Nature 2015 preprocessing) with a Double DQN target: uint8 frames are
// max-pooled over two raw frames, converted to luminance, resized to 84x84 and stacked by 4;
// the replay buffer keeps uint8 stacks; Huber loss, periodic target sync, linear epsilon.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <vector>

namespace F = torch::nn::functional;

struct DQNConfig {
  int64_t frame_size = 84;
  int64_t stack = 4;
  int64_t n_actions = 6;
  int64_t replay_capacity = 100000;
  int64_t batch_size = 32;
  double gamma = 0.99;
  double lr = 6.25e-5;
  int64_t target_sync_every = 10000;
  int64_t learn_start = 50000;
  int64_t train_every = 4;
  double eps_start = 1.0;
  double eps_end = 0.01;
  int64_t eps_decay_steps = 1000000;
  int64_t log_every = 10000;
};

double epsilon_at(const DQNConfig& c, int64_t step) {
  const double frac = std::min(1.0, static_cast<double>(step) / static_cast<double>(c.eps_decay_steps));
  return c.eps_start + frac * (c.eps_end - c.eps_start);
}

// RGB uint8 [H, W, 3] -> luminance float [H, W] (ITU-R BT.601 weights).
torch::Tensor to_gray(const torch::Tensor& rgb) {
  const int64_t H = rgb.size(0), W = rgb.size(1);
  auto luma = torch::tensor({0.299f, 0.587f, 0.114f}).view({1, 3});
  // FACT: f = torch.zeros(6, 8, 3, dtype=torch.uint8); assert is_view_of(f.permute(2, 0, 1).view(3, -1), f)
  auto planes = rgb.permute({2, 0, 1}).view({3, -1});  // LOOKALIKE: tensor-view-non-contiguous -- H and W stay adjacent after moving channels first, so the merge is a view
  return torch::matmul(luma, planes.to(torch::kFloat)).view({H, W});
}

torch::Tensor resize_bilinear(const torch::Tensor& gray, int64_t size) {
  return F::interpolate(gray.unsqueeze(0).unsqueeze(0), F::InterpolateFuncOptions()
                                                            .size(std::vector<int64_t>{size, size})
                                                            .mode(torch::kBilinear)
                                                            .align_corners(false))
      .squeeze(0)
      .squeeze(0);
}

class FrameStack {
 public:
  FrameStack(int64_t k, int64_t size)
      : k_(k), size_(size), frames_(torch::zeros({k, size, size}, torch::kByte)) {}

  void reset(const torch::Tensor& rgb) {
    last_raw_ = rgb.clone();
    auto first = torch::empty({size_, size_}, torch::kByte);
    first.copy_(resize_bilinear(to_gray(rgb), size_).round().clamp(0, 255));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to [0, 255] before the uint8 store
    for (int64_t i = 0; i < k_; ++i)
      frames_[i] = first.clone();  // EXPECT: tensor-clone-in-loop
  }

  // Some sprites are drawn on alternate frames only: max over the last two raw frames.
  void push(const torch::Tensor& rgb) {
    auto prev = last_raw_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- last_raw_ is overwritten on the next line while prev is still needed
    last_raw_.copy_(rgb);
    auto small = F::interpolate(to_gray(torch::max(prev, last_raw_)).unsqueeze(0).unsqueeze(0),
                                F::InterpolateFuncOptions()
                                    .size(std::vector<int64_t>{size_, size_})
                                    .mode(torch::kBilinear)
                                    .align_corners(false));
    // FACT: f = torch.zeros(4, 6, 6, dtype=torch.uint8); assert raises(lambda: f.narrow(0, 0, 3).copy_(f.narrow(0, 1, 3)), "some elements of the input tensor")
    frames_.narrow(0, 0, k_ - 1).copy_(frames_.narrow(0, 1, k_ - 1));  // EXPECT: tensor-inplace-overlap
    frames_[k_ - 1].copy_(small.squeeze());  // EXPECT: tensor-copy-narrowing
  }

  torch::Tensor state() const { return frames_.clone(); }  // [k, size, size] uint8 snapshot

 private:
  int64_t k_, size_;
  torch::Tensor frames_;
  torch::Tensor last_raw_;
};

struct ReplayBatch {
  torch::Tensor obs, actions, rewards, next_obs, dones;
};

class ReplayBuffer {
 public:
  ReplayBuffer(int64_t capacity, int64_t stack, int64_t size)
      : capacity_(capacity),
        obs_(torch::zeros({capacity, stack, size, size}, torch::kByte)),
        next_obs_(torch::zeros({capacity, stack, size, size}, torch::kByte)),
        actions_(torch::zeros({capacity}, torch::kLong)),
        rewards_(torch::zeros({capacity}, torch::kFloat)),
        dones_(torch::zeros({capacity}, torch::kFloat)) {}

  void push(const torch::Tensor& obs, int64_t action, double reward, const torch::Tensor& next_obs, bool done) {
    TORCH_CHECK(obs.scalar_type() == torch::kByte && next_obs.scalar_type() == torch::kByte,
                "replay stores uint8 frame stacks");
    obs_[pos_].copy_(obs);  // LOOKALIKE: tensor-copy-narrowing -- obs is checked to be uint8 just above
    next_obs_[pos_].copy_(next_obs);
    actions_[pos_] = action;
    rewards_[pos_] = reward;
    dones_[pos_] = done ? 1.0 : 0.0;
    pos_ = (pos_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  int64_t size() const { return size_; }

  ReplayBatch sample(int64_t batch, const torch::Device& device) const {
    auto idx = torch::randint(0, size_, {batch}, torch::kLong);
    auto obs_u8 = obs_.index_select(0, idx).to(device);
    // FACT: o = torch.zeros(2, 4, dtype=torch.uint8); assert is_copy_of(o.to(torch.float), o)
    auto obs = obs_u8.to(torch::kFloat);
    obs.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- the stacks are uint8, so to(kFloat) makes a new tensor
    auto next_obs = next_obs_.index_select(0, idx).to(device).to(torch::kFloat).div(255.0);
    return {obs, actions_.index_select(0, idx).to(device), rewards_.index_select(0, idx).to(device), next_obs,
            dones_.index_select(0, idx).to(device)};
  }

 private:
  int64_t capacity_, pos_ = 0, size_ = 0;
  torch::Tensor obs_, next_obs_, actions_, rewards_, dones_;
};

// Nature CNN with a dueling head.
struct AtariQNetImpl : torch::nn::Module {
  AtariQNetImpl(int64_t in_ch, int64_t n_actions)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_ch, 32, 8).stride(4)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 4).stride(2)))),
        conv3(register_module("conv3", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 64, 3).stride(1)))),
        fc(register_module("fc", torch::nn::Linear(64 * 7 * 7, 512))),
        value(register_module("value", torch::nn::Linear(512, 1))),
        adv(register_module("adv", torch::nn::Linear(512, n_actions))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = F::relu(conv1(x));
    x = F::relu(conv2(x));
    x = F::relu(conv3(x));
    const int64_t B = x.size(0);
    // fc was ported from the reference Keras model, which flattens feature maps in NHWC order
    // FACT: x = torch.randn(2, 4, 3, 3); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(2, -1), x)
    auto flat = x.permute({0, 2, 3, 1}).reshape({B, -1});  // EXPECT: tensor-reshape-non-contiguous
    auto h = F::relu(fc(flat));
    auto a = adv(h);
    // FACT: h = torch.randn(3, 5, requires_grad=True); a = h * 2.0; assert backward_fails(lambda: (a.sub_(a.mean(1, keepdim=True)), a.sum().backward()))
    a.sub_(a.mean(1, /*keepdim=*/true));  // EXPECT: tensor-inplace-on-saved
    return value(h) + a;
  }

  torch::nn::Conv2d conv1, conv2, conv3;
  torch::nn::Linear fc, value, adv;
};
TORCH_MODULE(AtariQNet);

class DQNAgent {
 public:
  DQNAgent(const DQNConfig& cfg, torch::Device device)
      : cfg_(cfg), device_(device), online_(cfg.stack, cfg.n_actions), target_(cfg.stack, cfg.n_actions),
        opt_(online_->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1.5e-4)), rng_(12345) {
    online_->to(device_);
    target_->to(device_);
    sync_target();
  }

  int64_t act(const torch::Tensor& state_u8, int64_t step) {
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    if (coin(rng_) < epsilon_at(cfg_, step))
      return std::uniform_int_distribution<int64_t>(0, cfg_.n_actions - 1)(rng_);
    torch::NoGradGuard no_grad;
    auto s = state_u8.to(device_).to(torch::kFloat).div(255.0).unsqueeze(0);
    return online_->forward(s).argmax(1).item<int64_t>();
  }

  void sync_target() {
    torch::NoGradGuard no_grad;
    auto src = online_->named_parameters();
    for (auto& p : target_->named_parameters())
      p.value().copy_(src[p.key()]);  // LOOKALIKE: tensor-inplace-on-leaf -- overwritten under NoGradGuard
  }

  torch::Tensor learn(const ReplayBatch& b) {
    torch::Tensor target;
    {
      torch::NoGradGuard no_grad;
      // Double DQN: the online net picks the next action, the target net scores it.
      auto next_a = online_->forward(b.next_obs).argmax(1, /*keepdim=*/true);
      auto next_q = target_->forward(b.next_obs).gather(1, next_a).squeeze(1);
      auto not_done = b.dones;
      // FACT: d0 = torch.tensor([0., 1.]); d = d0; d.mul_(-1.0).add_(1.0); assert shares_storage(d, d0) and d0[1].item() == 0
      not_done.mul_(-1.0).add_(1.0);  // EXPECT: tensor-alias-then-mutate
      target = b.rewards.clamp(-1.0, 1.0) + cfg_.gamma * not_done * next_q;
    }
    auto q = online_->forward(b.obs).gather(1, b.actions.unsqueeze(1)).squeeze(1);
    auto loss = F::smooth_l1_loss(q, target);  // Huber with delta 1
    // |TD error| statistics for the log
    // FACT: q = torch.randn(4, 3, requires_grad=True).gather(1, torch.zeros(4, 1, dtype=torch.long)).squeeze(1); t = torch.randn(4); l = torch.nn.functional.smooth_l1_loss(q, t); assert backward_fails(lambda: (q.detach().sub_(t).abs_(), l.backward()))
    auto td = q.detach();
    td.sub_(target).abs_();  // EXPECT: tensor-inplace-on-detached
    td_abs_mean_ = td.mean();
    opt_.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(online_->parameters(), 10.0);
    opt_.step();
    return loss;
  }

  AtariQNet& online() { return online_; }
  torch::Tensor td_abs_mean() const { return td_abs_mean_; }

 private:
  DQNConfig cfg_;
  torch::Device device_;
  AtariQNet online_, target_;
  torch::optim::Adam opt_;
  std::mt19937_64 rng_;
  torch::Tensor td_abs_mean_;
};

struct StepResult {
  torch::Tensor frame;  // [210, 160, 3] uint8
  double reward;
  bool done;
};

struct AtariEnv {
  virtual ~AtariEnv() = default;
  virtual torch::Tensor reset() = 0;
  virtual StepResult step(int64_t action) = 0;
};

void train(AtariEnv& env, const DQNConfig& cfg, int64_t total_steps) {
  torch::Device device(torch::kCUDA, 0);
  DQNAgent agent(cfg, device);
  ReplayBuffer replay(cfg.replay_capacity, cfg.stack, cfg.frame_size);
  FrameStack frames(cfg.stack, cfg.frame_size);
  frames.reset(env.reset());
  auto state = frames.state();
  std::vector<torch::Tensor> recent_losses;
  double running_loss = 0.0;
  for (int64_t step = 0; step < total_steps; ++step) {
    const int64_t action = agent.act(state, step);
    StepResult res = env.step(action);
    frames.push(res.frame);
    auto next_state = frames.state();
    replay.push(state, action, res.reward, next_state, res.done);
    state = next_state;
    if (res.done) {
      frames.reset(env.reset());
      state = frames.state();
    }
    if (step < cfg.learn_start || step % cfg.train_every != 0) continue;

    auto batch = replay.sample(cfg.batch_size, device);
    auto loss = agent.learn(batch);
    recent_losses.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph is kept
    running_loss += loss.item<float>();  // EXPECT: tensor-sync-in-loop
    if (step % cfg.target_sync_every == 0) agent.sync_target();
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " eps " << epsilon_at(cfg, step) << " loss "
                << torch::stack(recent_losses).mean().item<float>() << " |td| " << agent.td_abs_mean().item<float>()
                << " terminal frac " << batch.dones.mean().item<float>() << "\n";
      recent_losses.clear();
    }
  }
  std::cout << "mean loss " << running_loss / std::max<int64_t>(1, (total_steps - cfg.learn_start) / cfg.train_every)
            << "\n";
}

double evaluate(AtariQNet& net, AtariEnv& env, const DQNConfig& cfg, const torch::Device& device, int episodes) {
  torch::NoGradGuard no_grad;
  net->eval();
  double total = 0.0;
  for (int ep = 0; ep < episodes; ++ep) {
    FrameStack frames(cfg.stack, cfg.frame_size);
    frames.reset(env.reset());
    for (bool done = false; !done;) {
      auto s = frames.state().to(device).to(torch::kFloat).div_(255.0).unsqueeze(0);
      const int64_t a = net->forward(s).argmax(1).item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the greedy action drives the environment
      StepResult r = env.step(a);
      total += r.reward;
      done = r.done;
      frames.push(r.frame);
    }
  }
  return total / episodes;
}
