// PPO with an Intrinsic Curiosity Module (Pathak et al., 2017): intrinsic reward is
// the forward model's error in ICM feature space; the ICM has its own optimiser.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

struct Config {
  std::string env_id = "SuperMarioBros-1-1-v0";
  int64_t num_envs = 16, rollout_len = 128, frame_size = 42, frame_stack = 4;
  int64_t num_actions = 12, feature_dim = 256, num_updates = 20000;
  int64_t ppo_epochs = 4, icm_epochs = 2, num_minibatches = 8;
  double gamma = 0.99, gae_lambda = 0.95, clip_eps = 0.2;
  double entropy_coef = 0.01, value_coef = 0.5, max_grad_norm = 0.5;
  double icm_beta = 0.2, icm_eta = 0.01, lr = 1e-4;
  int64_t log_every = 10;
};

// Provided by the environment wrapper library (frame-stacked, grey-scale, resized).
struct StepResult {
  std::vector<uint8_t> frames, dones;
  std::vector<double> rewards;
};
struct VecEnv {
  virtual ~VecEnv() = default;
  virtual const std::vector<uint8_t>& reset() = 0;
  virtual const StepResult& step(const std::vector<int64_t>& actions) = 0;
};
std::unique_ptr<VecEnv> make_vec_env(const std::string& id, int64_t n, int64_t size, int64_t stack);

struct EncoderImpl : torch::nn::Module {
  EncoderImpl(int64_t in_channels, int64_t out_dim) {
    for (int64_t i = 0; i < 4; ++i) {
      auto opts = torch::nn::Conv2dOptions(i == 0 ? in_channels : 32, 32, 3).stride(2).padding(1);
      convs.push_back(register_module("conv" + std::to_string(i), torch::nn::Conv2d(opts)));
    }
    fc = register_module("fc", torch::nn::Linear(32 * 3 * 3, out_dim));
  }

  torch::Tensor forward(torch::Tensor x) {
    for (auto& conv : convs) x = torch::elu(conv->forward(x));
    // FACT: x=torch.nn.functional.elu(torch.nn.Conv2d(32,32,3,2,1)(torch.zeros(2,32,6,6))); assert is_view_of(x.flatten(1), x)
    return torch::relu(fc(x.flatten(1)));  // LOOKALIKE: tensor-reshape-non-contiguous -- conv output is contiguous, flatten is a view
  }

  std::vector<torch::nn::Conv2d> convs;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Encoder);

struct IcmOutput {
  torch::Tensor action_logits;
  torch::Tensor forward_error;
};

struct IcmImpl : torch::nn::Module {
  IcmImpl(int64_t in_channels, int64_t num_actions, int64_t feature_dim) : num_actions_(num_actions) {
    encoder = register_module("encoder", Encoder(in_channels, feature_dim));
    inverse = register_module("inverse", torch::nn::Sequential(
        torch::nn::Linear(2 * feature_dim, 256), torch::nn::ReLU(), torch::nn::Linear(256, num_actions)));
    forward_model = register_module("forward_model", torch::nn::Sequential(
        torch::nn::Linear(feature_dim + num_actions, 256), torch::nn::ReLU(),
        torch::nn::Linear(256, feature_dim)));
  }

  IcmOutput forward(const torch::Tensor& obs, const torch::Tensor& next_obs, const torch::Tensor& actions) {
    auto phi = encoder(obs);
    auto phi_next = encoder(next_obs);
    auto logits = inverse->forward(torch::cat({phi, phi_next}, 1));

    auto a_onehot = torch::one_hot(actions, num_actions_).to(phi.scalar_type());
    auto phi_pred = forward_model->forward(torch::cat({phi, a_onehot}, 1));
    phi_pred = phi_pred / phi_pred.norm(2, {1}, true).clamp_min(1e-6);

    // The forward model must not pull the encoder towards trivial features.
    auto target = phi_next.detach();
    // FACT: assert backward_fails(lambda: (lambda y: (y.detach().div_(2.0), y.sum().backward()))(torch.relu(torch.randn(2, 4, requires_grad=True))))
    target.div_(target.norm(2, {1}, true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-detached
    auto error = 0.5 * (phi_pred - target).pow(2).sum(1);
    return {logits, error};
  }

  torch::Tensor intrinsic_reward(const torch::Tensor& obs, const torch::Tensor& next_obs,
                                 const torch::Tensor& actions, double eta) {
    torch::NoGradGuard no_grad;
    return eta * forward(obs, next_obs, actions).forward_error;
  }

  int64_t num_actions_;
  Encoder encoder{nullptr};
  torch::nn::Sequential inverse{nullptr}, forward_model{nullptr};
};
TORCH_MODULE(Icm);

struct ActorCriticImpl : torch::nn::Module {
  ActorCriticImpl(int64_t in_channels, int64_t num_actions, int64_t feature_dim) {
    encoder = register_module("encoder", Encoder(in_channels, feature_dim));
    hidden = register_module("hidden", torch::nn::Linear(feature_dim, 256));
    policy = register_module("policy", torch::nn::Linear(256, num_actions));
    value = register_module("value", torch::nn::Linear(256, 1));

    torch::nn::init::orthogonal_(hidden->weight, std::sqrt(2.0));
    torch::nn::init::orthogonal_(policy->weight, 1.0);
    torch::nn::init::orthogonal_(value->weight, 1.0);
    policy->weight.mul_(0.01);  // EXPECT: tensor-inplace-on-leaf
    for (auto* bias : {&hidden->bias, &policy->bias, &value->bias}) torch::nn::init::zeros_(*bias);
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs) {
    // FACT: l=torch.nn.Linear(4,3); torch.relu_(l(torch.randn(2,4))).sum().backward()
    auto h = hidden(encoder(obs)).relu_();  // LOOKALIKE: tensor-inplace-on-saved -- addmm saves its inputs, not its output
    return {policy(h), value(h).squeeze(-1)};
  }

  Encoder encoder{nullptr};
  torch::nn::Linear hidden{nullptr}, policy{nullptr}, value{nullptr};
};
TORCH_MODULE(ActorCritic);

struct PolicyEval {
  torch::Tensor log_probs, entropy, values;
};

PolicyEval evaluate_actions(ActorCritic& ac, const torch::Tensor& obs, const torch::Tensor& actions) {
  auto [logits, values] = ac->forward(obs);
  auto probs = torch::softmax(logits, -1);
  // FACT: assert backward_fails(lambda: (lambda p: torch.log(p.clamp_(1e-8, 1.0)).sum().backward())(torch.softmax(torch.randn(3, 4, requires_grad=True), -1)))
  auto log_probs = torch::log(probs.clamp_(1e-8, 1.0));  // EXPECT: tensor-inplace-on-saved
  auto entropy = -(probs * log_probs).sum(-1);
  return {log_probs.gather(1, actions.unsqueeze(1)).squeeze(1), entropy, values};
}

struct Rollout {
  Rollout(const Config& c, torch::Device device) : T(c.rollout_len) {
    auto f = torch::TensorOptions().device(device);
    obs = torch::zeros({T + 1, c.num_envs, c.frame_stack, c.frame_size, c.frame_size}, torch::kUInt8);
    actions = torch::zeros({T, c.num_envs}, f.dtype(torch::kLong));
    for (auto* t : {&log_probs, &ext_rewards, &int_rewards, &advantages}) *t = torch::zeros({T, c.num_envs}, f);
    values = torch::zeros({T + 1, c.num_envs}, f);
    masks = torch::ones({T + 1, c.num_envs}, f);
  }

  int64_t T;
  torch::Tensor obs, actions, log_probs, values, ext_rewards, int_rewards, masks, advantages, returns;
};

torch::Tensor to_input(const torch::Tensor& frames, torch::Device device) {
  auto x = frames.to(device, torch::kFloat32);
  // FACT: f=torch.zeros(2,4,6,6,dtype=torch.uint8); x=f.to(torch.float32); assert is_copy_of(x, f)
  return x.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 to float always allocates, the frames stay untouched
}

// Environment-major order keeps each environment's trajectory together in the batch.
torch::Tensor swap_flatten(const torch::Tensor& t) {
  auto sizes = t.sizes().vec();
  std::vector<int64_t> shape{sizes[0] * sizes[1]};
  shape.insert(shape.end(), sizes.begin() + 2, sizes.end());
  // FACT: x=torch.zeros(3,2,4,5,5,dtype=torch.uint8); assert is_copy_of(x.transpose(0,1).reshape(6,4,5,5), x)
  return t.transpose(0, 1).reshape(shape);  // EXPECT: tensor-reshape-non-contiguous
}

void compute_gae(Rollout& r, const torch::Tensor& rewards, double gamma, double lambda) {
  auto gae = torch::zeros_like(rewards[0]);
  for (int64_t t = r.T - 1; t >= 0; --t) {
    auto delta = rewards[t] + gamma * r.values[t + 1] * r.masks[t + 1] - r.values[t];
    gae = delta + gamma * lambda * r.masks[t + 1] * gae;
    r.advantages[t].copy_(gae);
  }
  r.returns = r.advantages + r.values.narrow(0, 0, r.T);
}

torch::Tensor icm_update(Icm& icm, torch::optim::Adam& opt, const Rollout& r, const Config& cfg,
                         torch::Device device) {
  const std::vector<int64_t> flat_shape{-1, cfg.frame_stack, cfg.frame_size, cfg.frame_size};
  auto actions = r.actions.reshape({-1});
  const int64_t batch = actions.size(0), mb = batch / cfg.num_minibatches;
  auto total = torch::zeros({}, torch::TensorOptions().device(device));

  for (int64_t epoch = 0; epoch < cfg.icm_epochs; ++epoch) {
    auto frames = to_input(r.obs, device);  // EXPECT: tensor-clone-in-loop
    // FACT: o=torch.zeros(5,2,4,6,6); x=o.narrow(0,1,4); assert is_view_of(x.reshape(-1,4,6,6), o)
    auto steps = [&](int64_t from) { return frames.narrow(0, from, r.T).reshape(flat_shape); };  // LOOKALIKE: tensor-reshape-non-contiguous -- a narrow of the leading dim stays contiguous
    auto obs = steps(0), next_obs = steps(1);

    auto perm = torch::randperm(batch, torch::TensorOptions().device(device).dtype(torch::kLong));
    for (int64_t start = 0; start + mb <= batch; start += mb) {
      auto idx = perm.narrow(0, start, mb);
      auto a = actions.index_select(0, idx);
      auto out = icm->forward(obs.index_select(0, idx), next_obs.index_select(0, idx), a);
      auto inverse_loss = torch::nn::functional::cross_entropy(out.action_logits, a);
      auto forward_loss = out.forward_error.mean();
      auto loss = (1.0 - cfg.icm_beta) * inverse_loss + cfg.icm_beta * forward_loss;
      opt.zero_grad();
      loss.backward();
      opt.step();
      total += loss;  // EXPECT: tensor-graph-kept-across-iterations
    }
  }
  return total / static_cast<double>(cfg.icm_epochs * cfg.num_minibatches);
}

torch::Tensor ppo_update(ActorCritic& ac, torch::optim::Adam& opt, Rollout& r, const Config& cfg,
                         torch::Device device) {
  auto obs = swap_flatten(r.obs.narrow(0, 0, r.T));
  auto actions = swap_flatten(r.actions);
  auto old_log_probs = swap_flatten(r.log_probs);
  auto returns = swap_flatten(r.returns);
  auto advantages = swap_flatten(r.advantages);
  // FACT: a=torch.randn(6,4); f=a.transpose(0,1).reshape(-1); assert is_copy_of(f, a)
  advantages.sub_(advantages.mean()).div_(advantages.std() + 1e-8);  // LOOKALIKE: tensor-alias-then-mutate -- swap_flatten copied, r.advantages is not touched

  const int64_t batch = obs.size(0), mb = batch / cfg.num_minibatches;
  auto stats = torch::zeros({3}, torch::TensorOptions().device(device));
  for (int64_t epoch = 0; epoch < cfg.ppo_epochs; ++epoch) {
    auto perm = torch::randperm(batch, torch::TensorOptions().dtype(torch::kLong));
    for (int64_t start = 0; start + mb <= batch; start += mb) {
      auto idx = perm.narrow(0, start, mb);
      auto obs_mb = to_input(obs.index_select(0, idx), device);  // LOOKALIKE: tensor-clone-in-loop -- a different minibatch every iteration
      auto idx_dev = idx.to(device);
      auto act_mb = actions.index_select(0, idx_dev);
      auto adv_mb = advantages.index_select(0, idx_dev);

      auto ev = evaluate_actions(ac, obs_mb, act_mb);
      auto ratio = torch::exp(ev.log_probs - old_log_probs.index_select(0, idx_dev));
      auto clipped = torch::clamp(ratio, 1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps);
      auto policy_loss = -torch::min(ratio * adv_mb, clipped * adv_mb).mean();
      auto value_loss = 0.5 * (returns.index_select(0, idx_dev) - ev.values).pow(2).mean();
      auto entropy = ev.entropy.mean();
      auto loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy;

      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(ac->parameters(), cfg.max_grad_norm);
      opt.step();
      stats += torch::stack({policy_loss, value_loss, entropy}).detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
    }
  }
  return stats / static_cast<double>(cfg.ppo_epochs * cfg.num_minibatches);
}

int main() {
  Config cfg;
  torch::manual_seed(1);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const int64_t N = cfg.num_envs, S = cfg.frame_stack, F = cfg.frame_size, T = cfg.rollout_len;

  auto env = make_vec_env(cfg.env_id, N, F, S);
  ActorCritic ac(S, cfg.num_actions, cfg.feature_dim);
  Icm icm(S, cfg.num_actions, cfg.feature_dim);
  ac->to(device);
  icm->to(device);
  torch::optim::Adam ac_opt(ac->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1e-5));
  torch::optim::Adam icm_opt(icm->parameters(), torch::optim::AdamOptions(cfg.lr));

  Rollout rollout(cfg, device);
  auto load_frames = [&](const std::vector<uint8_t>& buf) {
    return torch::from_blob(const_cast<uint8_t*>(buf.data()), {N, F, F, S}, torch::kUInt8)
        .permute({0, 3, 1, 2});
  };
  rollout.obs[0].copy_(load_frames(env->reset()));
  double intrinsic_sum = 0.0;

  for (int64_t update = 0; update < cfg.num_updates; ++update) {
    auto obs = to_input(rollout.obs[0], device);
    for (int64_t step = 0; step < T; ++step) {
      torch::NoGradGuard no_grad;
      auto [logits, value] = ac->forward(obs);
      auto action = torch::multinomial(torch::softmax(logits, -1), 1).squeeze(1);
      auto log_prob = torch::log_softmax(logits, -1).gather(1, action.unsqueeze(1)).squeeze(1);

      auto action_cpu = action.to(torch::kCPU);  // LOOKALIKE: tensor-sync-in-loop -- the environment needs the actions on the host
      const auto& res = env->step(std::vector<int64_t>(action_cpu.data_ptr<int64_t>(),
                                                       action_cpu.data_ptr<int64_t>() + N));
      rollout.obs[step + 1].copy_(load_frames(res.frames));
      auto next_obs = to_input(rollout.obs[step + 1], device);

      auto r_int = icm->intrinsic_reward(obs, next_obs, action, cfg.icm_eta);
      auto r_ext = torch::from_blob(const_cast<double*>(res.rewards.data()), {N}, torch::kFloat64);
      rollout.ext_rewards[step].copy_(r_ext);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ may cross devices
      rollout.int_rewards[step].copy_(r_int);
      auto done = torch::from_blob(const_cast<uint8_t*>(res.dones.data()), {N}, torch::kUInt8);
      rollout.masks[step + 1].copy_(1 - done.to(torch::kFloat32));
      rollout.actions[step].copy_(action);
      rollout.log_probs[step].copy_(log_prob);
      rollout.values[step].copy_(value);
      intrinsic_sum += r_int.sum().item<double>();  // EXPECT: tensor-sync-in-loop
      obs = next_obs;
    }
    {
      torch::NoGradGuard no_grad;
      rollout.values[T].copy_(ac->forward(obs).second);
    }

    auto rewards = rollout.ext_rewards;
    // FACT: e=torch.zeros(8,4); r=e; r.add_(torch.ones(8,4)); assert shares_storage(r, e) and e.sum() > 0
    rewards.add_(rollout.int_rewards);  // EXPECT: tensor-alias-then-mutate
    compute_gae(rollout, rewards, cfg.gamma, cfg.gae_lambda);

    auto icm_loss = icm_update(icm, icm_opt, rollout, cfg, device);
    auto stats = ppo_update(ac, ac_opt, rollout, cfg, device);

    if (update % cfg.log_every == 0) {
      std::cout << std::fixed << std::setprecision(4) << "update " << update << " ext_return "
                << rollout.ext_rewards.sum(0).mean().item<double>() << " intrinsic "
                << intrinsic_sum / static_cast<double>(N * T * cfg.log_every) << " icm "
                << icm_loss.item<double>() << " pi/vf/ent " << stats.to(torch::kCPU) << std::endl;
      intrinsic_sum = 0.0;
    }
    // FACT: o=torch.arange(10.).reshape(5,2); o[0].copy_(o[4]); assert o[0].tolist() == [8.0, 9.0]
    rollout.obs[0].copy_(rollout.obs[T]);  // LOOKALIKE: tensor-inplace-overlap -- first and last slots of the buffer do not overlap
    rollout.masks[0].copy_(rollout.masks[T]);
  }
  return 0;
}
