// CommNet (Sukhbaatar et al., 2016) for cooperative multi-agent control: per-agent encoders,
// communication steps that average the hidden states of the other living agents, per-agent action
// heads and a shared value baseline, trained with REINFORCE over episodes of variable length.
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <vector>

struct CommNetConfig {
  int64_t n_agents = 5, obs_dim = 24, history = 4, hidden = 128, num_actions = 9, comm_steps = 2;
  int64_t num_envs = 8, max_steps = 80, iterations = 2000;
  double gamma = 0.99, lr = 3e-4, value_coef = 0.5, grad_clip = 1.0;
  bool use_baseline = true;
};

struct PolicyOut {
  torch::Tensor logits;  // [B * N, A], agent-major within each batch row
  torch::Tensor values;  // [B, N]
};

struct CommNetImpl : torch::nn::Module {
  explicit CommNetImpl(const CommNetConfig& cfg) : comm_steps_(cfg.comm_steps) {
    const int64_t in_dim = cfg.history * cfg.obs_dim;
    for (int64_t i = 0; i < cfg.n_agents; ++i) {
      encoders_.push_back(register_module("enc" + std::to_string(i), torch::nn::Linear(in_dim, cfg.hidden)));
      heads_.push_back(register_module("head" + std::to_string(i), torch::nn::Linear(cfg.hidden, cfg.num_actions)));
    }
    for (int64_t k = 0; k < cfg.comm_steps; ++k) {
      self_.push_back(register_module("H" + std::to_string(k), torch::nn::Linear(cfg.hidden, cfg.hidden)));
      comm_.push_back(register_module(
          "C" + std::to_string(k), torch::nn::Linear(torch::nn::LinearOptions(cfg.hidden, cfg.hidden).bias(false))));
    }
    agent_embed_ = register_parameter("agent_embed", torch::randn({cfg.n_agents, cfg.hidden}) * 0.02);
    value_ = register_module("value", torch::nn::Linear(cfg.hidden, 1));
  }

  // obs: [B, N, history * obs_dim]; alive: [B, N] with 1 for living agents.
  PolicyOut forward(const torch::Tensor& obs, const torch::Tensor& alive) {
    const int64_t B = obs.size(0), N = obs.size(1);
    std::vector<torch::Tensor> enc;
    for (int64_t i = 0; i < N; ++i) {
      auto e = encoders_[i]->forward(obs.select(1, i));
      e.add_(agent_embed_[i]);  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
      enc.push_back(torch::tanh(e));
    }
    auto h = torch::stack(enc, 1);  // [B, N, H]

    // Agent i listens to every other living agent j: weights alive_i * alive_j / (#others alive).
    auto pair_mask = alive.unsqueeze(1) * alive.unsqueeze(2);
    // FACT: a = torch.rand(3, 5); m = a.unsqueeze(1) * a.unsqueeze(2); d = m.diagonal(0, 1, 2); assert is_view_of(d, m) and is_copy_of(m, a)
    pair_mask.diagonal(0, 1, 2).zero_();  // LOOKALIKE: tensor-alias-then-mutate -- an explicit view of a fresh product
    auto comm_w = pair_mask / pair_mask.sum(2, /*keepdim=*/true).clamp_min(1.0);
    for (int64_t k = 0; k < comm_steps_; ++k) {
      auto c = torch::bmm(comm_w, h);
      auto h_next = torch::tanh(self_[k]->forward(h) + comm_[k]->forward(c));
      h_next.masked_fill_(alive.unsqueeze(-1) == 0, 0.0);  // EXPECT: tensor-inplace-on-saved
      h = h_next;
    }

    std::vector<torch::Tensor> logits;
    for (int64_t i = 0; i < N; ++i) logits.push_back(heads_[i]->forward(h.select(1, i)));
    PolicyOut out;
    // FACT: l = torch.randn(5, 8, 9); r = l.transpose(0, 1).reshape(40, -1); assert is_copy_of(r, l)
    out.logits = torch::stack(logits, 0).transpose(0, 1).reshape({B * N, -1});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: hh = torch.randn(8, 5, 128); assert is_view_of(hh.reshape(40, -1), hh)
    out.values = value_->forward(h.reshape({B * N, -1})).view({B, N});  // LOOKALIKE: tensor-reshape-non-contiguous -- h is a fresh contiguous [B, N, H]
    return out;
  }

  int64_t comm_steps_;
  std::vector<torch::nn::Linear> encoders_, heads_, self_, comm_;
  torch::Tensor agent_embed_;
  torch::nn::Linear value_{nullptr};
};
TORCH_MODULE(CommNet);

// Last `history` observations of every agent in every environment: frames_ is [K, E, N, obs_dim].
class ObsHistory {
 public:
  ObsHistory(int64_t k, int64_t envs, int64_t agents, int64_t obs_dim)
      : frames_(torch::zeros({k, envs, agents, obs_dim})) {}

  void reset(const torch::Tensor& obs) {
    // FACT: f = torch.zeros(4, 3, 5, 2); assert not raises(lambda: f.copy_(torch.randn(3, 5, 2).unsqueeze(0).expand_as(f)))
    frames_.copy_(obs.unsqueeze(0).expand_as(frames_));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only the source
  }

  void push(const torch::Tensor& obs) {
    const int64_t k = frames_.size(0);
    // FACT: f = torch.zeros(4, 3, 5, 2); assert raises(lambda: f.narrow(0, 0, 3).copy_(f.narrow(0, 1, 3)), "some elements of the input tensor")
    frames_.narrow(0, 0, k - 1).copy_(frames_.narrow(0, 1, k - 1));  // EXPECT: tensor-inplace-overlap
    frames_[k - 1].copy_(obs);
  }

  // [E, N, K * obs_dim]: each agent's own stacked history.
  torch::Tensor stacked() const {
    const int64_t envs = frames_.size(1), agents = frames_.size(2);
    // FACT: f = torch.zeros(4, 3, 5, 2); s = f.permute(1, 2, 0, 3).reshape(3, 5, -1); assert is_copy_of(s, f)
    return frames_.permute({1, 2, 0, 3}).reshape({envs, agents, -1});  // EXPECT: tensor-reshape-non-contiguous
  }

 private:
  torch::Tensor frames_;
};

struct VecStep {
  torch::Tensor obs;     // [E, N, obs_dim]
  torch::Tensor reward;  // [E, N]
  torch::Tensor alive;   // [E, N]
  torch::Tensor done;    // [E], 1 when the episode of that env ended
};

class VecMultiAgentEnv {
 public:
  virtual ~VecMultiAgentEnv() = default;
  virtual torch::Tensor reset() = 0;
  virtual VecStep step(const torch::Tensor& actions) = 0;
};

class CommNetTrainer {
 public:
  explicit CommNetTrainer(const CommNetConfig& cfg)
      : cfg_(cfg),
        net_(cfg),
        opt_(net_->parameters(), torch::optim::AdamOptions(cfg.lr)),
        history_(cfg.history, cfg.num_envs, cfg.n_agents, cfg.obs_dim) {}

  // spawn_alive: [E, N], which agents the scenario spawns at the start of every episode.
  void train(VecMultiAgentEnv& env, const torch::Tensor& spawn_alive) {
    const int64_t E = cfg_.num_envs, N = cfg_.n_agents;
    torch::Tensor entropy_log = torch::zeros({});
    int64_t logged_steps = 0;
    for (int64_t it = 0; it < cfg_.iterations; ++it) {
      auto alive = spawn_alive.clone();  // EXPECT: tensor-clone-in-loop
      auto active = torch::ones({E});
      history_.reset(env.reset());
      std::vector<torch::Tensor> logps, vals, rews, masks;
      for (int64_t t = 0; t < cfg_.max_steps; ++t) {
        auto out = net_->forward(history_.stacked(), alive);
        auto logp_all = torch::log_softmax(out.logits, -1);
        // FACT: m = torch.multinomial(torch.rand(40, 9), 1); assert is_view_of(m.view(8, 5), m)
        auto actions = torch::multinomial(logp_all.detach().exp(), 1).view({E, N});  // LOOKALIKE: tensor-view-non-contiguous -- multinomial returns a fresh [E * N, 1]
        auto step_mask = alive * active.unsqueeze(1);
        logps.push_back(logp_all.gather(1, actions.view({-1, 1})).view({E, N}));  // LOOKALIKE: tensor-graph-kept-across-iterations -- REINFORCE terms, backpropagated below
        vals.push_back(out.values);
        masks.push_back(step_mask);
        entropy_log += -(logp_all.exp() * logp_all).sum(-1).mean();  // EXPECT: tensor-graph-kept-across-iterations
        ++logged_steps;

        VecStep res = env.step(actions);
        rews.push_back(res.reward * step_mask);
        alive.mul_(res.alive);
        active.mul_(1.0 - res.done);
        history_.push(res.obs);
        if (active.sum().item<double>() == 0.0) break;
      }

      auto R = torch::stack(rews);  // [T, E, N], T varies between iterations
      auto M = torch::stack(masks);
      auto V = torch::stack(vals);
      auto L = torch::stack(logps);
      auto rtg = R.clone();  // LOOKALIKE: tensor-unnecessary-clone -- R is logged below; rtg is accumulated in place row by row
      for (int64_t t = rtg.size(0) - 2; t >= 0; --t) {
        // FACT: r = torch.randn(6, 3, 5); assert not raises(lambda: r[2].addcmul_(r[3], torch.ones(3, 5), value=0.99))
        rtg[t].addcmul_(rtg[t + 1], M[t + 1], cfg_.gamma);  // LOOKALIKE: tensor-inplace-overlap -- rows t and t + 1 are disjoint
      }
      torch::Tensor adv = rtg;
      if (cfg_.use_baseline) {
        // FACT: g = torch.randn(6, 3, 5); a = g; a -= torch.randn(6, 3, 5); assert shares_storage(a, g)
        adv -= V.detach();  // EXPECT: tensor-alias-then-mutate
      }
      auto n_valid = M.sum().clamp_min(1.0);
      auto policy_loss = -(L * adv * M).sum() / n_valid;
      auto value_loss = ((V - rtg).pow(2) * M).sum() / n_valid;

      opt_.zero_grad();
      (policy_loss + cfg_.value_coef * value_loss).backward();
      for (auto& p : net_->parameters()) {
        if (p.grad().defined()) p.grad().clamp_(-cfg_.grad_clip, cfg_.grad_clip);  // LOOKALIKE: tensor-inplace-on-leaf -- writes the gradient, not the parameter
      }
      opt_.step();

      if (it % 50 == 0) {
        std::cout << "iter " << it << " episode len " << R.size(0) << " team return "
                  << R.sum(0).sum(-1).mean().item<double>() << " value loss " << value_loss.item<double>() << "\n";
      }
    }
    std::cout << "mean policy entropy " << entropy_log.item<double>() / static_cast<double>(logged_steps) << "\n";
  }

 private:
  CommNetConfig cfg_;
  CommNet net_;
  torch::optim::Adam opt_;
  ObsHistory history_;
};
