// Graph / segment primitives for the GNN encoder: segment reductions on top of index_add_ and
// scatter_add_, CSR construction from COO edge lists, a hand-written CSR x dense kernel for
// inference, GCN degree normalisation, a straight-through rounding Function for fake-quantised
// node features and a hard-sigmoid edge gate for learned sparsification.
#include <torch/torch.h>

#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CsrGraph {
  torch::Tensor rowptr;  // [num_nodes + 1], int64
  torch::Tensor col;     // [E], int32 (compact on disk and in the cache)
  torch::Tensor perm;    // [E], int64: COO edge id of every CSR slot
  int64_t num_nodes = 0;
};

// out[index[i]] += src[i] along dim 0, for any trailing shape.
torch::Tensor segment_sum(const torch::Tensor& src, const torch::Tensor& index, int64_t num_segments) {
  auto shape = src.sizes().vec();
  shape[0] = num_segments;
  auto out = torch::zeros(shape, src.options());
  out.index_add_(0, index, src);
  return out;
}

// Same reduction through scatter_add_, which wants the index broadcast to src's shape.
torch::Tensor segment_sum_2d(const torch::Tensor& src, const torch::Tensor& index, int64_t num_segments) {
  auto idx = index.view({-1, 1}).expand_as(src);
  auto out = torch::zeros({num_segments, src.size(1)}, src.options());
  // FACT: s = torch.randn(6, 4); i = torch.tensor([0, 2, 1, 0, 2, 1]).view(-1, 1).expand(6, 4); o = torch.zeros(3, 4); o.scatter_add_(0, i, s); assert torch.allclose(o[0], s[0] + s[3])
  out.scatter_add_(0, idx, src);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is the index, only read
  return out;
}

torch::Tensor segment_mean(const torch::Tensor& src, const torch::Tensor& index, int64_t num_segments) {
  auto sum = segment_sum(src, index, num_segments);
  auto cnt = segment_sum(torch::ones({src.size(0)}, src.options()), index, num_segments).clamp_min(1.0);
  return sum / cnt.view({-1, 1});
}

CsrGraph build_csr(const torch::Tensor& edge_index, int64_t num_nodes) {
  TORCH_CHECK(edge_index.dim() == 2 && edge_index.size(0) == 2, "edge_index must be [2, E]");
  auto row = edge_index.select(0, 0).contiguous();
  auto col = edge_index.select(0, 1);
  const int64_t num_edges = row.size(0);

  auto counts = torch::bincount(row, /*weights=*/{}, num_nodes);
  auto rowptr = torch::zeros({num_nodes + 1}, torch::kLong);
  // FACT: r = torch.zeros(5, dtype=torch.long); c = torch.tensor([1, 0, 2, 3]); r.narrow(0, 1, 4).copy_(c.cumsum(0)); assert r.tolist() == [0, 1, 1, 3, 6]
  rowptr.narrow(0, 1, num_nodes).copy_(counts.cumsum(0));  // LOOKALIKE: tensor-inplace-overlap -- the source is another tensor

  // Bucket fill: every edge goes to the next free slot of its row.
  auto cursor = rowptr.narrow(0, 0, num_nodes).clone();  // LOOKALIKE: tensor-unnecessary-clone -- the cursor is advanced while filling
  auto perm = torch::empty({num_edges}, torch::kLong);
  auto row_a = row.accessor<int64_t, 1>();
  auto cur_a = cursor.accessor<int64_t, 1>();
  auto perm_a = perm.accessor<int64_t, 1>();
  for (int64_t e = 0; e < num_edges; ++e) perm_a[cur_a[row_a[e]]++] = e;

  CsrGraph g;
  g.rowptr = rowptr;
  g.col = col.index_select(0, perm).to(torch::kInt);
  g.perm = perm;
  g.num_nodes = num_nodes;
  return g;
}

// Node offset of every graph in a mini-batch of graphs: exclusive scan of the graph sizes.
torch::Tensor batch_offsets(const torch::Tensor& nodes_per_graph) {
  auto offs = nodes_per_graph.cumsum(0);
  const int64_t num_graphs = offs.size(0);
  // FACT: o = torch.tensor([3, 5, 2, 4]).cumsum(0); assert raises(lambda: o.narrow(0, 1, 3).copy_(o.narrow(0, 0, 3)), "some elements of the input tensor")
  offs.narrow(0, 1, num_graphs - 1).copy_(offs.narrow(0, 0, num_graphs - 1));  // EXPECT: tensor-inplace-overlap
  offs[0] = 0;
  return offs;
}

// y = A x with A in CSR form; plain loops for the CPU inference server (no autograd).
torch::Tensor spmm_csr(const CsrGraph& g, const torch::Tensor& values, const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "spmm_csr: x must be a float matrix");
  auto xc = x.contiguous();
  auto vals = values.to(torch::kFloat).contiguous();
  const int64_t C = xc.size(1);
  auto out = torch::zeros({g.num_nodes, C}, xc.options());
  auto rp = g.rowptr.accessor<int64_t, 1>();
  auto cl = g.col.accessor<int32_t, 1>();
  const float* vp = vals.data_ptr<float>();
  const float* xp = xc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t r = 0; r < g.num_nodes; ++r) {
    float* dst = op + r * C;
    for (int64_t k = rp[r]; k < rp[r + 1]; ++k) {
      const float w = vp[k];
      const float* src = xp + static_cast<int64_t>(cl[k]) * C;
      for (int64_t c = 0; c < C; ++c) dst[c] += w * src[c];
    }
  }
  return out;
}

// D^{-1/2} of a weighted degree vector; isolated nodes get 0.
torch::Tensor sym_norm(const torch::Tensor& deg) {
  // FACT: d = torch.rand(5) + 1; assert shares_storage(d.to(torch.float32), d)
  auto dinv = deg.to(torch::kFloat);
  dinv.pow_(-0.5);  // EXPECT: tensor-alias-then-mutate
  dinv.masked_fill_(torch::isinf(dinv), 0.0);  // EXPECT: tensor-alias-then-mutate -- the second write through the same alias
  return dinv;
}

// Random-walk normalisation w_ij / deg_i, for mean aggregation.
torch::Tensor row_norm(const torch::Tensor& row, const torch::Tensor& weight, int64_t num_nodes) {
  auto deg = segment_sum(weight, row, num_nodes);
  return weight / deg.index_select(0, row).clamp_min(1e-12);
}

// round() forward, clipped identity backward.
struct StraightThroughRound : public torch::autograd::Function<StraightThroughRound> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x) {
    ctx->save_for_backward({x});
    return torch::round(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto x = ctx->get_saved_variables()[0];
    auto g = grad_out[0].clone();  // EXPECT: tensor-unnecessary-clone
    g.masked_fill_(x.abs() > 127.0, 0.0);
    return {g};
  }
};

torch::Tensor fake_quant(const torch::Tensor& x, double scale) {
  return StraightThroughRound::apply(x / scale) * scale;
}

struct QuantizedFeatures {
  torch::Tensor codes;  // int8
  double scale = 1.0;
};

QuantizedFeatures quantize_int8(const torch::Tensor& x) {
  const double scale = x.abs().max().item<double>() / 127.0 + 1e-12;
  auto codes = torch::empty(x.sizes(), torch::kChar);
  codes.copy_((x / scale).round().clamp(-127, 127));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped: whole numbers in int8 range
  return {codes, scale};
}

struct EdgeGate {
  torch::Tensor gate;  // {0, 1} forward, hard-sigmoid gradient
  torch::Tensor soft;  // for the L0-style sparsity penalty
};

EdgeGate hard_edge_gate(const torch::Tensor& logits) {
  auto soft = torch::clamp(logits * 0.2 + 0.5, 0.0, 1.0);
  auto hard = soft.detach();
  hard.round_();  // EXPECT: tensor-inplace-on-detached
  return {soft + (hard - soft.detach()), soft};
}

struct GCNConvImpl : nn::Module {
  GCNConvImpl(int64_t in, int64_t out, bool improved)
      : lin(register_module("lin", nn::Linear(nn::LinearOptions(in, out).bias(false)))), improved_(improved) {
    bias = register_parameter("bias", torch::empty({out}));
    reset_parameters();
  }

  void reset_parameters() {
    nn::init::xavier_uniform_(lin->weight);
    torch::NoGradGuard no_grad;
    bias.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& edge_index, const torch::Tensor& edge_weight) {
    const int64_t n = x.size(0);
    auto loops = torch::arange(n, edge_index.options());
    auto loop_w = torch::ones({1}, edge_weight.options()).expand({n});
    // FACT: l = torch.ones(1).expand(5); assert raises(lambda: l.mul_(2.0), "more than one element")
    if (improved_) loop_w.mul_(2.0);  // EXPECT: tensor-inplace-on-expanded
    auto row = torch::cat({edge_index[0], loops});
    auto col = torch::cat({edge_index[1], loops});
    auto w = torch::cat({edge_weight, loop_w});
    auto dinv = sym_norm(segment_sum(w, col, n));
    auto norm = dinv.index_select(0, row) * w * dinv.index_select(0, col);
    auto h = lin(x);
    return segment_sum(h.index_select(0, row) * norm.unsqueeze(1), col, n) + bias;
  }

  nn::Linear lin;
  torch::Tensor bias;
  bool improved_;
};
TORCH_MODULE(GCNConv);

struct GATConvImpl : nn::Module {
  GATConvImpl(int64_t in, int64_t out, int64_t heads)
      : lin(register_module("lin", nn::Linear(nn::LinearOptions(in, heads * out).bias(false)))),
        heads_(heads), out_(out) {
    att_src = register_parameter("att_src", torch::empty({1, heads, out}));
    att_dst = register_parameter("att_dst", torch::empty({1, heads, out}));
    nn::init::xavier_uniform_(att_src);
    nn::init::xavier_uniform_(att_dst);
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& edge_index) {
    const int64_t n = x.size(0);
    auto src = edge_index[0];
    auto dst = edge_index[1];
    // FACT: l = torch.nn.Linear(6, 8)(torch.randn(5, 6)); assert is_view_of(l.view(5, 2, 4), l)
    auto h = lin(x).view({n, heads_, out_});  // LOOKALIKE: tensor-view-non-contiguous -- Linear output is contiguous
    auto a_src = (h * att_src).sum(-1);
    auto a_dst = (h * att_dst).sum(-1);
    auto e = F::leaky_relu(a_src.index_select(0, src) + a_dst.index_select(0, dst),
                           F::LeakyReLUFuncOptions().negative_slope(0.2));
    auto alpha = (e - e.max().detach()).exp();  // [E, H]
    alpha = alpha / segment_sum(alpha, dst, n).index_select(0, dst).clamp_min(1e-16);
    if (keep_attention) {
      // FACT: a = torch.rand(7, 4); assert raises(lambda: a.t().view(-1), "view size is not compatible")
      last_attention = alpha.detach().t().view({-1});  // EXPECT: tensor-view-non-contiguous
    }
    auto msg = h.index_select(0, src) * alpha.unsqueeze(-1);
    return segment_sum(msg, dst, n).reshape({n, heads_ * out_});
  }

  nn::Linear lin;
  torch::Tensor att_src, att_dst;
  int64_t heads_, out_;
  bool keep_attention = false;
  torch::Tensor last_attention;  // head-major, for the attention visualiser
};
TORCH_MODULE(GATConv);

struct GraphEncoderImpl : nn::Module {
  // Transductive: one fixed graph, one learnable gate logit per edge.
  GraphEncoderImpl(int64_t in, int64_t hidden, int64_t heads, int64_t num_edges)
      : proj(register_module("proj", nn::Linear(in, hidden))),
        conv1(register_module("conv1", GCNConv(hidden, hidden, /*improved=*/true))),
        conv2(register_module("conv2", GCNConv(hidden, hidden, /*improved=*/false))),
        gat(register_module("gat", GATConv(hidden, hidden / heads, heads))) {
    edge_logits = register_parameter("edge_logits", torch::full({num_edges}, 2.0));
  }

  // Edges whose gate stayed closed for a whole epoch are pinned shut.
  void prune(const torch::Tensor& dead) {
    torch::NoGradGuard no_grad;
    edge_logits.masked_fill_(dead, -10.0);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& edge_index) {
    const int64_t n = x.size(0);
    auto gate = hard_edge_gate(edge_logits);
    auto deg = segment_sum(gate.gate, edge_index[1], n);
    auto scale = torch::log1p(deg).add(1.0).reciprocal();
    auto h = torch::relu(proj(x));
    h.mul_(scale.unsqueeze(1));  // EXPECT: tensor-inplace-on-saved
    auto h1 = conv1(h, edge_index, gate.gate);
    h1 += h;  // LOOKALIKE: tensor-inplace-on-saved -- GCNConv ends in an add of the bias, which saves nothing
    h1 = F::elu(h1);
    auto out = gat(h1, edge_index) + conv2(h1, edge_index, gate.gate);
    return {out, gate.soft.mean()};
  }

  nn::Linear proj;
  GCNConv conv1, conv2;
  GATConv gat;
  torch::Tensor edge_logits;
};
TORCH_MODULE(GraphEncoder);

// APPNP: h_{k+1} = (1 - alpha) * A_hat h_k + alpha * h_0, edges in CSR order.
torch::Tensor appnp_propagate(const CsrGraph& g, const torch::Tensor& norm_w, const torch::Tensor& h0, int64_t K,
                              double alpha) {
  auto counts = g.rowptr.narrow(0, 1, g.num_nodes) - g.rowptr.narrow(0, 0, g.num_nodes);
  auto row = torch::repeat_interleave(counts);
  auto h = h0;
  for (int64_t k = 0; k < K; ++k) {
    auto col = g.col.to(torch::kLong);  // EXPECT: tensor-clone-in-loop
    auto msg = h.index_select(0, col) * norm_w.unsqueeze(1);
    h = (1.0 - alpha) * segment_sum(msg, row, g.num_nodes) + alpha * h0;
  }
  return h;
}

// Per-graph max pooling over a batch of graphs stored back to back.
torch::Tensor max_readout(const torch::Tensor& h, const torch::Tensor& nodes_per_graph) {
  auto offs = batch_offsets(nodes_per_graph);
  auto sizes = nodes_per_graph.to(torch::kLong);
  auto offs_a = offs.accessor<int64_t, 1>();
  auto sizes_a = sizes.accessor<int64_t, 1>();
  std::vector<torch::Tensor> pooled;
  for (int64_t b = 0; b < sizes.size(0); ++b) {
    auto block = h.narrow(0, offs_a[b], sizes_a[b]).contiguous();  // LOOKALIKE: tensor-clone-in-loop -- a different graph's rows every iteration
    pooled.push_back(std::get<0>(block.max(0)));
  }
  return torch::stack(pooled);
}
