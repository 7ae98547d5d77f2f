// RUN: %check_tensor_tidy --compile-fixed %s tensor-clone-in-loop %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-clone-in-loop %t.plugin
#include "tt/tt.h"

#include <functional>
#include <utility>
#include <vector>

using tt::Tensor;

float use(const Tensor &t) { return t.sum().item<float>(); }
void normalize(const Tensor &t); // may write t in place: we cannot see
struct Optimizer {
  void step();
};
// An optimizer that calls a closure (LBFGS: one or more times per step).
inline Tensor stepWith(const std::function<Tensor()> &closure) { return closure(); }
void keepForLater(std::function<Tensor()> f);

// ---- flagged ------------------------------------------------------------------

float neverWritten(const Tensor &mask, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) {
    auto m = mask.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'clone' of loop-invariant 'mask' allocates and copies it on every iteration; it is never written: use 'mask' itself [tensor-clone-in-loop]
    // CHECK-FIXES: auto m = mask;
    s += use(m);
  }
  return s;
}

float writtenEachIteration(const Tensor &mask, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) {
    auto w = mask.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'clone' of loop-invariant 'mask' allocates and copies it on every iteration; hoist one buffer out of the loop and 'copy_' into it [tensor-clone-in-loop]
    w.mul_(2);
    s += use(w);
  }
  // CHECK-FIXES: float s = 0;
  // CHECK-FIXES-NEXT: auto w = mask.clone();
  // CHECK-FIXES-NEXT: for (int i = 0; i < n; ++i) {
  // CHECK-FIXES-NEXT: w.copy_(mask);
  return s;
}

float temporary(const Tensor &mask, int n) {
  Tensor acc = tt::zeros({4});
  int j = 0;
  while (j++ < n) {
    acc = acc + mask.clone() * 2;
    // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: 'clone' of loop-invariant 'mask' allocates and copies it on every iteration; it is never written
    // CHECK-FIXES: acc = acc + mask * 2;
  }
  return use(acc);
}

float convertEveryStep(const Tensor &x, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) {
    auto h = x.to(tt::kDouble);
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'to' of loop-invariant 'x' converts it again on every iteration (a copy; assuming 'x' is a float32 CPU tensor, as nearly all are); hoist it out of the loop
    s += use(h) * i;
  }
  // CHECK-FIXES: float s = 0;
  // CHECK-FIXES-NEXT: auto h = x.to(tt::kDouble);
  // CHECK-FIXES-NEXT: for (int i = 0; i < n; ++i) {
  // CHECK-FIXES-NEXT: //
  return s;
}

float toDevice(const Tensor &x, tt::Device dev, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i)
    s += use(x.to(dev));
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'to' of loop-invariant 'x' copies it to another device again on every iteration (a synchronising transfer; assuming 'x' is a float32 CPU tensor, as nearly all are); hoist it out of the loop
  return s;
}

float cudaAndCpu(const Tensor &x, int n) {
  float s = 0;
  do {
    s += use(x.cuda());
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'cuda' of loop-invariant 'x' copies it to another device again
    s += use(x.cpu()); // a CPU tensor (as inputs are taken to be): no copy
  } while (--n > 0);
  auto g = x.cuda();
  for (int i = 0; i < n; ++i)
    s += use(g.cpu());
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'cpu' of loop-invariant 'g' copies it to another device again on every iteration (a synchronising transfer); hoist it out of the loop
  return s;
}

float contiguousOfTransposed(int n) {
  auto t = tt::ones({32, 64}).t();
  float s = 0;
  for (int i = 0; i < n; ++i) {
    auto tc = t.contiguous();
    // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: 'contiguous' of loop-invariant 't' copies the non-contiguous tensor on every iteration (8.0 KiB each time); hoist it out of the loop
    s += use(tc);
  }
  return s;
}

float rangeFor(const std::vector<Tensor> &batches, const Tensor &mask) {
  float s = 0;
  for (const Tensor &b : batches) {
    auto m = mask.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'clone' of loop-invariant 'mask'
    s += use(b * m);
  }
  return s;
}

float nested(const Tensor &w, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) {
    auto row = w.select(0, i);
    for (int j = 0; j < n; ++j) {
      auto r = row.clone();
      // CHECK-MESSAGES: :[[@LINE-1]]:20: warning: 'clone' of loop-invariant 'row'
      s += use(r);
    }
  }
  return s;
}

float derivedInLoop(const Tensor &mask, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) {
    auto base = mask.view({-1});
    auto c = base.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'clone' of loop-invariant 'base'
    s += use(c);
  }
  return s;
}

struct Layer {
  Tensor mask_;
  float run(int n) const {
    float s = 0;
    for (int i = 0; i < n; ++i)
      s += use(mask_.clone());
    // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: 'clone' of loop-invariant 'mask_'
    return s;
  }
};

float inLambda(const Tensor &mask) {
  auto f = [&mask](int n) {
    float s = 0;
    for (int i = 0; i < n; ++i)
      s += use(mask.clone());
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'clone' of loop-invariant 'mask'
    return s;
  };
  return f(3);
}

template <typename T> T templ(const Tensor &mask, int n) {
  T s = 0;
  for (int i = 0; i < n; ++i)
    s += use(mask.clone());
  // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'clone' of loop-invariant 'mask'
  return s;
}
template float templ<float>(const Tensor &, int);

#define COPY(t) (t).clone()
float inMacro(const Tensor &mask, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i)
    s += use(COPY(mask));
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' of a loop-invariant tensor allocates and copies it on every iteration; it is never written: use the tensor itself
  return s;
}

// A closure written in the loop and run by it: its body runs every iteration.
float inClosure(const Tensor &style, int n) {
  float s = 0;
  Tensor styleGram = style.mul(2);
  for (int i = 0; i < n; ++i) {
    auto closure = [&] {
      auto target = styleGram.detach().clone();
      // CHECK-MESSAGES: :[[@LINE-1]]:40: warning: 'clone' of loop-invariant 'styleGram.detach()' allocates and copies it on every iteration; it is never written: use 'styleGram.detach()' itself [tensor-clone-in-loop]
      // CHECK-FIXES: auto target = styleGram.detach();
      return (target * 2).sum();
    };
    s += use(stepWith(closure));
  }
  for (int i = 0; i < n; ++i)
    s += use(stepWith([&] { return (style.clone() * 2).sum(); }));
  // CHECK-MESSAGES: :[[@LINE-1]]:43: warning: 'clone' of loop-invariant 'style' allocates and copies it on every iteration; it is never written: use 'style' itself
  for (int i = 0; i < n; ++i) {
    std::function<Tensor()> f = [&style] {
      auto w = style.clone();
      // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: 'clone' of loop-invariant 'style' allocates and copies it on every iteration; hoist one buffer out of the loop and 'copy_' into it
      w.add_(1);
      return w.sum();
    };
    s += use(f());
  }
  return s;
}

// What a helper of the TU returns: newly allocated storage (gramOf), which an
// opaque call cannot reach, or a view of its argument (flatOf), which it may.
Tensor gramOf(const Tensor &f) { return tt::matmul(f, f.t()) / 4; }
Tensor flatOf(const Tensor &f) { return f.view({-1}); }
float freshFromHelper(std::vector<Tensor> &params, Optimizer &opt, int n) {
  Tensor target = gramOf(params[0]);
  Tensor flat = flatOf(params[0]);
  float s = 0;
  for (int i = 0; i < n; ++i) {
    s += use(target.clone());
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'clone' of loop-invariant 'target' allocates and copies it on every iteration; it is never written: use 'target' itself
    s += use(flat.clone());                 // a view of the caller's parameter: opt.step() may write it
    opt.step();
  }
  return s;
}

// ---- not flagged ----------------------------------------------------------------

// A tensor handed to an object that may keep it (an optimizer built from it):
// a non-const call of that object may write it, even a caller's tensor.
struct Holder {
  explicit Holder(std::vector<Tensor> ts) : held(std::move(ts)) {}
  void step();
  std::vector<Tensor> held;
};
float handedOver(Tensor w, int n) {
  Holder h({w});
  float s = 0;
  for (int i = 0; i < n; ++i) {
    auto before = w.clone();                // a snapshot: h.step() may move w
    h.step();
    s += use(w - before);
  }
  return s;
}

// Closures the loop does not run, or whose copy differs between runs.
float closureNegatives(Tensor x, const Tensor &mask, int n) {
  float s = 0;
  std::vector<std::function<Tensor()>> later;
  for (int i = 0; i < n; ++i)
    later.push_back([&] { return (mask.clone() * 2).sum(); }); // stored, run later
  for (int i = 0; i < n; ++i)
    keepForLater([&] { return (mask.clone() * 2).sum(); });    // kept by a callee
  for (int i = 0; i < n; ++i) {
    auto unused = [&] { return (mask.clone() * 2).sum(); };    // never run
  }
  for (int i = 0; i < n; ++i) {
    auto closure = [&] {
      x.add_(1);                                               // the closure writes x
      return (x.clone() * 2).sum();
    };
    s += use(stepWith(closure));
  }
  for (int i = 0; i < n; ++i) {
    auto scaled = [&](const Tensor &t) { return (t.clone() * 2).sum(); }; // a new t each call
    s += use(scaled(mask * i));
  }
  for (int i = 0; i < n; ++i) {
    auto named = [&] { return (mask.clone() * 2).sum(); };     // named, then only stored
    later.push_back(named);
  }
  auto outside = [&] { return (mask.clone() * 2).sum(); }; // written before the loop
  for (int i = 0; i < n; ++i)
    s += use(outside());
  return s;
}


struct Fake {
  Fake clone() const;
};

Tensor negatives(Tensor x, const Tensor &mask, std::vector<Tensor> &kept, Optimizer &opt,
                 const std::vector<tt::Device> &devices, Fake f, int n) {
  Tensor last;
  float s = 0;
  for (int i = 0; i < n; ++i) {
    s += use(x[i].clone());                 // the source changes every iteration
    kept.push_back(mask.clone());           // each copy is kept
    auto k = mask.clone();
    kept.emplace_back(std::move(k));        // kept, through a handle
    last = mask.clone();                    // stored outside the loop
    auto snap = x.clone();                  // a snapshot: x is written below
    x.add_(1);
    s += use(x - snap);
    f.clone();                              // not a tensor
    s += use(tt::randn({3}).clone());       // a new source every iteration
    s += use(mask.contiguous());            // contiguous: no copy
    s += use(x.to(devices[i]));             // the device changes
    if (s > 100)
      return mask.clone();                  // returned
  }
  auto v = x.view({-1});
  for (int i = 0; i < n; ++i) {
    s += use(x.clone());                    // written through the view v
    v.mul_(2);
  }
  for (int i = 0; i < n; ++i) {
    s += use(x.clone());                    // x is rebound in the loop
    x = x * 2;
  }
  for (int i = 0; i < n; ++i) {
    s += use(mask.clone());                 // mask may be written by code we cannot see
    normalize(mask);
  }
  for (int i = 0; i < n; ++i) {
    auto w = kept[0].clone();               // the caller's container: opt.step() may write it
    opt.step();
    s += use(kept[0] - w);
  }
  auto g = [&] { x.add_(1); };
  for (int i = 0; i < n; ++i) {
    s += use(x.clone());                    // captured by reference
    g();
  }
  for (int i = 0; i < n; ++i) {
    auto later = [&] { return mask.clone(); }; // runs whenever the lambda does
    s += use(later());
  }
  std::vector<std::pair<Tensor, int>> pairs;
  for (int i = 0; i < n; ++i)
    pairs.push_back({mask.clone(), i});     // kept inside another object
  return last + s;
}
