// Class-incremental continual learning with Elastic Weight Consolidation and a small replay
// memory. After each task the diagonal Fisher information (mean squared gradients of the
// log-likelihood) and a snapshot of the weights are stored; training on later tasks adds
// lambda/2 * sum F * (theta - theta*)^2 per past task to the loss.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct EwcConfig {
  int64_t in_dim = 784;
  int64_t hidden = 256;
  int64_t num_classes = 10;
  int64_t classes_per_task = 2;
  double lr = 1e-2;
  double ewc_lambda = 400.0;
  double fisher_clip = 1e3;
  double input_noise = 0.0;
  int64_t fisher_samples = 256;
  int64_t epochs_per_task = 3;
  int64_t batch_size = 64;
  int64_t memory_size = 500;
  int64_t replay_batch = 32;
};

struct Task {
  torch::Tensor x;  // [N, in_dim] float in [0, 1]
  torch::Tensor y;  // [N] int64
  int64_t id = 0;
};

struct MLPImpl : nn::Module {
  explicit MLPImpl(const EwcConfig& cfg)
      : fc1(register_module("fc1", nn::Linear(cfg.in_dim, cfg.hidden))),
        fc2(register_module("fc2", nn::Linear(cfg.hidden, cfg.hidden))),
        fc3(register_module("fc3", nn::Linear(cfg.hidden, cfg.num_classes))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x));
    x = torch::relu(fc2(x));
    return fc3(x);
  }

  nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(MLP);

using ParamMap = std::map<std::string, torch::Tensor>;

class EWC {
 public:
  void consolidate(MLP& model, const Task& task, const EwcConfig& cfg);
  torch::Tensor penalty(MLP& model) const;
  std::map<std::string, double> drift(MLP& model) const;
  bool empty() const { return fishers_.empty(); }

 private:
  std::vector<ParamMap> fishers_;
  std::vector<ParamMap> stars_;
};

void EWC::consolidate(MLP& model, const Task& task, const EwcConfig& cfg) {
  model->eval();
  const auto dev = model->fc1->weight.device();
  ParamMap fisher;
  for (const auto& kv : model->named_parameters()) fisher[kv.key()] = torch::zeros_like(kv.value());

  const int64_t n = std::min(cfg.fisher_samples, task.x.size(0));
  auto order = torch::randperm(task.x.size(0)).narrow(0, 0, n);
  for (int64_t i = 0; i < n; ++i) {
    auto xi = task.x.index_select(0, order.narrow(0, i, 1)).to(dev);
    auto logp = F::log_softmax(model->forward(xi), F::LogSoftmaxFuncOptions(1));
    // true Fisher: labels drawn from the model's own predictive distribution
    auto yi = torch::multinomial(logp.exp().detach(), 1).squeeze(1);
    model->zero_grad();
    F::nll_loss(logp, yi).backward();
    for (auto& kv : model->named_parameters()) {
      fisher[kv.key()] += kv.value().grad().pow(2); // LOOKALIKE: tensor-graph-kept-across-iterations -- gradients carry no graph (no create_graph)
    }
  }

  ParamMap task_fisher, task_star;
  for (const auto& kv : model->named_parameters()) {
    const auto& acc = fisher.at(kv.key());
    auto f = acc.clone(); // EXPECT: tensor-unnecessary-clone
    f.div_(static_cast<double>(n));
    f.clamp_max_(cfg.fisher_clip);
    task_fisher[kv.key()] = f;
    task_star[kv.key()] = kv.value().detach().clone(); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- a stored snapshot of a different parameter each pass; without the copy it would follow later optimizer steps
  }
  fishers_.push_back(std::move(task_fisher));
  stars_.push_back(std::move(task_star));
  model->train();
}

torch::Tensor EWC::penalty(MLP& model) const {
  auto total = torch::zeros({});
  for (const auto& kv : model->named_parameters()) {
    for (size_t t = 0; t < fishers_.size(); ++t) {
      const auto& f = fishers_[t].at(kv.key());
      const auto& star = stars_[t].at(kv.key());
      total = total + (f * (kv.value() - star).pow(2)).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- the penalty is returned and backpropagated
    }
  }
  return 0.5 * total;
}

// Squared distance of every parameter from the last consolidated weights, for the log.
std::map<std::string, double> EWC::drift(MLP& model) const {
  std::map<std::string, double> out;
  if (stars_.empty()) return out;
  for (const auto& kv : model->named_parameters()) {
    auto d = kv.value().detach();
    d -= stars_.back().at(kv.key()); // EXPECT: tensor-inplace-on-detached
    out[kv.key()] = d.pow(2).sum().item<double>();
  }
  return out;
}

// Reservoir-sampled memory; images stored as uint8 to keep it small.
class ReplayBuffer {
 public:
  ReplayBuffer(int64_t capacity, int64_t dim)
      : capacity_(capacity),
        x_(torch::zeros({capacity, dim}, torch::kByte)),
        y_(torch::zeros({capacity}, torch::kLong)),
        rng_(1234) {}

  int64_t size() const { return std::min(seen_, capacity_); }

  void add(const torch::Tensor& x, const torch::Tensor& y) {
    for (int64_t i = 0; i < x.size(0); ++i) {
      int64_t slot = seen_;
      if (seen_ >= capacity_) slot = std::uniform_int_distribution<int64_t>(0, seen_)(rng_);
      ++seen_;
      if (slot >= capacity_) continue;
      x_[slot].copy_((x[i] * 255.0).round().clamp(0, 255)); // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to 0..255 first
      y_[slot] = y[i]; // LOOKALIKE: tensor-copy-narrowing -- labels are int64, like the buffer
    }
  }

  std::pair<torch::Tensor, torch::Tensor> sample(int64_t k) {
    auto idx = torch::randint(size(), {std::min(k, size())}, torch::kLong);
    // FACT: b = torch.zeros(6, 3, dtype=torch.uint8); s = b.index_select(0, torch.tensor([0, 2])); assert is_copy_of(s.to(torch.float), b)
    auto xs = x_.index_select(0, idx).to(torch::kFloat).div_(255.0); // LOOKALIKE: tensor-alias-then-mutate -- index_select and to(kFloat) both copy; written once, no other handle
    return {xs, y_.index_select(0, idx)};
  }

 private:
  int64_t capacity_;
  int64_t seen_ = 0;
  torch::Tensor x_;
  torch::Tensor y_;
  std::mt19937 rng_;
};

void jitter_(torch::Tensor x, double sigma) { x.add_(torch::randn_like(x) * sigma).clamp_(0.0, 1.0); }

// Output units of the classes seen so far (class-incremental: later classes stay masked).
torch::Tensor classes_seen(int64_t task_id, const EwcConfig& cfg) {
  auto mask = torch::zeros({cfg.num_classes}, torch::kBool);
  mask.narrow(0, 0, (task_id + 1) * cfg.classes_per_task).fill_(true);
  return mask;
}

// New classes get a freshly initialised output row.
void reset_head_rows(MLP& model, int64_t first, int64_t count) {
  nn::init::normal_(model->fc3->weight.narrow(0, first, count), 0.0, 0.01); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under NoGradGuard
  model->fc3->bias.narrow(0, first, count).zero_(); // EXPECT: tensor-inplace-on-leaf
}

void restore(MLP& model, const ParamMap& best) {
  torch::NoGradGuard no_grad;
  for (auto& kv : model->named_parameters()) {
    kv.value().copy_(best.at(kv.key())); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
}

void train_sequence(MLP& model, const std::vector<Task>& tasks, const EwcConfig& cfg, torch::Device device) {
  model->to(device);
  EWC ewc;
  ReplayBuffer memory(cfg.memory_size, cfg.in_dim);
  std::vector<torch::Tensor> loss_history;

  for (const auto& task : tasks) {
    if (task.id > 0) reset_head_rows(model, task.id * cfg.classes_per_task, cfg.classes_per_task);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(0.9));
    auto seen = classes_seen(task.id, cfg);
    const int64_t N = task.x.size(0);

    for (int64_t epoch = 0; epoch < cfg.epochs_per_task; ++epoch) {
      for (int64_t start = 0; start < N; start += cfg.batch_size) {
        const int64_t len = std::min(cfg.batch_size, N - start);
        // FACT: x = torch.randn(10, 4); b = x.narrow(0, 2, 5).contiguous(); assert is_view_of(b, x)
        auto xb = task.x.narrow(0, start, len).contiguous();
        if (cfg.input_noise > 0) jitter_(xb, cfg.input_noise); // EXPECT: tensor-alias-then-mutate
        xb = xb.to(device);
        auto yb = task.y.narrow(0, start, len).to(device);
        if (memory.size() > 0) {
          auto replay = memory.sample(cfg.replay_batch);
          xb = torch::cat({xb, replay.first.to(device)});
          yb = torch::cat({yb, replay.second.to(device)});
        }

        auto logits = model->forward(xb);
        logits = logits.masked_fill(seen.to(device).logical_not(), -1e9); // EXPECT: tensor-clone-in-loop
        auto loss = F::cross_entropy(logits, yb);
        if (!ewc.empty()) {
          loss = loss + cfg.ewc_lambda * ewc.penalty(model).to(device); // LOOKALIKE: tensor-clone-in-loop -- the penalty changes with the weights every step
        }
        opt.zero_grad();
        loss.backward();
        opt.step();
        loss_history.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations
      }
    }

    auto recent = torch::stack(loss_history).narrow(0, std::max<int64_t>(0, (int64_t)loss_history.size() - 50),
                                                    std::min<int64_t>(50, (int64_t)loss_history.size()));
    std::cout << "task " << task.id << " recent loss " << recent.mean().item<double>() << "\n";
    for (const auto& kv : ewc.drift(model)) std::cout << "  drift " << kv.first << " " << kv.second << "\n";

    ewc.consolidate(model, task, cfg);
    auto keep = torch::randperm(N).narrow(0, 0, std::min<int64_t>(N, cfg.memory_size / 2));
    memory.add(task.x.index_select(0, keep), task.y.index_select(0, keep));
  }
}

double evaluate(MLP& model, const std::vector<Task>& tasks, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  double correct = 0.0, total = 0.0;
  for (const auto& task : tasks) {
    auto pred = model->forward(task.x.to(device)).argmax(1).cpu();
    correct += pred.eq(task.y).sum().item<double>();
    total += static_cast<double>(task.y.size(0));
  }
  model->train();
  return correct / std::max(total, 1.0);
}

int main() {
  EwcConfig cfg;
  std::vector<Task> tasks;
  for (int64_t t = 0; t < cfg.num_classes / cfg.classes_per_task; ++t) {
    Task task;
    task.id = t;
    task.x = torch::rand({512, cfg.in_dim});
    task.y = torch::randint(t * cfg.classes_per_task, (t + 1) * cfg.classes_per_task, {512}, torch::kLong);
    tasks.push_back(task);
  }
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  MLP model(cfg);
  train_sequence(model, tasks, cfg, device);
  std::cout << "accuracy over all tasks " << evaluate(model, tasks, device) << "\n";

  ParamMap best;
  for (const auto& kv : model->named_parameters()) best[kv.key()] = kv.value().detach().clone();
  restore(model, best);
  return 0;
}
