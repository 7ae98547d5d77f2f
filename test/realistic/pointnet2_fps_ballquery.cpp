// PointNet++ classifier with farthest point sampling, ball query and a grouping
// op written as a custom autograd Function (ports of the pointnet2 CUDA ops).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace pc {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
namespace F = torch::nn::functional;

// Indices of npoint well-spread points per cloud; int32 like the kernel it replaces.
torch::Tensor furthest_point_sample(const torch::Tensor& xyz, int64_t npoint) {
  torch::NoGradGuard no_grad;
  const int64_t B = xyz.size(0), N = xyz.size(1);
  auto idx = torch::zeros({B, npoint}, xyz.options().dtype(torch::kInt));
  auto dist = torch::full({B, N}, 1e10, xyz.options());
  auto farthest = torch::zeros({B}, xyz.options().dtype(torch::kLong));
  auto offset = torch::arange(B, farthest.options()) * N;
  for (int64_t i = 0; i < npoint; ++i) {
    idx.select(1, i).copy_(farthest);  // EXPECT: tensor-copy-narrowing
    auto flat = xyz.contiguous().view({B * N, 3});  // EXPECT: tensor-clone-in-loop
    auto centroid = flat.index_select(0, farthest + offset).unsqueeze(1);
    dist = torch::minimum(dist, (xyz - centroid).pow(2).sum(-1));
    farthest = dist.argmax(-1);
  }
  return idx;
}

// Up to nsample neighbours within radius of each centroid; short balls repeat their first hit.
torch::Tensor ball_query(double radius, int64_t nsample, const torch::Tensor& xyz, const torch::Tensor& new_xyz) {
  torch::NoGradGuard no_grad;
  const int64_t B = xyz.size(0), N = xyz.size(1), S = new_xyz.size(1);
  auto sqrdists = torch::cdist(new_xyz, xyz).pow_(2);
  auto r2 = torch::tensor(radius * radius);
  auto outside = sqrdists > r2;  // LOOKALIKE: tensor-device-mismatch -- r2 is a 0-dim CPU tensor, accepted next to CUDA operands
  auto group_idx = torch::arange(N, xyz.options().dtype(torch::kLong)).view({1, 1, N}).expand({B, S, N});
  // FACT: import warnings; warnings.simplefilter("ignore"); t = torch.arange(5).view(1, 1, 5).expand(2, 3, 5); m = torch.zeros(2, 3, 5, dtype=torch.bool); m[0, 0, 4] = True; t.masked_fill_(m, 5); assert t.stride(0) == 0 and t[1, 2, 4] == 5
  group_idx.masked_fill_(outside, N);  // EXPECT: tensor-inplace-on-expanded
  group_idx = std::get<0>(group_idx.sort(-1)).slice(2, 0, nsample);
  auto group_first = group_idx.select(2, 0).unsqueeze(-1).expand({B, S, nsample});
  auto empty = group_idx.eq(N);
  // FACT: t = torch.arange(6).view(1, 6).repeat(2, 1); f = t[:, 0:1].expand(2, 6); m = t > 3; t.masked_scatter_(m, f.masked_select(m)); assert f.stride(1) == 0 and t[1, 5] == 0
  group_idx.masked_scatter_(empty, group_first.masked_select(empty));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded group_first is only read
  return group_idx;
}

// Gathers channel-first features at the given point indices; idx may be B x S or B x S x K.
struct GroupPoints : public torch::autograd::Function<GroupPoints> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor features, torch::Tensor idx) {
    const int64_t B = features.size(0), C = features.size(1);
    // FACT: raises(lambda: torch.arange(40).view(2, 4, 5).sort(-1)[0][..., :3].to(torch.long).view(2, 1, -1), "view size is not compatible")
    auto flat = idx.to(torch::kLong).view({B, 1, -1}).expand({B, C, -1});  // EXPECT: tensor-view-non-contiguous
    ctx->save_for_backward({flat});
    ctx->saved_data["n"] = features.size(2);
    std::vector<int64_t> shape{B, C};
    shape.insert(shape.end(), idx.sizes().begin() + 1, idx.sizes().end());
    return features.gather(2, flat).view(shape);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto flat = ctx->get_saved_variables()[0];
    auto g = grads[0].reshape({flat.size(0), flat.size(1), -1});
    auto grad_features = torch::zeros({flat.size(0), flat.size(1), ctx->saved_data["n"].toInt()}, g.options());
    grad_features.scatter_add_(2, flat, g);
    return {grad_features, torch::Tensor()};
  }
};

torch::nn::Sequential shared_mlp(int64_t in, const std::vector<int64_t>& widths) {
  torch::nn::Sequential seq;
  for (auto w : widths) {
    seq->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, w, 1).bias(false)));
    seq->push_back(torch::nn::BatchNorm2d(w));
    seq->push_back(torch::nn::ReLU());
    in = w;
  }
  return seq;
}

struct ScaleSpec {
  double radius;
  int64_t nsample;
  std::vector<int64_t> widths;
};

// Multi-scale grouping set abstraction; xyz is B x N x 3, features B x C x N.
struct SetAbstractionImpl : torch::nn::Module {
  SetAbstractionImpl(int64_t npoint, int64_t in_ch, std::vector<ScaleSpec> scales)
      : npoint_(npoint), scales_(std::move(scales)) {
    for (size_t i = 0; i < scales_.size(); ++i) {
      pos_enc_.push_back(register_module("pos" + std::to_string(i), torch::nn::Linear(3, 16)));
      mlps_.push_back(register_module("mlp" + std::to_string(i), shared_mlp(in_ch + 16, scales_[i].widths)));
    }
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& xyz, const torch::Tensor& features) {
    const int64_t B = xyz.size(0), S = npoint_;
    auto xyz_t = xyz.transpose(1, 2);
    auto new_xyz_t = GroupPoints::apply(xyz_t, furthest_point_sample(xyz, npoint_));
    auto new_xyz = new_xyz_t.transpose(1, 2);
    std::vector<torch::Tensor> outs;
    for (size_t i = 0; i < scales_.size(); ++i) {
      const auto& sc = scales_[i];
      auto idx = ball_query(sc.radius, sc.nsample, xyz, new_xyz);
      auto rel = (GroupPoints::apply(xyz_t, idx) - new_xyz_t.unsqueeze(-1)) / sc.radius;
      // FACT: (lambda g: is_copy_of(g.permute(0, 2, 3, 1).reshape(-1, 3), g))(torch.randn(2, 3, 4, 5))
      auto pe = pos_enc_[i]->forward(rel.permute({0, 2, 3, 1}).reshape({-1, 3}));  // EXPECT: tensor-reshape-non-contiguous
      pe = pe.view({B, S, sc.nsample, -1}).permute({0, 3, 1, 2});
      auto grouped = torch::cat({pe, GroupPoints::apply(features, idx)}, 1).contiguous();  // LOOKALIKE: tensor-clone-in-loop -- a different grouping at every radius
      outs.push_back(std::get<0>(mlps_[i]->forward(grouped).max(-1)));
    }
    return {new_xyz, torch::cat(outs, 1)};
  }

  int64_t npoint_;
  std::vector<ScaleSpec> scales_;
  std::vector<torch::nn::Linear> pos_enc_;
  std::vector<torch::nn::Sequential> mlps_;
};
TORCH_MODULE(SetAbstraction);

struct ClsOutput {
  torch::Tensor logits, embedding;
};

struct PointNet2ClsImpl : torch::nn::Module {
  explicit PointNet2ClsImpl(int64_t classes) {
    using Scales = std::vector<ScaleSpec>;
    sa1 = register_module("sa1", SetAbstraction(256, 3, Scales{{0.1, 16, {32, 32, 64}}, {0.2, 32, {64, 64, 128}}}));
    sa2 = register_module("sa2", SetAbstraction(64, 192, Scales{{0.2, 16, {64, 64, 128}}, {0.4, 32, {128, 128, 256}}}));
    sa3 = register_module("sa3", shared_mlp(3 + 384, {256, 512, 1024}));
    head = register_module("head", torch::nn::Sequential(
        torch::nn::Linear(1024, 256), torch::nn::BatchNorm1d(256), torch::nn::ReLU(), torch::nn::Dropout(0.4),
        torch::nn::Linear(256, classes)));
  }

  // points: B x 6 x N (xyz, normal)
  ClsOutput forward(const torch::Tensor& points) {
    auto xyz = points.narrow(1, 0, 3).transpose(1, 2);
    auto l1 = sa1(xyz, points.narrow(1, 3, 3));
    auto l2 = sa2(l1.first, l1.second);
    auto grouped = torch::cat({l2.first.transpose(1, 2), l2.second}, 1).unsqueeze(2);
    auto l3 = std::get<0>(sa3->forward(grouped).max(-1));
    // FACT: (lambda m: is_view_of(m.view(2, -1), m))(torch.randn(2, 8, 1, 5).max(-1)[0])
    auto global = l3.view({l3.size(0), -1});  // LOOKALIKE: tensor-view-non-contiguous -- max() returns a fresh contiguous tensor
    return {head->forward(global), global};
  }

  SetAbstraction sa1{nullptr}, sa2{nullptr};
  torch::nn::Sequential sa3{nullptr}, head{nullptr};
};
TORCH_MODULE(PointNet2Cls);

class ShapeDataset : public torch::data::datasets::Dataset<ShapeDataset> {
 public:
  ShapeDataset(const std::vector<torch::Tensor>& raw, const std::vector<int64_t>& labels, int64_t npoints, bool train)
      : labels_(labels), train_(train) {
    for (const auto& cloud : raw) {
      auto keep = furthest_point_sample(cloud.narrow(1, 0, 3).unsqueeze(0), npoints).squeeze(0);
      auto pts = cloud.index_select(0, keep);
      auto xyz = pts.narrow(1, 0, 3);
      // FACT: (lambda c: is_copy_of(c.index_select(0, torch.tensor([0, 2], dtype=torch.int32)), c))(torch.randn(8, 6))
      xyz.sub_(xyz.mean(0));  // LOOKALIKE: tensor-alias-then-mutate -- pts is index_select's fresh copy, writing it is the point
      xyz.div_(xyz.norm(2, 1).max());
      clouds_.push_back(pts);
    }
  }

  torch::data::Example<> get(size_t i) override {
    auto pts = clouds_[i];
    if (train_) {
      auto xyz = pts.narrow(1, 0, 3);
      // FACT: (lambda c: is_view_of(c.narrow(1, 0, 3), c))(torch.randn(8, 6))
      xyz.mul_(torch::empty({1, 3}).uniform_(0.8, 1.25));  // EXPECT: tensor-alias-then-mutate
      auto jittered = pts.clone();  // LOOKALIKE: tensor-unnecessary-clone -- only xyz gets noise, the normals are kept
      jittered.narrow(1, 0, 3).add_(torch::randn({pts.size(0), 3}).mul_(0.01).clamp_(-0.05, 0.05));
      pts = jittered;
    }
    return {pts, torch::tensor(labels_[i])};
  }

  torch::optional<size_t> size() const override { return clouds_.size(); }

 private:
  std::vector<torch::Tensor> clouds_;
  std::vector<int64_t> labels_;
  bool train_;
};

// Surface samples of a sphere, a cube or a cylinder, with outward normals.
torch::Tensor synthetic_shape(int64_t cls, int64_t n) {
  auto p = torch::randn({n, 3});
  if (cls == 0) {
    p = p / p.norm(2, 1, true);
    return torch::cat({p, p}, 1);
  }
  if (cls == 1) {
    auto face = torch::one_hot(p.abs().argmax(1), 3).to(torch::kFloat) * p.sign();
    auto u = torch::rand({n, 3}) * 2 - 1;
    return torch::cat({u * (1 - face.abs()) + face, face}, 1);
  }
  auto theta = torch::rand({n}) * 2 * M_PI;
  auto normal = torch::stack({theta.cos(), theta.sin(), torch::zeros({n})}, 1);
  auto height = torch::stack({torch::zeros({n}), torch::zeros({n}), torch::rand({n}) * 2 - 1}, 1);
  return torch::cat({normal + height, normal}, 1);
}

void clip_gradients(torch::nn::Module& model, double max_norm) {
  std::vector<torch::Tensor> grads;
  for (auto& p : model.parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  std::vector<torch::Tensor> norms;
  for (const auto& g : grads) norms.push_back(g.norm());
  auto coef = (max_norm / (torch::stack(norms).norm() + 1e-6)).clamp_max(1.0);
  for (auto& g : grads) g.detach().mul_(coef);  // LOOKALIKE: tensor-inplace-on-detached -- rescales the gradient on purpose, as clip_grad_norm_ does
}

// Random rotation about the up axis, applied in place to a batch of row-major clouds.
void rotate_z_(const torch::Tensor& rows) {
  const double t = torch::rand({1}).item<double>() * 2 * M_PI;
  const double c = std::cos(t), s = std::sin(t);
  auto rot = torch::tensor({{c, s, 0.0}, {-s, c, 0.0}, {0.0, 0.0, 1.0}}, rows.options());
  for (int64_t off : {0, 3}) {
    // FACT: (lambda b: is_view_of(b.narrow(2, 3, 3).reshape(-1, 3), b))(torch.randn(2, 5, 6))
    auto v = rows.narrow(2, off, 3).reshape({-1, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- a last-dim narrow still lets batch and point dims merge: a view
    v.copy_(v.mm(rot));
  }
}

template <typename Loader>
void train(PointNet2Cls& model, Loader& loader, torch::Device device, int epochs) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3).weight_decay(1e-4));
  auto class_weights = torch::tensor({1.0f, 1.2f, 1.0f});
  std::vector<torch::Tensor> bank;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    bank.clear();
    float running = 0.f;
    int64_t steps = 0;
    for (auto& batch : *loader) {
      torch::Tensor rows = batch.data.to(device);
      rotate_z_(rows);
      auto points = rows.transpose(1, 2);
      torch::Tensor labels = batch.target.to(device);
      auto out = model->forward(points);
      auto loss = F::cross_entropy(out.logits, labels,
                                   F::CrossEntropyFuncOptions().weight(class_weights).label_smoothing(0.1));  // EXPECT: tensor-device-mismatch
      auto emb = out.embedding.detach();
      // FACT: backward_fails(lambda: (lambda x, w: (lambda y: (lambda z: (y.detach().div_(2), z.sum().backward()))(y.mm(w)))(x * 1))(torch.randn(3, 4, requires_grad=True), torch.randn(4, 2, requires_grad=True)))
      emb.div_(emb.norm(2, 1, true).clamp_min(1e-8));  // EXPECT: tensor-inplace-on-detached
      bank.push_back(emb);  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached embeddings carry no graph
      opt.zero_grad();
      loss.backward();
      clip_gradients(*model, 5.0);
      opt.step();
      running += loss.item<float>();  // EXPECT: tensor-sync-in-loop
      ++steps;
    }
    std::cout << "epoch " << epoch << " loss " << running / std::max<int64_t>(steps, 1)
              << " bank " << torch::cat(bank).size(0) << '\n';
  }
}

template <typename Loader>
double evaluate(PointNet2Cls& model, Loader& loader, torch::Device device, double temperature) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t total = 0;
  for (auto& batch : *loader) {
    torch::Tensor points = batch.data.to(device).transpose(1, 2);
    torch::Tensor probs;
    for (double s : {0.9, 1.0, 1.1}) {
      auto view = torch::cat({points.narrow(1, 0, 3) * s, points.narrow(1, 3, 3)}, 1);
      auto logits = model->forward(view).logits.clone();  // EXPECT: tensor-unnecessary-clone
      auto p = torch::softmax(logits.div_(temperature), 1);
      probs = probs.defined() ? probs + p : p;
    }
    correct += probs.argmax(1).eq(batch.target.to(device)).sum();
    total += points.size(0);
  }
  return correct.item<double>() / static_cast<double>(std::max<int64_t>(total, 1));
}

}  // namespace pc

int main() {
  using namespace pc;
  torch::manual_seed(3);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  std::vector<torch::Tensor> raw;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 96; ++i) {
    raw.push_back(synthetic_shape(i % 3, 2048));
    labels.push_back(i % 3);
  }
  auto train_set = ShapeDataset(raw, labels, 1024, true).map(torch::data::transforms::Stack<>());
  auto test_set = ShapeDataset(raw, labels, 1024, false).map(torch::data::transforms::Stack<>());
  auto train_loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(std::move(train_set), 16);
  auto test_loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(std::move(test_set), 16);

  PointNet2Cls model(3);
  model->to(device);
  train(model, train_loader, device, 4);
  std::cout << "test accuracy " << evaluate(model, test_loader, device, 1.5) << '\n';
}
