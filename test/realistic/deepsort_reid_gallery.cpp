// DeepSORT-style tracker: re-identification embeddings, a bounded per-track feature gallery,
// Kalman motion model with Mahalanobis gating, tentative/confirmed/deleted track life cycle.
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <deque>
#include <iostream>
#include <tuple>
#include <vector>

namespace mot {

struct TrackerConfig {
  int64_t embedding_dim = 128;
  int64_t num_parts = 3;
  int64_t num_identities = 751;
  int64_t gallery_budget = 100;
  double max_cosine_distance = 0.2;
  double ema_alpha = 0.9;
  int max_age = 30;
  int n_init = 3;
  float std_weight_position = 1.f / 20;
  float std_weight_velocity = 1.f / 160;
};

struct ReIdOutput { torch::Tensor embedding, logits; };

struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3)
                                                              .stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3)
                                                              .padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      shortcut = register_module(
          "shortcut",
          torch::nn::Sequential(
              torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
              torch::nn::BatchNorm2d(out)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (shortcut ? shortcut->forward(x) : x));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(ResBlock);

struct ReIdNetImpl : torch::nn::Module {
  explicit ReIdNetImpl(const TrackerConfig& cfg)
      : num_parts(cfg.num_parts),
        stem(register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3)
                                                            .padding(1).bias(false)))),
        stem_bn(register_module("stem_bn", torch::nn::BatchNorm2d(32))),
        layer1(register_module("layer1", ResBlock(32, 32, 1))),
        layer2(register_module("layer2", ResBlock(32, 64, 2))),
        layer3(register_module("layer3", ResBlock(64, 128, 2))),
        attn_logit(register_module("attn_logit", torch::nn::Linear(128, 1))),
        embed(register_module("embed", torch::nn::Linear(128 * (1 + cfg.num_parts), cfg.embedding_dim))),
        bnneck(register_module("bnneck", torch::nn::BatchNorm1d(cfg.embedding_dim))),
        classifier(register_module("classifier", torch::nn::Linear(torch::nn::LinearOptions(
                                                     cfg.embedding_dim, cfg.num_identities).bias(false)))) {
    torch::nn::init::normal_(classifier->weight, 0.0, 0.001);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes parameters under its own NoGradGuard
  }

  ReIdOutput forward(torch::Tensor x) {
    x = torch::relu(stem_bn(stem(x)));
    x = torch::max_pool2d(x, 3, 2, 1);
    x = layer3(layer2(layer1(x)));
    const auto n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    // FACT: x = torch.rand(2, 4, 3, 5); assert is_view_of(x.permute(0, 2, 3, 1).view(2, 15, 4), x)
    auto tokens = x.permute({0, 2, 3, 1}).view({n, h * w, c});  // LOOKALIKE: tensor-view-non-contiguous -- H and W stay adjacent after the permute, so the merge is expressible with strides
    auto attn = torch::softmax(attn_logit(tokens), 1);
    auto global = (attn * tokens).sum(1);
    auto stripes = torch::adaptive_avg_pool2d(x, {num_parts, 1}).squeeze(3);
    // FACT: s = torch.rand(2, 8, 3); assert is_copy_of(s.transpose(1, 2).reshape(2, -1), s)
    auto parts = stripes.transpose(1, 2).reshape({n, -1});  // EXPECT: tensor-reshape-non-contiguous
    auto emb = embed(torch::cat({global, parts}, 1));
    auto logits = classifier(bnneck(emb));
    // FACT: assert backward_fails(lambda: (lambda e: e.div_(e.norm(2, 1, keepdim=True).clamp_min(1e-12)).sum().backward())(torch.nn.Linear(6, 4)(torch.rand(3, 6))))
    emb.div_(emb.norm(2, 1, true).clamp_min(1e-12));  // EXPECT: tensor-inplace-on-saved
    return {emb, logits};
  }

  int64_t num_parts;
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d stem_bn;
  ResBlock layer1, layer2, layer3;
  torch::nn::Linear attn_logit, embed;
  torch::nn::BatchNorm1d bnneck;
  torch::nn::Linear classifier;
};
TORCH_MODULE(ReIdNet);

// Boxes as (top-left x, top-left y, width, height) -> (center x, center y, aspect, height).
torch::Tensor tlwh_to_xyah(const torch::Tensor& tlwh) {
  auto ret = tlwh.clone();  // LOOKALIKE: tensor-unnecessary-clone -- keeps the caller's boxes intact; the column-wise updates below have no single out-of-place form
  ret.narrow(-1, 0, 2).add_(ret.narrow(-1, 2, 2) / 2);
  // FACT: r = torch.rand(3, 4); assert not raises(lambda: r.select(-1, 2).div_(r.select(-1, 3)))
  ret.select(-1, 2).div_(ret.select(-1, 3));  // LOOKALIKE: tensor-inplace-overlap -- width and height columns are disjoint elements of the buffer
  return ret;
}

class KalmanFilterXYAH {
 public:
  KalmanFilterXYAH(const TrackerConfig& cfg, torch::Device device)
      : wp_(cfg.std_weight_position), wv_(cfg.std_weight_velocity) {
    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
    motion_mat_ = torch::eye(8, opts);
    motion_mat_.diagonal(4).fill_(1.0);
    update_mat_ = torch::eye(4, 8, opts);
    std_weight_ = torch::tensor({wp_, wp_, 0.f, wp_, wv_, wv_, 0.f, wv_}, opts);
    std_floor_ = torch::tensor({0.f, 0.f, 1e-2f, 0.f, 0.f, 0.f, 1e-5f, 0.f}, opts);
  }

  std::pair<torch::Tensor, torch::Tensor> initiate(const torch::Tensor& xyah) const {
    auto mean = torch::cat({xyah, torch::zeros_like(xyah)});
    auto h = xyah[3];
    auto sd = torch::stack({2 * wp_ * h, 2 * wp_ * h, torch::full_like(h, 1e-2), 2 * wp_ * h,
                            10 * wv_ * h, 10 * wv_ * h, torch::full_like(h, 1e-5), 10 * wv_ * h});
    return {mean, torch::diag(sd.pow(2))};
  }

  void predict(torch::Tensor& means, torch::Tensor& covs) const {
    auto heights = means.select(1, 3).unsqueeze(1);
    auto stds = std_weight_.expand({means.size(0), 8});
    // FACT: assert raises(lambda: torch.rand(8).expand(3, 8).mul_(torch.rand(3, 1)), 'more than one element')
    stds.mul_(heights).add_(std_floor_);  // EXPECT: tensor-inplace-on-expanded
    auto motion_cov = torch::diag_embed(stds.pow(2));
    means = means.mm(motion_mat_.t());
    covs = motion_mat_.matmul(covs).matmul(motion_mat_.t()) + motion_cov;
  }

  std::pair<torch::Tensor, torch::Tensor> project(const torch::Tensor& means,
                                                  const torch::Tensor& covs) const {
    auto h = means.select(1, 3);
    auto s = torch::stack({wp_ * h, wp_ * h, torch::full_like(h, 1e-1), wp_ * h}, 1);
    auto pm = means.mm(update_mat_.t());
    auto pc = update_mat_.matmul(covs).matmul(update_mat_.t()) + torch::diag_embed(s.pow(2));
    // FACT: assert raises(lambda: (lambda c: c.add_(c.transpose(1, 2)))(torch.rand(3, 4, 4)), 'single memory location')
    pc.add_(pc.transpose(1, 2)).mul_(0.5);  // EXPECT: tensor-inplace-overlap
    return {pm, pc};
  }

  torch::Tensor gating_distance(const torch::Tensor& means, const torch::Tensor& covs,
                                const torch::Tensor& xyah) const {
    auto [pm, pc] = project(means, covs);
    auto chol = torch::linalg::cholesky(pc);
    auto d = xyah.unsqueeze(0) - pm.unsqueeze(1);
    auto z = torch::linalg::solve_triangular(chol, d.transpose(1, 2), /*upper=*/false,
                                             /*left=*/true, /*unitriangular=*/false);
    return z.pow(2).sum(1);
  }

  void update(torch::Tensor& mean, torch::Tensor& cov, const torch::Tensor& xyah) const {
    auto [pm, pc] = project(mean.unsqueeze(0), cov.unsqueeze(0));
    auto pc64 = pc.squeeze(0).to(torch::kDouble);
    auto cov64 = cov.to(torch::kDouble);
    auto pht = cov64.mm(update_mat_.t().to(torch::kDouble));
    auto gain = torch::cholesky_solve(pht.t(), torch::linalg::cholesky(pc64)).t();
    auto innovation = xyah - pm.squeeze(0);  // EXPECT: tensor-device-mismatch
    mean.copy_(mean.to(torch::kDouble) + gain.mv(innovation.to(torch::kDouble)));  // EXPECT: tensor-copy-narrowing
    auto new_cov = cov64 - gain.mm(pc64).mm(gain.t());
    cov.copy_(new_cov.to(cov.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the double result is converted explicitly before the copy
  }

 private:
  float wp_, wv_;
  torch::Tensor motion_mat_, update_mat_, std_weight_, std_floor_;
};

enum class TrackState { Tentative, Confirmed, Deleted };

struct Track {
  int64_t id;
  torch::Tensor mean, cov;
  std::deque<torch::Tensor> gallery;
  torch::Tensor smooth_feat;
  int hits = 1, age = 1, time_since_update = 0;
  TrackState state = TrackState::Tentative;
};

struct Detection {
  std::array<float, 4> tlwh;
  float confidence;
};

class Tracker {
 public:
  Tracker(TrackerConfig cfg, ReIdNet reid, torch::Device device)
      : cfg_(cfg), reid_(std::move(reid)), device_(device), kf_(cfg_, device) { reid_->eval(); }

  void step(const torch::Tensor& crops, const std::vector<Detection>& dets) {
    torch::NoGradGuard no_grad;
    std::vector<float> flat;
    for (const auto& d : dets) flat.insert(flat.end(), d.tlwh.begin(), d.tlwh.end());
    const auto n_det = static_cast<int64_t>(dets.size());
    auto boxes = torch::from_blob(flat.data(), {n_det, 4}, torch::kFloat).clone();  // LOOKALIKE: tensor-unnecessary-clone -- from_blob borrows the local vector; the clone gives the boxes their own storage
    auto xyah = tlwh_to_xyah(boxes);
    auto feats = reid_->forward((crops.to(device_) / 255.0 - 0.45) / 0.225).embedding;

    std::vector<bool> det_used(n_det, false);
    if (!tracks_.empty() && n_det > 0) {
      std::vector<torch::Tensor> ms, cs, cols;
      for (auto& t : tracks_) { ms.push_back(t.mean); cs.push_back(t.cov); }
      auto means = torch::stack(ms), covs = torch::stack(cs);
      kf_.predict(means, covs);
      for (size_t i = 0; i < tracks_.size(); ++i) {
        tracks_[i].mean = means[i];
        tracks_[i].cov = covs[i];
        auto g = torch::stack(std::vector<torch::Tensor>(tracks_[i].gallery.begin(), tracks_[i].gallery.end()));
        cols.push_back(0.5 * (1.0 - feats.mm(g.t()).amax(1)) + 0.5 * (1.0 - feats.mv(tracks_[i].smooth_feat)));
      }
      auto cost = torch::stack(cols, 1);
      auto maha = kf_.gating_distance(means, covs, xyah.to(device_));
      auto chi2inv95 = torch::tensor({3.8415, 5.9915, 7.8147, 9.4877});
      cost.masked_fill_(maha.t() > chi2inv95[3], 1e5);  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor is accepted as a scalar operand next to CUDA tensors
      // FACT: c = torch.rand(3, 5); assert raises(lambda: c.t().view(-1), 'view size is not compatible')
      auto host = cost.t().view({-1}).to(torch::kCPU);  // EXPECT: tensor-view-non-contiguous
      auto* c = host.data_ptr<float>();
      for (size_t t = 0; t < tracks_.size(); ++t) {
        int64_t best = -1;
        float best_cost = static_cast<float>(cfg_.max_cosine_distance);
        for (int64_t d = 0; d < n_det; ++d)
          if (!det_used[d] && c[t * n_det + d] < best_cost) { best = d; best_cost = c[t * n_det + d]; }
        if (best < 0) continue;
        det_used[best] = true;
        auto& tr = tracks_[t];
        kf_.update(tr.mean, tr.cov, xyah[best]);
        update_appearance(tr, feats[best]);
        tr.hits++;
        tr.time_since_update = -1;
        if (tr.state == TrackState::Tentative && tr.hits >= cfg_.n_init) tr.state = TrackState::Confirmed;
      }
    }
    for (auto& tr : tracks_) {
      tr.age++;
      if (++tr.time_since_update > cfg_.max_age || (tr.state == TrackState::Tentative && tr.time_since_update > 0))
        tr.state = TrackState::Deleted;
    }
    tracks_.erase(std::remove_if(tracks_.begin(), tracks_.end(),
                                 [](const Track& t) { return t.state == TrackState::Deleted; }),
                  tracks_.end());
    for (int64_t d = 0; d < n_det; ++d) {
      if (det_used[d]) continue;
      Track tr;
      tr.id = next_id_++;
      std::tie(tr.mean, tr.cov) = kf_.initiate(xyah[d].to(device_));
      update_appearance(tr, feats[d]);
      tracks_.push_back(std::move(tr));
    }
  }

  const std::vector<Track>& tracks() const { return tracks_; }

 private:
  void update_appearance(Track& t, const torch::Tensor& feat) {
    t.gallery.push_back(feat);
    if (static_cast<int64_t>(t.gallery.size()) > cfg_.gallery_budget) t.gallery.pop_front();
    if (!t.smooth_feat.defined()) {
      t.smooth_feat = feat;
      return;
    }
    // FACT: f = torch.rand(4, 8); s = f[1]; s.mul_(0.9); assert is_view_of(s, f)
    t.smooth_feat.mul_(cfg_.ema_alpha).add_(feat, 1.0 - cfg_.ema_alpha);  // EXPECT: tensor-alias-then-mutate
    t.smooth_feat = t.smooth_feat / t.smooth_feat.norm();
  }

  TrackerConfig cfg_;
  ReIdNet reid_;
  torch::Device device_;
  KalmanFilterXYAH kf_;
  std::vector<Track> tracks_;
  int64_t next_id_ = 1;
};

template <typename Loader>
void train_reid(ReIdNet& net, Loader& loader, torch::Device device, int epochs) {
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(3.5e-4).weight_decay(5e-4));
  auto pixel_mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1});
  auto pixel_std = torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1});
  net->train();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    int64_t step = 0, correct = 0, seen = 0;
    for (auto& batch : *loader) {
      torch::Tensor images = batch.data.to(device, torch::kFloat, /*non_blocking=*/true);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      torch::Tensor labels = batch.target.to(device);
      // FACT: a = torch.zeros(2, 3, 8, 4, dtype=torch.uint8); assert is_copy_of(a.to(torch.float32), a)
      images.div_(255.0).sub_(pixel_mean.to(device)).div_(pixel_std.to(device));  // EXPECT: tensor-clone-in-loop // LOOKALIKE: tensor-alias-then-mutate -- the uint8 batch was converted to float into new storage
      ReIdOutput out = net->forward(images);
      auto dist = torch::cdist(out.embedding, out.embedding);
      auto same = labels.unsqueeze(0) == labels.unsqueeze(1);
      auto hardest_pos = dist.masked_fill(same.logical_not(), 0).amax(1);
      auto hardest_neg = dist.masked_fill(same, 1e4).amin(1);
      torch::Tensor loss = torch::nn::functional::cross_entropy(out.logits, labels) +
                           torch::relu(hardest_pos - hardest_neg + 0.3).mean();
      opt.zero_grad();
      loss.backward();
      opt.step();
      correct += out.logits.argmax(1).eq(labels).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
      seen += labels.size(0);
      if (++step % 100 == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>() << '\n';  // LOOKALIKE: tensor-sync-in-loop -- read once every 100 steps for the log
    }
    std::cout << "epoch " << epoch << " id accuracy " << static_cast<double>(correct) / seen << '\n';
  }
}

}  // namespace mot
