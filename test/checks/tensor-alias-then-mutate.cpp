// RUN: %check_tensor_tidy --compile-fixed %s tensor-alias-then-mutate %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-alias-then-mutate %t.plugin
#include "tt/tt.h"

#include <utility>
#include <vector>

using tt::Tensor;
void use(const Tensor &);
Tensor make();
bool flag();

// ===== positives ============================================================

void copyThenAdd() {
  Tensor a = tt::ones({3});
  Tensor b = a;
  b.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'add_' on 'b' also changes 'a', which shares its storage: copying a tensor handle does not copy data [tensor-alias-then-mutate]
  // CHECK-FIXES: {{^}}  b = b.add(1);{{$}}
  use(a);
}

void compoundAssign(const Tensor &m) {
  Tensor a = tt::ones({3});
  auto b = a;
  b -= m + 1;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place '-=' on 'b' also changes 'a'
  // CHECK-FIXES: {{^}}  b = b - (m + 1);{{$}}
  use(a);
}

// A const handle cannot be reassigned: the fix clones at the alias instead.
void constHandle() {
  Tensor a = tt::ones({3});
  const Tensor b = a;
  // CHECK-FIXES: {{^}}  const Tensor b = a.clone();{{$}}
  b.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'add_' on 'b' also changes 'a'
  use(a);
}

// Several writes: one clone() where the alias is made.
void normalizeTwice(const Tensor &mean, const Tensor &stdev) {
  Tensor a = tt::ones({3});
  Tensor b = a;
  // CHECK-FIXES: {{^}}  Tensor b = a.clone();{{$}}
  b -= mean;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place '-=' on 'b' also changes 'a'
  b /= stdev;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place '/=' on 'b' also changes 'a'
  use(a);
}

// The caller's tensor changes.
Tensor centered(const Tensor &x) {
  Tensor y = x;
  y.sub_(y.mean());
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'sub_' on 'y' also changes 'x'
  // CHECK-FIXES: {{^}}  y = y.sub(y.mean());{{$}}
  return y;
}

void byValueParam(Tensor x) {
  auto y = x;
  y.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'y' also changes 'x'
  // CHECK-FIXES: {{^}}  y = y.mul(2);{{$}}
  use(y);
}

// May-alias ops: the single-copy form replaces the op.
Tensor toUnit(const Tensor &img) {
  Tensor y = img.contiguous();
  // CHECK-FIXES: {{^}}  Tensor y = img.clone(tt::MemoryFormat::Contiguous);{{$}}
  y.div_(255);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'div_' on 'y' may also change 'img': 'contiguous' returns its input, not a copy, when it can
  y.sub_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'sub_' on 'y' may also change 'img'
  return y;
}

void reshapeZero(const Tensor &x) {
  auto flat = x.reshape({-1});
  // CHECK-FIXES: {{^}}  auto flat = x.clone(tt::MemoryFormat::Contiguous).reshape({-1});{{$}}
  flat.zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'zero_' on 'flat' may also change 'x': 'reshape' returns its input
  use(flat);
}

void toDtype(const Tensor &x) {
  auto y = x.to(tt::kFloat);
  // CHECK-FIXES: {{^}}  auto y = x.to(tt::kFloat, /*non_blocking=*/false, /*copy=*/true);{{$}}
  y.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'y' may also change 'x': 'to' returns its input
  y.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'add_' on 'y' may also change 'x'
  use(y);
}

void flattenLocal() {
  Tensor a = tt::ones({2, 3});
  auto f = a.flatten();
  f.fill_(0);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'fill_' on 'f' may also change 'a': 'flatten' returns its input
  // CHECK-FIXES: {{^}}  auto f = a.clone(tt::MemoryFormat::Contiguous).flatten();{{$}}
  use(a);
}

struct Model {
  Tensor w;
  void step(const Tensor &g) {
    Tensor cur = w;
    cur.sub_(g);
    // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'sub_' on 'cur' also changes 'w'
    // CHECK-FIXES: {{^}}    cur = cur.sub(g);{{$}}
    use(cur);
  }
};

Tensor g_buffer;
void globalCopy() {
  auto b = g_buffer;
  b.zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'zero_' on 'b' also changes 'g_buffer'
  // CHECK-FIXES: {{^}}  auto b = g_buffer.clone();{{$}}
}

void writeInBranch(bool c) {
  Tensor a = tt::ones({3});
  auto b = a;
  if (c)
    b.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'mul_' on 'b' also changes 'a'
  // CHECK-FIXES: {{^}}    b = b.mul(2);{{$}}
  use(a);
}

// Read again in the next iteration.
void copyInLoop(int n) {
  Tensor acc = tt::zeros({3});
  for (int i = 0; i < n; ++i) {
    Tensor step = acc;
    step.add_(1);
    // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: in-place 'add_' on 'step' also changes 'acc'
    // CHECK-FIXES: {{^}}    step = step.add(1);{{$}}
    use(step);
  }
}

void reassignedThroughMayAlias() {
  Tensor a = tt::ones({3});
  Tensor b = a;
  b = b.contiguous();
  b.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'add_' on 'b' may also change 'a': 'contiguous' returns its input
  // CHECK-FIXES: {{^}}  b = b.add(1);{{$}}
  use(a);
}

// The snapshot is not one: writing the original changes it.
Tensor snapshot(Tensor h) {
  Tensor prev = h;
  h.mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'h' also changes 'prev'
  // CHECK-FIXES: {{^}}  h = h.mul(0.5);{{$}}
  return h - prev;
}

auto lambdaParam = [](const Tensor &x) {
  Tensor y = x;
  y.relu_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'relu_' on 'y' also changes 'x'
  // CHECK-FIXES: {{^}}  y = y.relu();{{$}}
  return y;
};

void lambdaCapture() {
  Tensor a = tt::ones({3});
  auto fn = [&a]() {
    auto b = a;
    b.neg_();
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'neg_' on 'b' also changes 'a'
    // CHECK-FIXES: {{^}}    b = b.neg();{{$}}
    use(b);
  };
  fn();
}

template <typename T> T bumped(const T &x) {
  T y = x;
  y.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'add_' on 'y' also changes 'x'
  // CHECK-FIXES: {{^}}  y = y.add(1);{{$}}
  return y;
}
Tensor useBumped(const Tensor &t) { return bumped(t); }

// Calls are not black boxes: scale() writes its parameter.
void scale(Tensor t) { t.mul_(2); }
void callsMutator() {
  Tensor a = tt::ones({3});
  Tensor b = a;
  // CHECK-FIXES: {{^}}  Tensor b = a.clone();{{$}}
  scale(b);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: call to 'scale', which writes its argument in place, on 'b' also changes 'a'
  use(a);
}

// ... and same() returns its argument.
Tensor same(const Tensor &t) { return t; }
void aliasThroughCall() {
  Tensor a = tt::ones({3});
  Tensor b = same(a);
  b.exp_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'exp_' on 'b' also changes 'a'
  // CHECK-FIXES: {{^}}  b = b.exp();{{$}}
  use(a);
}

void indexAssign() {
  Tensor a = tt::ones({3});
  Tensor b = a;
  // CHECK-FIXES: {{^}}  Tensor b = a.clone();{{$}}
  b[0] = 5;
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place '=' on 'b' also changes 'a'
  use(a);
}

// A named view of the copy still writes the original.
void viewOfCopy() {
  Tensor a = tt::ones({4});
  Tensor b = a;
  // CHECK-FIXES: {{^}}  Tensor b = a.clone();{{$}}
  auto head = b.narrow(0, 0, 2);
  head.zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'zero_' on 'head' also changes 'a'
  use(a);
}

// index() with integers and slices is a view too (ops.def: index).
void sliceIndexOfCopy() {
  Tensor a = tt::ones({4});
  Tensor b = a;
  // CHECK-FIXES: {{^}}  Tensor b = a.clone();{{$}}
  auto head = b.index({tt::indexing::Slice(0, 2)});
  head.zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'zero_' on 'head' also changes 'a'
  use(a);
}

#define ZERO_OUT(t) (t).zero_()
void throughMacro() {
  Tensor a = tt::ones({3});
  Tensor b = a;
  // CHECK-FIXES: {{^}}  Tensor b = a.clone();{{$}}
  ZERO_OUT(b);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: in-place 'zero_' on 'b' also changes 'a'
  use(a);
}

struct Batch {
  Tensor data, target;
};
void memberOfLocal(Batch b) {
  auto x = b.data;
  x.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'x' also changes 'data'
  // CHECK-FIXES: {{^}}  x = x.mul(2);{{$}}
  use(x);
}

void outParameter(const Tensor &in, Tensor &out) {
  out = in;
  out.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'mul_' on 'out' also changes 'in'
  // CHECK-FIXES: {{^}}  out = out.mul(2);{{$}}
}

// A chain writes one tensor: one finding, at its first write; one clone() at the copy.
void chained(const Tensor &x) {
  auto y = x;
  // CHECK-FIXES: {{^}}  auto y = x.clone();{{$}}
  y.mul_(2).add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'y' also changes 'x'
  use(y);
}

void inSwitch(int k, const Tensor &x) {
  Tensor y = x;
  switch (k) {
  case 0:
    y.add_(1);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'add_' on 'y' also changes 'x'
    // CHECK-FIXES: {{^}}    y = y.add(1);{{$}}
    break;
  default:
    break;
  }
  use(y);
}

Tensor afterEarlyReturn(const Tensor &x, bool c) {
  Tensor y = x;
  if (c)
    return y;
  y.div_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'div_' on 'y' also changes 'x'
  // CHECK-FIXES: {{^}}  y = y.div(2);{{$}}
  return y;
}

void staticLocal() {
  static Tensor cache = tt::zeros({2});
  Tensor c = cache;
  c.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'add_' on 'c' also changes 'cache'
  // CHECK-FIXES: {{^}}  c = c.add(1);{{$}}
}

// ===== negatives ============================================================

void cloned() {
  Tensor a = tt::ones({3});
  auto b = a.clone();
  b.add_(1);
  use(a);
}

void explicitViews() {
  Tensor a = tt::ones({3, 4});
  auto row = a.select(0, 0);
  row.zero_();
  a[1].fill_(1);
  a.narrow(1, 0, 2).mul_(2);
  auto v = a.view({-1});
  v.add_(1);
  a[2] = 3;
  use(a);
}

// A tensor index copies (advanced indexing, ops.def: index_tensor): the
// write stays in `picked`.
void tensorIndexOfCopy() {
  Tensor a = tt::ones({4});
  Tensor b = a;
  auto picked = b.index({tt::arange(2, tt::kLong)});
  picked.zero_();
  use(a);
}

void sourceDead() {
  Tensor b = make();
  Tensor c = b;
  c.add_(1);
  use(c);
}

void copyRebound() {
  Tensor a = tt::ones({3});
  Tensor b = a;
  b = b.add(1);
  b.add_(1);
  use(a);
}

void sourceRebound() {
  Tensor a = tt::ones({3});
  Tensor b = a;
  a = tt::zeros({3});
  b.add_(1);
  use(a);
  use(b);
}

// Copy on one path only: the author chose between aliasing and copying.
void conditionalCopy(bool c) {
  Tensor a = tt::ones({3});
  Tensor b = a;
  if (c)
    b = a.clone();
  b.add_(1);
  use(a);
  Tensor d = c ? a : a.clone();
  d.mul_(2);
  use(a);
}

void metadataOnly() {
  Tensor a = tt::ones({3});
  auto b = a;
  b.add_(1);
  auto n = a.size(0) + a.dim();
  (void)n;
  use(b);
}

void forcedCopy() {
  Tensor a = tt::ones({3});
  auto b = a.to(tt::kFloat, /*non_blocking=*/false, /*copy=*/true);
  b.mul_(2);
  use(a);
}

void detachedBelongsToOtherCheck() {
  Tensor a = tt::ones({3});
  auto d = a.detach();
  d.mul_(2);
  use(a);
}

void outOfPlaceOnly() {
  Tensor a = tt::ones({3});
  auto b = a;
  b = b * 2;
  b = b - 1;
  use(a);
  use(b);
}

struct Fake {
  Fake add_(int) { return *this; }
};
void notATensor() {
  Fake f;
  Fake g = f;
  g.add_(1);
  (void)f;
}

void writesItsOwnParameter(Tensor x) { x.relu_(); }
void writesOutParameter(Tensor &out, const Tensor &src) { out.copy_(src); }

void referenceIsTheSameHandle() {
  Tensor a = tt::ones({3});
  Tensor &r = a;
  r.add_(1);
  use(a);
}

template <typename T> void neverInstantiated(T x) {
  auto y = x;
  y.add_(1);
  use(x);
}

void movedFrom() {
  Tensor a = tt::ones({3});
  Tensor b = std::move(a);
  b.add_(1);
  use(b);
}

void temporaryChain() {
  Tensor a = tt::ones({3});
  a.contiguous().add_(1);
  use(a);
}

void flagOnly() {
  Tensor a = tt::ones({3});
  auto b = a;
  b.requires_grad_();
  use(a);
}

void freshEachIteration(int n) {
  Tensor a = tt::ones({3});
  for (int i = 0; i < n; ++i) {
    Tensor b = a.clone();
    b.add_(1);
    use(a);
  }
}

void sourceReadOnlyBefore() {
  Tensor a = tt::ones({3});
  auto b = a;
  use(a);
  b.add_(1);
  use(b);
}

void advancedIndexCopies(const Tensor &idx) {
  Tensor a = tt::ones({3});
  auto b = a[idx];
  b.zero_();
  use(a);
}

void accumulator(const std::vector<Tensor> &xs) {
  Tensor total = tt::zeros({3});
  for (const Tensor &x : xs)
    total.add_(x);
  use(total);
}

auto lambdaClone = [](const Tensor &x) {
  Tensor y = x.clone();
  y.add_(1);
  return y;
};

#define CLONE_OF(t) (t).clone()
void macroClone() {
  Tensor a = tt::ones({3});
  Tensor b = CLONE_OF(a);
  b.add_(1);
  use(a);
}

// The callee does not write its parameter.
Tensor pure(const Tensor &t) { return t * 2; }
void callsPure() {
  Tensor a = tt::ones({3});
  Tensor b = a;
  use(pure(b));
  use(a);
}

// Writing a view of acc writes acc: intended, even though acc came from
// reshapes of a handle that is dead by then.
void viewOfReshapedInLoop(int n) {
  Tensor acc = tt::zeros({4});
  for (int i = 0; i < n; ++i) {
    Tensor tmp = acc.reshape({2, 2});
    tmp = tmp.t().contiguous();
    acc = tmp.reshape({4});
  }
  auto v = acc.narrow(0, 0, 2);
  v.mul_(0.5);
  use(acc);
}

// contiguous() of a transposed tensor copies.
void contiguousOfTransposed(const Tensor &x) {
  Tensor y = x.t().contiguous();
  y.add_(1);
  auto p = x.permute({1, 0});
  auto q = p;
  auto c = q.contiguous();
  c.mul_(2);
  use(y);
  use(c);
}

// A ResNet-style block: relu_ on the input while the identity is still needed.
Tensor residual(Tensor x) {
  Tensor identity = x;
  x.relu_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'relu_' on 'x' also changes 'identity'
  // CHECK-FIXES: {{^}}  x = x.relu();{{$}}
  return x + identity;
}

// Elements of containers the function does not own: a handle copied out of
// a member or parameter container shares the stored tensor's storage.
struct Buffer {
  std::vector<Tensor> frames_;
  Tensor sample(size_t i) {
    auto obs = frames_[i];
    obs.div_(255.0);
    // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'div_' on 'obs' also changes an element of 'frames_', which shares its storage
    return obs;
  }
  Tensor newest() {
    Tensor last = frames_.back();
    last.mul_(2);
    // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: in-place 'mul_' on 'last' also changes an element of 'frames_'
    return last;
  }
  // Look-alikes: a copy, a reference meant to update the element, reassignment.
  Tensor sampleCopy(size_t i) {
    auto obs = frames_[i].clone();
    obs.div_(255.0);
    return obs;
  }
  void scaleStored(size_t i) {
    auto &stored = frames_[i];
    stored.mul_(0.5);
  }
  Tensor sampleScaled(size_t i) {
    auto obs = frames_[i];
    obs = obs / 255.0;
    return obs;
  }
};

void mergeLevels(const std::vector<Tensor> &laterals, std::vector<Tensor> &out) {
  for (size_t i = 0; i + 1 < laterals.size(); ++i) {
    auto merged = laterals.at(i);
    merged.add_(out[i + 1]);
    // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: in-place 'add_' on 'merged' also changes an element of 'laterals'
    out[i] = merged;
  }
}

// A local container's later reads are not tracked: silent.
Tensor localContainer() {
  std::vector<Tensor> parts{tt::ones({2}), tt::ones({2})};
  auto p = parts[0];
  p.add_(1);
  return p;
}

// A member or out-parameter given an alias after the writes sees the written
// data, as intended: only writes the store may precede count.
struct Ratings {
  Tensor m;
  void fill(int n) {
    Tensor r = tt::empty({n, 1});
    for (int i = 0; i < n; ++i)
      r[i] = i;
    m = r.contiguous();
  }
  void writeAfterStore() {
    Tensor r = tt::empty({4});
    m = r.contiguous();
    r.fill_(1);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'fill_' on 'r' may also change 'm': 'contiguous' returns its input
  }
  void storeInLoop(int n) {
    Tensor r = tt::empty({4});
    for (int i = 0; i < n; ++i) {
      r.fill_(i);
      // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'fill_' on 'r' may also change 'm': 'contiguous' returns its input
      m = r.contiguous();
    }
  }
};

void outParamAfterWrites(Tensor &out, int n) {
  Tensor r = tt::empty({n});
  r.fill_(n);
  out = r;
}
