// Decision Transformer (Chen et al. 2021) on logged locomotion trajectories: returns-to-go are
// precomputed per trajectory, segments of K steps are sampled (left-padded, states normalised),
// and returns, states and actions are embedded with a shared timestep embedding and interleaved
// as (R_1, s_1, a_1, R_2, ...) tokens for a causal GPT. The action is predicted from each state
// token and trained with MSE. Evaluation conditions on a target return and rolls the policy out
// in the simulator, lowering the return-to-go by every reward received.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;

struct DTConfig {
  int64_t state_dim = 17, act_dim = 6, hidden = 128, n_layer = 3, n_head = 1, context = 20, max_ep_len = 1000;
  int64_t batch = 64, steps = 100000, warmup = 10000, log_every = 100, eval_episodes = 10;
  double lr = 1e-4, weight_decay = 1e-4, dropout = 0.1, rtg_scale = 1000.0, target_return = 3600.0, clip = 0.25;
  double max_action = 1.0;
};

struct Trajectory {
  torch::Tensor observations, actions, rewards, rtg; // [T, S], [T, A], [T], [T]
};

struct SegmentBatch {
  torch::Tensor states, actions, rtg, timesteps, mask; // [B, K, S], [B, K, A], [B, K, 1], [B, K] int64, [B, K] int64
};

struct StateNorm {
  torch::Tensor mean, stdev; // [S], over every observation of the dataset
};

// Undiscounted returns-to-go, as in the paper: rtg[t] = r[t] + r[t + 1] + ...
torch::Tensor returns_to_go(const torch::Tensor &rewards) { return rewards.flip(0).cumsum(0).flip(0); }

class TrajectoryDataset {
public:
  TrajectoryDataset(std::vector<Trajectory> trajs, const DTConfig &cfg) : trajs_(std::move(trajs)), cfg_(cfg) {
    std::vector<torch::Tensor> obs;
    std::vector<double> lengths;
    for (auto &t : trajs_) {
      t.rtg = returns_to_go(t.rewards);
      obs.push_back(t.observations);
      lengths.push_back(static_cast<double>(t.observations.size(0)));
    }
    auto all = torch::cat(obs, 0);
    norm_ = {all.mean(0), all.std(0) + 1e-6};
    sample_p_ = torch::tensor(lengths, torch::kDouble);
    sample_p_ /= sample_p_.sum(); // long trajectories are sampled more often
  }

  SegmentBatch sample(int64_t B) const {
    const auto K = cfg_.context;
    SegmentBatch batch{torch::zeros({B, K, cfg_.state_dim}), torch::zeros({B, K, cfg_.act_dim}), torch::zeros({B, K, 1}),
                       torch::zeros({B, K}, torch::kLong), torch::zeros({B, K}, torch::kLong)};
    auto picks = torch::multinomial(sample_p_, B, /*replacement=*/true);
    for (int64_t b = 0; b < B; ++b) {
      const auto &traj = trajs_[static_cast<size_t>(picks[b].item<int64_t>())];
      const auto T = traj.observations.size(0);
      const auto si = torch::randint(T, {1}).item<int64_t>(), len = std::min(K, T - si), pad = K - len;
      auto s = traj.observations.narrow(0, si, len);
      // FACT: o = torch.randn(50, 4); s = o.narrow(0, 3, 5); o0 = o.clone(); s = (s - o.mean(0)) / o.std(0); assert torch.equal(o, o0) and is_copy_of(s, o)
      s = (s - norm_.mean) / norm_.stdev; // LOOKALIKE: tensor-alias-then-mutate -- out of place: s is rebound to a new tensor
      auto r = traj.rtg.narrow(0, si, len).reshape({len, 1});
      // FACT: rtg = torch.arange(50.0).flip(0); r = rtg.narrow(0, 10, 20).reshape(20, 1); r.div_(1000.0); assert shares_storage(r, rtg) and rtg[10] < 1
      r.div_(cfg_.rtg_scale); // EXPECT: tensor-alias-then-mutate -- reshape of a row range is a view: the dataset's returns-to-go shrink by rtg_scale every time a segment is drawn
      batch.states[b].narrow(0, pad, len).copy_(s);
      batch.actions[b].narrow(0, pad, len).copy_(traj.actions.narrow(0, si, len));
      batch.rtg[b].narrow(0, pad, len).copy_(r);
      batch.timesteps[b].narrow(0, pad, len).copy_(torch::arange(si, si + len)); // LOOKALIKE: tensor-copy-narrowing -- arange of integers is int64, like the destination
      batch.mask[b].narrow(0, pad, len).fill_(1);
    }
    batch.timesteps.clamp_max_(cfg_.max_ep_len - 1);
    return batch;
  }

  const StateNorm &norm() const { return norm_; }

private:
  std::vector<Trajectory> trajs_;
  DTConfig cfg_;
  StateNorm norm_;
  torch::Tensor sample_p_;
};

struct CausalBlockImpl : nn::Module {
  explicit CausalBlockImpl(const DTConfig &cfg) : n_head_(cfg.n_head) {
    const auto H = cfg.hidden;
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({H})));
    qkv = register_module("qkv", nn::Linear(H, 3 * H));
    proj = register_module("proj", nn::Linear(H, H));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({H})));
    mlp = register_module("mlp", nn::Sequential(nn::Linear(H, 4 * H), nn::GELU(), nn::Linear(4 * H, H), nn::Dropout(cfg.dropout)));
    drop = register_module("drop", nn::Dropout(cfg.dropout));
  }
  // x: [B, T, H]; key_mask: [B, T] int64, 0 on left padding.
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &key_mask) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2), hd = C / n_head_;
    // FACT: y = torch.nn.Linear(8, 24)(torch.nn.LayerNorm(8)(torch.randn(2, 5, 8))); assert is_view_of(y.view(2, 5, 3, 2, 4), y)
    auto parts = qkv(ln1(x)).view({B, T, 3, n_head_, hd}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto q = parts.select(2, 0).transpose(1, 2), k = parts.select(2, 1).transpose(1, 2), v = parts.select(2, 2).transpose(1, 2);
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att.masked_fill_(future.view({1, 1, T, T}) | (key_mask == 0).view({B, 1, 1, T}), -1e4); // LOOKALIKE: tensor-inplace-on-saved -- matmul saves q and k, and the scaling saves nothing
    auto y = torch::matmul(torch::softmax(att, -1), v); // [B, nh, T, hd]
    // FACT: y = torch.randn(2, 1, 5, 8).transpose(1, 2).contiguous(); assert is_contiguous(y) and is_view_of(y.view(2, 5, 8), y)
    y = y.transpose(1, 2).contiguous().view({B, T, C}); // LOOKALIKE: tensor-view-non-contiguous -- made contiguous first
    auto h = x + drop(proj(y));
    return h + mlp->forward(ln2(h));
  }
  int64_t n_head_;
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  nn::Linear qkv{nullptr}, proj{nullptr};
  nn::Sequential mlp{nullptr};
  nn::Dropout drop{nullptr};
};
TORCH_MODULE(CausalBlock);

struct DecisionTransformerImpl : nn::Module {
  explicit DecisionTransformerImpl(const DTConfig &cfg) : cfg_(cfg) {
    const auto H = cfg.hidden;
    embed_timestep = register_module("embed_timestep", nn::Embedding(cfg.max_ep_len, H));
    embed_return = register_module("embed_return", nn::Linear(1, H));
    embed_state = register_module("embed_state", nn::Linear(cfg.state_dim, H));
    embed_action = register_module("embed_action", nn::Linear(cfg.act_dim, H));
    embed_ln = register_module("embed_ln", nn::LayerNorm(nn::LayerNormOptions({H})));
    blocks = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layer; ++i)
      blocks->push_back(CausalBlock(cfg));
    ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({H})));
    predict_action = register_module("predict_action", nn::Linear(H, cfg.act_dim));
    action_scale_ = register_buffer("action_scale", torch::full({cfg.act_dim}, cfg.max_action));
    // GPT-2 initialisation: N(0, 0.02) for matrices, zero biases.
    for (auto &p : named_parameters()) {
      if (p.key().find("bias") != std::string::npos)
        nn::init::zeros_(p.value()); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
      else if (p.value().dim() >= 2)
        // FACT: w = torch.nn.Embedding(10, 4).weight; assert raises(lambda: w.normal_(0.0, 0.02), "a leaf Variable that requires grad")
        p.value().normal_(0.0, 0.02); // EXPECT: tensor-inplace-on-leaf -- written with grad mode on: PyTorch refuses the in-place init
    }
  }

  // Predicted actions [B, K, A], one per state token.
  torch::Tensor forward(const SegmentBatch &b) {
    const auto B = b.states.size(0), K = b.states.size(1), H = cfg_.hidden;
    auto time_emb = embed_timestep(b.timesteps);
    auto r = embed_return(b.rtg) + time_emb, s = embed_state(b.states) + time_emb, a = embed_action(b.actions) + time_emb;
    // FACT: r, s, a = torch.randn(3, 2, 5, 4).unbind(0); x = torch.stack([r, s, a], 1); t = x.permute(0, 2, 1, 3).reshape(2, 15, 4); assert is_copy_of(t, x)
    auto tokens = torch::stack({r, s, a}, 1).permute({0, 2, 1, 3}).reshape({B, 3 * K, H}); // EXPECT: tensor-reshape-non-contiguous -- stacked on dim 1 then permuted: interleaving copies every activation
    // FACT: m = torch.ones(2, 5, dtype=torch.long); x = torch.stack([m, m, m], 2); assert is_view_of(x.reshape(2, 15), x)
    auto mask = torch::stack({b.mask, b.mask, b.mask}, 2).reshape({B, 3 * K}); // LOOKALIKE: tensor-reshape-non-contiguous -- stacked on the last dim: already interleaved, a view
    auto h = embed_ln(tokens);
    for (size_t i = 0; i < blocks->size(); ++i)
      h = blocks->ptr<CausalBlockImpl>(i)->forward(h, mask);
    // FACT: h = torch.nn.LayerNorm(4)(torch.randn(2, 15, 4)); assert is_view_of(h.reshape(2, 5, 3, 4), h)
    auto per_type = ln_f(h).reshape({B, K, 3, H}).permute({0, 2, 1, 3}); // LOOKALIKE: tensor-reshape-non-contiguous -- splits a contiguous dim: a view
    auto preds = torch::tanh(predict_action(per_type.select(1, 1)));
    // FACT: l = torch.nn.Linear(4, 3); y = torch.tanh(l(torch.randn(2, 4))); y.mul_(torch.full((3,), 2.0)); assert backward_fails(lambda: y.sum().backward())
    preds.mul_(action_scale_); // EXPECT: tensor-inplace-on-saved -- tanh saved its output for backward: the training step's backward() raises
    return preds;
  }

  // The last K steps of an episode, left-padded; returns the action for the latest state.
  torch::Tensor get_action(const torch::Tensor &states, const torch::Tensor &actions, const torch::Tensor &rtg, const torch::Tensor &timesteps) {
    const auto K = cfg_.context, n = states.size(0), T = std::min(K, n), pad = K - T;
    const auto opts = states.options();
    auto left = [&](const torch::Tensor &x, int64_t width) { return torch::cat({torch::zeros({pad, width}, opts), x.narrow(0, n - T, T)}).unsqueeze(0); };
    auto steps = timesteps.narrow(0, n - T, T);
    SegmentBatch seg{left(states, cfg_.state_dim), left(actions, cfg_.act_dim), left(rtg, 1),
                     torch::cat({torch::zeros({pad}, steps.options()), steps}).unsqueeze(0),
                     torch::cat({torch::zeros({pad}, opts.dtype(torch::kLong)), torch::ones({T}, opts.dtype(torch::kLong))}).unsqueeze(0)};
    return forward(seg)[0][-1];
  }

  DTConfig cfg_;
  nn::Embedding embed_timestep{nullptr};
  nn::Linear embed_return{nullptr}, embed_state{nullptr}, embed_action{nullptr}, predict_action{nullptr};
  nn::LayerNorm embed_ln{nullptr}, ln_f{nullptr};
  nn::ModuleList blocks{nullptr};
  torch::Tensor action_scale_;
};
TORCH_MODULE(DecisionTransformer);

// Gradient-norm clipping that stays on the device (nn::utils::clip_grad_norm_ reads the norm back).
void clip_grad_norm_on_device(const std::vector<torch::Tensor> &params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const auto &p : params)
    if (p.grad().defined())
      norms.push_back(p.grad().norm()); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
  auto coef = (max_norm / (torch::stack(norms).norm() + 1e-6)).clamp_max(1.0);
  for (const auto &p : params)
    if (p.grad().defined())
      p.grad().mul_(coef); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient is written, not the parameter
}

void train_dt(DecisionTransformer &model, const TrajectoryDataset &data, const DTConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  std::vector<torch::Tensor> action_mse;
  double running = 0;
  for (int64_t step = 0; step < cfg.steps; ++step) {
    const double lr = cfg.lr * std::min(1.0, static_cast<double>(step + 1) / static_cast<double>(cfg.warmup));
    for (auto &group : opt.param_groups())
      static_cast<torch::optim::AdamWOptions &>(group.options()).lr(lr);
    const auto cpu = data.sample(cfg.batch);
    SegmentBatch batch{cpu.states.to(device), cpu.actions.to(device), cpu.rtg.to(device), cpu.timesteps.to(device), cpu.mask.to(device)}; // LOOKALIKE: tensor-clone-in-loop -- a freshly sampled batch every step
    auto action_target = batch.actions.clone(); // EXPECT: tensor-unnecessary-clone -- nothing writes the actions or the copy: an extra pass over the batch every step
    auto preds = model->forward(batch);
    const auto A = preds.size(2);
    auto valid = batch.mask.reshape({-1}) > 0;
    // FACT: p = torch.tanh(torch.nn.Linear(4, 3)(torch.randn(2, 5, 4))) * 2.0; assert is_view_of(p.reshape(-1, 3), p)
    auto pred = preds.reshape({-1, A}).index({valid}); // LOOKALIKE: tensor-reshape-non-contiguous -- the head's output is contiguous: a view
    auto target = action_target.reshape({-1, A}).index({valid});
    auto loss = torch::mse_loss(pred, target);
    opt.zero_grad();
    loss.backward();
    clip_grad_norm_on_device(model->parameters(), cfg.clip);
    opt.step();
    action_mse.push_back(torch::mean((pred - target).pow(2))); // EXPECT: tensor-graph-kept-across-iterations -- pred still requires grad: every step's graph is chained into the diagnostics until the next log
    running += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- on a GPU every step waits here only to sum the loss
    if ((step + 1) % cfg.log_every == 0) {
      std::cout << "step " << step + 1 << " lr " << lr << " loss " << running / static_cast<double>(cfg.log_every) << " action mse "
                << torch::stack(action_mse).mean().item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
      running = 0;
      action_mse.clear();
    }
  }
}

struct StepResult {
  torch::Tensor obs; // [S] float32 from the simulator
  double reward = 0;
  bool done = false;
};

class Env {
public:
  virtual ~Env() = default;
  virtual torch::Tensor reset() = 0;
  virtual StepResult step(const torch::Tensor &action) = 0;
};

// One episode conditioned on cfg.target_return; returns the undiscounted return.
double rollout(DecisionTransformer &model, Env &env, const StateNorm &norm, const DTConfig &cfg) {
  torch::NoGradGuard no_grad;
  const torch::Device device(torch::kCUDA);
  model->eval();
  model->to(device);
  const auto opts = torch::TensorOptions().device(device);
  auto states = env.reset().to(device).unsqueeze(0); // [1, S]
  auto actions = torch::zeros({0, cfg.act_dim}, opts);
  auto rtg = torch::full({1, 1}, cfg.target_return / cfg.rtg_scale, opts); // [t + 1, 1]
  auto timesteps = torch::zeros({1}, opts.dtype(torch::kLong));
  double episode_return = 0;
  for (int64_t t = 0; t < cfg.max_ep_len; ++t) {
    actions = torch::cat({actions, torch::zeros({1, cfg.act_dim}, opts)}, 0); // LOOKALIKE: tensor-device-mismatch -- the padding row is made on the device
    auto normed = (states - norm.mean.to(device)) / norm.stdev.to(device); // EXPECT: tensor-clone-in-loop -- the same normalisation statistics are copied to the GPU at every environment step
    auto action = model->get_action(normed, actions, rtg, timesteps);
    actions[-1] = action;
    auto res = env.step(action.cpu()); // LOOKALIKE: tensor-sync-in-loop -- the simulator needs the action on the host
    episode_return += res.reward;
    if (res.done)
      break;
    states = torch::cat({states, res.obs.to(device).unsqueeze(0)}, 0);
    rtg = torch::cat({rtg, rtg[-1].unsqueeze(0) - res.reward / cfg.rtg_scale}, 0);
    timesteps = torch::cat({timesteps, torch::full({1}, std::min(t + 1, cfg.max_ep_len - 1), torch::kLong)}); // EXPECT: tensor-device-mismatch -- the new timestep is made on the CPU, the history lives on the GPU: cat throws
  }
  return episode_return;
}

double evaluate(DecisionTransformer &model, Env &env, const StateNorm &norm, const DTConfig &cfg) {
  double total = 0;
  for (int64_t e = 0; e < cfg.eval_episodes; ++e)
    total += rollout(model, env, norm, cfg);
  std::cout << "target " << cfg.target_return << " mean return " << total / static_cast<double>(cfg.eval_episodes) << "\n";
  return total / static_cast<double>(cfg.eval_episodes);
}
