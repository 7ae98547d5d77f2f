// Semi-supervised video object segmentation with an attention memory bank
// (XMem-style working memory: key / shrinkage / selection, anisotropic L2 readout,
// a sensory hidden state per object, soft aggregation of object probabilities).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <tuple>
#include <vector>

namespace F = torch::nn::functional;

struct VosConfig {
  int64_t key_dim = 64, value_dim = 256, feat_dim = 512, hidden_dim = 64;
  int64_t mem_capacity = 8, mem_every = 5, top_k = 30;
  int64_t clip_len = 8, iterations = 2000, log_every = 100;
  double value_clip = 20.0, age_penalty = 0.05, lr = 1e-5;
};

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2));
}

// Object id map -> one binary channel per object (background is id 0).
torch::Tensor labels_to_masks(const torch::Tensor& labels, int64_t num_obj) {
  auto ids = torch::arange(1, num_obj + 1, labels.options()).view({1, num_obj, 1, 1});
  auto masks = ids.expand({labels.size(0), num_obj, labels.size(1), labels.size(2)});
  // FACT: ids = torch.arange(1, 4).view(1, 3, 1, 1).expand(2, 3, 4, 4); assert raises(lambda: ids.eq_(torch.randint(0, 4, (2, 1, 4, 4))), "single memory location")
  return masks.eq_(labels.unsqueeze(1)).to(torch::kFloat);  // EXPECT: tensor-inplace-on-expanded
}

// XMem soft aggregation: background = prod(1 - p_i), then back to logits.
torch::Tensor aggregate(const torch::Tensor& prob) {
  auto bg = torch::prod(1 - prob, 1, true);
  auto p = torch::cat({bg, prob}, 1).clamp(1e-7, 1 - 1e-7);
  return torch::log(p / (1 - p));
}

struct PixelEncoderImpl : torch::nn::Module {
  explicit PixelEncoderImpl(const VosConfig& cfg) {
    stem = register_module("stem", conv(3, 64, 7, 4));
    body = register_module("body", conv(64, cfg.feat_dim, 3, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(body(torch::relu(stem(x)))); }
  torch::nn::Conv2d stem{nullptr}, body{nullptr};
};
TORCH_MODULE(PixelEncoder);

struct KeyProjectionImpl : torch::nn::Module {
  explicit KeyProjectionImpl(const VosConfig& cfg) {
    key_proj = register_module("key_proj", conv(cfg.feat_dim, cfg.key_dim, 3));
    d_proj = register_module("d_proj", conv(cfg.feat_dim, 1, 3));
    e_proj = register_module("e_proj", conv(cfg.feat_dim, cfg.key_dim, 3));
  }
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(const torch::Tensor& feat) {
    auto shrinkage = d_proj(feat).pow(2) + 1;
    auto selection = torch::sigmoid(e_proj(feat));
    return {key_proj(feat), shrinkage, selection};
  }
  torch::nn::Conv2d key_proj{nullptr}, d_proj{nullptr}, e_proj{nullptr};
};
TORCH_MODULE(KeyProjection);

struct ValueEncoderImpl : torch::nn::Module {
  explicit ValueEncoderImpl(const VosConfig& cfg) {
    fuse = register_module("fuse", conv(cfg.feat_dim + 2, cfg.value_dim, 3));
    hidden_update = register_module("hidden_update", conv(cfg.value_dim + cfg.hidden_dim, cfg.hidden_dim, 3));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& feat, const torch::Tensor& masks,
                                                  const torch::Tensor& hidden) {
    const auto b = masks.size(0), o = masks.size(1);
    auto small = F::avg_pool2d(masks, F::AvgPool2dFuncOptions(16));
    auto others = small.sum(1, true) - small;
    auto g = torch::cat({feat.unsqueeze(1).expand({b, o, -1, -1, -1}), small.unsqueeze(2), others.unsqueeze(2)}, 2);
    auto value = torch::relu(fuse(g.flatten(0, 1)));
    auto h = torch::tanh(hidden_update(torch::cat({value, hidden.flatten(0, 1)}, 1)));
    return {value.view({b, o, -1, value.size(-2), value.size(-1)}), h.view_as(hidden)};
  }
  torch::nn::Conv2d fuse{nullptr}, hidden_update{nullptr};
};
TORCH_MODULE(ValueEncoder);

struct MaskDecoderImpl : torch::nn::Module {
  explicit MaskDecoderImpl(const VosConfig& cfg) {
    fuse = register_module("fuse", conv(cfg.value_dim + cfg.hidden_dim + cfg.feat_dim, 256, 3));
    hidden_conv = register_module("hidden_conv", conv(256 + cfg.hidden_dim, cfg.hidden_dim, 3));
    pred = register_module("pred", conv(256, 1, 3));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& feat, const torch::Tensor& readout,
                                                  const torch::Tensor& hidden) {
    const auto b = readout.size(0), o = readout.size(1);
    auto x = torch::cat({readout, hidden, feat.unsqueeze(1).expand({b, o, -1, -1, -1})}, 2).flatten(0, 1);
    x = torch::relu(fuse(x));
    auto new_hidden = torch::tanh(hidden_conv(torch::cat({x, hidden.flatten(0, 1)}, 1))).view_as(hidden);
    auto obj_logits = pred(x).view({b, o, x.size(-2), x.size(-1)});
    auto logits = aggregate(torch::sigmoid(obj_logits));
    logits = F::interpolate(logits, F::InterpolateFuncOptions().scale_factor(std::vector<double>{16, 16})
                                        .mode(torch::kBilinear).align_corners(false));
    return {logits, new_hidden};
  }
  torch::nn::Conv2d fuse{nullptr}, hidden_conv{nullptr}, pred{nullptr};
};
TORCH_MODULE(MaskDecoder);

struct VosNetImpl : torch::nn::Module {
  explicit VosNetImpl(const VosConfig& cfg)
      : encoder(register_module("encoder", PixelEncoder(cfg))),
        key_proj(register_module("key_proj", KeyProjection(cfg))),
        value_encoder(register_module("value_encoder", ValueEncoder(cfg))),
        decoder(register_module("decoder", MaskDecoder(cfg))) {}
  PixelEncoder encoder;
  KeyProjection key_proj;
  ValueEncoder value_encoder;
  MaskDecoder decoder;
};
TORCH_MODULE(VosNet);

// Working memory with a fixed number of frame slots; the oldest frame is dropped
// when a new one arrives and the bank is full.
class MemoryBank {
 public:
  explicit MemoryBank(const VosConfig& cfg) : cfg_(cfg) {}

  void add(const torch::Tensor& key, const torch::Tensor& shrinkage, const torch::Tensor& value) {
    const auto b = key.size(0), hw = key.size(2) * key.size(3);
    if (!keys_.defined()) {
      keys_ = torch::zeros({cfg_.mem_capacity, b, cfg_.key_dim, hw}, key.options());
      shrink_ = torch::zeros({b, cfg_.mem_capacity, hw}, key.options());
      values_ = torch::zeros({b, value.size(1), value.size(2), cfg_.mem_capacity, hw}, value.options());
      usage_ = torch::zeros({1, 1, 1}, key.options()).expand({b, cfg_.mem_capacity, hw}).contiguous();
    }
    if (size_ == cfg_.mem_capacity) {
      const int64_t n = cfg_.mem_capacity - 1;
      // FACT: m = torch.randn(4, 1, 2, 6); assert raises(lambda: m.narrow(0, 0, 3).copy_(m.narrow(0, 1, 3)), "single memory location")
      keys_.narrow(0, 0, n).copy_(keys_.narrow(0, 1, n));  // EXPECT: tensor-inplace-overlap
      // FACT: v = torch.randn(1, 2, 3, 4, 6); s = v.narrow(3, 1, 3).clone(); v.narrow(3, 0, 3).copy_(s); assert is_copy_of(s, v)
      values_.narrow(3, 0, n).copy_(values_.narrow(3, 1, n).clone());  // LOOKALIKE: tensor-inplace-overlap -- the source is cloned before the shift
      shrink_ = shrink_.roll(-1, 1);
      usage_ = usage_.roll(-1, 1);
      size_ = n;
    }
    keys_[size_].copy_(key.flatten(2));
    shrink_.select(1, size_).copy_(shrinkage.flatten(1));
    values_.select(3, size_).copy_(value.flatten(3));
    usage_.select(1, size_).zero_();
    ++size_;
  }

  // Readout for the query frame: affinity over all memory pixels, top-k softmax,
  // weighted sum of memory values per object.
  torch::Tensor read(const torch::Tensor& qk, const torch::Tensor& qe) {
    const auto b = qk.size(0), ck = qk.size(1), h = qk.size(2), w = qk.size(3);
    // FACT: m = torch.randn(3, 1, 4, 6).permute(1, 2, 0, 3); r = m.reshape(1, 4, 18); assert is_copy_of(r, m)
    auto mk = keys_.narrow(0, 0, size_).permute({1, 2, 0, 3}).reshape({b, ck, -1});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: s = torch.randn(2, 8, 6)[:, :3]; r = s.reshape(2, 1, 18); assert not is_contiguous(s) and is_view_of(r, s)
    auto ms = shrink_.narrow(1, 0, size_).reshape({b, 1, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- narrowing the slot dim keeps each slot's pixels dense, so the merge is a view

    auto qk_f = qk.flatten(2);
    auto qe_f = qe.flatten(2);
    auto a_sq = torch::bmm(mk.pow(2).transpose(1, 2), qe_f);
    auto b_sq = (qe_f * qk_f.pow(2)).sum(1, true);
    // FACT: k = torch.randn(1, 4, 3, 3); f = k.flatten(2); f.mul_(2.0); assert is_view_of(f, k)
    qk_f.mul_(qe_f);  // EXPECT: tensor-alias-then-mutate
    auto two_ab = 2 * torch::bmm(mk.transpose(1, 2), qk_f);
    auto sim = (-a_sq + two_ab - b_sq) * ms.transpose(1, 2) / std::sqrt(static_cast<double>(ck));

    // recency prior: older slots are slightly penalised
    auto age = torch::arange(size_, 0, -1, torch::kFloat).repeat_interleave(h * w);
    sim = sim - cfg_.age_penalty * age.view({1, -1, 1});  // EXPECT: tensor-device-mismatch

    auto topk = torch::topk(sim, std::min<int64_t>(cfg_.top_k, sim.size(1)), 1);
    auto x_exp = (std::get<0>(topk) - std::get<0>(std::get<0>(topk).max(1, true))).exp();
    auto affinity = torch::zeros_like(sim).scatter_(1, std::get<1>(topk), x_exp / x_exp.sum(1, true));
    // FACT: u = torch.zeros(1, 1, 1).expand(2, 5, 6).contiguous(); u.narrow(1, 0, 3).add_(1.0); assert is_contiguous(u)
    usage_.narrow(1, 0, size_).add_(affinity.sum(2).view({b, size_, -1}));  // LOOKALIKE: tensor-inplace-on-expanded -- usage_ was materialised with contiguous() at allocation

    // FACT: v = torch.randn(1, 2, 3, 5, 6)[:, :, :, :3]; f = v.flatten(3); assert not is_contiguous(v) and is_view_of(f, v)
    auto mv = values_.narrow(3, 0, size_).flatten(3);  // LOOKALIKE: tensor-reshape-non-contiguous -- slot and pixel dims stay adjacent and dense: flatten is a view
    auto readout = torch::matmul(mv, affinity.unsqueeze(1));
    return readout.view({b, mv.size(1), mv.size(2), h, w});
  }

  int64_t size() const { return size_; }

 private:
  VosConfig cfg_;
  torch::Tensor keys_, shrink_, values_, usage_;
  int64_t size_ = 0;
};

struct Clip {
  torch::Tensor frames;  // read from disk
  torch::Tensor labels;
  int64_t num_obj = 1;
};

void train(VosNet& net, const std::vector<Clip>& clips, const VosConfig& cfg, torch::Device device) {
  net->to(device);
  net->train();
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(0.05));
  auto frame_weights = torch::linspace(0.5, 1.0, cfg.clip_len);
  auto running = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t it = 0; it < cfg.iterations; ++it) {
    const auto& clip = clips[it % clips.size()];
    auto frames = clip.frames.to(device);
    auto labels = clip.labels.to(device);
    const auto b = frames.size(0), o = clip.num_obj;
    MemoryBank bank(cfg);
    auto masks = labels_to_masks(labels.select(1, 0), o);
    torch::Tensor hidden;
    auto clip_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t t = 0; t < cfg.clip_len; ++t) {
      auto feat = net->encoder(frames.select(1, t));
      auto kse = net->key_proj(feat);
      auto key = std::get<0>(kse);
      if (t == 0) {
        hidden = torch::zeros({b, o, cfg.hidden_dim, feat.size(2), feat.size(3)}, feat.options());
      } else {
        auto readout = bank.read(key, std::get<2>(kse));
        auto dec = net->decoder(feat, readout, hidden);
        auto logits = dec.first;
        hidden = dec.second;
        // FACT: assert raises(lambda: torch.randn(2, 3, 4, 4).permute(0, 2, 3, 1).view(-1, 3), "view size is not compatible")
        auto flat = logits.permute({0, 2, 3, 1}).view({-1, logits.size(1)});  // EXPECT: tensor-view-non-contiguous
        auto frame_loss = F::cross_entropy(flat, labels.select(1, t).reshape({-1}));
        clip_loss = clip_loss + frame_loss * frame_weights[t];  // LOOKALIKE: tensor-graph-kept-across-iterations -- the frames of one clip share a single backward // LOOKALIKE: tensor-device-mismatch -- frame_weights[t] is a 0-dim CPU tensor, accepted as a scalar
        masks = torch::softmax(logits, 1).narrow(1, 1, o);
      }
      auto enc = net->value_encoder(feat, masks, hidden);
      hidden = enc.second;
      auto mem_value = enc.first.detach();
      mem_value.clamp_(0.0, cfg.value_clip);  // EXPECT: tensor-inplace-on-detached
      bank.add(key.detach(), std::get<1>(kse).detach(), mem_value);
    }
    opt.zero_grad();
    clip_loss.backward();
    torch::nn::utils::clip_grad_norm_(net->parameters(), 3.0);
    opt.step();
    running += clip_loss;  // EXPECT: tensor-graph-kept-across-iterations
    if ((it + 1) % cfg.log_every == 0) {
      std::cout << "it " << it + 1 << " loss " << running.item<double>() / cfg.log_every << "\n";
      running.zero_();
    }
  }
}

struct Video {
  std::vector<torch::Tensor> frames;  // decoded RGB frames
  std::vector<torch::Tensor> labels;  // annotated frames only; undefined elsewhere
  int64_t num_obj = 1;
};

double evaluate(VosNet& net, const std::vector<Video>& videos, const VosConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  const auto pixel_mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1});
  const auto pixel_std = torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1});
  double iou_sum = 0.0;
  int64_t scored = 0;
  for (const auto& video : videos) {
    MemoryBank bank(cfg);
    torch::Tensor masks, hidden;
    const int64_t o = video.num_obj;
    for (size_t t = 0; t < video.frames.size(); ++t) {
      auto rgb = video.frames[t].to(device).to(torch::kFloat).div(255).unsqueeze(0);  // LOOKALIKE: tensor-clone-in-loop -- a different frame every iteration
      auto image = (rgb - pixel_mean.to(device)) / pixel_std.to(device);  // EXPECT: tensor-clone-in-loop
      auto feat = net->encoder(image);
      auto kse = net->key_proj(feat);
      if (t == 0) {
        masks = labels_to_masks(video.labels[0].to(device).unsqueeze(0), o);
        hidden = torch::zeros({1, o, cfg.hidden_dim, feat.size(2), feat.size(3)}, feat.options());
      } else {
        auto dec = net->decoder(feat, bank.read(std::get<0>(kse), std::get<2>(kse)), hidden);
        hidden = dec.second;
        auto prob = torch::softmax(dec.first, 1);
        masks = prob.narrow(1, 1, o);
        if (video.labels[t].defined()) {
          auto gt = labels_to_masks(video.labels[t].to(device).unsqueeze(0), o) > 0.5;
          if (gt.any().item<bool>()) {  // LOOKALIKE: tensor-sync-in-loop -- the value decides control flow
            auto pred = masks > 0.5;
            auto inter = torch::logical_and(pred, gt).sum({2, 3}).to(torch::kFloat);
            auto uni = torch::logical_or(pred, gt).sum({2, 3}).clamp_min(1).to(torch::kFloat);
            iou_sum += (inter / uni).mean().item<double>();  // EXPECT: tensor-sync-in-loop
            ++scored;
          }
        }
      }
      if (t == 0 || t % cfg.mem_every == 0) {
        auto enc = net->value_encoder(feat, masks, hidden);
        hidden = enc.second;
        bank.add(std::get<0>(kse), std::get<1>(kse), enc.first);
      }
    }
  }
  return scored > 0 ? iou_sum / scored : 0.0;
}

int main() {
  VosConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  VosNet net(cfg);
  std::vector<Clip> clips(4);
  for (auto& c : clips) {
    c.num_obj = 2;
    c.frames = torch::rand({2, cfg.clip_len, 3, 384, 384});
    c.labels = torch::randint(0, 3, {2, cfg.clip_len, 384, 384}, torch::kLong);
  }
  train(net, clips, cfg, device);

  Video video;
  video.num_obj = 2;
  for (int t = 0; t < 30; ++t) {
    video.frames.push_back(torch::randint(0, 256, {3, 480, 864}, torch::kUInt8));
    video.labels.push_back(t % 10 == 0 ? torch::randint(0, 3, {480, 864}, torch::kLong) : torch::Tensor());
  }
  std::cout << "J mean " << evaluate(net, {video}, cfg, device) << "\n";
  return 0;
}
