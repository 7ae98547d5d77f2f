// CSR sparse x dense matmul as a custom autograd op, used by a two-layer GCN with
// learnable edge weights. On CPU the forward walks the CSR rows with accessors;
// on other devices, or when the adjacency is dense enough, it falls back to a
// dense adjacency and a plain mm. Backward: d(values) by SDDMM, d(dense) = A^T g.
#include <torch/torch.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <utility>
#include <vector>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
namespace F = torch::nn::functional;

struct GcnConfig {
  int64_t num_nodes = 2000;
  int64_t num_edges = 8000;
  int64_t in_dim = 64;
  int64_t hidden = 64;
  int64_t classes = 7;
  double dropout = 0.5;
  double dense_threshold = 0.05;
  int64_t epochs = 100;
  int64_t sgc_hops = 2;
  double lr = 1e-2;
};

struct CsrGraph {
  torch::Tensor crow, col, val;
  int64_t num_nodes = 0;

  CsrGraph to(torch::Device device) const {
    return {crow.to(device), col.to(device), val.to(device), num_nodes};
  }
};

// Undirected edge list (each edge once) -> CSR with both directions and self loops.
CsrGraph build_csr(const torch::Tensor& edge_index, int64_t n) {
  auto loops = torch::arange(n, edge_index.options());
  auto src = torch::cat({edge_index[0], edge_index[1], loops});
  auto dst = torch::cat({edge_index[1], edge_index[0], loops});
  auto order = std::get<1>((src * n + dst).sort());
  src = src.index_select(0, order);
  dst = dst.index_select(0, order);
  auto counts = torch::bincount(src, {}, n);
  auto crow = torch::zeros({n + 1}, src.options());
  // FACT: c = torch.zeros(5, dtype=torch.long); s = torch.tensor([1, 2, 3, 4]).cumsum(0); c.narrow(0, 1, 4).copy_(s); assert is_copy_of(s, c) and c.tolist() == [0, 1, 3, 6, 10]
  crow.narrow(0, 1, n).copy_(counts.cumsum(0));  // LOOKALIKE: tensor-inplace-overlap -- the source is a fresh cumsum, not a shifted slice of crow
  return {crow, dst, torch::ones({dst.numel()}), n};
}

torch::Tensor csr_row_ids(const torch::Tensor& crow, int64_t nnz) {
  auto rows = torch::arange(crow.size(0) - 1, crow.options());
  return torch::repeat_interleave(rows, crow.diff(), 0, nnz);
}

torch::Tensor csr_to_dense(const torch::Tensor& crow, const torch::Tensor& col,
                           const torch::Tensor& val, int64_t n_cols) {
  return torch::sparse_csr_tensor(crow, col, val, {crow.size(0) - 1, n_cols}, val.options())
      .to_dense();
}

torch::Tensor spmm_csr_cpu(const torch::Tensor& crow, const torch::Tensor& col,
                           const torch::Tensor& val, const torch::Tensor& dense) {
  const int64_t rows = crow.size(0) - 1, k = dense.size(1);
  auto out = torch::zeros({rows, k}, dense.options());
  auto cr = crow.accessor<int64_t, 1>();
  auto ci = col.accessor<int64_t, 1>();
  auto v = val.accessor<float, 1>();
  auto d = dense.accessor<float, 2>();
  auto o = out.accessor<float, 2>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t p = cr[r]; p < cr[r + 1]; ++p) {
        const float w = v[p];
        const int64_t c = ci[p];
        for (int64_t j = 0; j < k; ++j) o[r][j] += w * d[c][j];
      }
    }
  });
  return out;
}

class CsrSpmm : public torch::autograd::Function<CsrSpmm> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor crow, torch::Tensor col,
                               torch::Tensor val, torch::Tensor dense, double dense_threshold) {
    ctx->save_for_backward({crow, col, val, dense});
    const int64_t rows = crow.size(0) - 1;
    const double density =
        static_cast<double>(val.numel()) / static_cast<double>(rows * dense.size(0));
    if (density > dense_threshold || !dense.device().is_cpu()) {
      return torch::mm(csr_to_dense(crow, col, val, dense.size(0)), dense);
    }
    return spmm_csr_cpu(crow, col, val, dense.contiguous());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto crow = saved[0], col = saved[1], val = saved[2], dense = saved[3];
    auto grad_out = grad_outputs[0].clone();  // EXPECT: tensor-unnecessary-clone
    auto row = csr_row_ids(crow, col.numel());
    auto g_rows = grad_out.index_select(0, row);
    auto grad_val = (g_rows * dense.index_select(0, col)).sum(1);
    auto grad_dense = torch::zeros_like(dense);
    grad_dense.index_add_(0, col, g_rows * val.unsqueeze(1));  // LOOKALIKE: tensor-device-mismatch -- grad_dense is zeros_like(dense), on the same device as col and g_rows
    return {torch::Tensor(), torch::Tensor(), grad_val, grad_dense, torch::Tensor()};
  }
};

class GcnConvImpl : public torch::nn::Module {
 public:
  GcnConvImpl(int64_t in, int64_t out, const torch::Tensor& degree, double dense_threshold)
      : lin(register_module("lin", torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)))),
        threshold_(dense_threshold) {
    bias = register_parameter("bias", torch::zeros({out}));
    inv_deg_ = degree.to(torch::kFloat).clamp_min(1.0).reciprocal().unsqueeze(1);
  }

  torch::Tensor forward(const torch::Tensor& x, const CsrGraph& g, const torch::Tensor& edge_w) {
    auto out = CsrSpmm::apply(g.crow, g.col, edge_w, lin(x), threshold_);
    out.mul_(inv_deg_);  // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-inplace-on-saved -- CsrSpmm saves its inputs, not its output
    return out + bias;
  }

  torch::nn::Linear lin;
  torch::Tensor bias;

 private:
  torch::Tensor inv_deg_;
  double threshold_;
};
TORCH_MODULE(GcnConv);

class GcnNetImpl : public torch::nn::Module {
 public:
  GcnNetImpl(const GcnConfig& cfg, const torch::Tensor& degree, int64_t nnz)
      : conv1(register_module("conv1", GcnConv(cfg.in_dim, cfg.hidden, degree, cfg.dense_threshold))),
        conv2(register_module("conv2", GcnConv(cfg.hidden, cfg.classes, degree, cfg.dense_threshold))),
        p_(cfg.dropout) {
    edge_logit = register_parameter("edge_logit", torch::empty({nnz}));
    torch::nn::init::constant_(edge_logit, 3.0);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under a NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& x, const CsrGraph& g, const torch::Tensor& edge_w) {
    auto h = torch::relu(conv1(x, g, edge_w));
    if (is_training()) {
      auto keep = torch::bernoulli(torch::full_like(h, 1.0 - p_));
      h.mul_(keep.div_(1.0 - p_));  // EXPECT: tensor-inplace-on-saved
    }
    return conv2(h, g, edge_w);
  }

  GcnConv conv1, conv2;
  torch::Tensor edge_logit;

 private:
  double p_;
};
TORCH_MODULE(GcnNet);

// Share of edges the gate has pushed below the threshold.
double pruned_fraction(const torch::Tensor& edge_w, double threshold) {
  auto w = edge_w.detach();
  w.masked_fill_(w < threshold, 0.0);  // EXPECT: tensor-inplace-on-detached
  return w.eq(0).to(torch::kFloat).mean().item<double>();
}

torch::Tensor accuracy(GcnNet& model, const torch::Tensor& x, const CsrGraph& g,
                       const torch::Tensor& y, const torch::Tensor& idx) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto pred = model->forward(x, g, torch::sigmoid(model->edge_logit)).argmax(1);
  model->train();
  return pred.index_select(0, idx).eq(y.index_select(0, idx)).to(torch::kFloat).mean();
}

// SGC baseline features: k hops of propagation over the structure-only graph.
torch::Tensor sgc_features(const CsrGraph& g_cpu, const torch::Tensor& x, int64_t hops) {
  torch::NoGradGuard no_grad;
  auto deg = g_cpu.crow.diff().to(x.device()).to(torch::kFloat).unsqueeze(1);
  // FACT: x = torch.randn(4, 3); h = x; h = h / 2; assert is_copy_of(h, x)
  torch::Tensor h = x;
  for (int64_t k = 0; k < hops; ++k) {
    h = CsrSpmm::apply(g_cpu.crow.to(h.device()), g_cpu.col.to(h.device()), g_cpu.val.to(h.device()), h, 1.0);  // EXPECT: tensor-clone-in-loop
    h = h / deg;  // LOOKALIKE: tensor-alias-then-mutate -- h is rebound to a new tensor, x is never written
  }
  return h;
}

// Dense reference for the kernel check (small graphs only).
struct DenseReference {
  torch::Tensor adj;

  torch::Tensor propagate(const torch::Tensor& x) const {
    // FACT: a = torch.zeros(3, 3); b = a; b.diagonal().add_(1.0); assert a.trace().item() == 3.0 and shares_storage(a, b)
    torch::Tensor a_hat = adj;
    a_hat.diagonal().add_(1.0);  // EXPECT: tensor-alias-then-mutate
    return torch::mm(a_hat, x) / a_hat.sum(1, true);
  }
};

DenseReference make_reference(const torch::Tensor& edge_index, int64_t n) {
  DenseReference ref;
  ref.adj = torch::zeros({n, n});
  ref.adj.index_put_({edge_index[0], edge_index[1]}, torch::ones({edge_index.size(1)}), /*accumulate=*/true);
  // FACT: a = torch.rand(4, 4); assert raises(lambda: a.add_(a.t()), "refer to a single memory location")
  ref.adj.add_(ref.adj.t());  // EXPECT: tensor-inplace-overlap
  return ref;
}

bool check_against_dense(const CsrGraph& g, const DenseReference& ref, int64_t dim) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({g.num_nodes, dim});
  auto deg = g.crow.diff().to(torch::kFloat).unsqueeze(1);
  auto got = CsrSpmm::apply(g.crow, g.col, g.val, x, 1.0) / deg;
  return torch::allclose(got, ref.propagate(x), 1e-4, 1e-5);
}

// Index arrays for the serving runtime, which takes int32 CSR.
std::pair<torch::Tensor, torch::Tensor> export_int32_indices(const CsrGraph& g) {
  auto crow32 = torch::empty({g.crow.numel()}, torch::kInt);
  auto col32 = torch::empty({g.col.numel()}, torch::kInt);
  crow32.copy_(g.crow);  // EXPECT: tensor-copy-narrowing
  col32.copy_(g.col.to(torch::kInt));  // LOOKALIKE: tensor-copy-narrowing -- the int64 -> int32 conversion is spelled out
  return {crow32, col32};
}

int main() {
  torch::manual_seed(0);
  GcnConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const int64_t n = cfg.num_nodes;

  auto labels = torch::randint(cfg.classes, {n}, torch::kLong);
  auto feats = torch::randn({n, cfg.in_dim});
  feats.narrow(1, 0, cfg.classes).add_(torch::one_hot(labels, cfg.classes).to(torch::kFloat) * 2.0);
  auto edge_index = torch::randint(n, {2, cfg.num_edges}, torch::kLong);

  CsrGraph graph_cpu = build_csr(edge_index, n);
  if (!check_against_dense(graph_cpu, make_reference(edge_index, n), 16)) {
    std::fprintf(stderr, "CsrSpmm disagrees with the dense reference\n");
  }
  CsrGraph graph = graph_cpu.to(device);
  auto x = feats.to(device);
  auto y = labels.to(device);
  auto perm = torch::randperm(n, torch::kLong).to(device);
  auto train_idx = perm.narrow(0, 0, n / 2), val_idx = perm.narrow(0, n / 2, n / 4);

  GcnNet model(cfg, graph_cpu.crow.diff(), graph_cpu.col.numel());
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(5e-4));
  std::vector<torch::Tensor> epoch_losses, val_accs;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    opt.zero_grad();
    auto edge_w = torch::sigmoid(model->edge_logit);
    auto logits = model->forward(x, graph, edge_w);
    auto loss = F::cross_entropy(logits.index_select(0, train_idx), y.index_select(0, train_idx));
    if (epoch % 20 == 0) {
      std::printf("epoch %lld pruned %.3f\n", static_cast<long long>(epoch), pruned_fraction(edge_w, 0.05));
    }
    loss.backward();
    opt.step();
    {
      torch::NoGradGuard no_grad;
      model->edge_logit.data().clamp_(-6.0, 6.0);  // LOOKALIKE: tensor-inplace-on-detached -- deliberate projection of the parameter after the step; no graph is alive
    }
    epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    val_accs.push_back(accuracy(model, x, graph, y, val_idx));  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard, carries no graph
  }
  std::printf("final loss %.4f val acc %.3f\n", epoch_losses.back().item<double>(),
              val_accs.back().item<double>());

  auto sgc = sgc_features(graph_cpu, x, cfg.sgc_hops);
  auto exported = export_int32_indices(graph_cpu);
  std::printf("sgc features %lld x %lld, exported nnz %lld\n", static_cast<long long>(sgc.size(0)),
              static_cast<long long>(sgc.size(1)), static_cast<long long>(exported.second.numel()));
  return 0;
}
