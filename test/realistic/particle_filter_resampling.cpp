// Monte Carlo localisation for a fleet of warehouse robots, batched on the GPU: B robots, N
// particles each, pose (x, y, theta) in the map frame. The motion model applies the odometry
// increment in each particle's own frame with speed-proportional noise; the measurement model is
// the likelihood field (Thrun et al., Probabilistic Robotics, ch. 6.4): every beam end point is
// looked up in a precomputed distance-to-nearest-obstacle map with grid_sample. Systematic
// resampling runs per robot when its effective sample size drops below a threshold; the pose
// estimate is the weighted mean with a circular mean for the heading. A replay driver scores the
// filter against the ground truth of a recorded log.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace F = torch::nn::functional;

struct PfConfig {
  int64_t robots = 16, particles = 4096, beams = 181, history = 10;
  double fov = 3.14159265358979323846, max_range = 12.0, sigma_hit = 0.2, z_hit = 0.9, z_rand = 0.1;
  double alpha_trans = 0.05, alpha_rot = 0.02, roughen = 0.01, resample_ratio = 0.5, dt = 0.1;
  std::vector<double> init_std = {0.5, 0.5, 0.2};
};

struct DistanceMap {
  torch::Tensor field; // [H, W] float32, metres to the nearest occupied cell
  double resolution = 0.05, origin_x = 0.0, origin_y = 0.0;
};

class BatchedParticleFilter {
public:
  BatchedParticleFilter(const DistanceMap &map, const torch::Tensor &initial_poses, const PfConfig &cfg)
      : cfg_(cfg), device_(torch::kCUDA), map_(map) {
    const auto B = cfg.robots, N = cfg.particles;
    const auto H = map.field.size(0), W = map.field.size(1);
    opts_ = torch::TensorOptions().dtype(torch::kFloat).device(device_);
    field_ = map.field.to(device_).view({1, 1, H, W});
    extent_ = torch::tensor({W * map.resolution, H * map.resolution}, opts_);
    origin_ = torch::tensor({map.origin_x, map.origin_y}, opts_);
    angles_ = torch::linspace(-cfg.fov / 2, cfg.fov / 2, cfg.beams);
    init_std_ = torch::tensor(cfg.init_std, opts_);
    // Gaussian cloud around each robot's initial guess.
    particles_ = initial_poses.to(device_).unsqueeze(1).expand({B, N, 3});
    // FACT: p = torch.randn(2, 3).unsqueeze(1).expand(2, 5, 3); assert raises(lambda: p.add_(torch.randn(2, 5, 3) * 0.5), "more than one element of the written-to tensor refers to a single memory location")
    particles_.add_(torch::randn({B, N, 3}, opts_) * init_std_); // EXPECT: tensor-inplace-on-expanded -- every particle of a robot is the same memory location: PyTorch refuses the write
    log_w_ = torch::full({B, N}, -std::log(static_cast<double>(N)), opts_);
    history_ = torch::zeros({cfg.history, B, 3}, opts_);
  }

  // Odometry increments [B, 3] (dx, dy, dtheta in the robot frame). Returns the mean distance
  // the clouds moved, which the driver compares with the wheel odometry.
  torch::Tensor predict(const torch::Tensor &odom) {
    const auto B = particles_.size(0), N = particles_.size(1);
    auto u = odom.to(device_).unsqueeze(1); // [B, 1, 3]
    auto trans = u.narrow(2, 0, 2).norm(2, -1, /*keepdim=*/true);
    auto rot = u.narrow(2, 2, 1).abs();
    auto noise = torch::randn({B, N, 3}, opts_);
    auto dx = u.narrow(2, 0, 1) + noise.narrow(2, 0, 1) * cfg_.alpha_trans * trans;
    auto dy = u.narrow(2, 1, 1) + noise.narrow(2, 1, 1) * cfg_.alpha_trans * trans;
    auto dth = u.narrow(2, 2, 1) + noise.narrow(2, 2, 1) * (cfg_.alpha_rot * trans + cfg_.alpha_trans * rot);
    auto th = particles_.narrow(2, 2, 1);
    auto c = torch::cos(th), s = torch::sin(th);
    auto before = particles_;
    // FACT: p = torch.randn(2, 4, 3); b = p; p += torch.randn(2, 4, 3); assert shares_storage(b, p) and torch.equal(p - b, torch.zeros(2, 4, 3))
    particles_ += torch::cat({c * dx - s * dy, s * dx + c * dy, dth}, 2); // EXPECT: tensor-alias-then-mutate -- 'before' is the same tensor: the displacement returned below is always zero
    particles_.narrow(2, 2, 1).remainder_(2 * M_PI);
    return (particles_ - before).narrow(2, 0, 2).norm(2, -1).mean(1);
  }

  // Log-likelihood [B, N] of the scans [B, R] under the likelihood field.
  torch::Tensor measurement_loglik(const torch::Tensor &scan) {
    const auto B = particles_.size(0), N = particles_.size(1), R = scan.size(1);
    auto x = particles_.select(2, 0).unsqueeze(-1), y = particles_.select(2, 1).unsqueeze(-1);
    auto th = particles_.select(2, 2).unsqueeze(-1);     // [B, N, 1]
    auto beam = th + angles_; // EXPECT: tensor-device-mismatch -- the beam angles were made on the host; the particles live on the GPU
    auto r = scan.unsqueeze(1);                          // [B, 1, R]
    auto ex = x + r * torch::cos(beam), ey = y + r * torch::sin(beam);
    auto gx = (ex - origin_[0]) / extent_[0] * 2 - 1;
    auto gy = (ey - origin_[1]) / extent_[1] * 2 - 1;
    // FACT: gx = torch.randn(2, 4, 5); gy = torch.randn(2, 4, 5); g = torch.stack([gx, gy], 1).permute(0, 2, 3, 1); assert not is_contiguous(g) and is_view_of(g.view(2, 20, 1, 2), g)
    auto grid = torch::stack({gx, gy}, 1).permute({0, 2, 3, 1}).view({B, N * R, 1, 2}); // LOOKALIKE: tensor-view-non-contiguous -- the particle and beam dims stay adjacent after the permute: a view
    auto gs = F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kBorder).align_corners(false);
    // FACT: o = torch.nn.functional.grid_sample(torch.randn(1, 1, 8, 8).expand(2, -1, -1, -1), torch.rand(2, 20, 1, 2) * 2 - 1, align_corners=False); assert is_contiguous(o) and is_view_of(o.view(2, 4, 5), o)
    auto d = F::grid_sample(field_.expand({B, -1, -1, -1}), grid, gs).view({B, N, R}); // LOOKALIKE: tensor-view-non-contiguous -- grid_sample writes a fresh contiguous output
    const double inv_2s2 = 0.5 / (cfg_.sigma_hit * cfg_.sigma_hit);
    auto lik = cfg_.z_hit * torch::exp(-d.square() * inv_2s2) + cfg_.z_rand / cfg_.max_range;
    auto valid = (scan < cfg_.max_range).unsqueeze(1); // max-range readings carry no information
    // FACT: d = torch.rand(2, 4, 5); s = torch.rand(2, 5) * 14; l = 0.9 * torch.exp(-d.square() * 12.5) + 0.1 / 12.0; l.masked_fill_((s < 12.0).unsqueeze(1).logical_not(), 1.0); assert is_contiguous(l) and 0 not in l.stride()
    lik.masked_fill_(valid.logical_not(), 1.0); // LOOKALIKE: tensor-inplace-on-expanded -- the broadcast arithmetic made a full [B, N, R] tensor; only the mask is broadcast
    return torch::log(lik).sum(-1);
  }

  void update(const torch::Tensor &scan) {
    auto prior_log_w = log_w_.clone(); // LOOKALIKE: tensor-unnecessary-clone -- log_w_ is rewritten below while the prior is still needed
    log_w_.add_(measurement_loglik(scan.to(device_)));
    // FACT: w = torch.randn(3, 6); r = w.clone(); w.sub_(w.logsumexp(1, keepdim=True)); assert torch.allclose(w, r - r.logsumexp(1, keepdim=True))
    log_w_.sub_(log_w_.logsumexp(1, /*keepdim=*/true)); // LOOKALIKE: tensor-inplace-overlap -- logsumexp returns a new [B, 1] tensor: no overlap with the weights
    last_kl_ = (log_w_.exp() * (log_w_ - prior_log_w)).sum(1);
  }

  torch::Tensor ess() const {
    auto w = log_w_.exp();
    return 1.0 / (w * w).sum(1);
  }

  // Systematic resampling for the robots in `mask` [B] (bool), then a little roughening noise.
  void resample(const torch::Tensor &mask) {
    const auto B = particles_.size(0), N = particles_.size(1);
    auto cdf = log_w_.exp().cumsum(1);
    // FACT: lw = torch.log_softmax(torch.randn(3, 6), 1); c = lw.exp().cumsum(1); c.select(1, 5).fill_(1.0); assert is_copy_of(c, lw) and torch.allclose(lw.exp().sum(1), torch.ones(3))
    cdf.select(1, N - 1).fill_(1.0); // LOOKALIKE: tensor-alias-then-mutate -- cumsum made the cdf: the weights keep their values
    auto positions = (torch::rand({B, 1}, opts_) + torch::arange(N, opts_)) / static_cast<double>(N);
    auto idx = torch::searchsorted(cdf, positions).clamp_max_(N - 1);
    auto resampled = particles_.gather(1, idx.unsqueeze(-1).expand({B, N, 3}));
    // FACT: p = torch.randn(2, 6, 3); i = torch.randint(0, 6, (2, 6)); r = p.gather(1, i.unsqueeze(-1).expand(2, 6, 3)); r.add_(0.01); assert is_copy_of(r, p)
    resampled.add_(torch::randn_like(resampled) * cfg_.roughen); // LOOKALIKE: tensor-alias-then-mutate, tensor-inplace-on-expanded -- gather copies the chosen particles; only the index was expanded
    auto m = mask.to(device_);
    particles_ = torch::where(m.view({B, 1, 1}), resampled, particles_);
    log_w_ = torch::where(m.view({B, 1}), torch::full_like(log_w_, -std::log(static_cast<double>(N))), log_w_);
  }

  // Weighted mean pose [B, 3], circular mean for the heading; pushed into the history.
  torch::Tensor estimate() {
    auto w = log_w_.exp().unsqueeze(-1);         // [B, N, 1]
    auto xy = (particles_.narrow(2, 0, 2) * w).sum(1);
    auto theta = particles_.select(2, 2).clone(); // EXPECT: tensor-unnecessary-clone -- only read by cos and sin, and nothing writes the particles meanwhile
    auto heading = torch::atan2((torch::sin(theta) * w.squeeze(-1)).sum(1), (torch::cos(theta) * w.squeeze(-1)).sum(1));
    auto est = torch::cat({xy, heading.unsqueeze(1)}, 1);
    const auto H = history_.size(0);
    // FACT: h = torch.randn(10, 4, 3); assert raises(lambda: h.narrow(0, 0, 9).copy_(h.narrow(0, 1, 9)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    history_.narrow(0, 0, H - 1).copy_(history_.narrow(0, 1, H - 1)); // EXPECT: tensor-inplace-overlap -- rows 0..H-2 and 1..H-1 of one buffer: PyTorch refuses the shift
    // FACT: h = torch.randn(10, 4, 3); e = torch.randn(4, 3); h[9].copy_(e); assert torch.equal(h[9], e)
    history_[H - 1].copy_(est); // LOOKALIKE: tensor-inplace-overlap -- a fresh estimate into the last row
    return est;
  }

  // Planar velocity [B, 2] over the history window.
  torch::Tensor velocity() const {
    const auto H = history_.size(0);
    return (history_[H - 1] - history_[0]).narrow(1, 0, 2) / ((H - 1) * cfg_.dt);
  }

  // Particle counts per map cell for robot b, for the operator's viewer: [H, W] int64 on the host.
  torch::Tensor cloud_histogram(int64_t b) const {
    const auto N = particles_.size(1), H = map_.field.size(0), W = map_.field.size(1);
    auto cells = torch::empty({N, 2}, torch::kLong);
    // FACT: c = torch.empty(3, dtype=torch.long); c.copy_(torch.tensor([-0.4, 1.7, -2.2]) / 1.0); assert c.tolist() == [0, 1, -2]
    cells.copy_((particles_[b].narrow(1, 0, 2) - origin_) / map_.resolution); // EXPECT: tensor-copy-narrowing -- truncates toward zero: particles just below or left of the origin land in cell 0
    auto col = cells.select(1, 0).clamp(0, W - 1), row = cells.select(1, 1).clamp(0, H - 1);
    return torch::bincount(row * W + col, {}, H * W).view({H, W});
  }

  // Estimates in integer millimetres and milliradians for the fleet log.
  torch::Tensor estimate_mm(const torch::Tensor &est) const {
    auto out = torch::empty({est.size(0), 3}, torch::kInt);
    // FACT: o = torch.empty(2, dtype=torch.int32); o.copy_(torch.tensor([1234.0, -17.0])); assert o.tolist() == [1234, -17]
    out.copy_((est * 1000.0).round()); // LOOKALIKE: tensor-copy-narrowing -- rounded first: the conversion drops only a zero fraction
    return out;
  }

  torch::Tensor last_kl() const { return last_kl_; }
  int64_t particles() const { return particles_.size(1); }

private:
  PfConfig cfg_;
  torch::Device device_;
  const DistanceMap &map_;
  torch::TensorOptions opts_;
  torch::Tensor field_, extent_, origin_, angles_, init_std_;
  torch::Tensor particles_, log_w_, history_, last_kl_;
};

struct RecordedLog {
  std::vector<torch::Tensor> odometry, scans; // per step: [B, 3], [B, R] host tensors
  torch::Tensor ground_truth;                 // [T, B, 3] host tensor
};

// Replays a log and reports the mean position error, how often each robot resampled, and the
// estimated trajectory (host tensors).
std::vector<torch::Tensor> replay(const DistanceMap &map, const RecordedLog &log, const PfConfig &cfg) {
  torch::Device device(torch::kCUDA);
  BatchedParticleFilter pf(map, log.ground_truth[0], cfg);
  const auto T = static_cast<int64_t>(log.scans.size());
  const double threshold = cfg.resample_ratio * static_cast<double>(pf.particles());
  std::vector<torch::Tensor> trajectory;
  double err_sum = 0;
  auto resamples = torch::zeros({cfg.robots}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t t = 1; t < T; ++t) {
    pf.predict(log.odometry[t]);
    auto scan = log.scans[t].to(device); // LOOKALIKE: tensor-clone-in-loop -- a new scan every step
    pf.update(scan);
    // Resampling is masked per robot, so the host never has to look at the ESS.
    auto low = pf.ess() < threshold;
    pf.resample(low);
    resamples += low;
    if (t % 500 == 0)
      std::printf("step %lld: mean KL of the update %.4f\n", static_cast<long long>(t), pf.last_kl().mean().item<double>()); // LOOKALIKE: tensor-sync-in-loop -- only every 500 steps
    auto est = pf.estimate();
    auto gt = log.ground_truth.to(device); // EXPECT: tensor-clone-in-loop -- the whole recorded ground truth goes to the GPU again every step for one row
    err_sum += (est.narrow(1, 0, 2) - gt[t].narrow(1, 0, 2)).norm(2, 1).mean().item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step only to add up the error
    trajectory.push_back(est); // LOOKALIKE: tensor-graph-kept-across-iterations -- filter arithmetic on data: nothing requires grad
  }
  std::printf("mean position error %.3f m over %lld steps, %.1f resampling rounds per robot\n",
              err_sum / static_cast<double>(T - 1), static_cast<long long>(T - 1),
              resamples.to(torch::kDouble).mean().item<double>()); // LOOKALIKE: tensor-sync-in-loop -- once, after the replay
  return torch::stack(trajectory).cpu().unbind(0);
}
