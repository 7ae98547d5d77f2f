// Single-process data parallelism without c10d: one replica per device, gradients averaged by
// hand in flat buckets, the update made on replica 0 and broadcast to the others.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct TrainConfig {
  int64_t max_replicas = 4;
  int64_t in_features = 16;
  int64_t hidden = 64;
  int64_t pooled_len = 8;
  int64_t classes = 10;
  int64_t batch_size = 32;
  int64_t epochs = 5;
  int64_t log_every = 50;
  double lr = 0.05;
  double weight_decay = 1e-4;
  double max_grad_norm = 1.0;
  double bucket_cap_mb = 1.0;
};

struct TemporalNetImpl : nn::Cloneable<TemporalNetImpl> {
  explicit TemporalNetImpl(const TrainConfig& cfg) : cfg_(cfg) { reset(); }

  void reset() override {
    const auto& cfg = cfg_;
    conv1_ = register_module("conv1", nn::Conv1d(nn::Conv1dOptions(cfg.in_features, cfg.hidden, 5).padding(2)));
    conv2_ = register_module("conv2", nn::Conv1d(nn::Conv1dOptions(cfg.hidden, cfg.hidden, 3).padding(1)));
    pool_ = register_module("pool", nn::AdaptiveAvgPool1d(cfg.pooled_len));
    norm_ = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({cfg.hidden * cfg.pooled_len})));
    head_ = register_module("head", nn::Linear(cfg.hidden * cfg.pooled_len, cfg.classes));
  }

  // x: [B, T, in_features]
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = F::gelu(conv1_(x.transpose(1, 2)));
    h = F::gelu(conv2_(h)) + h;
    auto pooled = pool_(h);  // [B, hidden, pooled_len]
    // time-major feature vector for the classifier
    // FACT: p = torch.randn(2, 6, 4); assert is_copy_of(p.transpose(1, 2).flatten(1), p)
    auto feats = pooled.transpose(1, 2).flatten(1); // EXPECT: tensor-reshape-non-contiguous
    return head_(norm_(feats));
  }

  TrainConfig cfg_;
  nn::Conv1d conv1_{nullptr}, conv2_{nullptr};
  nn::AdaptiveAvgPool1d pool_{nullptr};
  nn::LayerNorm norm_{nullptr};
  nn::Linear head_{nullptr};
};
TORCH_MODULE(TemporalNet);

struct Bucket {
  std::vector<size_t> index;  // positions in parameters()
  int64_t bytes = 0;
};

std::vector<torch::Device> pick_devices(int64_t max_replicas) {
  std::vector<torch::Device> devices;
  if (torch::cuda::is_available()) {
    const auto n = std::min<int64_t>(max_replicas, static_cast<int64_t>(torch::cuda::device_count()));
    for (int64_t i = 0; i < n; ++i) devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
  } else {
    for (int64_t i = 0; i < max_replicas; ++i) devices.emplace_back(torch::kCPU);  // host replicas for testing
  }
  return devices;
}

// Reverse parameter order, like DDP: the last layers' gradients are ready first.
std::vector<Bucket> make_buckets(const std::vector<torch::Tensor>& params, double cap_mb) {
  const auto cap = static_cast<int64_t>(cap_mb * 1024 * 1024);
  std::vector<Bucket> buckets(1);
  for (size_t k = params.size(); k-- > 0;) {
    const auto bytes = params[k].numel() * static_cast<int64_t>(params[k].element_size());
    if (buckets.back().bytes > 0 && buckets.back().bytes + bytes > cap) buckets.emplace_back();
    buckets.back().index.push_back(k);
    buckets.back().bytes += bytes;
  }
  return buckets;
}

torch::Tensor prepare_batch(const torch::Tensor& x, const torch::Tensor& mean, const torch::Tensor& stdev) {
  auto y = x.to(torch::kFloat);
  // FACT: x = torch.randn(4, 3); y = x.to(torch.float32); y.sub_(1.0); assert shares_storage(x, y)
  y.sub_(mean); // EXPECT: tensor-alias-then-mutate
  y.div_(stdev); // EXPECT: tensor-alias-then-mutate -- the second write through the same alias
  return y;
}

void allreduce_gradients(std::vector<TemporalNet>& replicas, const std::vector<Bucket>& buckets,
                         const std::vector<torch::Device>& devices) {
  const auto world = replicas.size();
  std::vector<std::vector<torch::Tensor>> params(world);
  for (size_t r = 0; r < world; ++r) params[r] = replicas[r]->parameters();
  const auto root = devices.front();

  for (const auto& bucket : buckets) {
    std::vector<torch::Tensor> flats;
    for (size_t r = 0; r < world; ++r) {
      std::vector<torch::Tensor> pieces;
      for (auto i : bucket.index) {
        // FACT: lin = torch.nn.Linear(3, 4); lin(torch.randn(2, 3)).sum().backward(); g = lin.weight.grad; assert is_contiguous(g) and shares_storage(g.reshape(-1), g)
        pieces.push_back(params[r][i].grad().reshape({-1})); // LOOKALIKE: tensor-reshape-non-contiguous -- .grad() follows the contiguous parameter's layout
      }
      flats.push_back(torch::cat(pieces));
    }
    // FACT: f0 = torch.cat([torch.randn(3), torch.randn(2)]); assert shares_storage(f0.to(torch.device("cpu")), f0)
    auto acc = flats[0].to(root);
    for (size_t r = 1; r < world; ++r) acc.add_(flats[r].to(acc.device())); // LOOKALIKE: tensor-alias-then-mutate -- flats[0] is a fresh cat buffer nobody reads again
    acc.div_(static_cast<double>(world));

    for (size_t r = 0; r < world; ++r) {
      auto reduced = acc.to(devices[r]);
      int64_t off = 0;
      for (auto i : bucket.index) {
        auto g = params[r][i].grad();
        const auto n = g.numel();
        // FACT: a = torch.randn(20); g = torch.zeros(3, 4); assert is_view_of(a.narrow(0, 5, 12).view_as(g), a)
        auto piece = reduced.narrow(0, off, n).view_as(g).clone(); // EXPECT: tensor-unnecessary-clone // LOOKALIKE: tensor-view-non-contiguous -- a 1-D narrow is contiguous
        g.copy_(piece);
        off += n;
      }
    }
  }
}

double clip_and_decay(TemporalNet& net, double max_norm, double weight_decay) {
  torch::NoGradGuard no_grad;
  auto params = net->parameters();
  torch::Tensor total = torch::zeros({}, params.front().options());
  for (auto& p : params) {
    if (!p.grad().defined()) continue;
    p.grad().add_(p, weight_decay); // LOOKALIKE: tensor-inplace-on-leaf -- writes the gradient, under NoGradGuard
    total += p.grad().pow(2).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- no-grad: gradients carry no graph
  }
  const double norm = std::sqrt(total.item<double>());
  if (norm > max_norm) {
    const double coef = max_norm / (norm + 1e-6);
    for (auto& p : params) {
      auto g = p.grad();
      // FACT: lin = torch.nn.Linear(3, 2); lin(torch.randn(4, 3)).sum().backward(); g = lin.weight.grad; g.mul_(0.5); assert shares_storage(g, lin.weight.grad)
      g.mul_(coef); // LOOKALIKE: tensor-alias-then-mutate -- scaling the gradient in place is the point
    }
  }
  return norm;
}

void broadcast_parameters(std::vector<TemporalNet>& replicas) {
  auto src = replicas.front()->parameters();
  for (size_t r = 1; r < replicas.size(); ++r) {
    auto dst = replicas[r]->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]); // EXPECT: tensor-inplace-on-leaf // LOOKALIKE: tensor-device-mismatch -- copy_ across devices is allowed
  }
}

double evaluate(TemporalNet& net, const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& mean,
                const torch::Tensor& stdev, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  net->eval();
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const auto N = X.size(0);
  auto preds = torch::empty({N}, torch::kLong);
  int64_t correct = 0;
  for (int64_t begin = 0; begin < N; begin += batch_size) {
    const auto n = std::min(batch_size, N - begin);
    auto xb = ((X.narrow(0, begin, n) - mean) / stdev).to(device);
    auto yb = Y.narrow(0, begin, n).to(device);
    auto top = net->forward(xb).argmax(1);
    preds.narrow(0, begin, n).copy_(top); // LOOKALIKE: tensor-copy-narrowing -- argmax is int64, like the buffer
    correct += (top == yb).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop
  }
  net->train();
  std::cout << "predicted class histogram " << torch::bincount(preds) << "\n";
  return static_cast<double>(correct) / static_cast<double>(N);
}

void train(const TrainConfig& cfg, const torch::Tensor& X, const torch::Tensor& Y, const torch::Tensor& Xval,
           const torch::Tensor& Yval) {
  const auto devices = pick_devices(cfg.max_replicas);
  const auto world = devices.size();
  TemporalNet master(cfg);
  master->to(devices.front());
  std::vector<TemporalNet> replicas{master};
  for (size_t r = 1; r < world; ++r)
    replicas.emplace_back(std::dynamic_pointer_cast<TemporalNetImpl>(master->clone(devices[r])));

  torch::optim::SGD opt(master->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(0.9));
  const auto buckets = make_buckets(master->parameters(), cfg.bucket_cap_mb);

  auto flat_x = X.flatten(0, 1);
  auto mean = flat_x.mean(0);
  auto stdev = flat_x.std(0) + 1e-6;
  auto counts = torch::bincount(Y, {}, cfg.classes).to(torch::kFloat);
  auto class_weights = counts.sum() / (counts * static_cast<double>(cfg.classes)).clamp_min(1.0);

  const auto shard = X.size(0) / static_cast<int64_t>(world);
  const auto steps = shard / cfg.batch_size;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    torch::Tensor epoch_loss = torch::zeros({}, torch::TensorOptions().device(devices.front()));
    for (int64_t step = 0; step < steps; ++step) {
      for (size_t r = 0; r < world; ++r) {
        const auto begin = static_cast<int64_t>(r) * shard + step * cfg.batch_size;
        replicas[r]->zero_grad();
        auto xb = prepare_batch(X.narrow(0, begin, cfg.batch_size), mean, stdev).to(devices[r]); // LOOKALIKE: tensor-clone-in-loop -- a different slice every step
        auto yb = Y.narrow(0, begin, cfg.batch_size).to(devices[r]);
        auto out = replicas[r]->forward(xb);
        auto loss = F::cross_entropy(out, yb, F::CrossEntropyFuncOptions().weight(class_weights.to(devices[r]))); // EXPECT: tensor-clone-in-loop
        loss.backward();
        epoch_loss += loss.to(devices.front()); // EXPECT: tensor-graph-kept-across-iterations
        if (r == 0 && step % cfg.log_every == 0) std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      }
      allreduce_gradients(replicas, buckets, devices);
      const double gnorm = clip_and_decay(master, cfg.max_grad_norm, cfg.weight_decay);
      opt.step();
      broadcast_parameters(replicas);
      if (!std::isfinite(gnorm)) throw std::runtime_error("non-finite gradient norm");
    }
    std::cout << "epoch " << epoch << " mean loss "
              << epoch_loss.item<double>() / static_cast<double>(std::max<int64_t>(steps * world, 1)) << "\n";
    std::cout << "val acc " << evaluate(master, Xval, Yval, mean, stdev, cfg.batch_size) << "\n";
  }
}

int main() {
  TrainConfig cfg;
  const int64_t n_train = 4096, n_val = 512, seq_len = 48;
  auto X = torch::randn({n_train, seq_len, cfg.in_features}) * 3.0 + 1.0;
  auto Y = torch::randint(0, cfg.classes, {n_train}, torch::kLong);
  auto Xval = torch::randn({n_val, seq_len, cfg.in_features}) * 3.0 + 1.0;
  auto Yval = torch::randint(0, cfg.classes, {n_val}, torch::kLong);
  train(cfg, X, Y, Xval, Yval);
  return 0;
}
