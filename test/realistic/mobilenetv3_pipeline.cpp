// MobileNetV3-Small video classification pipeline: BN folding for inference, hard-swish and
// squeeze-excite blocks, temperature calibration, temporal smoothing of the class scores, and
// int8 post-processing (embedding codes for the retrieval index, per-channel feature export).
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct PipelineConfig {
  int64_t num_classes = 1000, input_size = 224, smooth_window = 8, top_k = 5;
  int64_t val_batches = 50, batch_size = 32, frames = 600, calib_iters = 200;
  std::vector<float> mean{0.485f, 0.456f, 0.406f}, std{0.229f, 0.224f, 0.225f};
};

inline torch::Tensor hard_sigmoid(const torch::Tensor& x) { return F::relu6(x + 3.0) / 6.0; }
inline torch::Tensor hard_swish(const torch::Tensor& x) { return x * hard_sigmoid(x); }

enum class Act { kNone, kReLU, kHSwish };

struct BlockSpec { int64_t kernel, expand, out; bool se; Act act; int64_t stride; };

const std::vector<BlockSpec> kSmallSpec = {
    {3, 16, 16, true, Act::kReLU, 2},     {3, 72, 24, false, Act::kReLU, 2},    {3, 88, 24, false, Act::kReLU, 1},
    {5, 96, 40, true, Act::kHSwish, 2},   {5, 240, 40, true, Act::kHSwish, 1},  {5, 240, 40, true, Act::kHSwish, 1},
    {5, 120, 48, true, Act::kHSwish, 1},  {5, 144, 48, true, Act::kHSwish, 1},  {5, 288, 96, true, Act::kHSwish, 2},
    {5, 576, 96, true, Act::kHSwish, 1},  {5, 576, 96, true, Act::kHSwish, 1}};

inline int64_t make_divisible(int64_t v, int64_t d = 8) { return std::max(d, (v + d / 2) / d * d); }

struct ConvBNActImpl : torch::nn::Module {
  ConvBNActImpl(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t groups, Act act) : act_(act) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(stride)
                                                         .padding(k / 2).groups(groups).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(out));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = fused_ ? conv(x) + fused_bias_ : bn(conv(x));
    if (act_ == Act::kReLU) return torch::relu(y);
    return act_ == Act::kHSwish ? hard_swish(y) : y;
  }
  // Fold the eval-mode BatchNorm into the convolution weights.
  void fuse() {
    torch::NoGradGuard no_grad;
    auto scale = bn->weight / torch::sqrt(bn->running_var + bn->options.eps());
    conv->weight.mul_(scale.view({-1, 1, 1, 1}));  // LOOKALIKE: tensor-inplace-on-leaf -- BN folding runs under NoGradGuard
    fused_bias_ = register_buffer("fused_bias", (bn->bias - bn->running_mean * scale).view({1, -1, 1, 1}));
    fused_ = true;
  }
  Act act_;
  bool fused_ = false;
  torch::Tensor fused_bias_;
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(ConvBNAct);

struct SqueezeExciteImpl : torch::nn::Module {
  SqueezeExciteImpl(int64_t ch, int64_t squeeze) {
    fc1 = register_module("fc1", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, squeeze, 1)));
    fc2 = register_module("fc2", torch::nn::Conv2d(torch::nn::Conv2dOptions(squeeze, ch, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto s = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1));
    return x * hard_sigmoid(fc2(torch::relu(fc1(s))));
  }
  torch::nn::Conv2d fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(SqueezeExcite);

struct InvertedResidualImpl : torch::nn::Module {
  InvertedResidualImpl(int64_t in, const BlockSpec& b) : use_res_(b.stride == 1 && in == b.out) {
    if (b.expand != in) expand_conv = register_module("expand", ConvBNAct(in, b.expand, 1, 1, 1, b.act));
    dw = register_module("dw", ConvBNAct(b.expand, b.expand, b.kernel, b.stride, b.expand, b.act));
    if (b.se) se = register_module("se", SqueezeExcite(b.expand, make_divisible(b.expand / 4)));
    project = register_module("project", ConvBNAct(b.expand, b.out, 1, 1, 1, Act::kNone));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = dw(expand_conv ? expand_conv(x) : x);
    if (se) h = se(h);
    h = project(h);
    return use_res_ ? h + x : h;
  }
  bool use_res_;
  ConvBNAct expand_conv{nullptr}, dw{nullptr}, project{nullptr};
  SqueezeExcite se{nullptr};
};
TORCH_MODULE(InvertedResidual);

struct MobileNetV3Impl : torch::nn::Module {
  MobileNetV3Impl(const std::vector<BlockSpec>& spec, int64_t num_classes) {
    stem = register_module("stem", ConvBNAct(3, 16, 3, 2, 1, Act::kHSwish));
    int64_t in = 16;
    for (const auto& b : spec) {
      blocks->push_back(InvertedResidual(in, b));
      in = b.out;
    }
    register_module("blocks", blocks);
    last = register_module("last", ConvBNAct(in, 576, 1, 1, 1, Act::kHSwish));
    fc1 = register_module("fc1", torch::nn::Linear(576, 1024));
    fc2 = register_module("fc2", torch::nn::Linear(1024, num_classes));
  }
  torch::Tensor features(const torch::Tensor& x) { return last(blocks->forward(stem(x))); }
  torch::Tensor embed(const torch::Tensor& fmap) {
    auto pooled = F::adaptive_avg_pool2d(fmap, F::AdaptiveAvgPool2dFuncOptions(1));
    // FACT: x=torch.randn(2,16,7,7).to(memory_format=torch.channels_last); p=torch.nn.functional.adaptive_avg_pool2d(x,1); assert is_view_of(p.flatten(1), p)
    return hard_swish(fc1(pooled.flatten(1)));  // LOOKALIKE: tensor-reshape-non-contiguous -- a 1x1 pooled map flattens to a view, even in channels_last
  }
  torch::Tensor classify(const torch::Tensor& emb) { return fc2(emb); }
  void fuse() {
    for (auto& m : modules(/*include_self=*/false))
      if (auto* c = m->as<ConvBNActImpl>()) c->fuse();
  }
  ConvBNAct stem{nullptr}, last{nullptr};
  torch::nn::Sequential blocks;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MobileNetV3);

// Float copy of the decoded frame in [0, 1] for the preview window.
torch::Tensor preview_frame(const torch::Tensor& frame_hwc) {
  auto x = frame_hwc.to(torch::kFloat);
  // FACT: f=torch.rand(4,4,3)*255; x=f.to(torch.float); x.div_(255); assert shares_storage(f,x) and f.max()<=1
  x.div_(255.0);  // EXPECT: tensor-alias-then-mutate
  return x;
}

// Center crop, gray-world white balance, CHW in [0, 1], resized to the network input.
torch::Tensor preprocess(const torch::Tensor& frame_hwc, const PipelineConfig& cfg) {
  const int64_t h = frame_hwc.size(0), w = frame_hwc.size(1), s = std::min(h, w);
  auto crop = frame_hwc.slice(0, (h - s) / 2, (h - s) / 2 + s).slice(1, (w - s) / 2, (w - s) / 2 + s);
  // FACT: f=torch.rand(6,8,3); c=f[:, 1:7]; assert raises(lambda: c.view(-1,3), "view size is not compatible")
  auto channel_mean = crop.view({-1, 3}).mean(0);  // EXPECT: tensor-view-non-contiguous
  auto gain = channel_mean.mean() / channel_mean.clamp_min(1e-3);
  auto chw = crop.permute({2, 0, 1}).contiguous();
  // FACT: f=torch.rand(6,8,3); c=f[:, 1:7].permute(2,0,1).contiguous(); c.mul_(0.5); assert is_copy_of(c,f)
  chw.mul_(gain.view({3, 1, 1}) / 255.0);  // LOOKALIKE: tensor-alias-then-mutate -- a permuted HWC crop is not contiguous, so contiguous() copied it
  auto size = std::vector<int64_t>{cfg.input_size, cfg.input_size};
  return F::interpolate(chw.unsqueeze(0), F::InterpolateFuncOptions().size(size).mode(torch::kBilinear).align_corners(false));
}

// Sliding window over the last class distributions.
struct TemporalSmoother {
  TemporalSmoother(int64_t window, int64_t classes, torch::Device device)
      : history(torch::zeros({window, classes}, torch::TensorOptions().device(device))) {}
  torch::Tensor push(const torch::Tensor& probs) {
    const int64_t w = history.size(0);
    // FACT: h=torch.rand(8,10); assert raises(lambda: h[:-1].copy_(h[1:]), "some elements of the input tensor and the written-to tensor")
    history.narrow(0, 0, w - 1).copy_(history.narrow(0, 1, w - 1));  // EXPECT: tensor-inplace-overlap
    history[w - 1].copy_(probs);
    filled = std::min(filled + 1, w);
    return history.narrow(0, w - filled, filled).mean(0);
  }
  torch::Tensor history;
  int64_t filled = 0;
};

// Per-channel range of the exported feature map, collected over calibration batches.
struct ChannelObserver {
  void observe(const torch::Tensor& fmap) {
    const int64_t c = fmap.size(1);
    // FACT: x=torch.randn(2,8,4,4); assert is_copy_of(x.transpose(0,1).reshape(8,-1), x)
    auto per_channel = fmap.transpose(0, 1).reshape({c, -1}).abs().amax(1);  // EXPECT: tensor-reshape-non-contiguous
    running_max = running_max.defined() ? torch::max(running_max, per_channel) : per_channel;
  }
  torch::Tensor scale() const { return running_max.clamp_min(1e-8) / 127.0; }
  torch::Tensor running_max;
};

torch::Tensor quantize_fmap(const torch::Tensor& fmap, const torch::Tensor& ch_scale) {
  return torch::round(fmap / ch_scale.view({1, -1, 1, 1})).clamp_(-127, 127).to(torch::kInt8);
}

// Server side: int8 codes with per-channel scales and one scale for the whole export.
torch::Tensor dequantize_fmap(const torch::Tensor& q, const torch::Tensor& ch_scale, double tensor_scale) {
  auto s = ch_scale.view({1, -1, 1, 1}).expand_as(q);
  // FACT: w=torch.rand(8); q=torch.zeros(2,8,4,4,dtype=torch.int8); s=w.view(1,-1,1,1).expand_as(q); assert raises(lambda: s.mul_(0.5), "more than one element")
  s.mul_(tensor_scale);  // EXPECT: tensor-inplace-on-expanded
  return q.to(torch::kFloat) * s;
}

// Embedding codes for the retrieval index; the scale comes from the calibration set.
struct Int8Codec {
  torch::Tensor scale;
  torch::Tensor encode(const torch::Tensor& emb) const {
    auto q = torch::empty(emb.sizes(), emb.options().dtype(torch::kInt8));
    q.copy_(torch::round(emb / scale));  // EXPECT: tensor-copy-narrowing
    return q;
  }
  torch::Tensor decode(const torch::Tensor& q) const { return q.to(torch::kFloat) * scale; }
};

// Single-temperature calibration (Guo et al. 2017) on held-out logits.
torch::Tensor fit_temperature(const torch::Tensor& logits, const torch::Tensor& labels, int64_t iters) {
  auto log_t = torch::zeros({}, torch::TensorOptions().device(logits.device()).requires_grad(true));
  torch::optim::Adam opt({log_t}, torch::optim::AdamOptions(1e-2));
  for (int64_t i = 0; i < iters; ++i) {
    opt.zero_grad();
    auto loss = F::cross_entropy(logits / log_t.exp(), labels);
    loss.backward();
    opt.step();
    log_t.clamp_(-3.0, 3.0);  // EXPECT: tensor-inplace-on-leaf
  }
  return log_t.detach().exp().cpu();
}

int main() {
  PipelineConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  MobileNetV3 net(kSmallSpec, cfg.num_classes);
  net->eval();
  net->fuse();
  net->to(device);
  torch::NoGradGuard no_grad;

  // ---- validation: accuracy, held-out logits, feature and embedding ranges ----
  std::vector<torch::Tensor> val_logits, val_labels, val_emb;
  ChannelObserver observer;
  int64_t correct = 0, seen = 0;
  for (int64_t b = 0; b < cfg.val_batches; ++b) {
    auto x = torch::randn({cfg.batch_size, 3, cfg.input_size, cfg.input_size}, device);
    auto y = torch::randint(cfg.num_classes, {cfg.batch_size}, torch::TensorOptions().device(device).dtype(torch::kLong));
    auto fmap = net->features(x);
    observer.observe(fmap);
    auto emb = net->embed(fmap);
    auto logits = net->classify(emb);
    correct += (logits.argmax(1) == y).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    seen += y.size(0);
    val_logits.push_back(logits);  // LOOKALIKE: tensor-graph-kept-across-iterations -- inference under NoGradGuard records no graph
    val_labels.push_back(y);
    val_emb.push_back(emb / emb.norm(2, 1, true).clamp_min(1e-12));
  }
  std::cout << "top-1 " << double(correct) / seen << "\n";
  torch::Tensor temperature;
  {
    torch::AutoGradMode enable_grad(true);
    temperature = fit_temperature(torch::cat(val_logits).cpu(), torch::cat(val_labels).cpu(), cfg.calib_iters);
  }
  std::cout << "temperature " << temperature.item<float>() << "\n";
  Int8Codec codec{torch::cat(val_emb).abs().amax(0).clamp_min(1e-6) / 127.0};
  auto ch_scale = observer.scale();

  // ---- video: per-frame scores, smoothing, label change events, int8 exports ----
  const auto norm_stats = torch::stack({torch::tensor(cfg.mean), torch::tensor(cfg.std)}).view({2, 1, 3, 1, 1});
  const auto log_prior = torch::log_softmax(torch::randn({cfg.num_classes}), 0);  // deployment class prior
  TemporalSmoother smoother(cfg.smooth_window, cfg.num_classes, device);
  auto top_ids = torch::zeros({cfg.frames, cfg.top_k}, torch::TensorOptions().device(device).dtype(torch::kInt32));
  std::vector<torch::Tensor> codes, event_history;
  int64_t current_label = -1;
  for (int64_t f = 0; f < cfg.frames; ++f) {
    auto frame = torch::rand({480, 640, 3}) * 255;
    auto shown = preview_frame(frame);
    auto x = preprocess(frame, cfg).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new frame every iteration
    auto norm = norm_stats.to(device);  // EXPECT: tensor-clone-in-loop
    x = (x - norm[0]) / norm[1];

    auto fmap = net->features(x);
    auto emb = net->embed(fmap);
    auto logits = net->classify(emb) / temperature;  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor is accepted as a scalar
    logits = logits + log_prior;  // EXPECT: tensor-device-mismatch
    auto probs = smoother.push(torch::softmax(logits, 1)[0]);

    auto top = std::get<1>(probs.topk(cfg.top_k));
    top_ids[f].copy_(top.to(torch::kInt32));  // LOOKALIKE: tensor-copy-narrowing -- the long to int conversion is spelled out
    const int64_t label = top[0].item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the host needs the label every frame to raise events
    if (label != current_label) {
      std::cout << "frame " << f << ": class " << label << "\n";
      event_history.push_back(smoother.history.clone());  // LOOKALIKE: tensor-unnecessary-clone -- the ring buffer is rewritten in place by the next push
      current_label = label;
    }
    // FACT: e=torch.randn(4,8); n=e.norm(2,1,keepdim=True); e.div_(n); assert is_copy_of(n,e)
    emb.div_(emb.norm(2, 1, true).clamp_min(1e-12));  // LOOKALIKE: tensor-inplace-overlap -- the norm is a new tensor computed before the write
    codes.push_back(codec.encode(emb));
    if (f % 100 == 0) {
      auto restored = dequantize_fmap(quantize_fmap(fmap, ch_scale), ch_scale, 1.0);
      std::cout << "export error " << (restored - fmap).abs().max().item<float>() << " preview brightness "
                << shown.mean().item<float>() << "\n";
    }
  }
  auto index_codes = torch::cat(codes).cpu();
  std::cout << "indexed " << index_codes.size(0) << " codes, " << event_history.size() << " label changes\n";
  return 0;
}
