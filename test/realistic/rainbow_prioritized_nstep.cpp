// Rainbow DQN pieces (Hessel et al. 2018) for Atari: a dueling C51 head on noisy linear layers
// (factorised Gaussian noise, resampled every step), n-step returns from a single environment,
// proportional prioritised replay (sum tree and priorities on the host) with importance-sampling
// weights, double-DQN action selection and the projection of the target distribution onto the
// fixed support. Frames are stored as uint8 to keep a million transitions in memory.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <random>
#include <tuple>
#include <vector>

namespace nn = torch::nn;

struct RainbowConfig {
  int64_t frames = 4, n_actions = 18, atoms = 51, hidden = 512, n_step = 3, batch = 32, capacity = 1 << 20; // 2^k for the tree
  int64_t learn_start = 20000, learn_every = 4, target_every = 8000, total_steps = 50000000;
  double v_min = -10.0, v_max = 10.0, gamma = 0.99, alpha = 0.5, beta0 = 0.4, sigma0 = 0.5;
  double lr = 6.25e-5, adam_eps = 1.5e-4, prio_eps = 1e-6, grad_clip = 10.0;
};

struct NoisyLinearImpl : nn::Module {
  NoisyLinearImpl(int64_t in, int64_t out, double sigma0) : in_(in), out_(out) {
    w_mu = register_parameter("weight_mu", torch::empty({out, in}));
    w_sigma = register_parameter("weight_sigma", torch::empty({out, in}));
    b_mu = register_parameter("bias_mu", torch::empty({out}));
    b_sigma = register_parameter("bias_sigma", torch::empty({out}));
    w_eps = register_buffer("weight_epsilon", torch::zeros({out, in}));
    b_eps = register_buffer("bias_epsilon", torch::zeros({out}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    {
      torch::NoGradGuard no_grad;
      // FACT: w = torch.nn.Parameter(torch.empty(3, 4)); exec('with torch.no_grad(): w.uniform_(-0.5, 0.5)'); assert w.is_leaf and w.requires_grad
      w_mu.uniform_(-bound, bound); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      b_mu.uniform_(-bound, bound);
      w_sigma.fill_(sigma0 * bound);
      b_sigma.fill_(sigma0 * bound);
    }
    reset_noise();
  }
  static torch::Tensor scaled_noise(int64_t n) { auto x = torch::randn({n}); return x.sign() * x.abs().sqrt(); }
  // Factorised noise: in + out samples instead of in * out.
  void reset_noise() {
    auto e_in = scaled_noise(in_), e_out = scaled_noise(out_);
    w_eps.copy_(e_out.ger(e_in)); // LOOKALIKE: tensor-inplace-on-leaf, tensor-device-mismatch -- a buffer, not a parameter; copy_ from host noise into a GPU buffer is allowed
    b_eps.copy_(e_out);
  }
  torch::Tensor forward(const torch::Tensor &x) {
    if (!is_training())
      return torch::linear(x, w_mu, b_mu);
    return torch::linear(x, w_mu + w_sigma * w_eps, b_mu + b_sigma * b_eps);
  }
  int64_t in_, out_;
  torch::Tensor w_mu, w_sigma, b_mu, b_sigma, w_eps, b_eps;
};
TORCH_MODULE(NoisyLinear);

struct RainbowNetImpl : nn::Module {
  explicit RainbowNetImpl(const RainbowConfig &cfg) : n_actions_(cfg.n_actions), atoms_(cfg.atoms) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(cfg.frames, 32, 8).stride(4)));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 4).stride(2)));
    conv3 = register_module("conv3", nn::Conv2d(nn::Conv2dOptions(64, 64, 3)));
    v_hidden = register_module("v_hidden", NoisyLinear(3136, cfg.hidden, cfg.sigma0));
    v_out = register_module("v_out", NoisyLinear(cfg.hidden, cfg.atoms, cfg.sigma0));
    a_hidden = register_module("a_hidden", NoisyLinear(3136, cfg.hidden, cfg.sigma0));
    a_out = register_module("a_out", NoisyLinear(cfg.hidden, cfg.n_actions * cfg.atoms, cfg.sigma0));
  }
  // frames [B, k, 84, 84] in [0, 1] -> log-probabilities over the atoms, [B, A, atoms]
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::relu(conv3(torch::relu(conv2(torch::relu(conv1(x))))));
    // FACT: h = torch.relu(torch.nn.Conv2d(4, 8, 3)(torch.randn(2, 4, 9, 9))); assert is_view_of(h.view(2, -1), h)
    h = h.view({h.size(0), -1}); // LOOKALIKE: tensor-view-non-contiguous -- a conv output is contiguous
    auto v = v_out(torch::relu(v_hidden(h))).view({-1, 1, atoms_});
    // FACT: a = torch.nn.functional.linear(torch.randn(2, 8), torch.randn(12, 8), torch.randn(12)); assert is_view_of(a.view(-1, 3, 4), a)
    auto a = a_out(torch::relu(a_hidden(h))).view({-1, n_actions_, atoms_}); // LOOKALIKE: tensor-view-non-contiguous -- a linear output is contiguous
    return torch::log_softmax(v + a - a.mean(1, /*keepdim=*/true), 2);
  }
  void reset_noise() {
    for (auto *layer : {&v_hidden, &v_out, &a_hidden, &a_out})
      (*layer)->reset_noise();
  }
  int64_t n_actions_, atoms_;
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  NoisyLinear v_hidden{nullptr}, v_out{nullptr}, a_hidden{nullptr}, a_out{nullptr};
};
TORCH_MODULE(RainbowNet);

// Leaves hold p_i^alpha, inner nodes the sums of their children; node 1 is the root.
struct SumTree {
  explicit SumTree(int64_t cap) : cap_(cap), nodes_(2 * cap, 0.0) {}
  void set(int64_t i, double p) {
    const double d = p - nodes_[i + cap_];
    for (int64_t k = i + cap_; k >= 1; k /= 2)
      nodes_[k] += d;
  }
  double get(int64_t i) const { return nodes_[i + cap_]; }
  double total() const { return nodes_[1]; }
  int64_t find(double mass) const {
    int64_t k = 1;
    while (k < cap_) {
      k *= 2;
      if (mass > nodes_[k])
        mass -= nodes_[k++];
    }
    return k - cap_;
  }
  int64_t cap_;
  std::vector<double> nodes_;
};

struct Batch { torch::Tensor obs, actions, returns, discounts, next_obs, weights; std::vector<int64_t> idx; };

class PrioritizedReplay {
public:
  PrioritizedReplay(const RainbowConfig &cfg, int64_t h, int64_t w)
      : cap_(cfg.capacity), alpha_(cfg.alpha), prio_eps_(cfg.prio_eps), tree_(cfg.capacity) {
    obs_ = torch::zeros({cap_, cfg.frames, h, w}, torch::kUInt8);
    next_obs_ = torch::zeros({cap_, cfg.frames, h, w}, torch::kUInt8);
    actions_ = torch::zeros({cap_}, torch::kLong);
    returns_ = torch::zeros({cap_});
    discounts_ = torch::zeros({cap_}); // gamma^k, or 0 when the episode ended inside the window
  }
  // obs, next_obs: preprocessed frame stacks [k, H, W], floats in [0, 1]
  void add(const torch::Tensor &obs, int64_t action, double ret, double discount, const torch::Tensor &next_obs) {
    // FACT: b = torch.zeros(2, 4, 4, dtype=torch.uint8); f = torch.rand(4, 4) * 0.99; b[0].copy_(f); assert int(b[0].sum()) == 0 and float(f.sum()) > 0
    obs_[ptr_].copy_(obs); // EXPECT: tensor-copy-narrowing -- pixels in [0, 1] truncate to 0 or 1 in the uint8 buffer: the stored frames are black
    next_obs_[ptr_].copy_(next_obs.mul(255.0).round().to(torch::kUInt8)); // LOOKALIKE: tensor-copy-narrowing -- rescaled, rounded and converted explicitly
    actions_[ptr_] = action;
    returns_[ptr_] = ret;
    discounts_[ptr_] = discount;
    tree_.set(ptr_, max_priority_);
    ptr_ = (ptr_ + 1) % cap_;
    size_ = std::min(size_ + 1, cap_);
  }
  // Stratified proportional sampling; weights (N P(i))^-beta, not yet normalised.
  Batch sample(int64_t n, double beta, std::mt19937 &rng) const {
    std::vector<int64_t> idx;
    std::vector<double> w;
    const double seg = tree_.total() / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      std::uniform_real_distribution<double> u(seg * static_cast<double>(i), seg * static_cast<double>(i + 1));
      idx.push_back(tree_.find(u(rng)));
      w.push_back(std::pow(static_cast<double>(size_) * tree_.get(idx.back()) / tree_.total(), -beta));
    }
    auto index = torch::tensor(idx);
    auto frames = obs_.index_select(0, index).to(torch::kFloat);
    // FACT: o = torch.randint(0, 255, (6, 4, 5, 5), dtype=torch.uint8); s = o.index_select(0, torch.tensor([1, 3])); f = s.to(torch.float); f.div_(255.0); assert is_copy_of(s, o) and is_copy_of(f, s)
    frames.div_(255.0); // LOOKALIKE: tensor-alias-then-mutate -- index_select copies and to(kFloat) of uint8 frames converts into new memory
    return {frames, actions_.index_select(0, index), returns_.index_select(0, index), discounts_.index_select(0, index),
            next_obs_.index_select(0, index).to(torch::kFloat).div(255.0), torch::tensor(w).to(torch::kFloat), idx};
  }
  void update_priorities(const std::vector<int64_t> &idx, const torch::Tensor &td) {
    auto p = td.to(torch::kDouble);
    // FACT: td = torch.rand(8); p = td.to(torch.double); p.add_(1e-6).pow_(0.5); assert is_copy_of(p, td)
    p.add_(prio_eps_).pow_(alpha_); // LOOKALIKE: tensor-alias-then-mutate -- to(kDouble) of the float32 losses is a copy
    auto pa = p.accessor<double, 1>();
    for (size_t i = 0; i < idx.size(); ++i) {
      tree_.set(idx[i], pa[static_cast<int64_t>(i)]);
      max_priority_ = std::max(max_priority_, pa[static_cast<int64_t>(i)]);
    }
  }
private:
  int64_t cap_, ptr_ = 0, size_ = 0;
  double alpha_, prio_eps_, max_priority_ = 1.0;
  SumTree tree_;
  torch::Tensor obs_, next_obs_, actions_, returns_, discounts_;
};

// n-step transitions from one environment: R = r_t + g r_{t+1} + ... over n rewards, or fewer
// when the episode ends inside the window (then nothing is bootstrapped).
struct NStepQueue {
  NStepQueue(int64_t n, double gamma) : n_(n), gamma_(gamma) {}
  void push(const torch::Tensor &obs, int64_t action, double reward, const torch::Tensor &next_obs, bool done, PrioritizedReplay &replay) {
    q_.push_back({obs, action, reward});
    while (!q_.empty() && (done || static_cast<int64_t>(q_.size()) == n_)) {
      double ret = 0, g = 1;
      for (const auto &s : q_)
        ret += g * s.reward, g *= gamma_;
      replay.add(q_.front().obs, q_.front().action, ret, done ? 0.0 : g, next_obs);
      q_.pop_front();
    }
  }
  struct Step { torch::Tensor obs; int64_t action; double reward; };
  int64_t n_; double gamma_;
  std::deque<Step> q_;
};

class RainbowLearner {
public:
  RainbowLearner(const RainbowConfig &cfg, torch::Device device)
      : cfg_(cfg), device_(device), online_(cfg), target_(cfg),
        opt_(online_->parameters(), torch::optim::AdamOptions(cfg.lr).eps(cfg.adam_eps)) {
    support_ = torch::linspace(cfg.v_min, cfg.v_max, cfg.atoms).to(device);
    online_->to(device);
    target_->to(device);
    sync_target();
  }
  void sync_target() {
    auto src = online_->named_parameters();
    // FACT: a = torch.nn.Linear(3, 2); b = torch.nn.Linear(3, 2); assert raises(lambda: b.weight.copy_(a.weight), "a leaf Variable that requires grad")
    for (auto &p : target_->named_parameters())
      p.value().copy_(src[p.key()]); // EXPECT: tensor-inplace-on-leaf -- the target's parameters are overwritten with grad mode on
    auto bufs = online_->named_buffers();
    for (auto &b : target_->named_buffers())
      b.value().copy_(bufs[b.key()]); // LOOKALIKE: tensor-inplace-on-leaf -- buffers (the noise samples) do not require grad
  }
  int64_t act(const torch::Tensor &obs) {
    torch::NoGradGuard no_grad;
    online_->reset_noise();
    auto q = (online_->forward(obs.unsqueeze(0).to(device_)).exp() * support_).sum(2);
    return q.argmax(1).item<int64_t>();
  }
  // Target distribution [B, atoms]: the target net's distribution for the online net's greedy
  // action, shifted by the n-step Bellman update and projected back onto the support.
  torch::Tensor project(const torch::Tensor &next_obs, const torch::Tensor &returns, const torch::Tensor &discounts) {
    torch::NoGradGuard no_grad;
    const auto B = next_obs.size(0);
    auto a_star = (online_->forward(next_obs).exp() * support_).sum(2).argmax(1);
    target_->reset_noise();
    auto next_p = target_->forward(next_obs).exp().index({torch::arange(B, a_star.options()), a_star});
    auto tz = support_.unsqueeze(0).expand({B, cfg_.atoms});
    // FACT: s = torch.linspace(-10, 10, 51); tz = s.unsqueeze(0).expand(4, 51); assert raises(lambda: tz.mul_(torch.rand(4, 1)), "more than one element of the written-to tensor refers to a single memory location")
    tz.mul_(discounts.unsqueeze(1)).add_(returns.unsqueeze(1)).clamp_(cfg_.v_min, cfg_.v_max); // EXPECT: tensor-inplace-on-expanded -- every row of tz is the one support vector: it cannot be shifted per sample
    const double dz = (cfg_.v_max - cfg_.v_min) / static_cast<double>(cfg_.atoms - 1);
    auto b = (tz - cfg_.v_min) / dz;
    auto l = b.floor().to(torch::kLong), u = b.ceil().to(torch::kLong);
    // FACT: b = torch.rand(4, 51) * 50; l = b.floor().to(torch.long); l.sub_(1); assert is_copy_of(l, b)
    l.sub_(((u > 0) & (l == u)).to(torch::kLong)); // LOOKALIKE: tensor-alias-then-mutate -- floor() is fresh and its to(kLong) a conversion into new memory
    u.add_(((l < cfg_.atoms - 1) & (l == u)).to(torch::kLong));
    auto m = torch::zeros({B, cfg_.atoms}, next_p.options());
    auto offset = (torch::arange(B, l.options()) * cfg_.atoms).unsqueeze(1);
    // FACT: m = torch.zeros(4, 51); i = torch.randint(0, 51, (4, 51)) + torch.arange(4).unsqueeze(1) * 51; assert is_view_of(m.view(-1), m) and is_view_of(i.view(-1), i)
    m.view({-1}).index_add_(0, (l + offset).view({-1}), (next_p * (u.to(torch::kFloat) - b)).view({-1})); // LOOKALIKE: tensor-view-non-contiguous -- m is a fresh contiguous buffer, the others fresh results
    m.view({-1}).index_add_(0, (u + offset).view({-1}), (next_p * (b - l.to(torch::kFloat))).view({-1}));
    return m;
  }
  // One update from a prioritised batch; returns the per-sample losses for the new priorities.
  torch::Tensor learn(const Batch &batch) {
    auto obs = batch.obs.to(device_), actions = batch.actions.to(device_);
    auto target = project(batch.next_obs.to(device_), batch.returns.to(device_), batch.discounts.to(device_));
    online_->reset_noise();
    auto log_p = online_->forward(obs).index({torch::arange(obs.size(0), actions.options()), actions});
    auto loss_per = -(target * log_p).sum(1);
    auto w = batch.weights.clone(); // EXPECT: tensor-unnecessary-clone -- divided in place right after: batch.weights / batch.weights.max() is one pass
    w.div_(w.max());
    auto loss = (w.to(device_) * loss_per).mean();
    opt_.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(online_->parameters(), cfg_.grad_clip);
    opt_.step();
    return loss_per.detach();
  }
private:
  RainbowConfig cfg_;
  torch::Device device_;
  RainbowNet online_, target_;
  torch::optim::Adam opt_;
  torch::Tensor support_;
};

struct AtariEnv {
  virtual ~AtariEnv() = default;
  virtual torch::Tensor reset() = 0; // uint8 frame stack [k, 84, 84]
  virtual std::tuple<torch::Tensor, double, bool> step(int64_t action) = 0;
};

torch::Tensor preprocess(const torch::Tensor &frames) { return frames.to(torch::kFloat).div(255.0); }

// Greedy evaluation of a snapshot with the noise off (eval mode uses the mean weights).
double evaluate(RainbowNet &net, AtariEnv &env, const RainbowConfig &cfg, int episodes) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  net->to(device);
  net->eval();
  auto support = torch::linspace(cfg.v_min, cfg.v_max, cfg.atoms);
  double total = 0;
  for (int e = 0; e < episodes; ++e) {
    auto obs = preprocess(env.reset());
    for (bool done = false; !done;) {
      auto q = (net->forward(obs.unsqueeze(0).to(device)).exp() * support).sum(2); // EXPECT: tensor-device-mismatch -- the support was made on the host, the distribution is on the GPU
      auto [frame, r, d] = env.step(q.argmax(1).item<int64_t>()); // LOOKALIKE: tensor-sync-in-loop -- the action steers the environment
      total += r;
      done = d;
      obs = preprocess(frame);
    }
  }
  return total / episodes;
}

void train(AtariEnv &env, const RainbowConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  RainbowLearner learner(cfg, device);
  PrioritizedReplay replay(cfg, 84, 84);
  NStepQueue nstep(cfg.n_step, cfg.gamma);
  std::mt19937 rng(7);
  auto obs = preprocess(env.reset());
  double episode_return = 0;
  for (int64_t t = 0; t < cfg.total_steps; ++t) {
    const auto a = learner.act(obs);
    auto [frame, reward, done] = env.step(a);
    auto next_obs = preprocess(frame);
    nstep.push(obs, a, std::clamp(reward, -1.0, 1.0), next_obs, done, replay);
    episode_return += reward;
    obs = done ? preprocess(env.reset()) : next_obs;
    if (done) {
      std::cout << "step " << t << " return " << episode_return << "\n";
      episode_return = 0;
    }
    if (t >= cfg.learn_start && t % cfg.learn_every == 0) {
      const double beta = std::min(1.0, cfg.beta0 + (1.0 - cfg.beta0) * static_cast<double>(t) / static_cast<double>(cfg.total_steps));
      auto batch = replay.sample(cfg.batch, beta, rng);
      auto td = learner.learn(batch);
      replay.update_priorities(batch.idx, td.cpu()); // LOOKALIKE: tensor-sync-in-loop -- the new priorities are data for the host sum tree
      if (t % cfg.target_every == 0)
        learner.sync_target();
    }
  }
}
