// R2D2 (Kapturowski et al., 2019): a recurrent Q-network trained from
// prioritized sequence replay. Sequences carry the LSTM state the actor had
// when they started; the learner refreshes it with a burn-in, then trains on
// n-step double-Q targets under the invertible value rescaling h(x).

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <tuple>
#include <utility>

namespace nn = torch::nn;

struct R2d2Config {
  int64_t obs_dim = 256;
  int64_t n_actions = 18;
  int64_t hidden = 512;
  int64_t burn_in = 40;
  int64_t unroll = 80;
  int64_t n_step = 5;
  int64_t batch = 64;
  int64_t capacity = 50000;
  int64_t target_period = 2500;
  double gamma = 0.997;
  double eta = 0.9;
  double rescale_eps = 1e-3;
  double priority_exponent = 0.9;
  double is_beta = 0.6;
  double lr = 1e-4;
  int64_t seq_len() const { return burn_in + unroll + n_step; }
};

struct RecurrentState {
  torch::Tensor h;  // [1, B, hidden]
  torch::Tensor c;
};

// h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x
torch::Tensor value_rescale(const torch::Tensor& x, double eps) {
  return x.sign() * ((x.abs() + 1.0).sqrt() - 1.0) + eps * x;
}

// In-place variant for freshly computed target tensors (saves one [B, U] buffer).
void value_rescale_(torch::Tensor x, double eps) { x.copy_(value_rescale(x, eps)); }

// h^-1(x), closed form (Pohlen et al., 2018, Prop. A.2).
torch::Tensor inv_value_rescale(const torch::Tensor& x, double eps) {
  auto t = ((1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)).sqrt() - 1.0) / (2.0 * eps);
  return x.sign() * (t.pow(2) - 1.0);
}

struct R2d2NetImpl : nn::Module {
  explicit R2d2NetImpl(const R2d2Config& cfg)
      : torso(nn::Linear(cfg.obs_dim, 512), nn::ReLU(), nn::Linear(512, 512), nn::ReLU()),
        lstm(nn::LSTMOptions(512, cfg.hidden)),
        value(cfg.hidden, 1),
        advantage(cfg.hidden, cfg.n_actions) {
    register_module("torso", torso);
    register_module("lstm", lstm);
    register_module("value", value);
    register_module("advantage", advantage);
  }

  // obs: [B, T, obs_dim] -> dueling Q-values [B, T, A] and the state after step T.
  std::pair<torch::Tensor, RecurrentState> forward(const torch::Tensor& obs, const RecurrentState& s) {
    const int64_t B = obs.size(0);
    const int64_t T = obs.size(1);
    auto feats = torso->forward(obs).transpose(0, 1);  // the LSTM is time-major: [T, B, 512]
    auto out = lstm->forward(feats, std::make_tuple(s.h, s.c));
    auto seq = std::get<0>(out);  // [T, B, hidden]
    auto hc = std::get<1>(out);
    // FACT: seq = torch.randn(6, 3, 8); assert is_copy_of(seq.transpose(0, 1).reshape(18, 8), seq)
    auto rows = seq.transpose(0, 1).reshape({B * T, -1});  // EXPECT: tensor-reshape-non-contiguous
    auto adv = advantage(rows);
    auto q = value(rows) + adv - adv.mean(-1, true);
    // FACT: r = torch.randn(6, 8); a = torch.nn.Linear(8, 3)(r); q = torch.nn.Linear(8, 1)(r) + a - a.mean(-1, keepdim=True); assert is_view_of(q.view(2, 3, -1), q)
    auto q_bt = q.view({B, T, -1});  // LOOKALIKE: tensor-view-non-contiguous -- the dueling sum is a fresh contiguous [B*T, A]
    return {q_bt, RecurrentState{std::get<0>(hc), std::get<1>(hc)}};
  }

  nn::Sequential torso;
  nn::LSTM lstm{nullptr};
  nn::Linear value{nullptr}, advantage{nullptr};
};
TORCH_MODULE(R2d2Net);

class SequenceReplay {
 public:
  struct Sample {
    torch::Tensor idx, obs, actions, rewards, dones, h0, c0, weights;
  };

  explicit SequenceReplay(const R2d2Config& cfg)
      : cfg_(cfg),
        obs_(torch::zeros({cfg.capacity, cfg.seq_len(), cfg.obs_dim})),
        actions_(torch::zeros({cfg.capacity, cfg.seq_len()}, torch::kLong)),
        rewards_(torch::zeros({cfg.capacity, cfg.seq_len()})),
        dones_(torch::zeros({cfg.capacity, cfg.seq_len()})),
        h0_(torch::zeros({cfg.capacity, cfg.hidden})),
        c0_(torch::zeros({cfg.capacity, cfg.hidden})),
        priorities_(torch::zeros({cfg.capacity})) {}

  // One actor sequence of length L: obs [L, D], int64 actions [L], rewards and
  // dones [L], plus the LSTM state ([1, 1, hidden] each) before its first step.
  void add(const torch::Tensor& obs, const torch::Tensor& actions, const torch::Tensor& rewards,
           const torch::Tensor& dones, const RecurrentState& start) {
    obs_[pos_].copy_(obs);
    actions_[pos_].copy_(actions);  // LOOKALIKE: tensor-copy-narrowing -- int64 action ids into an int64 buffer
    rewards_[pos_].copy_(rewards);
    dones_[pos_].copy_(dones);
    // FACT: lstm = torch.nn.LSTM(4, 8); _, (h, c) = lstm(torch.randn(3, 1, 4)); assert is_view_of(h.view(-1), h)
    h0_[pos_].copy_(start.h.view({-1}));  // LOOKALIKE: tensor-view-non-contiguous -- an LSTM state [1, 1, H] is contiguous
    c0_[pos_].copy_(start.c.view({-1}));
    priorities_[pos_] = max_priority_;
    pos_ = (pos_ + 1) % cfg_.capacity;
    size_ = std::min(size_ + 1, cfg_.capacity);
  }

  Sample sample(int64_t n) const {
    auto p = priorities_.narrow(0, 0, size_).pow(cfg_.priority_exponent);
    auto probs = p / p.sum();
    auto idx = torch::multinomial(probs, n, /*replacement=*/true);
    auto w = (static_cast<double>(size_) * probs.index_select(0, idx)).pow(-cfg_.is_beta);
    return Sample{idx,
                  obs_.index_select(0, idx),
                  actions_.index_select(0, idx),
                  rewards_.index_select(0, idx),
                  dones_.index_select(0, idx),
                  h0_.index_select(0, idx),
                  c0_.index_select(0, idx),
                  w / w.max()};
  }

  // td_abs: [B, U] absolute TD errors on the learner's device.
  // p = eta * max_t |td| + (1 - eta) * mean_t |td|
  void update_priorities(const torch::Tensor& idx, const torch::Tensor& td_abs) {
    auto mixed = cfg_.eta * std::get<0>(td_abs.max(1)) + (1.0 - cfg_.eta) * td_abs.mean(1);
    // FACT: m = torch.rand(4); p = m.to("cpu"); assert shares_storage(p, m)
    auto prio = mixed.to(torch::kCPU);
    prio.add_(1e-6);  // LOOKALIKE: tensor-alias-then-mutate -- may alias 'mixed', a temporary nobody reads again
    priorities_.index_put_({idx.cpu()}, prio);  // LOOKALIKE: tensor-copy-narrowing -- tensor index, float32 into float32
    max_priority_ = std::max(max_priority_, prio.max().item<double>());
  }

  int64_t size() const { return size_; }

 private:
  R2d2Config cfg_;
  torch::Tensor obs_, actions_, rewards_, dones_, h0_, c0_, priorities_;
  double max_priority_ = 1.0;
  int64_t pos_ = 0;
  int64_t size_ = 0;
};

// Replays the first `steps` observations without gradients to refresh the stale
// stored state, one step at a time exactly as the actor unrolled them.
RecurrentState burn_in(R2d2Net& net, const torch::Tensor& obs, RecurrentState s, int64_t steps) {
  torch::NoGradGuard no_grad;
  auto time_major = obs.transpose(0, 1);  // [T, B, D]
  for (int64_t t = 0; t < steps; ++t) {
    auto x_t = time_major.contiguous()[t].unsqueeze(1);  // EXPECT: tensor-clone-in-loop
    s = net->forward(x_t, s).second;
  }
  return s;
}

void copy_params(R2d2Net& online, R2d2Net& target) {
  torch::NoGradGuard no_grad;
  auto src = online->parameters();
  auto dst = target->parameters();
  for (size_t i = 0; i < src.size(); ++i) {
    dst[i].copy_(src[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
}

void train_learner(const R2d2Config& cfg, SequenceReplay& replay, int64_t num_steps) {
  torch::Device device(torch::kCUDA);
  R2d2Net online(cfg), target(cfg);
  online->to(device);
  target->to(device);
  copy_params(online, target);
  torch::optim::Adam opt(online->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1e-3));

  const int64_t U = cfg.unroll;
  const int64_t n = cfg.n_step;
  // gamma^k, k = 0..n-1: folds a window of n rewards into one return
  auto discounts = torch::pow(torch::full({n}, cfg.gamma), torch::arange(n, torch::kFloat));
  auto gamma_n = torch::tensor(std::pow(cfg.gamma, static_cast<double>(n)));
  auto avg_q = torch::zeros({}, torch::TensorOptions().device(device));
  torch::Tensor last_raw_return;

  for (int64_t step = 0; step < num_steps; ++step) {
    auto s = replay.sample(cfg.batch);
    auto obs = s.obs.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new sample every step
    auto actions = s.actions.to(device);
    auto rewards = s.rewards.to(device);
    auto dones = s.dones.to(device);
    auto weights = s.weights.to(device);
    RecurrentState start{s.h0.unsqueeze(0).to(device), s.c0.unsqueeze(0).to(device)};

    // Burn-in warms up the stored state; only the unroll after it is trained.
    auto online_state = burn_in(online, obs, start, cfg.burn_in);
    auto target_state = burn_in(target, obs, start, cfg.burn_in);
    auto train_obs = obs.narrow(1, cfg.burn_in, U + n);
    auto q_online = online->forward(train_obs, online_state).first;  // [B, U + n, A]
    torch::Tensor q_target;
    {
      torch::NoGradGuard no_grad;
      q_target = target->forward(train_obs, target_state).first;
    }
    auto act = actions.narrow(1, cfg.burn_in, U).unsqueeze(-1);
    auto q_taken = q_online.narrow(1, 0, U).gather(-1, act).squeeze(-1);  // [B, U]

    torch::Tensor targets;
    {
      torch::NoGradGuard no_grad;
      auto r_win = rewards.narrow(1, cfg.burn_in, U + n - 1).unfold(1, n, 1);  // [B, U, n]
      auto nstep_r = (r_win * discounts).sum(-1);  // EXPECT: tensor-device-mismatch
      auto alive = 1.0 - dones.narrow(1, cfg.burn_in + n - 1, U);
      // Double Q: the online net picks the bootstrap action, the target net scores it.
      auto best = q_online.narrow(1, n, U).argmax(-1, true);
      auto q_boot = q_target.narrow(1, n, U).gather(-1, best).squeeze(-1);
      auto ret = nstep_r + alive * gamma_n * inv_value_rescale(q_boot, cfg.rescale_eps);  // LOOKALIKE: tensor-device-mismatch -- gamma_n is a 0-dim CPU scalar tensor
      targets = ret;
      // FACT: r = torch.randn(3, 4); t = r; t.copy_(t.abs()); assert shares_storage(t, r) and bool((r >= 0).all())
      value_rescale_(targets, cfg.rescale_eps);  // EXPECT: tensor-alias-then-mutate
      last_raw_return = ret.mean();
    }

    // |TD| per unrolled step, for the replay priorities.
    auto td = q_taken.detach();
    td.sub_(targets).abs_();  // EXPECT: tensor-inplace-on-detached
    auto loss = (0.5 * (q_taken - targets).pow(2) * weights.unsqueeze(1)).sum(1).mean();
    opt.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(online->parameters(), 40.0);
    opt.step();
    replay.update_priorities(s.idx, td);

    avg_q = 0.99 * avg_q + 0.01 * q_taken.mean();  // EXPECT: tensor-graph-kept-across-iterations
    std::cout << "step " << step << " loss " << loss.item<float>() << '\n';  // EXPECT: tensor-sync-in-loop
    if (step % 500 == 0) {
      std::cout << "  avg Q " << avg_q.item<float>() << "  raw return " << last_raw_return.item<float>() << '\n';  // LOOKALIKE: tensor-sync-in-loop -- every 500 steps only
    }
    if (step % cfg.target_period == 0) copy_params(online, target);
  }
}

class ActorEnv {
 public:
  virtual ~ActorEnv() = default;
  virtual torch::Tensor reset() = 0;  // [obs_dim]
  virtual std::tuple<torch::Tensor, double, bool> step(int64_t action) = 0;
};

// Epsilon-greedy actor: cuts its experience into fixed-length sequences and
// stores each with the recurrent state it started from.
void run_actor(R2d2Net& net, ActorEnv& env, SequenceReplay& replay, const R2d2Config& cfg,
               double epsilon, int64_t num_steps, uint64_t seed) {
  torch::NoGradGuard no_grad;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::uniform_int_distribution<int64_t> any_action(0, cfg.n_actions - 1);
  const int64_t L = cfg.seq_len();
  auto fresh = [&] { return RecurrentState{torch::zeros({1, 1, cfg.hidden}), torch::zeros({1, 1, cfg.hidden})}; };
  RecurrentState state = fresh();
  RecurrentState seq_start = state;
  auto obs_seq = torch::zeros({L, cfg.obs_dim});
  auto act_seq = torch::zeros({L}, torch::kLong);
  auto rew_seq = torch::zeros({L});
  auto done_seq = torch::zeros({L});
  int64_t t_in_seq = 0;
  auto obs = env.reset();
  for (int64_t i = 0; i < num_steps; ++i) {
    auto out = net->forward(obs.view({1, 1, -1}), state);
    const int64_t a = coin(rng) < epsilon ? any_action(rng) : out.first.argmax(-1).item<int64_t>();
    auto [next_obs, reward, done] = env.step(a);
    obs_seq[t_in_seq] = obs;
    act_seq[t_in_seq] = a;
    rew_seq[t_in_seq] = reward;
    done_seq[t_in_seq] = done ? 1.0 : 0.0;
    state = done ? fresh() : out.second;
    obs = done ? env.reset() : next_obs;
    if (++t_in_seq == L) {
      replay.add(obs_seq, act_seq, rew_seq, done_seq, seq_start);
      seq_start = state;
      t_in_seq = 0;
    }
  }
}
