// RUN: %check_tensor_tidy --compile-fixed %s tensor-graph-kept-across-iterations %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-graph-kept-across-iterations %t.plugin
#include "tt/tt.h"

#include <map>
#include <vector>

using tt::Tensor;

Tensor batch(int i) { return tt::full({4, 8}, static_cast<double>(i)); }
void log_tensor(const Tensor &t); // code we cannot see: may differentiate it

// ---- flagged ------------------------------------------------------------------

float sumOfLosses(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor total = tt::zeros({});
  for (int i = 0; i < steps; ++i) {
    Tensor loss = batch(i).matmul(w).pow(2).mean();
    total += loss;
    // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'loss' requires grad and is accumulated into 'total', which outlives the loop iteration: every iteration's autograd graph (its nodes and the tensors they saved for backward) stays alive as long as 'total' does, and nothing differentiates it; keep 'loss.detach()', or '.item<double>()' to keep a number [tensor-graph-kept-across-iterations]
    // CHECK-FIXES: total += loss.detach();
  }
  return total.item<float>() / steps;
}

float minusEquals(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor drift = tt::zeros({});
  for (int i = 0; i < steps; ++i) {
    drift -= batch(i).matmul(w).mean();
    // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'batch(i).matmul(w).mean()' requires grad and is accumulated into 'drift'
    // CHECK-FIXES: drift -= batch(i).matmul(w).mean().detach();
  }
  return drift.item<float>();
}

float selfSum(int steps) {
  Tensor w = tt::ones({8, 2}).requires_grad_();
  Tensor total = tt::zeros({});
  for (int i = 0; i < steps; ++i) {
    Tensor out = batch(i).matmul(w);
    total = total + out.sum();
    // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'out.sum()' requires grad and is accumulated into 'total'
    // CHECK-FIXES: total = total + out.sum().detach();
  }
  return total.item<float>();
}

float runningAverage(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor avg = tt::zeros({});
  for (int i = 0; i < steps; ++i) {
    Tensor loss = batch(i).matmul(w).abs().mean();
    avg = 0.9 * avg + 0.1 * loss;
    // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: 'loss' requires grad and is accumulated into 'avg'
    // CHECK-FIXES: avg = 0.9 * avg + 0.1 * loss.detach();
  }
  return avg.item<float>();
}

float addUnderscore(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor acc = tt::zeros({2});
  for (int i = 0; i < steps; ++i) {
    acc.add_(batch(i).matmul(w).sum(0));
    // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: 'batch(i).matmul(w).sum(0)' requires grad and is accumulated into 'acc'
    // CHECK-FIXES: acc.add_(batch(i).matmul(w).sum(0).detach());
  }
  return acc.sum().item<float>();
}

size_t pushBack(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  std::vector<Tensor> outs;
  for (int i = 0; i < steps; ++i) {
    Tensor out = batch(i).matmul(w).relu();
    outs.push_back(out);
    // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: 'out' requires grad and is stored in 'outs', which outlives the loop iteration
    // CHECK-FIXES: outs.push_back(out.detach());
  }
  return outs.size();
}

float emplaceBack(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  std::vector<Tensor> history;
  for (int i = 0; i < steps; ++i)
    history.emplace_back(batch(i).matmul(w) * 2);
  // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'batch(i).matmul(w) * 2' requires grad and is stored in 'history'
  // CHECK-FIXES: history.emplace_back((batch(i).matmul(w) * 2).detach());
  return history.back().sum().item<float>();
}

float keyedByStep(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  std::map<int, Tensor> by_step;
  for (int i = 0; i < steps; ++i) {
    Tensor out = batch(i).matmul(w);
    by_step[i] = out;
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'out' requires grad and is stored under a new key in 'by_step'
    // CHECK-FIXES: by_step[i] = out.detach();
  }
  return by_step[0].sum().item<float>();
}

float nestedLoops(int epochs, int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  float last = 0;
  for (int e = 0; e < epochs; ++e) {
    Tensor epoch_loss = tt::zeros({});
    for (int i = 0; i < steps; ++i) {
      Tensor loss = batch(i).matmul(w).mean();
      loss.backward();
      epoch_loss += loss;
      // CHECK-MESSAGES: :[[@LINE-1]]:18: warning: 'loss' requires grad and is accumulated into 'epoch_loss'
      // CHECK-FIXES: epoch_loss += loss.detach();
    }
    last = epoch_loss.item<float>();
  }
  return last;
}

struct Tracker {
  std::vector<Tensor> seen_;
  Tensor w_ = tt::randn({8, 2}, tt::requires_grad());

  void run(int steps) {
    Tensor w = w_.mul(1.0);
    for (int i = 0; i < steps; ++i) {
      Tensor out = batch(i).matmul(tt::randn({8, 2}, tt::requires_grad()));
      seen_.push_back(out);
      // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'out' requires grad and is stored in 'seen_'
      // CHECK-FIXES: seen_.push_back(out.detach());
    }
  }
  float mean() const { return seen_.front().mean().item<float>(); }
};

float whileLoop(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor total = tt::zeros({});
  int i = 0;
  while (i < steps) {
    Tensor loss = batch(i++).matmul(w).sum();
    total += loss;
    // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'loss' requires grad and is accumulated into 'total'
  }
  return total.item<float>();
}

// ---- not flagged --------------------------------------------------------------

float itemSum(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  double total = 0;
  for (int i = 0; i < steps; ++i)
    total += batch(i).matmul(w).mean().item<double>(); // a number: no graph
  return static_cast<float>(total);
}

float detached(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor total = tt::zeros({});
  std::vector<Tensor> outs;
  for (int i = 0; i < steps; ++i) {
    Tensor loss = batch(i).matmul(w).mean();
    total += loss.detach();
    outs.push_back(loss.detach());
  }
  return total.item<float>() + outs.size();
}

float underNoGrad(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  tt::NoGradGuard no_grad;
  Tensor total = tt::zeros({});
  for (int i = 0; i < steps; ++i)
    total += batch(i).matmul(w).mean(); // grad mode is off: no graph is recorded
  return total.item<float>();
}

float underAutoGradModeFalse(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  std::vector<Tensor> outs;
  for (int i = 0; i < steps; ++i) {
    tt::AutoGradMode off(false);
    outs.push_back(batch(i).matmul(w));
  }
  return outs.size();
}

void gradientAccumulation(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor total = tt::zeros({});
  for (int i = 0; i < steps; ++i)
    total = total + batch(i).matmul(w).mean(); // differentiated after the loop
  total.backward();
}

void stackedThenBackward(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  std::vector<Tensor> log_probs;
  for (int i = 0; i < steps; ++i)
    log_probs.push_back(batch(i).matmul(w).sigmoid().log().select(1, 0).sum());
  auto loss = tt::stack(log_probs).mean().neg(); // REINFORCE: the graph is needed
  loss.backward();
}

float overwritten(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor last;
  for (int i = 0; i < steps; ++i)
    last = batch(i).matmul(w).mean(); // one graph at a time
  return last.item<float>();
}

float declaredInLoop(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  float s = 0;
  for (int i = 0; i < steps; ++i) {
    Tensor total = tt::zeros({});
    std::vector<Tensor> outs;
    total += batch(i).matmul(w).mean(); // dies with the iteration
    outs.push_back(total);
    s += total.item<float>();
  }
  return s;
}

float noGrad(int steps) {
  Tensor w = tt::randn({8, 2}); // does not require grad
  Tensor total = tt::zeros({});
  std::vector<Tensor> outs;
  for (int i = 0; i < steps; ++i) {
    total += batch(i).matmul(w).mean();
    outs.push_back(batch(i));
  }
  return total.item<float>() + outs.size();
}

float unknownParameter(const Tensor &x, int steps) {
  Tensor total = tt::zeros({});
  for (int i = 0; i < steps; ++i)
    total += x.mul(i).mean(); // whether x requires grad is the caller's business
  return total.item<float>();
}

std::vector<Tensor> returned(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  std::vector<Tensor> outs;
  for (int i = 0; i < steps; ++i)
    outs.push_back(batch(i).matmul(w)); // the caller may differentiate them
  return outs;
}

void handedToUnknownCode(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor total = tt::zeros({});
  for (int i = 0; i < steps; ++i)
    total += batch(i).matmul(w).mean();
  log_tensor(total); // may call backward()
}

void intoCallersVector(std::vector<Tensor> &out, int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  for (int i = 0; i < steps; ++i)
    out.push_back(batch(i).matmul(w)); // the caller's state: unknown use
}

float sameKey(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  std::map<int, Tensor> latest;
  for (int i = 0; i < steps; ++i)
    latest[0] = batch(i).matmul(w); // overwrites one entry
  return latest[0].sum().item<float>();
}

float notInLoop() {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor total = tt::zeros({});
  total += batch(0).matmul(w).mean();
  return total.item<float>();
}

struct Policy {
  std::vector<Tensor> saved_log_probs_;
  void act(int steps) {
    Tensor w = tt::randn({8, 2}, tt::requires_grad());
    for (int i = 0; i < steps; ++i)
      saved_log_probs_.push_back(batch(i).matmul(w).sigmoid().log().sum());
  }
  void finish() {
    tt::stack(saved_log_probs_).sum().neg().backward(); // another method differentiates them
    saved_log_probs_.clear();
  }
};

float lambdaUse(int steps) {
  Tensor w = tt::randn({8, 2}, tt::requires_grad());
  Tensor total = tt::zeros({});
  for (int i = 0; i < steps; ++i)
    total += batch(i).matmul(w).mean();
  auto closure = [&] { total.backward(); };
  closure();
  return 0;
}
