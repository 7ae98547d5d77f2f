// Self-supervised video pretraining (instance discrimination with a memory bank):
// clips are sampled from decoded videos, two augmented views per clip go through a
// frame encoder with temporal pooling, and an InfoNCE loss contrasts the views
// against the bank, which is refreshed with the new embeddings every step.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;
namespace nn = torch::nn;
using torch::Tensor;

struct ClipConfig {
  int64_t clip_len = 16;
  int64_t frame_stride = 2;
  int64_t crop = 112;
  double min_area = 0.3;
  double flip_p = 0.5;
  double brightness = 0.4;
  double saturation = 0.4;
  int64_t clips_per_video = 2;
  int64_t embed_dim = 128;
  double temperature = 0.07;
  double bank_momentum = 0.5;
  int64_t log_every = 50;
};

// x: any layout; mean/std: [C] broadcast along `channel_dim`. Writes x.
void normalize_(Tensor x, const Tensor& mean, const Tensor& std, int64_t channel_dim) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[channel_dim] = -1;
  // FACT: x = torch.rand(3, 4, 5, 5); m = torch.rand(3); assert x.sub_(m.view(-1, 1, 1, 1).expand_as(x)) is x
  x.sub_(mean.view(shape).expand_as(x)).div_(std.view(shape)); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded mean is only read
}

class ClipSampler {
 public:
  ClipSampler(const ClipConfig& cfg, uint64_t seed)
      : cfg_(cfg), rng_(seed),
        luma_(torch::tensor({0.299f, 0.587f, 0.114f}, torch::kFloat)),
        mean_(torch::tensor({0.43f, 0.39f, 0.37f}, torch::kFloat)),
        std_(torch::tensor({0.23f, 0.22f, 0.22f}, torch::kFloat)) {}

  // video: [T, C, H, W] in [0, 1] -> [clip_len, C, H, W], a strided view of `video`
  Tensor temporal_crop(const Tensor& video) {
    const int64_t span = (cfg_.clip_len - 1) * cfg_.frame_stride + 1;
    std::uniform_int_distribution<int64_t> start(0, std::max<int64_t>(video.size(0) - span, 0));
    const int64_t s = start(rng_);
    return video.slice(0, s, s + span, cfg_.frame_stride);
  }

  // consecutive frames from the middle of the video, for evaluation
  Tensor center_clip(const Tensor& video) const {
    const int64_t s = std::max<int64_t>((video.size(0) - cfg_.clip_len) / 2, 0);
    return video.narrow(0, s, cfg_.clip_len);
  }

  // random resized crop + horizontal flip, the same for every frame: new memory
  Tensor spatial_crop(const Tensor& clip) {
    const int64_t H = clip.size(2), W = clip.size(3);
    const double area = std::uniform_real_distribution<double>(cfg_.min_area, 1.0)(rng_);
    const int64_t ch = std::max<int64_t>(8, static_cast<int64_t>(H * std::sqrt(area)));
    const int64_t cw = std::max<int64_t>(8, static_cast<int64_t>(W * std::sqrt(area)));
    const int64_t y0 = std::uniform_int_distribution<int64_t>(0, H - ch)(rng_);
    const int64_t x0 = std::uniform_int_distribution<int64_t>(0, W - cw)(rng_);
    auto region = clip.narrow(2, y0, ch).narrow(3, x0, cw);
    auto out = F::interpolate(region, F::InterpolateFuncOptions()
                                          .size(std::vector<int64_t>{cfg_.crop, cfg_.crop})
                                          .mode(torch::kBilinear)
                                          .align_corners(false));
    if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < cfg_.flip_p) out = out.flip({3});
    return out;
  }

  // brightness and saturation jitter, written into `clip` ([L, C, h, w])
  void color_jitter_(Tensor clip) {
    std::uniform_real_distribution<double> b(1.0 - cfg_.brightness, 1.0 + cfg_.brightness);
    std::uniform_real_distribution<double> s(1.0 - cfg_.saturation, 1.0 + cfg_.saturation);
    const double sat = s(rng_);
    clip.mul_(b(rng_));
    auto grey = (clip * luma_.view({1, 3, 1, 1})).sum(1, true).expand_as(clip);
    // FACT: g = torch.rand(4, 1, 5, 5).expand(4, 3, 5, 5); assert raises(lambda: g.mul_(0.5), "more than one element")
    grey.mul_(1.0 - sat); // EXPECT: tensor-inplace-on-expanded
    clip.mul_(sat).add_(grey).clamp_(0.0, 1.0);
  }

  // two independently augmented views, model layout [C, L, crop, crop]
  std::pair<Tensor, Tensor> two_views(const Tensor& video) {
    auto clip = temporal_crop(video);
    auto v1 = spatial_crop(clip);
    auto v2 = spatial_crop(clip);
    // FACT: c = torch.rand(4, 3, 8, 8)[:, :, 1:6, 2:7]; o = torch.nn.functional.interpolate(c, size=(4, 4), mode="bilinear", align_corners=False); assert is_copy_of(o, c)
    color_jitter_(v1); // LOOKALIKE: tensor-alias-then-mutate -- spatial_crop returns interpolated memory, not a view of the video
    color_jitter_(v2);
    auto x1 = v1.permute({1, 0, 2, 3}).contiguous();
    auto x2 = v2.permute({1, 0, 2, 3}).contiguous();
    // FACT: v = torch.rand(4, 3, 5, 5); x = v.permute(1, 0, 2, 3).contiguous(); assert is_copy_of(x, v)
    normalize_(x1, mean_, std_, 0); // LOOKALIKE: tensor-alias-then-mutate -- permute makes contiguous() copy
    normalize_(x2, mean_, std_, 0);
    return {x1, x2};
  }

  // decoded: [T, H, W, C] as the decoder hands it over
  std::vector<std::pair<Tensor, Tensor>> views_for_video(const Tensor& decoded) {
    auto tchw = decoded.permute({0, 3, 1, 2});
    std::vector<std::pair<Tensor, Tensor>> out;
    for (int64_t c = 0; c < cfg_.clips_per_video; ++c) {
      auto frames = tchw.contiguous(); // EXPECT: tensor-clone-in-loop
      out.push_back(two_views(frames));
    }
    return out;
  }

  const Tensor& mean() const { return mean_; }
  const Tensor& stddev() const { return std_; }

 private:
  ClipConfig cfg_;
  std::mt19937_64 rng_;
  Tensor luma_, mean_, std_;
};

// Per-frame 2D stem, temporal convolution, projection onto the unit sphere.
struct ClipEncoderImpl : nn::Module {
  explicit ClipEncoderImpl(int64_t embed_dim) {
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 32, 3).stride(2).padding(1)));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).stride(2).padding(1)));
    temporal_ = register_module("temporal", nn::Conv1d(nn::Conv1dOptions(64, 128, 3).padding(1)));
    head_ = register_module("head", nn::Linear(128, embed_dim));
  }

  // x: [B, C, L, H, W] -> [B, D], L2-normalised
  Tensor forward(const Tensor& x) {
    const int64_t B = x.size(0), C = x.size(1), L = x.size(2), H = x.size(3), W = x.size(4);
    // FACT: x = torch.randn(2, 3, 4, 5, 5); assert is_copy_of(x.transpose(1, 2).reshape(8, 3, 5, 5), x)
    auto frames = x.transpose(1, 2).reshape({B * L, C, H, W}); // EXPECT: tensor-reshape-non-contiguous
    auto h = torch::relu(conv2_(torch::relu(conv1_(frames))));
    h = F::adaptive_avg_pool2d(h, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);  // [B*L, 64]
    // FACT: h = torch.randn(8, 64, 1, 1).flatten(1); assert is_view_of(h.view(2, 4, -1), h)
    auto seq = h.view({B, L, -1}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- the pooled features are contiguous
    auto t = torch::relu(temporal_(seq)).mean(2);
    return F::normalize(head_(t), F::NormalizeFuncOptions().dim(1));
  }

  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::Conv1d temporal_{nullptr};
  nn::Linear head_{nullptr};
};
TORCH_MODULE(ClipEncoder);

struct ClipBatch {
  Tensor view1, view2;  // [B, C, L, crop, crop]
  Tensor index;         // [B] int64, dataset positions
};

struct MemoryBank {
  MemoryBank(int64_t n, int64_t dim, torch::Device device)
      : feats(F::normalize(torch::randn({n, dim}), F::NormalizeFuncOptions().dim(1)).to(device)) {}
  Tensor feats;  // [N, D]
};

double pretrain_epoch(ClipEncoder& net, MemoryBank& bank, const std::vector<ClipBatch>& batches,
                      torch::optim::Optimizer& opt, const ClipConfig& cfg) {
  torch::Device device(torch::kCUDA);
  net->to(device);
  net->train();
  const Tensor temp = torch::tensor(cfg.temperature);
  double epoch_loss = 0.0;
  int64_t step = 0;
  for (const auto& batch : batches) {
    auto idx = batch.index.to(device);
    auto z1 = net->forward(batch.view1.to(device));
    auto z2 = net->forward(batch.view2.to(device));
    const int64_t B = z1.size(0);

    auto pos = (z1 * z2).sum(1, true);                 // [B, 1]
    auto neg = torch::matmul(z1, bank.feats.t());      // [B, N]
    auto logits = torch::cat({pos, neg}, 1) / temp; // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may join CUDA operands
    auto labels = torch::zeros({B}, torch::kLong);
    auto loss = F::cross_entropy(logits, labels); // EXPECT: tensor-device-mismatch

    // v_i <- normalize(m * v_i + (1 - m) * f_i)  (Wu et al. 2018)
    auto fresh = z2.detach();
    fresh.mul_(1.0 - cfg.bank_momentum).add_(bank.feats.index_select(0, idx), cfg.bank_momentum); // EXPECT: tensor-inplace-on-detached
    bank.feats.index_copy_(0, idx, F::normalize(fresh, F::NormalizeFuncOptions().dim(1)));

    opt.zero_grad();
    loss.backward();
    opt.step();
    epoch_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    if (++step % cfg.log_every == 0)
      std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
  }
  return epoch_loss / static_cast<double>(std::max<size_t>(batches.size(), 1));
}

struct EvalItem {
  Tensor clip;   // [C, L, H, W], normalised
  Tensor label;  // 0-dim int64
};

struct VideoRecord {
  Tensor frames;  // decoded once and cached: [T, C, H, W] in [0, 1]
  Tensor label;
};

std::vector<EvalItem> build_eval_set(const ClipSampler& sampler, const std::vector<VideoRecord>& videos) {
  std::vector<EvalItem> items;
  items.reserve(videos.size());
  for (const auto& v : videos) {
    auto x = sampler.center_clip(v.frames).contiguous(); // LOOKALIKE: tensor-clone-in-loop -- a different video each iteration
    // FACT: v = torch.rand(8, 3, 4, 4); x = v.narrow(0, 2, 4).contiguous(); x.sub_(0.5); assert shares_storage(x, v) and x.data_ptr() == v[2].data_ptr()
    normalize_(x, sampler.mean(), sampler.stddev(), 1); // EXPECT: tensor-alias-then-mutate
    items.push_back({x.permute({1, 0, 2, 3}).contiguous(), v.label});
  }
  return items;
}

// k-NN top-1 accuracy of the frozen embeddings (the usual SSL monitor).
double knn_accuracy(ClipEncoder& net, const std::vector<EvalItem>& train_set,
                    const std::vector<EvalItem>& val_set, int64_t k, int64_t n_classes) {
  net->eval();
  std::vector<Tensor> train_feats, train_labels;
  for (const auto& item : train_set) {
    train_feats.push_back(net->forward(item.clip.unsqueeze(0))); // EXPECT: tensor-graph-kept-across-iterations
    train_labels.push_back(item.label); // LOOKALIKE: tensor-graph-kept-across-iterations -- labels carry no graph
  }
  auto feats = torch::cat(train_feats);    // [N, D]
  auto labels = torch::stack(train_labels);
  int64_t correct = 0;
  torch::NoGradGuard no_grad;
  for (const auto& item : val_set) {
    auto sim = torch::matmul(net->forward(item.clip.unsqueeze(0)), feats.t()).squeeze(0);
    auto nearest = std::get<1>(sim.topk(std::min<int64_t>(k, sim.size(0))));
    auto votes = torch::bincount(labels.index_select(0, nearest), {}, n_classes);
    if (votes.argmax().item<int64_t>() == item.label.item<int64_t>()) ++correct;
  }
  return static_cast<double>(correct) / static_cast<double>(std::max<size_t>(val_set.size(), 1));
}
