// Building a symmetric adjacency matrix for a GCN from directed edges.
#include <torch/torch.h>

torch::Tensor adjacency(const torch::Tensor &edges, int64_t n) {
  auto adj = torch::zeros({n, n});
  adj.index_put_({edges.select(1, 0), edges.select(1, 1)}, 1.0);
  // FACT: a = torch.rand(4, 4); assert raises(lambda: a.add_(a.t()), "some elements of the input tensor and the written-to tensor")
  adj.add_(adj.t()); // EXPECT: tensor-inplace-overlap
  adj.clamp_(0, 1);
  return adj;
}

torch::Tensor adjacency_ok(const torch::Tensor &edges, int64_t n) {
  auto adj = torch::zeros({n, n});
  adj.index_put_({edges.select(1, 0), edges.select(1, 1)}, 1.0);
  // FACT: a = torch.rand(4, 4); assert not raises(lambda: (a + a.t()).clamp_(0, 1))
  adj = (adj + adj.t()).clamp_(0, 1); // LOOKALIKE: tensor-inplace-overlap -- the sum is a new tensor
  return adj;
}

torch::Tensor normalized(torch::Tensor adj) {
  auto deg = adj.sum(1).clamp_min(1).pow(-0.5);
  // FACT: a = torch.rand(4, 4); d = torch.rand(4); assert not raises(lambda: a.mul_(d.unsqueeze(1)).mul_(d.unsqueeze(0)))
  adj.mul_(deg.unsqueeze(1)).mul_(deg.unsqueeze(0)); // LOOKALIKE: tensor-inplace-overlap -- the degrees are another tensor
  return adj;
}

// Ties a square projection to its transpose (called under NoGradGuard).
void tie_transposed(torch::Tensor &w) {
  // FACT: w = torch.rand(4, 4); assert raises(lambda: w.copy_(w.t()), "some elements of the input tensor and the written-to tensor")
  w.copy_(w.t()); // EXPECT: tensor-inplace-overlap
}

void tie_averaged(torch::Tensor &w) {
  // FACT: w = torch.rand(4, 4); assert not raises(lambda: w.copy_(0.5 * (w + w.t())))
  w.copy_(0.5 * (w + w.t())); // LOOKALIKE: tensor-inplace-overlap -- the average is a new tensor
}

torch::Tensor covariance(const torch::Tensor &x) {
  auto c = x.t().mm(x) / (x.size(0) - 1);
  // FACT: c = torch.rand(3, 3); assert not raises(lambda: c.add_(c.t().clone()).mul_(0.5))
  c.add_(c.t().clone()).mul_(0.5); // LOOKALIKE: tensor-inplace-overlap -- the transpose is cloned
  return c;
}
