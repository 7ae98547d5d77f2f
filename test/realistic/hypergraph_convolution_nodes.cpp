// Hypergraph neural network (HGNN, Feng et al., AAAI 2019) for semi-supervised node
// classification, with an optional multi-head hyperedge-attention first layer and
// self-distillation on the unlabeled nodes.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace hg {

struct Config {
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t knn = 10;
  double dropout = 0.5;
  double lr = 1e-3;
  double weight_decay = 5e-4;
  int64_t epochs = 300;
  int64_t patience = 50;
  double temperature = 0.5;
  double distill_weight = 0.3;
  bool attention = true;
};

struct HypergraphData {
  torch::Tensor features, labels;
  torch::Tensor H, edge_weight;
  torch::Tensor train_idx, val_idx, test_idx, unlabeled_idx;
  int64_t num_classes = 0;
};

// Rows of the exported table: node id, bag-of-words counts, label.
HypergraphData load_table(const torch::Tensor& table, int64_t num_classes) {
  const int64_t F = table.size(1) - 2;
  HypergraphData d;
  d.num_classes = num_classes;
  auto counts = table.narrow(1, 1, F);
  // FACT: t=torch.rand(6,7); assert raises(lambda: t.narrow(1,1,5).view(-1), "view size is not compatible")
  auto cap = torch::quantile(counts.view({-1}), 0.99).item<double>();  // EXPECT: tensor-view-non-contiguous
  // FACT: t=torch.rand(6,7); x=t.narrow(1,1,5); assert not is_contiguous(x) and is_copy_of(x.contiguous(), t)
  auto x = counts.contiguous();
  x.clamp_max_(cap);  // LOOKALIKE: tensor-alias-then-mutate -- the column slice is not contiguous, contiguous() copied it and the table is untouched
  x.div_(x.sum(1, true).clamp_min(1.0));
  d.features = x;
  d.labels = table.select(1, F + 1).to(torch::kLong);
  return d;
}

// Every node spawns a hyperedge joining it with its k nearest neighbours in feature space.
void build_knn_hyperedges(HypergraphData& d, int64_t k, int64_t block = 1024) {
  const int64_t N = d.features.size(0);
  d.H = torch::zeros({N, N});
  d.edge_weight = torch::empty({N});
  for (int64_t start = 0; start < N; start += block) {
    const int64_t len = std::min(block, N - start);
    auto dist = torch::cdist(d.features.narrow(0, start, len), d.features);
    auto [val, nbr] = dist.topk(k + 1, 1, /*largest=*/false);
    auto edges = torch::arange(start, start + len, torch::kLong).repeat_interleave(k + 1);
    d.H.index_put_({nbr.reshape({-1}), edges}, 1.0);
    d.edge_weight.narrow(0, start, len).copy_(torch::exp(-val.mean(1) / val.mean()));
  }
}

// G = Dv^-1/2 H W De^-1 H^T Dv^-1/2, with W normalised to mean one.
torch::Tensor generate_G(const torch::Tensor& H, torch::Tensor w) {
  // FACT: w=torch.rand(6)+0.5; v=w; v.div_(v.mean()); assert shares_storage(v, w) and torch.allclose(w.mean(), torch.tensor(1.0))
  w.div_(w.mean());  // EXPECT: tensor-alias-then-mutate
  auto dv_isqrt = torch::mv(H, w).pow(-0.5);
  dv_isqrt.masked_fill_(torch::isinf(dv_isqrt), 0.0);
  auto de_inv = H.sum(0).reciprocal();
  de_inv.masked_fill_(torch::isinf(de_inv), 0.0);
  auto left = dv_isqrt.unsqueeze(1) * H * (w * de_inv).unsqueeze(0);
  return torch::mm(left, H.t() * dv_isqrt.unsqueeze(0));
}

struct HGNNConvImpl : torch::nn::Module {
  HGNNConvImpl(int64_t in, int64_t out) {
    weight = register_parameter("weight", torch::empty({in, out}));
    bias = register_parameter("bias", torch::empty({out}));
    reset_parameters();
  }

  void reset_parameters() {
    const double stdv = 1.0 / std::sqrt(static_cast<double>(weight.size(1)));
    torch::NoGradGuard no_grad;
    weight.uniform_(-stdv, stdv);  // LOOKALIKE: tensor-inplace-on-leaf -- initialisation under NoGradGuard
    bias.uniform_(-stdv, stdv);
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& G) {
    auto h = torch::mm(x, weight);
    h.add_(bias);  // LOOKALIKE: tensor-inplace-on-saved -- mm saved x and weight, not its result
    return torch::mm(G, h);
  }

  torch::Tensor weight, bias;
};
TORCH_MODULE(HGNNConv);

// Nodes attend over the hyperedges they belong to; hyperedge features are member means.
struct HyperAttentionImpl : torch::nn::Module {
  HyperAttentionImpl(int64_t in, int64_t out, int64_t heads, double dropout)
      : heads_(heads), out_(out), dropout_(dropout) {
    proj_ = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(in, heads * out).bias(false)));
    att_node_ = register_parameter("att_node", torch::empty({heads, out}));
    att_edge_ = register_parameter("att_edge", torch::empty({heads, out}));
    torch::nn::init::xavier_uniform_(att_node_);
    torch::nn::init::xavier_uniform_(att_edge_);
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& H, const torch::Tensor& de_inv) {
    const int64_t N = x.size(0);
    // FACT: x=torch.randn(7,12); assert is_view_of(x.view(7,4,3).transpose(0,1), x)
    auto h = proj_(x).view({N, heads_, out_}).transpose(0, 1);  // LOOKALIKE: tensor-view-non-contiguous -- view runs on the linear output, before the transpose
    auto e = torch::matmul(H.t(), h) * de_inv.view({1, -1, 1});
    auto score = (h * att_node_.unsqueeze(1)).sum(-1).unsqueeze(2) +
                 (e * att_edge_.unsqueeze(1)).sum(-1).unsqueeze(1);
    score = torch::leaky_relu(score, 0.2).masked_fill(H.unsqueeze(0) == 0, -1e9);
    auto alpha = torch::dropout(torch::softmax(score, -1), dropout_, is_training());
    auto out = torch::matmul(alpha, e);
    // FACT: o=torch.randn(4,7,3); assert is_copy_of(o.transpose(0,1).reshape(7,12), o)
    return out.transpose(0, 1).reshape({N, heads_ * out_});  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t heads_, out_;
  double dropout_;
  torch::nn::Linear proj_{nullptr};
  torch::Tensor att_node_, att_edge_;
};
TORCH_MODULE(HyperAttention);

struct HGNNImpl : torch::nn::Module {
  HGNNImpl(int64_t in, int64_t classes, const Config& cfg, const torch::Tensor& G, const torch::Tensor& H)
      : cfg_(cfg) {
    G_ = register_buffer("G", G);
    H_ = register_buffer("H", H);
    auto de_inv = H.sum(0).reciprocal();
    de_inv_ = register_buffer("de_inv", de_inv.masked_fill(torch::isinf(de_inv), 0.0));
    if (cfg.attention)
      att_ = register_module("att", HyperAttention(in, cfg.hidden / cfg.heads, cfg.heads, cfg.dropout));
    else
      conv1_ = register_module("conv1", HGNNConv(in, cfg.hidden));
    conv2_ = register_module("conv2", HGNNConv(cfg.hidden, classes));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::dropout(x, cfg_.dropout, is_training());
    if (cfg_.attention) {
      h = torch::elu(att_(h, H_, de_inv_));
    } else {
      h = torch::relu(conv1_(h, G_));
      torch::dropout_(h, cfg_.dropout, is_training());  // EXPECT: tensor-inplace-on-saved
    }
    return conv2_(h, G_);  // LOOKALIKE: tensor-device-mismatch -- G_ is a registered buffer and moved with model->to(device)
  }

  Config cfg_;
  torch::Tensor G_, H_, de_inv_;
  HyperAttention att_{nullptr};
  HGNNConv conv1_{nullptr}, conv2_{nullptr};
};
TORCH_MODULE(HGNN);

double accuracy(HGNN& model, const torch::Tensor& x, const HypergraphData& d, const torch::Tensor& idx) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto pred = model->forward(x).argmax(1);
  auto hit = pred.eq(d.labels).index_select(0, idx.to(pred.device()));  // EXPECT: tensor-device-mismatch
  return hit.to(torch::kFloat64).mean().item<double>();
}

void train(HGNN& model, const HypergraphData& d, const Config& cfg, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));
  auto x = d.features.to(device);
  auto train_idx = d.train_idx.to(device);
  auto unl_idx = d.unlabeled_idx.to(device);
  double best_val = -1.0;
  int64_t bad_epochs = 0;
  std::vector<torch::Tensor> best_params;
  torch::Tensor smoothed, best_logits;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto y = d.labels.to(device);  // EXPECT: tensor-clone-in-loop
    opt.zero_grad();
    auto logits = model->forward(x);
    auto log_probs = torch::log_softmax(logits, 1);
    auto loss = torch::nll_loss(log_probs.index_select(0, train_idx), y.index_select(0, train_idx));

    // Sharpened predictions on unlabeled nodes serve as soft targets.
    // FACT: x=torch.randn(5,4,requires_grad=True); assert backward_fails(lambda: (lambda lp: (lp.detach().div_(0.5), lp.sum().backward()))(torch.log_softmax(x, 1)))
    auto target = log_probs.detach();
    target.div_(cfg.temperature);  // EXPECT: tensor-inplace-on-detached
    auto soft = torch::softmax(target, 1).index_select(0, unl_idx);
    loss = loss + cfg.distill_weight * torch::kl_div(log_probs.index_select(0, unl_idx), soft,
                                                     at::Reduction::Mean);
    loss.backward();
    opt.step();

    smoothed = smoothed.defined() ? 0.9 * smoothed + 0.1 * loss : loss;  // EXPECT: tensor-graph-kept-across-iterations
    const double val_acc = accuracy(model, x, d, d.val_idx);  // LOOKALIKE: tensor-sync-in-loop -- early stopping needs the value on the host every epoch
    if (val_acc > best_val) {
      best_val = val_acc;
      bad_epochs = 0;
      best_logits = logits.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, so no graph outlives the epoch
      best_params.clear();
      for (const auto& p : model->parameters())
        best_params.push_back(p.detach().clone());  // LOOKALIKE: tensor-clone-in-loop -- the parameters changed since the last snapshot
    } else if (++bad_epochs >= cfg.patience) {
      std::cout << "early stop at epoch " << epoch << '\n';
      break;
    }
    if (epoch % 20 == 0) std::cout << "epoch " << epoch << " loss " << smoothed.item<double>() << " val " << val_acc << '\n';
  }

  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    params[i].data().copy_(best_params[i]);  // LOOKALIKE: tensor-inplace-on-detached -- restoring the best weights is meant to write the parameters
}

// Gradient saliency of one node's prediction, with features outside `keep` ablated.
torch::Tensor feature_saliency(HGNN& model, const torch::Tensor& x, const torch::Tensor& keep, int64_t node) {
  model->eval();
  auto inp = x.detach().clone().requires_grad_(true);
  inp.masked_fill_(keep.logical_not().unsqueeze(0), 0.0);  // EXPECT: tensor-inplace-on-leaf
  auto logits = model->forward(inp);
  logits[node].max().backward();
  return inp.grad().abs().sum(0);
}

void write_predictions(HGNN& model, const torch::Tensor& x, const std::string& path) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto logits = model->forward(x);
  auto pred = torch::empty({logits.size(0)}, torch::kInt32);
  pred.copy_(logits.argmax(1));  // EXPECT: tensor-copy-narrowing
  std::ofstream out(path);
  auto acc = pred.accessor<int32_t, 1>();
  for (int64_t i = 0; i < pred.size(0); ++i) out << i << '\t' << acc[i] << '\n';
}

}  // namespace hg

int main() {
  using namespace hg;
  torch::manual_seed(3);
  Config cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  const int64_t N = 2708, F = 1433, C = 7;
  auto labels = torch::randint(C, {N}, torch::kLong);
  auto topic = torch::rand({C, F}).pow(4);
  auto counts = torch::poisson(topic.index_select(0, labels) * 3.0);
  auto table = torch::cat({torch::arange(N, torch::kFloat32).unsqueeze(1), counts,
                           labels.to(torch::kFloat32).unsqueeze(1)}, 1);

  auto data = load_table(table, C);
  build_knn_hyperedges(data, cfg.knn);
  auto perm = torch::randperm(N, torch::kLong);
  data.train_idx = perm.narrow(0, 0, 140);
  data.val_idx = perm.narrow(0, 140, 500);
  data.test_idx = perm.narrow(0, 640, 1000);
  data.unlabeled_idx = perm.narrow(0, 140, N - 140);

  auto G = generate_G(data.H, data.edge_weight);
  std::cout << "strongest hyperedge weight " << data.edge_weight.max().item<float>() << '\n';
  HGNN model(data.features.size(1), C, cfg, G, data.H);
  model->to(device);

  train(model, data, cfg, device);
  auto x = data.features.to(device);
  std::cout << "test accuracy " << accuracy(model, x, data, data.test_idx) << '\n';

  auto keep = torch::rand({F}) < 0.5;
  auto sal = feature_saliency(model, x, keep.to(device), 0);
  std::cout << "top saliency " << sal.max().item<float>() << '\n';
  write_predictions(model, x, "predictions.tsv");
  return 0;
}
