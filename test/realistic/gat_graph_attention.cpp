// Graph attention network (Velickovic et al. 2018) for transductive node classification on a
// citation graph (Cora / Citeseer style): TF-IDF features, edge-index gathers, per-edge LeakyReLU
// scores, a scatter softmax over the incoming edges of every node, independent attention heads
// that are concatenated in the hidden layer and averaged in the output layer, and full-batch
// training on the GPU with early stopping on the validation loss.
#include <torch/torch.h>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct GATConfig {
  int64_t in_dim = 1433, hidden = 8, heads = 8, out_heads = 1, num_classes = 7;
  double negative_slope = 0.2, feat_drop = 0.6, attn_drop = 0.6, input_noise = 0.01;
  double lr = 5e-3, weight_decay = 5e-4;
  int64_t epochs = 1000, patience = 100, eval_every = 5;
};

struct Graph {
  torch::Tensor x;                            // [N, F] word counts
  torch::Tensor edge_index;                   // [2, E] int64, row 0 = source, row 1 = target
  torch::Tensor y;                            // [N] int64
  torch::Tensor train_idx, val_idx, test_idx; // int64 node ids
};

// TF-IDF weighting of the bag-of-words counts, then unit rows.
torch::Tensor tfidf_features(const Graph &g) {
  auto x = g.x;
  const auto N = x.size(0);
  auto df = (x > 0).sum(0).to(torch::kFloat);
  // FACT: x = torch.rand(4, 3); c = (x > 0.5).sum(0); f = c.to(torch.float); f.add_(1.0); assert c.dtype == torch.int64 and is_copy_of(f, c)
  df.add_(1.0); // LOOKALIKE: tensor-alias-then-mutate -- the int64 counts are converted: to(kFloat) made a new tensor
  auto idf = torch::log((N + 1.0) / df) + 1.0;
  // FACT: x = torch.rand(4, 3); g = {'x': x}; f = g['x']; before = x.clone(); f.mul_(torch.tensor([2.0, 3.0, 4.0])); assert shares_storage(f, x) and not torch.equal(x, before)
  x.mul_(idf); // EXPECT: tensor-alias-then-mutate -- 'x' is the graph's own count matrix: every call weights the caller's features again
  return F::normalize(x, F::NormalizeFuncOptions().p(2).dim(1));
}

torch::Tensor add_self_loops(const torch::Tensor &edge_index, int64_t num_nodes) {
  auto loops = torch::arange(num_nodes, edge_index.options()).unsqueeze(0).repeat({2, 1}); // LOOKALIKE: tensor-device-mismatch -- made with the edge list's options
  return torch::cat({edge_index, loops}, 1);
}

// Softmax of per-edge scores [E] over the incoming edges of every target node.
torch::Tensor edge_softmax(const torch::Tensor &scores, const torch::Tensor &dst, int64_t num_nodes) {
  auto node_max = torch::full({num_nodes}, -std::numeric_limits<float>::infinity(), scores.options());
  node_max.scatter_reduce_(0, dst, scores.detach(), "amax", /*include_self=*/false);
  auto alpha = torch::exp(scores - node_max.index_select(0, dst));
  auto denom = torch::zeros({num_nodes}, scores.options()).index_add_(0, dst, alpha);
  // FACT: e = torch.randn(6, requires_grad=True); d = torch.tensor([0, 1, 1, 2, 2, 2]); a = torch.exp(e); a.div_(torch.zeros(3).index_add_(0, d, a).index_select(0, d) + 1e-16); assert backward_fails(lambda: a.sum().backward())
  alpha.div_(denom.index_select(0, dst) + 1e-16); // EXPECT: tensor-inplace-on-saved -- exp saved its result for backward
  return alpha;
}

// One attention head: h = W x, e_ij = LeakyReLU(a_src . h_j + a_dst . h_i) for the edge j -> i.
struct GATHeadImpl : torch::nn::Module {
  GATHeadImpl(int64_t in, int64_t out, const GATConfig &cfg) : slope_(cfg.negative_slope), attn_drop_(cfg.attn_drop) {
    lin_ = register_module("lin", torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
    att_src_ = register_parameter("att_src", torch::empty({out}));
    att_dst_ = register_parameter("att_dst", torch::empty({out}));
    // FACT: p = torch.nn.Parameter(torch.empty(4)); torch.nn.init.normal_(p, 0.0, 0.1); assert p.is_leaf and p.requires_grad
    torch::nn::init::normal_(att_src_, 0.0, 0.1); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    torch::nn::init::normal_(att_dst_, 0.0, 0.1);
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &edge_index) {
    const auto N = x.size(0);
    auto src = edge_index[0], dst = edge_index[1];
    auto h = lin_(x); // [N, C]
    auto e = torch::leaky_relu(torch::mv(h, att_src_).index_select(0, src) + torch::mv(h, att_dst_).index_select(0, dst), slope_);
    auto alpha = torch::dropout(edge_softmax(e, dst, N), attn_drop_, is_training());
    auto msg = h.index_select(0, src) * alpha.unsqueeze(1); // [E, C]
    auto out = torch::zeros({N, h.size(1)}, h.options()); // LOOKALIKE: tensor-device-mismatch -- made with h's options
    // FACT: h = torch.randn(3, 2, requires_grad=True); m = h.index_select(0, torch.tensor([0, 2, 1])) * 0.5; o = torch.zeros(3, 2); o.index_add_(0, torch.tensor([1, 1, 0]), m); o.sum().backward(); assert h.grad is not None
    out.index_add_(0, dst, msg); // LOOKALIKE: tensor-inplace-on-saved -- a fresh buffer nothing saved
    return out;
  }

  double slope_, attn_drop_;
  torch::nn::Linear lin_{nullptr};
  torch::Tensor att_src_, att_dst_;
};
TORCH_MODULE(GATHead);

// H independent heads, stacked to [H, N, C]: concatenated to [N, H*C] or averaged to [N, C].
struct GATLayerImpl : torch::nn::Module {
  GATLayerImpl(int64_t in, int64_t out, int64_t heads, bool concat, const GATConfig &cfg) : concat_(concat) {
    for (int64_t k = 0; k < heads; ++k)
      heads_.push_back(register_module("head" + std::to_string(k), GATHead(in, out, cfg)));
    bias_ = register_parameter("bias", torch::zeros({concat ? heads * out : out}));
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &edge_index) {
    std::vector<torch::Tensor> outs;
    for (auto &head : heads_)
      outs.push_back(head->forward(x, edge_index)); // LOOKALIKE: tensor-graph-kept-across-iterations -- the heads are stacked into this layer's output
    auto stacked = torch::stack(outs); // [H, N, C]
    if (!concat_)
      return stacked.mean(0) + bias_;
    const auto N = x.size(0);
    // FACT: s = torch.randn(3, 5, 4); assert is_copy_of(s.permute(1, 0, 2).reshape(5, -1), s)
    return stacked.permute({1, 0, 2}).reshape({N, -1}) + bias_; // EXPECT: tensor-reshape-non-contiguous -- node-major concat of head-major outputs copies every forward
  }

  bool concat_;
  std::vector<GATHead> heads_;
  torch::Tensor bias_;
};
TORCH_MODULE(GATLayer);

struct GATImpl : torch::nn::Module {
  explicit GATImpl(const GATConfig &cfg) : feat_drop_(cfg.feat_drop) {
    l1_ = register_module("l1", GATLayer(cfg.in_dim, cfg.hidden, cfg.heads, true, cfg));
    l2_ = register_module("l2", GATLayer(cfg.hidden * cfg.heads, cfg.num_classes, cfg.out_heads, false, cfg));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor &edge_index) {
    x = torch::dropout(x, feat_drop_, is_training());
    x = torch::elu(l1_(x, edge_index));
    x = torch::dropout(x, feat_drop_, is_training());
    return torch::log_softmax(l2_(x, edge_index), 1);
  }
  double feat_drop_;
  GATLayer l1_{nullptr}, l2_{nullptr};
};
TORCH_MODULE(GAT);

double accuracy(const torch::Tensor &logp, const torch::Tensor &y, const torch::Tensor &idx) {
  auto pred = logp.index_select(0, idx).argmax(1);
  return pred.eq(y.index_select(0, idx)).to(torch::kFloat).mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- called once, after training
}

void train(GAT &model, const Graph &g, const GATConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  const auto N = g.x.size(0);
  auto x = tfidf_features(g).to(device);
  auto edge_index = add_self_loops(g.edge_index, N).to(device);
  auto y = g.y.to(device);
  auto train_idx = g.train_idx.to(device), val_idx = g.val_idx.to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));

  std::vector<torch::Tensor> val_curve;
  double best_val = std::numeric_limits<double>::infinity(), loss_sum = 0.0;
  int64_t since_best = 0;
  for (int64_t epoch = 1; epoch <= cfg.epochs; ++epoch) {
    model->train();
    auto noisy = x + cfg.input_noise * torch::randn({N, x.size(1)}); // EXPECT: tensor-device-mismatch -- the noise is drawn on the CPU, x lives on the GPU
    auto logp = model->forward(noisy, edge_index);
    auto loss = F::nll_loss(logp.index_select(0, train_idx), y.index_select(0, train_idx));
    opt.zero_grad();
    loss.backward();
    opt.step();
    loss_sum += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- every step waits for the GPU, only to sum

    if (epoch % cfg.eval_every != 0) continue;
    model->eval();
    auto val_logp = model->forward(x, edge_index);
    auto val_loss = F::nll_loss(val_logp.index_select(0, val_idx), y.index_select(0, val_idx));
    // FACT: m = torch.nn.Linear(3, 2); m.eval(); curve = [torch.nn.functional.mse_loss(m(torch.randn(5, 3)), torch.zeros(5, 2)) for _ in range(4)]; assert all(v.requires_grad for v in curve) and kept_nodes(curve) > kept_nodes(curve[:1])
    val_curve.push_back(val_loss); // EXPECT: tensor-graph-kept-across-iterations -- the eval pass runs with grad on: every entry keeps its graph
    const double v = val_loss.item<double>(); // LOOKALIKE: tensor-sync-in-loop -- the value steers early stopping
    std::cout << "epoch " << epoch << " train " << loss_sum / epoch << " val " << v << "\n";
    if (v < best_val) {
      best_val = v;
      since_best = 0;
    } else if ((since_best += cfg.eval_every) >= cfg.patience) {
      break;
    }
  }
  auto curve = torch::stack(val_curve).cpu();
  std::cout << "best val loss " << curve.min().item<double>() << " after " << curve.size(0) << " evaluations\n";

  torch::NoGradGuard no_grad;
  model->eval();
  auto logp = model->forward(x, edge_index);
  std::cout << "test accuracy " << accuracy(logp, y, g.test_idx.to(device)) << "\n";
}

// Attention weights of the first head of the first layer, for inspection: one row per edge.
torch::Tensor first_head_attention(GAT &model, const torch::Tensor &x, const torch::Tensor &edge_index) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto &head = model->l1_->heads_.front();
  auto h = head->lin_(x);
  auto src = edge_index[0], dst = edge_index[1];
  auto e = torch::leaky_relu(torch::mv(h, head->att_src_).index_select(0, src) + torch::mv(h, head->att_dst_).index_select(0, dst),
                             head->slope_);
  auto alpha = edge_softmax(e, dst, x.size(0));
  // FACT: a = torch.rand(6); s = torch.stack([torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([0, 0, 1, 1, 2, 2])], 0).t(); r = torch.cat([s.to(torch.float), a.unsqueeze(1)], 1); assert is_view_of(r.view(-1), r)
  return torch::cat({edge_index.t().to(torch::kFloat), alpha.unsqueeze(1)}, 1).view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- cat writes a fresh contiguous tensor
}
