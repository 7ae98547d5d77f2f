// Discrete-action Soft Actor-Critic for Atari (Christodoulou, 2019).
// Twin critics with polyak-averaged targets, a categorical actor over the
// game's legal actions and an automatically tuned entropy temperature.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

namespace F = torch::nn::functional;

struct SacConfig {
  int64_t n_actions = 18;
  int64_t frame_stack = 4, frame_size = 84;
  int64_t buffer_capacity = 200000, batch_size = 64;
  int64_t learning_starts = 20000, updates_per_step = 1, log_every = 5000;
  double gamma = 0.99, tau = 0.005, lr = 3e-4;
  double target_entropy_scale = 0.98, act_temperature = 1.0;
};

// Nature-DQN torso followed by an MLP head; the actor and both critics share it.
struct AtariNetImpl : torch::nn::Module {
  AtariNetImpl(int64_t in_ch, int64_t n_out)
      : c1(torch::nn::Conv2dOptions(in_ch, 32, 8).stride(4)),
        c2(torch::nn::Conv2dOptions(32, 64, 4).stride(2)),
        c3(torch::nn::Conv2dOptions(64, 64, 3).stride(1)),
        fc(7 * 7 * 64, 512),
        head(512, n_out) {
    register_module("c1", c1), register_module("c2", c2), register_module("c3", c3);
    register_module("fc", fc), register_module("head", head);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(c1(x));
    x = torch::relu(c2(x));
    x = torch::relu(c3(x));
    // FACT: x = torch.relu(torch.nn.Conv2d(4, 8, 3)(torch.randn(2, 4, 9, 9))); assert is_view_of(x.view(2, -1), x)
    x = x.view({x.size(0), -1});  // LOOKALIKE: tensor-view-non-contiguous -- conv + relu output is a contiguous NCHW map
    return head(torch::relu(fc(x)));
  }

  torch::nn::Conv2d c1{nullptr}, c2{nullptr}, c3{nullptr};
  torch::nn::Linear fc{nullptr}, head{nullptr};
};
TORCH_MODULE(AtariNet);

// Uniform replay of (s, a, r, s', done); frames are kept as bytes to fit in memory.
class FrameReplay {
 public:
  struct Batch { torch::Tensor obs, actions, rewards, next_obs, dones; };

  FrameReplay(int64_t capacity, int64_t stack, int64_t size)
      : capacity_(capacity),
        obs_(torch::zeros({capacity, stack, size, size}, torch::kByte)),
        next_obs_(torch::zeros({capacity, stack, size, size}, torch::kByte)),
        actions_(torch::zeros({capacity}, torch::kLong)),
        rewards_(torch::zeros({capacity})),
        dones_(torch::zeros({capacity})) {
    TORCH_CHECK(obs_.scalar_type() == torch::kByte && next_obs_.scalar_type() == torch::kByte);
  }

  // The env wrapper hands over float frame stacks scaled to [0, 1].
  void add(const torch::Tensor& obs, int64_t action, double reward,
           const torch::Tensor& next_obs, bool done) {
    obs_[pos_].copy_(obs.mul(255.0).round());  // LOOKALIKE: tensor-copy-narrowing -- rounded whole numbers in [0, 255]
    next_obs_[pos_].copy_(next_obs);           // EXPECT: tensor-copy-narrowing
    actions_[pos_] = action;
    rewards_[pos_] = reward;
    dones_[pos_] = done ? 1.0 : 0.0;
    pos_ = (pos_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  Batch sample(int64_t n) const {
    auto idx = torch::randint(size_, {n}, torch::kLong);
    // FACT: buf = torch.zeros(8, 2, dtype=torch.uint8); o = buf.index_select(0, torch.tensor([1, 3])).to(torch.float32); assert is_copy_of(o, buf)
    auto o = obs_.index_select(0, idx).to(torch::kFloat);
    o.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers fresh bytes and to(kFloat) converts them again
    auto next = next_obs_.index_select(0, idx).to(torch::kFloat).div(255.0);
    return Batch{o, actions_.index_select(0, idx), rewards_.index_select(0, idx), next,
                 dones_.index_select(0, idx)};
  }

 private:
  int64_t capacity_, pos_ = 0, size_ = 0;
  torch::Tensor obs_, next_obs_, actions_, rewards_, dones_;
};

struct ActorOut { torch::Tensor loss, entropy, probs, log_probs; };

class DiscreteSac {
 public:
  DiscreteSac(const SacConfig& cfg, torch::Device device, const std::vector<int64_t>& legal_actions)
      : cfg_(cfg), device_(device), actor_(cfg.frame_stack, cfg.n_actions),
        q1_(cfg.frame_stack, cfg.n_actions), q2_(cfg.frame_stack, cfg.n_actions),
        q1_targ_(cfg.frame_stack, cfg.n_actions), q2_targ_(cfg.frame_stack, cfg.n_actions) {
    for (auto* net : {&actor_, &q1_, &q2_, &q1_targ_, &q2_targ_}) (*net)->to(device_);
    polyak(*q1_, *q1_targ_, 1.0);
    polyak(*q2_, *q2_targ_, 1.0);
    log_alpha_ = torch::zeros({1}, torch::TensorOptions().device(device_).requires_grad(true));
    target_entropy_ = cfg.target_entropy_scale * std::log(static_cast<double>(cfg.n_actions));
    auto legal = torch::zeros({cfg.n_actions}, torch::kBool);
    for (int64_t a : legal_actions) legal[a] = true;
    action_mask_ = legal.to(device_);
    std::vector<torch::Tensor> critic_params = q1_->parameters();
    for (const auto& p : q2_->parameters()) critic_params.push_back(p);
    critic_opt_ = std::make_unique<torch::optim::Adam>(critic_params, torch::optim::AdamOptions(cfg.lr));
    actor_opt_ = std::make_unique<torch::optim::Adam>(actor_->parameters(), torch::optim::AdamOptions(cfg.lr));
    alpha_opt_ = std::make_unique<torch::optim::Adam>(std::vector<torch::Tensor>{log_alpha_},
                                                      torch::optim::AdamOptions(cfg.lr));
  }

  torch::Tensor alpha() const { return log_alpha_.exp().detach(); }
  double last_entropy() const { return last_entropy_; }

  int64_t act(const torch::Tensor& state, bool greedy) {
    auto logits = actor_->forward(state.unsqueeze(0).to(device_));
    auto scaled = logits.detach();
    scaled.div_(cfg_.act_temperature).masked_fill_(action_mask_.logical_not(), -1e9);  // EXPECT: tensor-inplace-on-detached
    const int64_t a = greedy ? scaled.argmax(-1).item<int64_t>()
                             : torch::softmax(scaled, -1).multinomial(1).item<int64_t>();
    // Entropy of the untempered policy, printed with the episode return.
    auto logp = F::log_softmax(logits, F::LogSoftmaxFuncOptions(-1));
    last_entropy_ = -(logp.exp() * logp).sum().item<double>();
    return a;
  }

  torch::Tensor critic_target(const torch::Tensor& rewards, const torch::Tensor& dones,
                              const torch::Tensor& next_obs) {
    torch::NoGradGuard no_grad;
    auto next_logits = actor_->forward(next_obs).masked_fill(action_mask_.logical_not(), -1e9);
    auto next_logp = F::log_softmax(next_logits, F::LogSoftmaxFuncOptions(-1));
    auto next_p = next_logp.exp();
    auto min_q_next = torch::min(q1_targ_->forward(next_obs), q2_targ_->forward(next_obs));
    auto v_next = (next_p * (min_q_next - alpha() * next_logp)).sum(-1);
    torch::Tensor y = rewards;
    // FACT: r = torch.rand(4); y = r; y += 0.99 * torch.rand(4); assert shares_storage(y, r)
    y += cfg_.gamma * (1.0 - dones) * v_next;  // EXPECT: tensor-alias-then-mutate
    return y;
  }

  torch::Tensor critic_loss(const torch::Tensor& obs, const torch::Tensor& actions,
                            const torch::Tensor& rewards, const torch::Tensor& next_obs,
                            const torch::Tensor& dones) {
    auto y = critic_target(rewards, dones, next_obs);
    auto a = actions.unsqueeze(1);
    auto q1 = q1_->forward(obs).gather(1, a).squeeze(1);
    auto q2 = q2_->forward(obs).gather(1, a).squeeze(1);
    return F::mse_loss(q1, y) + F::mse_loss(q2, y);
  }

  void step_critic(const torch::Tensor& loss) { apply(*critic_opt_, loss); }

  ActorOut actor_loss(const torch::Tensor& obs) {
    auto logits = actor_->forward(obs);
    auto probs = F::softmax(logits, F::SoftmaxFuncOptions(-1));
    auto log_probs = F::log_softmax(logits, F::LogSoftmaxFuncOptions(-1));
    probs.masked_fill_(action_mask_.logical_not(), 0.0);  // EXPECT: tensor-inplace-on-saved
    // The critics only score the actions here; centre them per state.
    auto q_pi = torch::min(q1_->forward(obs), q2_->forward(obs)).detach();
    q_pi.sub_(q_pi.mean(-1, true));  // LOOKALIKE: tensor-inplace-on-detached -- detached from a temporary nobody else holds
    auto loss = (probs * (alpha() * log_probs - q_pi)).sum(-1).mean();
    return ActorOut{loss, -(probs * log_probs).sum(-1).mean(), probs, log_probs};
  }

  void step_actor(const torch::Tensor& loss) { apply(*actor_opt_, loss); }

  // J(alpha) = E_s[ pi(s)^T (-alpha (log pi(s) + H_target)) ]
  void step_alpha(const ActorOut& out) {
    auto w = out.probs.detach();
    auto alpha_loss = (w * (-log_alpha_ * (out.log_probs.detach() + target_entropy_))).sum(-1).mean();
    apply(*alpha_opt_, alpha_loss);
    log_alpha_.clamp_(-10.0, 2.0);  // EXPECT: tensor-inplace-on-leaf
  }

  void soft_update() { polyak(*q1_, *q1_targ_, cfg_.tau), polyak(*q2_, *q2_targ_, cfg_.tau); }

  torch::Tensor policy_probs(const torch::Tensor& obs) {
    auto logits = actor_->forward(obs).masked_fill(action_mask_.logical_not(), -1e9);
    return torch::softmax(logits, -1);
  }

 private:
  static void apply(torch::optim::Optimizer& opt, const torch::Tensor& loss) {
    opt.zero_grad();
    loss.backward();
    opt.step();
  }

  static void polyak(torch::nn::Module& online, torch::nn::Module& target, double tau) {
    torch::NoGradGuard no_grad;
    auto src = online.parameters();
    auto dst = target.parameters();
    for (size_t i = 0; i < src.size(); ++i) {
      dst[i].mul_(1.0 - tau).add_(src[i], tau);  // LOOKALIKE: tensor-inplace-on-leaf -- target weights blended under NoGradGuard
    }
  }

  SacConfig cfg_;
  torch::Device device_;
  AtariNet actor_, q1_, q2_, q1_targ_, q2_targ_;
  torch::Tensor log_alpha_, action_mask_;
  double target_entropy_ = 0.0, last_entropy_ = 0.0;
  std::unique_ptr<torch::optim::Adam> critic_opt_, actor_opt_, alpha_opt_;
};

struct StepResult { torch::Tensor frame; double reward = 0.0; bool done = false; };  // frame: [H, W] in [0, 1]

class AtariEnv {
 public:
  virtual ~AtariEnv() = default;
  virtual torch::Tensor reset() = 0;
  virtual StepResult step(int64_t action) = 0;
  virtual std::vector<int64_t> legal_actions() const = 0;
};

// Drops the oldest frame of a [K, H, W] stack and appends the newest one.
torch::Tensor push_frame(const torch::Tensor& stack, const torch::Tensor& frame) {
  const int64_t k = stack.size(0);
  auto next = stack.clone();  // LOOKALIKE: tensor-unnecessary-clone -- written below through views and returned
  // FACT: s = torch.rand(4, 3); n = s.clone(); n.narrow(0, 0, 3).copy_(s.narrow(0, 1, 3)); assert torch.equal(n[:3], s[1:]) and is_copy_of(n, s)
  next.narrow(0, 0, k - 1).copy_(stack.narrow(0, 1, k - 1));  // LOOKALIKE: tensor-inplace-overlap -- reads the old stack, writes its clone
  next[k - 1] = frame;
  return next;
}

// KL(pi || uniform) on a fixed set of probe states: how far the policy has collapsed.
double policy_drift(DiscreteSac& agent, const std::vector<torch::Tensor>& probes, int64_t n_actions) {
  torch::NoGradGuard no_grad;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto uniform = torch::full({n_actions}, 1.0 / static_cast<double>(n_actions));
  auto kl_total = torch::zeros({}, torch::TensorOptions().device(device));
  for (const auto& s : probes) {
    auto p = agent.policy_probs(s.unsqueeze(0).to(device)).squeeze(0);  // LOOKALIKE: tensor-clone-in-loop -- a different probe state each iteration
    auto ref = uniform.to(device);  // EXPECT: tensor-clone-in-loop
    kl_total += (p * (p.clamp_min(1e-8).log() - ref.log())).sum();  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, nothing is recorded
  }
  return kl_total.item<double>() / static_cast<double>(probes.size());
}

void train(AtariEnv& env, const SacConfig& cfg, int64_t total_steps) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const auto legal = env.legal_actions();
  DiscreteSac agent(cfg, device, legal);
  FrameReplay buffer(cfg.buffer_capacity, cfg.frame_stack, cfg.frame_size);
  std::mt19937 rng(0);
  std::uniform_int_distribution<size_t> pick(0, legal.size() - 1);
  auto state = env.reset().unsqueeze(0).repeat({cfg.frame_stack, 1, 1});
  double episode_return = 0.0, critic_sum = 0.0;
  int64_t n_updates = 0;
  auto entropy_sum = torch::zeros({}, torch::TensorOptions().device(device));
  auto reward_sum = torch::zeros({}, torch::TensorOptions().device(device));

  for (int64_t t = 0; t < total_steps; ++t) {
    const int64_t a = t < cfg.learning_starts ? legal[pick(rng)] : agent.act(state, false);
    auto res = env.step(a);
    auto next_state = push_frame(state, res.frame);
    buffer.add(state, a, res.reward, next_state, res.done);
    episode_return += res.reward;
    if (res.done) {
      std::cout << "t=" << t << " return " << episode_return << " entropy " << agent.last_entropy() << '\n';
      episode_return = 0.0;
      state = env.reset().unsqueeze(0).repeat({cfg.frame_stack, 1, 1});
    } else {
      state = next_state;
    }
    if (t < cfg.learning_starts) continue;

    for (int64_t g = 0; g < cfg.updates_per_step; ++g) {
      auto batch = buffer.sample(cfg.batch_size);
      auto obs = batch.obs.to(device);
      auto rewards = batch.rewards.to(device);
      auto critic_loss = agent.critic_loss(obs, batch.actions.to(device), rewards,
                                           batch.next_obs.to(device), batch.dones.to(device));
      agent.step_critic(critic_loss);
      critic_sum += critic_loss.item<double>();  // EXPECT: tensor-sync-in-loop
      reward_sum += rewards.mean();
      auto out = agent.actor_loss(obs);
      agent.step_actor(out.loss);
      agent.step_alpha(out);
      entropy_sum += out.entropy;  // EXPECT: tensor-graph-kept-across-iterations
      agent.soft_update();
      ++n_updates;
    }

    if (t % cfg.log_every == 0) {
      const double n = static_cast<double>(n_updates);
      std::cout << "t=" << t << " critic " << critic_sum / n << " entropy " << entropy_sum.item<double>() / n  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
                << " reward " << reward_sum.item<double>() / n << " alpha " << agent.alpha().item<double>() << '\n';
      critic_sum = 0.0;
      n_updates = 0;
      entropy_sum = torch::zeros({}, torch::TensorOptions().device(device));
      reward_sum = torch::zeros({}, torch::TensorOptions().device(device));
    }
  }
}
