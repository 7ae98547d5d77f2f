// Never-Give-Up style exploration: episodic kNN novelty modulated by RND, mixed into a PPO update.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <vector>

namespace F = torch::nn::functional;

namespace ngu {

struct Config {
  int64_t frame_dim = 64, frame_stack = 4, num_actions = 18, embed_dim = 32, hidden = 256;
  int64_t num_envs = 16, rollout_len = 128, memory_capacity = 5000, k_neighbors = 10;
  double kernel_eps = 1e-3, cluster_distance = 8e-3, c_const = 1e-3, max_similarity = 8.0;
  double max_modulation = 5.0, beta = 0.3, gamma_ext = 0.997, gamma_int = 0.99, lam = 0.95;
  double lr = 2.5e-4, clip = 0.1, ent_coef = 0.01;
  int64_t epochs = 4, minibatch = 512;
  int64_t obs_dim() const { return frame_dim * frame_stack; }
};

struct RunningMeanStd {
  torch::Tensor mean, var;
  double count = 1e-4;
  explicit RunningMeanStd(int64_t dim) : mean(torch::zeros({dim})), var(torch::ones({dim})) {}

  void update(const torch::Tensor& x) {
    auto bm = x.mean(0), bv = x.var(0, false);
    const double bc = static_cast<double>(x.size(0)), tot = count + bc;
    auto delta = bm - mean;
    mean = mean + delta * (bc / tot);
    var = (var * count + bv * bc + delta.pow(2) * (count * bc / tot)) / tot;
    count = tot;
  }
  torch::Tensor stdev() const { return var.sqrt().clamp_min(1e-8); }
};

struct FrameStack {
  torch::Tensor frames;

  void push(const torch::Tensor& frame) {
    const int64_t K = frames.size(1);
    // FACT: s=torch.randn(2,4,3); a=s.narrow(1,0,3); b=s.narrow(1,1,3); assert shares_storage(a,b) and not raises(lambda: a.copy_(b))
    frames.narrow(1, 0, K - 1).copy_(frames.narrow(1, 1, K - 1));  // EXPECT: tensor-inplace-overlap
    frames.select(1, K - 1).copy_(frame);
  }
  torch::Tensor get() const { return frames.flatten(1); }
};

class EpisodicMemory {
 public:
  explicit EpisodicMemory(const Config& cfg)
      : cfg_(cfg), memory_(torch::zeros({cfg.memory_capacity, cfg.embed_dim})), dm2_(torch::ones({})) {}

  void reset() { size_ = pos_ = 0; }

  torch::Tensor novelty(const torch::Tensor& emb) {
    auto reward = torch::zeros({}, emb.options());
    if (size_ >= cfg_.k_neighbors) {
      auto d2 = torch::cdist(emb, memory_.narrow(0, 0, size_)).pow(2).squeeze(0);  // EXPECT: tensor-device-mismatch
      auto knn = std::get<0>(d2.topk(cfg_.k_neighbors, -1, /*largest=*/false));
      auto dist = knn;
      // FACT: d=torch.rand(2,7); k=torch.topk(d,3,-1,False)[0]; n=k; n.div_(2.0); assert shares_storage(n,k)
      dist.div_(dm2_ + 1e-8);  // EXPECT: tensor-alias-then-mutate
      auto kernel = cfg_.kernel_eps / ((dist - cfg_.cluster_distance).clamp_min(0.0) + cfg_.kernel_eps);
      auto sim = kernel.sum().sqrt() + cfg_.c_const;
      reward = torch::where(sim.gt(cfg_.max_similarity), torch::zeros_like(sim), 1.0 / sim);
      dm2_ = 0.99 * dm2_ + 0.01 * knn.mean().detach();
    }
    memory_[pos_].copy_(emb.squeeze(0).detach().clone());  // EXPECT: tensor-unnecessary-clone // LOOKALIKE: tensor-device-mismatch -- copy_ may read from another device
    pos_ = (pos_ + 1) % cfg_.memory_capacity;
    size_ = std::min(size_ + 1, cfg_.memory_capacity);
    return reward;
  }

 private:
  Config cfg_;
  torch::Tensor memory_, dm2_;
  int64_t size_ = 0, pos_ = 0;
};

struct EmbeddingNetImpl : torch::nn::Module {
  explicit EmbeddingNetImpl(const Config& c) {
    encoder = register_module("encoder", torch::nn::Sequential(
        torch::nn::Linear(c.obs_dim(), c.hidden), torch::nn::ReLU(), torch::nn::Linear(c.hidden, c.embed_dim)));
    inverse = register_module("inverse", torch::nn::Sequential(
        torch::nn::Linear(2 * c.embed_dim, c.hidden), torch::nn::ReLU(), torch::nn::Linear(c.hidden, c.num_actions)));
  }
  torch::Tensor forward(const torch::Tensor& obs) { return encoder->forward(obs); }
  torch::Tensor inverse_loss(const torch::Tensor& obs, const torch::Tensor& next_obs, const torch::Tensor& actions) {
    auto logits = inverse->forward(torch::cat({forward(obs), forward(next_obs)}, -1));
    return F::cross_entropy(logits, actions);
  }
  torch::nn::Sequential encoder{nullptr}, inverse{nullptr};
};
TORCH_MODULE(EmbeddingNet);

struct RNDImpl : torch::nn::Module {
  explicit RNDImpl(const Config& c) {
    target = register_module("target", torch::nn::Sequential(
        torch::nn::Linear(c.obs_dim(), c.hidden), torch::nn::LeakyReLU(), torch::nn::Linear(c.hidden, c.embed_dim)));
    predictor = register_module("predictor", torch::nn::Sequential(
        torch::nn::Linear(c.obs_dim(), c.hidden), torch::nn::LeakyReLU(), torch::nn::Linear(c.hidden, c.hidden),
        torch::nn::LeakyReLU(), torch::nn::Linear(c.hidden, c.embed_dim)));
    for (auto& p : target->parameters()) {
      p.set_requires_grad(false);
      p.mul_(std::sqrt(2.0));  // LOOKALIKE: tensor-inplace-on-leaf -- requires_grad was switched off on the line above
    }
  }
  torch::Tensor error(const torch::Tensor& obs) {
    auto err = (predictor->forward(obs) - target->forward(obs)).pow(2).sum(-1);
    // FACT: p=torch.randn(4,3,requires_grad=True); e=(p-1).pow(2).sum(-1); e.mul_(0.5); e.mean().backward(); assert p.grad is not None
    err.mul_(0.5);  // LOOKALIKE: tensor-inplace-on-saved -- sum's output is not saved; pow kept its own input
    return err;
  }
  torch::nn::Sequential target{nullptr}, predictor{nullptr};
};
TORCH_MODULE(RND);

struct ActorCriticImpl : torch::nn::Module {
  explicit ActorCriticImpl(const Config& c) {
    torso = register_module("torso", torch::nn::Sequential(torch::nn::Linear(c.obs_dim(), c.hidden), torch::nn::Tanh(),
                                                           torch::nn::Linear(c.hidden, c.hidden), torch::nn::Tanh()));
    pi = register_module("pi", torch::nn::Linear(c.hidden, c.num_actions));
    value = register_module("value", torch::nn::Linear(c.hidden, 2));
    // FACT: l=torch.nn.Linear(4,2); assert raises(lambda: l.weight[1].mul_(0.1), "view of a leaf Variable")
    value->weight[1].mul_(0.1);  // EXPECT: tensor-inplace-on-leaf
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs) {
    auto h = torso->forward(obs);
    return {pi->forward(h), value->forward(h)};
  }
  torch::nn::Sequential torso{nullptr};
  torch::nn::Linear pi{nullptr}, value{nullptr};
};
TORCH_MODULE(ActorCritic);

torch::Tensor gae(const torch::Tensor& rewards, const torch::Tensor& values, const torch::Tensor& not_done,
                  double gamma, double lam) {
  auto adv = torch::zeros_like(rewards);
  auto last = torch::zeros_like(rewards[0]);
  for (int64_t t = rewards.size(0) - 1; t >= 0; --t) {
    auto delta = rewards[t] + gamma * values[t + 1] * not_done[t] - values[t];
    last = delta + gamma * lam * not_done[t] * last;
    adv[t] = last;
  }
  return adv;
}

struct StepResult {
  std::vector<float> frames;
  std::vector<double> rewards;
  std::vector<uint8_t> dones;
};

struct VecEnv {
  virtual ~VecEnv() = default;
  virtual std::vector<float> reset() = 0;
  virtual StepResult step(const torch::Tensor& actions) = 0;
};

class NGUAgent {
 public:
  NGUAgent(const Config& cfg, torch::Device device)
      : cfg_(cfg), device_(device), agent_(cfg), embed_(cfg), rnd_(cfg), obs_rms_(cfg.obs_dim()) {
    agent_->to(device_);
    embed_->to(device_);
    rnd_->to(device_);
    std::vector<torch::Tensor> params = agent_->parameters();
    for (auto& p : embed_->parameters()) params.push_back(p);
    for (auto& p : rnd_->predictor->parameters()) params.push_back(p);
    optimizer_ = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(cfg.lr));
    auto opts = torch::TensorOptions().device(device_);
    const int64_t T = cfg.rollout_len, N = cfg.num_envs;
    obs_ = torch::zeros({T, N, cfg.obs_dim()}, opts);
    actions_ = torch::zeros({T, N}, opts.dtype(torch::kLong));
    logp_ = torch::zeros({T, N}, opts);
    ext_rewards_ = torch::zeros({T, N}, opts);
    dones_ = torch::zeros({T, N}, opts);
    betas_ = torch::linspace(0.0, cfg.beta, N, opts);
    stack_.frames = torch::zeros({N, cfg.frame_stack, cfg.frame_dim}, opts);
    for (int64_t i = 0; i < N; ++i) memories_.emplace_back(cfg);
  }

  void reset(std::vector<float> frames) {
    auto first = torch::from_blob(frames.data(), {cfg_.num_envs, 1, cfg_.frame_dim}, torch::kFloat32);
    stack_.frames.copy_(first.expand_as(stack_.frames));
  }

  float entropy() const { return last_entropy_.defined() ? last_entropy_.item<float>() : 0.f; }

  void collect(VecEnv& envs) {
    const int64_t T = cfg_.rollout_len, N = cfg_.num_envs;
    values_.clear();
    int_rewards_.clear();
    for (int64_t t = 0; t < T; ++t) {
      auto obs = stack_.get();
      obs_[t].copy_(obs);
      torch::Tensor logits, values;
      {
        torch::NoGradGuard no_grad;
        std::tie(logits, values) = agent_->forward(obs);
      }
      values_.push_back(values);  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed inside the NoGradGuard block
      auto action = torch::multinomial(torch::softmax(logits, -1), 1).squeeze(1);
      actions_[t].copy_(action);
      logp_[t].copy_(torch::log_softmax(logits, -1).gather(1, action.unsqueeze(1)).squeeze(1));

      auto res = envs.step(action.to(torch::kCPU));  // LOOKALIKE: tensor-sync-in-loop -- the environments need the actions on the host every step
      ext_rewards_[t].copy_(torch::from_blob(res.rewards.data(), {N}, torch::kFloat64));  // EXPECT: tensor-copy-narrowing
      dones_[t].copy_(torch::from_blob(res.dones.data(), {N}, torch::kUInt8));  // LOOKALIKE: tensor-copy-narrowing -- 0/1 flags are exact in float
      auto frame = torch::from_blob(res.frames.data(), {N, cfg_.frame_dim}, torch::kFloat32).to(device_);  // LOOKALIKE: tensor-clone-in-loop -- a new observation every step
      stack_.push(frame);
      auto next_obs = stack_.get();

      auto norm_obs = ((next_obs - obs_rms_.mean.to(device_)) / obs_rms_.stdev().to(device_)).clamp(-5.0, 5.0);  // EXPECT: tensor-clone-in-loop
      auto lifelong = rnd_->error(norm_obs);
      auto alpha = (1.0 + (lifelong - lifelong.mean()) / (lifelong.std() + 1e-8)).clamp(1.0, cfg_.max_modulation);
      auto emb = embed_->forward(next_obs);
      auto episodic = torch::zeros({N}, emb.options());
      for (int64_t i = 0; i < N; ++i) {
        episodic[i] = memories_[i].novelty(emb[i].unsqueeze(0));
        if (res.dones[i]) memories_[i].reset();
      }
      int_rewards_.push_back(episodic * alpha);  // EXPECT: tensor-graph-kept-across-iterations
    }
    torch::NoGradGuard no_grad;
    values_.push_back(agent_->forward(stack_.get()).second);
    obs_rms_.update(obs_.flatten(0, 1).to(torch::kCPU));
  }

  void update() {
    const int64_t T = cfg_.rollout_len, N = cfg_.num_envs;
    torch::Tensor adv, ret;
    {
      torch::NoGradGuard no_grad;
      auto values = torch::stack(values_);
      auto int_rewards = torch::stack(int_rewards_).detach();
      auto not_done = 1.0 - dones_;
      auto adv_ext = gae(ext_rewards_, values.select(2, 0), not_done, cfg_.gamma_ext, cfg_.lam);
      auto adv_int = gae(int_rewards, values.select(2, 1), torch::ones_like(not_done), cfg_.gamma_int, cfg_.lam);
      ret = torch::stack({adv_ext, adv_int}, -1) + values.narrow(0, 0, T);
      auto beta = betas_.unsqueeze(0).expand({T, N});
      // FACT: b=torch.rand(4).unsqueeze(0).expand(3,4); r=torch.rand(3,4); assert not raises(lambda: r.mul_(b))
      adv_int.mul_(beta);  // LOOKALIKE: tensor-inplace-on-expanded -- beta is only read; adv_int is gae's own buffer
      adv = adv_ext + adv_int;
      // FACT: a=torch.rand(3,4); m=a+a; assert is_copy_of(m,a)
      adv.sub_(adv.mean()).div_(adv.std() + 1e-8);  // LOOKALIKE: tensor-alias-then-mutate -- adv is a fresh sum that nothing else holds
    }

    auto obs = obs_.flatten(0, 1), act = actions_.flatten(0, 1), old_logp = logp_.flatten(0, 1);
    auto adv_f = adv.flatten(), ret_f = ret.flatten(0, 1);
    auto norm_obs = ((obs - obs_rms_.mean.to(device_)) / obs_rms_.stdev().to(device_)).clamp(-5.0, 5.0);
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      auto perm = torch::randperm(T * N, torch::TensorOptions().dtype(torch::kLong).device(device_));
      for (int64_t start = 0; start + cfg_.minibatch <= T * N; start += cfg_.minibatch) {
        auto idx = perm.narrow(0, start, cfg_.minibatch);
        auto [logits, v] = agent_->forward(obs.index_select(0, idx));
        auto logp_all = torch::log_softmax(logits, -1);
        auto probs = torch::softmax(logits, -1);
        auto logp = logp_all.gather(1, act.index_select(0, idx).unsqueeze(1)).squeeze(1);
        auto mb_adv = adv_f.index_select(0, idx);
        auto ratio = torch::exp(logp - old_logp.index_select(0, idx));
        auto surr1 = ratio * mb_adv;
        // FACT: x=torch.randn(5,requires_grad=True); r=torch.exp(x); s=r*torch.randn(5); r.clamp_(0.9,1.1); assert backward_fails(lambda: torch.min(s, r).mean().backward())
        ratio.clamp_(1.0 - cfg_.clip, 1.0 + cfg_.clip);  // EXPECT: tensor-inplace-on-saved
        auto pg_loss = -torch::min(surr1, ratio * mb_adv).mean();
        auto v_loss = (v - ret_f.index_select(0, idx)).pow(2).mean();
        auto entropy = -(probs * logp_all).sum(-1).mean();
        auto p_log = probs.detach();
        // FACT: g=torch.randn(3,4,requires_grad=True); p=torch.softmax(g,-1); e=-(p*torch.log_softmax(g,-1)).sum(); p.detach().clamp_(1e-8,1.0); assert backward_fails(e.backward)
        p_log.clamp_(1e-8, 1.0);  // EXPECT: tensor-inplace-on-detached
        last_entropy_ = -(p_log * p_log.log()).sum(-1).mean();
        auto rnd_loss = rnd_->error(norm_obs.index_select(0, idx)).mean();
        auto loss = pg_loss + 0.5 * v_loss - cfg_.ent_coef * entropy + rnd_loss;
        optimizer_->zero_grad();
        loss.backward();
        optimizer_->step();
      }
    }

    // FACT: o=torch.randn(6,4,3); assert is_view_of(o.narrow(0,1,5).flatten(0,1), o)
    auto next_obs = obs_.narrow(0, 1, T - 1).flatten(0, 1);  // LOOKALIKE: tensor-reshape-non-contiguous -- narrowing the leading time dim keeps the block contiguous
    auto inv_loss = embed_->inverse_loss(obs_.narrow(0, 0, T - 1).flatten(0, 1), next_obs,
                                         actions_.narrow(0, 0, T - 1).flatten(0, 1));
    optimizer_->zero_grad();
    inv_loss.backward();
    optimizer_->step();
  }

 private:
  Config cfg_;
  torch::Device device_;
  ActorCritic agent_;
  EmbeddingNet embed_;
  RND rnd_;
  std::unique_ptr<torch::optim::Adam> optimizer_;
  RunningMeanStd obs_rms_;
  FrameStack stack_;
  std::vector<EpisodicMemory> memories_;
  std::vector<torch::Tensor> values_, int_rewards_;
  torch::Tensor obs_, actions_, logp_, ext_rewards_, dones_, betas_, last_entropy_;
};

void train(VecEnv& envs, const Config& cfg, int64_t iterations) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  NGUAgent agent(cfg, device);
  agent.reset(envs.reset());
  for (int64_t it = 0; it < iterations; ++it) {
    agent.collect(envs);
    agent.update();
    if (it % 10 == 0) std::cout << "iteration " << it << " policy entropy " << agent.entropy() << "\n";
  }
}

}  // namespace ngu
