// Point-cloud segmentation (DGCNN / PointNet++ flavour): augmentation, voxel keys, farthest point
// sampling, kNN grouping with gather, EdgeConv over [B, N, K] neighbourhoods, a global max-pool fused per point.
#include <torch/torch.h>
#include <tuple>
#include <vector>

struct SegConfig {
  int64_t k = 20;
  int64_t emb = 64;
  int64_t global_dim = 256;
  int64_t n_classes = 13;
  double voxel = 0.05;
  double jitter = 0.01;
};

// Training-time augmentation of one cloud [N, 3]: random anisotropic scale, then jitter.
torch::Tensor augment(const torch::Tensor &cloud, double jitter) {
  auto pts = cloud.to(torch::kFloat); // some loaders hand over float64 clouds
  auto scale = torch::empty({1, 3}).uniform_(0.8, 1.25);
  // FACT: c = torch.randn(9, 3); c0 = c.clone(); p = c.to(torch.float32); p.mul_(torch.empty(1, 3).uniform_(0.8, 1.25)); assert shares_storage(p, c) and not torch.equal(c, c0)
  pts.mul_(scale); // EXPECT: tensor-alias-then-mutate -- to(kFloat) of a float32 cloud is the cloud: the dataset is rescaled every epoch
  return pts + jitter * torch::randn_like(pts);
}

// Integer voxel cell of every point [B, N, 3], used as a hash key to drop duplicates before sampling.
torch::Tensor voxel_keys(const torch::Tensor &xyz, double voxel) {
  auto cells = torch::empty(xyz.sizes(), torch::kLong);
  // FACT: c = torch.empty(3, dtype=torch.long); c.copy_(torch.tensor([-0.4, 0.4, -1.2]) / 0.5); assert c.tolist() == [0, 0, -2] and torch.floor(torch.tensor([-0.4, 0.4, -1.2]) / 0.5).tolist() == [-1, 0, -3]
  cells.copy_(xyz / voxel); // EXPECT: tensor-copy-narrowing -- truncation toward zero merges the cells on both sides of 0 (floor was meant)
  return cells;
}

// Farthest point sampling: xyz [B, N, 3] -> indices [B, S].
torch::Tensor farthest_point_sample(const torch::Tensor &xyz, int64_t S) {
  const auto B = xyz.size(0), N = xyz.size(1);
  auto centroids = torch::zeros({B, S}, torch::kLong);
  auto dist = torch::full({B, N}, 1e10);
  auto farthest = torch::randint(0, N, {B}, torch::kLong);
  auto batch = torch::arange(B);
  for (int64_t i = 0; i < S; ++i) {
    // FACT: c = torch.zeros(2, 4, dtype=torch.long); f = torch.max(torch.randn(2, 9), -1)[1]; c.select(1, 0).copy_(f); assert f.dtype == torch.long and torch.equal(c[:, 0], f)
    centroids.select(1, i).copy_(farthest); // LOOKALIKE: tensor-copy-narrowing -- int64 indices into an int64 buffer
    auto c = xyz.index({batch, farthest}).unsqueeze(1); // [B, 1, 3]
    dist = torch::min(dist, (xyz - c).pow(2).sum(-1));
    farthest = std::get<1>(dist.max(-1));
  }
  return centroids;
}

// points [B, N, C], idx [B, S, K] -> [B, S, K, C]
torch::Tensor gather_points(const torch::Tensor &points, const torch::Tensor &idx) {
  const auto B = idx.size(0), S = idx.size(1), K = idx.size(2), C = points.size(2);
  auto flat = idx.reshape({B, S * K, 1}).expand({-1, -1, C});
  // FACT: p = torch.randn(2, 7, 3); i = torch.randint(0, 7, (2, 4, 5)); g = p.gather(1, i.reshape(2, 20, 1).expand(-1, -1, 3)); assert is_contiguous(g) and is_view_of(g.view(2, 4, 5, 3), g)
  return points.gather(1, flat).view({B, S, K, C}); // LOOKALIKE: tensor-view-non-contiguous -- gather allocates its output in the index's shape
}

// x [B, N, C] -> indices of the k nearest points [B, N, k]
torch::Tensor knn(const torch::Tensor &x, int64_t k) {
  return std::get<1>(torch::cdist(x, x).topk(k, -1, /*largest=*/false));
}

struct EdgeConvImpl : torch::nn::Module {
  EdgeConvImpl(int64_t in, int64_t out, int64_t k) : k_(k) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2 * in, out, 1).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(out));
  }
  // x [B, N, C] (point-major) -> [B, out, N]
  torch::Tensor forward(const torch::Tensor &x) {
    auto nbrs = gather_points(x, knn(x, k_));      // [B, N, K, C]
    auto center = x.unsqueeze(2).expand_as(nbrs); // [B, N, K, C], stride 0 along K
    // FACT: p = torch.randn(2, 7, 3, requires_grad=True); i = torch.randint(0, 7, (2, 7, 4)); n = p.gather(1, i.reshape(2, 28, 1).expand(-1, -1, 3)).view(2, 7, 4, 3); c = p.unsqueeze(2).expand(-1, -1, 4, -1); n.sub_(c); n.sum().backward(); assert c.stride(2) == 0
    nbrs.sub_(center); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded centre is only read; nbrs is gather's own output
    auto edge = torch::cat({nbrs, center}, 3).permute({0, 3, 1, 2}); // [B, 2C, N, K]
    auto h = torch::leaky_relu(bn(conv(edge)), 0.2);
    return std::get<0>(h.max(3)); // max over the neighbourhood: [B, out, N]
  }
  int64_t k_;
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(EdgeConv);

struct PointSegNetImpl : torch::nn::Module {
  explicit PointSegNetImpl(const SegConfig &cfg) {
    ec1 = register_module("ec1", EdgeConv(3, cfg.emb, cfg.k));
    ec2 = register_module("ec2", EdgeConv(cfg.emb, cfg.emb, cfg.k));
    glob = register_module("glob", torch::nn::Conv1d(torch::nn::Conv1dOptions(2 * cfg.emb, cfg.global_dim, 1)));
    local = register_module("local", torch::nn::Conv1d(torch::nn::Conv1dOptions(2 * cfg.emb, cfg.global_dim, 1)));
    seg = register_module("seg", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.global_dim, cfg.n_classes, 1)));
  }
  // points [B, N, 3] -> per-point logits [B, n_classes, N]
  torch::Tensor forward(const torch::Tensor &points) {
    const auto N = points.size(1);
    auto f1 = ec1(points);                                        // [B, emb, N]
    auto f2 = ec2(f1.transpose(1, 2));                            // kNN again in feature space
    auto f = torch::cat({f1, f2}, 1);                             // [B, 2 emb, N]
    auto global = std::get<0>(glob(f).max(2, /*keepdim=*/true)); // [B, G, 1]
    auto ctx = global.expand({-1, -1, N});                        // the shape context of every point
    // FACT: g = torch.randn(2, 8, 1); l = torch.randn(2, 8, 5); assert raises(lambda: g.expand(-1, -1, 5).add_(l), "more than one element of the written-to tensor refers to a single memory location")
    ctx.add_(local(f)); // EXPECT: tensor-inplace-on-expanded -- ctx has stride 0 along N
    return seg(torch::relu(ctx));
  }
  EdgeConv ec1{nullptr}, ec2{nullptr};
  torch::nn::Conv1d glob{nullptr}, local{nullptr}, seg{nullptr};
};
TORCH_MODULE(PointSegNet);

double train_epoch(PointSegNet &net, torch::optim::Adam &opt, const std::vector<torch::Tensor> &clouds,
                   const std::vector<torch::Tensor> &labels, const SegConfig &cfg, size_t batch) {
  net->train();
  double total = 0;
  int64_t steps = 0;
  for (size_t s = 0; s + batch <= clouds.size(); s += batch) {
    std::vector<torch::Tensor> xs, ys;
    for (size_t j = s; j < s + batch; ++j) {
      xs.push_back(augment(clouds[j], cfg.jitter));
      ys.push_back(labels[j]);
    }
    auto logits = net->forward(torch::stack(xs)); // [B, n_classes, N]
    // FACT: l = torch.randn(2, 5, 6); assert raises(lambda: l.transpose(1, 2).view(-1, 5), "view size is not compatible")
    auto flat = logits.transpose(1, 2).view({-1, logits.size(1)}); // EXPECT: tensor-view-non-contiguous -- [B, N, n_classes] after the transpose
    auto loss = torch::nn::functional::cross_entropy(flat, torch::stack(ys).view({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step();
    total += loss.item<double>();
    ++steps;
  }
  return total / std::max<int64_t>(steps, 1);
}
