// LiDAR semantic segmentation on a voxel grid.
//
// Points are voxelised on a sensor-centred grid (scatter-mean of the point features per
// occupied voxel), a few 3D convolutions on the dense grid stand in for a sparse backbone
// (masked by occupancy), and the voxel logits are gathered back to the points. Training uses
// a class-weighted cross entropy, validation reports per-class IoU / mIoU.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct VoxelConfig {
  std::vector<int64_t> grid{64, 64, 16};  // X, Y, Z voxels, sensor at the centre
  double voxel_size = 0.4;                // metres
  int64_t in_channels = 4;                // x, y, z, intensity
  int64_t width = 32;
  int64_t num_classes = 20;
  int64_t batch_size = 4;
  double lr = 2e-3;
  int64_t epochs = 10;
  int64_t log_every = 20;
};

struct Scan {
  torch::Tensor points;  // [P, 4] float: x, y, z, intensity
  torch::Tensor labels;  // [P] int64, -1 = unlabelled
};

struct Voxelized {
  torch::Tensor feats;    // [M, C] mean point feature per occupied voxel
  torch::Tensor keys;     // [M] b * X*Y*Z + x * Y*Z + y * Z + z
  torch::Tensor inverse;  // [P] voxel of every point
  torch::Tensor counts;   // [M] points per voxel
  int64_t batch = 0;
};

// Random global scaling and rotation about z.
torch::Tensor augment_xyz(const torch::Tensor& xyz, double scale, double yaw) {
  torch::Tensor out = xyz;
  // FACT: p = torch.ones(6, 4); out = p.narrow(1, 0, 3); out *= 1.1; assert abs(p[0, 0].item() - 1.1) < 1e-6
  out *= scale; // EXPECT: tensor-alias-then-mutate
  const double c = std::cos(yaw), s = std::sin(yaw);
  auto rot = torch::tensor({c, -s, 0.0, s, c, 0.0, 0.0, 0.0, 1.0}).view({3, 3}).to(xyz.scalar_type());
  return torch::matmul(out, rot.t());
}

// xyz_list: one [P_b, 3] tensor per scan; feats: the scans' point features concatenated [P, C].
Voxelized voxelize(const std::vector<torch::Tensor>& xyz_list, const torch::Tensor& feats, const VoxelConfig& cfg) {
  const int64_t X = cfg.grid[0], Y = cfg.grid[1], Z = cfg.grid[2];
  auto centre = torch::tensor({X / 2, Y / 2, Z / 4});
  std::vector<torch::Tensor> keys_list;
  for (size_t b = 0; b < xyz_list.size(); ++b) {
    const auto& xyz = xyz_list[b];
    auto coords = torch::empty({xyz.size(0), 3}, torch::kLong);
    coords.copy_(xyz / cfg.voxel_size); // EXPECT: tensor-copy-narrowing
    coords += centre;
    for (int64_t d = 0; d < 3; ++d) coords.select(1, d).clamp_(0, cfg.grid[d] - 1);
    auto key = coords.select(1, 0) * (Y * Z) + coords.select(1, 1) * Z + coords.select(1, 2);
    keys_list.push_back(key + static_cast<int64_t>(b) * X * Y * Z);
  }
  auto point_keys = torch::cat(keys_list).to(feats.device());

  torch::Tensor uniq, inverse, counts;
  std::tie(uniq, inverse, counts) = torch::_unique2(point_keys, /*sorted=*/true, /*return_inverse=*/true,
                                                    /*return_counts=*/true);
  auto sums = torch::zeros({uniq.size(0), feats.size(1)}, feats.options());
  sums.index_add_(0, inverse, feats);
  torch::Tensor mean = sums;
  // FACT: s = torch.ones(3, 4); m = s; m /= torch.tensor([[2], [1], [4]]); assert shares_storage(m, s) and s[0, 0].item() == 0.5
  mean /= counts.unsqueeze(1); // LOOKALIKE: tensor-alias-then-mutate -- sums is a local scratch buffer never read again

  Voxelized v;
  v.feats = mean;
  v.keys = uniq;
  v.inverse = inverse;
  v.counts = counts;
  v.batch = static_cast<int64_t>(xyz_list.size());
  return v;
}

struct VoxelSegNetImpl : nn::Module {
  explicit VoxelSegNetImpl(const VoxelConfig& cfg)
      : grid_(cfg.grid),
        conv1_(register_module("conv1", nn::Conv3d(nn::Conv3dOptions(cfg.in_channels, cfg.width, 3).padding(1).bias(false)))),
        bn1_(register_module("bn1", nn::BatchNorm3d(cfg.width))),
        conv2_(register_module("conv2", nn::Conv3d(nn::Conv3dOptions(cfg.width, cfg.width, 3).padding(1).bias(false)))),
        bn2_(register_module("bn2", nn::BatchNorm3d(cfg.width))),
        head_(register_module("head", nn::Conv3d(nn::Conv3dOptions(cfg.width, cfg.num_classes, 1)))),
        point_head_(register_module("point_head", nn::Linear(2 * cfg.in_channels, cfg.num_classes))) {}

  // Per-point logits [P, K]; point_batch [P] holds each point's scan index.
  torch::Tensor forward(const Voxelized& v, const torch::Tensor& point_feats, const torch::Tensor& point_batch) {
    const int64_t X = grid_[0], Y = grid_[1], Z = grid_[2];
    const int64_t B = v.batch;
    const int64_t C = v.feats.size(1);

    auto dense = torch::zeros({B * X * Y * Z, C}, v.feats.options());
    dense.index_copy_(0, v.keys, v.feats);
    // FACT: d = torch.zeros(2 * 4 * 4 * 3, 5); assert is_view_of(d.view(2, 4, 4, 3, 5), d)
    auto grid = dense.view({B, X, Y, Z, C}).permute({0, 4, 1, 2, 3}); // LOOKALIKE: tensor-view-non-contiguous -- dense is a fresh contiguous buffer
    auto occ = torch::zeros({B * X * Y * Z}, v.feats.options());
    occ.index_fill_(0, v.keys, 1.0);
    occ = occ.view({B, 1, X, Y, Z});

    // mean input feature of the occupied voxels of each scan: a global scene descriptor
    // FACT: g = torch.zeros(2 * 4 * 4 * 3, 5).view(2, 4, 4, 3, 5).permute(0, 4, 1, 2, 3); assert raises(lambda: g.view(2, -1, 5), "view size is not compatible")
    auto scene_ctx = grid.view({B, -1, C}).sum(1) / occ.view({B, -1}).sum(1, true).clamp_min(1.0); // EXPECT: tensor-view-non-contiguous

    auto h = torch::relu(bn1_(conv1_(grid)));
    h.mul_(occ); // EXPECT: tensor-inplace-on-saved
    auto out = bn2_(conv2_(h)) * occ;
    out += h; // LOOKALIKE: tensor-inplace-on-saved -- out is the product's result; mul saved its operands, not its result
    out = torch::relu(out);

    auto logits = head_(out);  // [B, K, X, Y, Z]
    const int64_t K = logits.size(1);
    // FACT: g = torch.randn(2, 5, 4, 4, 3); assert is_view_of(g.permute(0, 2, 3, 4, 1).flatten(1, 3), g)
    auto vox_major = logits.permute({0, 2, 3, 4, 1}).flatten(1, 3); // LOOKALIKE: tensor-reshape-non-contiguous -- X, Y, Z stay adjacent in memory: a view
    // FACT: g = torch.randn(2, 5, 4, 4, 3); v = g.permute(0, 2, 3, 4, 1).flatten(1, 3); assert is_copy_of(v.reshape(-1, 5), g)
    auto per_voxel = vox_major.reshape({-1, K}); // EXPECT: tensor-reshape-non-contiguous
    auto voxel_logits = per_voxel.index_select(0, v.keys);
    auto point_logits = voxel_logits.index_select(0, v.inverse);
    auto ctx = scene_ctx.index_select(0, point_batch);
    return point_logits + point_head_(torch::cat({point_feats, ctx}, 1));
  }

  std::vector<int64_t> grid_;
  nn::Conv3d conv1_;
  nn::BatchNorm3d bn1_;
  nn::Conv3d conv2_;
  nn::BatchNorm3d bn2_;
  nn::Conv3d head_;
  nn::Linear point_head_;
};
TORCH_MODULE(VoxelSegNet);

// Inverse log-frequency class weights (ENet style).
torch::Tensor class_weights(const std::vector<Scan>& scans, int64_t K) {
  auto hist = torch::zeros({K}, torch::kLong);
  for (const auto& s : scans) {
    hist += torch::bincount(s.labels.masked_select(s.labels.ge(0)), {}, K);
  }
  // FACT: h = torch.zeros(5, dtype=torch.long); assert is_copy_of(h.to(torch.float), h)
  auto freq = hist.to(torch::kFloat);
  freq /= freq.sum().clamp_min(1.0); // LOOKALIKE: tensor-alias-then-mutate -- hist is int64: to(kFloat) made a copy
  std::cout << "points per class: " << hist << "\n";
  return torch::log(freq + 1.02).reciprocal();
}

std::vector<double> per_class_iou(const torch::Tensor& pred, const torch::Tensor& target, int64_t K) {
  auto valid = target.ge(0);
  auto idx = target.masked_select(valid) * K + pred.masked_select(valid);
  // FACT: b = torch.bincount(torch.tensor([0, 3, 3, 5]), minlength=9); assert is_view_of(b.view(3, 3), b)
  auto conf = torch::bincount(idx, {}, K * K).view({K, K}); // LOOKALIKE: tensor-view-non-contiguous -- bincount returns a fresh contiguous vector
  // FACT: c = torch.bincount(torch.tensor([0, 3, 3]), minlength=4).view(2, 2); assert is_copy_of(c.diagonal().to(torch.double), c)
  auto iou = conf.diagonal().to(torch::kDouble);
  auto uni = (conf.sum(0) + conf.sum(1) - conf.diagonal()).to(torch::kDouble);
  iou /= uni.clamp_min(1.0); // LOOKALIKE: tensor-alias-then-mutate -- conf is int64 (bincount): to(kDouble) copies
  auto acc = conf.diagonal().sum().to(torch::kDouble) / conf.sum().clamp_min(1);
  std::cout << "overall accuracy " << acc.item<double>() << "\n";
  iou = iou.contiguous();
  return std::vector<double>(iou.data_ptr<double>(), iou.data_ptr<double>() + K);
}

void train(VoxelSegNet& net, const std::vector<Scan>& scans, const VoxelConfig& cfg, torch::Device device) {
  net->to(device);
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(1e-4));
  auto weights = class_weights(scans, cfg.num_classes);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> scale_dist(0.95, 1.05), yaw_dist(-M_PI, M_PI);
  const auto n = static_cast<int64_t>(scans.size());

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    net->train();
    for (int64_t start = 0; start + cfg.batch_size <= n; start += cfg.batch_size) {
      std::vector<torch::Tensor> xyz_list, feat_list, label_list, batch_list;
      for (int64_t b = 0; b < cfg.batch_size; ++b) {
        const auto& scan = scans[static_cast<size_t>(start + b)];
        auto xyz = augment_xyz(scan.points.narrow(1, 0, 3), scale_dist(rng), yaw_dist(rng));
        xyz_list.push_back(xyz);
        feat_list.push_back(torch::cat({xyz, scan.points.narrow(1, 3, 1)}, 1));
        label_list.push_back(scan.labels);
        batch_list.push_back(torch::full({xyz.size(0)}, b, torch::kLong));
      }
      auto feats = torch::cat(feat_list).to(device);
      auto labels = torch::cat(label_list).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto point_batch = torch::cat(batch_list).to(device);
      auto vox = voxelize(xyz_list, feats, cfg);

      auto logits = net->forward(vox, feats, point_batch);
      auto loss = F::cross_entropy(logits, labels,
                                   F::CrossEntropyFuncOptions().weight(weights.to(device)).ignore_index(-1)); // EXPECT: tensor-clone-in-loop
      opt.zero_grad();
      loss.backward();
      opt.step();
      if ((start / cfg.batch_size) % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " batch " << start / cfg.batch_size << " loss " << loss.item<double>() << "\n";
      }
    }
  }
}

double validate(VoxelSegNet& net, const std::vector<Scan>& scans, const VoxelConfig& cfg, torch::Device device) {
  net->eval();
  int64_t total_pts = 0;
  for (const auto& s : scans) total_pts += s.labels.size(0);
  auto preds = torch::empty({total_pts}, torch::kLong);
  auto targets = torch::empty({total_pts}, torch::kLong);
  torch::Tensor val_loss = torch::zeros({}, torch::TensorOptions().device(device));

  int64_t off = 0;
  for (const auto& scan : scans) {
    auto feats = scan.points.to(device);
    auto labels = scan.labels.to(device);
    auto vox = voxelize({scan.points.narrow(1, 0, 3)}, feats, cfg);
    auto point_batch = torch::zeros({feats.size(0)}, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto logits = net->forward(vox, feats, point_batch);
    val_loss += F::cross_entropy(logits, labels, F::CrossEntropyFuncOptions().ignore_index(-1)); // EXPECT: tensor-graph-kept-across-iterations
    const int64_t P = logits.size(0);
    preds.narrow(0, off, P).copy_(logits.argmax(1)); // LOOKALIKE: tensor-copy-narrowing -- argmax is int64, the buffer too
    targets.narrow(0, off, P).copy_(scan.labels);
    off += P;
  }
  auto iou = per_class_iou(preds, targets, cfg.num_classes);
  double miou = 0.0;
  for (double v : iou) miou += v;
  miou /= static_cast<double>(iou.size());
  std::cout << "val loss " << val_loss.item<double>() / static_cast<double>(scans.size()) << " mIoU " << miou << "\n";
  return miou;
}

int main() {
  VoxelConfig cfg;
  std::vector<Scan> scans;
  for (int i = 0; i < 16; ++i) {
    const int64_t P = 4096;
    auto xyz = (torch::rand({P, 3}) - 0.5) * torch::tensor({25.0f, 25.0f, 6.0f});
    Scan s;
    s.points = torch::cat({xyz, torch::rand({P, 1})}, 1);
    s.labels = torch::randint(-1, cfg.num_classes, {P}, torch::kLong);
    scans.push_back(s);
  }
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  VoxelSegNet net(cfg);
  train(net, scans, cfg, device);
  validate(net, scans, cfg, device);
  return 0;
}
