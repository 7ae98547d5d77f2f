// PointNet++ (single-scale grouping) for per-point semantic segmentation.
#include <torch/torch.h>

#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct SegConfig {
  int64_t num_classes = 13;
  int64_t batch = 8;
  int64_t epochs = 30;
  double lr = 1e-3;
  double jitter_sigma = 0.01;
  double focal_gamma = 2.0;
  double smoothing = 0.1;
};

// [B, N, C] x [B, M, C] -> [B, N, M] squared distances
torch::Tensor square_distance(const torch::Tensor& src, const torch::Tensor& dst) {
  auto d = -2 * torch::matmul(src, dst.transpose(1, 2));
  return d + src.pow(2).sum(-1).unsqueeze(-1) + dst.pow(2).sum(-1).unsqueeze(1);
}

// points [B, N, C], idx [B, ...] -> [B, ..., C]
torch::Tensor index_points(const torch::Tensor& points, const torch::Tensor& idx) {
  const auto B = points.size(0);
  std::vector<int64_t> shape(idx.dim(), 1);
  shape[0] = B;
  auto batch = torch::arange(B, idx.options()).view(shape).expand(idx.sizes());
  return points.index({batch, idx});
}

torch::Tensor farthest_point_sample(const torch::Tensor& xyz, int64_t npoint) {
  const auto B = xyz.size(0), N = xyz.size(1), C = xyz.size(2);
  auto lopts = xyz.options().dtype(torch::kLong);
  auto centroids = torch::zeros({B, npoint}, lopts);
  auto distance = torch::full({B, N}, 1e10, xyz.options());
  auto farthest = torch::randint(0, N, {B}, lopts);
  auto batch_idx = torch::arange(B, lopts);
  for (int64_t i = 0; i < npoint; ++i) {
    centroids.select(1, i).copy_(farthest); // LOOKALIKE: tensor-copy-narrowing -- int64 indices into an int64 buffer
    // FACT: x = torch.randn(2, 3, 9).permute(0, 2, 1); c = x[torch.arange(2), torch.tensor([1, 4])]; assert is_contiguous(c) and is_view_of(c.view(2, 1, 3), c)
    auto centroid = xyz.index({batch_idx, farthest}).view({B, 1, C}); // LOOKALIKE: tensor-view-non-contiguous -- advanced indexing gathers into a new contiguous tensor
    auto dist = (xyz - centroid).pow(2).sum(-1);
    distance = torch::min(distance, dist);
    farthest = std::get<1>(distance.max(-1));
  }
  return centroids;
}

torch::Tensor query_ball_point(double radius, int64_t nsample, const torch::Tensor& xyz, const torch::Tensor& new_xyz) {
  const auto B = xyz.size(0), N = xyz.size(1), S = new_xyz.size(1);
  auto group_idx = torch::arange(N, xyz.options().dtype(torch::kLong)).view({1, 1, N}).repeat({B, S, 1});
  auto sqrdists = square_distance(new_xyz, xyz);
  // FACT: g = torch.arange(5).view(1, 1, 5).repeat(2, 3, 1); g.masked_fill_(torch.rand(2, 3, 5) > 0.5, 5); assert is_contiguous(g)
  group_idx.masked_fill_(sqrdists > radius * radius, N); // LOOKALIKE: tensor-inplace-on-expanded -- repeat materialises every row
  group_idx = std::get<0>(group_idx.sort(-1)).narrow(2, 0, nsample);
  auto group_first = group_idx.select(2, 0).unsqueeze(2).expand({B, S, nsample});
  auto empty = group_idx == N;
  group_idx.index_put_({empty}, group_first.index({empty}));
  return group_idx;
}

// Random anisotropic-free scale augmentation.
torch::Tensor random_scale(const torch::Tensor& cloud, double lo, double hi) {
  torch::Tensor out = cloud;
  const double s = lo + (hi - lo) * torch::rand({1}).item<double>();
  // FACT: c = torch.randn(6, 3); o = c; o *= 1.1; assert shares_storage(o, c)
  out *= s; // EXPECT: tensor-alias-then-mutate
  return out;
}

struct SetAbstractionImpl : nn::Module {
  int64_t npoint, nsample;
  double radius;
  bool group_all;
  std::vector<nn::Conv2d> convs;
  std::vector<nn::BatchNorm2d> bns;

  SetAbstractionImpl(int64_t npoint_, double radius_, int64_t nsample_, int64_t in_ch, std::vector<int64_t> mlp, bool all)
      : npoint(npoint_), nsample(nsample_), radius(radius_), group_all(all) {
    int64_t last = in_ch;
    for (size_t i = 0; i < mlp.size(); ++i) {
      convs.push_back(register_module("conv" + std::to_string(i), nn::Conv2d(nn::Conv2dOptions(last, mlp[i], 1))));
      bns.push_back(register_module("bn" + std::to_string(i), nn::BatchNorm2d(mlp[i])));
      last = mlp[i];
    }
  }

  // xyz [B, 3, N], points [B, D, N] (may be undefined) -> new_xyz [B, 3, S], new_points [B, D', S]
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& xyz, const torch::Tensor& points) {
    auto xyz_t = xyz.permute({0, 2, 1});
    torch::Tensor points_t;
    if (points.defined()) points_t = points.permute({0, 2, 1});
    const auto B = xyz_t.size(0), N = xyz_t.size(1), C = xyz_t.size(2);
    torch::Tensor new_xyz, grouped;
    if (group_all) {
      new_xyz = torch::zeros({B, 1, C}, xyz.options());
      // FACT: p = torch.randn(2, 6, 9).permute(0, 2, 1); assert is_view_of(p.view(2, 1, 9, 6), p)
      auto gx = xyz_t.view({B, 1, N, C}); // LOOKALIKE: tensor-view-non-contiguous -- only a size-1 dim is inserted: strides allow it
      grouped = points_t.defined() ? torch::cat({gx, points_t.unsqueeze(1)}, -1) : gx;
    } else {
      auto fps_idx = farthest_point_sample(xyz_t, npoint);
      new_xyz = index_points(xyz_t, fps_idx);
      auto idx = query_ball_point(radius, nsample, xyz_t, new_xyz);
      auto gx = index_points(xyz_t, idx);
      // FACT: x = torch.randn(2, 3, 9).permute(0, 2, 1); i = torch.randint(0, 9, (2, 4, 5)); b = torch.arange(2).view(2, 1, 1).expand(2, 4, 5); assert is_copy_of(x[b, i], x)
      gx -= new_xyz.view({B, npoint, 1, C}); // LOOKALIKE: tensor-alias-then-mutate -- index_points gathers into new storage
      grouped = points_t.defined() ? torch::cat({gx, index_points(points_t, idx)}, -1) : gx;
    }
    auto feat = grouped.permute({0, 3, 2, 1});  // [B, C+D, K, S]
    for (size_t i = 0; i < convs.size(); ++i) feat = F::relu(bns[i](convs[i](feat)));
    feat = std::get<0>(torch::max(feat, 2));
    return {new_xyz.permute({0, 2, 1}), feat};
  }
};
TORCH_MODULE(SetAbstraction);

struct FeaturePropagationImpl : nn::Module {
  std::vector<nn::Conv1d> convs;
  std::vector<nn::BatchNorm1d> bns;

  FeaturePropagationImpl(int64_t in_ch, std::vector<int64_t> mlp) {
    int64_t last = in_ch;
    for (size_t i = 0; i < mlp.size(); ++i) {
      convs.push_back(register_module("conv" + std::to_string(i), nn::Conv1d(nn::Conv1dOptions(last, mlp[i], 1))));
      bns.push_back(register_module("bn" + std::to_string(i), nn::BatchNorm1d(mlp[i])));
      last = mlp[i];
    }
  }

  torch::Tensor forward(const torch::Tensor& xyz1, const torch::Tensor& xyz2, const torch::Tensor& points1,
                        const torch::Tensor& points2) {
    auto x1 = xyz1.permute({0, 2, 1}), x2 = xyz2.permute({0, 2, 1}), p2 = points2.permute({0, 2, 1});
    const auto B = x1.size(0), N = x1.size(1), S = x2.size(1);
    torch::Tensor interp;
    if (S == 1) {
      interp = p2.expand({B, N, p2.size(2)});
    } else {
      auto sorted = square_distance(x1, x2).sort(-1);
      auto d = std::get<0>(sorted).narrow(2, 0, 3);
      auto idx = std::get<1>(sorted).narrow(2, 0, 3);
      auto recip = 1.0 / (d + 1e-8);
      auto weight = recip / recip.sum(2, /*keepdim=*/true);
      // FACT: d = torch.rand(2, 5, 7).narrow(2, 0, 3); r = 1.0 / (d + 1e-8); w = r / r.sum(2, keepdim=True); assert is_contiguous(w) and is_view_of(w.view(2, 5, 3, 1), w)
      interp = (index_points(p2, idx) * weight.view({B, N, 3, 1})).sum(2); // LOOKALIKE: tensor-view-non-contiguous -- elementwise results of the narrowed distances are freshly allocated, contiguous
    }
    auto feat = points1.defined() ? torch::cat({points1.permute({0, 2, 1}), interp}, -1) : interp;
    feat = feat.permute({0, 2, 1});
    for (size_t i = 0; i < convs.size(); ++i) feat = F::relu(bns[i](convs[i](feat)));
    return feat;
  }
};
TORCH_MODULE(FeaturePropagation);

struct SegOutput {
  torch::Tensor logits;    // [B, classes, N]
  torch::Tensor features;  // [B, 128, N]
};

struct PointNet2SegImpl : nn::Module {
  SetAbstraction sa1{nullptr}, sa2{nullptr}, sa3{nullptr};
  FeaturePropagation fp3{nullptr}, fp2{nullptr}, fp1{nullptr};
  nn::Conv1d head1{nullptr}, head2{nullptr};
  nn::BatchNorm1d hbn{nullptr};

  explicit PointNet2SegImpl(const SegConfig& cfg) {
    sa1 = register_module("sa1", SetAbstraction(512, 0.2, 32, 3, std::vector<int64_t>{64, 64, 128}, false));
    sa2 = register_module("sa2", SetAbstraction(128, 0.4, 64, 128 + 3, std::vector<int64_t>{128, 128, 256}, false));
    sa3 = register_module("sa3", SetAbstraction(1, 0.0, 1, 256 + 3, std::vector<int64_t>{256, 512, 1024}, true));
    fp3 = register_module("fp3", FeaturePropagation(1024 + 256, std::vector<int64_t>{256, 256}));
    fp2 = register_module("fp2", FeaturePropagation(256 + 128, std::vector<int64_t>{256, 128}));
    fp1 = register_module("fp1", FeaturePropagation(128, std::vector<int64_t>{128, 128, 128}));
    head1 = register_module("head1", nn::Conv1d(nn::Conv1dOptions(128, 128, 1)));
    hbn = register_module("hbn", nn::BatchNorm1d(128));
    head2 = register_module("head2", nn::Conv1d(nn::Conv1dOptions(128, cfg.num_classes, 1)));
  }

  SegOutput forward(const torch::Tensor& xyz) {
    auto [l1_xyz, l1_pts] = sa1(xyz, torch::Tensor());
    auto [l2_xyz, l2_pts] = sa2(l1_xyz, l1_pts);
    auto [l3_xyz, l3_pts] = sa3(l2_xyz, l2_pts);
    l2_pts = fp3(l2_xyz, l3_xyz, l2_pts, l3_pts);
    l1_pts = fp2(l1_xyz, l2_xyz, l1_pts, l2_pts);
    auto l0_pts = fp1(xyz, l1_xyz, torch::Tensor(), l1_pts);
    auto h = F::dropout(F::relu(hbn(head1(l0_pts))), F::DropoutFuncOptions().p(0.5).training(is_training()));
    return {head2(h), l0_pts};
  }
};
TORCH_MODULE(PointNet2Seg);

torch::Tensor smoothed_targets(const torch::Tensor& target, int64_t C, double eps) {
  const auto M = target.size(0);
  auto soft = torch::full({1, C}, eps / C, torch::TensorOptions().device(target.device())).expand({M, C});
  // FACT: s = torch.full((1, 5), 0.02).expand(6, 5); assert raises(lambda: s.scatter_(1, torch.randint(0, 5, (6, 1)), 0.9), "more than one element of the written-to tensor")
  soft.scatter_(1, target.unsqueeze(1), 1.0 - eps + eps / C); // EXPECT: tensor-inplace-on-expanded
  return soft;
}

void train_segmentation(const SegConfig& cfg, const std::vector<torch::Tensor>& clouds, const std::vector<torch::Tensor>& labels) {
  torch::Device device(torch::kCUDA);
  PointNet2Seg model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(1e-4));
  const int64_t C = cfg.num_classes;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto total = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t step = 0;
    for (size_t start = 0; start + cfg.batch <= clouds.size(); start += cfg.batch) {
      std::vector<torch::Tensor> xs, ys;
      for (int64_t i = 0; i < cfg.batch; ++i) {
        xs.push_back(random_scale(clouds[start + i], 0.8, 1.25));
        ys.push_back(labels[start + i]);
      }
      auto xyz = torch::stack(xs).to(device);
      auto target = torch::stack(ys).to(device);
      const auto B = xyz.size(0), N = xyz.size(1);
      auto jitter = torch::randn({B, N, 3}).clamp(-0.05, 0.05) * cfg.jitter_sigma;
      auto noisy = xyz + jitter; // EXPECT: tensor-device-mismatch
      auto out = model->forward(noisy.permute({0, 2, 1}));
      auto logp = F::log_softmax(out.logits, 1);
      auto p = logp.exp();
      auto focal = p.detach();
      focal.neg_().add_(1).pow_(cfg.focal_gamma); // EXPECT: tensor-inplace-on-detached
      auto onehot = F::one_hot(target, C).permute({0, 2, 1}).to(torch::kFloat);
      auto fl = -(focal * logp * onehot).sum(1).mean();
      // FACT: t = torch.randint(0, 5, (2, 7)); assert is_view_of(t.view(-1), t)
      auto soft = smoothed_targets(target.view({-1}), C, cfg.smoothing); // LOOKALIKE: tensor-view-non-contiguous -- stacked labels are contiguous
      // FACT: l = torch.randn(2, 5, 7).transpose(1, 2); assert raises(lambda: l.view(-1, 5), "view size is not compatible") and is_contiguous(l.contiguous().view(-1, 5))
      auto flat_logp = logp.transpose(1, 2).contiguous().view({-1, C}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() copies first
      auto ce = -(soft * flat_logp).sum(1).mean();
      const std::vector<int64_t> over_points{0, 2};
      auto inter = (p * onehot).sum(over_points);
      auto dice = 1.0 - (2.0 * inter + 1.0) / (p.sum(over_points) + onehot.sum(over_points) + 1.0);
      auto loss = fl + ce + dice.mean();
      opt.zero_grad();
      loss.backward();
      opt.step();
      total += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
      if (++step % 20 == 0) std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every 20th step
    }
    std::cout << "epoch " << epoch << " mean loss " << (total / std::max<int64_t>(step, 1)).item<double>() << "\n";
  }
}

// Confusion matrix with flip test-time augmentation; also returns per-point embeddings.
std::pair<torch::Tensor, torch::Tensor> evaluate(PointNet2Seg& model, const std::vector<torch::Tensor>& xyz_batches,
                                                 const std::vector<torch::Tensor>& label_batches, int64_t C) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto conf = torch::zeros({C, C}, torch::kLong);
  std::vector<torch::Tensor> embeddings;
  for (size_t b = 0; b < xyz_batches.size(); ++b) {
    const auto& xyz = xyz_batches[b];  // [B, 3, N]
    auto out = model->forward(xyz);
    auto flipped = xyz.clone(); // LOOKALIKE: tensor-unnecessary-clone -- written through a view, the source is still needed
    flipped.select(1, 0).neg_();
    auto probs = F::softmax(out.logits, 1);
    auto avg = probs.clone(); // EXPECT: tensor-unnecessary-clone
    avg.mul_(0.5);
    avg += 0.5 * F::softmax(model->forward(flipped).logits, 1);
    // FACT: l = torch.randn(2, 5, 7); assert is_copy_of(l.permute(0, 2, 1).reshape(-1, 5), l)
    auto pred = avg.permute({0, 2, 1}).reshape({-1, C}).argmax(1); // EXPECT: tensor-reshape-non-contiguous
    auto gt = label_batches[b].reshape({-1});
    conf.index_put_({gt, pred}, torch::ones_like(pred), /*accumulate=*/true);
    const auto D = out.features.size(1);
    // FACT: f = torch.randn(2, 8, 7); assert raises(lambda: f.transpose(1, 2).view(-1, 8), "view size is not compatible")
    embeddings.push_back(out.features.transpose(1, 2).view({-1, D})); // EXPECT: tensor-view-non-contiguous
  }
  return {conf, torch::cat(embeddings)};
}
