// Ape-X actor (Horgan et al., 2018). Each actor process runs its own epsilon, acts with a
// periodically refreshed copy of the learner's dueling network, accumulates n-step
// transitions in a local buffer and computes their initial priorities before shipping
// them to the shared replay server.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

struct ActorConfig {
  int64_t actor_id = 0, num_actors = 256;
  double eps_base = 0.4, eps_alpha = 7.0;
  int64_t n_step = 3, local_buffer_size = 50;
  double gamma = 0.99, priority_eps = 1e-6, priority_alpha = 0.6;
  int64_t frame_size = 84, frame_stack = 4, num_actions = 18;
  int64_t pull_every = 400, target_pull_every = 2500, log_every = 10000;
  int64_t total_steps = 50000000;
  bool use_gpu = true;
};

struct AtariStep {
  const std::vector<float>& frame;
  float reward;
  bool done;
};
struct AtariEnv {
  virtual ~AtariEnv() = default;
  virtual const std::vector<float>& reset() = 0;
  virtual AtariStep step(int64_t action) = 0;
  virtual std::vector<int64_t> minimal_action_set() const = 0;
};

struct TransitionBatch {
  torch::Tensor obs, actions, returns, discounts, priorities;
  int64_t n_step;
};
struct ReplayClient {
  virtual ~ReplayClient() = default;
  virtual void add(TransitionBatch batch) = 0;
};
struct ParameterClient {
  virtual ~ParameterClient() = default;
  virtual bool fetch(const std::string& which, std::vector<torch::Tensor>& out, int64_t& version) = 0;
};

std::unique_ptr<AtariEnv> make_atari(const std::string& game, int64_t seed);
std::unique_ptr<ReplayClient> connect_replay(const std::string& address);
std::unique_ptr<ParameterClient> connect_learner(const std::string& address);

struct DuelingDqnImpl : torch::nn::Module {
  DuelingDqnImpl(int64_t in_channels, int64_t num_actions) {
    features = register_module("features", torch::nn::Sequential(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, 32, 8).stride(4)), torch::nn::ReLU(),
        torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 4).stride(2)), torch::nn::ReLU(),
        torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 64, 3).stride(1)), torch::nn::ReLU(),
        torch::nn::Flatten()));
    value = register_module("value", torch::nn::Sequential(
        torch::nn::Linear(64 * 7 * 7, 512), torch::nn::ReLU(), torch::nn::Linear(512, 1)));
    advantage = register_module("advantage", torch::nn::Sequential(
        torch::nn::Linear(64 * 7 * 7, 512), torch::nn::ReLU(), torch::nn::Linear(512, num_actions)));
  }

  torch::Tensor forward(const torch::Tensor& obs) {
    auto x = obs.to(torch::kFloat32);
    // FACT: o=torch.zeros(1,4,84,84,dtype=torch.uint8); x=o.to(torch.float32); x.div_(255.0); assert is_copy_of(x, o)
    x.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 to float allocates, the stored frames are not touched
    auto h = features->forward(x);
    auto a = advantage->forward(h);
    return value->forward(h) + a - a.mean(1, true);
  }

  torch::nn::Sequential features{nullptr}, value{nullptr}, advantage{nullptr};
};
TORCH_MODULE(DuelingDqn);

struct LocalBuffer {
  LocalBuffer(int64_t capacity, int64_t stack, int64_t size)
      : obs(torch::zeros({capacity, stack, size, size}, torch::kUInt8)),
        actions(torch::zeros({capacity}, torch::kLong)),
        rewards(torch::zeros({capacity})),
        dones(torch::zeros({capacity})) {}

  void add(const torch::Tensor& state, int64_t action, float reward, bool done) {
    obs[count].copy_(state);
    actions[count] = action;
    rewards[count] = reward;
    dones[count] = done ? 1.0f : 0.0f;
    ++count;
  }

  // The last `keep` entries are the n-step lookahead of the next chunk.
  void carry_over(int64_t from, int64_t keep) {
    // FACT: b=torch.arange(10.); b.narrow(0,0,3).copy_(b.narrow(0,7,3)); assert b[:3].tolist() == [7.0, 8.0, 9.0]
    for (auto* t : {&obs, &actions, &rewards, &dones}) t->narrow(0, 0, keep).copy_(t->narrow(0, from, keep));  // LOOKALIKE: tensor-inplace-overlap -- from >= keep, the ranges are disjoint
    count = keep;
  }

  torch::Tensor obs, actions, rewards, dones;
  int64_t count = 0;
};

class ApeXActor {
 public:
  ApeXActor(const ActorConfig& cfg, std::unique_ptr<AtariEnv> env, ParameterClient& learner, ReplayClient& replay)
      : cfg_(cfg), env_(std::move(env)), learner_(learner), replay_(replay),
        device_(cfg.use_gpu && torch::cuda::is_available() ? torch::kCUDA : torch::kCPU),
        online_(cfg.frame_stack, cfg.num_actions), target_(cfg.frame_stack, cfg.num_actions),
        buffer_(cfg.local_buffer_size + cfg.n_step, cfg.frame_stack, cfg.frame_size),
        stack_(torch::zeros({cfg.frame_stack, cfg.frame_size, cfg.frame_size}, torch::kUInt8)),
        rng_(static_cast<uint64_t>(cfg.actor_id) * 7919 + 17) {
    const double exponent = 1.0 + cfg.eps_alpha * cfg.actor_id / std::max<int64_t>(cfg.num_actors - 1, 1);
    epsilon_ = std::pow(cfg.eps_base, exponent);
    legal_ids_ = env_->minimal_action_set();
    legal_ = torch::zeros({cfg.num_actions}, torch::kBool);
    for (auto a : legal_ids_) legal_[a] = true;
    online_->to(device_);
    target_->to(device_);
    online_->eval();
    target_->eval();
  }

  void run() {
    pull_online();
    pull_target();
    reset_episode();
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::uniform_int_distribution<size_t> pick(0, legal_ids_.size() - 1);

    for (int64_t t = 1; t <= cfg_.total_steps; ++t) {
      auto legal = legal_.to(device_);  // EXPECT: tensor-clone-in-loop
      auto state = stack_.unsqueeze(0).to(device_);  // LOOKALIKE: tensor-clone-in-loop -- the stack gets a new frame every step
      auto q = online_->forward(state);
      // FACT: a=torch.randn(1,4,requires_grad=True); q=a - a.mean(1, keepdim=True); q.masked_fill_(torch.tensor([[True,False,False,False]]), -1e9); q.sum().backward()
      q.masked_fill_(legal.logical_not(), -1e9);  // LOOKALIKE: tensor-inplace-on-saved -- the dueling sum's output is not saved for backward

      const int64_t action = coin(rng_) < epsilon_ ? legal_ids_[pick(rng_)]
                                                   : q.argmax(1).item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the environment needs the action now
      q_taken_.push_back(q[0][action]);  // EXPECT: tensor-graph-kept-across-iterations
      max_q_sum_ += q.max().item<double>();  // EXPECT: tensor-sync-in-loop

      const auto out = env_->step(action);
      buffer_.add(stack_, action, std::max(-1.0f, std::min(1.0f, out.reward)), out.done);
      push_frame(out.frame);
      episode_return_ += out.reward;
      if (out.done) {
        std::cout << "[actor " << cfg_.actor_id << "] return " << episode_return_ << " eps " << epsilon_ << "\n";
        reset_episode();
      }

      if (buffer_.count == cfg_.local_buffer_size + cfg_.n_step) flush();
      if (t % cfg_.pull_every == 0) pull_online();
      if (t % cfg_.target_pull_every == 0) pull_target();
      if (t % cfg_.log_every == 0) {
        std::cout << "[actor " << cfg_.actor_id << "] step " << t << " mean max-q "
                  << max_q_sum_ / cfg_.log_every << " mean |td| " << mean_abs_td_ << std::endl;
        max_q_sum_ = 0.0;
      }
    }
  }

 private:
  void reset_episode() {
    const auto& frame = env_->reset();
    auto first = torch::from_blob(const_cast<float*>(frame.data()), {cfg_.frame_size, cfg_.frame_size}, torch::kFloat32)
                     .round().to(torch::kUInt8);
    // FACT: s=torch.zeros(4,6,6); s.copy_(torch.ones(6,6).unsqueeze(0).expand_as(s)); assert s.sum().item() == 144
    stack_.copy_(first.unsqueeze(0).expand_as(stack_));  // LOOKALIKE: tensor-inplace-on-expanded -- only the source is expanded
    episode_return_ = 0.0;
  }

  void push_frame(const std::vector<float>& frame) {
    const int64_t S = cfg_.frame_stack, H = cfg_.frame_size;
    // FACT: assert raises(lambda: (lambda s: s.narrow(0,0,3).copy_(s.narrow(0,1,3)))(torch.zeros(4,6,6,dtype=torch.uint8)), "some elements of the input tensor")
    stack_.narrow(0, 0, S - 1).copy_(stack_.narrow(0, 1, S - 1));  // EXPECT: tensor-inplace-overlap
    auto f = torch::from_blob(const_cast<float*>(frame.data()), {H, H}, torch::kFloat32);
    stack_[S - 1].copy_(f);  // EXPECT: tensor-copy-narrowing
  }

  void pull_online() {
    std::vector<torch::Tensor> latest;
    if (!learner_.fetch("online", latest, online_version_)) return;
    auto params = online_->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].copy_(latest[i]);  // EXPECT: tensor-inplace-on-leaf // LOOKALIKE: tensor-device-mismatch -- copy_ may cross devices
  }

  void pull_target() {
    std::vector<torch::Tensor> latest;
    if (!learner_.fetch("target", latest, target_version_)) return;
    torch::NoGradGuard no_grad;
    auto params = target_->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].copy_(latest[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  void flush() {
    torch::NoGradGuard no_grad;
    const int64_t n = cfg_.n_step, len = buffer_.count - n;
    auto returns = torch::zeros({len});
    auto alive = torch::ones({len});
    for (int64_t k = 0; k < n; ++k) {
      returns += alive * std::pow(cfg_.gamma, k) * buffer_.rewards.narrow(0, k, len);
      alive = alive * (1.0 - buffer_.dones.narrow(0, k, len));
    }
    auto discounts = torch::full({1}, std::pow(cfg_.gamma, n)).expand({len});
    // FACT: assert raises(lambda: torch.full((1,), 0.97).expand(5).mul_(torch.ones(5)), "more than one element")
    discounts.mul_(alive);  // EXPECT: tensor-inplace-on-expanded

    auto next_in = buffer_.obs.narrow(0, n, len).to(device_);
    auto best = online_->forward(next_in).argmax(1, true);
    auto q_next = target_->forward(next_in).gather(1, best).squeeze(1);
    auto targets = returns + discounts * q_next;  // EXPECT: tensor-device-mismatch
    auto q_sa = torch::stack(std::vector<torch::Tensor>(q_taken_.begin(), q_taken_.begin() + len));

    auto abs_td = (targets - q_sa).abs();
    auto priorities = abs_td;
    // FACT: t=torch.rand(5); p=t; p.add_(1e-6).pow_(0.6); assert shares_storage(p, t)
    priorities.add_(cfg_.priority_eps).pow_(cfg_.priority_alpha);  // EXPECT: tensor-alias-then-mutate
    mean_abs_td_ = abs_td.mean().item<double>();

    TransitionBatch batch{buffer_.obs.narrow(0, 0, len + n).clone(), buffer_.actions.narrow(0, 0, len).clone(),  // LOOKALIKE: tensor-unnecessary-clone -- the buffer slots are overwritten by carry_over right after
                          returns, discounts, priorities.to(torch::kCPU).clone(), n};  // EXPECT: tensor-unnecessary-clone
    replay_.add(std::move(batch));

    buffer_.carry_over(len, n);
    q_taken_.erase(q_taken_.begin(), q_taken_.begin() + len);
  }

  ActorConfig cfg_;
  std::unique_ptr<AtariEnv> env_;
  ParameterClient& learner_;
  ReplayClient& replay_;
  torch::Device device_;
  DuelingDqn online_, target_;
  LocalBuffer buffer_;
  torch::Tensor stack_, legal_;
  std::vector<int64_t> legal_ids_;
  std::vector<torch::Tensor> q_taken_;
  std::mt19937_64 rng_;
  double epsilon_ = 0.0, episode_return_ = 0.0, max_q_sum_ = 0.0, mean_abs_td_ = 0.0;
  int64_t online_version_ = -1, target_version_ = -1;
};

int main(int argc, char** argv) {
  ActorConfig cfg;
  if (argc > 1) cfg.actor_id = std::atoll(argv[1]);
  if (argc > 2) cfg.num_actors = std::atoll(argv[2]);
  const std::string learner_addr = argc > 3 ? argv[3] : "localhost:5555";
  const std::string replay_addr = argc > 4 ? argv[4] : "localhost:5556";
  torch::set_num_threads(1);

  auto learner = connect_learner(learner_addr);
  auto replay = connect_replay(replay_addr);
  ApeXActor actor(cfg, make_atari("Breakout", cfg.actor_id), *learner, *replay);
  actor.run();
  return 0;
}
