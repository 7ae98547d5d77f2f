// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-on-expanded %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-on-expanded %t.plugin -- --quiet --fix-errors -- %torch_pch
#include <torch/torch.h>

using torch::Tensor;

// ===== positives ============================================================

Tensor biasAdd(const Tensor &b, const Tensor &x) {
  auto bias = b.expand_as(x);
  // CHECK-FIXES: {{^}}  auto bias = b.expand_as(x).clone();{{$}}
  bias.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'add_' on a tensor expanded by 'expand_as' throws at run time: its elements along a stride-0 dimension share one memory location ('unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.'); assuming 'expand_as' broadcasts a dimension to a size > 1, as nearly all do [tensor-inplace-on-expanded]
  // CHECK-MESSAGES: :[[@LINE-4]]:17: note: expanded here; '.clone()' gives the tensor memory of its own
  return x + bias;
}

Tensor scaledPositions(const Tensor &pos, int64_t n, double scale) {
  return pos.expand({n, -1}).mul_(scale);
  // CHECK-MESSAGES: :[[@LINE-1]]:30: warning: in-place 'mul_' on a tensor expanded by 'expand' throws
  // CHECK-FIXES: {{^}}  return pos.expand({n, -1}).clone().mul_(scale);{{$}}
}

Tensor headMask(const Tensor &m, int64_t b, int64_t h, int64_t t) {
  auto mask = m.unsqueeze(1).expand({b, h, t, t});
  mask.mul_(-1e9);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'mul_' on a tensor expanded by 'expand' throws
  return mask;
}

Tensor known() {
  auto row = torch::arange(4, torch::kFloat).unsqueeze(0).expand({3, 4});
  row += 1;
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'add_' on a tensor expanded by 'expand' throws
  return row;
}

Tensor broadcastTo(const Tensor &mean, const Tensor &x) {
  auto m = mean.broadcast_to(x.sizes());
  m.neg_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'neg_' on a tensor expanded by 'broadcast_to' throws
  return m;
}

Tensor scatterTargets(const Tensor &labels, int64_t B, int64_t C) {
  auto t = torch::full({1, C}, 0.1).expand({B, C});
  t.scatter_(1, labels.unsqueeze(1), 0.9);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'scatter_' on a tensor expanded by 'expand' throws
  return t;
}

void clampShapes(const Tensor &shapes, int64_t n) {
  shapes.unsqueeze(0).expand({n, -1, -1}).clamp_(0, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:43: warning: in-place 'clamp_' on a tensor expanded by 'expand' throws
}

void copyInto(const Tensor &v, const Tensor &src, int64_t n) {
  auto e = v.unsqueeze(1).expand({-1, n});
  e.copy_(src);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'copy_' on a tensor expanded by 'expand' throws
}

// ===== negatives ============================================================

void maskedFillOnlyWarns(const Tensor &m, const Tensor &pad, int64_t b, int64_t t) {
  auto mask = m.unsqueeze(0).expand({b, t, t});
  mask.masked_fill_(pad, true);
  mask.index_put_({0}, false);
}

void fillZero(const Tensor &v, int64_t n) {
  v.expand({n, -1}).fill_(0);
  v.expand({n, -1}).zero_();
}

Tensor outputWritten(const Tensor &x, const Tensor &b) {
  auto y = x.clone();
  y.add_(b.expand_as(y));
  return y;
}

Tensor cloned(const Tensor &b, const Tensor &x) {
  auto bias = b.expand_as(x).clone();
  bias.add_(1);
  return bias;
}

Tensor repeated(const Tensor &v, int64_t n) {
  auto r = v.unsqueeze(1).repeat({1, n});
  r.div_(2);
  return r;
}

Tensor outOfPlace(const Tensor &v, int64_t n) {
  auto e = v.unsqueeze(0).expand({n, -1}) * 2;
  e.add_(1);
  return e;
}

Tensor contiguousCopy(const Tensor &v, int64_t n) {
  auto e = v.unsqueeze(0).expand({n, -1}).contiguous();
  e.sub_(1);
  return e;
}

Tensor sameShape(const Tensor &x) {
  auto e = x.expand({-1, -1});
  return e;
}

// A move as one constant plane: the view's -1 is the batch (expand can only
// keep it), the 1s become N x N.
Tensor actionPlane(const Tensor &state, const Tensor &action) {
  const auto B = state.size(0), N = state.size(2);
  auto plane = action.to(torch::kFloat).view({-1, 1, 1, 1}).expand({B, 1, N, N});
  plane.div_(4);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'div_' on a tensor expanded by 'expand' throws at run time: its elements along a stride-0 dimension share one memory location ('unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.'); assuming 'expand' broadcasts a dimension to a size > 1, as nearly all do [tensor-inplace-on-expanded]
  return torch::cat({state, plane}, 1);
}

// A member assigned in the body is followed until a call that may assign it
// again (a method of the class): the cloud of copies of one pose is written.
struct ParticleCloud {
  torch::Tensor particles_;
  ParticleCloud(const torch::Tensor &init, int64_t B, int64_t N) {
    particles_ = init.unsqueeze(1).expand({B, N, 3});
    particles_.add_(torch::randn({B, N, 3}) * 0.1);
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: in-place 'add_' on a tensor expanded by 'expand' throws at run time
  }
  void reset(const torch::Tensor &init, int64_t B, int64_t N) {
    particles_ = init.unsqueeze(1).expand({B, N, 3}).clone();
    particles_.add_(torch::randn({B, N, 3}) * 0.1);
  }
  void regrow(const torch::Tensor &init, int64_t B, int64_t N) {
    particles_ = init.unsqueeze(1).expand({B, N, 3});
    own();
    particles_.add_(torch::randn({B, N, 3}) * 0.1);
  }
  void own() { particles_ = particles_.contiguous(); }
};
