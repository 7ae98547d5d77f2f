// Option-critic (Bacon, Harb & Precup, 2017) on the four-rooms grid world. A small conv trunk over
// the last k frames feeds Q_Omega(s, .), one termination head beta(s, .) and one softmax policy per
// option. Options are picked epsilon-greedily over Q_Omega and kept until they terminate; the
// critic learns by intra-option Q learning on transitions replayed from a buffer against a target
// network, while the termination and intra-option policy gradients use the latest transition.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

namespace nn = torch::nn;

struct OcConfig {
  int64_t grid = 13, frames = 4, num_options = 4, num_actions = 4, feat = 128, max_steps = 1000, eval_episodes = 10;
  int64_t replay_capacity = 100000, batch = 32, warmup = 1000, target_every = 200, total_steps = 500000, log_every = 1000, eval_every = 20000;
  double gamma = 0.99, lr = 5e-4, eps_start = 1.0, eps_end = 0.1, eps_decay = 20000, slip = 1.0 / 3.0;
  double termination_reg = 0.01, entropy_reg = 0.01, grad_clip = 1.0;
};

struct StepResult { torch::Tensor frame; double reward; bool done; };

// Sutton, Precup & Singh's four rooms: walls, four doorways, a fixed goal; a third of the moves slip.
class FourRooms {
public:
  FourRooms(int64_t n, int64_t max_steps, double slip) : n_(n), max_steps_(max_steps), slip_(slip) {
    walls_ = torch::zeros({n, n}, torch::kBool);
    const auto mid = n / 2;
    for (int64_t i : {int64_t{0}, mid, n - 1}) {
      walls_.select(0, i).fill_(true);
      walls_.select(1, i).fill_(true);
    }
    auto doors = torch::tensor({mid / 2, (mid + n) / 2}, torch::kLong);
    walls_.index_put_({mid, doors}, false);
    walls_.index_put_({doors, mid}, false);
    moves_ = torch::tensor({-1, 0, 1, 0, 0, -1, 0, 1}, torch::kLong).view({4, 2});
    goal_ = torch::tensor({n - 2, n - 2}, torch::kLong);
  }
  torch::Tensor reset() {
    t_ = 0;
    do
      pos_ = torch::randint(1, n_ - 1, {2}, torch::kLong);
    while (walls_[pos_[0]][pos_[1]].item<bool>() || torch::equal(pos_, goal_));
    return render();
  }
  StepResult step(int64_t action) {
    if (torch::rand({1}).item<double>() < slip_)
      action = torch::randint(0, 4, {1}).item<int64_t>();
    auto next = pos_;
    // FACT: pos = torch.tensor([3, 4]); nxt = pos; nxt += torch.tensor([0, 1]); assert shares_storage(nxt, pos) and pos[1] == 5
    next += moves_[action]; // EXPECT: tensor-alias-then-mutate
    if (!walls_[next[0]][next[1]].item<bool>())
      pos_ = next;
    const bool at_goal = torch::equal(pos_, goal_);
    return {render(), at_goal ? 1.0 : 0.0, at_goal || ++t_ >= max_steps_};
  }
  // Three planes: walls, agent, goal.
  torch::Tensor render() const {
    auto frame = torch::zeros({3, n_, n_});
    // FACT: f = torch.zeros(2, 3, 3); w = torch.rand(3, 3) > 0.5; f[0].copy_(w); assert torch.equal(f[0], w.float())
    frame[0].copy_(walls_); // LOOKALIKE: tensor-copy-narrowing -- bool into float is exact
    frame[1][pos_[0]][pos_[1]] = 1.0;
    frame[2][goal_[0]][goal_[1]] = 1.0;
    return frame;
  }

private:
  int64_t n_, max_steps_, t_ = 0;
  double slip_;
  torch::Tensor walls_, moves_, pos_, goal_;
};

// The last k frames, oldest first.
class FrameStack {
public:
  FrameStack(int64_t k, int64_t n) : k_(k), frames_(torch::zeros({k, 3, n, n})) {}
  torch::Tensor reset(const torch::Tensor &frame) {
    // FACT: f = torch.zeros(4, 3, 5, 5); x = torch.rand(3, 5, 5); f.copy_(x.unsqueeze(0).expand_as(f)); assert torch.equal(f[3], x)
    frames_.copy_(frame.unsqueeze(0).expand_as(frames_)); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded frame is only read
    return observe();
  }
  torch::Tensor push(const torch::Tensor &frame) {
    // FACT: f = torch.zeros(4, 3, 5, 5); assert raises(lambda: f.narrow(0, 0, 3).copy_(f.narrow(0, 1, 3)), "single memory location")
    frames_.narrow(0, 0, k_ - 1).copy_(frames_.narrow(0, 1, k_ - 1)); // EXPECT: tensor-inplace-overlap
    // FACT: f = torch.zeros(4, 3, 5, 5); f[3].copy_(torch.ones(3, 5, 5)); assert f[3].sum() == 75 and f[:3].sum() == 0
    frames_[k_ - 1].copy_(frame); // LOOKALIKE: tensor-inplace-overlap -- the new frame is another tensor
    return observe();
  }
  // [k * 3, n, n]: the network sees the stacked frames as channels.
  torch::Tensor observe() const {
    auto snapshot = frames_.clone(); // LOOKALIKE: tensor-unnecessary-clone -- frames_ shifts in place on the next push; the replay keeps this one
    // FACT: s = torch.zeros(4, 3, 5, 5).clone(); assert is_view_of(s.flatten(0, 1), s)
    return snapshot.flatten(0, 1); // LOOKALIKE: tensor-reshape-non-contiguous -- the clone is contiguous: flatten is a view
  }

private:
  int64_t k_;
  torch::Tensor frames_;
};

struct OptionCriticNetImpl : nn::Module {
  explicit OptionCriticNetImpl(const OcConfig &cfg) : O_(cfg.num_options), A_(cfg.num_actions) {
    trunk = register_module("trunk", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3 * cfg.frames, 32, 3).padding(1)), nn::ReLU(),
                                                    nn::Conv2d(nn::Conv2dOptions(32, 32, 3).padding(1)), nn::ReLU(), nn::Flatten(),
                                                    nn::Linear(32 * cfg.grid * cfg.grid, cfg.feat), nn::ReLU()));
    q_head = register_module("q_head", nn::Linear(cfg.feat, O_));
    beta_head = register_module("beta_head", nn::Linear(cfg.feat, O_));
    pi_head = register_module("pi_head", nn::Linear(cfg.feat, O_ * A_));
    uniform_ = register_buffer("uniform", torch::full({O_}, 1.0 / static_cast<double>(O_)));
  }
  torch::Tensor features(const torch::Tensor &obs) { return trunk->forward(obs); }
  torch::Tensor q_omega(const torch::Tensor &f) { return q_head(f); }
  torch::Tensor termination(const torch::Tensor &f) { return torch::sigmoid(beta_head(f)); }
  // log pi_w(. | s) of each row's option: [B, A].
  torch::Tensor option_log_probs(const torch::Tensor &f, const torch::Tensor &options) {
    // FACT: y = torch.nn.Linear(8, 12)(torch.randn(5, 8)); assert is_view_of(y.view(5, 3, 4), y)
    auto logits = pi_head(f).view({f.size(0), O_, A_}); // LOOKALIKE: tensor-view-non-contiguous -- Linear's output is contiguous
    auto idx = options.view({-1, 1, 1}).expand({-1, 1, A_});
    return torch::log_softmax(logits.gather(1, idx).squeeze(1), -1);
  }
  // Epsilon-greedy policy over options: eps / O everywhere plus 1 - eps on the greedy option.
  torch::Tensor option_probs(const torch::Tensor &q, double eps) {
    auto probs = uniform_.expand({q.size(0), O_});
    // FACT: u = torch.full((4,), 0.25); p = u.expand(3, 4); assert raises(lambda: p.mul_(0.1), "single memory location")
    probs.mul_(eps); // EXPECT: tensor-inplace-on-expanded
    return probs.scatter_add(1, q.argmax(1, true), torch::full({q.size(0), 1}, 1.0 - eps, q.options()));
  }
  int64_t O_, A_;
  nn::Sequential trunk{nullptr};
  nn::Linear q_head{nullptr}, beta_head{nullptr}, pi_head{nullptr};
  torch::Tensor uniform_;
};
TORCH_MODULE(OptionCriticNet);

struct Transition { torch::Tensor obs, next_obs; int64_t option, action; double reward; bool done; };
struct ReplayBatch { torch::Tensor obs, next_obs, options; std::vector<float> rewards, dones; };

// Uniform replay over a ring of transitions; observations stay on the host.
struct Replay {
  size_t capacity, next = 0;
  std::vector<Transition> buf;
  void push(Transition t) {
    if (buf.size() < capacity)
      buf.push_back(std::move(t));
    else
      buf[next] = std::move(t);
    next = (next + 1) % capacity;
  }
  ReplayBatch sample(int64_t n, std::mt19937 &rng) const {
    std::uniform_int_distribution<size_t> pick(0, buf.size() - 1);
    std::vector<torch::Tensor> obs, next_obs;
    std::vector<int64_t> options;
    std::vector<float> rewards, dones;
    for (int64_t i = 0; i < n; ++i) {
      const auto &t = buf[pick(rng)];
      obs.push_back(t.obs);
      next_obs.push_back(t.next_obs);
      options.push_back(t.option);
      rewards.push_back(static_cast<float>(t.reward));
      dones.push_back(t.done ? 1.0f : 0.0f);
    }
    return {torch::stack(obs), torch::stack(next_obs), torch::tensor(options, torch::kLong), rewards, dones};
  }
};

void hard_update(OptionCriticNet &target, OptionCriticNet &online) {
  torch::NoGradGuard no_grad;
  auto tp = target->parameters(), op = online->parameters();
  for (size_t i = 0; i < tp.size(); ++i)
    tp[i].copy_(op[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

// Termination gradient (advantage of the option in s') and intra-option policy gradient with
// Q_U(s, w, a) ~ r + gamma * U(s', w) on the latest transition; obs and next_obs are [1, C, n, n].
torch::Tensor actor_loss(OptionCriticNet &net, const torch::Tensor &obs, const torch::Tensor &next_obs, int64_t option, int64_t action,
                         double reward, bool done, const OcConfig &cfg) {
  auto f = net->features(obs), f_next = net->features(next_obs);
  auto w = torch::full({1, 1}, option, torch::TensorOptions().dtype(torch::kLong).device(obs.device()));
  auto q_next = net->q_omega(f_next);
  auto beta_next = net->termination(f_next).gather(1, w);
  auto adv = q_next.detach();
  // FACT: lin = torch.nn.Linear(3, 4); q = lin(torch.randn(1, 3)); q0 = q.detach().clone(); a = q.detach(); a -= a.max(1, keepdim=True)[0] - 0.01; assert shares_storage(a, q) and not torch.equal(q.detach(), q0)
  adv -= std::get<0>(adv.max(1, true)) - cfg.termination_reg; // EXPECT: tensor-inplace-on-detached
  auto beta_loss = beta_next * adv.gather(1, w) * (done ? 0.0 : 1.0);
  auto u_next = ((1 - beta_next) * q_next.gather(1, w) + beta_next * std::get<0>(q_next.max(1, true))).detach();
  auto gt = torch::tensor(static_cast<float>(reward)) + cfg.gamma * (done ? 0.0 : 1.0) * u_next; // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor is accepted next to CUDA tensors
  auto logp = net->option_log_probs(f, w.view({-1}));
  auto entropy = -(logp.exp() * logp).sum(-1);
  auto baseline = net->q_omega(f).detach().gather(1, w);
  auto policy_loss = -logp.select(1, action) * (gt - baseline).squeeze(1) - cfg.entropy_reg * entropy;
  return beta_loss.sum() + policy_loss.sum();
}

// Greedy rollouts: the mean return, and the mean max Q_Omega predicted along the way.
std::pair<double, double> evaluate(OptionCriticNet &net, const OcConfig &cfg, torch::Device device) {
  FourRooms env(cfg.grid, cfg.max_steps, cfg.slip);
  FrameStack stack(cfg.frames, cfg.grid);
  auto q_sum = torch::zeros({}, torch::TensorOptions().device(device));
  double ret = 0, q_count = 0;
  std::vector<torch::Tensor> visited; // frames of the rollouts, for the trajectory plots
  for (int64_t ep = 0; ep < cfg.eval_episodes; ++ep) {
    auto obs = stack.reset(env.reset());
    int64_t option = -1;
    for (bool done = false; !done;) {
      auto f = net->features(obs.unsqueeze(0).to(device));
      auto q = net->q_omega(f);
      if (option < 0 || torch::rand({1}).item<double>() < net->termination(f)[0][option].item<double>())
        option = q.argmax(1).item<int64_t>();
      q_sum += q.max(); // EXPECT: tensor-graph-kept-across-iterations
      q_count += 1;
      auto logp = net->option_log_probs(f, torch::full({1}, option, torch::TensorOptions().dtype(torch::kLong).device(device)));
      auto res = env.step(logp.argmax(1).item<int64_t>());
      visited.push_back(res.frame); // LOOKALIKE: tensor-graph-kept-across-iterations -- environment frames carry no graph
      ret += res.reward;
      done = res.done;
      obs = stack.push(res.frame);
    }
  }
  torch::save(visited, "eval_frames.pt");
  return {ret / static_cast<double>(cfg.eval_episodes), q_sum.item<double>() / q_count};
}

void train(const OcConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  FourRooms env(cfg.grid, cfg.max_steps, cfg.slip);
  FrameStack stack(cfg.frames, cfg.grid);
  OptionCriticNet net(cfg), target(cfg);
  net->to(device), target->to(device);
  hard_update(target, net);
  torch::optim::RMSprop opt(net->parameters(), torch::optim::RMSpropOptions(cfg.lr));
  Replay replay{static_cast<size_t>(cfg.replay_capacity)};
  std::mt19937 rng(0);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  std::uniform_int_distribution<int64_t> any_option(0, cfg.num_options - 1);
  auto obs = stack.reset(env.reset());
  int64_t option = 0, episodes = 0;
  bool pick_option = true;
  double ep_return = 0, critic_sum = 0;
  for (int64_t step = 0; step < cfg.total_steps; ++step) {
    const double eps = cfg.eps_end + (cfg.eps_start - cfg.eps_end) * std::exp(-static_cast<double>(step) / cfg.eps_decay);
    auto obs_d = obs.unsqueeze(0).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new observation every step
    int64_t action = 0;
    {
      torch::NoGradGuard no_grad;
      auto f = net->features(obs_d);
      if (pick_option)
        option = unif(rng) < eps ? any_option(rng) : net->q_omega(f).argmax(1).item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- the greedy option steers the rollout
      auto logp = net->option_log_probs(f, torch::full({1}, option, torch::TensorOptions().dtype(torch::kLong).device(device)));
      action = torch::multinomial(logp.exp(), 1).item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- the action goes to the environment
    }
    auto res = env.step(action);
    auto next_obs = stack.push(res.frame);
    replay.push({obs, next_obs, option, action, res.reward, res.done});
    ep_return += res.reward;
    auto next_d = next_obs.unsqueeze(0).to(device);
    { // the option ends in s' with probability beta(s', w)
      torch::NoGradGuard no_grad;
      const double beta = net->termination(net->features(next_d))[0][option].item<double>(); // LOOKALIKE: tensor-sync-in-loop -- the draw decides whether the option ends
      pick_option = res.done || unif(rng) < beta;
    }
    obs = next_obs;
    if (res.done) {
      std::cout << "episode " << ++episodes << " return " << ep_return << " steps " << step << "\n";
      obs = stack.reset(env.reset()), ep_return = 0;
    }
    if (replay.buf.size() < static_cast<size_t>(cfg.warmup))
      continue;
    auto loss = actor_loss(net, obs_d, next_d, option, action, res.reward, res.done, cfg);
    auto b = replay.sample(cfg.batch, rng);
    auto o = b.obs.to(device), no = b.next_obs.to(device), w = b.options.to(device).unsqueeze(1);
    torch::Tensor u_next;
    {
      torch::NoGradGuard no_grad;
      auto beta_next = net->termination(net->features(no)).gather(1, w);
      auto q_next = target->q_omega(target->features(no));
      auto q_snapshot = q_next.clone(); // EXPECT: tensor-unnecessary-clone
      auto v_next = (target->option_probs(q_snapshot, eps) * q_snapshot).sum(1, true);
      u_next = (1 - beta_next) * q_snapshot.gather(1, w) + beta_next * v_next;
    }
    auto rewards = torch::tensor(b.rewards).unsqueeze(1);
    auto not_done = 1 - torch::tensor(b.dones).unsqueeze(1).to(device);
    auto gt = rewards + cfg.gamma * not_done * u_next; // EXPECT: tensor-device-mismatch
    auto critic = 0.5 * (net->q_omega(net->features(o)).gather(1, w) - gt).pow(2).mean();
    opt.zero_grad();
    (loss + critic).backward();
    nn::utils::clip_grad_norm_(net->parameters(), cfg.grad_clip);
    opt.step();
    critic_sum += critic.item<double>(); // EXPECT: tensor-sync-in-loop
    if (step % cfg.target_every == 0)
      hard_update(target, net);
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " eps " << eps << " critic " << critic_sum / static_cast<double>(cfg.log_every) << "\n";
      critic_sum = 0;
    }
    if (step % cfg.eval_every == 0)
      std::cout << "eval return " << evaluate(net, cfg, device).first << "\n";
  }
}
