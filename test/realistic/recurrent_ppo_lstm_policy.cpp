// Recurrent PPO (Schulman et al. 2017) with an LSTM core for partially observable tasks. N host
// environments step in lock-step; each keeps its own recurrent state, zeroed when its episode ends.
// A rollout of T steps is cut into sequences of bptt_len steps and the state entering each sequence
// is stored, so the update replays every sequence from the state the policy really had (truncated
// BPTT), zeroing it again at the episode boundaries inside the sequence.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

struct PPOConfig {
  int64_t num_envs = 16, rollout_len = 128, bptt_len = 16, enc_dim = 128, hidden = 256;
  int64_t epochs = 4, seqs_per_batch = 32, updates = 5000, log_every = 10;
  double gamma = 0.99, lam = 0.95, clip = 0.2, vf_coef = 0.5, ent_coef = 0.01;
  double lr = 2.5e-4, max_grad_norm = 0.5, target_kl = 0.02, obs_clip = 10.0;
};

// A batch of environments on the host; finished episodes restart on their own.
struct VecEnv {
  struct Step {
    torch::Tensor obs, reward;  // [N, obs_dim], [N]
    torch::Tensor terminal_obs; // [N, obs_dim]: the last observation of the episodes that just ended
    std::vector<float> done, truncated;
  };
  virtual ~VecEnv() = default;
  virtual torch::Tensor reset() = 0;
  virtual Step step(const torch::Tensor &actions) = 0; // actions [N] int64 on the host
  virtual int64_t obs_dim() const = 0;
  virtual int64_t n_actions() const = 0;
};

// Observation statistics (Chan et al. parallel update) for normalising inputs.
struct RunningMeanStd {
  explicit RunningMeanStd(int64_t dim) : mean(torch::zeros({dim})), var(torch::ones({dim})) {}

  void update(const torch::Tensor &x) {
    auto b_mean = x.mean(0), b_var = x.var(0, /*unbiased=*/false);
    const double b = static_cast<double>(x.size(0)), tot = count + b;
    auto delta = b_mean - mean;
    mean = mean + delta * (b / tot);
    var = (var * count + b_var * b + delta.pow(2) * (count * b / tot)) / tot;
    count = tot;
  }

  torch::Tensor normalize(const torch::Tensor &x, double clip) const {
    // FACT: x = torch.randn(6, 4); m = torch.randn(4); y = x.clone(); y.sub_(m); assert torch.equal(y, x.sub(m)) and is_copy_of(x.sub(m), x)
    auto y = x.clone(); // EXPECT: tensor-unnecessary-clone -- overwritten by sub_ right away: x.sub(mean) is the same tensor in one pass
    y.sub_(mean);
    y.div_((var + 1e-8).sqrt());
    return y.clamp_(-clip, clip);
  }

  torch::Tensor mean, var;
  double count = 1e-4;
};

using LstmState = std::tuple<torch::Tensor, torch::Tensor>; // h, c: [1, B, hidden]

struct PolicyOut {
  torch::Tensor logits, values; // [B * L, A], [B * L]
};

struct RecurrentPolicyImpl : torch::nn::Module {
  RecurrentPolicyImpl(int64_t obs_dim, int64_t n_actions, const PPOConfig &cfg) : hidden_(cfg.hidden) {
    enc_ = register_module("enc", torch::nn::Linear(obs_dim, cfg.enc_dim));
    lstm_ = register_module(
        "lstm", torch::nn::LSTM(torch::nn::LSTMOptions(cfg.enc_dim, cfg.hidden).batch_first(true)));
    pi_ = register_module("pi", torch::nn::Linear(cfg.hidden, n_actions));
    v_ = register_module("v", torch::nn::Linear(cfg.hidden, 1));
    for (auto &np : named_parameters()) {
      if (np.key().find("bias") != std::string::npos)
        torch::nn::init::constant_(np.value(), 0.0); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
      else
        torch::nn::init::orthogonal_(np.value(), np.key().rfind("pi.", 0) == 0 ? 0.01 : std::sqrt(2.0));
    }
    // Forget-gate bias of 1 (Jozefowicz et al. 2015); PyTorch orders the gates i, f, g, o.
    auto b_ih = lstm_->named_parameters()["bias_ih_l0"];
    // FACT: l = torch.nn.LSTM(4, 8); assert raises(lambda: l.bias_ih_l0.narrow(0, 8, 8).fill_(1.0), "a view of a leaf Variable that requires grad")
    b_ih.narrow(0, cfg.hidden, cfg.hidden).fill_(1.0); // EXPECT: tensor-inplace-on-leaf -- a slice of an LSTM parameter written with grad mode on
  }

  // obs [B, L, obs_dim]; keep [B, L]: 0 where the state must be zeroed before step t. `state` is
  // the state entering the sequence and leaves as the state after it. `resets_inside`: some keep[:, 1:]
  // is 0, so the sequence has to be stepped one time step at a time.
  PolicyOut forward(const torch::Tensor &obs, const torch::Tensor &keep, LstmState &state, bool resets_inside) {
    const auto B = obs.size(0), L = obs.size(1);
    auto z = torch::relu(enc_(obs));
    auto h = std::get<0>(state), c = std::get<1>(state);
    torch::Tensor feat;
    // FACT: k = torch.rand(5, 7); assert is_view_of(k.select(1, 0).view(1, -1, 1), k) and is_view_of(k.select(1, 3).view(1, -1, 1), k)
    if (!resets_inside) {
      // one fused LSTM call over the whole sequence: only the entering state may need zeroing
      auto k0 = keep.select(1, 0).view({1, -1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- a column is strided, but adding size-1 dims is always a view
      auto res = lstm_->forward(z, std::make_tuple(h * k0, c * k0));
      state = std::get<1>(res);
      // FACT: l = torch.nn.LSTM(4, 8, batch_first=True); o, _ = l(torch.randn(3, 5, 4)); assert not is_contiguous(o) and is_copy_of(o.reshape(15, 8), o)
      feat = std::get<0>(res).reshape({B * L, hidden_}); // EXPECT: tensor-reshape-non-contiguous -- a batch_first LSTM returns its [L, B, H] output transposed: the merge copies it
    } else {
      std::vector<torch::Tensor> outs;
      for (int64_t t = 0; t < L; ++t) {
        auto k = keep.select(1, t).view({1, -1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- same: size-1 dims around a strided column
        auto res = lstm_->forward(z.narrow(1, t, 1), std::make_tuple(h * k, c * k));
        outs.push_back(std::get<0>(res)); // LOOKALIKE: tensor-graph-kept-across-iterations -- the steps of one sequence, concatenated and returned for the loss
        std::tie(h, c) = std::get<1>(res);
      }
      state = std::make_tuple(h, c);
      // FACT: o = [torch.randn(3, 8).unsqueeze(0).transpose(0, 1) for _ in range(5)]; c = torch.cat(o, 1); assert is_contiguous(c) and is_view_of(c.view(15, 8), c)
      feat = torch::cat(outs, 1).view({B * L, hidden_}); // LOOKALIKE: tensor-view-non-contiguous -- cat writes a new contiguous tensor
    }
    return {pi_(feat), v_(feat).squeeze(1)};
  }

  int64_t hidden_;
  torch::nn::Linear enc_{nullptr}, pi_{nullptr}, v_{nullptr};
  torch::nn::LSTM lstm_{nullptr};
};
TORCH_MODULE(RecurrentPolicy);

// [T, N, ...] -> [S * N, L, ...]: each env's steps cut into sequences of L, sequence-major.
torch::Tensor to_sequences(const torch::Tensor &x, int64_t L) {
  const auto S = x.size(0) / L, N = x.size(1);
  std::vector<int64_t> split{S, L}, seqs{S * N, L};
  for (int64_t d = 1; d < x.dim(); ++d)
    split.push_back(x.size(d));
  for (int64_t d = 2; d < x.dim(); ++d)
    seqs.push_back(x.size(d));
  // FACT: x = torch.randn(8, 3, 5); assert is_copy_of(x.view(2, 4, 3, 5).transpose(1, 2).reshape(6, 4, 5), x)
  return x.view(split).transpose(1, 2).reshape(seqs); // EXPECT: tensor-reshape-non-contiguous -- env-major sequences are no view of the time-major buffer: every buffer is copied
}

struct RolloutBuffer {
  torch::Tensor obs, actions, logp, values, rewards, keep; // [T, N, ...] on the device
  torch::Tensor seg_hc;                                    // [2, S, N, hidden] on the host: h and c entering each sequence
};

struct UpdateStats {
  double kl = 0, grad_norm = 0;
  int64_t minibatches = 0;
};

class RecurrentPPO {
public:
  RecurrentPPO(VecEnv &env, const PPOConfig &cfg)
      : env_(env), cfg_(cfg), device_(torch::kCUDA), policy_(env.obs_dim(), env.n_actions(), cfg),
        opt_(policy_->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1e-5)), rms_(env.obs_dim()) {
    policy_->to(device_);
    const auto N = cfg.num_envs, T = cfg.rollout_len, S = T / cfg.bptt_len;
    auto opts = torch::TensorOptions().device(device_);
    buf_.obs = torch::zeros({T, N, env.obs_dim()}, opts);
    buf_.actions = torch::zeros({T, N}, opts.dtype(torch::kLong));
    buf_.logp = torch::zeros({T, N}, opts);
    buf_.values = torch::zeros({T, N}, opts);
    buf_.rewards = torch::zeros({T, N}, opts);
    buf_.keep = torch::ones({T, N}, opts);
    buf_.seg_hc = torch::zeros({2, S, N, cfg.hidden});
    state_ = std::make_tuple(torch::zeros({1, N, cfg.hidden}, opts), torch::zeros({1, N, cfg.hidden}, opts));
    keep_ = torch::ones({N, 1}, opts);
    obs_ = env.reset();
  }

  void collect() {
    torch::NoGradGuard no_grad;
    policy_->eval();
    const auto L = cfg_.bptt_len;
    for (int64_t t = 0; t < cfg_.rollout_len; ++t) {
      if (t % L == 0)
        buf_.seg_hc.select(1, t / L).copy_(torch::stack({std::get<0>(state_), std::get<1>(state_)}).squeeze(1));
      rms_.update(obs_);
      auto obs = rms_.normalize(obs_, cfg_.obs_clip).to(device_); // LOOKALIKE: tensor-clone-in-loop -- a new observation every step
      auto out = policy_->forward(obs.unsqueeze(1), keep_, state_, false);
      auto action = torch::multinomial(torch::softmax(out.logits, -1), 1).squeeze(1);
      auto step = env_.step(action.cpu()); // LOOKALIKE: tensor-sync-in-loop, tensor-clone-in-loop -- the environments need this step's actions on the host
      auto reward = step.reward;
      if (std::any_of(step.truncated.begin(), step.truncated.end(), [](float f) { return f > 0.f; })) {
        // a time limit is no failure: bootstrap from the value of the observation the episode stopped at
        LstmState after = state_;
        auto last = rms_.normalize(step.terminal_obs, cfg_.obs_clip).to(device_).unsqueeze(1);
        auto tv = policy_->forward(last, torch::ones_like(keep_), after, false).values;
        reward = reward + cfg_.gamma * tv * torch::tensor(step.truncated); // EXPECT: tensor-device-mismatch -- the value is on the GPU, the rewards and the truncation flags on the host
      }
      buf_.obs[t] = obs;
      buf_.actions[t] = action;
      buf_.logp[t] = torch::log_softmax(out.logits, -1).gather(1, action.unsqueeze(1)).squeeze(1);
      buf_.values[t] = out.values;
      buf_.rewards[t] = reward; // LOOKALIKE: tensor-device-mismatch -- assigning into the device buffer is a copy_, which may cross devices
      buf_.keep[t] = keep_.squeeze(1);
      keep_ = (1.0 - torch::tensor(step.done)).to(device_).unsqueeze(1);
      obs_ = step.obs;
    }
  }

  // GAE(lambda), bootstrapped from the value of the observation after the rollout.
  std::pair<torch::Tensor, torch::Tensor> advantages_and_returns() {
    torch::NoGradGuard no_grad;
    LstmState s = state_;
    auto next_obs = rms_.normalize(obs_, cfg_.obs_clip).to(device_).unsqueeze(1);
    auto last_v = policy_->forward(next_obs, keep_, s, false).values;
    auto adv = torch::zeros_like(buf_.rewards);
    auto gae = torch::zeros_like(last_v);
    const auto T = cfg_.rollout_len;
    for (int64_t t = T - 1; t >= 0; --t) {
      auto next_keep = t + 1 < T ? buf_.keep[t + 1] : keep_.squeeze(1);
      auto next_v = t + 1 < T ? buf_.values[t + 1] : last_v;
      auto delta = buf_.rewards[t] + cfg_.gamma * next_v * next_keep - buf_.values[t];
      gae = delta + cfg_.gamma * cfg_.lam * next_keep * gae;
      adv[t] = gae;
    }
    auto returns = adv;
    // FACT: a = torch.randn(4, 3); v = torch.randn(4, 3); a0 = a.clone(); r = a; r += v; assert shares_storage(r, a) and torch.equal(a, a0 + v)
    returns += buf_.values; // EXPECT: tensor-alias-then-mutate -- 'returns' is the advantage tensor itself: the advantages become the returns
    return {adv, returns};
  }

  UpdateStats update() {
    auto [adv, ret] = advantages_and_returns();
    const auto L = cfg_.bptt_len, M = (cfg_.rollout_len / L) * cfg_.num_envs, mb = cfg_.seqs_per_batch;
    auto obs_seq = to_sequences(buf_.obs, L), act_seq = to_sequences(buf_.actions, L);
    auto logp_seq = to_sequences(buf_.logp, L), keep_seq = to_sequences(buf_.keep, L);
    auto adv_seq = to_sequences(adv, L), ret_seq = to_sequences(ret, L);
    // FACT: s = torch.zeros(2, 4, 3, 8); assert is_view_of(s.flatten(1, 2), s)
    auto seg_all = buf_.seg_hc.flatten(1, 2); // LOOKALIKE: tensor-reshape-non-contiguous -- the [2, S, N, H] snapshot buffer is contiguous: a view
    // long episodes: when no sequence of this rollout crosses a boundary, use the fused LSTM path
    const bool resets_inside = keep_seq.narrow(1, 1, L - 1).lt(0.5).any().item<bool>();

    policy_->train();
    UpdateStats stats;
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      auto perm = torch::randperm(M, torch::TensorOptions().dtype(torch::kLong).device(device_));
      auto kl_sum = torch::zeros({}, torch::TensorOptions().device(device_));
      int64_t n = 0;
      for (int64_t start = 0; start + mb <= M; start += mb) {
        auto idx = perm.narrow(0, start, mb);
        auto hc = seg_all.to(device_).index_select(1, idx); // EXPECT: tensor-clone-in-loop -- all the snapshots go to the GPU again for every minibatch
        LstmState st = std::make_tuple(hc[0].unsqueeze(0), hc[1].unsqueeze(0));
        auto out = policy_->forward(obs_seq.index_select(0, idx), keep_seq.index_select(0, idx), st, resets_inside);

        auto logp_all = torch::log_softmax(out.logits, -1);
        // FACT: a = torch.randint(0, 4, (10, 6)); s = a.index_select(0, torch.tensor([7, 2, 5])); assert is_contiguous(s) and is_view_of(s.view(-1, 1), s)
        auto logp = logp_all.gather(1, act_seq.index_select(0, idx).view({-1, 1})).squeeze(1); // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a new contiguous tensor
        auto old_logp = logp_seq.index_select(0, idx).view(-1);
        auto ratio = (logp - old_logp).exp();
        auto mb_adv = adv_seq.index_select(0, idx).view(-1);
        // FACT: a = torch.randn(6, 4); m = a.index_select(0, torch.tensor([4, 1])).view(-1); a0 = a.clone(); m.sub_(m.mean()).div_(m.std() + 1e-8); assert is_copy_of(m, a) and torch.equal(a, a0)
        mb_adv.sub_(mb_adv.mean()).div_(mb_adv.std() + 1e-8); // LOOKALIKE: tensor-alias-then-mutate -- index_select copied the rows: the rollout's advantages stay as they are
        auto pg_loss = -torch::min(ratio * mb_adv, ratio.clamp(1.0 - cfg_.clip, 1.0 + cfg_.clip) * mb_adv).mean();
        auto v_loss = 0.5 * (out.values - ret_seq.index_select(0, idx).view(-1)).pow(2).mean();
        auto entropy = -(logp_all.exp() * logp_all).sum(-1).mean();
        auto loss = pg_loss + cfg_.vf_coef * v_loss - cfg_.ent_coef * entropy;

        opt_.zero_grad();
        loss.backward();
        stats.grad_norm += torch::nn::utils::clip_grad_norm_(policy_->parameters(), cfg_.max_grad_norm);
        opt_.step();
        {
          torch::NoGradGuard no_grad;
          kl_sum += ((ratio - 1) - (logp - old_logp)).mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph is recorded
        }
        ++n;
      }
      stats.minibatches += n;
      stats.kl = kl_sum.item<double>() / std::max<int64_t>(n, 1); // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after its minibatches, and it decides the early stop
      if (stats.kl > 1.5 * cfg_.target_kl)
        break;
    }
    return stats;
  }

  void train() {
    for (int64_t u = 0; u < cfg_.updates; ++u) {
      collect();
      auto stats = update();
      if (u % cfg_.log_every == 0)
        std::cout << "update " << u << " kl " << stats.kl << " |g| "
                  << stats.grad_norm / std::max<int64_t>(stats.minibatches, 1) << "\n";
    }
  }

private:
  VecEnv &env_;
  PPOConfig cfg_;
  torch::Device device_;
  RecurrentPolicy policy_;
  torch::optim::Adam opt_;
  RunningMeanStd rms_;
  RolloutBuffer buf_;
  LstmState state_;
  torch::Tensor keep_, obs_;
};
