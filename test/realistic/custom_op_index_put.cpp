// Scatter helpers of a graph neural network layer (index_put_, narrow/copy_).
#include <torch/torch.h>

torch::Tensor scatter_mean(const torch::Tensor &src, const torch::Tensor &index, int64_t num_nodes) {
  auto out = torch::zeros({num_nodes, src.size(1)}, src.options());
  auto count = torch::zeros({num_nodes}, src.options());
  out.index_add_(0, index, src);
  count.index_add_(0, index, torch::ones({src.size(0)}, src.options()));
  return out / count.clamp_min(1).unsqueeze(1);
}

// Writes the node features of one subgraph into the batch buffer.
void write_block(torch::Tensor &batch_feats, const torch::Tensor &block, int64_t offset) {
  // FACT: b = torch.zeros(6, 3); b.narrow(0, 2, 2).copy_(torch.ones(2, 3)); assert b.sum() == 6
  batch_feats.narrow(0, offset, block.size(0)).copy_(block); // LOOKALIKE: tensor-alias-then-mutate -- writing the caller's buffer through narrow is the intent
}

torch::Tensor add_self_loops(const torch::Tensor &adj) {
  auto n = adj.size(0);
  auto a = adj;
  auto diag = torch::arange(n, torch::kLong);
  // FACT: adj = torch.zeros(3, 3); a = adj; a.index_put_((torch.arange(3), torch.arange(3)), torch.tensor(1.)); assert adj.trace() == 3
  a.index_put_({diag, diag}, torch::ones({n}, adj.options())); // EXPECT: tensor-alias-then-mutate
  return a / a.sum(1, true);
}

torch::Tensor add_self_loops_ok(const torch::Tensor &adj) {
  auto n = adj.size(0);
  auto a = adj + torch::eye(n, adj.options());
  // FACT: adj = torch.zeros(3, 3); a = adj + torch.eye(3); a.div_(2); assert is_copy_of(a, adj)
  a.div_(a.sum(1, true)); // LOOKALIKE: tensor-alias-then-mutate -- the sum allocated a new tensor
  return a;
}
