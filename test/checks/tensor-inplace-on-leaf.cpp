// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-on-leaf %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-on-leaf %t.plugin -- --fix-errors
#include "tt/tt.h"

using tt::Tensor;

// ===== positives ============================================================

Tensor scaledWeight() {
  Tensor w = tt::randn({4, 4}, tt::requires_grad());
  w.mul_(0.1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'w', a leaf tensor that requires grad, while grad mode is on: PyTorch raises "a leaf Variable that requires grad is being used in an in-place operation." [tensor-inplace-on-leaf]
  // CHECK-FIXES: {{^}}  { tt::NoGradGuard no_grad; w.mul_(0.1); }{{$}}
  return w;
}

Tensor flagged() {
  Tensor w = tt::ones({3}).requires_grad_();
  w += 1;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place '+=' on 'w', a leaf tensor
  // CHECK-FIXES: {{^}}  { tt::NoGradGuard no_grad; w += 1; }{{$}}
  return w;
}

Tensor rowZero() {
  Tensor w = tt::zeros({3, 3}, tt::TensorOptions().requires_grad(true));
  w.select(0, 1).fill_(2.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:18: error: in-place 'fill_' on 'w.select(0, 1)', a view of a leaf tensor
  w[2].zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:8: error: in-place 'zero_' on 'w[2]', a view of a leaf tensor
  return w;
}

void sgd(Tensor &grad) {
  Tensor w = tt::randn({3}, tt::requires_grad());
  w.sub_(grad * 0.1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'sub_' on 'w', a leaf tensor
}

// ===== negatives ============================================================

Tensor guarded() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  {
    tt::NoGradGuard no_grad;
    w.mul_(0.1);
  }
  tt::AutoGradMode off(false);
  w.add_(1);
  return w;
}

Tensor beforeFlag() {
  Tensor w = tt::randn({4});
  w.mul_(0.1);
  w.requires_grad_();
  return w;
}

Tensor nonLeaf() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  Tensor h = w * 2;
  h.add_(1);
  Tensor d = w.detach();
  d.zero_();
  w.grad().defined();
  return h;
}

void input(Tensor x) { x.add_(1); }

// Helpers whose every call in the file runs under the caller's no-grad guard
// (an init helper called from a constructor's guarded block): grad mode is off
// in them too, directly or through one more helper.
Tensor initScaled() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  w.mul_(0.1);
  return w;
}
Tensor initTwice() { return initScaled() + initScaled(); }
Tensor initThroughHelper() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  w.zero_();
  return w;
}
Tensor initOuter() { return initThroughHelper(); }
Tensor makeGuarded() {
  tt::NoGradGuard no_grad;
  return initTwice() + initOuter();
}

// ===== positives through call sites =========================================

// Called with grad on once is enough.
Tensor initMixed() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  w.mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'w', a leaf tensor
  return w;
}
Tensor useMixed() {
  Tensor a;
  {
    tt::NoGradGuard no_grad;
    a = initMixed();
  }
  return a + initMixed();
}

// Passed on as a callback: calls the file cannot see.
Tensor initCallback() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  w.mul_(0.25);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'w', a leaf tensor
  return w;
}
Tensor (*const InitHook)() = initCallback;
Tensor useCallback() {
  tt::NoGradGuard no_grad;
  return initCallback();
}
