// QMIX (Rashid et al., 2018) for cooperative multi-agent RL: a shared recurrent
// agent network gives per-agent utilities, a hypernetwork conditioned on the
// global state mixes them monotonically into Q_tot.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct QMixConfig {
  int64_t n_agents = 5, obs_dim = 80, state_dim = 120, n_actions = 11;
  int64_t rnn_hidden = 64, mixing_embed = 32, hypernet_embed = 64;
  int64_t episode_limit = 120, buffer_episodes = 5000, batch_episodes = 32;
  int64_t target_update_interval = 200;  // episodes
  double gamma = 0.99, lr = 5e-4, grad_norm_clip = 10.0;
};

// One episode as the runner collected it (time first).
struct Episode {
  torch::Tensor obs;            // [len + 1, N, obs_dim]
  torch::Tensor state;          // [len + 1, S]
  torch::Tensor avail_actions;  // [len + 1, N, A]
  torch::Tensor actions;        // [len, N, 1] int64
  torch::Tensor reward;         // [len, 1]
  int64_t length = 0;
  bool terminated = false;
};

// A sampled batch: [B, T + 1, ...] on the host.
struct EpisodeBatch {
  torch::Tensor obs, state, avail_actions, actions, reward, terminated, filled;
};

class EpisodeReplayBuffer {
 public:
  explicit EpisodeReplayBuffer(const QMixConfig& cfg) : capacity_(cfg.buffer_episodes) {
    const int64_t L = cfg.episode_limit + 1;
    obs_ = torch::zeros({capacity_, L, cfg.n_agents, cfg.obs_dim});
    state_ = torch::zeros({capacity_, L, cfg.state_dim});
    avail_ = torch::zeros({capacity_, L, cfg.n_agents, cfg.n_actions});
    actions_ = torch::zeros({capacity_, L, cfg.n_agents, 1}, torch::kLong);
    reward_ = torch::zeros({capacity_, L, 1});
    terminated_ = torch::zeros({capacity_, L, 1}, torch::kByte);
    filled_ = torch::zeros({capacity_, L, 1}, torch::kByte);
  }

  void insert(const Episode& ep) {
    const int64_t slot = next_;
    const int64_t len = ep.length;
    for (auto* buf : {&obs_, &state_, &avail_, &actions_, &reward_, &terminated_, &filled_}) {
      (*buf)[slot].zero_();
    }
    obs_[slot].narrow(0, 0, len + 1).copy_(ep.obs);
    state_[slot].narrow(0, 0, len + 1).copy_(ep.state);
    avail_[slot].narrow(0, 0, len + 1).copy_(ep.avail_actions);
    actions_[slot].narrow(0, 0, len).copy_(ep.actions);  // LOOKALIKE: tensor-copy-narrowing -- action ids are int64, like the buffer
    reward_[slot].narrow(0, 0, len).copy_(ep.reward);
    filled_[slot].narrow(0, 0, len).fill_(1);
    if (ep.terminated) terminated_[slot][len - 1].fill_(1);
    next_ = (next_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  EpisodeBatch sample(int64_t batch_size) const {
    auto idx = torch::randint(size_, {batch_size}, torch::kLong);
    // Trim to the longest episode drawn: most batches are far shorter than the limit.
    const int64_t steps = filled_.index_select(0, idx).sum(1).max().item<int64_t>() + 1;
    auto take = [&](const torch::Tensor& buf) { return buf.index_select(0, idx).narrow(1, 0, steps); };
    return {take(obs_), take(state_), take(avail_), take(actions_), take(reward_), take(terminated_), take(filled_)};
  }

  int64_t size() const { return size_; }

 private:
  int64_t capacity_;
  int64_t next_ = 0;
  int64_t size_ = 0;
  torch::Tensor obs_, state_, avail_, actions_, reward_, terminated_, filled_;
};

struct AgentOut {
  torch::Tensor q;       // [B * N, A]
  torch::Tensor hidden;  // [B * N, H]
};

// Shared by all agents; the agent id is part of the input.
struct RNNAgentImpl : nn::Module {
  RNNAgentImpl(int64_t input_dim, const QMixConfig& cfg)
      : fc1(input_dim, cfg.rnn_hidden), rnn(nn::GRUCellOptions(cfg.rnn_hidden, cfg.rnn_hidden)),
        fc2(cfg.rnn_hidden, cfg.n_actions) {
    register_module("fc1", fc1);
    register_module("rnn", rnn);
    register_module("fc2", fc2);
  }
  AgentOut forward(const torch::Tensor& inputs, const torch::Tensor& h) {
    auto x = F::relu(fc1(inputs));
    auto h_new = rnn(x, h);
    return {fc2(h_new), h_new};
  }
  nn::Linear fc1;
  nn::GRUCell rnn;
  nn::Linear fc2;
};
TORCH_MODULE(RNNAgent);

struct QMixerImpl : nn::Module {
  explicit QMixerImpl(const QMixConfig& cfg) : n_agents_(cfg.n_agents), embed_(cfg.mixing_embed) {
    const int64_t S = cfg.state_dim;
    hyper_w1 = register_module("hyper_w1", nn::Sequential(nn::Linear(S, cfg.hypernet_embed), nn::ReLU(),
                                                          nn::Linear(cfg.hypernet_embed, embed_ * n_agents_)));
    hyper_w_final = register_module("hyper_w_final", nn::Sequential(nn::Linear(S, cfg.hypernet_embed), nn::ReLU(),
                                                                    nn::Linear(cfg.hypernet_embed, embed_)));
    hyper_b1 = register_module("hyper_b1", nn::Linear(S, embed_));
    V = register_module("V", nn::Sequential(nn::Linear(S, embed_), nn::ReLU(), nn::Linear(embed_, 1)));
  }

  // agent_qs: [BT, N], states: [BT, S] -> Q_tot [BT, 1]
  torch::Tensor forward(const torch::Tensor& agent_qs, const torch::Tensor& states) {
    // Non-negative mixing weights keep dQ_tot/dQ_a >= 0 (monotonicity).
    // FACT: w = torch.randn(6, 8).abs(); assert is_view_of(w.view(-1, 2, 4), w)
    auto w1 = torch::abs(hyper_w1->forward(states)).view({-1, n_agents_, embed_});  // LOOKALIKE: tensor-view-non-contiguous -- abs of a Linear output is contiguous
    auto b1 = hyper_b1(states).view({-1, 1, embed_});
    auto hidden = torch::bmm(agent_qs.unsqueeze(1), w1);
    hidden.add_(b1);  // LOOKALIKE: tensor-inplace-on-saved -- bmm saves its operands, not its result
    hidden = F::elu(hidden);
    auto w_final = torch::abs(hyper_w_final->forward(states)).view({-1, embed_, 1});
    auto v = V->forward(states).view({-1, 1, 1});
    return (torch::bmm(hidden, w_final) + v).view({-1, 1});
  }

  int64_t n_agents_, embed_;
  nn::Sequential hyper_w1{nullptr}, hyper_w_final{nullptr}, V{nullptr};
  nn::Linear hyper_b1{nullptr};
};
TORCH_MODULE(QMixer);

class QMixLearner {
 public:
  explicit QMixLearner(const QMixConfig& cfg)
      : cfg_(cfg), device_(torch::kCUDA), agent_(input_dim(cfg), cfg), target_agent_(input_dim(cfg), cfg),
        mixer_(cfg), target_mixer_(cfg) {
    agent_->to(device_);
    target_agent_->to(device_);
    mixer_->to(device_);
    target_mixer_->to(device_);
    params_ = agent_->parameters();
    for (auto& p : mixer_->parameters()) params_.push_back(p);
    opt_ = std::make_unique<torch::optim::RMSprop>(params_, torch::optim::RMSpropOptions(cfg.lr).alpha(0.99).eps(1e-5));
    update_targets();
  }

  static int64_t input_dim(const QMixConfig& cfg) { return cfg.obs_dim + cfg.n_actions + cfg.n_agents; }

  // Epsilon-greedy over available actions, one step for B parallel envs.
  torch::Tensor select_actions(const torch::Tensor& obs_t, const torch::Tensor& last_act, const torch::Tensor& avail_t,
                               double epsilon) {
    torch::NoGradGuard no_grad;
    const int64_t B = obs_t.size(0);
    const int64_t N = cfg_.n_agents;
    if (!rollout_hidden_.defined() || rollout_hidden_.size(0) != B * N) {
      rollout_hidden_ = torch::zeros({B * N, cfg_.rnn_hidden}, torch::TensorOptions().device(device_));
    }
    auto ids = torch::eye(N, torch::TensorOptions().device(device_)).unsqueeze(0).expand({B, -1, -1});
    auto inputs = torch::cat({obs_t.to(device_), last_act.to(device_), ids}, -1).reshape({B * N, -1});
    auto out = agent_->forward(inputs, rollout_hidden_);
    rollout_hidden_ = out.hidden;
    auto q = out.q.view({B, N, -1});
    auto avail = avail_t.to(device_);

    auto masked_q = q.clone();  // EXPECT: tensor-unnecessary-clone
    masked_q.masked_fill_(avail == 0, -std::numeric_limits<float>::infinity());
    auto greedy = masked_q.argmax(-1);  // [B, N]
    auto random_actions = torch::multinomial(avail.to(torch::kFloat).view({B * N, -1}), 1).view({B, N});
    auto pick_random = (torch::rand({B, N}) < epsilon).to(torch::kLong);
    return (1 - pick_random) * greedy + pick_random * random_actions;  // EXPECT: tensor-device-mismatch
  }

  double train(const EpisodeBatch& batch, int64_t episode) {
    const int64_t B = batch.obs.size(0);
    const int64_t T = batch.obs.size(1) - 1;
    const int64_t N = cfg_.n_agents;
    const int64_t A = cfg_.n_actions;

    auto obs = batch.obs.to(device_);
    auto states = batch.state.to(device_);
    auto avail = batch.avail_actions.to(device_);
    auto actions = batch.actions.to(device_);
    auto rewards = batch.reward.narrow(1, 0, T).to(device_);
    auto terminated = batch.terminated.narrow(1, 0, T).to(device_).to(torch::kFloat);
    // FACT: f = torch.ones(2, 5, 1, dtype=torch.uint8); m = f.narrow(1, 0, 4).to(torch.float); m.narrow(1, 1, 3).mul_(0.0); assert bool((f == 1).all())
    auto mask = batch.filled.narrow(1, 0, T).to(device_).to(torch::kFloat);
    mask.narrow(1, 1, T - 1).mul_(1 - terminated.narrow(1, 0, T - 1));  // LOOKALIKE: tensor-alias-then-mutate -- the sample is moved to the GPU and converted from uint8: mask owns its memory

    auto actions_onehot = torch::zeros({B, T + 1, N, A}, obs.options()).scatter_(3, actions, 1.0);
    // Agents also see the action they took on the previous step.
    auto last_actions = actions_onehot.clone();  // LOOKALIKE: tensor-unnecessary-clone -- written through a view next, and actions_onehot is read again below
    // FACT: x = torch.arange(144.).view(2, 6, 3, 4); ref = x.narrow(1, 0, 5).clone(); x.narrow(1, 1, 5).copy_(x.narrow(1, 0, 5)); assert not torch.equal(x.narrow(1, 1, 5), ref)
    last_actions.narrow(1, 1, T).copy_(last_actions.narrow(1, 0, T));  // EXPECT: tensor-inplace-overlap
    last_actions.select(1, 0).zero_();
    // FACT: e = torch.eye(3).unsqueeze(0).expand(4, -1, -1); c = torch.cat([torch.randn(4, 3, 2), e], -1); assert e.stride(0) == 0 and is_contiguous(c)
    auto agent_ids = torch::eye(N, obs.options()).unsqueeze(0).expand({B, -1, -1});

    std::vector<torch::Tensor> inputs_t, mac_out;
    auto h = torch::zeros({B * N, cfg_.rnn_hidden}, obs.options());
    for (int64_t t = 0; t <= T; ++t) {
      // FACT: x = torch.cat([torch.randn(4, 6, 3, 5)[:, 2], torch.randn(4, 3, 2)], -1); assert is_view_of(x.reshape(12, -1), x)
      auto in_t = torch::cat({obs.select(1, t), last_actions.select(1, t), agent_ids}, -1).reshape({B * N, -1});  // LOOKALIKE: tensor-reshape-non-contiguous, tensor-inplace-on-expanded -- cat's output is contiguous; agent_ids is only read
      auto out = agent_->forward(in_t, h);
      h = out.hidden;
      inputs_t.push_back(in_t);
      mac_out.push_back(out.q.view({B, N, A}));  // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked into the TD loss that reaches backward()
    }
    auto q_all = torch::stack(mac_out, 1);  // [B, T + 1, N, A]
    auto chosen = (q_all.narrow(1, 0, T) * actions_onehot.narrow(1, 0, T)).sum(-1);  // [B, T, N]

    torch::Tensor target_tot;
    {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> target_out;
      auto th = torch::zeros({B * N, cfg_.rnn_hidden}, obs.options());
      for (const auto& in_t : inputs_t) {
        auto out = target_agent_->forward(in_t, th);
        th = out.hidden;
        target_out.push_back(out.q.view({B, N, A}));
      }
      auto target_q = torch::stack(target_out, 1).narrow(1, 1, T);
      // Double Q-learning: the online net picks, the target net evaluates.
      auto online_next = q_all.detach().narrow(1, 1, T).masked_fill(avail.narrow(1, 1, T) == 0, -1e9);
      auto target_max = target_q.gather(3, online_next.argmax(-1, true)).squeeze(3);  // [B, T, N]
      // FACT: s = torch.randn(2, 5, 3); n = s.narrow(1, 1, 4).contiguous(); assert is_copy_of(n, s) and is_view_of(n.view(8, 3), n)
      auto states_next = states.narrow(1, 1, T).contiguous().view({B * T, -1});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() copies first
      target_tot = target_mixer_->forward(target_max.reshape({B * T, N}), states_next).view({B, T, 1});
    }

    // FACT: s = torch.randn(2, 5, 3); assert is_copy_of(s.narrow(1, 0, 4).reshape(8, 3), s)
    auto states_now = states.narrow(1, 0, T).reshape({B * T, -1});  // EXPECT: tensor-reshape-non-contiguous
    auto q_tot = mixer_->forward(chosen.reshape({B * T, N}), states_now).view({B, T, 1});

    auto targets = rewards + cfg_.gamma * (1 - terminated) * target_tot;
    auto td_error = (q_tot - targets.detach()) * mask;
    auto loss = td_error.pow(2).sum() / mask.sum();

    opt_->zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(params_, cfg_.grad_norm_clip);
    opt_->step();

    // Diagnostics: how far each agent's utility is from an even share of the team reward.
    // FACT: r = torch.randn(2, 3, 1); assert raises(lambda: r.expand(2, 3, 4).div_(4), "more than one element")
    auto agent_reward = rewards.expand({B, T, N});
    agent_reward /= static_cast<double>(N);  // EXPECT: tensor-inplace-on-expanded
    utility_gap_ = ((chosen.detach() - agent_reward) * mask).abs().sum() / (mask.sum() * N);

    if (episode - last_target_update_ >= cfg_.target_update_interval) {
      update_targets();
      last_target_update_ = episode;
    }
    return loss.item<double>();
  }

  void load_mixer(const std::string& path) {
    std::vector<torch::Tensor> saved;
    torch::load(saved, path);
    auto params = mixer_->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].copy_(saved[i].to(device_));  // EXPECT: tensor-inplace-on-leaf
    }
    update_targets();
  }

 private:
  void update_targets() {
    torch::NoGradGuard no_grad;
    copy_params(*target_agent_, *agent_);
    copy_params(*target_mixer_, *mixer_);
  }

  static void copy_params(nn::Module& dst, const nn::Module& src) {
    auto src_params = src.named_parameters();
    for (auto& p : dst.named_parameters()) {
      p.value().copy_(src_params[p.key()]);  // LOOKALIKE: tensor-inplace-on-leaf -- only called from update_targets, under its NoGradGuard
    }
  }

  QMixConfig cfg_;
  torch::Device device_;
  RNNAgent agent_, target_agent_;
  QMixer mixer_, target_mixer_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::RMSprop> opt_;
  torch::Tensor rollout_hidden_;
  torch::Tensor utility_gap_;
  int64_t last_target_update_ = 0;
};
