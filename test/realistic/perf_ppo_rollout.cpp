// PPO rollout and update: rewards summed for the log, advantages normalised.
#include <torch/torch.h>
#include <iostream>
#include <vector>

struct ActorCritic : torch::nn::Module {
  ActorCritic(int64_t obs, int64_t act) {
    body = register_module("body", torch::nn::Linear(obs, 64));
    pi = register_module("pi", torch::nn::Linear(64, act));
    v = register_module("v", torch::nn::Linear(64, 1));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(torch::Tensor x) {
    auto h = torch::tanh(body->forward(x));
    return {torch::log_softmax(pi->forward(h), -1), v->forward(h).squeeze(-1)};
  }
  torch::nn::Linear body{nullptr}, pi{nullptr}, v{nullptr};
};

struct Env {
  torch::Tensor reset();
  torch::Tensor step(int64_t action, float &reward, bool &done);
};

float rollout(ActorCritic &ac, Env &env, std::vector<torch::Tensor> &obs_buf,
              std::vector<int64_t> &act_buf, std::vector<float> &rew_buf, int horizon) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  auto obs = env.reset();
  float ep_return = 0;
  for (int t = 0; t < horizon; ++t) {
    auto [logp, value] = ac.forward(obs.to(device).unsqueeze(0));
    auto action = torch::multinomial(logp.exp(), 1).item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- the action is needed by the environment
    float r;
    bool done;
    obs_buf.push_back(obs.clone()); // LOOKALIKE: tensor-unnecessary-clone -- stored in the rollout buffer
    auto next = env.step(action, r, done);
    act_buf.push_back(action);
    rew_buf.push_back(r);
    ep_return += r;
    obs = done ? env.reset() : next;
  }
  return ep_return;
}

torch::Tensor normalise_advantages(const torch::Tensor &adv) {
  auto a = adv.clone(); // EXPECT: tensor-unnecessary-clone
  a.sub_(adv.mean());
  return a / (adv.std() + 1e-8);
}

torch::Tensor discounted_returns(const torch::Tensor &rewards, double gamma) {
  auto ret = rewards.clone(); // LOOKALIKE: tensor-unnecessary-clone -- elements written in the loop below
  for (int64_t i = rewards.size(0) - 2; i >= 0; --i)
    ret[i] += gamma * ret[i + 1];
  return ret;
}

void ppo_update(ActorCritic &ac, torch::optim::Adam &opt, const torch::Tensor &obs,
                const torch::Tensor &actions, const torch::Tensor &old_logp,
                const torch::Tensor &adv, const torch::Tensor &returns, int epochs) {
  torch::Device device(torch::kCUDA);
  ac.to(device);
  auto o = obs.to(device), a = actions.to(device), lp_old = old_logp.to(device);
  auto A = normalise_advantages(adv).to(device), R = returns.to(device);
  float pi_loss_sum = 0, v_loss_sum = 0, kl_sum = 0;
  for (int e = 0; e < epochs; ++e) {
    auto [logp_all, v] = ac.forward(o);
    auto logp = logp_all.gather(1, a.unsqueeze(1)).squeeze(1);
    auto ratio = (logp - lp_old).exp();
    auto clipped = torch::clamp(ratio, 0.8, 1.2) * A;
    auto pi_loss = -torch::min(ratio * A, clipped).mean();
    auto v_loss = (v - R).pow(2).mean();
    opt.zero_grad();
    (pi_loss + 0.5 * v_loss).backward();
    opt.step();
    pi_loss_sum += pi_loss.item<float>(); // EXPECT: tensor-sync-in-loop
    v_loss_sum += v_loss.item<float>(); // EXPECT: tensor-sync-in-loop
    auto kl = (lp_old - logp).mean().item<float>(); // LOOKALIKE: tensor-sync-in-loop -- early stop on the KL
    kl_sum += kl;
    if (kl > 0.015f)
      break;
  }
  std::cout << "pi " << pi_loss_sum / epochs << " v " << v_loss_sum / epochs << " kl " << kl_sum << "\n";
}
