// DGCNN (Wang et al., "Dynamic Graph CNN for Learning on Point Clouds") for ModelNet40 classification.
// Every EdgeConv rebuilds the k-nearest-neighbour graph in the feature space of its input, gathers
// the neighbours' features and max-pools the edge responses.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

struct DGCNNConfig {
  int64_t k = 20, emb_dims = 1024, num_classes = 40, num_points = 1024;
  int64_t batch_size = 32, epochs = 250, test_votes = 4;
  double dropout = 0.5, smoothing = 0.2;
  double lr = 0.1, lr_min = 1e-3, momentum = 0.9, weight_decay = 1e-4;
};

struct AugConfig {
  double scale_lo = 2.0 / 3.0, scale_hi = 1.5, shift = 0.2, jitter_sigma = 0.01, jitter_clip = 0.05;
};

constexpr double kPi = 3.14159265358979323846;

// Indices of the k nearest neighbours of every point, measured in the features of x.
torch::Tensor knn(const torch::Tensor& x, int64_t k) {
  torch::NoGradGuard no_grad;
  auto neg_dist = torch::matmul(x.transpose(2, 1), x);
  auto xx = x.pow(2).sum(1, /*keepdim=*/true);
  // FACT: d = torch.randn(2, 4, 4); xx = torch.randn(2, 1, 4); assert not shares_storage(d, xx.transpose(2, 1))
  neg_dist.mul_(2).sub_(xx).sub_(xx.transpose(2, 1));  // LOOKALIKE: tensor-inplace-overlap -- xx is its own buffer; its transpose never aliases neg_dist
  // Round-off leaves d(i, j) and d(j, i) slightly apart; average them so ties break the same way.
  // FACT: d = torch.randn(2, 4, 4); assert raises(lambda: d.add_(d.transpose(1, 2)), "single memory location")
  neg_dist.add_(neg_dist.transpose(1, 2)).mul_(0.5);  // EXPECT: tensor-inplace-overlap
  return std::get<1>(neg_dist.topk(k, -1));
}

// Edge features [x_j - x_i, x_i] for each point i and its neighbours j.
torch::Tensor get_graph_feature(const torch::Tensor& x, int64_t k) {
  const int64_t B = x.size(0), C = x.size(1), N = x.size(2);
  auto idx = knn(x, k);
  auto idx_base = torch::arange(B).view({-1, 1, 1}) * N;
  auto flat_idx = (idx + idx_base).view(-1);  // EXPECT: tensor-device-mismatch
  auto x_t = x.transpose(2, 1);
  // FACT: x = torch.randn(2, 3, 5); assert raises(lambda: x.transpose(2, 1).view(10, 3), "view size is not compatible")
  auto rows = x_t.view({B * N, C});  // EXPECT: tensor-view-non-contiguous
  // FACT: r = torch.randn(10, 3).index_select(0, torch.randint(0, 10, (30,))); assert is_contiguous(r) and not raises(lambda: r.view(2, 5, 3, 3))
  auto neigh = rows.index_select(0, flat_idx).view({B, N, k, C});  // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a fresh contiguous tensor
  // FACT: x = torch.randn(2, 3, 5).transpose(2, 1); assert is_view_of(x.reshape(2, 5, 1, 3), x)
  auto center = x_t.reshape({B, N, 1, C}).expand({B, N, k, C});  // LOOKALIKE: tensor-reshape-non-contiguous -- inserting a unit dim is expressible with strides, so no copy
  // FACT: n = torch.randn(2, 5, 3, 3); c = torch.randn(2, 5, 1, 3).expand(2, 5, 3, 3); assert not raises(lambda: n.sub_(c))
  neigh.sub_(center);  // LOOKALIKE: tensor-inplace-on-expanded -- the written tensor is the fresh gather; the expanded center is only read
  return torch::cat({neigh, center}, 3).permute({0, 3, 1, 2});
}

struct EdgeConvImpl : torch::nn::Module {
  EdgeConvImpl(int64_t in_ch, int64_t out_ch, int64_t k) : k_(k) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2 * in_ch, out_ch, 1).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(out_ch));
    act = register_module("act", torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.2).inplace(true)));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // FACT: bn = torch.nn.BatchNorm2d(3); x = torch.randn(2, 3, 4, 4, requires_grad=True); assert not backward_fails(lambda: torch.nn.functional.leaky_relu(bn(x), 0.2, inplace=True).amax(-1).sum().backward())
    auto h = act->forward(bn->forward(conv->forward(get_graph_feature(x, k_))));  // LOOKALIKE: tensor-inplace-on-saved -- batch norm does not keep its output for backward, so the in-place activation is safe
    return std::get<0>(h.max(-1));
  }

  int64_t k_;
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::LeakyReLU act{nullptr};
};
TORCH_MODULE(EdgeConv);

struct DGCNNImpl : torch::nn::Module {
  explicit DGCNNImpl(const DGCNNConfig& cfg) {
    edge1 = register_module("edge1", EdgeConv(3, 64, cfg.k));
    edge2 = register_module("edge2", EdgeConv(64, 64, cfg.k));
    edge3 = register_module("edge3", EdgeConv(64, 128, cfg.k));
    edge4 = register_module("edge4", EdgeConv(128, 256, cfg.k));
    conv5 = register_module("conv5", torch::nn::Conv1d(torch::nn::Conv1dOptions(512, cfg.emb_dims, 1).bias(false)));
    bn5 = register_module("bn5", torch::nn::BatchNorm1d(cfg.emb_dims));
    fc1 = register_module("fc1", torch::nn::Linear(torch::nn::LinearOptions(2 * cfg.emb_dims, 512).bias(false)));
    bn6 = register_module("bn6", torch::nn::BatchNorm1d(512));
    fc2 = register_module("fc2", torch::nn::Linear(512, 256));
    bn7 = register_module("bn7", torch::nn::BatchNorm1d(256));
    fc3 = register_module("fc3", torch::nn::Linear(256, cfg.num_classes));
    drop = register_module("drop", torch::nn::Dropout(torch::nn::DropoutOptions(cfg.dropout).inplace(true)));
  }

  torch::Tensor forward(const torch::Tensor& pts) {
    const int64_t B = pts.size(0);
    auto x1 = edge1->forward(pts);
    auto x2 = edge2->forward(x1);
    auto x3 = edge3->forward(x2);
    auto x4 = edge4->forward(x3);
    auto x = torch::leaky_relu(bn5->forward(conv5->forward(torch::cat({x1, x2, x3, x4}, 1))), 0.2);
    auto pooled_max = std::get<0>(torch::adaptive_max_pool1d(x, 1)).view({B, -1});
    auto pooled_avg = torch::adaptive_avg_pool1d(x, 1).view({B, -1});
    x = torch::cat({pooled_max, pooled_avg}, 1);
    x = drop->forward(torch::leaky_relu(bn6->forward(fc1->forward(x)), 0.2));
    x = drop->forward(torch::leaky_relu(bn7->forward(fc2->forward(x)), 0.2));
    return fc3->forward(x);
  }

  EdgeConv edge1{nullptr}, edge2{nullptr}, edge3{nullptr}, edge4{nullptr};
  torch::nn::Conv1d conv5{nullptr};
  torch::nn::BatchNorm1d bn5{nullptr}, bn6{nullptr}, bn7{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(DGCNN);

// Random anisotropic scale and translation (the reference translate_pointcloud), plus clipped jitter.
torch::Tensor augment(const torch::Tensor& pts, const AugConfig& cfg) {
  const int64_t B = pts.size(0), N = pts.size(2);
  auto scale = torch::empty({B, 3, 1}, pts.options()).uniform_(cfg.scale_lo, cfg.scale_hi);
  auto shift = torch::empty({B, 3, 1}, pts.options()).uniform_(-cfg.shift, cfg.shift).expand({B, 3, N});
  auto jitter = torch::randn({B, 3, N}, pts.options()).mul_(cfg.jitter_sigma).clamp_(-cfg.jitter_clip, cfg.jitter_clip);
  // FACT: s = torch.empty(2, 3, 1).uniform_(-0.2, 0.2).expand(2, 3, 5); assert raises(lambda: s.add_(torch.randn(2, 3, 5)), "more than one element")
  shift.add_(jitter);  // EXPECT: tensor-inplace-on-expanded
  return pts.clone().mul_(scale).add_(shift);  // EXPECT: tensor-unnecessary-clone
}

// Rotation about the up (y) axis, for test-time voting.
torch::Tensor rotate_up(const torch::Tensor& pts, double angle) {
  const double c = std::cos(angle), s = std::sin(angle);
  auto rot = torch::tensor({{c, 0.0, s}, {0.0, 1.0, 0.0}, {-s, 0.0, c}}, pts.options());
  // FACT: p = torch.randn(2, 3, 5); assert is_copy_of(p.transpose(1, 2).reshape(-1, 3), p)
  auto flat = pts.transpose(1, 2).reshape({-1, 3});  // EXPECT: tensor-reshape-non-contiguous
  return flat.mm(rot.t()).view({pts.size(0), pts.size(2), 3}).transpose(1, 2);
}

struct LossOut {
  torch::Tensor loss, log_probs;
};

// Label-smoothed cross-entropy, weighted per class.
LossOut smooth_ce(const torch::Tensor& logits, const torch::Tensor& labels, double eps, const torch::Tensor& class_w) {
  const int64_t n_class = logits.size(1);
  auto one_hot = torch::zeros_like(logits).scatter_(1, labels.view({-1, 1}), 1.0);
  auto target = one_hot * (1.0 - eps) + (1.0 - one_hot) * (eps / (n_class - 1));
  auto log_probs = torch::log_softmax(logits, 1);
  auto w = class_w.index_select(0, labels);
  return {(-(target * log_probs).sum(1) * w).sum() / w.sum(), log_probs};
}

torch::Tensor inverse_frequency(const torch::Tensor& labels, int64_t n_class) {
  auto counts = torch::bincount(labels, {}, n_class).to(torch::kFloat).clamp_min(1.0);
  return counts.sum() / (counts * static_cast<double>(n_class));
}

struct PointSet {
  torch::Tensor points, labels;
};
PointSet load_modelnet40(const std::string& root, bool train, int64_t num_points);  // h5 reader, modelnet_io.cpp

void train_epoch(DGCNN& model, torch::optim::SGD& opt, const PointSet& train, const torch::Tensor& cls_w,
                 const DGCNNConfig& cfg, const AugConfig& aug, torch::Device device, int64_t epoch) {
  model->train();
  const int64_t n = train.points.size(0);
  auto perm = torch::randperm(n);
  std::vector<torch::Tensor> epoch_logits, epoch_labels;
  auto conf_sum = torch::zeros({}, torch::TensorOptions().device(device));
  double loss_sum = 0.0;
  for (int64_t start = 0; start + cfg.batch_size <= n; start += cfg.batch_size) {
    auto idx = perm.narrow(0, start, cfg.batch_size);
    auto pts = train.points.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
    auto labels = train.labels.index_select(0, idx).to(device);
    auto logits = model->forward(augment(pts, aug));
    auto out = smooth_ce(logits, labels, cfg.smoothing, cls_w.to(device));  // EXPECT: tensor-clone-in-loop
    // FACT: x = torch.randn(4, 5, requires_grad=True); assert backward_fails(lambda: (lambda lp: (lp.sum(1).mean(), lp.exp_())[0].backward())(torch.log_softmax(x, 1)))
    auto conf = std::get<0>(out.log_probs.exp_().max(1)).detach();  // EXPECT: tensor-inplace-on-saved
    opt.zero_grad();
    out.loss.backward();
    opt.step();

    conf_sum += conf.sum();
    // FACT: w = torch.randn(3, requires_grad=True); kept = [w * torch.randn(3) for _ in range(4)]; assert kept_nodes(kept) >= 4
    epoch_logits.push_back(logits);  // EXPECT: tensor-graph-kept-across-iterations
    epoch_labels.push_back(labels);
    loss_sum += out.loss.item<double>();  // EXPECT: tensor-sync-in-loop
  }
  auto all_logits = torch::cat(epoch_logits);
  auto acc = (all_logits.argmax(1) == torch::cat(epoch_labels)).to(torch::kFloat).mean().item<double>();
  std::printf("epoch %3lld  train loss %.4f  acc %.4f  mean conf %.3f\n", static_cast<long long>(epoch),
              loss_sum / epoch_logits.size(), acc, conf_sum.item<double>() / all_logits.size(0));
}

// Returns overall and class-averaged accuracy; logits are summed over rotated copies.
std::pair<double, double> evaluate(DGCNN& model, const PointSet& test, const DGCNNConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t n = test.points.size(0);
  std::vector<torch::Tensor> preds;
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t start = 0; start < n; start += cfg.batch_size) {
    const int64_t len = std::min(cfg.batch_size, n - start);
    auto pts = test.points.narrow(0, start, len).to(device);
    auto labels = test.labels.narrow(0, start, len).to(device);
    auto votes = torch::zeros({len, cfg.num_classes}, pts.options());
    for (int64_t v = 0; v < cfg.test_votes; ++v) {
      votes += torch::softmax(model->forward(rotate_up(pts, 2.0 * kPi * v / cfg.test_votes)), 1);
    }
    auto pred = votes.argmax(1);
    preds.push_back(pred);  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard, no graph is attached
    correct += (pred == labels).sum();  // LOOKALIKE: tensor-sync-in-loop -- stays on the device until the single read after the loop
  }
  auto all_pred = torch::cat(preds).cpu();
  auto hit = (all_pred == test.labels).to(torch::kFloat);
  auto per_class = torch::zeros({cfg.num_classes}).index_add_(0, test.labels, hit) /
                   torch::bincount(test.labels, {}, cfg.num_classes).to(torch::kFloat).clamp_min(1.0);
  return {correct.item<double>() / n, per_class.mean().item<double>()};
}

int main(int argc, char** argv) {
  DGCNNConfig cfg;
  AugConfig aug;
  torch::manual_seed(1);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  const std::string root = argc > 1 ? argv[1] : "data/modelnet40_ply_hdf5_2048";
  auto train = load_modelnet40(root, /*train=*/true, cfg.num_points);
  auto test = load_modelnet40(root, /*train=*/false, cfg.num_points);
  auto cls_w = inverse_frequency(train.labels, cfg.num_classes);

  DGCNN model(cfg);
  model->to(device);
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).weight_decay(cfg.weight_decay));

  std::vector<torch::Tensor> state = model->parameters();
  for (const auto& b : model->buffers()) state.push_back(b);
  std::vector<torch::Tensor> best_state;
  double best_acc = 0.0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    const double lr = cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1.0 + std::cos(kPi * epoch / cfg.epochs));
    for (auto& group : opt.param_groups()) static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
    train_epoch(model, opt, train, cls_w, cfg, aug, device, epoch);
    auto [acc, class_acc] = evaluate(model, test, cfg, device);
    std::printf("           test acc %.4f  class acc %.4f\n", acc, class_acc);
    if (acc > best_acc) {
      best_acc = acc;
      best_state.clear();
      for (const auto& t : state) best_state.push_back(t.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone -- the snapshot must outlive later optimizer steps
    }
  }

  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < state.size(); ++i) state[i].copy_(best_state[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- restoring weights under NoGradGuard
  torch::save(model, "dgcnn_best.pt");
  std::printf("best test acc %.4f\n", best_acc);
  return 0;
}
