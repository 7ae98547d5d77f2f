// RUN: %check_tensor_tidy --compile-fixed %s tensor-sync-in-loop %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-sync-in-loop %t.plugin
#include "tt/tt.h"

#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

using tt::Tensor;

struct Model {
  Tensor w = tt::ones({4});
  Tensor forward(const Tensor &x) { return x * w; }
};
std::pair<Tensor, Tensor> twoHeads(const Tensor &x) { return {x.sum(), x.mean()}; }
void consume(const Tensor &t);

// ---- flagged ------------------------------------------------------------------

double accumulated(const std::vector<Tensor> &xs) {
  tt::Device device(tt::kCUDA);
  double running = 0;
  for (const auto &x : xs) {
    auto loss = (x.to(device) * 2).sum();
    running += loss.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'item' of CUDA tensor 'loss' copies it to the host and waits for the GPU on every iteration, only to add the value up; accumulate on the device ('sum_t = sum_t + loss.detach()') and read the sum once after the loop [tensor-sync-in-loop]
  }
  return running;
}
// CHECK-FIXES: double running = 0;
// CHECK-FIXES-NEXT: tt::Tensor running_t = tt::zeros({}, tt::kDouble);
// CHECK-FIXES-NEXT: for (const auto &x : xs) {
// CHECK-FIXES: running_t = running_t + loss.detach();
// CHECK-FIXES: running += running_t.item<double>();
// CHECK-FIXES-NEXT: return running;

float cudaMethod(const std::vector<Tensor> &xs) {
  float total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor loss = xs[i].cuda().mean();
    total += loss.item<float>();
    // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'item' of CUDA tensor 'loss' copies it to the host
  }
  return total;
}
// CHECK-FIXES: tt::Tensor total_t = tt::zeros({}, tt::kFloat);
// CHECK-FIXES: total_t = total_t + loss.detach();
// CHECK-FIXES: total += total_t.item<float>();

double literalDevice(const std::vector<Tensor> &xs) {
  double s = 0;
  for (const auto &x : xs)
    s += x.to(tt::kCUDA).sum().item<double>(); // no fix-it: the loop body is not a block
  // CHECK-MESSAGES: :[[@LINE-1]]:32: warning: 'item' of CUDA tensor 'x.to(tt::kCUDA).sum()' copies
  return s;
}

void logged(const std::vector<Tensor> &xs) {
  tt::Device device(tt::kCUDA);
  for (const auto &x : xs) {
    auto loss = x.to(device).sum();
    std::cout << "loss " << loss.item<float>() << "\n";
    // CHECK-MESSAGES: :[[@LINE-1]]:34: warning: 'item' of CUDA tensor 'loss' copies it to the host and waits for the GPU on every iteration, only to log it; log every N steps, or accumulate on the device and read once after the loop [tensor-sync-in-loop]
  }
}

void printed(const std::vector<Tensor> &xs) {
  tt::Device device(tt::kCUDA);
  int step = 0;
  for (const auto &x : xs) {
    auto loss = x.to(device).sum();
    std::printf("%d %f\n", step++, loss.item<float>());
    // CHECK-MESSAGES: :[[@LINE-1]]:41: warning: 'item' of CUDA tensor 'loss' {{.*}} only to log it
  }
}

double throughVariable(const std::vector<Tensor> &xs) {
  tt::Device device(tt::kCUDA);
  double sum = 0;
  for (const auto &x : xs) {
    auto loss = x.to(device).sum();
    float l = loss.item<float>();
    // CHECK-MESSAGES: :[[@LINE-1]]:20: warning: 'item' of CUDA tensor 'loss' {{.*}} only to add the value up
    sum += l;
    std::cout << l << "\n";
  }
  return sum;
}

double weighted(const std::vector<Tensor> &xs, int n) {
  tt::Device device(tt::kCUDA);
  double sum = 0;
  for (const auto &x : xs) {
    auto loss = x.to(device).sum();
    sum += loss.item<double>() * n; // no fix-it: the value is combined first
    // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: 'item' of CUDA tensor 'loss'
  }
  return sum;
}

int64_t counted(const std::vector<Tensor> &xs, const Tensor &labels) {
  tt::Device device(tt::kCUDA);
  int64_t correct = 0;
  auto target = labels.to(device);
  for (const auto &x : xs) {
    auto pred = x.to(device).argmax(0);
    correct += pred.eq(target).sum().item<int64_t>();
    // CHECK-MESSAGES: :[[@LINE-1]]:38: warning: 'item' of CUDA tensor 'pred.eq(target).sum()'
  }
  return correct;
}

double whenAvailable(const std::vector<Tensor> &xs) {
  tt::Device device = tt::cuda::is_available() ? tt::kCUDA : tt::kCPU;
  double s = 0;
  for (const auto &x : xs) {
    auto loss = x.to(device).sum();
    s += loss.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:15: warning: 'item' of 'loss' (on CUDA whenever cuda::is_available()) copies it to the host
  }
  return s;
}

void cpuLogged(const std::vector<Tensor> &xs) {
  for (const auto &x : xs) {
    auto h = x.cuda().relu();
    std::cout << h.cpu() << "\n";
    // CHECK-MESSAGES: :[[@LINE-1]]:20: warning: 'cpu' of CUDA tensor 'h' {{.*}} only to log it
  }
}

double toCpuItem(const std::vector<Tensor> &xs) {
  double s = 0;
  for (const auto &x : xs) {
    auto loss = x.cuda().sum();
    s += loss.to(tt::kCPU).item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:15: warning: 'to' of CUDA tensor 'loss'
  }
  return s;
}

double modelCall(Model &m, const std::vector<Tensor> &xs) {
  double s = 0;
  for (const auto &x : xs) {
    auto out = m.forward(x.cuda());
    s += out.sum().item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:20: warning: 'item' of CUDA tensor 'out.sum()'
  }
  return s;
}

double whileLoop(const std::vector<Tensor> &xs) {
  tt::Device device(tt::kCUDA);
  double s = 0;
  size_t i = 0;
  while (i < xs.size()) {
    auto loss = xs[i++].to(device).sum();
    s += loss.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:15: warning: 'item' of CUDA tensor 'loss'
  }
  return s;
}
// CHECK-FIXES: auto loss = xs[i++].to(device).sum();
// CHECK-FIXES-NEXT: s_t = s_t + loss.detach();

double structured(const std::vector<Tensor> &xs) {
  double s = 0;
  for (const auto &x : xs) {
    auto [total, mean] = twoHeads(x.cuda());
    s += mean.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:15: warning: 'item' of CUDA tensor 'mean'
  }
  return s;
}

struct Meter {
  double total = 0;
  void run(const std::vector<Tensor> &xs) {
    for (const auto &x : xs)
      total += x.cuda().sum().item<double>(); // a member: no fix-it
    // CHECK-MESSAGES: :[[@LINE-1]]:31: warning: 'item' of CUDA tensor 'x.cuda().sum()'
  }
};

double nested(const std::vector<std::vector<Tensor>> &epochs) {
  tt::Device device(tt::kCUDA);
  double last = 0;
  for (const auto &batches : epochs) {
    double epoch_loss = 0;
    for (const auto &b : batches) {
      auto loss = b.to(device).sum();
      epoch_loss += loss.item<double>();
      // CHECK-MESSAGES: :[[@LINE-1]]:26: warning: 'item' of CUDA tensor 'loss'
    }
    last = epoch_loss;
  }
  return last;
}
// CHECK-FIXES: double epoch_loss = 0;
// CHECK-FIXES-NEXT: tt::Tensor epoch_loss_t = tt::zeros({}, tt::kDouble);
// CHECK-FIXES: epoch_loss += epoch_loss_t.item<double>();
// CHECK-FIXES-NEXT: last = epoch_loss;

double subtracted(const std::vector<Tensor> &xs) {
  tt::Device device(tt::kCUDA);
  double s = 0;
  for (const auto &x : xs) {
    auto penalty = tt::randn({4}, device).mul(x.to(device)).sum();
    s -= penalty.item<double>();
    // CHECK-MESSAGES: :[[@LINE-1]]:18: warning: 'item' of CUDA tensor 'penalty'
  }
  return s;
}

// A closure the loop writes and runs (an LBFGS-style optimizer calls it at
// least once per step): its syncs are in the loop. No fix-it: a hoisted
// accumulator may not be among the closure's captures.
inline Tensor stepWith(const std::function<Tensor()> &closure) { return closure(); }
double inClosure(const Tensor &x, int n) {
  tt::Device device(tt::kCUDA);
  Tensor w = tt::ones({4}, tt::TensorOptions().device(device));
  double total = 0;
  for (int i = 0; i < n; ++i) {
    auto closure = [&] {
      auto loss = (x.to(device) * w).sum();
      total += loss.item<double>();
      // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'item' of CUDA tensor 'loss' copies it to the host and waits for the GPU on every iteration, only to add the value up; accumulate on the device ('sum_t = sum_t + loss.detach()') and read the sum once after the loop [tensor-sync-in-loop]
      // CHECK-FIXES: total += loss.item<double>();
      return loss;
    };
    stepWith(closure);
  }
  for (int i = 0; i < n; ++i)
    stepWith([&] {
      auto loss = (x.to(device) * w).sum();
      std::cout << loss.item<double>() << "\n";
      // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: 'item' of CUDA tensor 'loss' copies it to the host and waits for the GPU on every iteration, only to log it
      return loss;
    });
  return total;
}

double insideLambda(const std::vector<Tensor> &xs) {
  double s = 0;
  for (const auto &x : xs) {
    auto add = [&] { s += x.cuda().sum().item<double>(); }; // called below, every iteration
    // CHECK-MESSAGES: :[[@LINE-1]]:42: warning: 'item' of CUDA tensor 'x.cuda().sum()' copies it to the host and waits for the GPU on every iteration, only to add the value up
    add();
  }
  return s;
}

// ---- not flagged ----------------------------------------------------------------

double closureNegatives(const Tensor &x, int n, std::vector<std::function<double()>> &later) {
  tt::Device device(tt::kCUDA);
  Tensor w = tt::ones({4}, tt::TensorOptions().device(device));
  double total = 0;
  for (int i = 0; i < n; ++i)
    stepWith([&] {
      auto loss = (x.to(device) * w).sum();
      if (i % 10 == 0)
        std::cout << loss.item<double>() << "\n"; // every tenth step only
      return loss;
    });
  for (int i = 0; i < n; ++i)
    later.push_back([&] { return (x.to(device) * w).sum().item<double>(); }); // kept, run later
  auto report = [&] { total += (x.to(device) * w).sum().item<double>(); };   // written before the loop
  for (int i = 0; i < n; ++i)
    report();
  return total;
}

void everyHundred(const std::vector<Tensor> &xs) {
  tt::Device device(tt::kCUDA);
  int step = 0;
  for (const auto &x : xs) {
    auto loss = x.to(device).sum();
    if (++step % 100 == 0)
      std::cout << loss.item<float>() << "\n"; // only on some iterations
  }
}

int earlyStop(const std::vector<Tensor> &xs, float tol) {
  tt::Device device(tt::kCUDA);
  int i = 0;
  for (const auto &x : xs) {
    auto loss = x.to(device).sum();
    if (loss.item<float>() < tol) // the value decides control flow
      break;
    ++i;
  }
  return i;
}

std::vector<float> kept(const std::vector<Tensor> &xs) {
  tt::Device device(tt::kCUDA);
  std::vector<float> out;
  for (const auto &x : xs)
    out.push_back(x.to(device).sum().item<float>()); // data the caller gets
  return out;
}

double deviceParameter(const std::vector<Tensor> &xs, tt::Device device) {
  double s = 0;
  for (const auto &x : xs)
    s += x.to(device).sum().item<double>(); // the caller's device (Note [caller's device])
  // CHECK-MESSAGES: :[[@LINE-1]]:29: warning: 'item' of 'x.to(device).sum()' (on CUDA when its caller passes a CUDA device) copies it to the host
  return s;
}

double cpuTensors(const std::vector<Tensor> &xs) {
  double s = 0;
  for (const auto &x : xs)
    s += x.sum().item<double>(); // inputs never moved: CPU as far as we know
  return s;
}

double cpuDevice(const std::vector<Tensor> &xs) {
  tt::Device device(tt::kCPU);
  double s = 0;
  for (const auto &x : xs)
    s += x.to(device).sum().item<double>(); // CPU: nothing to wait for
  return s;
}

void hostData(const std::vector<Tensor> &xs) {
  for (const auto &x : xs) {
    auto h = x.cuda().relu().cpu(); // the host tensor is used as data
    consume(h);
  }
}

double afterLoop(const std::vector<Tensor> &xs) {
  Tensor acc = tt::zeros({}).cuda();
  for (const auto &x : xs)
    acc = acc + x.cuda().sum();
  return acc.item<double>(); // once, after the loop
}

double ternary(const std::vector<Tensor> &xs, bool use) {
  double s = 0;
  for (const auto &x : xs)
    s += use ? x.cuda().sum().item<double>() : 0.0; // only on some iterations
  return s;
}

double shortCircuit(const std::vector<Tensor> &xs, bool check) {
  double s = 0;
  for (const auto &x : xs)
    if (check && x.cuda().sum().item<double>() > 0) // control flow
      s += 1;
  return s;
}

double returnedInLoop(const std::vector<Tensor> &xs) {
  for (const auto &x : xs) {
    auto loss = x.cuda().sum();
    return loss.item<double>(); // the result, not a log
  }
  return 0;
}

double reassignedDevice(const std::vector<Tensor> &xs, tt::Device other) {
  tt::Device device(tt::kCUDA);
  device = other; // now CUDA or the caller's device: the weaker
  double s = 0;
  for (const auto &x : xs)
    s += x.to(device).sum().item<double>();
  // CHECK-MESSAGES: :[[@LINE-1]]:29: warning: 'item' of 'x.to(device).sum()' (on CUDA when its caller passes a CUDA device) copies it to the host
  return s;
}

double bestSoFar(const std::vector<Tensor> &xs) {
  double best = 1e9;
  for (const auto &x : xs) {
    float v = x.cuda().sum().item<float>(); // compared: decides the best
    if (v < best)
      best = v;
  }
  return best;
}

void histogram(const std::vector<Tensor> &xs, std::vector<int> &hist) {
  for (const auto &x : xs)
    hist[x.cuda().argmax(0).item<int64_t>()]++; // an index
}

double stringDevice(const std::vector<Tensor> &xs, const std::string &name) {
  double s = 0;
  for (const auto &x : xs)
    s += x.to(name == "gpu" ? tt::kCUDA : tt::kCPU).sum().item<double>(); // chosen at run time
  return s;
}

// A tensor from a call through a function pointer (no callee to look at):
// its device is unknown, and the analysis does not crash on it.
float throughPointer(tt::Tensor (*step)(int), int n) {
  float total = 0;
  for (int i = 0; i < n; ++i) {
    tt::Tensor r = step(i);
    total += r.item<float>();
  }
  return total;
}
