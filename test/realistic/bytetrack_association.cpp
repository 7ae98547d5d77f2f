// ByteTrack-style tracker: track states (Kalman means/covariances, ids, lost counters, a box
// history) live in batched tensors across frames; each frame runs a two-stage association
// (high-score detections first, then the low-score ones against the tracks left over).
#include <torch/torch.h>

#include <iostream>
#include <limits>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;
using torch::Tensor;
using torch::indexing::Slice;

struct TrackerConfig {
  float track_high_thresh = 0.6f, track_low_thresh = 0.1f, new_track_thresh = 0.7f;
  float match_thresh = 0.8f, second_match_iou = 0.5f;
  int64_t track_buffer = 30, history_len = 16;
  int64_t frame_stride = 2;  // the detector runs on every frame_stride-th frame
  float std_weight_position = 1.f / 20, std_weight_velocity = 1.f / 160, velocity_decay = 0.9f;
};

struct SequenceConfig {
  int64_t input_h = 800, input_w = 1440, orig_h = 1080, orig_w = 1920;
};

// ---- Box helpers -----------------------------------------------------------
Tensor xyah_to_xyxy(const Tensor& xyah) {
  auto h = xyah.select(1, 3), w = xyah.select(1, 2) * h;
  auto cx = xyah.select(1, 0), cy = xyah.select(1, 1);
  return torch::stack({cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2}, 1);
}

Tensor xyxy_to_xyah(const Tensor& xyxy) {
  auto w = xyxy.select(1, 2) - xyxy.select(1, 0);
  auto h = xyxy.select(1, 3) - xyxy.select(1, 1);
  return torch::stack({xyxy.select(1, 0) + w / 2, xyxy.select(1, 1) + h / 2, w / h, h}, 1);
}

// IoU of aligned pairs: a[k] with b[k].
Tensor aligned_iou(const Tensor& a, const Tensor& b) {
  auto lt = torch::max(a.narrow(1, 0, 2), b.narrow(1, 0, 2));
  auto rb = torch::min(a.narrow(1, 2, 2), b.narrow(1, 2, 2));
  auto wh = (rb - lt).clamp_min(0);
  auto inter = wh.select(1, 0) * wh.select(1, 1);
  auto area_a = (a.select(1, 2) - a.select(1, 0)) * (a.select(1, 3) - a.select(1, 1));
  auto area_b = (b.select(1, 2) - b.select(1, 0)) * (b.select(1, 3) - b.select(1, 1));
  return inter / (area_a + area_b - inter + 1e-6);
}

Tensor iou_matrix(const Tensor& tracks, const Tensor& dets) {
  const int64_t n = tracks.size(0), m = dets.size(0);
  // FACT: t = torch.randn(3, 4); assert is_copy_of(t.unsqueeze(1).expand(3, 5, 4).reshape(-1, 4), t)
  auto pairs_t = tracks.unsqueeze(1).expand({n, m, 4}).reshape({-1, 4}); // EXPECT: tensor-reshape-non-contiguous
  auto pairs_d = dets.repeat({n, 1});
  // FACT: a = torch.rand(12, 4); r = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]) / 2.0; assert is_contiguous(r) and is_view_of(r.view(3, 4), r)
  return aligned_iou(pairs_t, pairs_d).view({n, m}); // LOOKALIKE: tensor-view-non-contiguous -- an elementwise result over one dim is contiguous
}

// Integer pixel corners for cropping: outward rounding so the crop covers the box.
Tensor to_pixel_corners(const Tensor& boxes_xyxy) {
  auto px = torch::empty({boxes_xyxy.size(0), 4}, torch::kLong);
  px.narrow(1, 0, 2).copy_(boxes_xyxy.narrow(1, 0, 2).floor()); // LOOKALIKE: tensor-copy-narrowing -- floor() leaves whole numbers
  px.narrow(1, 2, 2).copy_(boxes_xyxy.narrow(1, 2, 2).ceil()); // LOOKALIKE: tensor-copy-narrowing -- ceil() leaves whole numbers
  return px;
}

// MOTChallenge rows: frame, id, left, top, width, height.
Tensor mot_rows(const Tensor& ids, const Tensor& tlwh, int64_t frame_id) {
  auto rows = torch::empty({tlwh.size(0), 6}, torch::kLong);
  rows.select(1, 0).fill_(frame_id);
  rows.select(1, 1).copy_(ids);
  rows.narrow(1, 2, 4).copy_(tlwh); // EXPECT: tensor-copy-narrowing
  return rows;
}

// Greedy assignment on a [N, M] cost matrix (host tensor); pairs with cost > max_cost are dropped.
std::vector<std::pair<int64_t, int64_t>> greedy_match(const Tensor& cost, float max_cost) {
  std::vector<std::pair<int64_t, int64_t>> matches;
  if (cost.numel() == 0) return matches;
  auto work = cost.clone(); // LOOKALIKE: tensor-unnecessary-clone -- rows and columns of the copy are filled below; the caller's matrix must stay intact
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t cols = work.size(1);
  while (true) {
    const int64_t flat = work.argmin().item<int64_t>();
    const int64_t r = flat / cols, c = flat % cols;
    if (work[r][c].item<float>() > max_cost) break;
    matches.emplace_back(r, c);
    work.select(0, r).fill_(inf);
    work.select(1, c).fill_(inf);
  }
  return matches;
}

// ---- Batched Kalman filter over [N, 8] states (cx, cy, a, h and their velocities) ----
class BatchedKalmanFilter {
 public:
  BatchedKalmanFilter(float std_pos, float std_vel) : std_pos_(std_pos), std_vel_(std_vel) {
    motion_mat_ = torch::eye(8);
    for (int64_t i = 0; i < 4; ++i) motion_mat_[i][4 + i] = 1.0;
    update_mat_ = torch::eye(4, 8);
  }
  // Diagonal covariance scaled by box height: (pos, pos, aspect, pos, vel, vel, aspect', vel).
  Tensor height_scaled_cov(const Tensor& h, double k_pos, double k_vel) const {
    auto ones = torch::ones_like(h);
    auto sd = torch::stack({k_pos * std_pos_ * h, k_pos * std_pos_ * h, 1e-2 * ones, k_pos * std_pos_ * h,
                            k_vel * std_vel_ * h, k_vel * std_vel_ * h, 1e-5 * ones, k_vel * std_vel_ * h}, 1);
    return torch::diag_embed(sd.pow(2));
  }
  std::pair<Tensor, Tensor> initiate(const Tensor& xyah) const {
    return {torch::cat({xyah, torch::zeros_like(xyah)}, 1), height_scaled_cov(xyah.select(1, 3), 2.0, 10.0)};
  }
  // Predicts `steps` frames ahead (the detector skips frames).
  void multi_predict(Tensor& mean, Tensor& cov, int64_t steps) const {
    for (int64_t s = 0; s < steps; ++s) {
      auto Ft = motion_mat_.t().contiguous(); // EXPECT: tensor-clone-in-loop
      auto q = height_scaled_cov(mean.select(1, 3), 1.0, 1.0);
      mean = mean.matmul(Ft);
      cov = torch::matmul(motion_mat_, cov).matmul(Ft) + q;
    }
  }
  void update(Tensor& mean, Tensor& cov, const Tensor& xyah) const {
    auto h = mean.select(1, 3);
    auto r = torch::stack({std_pos_ * h, std_pos_ * h, 1e-1 * torch::ones_like(h), std_pos_ * h}, 1);
    auto proj_mean = mean.matmul(update_mat_.t());
    auto proj_cov = update_mat_.matmul(cov).matmul(update_mat_.t()) + torch::diag_embed(r.pow(2));
    auto chol = torch::linalg_cholesky(proj_cov);
    auto pht = cov.matmul(update_mat_.t());                                  // [N, 8, 4]
    auto gain = torch::cholesky_solve(pht.transpose(1, 2), chol).transpose(1, 2);
    auto innovation = (xyah - proj_mean).unsqueeze(-1);
    mean = mean + gain.matmul(innovation).squeeze(-1);
    cov = cov - gain.matmul(proj_cov).matmul(gain.transpose(1, 2));
  }
 private:
  float std_pos_, std_vel_;
  Tensor motion_mat_, update_mat_;
};

// ---- Tracker ---------------------------------------------------------------
struct OnlineTracks {
  Tensor ids, xyxy;  // [K] int64, [K, 4]
};

class ByteTracker {
 public:
  explicit ByteTracker(const TrackerConfig& cfg)
      : cfg_(cfg), kf_(cfg.std_weight_position, cfg.std_weight_velocity) {
    history_ = torch::zeros({cfg.history_len, 0, 4});
    velocity_decay_ = torch::tensor({1.f, 1.f, 1.f, 1.f, cfg.velocity_decay, cfg.velocity_decay,
                                     cfg.velocity_decay, cfg.velocity_decay});
  }
  OnlineTracks update(const Tensor& dets /* [D, 5] host: xyxy + score */, int64_t frame_id) {
    auto scores = dets.select(1, 4);
    auto boxes = dets.narrow(1, 0, 4).clone(); // EXPECT: tensor-unnecessary-clone
    boxes.clamp_min_(0.0);
    auto high_idx = (scores >= cfg_.track_high_thresh).nonzero().squeeze(1);
    auto low_idx = ((scores >= cfg_.track_low_thresh) & (scores < cfg_.track_high_thresh)).nonzero().squeeze(1);
    std::vector<int64_t> trk_rows, det_rows;
    std::vector<bool> det_used(dets.size(0), false);
    if (means_.size(0) > 0) {
      kf_.multi_predict(means_, covs_, cfg_.frame_stride);
      auto track_xyxy = xyah_to_xyxy(means_.narrow(1, 0, 4));
      auto high_boxes = boxes.index_select(0, high_idx);
      std::vector<bool> trk_used(means_.size(0), false);
      for (auto [r, c] : greedy_match(1.0 - iou_matrix(track_xyxy, high_boxes), 1.0f - cfg_.match_thresh)) {
        trk_rows.push_back(r);
        det_rows.push_back(high_idx[c].item<int64_t>());
        trk_used[r] = true;
      }
      // Second stage: tracked (not lost) leftovers against low-score detections.
      std::vector<int64_t> rest;
      auto lost_a = lost_.accessor<int64_t, 1>();
      for (int64_t t = 0; t < means_.size(0); ++t)
        if (!trk_used[t] && lost_a[t] == 0) rest.push_back(t);
      if (!rest.empty() && low_idx.numel() > 0) {
        auto rest_t = torch::tensor(rest, torch::kLong);
        auto iou2 = iou_matrix(track_xyxy.index_select(0, rest_t), boxes.index_select(0, low_idx));
        for (auto [r, c] : greedy_match(1.0 - iou2, 1.0f - cfg_.second_match_iou)) {
          trk_rows.push_back(rest[r]);
          det_rows.push_back(low_idx[c].item<int64_t>());
        }
      }
    }
    for (int64_t d : det_rows) det_used[d] = true;
    lost_ += 1;
    if (!trk_rows.empty()) {
      auto rows = torch::tensor(trk_rows, torch::kLong);
      auto meas = xyxy_to_xyah(boxes.index_select(0, torch::tensor(det_rows, torch::kLong)));
      last_jump_ = apply_updates(rows, meas);
      lost_.index_fill_(0, rows, 0);
    }
    spawn_tracks(boxes, scores, det_used);
    prune();
    record_positions(xyah_to_xyxy(means_.narrow(1, 0, 4)));
    next_frame_ = frame_id + 1;
    auto alive = (lost_ == 0).nonzero().squeeze(1);
    return {ids_.index_select(0, alive), xyah_to_xyxy(means_.narrow(1, 0, 4)).index_select(0, alive)};
  }
  // Position-uncertainty per track, [N, 4] standard deviations of (cx, cy, a, h).
  Tensor position_std() const {
    const int64_t n = covs_.size(0);
    // FACT: c = torch.randn(5, 8, 8); assert is_view_of(c.diagonal(0, -2, -1).reshape(5, 2, 4), c)
    auto var = covs_.diagonal(0, -2, -1).reshape({n, 2, 4}); // LOOKALIKE: tensor-reshape-non-contiguous -- only splits the strided diagonal dim: a view
    return var.select(1, 0).clamp_min(0).sqrt();
  }
 private:
  Tensor apply_updates(const Tensor& rows, const Tensor& meas_xyah) {
    auto prev_means = means_;  // before the correction
    // FACT: m = torch.randn(5, 8); s = m.index_select(0, torch.tensor([0, 2])); s.mul_(0.9); assert is_copy_of(s, m)
    auto sel_mean = means_.index_select(0, rows);
    sel_mean.mul_(velocity_decay_); // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into new storage
    auto sel_cov = covs_.index_select(0, rows);
    kf_.update(sel_mean, sel_cov, meas_xyah);
    // FACT: m = torch.zeros(5, 8); p = m; m.index_copy_(0, torch.tensor([1, 3]), torch.ones(2, 8)); assert shares_storage(m, p) and (m - p).abs().sum() == 0
    means_.index_copy_(0, rows, sel_mean); // EXPECT: tensor-alias-then-mutate
    covs_.index_copy_(0, rows, sel_cov);
    return (means_ - prev_means).narrow(1, 0, 2).norm(2, 1);  // per-track correction size
  }
  void spawn_tracks(const Tensor& boxes, const Tensor& scores, const std::vector<bool>& det_used) {
    std::vector<int64_t> fresh;
    auto sc = scores.accessor<float, 1>();
    for (int64_t d = 0; d < boxes.size(0); ++d)
      if (!det_used[d] && sc[d] >= cfg_.new_track_thresh) fresh.push_back(d);
    if (fresh.empty()) return;
    auto sel = boxes.index_select(0, torch::tensor(fresh, torch::kLong));
    auto init = kf_.initiate(xyxy_to_xyah(sel));
    const auto k = static_cast<int64_t>(fresh.size());
    means_ = torch::cat({means_, init.first}, 0);
    covs_ = torch::cat({covs_, init.second}, 0);
    ids_ = torch::cat({ids_, torch::arange(next_id_, next_id_ + k, torch::kLong)}, 0);
    lost_ = torch::cat({lost_, torch::zeros({k}, torch::kLong)}, 0);
    history_ = torch::cat({history_, sel.unsqueeze(0).expand({history_.size(0), k, 4})}, 1);
    next_id_ += k;
  }
  void prune() {
    auto keep = (lost_ <= cfg_.track_buffer).nonzero().squeeze(1);
    means_ = means_.index_select(0, keep);
    covs_ = covs_.index_select(0, keep);
    ids_ = ids_.index_select(0, keep);
    lost_ = lost_.index_select(0, keep);
    history_ = history_.index_select(1, keep);
    means_.select(1, 7).masked_fill_(lost_ > 0, 0.0);  // lost tracks stop growing
  }
  void record_positions(const Tensor& xyxy) {
    const int64_t L = history_.size(0);
    // FACT: b = torch.randn(6, 3, 4); assert raises(lambda: b.narrow(0, 0, 5).copy_(b.narrow(0, 1, 5)), "some elements")
    history_.narrow(0, 0, L - 1).copy_(history_.narrow(0, 1, L - 1)); // EXPECT: tensor-inplace-overlap
    history_[L - 1].copy_(xyxy);
  }
  TrackerConfig cfg_;
  BatchedKalmanFilter kf_;
  Tensor means_ = torch::zeros({0, 8}), covs_ = torch::zeros({0, 8, 8});
  Tensor ids_ = torch::zeros({0}, torch::kLong), lost_ = torch::zeros({0}, torch::kLong);
  Tensor history_, velocity_decay_, last_jump_;
  int64_t next_id_ = 1, next_frame_ = 0;
};

// ---- Sequence driver -------------------------------------------------------
Tensor letterbox(const Tensor& img, int64_t h, int64_t w) {
  auto x = img.unsqueeze(0).to(torch::kFloat) / torch::tensor(255.0f); // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may combine with a CUDA tensor
  return F::interpolate(x, F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false));
}

Tensor crop_tracks(const Tensor& img, const Tensor& xyxy) {
  auto corners = to_pixel_corners(xyxy);
  auto c = corners.accessor<int64_t, 2>();
  std::vector<Tensor> crops;
  for (int64_t i = 0; i < corners.size(0); ++i) {
    auto patch = img.index({Slice(), Slice(c[i][1], c[i][3]), Slice(c[i][0], c[i][2])}).unsqueeze(0);
    crops.push_back(F::interpolate(patch.to(torch::kFloat), F::InterpolateFuncOptions().size(std::vector<int64_t>{256, 128}).mode(torch::kBilinear).align_corners(false)));
  }
  return torch::cat(crops, 0);
}

void run_sequence(torch::nn::Sequential& detector, torch::nn::Sequential& reid, ByteTracker& tracker,
                  const std::vector<Tensor>& frames, const SequenceConfig& seq) {
  torch::Device cuda(torch::kCUDA);
  detector->to(cuda);
  reid->to(cuda);
  detector->eval();
  reid->eval();
  const float sx = static_cast<float>(seq.orig_w) / seq.input_w;
  const float sy = static_cast<float>(seq.orig_h) / seq.input_h;
  std::vector<Tensor> gallery;
  for (size_t f = 0; f < frames.size(); ++f) {
    auto img = frames[f].to(cuda); // LOOKALIKE: tensor-clone-in-loop -- a new frame every iteration
    auto raw = detector->forward(letterbox(img, seq.input_h, seq.input_w)).detach();  // [D, 5]
    auto scale = torch::tensor({sx, sy, sx, sy});
    auto boxes = raw.narrow(1, 0, 4) * scale; // EXPECT: tensor-device-mismatch
    auto dets = torch::cat({boxes, raw.narrow(1, 4, 1)}, 1);
    auto dets_host = dets.to(torch::kCPU); // LOOKALIKE: tensor-sync-in-loop -- host detections feed the matcher: data, not a log
    auto online = tracker.update(dets_host, static_cast<int64_t>(f));
    if (online.ids.numel() == 0) continue;
    auto emb = F::normalize(reid->forward(crop_tracks(img, online.xyxy)), F::NormalizeFuncOptions().dim(1));
    gallery.push_back(emb); // EXPECT: tensor-graph-kept-across-iterations
  }
  auto all = torch::cat(gallery, 0);
  auto sim = torch::mm(all, all.t());
  std::cout << "gallery " << all.size(0) << " mean sim " << sim.mean().item<float>() << std::endl;
}
