// Self-play PPO for 8x8 Othello with invalid-action masking.
// One network plays both colours; values and rewards are from the side to move.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

constexpr int64_t kBoard = 8;
constexpr int64_t kSquares = kBoard * kBoard;
constexpr int64_t kActions = kSquares + 1;  // last action is "pass"
constexpr int64_t kHistory = 4;
constexpr int64_t kPlanes = 2 * kHistory + 1;

struct PPOConfig {
  int64_t num_envs = 128, horizon = 64, epochs = 4, minibatch = 1024, iterations = 3000;
  int64_t channels = 64, blocks = 4, eval_every = 50, eval_games = 256;
  double gamma = 1.0, lam = 0.95, clip = 0.2, vf_coef = 0.5, ent_coef = 0.01, lr = 3e-4, max_grad_norm = 0.5;
  bool transpose_aug = true;
};

// Batched rules engine (othello_engine.cpp). Finished games restart on the next step;
// boards() and to_move() are the engine's own buffers and change in place.
struct StepResult { torch::Tensor reward, done; };
class OthelloBatch {
 public:
  explicit OthelloBatch(int64_t num_games);
  torch::Tensor boards() const;
  torch::Tensor to_move() const;
  torch::Tensor legal_moves() const;
  StepResult step(const torch::Tensor& actions);
};

torch::Tensor with_pass(const torch::Tensor& legal) {
  auto squares = legal.flatten(1);
  return torch::cat({squares, squares.any(1, true).logical_not()}, 1);
}

class PositionHistory {
 public:
  explicit PositionHistory(int64_t n) : planes_(torch::zeros({n, 2 * kHistory, kBoard, kBoard})) {}

  void push(const torch::Tensor& boards, const torch::Tensor& restarted) {
    planes_.index_put_({restarted}, 0.0);
    // FACT: h=torch.arange(8.).view(1,8,1,1).expand(2,8,8,8).contiguous(); h.narrow(1,2,6).copy_(h.narrow(1,0,6)); assert not torch.equal(h[0,:,0,0], torch.tensor([0.,1,0,1,2,3,4,5]))
    planes_.narrow(1, 2, 2 * (kHistory - 1)).copy_(planes_.narrow(1, 0, 2 * (kHistory - 1)));  // EXPECT: tensor-inplace-overlap
    planes_.select(1, 0).copy_(boards.eq(1));
    planes_.select(1, 1).copy_(boards.eq(-1));
  }

  torch::Tensor planes(const torch::Tensor& to_move) const {
    auto side = to_move.to(torch::kFloat32).view({-1, 1, 1, 1}).expand({planes_.size(0), 1, kBoard, kBoard});
    return torch::cat({planes_, side}, 1);
  }

 private:
  torch::Tensor planes_;
};

struct ResBlockImpl : torch::nn::Module {
  explicit ResBlockImpl(int64_t c)
      : conv1(torch::nn::Conv2dOptions(c, c, 3).padding(1)), conv2(torch::nn::Conv2dOptions(c, c, 3).padding(1)) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(x + conv2(torch::relu(conv1(x)))); }
  torch::nn::Conv2d conv1, conv2;
};
TORCH_MODULE(ResBlock);

struct PolicyValueNetImpl : torch::nn::Module {
  PolicyValueNetImpl(int64_t channels, int64_t blocks)
      : stem(torch::nn::Conv2dOptions(kPlanes, channels, 3).padding(1)),
        policy_conv(torch::nn::Conv2dOptions(channels, 2, 1)), value_conv(torch::nn::Conv2dOptions(channels, 1, 1)),
        policy_fc(2 * kSquares, kActions), value_fc1(kSquares, 64), value_fc2(64, 1) {
    for (int64_t i = 0; i < blocks; ++i) tower->push_back(ResBlock(channels));
    register_module("stem", stem);
    register_module("tower", tower);
    register_module("policy_conv", policy_conv);
    register_module("value_conv", value_conv);
    register_module("policy_fc", policy_fc);
    register_module("value_fc1", value_fc1);
    register_module("value_fc2", value_fc2);
    for (auto* fc : {&policy_fc, &value_fc1, &value_fc2}) {
      torch::nn::init::orthogonal_((*fc)->weight, fc == &policy_fc ? 0.01 : std::sqrt(2.0));  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs the fill under its own NoGradGuard
      torch::nn::init::zeros_((*fc)->bias);
    }
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& planes) {
    auto h = tower->forward(torch::relu(stem(planes)));
    auto logits = policy_fc(torch::relu(policy_conv(h)).flatten(1));
    auto v = value_fc2(torch::relu(value_fc1(torch::relu(value_conv(h)).flatten(1))));
    return {logits, torch::tanh(v).squeeze(1)};
  }

  torch::nn::Conv2d stem, policy_conv, value_conv;
  torch::nn::Sequential tower;
  torch::nn::Linear policy_fc, value_fc1, value_fc2;
};
TORCH_MODULE(PolicyValueNet);

torch::Tensor masked_log_probs(torch::Tensor logits, const torch::Tensor& legal) {
  // FACT: x=torch.rand(2,3); l=torch.nn.Linear(3,5)(x); l.masked_fill_(torch.rand(2,5)>0.5, -1e9); assert not backward_fails(lambda: torch.log_softmax(l,-1).sum().backward())
  logits.masked_fill_(legal.logical_not(), -1e9);  // LOOKALIKE: tensor-inplace-on-saved -- the linear head does not save its output
  return torch::log_softmax(logits, -1);
}

torch::Tensor masked_entropy(const torch::Tensor& logits, const torch::Tensor& legal) {
  auto p = torch::softmax(logits, -1);
  // FACT: l=torch.rand(2,5,requires_grad=True); p=torch.softmax(l,-1); p.mul_(torch.rand(2,5)>0.3); assert backward_fails(lambda: p.sum().backward())
  p.mul_(legal).div_(p.sum(-1, true) + 1e-8);  // EXPECT: tensor-inplace-on-saved
  return -(p * torch::log(p + 1e-8)).sum(-1);
}

torch::Tensor random_moves(const torch::Tensor& legal) {
  auto weights = torch::ones({1, kActions}).expand({legal.size(0), kActions});
  // FACT: s=torch.ones(1,6).expand(4,6); assert raises(lambda: s.mul_(torch.rand(4,6)>0.5), "more than one element")
  weights.mul_(legal);  // EXPECT: tensor-inplace-on-expanded
  return torch::multinomial(weights, 1).squeeze(1);
}

struct RolloutBuffer {
  RolloutBuffer(int64_t T, int64_t N)
      : obs(torch::zeros({T, N, kPlanes, kBoard, kBoard})), masks(torch::zeros({T, N, kActions}, torch::kBool)),
        actions(torch::zeros({T, N}, torch::kLong)), log_probs(torch::zeros({T, N})), values(torch::zeros({T + 1, N})),
        rewards(torch::zeros({T, N})), dones(torch::zeros({T, N})), advantages(torch::zeros({T, N})) {}

  void compute_gae(double gamma, double lam) {
    const auto T = rewards.size(0);
    auto last_gae = torch::zeros_like(values[0]);
    for (int64_t t = T - 1; t >= 0; --t) {
      auto not_done = 1.0 - dones[t];
      auto opp_value = values[t + 1].clone();  // EXPECT: tensor-unnecessary-clone
      opp_value.neg_();
      auto delta = rewards[t] + gamma * opp_value * not_done - values[t];
      last_gae = delta - gamma * lam * not_done * last_gae;  // the next advantage belongs to the opponent
      advantages[t].copy_(last_gae);
    }
  }

  torch::Tensor returns() const { return advantages + values.narrow(0, 0, advantages.size(0)); }

  torch::Tensor obs, masks, actions, log_probs, values, rewards, dones, advantages;
};

void collect(PolicyValueNet& net, OthelloBatch& games, PositionHistory& history, RolloutBuffer& buf,
             torch::Device device) {
  torch::NoGradGuard no_grad;
  const auto T = buf.rewards.size(0);
  for (int64_t t = 0; t < T; ++t) {
    auto planes = history.planes(games.to_move());
    auto legal = with_pass(games.legal_moves());
    auto out = net->forward(planes.to(device));
    auto logp_all = masked_log_probs(out.first, legal.to(device));
    auto action = torch::multinomial(logp_all.exp(), 1);
    auto action_cpu = action.squeeze(1).cpu();  // LOOKALIKE: tensor-sync-in-loop -- the engine needs the moves on the host
    auto res = games.step(action_cpu);
    buf.obs[t].copy_(planes);
    buf.masks[t].copy_(legal);
    buf.actions[t].copy_(action_cpu);
    buf.log_probs[t].copy_(logp_all.gather(1, action).squeeze(1));
    buf.values[t].copy_(out.second);
    buf.rewards[t].copy_(res.reward);  // LOOKALIKE: tensor-copy-narrowing -- int8 game outcomes widen into float
    buf.dones[t].copy_(res.done);
    history.push(games.boards(), res.done);
  }
  buf.values[T].copy_(net->forward(history.planes(games.to_move()).to(device)).second);
}

struct Minibatch { torch::Tensor obs, masks, actions, old_logp, adv, returns; };

// Othello is invariant under the main-diagonal transpose; move indices follow the squares.
Minibatch transpose_augment(Minibatch mb) {
  const auto n = mb.obs.size(0);
  mb.obs = mb.obs.transpose(2, 3);
  // FACT: m=torch.rand(4,65)>0.5; v=m.narrow(1,0,64); assert not is_contiguous(v) and is_view_of(v.view(-1,8,8), m)
  auto board_mask = mb.masks.narrow(1, 0, kSquares).view({n, kBoard, kBoard});  // LOOKALIKE: tensor-view-non-contiguous -- splitting the unit-stride dim of the narrow is a valid view
  // FACT: m=torch.rand(4,65)>0.5; b=m.narrow(1,0,64).view(-1,8,8); assert is_copy_of(b.transpose(1,2).reshape(-1,64), m)
  auto swapped = board_mask.transpose(1, 2).reshape({n, kSquares});  // EXPECT: tensor-reshape-non-contiguous
  mb.masks = torch::cat({swapped, mb.masks.narrow(1, kSquares, 1)}, 1);
  auto sq = mb.actions.clamp_max(kSquares - 1);
  mb.actions = torch::where(mb.actions < kSquares, (sq % kBoard) * kBoard + sq.div(kBoard, "floor"), mb.actions);
  return mb;
}

void ppo_update(PolicyValueNet& net, torch::optim::Adam& opt, RolloutBuffer& buf, const PPOConfig& cfg,
                torch::Device device) {
  auto adv = buf.advantages.reshape({-1});
  // FACT: a=torch.rand(6,4); r0=a+1; b=a.reshape(-1); assert is_view_of(b,a) and not raises(lambda: b.sub_(b.mean())) and not torch.equal(a+1, r0)
  adv.sub_(adv.mean()).div_(adv.std() + 1e-8);  // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-inplace-overlap -- mean() and std() are fresh tensors, not views of adv
  auto returns = buf.returns().reshape({-1});
  // FACT: o=torch.rand(5,4,9,8,8); assert is_view_of(o.reshape(-1,9,8,8), o)
  auto obs = buf.obs.reshape({-1, kPlanes, kBoard, kBoard});  // LOOKALIKE: tensor-reshape-non-contiguous -- the buffer is contiguous, so this is a view
  auto masks = buf.masks.reshape({-1, kActions});
  auto actions = buf.actions.reshape({-1});
  auto old_logp = buf.log_probs.reshape({-1});

  std::vector<torch::Tensor> policy_losses, clip_fracs;
  double kl_sum = 0.0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(obs.size(0));
    for (int64_t start = 0; start + cfg.minibatch <= obs.size(0); start += cfg.minibatch) {
      auto idx = perm.narrow(0, start, cfg.minibatch);
      auto returns_d = returns.to(device);  // EXPECT: tensor-clone-in-loop
      Minibatch mb{obs.index_select(0, idx).to(device), masks.index_select(0, idx).to(device),  // LOOKALIKE: tensor-clone-in-loop -- a different slice every minibatch
                   actions.index_select(0, idx).to(device), old_logp.index_select(0, idx).to(device),
                   adv.index_select(0, idx).to(device), returns_d.index_select(0, idx.to(device))};
      if (cfg.transpose_aug && (start / cfg.minibatch) % 2 == 1) mb = transpose_augment(mb);

      auto out = net->forward(mb.obs);
      auto entropy = masked_entropy(out.first, mb.masks);
      auto logp = masked_log_probs(out.first, mb.masks).gather(1, mb.actions.unsqueeze(1)).squeeze(1);
      auto log_ratio = logp - mb.old_logp;
      auto ratio = log_ratio.exp();
      auto pg_loss = -torch::min(ratio * mb.adv, ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip) * mb.adv).mean();
      auto v_loss = F::mse_loss(out.second, mb.returns);
      auto loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy.mean();
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(net->parameters(), cfg.max_grad_norm);
      opt.step();

      policy_losses.push_back(pg_loss);  // EXPECT: tensor-graph-kept-across-iterations
      clip_fracs.push_back(((ratio - 1.0).abs() > cfg.clip).to(torch::kFloat32).mean());  // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison result carries no graph
      kl_sum += ((ratio - 1.0) - log_ratio).mean().item<double>();  // EXPECT: tensor-sync-in-loop
    }
  }
  std::cout << "pg_loss " << torch::stack(policy_losses).mean().item<double>() << " clip_frac "
            << torch::stack(clip_fracs).mean().item<double>() << " approx_kl " << kl_sum / policy_losses.size()
            << std::endl;
}

double evaluate_vs_random(PolicyValueNet& net, int64_t n, torch::Device device) {
  torch::NoGradGuard no_grad;
  OthelloBatch games(n);
  PositionHistory history(n);
  history.push(games.boards(), torch::ones({n}, torch::kBool));
  auto finished = torch::zeros({n}, torch::kBool);
  auto score = torch::zeros({n});
  while (!finished.all().item<bool>()) {
    auto legal = with_pass(games.legal_moves());
    auto logits = net->forward(history.planes(games.to_move()).to(device)).first;
    auto greedy = logits.masked_fill(legal.logical_not(), -1e9).argmax(1).cpu();  // EXPECT: tensor-device-mismatch
    auto mover = games.to_move().clone();
    auto res = games.step(torch::where(mover.eq(1), greedy, random_moves(legal)));
    auto r = res.reward.to(torch::kFloat32);
    // FACT: r=torch.tensor([1,-1,0],dtype=torch.int8); assert is_copy_of(r.to(torch.float32), r)
    r.mul_(mover);  // LOOKALIKE: tensor-alias-then-mutate -- rewards are int8, so to() made a float copy
    score += r * res.done * finished.logical_not();
    finished.logical_or_(res.done);
    history.push(games.boards(), res.done);
  }
  return (score.mean().item<double>() + 1.0) / 2.0;
}

int main() {
  TORCH_CHECK(torch::cuda::is_available(), "self-play training expects a GPU");
  torch::Device device(torch::kCUDA);
  PPOConfig cfg;
  PolicyValueNet net(cfg.channels, cfg.blocks);
  net->to(device);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1e-5));

  OthelloBatch games(cfg.num_envs);
  PositionHistory history(cfg.num_envs);
  history.push(games.boards(), torch::ones({cfg.num_envs}, torch::kBool));
  RolloutBuffer buf(cfg.horizon, cfg.num_envs);
  for (int64_t it = 0; it < cfg.iterations; ++it) {
    collect(net, games, history, buf, device);
    buf.compute_gae(cfg.gamma, cfg.lam);
    ppo_update(net, opt, buf, cfg, device);
    if (it % cfg.eval_every == 0)
      std::cout << "iter " << it << " win rate vs random " << evaluate_vs_random(net, cfg.eval_games, device)
                << std::endl;
  }
  return 0;
}
