// PU-Net style point cloud upsampling: hierarchical PointNet++ features,
// multi-branch feature expansion, coordinate regression, Chamfer + repulsion
// losses and patch-based inference on whole scans.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace punet {

struct Config {
  int64_t n_points = 1024;
  int64_t up_ratio = 4;
  int64_t nsample = 32;
  int64_t repulsion_k = 5;
  double repulsion_h = 0.03;
  double repulsion_weight = 0.01;
  double jitter_sigma = 0.01;
  double jitter_clip = 0.03;
  int64_t patches_per_batch = 16;
};

torch::Tensor square_distance(const torch::Tensor& a, const torch::Tensor& b) {
  auto d = -2.0 * torch::matmul(a, b.transpose(1, 2));
  d += a.pow(2).sum(-1, true);
  d += b.pow(2).sum(-1).unsqueeze(1);
  return d;
}

torch::Tensor index_points(const torch::Tensor& points, const torch::Tensor& idx) {
  std::vector<int64_t> shape(idx.dim(), 1);
  shape[0] = points.size(0);
  auto batch = torch::arange(points.size(0), idx.options()).view(shape).expand_as(idx);
  return points.index({batch, idx});
}

torch::Tensor knn(const torch::Tensor& query, const torch::Tensor& ref, int64_t k) {
  return std::get<1>(square_distance(query, ref).topk(k, -1, /*largest=*/false));
}

torch::Tensor farthest_point_sample(const torch::Tensor& xyz, int64_t npoint) {
  const auto B = xyz.size(0), N = xyz.size(1);
  auto opts = xyz.options().dtype(torch::kLong);
  auto centroids = torch::zeros({B, npoint}, opts);
  auto distance = torch::full({B, N}, 1e10);
  auto farthest = torch::randint(0, N, {B}, opts);
  auto batch = torch::arange(B, opts);
  for (int64_t i = 0; i < npoint; ++i) {
    centroids.select(1, i).copy_(farthest);  // LOOKALIKE: tensor-copy-narrowing -- int64 into int64
    auto centroid = xyz.index({batch, farthest}).unsqueeze(1);
    auto dist = (xyz - centroid).pow(2).sum(-1);
    distance = torch::minimum(distance, dist);  // EXPECT: tensor-device-mismatch
    farthest = distance.argmax(-1);
  }
  return centroids;
}

// Three-nearest-neighbour inverse-distance interpolation of coarse features.
torch::Tensor interpolate(const torch::Tensor& xyz, const torch::Tensor& coarse_xyz, const torch::Tensor& feat) {
  auto [dist, idx] = square_distance(xyz, coarse_xyz).topk(3, -1, /*largest=*/false);
  auto w = 1.0 / dist.clamp_min(1e-8);
  w = w / w.sum(-1, true);
  return (index_points(feat, idx) * w.unsqueeze(-1)).sum(2);
}

struct SetAbstractionImpl : torch::nn::Module {
  SetAbstractionImpl(int64_t npoint, int64_t nsample, int64_t in_ch, const std::vector<int64_t>& widths)
      : npoint(npoint), nsample(nsample) {
    int64_t c = in_ch + 3;
    for (auto w : widths) {
      mlp->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(c, w, 1)));
      mlp->push_back(torch::nn::BatchNorm2d(w));
      mlp->push_back(torch::nn::ReLU());
      c = w;
    }
    register_module("mlp", mlp);
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& xyz, const torch::Tensor& feat) {
    torch::Tensor fps_idx;
    {
      torch::NoGradGuard no_grad;
      fps_idx = farthest_point_sample(xyz, npoint);
    }
    auto new_xyz = index_points(xyz, fps_idx);
    auto group_idx = knn(new_xyz, xyz, nsample);
    auto grouped = index_points(xyz, group_idx) - new_xyz.unsqueeze(2);
    if (feat.defined()) grouped = torch::cat({grouped, index_points(feat, group_idx)}, -1);
    auto h = mlp->forward(grouped.permute({0, 3, 2, 1}));
    return {new_xyz, std::get<0>(h.max(2)).transpose(1, 2)};
  }

  int64_t npoint, nsample;
  torch::nn::Sequential mlp;
};
TORCH_MODULE(SetAbstraction);

struct PUNetImpl : torch::nn::Module {
  explicit PUNetImpl(const Config& c) : cfg(c) {
    const int64_t N = c.n_points;
    sa1 = register_module("sa1", SetAbstraction(N, c.nsample, 0, std::vector<int64_t>{32, 32, 64}));
    sa2 = register_module("sa2", SetAbstraction(N / 2, c.nsample, 64, std::vector<int64_t>{64, 64, 128}));
    sa3 = register_module("sa3", SetAbstraction(N / 4, c.nsample, 128, std::vector<int64_t>{128, 128, 256}));
    sa4 = register_module("sa4", SetAbstraction(N / 8, c.nsample, 256, std::vector<int64_t>{256, 256, 512}));
    const int64_t feat_ch = 3 + 64 + 128 + 256 + 512;
    for (int64_t r = 0; r < c.up_ratio; ++r) {
      branches->push_back(torch::nn::Sequential(torch::nn::Conv1d(torch::nn::Conv1dOptions(feat_ch, 256, 1)),
                                                torch::nn::ReLU(),
                                                torch::nn::Conv1d(torch::nn::Conv1dOptions(256, 128, 1)),
                                                torch::nn::ReLU()));
    }
    register_module("branches", branches);
    regressor = register_module(
        "regressor", torch::nn::Sequential(torch::nn::Conv1d(torch::nn::Conv1dOptions(128, 64, 1)), torch::nn::ReLU(),
                                           torch::nn::Conv1d(torch::nn::Conv1dOptions(64, 3, 1))));
  }

  // Returns the upsampled coordinates, channels first.
  torch::Tensor forward(const torch::Tensor& xyz) {
    const auto B = xyz.size(0), N = xyz.size(1);
    auto [l1_xyz, l1] = sa1(xyz, torch::Tensor());
    auto [l2_xyz, l2] = sa2(l1_xyz, l1);
    auto [l3_xyz, l3] = sa3(l2_xyz, l2);
    auto [l4_xyz, l4] = sa4(l3_xyz, l3);
    auto feat = torch::cat({xyz, interpolate(xyz, l1_xyz, l1), interpolate(xyz, l2_xyz, l2),
                            interpolate(xyz, l3_xyz, l3), interpolate(xyz, l4_xyz, l4)},
                           -1)
                    .transpose(1, 2);
    std::vector<torch::Tensor> expanded;
    for (const auto& branch : *branches) expanded.push_back(branch->as<torch::nn::Sequential>()->forward(feat));
    // FACT: assert (lambda s: is_copy_of(s.transpose(1, 2).reshape(2, 4, 15), s))(torch.stack([torch.randn(2, 4, 5) for _ in range(3)], 1))
    auto up_feat = torch::stack(expanded, 1).transpose(1, 2).reshape({B, -1, cfg.up_ratio * N});  // EXPECT: tensor-reshape-non-contiguous
    return regressor->forward(up_feat);
  }

  Config cfg;
  SetAbstraction sa1{nullptr}, sa2{nullptr}, sa3{nullptr}, sa4{nullptr};
  torch::nn::ModuleList branches;
  torch::nn::Sequential regressor{nullptr};
};
TORCH_MODULE(PUNet);

torch::Tensor chamfer_loss(const torch::Tensor& pred, const torch::Tensor& gt) {
  auto d = square_distance(pred, gt);
  return std::get<0>(d.min(2)).mean() + std::get<0>(d.min(1)).mean();
}

torch::Tensor repulsion_loss(const torch::Tensor& pred, const Config& cfg) {
  auto d = square_distance(pred, pred);
  // matmul-based distances are not exactly symmetric
  // FACT: assert raises(lambda: (lambda a: a.add_(a.transpose(1, 2)))(torch.rand(2, 4, 4)), "single memory location")
  d.add_(d.transpose(1, 2)).mul_(0.5);  // EXPECT: tensor-inplace-overlap
  auto knn_d2 = std::get<0>(d.topk(cfg.repulsion_k + 1, -1, /*largest=*/false))
                    .narrow(-1, 1, cfg.repulsion_k)
                    .clamp_min(1e-12);
  auto dist = torch::sqrt(knn_d2);
  auto h = torch::tensor(cfg.repulsion_h);
  auto weight = torch::exp(-knn_d2 / (h * h));  // LOOKALIKE: tensor-device-mismatch -- h is a 0-dim CPU tensor, which may meet CUDA operands
  // FACT: assert backward_fails(lambda: (lambda x: (lambda w: (w.mul_(torch.tensor([1.0, 0.0, 1.0])), ((1.0 - x) * w).sum().backward()))(torch.exp(-x)))(torch.rand(3, requires_grad=True) * 1.0))
  weight.mul_((dist < h).to(weight.scalar_type()));  // EXPECT: tensor-inplace-on-saved
  return ((h - dist) * weight).mean();
}

// Mean distance of each seed's r generated points from their centre; a value near
// zero means the expansion branches collapsed onto each other.
torch::Tensor branch_spread(const torch::Tensor& coords, int64_t up_ratio) {
  const auto B = coords.size(0);
  // FACT: assert (lambda c: is_view_of(c.transpose(1, 2).reshape(2, 4, 5, 3), c))(torch.randn(2, 3, 20))
  auto children = coords.transpose(1, 2).reshape({B, up_ratio, -1, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- only splits one dim of the transposed tensor, still a view
  return (children - children.mean(1, true)).norm(2, -1).mean();
}

struct PatchBatch {
  torch::Tensor sparse, dense, centroid, radius;
};

double train_epoch(PUNet& model, torch::optim::Optimizer& opt, const std::vector<PatchBatch>& data,
                   const Config& cfg, torch::Device device, std::vector<torch::Tensor>& rep_history) {
  model->train();
  auto total = torch::zeros({}, torch::TensorOptions().device(device));
  auto cd_world = torch::zeros({}, torch::TensorOptions().device(device));
  for (const auto& batch : data) {
    auto input = batch.sparse.to(device);
    auto gt = batch.dense.to(device);
    auto radius = batch.radius.to(device);
    auto centroid = batch.centroid.to(device);
    // FACT: assert (lambda a: shares_storage(a.to("cpu"), a))(torch.randn(2, 8, 3))
    input.add_(torch::randn_like(input).mul_(cfg.jitter_sigma).clamp_(-cfg.jitter_clip, cfg.jitter_clip));  // EXPECT: tensor-alias-then-mutate

    auto coords = model->forward(input);
    auto pred = coords.transpose(1, 2);
    auto cd = chamfer_loss(pred, gt);
    auto rep = repulsion_loss(pred, cfg);
    auto loss = cd + cfg.repulsion_weight * rep;

    // Chamfer distance in the units of the original scan, for the log.
    // FACT: assert backward_fails(lambda: (lambda p: (lambda l: (p.detach().mul_(2.0), l.backward()))((p * p).sum()))(torch.randn(2, 3, 5, requires_grad=True).transpose(1, 2) * 1.0))
    auto pred_world = pred.detach();
    pred_world.mul_(radius).add_(centroid);  // EXPECT: tensor-inplace-on-detached
    cd_world += chamfer_loss(pred_world, gt * radius + centroid);  // LOOKALIKE: tensor-sync-in-loop -- accumulated on the device, read after the epoch

    opt.zero_grad();
    loss.backward();
    opt.step();

    total += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- the detached loss carries no graph
    rep_history.push_back(rep);  // EXPECT: tensor-graph-kept-across-iterations
  }
  const auto n = static_cast<double>(data.size());
  std::cout << "  cd(world) " << cd_world.item<double>() / n << "\n";
  return total.item<double>() / n;
}

void load_pretrained(PUNet& model, const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    torch::Tensor src;
    if (archive.try_read(p.key(), src)) {
      p.value().data().copy_(src);  // LOOKALIKE: tensor-inplace-on-detached -- writing the parameter is the point, under NoGradGuard
    }
  }
}

// Upsamples a whole scan: overlapping kNN patches around FPS seeds, each normalised
// into the unit sphere, then the union is resampled to up_ratio * N points.
torch::Tensor upsample_cloud(PUNet& model, const torch::Tensor& cloud, const Config& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t N = cloud.size(0), K = cfg.n_points;
  const int64_t n_seeds = std::max<int64_t>(1, 3 * N / K);
  auto pts = cloud.unsqueeze(0).to(device);
  auto seeds = index_points(pts, farthest_point_sample(pts, n_seeds)).squeeze(0);

  std::vector<torch::Tensor> outputs;
  for (int64_t s = 0; s < n_seeds; s += cfg.patches_per_batch) {
    const int64_t P = std::min(cfg.patches_per_batch, n_seeds - s);
    auto ref = cloud.to(device);  // EXPECT: tensor-clone-in-loop
    auto idx = knn(seeds.narrow(0, s, P).unsqueeze(0), ref.unsqueeze(0), K).squeeze(0);
    // FACT: assert is_contiguous(torch.randn(1, 6, 50).topk(4, -1, largest=False)[1].squeeze(0)) and is_contiguous(torch.randn(50, 3).index_select(0, torch.arange(12)))
    auto patch = ref.index_select(0, idx.view(-1)).view({P, K, 3});  // LOOKALIKE: tensor-view-non-contiguous -- topk and index_select both return contiguous tensors
    auto centroid = patch.mean(1, true);
    auto centered = patch.clone();  // EXPECT: tensor-unnecessary-clone
    centered.sub_(centroid);
    auto radius = centered.norm(2, -1, true).amax(1, true);
    // FACT: assert (lambda p: is_copy_of(p.norm(2, -1, True).amax(1, True), p))(torch.randn(2, 5, 3))
    centered.div_(radius);  // LOOKALIKE: tensor-inplace-overlap -- radius is a new reduction result, not a view of centered
    auto out = model->forward(centered);
    // FACT: assert (lambda y: not is_contiguous(y) and is_copy_of(y.reshape(-1, 3), y))(torch.randn(4, 3, 20).transpose(1, 2) * torch.rand(4, 1, 1) + torch.rand(4, 1, 3))
    outputs.push_back((out.transpose(1, 2) * radius + centroid).reshape({-1, 3}));  // EXPECT: tensor-reshape-non-contiguous
  }
  auto dense = torch::cat(outputs, 0).unsqueeze(0);
  auto keep = farthest_point_sample(dense, N * cfg.up_ratio);
  return index_points(dense, keep).squeeze(0).cpu();
}

std::vector<PatchBatch> make_synthetic_patches(const Config& cfg, int64_t n_batches, int64_t batch_size) {
  std::vector<PatchBatch> data;
  for (int64_t i = 0; i < n_batches; ++i) {
    auto dense = torch::randn({batch_size, cfg.n_points * cfg.up_ratio, 3});
    dense = dense / dense.norm(2, -1, true);
    auto sparse = dense.narrow(1, 0, cfg.n_points).contiguous();
    data.push_back({sparse, dense, torch::rand({batch_size, 1, 3}), torch::rand({batch_size, 1, 1}) + 0.5});
  }
  return data;
}

}  // namespace punet

int main(int argc, char** argv) {
  using namespace punet;
  torch::manual_seed(7);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Config cfg;
  PUNet model(cfg);
  if (argc > 1) load_pretrained(model, argv[1]);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));

  auto data = make_synthetic_patches(cfg, 4, 2);
  for (auto& b : data) {
    b.sparse = b.sparse.to(device);
    b.dense = b.dense.to(device);
    b.centroid = b.centroid.to(device);
    b.radius = b.radius.to(device);
  }
  std::vector<torch::Tensor> rep_history;
  for (int epoch = 0; epoch < 2; ++epoch) {
    const double loss = train_epoch(model, opt, data, cfg, device, rep_history);
    {
      torch::NoGradGuard no_grad;
      auto spread = branch_spread(model->forward(data[0].sparse.to(device)), cfg.up_ratio);
      std::cout << "epoch " << epoch << " loss " << loss << " spread " << spread.item<double>() << "\n";
    }
  }

  auto scan = torch::rand({4096, 3});
  auto dense = upsample_cloud(model, scan, cfg, device);
  std::cout << "upsampled " << scan.size(0) << " -> " << dense.size(0) << " points\n";
  return 0;
}
