// AWAC (advantage-weighted actor-critic): pretrain on a logged behaviour dataset, then keep
// running the same update online while fresh transitions are mixed into each batch.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

struct AWACConfig {
  int64_t obs_dim = 12, act_dim = 4, hidden = 256;
  int64_t offline_envs = 50, offline_horizon = 1000;
  int64_t online_capacity = 200000, batch_size = 256;
  int64_t offline_steps = 20000, online_steps = 50000;
  double gamma = 0.99, tau = 5e-3, reward_scale = 1.0;
  double beta = 2.0, max_weight = 100.0;  // advantage temperature and weight clip
  int64_t num_v_samples = 4;  // policy samples per state for V(s)
  double online_fraction = 0.5, offline_weight = 0.5;
  double actor_lr = 3e-4, critic_lr = 3e-4;
  int64_t log_every = 1000, return_window = 20;
};

constexpr double kLogStdMin = -6.0, kLogStdMax = 0.0;
static const double kLog2Pi = std::log(2.0 * M_PI);

torch::nn::Sequential mlp(int64_t in, int64_t hidden, int64_t out) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, out));
}

struct ActorImpl : torch::nn::Module {
  ActorImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden)
      : trunk(register_module("trunk", mlp(obs_dim, hidden, hidden))),
        mean_head(register_module("mean_head", torch::nn::Linear(hidden, act_dim))),
        log_std_head(register_module("log_std_head", torch::nn::Linear(hidden, act_dim))) {}

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs) {
    auto h = torch::relu(trunk->forward(obs));
    auto log_std = torch::tanh(log_std_head->forward(h));
    // FACT: assert backward_fails(lambda: (lambda t: (t.add_(1.0), t.sum().backward()))(torch.randn(3, requires_grad=True).tanh()))
    log_std.add_(1.0).mul_(0.5 * (kLogStdMax - kLogStdMin)).add_(kLogStdMin);  // EXPECT: tensor-inplace-on-saved
    return {mean_head->forward(h), log_std};
  }
  torch::Tensor log_prob(const torch::Tensor& obs, const torch::Tensor& act) {
    auto [mean, log_std] = forward(obs);
    auto z = (act - mean) * torch::exp(-log_std);
    return (-0.5 * z.pow(2) - log_std - 0.5 * kLog2Pi).sum(-1, /*keepdim=*/true);
  }
  torch::Tensor sample(const torch::Tensor& obs) {
    auto [mean, log_std] = forward(obs);
    return (mean + log_std.exp() * torch::randn_like(mean)).clamp(-1.0, 1.0);
  }

  torch::nn::Sequential trunk;
  torch::nn::Linear mean_head, log_std_head;
};
TORCH_MODULE(Actor);

struct CriticImpl : torch::nn::Module {
  CriticImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden)
      : q1(register_module("q1", mlp(obs_dim + act_dim, hidden, 1))),
        q2(register_module("q2", mlp(obs_dim + act_dim, hidden, 1))) {}
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs, const torch::Tensor& act) {
    auto x = torch::cat({obs, act}, -1);
    return {q1->forward(x), q2->forward(x)};
  }
  torch::nn::Sequential q1, q2;
};
TORCH_MODULE(Critic);

struct Batch { torch::Tensor obs, act, rew, next_obs, done, weight; };

class ReplayBuffer {
 public:
  ReplayBuffer(int64_t capacity, int64_t obs_dim, int64_t act_dim) : capacity_(capacity) {
    fields_["observations"] = obs_ = torch::zeros({capacity, obs_dim});
    fields_["actions"] = act_ = torch::zeros({capacity, act_dim});
    fields_["rewards"] = rew_ = torch::zeros({capacity, 1});
    fields_["next_observations"] = next_obs_ = torch::zeros({capacity, obs_dim});
    fields_["terminals"] = done_ = torch::zeros({capacity, 1});
  }

  // Arrays come from the dataset converter (float64, time-major per behaviour env).
  void load(const std::map<std::string, torch::Tensor>& arrays) {
    const int64_t n = arrays.at("rewards").numel();
    for (const auto& [key, arr] : arrays) {
      // FACT: d=torch.randn(6,5,3,dtype=torch.float64); assert raises(lambda: d.transpose(0,1).view(30,-1), 'view size is not compatible')
      auto flat = arr.transpose(0, 1).view({n, -1});  // EXPECT: tensor-view-non-contiguous
      fields_.at(key).narrow(0, 0, n).copy_(flat);  // EXPECT: tensor-copy-narrowing
    }
    size_ = n; ptr_ = n % capacity_;
  }
  void add(const torch::Tensor& obs, const torch::Tensor& act, float rew, const torch::Tensor& next_obs, bool done) {
    obs_[ptr_].copy_(obs); act_[ptr_].copy_(act); next_obs_[ptr_].copy_(next_obs);
    rew_[ptr_].fill_(rew); done_[ptr_].fill_(done ? 1.0 : 0.0);
    ptr_ = (ptr_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }
  Batch sample(int64_t n, torch::Device device) const {
    auto idx = torch::randint(size_, {n}, torch::kLong);
    auto take = [&](const torch::Tensor& t) { return t.index_select(0, idx).to(device); };
    auto weight = torch::ones({1, 1}, torch::TensorOptions().device(device)).expand({n, 1});
    return {take(obs_), take(act_), take(rew_), take(next_obs_), take(done_), weight};
  }
  torch::Tensor observations() const { return obs_.narrow(0, 0, size_); }
  int64_t size() const { return size_; }

 private:
  int64_t capacity_, size_ = 0, ptr_ = 0;
  std::map<std::string, torch::Tensor> fields_;
  torch::Tensor obs_, act_, rew_, next_obs_, done_;
};

Batch concat(const Batch& a, const Batch& b) {
  Batch out{torch::cat({a.obs, b.obs}),           torch::cat({a.act, b.act}),
            torch::cat({a.rew, b.rew}),           torch::cat({a.next_obs, b.next_obs}),
            torch::cat({a.done, b.done}),         torch::cat({a.weight, b.weight})};
  // FACT: w=torch.cat([torch.ones(1,1).expand(3,1), torch.ones(1,1).expand(2,1)]); w.div_(w.mean()); assert is_contiguous(w)
  out.weight.div_(out.weight.mean());  // LOOKALIKE: tensor-inplace-on-expanded -- cat wrote the expanded weights into a new dense tensor
  return out;
}

Batch sample_mixed(const ReplayBuffer& offline, const ReplayBuffer& online, const AWACConfig& cfg, torch::Device device) {
  const auto n_on = std::min<int64_t>(online.size(), cfg.batch_size * cfg.online_fraction);
  auto off = offline.sample(cfg.batch_size - n_on, device);
  if (n_on == 0) return off;
  // FACT: w=torch.ones(1,1).expand(8,1); assert raises(lambda: w.mul_(0.5), 'more than one element')
  off.weight.mul_(cfg.offline_weight);  // EXPECT: tensor-inplace-on-expanded
  return concat(off, online.sample(n_on, device));
}

struct ObsNormalizer {
  torch::Tensor stats;  // mean and std, stacked
  void fit(const torch::Tensor& obs) { stats = torch::stack({obs.mean(0), obs.std(0).clamp_min(1e-3)}); }
  torch::Tensor apply(const torch::Tensor& obs) const {
    auto x = obs.contiguous();
    // FACT: x=torch.randn(6); y=x.contiguous(); y.sub_(1.0); assert shares_storage(x, y)
    x.sub_(stats[0]).div_(stats[1]);  // EXPECT: tensor-alias-then-mutate
    return x;
  }
};

struct ReturnWindow {
  explicit ReturnWindow(int64_t k) : buf(torch::zeros({k}, torch::kFloat64)) {}
  void push(double r) {
    const int64_t k = buf.size(0);
    // FACT: h=torch.zeros(10); assert raises(lambda: h[:9].copy_(h[1:]), 'single memory location')
    buf.narrow(0, 0, k - 1).copy_(buf.narrow(0, 1, k - 1));  // EXPECT: tensor-inplace-overlap
    buf[k - 1] = r;
    count = std::min(count + 1, k);
  }
  double mean() const { return count ? buf.narrow(0, buf.size(0) - count, count).mean().item<double>() : 0.0; }
  torch::Tensor buf;
  int64_t count = 0;
};

struct UpdateInfo { torch::Tensor critic_loss, actor_loss, mean_weight; };

struct AWACAgent {
  AWACAgent(const AWACConfig& cfg, torch::Device device)
      : cfg_(cfg), actor(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        critic(cfg.obs_dim, cfg.act_dim, cfg.hidden), critic_target(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        actor_opt(actor->parameters(), torch::optim::AdamOptions(cfg.actor_lr)),
        critic_opt(critic->parameters(), torch::optim::AdamOptions(cfg.critic_lr)) {
    actor->to(device); critic->to(device); critic_target->to(device);
    torch::NoGradGuard no_grad;
    auto tp = critic_target->parameters(), sp = critic->parameters();
    for (size_t i = 0; i < tp.size(); ++i) tp[i].copy_(sp[i]).set_requires_grad(false);
  }

  void soft_update() {
    torch::NoGradGuard no_grad;
    auto tp = critic_target->parameters(), sp = critic->parameters();
    for (size_t i = 0; i < tp.size(); ++i)
      tp[i].data().mul_(1.0 - cfg_.tau).add_(sp[i].data(), cfg_.tau);  // LOOKALIKE: tensor-inplace-on-detached -- the target copy is meant to be overwritten, nothing saved it
  }

  UpdateInfo update(const Batch& b) {
    torch::Tensor target, v_pi;
    {
      torch::NoGradGuard no_grad;
      auto [tq1, tq2] = critic_target->forward(b.next_obs, actor->sample(b.next_obs));
      auto q_next = torch::min(tq1, tq2);
      q_next.mul_(cfg_.gamma);  // LOOKALIKE: tensor-inplace-on-saved -- built under NoGradGuard, nothing is saved
      // FACT: r=torch.randn(8,1); c=r.clone().mul_(2.0); assert is_copy_of(c, r)
      auto rew = b.rew.clone().mul_(cfg_.reward_scale);  // EXPECT: tensor-unnecessary-clone // LOOKALIKE: tensor-alias-then-mutate -- the clone owns its storage, b.rew is untouched
      target = rew + (1.0 - b.done) * q_next;
      const int64_t B = b.obs.size(0), K = cfg_.num_v_samples;
      // FACT: o=torch.randn(4,3); r=o.unsqueeze(1).repeat(1,5,1); assert is_contiguous(r) and not raises(lambda: r.view(20,-1))
      auto obs_rep = b.obs.unsqueeze(1).repeat({1, K, 1}).view({B * K, -1});  // LOOKALIKE: tensor-view-non-contiguous -- repeat materialises a contiguous tensor
      auto [vq1, vq2] = critic->forward(obs_rep, actor->sample(obs_rep));
      v_pi = torch::min(vq1, vq2).view({B, K}).mean(1, /*keepdim=*/true);
    }
    auto [q1, q2] = critic->forward(b.obs, b.act);
    auto critic_loss = ((torch::mse_loss(q1, target, at::Reduction::None) +
                         torch::mse_loss(q2, target, at::Reduction::None)) * b.weight).mean();
    auto adv = q1.detach();
    // FACT: assert backward_fails(lambda: (lambda q: (lambda l: (q.detach().sub_(1.0), l.backward()))(torch.nn.functional.mse_loss(q, torch.zeros(4,1), reduction='none').mean()))(torch.nn.Linear(3,1)(torch.randn(4,3))))
    adv.sub_(v_pi);  // EXPECT: tensor-inplace-on-detached
    auto weights = torch::exp(adv / cfg_.beta).clamp_max(cfg_.max_weight);
    auto actor_loss = -(actor->log_prob(b.obs, b.act) * weights * b.weight).mean();

    critic_opt.zero_grad(); critic_loss.backward(); critic_opt.step();
    actor_opt.zero_grad(); actor_loss.backward(); actor_opt.step();
    soft_update();
    return {critic_loss, actor_loss.detach(), weights.mean()};
  }

  AWACConfig cfg_;
  Actor actor;
  Critic critic, critic_target;
  torch::optim::Adam actor_opt, critic_opt;
};

// Simulator binding with a plain C++ interface; it reuses one observation buffer.
struct ReacherSim {
  ReacherSim(int64_t obs_dim, int64_t act_dim, unsigned seed) : obs_(obs_dim), act_dim_(act_dim), rng_(seed) {}
  const std::vector<float>& reset() { for (auto& o : obs_) o = dist_(rng_); t_ = 0; return obs_; }
  const std::vector<float>& step(const float* action, float& reward, bool& done) {
    reward = 0.f;
    for (size_t i = 0; i < obs_.size(); ++i) {
      obs_[i] = 0.95f * obs_[i] + 0.1f * action[i % act_dim_];
      reward -= obs_[i] * obs_[i];
    }
    done = ++t_ >= 1000;
    return obs_;
  }
  std::vector<float> obs_;
  int64_t act_dim_; int t_ = 0;
  std::mt19937 rng_;
  std::normal_distribution<float> dist_{0.f, 1.f};
};

std::map<std::string, torch::Tensor> make_behaviour_dataset(const AWACConfig& cfg) {
  const int64_t T = cfg.offline_horizon, N = cfg.offline_envs;
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  std::map<std::string, torch::Tensor> d{
      {"observations", torch::empty({T, N, cfg.obs_dim}, opts)}, {"actions", torch::empty({T, N, cfg.act_dim}, opts)},
      {"rewards", torch::empty({T, N}, opts)}, {"next_observations", torch::empty({T, N, cfg.obs_dim}, opts)},
      {"terminals", torch::zeros({T, N}, opts)}};
  auto x = torch::randn({N, cfg.obs_dim}, opts);
  auto gain = 0.3 * torch::randn({cfg.obs_dim, cfg.act_dim}, opts);
  const int64_t reps = cfg.obs_dim / cfg.act_dim + 1;
  for (int64_t t = 0; t < T; ++t) {
    auto a = (-x.matmul(gain) + 0.3 * torch::randn({N, cfg.act_dim}, opts)).clamp(-1.0, 1.0);
    auto x_next = 0.95 * x + 0.1 * a.repeat({1, reps}).narrow(1, 0, cfg.obs_dim);
    d["observations"][t].copy_(x); d["actions"][t].copy_(a);
    d["rewards"][t].copy_(-x_next.pow(2).sum(-1)); d["next_observations"][t].copy_(x_next);
    x = x_next;
  }
  return d;
}

int main() {
  torch::manual_seed(0);
  AWACConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  ReplayBuffer offline(cfg.offline_envs * cfg.offline_horizon, cfg.obs_dim, cfg.act_dim);
  offline.load(make_behaviour_dataset(cfg));
  ReplayBuffer online(cfg.online_capacity, cfg.obs_dim, cfg.act_dim);
  ObsNormalizer norm;
  norm.fit(offline.observations());
  AWACAgent agent(cfg, device);
  ReturnWindow returns(cfg.return_window);
  std::vector<torch::Tensor> critic_hist, actor_hist;
  auto report = [&](const char* phase, int64_t step) {
    std::printf("[%s %6lld] critic %.4f  actor %.4f  return %.2f\n", phase, static_cast<long long>(step),
                torch::stack(critic_hist).mean().item<double>(),
                torch::stack(actor_hist).mean().item<double>(), returns.mean());
    critic_hist.clear(); actor_hist.clear();
  };
  auto normalize = [](Batch& b, const torch::Tensor& stats) {
    b.obs = (b.obs - stats[0]) / stats[1];
    b.next_obs = (b.next_obs - stats[0]) / stats[1];
  };

  for (int64_t step = 0; step < cfg.offline_steps; ++step) {
    auto batch = offline.sample(cfg.batch_size, device);
    normalize(batch, norm.stats.to(device));  // EXPECT: tensor-clone-in-loop
    auto info = agent.update(batch);
    critic_hist.push_back(info.critic_loss);  // EXPECT: tensor-graph-kept-across-iterations
    actor_hist.push_back(info.actor_loss);  // LOOKALIKE: tensor-graph-kept-across-iterations -- update() hands back the actor loss detached
    if ((step + 1) % cfg.log_every == 0) report("offline", step + 1);
  }

  ReacherSim sim(cfg.obs_dim, cfg.act_dim, 7);
  const auto stats_dev = norm.stats.to(device);
  auto obs = torch::from_blob(const_cast<float*>(sim.reset().data()), {cfg.obs_dim}).clone();
  double ep_return = 0.0;
  for (int64_t step = 0; step < cfg.online_steps; ++step) {
    torch::Tensor action;
    {
      torch::NoGradGuard no_grad;
      auto obs_dev = norm.apply(obs).to(device).unsqueeze(0);
      action = agent.actor->sample(obs_dev).squeeze(0).to(torch::kCPU);  // LOOKALIKE: tensor-sync-in-loop -- the simulator needs the action on the host every step
    }
    float reward = 0.f; bool done = false;
    const auto& next = sim.step(action.data_ptr<float>(), reward, done);
    auto next_obs = torch::from_blob(const_cast<float*>(next.data()), {cfg.obs_dim}).clone();  // LOOKALIKE: tensor-clone-in-loop -- from_blob borrows the simulator's buffer, rewritten every step
    online.add(obs, action, reward, next_obs, done);
    ep_return += reward;
    obs = next_obs;
    if (done) {
      returns.push(ep_return);
      ep_return = 0.0;
      obs = torch::from_blob(const_cast<float*>(sim.reset().data()), {cfg.obs_dim}).clone();
    }
    auto batch = sample_mixed(offline, online, cfg, device);
    normalize(batch, stats_dev);
    auto info = agent.update(batch);
    critic_hist.push_back(info.critic_loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before it is kept
    actor_hist.push_back(info.actor_loss);
    if ((step + 1) % cfg.log_every == 0) report("online", step + 1);
  }
  return 0;
}
