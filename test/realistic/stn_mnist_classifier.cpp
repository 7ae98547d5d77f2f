// Spatial transformer network in front of a small MNIST classifier.
// The localisation net regresses a bounded affine correction around the identity,
// the sampler rectifies the digit, and the classifier works on the rectified image.

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

namespace {

constexpr double kMean = 0.1307;
constexpr double kStd = 0.3081;

struct Config {
  std::string data_root = "./data/mnist";
  int64_t batch_size = 64;
  int64_t test_batch_size = 256;
  size_t epochs = 12;
  double lr = 0.01;
  double momentum = 0.9;
  double max_delta = 0.5;      // bound on the affine correction
  double theta_reg = 1e-3;     // pull the transform towards the identity
  double max_weight = 3.0;     // max-norm on the classifier head
  double noise_std = 0.05;
  double temperature = 1.0;
  int64_t log_interval = 50;
  std::string panel_path = "stn_panel.pgm";
};

struct LocalizationNetImpl : torch::nn::Module {
  explicit LocalizationNetImpl(double max_delta)
      : conv1(torch::nn::Conv2dOptions(1, 8, 7)),
        conv2(torch::nn::Conv2dOptions(8, 10, 5)),
        fc1(10 * 3 * 3, 32),
        fc2(32, 6),
        max_delta_(max_delta) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    identity_ = torch::tensor({1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f}).view({1, 2, 3});

    // Start from the identity transform: the correction head outputs zero.
    torch::NoGradGuard no_grad;
    fc2->weight.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- init runs under NoGradGuard
    fc2->bias.zero_();
  }

  struct Output {
    torch::Tensor theta;
    torch::Tensor reg;
  };

  Output forward(const torch::Tensor& x) {
    auto xs = torch::relu(torch::max_pool2d(conv1->forward(x), 2, 2));
    xs = torch::relu(torch::max_pool2d(conv2->forward(xs), 2, 2));
    // FACT: is_contiguous(torch.relu(torch.nn.functional.max_pool2d(torch.rand(4,10,6,6),2,2)))
    xs = xs.view({-1, 10 * 3 * 3});  // LOOKALIKE: tensor-view-non-contiguous -- pooled conv output is contiguous
    // FACT: d = torch.tanh(torch.nn.Linear(32,6)(torch.rand(4,32))); d.mul_(0.5); assert backward_fails(lambda: d.sum().backward())
    auto delta = torch::tanh(fc2->forward(torch::relu(fc1->forward(xs))));
    delta.mul_(max_delta_);  // EXPECT: tensor-inplace-on-saved
    auto theta = delta.view({-1, 2, 3}) + identity_;  // EXPECT: tensor-device-mismatch
    return {theta, delta.pow(2).sum(1).mean()};
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
  torch::Tensor identity_;
  double max_delta_;
};
TORCH_MODULE(LocalizationNet);

struct SpatialTransformerImpl : torch::nn::Module {
  explicit SpatialTransformerImpl(double max_delta)
      : loc(register_module("loc", LocalizationNet(max_delta))) {}

  std::pair<torch::Tensor, torch::Tensor> warp(const torch::Tensor& x) {
    auto out = loc->forward(x);
    auto grid = F::affine_grid(out.theta, x.sizes(), /*align_corners=*/false);
    auto warped = F::grid_sample(
        x, grid,
        F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kZeros).align_corners(false));
    last_reg = out.reg;
    last_grid = grid;
    return {warped, out.theta};
  }

  torch::Tensor forward(const torch::Tensor& x) { return warp(x).first; }

  LocalizationNet loc;
  torch::Tensor last_reg;
  torch::Tensor last_grid;
};
TORCH_MODULE(SpatialTransformer);

struct DigitClassifierImpl : torch::nn::Module {
  DigitClassifierImpl()
      : conv1(torch::nn::Conv2dOptions(1, 10, 5)),
        conv2(torch::nn::Conv2dOptions(10, 20, 5)),
        drop(torch::nn::Dropout2dOptions(0.25)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("drop", drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, 0.5, is_training());
    return fc2->forward(x);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout2d drop;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(DigitClassifier);

struct STNNetImpl : torch::nn::Module {
  explicit STNNetImpl(const Config& cfg)
      : stn(register_module("stn", SpatialTransformer(cfg.max_delta))),
        classifier(register_module("classifier", DigitClassifier())) {}

  torch::Tensor forward(const torch::Tensor& x) { return classifier->forward(stn->forward(x)); }

  SpatialTransformer stn;
  DigitClassifier classifier;
};
TORCH_MODULE(STNNet);

struct TrainStats {
  std::vector<torch::Tensor> step_losses;  // for the loss curve
  std::vector<double> epoch_losses;
};

void write_pgm(const std::string& path, const torch::Tensor& gray) {
  auto bytes = gray.mul(255.0).clamp(0, 255).to(torch::kUInt8).contiguous();
  std::ofstream out(path, std::ios::binary);
  out << "P5\n" << bytes.size(1) << " " << bytes.size(0) << "\n255\n";
  out.write(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), bytes.numel());
}

// Originals on the top row, rectified digits below.
void dump_stn_panel(STNNet& model, const torch::Tensor& images, torch::Device device,
                    const std::string& path) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t n = images.size(0);
  const int64_t h = images.size(2);
  const int64_t w = images.size(3);

  // FACT: x = torch.rand(8,1,28,28); is_view_of(x.squeeze(1), x)
  auto originals = images.squeeze(1);
  originals.mul_(kStd).add_(kMean);  // EXPECT: tensor-alias-then-mutate
  auto warped = model->stn->forward(images.to(device)).squeeze(1).to(torch::kCPU);
  auto shown = warped.clone().mul_(kStd).add_(kMean).clamp_(0.0, 1.0);  // EXPECT: tensor-unnecessary-clone

  auto panel = torch::cat({originals.clamp(0.0, 1.0), shown}, 0);
  // FACT: p = torch.rand(16,28,28).view(2,8,28,28).permute(0,2,1,3); is_copy_of(p.reshape(56,224), p)
  auto tiled = panel.view({2, n, h, w}).permute({0, 2, 1, 3}).reshape({2 * h, n * w});  // EXPECT: tensor-reshape-non-contiguous
  write_pgm(path, tiled);
}

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  double mean_theta_dev = 0.0;
  double grid_coverage = 0.0;
  torch::Tensor predictions;
  torch::Tensor targets;
};

template <typename Loader>
EvalResult evaluate(STNNet& model, Loader& loader, size_t dataset_size, torch::Device device,
                    const Config& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  EvalResult res;
  res.predictions = torch::empty({static_cast<int64_t>(dataset_size)}, torch::kInt32);
  res.targets = torch::empty({static_cast<int64_t>(dataset_size)}, torch::kInt64);
  auto identity_cpu = torch::tensor({1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f}).view({1, 2, 3});
  auto temperature = torch::scalar_tensor(cfg.temperature);

  auto loss_sum = torch::zeros({}, device);
  auto dev_sum = torch::zeros({}, device);
  auto inside_sum = torch::zeros({}, device);
  int64_t correct = 0;
  int64_t offset = 0;
  for (auto& batch : loader) {
    torch::Tensor data = batch.data.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    torch::Tensor target = batch.target.to(device);
    const int64_t n = data.size(0);

    auto [warped, theta] = model->stn->warp(data);
    auto logits = model->classifier->forward(warped);
    auto log_probs = F::log_softmax(logits / temperature, 1);  // LOOKALIKE: tensor-device-mismatch -- 0-dim CPU tensor is allowed with CUDA operands
    loss_sum += F::nll_loss(log_probs, target, F::NLLLossFuncOptions().reduction(torch::kSum));  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, no graph is built

    auto pred = log_probs.argmax(1);
    correct += pred.eq(target).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop

    auto identity = identity_cpu.to(device);  // EXPECT: tensor-clone-in-loop
    dev_sum += (theta - identity).abs().sum();
    // FACT: g = torch.nn.functional.affine_grid(torch.rand(4,2,3), (4,1,28,28), align_corners=False); is_view_of(g.reshape(4,-1,2), g)
    auto pts = model->stn->last_grid.reshape({n, -1, 2});  // LOOKALIKE: tensor-reshape-non-contiguous -- affine_grid returns a contiguous grid
    inside_sum += pts.abs().le(1.0).all(2).to(torch::kFloat).mean(1).sum();

    res.predictions.narrow(0, offset, n).copy_(pred);  // EXPECT: tensor-copy-narrowing
    res.targets.narrow(0, offset, n).copy_(batch.target);  // LOOKALIKE: tensor-copy-narrowing -- MNIST targets are int64 like the buffer
    offset += n;
  }
  const double count = static_cast<double>(offset);
  res.loss = loss_sum.item<double>() / count;
  res.accuracy = static_cast<double>(correct) / count;
  res.mean_theta_dev = dev_sum.item<double>() / (6.0 * count);
  res.grid_coverage = inside_sum.item<double>() / count;
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  if (argc > 1) cfg.data_root = argv[1];
  torch::manual_seed(1);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  auto train_set = torch::data::datasets::MNIST(cfg.data_root)
                       .map(torch::data::transforms::Normalize<>(kMean, kStd))
                       .map(torch::data::transforms::Stack<>());
  auto test_raw = torch::data::datasets::MNIST(cfg.data_root, torch::data::datasets::MNIST::Mode::kTest);
  const size_t test_size = test_raw.size().value();
  auto test_set = test_raw.map(torch::data::transforms::Normalize<>(kMean, kStd))
                      .map(torch::data::transforms::Stack<>());

  auto train_loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(train_set), torch::data::DataLoaderOptions().batch_size(cfg.batch_size).workers(2));
  auto test_loader = torch::data::make_data_loader(
      std::move(test_set), torch::data::DataLoaderOptions().batch_size(cfg.test_batch_size));

  STNNet model(cfg);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum));

  TrainStats stats;
  torch::Tensor panel_batch;
  for (size_t epoch = 1; epoch <= cfg.epochs; ++epoch) {
    model->train();
    auto running = torch::zeros({}, device);
    int64_t batch_idx = 0;
    for (auto& batch : *train_loader) {
      if (!panel_batch.defined()) panel_batch = batch.data.narrow(0, 0, 8).clone();
      // FACT: a = torch.rand(1,28,28); b = torch.stack([a, a]); is_copy_of(b, a) and shares_storage(b.to('cpu'), b)
      auto data = batch.data.to(device);
      data.add_(torch::randn_like(data), cfg.noise_std);  // LOOKALIKE: tensor-alias-then-mutate -- the collated batch is fresh and never read again
      auto target = batch.target.to(device);

      optimizer.zero_grad();
      auto logits = model->forward(data);
      auto loss = F::cross_entropy(logits, target) + cfg.theta_reg * model->stn->last_reg;
      loss.backward();
      optimizer.step();
      // FACT: assert raises(lambda: torch.nn.Linear(320,50).weight.clamp_(-3.0, 3.0), "leaf Variable")
      model->classifier->fc1->weight.clamp_(-cfg.max_weight, cfg.max_weight);  // EXPECT: tensor-inplace-on-leaf

      running += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, accumulated on the device
      stats.step_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      if (batch_idx % cfg.log_interval == 0) {
        std::printf("epoch %zu [%5ld] loss %.4f\n", epoch, static_cast<long>(batch_idx),
                    loss.item<float>());  // LOOKALIKE: tensor-sync-in-loop -- only every log_interval steps
      }
      ++batch_idx;
    }
    stats.epoch_losses.push_back(running.item<double>() / static_cast<double>(batch_idx));

    auto res = evaluate(model, *test_loader, test_size, device, cfg);
    std::printf("epoch %zu  train %.4f  test loss %.4f  acc %.2f%%  |theta-I| %.4f  coverage %.3f\n",
                epoch, stats.epoch_losses.back(), res.loss, 100.0 * res.accuracy,
                res.mean_theta_dev, res.grid_coverage);
  }

  dump_stn_panel(model, panel_batch, device, cfg.panel_path);
  torch::save(model, "stn_mnist.pt");
  return 0;
}
