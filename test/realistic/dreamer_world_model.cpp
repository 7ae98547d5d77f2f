// Dreamer-style agent (Hafner et al. 2020) for pixel-based continuous control. The world model
// is a conv encoder, an RSSM (GRUCell deterministic path plus a diagonal-Gaussian stochastic
// state sampled with the reparameterisation trick), a conv decoder and reward / continuation
// heads; it trains on [B, T] sequences from the episode buffer with reconstruction, reward and
// KL (free nats) losses. The actor and critic train on imagined rollouts started from every
// posterior state: lambda-returns bootstrapped by a slowly updated copy of the critic.
#include <torch/torch.h>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

namespace nn = torch::nn;

struct DreamerConfig {
  int64_t channels = 3, action_dim = 6, embed = 1024, deter = 200, stoch = 30, hidden = 300;
  int64_t horizon = 15, batch = 50, seq_len = 50, train_steps = 100, slow_every = 100, log_every = 10;
  double free_nats = 3.0, kl_scale = 1.0, gamma = 0.99, lambda = 0.95, min_std = 0.1;
  double model_lr = 6e-4, actor_lr = 8e-5, critic_lr = 8e-5, grad_clip = 100.0;
  int64_t feat() const { return stoch + deter; }
};

struct RssmState {
  torch::Tensor mean, std, stoch, deter;
};

struct EncoderImpl : nn::Module {
  explicit EncoderImpl(int64_t channels) {
    c1 = register_module("c1", nn::Conv2d(nn::Conv2dOptions(channels, 32, 4).stride(2)));
    c2 = register_module("c2", nn::Conv2d(nn::Conv2dOptions(32, 64, 4).stride(2)));
    c3 = register_module("c3", nn::Conv2d(nn::Conv2dOptions(64, 128, 4).stride(2)));
    c4 = register_module("c4", nn::Conv2d(nn::Conv2dOptions(128, 256, 4).stride(2)));
  }
  // [N, C, 64, 64] -> [N, 1024]
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::elu(c3(torch::elu(c2(torch::elu(c1(x))))));
    h = torch::elu(c4(h));
    // FACT: h = torch.nn.functional.elu(torch.nn.Conv2d(8, 4, 4, stride=2)(torch.randn(3, 8, 6, 6))); assert is_view_of(h.view(3, -1), h)
    return h.view({x.size(0), -1}); // LOOKALIKE: tensor-view-non-contiguous -- a conv output is contiguous
  }
  nn::Conv2d c1{nullptr}, c2{nullptr}, c3{nullptr}, c4{nullptr};
};
TORCH_MODULE(Encoder);

struct DecoderImpl : nn::Module {
  DecoderImpl(int64_t feat, int64_t channels) {
    fc = register_module("fc", nn::Linear(feat, 1024));
    d1 = register_module("d1", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(1024, 128, 5).stride(2)));
    d2 = register_module("d2", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(128, 64, 5).stride(2)));
    d3 = register_module("d3", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(64, 32, 6).stride(2)));
    d4 = register_module("d4", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(32, channels, 6).stride(2)));
  }
  // [N, feat] -> mean image [N, C, 64, 64]
  torch::Tensor forward(const torch::Tensor &feat) {
    // FACT: f = torch.nn.Linear(5, 16)(torch.randn(3, 5)); assert is_view_of(f.view(3, -1, 1, 1), f)
    auto h = fc(feat).view({feat.size(0), -1, 1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    h = torch::elu(d3(torch::elu(d2(torch::elu(d1(h))))));
    return d4(h);
  }
  nn::Linear fc{nullptr};
  nn::ConvTranspose2d d1{nullptr}, d2{nullptr}, d3{nullptr}, d4{nullptr};
};
TORCH_MODULE(Decoder);

struct RssmImpl : nn::Module {
  explicit RssmImpl(const DreamerConfig &cfg) : min_std_(cfg.min_std), stoch_(cfg.stoch), deter_(cfg.deter) {
    img_in = register_module("img_in", nn::Linear(cfg.stoch + cfg.action_dim, cfg.hidden));
    cell = register_module("cell", nn::GRUCell(cfg.hidden, cfg.deter));
    prior_fc = register_module("prior_fc", nn::Linear(cfg.deter, cfg.hidden));
    prior_out = register_module("prior_out", nn::Linear(cfg.hidden, 2 * cfg.stoch));
    post_fc = register_module("post_fc", nn::Linear(cfg.deter + cfg.embed, cfg.hidden));
    post_out = register_module("post_out", nn::Linear(cfg.hidden, 2 * cfg.stoch));
  }

  RssmState initial(int64_t n, const torch::TensorOptions &opts) const {
    auto z = torch::zeros({n, stoch_}, opts);
    return {z, z + 1.0, z, torch::zeros({n, deter_}, opts)};
  }

  RssmState gaussian(const torch::Tensor &stats, const torch::Tensor &deter) const {
    auto parts = stats.chunk(2, -1);
    auto std = torch::softplus(parts[1]) + min_std_;
    return {parts[0], std, parts[0] + std * torch::randn_like(std), deter};
  }

  // Prior: one step of the dynamics without looking at the observation.
  RssmState img_step(const RssmState &prev, const torch::Tensor &action) {
    auto x = torch::elu(img_in(torch::cat({prev.stoch, action}, -1)));
    auto deter = cell(x, prev.deter);
    return gaussian(prior_out(torch::elu(prior_fc(deter))), deter);
  }

  // Posterior and prior for one observed step.
  std::pair<RssmState, RssmState> obs_step(const RssmState &prev, const torch::Tensor &action,
                                           const torch::Tensor &embed) {
    auto prior = img_step(prev, action);
    auto post = gaussian(post_out(torch::elu(post_fc(torch::cat({prior.deter, embed}, -1)))), prior.deter);
    return {post, prior};
  }

  double min_std_;
  int64_t stoch_, deter_;
  nn::Linear img_in{nullptr}, prior_fc{nullptr}, prior_out{nullptr}, post_fc{nullptr}, post_out{nullptr};
  nn::GRUCell cell{nullptr};
};
TORCH_MODULE(Rssm);

// KL(q || p) of diagonal Gaussians, summed over the latent: [..., stoch] -> [...]
torch::Tensor kl_normal(const RssmState &q, const RssmState &p) {
  auto var_ratio = (q.std / p.std).pow(2);
  auto mean_term = ((q.mean - p.mean) / p.std).pow(2);
  return 0.5 * (var_ratio + mean_term - 1.0 - var_ratio.log()).sum(-1);
}

struct ModelOut {
  torch::Tensor recon, reward, cont, kl; // scalar losses; kl before free nats
  torch::Tensor post_stoch, post_deter;  // [T, B, .], time-major
};

struct WorldModelImpl : nn::Module {
  explicit WorldModelImpl(const DreamerConfig &cfg) {
    encoder = register_module("encoder", Encoder(cfg.channels));
    rssm = register_module("rssm", Rssm(cfg));
    decoder = register_module("decoder", Decoder(cfg.feat(), cfg.channels));
    reward_head = register_module("reward", nn::Sequential(nn::Linear(cfg.feat(), cfg.hidden), nn::ELU(),
                                                           nn::Linear(cfg.hidden, 1)));
    cont_head = register_module("cont", nn::Sequential(nn::Linear(cfg.feat(), cfg.hidden), nn::ELU(),
                                                       nn::Linear(cfg.hidden, 1)));
  }

  static torch::Tensor feature(const RssmState &s) { return torch::cat({s.stoch, s.deter}, -1); }

  // obs [B, T, C, H, W] in [-0.5, 0.5], action [B, T, A] (the action before each frame), reward and cont [B, T]
  ModelOut observe(const torch::Tensor &obs, const torch::Tensor &action, const torch::Tensor &reward,
                   const torch::Tensor &cont) {
    const auto B = obs.size(0), T = obs.size(1);
    // FACT: o = torch.rand(4, 5, 3, 8, 8); e = torch.randn(20, 16); assert is_view_of(o.view(20, 3, 8, 8), o) and is_view_of(e.view(4, 5, -1), e)
    auto embed = encoder(obs.view({B * T, obs.size(2), obs.size(3), obs.size(4)})).view({B, T, -1}); // LOOKALIKE: tensor-view-non-contiguous -- the buffer's batch and the encoder's output are contiguous
    auto state = rssm->initial(B, obs.options());
    std::vector<torch::Tensor> stochs, deters, kls;
    for (int64_t t = 0; t < T; ++t) {
      auto [post, prior] = rssm->obs_step(state, action.select(1, t), embed.select(1, t));
      kls.push_back(kl_normal(post, prior)); // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked into the KL loss, which is differentiated
      stochs.push_back(post.stoch);
      deters.push_back(post.deter);
      state = post;
    }
    auto post_stoch = torch::stack(stochs), post_deter = torch::stack(deters);
    auto feat = torch::cat({post_stoch, post_deter}, -1); // [T, B, F]
    // FACT: f = torch.randn(5, 4, 7); assert is_copy_of(f.transpose(0, 1).reshape(20, 7), f)
    auto flat = feat.transpose(0, 1).reshape({B * T, -1}); // EXPECT: tensor-reshape-non-contiguous -- time-major to batch-major: all features are copied to merge B and T
    auto target = obs.view({B * T, obs.size(2), obs.size(3), obs.size(4)});
    ModelOut out;
    out.recon = (decoder(flat) - target).pow(2).sum({1, 2, 3}).mean();
    out.reward = torch::mse_loss(reward_head->forward(flat).squeeze(-1), reward.reshape({-1}));
    out.cont = torch::binary_cross_entropy_with_logits(cont_head->forward(flat).squeeze(-1), cont.reshape({-1}));
    out.kl = torch::stack(kls).mean();
    out.post_stoch = post_stoch;
    out.post_deter = post_deter;
    return out;
  }

  Encoder encoder{nullptr};
  Rssm rssm{nullptr};
  Decoder decoder{nullptr};
  nn::Sequential reward_head{nullptr}, cont_head{nullptr};
};
TORCH_MODULE(WorldModel);

struct ActorImpl : nn::Module {
  ActorImpl(const DreamerConfig &cfg) : min_std_(cfg.min_std) {
    body = register_module("body", nn::Sequential(nn::Linear(cfg.feat(), cfg.hidden), nn::ELU(),
                                                  nn::Linear(cfg.hidden, cfg.hidden), nn::ELU()));
    mean_ = register_module("mean", nn::Linear(cfg.hidden, cfg.action_dim));
    std_ = register_module("std", nn::Linear(cfg.hidden, cfg.action_dim));
  }
  // A tanh-squashed Gaussian sample, reparameterised so returns backpropagate into the policy.
  torch::Tensor forward(const torch::Tensor &feat) {
    auto h = body->forward(feat);
    auto mean = 5.0 * torch::tanh(mean_(h) / 5.0);
    auto std = torch::softplus(std_(h) + 0.54) + min_std_;
    auto action = torch::tanh(mean + std * torch::randn_like(std));
    // FACT: m = torch.randn(4, 2, requires_grad=True); a = torch.tanh(m * 2); a.clamp_(-0.999, 0.999); assert backward_fails(lambda: a.sum().backward())
    action.clamp_(-0.999, 0.999); // EXPECT: tensor-inplace-on-saved -- tanh saved its result: the actor loss cannot backpropagate through the imagined actions
    return action;
  }
  double min_std_;
  nn::Sequential body{nullptr};
  nn::Linear mean_{nullptr}, std_{nullptr};
};
TORCH_MODULE(Actor);

nn::Sequential make_critic(const DreamerConfig &cfg) {
  return nn::Sequential(nn::Linear(cfg.feat(), cfg.hidden), nn::ELU(), nn::Linear(cfg.hidden, cfg.hidden), nn::ELU(),
                        nn::Linear(cfg.hidden, 1));
}

// Rollout of `horizon` prior steps from every posterior state; returns features [H + 1, N, F].
torch::Tensor imagine(WorldModel &wm, Actor &actor, const torch::Tensor &post_stoch, const torch::Tensor &post_deter,
                      int64_t horizon) {
  RssmState s;
  // FACT: s = torch.stack([torch.randn(4, 3) for _ in range(5)]); assert is_view_of(s.detach().reshape(-1, 3), s)
  s.stoch = post_stoch.detach().reshape({-1, post_stoch.size(-1)}); // LOOKALIKE: tensor-reshape-non-contiguous -- the stacked states are contiguous: a view
  s.deter = post_deter.detach().reshape({-1, post_deter.size(-1)});
  std::vector<torch::Tensor> feats{WorldModelImpl::feature(s)};
  for (int64_t h = 0; h < horizon; ++h) {
    auto a = actor(feats.back().detach());
    s = wm->rssm->img_step(s, a);
    feats.push_back(WorldModelImpl::feature(s)); // LOOKALIKE: tensor-graph-kept-across-iterations -- returned: the actor loss backpropagates through the rollout
  }
  return torch::stack(feats);
}

// TD(lambda) targets, computed backwards. reward, value, pcont: [H, N]; bootstrap: [N].
torch::Tensor lambda_return(const torch::Tensor &reward, const torch::Tensor &value, const torch::Tensor &pcont,
                            const torch::Tensor &bootstrap, double lambda) {
  auto next_values = torch::cat({value.slice(0, 1), bootstrap.unsqueeze(0)}, 0);
  auto inputs = reward + pcont * next_values * (1.0 - lambda);
  std::vector<torch::Tensor> outs(static_cast<size_t>(reward.size(0)));
  auto last = bootstrap;
  for (int64_t t = reward.size(0) - 1; t >= 0; --t) {
    last = inputs[t] + pcont[t] * lambda * last;
    outs[static_cast<size_t>(t)] = last; // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked and returned for the actor loss
  }
  return torch::stack(outs);
}

struct SequenceBatch { torch::Tensor obs, action, reward, cont; };

// Whole episodes on the host; observations stay uint8 until sampled.
class EpisodeBuffer {
public:
  void add(SequenceBatch episode) { episodes_.push_back(std::move(episode)); }
  SequenceBatch sample(int64_t batch, int64_t len, std::mt19937 &rng) const {
    std::uniform_int_distribution<size_t> pick(0, episodes_.size() - 1);
    std::vector<torch::Tensor> o, a, r, c;
    for (int64_t b = 0; b < batch; ++b) {
      const auto &ep = episodes_[pick(rng)];
      const auto start = std::uniform_int_distribution<int64_t>(0, ep.obs.size(0) - len)(rng);
      o.push_back(ep.obs.narrow(0, start, len));
      a.push_back(ep.action.narrow(0, start, len));
      r.push_back(ep.reward.narrow(0, start, len));
      c.push_back(ep.cont.narrow(0, start, len));
    }
    auto obs = torch::stack(o).to(torch::kFloat);
    // FACT: o = [torch.randint(0, 255, (5, 3, 4, 4), dtype=torch.uint8) for _ in range(2)]; s = torch.stack(o); f = s.to(torch.float); f.div_(255.0).sub_(0.5); assert is_copy_of(s, o[0]) and is_copy_of(f, s)
    obs.div_(255.0).sub_(0.5); // LOOKALIKE: tensor-alias-then-mutate -- stack made a new tensor and to(kFloat) of its uint8 frames another
    return {obs, torch::stack(a), torch::stack(r), torch::stack(c)};
  }

private:
  std::vector<SequenceBatch> episodes_;
};

void train_dreamer(WorldModel &wm, Actor &actor, nn::Sequential &critic, nn::Sequential &slow_critic,
                   const EpisodeBuffer &buffer, const DreamerConfig &cfg, std::mt19937 &rng) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  wm->to(device);
  actor->to(device);
  critic->to(device);
  slow_critic->to(device);
  torch::optim::Adam model_opt(wm->parameters(), torch::optim::AdamOptions(cfg.model_lr).eps(1e-5));
  torch::optim::Adam actor_opt(actor->parameters(), torch::optim::AdamOptions(cfg.actor_lr).eps(1e-5));
  torch::optim::Adam critic_opt(critic->parameters(), torch::optim::AdamOptions(cfg.critic_lr).eps(1e-5));
  auto free_nats = torch::full({}, cfg.free_nats);
  auto kl_total = torch::zeros({}, device);

  for (int64_t step = 0; step < cfg.train_steps; ++step) {
    auto seq = buffer.sample(cfg.batch, cfg.seq_len, rng);
    auto obs = seq.obs.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    auto out = wm->observe(obs, seq.action.to(device), seq.reward.to(device), seq.cont.to(device));
    auto kl_loss = torch::maximum(out.kl, free_nats.to(device)); // EXPECT: tensor-clone-in-loop -- the same free-nats constant is copied to the device at every step
    auto model_loss = out.recon + out.reward + out.cont + cfg.kl_scale * kl_loss;
    model_opt.zero_grad();
    model_loss.backward();
    nn::utils::clip_grad_norm_(wm->parameters(), cfg.grad_clip);
    model_opt.step();
    // FACT: m = torch.nn.Linear(3, 2); s = torch.zeros(()); exec('for _ in range(3):\n k = m(torch.randn(4, 3)).pow(2).mean(); k.backward(); s.add_(k)'); assert s.requires_grad and kept_nodes(s) >= 4
    kl_total.add_(out.kl); // EXPECT: tensor-graph-kept-across-iterations -- the raw KL keeps every step's posterior graph alive until the average is printed
    std::cout << "step " << step << " recon " << out.recon.item<float>() << "\n"; // EXPECT: tensor-sync-in-loop -- a log line that waits for the GPU at every step

    // Behaviour learning in imagination.
    auto feats = imagine(wm, actor, out.post_stoch, out.post_deter, cfg.horizon); // [H + 1, N, F]
    auto reward = wm->reward_head->forward(feats).squeeze(-1);
    auto cont = torch::sigmoid(wm->cont_head->forward(feats)).squeeze(-1); // P(the episode goes on)
    auto pcont = cont.detach();
    // FACT: c = torch.sigmoid(torch.randn(4, 3, requires_grad=True)); c0 = c.detach().clone(); d = c.detach(); d.mul_(0.99); assert shares_storage(d, c) and not torch.equal(c.detach(), c0)
    pcont.mul_(cfg.gamma); // EXPECT: tensor-inplace-on-detached -- detach() shares cont's storage: the survival weights below read discounted probabilities
    auto slow_v = slow_critic->forward(feats).squeeze(-1);
    auto returns = lambda_return(reward.slice(0, 0, -1), slow_v.slice(0, 0, -1), pcont.slice(0, 0, -1), slow_v[-1],
                                 cfg.lambda);
    // Probability that the imagined trajectory is still alive at each step (no discount).
    auto alive = torch::cumprod(torch::cat({torch::ones_like(cont.slice(0, 0, 1)), cont.slice(0, 0, -2)}, 0), 0).detach();
    auto actor_loss = -(alive * returns).mean();
    actor_opt.zero_grad();
    actor_loss.backward();
    nn::utils::clip_grad_norm_(actor->parameters(), cfg.grad_clip);
    actor_opt.step();
    auto value = critic->forward(feats.slice(0, 0, -1).detach()).squeeze(-1);
    auto critic_loss = 0.5 * (alive * (value - returns.detach()).pow(2)).mean();
    critic_opt.zero_grad();
    critic_loss.backward();
    nn::utils::clip_grad_norm_(critic->parameters(), cfg.grad_clip);
    critic_opt.step();
    if ((step + 1) % cfg.log_every == 0)
      std::cout << "  actor " << actor_loss.item<float>() << " critic " << critic_loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    if ((step + 1) % cfg.slow_every == 0) {
      torch::NoGradGuard no_grad;
      auto src = critic->parameters();
      auto dst = slow_critic->parameters();
      for (size_t i = 0; i < src.size(); ++i)
        dst[i].copy_(src[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
  }
  std::cout << "mean kl " << (kl_total / static_cast<double>(cfg.train_steps)).item<double>() << "\n";
}
