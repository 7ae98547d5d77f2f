// EfficientNet-B0-style backbone: MBConv blocks with squeeze-excitation and stochastic depth,
// an NHWC (decoder order) input adapter, label-smoothed training and a top-k eval loop.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct MBConvConfig {
  int64_t in_ch, out_ch, expand_ratio, kernel, stride;
  double se_ratio = 0.25;
  double drop_path = 0.0;
};

struct TrainConfig {
  double label_smoothing = 0.1;
  double ema_decay = 0.9998;
  int64_t log_every = 100;
  std::vector<int64_t> class_counts;  // training-set frequency, for logit adjustment
  double logit_tau = 1.0;
};

// Drop the whole residual branch for a random subset of samples.
torch::Tensor drop_path(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0.0) return x;
  const double keep = 1.0 - p;
  auto mask = torch::empty({x.size(0), 1, 1, 1}, x.options()).bernoulli_(keep).expand_as(x);
  // FACT: x = torch.rand(4, 3, 5, 5); m = torch.empty(4, 1, 1, 1).bernoulli_(0.8).expand_as(x); assert raises(lambda: m.div_(0.8), "more than one element")
  mask.div_(keep); // EXPECT: tensor-inplace-on-expanded
  return x * mask;
}

class SqueezeExciteImpl : public torch::nn::Module {
 public:
  SqueezeExciteImpl(int64_t channels, int64_t squeezed)
      : reduce_(register_module("reduce", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, squeezed, 1)))),
        expand_(register_module("expand", torch::nn::Conv2d(torch::nn::Conv2dOptions(squeezed, channels, 1)))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto s = x.mean({2, 3}, /*keepdim=*/true);
    s = F::silu(reduce_->forward(s));
    auto gate = torch::sigmoid(expand_->forward(s));
    return x * gate;
  }

 private:
  torch::nn::Conv2d reduce_, expand_;
};
TORCH_MODULE(SqueezeExcite);

class MBConvImpl : public torch::nn::Module {
 public:
  explicit MBConvImpl(const MBConvConfig& c)
      : use_residual_(c.stride == 1 && c.in_ch == c.out_ch), drop_rate_(c.drop_path) {
    namespace nn = torch::nn;
    const int64_t hidden = c.in_ch * c.expand_ratio;
    if (c.expand_ratio != 1) {
      expand_conv_ = register_module("expand_conv", nn::Conv2d(nn::Conv2dOptions(c.in_ch, hidden, 1).bias(false)));
      expand_bn_ = register_module("expand_bn", nn::BatchNorm2d(nn::BatchNorm2dOptions(hidden).momentum(0.01).eps(1e-3)));
    }
    dw_conv_ = register_module("dw_conv", nn::Conv2d(nn::Conv2dOptions(hidden, hidden, c.kernel)
                                                         .stride(c.stride).padding(c.kernel / 2)
                                                         .groups(hidden).bias(false)));
    dw_bn_ = register_module("dw_bn", nn::BatchNorm2d(nn::BatchNorm2dOptions(hidden).momentum(0.01).eps(1e-3)));
    const int64_t squeezed = std::max<int64_t>(1, static_cast<int64_t>(c.in_ch * c.se_ratio));
    se_ = register_module("se", SqueezeExcite(hidden, squeezed));
    project_conv_ = register_module("project_conv", nn::Conv2d(nn::Conv2dOptions(hidden, c.out_ch, 1).bias(false)));
    project_bn_ = register_module("project_bn", nn::BatchNorm2d(nn::BatchNorm2dOptions(c.out_ch).momentum(0.01).eps(1e-3)));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = x;
    if (!expand_conv_.is_empty()) h = F::silu(expand_bn_->forward(expand_conv_->forward(h)));
    h = F::silu(dw_bn_->forward(dw_conv_->forward(h)));
    h = se_->forward(h);
    h = project_bn_->forward(project_conv_->forward(h));
    if (use_residual_) {
      h = drop_path(h, drop_rate_, is_training());
      h += x; // LOOKALIKE: tensor-inplace-on-saved -- BatchNorm / the drop-path product do not save their output
    }
    return h;
  }

 private:
  bool use_residual_;
  double drop_rate_;
  torch::nn::Conv2d expand_conv_{nullptr}, dw_conv_{nullptr}, project_conv_{nullptr};
  torch::nn::BatchNorm2d expand_bn_{nullptr}, dw_bn_{nullptr}, project_bn_{nullptr};
  SqueezeExcite se_{nullptr};
};
TORCH_MODULE(MBConv);

class EfficientNetImpl : public torch::nn::Module {
 public:
  EfficientNetImpl(const std::vector<MBConvConfig>& blocks, int64_t num_classes, double dropout) {
    namespace nn = torch::nn;
    const int64_t stem_ch = blocks.front().in_ch, last_ch = blocks.back().out_ch;
    stem_ = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, stem_ch, 3).stride(2).padding(1).bias(false)));
    stem_bn_ = register_module("stem_bn", nn::BatchNorm2d(stem_ch));
    for (const auto& c : blocks) blocks_->push_back(MBConv(c));
    register_module("blocks", blocks_);
    head_ = register_module("head", nn::Conv2d(nn::Conv2dOptions(last_ch, 1280, 1).bias(false)));
    head_bn_ = register_module("head_bn", nn::BatchNorm2d(1280));
    dropout_ = register_module("dropout", nn::Dropout(dropout));
    fc_ = register_module("fc", nn::Linear(1280, num_classes));
  }

  torch::Tensor forward(const torch::Tensor& images) {
    auto x = F::silu(stem_bn_->forward(stem_->forward(images)));
    for (auto& blk : *blocks_) x = blk->as<MBConv>()->forward(x);
    x = F::silu(head_bn_->forward(head_->forward(x)));
    auto pooled = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1));
    // FACT: x = torch.rand(2, 8, 5, 5).to(memory_format=torch.channels_last); p = torch.nn.functional.adaptive_avg_pool2d(x, 1); assert is_view_of(p.flatten(1), p)
    auto feats = pooled.flatten(1); // LOOKALIKE: tensor-reshape-non-contiguous -- only 1x1 dims are merged: a view even for channels-last activations
    return fc_->forward(dropout_->forward(feats));
  }

 private:
  torch::nn::Conv2d stem_{nullptr}, head_{nullptr};
  torch::nn::BatchNorm2d stem_bn_{nullptr}, head_bn_{nullptr};
  torch::nn::ModuleList blocks_;
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(EfficientNet);

// The JPEG decoder hands float NHWC batches in [0, 1]; the network wants normalised NCHW in
// channels-last memory, which is exactly the NHWC buffer seen through a permute.
class ChannelsLastAdapterImpl : public torch::nn::Module {
 public:
  ChannelsLastAdapterImpl() {
    mean_ = register_buffer("mean", torch::tensor({0.485, 0.456, 0.406}, torch::kFloat));
    std_ = register_buffer("std", torch::tensor({0.229, 0.224, 0.225}, torch::kFloat));
  }

  torch::Tensor forward(const torch::Tensor& nhwc) {
    // FACT: n = torch.rand(2, 4, 4, 3); x = n.contiguous(); x.sub_(torch.rand(3)); assert shares_storage(x, n)
    auto x = nhwc.contiguous();
    x.sub_(mean_).div_(std_); // EXPECT: tensor-alias-then-mutate
    return x.permute({0, 3, 1, 2});
  }

  // uint8 batches straight from the decoder (cached datasets).
  torch::Tensor from_bytes(const torch::Tensor& nhwc_u8) {
    TORCH_CHECK(nhwc_u8.scalar_type() == torch::kByte, "expected uint8 images");
    // FACT: i = torch.randint(0, 255, (2, 4, 4, 3), dtype=torch.uint8); assert is_copy_of(i.to(torch.float32), i)
    auto x = nhwc_u8.to(torch::kFloat);
    x.div_(255.0); // LOOKALIKE: tensor-alias-then-mutate -- the input is uint8, to(kFloat) allocates
    return forward(x);
  }

  torch::Tensor mean_, std_;
};
TORCH_MODULE(ChannelsLastAdapter);

// Per-channel statistics of a decoded NHWC batch, for dataset normalisation constants.
std::pair<torch::Tensor, torch::Tensor> channel_stats(const torch::Tensor& nhwc) {
  const int64_t C = nhwc.size(3);
  const std::vector<int64_t> pixels = {1};
  auto nchw = nhwc.permute({0, 3, 1, 2});
  // FACT: n = torch.rand(2, 5, 6, 3); assert is_view_of(n.permute(0, 3, 1, 2).transpose(0, 1).view(3, -1), n)
  auto per_channel = nchw.transpose(0, 1).view({C, -1}); // LOOKALIKE: tensor-view-non-contiguous -- NHWC memory: channel-major over (B, H, W) is expressible with strides
  return {per_channel.mean(pixels), per_channel.std(pixels, /*unbiased=*/true)};
}

// Mean per-plane contrast of each image; near-blank decodes are dropped from the cache.
torch::Tensor image_contrast(const torch::Tensor& nhwc) {
  const std::vector<int64_t> pixels = {1};
  auto nchw = nhwc.permute({0, 3, 1, 2});
  const int64_t B = nchw.size(0), C = nchw.size(1);
  // FACT: n = torch.rand(2, 5, 6, 3); assert raises(lambda: n.permute(0, 3, 1, 2).view(6, -1), "view size is not compatible")
  auto planes = nchw.view({B * C, -1}); // EXPECT: tensor-view-non-contiguous
  return planes.std(pixels, /*unbiased=*/true).view({B, C}).mean(pixels);
}

torch::Tensor smoothed_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target, double eps) {
  auto logp = torch::log_softmax(logits, 1);
  // FACT: l = torch.randn(4, 5, requires_grad=True); lp = torch.log_softmax(l * 1, 1); lp.neg_(); assert backward_fails(lambda: lp.sum().backward())
  logp.neg_(); // EXPECT: tensor-inplace-on-saved
  auto nll = logp.gather(1, target.unsqueeze(1)).squeeze(1);
  auto smooth = logp.mean(1);
  return ((1.0 - eps) * nll + eps * smooth).mean();
}

void ema_update(EfficientNet& ema, EfficientNet& model, double decay) {
  torch::NoGradGuard no_grad;
  auto ema_params = ema->parameters();
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    ema_params[i].mul_(decay).add_(params[i], 1.0 - decay); // LOOKALIKE: tensor-inplace-on-leaf -- EMA update under NoGradGuard
  auto ema_bufs = ema->buffers();
  auto bufs = model->buffers();
  for (size_t i = 0; i < bufs.size(); ++i) ema_bufs[i].copy_(bufs[i]);
}

void train_epoch(EfficientNet& model, EfficientNet& ema, ChannelsLastAdapter& adapter,
                 torch::optim::Optimizer& opt, const std::vector<torch::data::Example<>>& batches,
                 const TrainConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  ema->to(device);
  adapter->to(device);
  model->train();
  std::vector<torch::Tensor> step_losses;
  torch::Tensor smoothed = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (const auto& batch : batches) {
    auto images = batch.data.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    auto labels = batch.target.to(device);
    auto logits = model->forward(adapter->forward(images));
    auto loss = smoothed_cross_entropy(logits, labels, cfg.label_smoothing);
    opt.zero_grad();
    loss.backward();
    opt.step();
    ema_update(ema, model, cfg.ema_decay);
    step_losses.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations
    smoothed = 0.98 * smoothed + 0.02 * loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph kept
    if (++step % cfg.log_every == 0)
      std::printf("step %lld loss %.4f\n", static_cast<long long>(step), smoothed.item<float>()); // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
  }
  auto mean_loss = torch::stack(step_losses).mean();
  std::cout << "epoch mean loss " << mean_loss.item<double>() << "\n";
}

struct EvalResult {
  double top1 = 0, top5 = 0;
};

EvalResult evaluate(EfficientNet& model, ChannelsLastAdapter& adapter,
                    const std::vector<torch::data::Example<>>& batches, const TrainConfig& cfg) {
  torch::NoGradGuard no_grad;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  adapter->to(device);
  model->eval();
  const int64_t num_classes = static_cast<int64_t>(cfg.class_counts.size());
  auto counts = torch::zeros({num_classes}, torch::kLong);
  for (int64_t c = 0; c < num_classes; ++c) counts[c] = cfg.class_counts[c];

  int64_t correct1 = 0, seen = 0;
  torch::Tensor correct5 = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (const auto& batch : batches) {
    auto x = adapter->forward(batch.data.to(device));
    auto y = batch.target.to(device);
    auto prior = counts.to(device, torch::kFloat); // EXPECT: tensor-clone-in-loop
    prior.div_(prior.sum());
    auto logits = model->forward(x) - cfg.logit_tau * prior.log();
    auto top = std::get<1>(logits.topk(5, 1));
    auto hits = top.eq(y.unsqueeze(1));
    correct1 += hits.select(1, 0).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop
    correct5 = correct5 + hits.any(1).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- eval under NoGradGuard, no graph at all
    seen += y.size(0);
  }
  EvalResult r;
  r.top1 = 100.0 * correct1 / std::max<int64_t>(seen, 1);
  r.top5 = 100.0 * correct5.item<int64_t>() / std::max<int64_t>(seen, 1);
  return r;
}
