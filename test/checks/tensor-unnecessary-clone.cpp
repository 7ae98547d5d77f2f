// RUN: %check_tensor_tidy --compile-fixed %s tensor-unnecessary-clone %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-unnecessary-clone %t.plugin
#include "tt/tt.h"

#include <utility>
#include <vector>

using tt::Tensor;

float use(const Tensor &t) { return t.sum().item<float>(); }
void scribble(Tensor &t);           // may write t: we cannot see
void unseen(const Tensor &t);       // a body we cannot see, given the tensor
struct Optimizer {
  void step();
};

// ---- (a) the copy's first use rewrites it in place ------------------------------

Tensor scaled(const Tensor &x) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x', then 'mul_' rewrites the copy in place at once: two passes over the data where the out-of-place op makes the same tensor in one; use 'x.mul(2)' [tensor-unnecessary-clone]
  y.mul_(2);
  return y;
}
// CHECK-FIXES: auto y = x.mul(2);
// CHECK-FIXES-NEXT: {{^  //$}}
// CHECK-FIXES-NEXT: return y;

Tensor shifted(const Tensor &x, const Tensor &m) {
  Tensor y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'clone' copies 'x', then 'sub_' rewrites
  y.sub_(m);
  y.div_(2);
  return y;
}
// CHECK-FIXES: Tensor y = x.sub(m);

Tensor compound(const Tensor &x) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x', then '*=' rewrites the copy in place at once{{.*}}use 'x.mul(0.5)'
  y *= 0.5;
  return y;
}
// CHECK-FIXES: auto y = x.mul(0.5);

Tensor addAssign(const Tensor &x, const Tensor &b) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x', then '+=' rewrites{{.*}}use 'x.add(b)'
  y += b;
  return y;
}
// CHECK-FIXES: auto y = x.add(b);

Tensor clamped(Tensor x, double lo, double hi) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x', then 'clamp_' rewrites{{.*}}use 'x.clamp(lo, hi)'
  y.clamp_(lo, hi);
  return y - x;
}
// CHECK-FIXES: auto y = x.clamp(lo, hi);

Tensor unary(const Tensor &x) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x', then 'relu_' rewrites{{.*}}use 'x.relu()'
  y.relu_();
  return y;
}
// CHECK-FIXES: auto y = x.relu();

Tensor ofResult(const Tensor &a, const Tensor &b) {
  auto y = tt::matmul(a, b).clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:29: warning: 'clone' copies 'tt::matmul(a, b)', then 'tanh_' rewrites{{.*}}use 'tt::matmul(a, b).tanh()'
  y.tanh_();
  return y;
}
// CHECK-FIXES: auto y = tt::matmul(a, b).tanh();

std::vector<Tensor> inLoopVarying(const std::vector<Tensor> &xs) {
  std::vector<Tensor> out;
  for (const auto &x : xs) {
    auto y = x.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'clone' copies 'x', then 'exp_' rewrites{{.*}}use 'x.exp()'
    y.exp_();
    out.push_back(y);
  }
  return out;
}
// CHECK-FIXES: auto y = x.exp();

// ---- (b) a copy nothing needs -------------------------------------------------

float onlyRead(const Tensor &x) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x' for nothing: neither 'y' nor 'x' is written while 'y' lives, and 'y' does not leave the block; use 'x' itself [tensor-unnecessary-clone]
  return use(y) + use(y * 2);
}
// CHECK-FIXES: auto y = x;

float localSource() {
  Tensor a = tt::ones({4});
  Tensor c = a.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'clone' copies 'a' for nothing
  return use(c.mean());
}
// CHECK-FIXES: Tensor c = a;

float readByOps(const Tensor &x, const Tensor &w) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x' for nothing
  auto z = tt::matmul(y, w).relu();
  z.mul_(2); // writes z, a fresh result, not y
  return use(z);
}
// CHECK-FIXES: auto y = x;

float readInLoop(const std::vector<Tensor> &xs) {
  float s = 0;
  for (const auto &x : xs) {
    auto y = x.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'clone' copies 'x' for nothing
    s += use(y);
  }
  return s;
}
// CHECK-FIXES: auto y = x;

struct Stats {
  Tensor mean = tt::zeros({3});
  float spread() const {
    auto m = mean.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'clone' copies 'mean' for nothing
    return use(m.abs());
  }
};
// CHECK-FIXES: auto m = mean;

struct Batch {
  Tensor data;
};
float fieldOfLocal(const Batch &b) {
  auto d = b.data.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'clone' copies 'b.data' for nothing
  return use(d);
}
// CHECK-FIXES: auto d = b.data;

float readOnlyHelper(const Tensor &t) { return t.sum().item<float>() * 2; }
float visibleReader(const Tensor &x) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x' for nothing
  return readOnlyHelper(y);
}
// CHECK-FIXES: auto y = x;

float viewRead(const Tensor &x) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x' for nothing
  auto v = y.view({-1});
  return use(v);
}
// CHECK-FIXES: auto y = x;

// ---- not flagged ----------------------------------------------------------------

Tensor returned(const Tensor &x) {
  auto y = x.clone(); // the copy is the result: the caller may write it
  return y;
}

std::vector<Tensor> pushed(const std::vector<Tensor> &xs) {
  std::vector<Tensor> keep;
  for (const auto &x : xs) {
    auto y = x.clone(); // stored: must not follow x
    keep.push_back(y);
  }
  return keep;
}

float sourceWrittenLater(Tensor x) {
  auto snapshot = x.clone(); // x changes while the snapshot is read
  x.add_(1);
  return use(snapshot) - use(x);
}

float sourceWrittenThroughAlias(Tensor x) {
  auto before = x.clone();
  auto v = x.view({-1});
  v.mul_(3);
  return use(before) + use(x);
}

Tensor writtenLater(const Tensor &x) {
  auto y = x.clone(); // written, but not as its first use
  float s = use(y);
  y.mul_(s);
  return y;
}

Tensor bufferCopiedInto(const Tensor &x, const Tensor &src) {
  auto buf = x.clone(); // copy_ has no out-of-place twin
  buf.copy_(src);
  return buf;
}

Tensor filled(const Tensor &x) {
  auto y = x.clone(); // fill_ / zero_: zeros_like would drop the autograd history
  y.fill_(1);
  return y;
}

Tensor writtenThroughView(const Tensor &x) {
  auto y = x.clone();
  y.narrow(0, 0, 1).zero_();
  return y;
}

Tensor byReference(const Tensor &x) {
  auto y = x.clone(); // handed to code that may write it
  scribble(y);
  return y;
}

float toUnknown(const Tensor &x) {
  auto y = x.clone(); // a body we cannot see may write it in place
  unseen(y);
  return use(x);
}

struct Trainer {
  Tensor w = tt::ones({3});
  Optimizer opt;
  float stepAndCompare() {
    auto before = w.clone(); // opt.step() may update w
    opt.step();
    return use(before - w);
  }
};

float rawPointer(const Tensor &x) {
  auto y = x.clone(); // written through the pointer
  float *p = y.data_ptr<float>();
  p[0] = 1;
  return use(y);
}

float gradFlag(const Tensor &x) {
  auto y = x.clone(); // the copy's own autograd identity is used
  y.requires_grad_(true);
  return use(y);
}

Tensor loopInvariant(const Tensor &mask, int n) {
  Tensor acc = tt::zeros({4});
  for (int i = 0; i < n; ++i) {
    auto m = mask.clone(); // tensor-clone-in-loop reports it (loop-invariant source)
    acc = acc + m;
  }
  return acc;
}

Tensor loopInvariantWritten(const Tensor &mask, int n) {
  Tensor acc = tt::zeros({4});
  for (int i = 0; i < n; ++i) {
    auto m = mask.clone(); // tensor-clone-in-loop reports it (hoist and copy_)
    m.mul_(2);
    acc = acc + m;
  }
  return acc;
}

Tensor contiguousCopy(const Tensor &x) {
  auto y = x.clone(tt::MemoryFormat::Contiguous); // a layout change, not a plain copy
  return y.view({-1});
}

Tensor intInPlace() {
  Tensor counts = tt::zeros({3}, tt::kLong);
  auto c = counts.clone(); // integer: left alone (an out-of-place op may promote)
  c.mul_(2);
  return c;
}

float captured(const Tensor &x) {
  auto y = x.clone();
  auto f = [&y] { y.add_(1); };
  f();
  return use(y);
}

std::pair<Tensor, Tensor> movedOut(const Tensor &x) {
  auto y = x.clone();
  return {std::move(y), x};
}
