// Graph attention network whose edge softmax is a custom autograd Function
// normalising attention logits over the incoming edges of each node.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <utility>
#include <vector>

namespace gnn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Graph {
  torch::Tensor x, y;
  torch::Tensor edge_index;  // row 0: source, row 1: target
  torch::Tensor edge_weight;
  torch::Tensor train_mask, val_mask;
  int64_t num_nodes = 0;

  Graph to(torch::Device d) const {
    return {x.to(d), y.to(d), edge_index.to(d), edge_weight.to(d), train_mask.to(d), val_mask.to(d), num_nodes};
  }
};

struct GraphConfig {
  int64_t nodes = 600, features = 64, classes = 5, avg_degree = 6;
  bool undirected = true;
};

torch::Tensor segment_sum(const torch::Tensor& src, const torch::Tensor& index, int64_t n) {
  auto idx = index.view({-1, 1}).expand_as(src);
  // FACT: not raises(lambda: torch.zeros(3, 2).scatter_add_(0, torch.tensor([0, 2, 2, 1]).view(-1, 1).expand(4, 2), torch.ones(4, 2)))
  return torch::zeros({n, src.size(1)}, src.options()).scatter_add_(0, idx, src);  // LOOKALIKE: tensor-inplace-on-expanded -- only the index is expanded; the written tensor is fresh
}

torch::Tensor segment_max(const torch::Tensor& src, const torch::Tensor& index, int64_t n) {
  const float lowest = -std::numeric_limits<float>::infinity();
  auto out = torch::full({1, src.size(1)}, lowest, src.options()).expand({n, src.size(1)});
  // FACT: raises(lambda: torch.full((1, 2), float('-inf')).expand(5, 2).index_reduce_(0, torch.tensor([0, 3]), torch.ones(2, 2), 'amax'), "more than one element")
  return out.index_reduce_(0, index, src, "amax");  // EXPECT: tensor-inplace-on-expanded
}

struct SegmentSoftmax : public torch::autograd::Function<SegmentSoftmax> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor src, torch::Tensor index, int64_t n) {
    auto e = src - segment_max(src, index, n).index_select(0, index);
    // FACT: (lambda s, m: is_copy_of(s - m, s))(torch.randn(5, 2), torch.randn(5, 2))
    e.exp_();  // LOOKALIKE: tensor-alias-then-mutate -- the subtraction produced a new tensor
    e.div_(segment_sum(e, index, n).index_select(0, index).clamp_min(1e-16));
    ctx->save_for_backward({e, index});
    ctx->saved_data["n"] = n;
    return e;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto out = saved[0], index = saved[1];
    const int64_t n = ctx->saved_data["n"].toInt();
    auto g = grads[0];
    auto dot = segment_sum(g * out, index, n).index_select(0, index);
    return {out * (g - dot), torch::Tensor(), torch::Tensor()};
  }
};

std::pair<torch::Tensor, torch::Tensor> add_self_loops(const torch::Tensor& edge_index,
                                                       const torch::Tensor& edge_weight, int64_t n) {
  auto loops = torch::arange(n, edge_index.options()).repeat({2, 1});
  auto ei = torch::cat({edge_index, loops}, 1);  // LOOKALIKE: tensor-device-mismatch -- loops are built with edge_index's options
  auto ew = torch::cat({edge_weight, torch::ones({n})});  // EXPECT: tensor-device-mismatch
  return {ei, ew};
}

struct GATConvImpl : torch::nn::Module {
  GATConvImpl(int64_t in, int64_t out, int64_t heads, bool concat, double dropout)
      : heads_(heads), out_(out), concat_(concat), dropout_(dropout) {
    weight = register_parameter("weight", torch::empty({heads, in, out}));
    att_src = register_parameter("att_src", torch::empty({heads, 1, out}));
    att_dst = register_parameter("att_dst", torch::empty({heads, 1, out}));
    log_tau = register_parameter("log_tau", torch::zeros({1}));
    res = register_module("res", torch::nn::Linear(torch::nn::LinearOptions(in, heads * out).bias(false)));
    torch::nn::init::xavier_uniform_(weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own NoGradGuard
    torch::nn::init::xavier_uniform_(att_src);
    torch::nn::init::xavier_uniform_(att_dst);
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& edge_index, const torch::Tensor& edge_weight) {
    const int64_t n = x.size(0);
    auto loops = add_self_loops(edge_index, edge_weight, n);
    auto src = loops.first[0], dst = loops.first[1];
    auto h = torch::matmul(x.unsqueeze(0), weight);
    auto a_src = (h * att_src).sum(-1);
    auto a_dst = (h * att_dst).sum(-1);
    auto logits = torch::leaky_relu(a_src.index_select(1, src) + a_dst.index_select(1, dst), 0.2).t();
    auto alpha = SegmentSoftmax::apply(logits / log_tau.exp(), dst, n);
    // FACT: backward_fails(lambda: (lambda x: (lambda y: (y.mul_(2), y.sum().backward()))(torch.softmax(x, 0)))(torch.randn(5, requires_grad=True)))
    alpha.mul_(loops.second.unsqueeze(1));  // EXPECT: tensor-inplace-on-saved
    alpha = torch::dropout(alpha, dropout_, is_training());
    auto msg = h.index_select(1, src) * alpha.t().unsqueeze(-1);
    auto out = torch::zeros_like(h).index_add_(1, dst, msg);
    // FACT: (lambda y: is_view_of(y.view(5, 2, 3), y))(torch.nn.functional.linear(torch.randn(5, 4), torch.randn(6, 4)))
    auto skip = res(x).view({n, heads_, out_});  // LOOKALIKE: tensor-view-non-contiguous -- Linear returns a contiguous tensor
    // FACT: (lambda m: (lambda o: (o.add_(1), o.sum().backward(), True)[-1])(torch.zeros(2, 3, 4).index_add_(1, torch.tensor([0, 2, 2]), m)))(torch.randn(2, 3, 4, requires_grad=True))
    out += skip.transpose(0, 1);  // LOOKALIKE: tensor-inplace-on-saved -- index_add saves only its index, not its result
    if (!concat_) return out.mean(0);
    // FACT: raises(lambda: torch.randn(2, 5, 3).transpose(0, 1).view(5, 6), "view size is not compatible")
    return out.transpose(0, 1).view({n, heads_ * out_});  // EXPECT: tensor-view-non-contiguous
  }

  // Ablation: silence whole heads by zeroing their projections.
  void drop_heads(const std::vector<int64_t>& heads) {
    for (auto hd : heads) {
      // FACT: raises(lambda: torch.zeros(3, 4, requires_grad=True)[0].zero_(), "a view of a leaf Variable")
      weight[hd].zero_();  // EXPECT: tensor-inplace-on-leaf
    }
  }

  int64_t heads_, out_;
  bool concat_;
  double dropout_;
  torch::Tensor weight, att_src, att_dst, log_tau;
  torch::nn::Linear res{nullptr};
};
TORCH_MODULE(GATConv);

struct GATImpl : torch::nn::Module {
  GATImpl(int64_t in, int64_t hidden, int64_t classes, int64_t heads, double p)
      : conv1(register_module("conv1", GATConv(in, hidden, heads, true, p))),
        conv2(register_module("conv2", GATConv(hidden * heads, classes, 1, false, p))),
        p_(p) {}

  torch::Tensor forward(const Graph& g) {
    auto h = g.x.reshape({g.num_nodes, -1});
    if (is_training()) {
      auto keep = torch::full_like(h, 1.0 - p_).bernoulli_().div_(1.0 - p_);
      // FACT: (lambda x: shares_storage(x.reshape(5, -1), x))(torch.randn(5, 3))
      h.mul_(keep);  // EXPECT: tensor-alias-then-mutate
    }
    h = torch::elu(conv1(h, g.edge_index, g.edge_weight));
    h = torch::dropout(h, p_, is_training());
    return conv2(h, g.edge_index, g.edge_weight);
  }

  GATConv conv1, conv2;
  double p_;
};
TORCH_MODULE(GAT);

torch::Tensor to_undirected_dense(const torch::Tensor& edge_index, int64_t n) {
  auto adj = torch::zeros({n, n});
  adj.index_put_({edge_index[0], edge_index[1]}, torch::ones({edge_index.size(1)}));
  // FACT: raises(lambda: (lambda a: a.add_(a.t()))(torch.rand(4, 4)), "some elements")
  adj.add_(adj.t()).clamp_max_(1.0);  // EXPECT: tensor-inplace-overlap
  adj.fill_diagonal_(0.0);
  return adj.nonzero().t().contiguous();
}

Graph make_graph(const GraphConfig& cfg) {
  Graph g;
  g.num_nodes = cfg.nodes;
  g.y = torch::randint(0, cfg.classes, {cfg.nodes});
  auto centers = torch::randn({cfg.classes, cfg.features}) * 1.5;
  g.x = torch::relu(torch::randn({cfg.nodes, cfg.features}) + centers.index_select(0, g.y));

  // The generator lists (citing, cited) pairs; messages flow from the cited paper.
  auto ei = torch::randint(0, cfg.nodes, {2, cfg.nodes * cfg.avg_degree});
  if (cfg.undirected) {
    ei = to_undirected_dense(ei, cfg.nodes);
  } else {
    // FACT: (lambda e: is_copy_of(e.flip(0), e))(torch.randint(0, 5, (2, 7)))
    ei.copy_(ei.flip(0));  // LOOKALIKE: tensor-inplace-overlap -- flip() returns a copy, not a view
  }
  g.edge_index = ei;

  auto deg = torch::bincount(ei[1], {}, cfg.nodes).to(torch::kDouble).add(1.0);
  auto dinv = deg.pow(-0.5);
  g.edge_weight = torch::empty({ei.size(1)}, g.x.options());
  g.edge_weight.copy_(dinv.index_select(0, ei[0]) * dinv.index_select(0, ei[1]));  // EXPECT: tensor-copy-narrowing

  auto r = torch::rand({cfg.nodes});
  g.train_mask = r.lt(0.6);
  g.val_mask = r.ge(0.6);
  return g;
}

double max_normalization_error(const torch::Tensor& alpha, const torch::Tensor& index, int64_t n) {
  double worst = 0.0;
  for (int64_t h = 0; h < alpha.size(1); ++h) {
    auto sums = torch::zeros({n}, alpha.options()).index_add_(0, index, alpha.select(1, h));
    worst = std::max(worst, (sums - 1.0).abs().max().item<double>());  // EXPECT: tensor-sync-in-loop
  }
  return worst;
}

double accuracy(GAT& model, const Graph& g, const torch::Tensor& mask) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto pred = model->forward(g).argmax(1);
  return pred.eq(g.y).masked_select(mask).to(torch::kFloat).mean().item<double>();
}

void train(GAT& model, const Graph& g, int epochs) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(5e-3).weight_decay(5e-4));
  auto train_idx = g.train_mask.nonzero().squeeze(1);
  auto y_train = g.y.index_select(0, train_idx);
  std::vector<torch::Tensor> loss_curve, val_curve;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    auto logits = model->forward(g);
    auto loss = torch::nn::functional::cross_entropy(logits.index_select(0, train_idx), y_train);
    opt.zero_grad();
    loss.backward();
    opt.step();
    {
      torch::NoGradGuard no_grad;
      model->conv1->log_tau.clamp_(-2.0, 2.0);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard after the step
      model->conv2->log_tau.clamp_(-2.0, 2.0);
    }
    loss_curve.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    {
      torch::NoGradGuard no_grad;
      model->eval();
      auto pred = model->forward(g).argmax(1);
      auto acc = pred.eq(g.y).masked_select(g.val_mask).to(torch::kFloat).mean();
      val_curve.push_back(acc);  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard, no graph attached
    }
    if (epoch % 25 == 0) {
      auto stats = torch::stack({loss.detach(), val_curve.back()}).cpu();  // LOOKALIKE: tensor-sync-in-loop -- one read every 25 epochs for the log
      std::cout << "epoch " << epoch << " loss " << stats[0].item<float>() << " val " << stats[1].item<float>() << '\n';
    }
  }
  std::cout << "final loss " << loss_curve.back().item<float>() << '\n';
}

}  // namespace gnn

int main() {
  using namespace gnn;
  torch::manual_seed(7);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  GraphConfig cfg;
  auto g = make_graph(cfg).to(device);

  {
    torch::NoGradGuard no_grad;
    auto loops = add_self_loops(g.edge_index, g.edge_weight, g.num_nodes);
    auto dst = loops.first[1];
    auto alpha = SegmentSoftmax::apply(torch::randn({dst.size(0), 4}, g.x.options()), dst, g.num_nodes);
    std::cout << "softmax normalisation error " << max_normalization_error(alpha, dst, g.num_nodes) << '\n';
  }

  GAT model(cfg.features, 8, cfg.classes, 8, 0.5);
  model->to(device);
  train(model, g, 200);
  std::cout << "val accuracy " << accuracy(model, g, g.val_mask) << '\n';

  model->conv1->drop_heads({0, 1});
  std::cout << "val accuracy without heads 0,1 " << accuracy(model, g, g.val_mask) << '\n';
}
