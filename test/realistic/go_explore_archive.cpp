// Go-Explore: an archive of cells keyed by coarse quantised frames; each iteration restores the
// simulator to a chosen cell and explores. A goal-conditioned policy is then cloned from the archive.
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

struct GoConfig {
  int64_t cell_h = 8, cell_w = 11, levels = 8, history = 4;
  int64_t iterations = 5000, explore_steps = 100, log_every = 500;
  double repeat_prob = 0.95, goal_noise = 0.02;
  int64_t bc_epochs = 20, bc_batch = 256;
};

// Two rooms joined by a locked door; the key is in the first room, the goal in the second.
class KeyDoorMaze {
 public:
  static constexpr int64_t kSize = 16, kScale = 4, kActions = 5;
  static constexpr int64_t kKeyR = 14, kKeyC = 2, kDoorR = 7, kDoorC = 8, kGoalR = 2, kGoalC = 14;
  struct Step { torch::Tensor reward; bool done; };
  KeyDoorMaze() : walls_(torch::zeros({kSize, kSize}, torch::kBool)) {
    for (int64_t d : {0, 1}) {
      walls_.select(d, 0).fill_(true);
      walls_.select(d, kSize - 1).fill_(true);
    }
    walls_.select(1, kDoorC).fill_(true);
    walls_[kDoorR][kDoorC] = false;
    reset();
  }

  void reset() { state_ = torch::tensor({1, 1, 0}, torch::kLong); }
  const torch::Tensor& snapshot() const { return state_; }
  void restore(torch::Tensor s) { state_ = std::move(s); }
  Step step(int64_t action) {
    static const int64_t dr[kActions] = {0, -1, 1, 0, 0}, dc[kActions] = {0, 0, 0, -1, 1};
    auto s = state_.accessor<int64_t, 1>();
    const int64_t r = s[0] + dr[action], c = s[1] + dc[action];
    const bool locked = r == kDoorR && c == kDoorC && s[2] == 0;
    if (!walls_.accessor<bool, 2>()[r][c] && !locked) { s[0] = r; s[1] = c; }
    double reward = 0.0;
    if (s[0] == kKeyR && s[1] == kKeyC && s[2] == 0) { s[2] = 1; reward = 1.0; }
    const bool done = s[0] == kGoalR && s[1] == kGoalC;
    return {torch::tensor(done ? 10.0 : reward), done};
  }
  torch::Tensor render() const {
    auto img = torch::zeros({kSize, kSize, 3}, torch::kUInt8);
    img.index_put_({walls_}, torch::tensor({90, 90, 90}, torch::kUInt8));
    auto s = state_.accessor<int64_t, 1>();
    if (s[2] == 0) img[kKeyR][kKeyC] = torch::tensor({255, 215, 0}, torch::kUInt8);
    img[kGoalR][kGoalC] = torch::tensor({0, 255, 0}, torch::kUInt8);
    img[s[0]][s[1]] = torch::tensor({255, 255, 255}, torch::kUInt8);
    return img.repeat_interleave(kScale, 0).repeat_interleave(kScale, 1);
  }
 private:
  torch::Tensor walls_, state_;
};

// Grayscale, area-downsample to cell_h x cell_w, quantise to a few intensity levels.
struct DownsamplerImpl : torch::nn::Module {
  DownsamplerImpl(int64_t h, int64_t w, int64_t levels) : h_(h), w_(w), levels_(levels) {
    gray_w_ = register_buffer("gray_w", torch::tensor({0.299, 0.587, 0.114}, torch::kFloat32));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& frame) {
    // FACT: f = torch.zeros(64, 64, 3, dtype=torch.uint8); assert is_copy_of(f.to(torch.float32), f)
    auto rgb = frame.to(torch::kFloat32);
    rgb.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- frames are uint8, to() allocated a float copy
    auto gray = rgb.matmul(gray_w_).unsqueeze(0).unsqueeze(0);
    auto small = torch::adaptive_avg_pool2d(gray, {h_, w_}).squeeze(0).squeeze(0);
    // FACT: s = torch.nn.functional.adaptive_avg_pool2d(torch.rand(1, 1, 64, 64), (8, 11)).squeeze(0).squeeze(0); assert is_view_of(s.flatten(), s)
    auto levels = small.flatten();
    levels.mul_(static_cast<double>(levels_)).floor_().clamp_max_(levels_ - 1);  // EXPECT: tensor-alias-then-mutate
    return {small, levels.view({h_, w_})};
  }
  int64_t h_, w_, levels_;
  torch::Tensor gray_w_;
};
TORCH_MODULE(Downsampler);

// Keys follow the reference implementation, which flattens frames column-major.
std::string cell_key(const torch::Tensor& levels) {
  // FACT: l = torch.rand(8, 11); assert is_copy_of(l.t().reshape(-1), l) and not is_contiguous(l.t())
  auto col_major = levels.t().reshape({-1}).to(torch::kUInt8);  // EXPECT: tensor-reshape-non-contiguous
  std::string key(static_cast<size_t>(col_major.numel()), '\0');
  std::memcpy(&key[0], col_major.data_ptr<uint8_t>(), key.size());
  return key;
}

struct Cell {
  torch::Tensor state, frame;
  std::vector<int64_t> trajectory;
  double score = -INFINITY;
  int64_t visits = 0, chosen = 0;
};

class Archive {
 public:
  bool maybe_add(const std::string& key, const torch::Tensor& state, const torch::Tensor& small,
                 const std::vector<int64_t>& traj, double score) {
    auto it = cells_.find(key);
    if (it != cells_.end()) {
      Cell& c = it->second;
      ++c.visits;
      const bool better = score > c.score || (score == c.score && traj.size() < c.trajectory.size());
      if (better) {
        c.state = state.clone();
        c.trajectory = traj;
        c.score = score;
      }
      return false;
    }
    Cell c;
    c.state = state.clone();  // LOOKALIKE: tensor-unnecessary-clone -- callers pass the simulator's live state, which step() rewrites
    c.frame = torch::empty(small.sizes(), torch::kUInt8);
    c.frame.copy_(small.mul(255.0));  // EXPECT: tensor-copy-narrowing
    c.trajectory = traj;
    c.score = score;
    cells_.emplace(key, std::move(c));
    return true;
  }
  const std::string& select() {
    keys_.clear();
    std::vector<double> chosen;
    for (const auto& kv : cells_) {
      keys_.push_back(kv.first);
      chosen.push_back(static_cast<double>(kv.second.chosen));
    }
    auto counts = torch::tensor(chosen, torch::kFloat64);
    const auto idx = torch::multinomial(torch::rsqrt(counts + 1.0), 1).item<int64_t>();
    ++cells_.at(keys_[idx]).chosen;
    return keys_[idx];
  }
  // All cell frames tiled into one image, for a quick look at what has been found.
  torch::Tensor mosaic(int64_t cols, int64_t h, int64_t w) const {
    std::vector<torch::Tensor> tiles;
    for (const auto& kv : cells_) tiles.push_back(kv.second.frame);
    while (tiles.size() % cols != 0) tiles.push_back(torch::zeros({h, w}, torch::kUInt8));
    const int64_t rows = static_cast<int64_t>(tiles.size()) / cols;
    auto grid = torch::stack(tiles).view({rows, cols, h, w}).permute({0, 2, 1, 3});
    // FACT: f = torch.rand(6, 8, 11); assert raises(lambda: f.view(2, 3, 8, 11).permute(0, 2, 1, 3).view(16, 33), "view size is not compatible")
    return grid.view({rows * h, cols * w});  // EXPECT: tensor-view-non-contiguous
  }

  Cell& at(const std::string& key) { return cells_.at(key); }
  const std::unordered_map<std::string, Cell>& cells() const { return cells_; }
 private:
  std::unordered_map<std::string, Cell> cells_;
  std::vector<std::string> keys_;
};

struct FrameHistory {
  FrameHistory(int64_t k, int64_t h, int64_t w) : buf(torch::zeros({k, h, w})) {}
  void reset(const torch::Tensor& f) { buf.copy_(f.unsqueeze(0).expand_as(buf)); }
  void push(const torch::Tensor& f) {
    const int64_t k = buf.size(0);
    // FACT: b = torch.zeros(4, 8, 11); assert raises(lambda: b.narrow(0, 0, 3).copy_(b.narrow(0, 1, 3)), "some elements of the input tensor")
    buf.narrow(0, 0, k - 1).copy_(buf.narrow(0, 1, k - 1));  // EXPECT: tensor-inplace-overlap
    buf[k - 1].copy_(f);
  }
  torch::Tensor buf;
};

struct GoalPolicyImpl : torch::nn::Module {
  GoalPolicyImpl(int64_t history, int64_t h, int64_t w, int64_t actions)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(history, 32, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 3).padding(1)))),
        goal_fc(register_module("goal_fc", torch::nn::Linear(h * w, 64))),
        trunk(register_module("trunk", torch::nn::Linear(32 * h * w + 64 + actions, 256))),
        head(register_module("head", torch::nn::Linear(256, actions))) {}
  torch::Tensor forward(const torch::Tensor& frames, const torch::Tensor& goal, const torch::Tensor& prev) {
    auto x = torch::relu(conv2(torch::relu(conv1(frames))));
    // FACT: x = torch.nn.Conv2d(4, 32, 3, padding=1)(torch.randn(2, 4, 8, 11)); assert is_view_of(x.flatten(1), x)
    auto feat = x.flatten(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- conv output is contiguous, flatten is a view
    auto g = torch::relu(goal_fc(goal));
    return head(torch::relu(trunk(torch::cat({feat, g, prev}, 1))));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear goal_fc, trunk, head;
};
TORCH_MODULE(GoalPolicy);

struct BCData { torch::Tensor frames, goals, prev, actions; };

BCData build_dataset(const Archive& archive, KeyDoorMaze& env, Downsampler& down, const GoConfig& cfg) {
  std::vector<torch::Tensor> frames, goals, prevs, acts;
  FrameHistory hist(cfg.history, cfg.cell_h, cfg.cell_w);
  for (const auto& kv : archive.cells()) {
    const Cell& cell = kv.second;
    const int64_t T = static_cast<int64_t>(cell.trajectory.size());
    if (T == 0) continue;
    env.reset();
    hist.reset(down->forward(env.render()).first);
    std::vector<torch::Tensor> steps;
    for (int64_t a : cell.trajectory) {
      steps.push_back(hist.buf.clone());
      env.step(a);
      hist.push(down->forward(env.render()).first);
    }
    auto actions = torch::tensor(cell.trajectory, torch::kLong);
    // FACT: a = torch.arange(6); p = torch.roll(a, 1, 0); assert is_copy_of(p, a)
    auto prev = torch::roll(actions, 1, 0);
    prev[0] = 0;  // LOOKALIKE: tensor-inplace-overlap -- roll wrote a fresh tensor, nothing overlaps
    auto goal = cell.frame.to(torch::kFloat32).div(255.0);
    // FACT: g = torch.rand(8, 11); r = g.unsqueeze(0).expand(5, -1, -1).reshape(5, -1); assert is_view_of(r, g) and r.stride(0) == 0 and raises(lambda: r.add_(torch.randn_like(r) * 0.02), "more than one element")
    auto goal_rows = goal.unsqueeze(0).expand({T, -1, -1}).reshape({T, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- only the inner dims merge, still a view
    goal_rows.add_(torch::randn_like(goal_rows) * cfg.goal_noise);  // EXPECT: tensor-inplace-on-expanded
    frames.push_back(torch::stack(steps));
    goals.push_back(goal_rows);
    prevs.push_back(prev);
    acts.push_back(actions);
  }
  return {torch::cat(frames), torch::cat(goals), torch::cat(prevs), torch::cat(acts)};
}

void train_policy(GoalPolicy& policy, const BCData& data, const GoConfig& cfg, torch::Device device) {
  torch::optim::Adam opt(policy->parameters(), torch::optim::AdamOptions(1e-3));
  auto frames = data.frames.to(device), goals = data.goals.to(device);
  auto prev = data.prev.to(device), actions = data.actions.to(device);
  auto counts = torch::bincount(data.actions, {}, KeyDoorMaze::kActions).to(torch::kFloat32);
  auto class_w = counts.sum() / (counts + 1.0) / static_cast<double>(KeyDoorMaze::kActions);
  const int64_t n = actions.size(0);
  std::vector<torch::Tensor> losses;
  for (int64_t epoch = 0; epoch < cfg.bc_epochs; ++epoch) {
    auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(device));
    int64_t correct = 0;
    for (int64_t i = 0; i < n; i += cfg.bc_batch) {
      auto idx = perm.narrow(0, i, std::min(cfg.bc_batch, n - i));
      auto y = actions.index_select(0, idx);
      auto prev_1h = torch::one_hot(prev.index_select(0, idx), KeyDoorMaze::kActions).to(torch::kFloat32);
      auto logits = policy->forward(frames.index_select(0, idx), goals.index_select(0, idx), prev_1h);
      auto loss = torch::nll_loss(torch::log_softmax(logits, -1), y, class_w.to(device));  // EXPECT: tensor-clone-in-loop
      opt.zero_grad();
      loss.backward();
      opt.step();
      correct += (logits.argmax(-1) == y).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
      losses.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph is kept
    }
    std::cout << "bc epoch " << epoch << " acc " << static_cast<double>(correct) / n
              << " loss " << torch::stack(losses).mean().item<double>() << "\n";
    losses.clear();
  }
}

double return_rate(GoalPolicy& policy, const Archive& archive, KeyDoorMaze& env, Downsampler& down,
                   const GoConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  policy->eval();
  FrameHistory hist(cfg.history, cfg.cell_h, cfg.cell_w);
  int64_t reached = 0, tried = 0;
  for (const auto& kv : archive.cells()) {
    const Cell& cell = kv.second;
    if (cell.trajectory.empty()) continue;
    env.reset();
    hist.reset(down->forward(env.render()).first);
    // FACT: f = torch.zeros(8, 11, dtype=torch.uint8); g = f.to(torch.float32).div(255.0); assert is_contiguous(g) and not raises(lambda: g.view(1, -1))
    auto goal = cell.frame.to(torch::kFloat32).div(255.0).view({1, -1});  // LOOKALIKE: tensor-view-non-contiguous -- div() returned a fresh contiguous tensor
    auto prev = torch::zeros({1, KeyDoorMaze::kActions}, device);
    bool hit = false;
    for (size_t t = 0; t < 2 * cell.trajectory.size() && !hit; ++t) {
      auto logits = policy->forward(hist.buf.unsqueeze(0).to(device), goal, prev);  // EXPECT: tensor-device-mismatch
      const int64_t a = logits.argmax(-1).item<int64_t>();
      env.step(a);
      auto [small, levels] = down->forward(env.render());
      hist.push(small);
      hit = cell_key(levels) == kv.first;
      prev.zero_();
      prev[0][a] = 1.0;
    }
    reached += hit;
    ++tried;
  }
  return tried ? static_cast<double>(reached) / tried : 0.0;
}

int main() {
  GoConfig cfg;
  torch::manual_seed(0);
  std::mt19937 rng(0);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  KeyDoorMaze env;
  Downsampler down(cfg.cell_h, cfg.cell_w, cfg.levels);
  Archive archive;
  auto [small0, levels0] = down->forward(env.render());
  archive.maybe_add(cell_key(levels0.clone()), env.snapshot(), small0, {}, 0.0);  // EXPECT: tensor-unnecessary-clone

  std::bernoulli_distribution repeat(cfg.repeat_prob);
  std::uniform_int_distribution<int64_t> any_action(0, KeyDoorMaze::kActions - 1);
  for (int64_t it = 0; it < cfg.iterations; ++it) {
    const Cell& start = archive.at(archive.select());
    env.restore(start.state.clone());  // LOOKALIKE: tensor-clone-in-loop -- step() writes the restored state in place
    auto traj = start.trajectory;
    double score = start.score;
    int64_t action = any_action(rng);
    for (int64_t s = 0; s < cfg.explore_steps; ++s) {
      if (!repeat(rng)) action = any_action(rng);
      auto tr = env.step(action);
      traj.push_back(action);
      score += tr.reward.item<double>();  // LOOKALIKE: tensor-sync-in-loop -- simulator rewards are CPU tensors
      auto [small, levels] = down->forward(env.render());
      archive.maybe_add(cell_key(levels), env.snapshot(), small, traj, score);
      if (tr.done) break;
    }
    if (it % cfg.log_every == 0) {
      std::cout << "iter " << it << " cells " << archive.cells().size() << "\n";
      torch::save(archive.mosaic(16, cfg.cell_h, cfg.cell_w), "archive_" + std::to_string(it) + ".pt");
    }
  }

  auto data = build_dataset(archive, env, down, cfg);
  GoalPolicy policy(cfg.history, cfg.cell_h, cfg.cell_w, KeyDoorMaze::kActions);
  policy->to(device);
  train_policy(policy, data, cfg, device);
  std::cout << "return rate " << return_rate(policy, archive, env, down, cfg, device) << "\n";
  return 0;
}
