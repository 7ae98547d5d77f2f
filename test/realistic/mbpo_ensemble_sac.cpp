// MBPO: an ensemble dynamics model, short branched rollouts from real states, SAC on the mix.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

struct MBPOConfig {
  int64_t obs_dim = 11, act_dim = 3, hidden = 200, sac_hidden = 256, ensemble = 7, num_elites = 5;
  int64_t env_capacity = 1000000, model_capacity = 2000000;
  int64_t total_steps = 200000, init_steps = 5000, model_train_freq = 250;
  int64_t rollout_batch_size = 50000, rollout_chunks = 2, max_horizon = 15;
  int64_t model_batch = 256, model_max_epochs = 200, max_holdout = 5000;
  int64_t sac_batch = 256, updates_per_step = 20;
  double real_ratio = 0.05, gamma = 0.99, tau = 5e-3, lr = 3e-4, init_alpha = 0.2;
  double action_scale = 1.0, reward_penalty = 0.0;
};

static const double kLog2Pi = std::log(2.0 * M_PI);

torch::nn::Sequential mlp(int64_t in, int64_t hidden, int64_t out) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, out));
}

// One independent linear layer per ensemble member, applied with a batched matmul.
struct EnsembleLinearImpl : torch::nn::Module {
  EnsembleLinearImpl(int64_t members, int64_t in, int64_t out) {
    weight = register_parameter("weight", torch::empty({members, in, out}).normal_(0.0, 0.5 / std::sqrt(double(in))));  // LOOKALIKE: tensor-inplace-on-leaf -- normal_ fills a fresh tensor before register_parameter makes it require grad
    bias = register_parameter("bias", torch::zeros({members, 1, out}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::baddbmm(bias, x, weight); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(EnsembleLinear);

struct EnsembleDynamicsImpl : torch::nn::Module {
  EnsembleDynamicsImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden, int64_t members)
      : members_(members), out_dim_(obs_dim + 1),
        l1(register_module("l1", EnsembleLinear(members, obs_dim + act_dim, hidden))),
        l2(register_module("l2", EnsembleLinear(members, hidden, hidden))),
        l3(register_module("l3", EnsembleLinear(members, hidden, hidden))),
        head(register_module("head", EnsembleLinear(members, hidden, 2 * (obs_dim + 1)))) {
    max_logvar = register_parameter("max_logvar", torch::full({1, 1, obs_dim + 1}, 0.5));
    min_logvar = register_parameter("min_logvar", torch::full({1, 1, obs_dim + 1}, -10.0));
  }
  void fit_scaler(const torch::Tensor& x) { in_mu = x.mean(0, true); in_std = x.std({0}, true, true).clamp_min(1e-6); }
  // inputs: one batch shared by every member, or one batch per member.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& inputs) {
    auto x = (inputs - in_mu) / in_std;  // EXPECT: tensor-device-mismatch
    if (x.dim() == 2) x = x.unsqueeze(0).expand({members_, x.size(0), x.size(1)});
    auto h = head->forward(torch::silu(l3->forward(torch::silu(l2->forward(torch::silu(l1->forward(x)))))));
    auto logvar = h.narrow(-1, out_dim_, out_dim_);
    logvar = max_logvar - torch::softplus(max_logvar - logvar);
    logvar = min_logvar + torch::softplus(logvar - min_logvar);
    return {h.narrow(-1, 0, out_dim_), logvar};
  }
  int64_t members_, out_dim_;
  EnsembleLinear l1, l2, l3, head;
  torch::Tensor max_logvar, min_logvar, in_mu, in_std;
};
TORCH_MODULE(EnsembleDynamics);

struct ActorImpl : torch::nn::Module {
  ActorImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden, double scale)
      : net(register_module("net", mlp(obs_dim, hidden, 2 * act_dim))), act_dim_(act_dim), scale_(scale) {}
  std::pair<torch::Tensor, torch::Tensor> sample(const torch::Tensor& obs) {
    auto out = net->forward(obs);
    auto mu = out.narrow(-1, 0, act_dim_);
    auto log_std = out.narrow(-1, act_dim_, act_dim_).clamp(-20.0, 2.0);
    auto u = mu + log_std.exp() * torch::randn_like(mu);
    auto log_prob = (-0.5 * ((u - mu) * torch::exp(-log_std)).pow(2) - log_std - 0.5 * kLog2Pi).sum(-1);
    auto action = torch::tanh(u);
    // FACT: assert not backward_fails(lambda: (lambda s: (s.sub_(1.0), s.sum().backward()))(torch.randn(4,3, requires_grad=True).pow(2).sum(-1)))
    log_prob.sub_(torch::log(1.0 - action.pow(2) + 1e-6).sum(-1));  // LOOKALIKE: tensor-inplace-on-saved -- sum does not save its output
    // FACT: assert backward_fails(lambda: (lambda a: (lambda lp: (a.mul_(2.0), (lp.sum()+a.sum()).backward()))(torch.log(1 - a.pow(2) + 1e-6).sum(-1)))(torch.randn(4,2, requires_grad=True).tanh()))
    action.mul_(scale_);  // EXPECT: tensor-inplace-on-saved
    return {action, log_prob};
  }
  torch::nn::Sequential net;
  int64_t act_dim_; double scale_;
};
TORCH_MODULE(Actor);

struct Batch { torch::Tensor obs, act, rew, next_obs, done; };

struct EnvBuffer {  // real transitions, kept on the host
  EnvBuffer(int64_t cap, int64_t obs_dim, int64_t act_dim)
      : cap(cap), obs(torch::zeros({cap, obs_dim})), act(torch::zeros({cap, act_dim})),
        rew(torch::zeros({cap, 1})), next_obs(torch::zeros({cap, obs_dim})), done(torch::zeros({cap, 1})) {}
  void add(const torch::Tensor& o, const torch::Tensor& a, double r, const torch::Tensor& o2, bool d) {
    obs[ptr].copy_(o); act[ptr].copy_(a); next_obs[ptr].copy_(o2);
    rew[ptr].fill_(r); done[ptr].fill_(d ? 1.0 : 0.0);
    ptr = (ptr + 1) % cap; size = std::min(size + 1, cap);
  }
  Batch sample(int64_t n, torch::Device device) const {
    auto idx = torch::randint(size, {n}, torch::kLong);
    auto take = [&](const torch::Tensor& t) { return t.index_select(0, idx).to(device); };
    return {take(obs), take(act), take(rew), take(next_obs), take(done)};
  }
  torch::Tensor sample_obs(int64_t n) const { return obs.index_select(0, torch::randint(size, {n}, torch::kLong)); }
  // (s, a) -> (r, s' - s)
  std::pair<torch::Tensor, torch::Tensor> model_data() const {
    auto s = obs.narrow(0, 0, size), s2 = next_obs.narrow(0, 0, size);
    return {torch::cat({s, act.narrow(0, 0, size)}, -1), torch::cat({rew.narrow(0, 0, size), s2 - s}, -1)};
  }
  int64_t cap, size = 0, ptr = 0;
  torch::Tensor obs, act, rew, next_obs, done;
};

// Imagined transitions: millions of rows, so they are stored in half precision on the device.
struct ModelBuffer {
  ModelBuffer(int64_t cap, int64_t obs_dim, int64_t act_dim, torch::Device device)
      : cap_(cap), obs_dim_(obs_dim), act_dim_(act_dim),
        data_(torch::zeros({cap, 2 * obs_dim + act_dim + 1}, torch::TensorOptions().dtype(torch::kHalf).device(device))),
        done_(torch::zeros({cap, 1}, torch::TensorOptions().device(device))) {}
  void add_batch(const torch::Tensor& obs, const torch::Tensor& act, const torch::Tensor& rew, const torch::Tensor& next_obs, const torch::Tensor& done) {
    const int64_t n = std::min(obs.size(0), cap_);
    if (ptr_ + n > cap_) ptr_ = 0;
    data_.narrow(0, ptr_, n).copy_(torch::cat({obs, act, rew, next_obs}, -1).narrow(0, 0, n));  // EXPECT: tensor-copy-narrowing
    done_.narrow(0, ptr_, n).copy_(done.unsqueeze(-1).narrow(0, 0, n));  // LOOKALIKE: tensor-copy-narrowing -- bool into float is exact
    ptr_ += n; size_ = std::min(size_ + n, cap_);
  }
  Batch sample(int64_t n) const {
    auto idx = torch::randint(size_, {n}, torch::TensorOptions().dtype(torch::kLong).device(data_.device()));
    auto rows = data_.index_select(0, idx).to(torch::kFloat32);
    return {rows.narrow(1, 0, obs_dim_), rows.narrow(1, obs_dim_, act_dim_), rows.narrow(1, obs_dim_ + act_dim_, 1),
            rows.narrow(1, obs_dim_ + act_dim_ + 1, obs_dim_), done_.index_select(0, idx)};
  }
  int64_t cap_, obs_dim_, act_dim_, size_ = 0, ptr_ = 0;
  torch::Tensor data_, done_;
};

torch::Tensor termination_fn(const torch::Tensor& next_obs) { return next_obs.abs().amax(-1) > 10.0; }

std::vector<int64_t> train_model(EnsembleDynamics& model, torch::optim::Adam& opt, const EnvBuffer& buf, const MBPOConfig& cfg, torch::Device device) {
  auto [inputs, targets] = buf.model_data();
  model->fit_scaler(inputs);
  const int64_t n = inputs.size(0), n_hold = std::min(n / 5, cfg.max_holdout), n_train = n - n_hold;
  auto perm = torch::randperm(n);
  auto rows = [&](const torch::Tensor& t, int64_t from, int64_t len) { return t.index_select(0, perm.narrow(0, from, len)).to(device); };
  auto hold_in = rows(inputs, 0, n_hold), hold_tg = rows(targets, 0, n_hold);
  auto train_in = rows(inputs, n_hold, n_train), train_tg = rows(targets, n_hold, n_train);
  auto params = model->parameters();
  std::vector<torch::Tensor> best_params, holdout_history;
  double best = std::numeric_limits<double>::infinity();
  int since_improved = 0;
  auto epoch_loss = torch::zeros({}, train_in.options());
  for (int64_t epoch = 0; epoch < cfg.model_max_epochs; ++epoch) {
    epoch_loss.zero_();
    for (int64_t i = 0; i < n_train; i += cfg.model_batch) {
      const int64_t b = std::min(cfg.model_batch, n_train - i);
      // bootstrap: every member draws its own rows
      auto idx = torch::randint(n_train, {cfg.ensemble * b}, torch::TensorOptions().dtype(torch::kLong).device(device));
      auto x = train_in.index_select(0, idx).view({cfg.ensemble, b, -1});
      auto y = train_tg.index_select(0, idx).view({cfg.ensemble, b, -1});
      auto [mean, logvar] = model->forward(x);
      auto loss = ((mean - y).pow(2) * torch::exp(-logvar) + logvar).mean(-1).mean(-1).sum() +
                  0.01 * (model->max_logvar.sum() - model->min_logvar.sum());
      opt.zero_grad(); loss.backward(); opt.step();
      epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, and it stays on the device
    }
    auto [hm, hlv] = model->forward(hold_in);
    auto hold_mse = (hm - hold_tg).pow(2).mean(-1).mean(-1);
    holdout_history.push_back(hold_mse);  // EXPECT: tensor-graph-kept-across-iterations
    const double cur = hold_mse.mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the holdout score decides early stopping
    if (cur < best * (1.0 - 1e-4)) {
      best = cur; since_improved = 0; best_params.clear();
      for (const auto& p : params) best_params.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone -- the snapshot must survive later optimizer steps
    } else if (++since_improved > 5) {
      break;
    }
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size() && !best_params.empty(); ++i) params[i].copy_(best_params[i]);
  auto order = holdout_history.back().argsort().to(torch::kCPU);
  std::vector<int64_t> elites(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + cfg.num_elites);
  std::printf("model: %lld epochs, train loss %.4f, holdout mse %.5f\n", static_cast<long long>(holdout_history.size()),
              epoch_loss.item<double>() / std::max<int64_t>(1, (n_train + cfg.model_batch - 1) / cfg.model_batch), best);
  return elites;
}

void model_rollout(EnsembleDynamics& model, Actor& actor, const EnvBuffer& env_buf, ModelBuffer& model_buf,
                   const std::vector<int64_t>& elites, int64_t horizon, const MBPOConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  auto elite_idx = torch::tensor(elites, torch::kLong);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  const int64_t E = cfg.ensemble;
  for (int64_t chunk = 0; chunk < cfg.rollout_chunks; ++chunk) {
    auto obs = env_buf.sample_obs(cfg.rollout_batch_size / cfg.rollout_chunks).to(device);  // LOOKALIKE: tensor-clone-in-loop -- fresh start states for every chunk
    for (int64_t h = 0; h < horizon; ++h) {
      const int64_t B = obs.size(0);
      auto act = actor->sample(obs).first;
      auto [mean, logvar] = model->forward(torch::cat({obs, act}, -1));
      auto samples = mean + torch::randn_like(mean) * (0.5 * logvar).exp();
      auto members = elite_idx.to(device).index_select(0, torch::randint(elite_idx.size(0), {B}, long_opts));  // EXPECT: tensor-clone-in-loop
      // FACT: s=torch.randn(5,8,4); assert is_copy_of(s.permute(1,0,2).reshape(40,4), s)
      auto flat = samples.permute({1, 0, 2}).reshape({B * E, -1});  // EXPECT: tensor-reshape-non-contiguous
      auto pick = flat.index_select(0, torch::arange(B, long_opts) * E + members);
      auto rew = pick.narrow(1, 0, 1);
      if (cfg.reward_penalty > 0.0) {
        // FACT: h=torch.randn(5,8,10); assert is_view_of(h[...,:1].permute(1,0,2).reshape(8,5), h)
        auto spread = mean.narrow(-1, 0, 1).permute({1, 0, 2}).reshape({B, E}).std(1, true, true);  // LOOKALIKE: tensor-reshape-non-contiguous -- only a size-1 dim is dropped, so this stays a view
        rew = rew - cfg.reward_penalty * spread;
      }
      auto next_obs = obs;
      // FACT: o=torch.randn(4,3); n=o; n.add_(torch.ones(4,3)); assert shares_storage(n, o) and n is o
      next_obs.add_(pick.narrow(1, 1, cfg.obs_dim));  // EXPECT: tensor-alias-then-mutate
      auto done = termination_fn(next_obs);
      model_buf.add_batch(obs, act, rew, next_obs, done);
      auto keep = (~done).nonzero().squeeze(-1);
      if (keep.numel() == 0) break;
      obs = next_obs.index_select(0, keep);
    }
  }
}

struct SACAgent {
  SACAgent(const MBPOConfig& cfg, torch::Device device)
      : cfg_(cfg), actor(cfg.obs_dim, cfg.act_dim, cfg.sac_hidden, cfg.action_scale),
        q1(mlp(cfg.obs_dim + cfg.act_dim, cfg.sac_hidden, 1)), q2(mlp(cfg.obs_dim + cfg.act_dim, cfg.sac_hidden, 1)),
        q1_t(mlp(cfg.obs_dim + cfg.act_dim, cfg.sac_hidden, 1)), q2_t(mlp(cfg.obs_dim + cfg.act_dim, cfg.sac_hidden, 1)),
        log_alpha(torch::zeros({1}, torch::TensorOptions().device(device).requires_grad(true))),
        target_entropy(torch::tensor(-static_cast<double>(cfg.act_dim))),
        pi_opt(actor->parameters(), torch::optim::AdamOptions(cfg.lr)),
        q_opt(concat(q1->parameters(), q2->parameters()), torch::optim::AdamOptions(cfg.lr)),
        alpha_opt(std::vector<torch::Tensor>{log_alpha}, torch::optim::AdamOptions(cfg.lr)) {
    actor->to(device);
    for (auto m : {q1, q2, q1_t, q2_t}) m->to(device);
    log_alpha.fill_(std::log(cfg.init_alpha));  // EXPECT: tensor-inplace-on-leaf
    soft_update(1.0);
  }
  static std::vector<torch::Tensor> concat(std::vector<torch::Tensor> a, const std::vector<torch::Tensor>& b) {
    a.insert(a.end(), b.begin(), b.end()); return a;
  }
  void soft_update(double tau) {
    torch::NoGradGuard no_grad;
    auto src = concat(q1->parameters(), q2->parameters()), dst = concat(q1_t->parameters(), q2_t->parameters());
    for (size_t i = 0; i < src.size(); ++i) dst[i].mul_(1.0 - tau).add_(src[i], tau);
  }

  torch::Tensor update(const Batch& b) {
    auto alpha = log_alpha.exp().detach();
    torch::Tensor target;
    {
      torch::NoGradGuard no_grad;
      auto [na, nlogp] = actor->sample(b.next_obs);
      auto nx = torch::cat({b.next_obs, na}, -1);
      auto next_v = torch::min(q1_t->forward(nx), q2_t->forward(nx)) - alpha * nlogp.unsqueeze(-1);
      target = b.rew.clone();  // EXPECT: tensor-unnecessary-clone
      target.add_(cfg_.gamma * (1.0 - b.done) * next_v);
    }
    auto x = torch::cat({b.obs, b.act}, -1);
    auto q1v = q1->forward(x);
    auto q_loss = torch::mse_loss(q1v, target) + torch::mse_loss(q2->forward(x), target);
    q_opt.zero_grad(); q_loss.backward(); q_opt.step();
    auto [a, logp] = actor->sample(b.obs);
    auto xa = torch::cat({b.obs, a}, -1);
    auto pi_loss = (alpha * logp - torch::min(q1->forward(xa), q2->forward(xa)).squeeze(-1)).mean();
    pi_opt.zero_grad(); pi_loss.backward(); pi_opt.step();
    auto alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean();  // LOOKALIKE: tensor-device-mismatch -- target_entropy is a 0-dim CPU tensor, accepted as a scalar
    alpha_opt.zero_grad(); alpha_loss.backward(); alpha_opt.step();
    soft_update(cfg_.tau);
    return q1v.mean().detach();
  }
  MBPOConfig cfg_;
  Actor actor;
  torch::nn::Sequential q1, q2, q1_t, q2_t;
  torch::Tensor log_alpha, target_entropy;
  torch::optim::Adam pi_opt, q_opt, alpha_opt;
};

Batch mix(const Batch& real, const Batch& imagined) {
  return {torch::cat({real.obs, imagined.obs}), torch::cat({real.act, imagined.act}), torch::cat({real.rew, imagined.rew}),
          torch::cat({real.next_obs, imagined.next_obs}), torch::cat({real.done, imagined.done})};
}

int main() {
  torch::manual_seed(0);
  MBPOConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  EnvBuffer env_buf(cfg.env_capacity, cfg.obs_dim, cfg.act_dim);
  ModelBuffer model_buf(cfg.model_capacity, cfg.obs_dim, cfg.act_dim, device);
  EnsembleDynamics model(cfg.obs_dim, cfg.act_dim, cfg.hidden, cfg.ensemble);
  model->to(device);
  torch::optim::Adam model_opt(model->parameters(), torch::optim::AdamOptions(1e-3).weight_decay(5e-5));
  SACAgent agent(cfg, device);
  auto dyn = torch::randn({cfg.obs_dim + cfg.act_dim, cfg.obs_dim}) * 0.1;
  auto obs = torch::randn({cfg.obs_dim});
  double q_sum = 0.0; int64_t n_updates = 0, ep_len = 0;
  for (int64_t t = 0; t < cfg.total_steps; ++t) {
    if (t >= cfg.init_steps && t % cfg.model_train_freq == 0) {
      auto elites = train_model(model, model_opt, env_buf, cfg, device);
      const int64_t horizon = std::min<int64_t>(cfg.max_horizon, 1 + (t - cfg.init_steps) / 20000);
      model_rollout(model, agent.actor, env_buf, model_buf, elites, horizon, cfg, device);
    }
    torch::Tensor action = torch::rand({cfg.act_dim}) * 2.0 - 1.0;
    if (t >= cfg.init_steps) {
      torch::NoGradGuard no_grad;
      action = agent.actor->sample(obs.to(device).unsqueeze(0)).first.squeeze(0).to(torch::kCPU);
    }
    auto next_obs = 0.9 * obs + torch::matmul(torch::cat({obs, action}), dyn);
    const double reward = -next_obs.pow(2).sum().item<double>() - 0.1 * action.pow(2).sum().item<double>();
    const bool done = termination_fn(next_obs).item<bool>();
    env_buf.add(obs, action, reward, next_obs, done);
    obs = next_obs;
    if (done || ++ep_len == 1000) { obs = torch::randn({cfg.obs_dim}); ep_len = 0; }
    if (t < cfg.init_steps || model_buf.size_ == 0) continue;
    const int64_t n_real = static_cast<int64_t>(cfg.sac_batch * cfg.real_ratio);
    for (int64_t g = 0; g < cfg.updates_per_step; ++g) {
      auto batch = mix(env_buf.sample(n_real, device), model_buf.sample(cfg.sac_batch - n_real));
      q_sum += agent.update(batch).item<double>();  // EXPECT: tensor-sync-in-loop
      ++n_updates;
    }
    if (t % 1000 == 0) std::printf("step %lld  mean Q %.3f\n", static_cast<long long>(t), q_sum / n_updates);
  }
  return 0;
}
