// STEVE (Buckman et al., 2018): every imagined horizon gives one candidate target per
// (dynamics model, critic) pair; per-horizon means are mixed by inverse variance.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <vector>

struct SteveConfig {
  int64_t obs_dim = 17, act_dim = 6;
  int64_t hidden = 256, model_hidden = 200;
  int64_t n_models = 4, n_critics = 4, horizon = 3;
  int64_t batch_size = 256, model_batch = 256, model_epochs = 5;
  int64_t total_steps = 500000, model_every = 1000, log_every = 1000, policy_freq = 2;
  double gamma = 0.99, tau = 0.005, expl_noise = 0.1;
  double actor_lr = 3e-4, critic_lr = 3e-4, model_lr = 1e-3, v_max = 1000.0;
};

// One independent linear layer per ensemble member, applied with a batched matmul.
struct EnsembleLinearImpl : torch::nn::Module {
  EnsembleLinearImpl(int64_t members, int64_t in, int64_t out)
      : weight(register_parameter("weight", torch::randn({members, in, out}) / std::sqrt(static_cast<double>(in)))),
        bias(register_parameter("bias", torch::zeros({members, 1, out}))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::baddbmm(bias, x, weight); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(EnsembleLinear);

struct Prediction { torch::Tensor mean, log_var, done_logit; };

struct DynamicsEnsembleImpl : torch::nn::Module {
  DynamicsEnsembleImpl(int64_t members, int64_t obs_dim, int64_t act_dim, int64_t hidden)
      : obs_dim(obs_dim),
        l1(register_module("l1", EnsembleLinear(members, obs_dim + act_dim, hidden))),
        l2(register_module("l2", EnsembleLinear(members, hidden, hidden))),
        l3(register_module("l3", EnsembleLinear(members, hidden, 2 * (obs_dim + 1) + 1))) {
    in_mean = register_buffer("in_mean", torch::zeros({obs_dim + act_dim}));
    in_std = register_buffer("in_std", torch::ones({obs_dim + act_dim}));
  }

  Prediction forward(const torch::Tensor& s, const torch::Tensor& a) {
    // FACT: s = torch.randn(2, 4, 3); a = torch.randn(2, 4, 2); assert is_copy_of(torch.cat([s, a], -1), s)
    auto x = torch::cat({s, a}, -1);
    x.sub_(in_mean).div_(in_std);  // LOOKALIKE: tensor-alias-then-mutate -- cat wrote a new tensor, s and a are untouched
    auto h = torch::silu(l1(x));
    h = torch::silu(l2(h));
    auto out = l3(h).split_with_sizes({obs_dim + 1, obs_dim + 1, 1}, -1);
    return {out[0], out[1].clamp(-10.0, 0.5), out[2].squeeze(-1)};
  }

  torch::Tensor loss(const Prediction& p, const torch::Tensor& target, const torch::Tensor& done) {
    auto var = p.log_var.exp();
    // FACT: assert backward_fails(lambda: (lambda v: (v.clamp_min_(1e-6), (1 / v).sum().backward()))(torch.randn(4, 3, requires_grad=True).exp()))
    var.clamp_min_(1e-6);  // EXPECT: tensor-inplace-on-saved
    auto nll = ((p.mean - target).pow(2) / var + p.log_var).mean();
    auto term = torch::binary_cross_entropy_with_logits(p.done_logit, done);
    return nll + term;
  }

  void fit_normalizer(const torch::Tensor& inputs) {
    torch::NoGradGuard no_grad;
    in_mean.copy_(inputs.mean(0));
    in_std.copy_(inputs.std(0).clamp_min(1e-6));
  }

  int64_t obs_dim;
  EnsembleLinear l1, l2, l3;
  torch::Tensor in_mean, in_std;
};
TORCH_MODULE(DynamicsEnsemble);

struct QEnsembleImpl : torch::nn::Module {
  QEnsembleImpl(int64_t n, int64_t obs_dim, int64_t act_dim, int64_t hidden)
      : n(n),
        l1(register_module("l1", EnsembleLinear(n, obs_dim + act_dim, hidden))),
        l2(register_module("l2", EnsembleLinear(n, hidden, hidden))),
        l3(register_module("l3", EnsembleLinear(n, hidden, 1))) {}

  torch::Tensor forward(const torch::Tensor& s, const torch::Tensor& a) {
    auto x = torch::cat({s, a}, -1).unsqueeze(0).expand({n, -1, -1});
    auto h = torch::relu(l1(x));
    h = torch::relu(l2(h));
    return l3(h).squeeze(-1);
  }

  int64_t n;
  EnsembleLinear l1, l2, l3;
};
TORCH_MODULE(QEnsemble);

struct ActorImpl : torch::nn::Module {
  ActorImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden)
      : l1(register_module("l1", torch::nn::Linear(obs_dim, hidden))),
        l2(register_module("l2", torch::nn::Linear(hidden, hidden))),
        l3(register_module("l3", torch::nn::Linear(hidden, act_dim))) {}
  torch::Tensor forward(const torch::Tensor& s) { return torch::tanh(l3(torch::relu(l2(torch::relu(l1(s)))))); }
  torch::nn::Linear l1, l2, l3;
};
TORCH_MODULE(Actor);

struct Batch { torch::Tensor obs, act, rew, next_obs, not_done; };

class ReplayBuffer {
 public:
  ReplayBuffer(int64_t capacity, int64_t obs_dim, int64_t act_dim, torch::Device device)
      : capacity_(capacity), device_(device) {
    auto opts = torch::TensorOptions().device(device);
    obs_ = torch::zeros({capacity, obs_dim}, opts);
    next_obs_ = torch::zeros({capacity, obs_dim}, opts);
    act_ = torch::zeros({capacity, act_dim}, opts);
    rew_ = torch::zeros({capacity}, opts);
    done_ = torch::zeros({capacity}, opts);
  }

  void add(const torch::Tensor& s, const torch::Tensor& a, double r, const torch::Tensor& s2, bool done) {
    obs_[pos_].copy_(s);
    act_[pos_].copy_(a);
    next_obs_[pos_].copy_(s2);
    rew_[pos_] = r;
    done_[pos_] = done ? 1.0 : 0.0;
    pos_ = (pos_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  Batch sample(int64_t n) const {
    auto idx = torch::randint(size_, {n}, torch::TensorOptions().dtype(torch::kLong).device(device_));
    return {obs_.index_select(0, idx), act_.index_select(0, idx), rew_.index_select(0, idx),
            next_obs_.index_select(0, idx), 1.0 - done_.index_select(0, idx)};
  }

  Batch all() const {
    return {obs_.narrow(0, 0, size_), act_.narrow(0, 0, size_), rew_.narrow(0, 0, size_),
            next_obs_.narrow(0, 0, size_), 1.0 - done_.narrow(0, 0, size_)};
  }
  int64_t size() const { return size_; }
  torch::Device device() const { return device_; }

 private:
  int64_t capacity_, pos_ = 0, size_ = 0;
  torch::Device device_;
  torch::Tensor obs_, next_obs_, act_, rew_, done_;
};

struct SteveTarget { torch::Tensor value, weights, variance, spread; };

SteveTarget steve_target(Actor& actor, QEnsemble& critics, DynamicsEnsemble& model, const Batch& b,
                         const torch::Tensor& gamma_pows, torch::Tensor& target_buf, const SteveConfig& cfg) {
  torch::NoGradGuard no_grad;
  const int64_t M = cfg.n_models, N = cfg.n_critics, H = cfg.horizon, B = b.obs.size(0);
  // Each model imagines its own continuation of every next state.
  // FACT: s = torch.randn(5, 3); assert is_copy_of(s.unsqueeze(0).expand(4, 5, 3).reshape(20, 3), s)
  auto s = b.next_obs.unsqueeze(0).expand({M, B, cfg.obs_dim}).reshape({M * B, cfg.obs_dim});  // EXPECT: tensor-reshape-non-contiguous
  auto alive = b.not_done.unsqueeze(0).expand({M, B}).clone();
  std::vector<torch::Tensor> rewards, boots;
  for (int64_t h = 0; h <= H; ++h) {
    auto a = actor->forward(s);
    boots.push_back(alive * critics->forward(s, a).view({N, M, B}));
    if (h == H) break;
    // FACT: s = torch.randn(4, 5, 3).reshape(20, 3); assert not raises(lambda: s.view(4, 5, 3))
    auto pred = model->forward(s.view({M, B, -1}), a.view({M, B, -1}));  // LOOKALIKE: tensor-view-non-contiguous -- s and a are fresh contiguous results
    rewards.push_back(alive * pred.mean.select(-1, cfg.obs_dim));
    auto keep = torch::sigmoid(pred.done_logit);
    keep.neg_().add_(1.0);  // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard, sigmoid saved nothing
    // FACT: m = torch.ones(3, 1).expand(3, 4).clone(); m.mul_(torch.rand(3, 4)); assert m.stride() == (4, 1)
    alive.mul_(keep);  // LOOKALIKE: tensor-inplace-on-expanded -- alive is a clone of the expand, with its own memory
    s = (s.view({M, B, -1}) + pred.mean.narrow(-1, 0, cfg.obs_dim)).view({M * B, -1});
  }

  // Discounted model rewards, then running sums along the horizon.
  auto ret = torch::zeros({H + 1, M, B}, b.rew.options());
  ret.narrow(0, 1, H).copy_(torch::stack(rewards) * gamma_pows.narrow(0, 1, H).view({H, 1, 1}));  // EXPECT: tensor-device-mismatch
  // FACT: r = torch.zeros(4, 2, 3); assert raises(lambda: r.narrow(0, 1, 3).add_(r.narrow(0, 0, 3)), "single memory location")
  ret.narrow(0, 1, H).add_(ret.narrow(0, 0, H));  // EXPECT: tensor-inplace-overlap
  ret.add_(b.rew);
  std::vector<torch::Tensor> cands;
  for (int64_t h = 0; h <= H; ++h)
    cands.push_back(ret[h] + gamma_pows[h + 1] * boots[h]);  // LOOKALIKE: tensor-device-mismatch -- gamma_pows[h + 1] is a 0-dim CPU tensor
  auto stacked = torch::stack(cands);
  auto cand = stacked.flatten(1, 2);
  auto mean_h = cand.mean(1);
  auto var64 = cand.var(1).to(torch::kFloat64);
  torch::Tensor prec = var64;
  // FACT: v = torch.rand(4, 3, dtype=torch.float64); v0 = v.clone(); p = v; p.add_(1e-8).reciprocal_(); assert not torch.equal(v, v0)
  prec.add_(1e-8).reciprocal_();  // EXPECT: tensor-alias-then-mutate
  auto w = prec / prec.sum({0}, /*keepdim=*/true);
  target_buf.copy_((w * mean_h).sum(0));  // EXPECT: tensor-copy-narrowing

  // FACT: c = torch.randn(4, 3, 2, 5).permute(3, 0, 1, 2); assert is_view_of(c.reshape(5, -1), c)
  auto spread = stacked.permute({3, 0, 1, 2}).reshape({B, -1}).std(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- only the batch dim moves to the front: still a view
  return {target_buf, w.to(torch::kFloat32), var64.mean(1), spread};
}

double fit_dynamics(DynamicsEnsemble& model, torch::optim::Adam& opt, const ReplayBuffer& replay,
                    const SteveConfig& cfg) {
  const int64_t M = cfg.n_models, bs = cfg.model_batch, n = replay.size();
  auto full = replay.all();
  model->fit_normalizer(torch::cat({full.obs, full.act}, 1));
  auto holdout = replay.sample(std::min<int64_t>(n / 10 + 1, 5000));
  auto idx_opts = torch::TensorOptions().dtype(torch::kLong).device(replay.device());
  std::vector<torch::Tensor> losses, best;
  double best_val = std::numeric_limits<double>::infinity();
  for (int64_t epoch = 0; epoch < cfg.model_epochs; ++epoch) {
    for (int64_t it = 0; it < std::max<int64_t>(n / bs, 1); ++it) {
      auto idx = torch::randint(full.obs.size(0), {M * bs}, idx_opts);
      // FACT: x = torch.randn(50, 6).index_select(0, torch.randint(50, (12,))); assert not raises(lambda: x.view(3, 4, -1))
      auto s = full.obs.index_select(0, idx).view({M, bs, -1});  // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a contiguous tensor
      auto a = full.act.index_select(0, idx).view({M, bs, -1});
      auto ds = full.next_obs.index_select(0, idx).view({M, bs, -1}) - s;
      auto r = full.rew.index_select(0, idx).view({M, bs, 1});
      auto d = 1.0 - full.not_done.index_select(0, idx).view({M, bs});
      auto loss = model->loss(model->forward(s, a), torch::cat({ds, r}, -1), d);
      opt.zero_grad();
      loss.backward();
      opt.step();
      losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    }
    double v = 0.0;
    {
      torch::NoGradGuard no_grad;
      auto p = model->forward(holdout.obs.unsqueeze(0).expand({M, -1, -1}), holdout.act.unsqueeze(0).expand({M, -1, -1}));
      auto target = torch::cat({holdout.next_obs - holdout.obs, holdout.rew.unsqueeze(1)}, 1);
      v = (p.mean - target).pow(2).mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- once per epoch, and the value decides which weights to keep
    }
    if (v < best_val) {
      best_val = v;
      best.clear();
      for (const auto& p : model->parameters())
        best.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone -- opt.step() rewrites p in place, the snapshot must own its data
    }
  }
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    params[i].copy_(best[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- restored under NoGradGuard
  return torch::stack(losses).mean().item<double>();
}

void polyak(torch::nn::Module& target, const torch::nn::Module& source, double tau) {
  torch::NoGradGuard no_grad;
  auto tp = target.parameters(), sp = source.parameters();
  for (size_t i = 0; i < tp.size(); ++i) tp[i].lerp_(sp[i], tau);
}

struct ContinuousEnv {
  virtual ~ContinuousEnv() = default;
  virtual torch::Tensor reset() = 0;
  virtual torch::Tensor step(const torch::Tensor& action, double& reward, bool& done) = 0;
};

void train(ContinuousEnv& env, const SteveConfig& cfg) {
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Actor actor(cfg.obs_dim, cfg.act_dim, cfg.hidden);
  QEnsemble critics(cfg.n_critics, cfg.obs_dim, cfg.act_dim, cfg.hidden);
  QEnsemble critics_target(cfg.n_critics, cfg.obs_dim, cfg.act_dim, cfg.hidden);
  DynamicsEnsemble model(cfg.n_models, cfg.obs_dim, cfg.act_dim, cfg.model_hidden);
  actor->to(device);
  critics->to(device);
  critics_target->to(device);
  model->to(device);
  polyak(*critics_target, *critics, 1.0);

  torch::optim::Adam actor_opt(actor->parameters(), torch::optim::AdamOptions(cfg.actor_lr));
  torch::optim::Adam critic_opt(critics->parameters(), torch::optim::AdamOptions(cfg.critic_lr));
  torch::optim::Adam model_opt(model->parameters(), torch::optim::AdamOptions(cfg.model_lr).weight_decay(1e-5));
  ReplayBuffer replay(cfg.total_steps, cfg.obs_dim, cfg.act_dim, device);

  auto gamma_pows = torch::pow(cfg.gamma, torch::arange(cfg.horizon + 2, torch::kFloat64)).to(torch::kFloat32);
  auto horizons = torch::arange(cfg.horizon + 1, torch::TensorOptions().dtype(torch::kFloat32).device(device)).view({-1, 1});
  auto target_buf = torch::empty({cfg.batch_size}, torch::TensorOptions().device(device));
  std::vector<torch::Tensor> weight_hist;
  double horizon_acc = 0.0, model_loss = 0.0;

  auto obs = env.reset();
  for (int64_t step = 1; step <= cfg.total_steps; ++step) {
    torch::Tensor action;
    {
      torch::NoGradGuard no_grad;
      auto a = actor->forward(obs.to(device).unsqueeze(0)).squeeze(0);
      action = (a + cfg.expl_noise * torch::randn_like(a)).clamp(-1.0, 1.0).to(torch::kCPU);
    }
    double r = 0.0; bool done = false;
    auto next_obs = env.step(action, r, done);
    replay.add(obs, action, r, next_obs, done);
    obs = done ? env.reset() : next_obs;
    if (replay.size() < 10 * cfg.batch_size) continue;

    if (step % cfg.model_every == 0) model_loss = fit_dynamics(model, model_opt, replay, cfg);

    auto b = replay.sample(cfg.batch_size);
    auto tgt = steve_target(actor, critics_target, model, b, gamma_pows, target_buf, cfg);
    auto y = tgt.value.unsqueeze(0).expand({cfg.n_critics, cfg.batch_size});
    // FACT: assert raises(lambda: torch.randn(5).unsqueeze(0).expand(3, 5).clamp_(-1, 1), "more than one element")
    y.clamp_(-cfg.v_max, cfg.v_max);  // EXPECT: tensor-inplace-on-expanded
    auto critic_loss = (critics->forward(b.obs, b.act) - y).pow(2).mean();
    critic_opt.zero_grad();
    critic_loss.backward();
    critic_opt.step();
    if (step % cfg.policy_freq == 0) {
      auto actor_loss = -critics->forward(b.obs, actor->forward(b.obs)).mean();
      actor_opt.zero_grad();
      actor_loss.backward();
      actor_opt.step();
      polyak(*critics_target, *critics, cfg.tau);
    }
    horizon_acc += (tgt.weights * horizons).sum(0).mean().item<double>();  // EXPECT: tensor-sync-in-loop
    weight_hist.push_back(tgt.weights.mean(1).clone());  // EXPECT: tensor-unnecessary-clone
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " model " << model_loss << " eff.horizon "
                << horizon_acc / static_cast<double>(weight_hist.size()) << " weights "
                << torch::stack(weight_hist).mean(0).cpu() << '\n';
      weight_hist.clear();
      horizon_acc = 0.0;
    }
  }
}
