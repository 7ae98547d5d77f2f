// Multi-object tracker for traffic cameras, SORT/DeepSORT style. Every track's Kalman filter
// runs in one batch on the device: state (cx, cy, a, h) and their velocities, constant-velocity
// motion, noise scaled by the box height. Detections are associated by IoU blended with the
// cosine distance to each track's gallery of re-id features; tracks are confirmed after n_init
// hits and dropped after max_age missed frames. The last hist_len boxes of every track feed the
// wrong-way-driver classifier.
#include <torch/torch.h>
#include <algorithm>
#include <deque>
#include <iostream>
#include <utility>
#include <vector>

struct TrackerConfig {
  int64_t n_init = 3, max_age = 30, hist_len = 16, budget = 50, feat_dim = 128, classify_every = 10;
  double std_pos = 1.0 / 20, std_vel = 1.0 / 160;
  double iou_gate = 0.3, app_weight = 0.4, max_cost = 0.7, alarm_prob = 0.9;
};

struct Detections {
  torch::Tensor boxes;  // [M, 4] x1 y1 x2 y2, pixels
  torch::Tensor scores; // [M]
  torch::Tensor crops;  // [M, 3, 128, 64] crops for the re-id net
};

// Re-identification embedding: crops -> unit-norm [M, feat_dim].
struct ReidNetImpl : torch::nn::Module {
  explicit ReidNetImpl(int64_t dim) {
    namespace nn = torch::nn;
    body_ = register_module("body", nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(3, 32, 3).stride(2).padding(1)), nn::BatchNorm2d(32), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(32, 64, 3).stride(2).padding(1)), nn::BatchNorm2d(64), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(64, 128, 3).stride(2).padding(1)), nn::BatchNorm2d(128), nn::ReLU(),
        nn::AdaptiveAvgPool2d(1)));
    fc_ = register_module("fc", nn::Linear(128, dim));
  }
  torch::Tensor forward(const torch::Tensor &crops) {
    auto h = body_->forward(crops);
    // FACT: h = torch.nn.AdaptiveAvgPool2d(1)(torch.randn(4, 8, 5, 3)); assert is_view_of(h.flatten(1), h)
    auto e = fc_(h.flatten(1)); // LOOKALIKE: tensor-reshape-non-contiguous -- the pooled [M, C, 1, 1] map is contiguous: flatten is a view
    return torch::nn::functional::normalize(e, torch::nn::functional::NormalizeFuncOptions().dim(1));
  }
  torch::nn::Sequential body_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(ReidNet);

// Trajectory classifier: hist_len normalised boxes -> logit of "driving against the lane".
struct WrongWayNetImpl : torch::nn::Module {
  explicit WrongWayNetImpl(int64_t hist_len)
      : fc1_(register_module("fc1", torch::nn::Linear(hist_len * 4, 64))),
        fc2_(register_module("fc2", torch::nn::Linear(64, 1))) {}
  torch::Tensor forward(const torch::Tensor &traj) { return fc2_(torch::relu(fc1_(traj))).squeeze(1); }
  torch::nn::Linear fc1_, fc2_;
};
TORCH_MODULE(WrongWayNet);

// x1 y1 x2 y2 -> cx cy a h, the filter's measurement space.
torch::Tensor to_xyah(const torch::Tensor &boxes) {
  auto b = boxes.to(torch::kFloat); // the detector may run in half precision
  // FACT: d = torch.tensor([[10., 20., 50., 80.]]); b = d.to(torch.float32); b.narrow(1, 2, 2).sub_(b.narrow(1, 0, 2)); assert shares_storage(b, d) and d[0, 2].item() == 40.0
  b.narrow(1, 2, 2).sub_(b.narrow(1, 0, 2)); // EXPECT: tensor-alias-then-mutate -- float32 boxes come back from to() as they are: the caller's x2 y2 become w h
  auto wh = b.narrow(1, 2, 2);
  auto c = b.narrow(1, 0, 2) + wh / 2;
  return torch::cat({c, (wh.select(1, 0) / wh.select(1, 1)).unsqueeze(1), wh.narrow(1, 1, 1)}, 1);
}

// cx cy a h -> x1 y1 x2 y2
torch::Tensor to_xyxy(const torch::Tensor &xyah) {
  auto h = xyah.select(1, 3), w = xyah.select(1, 2) * h;
  auto cx = xyah.select(1, 0), cy = xyah.select(1, 1);
  return torch::stack({cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2}, 1);
}

// Pairwise IoU of [N, 4] and [M, 4] x1 y1 x2 y2 boxes: [N, M].
torch::Tensor box_iou(const torch::Tensor &a, const torch::Tensor &b) {
  auto lt = torch::max(a.narrow(1, 0, 2).unsqueeze(1), b.narrow(1, 0, 2).unsqueeze(0));
  auto rb = torch::min(a.narrow(1, 2, 2).unsqueeze(1), b.narrow(1, 2, 2).unsqueeze(0));
  auto wh = (rb - lt).clamp_min(0);
  auto inter = wh.select(2, 0) * wh.select(2, 1);
  auto area_a = (a.select(1, 2) - a.select(1, 0)) * (a.select(1, 3) - a.select(1, 1));
  auto area_b = (b.select(1, 2) - b.select(1, 0)) * (b.select(1, 3) - b.select(1, 1));
  return inter / (area_a.unsqueeze(1) + area_b.unsqueeze(0) - inter).clamp_min(1e-6);
}

class Tracker {
public:
  Tracker(const TrackerConfig &cfg, ReidNet reid, torch::Device device) : cfg_(cfg), reid_(std::move(reid)), device_(device) {
    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device_);
    F_ = torch::eye(8);
    F_.diagonal(4).fill_(1.0); // position += velocity, one frame
    F_ = F_.to(device_);
    H_ = torch::eye(4, 8, opts);
    const auto sp = cfg.std_pos, sv = cfg.std_vel;
    Q_unit_ = torch::tensor({sp, sp, 1e-2, sp, sv, sv, 1e-5, sv}, opts).pow(2).diag();
    mean_ = torch::zeros({0, 8}, opts);
    cov_ = torch::zeros({0, 8, 8}, opts);
    history_ = torch::zeros({cfg.hist_len, 0, 4}, opts);
    ids_ = torch::zeros({0}, torch::kLong);
    hits_ = torch::zeros({0}, torch::kLong);
    misses_ = torch::zeros({0}, torch::kLong);
    reid_->to(device_);
    reid_->eval();
  }

  // One frame: predict, associate, correct, spawn, prune. Returns the confirmed tracks as
  // [K, 5] host rows (id, x1, y1, x2, y2) for the MOT writer.
  torch::Tensor step(const Detections &dets) {
    auto boxes = dets.boxes.to(device_);
    auto z = to_xyah(boxes);
    auto feats = reid_->forward(dets.crops.to(device_));
    predict();
    const auto N = mean_.size(0), M = boxes.size(0);
    std::vector<std::pair<int64_t, int64_t>> matches;
    std::vector<bool> det_used(M, false), trk_used(N, false);
    if (N > 0 && M > 0) {
      auto iou = box_iou(to_xyxy(mean_), boxes);
      auto cost = (1 - cfg_.app_weight) * (1 - iou) + cfg_.app_weight * appearance_cost(feats);
      // FACT: c = torch.rand(3, 4); g = c.clone(); g.masked_fill_(c > 0.5, 1e5); assert torch.equal(g, c.masked_fill(c > 0.5, 1e5)) and is_copy_of(g, c)
      auto gated = cost.clone(); // EXPECT: tensor-unnecessary-clone -- masked in place on the next line: cost.masked_fill(...) makes it in one pass
      gated.masked_fill_(iou < cfg_.iou_gate, 1e5);
      // Greedy assignment, cheapest pair first: as good as Hungarian at these densities.
      auto c = gated.detach().cpu();
      auto order = c.view({-1}).argsort();
      auto ca = c.accessor<float, 2>();
      auto oa = order.accessor<int64_t, 1>();
      for (int64_t k = 0; k < order.size(0); ++k) {
        const int64_t i = oa[k] / M, j = oa[k] % M;
        if (ca[i][j] > cfg_.max_cost)
          break;
        if (trk_used[i] || det_used[j])
          continue;
        trk_used[i] = det_used[j] = true;
        matches.emplace_back(i, j);
      }
    }
    if (!matches.empty()) {
      std::vector<int64_t> ti, di;
      for (auto [i, j] : matches) {
        ti.push_back(i);
        di.push_back(j);
      }
      correct(torch::tensor(ti).to(device_), z.index_select(0, torch::tensor(di).to(device_)));
      for (auto [i, j] : matches) {
        // FACT: m = torch.nn.Conv2d(3, 4, 3); g = [m(torch.randn(2, 3, 8, 8))[0] for _ in range(3)]; assert all(t.requires_grad for t in g) and kept_nodes(g) >= 3
        gallery_[i].push_back(feats[j]); // EXPECT: tensor-graph-kept-across-iterations -- re-id run with grad mode on: each kept feature holds its frame's conv graph for budget frames
        if (static_cast<int64_t>(gallery_[i].size()) > cfg_.budget)
          gallery_[i].pop_front();
      }
    }
    std::vector<int64_t> fresh;
    for (int64_t j = 0; j < M; ++j)
      if (!det_used[j])
        fresh.push_back(j);
    if (!fresh.empty()) {
      auto idx = torch::tensor(fresh).to(device_);
      spawn(z.index_select(0, idx), feats.index_select(0, idx));
    }
    prune();
    push_history();
    return confirmed();
  }

  // Each track's box history as one row of hist_len * 4 values, oldest first.
  torch::Tensor trajectories() const {
    const auto N = history_.size(1);
    // FACT: h = torch.randn(16, 6, 4); assert is_copy_of(h.permute(1, 0, 2).reshape(6, 64), h)
    return history_.permute({1, 0, 2}).reshape({N, -1}); // EXPECT: tensor-reshape-non-contiguous -- the buffer is time-major: a track's boxes are N rows apart, reshape copies it all
  }

  int64_t num_tracks() const { return mean_.size(0); }

private:
  // Constant-velocity prediction of every track: x = F x, P = F P F^T + Q.
  void predict() {
    const auto N = mean_.size(0);
    if (N == 0)
      return;
    // Process noise grows with the box (DeepSORT): Q = diag(std)^2 * h^2; the aspect terms are
    // scaled too, they are tiny either way.
    // FACT: m = torch.randn(5, 8); p = m.select(1, 3).pow(2); assert is_contiguous(p) and is_view_of(p.view(-1, 1, 1), p)
    auto h2 = mean_.select(1, 3).pow(2).view({-1, 1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- pow() of the strided column is a new contiguous tensor
    auto Q = Q_unit_.expand({N, 8, 8});
    // FACT: Q = torch.diag(torch.rand(8)).expand(5, 8, 8); assert raises(lambda: Q.mul_(torch.rand(5, 1, 1)), "more than one element of the written-to tensor")
    Q.mul_(h2); // EXPECT: tensor-inplace-on-expanded -- the N noise matrices are one 8x8 block in memory: mul_ raises
    auto Fb = F_.expand({N, 8, 8});
    mean_ = mean_.mm(F_.t());
    // FACT: F = torch.eye(8).expand(3, 8, 8); P = torch.rand(3, 8, 8); assert torch.allclose(torch.bmm(torch.bmm(F, P), F.transpose(1, 2)), P)
    cov_ = torch::bmm(torch::bmm(Fb, cov_), Fb.transpose(1, 2)) + Q; // LOOKALIKE: tensor-inplace-on-expanded -- the expanded F is only read
    // Round-off lets P drift away from symmetric over a long sequence.
    // FACT: c = torch.randn(4, 8, 8); assert raises(lambda: c.add_(c.transpose(1, 2)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    cov_.add_(cov_.transpose(1, 2)).mul_(0.5); // EXPECT: tensor-inplace-overlap -- the transpose reads the matrices add_ is writing: PyTorch refuses
    misses_ += 1;
  }

  // Kalman correction of the tracks `rows` with their measurements z (xyah).
  void correct(const torch::Tensor &rows, const torch::Tensor &z) {
    auto m = mean_.index_select(0, rows);
    auto P = cov_.index_select(0, rows);
    auto h = m.select(1, 3);
    auto sp = cfg_.std_pos * h;
    auto R = torch::stack({sp, sp, torch::full_like(h, 1e-1), sp}, 1).pow(2).diag_embed();
    auto PHt = P.matmul(H_.t());                                          // [K, 8, 4]
    auto S = H_.matmul(PHt) + R;                                          // [K, 4, 4]
    auto K = torch::linalg_solve(S, PHt.transpose(1, 2)).transpose(1, 2); // P H^T S^-1, S symmetric
    auto innov = z - m.mm(H_.t());
    mean_.index_copy_(0, rows, m + K.matmul(innov.unsqueeze(2)).squeeze(2));
    auto new_P = P - K.matmul(H_).matmul(P);
    // FACT: c = torch.randn(5, 8, 8); i = torch.tensor([0, 3]); p = c.index_select(0, i); c.index_copy_(0, i, p - 1); assert is_copy_of(p, c) and torch.equal(c[3], p[1] - 1)
    cov_.index_copy_(0, rows, new_P); // LOOKALIKE: tensor-inplace-overlap -- new_P is computed from a gather: memory of its own
    auto rows_h = rows.cpu();
    misses_.index_fill_(0, rows_h, 0);
    hits_.index_add_(0, rows_h, torch::ones_like(rows_h));
  }

  // New tracks from unmatched detections z (xyah) with their re-id features.
  void spawn(const torch::Tensor &z, const torch::Tensor &feats) {
    const auto K = z.size(0);
    auto h = z.select(1, 3);
    auto sp = 2 * cfg_.std_pos * h, sv = 10 * cfg_.std_vel * h;
    auto std0 = torch::stack({sp, sp, torch::full_like(h, 1e-2), sp, sv, sv, torch::full_like(h, 1e-5), sv}, 1);
    mean_ = torch::cat({mean_, torch::cat({z, torch::zeros_like(z)}, 1)});
    cov_ = torch::cat({cov_, std0.pow(2).diag_embed()});
    auto first = to_xyxy(z).unsqueeze(0).expand({cfg_.hist_len, K, 4}); // the first box, repeated
    history_ = torch::cat({history_, first}, 1);
    ids_ = torch::cat({ids_, torch::arange(next_id_, next_id_ + K)});
    next_id_ += K;
    hits_ = torch::cat({hits_, torch::ones({K}, torch::kLong)});
    misses_ = torch::cat({misses_, torch::zeros({K}, torch::kLong)});
    for (int64_t k = 0; k < K; ++k)
      gallery_.push_back(std::deque<torch::Tensor>{feats[k].detach()}); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
  }

  // Drops tracks missed for more than max_age frames.
  void prune() {
    auto keep = (misses_ <= cfg_.max_age).nonzero().squeeze(1);
    if (keep.size(0) == misses_.size(0))
      return;
    auto keep_d = keep.to(device_);
    mean_ = mean_.index_select(0, keep_d);
    cov_ = cov_.index_select(0, keep_d);
    history_ = history_.index_select(1, keep_d);
    ids_ = ids_.index_select(0, keep);
    hits_ = hits_.index_select(0, keep);
    misses_ = misses_.index_select(0, keep);
    std::vector<std::deque<torch::Tensor>> kept;
    auto ka = keep.accessor<int64_t, 1>();
    for (int64_t i = 0; i < keep.size(0); ++i)
      kept.push_back(std::move(gallery_[ka[i]]));
    gallery_ = std::move(kept);
  }

  // Shifts every track's history by one frame and appends its current box.
  void push_history() {
    const auto L = cfg_.hist_len;
    if (mean_.size(0) == 0)
      return;
    // FACT: h = torch.arange(12.).view(3, 2, 2); h.narrow(0, 0, 2).copy_(h.narrow(0, 1, 2).clone()); assert h[0, 0, 0].item() == 4.0 and h[1, 0, 0].item() == 8.0
    history_.narrow(0, 0, L - 1).copy_(history_.narrow(0, 1, L - 1).clone()); // LOOKALIKE: tensor-inplace-overlap -- the source rows are cloned before the shift
    // FACT: h = torch.cat([torch.zeros(4, 2, 4), torch.ones(4).expand(4, 1, 4)], 1); h[3].copy_(torch.rand(3, 4)); assert 0 not in h.stride()
    history_[L - 1].copy_(to_xyxy(mean_)); // LOOKALIKE: tensor-inplace-on-expanded -- the repeated first boxes of new tracks were copied by cat
  }

  // Smallest cosine distance between each track's gallery and each detection: [N, M].
  torch::Tensor appearance_cost(const torch::Tensor &feats) {
    std::vector<torch::Tensor> rows;
    for (const auto &g : gallery_) {
      auto bank = torch::stack(std::vector<torch::Tensor>(g.begin(), g.end())); // [G, D]
      rows.push_back(std::get<0>((1 - bank.mm(feats.t())).min(0))); // LOOKALIKE: tensor-graph-kept-across-iterations -- one frame's rows, stacked into its cost matrix and returned
    }
    return torch::stack(rows);
  }

  // Confirmed tracks updated this frame: [K, 5] rows (id, x1, y1, x2, y2) on the host.
  torch::Tensor confirmed() const {
    auto keep = ((hits_ >= cfg_.n_init) & (misses_ == 0)).nonzero().squeeze(1);
    auto boxes = to_xyxy(mean_).index_select(0, keep.to(device_)).cpu();
    auto out = torch::empty({keep.size(0), 5});
    // FACT: o = torch.empty(2, 5); o.narrow(1, 0, 1).copy_(torch.tensor([[7], [12]])); assert o[:, 0].tolist() == [7.0, 12.0]
    out.narrow(1, 0, 1).copy_(ids_.index_select(0, keep).unsqueeze(1)); // LOOKALIKE: tensor-copy-narrowing -- integer ids into a float table widen: exact below 2^24
    out.narrow(1, 1, 4).copy_(boxes);
    return out;
  }

  TrackerConfig cfg_;
  ReidNet reid_;
  torch::Device device_;
  torch::Tensor F_, H_, Q_unit_;
  torch::Tensor mean_, cov_, history_;  // [N, 8], [N, 8, 8], [L, N, 4] on the device
  torch::Tensor ids_, hits_, misses_;   // [N] int64 bookkeeping on the host
  std::vector<std::deque<torch::Tensor>> gallery_;
  int64_t next_id_ = 1;
};

// Runs the tracker over a sequence, collects the MOT rows and raises an alarm for tracks the
// classifier thinks drive against the lane.
std::vector<torch::Tensor> run_sequence(const std::vector<Detections> &frames, const TrackerConfig &cfg, ReidNet reid,
                                        WrongWayNet clf, double frame_w, double frame_h) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Tracker tracker(cfg, std::move(reid), device);
  clf->to(device);
  clf->eval();
  auto scale = torch::tensor({frame_w, frame_h, frame_w, frame_h}, torch::kFloat).repeat(cfg.hist_len).to(device);
  std::vector<torch::Tensor> mot_rows;
  int64_t alarms = 0;
  for (size_t f = 0; f < frames.size(); ++f) {
    auto tracks = tracker.step(frames[f]);
    mot_rows.push_back(tracks); // LOOKALIKE: tensor-graph-kept-across-iterations -- rows made from the Kalman state, which nothing with grad reaches
    std::cout << "frame " << f << ": " << tracks.size(0) << " confirmed tracks\n"; // LOOKALIKE: tensor-sync-in-loop -- size(0) is metadata: nothing is read from the device
    if (static_cast<int64_t>(f) % cfg.classify_every == 0 && tracker.num_tracks() > 0) {
      torch::NoGradGuard no_grad;
      auto p = torch::sigmoid(clf->forward(tracker.trajectories() / scale));
      alarms += (p > cfg.alarm_prob).sum().item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- every classify_every frames only
    }
  }
  std::cout << alarms << " wrong-way alarms in " << frames.size() << " frames\n";
  return mot_rows;
}
