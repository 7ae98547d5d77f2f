// Rainbow-lite agent: dueling Q-network with factorised NoisyNet layers (no epsilon-greedy),
// n-step returns from a sliding deque, prioritised replay, periodic target sync.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>

namespace F = torch::nn::functional;

struct AgentConfig {
  int64_t obs_dim = 8, num_actions = 4, hidden = 256, n_step = 3, batch_size = 32;
  int64_t buffer_capacity = 100000, learn_start = 1000, target_sync_every = 2000, total_steps = 200000;
  double gamma = 0.99, sigma0 = 0.5, lr = 6.25e-5, priority_alpha = 0.5, sigma_decay = 0.99999;
};

class NoisyLinearImpl : public torch::nn::Module {
 public:
  NoisyLinearImpl(int64_t in_features, int64_t out_features, double sigma0)
      : in_features_(in_features), out_features_(out_features), sigma0_(sigma0) {
    weight_mu_ = register_parameter("weight_mu", torch::empty({out_features, in_features}));
    weight_sigma_ = register_parameter("weight_sigma", torch::empty({out_features, in_features}));
    bias_mu_ = register_parameter("bias_mu", torch::empty({out_features}));
    bias_sigma_ = register_parameter("bias_sigma", torch::empty({out_features}));
    weight_epsilon_ = register_buffer("weight_epsilon", torch::zeros({out_features, in_features}));
    bias_epsilon_ = register_buffer("bias_epsilon", torch::zeros({out_features}));
    reset_parameters();
    reset_noise();
  }

  void reset_parameters() {
    torch::NoGradGuard no_grad;
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
    weight_mu_.uniform_(-bound, bound);  // LOOKALIKE: tensor-inplace-on-leaf -- initialised under NoGradGuard
    bias_mu_.uniform_(-bound, bound);
    weight_sigma_.fill_(sigma0_ / std::sqrt(static_cast<double>(in_features_)));
    bias_sigma_.fill_(sigma0_ / std::sqrt(static_cast<double>(out_features_)));
  }

  // Factorised Gaussian noise: eps_w = f(eps_out) f(eps_in)^T, eps_b = f(eps_out).
  void reset_noise() {
    auto eps_in = scaled_noise(in_features_);
    auto eps_out = scaled_noise(out_features_);
    auto outer = eps_out.unsqueeze(1).expand({out_features_, in_features_});
    // FACT: e = torch.randn(5).unsqueeze(1).expand(5, 3); assert raises(lambda: e.mul_(torch.randn(3)), "more than one element of the written-to tensor")
    outer.mul_(eps_in);  // EXPECT: tensor-inplace-on-expanded
    weight_epsilon_.copy_(outer);  // LOOKALIKE: tensor-inplace-on-leaf -- a registered buffer, not a parameter
    bias_epsilon_.copy_(eps_out);
  }

  // Late in training some runs shrink the learnt noise scale a little every update.
  void anneal_sigma(double factor) {
    weight_sigma_.mul_(factor);  // EXPECT: tensor-inplace-on-leaf
    bias_sigma_ *= factor;  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    if (is_training()) {
      auto w = weight_mu_ + weight_sigma_ * weight_epsilon_;
      auto b = bias_mu_ + bias_sigma_ * bias_epsilon_;
      return F::linear(x, w, b);
    }
    return F::linear(x, weight_mu_, bias_mu_);
  }

 private:
  static torch::Tensor scaled_noise(int64_t n) {
    auto x = torch::randn({n});
    return x.sign() * x.abs().sqrt();
  }

  int64_t in_features_, out_features_;
  double sigma0_;
  torch::Tensor weight_mu_, weight_sigma_, bias_mu_, bias_sigma_;
  torch::Tensor weight_epsilon_, bias_epsilon_;
};
TORCH_MODULE(NoisyLinear);

struct DuelingNoisyNetImpl : torch::nn::Module {
  explicit DuelingNoisyNetImpl(const AgentConfig& cfg)
      : feature(register_module("feature", torch::nn::Linear(cfg.obs_dim, cfg.hidden))),
        value_hidden(register_module("value_hidden", NoisyLinear(cfg.hidden, cfg.hidden, cfg.sigma0))),
        value_out(register_module("value_out", NoisyLinear(cfg.hidden, 1, cfg.sigma0))),
        adv_hidden(register_module("adv_hidden", NoisyLinear(cfg.hidden, cfg.hidden, cfg.sigma0))),
        adv_out(register_module("adv_out", NoisyLinear(cfg.hidden, cfg.num_actions, cfg.sigma0))) {}

  torch::Tensor forward(torch::Tensor obs) {
    // FACT: o = torch.randn(32, 4, 8); assert is_view_of(o.flatten(1), o)
    auto h = feature->forward(obs.flatten(1));  // LOOKALIKE: tensor-reshape-non-contiguous -- stacked observations are contiguous: a view
    h.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    auto v = value_out->forward(torch::relu(value_hidden->forward(h)));
    auto adv = adv_out->forward(torch::relu(adv_hidden->forward(h)));
    adv.sub_(adv.mean(1, /*keepdim=*/true));  // EXPECT: tensor-inplace-on-saved
    return v + adv;
  }

  void reset_noise() {
    value_hidden->reset_noise();
    value_out->reset_noise();
    adv_hidden->reset_noise();
    adv_out->reset_noise();
  }

  void anneal_sigma(double factor) {
    for (auto* layer : {&value_hidden, &value_out, &adv_hidden, &adv_out}) (*layer)->anneal_sigma(factor);
  }

  torch::nn::Linear feature;
  NoisyLinear value_hidden, value_out, adv_hidden, adv_out;
};
TORCH_MODULE(DuelingNoisyNet);

struct Batch {
  torch::Tensor obs, action, reward, next_obs, done, discount, weights, indices;
};

class PrioritizedReplay {
 public:
  PrioritizedReplay(int64_t capacity, int64_t obs_dim, double alpha) : capacity_(capacity), alpha_(alpha) {
    obs_ = torch::zeros({capacity, obs_dim});
    next_obs_ = torch::zeros({capacity, obs_dim});
    actions_ = torch::zeros({capacity}, torch::kLong);
    rewards_ = torch::zeros({capacity});
    dones_ = torch::zeros({capacity});
    discounts_ = torch::zeros({capacity});
    priorities_ = torch::zeros({capacity});
  }

  void add(const torch::Tensor& obs, int64_t action, double ret, const torch::Tensor& next_obs, bool done,
           double discount) {
    obs_[pos_].copy_(obs);
    next_obs_[pos_].copy_(next_obs);
    actions_[pos_] = action;
    rewards_[pos_] = ret;
    dones_[pos_] = done ? 1.0 : 0.0;
    discounts_[pos_] = discount;
    priorities_[pos_] = max_priority_;
    pos_ = (pos_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  Batch sample(int64_t n, double beta) {
    auto probs = priorities_.narrow(0, 0, size_);
    probs = probs.pow(alpha_);
    // FACT: pr = torch.rand(10); p = pr.narrow(0, 0, 6); p = p.pow(0.6); assert is_copy_of(p, pr)
    probs.div_(probs.sum());  // LOOKALIKE: tensor-alias-then-mutate -- 'probs' was rebound to pow()'s fresh result
    auto idx = torch::multinomial(probs, n, /*replacement=*/true);
    Batch b;
    b.obs = obs_.index_select(0, idx);
    b.next_obs = next_obs_.index_select(0, idx);
    b.action = actions_.index_select(0, idx);
    b.reward = rewards_.index_select(0, idx);
    b.done = dones_.index_select(0, idx);
    b.discount = discounts_.index_select(0, idx);
    auto w = (probs.index_select(0, idx) * static_cast<double>(size_)).pow(-beta);
    b.weights = w / w.max();
    b.indices = idx;
    return b;
  }

  void update_priorities(const torch::Tensor& indices, const torch::Tensor& prio) {
    priorities_.index_put_({indices}, prio);
    max_priority_ = std::max(max_priority_, prio.max().item<double>());
  }

  int64_t size() const { return size_; }

 private:
  int64_t capacity_;
  double alpha_;
  int64_t pos_ = 0, size_ = 0;
  double max_priority_ = 1.0;
  torch::Tensor obs_, next_obs_, actions_, rewards_, dones_, discounts_, priorities_;
};

struct StepResult { torch::Tensor obs; double reward; bool done; };

class Env {
 public:
  virtual ~Env() = default;
  virtual torch::Tensor reset() = 0;
  virtual StepResult step(int64_t action) = 0;
};

struct Transition { torch::Tensor obs; int64_t action; double reward; torch::Tensor next_obs; bool done; };

class RainbowAgent {
 public:
  explicit RainbowAgent(const AgentConfig& cfg)
      : cfg_(cfg),
        online_(cfg),
        target_(cfg),
        opt_(online_->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1.5e-4)),
        replay_(cfg.buffer_capacity, cfg.obs_dim, cfg.priority_alpha) {
    hard_update();
  }

  void hard_update() {
    torch::NoGradGuard no_grad;
    auto dst = target_->parameters();
    auto src = online_->parameters();
    for (size_t i = 0; i < dst.size(); ++i) {
      dst[i].copy_(src[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- target sync under NoGradGuard
    }
  }

  torch::Tensor learn_step(double beta) {
    Batch batch = replay_.sample(cfg_.batch_size, beta);
    auto q_sa = online_->forward(batch.obs).gather(1, batch.action.unsqueeze(1)).squeeze(1);
    torch::Tensor target;
    {
      torch::NoGradGuard no_grad;
      auto next_a = online_->forward(batch.next_obs).argmax(1, /*keepdim=*/true);
      auto next_q = target_->forward(batch.next_obs).gather(1, next_a).squeeze(1);
      target = batch.reward;
      // FACT: r = torch.randn(32); t = r; t.add_(torch.randn(32)); assert shares_storage(t, r)
      target.add_(batch.discount * (1.0 - batch.done) * next_q);  // EXPECT: tensor-alias-then-mutate
    }
    auto td = q_sa - target;
    auto per_sample =
        F::huber_loss(q_sa, target, F::HuberLossFuncOptions().reduction(torch::kNone).delta(1.0));
    auto loss = (per_sample * batch.weights).mean();
    auto prio = td.detach().abs();
    prio.add_(1e-6);  // LOOKALIKE: tensor-inplace-on-detached -- abs() returned new storage
    replay_.update_priorities(batch.indices, prio);
    mean_sampled_return_ = batch.reward.mean().item<double>();
    return loss;
  }

  void flush_window(std::deque<Transition>& window, bool episode_end) {
    while (!window.empty()) {
      double ret = 0.0, disc = 1.0;
      for (const auto& tr : window) {
        ret += disc * tr.reward;
        disc *= cfg_.gamma;
        if (tr.done) break;
      }
      const auto& first = window.front();
      const auto& last = window.back();
      replay_.add(first.obs, first.action, ret, last.next_obs, last.done, disc);
      window.pop_front();
      if (!episode_end) break;
    }
  }

  void train(Env& env) {
    std::deque<Transition> window;
    std::vector<torch::Tensor> greedy_q;
    double loss_sum = 0.0;
    int64_t updates = 0;
    auto obs = env.reset();
    for (int64_t step = 1; step <= cfg_.total_steps; ++step) {
      online_->reset_noise();  // fresh noise per step replaces epsilon-greedy exploration
      auto q = online_->forward(obs.unsqueeze(0));
      const int64_t action = q.argmax(1).item<int64_t>();
      greedy_q.push_back(q.max());  // EXPECT: tensor-graph-kept-across-iterations
      StepResult res = env.step(action);
      window.push_back({obs.clone(), action, res.reward, res.obs, res.done});  // LOOKALIKE: tensor-clone-in-loop -- obs changes every step and the copy is kept
      if (static_cast<int64_t>(window.size()) == cfg_.n_step || res.done) flush_window(window, res.done);
      if (replay_.size() >= cfg_.learn_start) {
        const double beta = std::min(1.0, 0.4 + 0.6 * static_cast<double>(step) / cfg_.total_steps);
        auto loss = learn_step(beta);
        opt_.zero_grad();
        loss.backward();
        torch::nn::utils::clip_grad_norm_(online_->parameters(), 10.0);
        opt_.step();
        loss_sum += loss.item<double>();  // LOOKALIKE: tensor-graph-kept-across-iterations -- item() copies out a double
        ++updates;
        online_->anneal_sigma(cfg_.sigma_decay);
      }
      if (step % cfg_.target_sync_every == 0) hard_update();
      obs = res.done ? env.reset() : res.obs;
    }
    if (!greedy_q.empty()) {
      std::cout << "mean max-Q " << torch::stack(greedy_q).mean().item<double>() << ", mean loss "
                << loss_sum / std::max<int64_t>(updates, 1) << ", last sampled return " << mean_sampled_return_
                << "\n";
    }
  }

 private:
  AgentConfig cfg_;
  DuelingNoisyNet online_;
  DuelingNoisyNet target_;
  torch::optim::Adam opt_;
  PrioritizedReplay replay_;
  double mean_sampled_return_ = 0.0;
};

// Deployment check: run the greedy (noise-free) head once on the GPU box.
torch::Tensor probe_on_gpu(DuelingNoisyNet net, int64_t obs_dim) {
  torch::Device gpu(torch::kCUDA);
  net->to(gpu);
  net->eval();
  torch::NoGradGuard no_grad;
  auto probe = torch::zeros({2, obs_dim});
  auto q = net->forward(probe);  // EXPECT: tensor-device-mismatch
  return q.cpu();
}
