// AlphaZero-style self-play and training for two-player board games on an H x W board (moves
// are (square, move plane) pairs, as in the chess encoding). A residual tower feeds a policy
// head (one logit per square and plane) and a tanh value head. MCTS with PUCT evaluates leaves
// in small batches under virtual loss, mixes Dirichlet noise into the root priors, and turns the
// visit counts (with temperature) into the policy targets. Finished games go into a sliding
// window; training samples positions from it with random horizontal flips.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

struct AZConfig {
  int64_t board_h = 6, board_w = 7, history = 4, channels = 64, blocks = 6, move_planes = 2;
  int64_t sims = 160, leaf_batch = 8, temp_moves = 10, window_games = 4000;
  int64_t batch_size = 256, train_steps = 1000, log_every = 100;
  double c_puct = 1.25, dirichlet_alpha = 0.3, noise_frac = 0.25, virtual_loss = 1.0;
  double lr = 0.02, weight_decay = 1e-4;
  int64_t in_planes() const { return 2 * history + 1; }
  int64_t n_actions() const { return board_h * board_w * move_planes; }
};

// The rules live elsewhere; search and training only need this much of them.
class Game {
public:
  virtual ~Game() = default;
  virtual std::unique_ptr<Game> copy() const = 0;
  virtual torch::Tensor board_planes() const = 0; // [2, H, W]: stones of the player to move, of the other
  virtual torch::Tensor legal_mask() const = 0;   // [A] bool
  virtual void play(int64_t action) = 0;
  virtual bool over() const = 0;
  virtual float result_for(int player) const = 0; // +1 win, 0 draw, -1 loss
  virtual int to_play() const = 0;
};

// A game plus its last `history` positions as network input, newest first, colour plane last.
struct Position {
  std::unique_ptr<Game> game;
  torch::Tensor planes; // [2 * history + 1, H, W]

  Position fork() const { return {game->copy(), planes.clone()}; } // LOOKALIKE: tensor-unnecessary-clone -- returned: every simulation pushes moves into its own planes
  void play(int64_t a) { game->play(a), push_history(); }
  void push_history() {
    const auto n = planes.size(0) - 1;
    // FACT: p = torch.zeros(9, 6, 7); assert raises(lambda: p.narrow(0, 2, 6).copy_(p.narrow(0, 0, 6)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    planes.narrow(0, 2, n - 2).copy_(planes.narrow(0, 0, n - 2)); // EXPECT: tensor-inplace-overlap -- planes 2.. and 0..n-2 of one buffer overlap: PyTorch refuses the shift
    // FACT: p = torch.zeros(9, 6, 7); b = torch.rand(2, 6, 7); p.narrow(0, 0, 2).copy_(b); assert torch.equal(p[:2], b)
    planes.narrow(0, 0, 2).copy_(game->board_planes()); // LOOKALIKE: tensor-inplace-overlap -- the newest position comes from the game, a tensor of its own
    planes[n].fill_(static_cast<double>(game->to_play()));
  }
};

struct ResBlockImpl : torch::nn::Module {
  explicit ResBlockImpl(int64_t ch) {
    namespace nn = torch::nn;
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", nn::BatchNorm2d(ch));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", nn::BatchNorm2d(ch));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    // FACT: c = torch.nn.Conv2d(3, 3, 3, padding=1); b = torch.nn.BatchNorm2d(3); x = torch.randn(2, 3, 4, 4); o = b(c(x)); o += x; torch.relu(o).sum().backward(); assert c.weight.grad is not None
    out += x; // LOOKALIKE: tensor-inplace-on-saved -- BatchNorm saves its input, not its output; the ReLU comes after the sum
    return torch::relu(out);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(ResBlock);

struct NetOutput {
  torch::Tensor logits, value; // [B, A] square-major like the move encoder; [B, 1] in (-1, 1)
};

struct PolicyValueNetImpl : torch::nn::Module {
  explicit PolicyValueNetImpl(const AZConfig &cfg) {
    namespace nn = torch::nn;
    const auto C = cfg.channels;
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(cfg.in_planes(), C, 3).padding(1).bias(false)));
    stem_bn = register_module("stem_bn", nn::BatchNorm2d(C));
    tower = register_module("tower", nn::Sequential());
    for (int64_t i = 0; i < cfg.blocks; ++i)
      tower->push_back(ResBlock(C));
    p_conv = register_module("p_conv", nn::Conv2d(nn::Conv2dOptions(C, C, 1).bias(false)));
    p_bn = register_module("p_bn", nn::BatchNorm2d(C));
    p_out = register_module("p_out", nn::Conv2d(nn::Conv2dOptions(C, cfg.move_planes, 1)));
    v_conv = register_module("v_conv", nn::Conv2d(nn::Conv2dOptions(C, 1, 1).bias(false)));
    v_bn = register_module("v_bn", nn::BatchNorm2d(1));
    v_fc1 = register_module("v_fc1", nn::Linear(cfg.board_h * cfg.board_w, 64));
    v_fc2 = register_module("v_fc2", nn::Linear(64, 1));
  }
  NetOutput forward(const torch::Tensor &x) {
    auto h = tower->forward(torch::relu(stem_bn(stem(x))));
    auto p = p_out(torch::relu(p_bn(p_conv(h)))); // [B, P, H, W]
    // FACT: p = torch.randn(2, 2, 6, 7); assert raises(lambda: p.permute(0, 2, 3, 1).view(2, -1), "view size is not compatible")
    auto logits = p.permute({0, 2, 3, 1}).view({x.size(0), -1}); // EXPECT: tensor-view-non-contiguous -- after the permute to square-major order the planes are strided: view throws
    auto v = torch::relu(v_bn(v_conv(h)));
    // FACT: v = torch.relu(torch.nn.BatchNorm2d(1)(torch.randn(2, 1, 6, 7))); assert is_view_of(v.flatten(1), v)
    v = torch::relu(v_fc1(v.flatten(1))); // LOOKALIKE: tensor-reshape-non-contiguous -- the value plane is contiguous: flatten is a view
    return {logits, torch::tanh(v_fc2(v))};
  }
  torch::nn::Conv2d stem{nullptr}, p_conv{nullptr}, p_out{nullptr}, v_conv{nullptr};
  torch::nn::BatchNorm2d stem_bn{nullptr}, p_bn{nullptr}, v_bn{nullptr};
  torch::nn::Sequential tower{nullptr};
  torch::nn::Linear v_fc1{nullptr}, v_fc2{nullptr};
};
TORCH_MODULE(PolicyValueNet);

// Runs the network on a batch of positions; priors and values come back to the host for the tree.
struct Evaluator {
  std::pair<torch::Tensor, torch::Tensor> operator()(const torch::Tensor &planes, const torch::Tensor &legal) {
    torch::NoGradGuard no_grad;
    net_->eval();
    auto out = net_->forward(planes.to(device_));
    out.logits.masked_fill_(legal.to(device_).logical_not(), -1e9); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is recorded
    auto priors = torch::softmax(out.logits, 1);
    return {priors.cpu(), out.value.squeeze(1).cpu()};
  }
  PolicyValueNet net_;
  torch::Device device_;
};

torch::Tensor dirichlet(int64_t n, double alpha) {
  auto g = torch::_standard_gamma(torch::full({n}, alpha));
  return g / g.sum();
}

struct Node {
  float prior = 0.f, value_sum = 0.f; // value_sum: for the player who moved into this node
  int visits = 0; int64_t action = -1;
  std::vector<std::unique_ptr<Node>> children;
  float q() const { return visits > 0 ? value_sum / static_cast<float>(visits) : 0.f; }
};

class Mcts {
public:
  Mcts(Evaluator &eval, const AZConfig &cfg) : eval_(eval), cfg_(cfg) {}

  // Visit counts of the root's moves after cfg.sims simulations, [A] float32.
  torch::Tensor search(const Position &root_pos, bool add_noise) {
    Node root;
    auto legal = root_pos.game->legal_mask();
    auto [p, v] = eval_(root_pos.planes.unsqueeze(0), legal.unsqueeze(0));
    auto priors = p[0];
    if (add_noise) {
      auto noise = torch::zeros_like(priors);
      noise.masked_scatter_(legal, dirichlet(legal.sum().item<int64_t>(), cfg_.dirichlet_alpha));
      // FACT: p = torch.softmax(torch.randn(1, 5), 1); r = p[0]; r.mul_(0.75).add_(torch.rand(5), alpha=0.25); assert is_view_of(r, p)
      priors.mul_(1.0 - cfg_.noise_frac).add_(noise, cfg_.noise_frac); // LOOKALIKE: tensor-alias-then-mutate -- an explicit row view of the evaluator's fresh batch, which nothing reads again
    }
    expand(root, priors, legal);
    for (int64_t done = 0; done < cfg_.sims;) {
      std::vector<std::pair<Position, std::vector<Node *>>> leaves;
      for (int64_t k = 0; k < cfg_.leaf_batch && done + k < cfg_.sims; ++k)
        leaves.push_back(descend(root, root_pos));
      std::vector<torch::Tensor> planes, masks;
      for (const auto &leaf : leaves)
        planes.push_back(leaf.first.planes), masks.push_back(leaf.first.game->legal_mask());
      auto [lp, lv] = eval_(torch::stack(planes), torch::stack(masks));
      auto values = lv.accessor<float, 1>();
      for (size_t i = 0; i < leaves.size(); ++i) {
        auto &[pos, path] = leaves[i];
        float value = values[static_cast<int64_t>(i)];
        if (pos.game->over())
          value = pos.game->result_for(pos.game->to_play());
        else
          expand(*path.back(), lp[static_cast<int64_t>(i)], masks[i]);
        backup(path, value);
      }
      done += static_cast<int64_t>(leaves.size());
    }
    auto counts = torch::zeros({cfg_.n_actions()});
    for (const auto &ch : root.children)
      counts[ch->action] = static_cast<double>(ch->visits);
    return counts;
  }

private:
  void expand(Node &node, const torch::Tensor &priors, const torch::Tensor &legal) {
    auto p = priors.accessor<float, 1>();
    auto ok = legal.accessor<bool, 1>();
    for (int64_t a = 0; a < priors.size(0); ++a)
      if (ok[a])
        node.children.push_back(std::make_unique<Node>(Node{p[a], 0.f, 0, a, {}}));
  }

  // PUCT descent with virtual loss, so the other leaves of the batch look elsewhere.
  std::pair<Position, std::vector<Node *>> descend(Node &root, const Position &root_pos) {
    auto pos = root_pos.fork();
    std::vector<Node *> path{&root};
    Node *node = &root;
    while (!node->children.empty()) {
      const float sqrt_n = std::sqrt(static_cast<float>(std::max(node->visits, 1)));
      auto score = [&](const std::unique_ptr<Node> &ch) {
        return ch->q() + static_cast<float>(cfg_.c_puct) * ch->prior * sqrt_n / (1.f + static_cast<float>(ch->visits));
      };
      node = std::max_element(node->children.begin(), node->children.end(),
                              [&](const auto &a, const auto &b) { return score(a) < score(b); })->get();
      node->visits += 1;
      node->value_sum -= static_cast<float>(cfg_.virtual_loss);
      pos.play(node->action);
      path.push_back(node);
    }
    root.visits += 1;
    return {std::move(pos), path};
  }

  // value is for the player to move at the leaf; each node stores it for the player who moved in.
  void backup(const std::vector<Node *> &path, float value) {
    for (size_t i = path.size(); i-- > 1;)
      path[i]->value_sum += static_cast<float>(cfg_.virtual_loss) + (value = -value);
  }

  Evaluator &eval_;
  AZConfig cfg_;
};

// Visit counts -> move distribution and training target; temp == 0 plays the most visited move.
torch::Tensor visit_policy(const torch::Tensor &counts, double temp) {
  if (temp < 1e-3)
    return torch::one_hot(counts.argmax(), counts.size(0)).to(torch::kFloat);
  auto pi = counts.clone(); // EXPECT: tensor-unnecessary-clone -- raised to 1/temp in place right after: counts.pow(1 / temp) is one pass
  pi.pow_(1.0 / temp);
  return pi / pi.sum();
}

struct Sample {
  torch::Tensor planes, pi, legal;
  float z = 0.f; // final result for the player to move here
};

std::vector<Sample> play_game(Mcts &mcts, Position pos, const AZConfig &cfg) {
  std::vector<Sample> samples;
  std::vector<int> movers;
  for (int64_t move = 0; !pos.game->over(); ++move) {
    auto counts = mcts.search(pos, /*add_noise=*/true);
    auto pi = visit_policy(counts, move < cfg.temp_moves ? 1.0 : 0.0);
    samples.push_back({pos.planes.clone(), pi, pos.game->legal_mask()}); // LOOKALIKE: tensor-clone-in-loop -- the planes change every move and each copy is kept
    movers.push_back(pos.game->to_play());
    const auto a = torch::multinomial(pi, 1).item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- a host tensor, and the sampled move steers the game
    pos.play(a);
  }
  for (size_t i = 0; i < samples.size(); ++i)
    samples[i].z = pos.game->result_for(movers[i]);
  return samples;
}

struct Batch { torch::Tensor planes, pi, legal, z; };

class ReplayWindow {
public:
  explicit ReplayWindow(size_t max_games) : max_games_(max_games) {}
  void add_game(std::vector<Sample> game) {
    games_.push_back(std::move(game));
    if (games_.size() > max_games_)
      games_.pop_front();
  }
  Batch sample(const AZConfig &cfg, std::mt19937 &rng) const {
    std::vector<torch::Tensor> planes, pis, legal;
    std::vector<float> zs;
    std::uniform_int_distribution<size_t> pick_game(0, games_.size() - 1);
    std::bernoulli_distribution mirror(0.5);
    const auto H = cfg.board_h, W = cfg.board_w, P = cfg.move_planes;
    for (int64_t i = 0; i < cfg.batch_size; ++i) {
      const auto &g = games_[pick_game(rng)];
      const auto &s = g[std::uniform_int_distribution<size_t>(0, g.size() - 1)(rng)];
      if (mirror(rng)) {
        planes.push_back(s.planes.flip({2}));
        // FACT: pi = torch.rand(84); f = pi.view(6, 7, 2).flip(1); assert is_view_of(pi.view(6, 7, 2), pi) and is_contiguous(f) and is_view_of(f.reshape(-1), f)
        pis.push_back(s.pi.view({H, W, P}).flip({1}).reshape({-1})); // LOOKALIKE: tensor-view-non-contiguous, tensor-reshape-non-contiguous -- pi is a flat contiguous target and flip returns a contiguous copy
        legal.push_back(s.legal.view({H, W, P}).flip({1}).reshape({-1}));
      } else {
        planes.push_back(s.planes), pis.push_back(s.pi), legal.push_back(s.legal);
      }
      zs.push_back(s.z);
    }
    return {torch::stack(planes), torch::stack(pis), torch::stack(legal), torch::tensor(zs)};
  }
  std::deque<std::vector<Sample>> games_;
  size_t max_games_;
};

void train(PolicyValueNet &net, const ReplayWindow &window, const AZConfig &cfg, std::mt19937 &rng) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  net->to(device);
  net->train();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(cfg.weight_decay));
  double policy_total = 0;
  auto value_ema = torch::zeros({}, device);
  for (int64_t step = 0; step < cfg.train_steps; ++step) {
    auto b = window.sample(cfg, rng);
    auto planes = b.planes.to(device), pi = b.pi.to(device), z = b.z.to(device);
    auto out = net->forward(planes);
    auto logits = out.logits;
    // FACT: c = torch.nn.Conv2d(4, 2, 1); l = c(torch.randn(3, 4, 6, 7)).flatten(1); l.masked_fill_(torch.rand(3, 84) < 0.3, -1e9); torch.log_softmax(l, 1).sum().backward(); assert c.weight.grad is not None
    logits.masked_fill_(b.legal.to(device).logical_not(), -1e9); // LOOKALIKE: tensor-inplace-on-saved -- a convolution does not save its output
    auto probs = torch::softmax(logits, 1);
    // FACT: l = torch.randn(3, 5, requires_grad=True); p = torch.softmax(l, 1); p.clamp_min_(1e-8); assert backward_fails(lambda: p.log().sum().backward())
    probs.clamp_min_(1e-8); // EXPECT: tensor-inplace-on-saved -- softmax saved its result for backward: loss.backward() below fails
    auto policy_loss = -(pi * probs.log()).sum(1).mean();
    auto value_loss = torch::mse_loss(out.value.squeeze(1), z);
    auto loss = policy_loss + value_loss;
    opt.zero_grad();
    loss.backward();
    opt.step();
    policy_total += policy_loss.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step to add up the policy loss
    // FACT: m = torch.nn.Linear(3, 1); e = torch.zeros(()); exec('for _ in range(3):\n l = m(torch.randn(4, 3)).pow(2).mean(); l.backward(); e = 0.98 * e + 0.02 * l'); assert e.requires_grad and kept_nodes(e) >= 9
    value_ema = 0.98 * value_ema + 0.02 * value_loss; // EXPECT: tensor-graph-kept-across-iterations -- the smoothed value loss chains every step's graph to the next
    if ((step + 1) % cfg.log_every == 0)
      std::cout << "step " << step + 1 << " policy " << policy_total / static_cast<double>(step + 1) << " value "
                << value_ema.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
  }
}
