// Dreamer-style training: an RSSM with categorical latents learns from replayed sequences;
// actor and critic learn from imagined rollouts (lambda returns, REINFORCE, slow critic).
#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct RSSMConfig {
  int64_t obs_dim = 24, act_dim = 6, embed = 256, hidden = 512;
  int64_t deter = 512, stoch = 32, classes = 32;
  int64_t batch = 16, seq_len = 64, horizon = 15;
  double gamma = 0.997, lambda = 0.95;
  double kl_balance = 0.8, free_nats = 1.0, kl_scale = 1.0, unimix = 0.01;
  double actor_ent = 3e-4, slow_critic_mix = 0.02;
  bool use_continue_head = true;
  double lr_model = 1e-4, lr_actor = 3e-5, lr_critic = 3e-5;
  int64_t train_steps = 100000, log_every = 250, kl_window = 64;
};

struct State { torch::Tensor deter, stoch, logits; };
// time-major: [T, B, *]
struct Posterior { torch::Tensor deter, stoch, logits, prior_logits; };
// batch-major: [B, T, *]
struct SequenceBatch { torch::Tensor obs, actions, reward, is_first, is_terminal; };

struct SequenceReplay {
  virtual ~SequenceReplay() = default;
  virtual SequenceBatch sample(int64_t batch, int64_t length) = 0;
};

nn::Sequential mlp(int64_t in, int64_t hidden, int64_t out) {
  return nn::Sequential(nn::Linear(in, hidden), nn::ELU(), nn::Linear(hidden, hidden), nn::ELU(),
                        nn::Linear(hidden, out));
}

static torch::Tensor stack_field(const std::vector<State>& states, torch::Tensor State::*field) {
  std::vector<torch::Tensor> xs;
  xs.reserve(states.size());
  for (const auto& s : states) xs.push_back(s.*field);
  return torch::stack(xs, 0);
}

class RSSMImpl : public nn::Module {
 public:
  explicit RSSMImpl(const RSSMConfig& cfg)
      : deter_(cfg.deter), stoch_(cfg.stoch), classes_(cfg.classes), unimix_(cfg.unimix) {
    const auto z = cfg.stoch * cfg.classes;
    img_in_ = register_module("img_in", nn::Linear(z + cfg.act_dim, cfg.hidden));
    cell_ = register_module("cell", nn::GRUCell(cfg.hidden, cfg.deter));
    img_out_ = register_module("img_out", nn::Linear(cfg.deter, cfg.hidden));
    prior_head_ = register_module("prior_head", nn::Linear(cfg.hidden, z));
    obs_out_ = register_module("obs_out", nn::Linear(cfg.deter + cfg.embed, cfg.hidden));
    post_head_ = register_module("post_head", nn::Linear(cfg.hidden, z));
    init_deter_ = register_parameter("init_deter", torch::zeros({1, cfg.deter}));
  }
  State initial(int64_t B) {
    auto stoch = torch::zeros({B, stoch_ * classes_}, init_deter_.options());
    // learned initial deterministic state, shared by the batch
    return {torch::tanh(init_deter_).expand({B, deter_}), stoch, torch::zeros_like(stoch)};
  }
  torch::Tensor feature(const State& s) const { return torch::cat({s.stoch, s.deter}, -1); }
  // One-hot sample of each categorical with straight-through gradients.
  torch::Tensor sample_stoch(const torch::Tensor& logits) {
    const auto B = logits.size(0);
    // FACT: l = torch.nn.Linear(8, 12)(torch.randn(5, 8)); assert is_view_of(l.view(5, 3, 4), l)
    auto probs = torch::softmax(logits.view({B, stoch_, classes_}), -1);  // LOOKALIKE: tensor-view-non-contiguous -- the logits come from a Linear: contiguous
    probs.mul_(1.0 - unimix_).add_(unimix_ / static_cast<double>(classes_));  // EXPECT: tensor-inplace-on-saved
    auto idx = torch::multinomial(probs.detach().view({B * stoch_, classes_}), 1).view({B, stoch_});
    auto one_hot = F::one_hot(idx, classes_).to(probs.scalar_type());
    return (one_hot + probs - probs.detach()).view({B, -1});
  }
  State img_step(const State& prev, const torch::Tensor& action) {
    auto x = F::elu(img_in_->forward(torch::cat({prev.stoch, action}, -1)));
    auto deter = cell_->forward(x, prev.deter);
    auto logits = prior_head_->forward(F::elu(img_out_->forward(deter)));
    return {deter, sample_stoch(logits), logits};
  }
  std::pair<State, State> obs_step(const State& prev, const torch::Tensor& action,
                                   const torch::Tensor& embed) {
    auto prior = img_step(prev, action);
    auto x = F::elu(obs_out_->forward(torch::cat({prior.deter, embed}, -1)));
    auto logits = post_head_->forward(x);
    return {State{prior.deter, sample_stoch(logits), logits}, prior};
  }
  // embed [B, T, E], actions [B, T, A] (the action that led to each step), is_first [B, T]
  Posterior observe(const torch::Tensor& embed, const torch::Tensor& actions,
                    const torch::Tensor& is_first) {
    const auto B = embed.size(0), T = embed.size(1);
    const State init = initial(B);
    State prev = init;
    std::vector<State> posts, priors;
    for (int64_t t = 0; t < T; ++t) {
      auto keep = (1.0 - is_first.select(1, t)).unsqueeze(-1);  // [B, 1]
      prev.deter = keep * prev.deter + (1.0 - keep) * init.deter;
      prev.stoch = keep * prev.stoch;
      auto [post, prior] = obs_step(prev, keep * actions.select(1, t), embed.select(1, t));
      posts.push_back(post);
      priors.push_back(prior);
      prev = post;
    }
    return {stack_field(posts, &State::deter), stack_field(posts, &State::stoch),
            stack_field(posts, &State::logits), stack_field(priors, &State::logits)};
  }

 private:
  int64_t deter_, stoch_, classes_;
  double unimix_;
  nn::Linear img_in_{nullptr}, img_out_{nullptr}, prior_head_{nullptr};
  nn::Linear obs_out_{nullptr}, post_head_{nullptr};
  nn::GRUCell cell_{nullptr};
  torch::Tensor init_deter_;
};
TORCH_MODULE(RSSM);

class ActorImpl : public nn::Module {
 public:
  ActorImpl(int64_t feat_dim, int64_t hidden, int64_t act_dim)
      : net_(register_module("net", mlp(feat_dim, hidden, act_dim))) {}
  torch::Tensor sample(const torch::Tensor& feat) {  // one-hot action
    auto probs = torch::softmax(net_->forward(feat), -1);
    auto idx = torch::multinomial(probs, 1).squeeze(-1);
    return F::one_hot(idx, probs.size(-1)).to(probs.scalar_type());
  }
  // log-probability and entropy of given one-hot actions
  std::tuple<torch::Tensor, torch::Tensor> evaluate(const torch::Tensor& feat, const torch::Tensor& action) {
    auto logp_all = F::log_softmax(net_->forward(feat), F::LogSoftmaxFuncOptions(-1));
    return {(logp_all * action).sum(-1), -(logp_all.exp() * logp_all).sum(-1)};
  }
 private:
  nn::Sequential net_;
};
TORCH_MODULE(Actor);

torch::Tensor kl_categorical(const torch::Tensor& lhs, const torch::Tensor& rhs, int64_t S, int64_t C) {
  auto lp = F::log_softmax(lhs.reshape({-1, S, C}), F::LogSoftmaxFuncOptions(-1));
  auto lq = F::log_softmax(rhs.reshape({-1, S, C}), F::LogSoftmaxFuncOptions(-1));
  return (lp.exp() * (lp - lq)).sum({-2, -1});
}

struct KLTerms { torch::Tensor loss, value; };

KLTerms kl_balance(const torch::Tensor& post_logits, const torch::Tensor& prior_logits,
                   const RSSMConfig& cfg) {
  auto lhs = kl_categorical(post_logits.detach(), prior_logits, cfg.stoch, cfg.classes);  // trains the prior
  auto rhs = kl_categorical(post_logits, prior_logits.detach(), cfg.stoch, cfg.classes);  // regularises the posterior
  torch::Tensor lhs_loss = lhs;
  // FACT: a = torch.tensor([0.2, 3.0]); b = a; b.clamp_min_(1.0); assert shares_storage(a, b) and float(a.min()) == 1.0
  lhs_loss.clamp_min_(cfg.free_nats);  // EXPECT: tensor-alias-then-mutate
  auto rhs_loss = rhs.clamp_min(cfg.free_nats);
  KLTerms out;
  out.loss = cfg.kl_scale * (cfg.kl_balance * lhs_loss.mean() + (1.0 - cfg.kl_balance) * rhs_loss.mean());
  out.value = lhs.detach().mean();
  return out;
}

struct Trajectory { torch::Tensor feats, actions; };  // [H + 1, N, F], [H, N, A]

Trajectory imagine(RSSM& rssm, Actor& actor, const State& start, int64_t horizon) {
  std::vector<torch::Tensor> feats{rssm->feature(start)};
  std::vector<torch::Tensor> actions;
  State s = start;
  for (int64_t h = 0; h < horizon; ++h) {
    auto action = actor->sample(feats.back().detach());
    s = rssm->img_step(s, action);
    feats.push_back(rssm->feature(s));  // LOOKALIKE: tensor-graph-kept-across-iterations -- the trajectory is returned, one rollout per call
    actions.push_back(action);  // LOOKALIKE: tensor-graph-kept-across-iterations -- one-hot samples carry no graph
  }
  return {torch::stack(feats, 0), torch::stack(actions, 0)};
}

// R_t = r_t + d_t * ((1 - lam) * V_{t+1} + lam * R_{t+1}), bootstrapped from V_H
torch::Tensor lambda_returns(const torch::Tensor& reward, const torch::Tensor& value, const torch::Tensor& discount, double lam) {
  const auto H = reward.size(0);
  auto ret = torch::empty_like(reward);
  ret[H - 1] = reward[H - 1] + discount[H - 1] * value[H];
  for (int64_t t = H - 2; t >= 0; --t) {
    ret[t] = reward[t] + discount[t] * (1.0 - lam) * value[t + 1];
    // FACT: r = torch.randn(5, 3); d = torch.rand(5, 3); e = r[2].clone(); r[1].addcmul_(d[1], r[2], value=0.95); assert torch.equal(r[2], e)
    ret[t].addcmul_(discount[t], ret[t + 1], lam);  // LOOKALIKE: tensor-inplace-overlap -- rows t and t + 1 are disjoint
  }
  return ret;
}

void update_slow_critic(nn::Sequential& slow, nn::Sequential& critic, double mix) {
  torch::NoGradGuard no_grad;
  auto src = critic->parameters();
  auto dst = slow->parameters();
  for (size_t i = 0; i < dst.size(); ++i) {
    auto d = dst[i].data();
    d.mul_(1.0 - mix).add_(src[i], mix);  // LOOKALIKE: tensor-inplace-on-detached -- EMA of the critic, meant to write it, under NoGradGuard
  }
}

struct Heads { nn::Sequential reward{nullptr}, cont{nullptr}, critic{nullptr}, slow_critic{nullptr}; };

std::pair<double, double> behaviour_step(RSSM& rssm, Actor& actor, Heads& heads, torch::optim::Adam& actor_opt,
                                         torch::optim::Adam& critic_opt, const State& start, const RSSMConfig& cfg) {
  const auto H = cfg.horizon;
  auto traj = imagine(rssm, actor, start, H);
  const auto N = traj.feats.size(1);
  torch::Tensor returns, weight, baseline;
  {
    torch::NoGradGuard no_grad;
    auto next_feats = traj.feats.narrow(0, 1, H);
    auto reward = heads.reward->forward(next_feats).squeeze(-1);  // [H, N]
    // FACT: d = torch.full((1, 1), 0.99).expand(5, 4); c = torch.rand(5, 4); assert raises(lambda: d.mul_(c), "more than one element of the written-to tensor")
    auto discount = torch::full({1, 1}, cfg.gamma).expand({H, N});
    if (cfg.use_continue_head) {
      discount.mul_(torch::sigmoid(heads.cont->forward(next_feats)).squeeze(-1));  // EXPECT: tensor-inplace-on-expanded
    }
    auto value = heads.slow_critic->forward(traj.feats).squeeze(-1);  // [H + 1, N]
    returns = lambda_returns(reward, value, discount, cfg.lambda);
    weight = torch::cumprod(torch::cat({torch::ones({1, N}), discount.narrow(0, 0, H - 1)}, 0), 0);
    baseline = value.narrow(0, 0, H);
  }
  auto [logp, ent] = actor->evaluate(traj.feats.narrow(0, 0, H).detach(), traj.actions);
  auto adv = returns.detach();
  adv -= baseline;  // EXPECT: tensor-inplace-on-detached
  auto actor_loss = -(weight * (logp * adv + cfg.actor_ent * ent)).mean();
  actor_opt.zero_grad();
  actor_loss.backward();
  actor_opt.step();
  auto v = heads.critic->forward(traj.feats.narrow(0, 0, H).detach()).squeeze(-1);
  auto critic_loss = (0.5 * weight * (v - returns).pow(2)).mean();
  critic_opt.zero_grad();
  critic_loss.backward();
  critic_opt.step();
  update_slow_critic(heads.slow_critic, heads.critic, cfg.slow_critic_mix);
  return {actor_loss.item<double>(), critic_loss.item<double>()};
}

void train_dreamer(SequenceReplay& replay, const RSSMConfig& cfg) {
  const auto feat_dim = cfg.stoch * cfg.classes + cfg.deter;
  RSSM rssm(cfg);
  auto encoder = mlp(cfg.obs_dim, cfg.hidden, cfg.embed);
  auto decoder = mlp(feat_dim, cfg.hidden, cfg.obs_dim);
  Heads heads{mlp(feat_dim, cfg.hidden, 1), mlp(feat_dim, cfg.hidden, 1),
              mlp(feat_dim, cfg.hidden, 1), mlp(feat_dim, cfg.hidden, 1)};
  Actor actor(feat_dim, cfg.hidden, cfg.act_dim);
  update_slow_critic(heads.slow_critic, heads.critic, 1.0);
  auto wm_params = rssm->parameters();
  for (auto* m : {&encoder, &decoder, &heads.reward, &heads.cont}) {
    for (const auto& p : (*m)->parameters()) wm_params.push_back(p);
  }
  torch::optim::Adam wm_opt(wm_params, torch::optim::AdamOptions(cfg.lr_model).eps(1e-8));
  torch::optim::Adam actor_opt(actor->parameters(), torch::optim::AdamOptions(cfg.lr_actor));
  torch::optim::Adam critic_opt(heads.critic->parameters(), torch::optim::AdamOptions(cfg.lr_critic));
  // imagination starts: every posterior state of the batch, batch-major
  auto to_starts = [](const torch::Tensor& x) -> torch::Tensor {
    // FACT: x = torch.randn(6, 4, 10); r = x.detach().transpose(0, 1).reshape(-1, 10); assert is_copy_of(r, x)
    return x.detach().transpose(0, 1).reshape({-1, x.size(-1)});  // EXPECT: tensor-reshape-non-contiguous
  };
  torch::Tensor model_loss_sum = torch::zeros({});
  auto kl_window = torch::zeros({cfg.kl_window});  // newest first, for a robust KL log
  for (int64_t step = 1; step <= cfg.train_steps; ++step) {
    auto batch = replay.sample(cfg.batch, cfg.seq_len);
    const auto B = batch.obs.size(0), T = batch.obs.size(1);
    // FACT: o = torch.randn(4, 6, 5); assert is_view_of(o.view(24, -1), o)
    auto obs_flat = batch.obs.view({B * T, -1});  // LOOKALIKE: tensor-view-non-contiguous -- replayed batches are contiguous
    auto embed = encoder->forward(obs_flat).view({B, T, -1});
    auto post = rssm->observe(embed, batch.actions, batch.is_first);  // [T, B, *]
    auto feat = torch::cat({post.stoch, post.deter}, -1);              // [T, B, F]
    auto feat_bt = feat.transpose(0, 1);                                // [B, T, F], like obs
    // FACT: f = torch.randn(6, 4, 10); assert raises(lambda: f.transpose(0, 1).view(24, -1), "view size is not compatible")
    auto recon = decoder->forward(feat_bt.view({B * T, -1}));  // EXPECT: tensor-view-non-contiguous
    auto recon_loss = F::mse_loss(recon, obs_flat);
    auto reward_loss = F::mse_loss(heads.reward->forward(feat).squeeze(-1), batch.reward.transpose(0, 1));
    auto cont_loss = F::binary_cross_entropy_with_logits(heads.cont->forward(feat).squeeze(-1),
                                                         (1.0 - batch.is_terminal).transpose(0, 1));
    auto kl = kl_balance(post.logits, post.prior_logits, cfg);
    auto model_loss = recon_loss + reward_loss + cont_loss + kl.loss;
    wm_opt.zero_grad();
    model_loss.backward();
    wm_opt.step();
    model_loss_sum = model_loss_sum + model_loss;  // EXPECT: tensor-graph-kept-across-iterations
    const auto W = kl_window.size(0);
    // FACT: b = torch.randn(8); W = 8; assert raises(lambda: b.narrow(0, 1, W - 1).copy_(b.narrow(0, 0, W - 1)), "some elements of the input tensor")
    kl_window.narrow(0, 1, W - 1).copy_(kl_window.narrow(0, 0, W - 1));  // EXPECT: tensor-inplace-overlap
    kl_window[0] = kl.value.detach();
    State start{to_starts(post.deter), to_starts(post.stoch), to_starts(post.logits)};
    auto [actor_loss, critic_loss] = behaviour_step(rssm, actor, heads, actor_opt, critic_opt, start, cfg);
    if (step % cfg.log_every == 0) {
      // FACT: x = torch.randn(5, 4, 12); y = x.transpose(0, 1).reshape(4, 5, 3, 4); assert is_view_of(y, x)
      auto post_bt = post.logits.detach().transpose(0, 1).reshape({B, T, cfg.stoch, cfg.classes});  // LOOKALIKE: tensor-reshape-non-contiguous -- splits only the last dim: a view
      auto lp = F::log_softmax(post_bt, F::LogSoftmaxFuncOptions(-1));
      const double post_ent = -(lp.exp() * lp).sum(-1).mean().item<double>();
      std::cout << "step " << step << " model " << model_loss_sum.item<double>() / cfg.log_every
                << " kl (median) " << kl_window.median().item<double>() << " post entropy " << post_ent
                << " actor " << actor_loss << " critic " << critic_loss << std::endl;
      model_loss_sum = torch::zeros({});
    }
  }
}
