// Random Network Distillation (Burda et al., 2018) on top of PPO, with running per-channel
// observation normalisation and intrinsic rewards scaled by the intrinsic-return std.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

struct RndConfig {
  int64_t num_envs = 32, rollout_len = 128, channels = 3, frame_size = 64, num_actions = 15;
  int64_t num_updates = 5000, ppo_epochs = 4, num_minibatches = 4, warmup_steps = 50;
  double gamma_ext = 0.999, gamma_int = 0.99, gae_lambda = 0.95;
  double ext_coef = 2.0, int_coef = 1.0, clip_eps = 0.1, entropy_coef = 0.001;
  double update_proportion = 0.25, lr = 1e-4;
};

struct EnvStep {
  std::vector<uint8_t> frames, dones;
  std::vector<float> rewards;
};
struct BatchedEnv {
  virtual ~BatchedEnv() = default;
  virtual const std::vector<uint8_t>& reset() = 0;
  virtual const EnvStep& step(const std::vector<int64_t>& actions) = 0;
};
std::unique_ptr<BatchedEnv> make_procgen(const std::string& name, int64_t num_envs);

struct ConvTrunkImpl : torch::nn::Module {
  ConvTrunkImpl(int64_t in_channels, int64_t out_dim) {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, 32, 8).stride(4)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 4).stride(2)));
    c3 = register_module("c3", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 64, 3).stride(1)));
    fc = register_module("fc", torch::nn::Linear(64 * 4 * 4, out_dim));
    for (auto& p : named_parameters()) {
      if (p.key().find("bias") != std::string::npos) continue;
      torch::nn::init::orthogonal_(p.value(), std::sqrt(2.0));  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under NoGradGuard
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::leaky_relu(c1(x), 0.01);
    x = torch::leaky_relu(c2(x), 0.01);
    return fc(torch::leaky_relu(c3(x), 0.01).flatten(1));
  }

  torch::nn::Conv2d c1{nullptr}, c2{nullptr}, c3{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ConvTrunk);

struct RndImpl : torch::nn::Module {
  explicit RndImpl(int64_t channels) {
    target = register_module("target", ConvTrunk(channels, 512));
    predictor = register_module("predictor", ConvTrunk(channels, 512));
    head = register_module("head", torch::nn::Sequential(
        torch::nn::ReLU(), torch::nn::Linear(512, 512), torch::nn::ReLU(), torch::nn::Linear(512, 512)));
    for (auto& p : target->parameters()) p.set_requires_grad(false);
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    return {head->forward(predictor(x)), target(x)};
  }

  torch::Tensor intrinsic_reward(const torch::Tensor& x) {
    torch::NoGradGuard no_grad;
    auto [pred, tgt] = forward(x);
    return (pred - tgt).pow(2).sum(1) / 2;
  }

  ConvTrunk target{nullptr}, predictor{nullptr};
  torch::nn::Sequential head{nullptr};
};
TORCH_MODULE(Rnd);

struct PolicyImpl : torch::nn::Module {
  PolicyImpl(int64_t channels, int64_t num_actions) {
    trunk = register_module("trunk", ConvTrunk(channels, 448));
    pi = register_module("pi", torch::nn::Linear(448, num_actions));
    v_ext = register_module("v_ext", torch::nn::Linear(448, 1));
    v_int = register_module("v_int", torch::nn::Linear(448, 1));
  }

  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    auto h = torch::relu(trunk(x));
    return {pi(h), v_ext(h).squeeze(1), v_int(h).squeeze(1)};
  }

  ConvTrunk trunk{nullptr};
  torch::nn::Linear pi{nullptr}, v_ext{nullptr}, v_int{nullptr};
};
TORCH_MODULE(Policy);

struct RunningMeanStd {
  explicit RunningMeanStd(at::IntArrayRef shape)
      : mean(torch::zeros(shape, torch::kFloat64)), var(torch::ones(shape, torch::kFloat64)) {}

  void update_from_moments(const torch::Tensor& batch_mean, const torch::Tensor& batch_var, double n) {
    auto bm = batch_mean.to(mean.options()), bv = batch_var.to(var.options());
    auto delta = bm - mean;
    const double total = count + n;
    mean = mean + delta * (n / total);
    var = (var * count + bv * n + delta.pow(2) * (count * n / total)) / total;
    count = total;
  }
  torch::Tensor std() const { return torch::sqrt(var + 1e-8); }
  torch::Tensor mean, var;
  double count = 1e-4;
};

void update_obs_stats(RunningMeanStd& rms, const torch::Tensor& frames) {
  auto x = frames.to(torch::kFloat64);
  // FACT: assert raises(lambda: torch.zeros(6,3,8,8,dtype=torch.float64).transpose(0,1).view(3,-1), "view size is not compatible")
  auto per_channel = x.transpose(0, 1).view({x.size(1), -1});  // EXPECT: tensor-view-non-contiguous
  rms.update_from_moments(per_channel.mean(1), per_channel.var(1, false), per_channel.size(1));
}

torch::Tensor normalize_obs(const torch::Tensor& frames, const RunningMeanStd& rms) {
  auto x = frames.to(torch::kFloat32);
  auto mean = rms.mean.view({1, -1, 1, 1}).to(torch::kFloat32);
  auto std = rms.std().view({1, -1, 1, 1}).to(torch::kFloat32);
  return ((x - mean) / std).clamp(-5.0, 5.0);  // EXPECT: tensor-device-mismatch
}

struct RewardForwardFilter {
  RewardForwardFilter(double gamma, int64_t num_envs, torch::Device device)
      : gamma_(gamma), rewems_(torch::zeros({1}, torch::TensorOptions().device(device)).expand({num_envs})) {}

  torch::Tensor update(const torch::Tensor& rews) {
    // FACT: assert raises(lambda: torch.zeros(1).expand(4).mul_(0.99), "more than one element")
    rewems_.mul_(gamma_).add_(rews);  // EXPECT: tensor-inplace-on-expanded
    return rewems_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- rewems_ is rewritten in place next step while the caller keeps this one
  }
  double gamma_;
  torch::Tensor rewems_;
};

torch::Tensor clip_rewards(torch::Tensor rewards) {
  auto flat = rewards.flatten();
  // FACT: e=torch.randn(4,3); f=e.flatten(); f.clamp_(-1.0, 1.0); assert is_view_of(f, e) and e.abs().max() <= 1.0
  flat.clamp_(-1.0, 1.0);  // EXPECT: tensor-alias-then-mutate
  return flat.view_as(rewards);
}

torch::Tensor gae(const torch::Tensor& rewards, const torch::Tensor& values, const torch::Tensor& masks,
                  double gamma, double lambda) {
  auto adv = torch::zeros_like(rewards), last = torch::zeros_like(rewards[0]);
  for (int64_t t = rewards.size(0) - 1; t >= 0; --t) {
    auto delta = rewards[t] + gamma * values[t + 1] * masks[t + 1] - values[t];
    last = delta + gamma * lambda * masks[t + 1] * last;
    adv[t] = last;
  }
  return adv;
}

struct Rollout {
  Rollout(const RndConfig& c, torch::Device device) : T(c.rollout_len) {
    auto f = torch::TensorOptions().device(device);
    obs = torch::zeros({T + 1, c.num_envs, c.channels, c.frame_size, c.frame_size}, torch::kUInt8);
    actions = torch::zeros({T, c.num_envs}, f.dtype(torch::kLong));
    for (auto* t : {&log_probs, &ext_rewards, &int_rewards}) *t = torch::zeros({T, c.num_envs}, f);
    for (auto* t : {&v_ext, &v_int, &masks}) *t = torch::ones({T + 1, c.num_envs}, f);
  }
  int64_t T;
  torch::Tensor obs, actions, log_probs, ext_rewards, int_rewards, v_ext, v_int, masks;
};

torch::Tensor rnd_update(Rnd& rnd, torch::optim::Adam& opt, const torch::Tensor& next_frames,
                         const RunningMeanStd& obs_rms, const RndConfig& cfg, torch::Device device) {
  std::vector<torch::Tensor> losses;
  const int64_t batch = next_frames.size(0), mb = batch / cfg.num_minibatches;
  for (int64_t epoch = 0; epoch < cfg.ppo_epochs; ++epoch) {
    auto x_all = normalize_obs(next_frames.to(device), obs_rms);  // EXPECT: tensor-clone-in-loop
    auto perm = torch::randperm(batch, torch::TensorOptions().device(device).dtype(torch::kLong));
    for (int64_t start = 0; start + mb <= batch; start += mb) {
      auto [pred, tgt] = rnd->forward(x_all.index_select(0, perm.narrow(0, start, mb)));
      auto mask = (torch::rand({mb, 1}, pred.options()) < cfg.update_proportion).to(pred.scalar_type());
      auto err = (pred - tgt).pow(2);
      // FACT: p=torch.randn(3,4,requires_grad=True); e=(p-1).pow(2); e.mul_(torch.ones(3,1)); e.sum().backward()
      err.mul_(mask);  // LOOKALIKE: tensor-inplace-on-saved -- pow saves its input, not its result
      auto loss = err.mean(1).sum() / mask.sum().clamp_min(1.0);
      opt.zero_grad();
      loss.backward();
      opt.step();
      losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    }
  }
  return torch::stack(losses).mean();
}

torch::Tensor ppo_update(Policy& policy, torch::optim::Adam& opt, const Rollout& r, const torch::Tensor& adv,
                         const torch::Tensor& ret_ext, const torch::Tensor& ret_int, const RndConfig& cfg,
                         torch::Device device) {
  const auto C = cfg.channels, F = cfg.frame_size;
  // FACT: o=torch.zeros(5,2,3,8,8,dtype=torch.uint8); v=o.narrow(0,0,4).view(-1,3,8,8); assert is_view_of(v, o)
  auto obs = r.obs.narrow(0, 0, r.T).view({-1, C, F, F});  // LOOKALIKE: tensor-view-non-contiguous -- the first T slots of a contiguous buffer
  auto flat = [](const torch::Tensor& t) { return t.reshape({-1}); };
  auto actions = flat(r.actions), old_logp = flat(r.log_probs), adv_f = flat(adv);
  auto ret_e = flat(ret_ext), ret_i = flat(ret_int);
  const int64_t batch = actions.size(0), mb = batch / cfg.num_minibatches;
  auto total = torch::zeros({}, adv.options());
  for (int64_t epoch = 0; epoch < cfg.ppo_epochs; ++epoch) {
    auto perm = torch::randperm(batch, torch::TensorOptions().dtype(torch::kLong));
    for (int64_t start = 0; start + mb <= batch; start += mb) {
      auto idx = perm.narrow(0, start, mb);
      auto x = obs.index_select(0, idx).to(device, torch::kFloat32) / 255.0;
      auto idx_d = idx.to(device);
      auto [logits, ve, vi] = policy->forward(x);
      auto logp_all = torch::log_softmax(logits, -1);
      auto logp = logp_all.gather(1, actions.index_select(0, idx_d).unsqueeze(1)).squeeze(1);
      auto a = adv_f.index_select(0, idx_d);
      auto ratio = torch::exp(logp - old_logp.index_select(0, idx_d));
      auto surr1 = ratio * a;
      // FACT: assert backward_fails(lambda: (lambda r: (r * 2 + r.clamp_(0.8, 1.2)).sum().backward())(torch.exp(torch.randn(4, requires_grad=True))))
      auto surr2 = ratio.clamp_(1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps) * a;  // EXPECT: tensor-inplace-on-saved
      auto pg_loss = -torch::min(surr1, surr2).mean();
      auto v_loss = 0.5 * ((ret_e.index_select(0, idx_d) - ve).pow(2).mean() +
                           (ret_i.index_select(0, idx_d) - vi).pow(2).mean());
      auto entropy = -(logp_all.exp() * logp_all).sum(1).mean();
      auto loss = pg_loss + v_loss - cfg.entropy_coef * entropy;
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(policy->parameters(), 0.5);
      opt.step();
      total += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, the graph is freed
    }
  }
  return total / static_cast<double>(cfg.ppo_epochs * cfg.num_minibatches);
}

int main() {
  RndConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const int64_t N = cfg.num_envs, T = cfg.rollout_len, C = cfg.channels, F = cfg.frame_size;
  auto env = make_procgen("coinrun", N);
  Policy policy(C, cfg.num_actions);
  Rnd rnd(C);
  policy->to(device), rnd->to(device);
  torch::optim::Adam policy_opt(policy->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto rnd_params = rnd->predictor->parameters();
  for (auto& p : rnd->head->parameters()) rnd_params.push_back(p);
  torch::optim::Adam rnd_opt(rnd_params, torch::optim::AdamOptions(cfg.lr));

  RunningMeanStd obs_rms({C}), rew_rms({});
  RewardForwardFilter rff(cfg.gamma_int, N, device);
  Rollout r(cfg, device);
  auto load = [&](const std::vector<uint8_t>& buf) {
    return torch::from_blob(const_cast<uint8_t*>(buf.data()), {N, F, F, C}, torch::kUInt8).permute({0, 3, 1, 2});
  };
  r.obs[0].copy_(load(env->reset()));
  std::vector<int64_t> random_actions(N);
  for (int64_t i = 0; i < cfg.warmup_steps; ++i) {
    for (auto& a : random_actions) a = std::rand() % cfg.num_actions;
    update_obs_stats(obs_rms, load(env->step(random_actions).frames));
  }

  std::vector<float> int_log;
  for (int64_t update = 0; update < cfg.num_updates; ++update) {
    auto obs_dev = r.obs[0].to(device);
    for (int64_t step = 0; step < T; ++step) {
      torch::NoGradGuard no_grad;
      auto [logits, ve, vi] = policy->forward(obs_dev.to(torch::kFloat32) / 255.0);
      auto action = torch::multinomial(torch::softmax(logits, -1), 1).squeeze(1);
      auto action_cpu = action.to(torch::kCPU);  // LOOKALIKE: tensor-sync-in-loop -- the environment consumes the actions
      const auto& res = env->step(std::vector<int64_t>(action_cpu.data_ptr<int64_t>(),
                                                       action_cpu.data_ptr<int64_t>() + N));
      r.obs[step + 1].copy_(load(res.frames));
      auto next_dev = r.obs[step + 1].to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new frame every step
      auto r_int = rnd->intrinsic_reward(normalize_obs(next_dev, obs_rms));

      r.actions[step].copy_(action);
      r.log_probs[step].copy_(torch::log_softmax(logits, -1).gather(1, action.unsqueeze(1)).squeeze(1));
      r.v_ext[step].copy_(ve), r.v_int[step].copy_(vi);
      r.int_rewards[step].copy_(r_int);
      r.ext_rewards[step].copy_(torch::from_blob(const_cast<float*>(res.rewards.data()), {N}, torch::kFloat32));
      auto done = torch::from_blob(const_cast<uint8_t*>(res.dones.data()), {N}, torch::kUInt8);
      r.masks[step + 1].copy_(done.logical_not());
      int_log.push_back(r_int.mean().item<float>());  // EXPECT: tensor-sync-in-loop
      obs_dev = next_dev;
    }
    {
      torch::NoGradGuard no_grad;
      auto [logits, ve, vi] = policy->forward(obs_dev.to(torch::kFloat32) / 255.0);
      r.v_ext[T].copy_(ve), r.v_int[T].copy_(vi);
    }

    std::vector<torch::Tensor> int_returns;
    for (int64_t t = 0; t < T; ++t) int_returns.push_back(rff.update(r.int_rewards[t]));
    auto int_ret = torch::stack(int_returns);
    rew_rms.update_from_moments(int_ret.mean(), int_ret.var(), static_cast<double>(int_ret.numel()));
    auto int_rewards = r.int_rewards.clone().div_(rew_rms.std());  // EXPECT: tensor-unnecessary-clone // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may meet a CUDA one
    auto ext_rewards = clip_rewards(r.ext_rewards);

    auto ext_adv = gae(ext_rewards, r.v_ext, r.masks, cfg.gamma_ext, cfg.gae_lambda);
    auto int_adv = gae(int_rewards, r.v_int, torch::ones_like(r.masks), cfg.gamma_int, cfg.gae_lambda);
    auto adv = ext_adv.mul(cfg.ext_coef);
    // FACT: e=torch.randn(4,3); a=e.mul(2.0); a.add_(torch.ones(4,3)); assert is_copy_of(a, e)
    adv.add_(int_adv, cfg.int_coef);  // LOOKALIKE: tensor-alias-then-mutate -- mul allocates, ext_adv is untouched
    auto ret_ext = ext_adv + r.v_ext.narrow(0, 0, T);
    auto ret_int = int_adv + r.v_int.narrow(0, 0, T);
    // FACT: o=torch.zeros(5,2,3,8,8,dtype=torch.uint8); v=o.narrow(0,1,4).view(-1,3,8,8); assert is_view_of(v, o)
    auto next_frames = r.obs.narrow(0, 1, T).view({-1, C, F, F});  // LOOKALIKE: tensor-view-non-contiguous -- a narrow of the leading dim stays contiguous
    auto rnd_loss = rnd_update(rnd, rnd_opt, next_frames, obs_rms, cfg, device);
    auto ppo_loss = ppo_update(policy, policy_opt, r, adv, ret_ext, ret_int, cfg, device);
    update_obs_stats(obs_rms, next_frames);

    if (update % 10 == 0)
      std::cout << "update " << update << " score " << r.ext_rewards.sum(0).mean().item<double>() << " int "
                << std::accumulate(int_log.begin(), int_log.end(), 0.0) / int_log.size() << " rnd "
                << rnd_loss.item<double>() << " ppo " << ppo_loss.item<double>() << std::endl;
    int_log.clear();
    r.obs[0].copy_(r.obs[T]), r.masks[0].copy_(r.masks[T]);
  }
  return 0;
}
