// Node classification with message passing over an edge list: GCN layers, a multi-head GAT layer, full-batch training.
#include <torch/torch.h>
#include <iostream>

// Symmetric normalisation D^-1/2 A D^-1/2 as one weight per edge (edge_index is [2, E], int64).
torch::Tensor gcn_edge_weight(const torch::Tensor &edge_index, int64_t num_nodes) {
  auto src = edge_index[0], dst = edge_index[1];
  auto num_edges = edge_index.size(1);
  auto opts = torch::TensorOptions().device(edge_index.device());
  auto deg = torch::zeros({num_nodes}, opts).index_add_(0, dst, torch::ones({num_edges}, opts));
  auto dinv = deg.pow(-0.5);
  // FACT: d = torch.tensor([0., 4.]); di = d.pow(-0.5); di.masked_fill_(torch.isinf(di), 0); assert is_copy_of(di, d) and d[0] == 0
  dinv.masked_fill_(torch::isinf(dinv), 0); // LOOKALIKE: tensor-alias-then-mutate -- pow returns a new tensor: deg is untouched
  // Unweighted graph: every edge weighs one, without a buffer per edge.
  auto edge_weight = torch::ones({1}, opts).expand({num_edges});
  // FACT: w = torch.ones(1).expand(5); assert raises(lambda: w.mul_(torch.rand(5)), "more than one element of the written-to tensor")
  edge_weight.mul_(dinv.index_select(0, src) * dinv.index_select(0, dst)); // EXPECT: tensor-inplace-on-expanded
  return edge_weight;
}

// Mean of the incoming messages per node (isolated nodes get zeros).
torch::Tensor scatter_mean(const torch::Tensor &msg, const torch::Tensor &index, int64_t num_nodes) {
  auto idx = index.unsqueeze(1).expand_as(msg);
  // FACT: i = torch.tensor([1, 2, 0]); m = torch.rand(3, 4); s = torch.zeros(3, 4); s.scatter_add_(0, i.unsqueeze(1).expand_as(m), m); assert torch.allclose(s[1], m[0])
  auto sum = torch::zeros({num_nodes, msg.size(1)}, msg.options()).scatter_add_(0, idx, msg); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded index is only read
  auto count = torch::zeros({num_nodes}, msg.options()).index_add_(0, index, torch::ones({index.size(0)}, msg.options()));
  return sum / count.clamp_min(1).unsqueeze(1);
}

struct GCNLayerImpl : torch::nn::Module {
  GCNLayerImpl(int64_t in, int64_t out) { lin_ = register_module("lin", torch::nn::Linear(in, out)); }

  // x: [N, F]; messages flow src -> dst, self loops added by starting from the node's own features.
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &edge_index, const torch::Tensor &w) {
    auto h = lin_(x);
    auto msg = h.index_select(0, edge_index[0]) * w.unsqueeze(1);
    auto out = h;
    // FACT: h = torch.zeros(3, 2); out = h; out.index_add_(0, torch.tensor([0]), torch.ones(1, 2)); assert shares_storage(out, h) and h[0, 0] == 1
    out.index_add_(0, edge_index[1], msg); // EXPECT: tensor-alias-then-mutate -- 'h' is read again below for the skip term
    return out + 0.1 * h;
  }
  torch::nn::Linear lin_{nullptr};
};
TORCH_MODULE(GCNLayer);

struct GATLayerImpl : torch::nn::Module {
  GATLayerImpl(int64_t in, int64_t out, int64_t heads) : heads_(heads) {
    fc_ = register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(in, heads * out).bias(false)));
    att_ = register_parameter("att", torch::randn({heads, 1, 2 * out}) * 0.1);
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &edge_index) {
    auto n = x.size(0);
    auto src = edge_index[0], dst = edge_index[1];
    // FACT: l = torch.nn.Linear(3, 8); h = l(torch.randn(5, 3)); assert is_view_of(h.view(5, 2, -1), h)
    auto h = fc_(x).view({n, heads_, -1}).transpose(0, 1); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous
    auto pair = torch::cat({h.index_select(1, src), h.index_select(1, dst)}, -1); // [heads, E, 2F]
    auto logits = torch::leaky_relu((pair * att_).sum(-1), 0.2);                  // [heads, E]
    auto alpha = (logits - logits.max()).exp();
    auto denom = torch::zeros({heads_, n}, alpha.options()).index_add_(1, dst, alpha);
    alpha = alpha / denom.index_select(1, dst);
    auto msg = h.index_select(1, src) * alpha.unsqueeze(-1);                       // [heads, E, F]
    auto agg = torch::zeros({heads_, n, h.size(2)}, h.options()).index_add_(1, dst, msg); // [heads, N, F]
    auto node_major = agg.transpose(0, 1);                                          // [N, heads, F]
    // FACT: a = torch.rand(2, 5, 3); assert raises(lambda: a.transpose(0, 1).view(5, -1), "view size is not compatible")
    return node_major.view({n, -1}); // EXPECT: tensor-view-non-contiguous -- concatenating the heads merges dims the transpose separated
  }
  int64_t heads_;
  torch::nn::Linear fc_{nullptr};
  torch::Tensor att_;
};
TORCH_MODULE(GATLayer);

struct GNNImpl : torch::nn::Module {
  GNNImpl(int64_t in, int64_t hidden, int64_t classes, int64_t heads) {
    conv1_ = register_module("conv1", GCNLayer(in, hidden));
    conv2_ = register_module("conv2", GCNLayer(hidden, hidden));
    gat_ = register_module("gat", GATLayer(hidden, hidden / heads, heads));
    cls_ = register_module("cls", torch::nn::Linear(hidden, classes));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &edge_index, const torch::Tensor &w) {
    auto h0 = torch::relu(conv1_->forward(x, edge_index, w));
    auto h = torch::dropout(h0, 0.5, is_training());
    auto h1 = torch::relu(conv2_->forward(h, edge_index, w));
    // FACT: m = torch.nn.Linear(3, 3); h1 = torch.relu(m(torch.randn(4, 3))); h1 += torch.ones(4, 3); assert backward_fails(lambda: h1.sum().backward())
    h1 += h0; // EXPECT: tensor-inplace-on-saved -- relu saved its result; the residual belongs before the relu or out of place
    return cls_(torch::elu(gat_->forward(h1, edge_index)));
  }
  GCNLayer conv1_{nullptr}, conv2_{nullptr};
  GATLayer gat_{nullptr};
  torch::nn::Linear cls_{nullptr};
};
TORCH_MODULE(GNN);

// The model's input is [x, mean of the neighbours' x] (features propagated once, before training).
void train(GNN &model, const torch::Tensor &x, const torch::Tensor &edge_index, const torch::Tensor &y,
           const torch::Tensor &train_idx,
           const torch::Tensor &val_idx, int epochs, int eval_every, int patience) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  model->to(device);
  auto ei = edge_index.to(device), ys = y.to(device), tidx = train_idx.to(device), vidx = val_idx.to(device);
  auto xs = x.to(device);
  xs = torch::cat({xs, scatter_mean(xs.index_select(0, ei[0]), ei[1], xs.size(0))}, 1);
  auto w = gcn_edge_weight(ei, xs.size(0));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01).weight_decay(5e-4));
  double acc_sum = 0, best = 0;
  int bad = 0;
  for (int e = 0; e < epochs; ++e) {
    model->train();
    auto logits = model->forward(xs, ei, w);
    auto loss = torch::cross_entropy_loss(logits.index_select(0, tidx), ys.index_select(0, tidx));
    opt.zero_grad();
    loss.backward();
    opt.step();
    auto correct = logits.argmax(1).eq(ys);
    auto acc = correct.index_select(0, tidx).to(torch::kFloat).mean();
    acc_sum += acc.item<double>(); // EXPECT: tensor-sync-in-loop -- a CUDA value waited for every epoch, only summed
    if (e % eval_every == 0) {
      double val_acc = correct.index_select(0, vidx).to(torch::kFloat).mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- every eval_every epochs, and it steers early stopping
      if (val_acc > best) {
        best = val_acc;
        bad = 0;
      } else if (++bad > patience) {
        break;
      }
    }
  }
  std::cout << "mean train acc " << acc_sum / epochs << " best val " << best << "\n";
}
