// RLHF fine-tuning of a small causal LM with PPO: per-token KL penalty against a frozen copy of
// the initial policy (the reward model's score added at the last response token), GAE over the
// response tokens, clipped policy and value losses.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct PPOConfig {
  int64_t vocab_size = 8192, d_model = 256, n_heads = 4, n_layers = 4, max_len = 256;
  int64_t max_new_tokens = 48, kl_window = 16, mini_batch = 8;
  double temperature = 0.7, init_kl_coef = 0.2, target_kl = 6.0, gamma = 1.0, lam = 0.95;
  double clip_range = 0.2, clip_range_value = 0.2, vf_coef = 0.1, lr = 1.4e-5;
  int ppo_epochs = 4, log_every = 10;
};

// Pre-LN decoder block with causal multi-head self-attention.
class BlockImpl : public nn::Module {
 public:
  BlockImpl(int64_t d_model, int64_t n_heads) : n_heads_(n_heads) {
    ln1_ = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({d_model})));
    qkv_ = register_module("qkv", nn::Linear(d_model, 3 * d_model));
    proj_ = register_module("proj", nn::Linear(d_model, d_model));
    ln2_ = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({d_model})));
    mlp_ = register_module("mlp", nn::Sequential(nn::Linear(d_model, 4 * d_model), nn::GELU(),
                                                 nn::Linear(4 * d_model, d_model)));
  }

  // x: [B, T, C]; keep: [B, 1, T, T], true where attention is allowed
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& keep) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    const auto hd = C / n_heads_;
    auto parts = qkv_(ln1_(x)).chunk(3, -1);
    // FACT: qkv = torch.randn(2, 5, 24); q = qkv.chunk(3, -1)[0]; assert not is_contiguous(q) and is_view_of(q.view(2, 5, 4, 2), qkv)
    auto q = parts[0].view({B, T, n_heads_, hd}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- a chunk of the last dim: splitting that dim is still a view
    auto k = parts[1].view({B, T, n_heads_, hd}).transpose(1, 2);
    auto v = parts[2].view({B, T, n_heads_, hd}).transpose(1, 2);
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    att = torch::softmax(att.masked_fill(keep.logical_not(), -1e9), -1);
    auto y = torch::matmul(att, v);  // [B, H, T, hd]
    // FACT: y = torch.randn(2, 4, 5, 3); assert is_copy_of(y.transpose(1, 2).reshape(2, 5, 12), y)
    y = y.transpose(1, 2).reshape({B, T, C}); // EXPECT: tensor-reshape-non-contiguous
    x = x + proj_(y);
    return x + mlp_->forward(ln2_(x));
  }

 private:
  int64_t n_heads_;
  nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  nn::Linear qkv_{nullptr}, proj_{nullptr};
  nn::Sequential mlp_{nullptr};
};
TORCH_MODULE(Block);

struct PolicyOutput { torch::Tensor logits, values; };  // [B, T, V], [B, T]

class PolicyImpl : public nn::Module {
 public:
  explicit PolicyImpl(const PPOConfig& cfg) {
    tok_ = register_module("tok", nn::Embedding(cfg.vocab_size, cfg.d_model));
    pos_ = register_module("pos", nn::Embedding(cfg.max_len, cfg.d_model));
    blocks_ = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layers; ++i) blocks_->push_back(Block(cfg.d_model, cfg.n_heads));
    ln_f_ = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})));
    lm_head_ = register_module("lm_head", nn::Linear(nn::LinearOptions(cfg.d_model, cfg.vocab_size).bias(false)));
    value_head_ = register_module("value_head", nn::Linear(cfg.d_model, 1));
    causal_ = register_buffer("causal", torch::ones({cfg.max_len, cfg.max_len}, torch::kBool).tril());
  }

  PolicyOutput forward(const torch::Tensor& ids, const torch::Tensor& attn_mask) {
    const auto T = ids.size(1);
    auto positions = torch::arange(T, ids.options()).unsqueeze(0);
    auto h = tok_(ids) + pos_(positions);
    auto keep = (causal_.narrow(0, 0, T).narrow(1, 0, T).unsqueeze(0) & attn_mask.to(torch::kBool).unsqueeze(1)).unsqueeze(1);
    for (const auto& blk : *blocks_) h = blk->as<BlockImpl>()->forward(h, keep);
    h = ln_f_(h);
    return {lm_head_(h), value_head_(h).squeeze(-1)};
  }

 private:
  nn::Embedding tok_{nullptr}, pos_{nullptr};
  nn::ModuleList blocks_{nullptr};
  nn::LayerNorm ln_f_{nullptr};
  nn::Linear lm_head_{nullptr}, value_head_{nullptr};
  torch::Tensor causal_;  // [max_len, max_len] lower-triangular
};
TORCH_MODULE(Policy);

using RewardFn = std::function<torch::Tensor(const torch::Tensor&)>;

// The frozen reference: same weights as the policy at the start of training.
Policy make_reference(const Policy& policy, const PPOConfig& cfg) {
  Policy ref(cfg);
  ref->to(policy->parameters().front().device());
  torch::NoGradGuard no_grad;
  auto src = policy->named_parameters();
  for (auto& item : ref->named_parameters()) {
    item.value().copy_(src[item.key()]); // LOOKALIKE: tensor-inplace-on-leaf -- weight loading under NoGradGuard
    item.value().set_requires_grad(false);
  }
  ref->eval();
  return ref;
}

torch::Tensor token_logprobs(const torch::Tensor& logits, const torch::Tensor& tokens) {
  auto logp = F::log_softmax(logits, F::LogSoftmaxFuncOptions(-1));
  return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
}

torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask) {
  return (x * mask).sum() / mask.sum().clamp_min(1.0);
}

// Adaptive KL coefficient (Ziegler et al.), driven by a sliding window of observed KL values.
class AdaptiveKLController {
 public:
  explicit AdaptiveKLController(const PPOConfig& cfg)
      : coef_(cfg.init_kl_coef), target_(cfg.target_kl), window_(cfg.kl_window),
        recent_(torch::zeros({cfg.kl_window}, torch::kDouble)) {}
  double value() const { return coef_; }

  void update(double observed_kl, int64_t n_steps) {
    // drop the oldest entry, append the newest at the end
    // FACT: r = torch.randn(16, dtype=torch.double); assert raises(lambda: r.narrow(0, 0, 15).copy_(r.narrow(0, 1, 15)), "some elements of the input tensor")
    recent_.narrow(0, 0, window_ - 1).copy_(recent_.narrow(0, 1, window_ - 1)); // EXPECT: tensor-inplace-overlap
    recent_[window_ - 1] = observed_kl;
    seen_ = std::min(seen_ + 1, window_);
    const double smoothed = recent_.narrow(0, window_ - seen_, seen_).mean().item<double>();
    const double err = std::clamp(smoothed / target_ - 1.0, -0.2, 0.2);
    coef_ *= 1.0 + err * static_cast<double>(n_steps) / 10000.0;
  }

 private:
  double coef_, target_;
  int64_t window_, seen_ = 0;
  torch::Tensor recent_;
};

struct Rollout {
  torch::Tensor sequences, attn_mask;            // [B, P + R]
  torch::Tensor response_mask;                   // [B, R], 1.0 up to and including EOS
  torch::Tensor logprobs, ref_logprobs, values;  // [B, R]
  torch::Tensor scores;                          // [B]
  int64_t prompt_len = 0;
};

Rollout generate_rollout(Policy& policy, Policy& ref, const RewardFn& reward_fn,
                         const torch::Tensor& prompts, const torch::Tensor& prompt_mask,
                         const PPOConfig& cfg, int64_t eos_id) {
  torch::NoGradGuard no_grad;
  policy->eval();
  const auto B = prompts.size(0), P = prompts.size(1);
  auto seq = prompts, attn = prompt_mask;
  auto alive = torch::ones({B}, torch::TensorOptions().dtype(torch::kBool).device(prompts.device()));
  std::vector<torch::Tensor> step_masks;
  for (int64_t step = 0; step < cfg.max_new_tokens; ++step) {
    auto logits = policy->forward(seq, attn).logits.select(1, -1);
    auto probs = torch::softmax(logits / cfg.temperature, -1);
    auto next = torch::multinomial(probs, 1).squeeze(1);
    next = torch::where(alive, next, torch::full_like(next, eos_id));
    step_masks.push_back(alive.to(torch::kFloat));
    alive = alive & next.ne(eos_id);
    seq = torch::cat({seq, next.unsqueeze(1)}, 1);
    attn = torch::cat({attn, torch::ones_like(next).unsqueeze(1)}, 1);
    if (!alive.any().item<bool>()) break; // LOOKALIKE: tensor-sync-in-loop -- the value decides whether sampling stops
  }

  Rollout ro;
  ro.sequences = seq, ro.attn_mask = attn, ro.prompt_len = P;
  ro.response_mask = torch::stack(step_masks, 1);
  const auto R = ro.response_mask.size(1);
  auto response = seq.narrow(1, P, R);
  auto out = policy->forward(seq, attn);
  auto ref_out = ref->forward(seq, attn);
  // the logit at position t scores token t + 1
  ro.logprobs = token_logprobs(out.logits.narrow(1, P - 1, R), response);
  ro.ref_logprobs = token_logprobs(ref_out.logits.narrow(1, P - 1, R), response);
  ro.values = out.values.narrow(1, P - 1, R).contiguous();
  ro.scores = reward_fn(seq);
  policy->train();
  return ro;
}

struct RewardTerms {
  torch::Tensor rewards;        // KL penalty on every token, plus the score on the last one
  torch::Tensor non_score, kl;  // the KL part alone, for the logs
};

RewardTerms compute_rewards(const torch::Tensor& scores, const torch::Tensor& logprobs,
                            const torch::Tensor& ref_logprobs, const torch::Tensor& response_mask,
                            double kl_coef) {
  auto kl = (logprobs - ref_logprobs) * response_mask;
  torch::Tensor non_score = -kl_coef * kl;
  auto last = (response_mask.sum(1) - 1).clamp_min(0).to(torch::kLong);
  auto score_at_last = torch::zeros_like(non_score).scatter(1, last.unsqueeze(1), scores.unsqueeze(1));
  // FACT: ns = torch.zeros(2, 4); r = ns; r += torch.ones(2, 4); assert shares_storage(r, ns) and ns.sum().item() == 8
  torch::Tensor rewards = non_score;
  rewards += score_at_last; // EXPECT: tensor-alias-then-mutate
  return {rewards, non_score, kl};
}

// GAE over the response tokens; values come from the no-grad rollout.
std::pair<torch::Tensor, torch::Tensor> compute_gae(const torch::Tensor& rewards, const torch::Tensor& values,
                                                    const torch::Tensor& mask, double gamma, double lam) {
  const auto T = rewards.size(1);
  auto last_gae = torch::zeros({rewards.size(0)}, rewards.options());
  std::vector<torch::Tensor> reversed;
  for (int64_t t = T - 1; t >= 0; --t) {
    auto next_v = t + 1 < T ? values.select(1, t + 1) : torch::zeros_like(last_gae);
    auto delta = rewards.select(1, t) + gamma * next_v - values.select(1, t);
    last_gae = delta + gamma * lam * last_gae;
    reversed.push_back(last_gae); // LOOKALIKE: tensor-graph-kept-across-iterations -- rewards and values come from the NoGradGuard rollout: no graph
  }
  std::reverse(reversed.begin(), reversed.end());
  auto adv = torch::stack(reversed, 1);
  auto returns = adv + values;
  auto mean = masked_mean(adv, mask);
  adv = (adv - mean) * torch::rsqrt(masked_mean((adv - mean).pow(2), mask) + 1e-8) * mask;
  return {adv.detach(), returns.detach()};
}

struct PPOStats { double pg_loss = 0.0, entropy = 0.0, explained_var = 0.0; };

PPOStats ppo_update(Policy& policy, torch::optim::Optimizer& opt, const Rollout& ro,
                    const torch::Tensor& advantages, const torch::Tensor& returns, const PPOConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const auto B = ro.sequences.size(0), P = ro.prompt_len, R = ro.response_mask.size(1);
  auto seq_all = ro.sequences.to(device), attn_all = ro.attn_mask.to(device);
  auto mask_all = ro.response_mask.to(device), old_values_all = ro.values.to(device);
  auto adv_all = advantages.to(device), ret_all = returns.to(device);

  PPOStats stats;
  double entropy_sum = 0.0;
  int64_t steps = 0;
  std::vector<torch::Tensor> pg_history;  // per-minibatch policy loss, for the logs
  for (int epoch = 0; epoch < cfg.ppo_epochs; ++epoch) {
    auto perm = torch::randperm(B, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto kl_acc = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t n_mb = 0;
    for (int64_t start = 0; start + cfg.mini_batch <= B; start += cfg.mini_batch) {
      auto idx = perm.narrow(0, start, cfg.mini_batch);
      auto take = [&idx](const torch::Tensor& t) { return t.index_select(0, idx); };
      auto seq = take(seq_all), attn = take(attn_all), mask = take(mask_all);
      auto adv = take(adv_all), ret = take(ret_all), old_v = take(old_values_all);
      auto old_lp = ro.logprobs.to(device).index_select(0, idx); // EXPECT: tensor-clone-in-loop
      auto out = policy->forward(seq, attn);
      auto logits = out.logits.narrow(1, P - 1, R);
      auto response = seq.narrow(1, P, R);

      // entropy at the sampling temperature, for the logs
      auto scaled = logits.detach();
      scaled.div_(cfg.temperature); // EXPECT: tensor-inplace-on-detached
      auto ent_p = torch::softmax(scaled, -1);
      auto entropy = masked_mean(-(ent_p * torch::log_softmax(scaled, -1)).sum(-1), mask);

      auto new_lp = token_logprobs(logits, response);
      auto vpred = out.values.narrow(1, P - 1, R);
      auto log_ratio = (new_lp - old_lp) * mask;
      auto ratio = torch::exp(log_ratio);
      ratio.masked_fill_(mask.logical_not(), 1.0); // EXPECT: tensor-inplace-on-saved
      auto pg1 = -adv * ratio;
      auto pg2 = -adv * torch::clamp(ratio, 1.0 - cfg.clip_range, 1.0 + cfg.clip_range);
      auto pg_loss = masked_mean(torch::max(pg1, pg2), mask);

      auto v_clipped = old_v + torch::clamp(vpred - old_v, -cfg.clip_range_value, cfg.clip_range_value);
      auto vf_loss = 0.5 * masked_mean(torch::max((vpred - ret).pow(2), (v_clipped - ret).pow(2)), mask);

      auto loss = pg_loss + cfg.vf_coef * vf_loss;
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(policy->parameters(), 1.0);
      opt.step();
      kl_acc += 0.5 * masked_mean(log_ratio.pow(2), mask).detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before it is kept
      entropy_sum += entropy.item<double>(); // EXPECT: tensor-sync-in-loop
      pg_history.push_back(pg_loss); // EXPECT: tensor-graph-kept-across-iterations
      ++n_mb;
      if (++steps % cfg.log_every == 0) std::cout << "  mb " << steps << " vf_loss " << vf_loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    // stop the PPO epochs early when the policy has moved too far from the rollout policy
    if (n_mb > 0 && kl_acc.item<double>() / n_mb > 1.5 * cfg.target_kl) break; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, and the value steers the loop
  }

  // FACT: a = torch.randn(3, 4); v = torch.randn(3, 6).narrow(1, 1, 4); r = a + v; assert is_contiguous(r) and is_view_of(r.reshape(-1), r)
  auto ret_flat = ret_all.reshape({-1}); // LOOKALIKE: tensor-reshape-non-contiguous -- returns is a fresh out-of-place sum, contiguous
  auto resid = ret_flat - old_values_all.flatten();
  stats.explained_var = 1.0 - (resid.var() / ret_flat.var().clamp_min(1e-8)).item<double>();
  if (!pg_history.empty()) stats.pg_loss = torch::stack(pg_history).mean().item<double>();
  stats.entropy = steps > 0 ? entropy_sum / static_cast<double>(steps) : 0.0;
  return stats;
}

void train_rlhf(Policy policy, const RewardFn& reward_fn,
                const std::vector<std::pair<torch::Tensor, torch::Tensor>>& prompt_batches,
                const PPOConfig& cfg, int64_t eos_id) {
  auto ref = make_reference(policy, cfg);
  torch::optim::AdamW opt(policy->parameters(), torch::optim::AdamWOptions(cfg.lr));
  AdaptiveKLController kl_ctl(cfg);

  for (size_t it = 0; it < prompt_batches.size(); ++it) {
    const auto& [prompts, prompt_mask] = prompt_batches[it];
    auto ro = generate_rollout(policy, ref, reward_fn, prompts, prompt_mask, cfg, eos_id);
    auto terms = compute_rewards(ro.scores, ro.logprobs, ro.ref_logprobs, ro.response_mask, kl_ctl.value());
    auto gae = compute_gae(terms.rewards, ro.values, ro.response_mask, cfg.gamma, cfg.lam);
    auto stats = ppo_update(policy, opt, ro, gae.first, gae.second, cfg);

    const double mean_kl = terms.kl.sum(1).mean().item<double>();
    kl_ctl.update(mean_kl, ro.sequences.size(0));
    std::cout << "iter " << it << " score " << ro.scores.mean().item<double>() << " kl " << mean_kl
              << " non_score " << terms.non_score.sum(1).mean().item<double>() << " pg " << stats.pg_loss
              << " ent " << stats.entropy << " ev " << stats.explained_var << " beta " << kl_ctl.value() << "\n";
  }
}
