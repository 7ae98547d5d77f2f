// GFlowNet on an n-dimensional hypergrid (Bengio et al. 2021), trained with trajectory balance
// (Malkin et al. 2022): minimise (log Z + sum log P_F - log R(x) - sum log P_B)^2 over sampled
// trajectories. Each action increments one coordinate; a separate action stops and emits x.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <vector>

struct GridConfig {
  int64_t ndim = 2, side = 8;
  double r0 = 1e-3, r1 = 0.5, r2 = 2.0;
};

struct TrainConfig {
  int64_t hidden = 256, batch = 16, iters = 20000, eval_every = 1000;
  int64_t buffer_cap = 1 << 16;
  double lr = 1e-3, lr_log_z = 1e-1, explore_eps = 0.05;
};

class Hypergrid {
 public:
  Hypergrid(const GridConfig& cfg, torch::Device device) : cfg_(cfg) {
    auto axis = torch::arange(cfg.side);
    auto grids = torch::meshgrid(std::vector<torch::Tensor>(cfg.ndim, axis), "ij");
    // FACT: g = torch.meshgrid(torch.arange(3), torch.arange(3), indexing="ij"); s = torch.stack(g, -1); assert is_view_of(s.reshape(-1, 2), s)
    all_states_ = torch::stack(grids, -1).reshape({-1, cfg.ndim});  // LOOKALIKE: tensor-reshape-non-contiguous -- stack writes a fresh contiguous tensor, so this is a view
    log_reward_table_ = log_reward(all_states_);
    place_values_ = torch::pow(cfg.side, torch::arange(cfg.ndim - 1, -1, -1)).to(device);
    s0_ = torch::zeros({1, cfg.ndim}, torch::kLong);
  }

  int64_t ndim() const { return cfg_.ndim; }
  int64_t n_states() const { return all_states_.size(0); }
  int64_t n_actions() const { return cfg_.ndim + 1; }
  int64_t max_steps() const { return cfg_.ndim * (cfg_.side - 1) + 1; }
  const torch::Tensor& s0() const { return s0_; }
  const torch::Tensor& log_reward_table() const { return log_reward_table_; }

  torch::Tensor encode(const torch::Tensor& states) const {
    // FACT: h = torch.nn.functional.one_hot(torch.randint(0, 8, (4, 2)), 8); assert is_contiguous(h) and not raises(lambda: h.view(4, -1))
    return torch::one_hot(states, cfg_.side).view({states.size(0), -1}).to(torch::kFloat);  // LOOKALIKE: tensor-view-non-contiguous -- one_hot returns a fresh contiguous tensor
  }

  torch::Tensor log_reward(const torch::Tensor& states) const {
    auto ax = (states.to(torch::kFloat) / static_cast<double>(cfg_.side - 1) - 0.5).abs();
    auto corner = (ax > 0.25).all(-1).to(torch::kFloat);
    auto ring = ((ax > 0.3).logical_and(ax < 0.4)).all(-1).to(torch::kFloat);
    return (cfg_.r0 + cfg_.r1 * corner + cfg_.r2 * ring).log();
  }

  torch::Tensor flat_index(const torch::Tensor& states) const { return (states * place_values_).sum(-1); }

  torch::Tensor lookup_log_reward(const torch::Tensor& states) const {
    return log_reward_table_.index_select(0, flat_index(states));  // EXPECT: tensor-device-mismatch
  }

  // Increments are allowed while the coordinate is below the edge; stopping is always allowed.
  torch::Tensor forward_mask(const torch::Tensor& states) const {
    auto mask = torch::ones({1, n_actions()}, states.options().dtype(torch::kBool)).expand({states.size(0), n_actions()});
    // FACT: m = torch.ones(1, 3, dtype=torch.bool).expand(4, 3); assert raises(lambda: m.narrow(1, 0, 2).logical_and_(torch.rand(4, 2) > 0.5), "more than one element")
    mask.narrow(1, 0, cfg_.ndim).logical_and_(states < cfg_.side - 1);  // EXPECT: tensor-inplace-on-expanded
    return mask;
  }

  // The stop action and rows that already stopped leave their state as it is.
  torch::Tensor step(const torch::Tensor& states, const torch::Tensor& actions, const torch::Tensor& frozen) const {
    auto inc = (actions < cfg_.ndim).logical_and(frozen.logical_not().unsqueeze(1)).to(torch::kLong);
    auto next = states;
    // FACT: s = torch.zeros(3, 2, dtype=torch.long); n = s; n.scatter_add_(1, torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1, dtype=torch.long)); assert shares_storage(s, n) and int(s.sum()) == 3
    next.scatter_add_(1, actions.clamp_max(cfg_.ndim - 1), inc);  // EXPECT: tensor-alias-then-mutate
    return next;
  }

 private:
  GridConfig cfg_;
  torch::Tensor all_states_, log_reward_table_, place_values_, s0_;
};

struct TBModelImpl : torch::nn::Module {
  TBModelImpl(int64_t in_dim, int64_t hidden, int64_t n_fwd, int64_t n_bwd) {
    trunk = register_module("trunk", torch::nn::Sequential(
        torch::nn::Linear(in_dim, hidden), torch::nn::LeakyReLU(),
        torch::nn::Linear(hidden, hidden), torch::nn::LeakyReLU()));
    head = register_module("head", torch::nn::Linear(hidden, n_fwd + n_bwd));
    log_z = register_parameter("log_z", torch::zeros({1}));
    torch::nn::init::zeros_(head->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& x) { return head->forward(trunk->forward(x)); }

  torch::nn::Sequential trunk{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor log_z;
};
TORCH_MODULE(TBModel);

struct Trajectories {
  torch::Tensor log_pf, log_pb, final_states, log_reward;
};

// Rolls the forward policy out from `states` until every row has stopped. P_B of each increment
// is read from the backward head at the state it led to, on the following step.
Trajectories sample_trajectories(TBModel& model, const Hypergrid& env, torch::Tensor states, double eps) {
  const int64_t B = states.size(0), n_fwd = env.n_actions(), ndim = env.ndim();
  auto done = torch::zeros({B}, states.options().dtype(torch::kBool));
  std::vector<torch::Tensor> step_log_pf, step_log_pb;
  torch::Tensor last_actions, last_moved;
  for (int64_t t = 0; t < env.max_steps(); ++t) {
    auto out = model->forward(env.encode(states));
    if (t > 0) {
      auto pb_logits = out.narrow(1, n_fwd, ndim).masked_fill(states == 0, -1e9);
      auto log_pb = torch::log_softmax(pb_logits, 1).gather(1, last_actions.clamp_max(ndim - 1)).squeeze(1);
      step_log_pb.push_back(log_pb.masked_fill(last_moved.logical_not(), 0.0));
    }
    if (done.all().item<bool>()) break;  // LOOKALIKE: tensor-sync-in-loop -- the flag decides whether the rollout continues

    auto fmask = env.forward_mask(states);
    auto logits = out.narrow(1, 0, n_fwd);
    // FACT: o = torch.randn(4, 5); b = o.narrow(1, 3, 2).clone(); f = o.narrow(1, 0, 3); f.fill_(-1e9); assert is_view_of(f, o) and torch.equal(o.narrow(1, 3, 2), b)
    logits.masked_fill_(fmask.logical_not(), -1e9);  // LOOKALIKE: tensor-alias-then-mutate -- writes only the forward columns; the backward slice of out is disjoint // LOOKALIKE: tensor-inplace-on-saved -- a Linear output is not saved for backward
    auto probs = torch::softmax(logits, 1);
    if (eps > 0.0) {
      auto valid = fmask.to(probs.scalar_type());
      // FACT: x = torch.randn(3, 4, requires_grad=True); assert backward_fails(lambda: torch.softmax(x, 1).mul_(0.9).log().sum().backward())
      probs.mul_(1.0 - eps).add_(valid / valid.sum(1, true) * eps);  // EXPECT: tensor-inplace-on-saved
    }
    auto actions = torch::multinomial(probs.detach(), 1);
    auto log_pf = probs.gather(1, actions).squeeze(1).log();
    step_log_pf.push_back(log_pf.masked_fill(done, 0.0));  // LOOKALIKE: tensor-graph-kept-across-iterations -- per-step terms of this batch's loss, released with it after backward

    auto prev = states;
    states = env.step(prev, actions, done);
    last_actions = actions;
    last_moved = (states != prev).any(1);
    done = done.logical_or(actions.squeeze(1) == n_fwd - 1);
  }
  auto log_r = env.lookup_log_reward(states);
  auto log_pb = step_log_pb.empty() ? torch::zeros_like(log_r) : torch::stack(step_log_pb, 1).sum(1);
  return {torch::stack(step_log_pf, 1).sum(1), log_pb, states, log_r};
}

torch::Tensor trajectory_balance(const TBModel& model, const Trajectories& tr) {
  return (model->log_z + tr.log_pf - tr.log_reward - tr.log_pb).pow(2).mean();
}

// Ring buffer of recent terminal states, for the empirical terminating distribution.
struct TerminalBuffer {
  TerminalBuffer(int64_t cap, int64_t ndim, torch::Device device)
      : states(torch::zeros({cap, ndim}, torch::TensorOptions().dtype(torch::kInt).device(device))),
        log_r(torch::zeros({cap}, torch::TensorOptions().dtype(torch::kDouble).device(device))) {}

  void add(const torch::Tensor& batch_states, const torch::Tensor& batch_log_r) {
    const int64_t n = batch_states.size(0);
    if (pos + n > states.size(0)) pos = 0;
    states.narrow(0, pos, n).copy_(batch_states);  // EXPECT: tensor-copy-narrowing
    log_r.narrow(0, pos, n).copy_(batch_log_r);  // LOOKALIKE: tensor-copy-narrowing -- float log-rewards widen into the double history
    pos += n;
    filled = std::min(filled + n, states.size(0));
  }

  torch::Tensor states, log_r;
  int64_t pos = 0, filled = 0;
};

double l1_to_target(const Hypergrid& env, const TerminalBuffer& buf) {
  torch::NoGradGuard no_grad;
  auto flat = env.flat_index(buf.states.narrow(0, 0, buf.filled).to(torch::kLong));
  auto counts = torch::bincount(flat.cpu(), {}, env.n_states()).to(torch::kDouble);
  auto target = env.log_reward_table().to(torch::kDouble).softmax(0);
  return (counts / counts.sum() - target).abs().sum().item<double>();  // LOOKALIKE: tensor-device-mismatch -- counts come from flat.cpu(), next to the CPU reward table
}

int main() {
  GridConfig gcfg;
  TrainConfig cfg;
  torch::manual_seed(0);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  Hypergrid env(gcfg, device);
  TBModel model(gcfg.ndim * gcfg.side, cfg.hidden, env.n_actions(), gcfg.ndim);
  model->to(device);
  const double true_log_z = env.log_reward_table().logsumexp(0).item<double>();
  // Start log Z near the scale of the total reward so early updates go to the policy.
  // FACT: p = torch.nn.Parameter(torch.zeros(1)); assert raises(lambda: p.fill_(2.0), "leaf Variable")
  model->log_z.fill_(true_log_z - 1.0);  // EXPECT: tensor-inplace-on-leaf

  std::vector<torch::Tensor> net_params;
  for (const auto& p : model->named_parameters()) {
    if (p.key() != "log_z") net_params.push_back(p.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(net_params, std::make_unique<torch::optim::AdamOptions>(cfg.lr));
  groups.emplace_back(std::vector<torch::Tensor>{model->log_z}, std::make_unique<torch::optim::AdamOptions>(cfg.lr_log_z));
  torch::optim::Adam opt(groups, torch::optim::AdamOptions(cfg.lr));

  TerminalBuffer buffer(cfg.buffer_cap, gcfg.ndim, device);
  std::deque<torch::Tensor> recent_losses;
  double mean_log_r = 0.0;
  for (int64_t it = 1; it <= cfg.iters; ++it) {
    auto start = env.s0().to(device).repeat({cfg.batch, 1});  // EXPECT: tensor-clone-in-loop
    auto traj = sample_trajectories(model, env, start, cfg.explore_eps);
    auto loss = trajectory_balance(model, traj);
    opt.zero_grad();
    loss.backward();
    opt.step();

    buffer.add(traj.final_states, traj.log_reward);
    // FACT: z = torch.zeros(1, requires_grad=True); window = [(z + torch.randn(4)).pow(2).mean() for _ in range(3)]; assert kept_nodes(window) >= 3
    recent_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (recent_losses.size() > 100) recent_losses.pop_front();
    mean_log_r += traj.log_reward.mean().item<double>();  // EXPECT: tensor-sync-in-loop

    if (it % cfg.eval_every == 0) {
      auto avg_loss = torch::stack(std::vector<torch::Tensor>(recent_losses.begin(), recent_losses.end())).mean();
      std::printf("it %6lld  loss %.4f  logZ %.3f (true %.3f)  mean log R %.3f  L1 %.4f\n",
                  static_cast<long long>(it), avg_loss.item<double>(), model->log_z.item<double>(),
                  true_log_z, mean_log_r / cfg.eval_every, l1_to_target(env, buffer));
      mean_log_r = 0.0;
    }
  }
  torch::save(model, "gfn_hypergrid.pt");
  return 0;
}
