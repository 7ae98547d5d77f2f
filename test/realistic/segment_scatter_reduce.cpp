// Segment sum / mean over edge messages: index_add on the GPU, a sorted-segment
// CPU fallback, and a hand-written backward. Used by a small message-passing net.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <tuple>
#include <vector>

namespace F = torch::nn::functional;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

namespace segment {

// The GPU path indexes with 32-bit ids to halve index traffic.
struct IndexCache {
  torch::Tensor ids32;

  const torch::Tensor& get(const torch::Tensor& ids) {
    if (!ids32.defined() || ids32.numel() != ids.numel() || ids32.device() != ids.device()) {
      ids32 = torch::empty({ids.numel()}, ids.options().dtype(torch::kInt));
    }
    ids32.copy_(ids);  // EXPECT: tensor-copy-narrowing
    return ids32;
  }
};

IndexCache& index_cache() {
  static thread_local IndexCache cache;
  return cache;
}

// Start offset and length of every segment of a sorted id vector.
std::tuple<torch::Tensor, torch::Tensor> segment_offsets(const torch::Tensor& sorted_ids,
                                                         int64_t num_segments) {
  auto counts = torch::bincount(sorted_ids, {}, num_segments);
  auto starts = counts.cumsum(0);
  // FACT: s = torch.tensor([2, 3, 5, 6]); assert raises(lambda: s.narrow(0, 1, 3).copy_(s.narrow(0, 0, 3)), "some elements of the input tensor")
  starts.narrow(0, 1, num_segments - 1).copy_(starts.narrow(0, 0, num_segments - 1));  // EXPECT: tensor-inplace-overlap
  starts[0] = 0;
  return {starts, counts};
}

torch::Tensor sum_cpu(const torch::Tensor& values, const torch::Tensor& ids,
                      int64_t num_segments, bool sorted) {
  auto out = torch::zeros({num_segments, values.size(1)}, values.options());
  if (!sorted) {
    // FACT: o = torch.zeros(3, 4); i = torch.tensor([0, 2, 1, 0]).view(-1, 1).expand(4, 4); o.scatter_add_(0, i, torch.ones(4, 4)); assert o.sum() == 16
    auto index = ids.view({-1, 1}).expand_as(values);
    out.scatter_add_(0, index, values);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read as the index, the write goes to out
    return out;
  }
  torch::Tensor starts, counts;
  std::tie(starts, counts) = segment_offsets(ids, num_segments);
  for (int64_t s = 0; s < num_segments; ++s) {
    const auto len = counts[s].item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- fallback for CPU tensors only, item() is a plain host read
    if (len == 0) continue;
    auto vals = values.contiguous();  // EXPECT: tensor-clone-in-loop
    out[s] = vals.narrow(0, starts[s].item<int64_t>(), len).sum(0);  // LOOKALIKE: tensor-sync-in-loop -- starts live on the host in this CPU-only path
  }
  return out;
}

}  // namespace segment

class SegmentReduceFn : public torch::autograd::Function<SegmentReduceFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor values, torch::Tensor ids,
                               int64_t num_segments, bool mean, bool sorted) {
    TORCH_CHECK(values.dim() == 2, "segment reduce expects 2-D values");
    TORCH_CHECK(ids.scalar_type() == torch::kLong, "segment ids must be int64");
    TORCH_CHECK(ids.numel() == values.size(0), "one segment id per row");

    torch::Tensor out;
    if (values.is_cuda()) {
      out = torch::zeros({num_segments, values.size(1)}, values.options());
      out.index_add_(0, segment::index_cache().get(ids), values);
    } else {
      out = segment::sum_cpu(values, ids, num_segments, sorted);
    }

    torch::Tensor counts;
    if (mean) {
      counts = torch::bincount(ids.cpu(), {}, num_segments)
                   .clamp_min(1)
                   .unsqueeze(1)
                   .to(values.scalar_type());
      out.div_(counts);  // EXPECT: tensor-device-mismatch
    }
    ctx->save_for_backward({ids});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["counts"] = counts;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    auto ids = ctx->get_saved_variables()[0];
    const bool mean = ctx->saved_data["mean"].toBool();

    auto grad = grad_outputs[0].clone();  // EXPECT: tensor-unnecessary-clone
    if (mean) {
      auto counts = ctx->saved_data["counts"].toTensor().to(grad.device());
      grad.div_(counts);  // LOOKALIKE: tensor-device-mismatch -- counts are moved to the gradient's device first
    }
    auto grad_values = grad.index_select(0, ids);
    return {grad_values, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor segment_reduce(const torch::Tensor& values, const torch::Tensor& ids,
                             int64_t num_segments, bool mean = false, bool sorted = false) {
  return SegmentReduceFn::apply(values, ids, num_segments, mean, sorted);
}

struct CsrGraph {
  torch::Tensor row_ptr, src, dst, perm;

  static CsrGraph from_edges(const torch::Tensor& src, const torch::Tensor& dst, int64_t n) {
    CsrGraph g;
    g.perm = dst.argsort();
    g.src = src.index_select(0, g.perm);
    g.dst = dst.index_select(0, g.perm);
    g.row_ptr = torch::zeros({n + 1}, dst.options());
    // FACT: r = torch.zeros(5, dtype=torch.long); c = torch.tensor([1, 0, 2, 1]); r.narrow(0, 1, 4).copy_(c.cumsum(0)); assert r.tolist() == [0, 1, 1, 3, 4]
    g.row_ptr.narrow(0, 1, n).copy_(torch::bincount(g.dst, {}, n).cumsum(0));  // LOOKALIKE: tensor-inplace-overlap -- cumsum writes a fresh tensor, the copy does not read the buffer it writes
    return g;
  }
};

class EdgeConvImpl : public torch::nn::Module {
 public:
  EdgeConvImpl(int64_t in, int64_t out, int64_t heads, int64_t edge_dim, bool mean)
      : heads_(heads), head_dim_(out / heads), mean_(mean),
        lin(register_module("lin", torch::nn::Linear(in, out))),
        gate(register_module("gate", torch::nn::Linear(edge_dim, heads))),
        out_proj(register_module("out_proj", torch::nn::Linear(out, out))) {
    edge_scale = register_buffer("edge_scale", torch::ones({1}));
  }

  torch::Tensor forward(const torch::Tensor& x, const CsrGraph& g, const torch::Tensor& edge_attr,
                        const torch::Tensor& self_loop) {
    const auto n = x.size(0), e = g.src.size(0);

    // FACT: a = torch.randn(6, 3); assert shares_storage(a.flatten(1), a)
    auto ea = edge_attr.flatten(1);
    ea.mul_(edge_scale);  // EXPECT: tensor-alias-then-mutate
    auto w = torch::sigmoid(gate(ea));
    // FACT: x = torch.randn(3, 2, requires_grad=True); s = torch.sigmoid(x); s.masked_fill_(torch.tensor([[True], [False], [True]]), 1.0); assert backward_fails(lambda: s.sum().backward())
    w.masked_fill_(self_loop.unsqueeze(1), 1.0);  // EXPECT: tensor-inplace-on-saved

    // FACT: l = torch.nn.Linear(8, 8); y = l(torch.randn(5, 8)); assert is_contiguous(y) and is_view_of(y.view(5, 2, 4), y)
    auto h = lin(x).view({n, heads_, head_dim_});  // LOOKALIKE: tensor-view-non-contiguous -- the linear output is freshly allocated and contiguous
    auto msg = h.index_select(0, g.src) * w.unsqueeze(-1);
    // FACT: x = torch.randn(3, 2, requires_grad=True); w = torch.randn(3, 1, requires_grad=True); m = x * w; m.mul_(0.5); m.sum().backward(); assert w.grad is not None
    msg.mul_(1.0 / std::sqrt(static_cast<double>(head_dim_)));  // LOOKALIKE: tensor-inplace-on-saved -- mul saves its operands, not the product
    // FACT: m = torch.randn(7, 2, 4) * torch.randn(7, 2, 1); assert is_view_of(m.reshape(7, 8), m)
    auto agg = segment_reduce(msg.reshape({e, heads_ * head_dim_}), g.dst, n, mean_, /*sorted=*/true);  // LOOKALIKE: tensor-reshape-non-contiguous -- the product is contiguous, reshape is a view
    // The checkpointed out_proj was trained with head-interleaved features.
    // FACT: a = torch.randn(6, 2, 4); assert is_copy_of(a.permute(0, 2, 1).reshape(6, -1), a)
    auto mixed = agg.view({n, heads_, head_dim_}).permute({0, 2, 1}).reshape({n, -1});  // EXPECT: tensor-reshape-non-contiguous
    return torch::relu(out_proj(mixed) + x);
  }

 private:
  int64_t heads_, head_dim_;
  bool mean_;

 public:
  torch::nn::Linear lin, gate, out_proj;
  torch::Tensor edge_scale;
};
TORCH_MODULE(EdgeConv);

class GraphClassifierImpl : public torch::nn::Module {
 public:
  GraphClassifierImpl(int64_t dim, int64_t edge_dim, int64_t classes)
      : conv1(register_module("conv1", EdgeConv(dim, dim, 4, edge_dim, false))),
        conv2(register_module("conv2", EdgeConv(dim, dim, 4, edge_dim, true))),
        head(register_module("head", torch::nn::Linear(dim, classes))) {}

  torch::Tensor forward(const torch::Tensor& x, const CsrGraph& g, const torch::Tensor& edge_attr,
                        const torch::Tensor& self_loop, const torch::Tensor& graph_ids,
                        int64_t num_graphs) {
    auto h = conv1(x, g, edge_attr, self_loop);
    h = conv2(h, g, edge_attr, self_loop);
    auto pooled = segment_reduce(h, graph_ids, num_graphs, /*mean=*/true);
    return head(pooled);
  }

  EdgeConv conv1, conv2;
  torch::nn::Linear head;
};
TORCH_MODULE(GraphClassifier);

struct GraphBatch {
  torch::Tensor x, src, dst, edge_attr, graph_ids, labels;
  int64_t num_graphs;
};

GraphBatch random_batch(int64_t graphs, int64_t nodes_per_graph, int64_t dim, int64_t edge_dim) {
  GraphBatch b;
  b.num_graphs = graphs;
  const auto n = graphs * nodes_per_graph, e = n * 4;
  b.x = torch::randn({n, dim});
  b.graph_ids = torch::arange(graphs, torch::kLong).repeat_interleave(nodes_per_graph);
  auto offset = b.graph_ids.index_select(0, torch::randint(0, n, {e}, torch::kLong)) * nodes_per_graph;
  b.src = offset + torch::randint(0, nodes_per_graph, {e}, torch::kLong);
  b.dst = offset + torch::randint(0, nodes_per_graph, {e}, torch::kLong);
  b.edge_attr = torch::randn({e, edge_dim});
  b.labels = torch::randint(0, 3, {graphs}, torch::kLong);
  return b;
}

void benchmark(torch::Device device) {
  auto values = torch::randn({1 << 16, 64}, torch::TensorOptions().device(device));
  auto ids = torch::randint(0, 1024, {1 << 16}, torch::TensorOptions().dtype(torch::kLong).device(device));
  double checksum = 0.0;
  for (int it = 0; it < 100; ++it) {
    auto out = segment_reduce(values, ids, 1024);
    checksum += out.sum().item<double>();  // EXPECT: tensor-sync-in-loop
  }
  std::cout << "checksum " << checksum << '\n';
}

int main() {
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const int64_t dim = 32, edge_dim = 8;
  GraphClassifier model(dim, edge_dim, 3);
  model->to(device);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));

  auto total_loss = torch::zeros({}, torch::TensorOptions().device(device));
  std::vector<torch::Tensor> predictions;
  const int steps = 300;
  for (int step = 0; step < steps; ++step) {
    auto batch = random_batch(16, 20, dim, edge_dim);
    auto g = CsrGraph::from_edges(batch.src.to(device), batch.dst.to(device), batch.x.size(0));  // LOOKALIKE: tensor-clone-in-loop -- a new batch each step, the transfer cannot be hoisted
    auto edge_attr = batch.edge_attr.to(device).index_select(0, g.perm);
    auto self_loop = g.src == g.dst;

    optimizer.zero_grad();
    auto logits = model->forward(batch.x.to(device), g, edge_attr, self_loop,
                                 batch.graph_ids.to(device), batch.num_graphs);
    auto loss = F::cross_entropy(logits, batch.labels.to(device));
    loss.backward();
    optimizer.step();

    total_loss = total_loss + loss;  // EXPECT: tensor-graph-kept-across-iterations
    predictions.push_back(logits.argmax(1));  // LOOKALIKE: tensor-graph-kept-across-iterations -- argmax yields integer indices with no graph
  }
  std::cout << "mean loss " << (total_loss / steps).item<double>() << '\n';
  auto all_preds = torch::cat(predictions).cpu();
  std::cout << "class histogram " << torch::bincount(all_preds, {}, 3) << '\n';

  benchmark(device);
  return 0;
}
