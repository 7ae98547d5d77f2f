// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-sync-in-loop %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-sync-in-loop %t.plugin -- --quiet -- %torch_pch
#include <torch/torch.h>
#include <cstdio>
#include <iostream>
#include <vector>

struct Net : torch::nn::Module {
  Net() { fc = register_module("fc", torch::nn::Linear(784, 10)); }
  torch::Tensor forward(torch::Tensor x) { return torch::log_softmax(fc->forward(x), 1); }
  torch::nn::Linear fc{nullptr};
};
struct Batch {
  torch::Tensor data, target;
};

double train_epoch(Net &model, torch::optim::Optimizer &opt, const std::vector<Batch> &batches) {
  torch::Device device(torch::kCUDA);
  model.to(device);
  double running_loss = 0.0;
  int64_t correct = 0;
  for (const auto &batch : batches) {
    auto data = batch.data.to(device), target = batch.target.to(device);
    opt.zero_grad();
    auto output = model.forward(data);
    auto loss = torch::nll_loss(output, target);
    loss.backward();
    opt.step();
    running_loss += loss.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:26: warning: 'item' of CUDA tensor 'loss' copies it to the host and waits for the GPU on every iteration, only to add the value up; accumulate on the device ('sum_t = sum_t + loss.detach()') and read the sum once after the loop [tensor-sync-in-loop]
    correct += output.argmax(1).eq(target).sum().item<int64_t>();
    // CHECK-MESSAGES: :[[@LINE-1]]:50: warning: 'item' of CUDA tensor 'output.argmax(1).eq(target).sum()'
  }
  return running_loss / batches.size() + correct;
}
// CHECK-FIXES: int64_t correct = 0;
// CHECK-FIXES: running_loss_t = running_loss_t + loss.detach();
// CHECK-FIXES: running_loss += running_loss_t.item<double>();
// CHECK-FIXES-NEXT: return running_loss / batches.size() + correct;

void log_gan(Net &d, const std::vector<torch::Tensor> &reals) {
  auto device = torch::Device(torch::kCUDA);
  int i = 0;
  for (const auto &r : reals) {
    auto real = r.to(device);
    auto d_loss = torch::binary_cross_entropy(torch::sigmoid(d.forward(real)),
                                              torch::ones({real.size(0), 10}, torch::TensorOptions().device(device)));
    std::cout << "[" << i++ << "] D: " << d_loss.item<float>() << std::endl;
    // CHECK-MESSAGES: :[[@LINE-1]]:50: warning: 'item' of CUDA tensor 'd_loss' {{.*}} only to log it
  }
}

double confidence(Net &model, const std::vector<torch::Tensor> &reqs) {
  torch::NoGradGuard no_grad;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  double total = 0;
  for (const auto &req : reqs) {
    auto probs = torch::softmax(model.forward(req.to(device)), 1);
    total += std::get<0>(probs.max(1)).mean().item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:47: warning: 'item' of 'std::get<0>(probs.max(1)).mean()' (on CUDA whenever cuda::is_available())
  }
  return total;
}

void printed(Net &model, const std::vector<torch::Tensor> &xs) {
  const torch::Device device(torch::kCUDA, 0);
  for (const auto &x : xs) {
    auto loss = model.forward(x.to(device)).mean();
    std::printf("loss %.4f\n", loss.item<float>());
    // CHECK-MESSAGES: :[[@LINE-1]]:37: warning: 'item' of CUDA tensor 'loss' {{.*}} only to log it
  }
}

// ---- not flagged ----------------------------------------------------------------

int train_until(Net &model, torch::optim::Optimizer &opt, const Batch &b, double tol) {
  torch::Device device(torch::kCUDA);
  auto data = b.data.to(device), target = b.target.to(device);
  int it = 0;
  for (; it < 1000; ++it) {
    opt.zero_grad();
    auto loss = torch::nll_loss(model.forward(data), target);
    loss.backward();
    opt.step();
    if (loss.item<double>() < tol) // control flow
      break;
  }
  return it;
}

double unknown_device(Net &model, const std::vector<Batch> &batches, torch::Device device) {
  double s = 0;
  for (const auto &b : batches)
    s += torch::nll_loss(model.forward(b.data.to(device)), b.target.to(device)).item<double>();
  // CHECK-MESSAGES: :[[@LINE-1]]:81: warning: 'item' of a tensor (on CUDA when its caller passes a CUDA device) copies it to the host
  return s;
}

double cpu_only(Net &model, const std::vector<Batch> &batches) {
  double s = 0;
  for (const auto &b : batches)
    s += torch::nll_loss(model.forward(b.data), b.target).item<double>(); // never moved
  return s;
}

void every_hundred(Net &model, const std::vector<Batch> &batches) {
  torch::Device device(torch::kCUDA);
  int step = 0;
  for (const auto &b : batches) {
    auto loss = torch::nll_loss(model.forward(b.data.to(device)), b.target.to(device));
    if (++step % 100 == 0)
      std::cout << loss.item<float>() << "\n"; // only every 100th step
  }
}

std::vector<int64_t> labels(Net &model, const std::vector<torch::Tensor> &reqs) {
  torch::Device device(torch::kCUDA);
  std::vector<int64_t> out;
  for (const auto &r : reqs)
    out.push_back(model.forward(r.to(device)).argmax(1).item<int64_t>()); // the answer per request
  return out;
}

std::vector<torch::Tensor> features(Net &model, const std::vector<torch::Tensor> &xs) {
  torch::Device device(torch::kCUDA);
  std::vector<torch::Tensor> out;
  for (const auto &x : xs)
    out.push_back(model.forward(x.to(device)).to(torch::kCPU)); // host data is the result
  return out;
}

// Device facts follow any number of values computed from one another (here
// five variables from the device to the item), and pair elements.
struct TwoHeads : torch::nn::Module {
  std::pair<torch::Tensor, torch::Tensor> forward(torch::Tensor x) { return {x, x}; }
};

double accuracy(torch::nn::Linear &model, const torch::Tensor &x, const torch::Tensor &y,
                const torch::Tensor &idx, TwoHeads &heads, int epochs) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto xs = x.to(device), ys = y.to(device), tidx = idx.to(device);
  double acc_sum = 0;
  for (int e = 0; e < epochs; ++e) {
    auto logits = model->forward(xs);
    auto correct = logits.argmax(1).eq(ys);
    auto acc = correct.index_select(0, tidx).to(torch::kFloat).mean();
    acc_sum += acc.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:20: warning: 'item' of 'acc' (on CUDA whenever cuda::is_available())
    auto out = heads.forward(xs);
    acc_sum += torch::sigmoid(out.first).mean().item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:49: warning: 'item' of 'torch::sigmoid(out.first).mean()' (on CUDA
  }
  return acc_sum;
}

// Once per epoch, beside the loop of steps: one wait per pass over the data.
// A loop over parameters beside a per-step sync does not make it per epoch.
void epochs(Net &model, torch::optim::Optimizer &opt, const std::vector<Batch> &batches, int n) {
  torch::Device device(torch::kCUDA);
  for (int e = 0; e < n; ++e) {
    auto smoothed = torch::zeros({}, device);
    for (const auto &b : batches) {
      auto loss = torch::nll_loss(model.forward(b.data.to(device)), b.target.to(device));
      loss.backward();
      opt.step();
      for (auto &p : model.parameters())
        p.grad().zero_();
      std::cout << loss.item<float>() << "\n";
      // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: 'item' of CUDA tensor 'loss' copies it to the host
      smoothed = 0.9 * smoothed + 0.1 * loss.detach();
    }
    std::cout << "epoch " << e << " " << smoothed.item<double>() << "\n";
  }
}

// A function of the file that runs a loop of steps (tiled inference) makes
// the caller's loop one pass per element: the sync waits once per image.
torch::Tensor upscaleTiled(Net &model, const torch::Tensor &img, int64_t tiles) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < tiles; ++t)
    outs.push_back(model.forward(img.narrow(0, t, 1)));
  return torch::cat(outs);
}
double perImageScore(Net &model, const std::vector<torch::Tensor> &images) {
  torch::Device device(torch::kCUDA);
  double total = 0;
  for (const auto &img : images)
    total += upscaleTiled(model, img.to(device), 4).mean().item<double>();
  return total;
}
// A training loop that makes steps itself is per step, whatever it calls.
double rolloutEachStep(Net &model, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs) {
  torch::Device device(torch::kCUDA);
  double total = 0;
  for (const auto &x : xs) {
    auto loss = model.forward(x.to(device)).mean();
    loss.backward();
    opt.step();
    total += upscaleTiled(model, x.to(device), 2).mean().item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:58: warning: 'item' of
  }
  return total;
}
// An evaluation forward beside the epoch's helper makes no step of the
// epoch loop itself: the log waits once per epoch (punet_upsampling).
double trainPass(Net &model, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs) {
  torch::Device device(torch::kCUDA);
  for (const auto &x : xs) {
    auto loss = model.forward(x.to(device)).mean();
    loss.backward();
    opt.step();
  }
  return 0.0;
}
void epochsWithProbe(Net &model, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs) {
  torch::Device device(torch::kCUDA);
  for (int epoch = 0; epoch < 3; ++epoch) {
    trainPass(model, opt, xs);
    torch::NoGradGuard no_grad;
    auto spread = model.forward(xs[0].to(device)).std();
    std::cout << "epoch " << epoch << " spread " << spread.item<double>() << "\n";
  }
}
// So does a solver whose loop reads a value to the host every pass (its
// convergence test): the caller's sync waits once per solve.
torch::Tensor solveToTolerance(const torch::Tensor &a, torch::Tensor x, double tol) {
  for (int64_t it = 0; it < 100; ++it) {
    auto r = a.matmul(x) - 1.0;
    if (r.abs().max().item<double>() < tol)
      break;
    x = x - 0.1 * r;
  }
  return x;
}
double perChunkResidual(const torch::Tensor &a, const std::vector<torch::Tensor> &starts) {
  torch::Device device(torch::kCUDA);
  double total = 0;
  for (const auto &x0 : starts)
    total += solveToTolerance(a, x0.to(device), 1e-6).norm().item<double>();
  return total;
}
// A helper whose loop only computes does not.
torch::Tensor iterate(const torch::Tensor &a, torch::Tensor x) {
  for (int64_t it = 0; it < 10; ++it)
    x = a.matmul(x).tanh();
  return x;
}
double perChunkIterate(const torch::Tensor &a, const std::vector<torch::Tensor> &starts) {
  torch::Device device(torch::kCUDA);
  double total = 0;
  for (const auto &x0 : starts)
    total += iterate(a, x0.to(device)).norm().item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:47: warning: 'item' of
  return total;
}
// A helper without a loop of steps does not.
torch::Tensor score(Net &model, const torch::Tensor &x) { return model.forward(x).mean(); }
double perBatchScore(Net &model, const std::vector<torch::Tensor> &batches) {
  torch::Device device(torch::kCUDA);
  double total = 0;
  for (const auto &b : batches)
    total += score(model, b.to(device)).item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:41: warning: 'item' of
  return total;
}

// A variable computed from itself in the loop (`x = a * x + b`) is on CUDA
// when its first value is and every value computed from it is: induction.
void denoise(torch::nn::Linear &net, int64_t steps) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  auto x = torch::randn({8, 16}, device);
  for (int64_t i = 0; i < steps; ++i) {
    auto eps = net->forward(x);
    auto x0 = (x - 0.1 * eps).clone();
    x0.clamp_(-1, 1);
    x = 0.9 * x0 + 0.1 * eps;
    std::cout << x0.abs().mean().item<float>() << "\n";
    // CHECK-MESSAGES: :[[@LINE-1]]:34: warning: 'item' of CUDA tensor 'x0.abs().mean()' copies it to the host
  }
}
// Not claimed: one value it is given moves it to the host.
void denoiseHost(torch::nn::Linear &net, int64_t steps) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({8, 16}, torch::kCUDA);
  for (int64_t i = 0; i < steps; ++i) {
    x = net->forward(x).cpu();
    std::cout << x.abs().mean().item<float>() << "\n";
  }
}

// A factory given `x.options()` is on x's device: the cost is a CUDA tensor.
class PlanOptimiser {
public:
  PlanOptimiser() : device_(torch::kCUDA) {}
  double optimise(const torch::Tensor &state, int64_t iters) {
    auto s0 = state.to(device_);
    double mean_cost = 0;
    for (int64_t it = 0; it < iters; ++it) {
      auto cost = torch::zeros({}, s0.options());
      cost = cost + s0.pow(2).sum();
      mean_cost += cost.item<double>();
      // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: 'item' of CUDA tensor 'cost' copies it to the host
    }
    return mean_cost;
  }
  torch::Device device_;
};

// `torch::Tensor loss;` then assigned in both branches: its values decide
// its device, not the undefined tensor it starts as.
void branchLoss(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs, bool nll) {
  torch::Device device(torch::kCUDA);
  net.to(device);
  double total = 0;
  for (const auto &x : xs) {
    auto in = x.to(device);
    torch::Tensor loss;
    if (nll)
      loss = -net.forward(in).mean();
    else
      loss = net.forward(in).exp().mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    total += loss.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'item' of CUDA tensor 'loss' copies it to the host
  }
  std::cout << total << "\n";
}

// One branch leaves it on the host: not claimed.
void branchLossHost(Net &net, const std::vector<torch::Tensor> &xs, bool gpu) {
  torch::Device device(torch::kCUDA);
  double total = 0;
  for (const auto &x : xs) {
    torch::Tensor loss;
    if (gpu)
      loss = net.forward(x.to(device)).mean();
    else
      loss = net.forward(x).mean();
    total += loss.item<double>();
  }
  std::cout << total << "\n";
}

// The batch is a local aggregate whose fields are moved to the device in its
// initialiser: the model's output, and the loss, are on it.
struct LmBatch {
  torch::Tensor tokens, targets;
};

void trainWindows(torch::nn::Linear &model, const torch::Tensor &stream, int64_t steps) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  double nll = 0;
  for (int64_t s = 0; s < steps; ++s) {
    LmBatch batch{stream.narrow(0, s, 8).to(device), stream.narrow(0, s + 1, 8).to(device)};
    auto loss = torch::mse_loss(model->forward(batch.tokens), batch.targets);
    loss.backward();
    nll += loss.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: 'item' of 'loss' (on CUDA whenever cuda::is_available()) copies it to the host and waits for the GPU on every iteration
  }
  std::cout << nll << "\n";
}

// Fields the batch keeps on the host: no device, no sync.
void trainHostBatch(torch::nn::Linear &model, const torch::Tensor &stream, int64_t steps) {
  double nll = 0;
  for (int64_t s = 0; s < steps; ++s) {
    LmBatch batch{stream.narrow(0, s, 8), stream.narrow(0, s + 1, 8)};
    auto loss = torch::mse_loss(model->forward(batch.tokens), batch.targets);
    nll += loss.item<double>();
  }
  std::cout << nll << "\n";
}

// A batch struct copied, its fields moved by the statements right after the
// copy, and the struct given to the model: a model fed CUDA fields runs on CUDA.
struct PillarNet : torch::nn::Module {
  PillarNet() { fc = register_module("fc", torch::nn::Linear(9, 1)); }
  torch::Tensor forward(const Batch &b) { return fc->forward(b.data) - b.target; }
  torch::nn::Linear fc{nullptr};
};
double struct_batches(PillarNet &model, const std::vector<Batch> &batches) {
  torch::Device device(torch::kCUDA);
  double running = 0;
  for (const auto &b : batches) {
    Batch in = b;
    in.data = b.data.to(device), in.target = b.target.to(device);
    auto loss = model.forward(in).pow(2).mean();
    loss.backward();
    running += loss.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'item' of CUDA tensor 'loss'
  }
  return running;
}
double struct_read_first(PillarNet &model, const std::vector<Batch> &batches) {
  torch::Device device(torch::kCUDA);
  double running = 0;
  for (const auto &b : batches) {
    Batch in = b;
    auto n = in.data.size(0); // the loader's tensor is read before the move: not a dead value
    in.data = b.data.to(device);
    auto loss = model.forward(in).pow(2).sum() / n;
    loss.backward();
    running += loss.item<double>(); // in.target stays where the loader put it: unknown
  }
  return running;
}

// A local vector of tensors has the device its elements share (braced
// elements, push_back): patches of a CUDA volume are CUDA, and so is what a
// list op (`cat`, `stack`) makes of them. One CPU element, or elements not
// followed (`v(n, t)`), leave it unknown.
double slidingWindow(torch::nn::Linear &net, const torch::Tensor &image, int64_t n) {
  torch::Device device(torch::kCUDA);
  auto vol = image.to(device);
  double spread = 0;
  for (int64_t b = 0; b < n; ++b) {
    std::vector<torch::Tensor> patches;
    for (int64_t i = 0; i < 3; ++i)
      patches.push_back(vol.narrow(0, b + i, 2));
    auto batch = torch::cat(patches, 0);
    std::vector<torch::Tensor> views{batch};
    views.push_back(batch.flip({1}));
    auto out = net->forward(torch::cat(views, 0));
    spread += torch::stack({out, out}).var(0).mean().item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:54: warning: 'item' of CUDA tensor 'torch::stack({out, out}).var(0).mean()'
    std::vector<torch::Tensor> mixed{batch};
    mixed.push_back(image);
    spread += torch::cat(mixed, 0).sum().item<double>(); // image stays on the host: unknown
    std::vector<torch::Tensor> filled(2, image);
    filled.push_back(batch);
    spread += torch::cat(filled, 0).sum().item<double>(); // copies of image: not followed
  }
  return spread;
}

// `pos = pos.to(device)`: the uses after the move see the device value, the
// uses before it the host one (Note [reaching assignment]).
double reassignedBatch(torch::nn::Linear fc, const torch::Tensor &triples, int64_t n) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  fc->to(device);
  double running = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto pos = triples.index_select(0, torch::arange(4));
    running += pos.sum().item<double>(); // still the host batch
    pos = pos.to(device);
    running += fc(pos).sum().item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:30: warning: 'item' of 'fc(pos).sum()' (on CUDA whenever cuda::is_available())
  }
  return running;
}
// An assignment in a branch beside the use, or later in the loop, may reach it.
double branchMove(const torch::Tensor &x, bool gpu, int64_t n) {
  double running = 0;
  auto h = x.index_select(0, torch::arange(4));
  for (int64_t i = 0; i < n; ++i) {
    running += h.sum().item<double>(); // the first iteration reads the host value
    h = h.cuda();
  }
  auto g = x.index_select(0, torch::arange(4));
  if (gpu)
    g = g.cuda();
  for (int64_t i = 0; i < n; ++i)
    running += g.sum().item<double>();
  return running;
}

// A device parameter is what every call passes: here the machine's device,
// so the loss is on CUDA whenever one is available. A call given a device
// (`sampleOn(data, device)`) computes there.
torch::Tensor sampleOn(const torch::Tensor &data, torch::Device device) {
  return data.index_select(0, torch::randint(data.size(0), {8})).to(device);
}
double fitOn(Net &model, torch::optim::Optimizer &opt, const torch::Tensor &data,
             torch::Device device) {
  double running = 0;
  for (int step = 0; step < 100; ++step) {
    auto loss = model.forward(sampleOn(data, device)).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    running += loss.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'item' of 'loss' (on CUDA whenever cuda::is_available()) copies it to the host
  }
  return running;
}
// Callers that pass different devices leave the parameter unknown.
double fitAnywhere(Net &model, torch::optim::Optimizer &opt, const torch::Tensor &data,
                   torch::Device device) {
  double running = 0;
  for (int step = 0; step < 100; ++step) {
    auto loss = model.forward(data.to(device)).mean();
    loss.backward();
    opt.step();
    running += loss.item<double>();
  }
  return running;
}
void runBoth(Net &model, torch::optim::Optimizer &opt, const torch::Tensor &data) {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  fitOn(model, opt, data, device);
  fitAnywhere(model, opt, data, device);
  fitAnywhere(model, opt, data, torch::kCPU);
}

// A vector of numbers the function only fills and prints from is a log; one
// whose numbers go anywhere else (a tensor, a decision) holds data.
void lossCurves(torch::nn::Linear &net, int64_t steps) {
  torch::Device device(torch::kCUDA);
  net->to(device);
  std::vector<double> curve, kept, counted;
  std::vector<float> norms;
  std::vector<torch::Tensor> snapshots;
  for (int64_t i = 0; i < steps; ++i) {
    auto loss = net->forward(torch::randn({4, 8}, torch::TensorOptions(device))).pow(2).mean();
    loss.backward();
    curve.push_back(loss.item<double>());
    // CHECK-MESSAGES: :[[@LINE-1]]:26: warning: 'item' of CUDA tensor 'loss' copies it to the host and waits for the GPU on every iteration, only to log it; log every N steps, or accumulate on the device and read once after the loop [tensor-sync-in-loop]
    kept.push_back(loss.item<double>());
    norms.push_back(net->weight.grad().norm().item<float>());
    counted.push_back(loss.item<double>()); // only its size is printed: data
    snapshots.push_back(net->weight.detach().cpu());
  }
  std::printf("%zu values, %zu snapshots\n", counted.size(), snapshots.size());
  std::printf("final %.4f over %zu steps\n", curve.empty() ? 0.0 : curve.back(), curve.size());
  std::cout << "first " << kept.front() << "\n"; // printed, but also made a tensor below
  auto trend = torch::tensor(kept);
  if (norms.back() > 10.0f)
    std::printf("exploding\n");
}

// A condition with the same value on every iteration runs its branch on all
// of them or none: a sum under it is still read every step; a log under a
// verbosity flag is opted into. The tensors come from the caller, on CUDA.
double scoreBatches(torch::nn::Linear &net, const torch::Tensor &xs, const torch::Tensor &ys,
                    bool verbose) {
  double sse = 0.0;
  for (int64_t i = 0; i < xs.size(0); i += 8) {
    auto err = net->forward(xs.narrow(0, i, 8)).sub(ys.narrow(0, i, 8)).pow(2).sum();
    if (ys.defined())
      sse += err.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:18: warning: 'item' of CUDA tensor 'err' copies it to the host and waits for the GPU on every iteration, only to add the value up
    if (verbose)
      std::cout << err.item<double>() << "\n";
    if (i % 64 == 0)
      sse += err.item<double>(); // every 8th batch
  }
  return sse;
}
void scoreOnDevice(torch::nn::Linear &net) {
  auto xs = torch::randn({64, 8}).cuda(), ys = torch::randn({64, 8}).cuda();
  scoreBatches(net, xs, ys, false);
}

// A device parameter no call in view passes: the caller's choice (Note
// [caller's device]), CUDA in the runs such code is written for.
float chosenDeviceLoss(const std::vector<torch::Tensor> &xs, torch::Device device) {
  float total = 0;
  for (const auto &x : xs) {
    auto loss = x.to(device).pow(2).mean();
    total += loss.item<float>();
    // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'item' of 'loss' (on CUDA when its caller passes a CUDA device) copies it to the host
  }
  return total;
}

// A module of the user's class that every move in the file sends to CUDA
// computes there whatever its input (a host input would throw first): here
// the batch comes out of a lambda run on the spot. A class moved to the host
// as well as to CUDA (Encoder below) is not decided.
struct DenoiserImpl : torch::nn::Module {
  torch::nn::Conv2d conv{nullptr};
  DenoiserImpl() { conv = register_module("conv", torch::nn::Conv2d(3, 3, 3)); }
  torch::Tensor forward(const torch::Tensor &x) { return conv(x); }
};
TORCH_MODULE(Denoiser);
struct EncoderImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  EncoderImpl() { fc = register_module("fc", torch::nn::Linear(8, 8)); }
  torch::Tensor forward(const torch::Tensor &x) { return fc(x); }
};
TORCH_MODULE(Encoder);
struct NoisyPair {
  torch::Tensor noisy, clean;
};
NoisyPair degrade(const torch::Tensor &x);
double trainDenoiser(const torch::Tensor &data, Encoder &enc, const torch::Tensor &feats) {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Denoiser net;
  net->to(device);
  enc->to(device);
  double running = 0, enc_total = 0;
  for (int step = 0; step < 100; ++step) {
    auto pair = [&] {
      torch::NoGradGuard no_grad;
      return degrade(data.to(device));
    }();
    auto loss = torch::l1_loss(net(pair.noisy), pair.clean);
    running += loss.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'item' of 'loss' (on CUDA whenever cuda::is_available()) copies it to the host
    enc_total += enc(feats).sum().item<double>();
  }
  enc->to(torch::kCPU);
  return running + enc_total;
}
