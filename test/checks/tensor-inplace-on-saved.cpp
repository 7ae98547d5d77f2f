// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-on-saved %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-on-saved %t.plugin -- --fix-errors
#include "tt/tt.h"

using tt::Tensor;

// ===== positives ============================================================

void reluBias(const Tensor &b) {
  Tensor w = tt::randn({4}, tt::requires_grad());
  Tensor h = tt::relu(w * 2);
  h.add_(b);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' on 'h', which 'relu' saved for backward (its result): backward() raises "one of the variables needed for gradient computation has been modified by an inplace operation" [tensor-inplace-on-saved]
  // CHECK-FIXES: {{^}}  h = h.add(b);{{$}}
  h.sum().backward();
}

void tanhScale() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  Tensor t = (w + 1).tanh();
  t *= 2;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place '*=' on 't', which 'tanh' saved
  // CHECK-FIXES: {{^}}  t = t * 2;{{$}}
  t.sum().backward();
}

void logOfInput() {
  Tensor w = tt::rand({4}, tt::requires_grad());
  Tensor a = w + 1;
  Tensor l = tt::log(a);
  a.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'a', which 'log' saved for backward (its input)
  l.sum().backward();
}

void productOfLeaves(Tensor x) {
  Tensor w = tt::randn({4}, tt::requires_grad());
  Tensor h = x.mul(w);
  x.zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'zero_' on 'x', which 'mul' saved for backward (its input)
  h.sum().backward();
}

Tensor forward(const Tensor &x) {
  Tensor w = tt::randn({4}, tt::requires_grad());
  Tensor y = tt::sigmoid(x * w);
  y.sub_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'sub_' on 'y', which 'sigmoid' saved for backward (its result): backward() through 'sigmoid' raises
  return y;
}

// A helper's parameter requires grad when every call with grad mode on passes
// one that does; a call under a no-grad guard records nothing in it.
Tensor halfDistance(const Tensor &emb) {
  Tensor d = tt::sqrt(emb * emb);
  d.mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'd', which 'sqrt' saved for backward (its result): backward() through 'sqrt' raises
  // CHECK-FIXES: {{^}}  d = d.mul(0.5);{{$}}
  return d;
}

void trainDistance() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  halfDistance(w * 2).sum().backward();
  tt::NoGradGuard guard;
  Tensor eval = halfDistance(w);
}

// ===== negatives ============================================================

void addOutput() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  Tensor s = w + 1;
  s.mul_(2);
  Tensor m = (s * 2).sum();
  m.backward();
}

void scalarFactor() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  Tensor h = w * 1;
  Tensor g = h * tt::ones({4});
  h.add_(1);
  g.sum().backward();
}

void afterBackward() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  Tensor h = tt::relu(w * 2);
  h.sum().backward();
  h.add_(1);
}

Tensor unknownInput(const Tensor &x) {
  Tensor y = tt::sigmoid(x * 3);
  y.sub_(0.5);
  return y;
}

void noGrad() {
  Tensor x = tt::randn({4});
  Tensor y = tt::sigmoid(x);
  y.mul_(2);
  Tensor w = tt::randn({4}, tt::requires_grad());
  tt::NoGradGuard guard;
  Tensor z = tt::exp(w);
  z.add_(1);
}

void outOfPlace() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  Tensor h = tt::relu(w * 2);
  h = h + 1;
  h.add_(1);
  h.sum().backward();
}

// One call passes a tensor that may not require grad.
Tensor expShift(const Tensor &x) {
  Tensor y = tt::exp(x);
  y.add_(1);
  return y;
}

void callsExpShift(const Tensor &data) {
  Tensor w = tt::randn({4}, tt::requires_grad());
  expShift(w * 2).sum().backward();
  Tensor plain = expShift(data);
}

// Every call runs under a no-grad guard.
Tensor expEval(const Tensor &x) {
  Tensor y = tt::exp(x);
  y.add_(1);
  return y;
}

void callsExpEval() {
  Tensor w = tt::randn({4}, tt::requires_grad());
  tt::NoGradGuard guard;
  Tensor e = expEval(w);
}
