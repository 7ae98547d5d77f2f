// Scan registration for a LiDAR mapping pipeline: point-to-point ICP (Besl & McKay 1992) with
// trimmed correspondences (TrICP, Chetverikov et al. 2002) and the closed-form SVD fit (Arun et
// al. 1987). Clouds arrive from the loader as [N, 3] float tensors on the host; the iterations
// run on the GPU. Two drivers: scan-to-scan odometry, and localisation of scans in a prebuilt
// georeferenced map. Poses are 4x4 homogeneous matrices, written as KITTI pose files.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

struct IcpConfig {
  int64_t max_iters = 60, check_every = 5, nn_chunk = 8192;
  double voxel = 0.25;        // downsampling grid, metres
  double max_corr_dist = 1.5; // pairs farther apart are outliers
  double trim_ratio = 0.85;   // TrICP: keep the closest 85% of the pairs
  double tolerance = 1e-5;    // stop when the RMSE moves less than this between two checks
};

struct IcpResult {
  torch::Tensor T; // [4, 4] source -> target
  double rmse = 0;
  int64_t iterations = 0;
  int64_t inliers = 0; // summed over the iterations, for the fitness report
};

// One point per occupied voxel: the centroid of the points that fall into it.
torch::Tensor voxel_downsample(const torch::Tensor &cloud, double voxel) {
  const auto N = cloud.size(0);
  auto keys = torch::empty({N, 3}, torch::kLong);
  // FACT: k = torch.empty(2, 3, dtype=torch.long); k.copy_(torch.tensor([[-0.4, 0.4, 1.5], [-1.5, 0.2, 0.0]]) / 1.0); assert k[0].tolist() == [0, 0, 1] and k[1, 0].item() == -1
  keys.copy_(cloud / voxel); // EXPECT: tensor-copy-narrowing -- truncation toward zero, not floor: -0.4 and +0.4 voxels land in one cell, so every cell on an axis is two cells wide
  keys -= std::get<0>(keys.min(0));
  auto [cells, inverse, counts] = torch::unique_dim(keys, 0, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/true);
  auto sums = torch::zeros({cells.size(0), 3}, cloud.options());
  sums.index_add_(0, inverse, cloud);
  return sums / counts.unsqueeze(1).to(cloud.dtype());
}

// For each source point the nearest target point, brute force in row chunks so the distance
// matrix stays a few hundred MB. Returns squared distances [N] and target indices [N].
std::tuple<torch::Tensor, torch::Tensor> nearest_neighbors(const torch::Tensor &src, const torch::Tensor &tgt,
                                                           int64_t chunk) {
  std::vector<torch::Tensor> d2, idx;
  for (int64_t s = 0; s < src.size(0); s += chunk) {
    auto rows = src.narrow(0, s, std::min(chunk, src.size(0) - s));
    auto [dmin, imin] = torch::cdist(rows, tgt).min(1);
    d2.push_back(dmin.pow(2));
    idx.push_back(imin);
  }
  return {torch::cat(d2), torch::cat(idx)};
}

// Weighted closed-form rigid fit: R, t minimising sum_i w_i |R p_i + t - q_i|^2. p, q: [M, 3]
// matched points, w: [M] weights (0 drops a pair). Returns the 4x4 transform, on p's device.
torch::Tensor best_fit_transform(const torch::Tensor &p, const torch::Tensor &q, const torch::Tensor &w) {
  auto wn = (w / w.sum().clamp_min(1e-12)).unsqueeze(1);
  auto mu_p = (p * wn).sum(0), mu_q = (q * wn).sum(0);
  auto H = ((p - mu_p) * wn).t().mm(q - mu_q); // 3x3 cross-covariance
  auto [U, S, Vh] = torch::linalg_svd(H);
  auto V = Vh.t();
  // det(V U^T) = -1: the best orthogonal fit is a reflection (flat scenes). Flip the axis of the
  // smallest singular value; kept on the device, no host round trip per iteration.
  auto D = torch::ones({3}, p.options());
  D[2] = torch::det(V.mm(U.t())).sign();
  auto R = (V * D).mm(U.t()); // LOOKALIKE: tensor-device-mismatch -- D is made with p's options, on p's device
  auto t = mu_q - R.mv(mu_p);
  auto T = torch::eye(4, p.options());
  // FACT: T = torch.eye(4); b = T.narrow(0, 0, 3).narrow(1, 0, 3); b.copy_(torch.full((3, 3), 2.0)); assert is_view_of(b, T) and T[0, 0].item() == 2.0 and T[3, 3].item() == 1.0
  T.narrow(0, 0, 3).narrow(1, 0, 3).copy_(R); // LOOKALIKE: tensor-alias-then-mutate -- an explicit view of the identity this function just made
  T.narrow(0, 0, 3).select(1, 3).copy_(t);
  return T;
}

// Applies a 4x4 transform to [N, 3] row points.
torch::Tensor transform_points(const torch::Tensor &pts, const torch::Tensor &T) {
  return pts.mm(T.narrow(0, 0, 3).narrow(1, 0, 3).t()) + T.narrow(0, 0, 3).select(1, 3);
}

class IcpRegistrar {
public:
  explicit IcpRegistrar(const IcpConfig &cfg) : cfg_(cfg), device_(torch::kCUDA) {}

  // source [N, 3] and target [M, 3] on the host; init [4, 4]: the initial guess source -> target.
  IcpResult align(const torch::Tensor &source, const torch::Tensor &target, const torch::Tensor &init) {
    torch::NoGradGuard no_grad;
    auto T = init.to(device_, torch::kFloat);
    auto cur = transform_points(source.to(device_), T);
    const auto keep = std::max<int64_t>(1, static_cast<int64_t>(cfg_.trim_ratio * cur.size(0)));
    IcpResult res;
    torch::Tensor rmse;
    double last_rmse = std::numeric_limits<double>::infinity();
    for (int64_t it = 0; it < cfg_.max_iters; ++it) {
      ++res.iterations;
      auto tgt = target.to(device_); // EXPECT: tensor-clone-in-loop -- the target cloud never changes: it is uploaded again at every iteration
      auto [d2, idx] = nearest_neighbors(cur, tgt, cfg_.nn_chunk);
      auto valid = d2 < cfg_.max_corr_dist * cfg_.max_corr_dist;
      // FACT: d2 = torch.rand(7); d = d2.clone(); d.sqrt_(); assert torch.equal(d, d2.sqrt()) and is_copy_of(d, d2)
      auto dist = d2.clone(); // EXPECT: tensor-unnecessary-clone -- square-rooted in place on the next line: d2.sqrt() makes it in one pass
      dist.sqrt_();
      auto cutoff = std::get<0>(dist.kthvalue(keep));
      auto w = (valid & (dist <= cutoff)).to(cur.dtype());
      auto step = best_fit_transform(cur, tgt.index_select(0, idx), w);
      cur = transform_points(cur, step);
      T = step.mm(T);
      rmse = ((d2 * w).sum() / w.sum().clamp_min(1)).sqrt();
      res.inliers += (w > 0).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU at every iteration only to add up a statistic
      if ((it + 1) % cfg_.check_every == 0) {
        const double e = rmse.item<double>(); // LOOKALIKE: tensor-sync-in-loop -- every check_every iterations, and the value decides when to stop
        if (std::abs(last_rmse - e) < cfg_.tolerance)
          break;
        last_rmse = e;
      }
    }
    res.T = T;
    res.rmse = rmse.item<double>(); // LOOKALIKE: tensor-sync-in-loop -- once, after the iterations
    return res;
  }

private:
  IcpConfig cfg_;
  torch::Device device_;
};

// Scan-to-scan odometry: each scan is registered to the previous one and the relative motions
// are chained into world poses; the last relative motion is the next initial guess (constant
// velocity). Returns one [4, 4] world pose per scan.
std::vector<torch::Tensor> run_odometry(IcpRegistrar &icp, const std::vector<torch::Tensor> &scans, const IcpConfig &cfg) {
  std::vector<torch::Tensor> poses;
  auto world_T = torch::eye(4);
  poses.push_back(world_T.clone());
  auto prev = voxel_downsample(scans[0], cfg.voxel);
  auto guess = torch::eye(4);
  for (size_t k = 1; k < scans.size(); ++k) {
    // FACT: s = torch.randn(5, 3); assert s.to(torch.float32) is s
    auto pts = scans[k].to(torch::kFloat); // LOOKALIKE: tensor-clone-in-loop -- a new scan every iteration, and float32 already: to() copies nothing
    auto cur = voxel_downsample(pts, cfg.voxel);
    auto res = icp.align(cur, prev, guess);
    // res.T maps scan k into scan k - 1: T_world_k = T_world_{k-1} * T
    world_T = world_T.mm(res.T); // EXPECT: tensor-device-mismatch -- res.T was estimated on the GPU and never brought back; world_T is a host tensor
    poses.push_back(world_T.clone()); // LOOKALIKE: tensor-clone-in-loop -- world_T is a new pose every scan; each copy is kept
    std::cout << "scan " << k << ": " << res.iterations << " iterations, rmse " << res.rmse << " m, "
              << res.inliers / std::max<int64_t>(res.iterations, 1) << " pairs per iteration\n";
    guess = res.T;
    prev = cur;
  }
  return poses;
}

// Localisation in a prebuilt map (a downsampled cloud in UTM coordinates): every scan is
// registered to the map, starting from its GNSS pose. Returns scan -> UTM poses.
std::vector<torch::Tensor> localize(IcpRegistrar &icp, const torch::Tensor &map_cloud,
                                    const std::vector<torch::Tensor> &scans, const std::vector<torch::Tensor> &gnss_poses) {
  // UTM eastings are ~5e5 m: float32 keeps only a few centimetres there, so the map is moved to
  // its centroid and the poses with it.
  auto origin = map_cloud.mean(0);
  auto map_local = map_cloud.contiguous();
  // FACT: m = torch.randn(50, 3) + 4e5; l = m.contiguous(); l -= m.mean(0); assert shares_storage(l, m) and m.abs().max().item() < 1e4
  map_local -= origin; // EXPECT: tensor-alias-then-mutate -- contiguous() of the loaded map is the map itself: the caller's georeferenced cloud is shifted
  auto to_local = torch::eye(4), from_local = torch::eye(4);
  to_local.narrow(0, 0, 3).select(1, 3).copy_(-origin);
  from_local.narrow(0, 0, 3).select(1, 3).copy_(origin);
  std::vector<torch::Tensor> out;
  for (size_t k = 0; k < scans.size(); ++k) {
    auto res = icp.align(scans[k], map_local, to_local.mm(gnss_poses[k]));
    out.push_back(from_local.mm(res.T.cpu())); // LOOKALIKE: tensor-sync-in-loop, tensor-clone-in-loop -- a new pose per scan, brought back to be kept
    if (res.rmse > 0.3)
      std::cout << "scan " << k << ": poor fit (rmse " << res.rmse << " m), check the GNSS prior\n";
  }
  return out;
}

// KITTI odometry format: the top 3x4 block of each pose, row-major, 12 numbers per line.
void write_kitti(const std::vector<torch::Tensor> &poses, const std::string &path) {
  auto P = torch::stack(poses); // [K, 4, 4]
  // FACT: P = torch.randn(6, 4, 4); assert is_view_of(P.narrow(1, 0, 3).view(6, 12), P)
  auto rows = P.narrow(1, 0, 3).view({P.size(0), 12}); // LOOKALIKE: tensor-view-non-contiguous -- the first three rows of a 4x4 block are still one run of 12 values
  auto out = torch::empty({P.size(0), 12}, torch::kDouble);
  // FACT: o = torch.empty(2, 12, dtype=torch.float64); s = torch.randn(2, 12); o.copy_(s); assert torch.equal(o.float(), s)
  out.copy_(rows); // LOOKALIKE: tensor-copy-narrowing -- float32 into float64 widens: nothing is lost
  auto acc = out.accessor<double, 2>();
  std::ofstream os(path);
  for (int64_t i = 0; i < out.size(0); ++i) {
    for (int64_t j = 0; j < 12; ++j)
      os << (j ? " " : "") << acc[i][j];
    os << "\n";
  }
}

// The registered scans as one cloud of [P, 3] rows, for the PLY writer of the map viewer.
torch::Tensor assemble_map(const std::vector<torch::Tensor> &scans, const std::vector<torch::Tensor> &poses, double voxel) {
  std::vector<torch::Tensor> chunks;
  for (size_t k = 0; k < scans.size(); ++k) {
    auto pts = voxel_downsample(scans[k], voxel);
    const auto &T = poses[k];
    auto R = T.narrow(0, 0, 3).narrow(1, 0, 3);
    auto t = T.narrow(0, 0, 3).select(1, 3);
    // column-vector convention, as in the papers: p' = R p + t on [3, N]
    auto world = (R.mm(pts.t()) + t.unsqueeze(1)).t();
    // FACT: R = torch.randn(3, 3); s = torch.randn(5, 3); t = torch.randn(3); a = (R.mm(s.t()) + t.unsqueeze(1)).t(); assert raises(lambda: a.view(-1), "view size is not compatible")
    chunks.push_back(world.view({-1})); // EXPECT: tensor-view-non-contiguous -- world is the transpose of a [3, N] result: a point's x y z are N apart, view throws
  }
  auto flat = torch::cat(chunks);
  // FACT: c = torch.cat([torch.randn(6), torch.randn(9)]); assert is_view_of(c.reshape(-1, 3), c)
  return flat.reshape({-1, 3}); // LOOKALIKE: tensor-reshape-non-contiguous -- a cat result is contiguous: a view
}

// Whole drive: odometry, pose file, map cloud.
torch::Tensor map_drive(const std::vector<torch::Tensor> &scans, const IcpConfig &cfg, const std::string &pose_path) {
  IcpRegistrar icp(cfg);
  auto poses = run_odometry(icp, scans, cfg);
  write_kitti(poses, pose_path);
  return assemble_map(scans, poses, 2 * cfg.voxel);
}
