// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-overlap %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-overlap %t.plugin -- --quiet --fix-errors -- %torch_pch
#include <torch/torch.h>

using torch::Tensor;

// ===== positives ============================================================

void symmetrise(Tensor &adj) {
  adj.add_(adj.t());
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'add_' reads a tensor that partially overlaps the one it writes: throws at run time ('unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. Please clone() the tensor before performing the operation.'); assuming the tensor is contiguous and its sizes exceed the offsets, as nearly all do [tensor-inplace-overlap]
  // CHECK-FIXES: {{^}}  adj.add_(adj.t().clone());{{$}}
}

void tie(Tensor &w) {
  w.copy_(w.t());
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'copy_' reads a tensor that partially overlaps
}

void compound(Tensor &x) {
  x += x.transpose(0, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' reads a tensor that partially overlaps
  // CHECK-FIXES: {{^}}  x += x.transpose(0, 1).clone();{{$}}
}

void shift(const Tensor &b) {
  int64_t n = b.size(0);
  b.narrow(0, 1, n - 1).copy_(b.narrow(0, 0, n - 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:25: error: in-place 'copy_' reads a tensor that partially overlaps
}

void rollLeft(const Tensor &frames) {
  auto k = frames.size(0);
  frames.narrow(0, 0, k - 1).copy_(frames.narrow(0, 1, k - 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:30: error: in-place 'copy_' reads a tensor that partially overlaps
}

void diff(const Tensor &x) {
  x.slice(0, 1).sub_(x.slice(0, 0, -1));
  // CHECK-MESSAGES: :[[@LINE-1]]:17: error: in-place 'sub_' reads a tensor that partially overlaps
}

void returns(const Tensor &r, int64_t T, double gamma) {
  r.narrow(0, 0, T - 1).add_(r.narrow(0, 1, T - 1), gamma);
  // CHECK-MESSAGES: :[[@LINE-1]]:25: error: in-place 'add_' reads a tensor that partially overlaps
}

void lerp(Tensor &x) {
  x.lerp_(x.t(), 0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'lerp_' reads a tensor that partially overlaps
}

void windowSlide(const Tensor &cache, int64_t L) {
  cache.narrow(2, 0, L - 1).copy_(cache.narrow(2, 1, L - 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:29: warning: in-place 'copy_' reads a tensor that partially overlaps the one it writes (overlapping slices along dimension 2): PyTorch cannot detect it and the result depends on the order in which elements are written
}

// N is the largest of the graphs' sizes, a value the loops name afresh: the
// buffer is still one storage when a later loop joins its paths.
Tensor symmetrize(const std::vector<Tensor> &atoms, int64_t B, int64_t min_nodes) {
  int64_t N = min_nodes;
  for (const auto &a : atoms)
    N = std::max(N, a.size(0));
  auto adj = torch::zeros({B, N, N});
  for (int64_t b = 0; b < B; ++b)
    adj[b].diagonal().fill_(1.0);
  adj.add_(adj.transpose(1, 2));
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'add_' reads a tensor that partially overlaps
  return adj;
}

// ===== negatives ============================================================

void full(Tensor &x) {
  x.add_(x);
  x.mul_(x.t().t());
}

void cloned(Tensor &x) { x.add_(x.t().clone()); }

void fresh(Tensor &x) {
  x.copy_(0.5 * (x + x.t()));
  x = x + x.t();
}

void disjoint(const Tensor &b) {
  b.narrow(0, 0, 2).copy_(b.narrow(0, 2, 2));
  auto n = b.size(0);
  b.narrow(0, 0, n / 2).add_(b.narrow(0, n / 2, n / 2));
}

void rows(const Tensor &r) {
  for (int64_t t = r.size(0) - 2; t >= 0; --t)
    r[t].add_(r[t + 1], 0.9);
}

void others(const Tensor &a, const Tensor &b) {
  a.add_(b.t());
  a.narrow(0, 1, 2).copy_(b.narrow(0, 0, 2));
}

void maskedScatterDoesNotCheck(Tensor &x) { x.masked_scatter_(x > 0, x.t()); }

void rolled(Tensor &f) { f = torch::roll(f, -1, 0); }

// A member of a struct variable is one storage wherever it is named: the
// shift inside the cache's window overlaps; two caches' windows are apart.
struct ConvCache {
  Tensor conv;
};
void shiftWindow(ConvCache &cache, const ConvCache &other) {
  const auto K = cache.conv.size(0);
  cache.conv.narrow(0, 0, K - 1).copy_(cache.conv.narrow(0, 1, K - 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:34: error: in-place 'copy_' reads a tensor that partially overlaps
  cache.conv.narrow(0, 0, K - 1).copy_(other.conv.narrow(0, 1, K - 1));
}

// A tensor made relative to one of its own rows: a slice with constant
// bounds is some of the elements written, not all. Along dim 0 it is dense
// and PyTorch compares it (throws); along another dim it leaves gaps and
// PyTorch cannot tell (order-dependent). A copy, or a reduction, is apart.
void relativeToFirst(Tensor &clouds, Tensor &rows) {
  clouds.sub_(clouds.narrow(1, 0, 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: in-place 'sub_' reads a tensor that partially overlaps the one it writes (a slice along dimension 1 of it): PyTorch cannot detect it
  // CHECK-FIXES: {{^}}  clouds.sub_(clouds.narrow(1, 0, 1).clone());{{$}}
  rows.sub_(rows.narrow(0, 0, 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:8: error: in-place 'sub_' reads a tensor that partially overlaps the one it writes: throws at run time
}
void relativeToCopy(Tensor &clouds) {
  auto first = clouds.narrow(1, 0, 1).clone();
  clouds.sub_(first);
  clouds.sub_(clouds.mean(1, true));
}

// The result of a function of the TU is one storage for its views here.
struct GraphImpl : torch::nn::Module {
  GraphImpl() { nodevec = register_parameter("nodevec", torch::randn({8, 4})); }
  Tensor adjacency() { return torch::softmax(torch::relu(torch::mm(nodevec, nodevec.t())), 1); }
  Tensor nodevec;
};
TORCH_MODULE(Graph);
void exportAdjacency(Graph &model) {
  torch::NoGradGuard no_grad;
  auto adj = model->adjacency().detach().cpu();
  adj.add_(adj.t()).mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'add_' reads a tensor that partially overlaps
  auto other = model->adjacency();
  other.add_(model->adjacency().t());
}

// bernoulli draws a new tensor of self's sizes (ops.def): spreading a mask
// one step along its own rows overlaps; from a copy it does not.
Tensor spanMask(const Tensor &ids, double p) {
  const auto L = ids.size(1);
  auto masked = torch::bernoulli(torch::full(ids.sizes(), p)).to(torch::kBool);
  masked.narrow(1, 1, L - 1).logical_or_(masked.narrow(1, 0, L - 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:30: warning: in-place 'logical_or_' reads a tensor that partially overlaps the one it writes (overlapping slices along dimension 1)
  auto spread = torch::bernoulli(torch::full(ids.sizes(), p)).to(torch::kBool);
  spread.narrow(1, 1, L - 1).logical_or_(spread.narrow(1, 0, L - 1).clone());
  return masked | spread;
}

// Note [shifted narrows]: two narrows of one tensor along the same dim, of
// the same length, from starts closer than that length overlap whatever the
// rank or the dim: `narrow(-1, ...)` and a `dim` parameter.
void preEmphasis(Tensor &wav, double coef) {
  const auto L = wav.size(-1);
  wav.narrow(-1, 1, L - 1).sub_(wav.narrow(-1, 0, L - 1), coef);
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: in-place 'sub_' reads a tensor that partially overlaps the one it writes (overlapping slices along dimension -1): PyTorch cannot detect it
}
void dilate(Tensor &active, int64_t dim) {
  const auto n = active.size(dim);
  active.narrow(dim, 1, n - 1).logical_or_(active.narrow(dim, 0, n - 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:32: warning: in-place 'logical_or_' reads a tensor that partially overlaps the one it writes (overlapping slices along dimension 'dim')
}
// Starts as far apart as the length, another tensor, another dim, a clone,
// a start the code does not show: no claim.
void shiftedNegatives(Tensor &a, Tensor &b, int64_t dim, int64_t n, int64_t hop) {
  a.narrow(-1, 0, 3).copy_(a.narrow(-1, 3, 3));
  a.narrow(dim, 1, n - 1).copy_(b.narrow(dim, 0, n - 1));
  a.narrow(dim, 1, n - 1).copy_(a.narrow(0, 0, n - 1));
  a.narrow(dim, 1, n - 1).copy_(a.narrow(dim, 0, n - 1).clone());
  a.narrow(-1, 0, n).copy_(a.narrow(-1, hop, n));
}
