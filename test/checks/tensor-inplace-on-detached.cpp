// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-on-detached %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-on-detached %t.plugin
// RUN: %check_tensor_tidy --check-suffix=STRICT %s tensor-inplace-on-detached %t.strict -- \
// RUN:   -config="{CheckOptions: {tensor-inplace-on-detached.IgnoreDirectChains: false, tensor-inplace-on-detached.IgnoreUnderNoGrad: false}}"
#include "tt/tt.h"

#include <vector>

using tt::Tensor;
void use(const Tensor &);
Tensor loss(const Tensor &);

// ===== positives ============================================================

void detachThenScale() {
  Tensor a = tt::ones({3}).requires_grad_();
  auto d = a.detach();
  // CHECK-FIXES: {{^}}  auto d = a.detach().clone();{{$}}
  d.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'd' changes 'a' behind autograd's back: 'detach()' shares storage and the version counter with its source [tensor-inplace-on-detached]
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'mul_' on 'd' changes 'a'
  use(loss(a));
}

void dataThenZero(const Tensor &w) {
  Tensor d = w.data();
  // CHECK-FIXES: {{^}}  Tensor d = w.detach().clone();{{$}}
  d.zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'zero_' on 'd' changes 'w' behind autograd's back: 'data()' shares storage but not even the version counter, so autograd cannot detect the change
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'zero_' on 'd' changes 'w'
}

void variableData(const Tensor &w) {
  auto d = w.variable_data();
  // CHECK-FIXES: {{^}}  auto d = w.detach().clone();{{$}}
  d.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'add_' on 'd' changes 'w' behind autograd's back: 'variable_data()' shares storage but not even
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'add_' on 'd' changes 'w'
}

void compoundOnDetached(Tensor x) {
  auto target = x.detach();
  target -= 1;
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: in-place '-=' on 'target' changes 'x'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:10: warning: in-place '-=' on 'target' changes 'x'
  use(target);
}

void detachedInBranch(bool c) {
  Tensor a = tt::ones({3}).requires_grad_();
  Tensor d = a.detach();
  if (c)
    d.clamp_(0, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'clamp_' on 'd' changes 'a'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:7: warning: in-place 'clamp_' on 'd' changes 'a'
  use(a);
}

void detachedInLoop(const std::vector<Tensor> &xs) {
  Tensor h = tt::zeros({3}).requires_grad_();
  for (const Tensor &x : xs) {
    Tensor hd = h.detach();
    hd.add_(x);
    // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'add_' on 'hd' changes 'h'
    // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:8: warning: in-place 'add_' on 'hd' changes 'h'
    use(hd);
  }
}

// A copy of the detached handle, then a write through a view of it.
void viewOfDetached() {
  Tensor a = tt::ones({4}).requires_grad_();
  Tensor d = a.detach();
  Tensor e = d;
  e.narrow(0, 0, 2).fill_(0);
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: in-place 'fill_' on 'e' changes 'a'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:21: warning: in-place 'fill_' on 'e' changes 'a'
  use(a);
}

struct Critic {
  Tensor value;
  void noisy() {
    auto v = value.detach();
    v.add_(0.1);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'add_' on 'v' changes 'value'
    // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:7: warning: in-place 'add_' on 'v' changes 'value'
    use(v);
  }
};

Tensor g_weights;
void globalDetached() {
  Tensor d = g_weights.detach();
  d.sqrt_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'sqrt_' on 'd' changes 'g_weights'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'sqrt_' on 'd' changes 'g_weights'
  use(d);
}

auto lambdaDetach = [](const Tensor &p) {
  auto d = p.detach();
  d.tanh_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'tanh_' on 'd' changes 'p'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'tanh_' on 'd' changes 'p'
  return d;
};

template <typename T> void perturb(const T &p) {
  T d = p.detach();
  d.add_(1e-3);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'add_' on 'd' changes 'p'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'add_' on 'd' changes 'p'
}
void usePerturb(const Tensor &p) { perturb(p); }

// The callee writes its parameter.
void halve(Tensor t) { t.div_(2); }
void callsMutatorOnDetached() {
  Tensor a = tt::ones({3}).requires_grad_();
  Tensor d = a.detach();
  halve(d);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: call to 'halve', which writes its argument in place, on 'd' changes 'a'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:3: warning: call to 'halve', which writes its argument in place, on 'd' changes 'a'
  use(loss(a));
}

void reassignedDetached() {
  Tensor a = tt::ones({3}).requires_grad_();
  Tensor d = tt::zeros({3});
  d = a.detach();
  d.exp_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'exp_' on 'd' changes 'a'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'exp_' on 'd' changes 'a'
  use(a);
}

#define SCALE_BY_TWO(t) (t).mul_(2)
void throughMacro() {
  Tensor a = tt::ones({3}).requires_grad_();
  Tensor d = a.detach();
  SCALE_BY_TWO(d);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: in-place 'mul_' on 'd' changes 'a'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:3: warning: in-place 'mul_' on 'd' changes 'a'
  use(a);
}

void detachOfCopy() {
  Tensor a = tt::ones({3}).requires_grad_();
  Tensor b = a;
  auto d = b.detach();
  d.log_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'log_' on 'd' changes 'b'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'log_' on 'd' changes 'b'
  use(b);
}

void indexAssignDetached(Tensor w) {
  auto d = w.detach();
  d[0] = 0;
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place '=' on 'd' changes 'w'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:8: warning: in-place '=' on 'd' changes 'w'
}

// The source requires grad: the write corrupts what autograd will use.
void requiresGradOption() {
  Tensor w = tt::ones({3}, tt::requires_grad());
  auto d = w.detach();
  d.zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'zero_' on 'd' changes 'w'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'zero_' on 'd' changes 'w'
}

void requiresGradLater() {
  Tensor w = tt::zeros({3});
  w.requires_grad_();
  Tensor d = w.detach();
  d.fill_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'fill_' on 'd' changes 'w'
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:5: warning: in-place 'fill_' on 'd' changes 'w'
}

// ===== negatives (the idioms) ================================================

void directChains(Tensor p, const Tensor &src) {
  p.detach().zero_();
  // CHECK-MESSAGES-STRICT: :[[@LINE-1]]:14: warning: in-place 'zero_' on 'the detached tensor' changes 'p'
  p.data().copy_(src);
  // CHECK-MESSAGES-STRICT: :[[@LINE-1]]:12: warning: in-place 'copy_' on 'the detached tensor' changes 'p'
}

void gradZero(const std::vector<Tensor> &params) {
  for (const Tensor &p : params)
    p.grad().zero_();
}

void targetNetworkUpdate(const std::vector<Tensor> &target, const std::vector<Tensor> &online) {
  tt::NoGradGuard guard;
  for (size_t i = 0; i < target.size(); ++i) {
    auto t = target[i].detach();
    t.mul_(0.99).add_(online[i], 0.01);
    // CHECK-MESSAGES-STRICT: :[[@LINE-1]]:7: warning: in-place 'mul_' on 't' changes an element of 'target'
    // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:18: warning: in-place 'add_' on 't' changes an element of 'target'
  }
}

void emaUnderGuard(Tensor avg, const Tensor &x) {
  tt::NoGradGuard no_grad;
  auto d = avg.data();
  d.mul_(0.9);
  // CHECK-MESSAGES-STRICT: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'd' changes 'avg'
}

void detachClone() {
  Tensor a = tt::ones({3}).requires_grad_();
  auto d = a.detach().clone();
  d.mul_(2);
  use(a);
}

void sourceDeadLocal() {
  Tensor a = tt::ones({3});
  auto d = a.detach();
  d.mul_(2);
  use(d);
}

void writeSourceNotDetached() {
  Tensor a = tt::ones({3}).requires_grad_();
  auto d = a.detach();
  a.add_(1);
  use(d);
}

void readOnlyDetached() {
  Tensor a = tt::ones({3}).requires_grad_();
  auto d = a.detach();
  use(d * 2);
  use(a);
}

void reboundBeforeWrite() {
  Tensor a = tt::ones({3}).requires_grad_();
  auto d = a.detach();
  d = d * 2;
  d.add_(1);
  use(a);
}

void metadataAfter() {
  Tensor a = tt::ones({3});
  auto d = a.detach();
  d.zero_();
  auto n = a.numel();
  (void)n;
  use(d);
}

void copyNotDetach() {
  Tensor a = tt::ones({3}).requires_grad_();
  auto c = a.clone().detach();
  c.mul_(2);
  use(a);
}

template <typename T> void uninstantiated(const T &p) {
  auto d = p.detach();
  d.add_(1);
  use(p);
}

struct FakeTensor {
  FakeTensor detach() const { return *this; }
  void mul_(int) {}
};
void notATensor(const FakeTensor &f) {
  auto d = f.detach();
  d.mul_(2);
  (void)f;
}

void conditionalDetach(bool c) {
  Tensor a = tt::ones({3}).requires_grad_();
  Tensor d = c ? a.detach() : tt::zeros({3});
  d.mul_(2);
  use(a);
}

auto lambdaCloned = [](const Tensor &p) {
  auto d = p.detach().clone();
  d.add_(1);
  return d;
};

void flagOnly() {
  Tensor a = tt::ones({3});
  auto d = a.detach();
  d.requires_grad_();
  use(a);
}

void noGradRequested() {
  Tensor w = tt::ones({3}, tt::requires_grad(false));
  auto d = w.detach();
  d.zero_();
  bool g = w.requires_grad();
  (void)g;
}

// Structured bindings are handles of their own.
std::pair<Tensor, Tensor> policyValue(const Tensor &obs);
Tensor valueLoss(const Tensor &obs, const Tensor &returns) {
  auto [logp, values] = policyValue(obs);
  auto baseline = values.detach();
  baseline.sub_(1.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: in-place 'sub_' on 'baseline' changes 'values' behind autograd's back
  // CHECK-MESSAGES-STRICT: :[[@LINE-2]]:12: warning: in-place 'sub_' on 'baseline' changes 'values'
  return (returns - values).pow(2).mean() + logp.sum();
}
// Look-alike: the detached copy is cloned first.
Tensor valueLossClone(const Tensor &obs, const Tensor &returns) {
  auto [logp, values] = policyValue(obs);
  auto baseline = values.detach().clone();
  baseline.sub_(1.0);
  return (returns - values).pow(2).mean() + logp.sum() + baseline.sum();
}
