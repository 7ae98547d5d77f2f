// DreamerV3-style actor-critic in imagination: symlog/symexp transforms, two-hot regression of
// returns over fixed bins, lambda-returns computed backwards over an imagined trajectory, and the
// percentile-EMA return normaliser used to scale advantages.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct DreamerConfig {
  int64_t feat_dim = 1536;  // deterministic + stochastic state
  int64_t hidden = 512;
  int64_t num_bins = 255;
  int64_t num_actions = 6;
  int64_t horizon = 15;
  double bin_low = -20.0, bin_high = 20.0;
  double gamma = 0.997, lambda = 0.95;
  double unimix = 0.01;
  double ret_decay = 0.99, ret_low_q = 0.05, ret_high_q = 0.95;
  double entropy_coef = 3e-4;
  double actor_lr = 3e-5, critic_lr = 3e-5;
};

inline torch::Tensor symlog(const torch::Tensor& x) { return torch::sign(x) * torch::log1p(torch::abs(x)); }

inline torch::Tensor symexp(const torch::Tensor& x) { return torch::sign(x) * (torch::exp(torch::abs(x)) - 1.0); }

// Two-hot encoding of symlog-space scalars over evenly spaced bins (and the matching decoder).
class TwoHotCodec {
 public:
  TwoHotCodec(int64_t num_bins, double low, double high)
      : bins_(torch::linspace(low, high, num_bins)), low_(low), step_((high - low) / (num_bins - 1)) {}

  // y: any shape, already in symlog space. Returns [y.numel(), num_bins].
  torch::Tensor encode(const torch::Tensor& y) const {
    const int64_t nb = bins_.size(0);
    auto flat = y.reshape({-1});
    auto pos = ((flat - low_) / step_).clamp(0.0, static_cast<double>(nb - 1));
    auto below = torch::empty({flat.size(0)}, torch::kLong);
    below.copy_(pos.floor().clamp(0, nb - 2));  // LOOKALIKE: tensor-copy-narrowing -- floor() and whole bounds: integral values
    auto above = below + 1;
    auto w_above = pos - below.to(torch::kFloat);
    auto out = torch::zeros({flat.size(0), nb});
    out.scatter_(1, below.unsqueeze(1), (1.0 - w_above).unsqueeze(1));
    out.scatter_add_(1, above.unsqueeze(1), w_above.unsqueeze(1));
    return out;
  }

  // logits: [N, num_bins] -> expected value in the original (symexp) space, [N].
  torch::Tensor decode(const torch::Tensor& logits) const {
    auto probs = torch::softmax(logits, -1);
    return symexp((probs * bins_).sum(-1));
  }

 private:
  torch::Tensor bins_;
  double low_;
  double step_;
};

struct CriticImpl : torch::nn::Module {
  explicit CriticImpl(const DreamerConfig& cfg)
      : trunk(register_module("trunk", torch::nn::Sequential(torch::nn::Linear(cfg.feat_dim, cfg.hidden),
                                                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})),
                                                              torch::nn::SiLU(), torch::nn::Linear(cfg.hidden, cfg.hidden),
                                                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})),
                                                              torch::nn::SiLU()))),
        head(register_module("head", torch::nn::Linear(cfg.hidden, cfg.num_bins))) {
    // DreamerV3 zero-initialises the output layer so the first predictions sit on the zero bin.
    torch::nn::init::zeros_(head->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    torch::nn::init::zeros_(head->bias);
  }

  torch::Tensor forward(const torch::Tensor& feats) { return head(trunk->forward(feats)); }

  torch::nn::Sequential trunk;
  torch::nn::Linear head;
};
TORCH_MODULE(Critic);

struct ActorImpl : torch::nn::Module {
  explicit ActorImpl(const DreamerConfig& cfg)
      : fc1(register_module("fc1", torch::nn::Linear(cfg.feat_dim, cfg.hidden))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})))),
        out(register_module("out", torch::nn::Linear(cfg.hidden, cfg.num_actions))),
        unimix_(cfg.unimix),
        num_actions_(cfg.num_actions) {}

  // Action probabilities with 1% uniform mixture, as in DreamerV3's categorical actor.
  torch::Tensor forward(const torch::Tensor& feats) {
    auto logits = out(F::silu(norm(fc1(feats))));
    auto probs = torch::softmax(logits, -1);
    probs.mul_(1.0 - unimix_).add_(unimix_ / static_cast<double>(num_actions_));  // EXPECT: tensor-inplace-on-saved
    return probs;
  }

  torch::nn::Linear fc1;
  torch::nn::LayerNorm norm;
  torch::nn::Linear out;
  double unimix_;
  int64_t num_actions_;
};
TORCH_MODULE(Actor);

// Scale S = max(1, EMA(P95) - EMA(P5)) of the lambda-returns.
class ReturnNormalizer {
 public:
  ReturnNormalizer(double decay, double low_q, double high_q) : decay_(decay), low_q_(low_q), high_q_(high_q) {}

  torch::Tensor update(const torch::Tensor& returns) {
    torch::NoGradGuard no_grad;
    auto r = returns.detach().clone();  // EXPECT: tensor-unnecessary-clone
    r.clamp_(-1e6, 1e6);  // LOOKALIKE: tensor-inplace-on-detached -- writes an owned clone, not 'returns'
    auto flat = r.flatten();
    auto lo = torch::quantile(flat, low_q_);
    auto hi = torch::quantile(flat, high_q_);
    if (!low_ema_.defined()) {
      low_ema_ = lo;
      high_ema_ = hi;
    } else {
      auto prev_low = low_ema_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- snapshot: low_ema_ is updated in place next
      low_ema_.mul_(decay_).add_(lo, 1.0 - decay_);
      high_ema_.mul_(decay_).add_(hi, 1.0 - decay_);
      drift_ = (low_ema_ - prev_low).abs().item<double>();
    }
    return torch::clamp_min(high_ema_ - low_ema_, 1.0);
  }

  double drift() const { return drift_; }

 private:
  double decay_, low_q_, high_q_;
  double drift_ = 0.0;
  torch::Tensor low_ema_, high_ema_;
};

// R_t = r_t + gamma * c_t * ((1 - lambda) * v_{t+1} + lambda * R_{t+1}), with R_H = v_H.
// rewards, continues: [H, B]; values: [H + 1, B]. All inputs are targets (no gradient).
torch::Tensor lambda_returns(const torch::Tensor& rewards, const torch::Tensor& values, const torch::Tensor& continues,
                             double gamma, double lambda) {
  torch::NoGradGuard no_grad;
  const int64_t horizon = rewards.size(0);
  std::vector<torch::Tensor> rets;
  auto next = values[horizon];
  for (int64_t t = horizon - 1; t >= 0; --t) {
    auto boot = (1.0 - lambda) * values[t + 1] + lambda * next;
    next = rewards[t] + gamma * continues[t] * boot;
    rets.push_back(next);  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard
  }
  std::reverse(rets.begin(), rets.end());
  return torch::stack(rets);
}

// Imagination starts from every posterior state of the replayed [B, T] batch, flattened time-major
// like the rest of the imagination code.
std::pair<torch::Tensor, torch::Tensor> start_states(const torch::Tensor& post_feats, const torch::Tensor& is_terminal) {
  const int64_t feat_dim = post_feats.size(-1);
  // FACT: p = torch.randn(16, 64, 32); s = p.transpose(0, 1).reshape(-1, 32); assert is_copy_of(s, p)
  auto start = post_feats.transpose(0, 1).reshape({-1, feat_dim});  // EXPECT: tensor-reshape-non-contiguous
  // FACT: m = torch.rand(16, 64); assert raises(lambda: m.transpose(0, 1).view(-1), "view size is not compatible")
  auto start_cont = 1.0 - is_terminal.transpose(0, 1).view({-1});  // EXPECT: tensor-view-non-contiguous
  return {start.detach(), start_cont};
}

class LatentModel {
 public:
  virtual ~LatentModel() = default;
  virtual torch::Tensor img_step(const torch::Tensor& feat, const torch::Tensor& action) = 0;
  virtual torch::Tensor reward(const torch::Tensor& feats) = 0;      // decoded reward, [H, B]
  virtual torch::Tensor cont_logit(const torch::Tensor& feats) = 0;  // [H, B]
};

class ImaginationTrainer {
 public:
  explicit ImaginationTrainer(const DreamerConfig& cfg)
      : cfg_(cfg),
        actor_(cfg),
        critic_(cfg),
        codec_(cfg.num_bins, cfg.bin_low, cfg.bin_high),
        ret_norm_(cfg.ret_decay, cfg.ret_low_q, cfg.ret_high_q),
        actor_opt_(actor_->parameters(), torch::optim::AdamOptions(cfg.actor_lr).eps(1e-5)),
        critic_opt_(critic_->parameters(), torch::optim::AdamOptions(cfg.critic_lr).eps(1e-5)) {}

  void train_step(LatentModel& wm, const torch::Tensor& post_feats, const torch::Tensor& is_terminal) {
    auto [start, start_cont] = start_states(post_feats, is_terminal);
    const int64_t B = start.size(0);
    const int64_t H = cfg_.horizon;

    std::vector<torch::Tensor> feat_seq{start};
    std::vector<torch::Tensor> logp_seq, ent_seq;
    auto feat = start;
    for (int64_t t = 0; t < H; ++t) {
      auto probs = actor_->forward(feat);
      auto action = torch::multinomial(probs, 1).squeeze(1);
      logp_seq.push_back(probs.gather(1, action.unsqueeze(1)).squeeze(1).log());  // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked into the actor loss and backpropagated
      ent_seq.push_back(-(probs * probs.log()).sum(-1));
      {
        torch::NoGradGuard no_grad;
        feat = wm.img_step(feat, action);
      }
      feat_seq.push_back(feat);
    }
    auto feats = torch::stack(feat_seq);  // [H + 1, B, D]

    torch::Tensor rewards, cont;
    {
      torch::NoGradGuard no_grad;
      auto next_feats = feats.narrow(0, 1, H);
      rewards = wm.reward(next_feats);
      auto cont_flags = torch::empty({H, B}, torch::kBool);
      cont_flags.copy_(torch::sigmoid(wm.cont_logit(next_feats)));  // EXPECT: tensor-copy-narrowing
      cont = cont_flags.to(torch::kFloat);
    }

    auto critic_logits = critic_->forward(feats.detach().flatten(0, 1));  // [(H + 1) * B, bins]
    // FACT: d = torch.randn(16 * 4); assert is_view_of(d.view(16, 4), d)
    auto values = codec_.decode(critic_logits).view({H + 1, B});  // LOOKALIKE: tensor-view-non-contiguous -- decode() returns a fresh contiguous vector
    auto boot = values.detach();
    boot.narrow(0, 1, H).mul_(cont);  // EXPECT: tensor-inplace-on-detached
    auto returns = lambda_returns(rewards, boot, cont, cfg_.gamma, cfg_.lambda);  // [H, B]
    auto weight = torch::cumprod(torch::cat({start_cont.unsqueeze(0), cont.narrow(0, 0, H - 1)}, 0), 0);

    // Actor: REINFORCE on normalised advantages (R - v) / max(1, S).
    auto scale = ret_norm_.update(returns);
    auto baseline = values.narrow(0, 0, H).detach();
    auto adv = returns;
    // FACT: R = torch.randn(15, 8); a = R; a.sub_(torch.randn(15, 8)).div_(2.0); assert shares_storage(a, R)
    adv.sub_(baseline).div_(scale);  // EXPECT: tensor-alias-then-mutate
    auto logp = torch::stack(logp_seq);
    auto ent = torch::stack(ent_seq);
    auto actor_loss = -(weight * (logp * adv + cfg_.entropy_coef * ent)).mean();

    // Critic: categorical cross-entropy against the two-hot symlog returns.
    auto sym_ret = symlog(returns);
    // FACT: R = torch.randn(15, 8); s = torch.sign(R) * torch.log1p(torch.abs(R)); assert is_copy_of(s, R)
    sym_ret.clamp_(cfg_.bin_low, cfg_.bin_high);  // LOOKALIKE: tensor-alias-then-mutate -- symlog() returns a new tensor
    auto target_twohot = codec_.encode(sym_ret);  // [H * B, bins]
    // FACT: c = torch.randn(16 * 4, 255).view(16, 4, 255).narrow(0, 0, 15); assert is_view_of(c.reshape(15 * 4, 255), c)
    auto step_logits = critic_logits.view({H + 1, B, -1}).narrow(0, 0, H).reshape({H * B, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- a leading narrow stays contiguous
    auto per_step = -(target_twohot * F::log_softmax(step_logits, F::LogSoftmaxFuncOptions(-1))).sum(-1);
    per_step.mul_(weight.reshape({-1}));  // LOOKALIKE: tensor-inplace-on-saved -- sum and neg save nothing
    auto critic_loss = per_step.mean();

    actor_opt_.zero_grad();
    critic_opt_.zero_grad();
    (actor_loss + critic_loss).backward();
    torch::nn::utils::clip_grad_norm_(actor_->parameters(), 100.0);
    torch::nn::utils::clip_grad_norm_(critic_->parameters(), 100.0);
    actor_opt_.step();
    critic_opt_.step();

    std::cout << "actor " << actor_loss.item<double>() << " critic " << critic_loss.item<double>() << " scale "
              << scale.item<double>() << " ret_drift " << ret_norm_.drift() << "\n";
  }

 private:
  DreamerConfig cfg_;
  Actor actor_;
  Critic critic_;
  TwoHotCodec codec_;
  ReturnNormalizer ret_norm_;
  torch::optim::Adam actor_opt_;
  torch::optim::Adam critic_opt_;
};
