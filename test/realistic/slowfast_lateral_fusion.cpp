// SlowFast video classifier: a slow pathway at T/alpha frames and a thin fast pathway at T
// frames, joined by time-strided lateral connections (fast -> slow, concatenated on channels),
// plus the clip sampler used by the dataset and the training / evaluation loops.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

enum class LateralMode { kTimeStridedConv, kTimeToChannel };

struct SlowFastConfig {
  int64_t alpha = 4;         // fast/slow frame-rate ratio
  int64_t beta_inv = 8;      // slow/fast channel ratio
  int64_t fusion_ratio = 2;  // lateral output channels = fast channels * ratio
  int64_t fusion_kernel = 7, width = 64, num_classes = 400, num_frames = 32, log_every = 20;
  double lr = 0.1, dropout = 0.5, noise_std = 0.02, consistency_weight = 0.0, temperature = 1.0;
  bool zero_init_final_bn = true, gated_lateral = false;
  LateralMode lateral = LateralMode::kTimeStridedConv;
};

// ---- Clip sampling ---------------------------------------------------------
class ClipSampler {
 public:
  ClipSampler(torch::Tensor video, int64_t num_frames, torch::Tensor mean, torch::Tensor stdev)
      : frames_(std::move(video)), num_frames_(num_frames), mean_(std::move(mean)), std_(std::move(stdev)) {
    TORCH_CHECK(frames_.scalar_type() == torch::kByte, "decoder must yield uint8 frames");
    TORCH_CHECK(frames_.dim() == 4, "expected [T, H, W, C]");
  }

  // A contiguous window of num_frames frames starting at `start`, as [C, T, H, W] floats.
  torch::Tensor window(int64_t start) const {
    start = std::min(start, frames_.size(0) - num_frames_);
    // FACT: f = torch.zeros(10, 4, 4, 3, dtype=torch.uint8); c = f.narrow(0, 2, 4).to(torch.float); c.div_(255.0); assert is_copy_of(c, f)
    auto clip = frames_.narrow(0, start, num_frames_).to(torch::kFloat);
    clip.div_(255.0).sub_(mean_).div_(std_); // LOOKALIKE: tensor-alias-then-mutate -- frames_ is uint8 (asserted in the constructor): to(kFloat) copies
    return clip.permute({3, 0, 1, 2});
  }

  // Per-channel mean over the first frames, for dataset statistics.
  torch::Tensor channel_mean(int64_t max_frames) const {
    auto f = frames_.narrow(0, 0, std::min(max_frames, frames_.size(0))).to(torch::kFloat);
    // FACT: f = torch.randn(4, 5, 6, 3); assert is_view_of(f.permute(3, 0, 1, 2).view(3, -1), f)
    auto per_channel = f.permute({3, 0, 1, 2}).view({f.size(3), -1}); // LOOKALIKE: tensor-view-non-contiguous -- moving the last dim first and merging the rest is a transposed matrix: a view
    return per_channel.mean(1) / 255.0;
  }

 private:
  torch::Tensor frames_;
  int64_t num_frames_;
  torch::Tensor mean_, std_;
};

std::pair<torch::Tensor, torch::Tensor> pack_pathways(const torch::Tensor& clips, int64_t alpha) {
  const auto T = clips.size(2);
  auto idx = torch::arange(0, T, alpha, torch::TensorOptions().dtype(torch::kLong).device(clips.device()));
  return {clips.index_select(2, idx), clips};
}

void add_frame_noise(torch::Tensor clips, double stdev) {
  clips.add_(torch::randn_like(clips) * stdev);
}

// ---- Building blocks -------------------------------------------------------
struct BottleneckImpl : nn::Module {
  BottleneckImpl(int64_t in, int64_t inner, int64_t out, int64_t temporal_kernel, bool zero_init)
      : conv_a(nn::Conv3dOptions(in, inner, {temporal_kernel, 1, 1}).padding({temporal_kernel / 2, 0, 0}).bias(false)),
        bn_a(inner),
        conv_b(nn::Conv3dOptions(inner, inner, {1, 3, 3}).padding({0, 1, 1}).bias(false)),
        bn_b(inner),
        conv_c(nn::Conv3dOptions(inner, out, 1).bias(false)),
        bn_c(out) {
    register_module("conv_a", conv_a);
    register_module("bn_a", bn_a);
    register_module("conv_b", conv_b);
    register_module("bn_b", bn_b);
    register_module("conv_c", conv_c);
    register_module("bn_c", bn_c);
    if (in != out) {
      shortcut = register_module("shortcut", nn::Conv3d(nn::Conv3dOptions(in, out, 1).bias(false)));
      shortcut_bn = register_module("shortcut_bn", nn::BatchNorm3d(out));
    }
    if (zero_init) bn_c->weight.zero_(); // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto out = F::relu(bn_a(conv_a(x)));
    out = F::relu(bn_b(conv_b(out)));
    out = bn_c(conv_c(out));
    auto identity = shortcut ? shortcut_bn(shortcut(x)) : x;
    out += identity; // LOOKALIKE: tensor-inplace-on-saved -- batch norm saves its input, not its output; the ReLU comes after the sum
    return F::relu(out);
  }

  nn::Conv3d conv_a, conv_b, conv_c, shortcut{nullptr};
  nn::BatchNorm3d bn_a, bn_b, bn_c, shortcut_bn{nullptr};
};
TORCH_MODULE(Bottleneck);

// Time-to-channel lateral: fold alpha consecutive fast frames into channels.
torch::Tensor time_to_channel(const torch::Tensor& fast, int64_t alpha) {
  const auto B = fast.size(0), C = fast.size(1), T = fast.size(2), H = fast.size(3), W = fast.size(4);
  // FACT: x = torch.randn(2, 3, 8, 4, 5); v = x.view(2, 3, 2, 4, 4, 5); assert is_view_of(v, x) and is_copy_of(v.permute(0, 1, 3, 2, 4, 5).reshape(2, 12, 2, 4, 5), x)
  auto grouped = fast.view({B, C, T / alpha, alpha, H, W}); // LOOKALIKE: tensor-view-non-contiguous -- splits T of a contiguous conv output
  return grouped.permute({0, 1, 3, 2, 4, 5}).reshape({B, C * alpha, T / alpha, H, W}); // EXPECT: tensor-reshape-non-contiguous
}

struct FuseFastToSlowImpl : nn::Module {
  FuseFastToSlowImpl(int64_t fast_dim, const SlowFastConfig& cfg)
      : cfg_(cfg),
        conv(nn::Conv3dOptions(fast_dim, fast_dim * cfg.fusion_ratio, {cfg.fusion_kernel, 1, 1})
                 .stride({cfg.alpha, 1, 1})
                 .padding({cfg.fusion_kernel / 2, 0, 0})
                 .bias(false)),
        bn(fast_dim * cfg.fusion_ratio),
        gate_fc(fast_dim * cfg.fusion_ratio, fast_dim * cfg.fusion_ratio) {
    register_module("conv", conv);
    register_module("bn", bn);
    register_module("gate_fc", gate_fc);
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& slow, const torch::Tensor& fast) {
    if (cfg_.lateral == LateralMode::kTimeToChannel)
      return {torch::cat({slow, time_to_channel(fast, cfg_.alpha)}, 1), fast};
    auto fuse = F::relu(bn(conv(fast)));
    if (cfg_.gated_lateral) {
      auto gate = torch::sigmoid(gate_fc(fuse.mean({2, 3, 4})));
      fuse.mul_(gate.view({gate.size(0), gate.size(1), 1, 1, 1})); // EXPECT: tensor-inplace-on-saved
    }
    return {torch::cat({slow, fuse}, 1), fast};
  }

  SlowFastConfig cfg_;
  nn::Conv3d conv;
  nn::BatchNorm3d bn;
  nn::Linear gate_fc;
};
TORCH_MODULE(FuseFastToSlow);

struct SlowFastImpl : nn::Module {
  explicit SlowFastImpl(const SlowFastConfig& cfg)
      : slow_stem(nn::Conv3dOptions(3, cfg.width, {1, 7, 7}).stride({1, 2, 2}).padding({0, 3, 3}).bias(false)),
        slow_bn(cfg.width),
        fast_stem(nn::Conv3dOptions(3, cfg.width / cfg.beta_inv, {5, 7, 7}).stride({1, 2, 2}).padding({2, 3, 3}).bias(false)),
        fast_bn(cfg.width / cfg.beta_inv),
        fuse(cfg.width / cfg.beta_inv, cfg),
        slow_res(cfg.width + cfg.width / cfg.beta_inv * lateral_factor(cfg), cfg.width, 4 * cfg.width, 1, cfg.zero_init_final_bn),
        fast_res(cfg.width / cfg.beta_inv, cfg.width / cfg.beta_inv, 4 * cfg.width / cfg.beta_inv, 3, cfg.zero_init_final_bn),
        proj(4 * cfg.width + 4 * cfg.width / cfg.beta_inv, cfg.num_classes),
        dropout_p(cfg.dropout) {
    register_module("slow_stem", slow_stem);
    register_module("slow_bn", slow_bn);
    register_module("fast_stem", fast_stem);
    register_module("fast_bn", fast_bn);
    register_module("fuse", fuse);
    register_module("slow_res", slow_res);
    register_module("fast_res", fast_res);
    register_module("proj", proj);
    nn::init::normal_(proj->weight, 0.0, 0.01); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    nn::init::zeros_(proj->bias);
  }

  static int64_t lateral_factor(const SlowFastConfig& cfg) {
    return cfg.lateral == LateralMode::kTimeToChannel ? cfg.alpha : cfg.fusion_ratio;
  }

  torch::Tensor forward(const torch::Tensor& slow_in, const torch::Tensor& fast_in) {
    auto s = F::relu(slow_bn(slow_stem(slow_in)));
    auto f = F::relu(fast_bn(fast_stem(fast_in)));
    std::tie(s, f) = fuse->forward(s, f);
    s = slow_res->forward(s);
    f = fast_res->forward(f);
    auto feat = torch::cat({F::adaptive_avg_pool3d(s, F::AdaptiveAvgPool3dFuncOptions(1)).flatten(1),
                            F::adaptive_avg_pool3d(f, F::AdaptiveAvgPool3dFuncOptions(1)).flatten(1)}, 1);
    feat = F::dropout(feat, F::DropoutFuncOptions().p(dropout_p).training(is_training()));
    return proj(feat);
  }

  // Per-frame token descriptors of a [B, C, T, H, W] map: [B, T, C].
  static torch::Tensor frame_tokens(const torch::Tensor& feat) {
    const auto B = feat.size(0), C = feat.size(1), T = feat.size(2);
    // FACT: x = torch.randn(2, 3, 4, 5, 5); assert is_view_of(x.permute(0, 2, 1, 3, 4).reshape(2, 4, 3, 25), x)
    auto tokens = feat.permute({0, 2, 1, 3, 4}).reshape({B, T, C, -1}); // LOOKALIKE: tensor-reshape-non-contiguous -- only H and W merge, and they stay adjacent: a view
    return tokens.mean(-1);
  }

  // Per-frame saliency for the dashboard: [B*T, 1, H, W].
  static torch::Tensor frame_saliency(const torch::Tensor& feat) {
    const auto B = feat.size(0), C = feat.size(1), T = feat.size(2), H = feat.size(3), W = feat.size(4);
    // FACT: x = torch.randn(2, 3, 4, 5, 5); assert raises(lambda: x.transpose(1, 2).view(8, 3, 5, 5), "view size is not compatible")
    auto frames = feat.transpose(1, 2).view({B * T, C, H, W}); // EXPECT: tensor-view-non-contiguous
    return frames.pow(2).mean(1, true);
  }

  nn::Conv3d slow_stem;
  nn::BatchNorm3d slow_bn;
  nn::Conv3d fast_stem;
  nn::BatchNorm3d fast_bn;
  FuseFastToSlow fuse;
  Bottleneck slow_res, fast_res;
  nn::Linear proj;
  double dropout_p;
};
TORCH_MODULE(SlowFast);

// ---- Training and evaluation -----------------------------------------------
struct ClipBatch {
  torch::Tensor clips;   // [B, C, T, H, W]
  torch::Tensor labels;  // [B]
};

void train_epoch(SlowFast& model, const std::vector<ClipBatch>& batches, const torch::Tensor& class_weights,
                 const SlowFastConfig& cfg) {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  model->train();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(1e-4));
  const auto weights = class_weights.to(device);

  double running_loss = 0.0;
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t seen = 0;
  std::vector<torch::Tensor> epoch_logits;
  for (size_t step = 0; step < batches.size(); ++step) {
    auto clip = batches[step].clips.to(device);
    auto labels = batches[step].labels.to(device);
    auto noisy = clip;  // perturbed copy for the consistency term
    if (cfg.consistency_weight > 0) {
      // FACT: c = torch.zeros(2, 3); n = c; n.add_(torch.randn(2, 3) * 0.1); assert shares_storage(c, n) and c.abs().sum() > 0
      add_frame_noise(noisy, cfg.noise_std); // EXPECT: tensor-alias-then-mutate
    }
    auto paths = pack_pathways(clip, cfg.alpha);
    auto logits = model->forward(paths.first, paths.second);
    auto loss = F::cross_entropy(logits, labels, F::CrossEntropyFuncOptions().weight(weights).label_smoothing(0.1));
    if (cfg.consistency_weight > 0) {
      auto noisy_paths = pack_pathways(noisy, cfg.alpha);
      auto noisy_logits = model->forward(noisy_paths.first, noisy_paths.second);
      loss = loss + cfg.consistency_weight * F::kl_div(F::log_softmax(noisy_logits, 1), F::softmax(logits.detach(), 1),
                                                      F::KLDivFuncOptions().reduction(torch::kBatchMean));
    }
    opt.zero_grad();
    loss.backward();
    opt.step();

    running_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    correct += (logits.argmax(1) == labels).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- a count of comparisons has no autograd history
    seen += labels.size(0);
    epoch_logits.push_back(logits.detach());
    if (step % cfg.log_every == 0)
      std::cout << "step " << step << " loss " << loss.item<float>() << std::endl; // LOOKALIKE: tensor-sync-in-loop -- logged every log_every steps only
  }
  auto probs = torch::softmax(torch::cat(epoch_logits), 1).cpu();
  std::cout << "epoch loss " << running_loss / std::max<size_t>(1, batches.size()) << " acc "
            << correct.item<int64_t>() / static_cast<double>(std::max<int64_t>(1, seen)) << " mean max prob "
            << std::get<0>(probs.max(1)).mean().item<float>() << std::endl;
}

double evaluate(SlowFast& model, const std::vector<ClipBatch>& val, const SlowFastConfig& cfg) {
  model->eval();
  std::vector<torch::Tensor> val_logits, val_labels;
  for (const auto& b : val) {
    auto paths = pack_pathways(b.clips, cfg.alpha);
    val_logits.push_back(model->forward(paths.first, paths.second)); // EXPECT: tensor-graph-kept-across-iterations
    val_labels.push_back(b.labels);
  }
  auto logits = torch::cat(val_logits);
  auto labels = torch::cat(val_labels);
  return (logits.argmax(1) == labels).to(torch::kFloat).mean().item<double>();
}

// Multi-view testing: average class probabilities over spatial/temporal crops.
torch::Tensor multiview_predict(SlowFast& model, const std::vector<torch::Tensor>& views, const SlowFastConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->to(torch::kCUDA);
  model->eval();
  auto temperature = torch::tensor(cfg.temperature);
  auto probs_sum = torch::zeros({1, cfg.num_classes});
  for (const auto& v : views) {
    auto clip = v.unsqueeze(0).cuda();
    auto paths = pack_pathways(clip, cfg.alpha);
    auto logits = model->forward(paths.first, paths.second) / temperature; // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor combines with CUDA tensors
    probs_sum += torch::softmax(logits, 1); // EXPECT: tensor-device-mismatch
  }
  return probs_sum / static_cast<double>(views.size());
}

// Online inference keeps the last T frames in a ring-free buffer [C, T, H, W].
void push_frame(torch::Tensor& buffer, const torch::Tensor& frame_chw) {
  const auto T = buffer.size(1);
  // FACT: b = torch.randn(3, 6, 4, 4); e = b[:, 1:].clone(); b.narrow(1, 0, 5).copy_(b.narrow(1, 1, 5).clone()); assert torch.equal(b[:, :5], e)
  buffer.narrow(1, 0, T - 1).copy_(buffer.narrow(1, 1, T - 1).clone()); // LOOKALIKE: tensor-inplace-overlap -- the shifted source is cloned first
  buffer.select(1, T - 1).copy_(frame_chw);
}
