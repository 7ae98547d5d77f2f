// TimeSformer (Bertasius et al. 2021) with divided space-time attention, for Kinetics-style
// clip classification. Frames are decoded offline and stored as uint8 THWC tensors.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct Config {
  int64_t img_size = 224, patch = 16, frames = 8, in_chans = 3;
  int64_t dim = 768, depth = 12, heads = 12, num_classes = 400;
  double mlp_ratio = 4.0, drop_path = 0.1, label_smoothing = 0.1;
  int64_t batch_size = 8, epochs = 15; double lr = 5e-3, weight_decay = 1e-4;
};

class DropPathImpl : public torch::nn::Module {
 public:
  explicit DropPathImpl(double p) : p_(p) {}

  torch::Tensor forward(const torch::Tensor& x) {
    if (!is_training() || p_ == 0.0) return x.clone();  // EXPECT: tensor-unnecessary-clone
    const double keep = 1.0 - p_;
    auto mask = torch::bernoulli(torch::full({x.size(0), 1, 1}, keep, x.options())).expand_as(x);
    // FACT: m = torch.ones(2, 1, 1).expand(2, 5, 4); assert raises(lambda: m.div_(0.9), "single memory location")
    mask.div_(keep);  // EXPECT: tensor-inplace-on-expanded
    return x * mask;
  }

 private:
  double p_;
};
TORCH_MODULE(DropPath);

class PatchEmbedImpl : public torch::nn::Module {
 public:
  explicit PatchEmbedImpl(const Config& cfg) {
    proj_ = register_module(
        "proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.in_chans, cfg.dim, cfg.patch).stride(cfg.patch)));
  }

  torch::Tensor forward(const torch::Tensor& clip) {
    // FACT: v = torch.randn(2, 3, 3, 8, 8); assert is_view_of(v.flatten(0, 1), v)
    auto frames = clip.flatten(0, 1);  // LOOKALIKE: tensor-reshape-non-contiguous -- the stacked batch is contiguous; merging B and T is a view
    auto x = proj_(frames);
    // FACT: y = torch.randn(8, 16, 2, 2); assert is_view_of(y.flatten(2), y)
    return x.flatten(2).transpose(1, 2);  // LOOKALIKE: tensor-reshape-non-contiguous -- flatten runs on the conv output, before the transpose
  }

 private:
  torch::nn::Conv2d proj_{nullptr};
};
TORCH_MODULE(PatchEmbed);

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(int64_t dim, int64_t heads) : heads_(heads), scale_(std::pow(double(dim / heads), -0.5)) {
    qkv_ = register_module("qkv", torch::nn::Linear(dim, dim * 3));
    proj_ = register_module("proj", torch::nn::Linear(dim, dim));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto n = x.size(0), l = x.size(1), d = x.size(2);
    auto qkv = qkv_(x).reshape({n, l, 3, heads_, d / heads_}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    q.mul_(scale_);  // LOOKALIKE: tensor-inplace-on-saved -- q views the qkv projection, which autograd does not save, and is scaled before matmul reads it
    auto attn = torch::softmax(torch::matmul(q, k.transpose(-2, -1)), -1);
    auto out = torch::matmul(attn, v);
    // FACT: o = torch.randn(2, 3, 5, 4); assert is_copy_of(o.transpose(1, 2).reshape(2, 5, 12), o)
    return proj_(out.transpose(1, 2).reshape({n, l, d}));  // EXPECT: tensor-reshape-non-contiguous
  }

 private:
  int64_t heads_;
  double scale_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(Attention);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const Config& cfg, double dpr) {
    const int64_t d = cfg.dim;
    const auto hidden = static_cast<int64_t>(d * cfg.mlp_ratio);
    auto ln = [d] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})); };
    temporal_norm_ = register_module("temporal_norm1", ln());
    temporal_attn_ = register_module("temporal_attn", Attention(d, cfg.heads));
    temporal_fc_ = register_module("temporal_fc", torch::nn::Linear(d, d));
    norm1_ = register_module("norm1", ln());
    attn_ = register_module("attn", Attention(d, cfg.heads));
    norm2_ = register_module("norm2", ln());
    fc1_ = register_module("fc1", torch::nn::Linear(d, hidden));
    fc2_ = register_module("fc2", torch::nn::Linear(hidden, d));
    drop_path_ = register_module("drop_path", DropPath(dpr));
  }

  // x holds the cls token followed by t * n patch tokens, frame-major.
  torch::Tensor forward(const torch::Tensor& x, int64_t b, int64_t t, int64_t n) {
    const auto d = x.size(2);
    auto xt = x.narrow(1, 1, t * n);

    // Temporal attention: each patch position attends over the t frames.
    // FACT: x = torch.randn(2, 1 + 3 * 4, 8); xt = x[:, 1:]; assert is_copy_of(xt.reshape(2, 3, 4, 8).permute(0, 2, 1, 3).reshape(8, 3, 8), x)
    auto seq_t = xt.reshape({b, t, n, d}).permute({0, 2, 1, 3}).reshape({b * n, t, d});  // EXPECT: tensor-reshape-non-contiguous
    auto res_t = drop_path_(temporal_attn_(temporal_norm_(seq_t)));
    // FACT: r = torch.randn(8, 3, 8); v = r.view(2, 4, 3, 8).permute(0, 2, 1, 3); assert not is_contiguous(v) and is_copy_of(v.contiguous().view(2, 12, 8), r)
    res_t = temporal_fc_(res_t.view({b, n, t, d}).permute({0, 2, 1, 3}).contiguous().view({b, t * n, d}));  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() runs right before the merging view
    auto xs = xt + res_t;

    // Spatial attention: each frame attends over its n patches plus a copy of the cls token.
    auto cls = x.narrow(1, 0, 1).repeat_interleave(t, 0);
    // FACT: s = torch.randn(2, 12, 8) + 1; assert is_view_of(s.view(6, 4, 8), s)
    auto seq_s = torch::cat({cls, xs.view({b * t, n, d})}, 1);  // LOOKALIKE: tensor-view-non-contiguous -- xs is the fresh result of an add
    auto res_s = drop_path_(attn_(norm1_(seq_s)));
    // FACT: r = torch.randn(6, 5, 8); assert is_view_of(r.select(1, 0).reshape(2, 3, 8), r)
    auto cls_out = res_s.select(1, 0).reshape({b, t, d}).mean(1, true);  // LOOKALIKE: tensor-reshape-non-contiguous -- only splits the leading dim, which strides can express
    // FACT: r = torch.randn(6, 5, 8); assert raises(lambda: r.narrow(1, 1, 4).view(2, 12, 8), "view size is not compatible")
    auto patches_out = res_s.narrow(1, 1, n).view({b, t * n, d});  // EXPECT: tensor-view-non-contiguous
    auto y = torch::cat({x.narrow(1, 0, 1), xs}, 1) + torch::cat({cls_out, patches_out}, 1);
    return y + drop_path_(fc2_(torch::gelu(fc1_(norm2_(y)))));
  }

 private:
  torch::nn::LayerNorm temporal_norm_{nullptr}, norm1_{nullptr}, norm2_{nullptr};
  Attention temporal_attn_{nullptr}, attn_{nullptr};
  torch::nn::Linear temporal_fc_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
  DropPath drop_path_{nullptr};
};
TORCH_MODULE(Block);

torch::Tensor sinusoid_table(int64_t len, int64_t dim) {
  auto pos = torch::arange(len, torch::kFloat).unsqueeze(1);
  auto div = torch::exp(torch::arange(0, dim, 2, torch::kFloat) * (-std::log(10000.0) / double(dim)));
  auto table = torch::zeros({len, dim});
  table.slice(1, 0, dim, 2).copy_(torch::sin(pos * div));
  table.slice(1, 1, dim, 2).copy_(torch::cos(pos * div));
  return table;
}

class TimeSformerImpl : public torch::nn::Module {
 public:
  explicit TimeSformerImpl(const Config& cfg) {
    const int64_t n = (cfg.img_size / cfg.patch) * (cfg.img_size / cfg.patch);
    patch_embed_ = register_module("patch_embed", PatchEmbed(cfg));
    cls_token_ = register_parameter("cls_token", torch::zeros({1, 1, cfg.dim}));
    pos_embed_ = register_parameter("pos_embed", torch::zeros({1, n + 1, cfg.dim}));
    torch::nn::init::normal_(pos_embed_, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init performs the write under NoGradGuard
    torch::nn::init::normal_(cls_token_, 0.0, 0.02);
    time_pe_ = sinusoid_table(cfg.frames, cfg.dim);
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.depth; ++i)
      blocks_->push_back(Block(cfg, cfg.drop_path * double(i) / double(std::max<int64_t>(cfg.depth - 1, 1))));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    head_ = register_module("head", torch::nn::Linear(cfg.dim, cfg.num_classes));
  }

  torch::Tensor forward(const torch::Tensor& clip) {
    const auto b = clip.size(0), t = clip.size(1);
    auto x = patch_embed_(clip);
    const auto n = x.size(1), d = x.size(2);
    x = torch::cat({cls_token_.expand({x.size(0), -1, -1}), x}, 1);
    x = x + pos_embed_;  // LOOKALIKE: tensor-device-mismatch -- a registered parameter, moved by module->to(device)
    auto cls = x.slice(0, 0, b * t, t).narrow(1, 0, 1);
    auto patches = x.narrow(1, 1, n) + time_pe_.repeat({b, 1}).unsqueeze(1);  // EXPECT: tensor-device-mismatch
    x = torch::cat({cls, patches.view({b, t * n, d})}, 1);
    for (const auto& blk : *blocks_) x = blk->as<BlockImpl>()->forward(x, b, t, n);
    return head_(norm_(x).select(1, 0));
  }

 private:
  PatchEmbed patch_embed_{nullptr};
  torch::Tensor cls_token_, pos_embed_, time_pe_;
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(TimeSformer);

torch::Tensor smoothed_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target, double eps) {
  // FACT: l = torch.randn(3, 5, requires_grad=True); lp = torch.log_softmax(l, -1).neg_(); assert backward_fails(lambda: lp.mean().backward())
  auto nlogp = torch::log_softmax(logits, -1).neg_();  // EXPECT: tensor-inplace-on-saved
  auto nll = nlogp.gather(1, target.unsqueeze(1)).squeeze(1);
  return ((1.0 - eps) * nll + eps * nlogp.mean(-1)).mean();
}

struct VideoSample { torch::Tensor frames; int64_t label; };

std::vector<VideoSample> load_split(const std::string& list_file) {
  std::vector<VideoSample> out;
  std::ifstream in(list_file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string path;
    VideoSample s{torch::Tensor(), 0};
    if (!(ss >> path >> s.label)) continue;
    torch::load(s.frames, path);
    out.push_back(s);
  }
  return out;
}

F::InterpolateFuncOptions resize_to(int64_t h, int64_t w) {
  return F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false);
}

class ClipDataset : public torch::data::datasets::Dataset<ClipDataset> {
 public:
  ClipDataset(std::vector<VideoSample> samples, const Config& cfg)
      : samples_(std::move(samples)), frames_(cfg.frames), size_(cfg.img_size) {
    mean_ = torch::tensor({0.45, 0.45, 0.45}).view({1, 3, 1, 1});
    std_ = torch::tensor({0.225, 0.225, 0.225}).view({1, 3, 1, 1});
  }

  torch::data::Example<> get(size_t i) override {
    const auto& s = samples_[i];
    auto idx = torch::linspace(0, double(s.frames.size(0) - 1), frames_).to(torch::kLong);
    auto raw = s.frames.index_select(0, idx);
    // FACT: raw = torch.zeros(2, 4, 4, 3, dtype=torch.uint8); assert is_copy_of(raw.permute(0, 3, 1, 2).to(torch.float32), raw)
    auto clip = raw.permute({0, 3, 1, 2}).to(torch::kFloat);
    clip.div_(255.0).sub_(mean_).div_(std_);  // LOOKALIKE: tensor-alias-then-mutate -- raw is uint8, so to(kFloat) already made a new tensor
    clip = F::interpolate(clip, resize_to(size_, size_));
    return {clip, torch::tensor(s.label, torch::kLong)};
  }

  torch::optional<size_t> size() const override { return samples_.size(); }

 private:
  std::vector<VideoSample> samples_;
  int64_t frames_, size_;
  torch::Tensor mean_, std_;
};

torch::Tensor normalized(const torch::Tensor& frames, const torch::Tensor& mean, const torch::Tensor& stdv) {
  auto x = frames.to(torch::kFloat);
  // FACT: f = torch.rand(3, 3, 8, 8); c = f.narrow(3, 1, 4); assert shares_storage(c.to(torch.float32), f)
  x.sub_(mean).div_(stdv);  // EXPECT: tensor-alias-then-mutate
  return x;
}

// Three spatial crops along the long side, logits summed (the paper's 1x3 view testing).
double evaluate_three_crop(TimeSformer& model, const std::vector<VideoSample>& videos, const Config& cfg,
                           torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto mean = torch::tensor({0.45, 0.45, 0.45}).view({1, 3, 1, 1});
  auto stdv = torch::tensor({0.225, 0.225, 0.225}).view({1, 3, 1, 1});
  auto correct = torch::zeros({}, torch::dtype(torch::kLong).device(device));
  for (const auto& v : videos) {
    auto idx = torch::linspace(0, double(v.frames.size(0) - 1), cfg.frames).to(torch::kLong);
    auto video = v.frames.index_select(0, idx).permute({0, 3, 1, 2}).to(torch::kFloat).div(255.0);
    const int64_t w = cfg.img_size * video.size(3) / video.size(2);
    video = F::interpolate(video, resize_to(cfg.img_size, std::max(w, cfg.img_size)));
    torch::Tensor logits_sum;
    for (int64_t c = 0; c < 3; ++c) {
      const int64_t x0 = (video.size(3) - cfg.img_size) * c / 2;
      auto crop = video.narrow(3, x0, cfg.img_size);
      auto logits = model(normalized(crop, mean, stdv).unsqueeze(0).to(device));
      logits_sum = logits_sum.defined() ? logits_sum + logits : logits;
    }
    correct += (logits_sum.argmax(-1) == v.label).sum();
  }
  return correct.item<double>() / double(videos.size());
}

void train(const Config& cfg, const std::string& train_list, const std::string& val_list) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  TimeSformer model(cfg);
  model->to(device);
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(cfg.weight_decay).nesterov(true));

  auto dataset = ClipDataset(load_split(train_list), cfg).map(torch::data::transforms::Stack<>());
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(dataset), torch::data::DataLoaderOptions(cfg.batch_size).workers(4));
  const auto val_videos = load_split(val_list);

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double epoch_loss = 0.0;
    int64_t steps = 0;
    std::vector<torch::Tensor> epoch_logits, epoch_labels;
    for (auto& batch : *loader) {
      auto x = batch.data.to(device, /*non_blocking=*/true);
      auto y = batch.target.to(device);
      auto logits = model(x);
      auto loss = smoothed_cross_entropy(logits, y, cfg.label_smoothing);
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      epoch_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      epoch_logits.push_back(logits);  // EXPECT: tensor-graph-kept-across-iterations
      epoch_labels.push_back(y);  // LOOKALIKE: tensor-graph-kept-across-iterations -- labels come from the loader and carry no graph
      ++steps;
    }
    const double train_acc =
        (torch::cat(epoch_logits).argmax(1) == torch::cat(epoch_labels)).to(torch::kFloat).mean().item<double>();
    const double val_acc = evaluate_three_crop(model, val_videos, cfg, device);
    std::cout << "epoch " << epoch << " loss " << epoch_loss / double(std::max<int64_t>(steps, 1)) << " train acc "
              << train_acc << " val acc " << val_acc << std::endl;
    torch::save(model, "timesformer_epoch" + std::to_string(epoch) + ".pt");
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " train_list.txt val_list.txt\n";
    return 1;
  }
  train(Config{}, argv[1], argv[2]);
  return 0;
}
