// MuZero (Schrittwieser et al. 2020) learner for a board game on an N x N board. The
// representation network encodes the last `stack` positions, the dynamics network unrolls K steps
// from the sampled moves and the prediction network gives policy and value at every step. Value
// and reward are categorical over the h-transformed support [-S, S]; hidden states are min-max
// scaled to [0, 1] and the gradient into the dynamics is halved at every step (Appendix G).
// Positions are drawn with prioritised replay over (game, position) and half of the batches are
// trained on the transposed board. Self-play (the search) lives in mcts.cpp and fills the buffer
// through save_game().
#include <torch/torch.h>
#include <iostream>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

struct MuZeroConfig {
  int64_t board = 9, planes = 3, stack = 4, n_actions = 82; // 81 points and pass
  int64_t channels = 64, support = 20, unroll = 5, batch = 256, max_games = 4096, max_moves = 200;
  int64_t train_steps = 200000, log_every = 100;
  double discount = 1.0, lr = 0.05, momentum = 0.9, weight_decay = 1e-4;
  double value_weight = 0.25, per_alpha = 0.6, per_beta = 1.0;
};

struct ResBlockImpl : torch::nn::Module {
  explicit ResBlockImpl(int64_t c) {
    namespace nn = torch::nn;
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1).bias(false)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(c));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1).bias(false)));
    bn2_ = register_module("bn2", nn::BatchNorm2d(c));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::relu(bn1_(conv1_(x)));
    return torch::relu(bn2_(conv2_(h)) + x);
  }
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
};
TORCH_MODULE(ResBlock);

// Every hidden state scaled to [0, 1] over its C x N x N values.
torch::Tensor min_max_scale(const torch::Tensor &s) {
  auto flat = s.flatten(1);
  auto lo = std::get<0>(flat.min(1, true)), hi = std::get<0>(flat.max(1, true));
  // FACT: s = torch.relu(torch.randn(3, 10, 2, 2)); f = s.flatten(1); lo = f.min(1, True)[0]; hi = f.max(1, True)[0]; r = (f - lo) / (hi - lo).clamp_min(1e-5); assert is_view_of(r.view_as(s), r)
  return ((flat - lo) / (hi - lo).clamp_min(1e-5)).view_as(s); // LOOKALIKE: tensor-view-non-contiguous -- an elementwise result of contiguous operands is contiguous
}

// Forward: x. Backward: scale * grad.
torch::Tensor scale_gradient(const torch::Tensor &x, double scale) {
  auto frozen = x.detach();
  // FACT: x = torch.randn(3, 4, requires_grad=True) * 1.0; x0 = x.detach().clone(); f = x.detach(); f.mul_(0.5); y = x * 0.5 + f; assert shares_storage(f, x) and not torch.allclose(y, x0)
  frozen.mul_(1.0 - scale); // EXPECT: tensor-inplace-on-detached -- detach() shares x's storage: x itself is scaled before x * scale reads it, so the forward value is no longer x
  return x * scale + frozen;
}

struct MuZeroNetImpl : torch::nn::Module {
  explicit MuZeroNetImpl(const MuZeroConfig &cfg) : A_(cfg.n_actions) {
    namespace nn = torch::nn;
    const auto C = cfg.channels, P = cfg.board * cfg.board, bins = 2 * cfg.support + 1;
    repr_conv_ = register_module("repr_conv", nn::Conv2d(nn::Conv2dOptions(cfg.stack * cfg.planes, C, 3).padding(1).bias(false)));
    repr_bn_ = register_module("repr_bn", nn::BatchNorm2d(C));
    repr_block_ = register_module("repr_block", ResBlock(C));
    dyn_conv_ = register_module("dyn_conv", nn::Conv2d(nn::Conv2dOptions(C + 1, C, 3).padding(1).bias(false)));
    dyn_bn_ = register_module("dyn_bn", nn::BatchNorm2d(C));
    reward_ = register_module("reward", nn::Linear(C * P, bins));
    policy_ = register_module("policy", nn::Linear(C * P, cfg.n_actions));
    value_ = register_module("value", nn::Linear(C * P, bins));
  }

  torch::Tensor represent(const torch::Tensor &obs) {
    return min_max_scale(repr_block_(torch::relu(repr_bn_(repr_conv_(obs)))));
  }

  // (s_k-1, a_k) -> (reward logits [B, bins], s_k [B, C, N, N])
  std::pair<torch::Tensor, torch::Tensor> dynamics(const torch::Tensor &state, const torch::Tensor &action) {
    const auto B = state.size(0), N = state.size(2);
    // the move as one constant plane a / A, as for board games
    auto plane = action.to(torch::kFloat).view({-1, 1, 1, 1}).expand({B, 1, N, N});
    // FACT: a = torch.tensor([1, 4, 2]); p = a.to(torch.float32).view(-1, 1, 1, 1).expand(3, 1, 6, 6); assert raises(lambda: p.div_(82), "more than one element of the written-to tensor refers to a single memory location")
    plane.div_(A_); // EXPECT: tensor-inplace-on-expanded -- the N x N cells of every plane are one element in memory: div_ raises
    auto s = torch::relu(dyn_bn_(dyn_conv_(torch::cat({state, plane}, 1))) + state);
    auto reward = reward_(s.flatten(1));
    // scaled in place: this runs K times per sample
    auto flat = s.flatten(1);
    auto lo = std::get<0>(flat.min(1, true)), hi = std::get<0>(flat.max(1, true));
    // FACT: c = torch.nn.Conv2d(3, 2, 3, padding=1); st = torch.rand(2, 2, 4, 4); s = torch.relu(c(torch.randn(2, 3, 4, 4)) + st); f = s.flatten(1); lo = f.min(1, True)[0]; hi = f.max(1, True)[0]; f.sub_(lo).div_((hi - lo).clamp_min(1e-5)); assert backward_fails(lambda: s.sum().backward())
    flat.sub_(lo).div_((hi - lo).clamp_min(1e-5)); // EXPECT: tensor-inplace-on-saved -- flat is a view of s, which relu saved (and the reward head's input): backward through the unroll raises
    return {reward, s};
  }

  // s -> (policy logits [B, A], value logits [B, bins])
  std::pair<torch::Tensor, torch::Tensor> predict(const torch::Tensor &state) {
    auto h = state.flatten(1);
    return {policy_(h), value_(h)};
  }

  int64_t A_;
  torch::nn::Conv2d repr_conv_{nullptr}, dyn_conv_{nullptr};
  torch::nn::BatchNorm2d repr_bn_{nullptr}, dyn_bn_{nullptr};
  ResBlock repr_block_{nullptr};
  torch::nn::Linear reward_{nullptr}, policy_{nullptr}, value_{nullptr};
};
TORCH_MODULE(MuZeroNet);

// h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x, then the two-hot encoding over [-S, S]: [..., 2S + 1]
torch::Tensor scalar_to_support(const torch::Tensor &x, int64_t S, double eps = 1e-3) {
  auto y = (x.sign() * ((x.abs() + 1).sqrt() - 1) + eps * x).clamp(-S, S);
  auto lo = y.floor();
  auto frac = (y - lo).unsqueeze(-1);
  auto idx = (lo + S).to(torch::kLong).unsqueeze(-1); // LOOKALIKE: tensor-copy-narrowing -- an explicit conversion of whole numbers
  auto sizes = x.sizes().vec();
  sizes.push_back(2 * S + 1);
  auto out = torch::zeros(sizes, x.options());
  out.scatter_(-1, idx, 1 - frac);
  out.scatter_add_(-1, (idx + 1).clamp_max(2 * S), frac);
  return out;
}

// Expected value under the predicted distribution, mapped back through h^-1.
torch::Tensor support_to_scalar(const torch::Tensor &logits, int64_t S, double eps = 1e-3) {
  auto atoms = torch::arange(-S, S + 1, logits.options());
  auto y = (torch::softmax(logits, -1) * atoms).sum(-1); // LOOKALIKE: tensor-device-mismatch -- the atoms are made with the logits' options, on their device
  auto x = ((torch::sqrt(1 + 4 * eps * (y.abs() + 1 + eps)) - 1) / (2 * eps)).pow(2) - 1;
  return y.sign() * x;
}

// logits [rows, classes], target distributions [rows, classes] -> [rows]
torch::Tensor soft_cross_entropy(const torch::Tensor &logits, const torch::Tensor &target) {
  return -(target * torch::log_softmax(logits, 1)).sum(1);
}

struct GameHistory {
  torch::Tensor observations; // [T + 1, planes, N, N]
  torch::Tensor actions;      // [T] int64
  torch::Tensor rewards;      // [T]
  torch::Tensor child_visits; // [T, A] int64 visit counts at the root of every search
  int64_t length() const { return actions.size(0); }

  // the last n positions up to t, oldest first, as [n * planes, N, N]; position 0 repeats before the start
  torch::Tensor stacked(int64_t t, int64_t n) const {
    auto idx = torch::arange(t - n + 1, t + 1).clamp_min(0);
    // FACT: o = torch.randn(5, 3, 4, 4); s = o.index_select(0, torch.tensor([0, 0, 1, 2])); assert is_view_of(s.flatten(0, 1), s)
    return observations.index_select(0, idx).flatten(0, 1); // LOOKALIKE: tensor-reshape-non-contiguous -- index_select makes a contiguous tensor: flatten is a view
  }

  // Board games bootstrap from the outcome: z_t = u_t+1 + gamma u_t+2 + ..., [T + 1]
  torch::Tensor value_targets(double gamma) const {
    auto z = torch::cat({rewards, torch::zeros({1})});
    // FACT: r = torch.randn(5); z = torch.cat([r, torch.zeros(1)]); z[3].add_(z[4], alpha=0.9); assert abs(float(z[3]) - float(r[3] + 0.9 * r[4])) < 1e-6
    for (int64_t t = length() - 1; t >= 0; --t)
      z[t].add_(z[t + 1], gamma); // LOOKALIKE: tensor-inplace-overlap -- two different elements: the one read is not the one written
    return z;
  }
};

struct Batch {
  torch::Tensor obs;      // [B, stack * planes, N, N]
  torch::Tensor actions;  // [B, K] int64
  torch::Tensor values;   // [B, K + 1]
  torch::Tensor rewards;  // [B, K]
  torch::Tensor policies; // [B, K + 1, A]
  torch::Tensor weights;  // [B] importance-sampling weights
  torch::Tensor index;    // [B] flat (game, position) index, for the priority update
};

class ReplayBuffer {
public:
  explicit ReplayBuffer(const MuZeroConfig &cfg)
      : cfg_(cfg), games_(static_cast<size_t>(cfg.max_games)), priorities_(torch::zeros({cfg.max_games, cfg.max_moves})) {}

  // root_values [T]: the search value at every position of the game
  void save_game(GameHistory g, const torch::Tensor &root_values) {
    const auto slot = next_++ % cfg_.max_games, T = g.length();
    auto z = g.value_targets(cfg_.discount);
    priorities_[slot].zero_();
    priorities_[slot].narrow(0, 0, T).copy_((root_values - z.narrow(0, 0, T)).abs() + 1e-6);
    games_[static_cast<size_t>(slot)] = std::move(g);
  }

  Batch sample() {
    const auto B = cfg_.batch, K = cfg_.unroll, L = cfg_.max_moves, A = cfg_.n_actions;
    auto p = priorities_.reshape({-1});
    // FACT: pr = torch.rand(4, 6) + 0.1; p0 = pr.clone(); p = pr.reshape(-1); p.pow_(0.6); assert shares_storage(p, pr) and not torch.equal(pr, p0)
    p.pow_(cfg_.per_alpha); // EXPECT: tensor-alias-then-mutate -- reshape of the contiguous table is a view: the stored priorities are raised to alpha again at every sample
    auto probs = p / p.sum();
    auto index = torch::multinomial(probs, B, /*replacement=*/true);
    auto weights = (probs.index_select(0, index) * (p > 0).sum()).pow(-cfg_.per_beta);
    weights = weights / weights.max();

    std::vector<torch::Tensor> obs, actions, values, rewards, policies;
    auto ix = index.accessor<int64_t, 1>();
    for (int64_t b = 0; b < B; ++b) {
      const auto &g = games_[static_cast<size_t>(ix[b] / L)];
      const auto t = ix[b] % L, T = g.length();
      auto z = g.value_targets(cfg_.discount);
      auto v = torch::zeros({K + 1}), r = torch::zeros({K});
      auto pi = torch::full({K + 1, A}, 1.0 / A);    // uniform past the end of the game
      auto a = torch::randint(A, {K}, torch::kLong); // random moves past the end
      for (int64_t k = 0; k <= K; ++k) {
        const auto i = t + k;
        if (i <= T)
          v[k] = z[i];
        if (i < T) {
          auto visits = g.child_visits[i].to(torch::kFloat);
          // FACT: c = torch.randint(0, 50, (5, 7)); v = c[2].to(torch.float32); v.div_(v.sum()); assert is_copy_of(v, c)
          visits.div_(visits.sum()); // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of the int64 visit counts is a new tensor
          pi[k] = visits;
          if (k < K) {
            a[k] = g.actions[i];
            r[k] = g.rewards[i];
          }
        }
      }
      obs.push_back(g.stacked(t, cfg_.stack));
      actions.push_back(a);
      values.push_back(v);
      rewards.push_back(r);
      policies.push_back(pi);
    }
    return {torch::stack(obs), torch::stack(actions), torch::stack(values), torch::stack(rewards), torch::stack(policies), weights, index};
  }

  void update_priorities(const torch::Tensor &index, const torch::Tensor &errors) {
    // FACT: p = torch.zeros(4, 6); v = p.view(-1); v.index_put_((torch.tensor([1, 7]),), torch.tensor([0.5, 2.0])); assert is_view_of(v, p) and float(p[1, 1]) == 2.0
    priorities_.view({-1}).index_put_({index}, errors.to(torch::kCPU) + 1e-6); // LOOKALIKE: tensor-view-non-contiguous -- the priority table is allocated contiguous
  }

private:
  MuZeroConfig cfg_;
  std::vector<GameHistory> games_;
  torch::Tensor priorities_; // [max_games, max_moves]
  int64_t next_ = 0;
};

// Move index of every move on the transposed board (row * N + col -> col * N + row; pass stays).
torch::Tensor transpose_moves(int64_t N) {
  // FACT: p = torch.arange(9).view(3, 3).t().contiguous().view(-1); assert p.tolist() == [0, 3, 6, 1, 4, 7, 2, 5, 8]
  auto points = torch::arange(N * N).view({N, N}).t().contiguous().view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() copies the transpose first: the view is of the copy
  return torch::cat({points, torch::full({1}, N * N, torch::kLong)});
}

// The rules are symmetric under the board's transpose.
void transpose_batch(Batch &b, const torch::Tensor &move_map) {
  // FACT: o = torch.randn(3, 4, 5, 5); assert raises(lambda: o.copy_(o.transpose(2, 3)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
  b.obs.copy_(b.obs.transpose(2, 3)); // EXPECT: tensor-inplace-overlap -- the source is the destination read in another order: copy_ refuses
  b.actions = move_map.index({b.actions});
  b.policies = b.policies.index_select(2, move_map);
}

struct StepLosses {
  torch::Tensor total, value, reward, policy, priority;
};

StepLosses train_step(MuZeroNet &net, torch::optim::Optimizer &opt, const Batch &b, const MuZeroConfig &cfg, torch::Device device) {
  const auto B = b.actions.size(0), K = b.actions.size(1), S = cfg.support, bins = 2 * S + 1, A = cfg.n_actions;
  auto actions = b.actions.to(device);
  auto z = scalar_to_support(b.values.to(device), S);  // [B, K + 1, bins]
  auto u = scalar_to_support(b.rewards.to(device), S); // [B, K, bins]
  auto pi = b.policies.to(device);                     // [B, K + 1, A]

  auto state = net->represent(b.obs.to(device));
  auto first = net->predict(state);
  std::vector<torch::Tensor> policy_logits{first.first}, value_logits{first.second}, reward_logits;
  for (int64_t k = 0; k < K; ++k) {
    auto [r, next] = net->dynamics(state, actions.select(1, k));
    state = scale_gradient(next, 0.5);
    auto [p, v] = net->predict(state);
    policy_logits.push_back(p); // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked into the loss that backward() runs through below
    value_logits.push_back(v);
    reward_logits.push_back(r);
  }
  // FACT: s = torch.stack([torch.nn.Linear(5, 4)(torch.randn(3, 5)) for _ in range(6)], 1); assert is_view_of(s.view(-1, 4), s)
  auto policy_ce = soft_cross_entropy(torch::stack(policy_logits, 1).view({-1, A}), pi.view({-1, A})).view({B, K + 1}); // LOOKALIKE: tensor-view-non-contiguous -- stacking along dim 1 gives a contiguous [B, K + 1, A]
  auto reward_ce = soft_cross_entropy(torch::stack(reward_logits, 1).view({-1, bins}), u.view({-1, bins})).view({B, K});
  auto vl = torch::stack(value_logits).transpose(0, 1); // [B, K + 1, bins]
  // FACT: v = torch.randn(6, 4, 41); assert is_copy_of(v.transpose(0, 1).reshape(-1, 41), v)
  auto value_ce = soft_cross_entropy(vl.reshape({-1, bins}), z.view({-1, bins})).view({B, K + 1}); // EXPECT: tensor-reshape-non-contiguous -- stacked step-major and transposed: reshape copies every value logit

  // the first step counts fully, the K unrolled steps share a weight of one
  auto per_step = cfg.value_weight * value_ce + policy_ce;
  auto per_sample = per_step.select(1, 0) + (per_step.narrow(1, 1, K).sum(1) + reward_ce.sum(1)) / K;
  auto loss = (per_sample * b.weights.to(device)).mean();
  opt.zero_grad();
  loss.backward();
  opt.step();

  // new priorities: |predicted root value - its target|
  auto v_root = support_to_scalar(value_logits.front(), S);
  // FACT: v = torch.randn(5, requires_grad=True) * 2; t = torch.randn(5); e = v.detach().clone(); e.sub_(t).abs_(); assert torch.equal(e, v.detach().sub(t).abs())
  auto err = v_root.detach().clone(); // EXPECT: tensor-unnecessary-clone -- rewritten in place at once: v_root.detach().sub(target) makes the same tensor in one pass
  err.sub_(b.values.select(1, 0).to(device)).abs_(); // LOOKALIKE: tensor-inplace-on-detached -- err is an owned copy
  return {loss.detach(), value_ce.mean().detach(), reward_ce.mean().detach(), policy_ce.mean().detach(), err};
}

void train(MuZeroNet &net, ReplayBuffer &replay, const MuZeroConfig &cfg) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  net->to(device);
  net->train();
  torch::optim::SGD opt(net->parameters(),
                        torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).weight_decay(cfg.weight_decay));
  const auto move_map = transpose_moves(cfg.board);
  std::mt19937 rng(0);
  std::bernoulli_distribution coin(0.5);
  auto value_sum = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t step = 1; step <= cfg.train_steps; ++step) {
    auto batch = replay.sample();
    if (coin(rng))
      transpose_batch(batch, move_map);
    auto l = train_step(net, opt, batch, cfg, device);
    replay.update_priorities(batch.index, l.priority);
    value_sum += l.value; // LOOKALIKE: tensor-graph-kept-across-iterations, tensor-sync-in-loop -- detached in train_step, and summed on the device
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " loss " << l.total.item<float>() << " value "
                << value_sum.item<double>() / cfg.log_every << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      value_sum.zero_();
    }
  }
}
