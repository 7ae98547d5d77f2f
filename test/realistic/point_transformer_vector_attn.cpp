// Point Transformer (Zhao et al., ICCV 2021) building blocks in LibTorch for shape
// classification: kNN grouping with gather/index_select, a relative-position MLP,
// vector self-attention (per-channel weights, softmax over the k neighbours) and
// transition-down with farthest point sampling. Features are channel-last [B, N, C];
// the loader hands per-point normals channel-first [B, 3, N], as PointNet code does.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct PtConfig {
  int64_t in_ch = 6, dim = 64, k = 16, n_classes = 40;
  double radius = 0.2;  // neighbours farther than this (first stage) get no attention
  std::vector<int64_t> stride_points{512, 128, 32};
  int64_t votes = 4;
};

struct PointCloud {
  torch::Tensor xyz;      // [N, 3]
  torch::Tensor normals;  // [3, N]
  torch::Tensor label;    // [] int64
};

// [B, N, M] squared distances between src [B, N, 3] and dst [B, M, 3].
torch::Tensor square_distance(const torch::Tensor& src, const torch::Tensor& dst) {
  auto d = -2 * torch::matmul(src, dst.transpose(1, 2));
  return d + src.pow(2).sum(-1, true) + dst.pow(2).sum(-1).unsqueeze(1);
}

torch::Tensor knn(const torch::Tensor& query, const torch::Tensor& ref, int64_t k) {
  return std::get<1>(square_distance(query, ref).topk(k, -1, /*largest=*/false));  // [B, S, k]
}

// Offsets so that idx can address the flattened [B * N, C] table.
torch::Tensor batch_offsets(const torch::Tensor& idx, int64_t n_points) {
  const int64_t B = idx.size(0);
  // FACT: i = torch.randint(0, 5, (3, 4, 2)); b = torch.arange(3).mul_(5).view(3, 1, 1).expand_as(i); assert b.stride(1) == 0 and int(b[2, 3, 1]) == 10
  auto base = torch::arange(B, idx.options()).mul_(n_points).view({B, 1, 1}).expand_as(idx);  // LOOKALIKE: tensor-inplace-on-expanded -- mul_ runs on the arange, before the expand
  return idx + base;
}

// points [B, N, C] (channel-last), idx [B, S, k] -> [B, S, k, C]
torch::Tensor index_points(const torch::Tensor& points, const torch::Tensor& idx) {
  const int64_t B = points.size(0), N = points.size(1), C = points.size(2);
  // FACT: p = torch.randn(2, 5, 3); assert is_view_of(p.reshape(10, 3), p)
  auto flat = points.reshape({B * N, C});  // LOOKALIKE: tensor-reshape-non-contiguous -- channel-last points are contiguous: a view
  auto rows = batch_offsets(idx, N).reshape({-1});
  // FACT: t = torch.randn(10, 3); r = torch.randint(0, 10, (2 * 4 * 2,)); assert is_contiguous(t.index_select(0, r)) and t.index_select(0, r).view(2, 4, 2, 3).shape == (2, 4, 2, 3)
  return flat.index_select(0, rows).view({idx.size(0), idx.size(1), idx.size(2), C});  // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a contiguous tensor
}

// Same gather for channel-first features [B, C, N] (the loader's normals).
torch::Tensor index_points_cf(const torch::Tensor& feats_cf, const torch::Tensor& idx) {
  const int64_t B = feats_cf.size(0), C = feats_cf.size(1), N = feats_cf.size(2);
  // FACT: f = torch.randn(2, 3, 5); assert raises(lambda: f.transpose(1, 2).view(10, 3), "view size is not compatible")
  auto flat = feats_cf.transpose(1, 2).view({B * N, C});  // EXPECT: tensor-view-non-contiguous
  auto rows = batch_offsets(idx, N).reshape({-1});
  return flat.index_select(0, rows).view({idx.size(0), idx.size(1), idx.size(2), C});
}

torch::Tensor farthest_point_sample(const torch::Tensor& xyz, int64_t npoint) {
  const int64_t B = xyz.size(0), N = xyz.size(1);
  auto opts_long = torch::TensorOptions().dtype(torch::kLong).device(xyz.device());
  auto centroids = torch::zeros({B, npoint}, opts_long);
  auto distance = torch::full({B, N}, 1e10, xyz.options());
  auto farthest = torch::randint(0, N, {B}, opts_long);
  auto batch = torch::arange(B, opts_long);
  for (int64_t i = 0; i < npoint; ++i) {
    centroids.select(1, i).copy_(farthest);  // LOOKALIKE: tensor-copy-narrowing -- int64 indices into an int64 table
    auto centroid = xyz.index({batch, farthest}).view({B, 1, 3});
    distance = torch::min(distance, (xyz - centroid).pow(2).sum(-1));
    farthest = std::get<1>(distance.max(-1));
  }
  return centroids;
}

struct PointTransformerLayerImpl : nn::Module {
  PointTransformerLayerImpl(int64_t dim, int64_t k, double radius)
      : k(k), radius2(radius * radius), scale(1.0 / std::sqrt(static_cast<double>(dim))),
        q(register_module("q", nn::Linear(dim, dim))),
        kp(register_module("kp", nn::Linear(dim, dim))),
        v(register_module("v", nn::Linear(dim, dim))),
        pos1(register_module("pos1", nn::Linear(3, dim))),
        pos2(register_module("pos2", nn::Linear(dim, dim))),
        gamma1(register_module("gamma1", nn::Linear(dim, dim))),
        gamma2(register_module("gamma2", nn::Linear(dim, dim))) {}

  // xyz [B, N, 3], x [B, N, C] -> [B, N, C]
  torch::Tensor forward(const torch::Tensor& xyz, const torch::Tensor& x) {
    auto nn_res = square_distance(xyz, xyz).topk(k, -1, /*largest=*/false);
    auto idx = std::get<1>(nn_res);
    auto too_far = std::get<0>(nn_res) > radius2;  // [B, N, k]
    auto q_i = q(x).unsqueeze(2);
    auto k_j = index_points(kp(x), idx);
    auto v_j = index_points(v(x), idx);
    auto rel = xyz.unsqueeze(2) - index_points(xyz, idx);
    auto p = pos1(rel);
    p.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- Linear saves its input, not its output
    p = pos2(p);
    auto w = gamma2(torch::relu(gamma1(q_i - k_j + p)));
    auto attn = torch::softmax(w * scale, 2);
    attn.masked_fill_(too_far.unsqueeze(-1), 0.0);  // EXPECT: tensor-inplace-on-saved
    return (attn * (v_j + p)).sum(2);
  }

  int64_t k;
  double radius2, scale;
  nn::Linear q, kp, v, pos1, pos2, gamma1, gamma2;
};
TORCH_MODULE(PointTransformerLayer);

// FPS down to `npoint`, kNN group, shared MLP (conv 1x1 + BN + ReLU), local max pool.
struct TransitionDownImpl : nn::Module {
  TransitionDownImpl(int64_t in_ch, int64_t out_ch, int64_t npoint, int64_t k)
      : npoint(npoint), k(k),
        conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(in_ch + 3, out_ch, 1).bias(false)))),
        bn(register_module("bn", nn::BatchNorm2d(out_ch))) {
    nn::init::kaiming_normal_(conv->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
  }

  // xyz [B, N, 3], x [B, N, C] -> new_xyz [B, S, 3], pooled [B, S, C']
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& xyz, const torch::Tensor& x) {
    auto centres = farthest_point_sample(xyz, npoint);
    auto new_xyz = index_points(xyz, centres.unsqueeze(-1)).squeeze(2);
    auto idx = knn(new_xyz, xyz, k);
    auto rel = index_points(xyz, idx) - new_xyz.unsqueeze(2);
    auto grouped = torch::cat({rel, index_points(x, idx)}, -1);     // [B, S, k, 3 + C]
    auto h = torch::relu(bn(conv(grouped.permute({0, 3, 1, 2}))));  // [B, C', S, k]
    return {new_xyz, std::get<0>(h.max(3)).transpose(1, 2).contiguous()};
  }

  int64_t npoint, k;
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
};
TORCH_MODULE(TransitionDown);

struct PointTransformerClsImpl : nn::Module {
  explicit PointTransformerClsImpl(const PtConfig& c)
      : k(c.k),
        stem(register_module("stem", nn::Linear(c.in_ch, c.dim))),
        head(register_module("head", nn::Linear(c.dim << c.stride_points.size(), c.n_classes))) {
    int64_t ch = c.dim;
    double radius = c.radius;
    for (size_t s = 0; s < c.stride_points.size(); ++s, radius *= 2) {
      blocks.push_back(register_module("pt" + std::to_string(s), PointTransformerLayer(ch, c.k, radius)));
      downs.push_back(register_module("td" + std::to_string(s), TransitionDown(ch, 2 * ch, c.stride_points[s], c.k)));
      ch *= 2;
    }
  }

  // Local embedding of the raw input: neighbour offsets and normals, shared MLP, max over k.
  torch::Tensor embed(const torch::Tensor& xyz, const torch::Tensor& normals_cf) {
    auto idx = knn(xyz, xyz, k);
    auto rel = index_points(xyz, idx) - xyz.unsqueeze(2);
    auto nrm = index_points_cf(normals_cf, idx);
    return std::get<0>(torch::relu(stem(torch::cat({rel, nrm}, -1))).max(2));
  }

  torch::Tensor forward(const torch::Tensor& xyz, const torch::Tensor& normals_cf) {
    auto x = embed(xyz, normals_cf);
    auto pts = xyz;
    for (size_t s = 0; s < blocks.size(); ++s) {
      x = x + blocks[s]->forward(pts, x);
      auto down = downs[s]->forward(pts, x);
      pts = down.first;
      x = down.second;
    }
    return head(x.mean(1));
  }

  int64_t k;
  nn::Linear stem, head;
  std::vector<PointTransformerLayer> blocks;
  std::vector<TransitionDown> downs;
};
TORCH_MODULE(PointTransformerCls);

// Centre at the origin and scale into the unit sphere.
torch::Tensor normalize_cloud(const PointCloud& cloud) {
  torch::Tensor pts = cloud.xyz;
  auto centroid = pts.mean(0, true);
  auto radius = (pts - centroid).norm(2, 1).max();
  // FACT: c = torch.randn(6, 3) + 2; before = c.clone(); p = c; p.sub_(p.mean(0, keepdim=True)).div_(2.0); assert not torch.equal(c, before)
  pts.sub_(centroid).div_(radius);  // EXPECT: tensor-alias-then-mutate
  return pts;
}

torch::Tensor augment(const torch::Tensor& pts, double scale, double jitter) {
  torch::Tensor out = pts;
  // FACT: p = torch.randn(5, 3); q = p; q = q * 1.2; q.add_(1.0); assert is_copy_of(q, p)
  out = out * scale;
  out.add_(torch::randn_like(out).clamp_(-3.0, 3.0) * jitter);  // LOOKALIKE: tensor-alias-then-mutate -- out was rebound to the product's new tensor
  return out;
}

double train_epoch(PointTransformerCls& model, torch::optim::Optimizer& opt,
                   const std::vector<PointCloud>& dataset, int64_t batch_size) {
  model->train();
  torch::Tensor epoch_loss = torch::zeros({});
  torch::Tensor correct = torch::zeros({}, torch::kLong);
  for (size_t start = 0; start + batch_size <= dataset.size(); start += batch_size) {
    std::vector<torch::Tensor> xs, ns, ys;
    for (size_t i = start; i < start + batch_size; ++i) {
      xs.push_back(augment(normalize_cloud(dataset[i]), 0.8 + 0.4 * torch::rand({1}).item<double>(), 0.01));
      ns.push_back(dataset[i].normals);
      ys.push_back(dataset[i].label);
    }
    auto y = torch::stack(ys);
    auto logits = model->forward(torch::stack(xs), torch::stack(ns));
    auto loss = F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().label_smoothing(0.2));
    opt.zero_grad();
    loss.backward();
    opt.step();
    epoch_loss = epoch_loss + loss;  // EXPECT: tensor-graph-kept-across-iterations
    correct += (logits.argmax(1) == y).sum();  // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison count carries no graph
  }
  std::cout << "train acc " << correct.item<int64_t>() / static_cast<double>(dataset.size()) << "\n";
  return epoch_loss.item<double>() * batch_size / static_cast<double>(dataset.size());
}

// Test-time voting over rescaled copies on the GPU.
torch::Tensor predict_votes(PointTransformerCls& model, const torch::Tensor& points,
                            const torch::Tensor& normals_cf, const PtConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->to(torch::kCUDA);
  auto normals = normals_cf.to(torch::kCUDA);
  torch::Tensor probs;
  for (int64_t v = 0; v < cfg.votes; ++v) {
    auto pts = points.to(torch::kCUDA);  // EXPECT: tensor-clone-in-loop
    auto logits = model->forward(augment(pts, 0.9 + 0.2 * v / cfg.votes, 0.0), normals);
    auto p = torch::softmax(logits, -1);
    probs = probs.defined() ? probs + p : p;
  }
  return probs.argmax(-1).cpu();
}
