// Deformable convolution (Dai et al. 2017) with DCNv2 modulation (Zhu et al. 2019), written with
// grid_sample instead of a custom CUDA kernel: a 3x3 conv predicts, for every output location,
// K = k*k (dx, dy) offsets and K modulation scalars; the input is bilinearly sampled at the K
// shifted taps and a [Cout, C*K] matrix mixes the samples. The layer sits at the end of a small
// backbone that classifies object crops; a helper dumps where the taps landed for a figure.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct DeformConfig {
  int64_t in_channels = 64, out_channels = 128, kernel = 3, dilation = 1;
  int64_t n_classes = 20, epochs = 12, batch_size = 32, log_every = 100;
  double lr = 1e-3, offset_lr_mult = 0.1, offset_l2 = 1e-4;
};

// Pixel positions (x, y) in the last dim -> grid_sample's [-1, 1] with align_corners = true,
// where -1 and 1 are the centres of the border pixels.
torch::Tensor to_unit_range(const torch::Tensor &pix, int64_t height, int64_t width) {
  auto scale = torch::tensor({2.0 / std::max<int64_t>(width - 1, 1), 2.0 / std::max<int64_t>(height - 1, 1)},
                             pix.options());
  auto g = pix.to(torch::kFloat); // grid_sample wants float32 grids
  // FACT: p = torch.rand(2, 9, 4, 5, 2) * 5; p0 = p.clone(); g = p.to(torch.float); g.mul_(torch.tensor([0.5, 0.25])).sub_(1.0); assert shares_storage(g, p) and not torch.equal(p, p0)
  g.mul_(scale).sub_(1.0); // EXPECT: tensor-alias-then-mutate -- the positions are float32 already: to() returned them and the caller's pixel positions are rescaled
  return g;
}

// Offsets as one (dx, dy) row per location and tap, for the penalty and the statistics.
torch::Tensor offset_rows(const torch::Tensor &offsets, int64_t taps) {
  // FACT: o = torch.randn(2, 18, 5, 6); assert raises(lambda: o.permute(0, 2, 3, 1).view(-1, 9, 2), "view size is not compatible")
  return offsets.permute({0, 2, 3, 1}).view({-1, taps, 2}); // EXPECT: tensor-view-non-contiguous -- after the permute the batch and row dims are no longer adjacent in memory
}

struct DeformConv2dImpl : torch::nn::Module {
  explicit DeformConv2dImpl(const DeformConfig &cfg) : k_(cfg.kernel), dil_(cfg.dilation) {
    const int64_t K = k_ * k_;
    offset_conv_ = register_module(
        "offset_conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.in_channels, 3 * K, k_)
                                             .padding(dil_ * (k_ - 1) / 2)
                                             .dilation(dil_)));
    weight_ = register_parameter("weight", torch::empty({cfg.out_channels, cfg.in_channels * K}));
    bias_ = register_parameter("bias", torch::zeros({cfg.out_channels}));
    // FACT: w = torch.nn.Parameter(torch.empty(4, 6)); torch.nn.init.kaiming_uniform_(w, a=5 ** 0.5); assert w.is_leaf and w.requires_grad
    torch::nn::init::kaiming_uniform_(weight_, std::sqrt(5.0)); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    {
      // Offsets and modulation start at zero and 0.5: the layer begins as a plain (scaled) conv.
      torch::NoGradGuard no_grad;
      offset_conv_->weight.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      offset_conv_->bias.zero_();
    }
    // Tap positions relative to the centre, (dx, dy), row-major over the kernel window.
    auto r = (torch::arange(k_).to(torch::kFloat) - (k_ - 1) / 2.0) * static_cast<double>(dil_);
    taps_ = register_buffer("taps", torch::stack({r.repeat({k_}), r.repeat_interleave(k_)}, 1));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), K = k_ * k_;
    auto head = offset_conv_(x); // [N, 3K, H, W]: 2K offsets, then K modulation logits
    auto offsets = head.narrow(1, 0, 2 * K);
    last_offsets_ = offsets;
    // FACT: h = torch.randn(2, 27, 5, 6); o = h.narrow(1, 0, 18); assert not is_contiguous(o) and is_view_of(o.view(2, 9, 2, 5, 6), h)
    auto off = offsets.view({N, K, 2, H, W}); // LOOKALIKE: tensor-view-non-contiguous -- only the narrowed channel dim is split: strides allow it

    // Sampling positions in input pixels: output location + tap + learned offset.
    auto xs = torch::arange(W, x.options()), ys = torch::arange(H, x.options()); // LOOKALIKE: tensor-device-mismatch -- made with the input's options
    auto centre = torch::stack({xs.view({1, W}).expand({H, W}), ys.view({H, 1}).expand({H, W})}, -1);
    // FACT: c = torch.randn(5, 6, 2); t = torch.randn(9, 2); o = torch.randn(2, 27, 5, 6).narrow(1, 0, 18).view(2, 9, 2, 5, 6); assert is_view_of(c.view(1, 1, 5, 6, 2), c); p = c.view(1, 1, 5, 6, 2) + t.view(1, 9, 1, 1, 2) + o.permute(0, 1, 3, 4, 2); assert is_contiguous(p) and is_view_of(p.view(2, 45, 6, 2), p)
    auto pos = centre.view({1, 1, H, W, 2}) + taps_.view({1, K, 1, 1, 2}) + off.permute({0, 1, 3, 4, 2});
    auto grid = to_unit_range(pos, H, W);
    // Taps outside the image: grid_sample pads them with zeros; the mask keeps their modulation
    // from being learned.
    auto inside = (pos.select(-1, 0) > -1) & (pos.select(-1, 0) < W) & (pos.select(-1, 1) > -1) & (pos.select(-1, 1) < H);

    auto sampled = F::grid_sample(x, grid.view({N, K * H, W, 2}), // LOOKALIKE: tensor-view-non-contiguous -- the sum took the layout of its first, contiguous operands
                                  F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kZeros).align_corners(true));
    auto mask = torch::sigmoid(head.narrow(1, 2 * K, K)); // [N, K, H, W]
    // FACT: h = torch.randn(2, 27, 5, 6, requires_grad=True); assert backward_fails(lambda: (lambda m: (m.mul_(torch.ones(2, 9, 5, 6)), m.sum().backward()))(torch.sigmoid(h.narrow(1, 18, 9))))
    mask.mul_(inside.to(mask.dtype())); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its result for backward
    // FACT: s = torch.randn(2, 4, 45, 6); assert is_contiguous(s) and is_view_of(s.view(2, 4, 9, 5, 6), s)
    auto cols = sampled.view({N, C, K, H, W}) * mask.unsqueeze(1); // LOOKALIKE: tensor-view-non-contiguous -- grid_sample returns a contiguous [N, C, K*H, W]
    // FACT: c = torch.randn(2, 4, 9, 5, 6); assert is_copy_of(c.permute(0, 3, 4, 1, 2).reshape(60, 36), c)
    auto flat = cols.permute({0, 3, 4, 1, 2}).reshape({N * H * W, C * K}); // EXPECT: tensor-reshape-non-contiguous -- the channel and tap dims move behind the spatial ones: the whole column tensor is copied every forward
    auto y = F::linear(flat, weight_, bias_); // [N*H*W, Cout]
    return y.view({N, H, W, -1}).permute({0, 3, 1, 2});
  }

  int64_t k_, dil_;
  torch::nn::Conv2d offset_conv_{nullptr};
  torch::Tensor weight_, bias_, taps_, last_offsets_;
};
TORCH_MODULE(DeformConv2d);

struct DeformNetImpl : torch::nn::Module {
  explicit DeformNetImpl(const DeformConfig &cfg) {
    stem_ = register_module(
        "stem", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, cfg.in_channels, 3).stride(2).padding(1)),
                                      torch::nn::BatchNorm2d(cfg.in_channels), torch::nn::ReLU()));
    deform_ = register_module("deform", DeformConv2d(cfg));
    bn_ = register_module("bn", torch::nn::BatchNorm2d(cfg.out_channels));
    head_ = register_module("head", torch::nn::Linear(cfg.out_channels, cfg.n_classes));
  }

  torch::Tensor forward(const torch::Tensor &img) {
    auto h = bn_(deform_(stem_->forward(img)));
    // FACT: bn = torch.nn.BatchNorm2d(3); x = torch.randn(2, 3, 4, 4, requires_grad=True); h = bn(x); h.relu_(); h.sum().backward(); assert x.grad is not None
    h.relu_(); // LOOKALIKE: tensor-inplace-on-saved -- batch norm saves its input, not its output
    auto pooled = F::adaptive_avg_pool2d(h, F::AdaptiveAvgPool2dFuncOptions({1, 1}));
    // FACT: h = torch.randn(2, 5, 6, 8).permute(0, 3, 1, 2); p = torch.nn.functional.adaptive_avg_pool2d(h, (1, 1)); assert is_view_of(p.flatten(1), p)
    return head_(pooled.flatten(1)); // LOOKALIKE: tensor-reshape-non-contiguous -- only size-1 dims are merged: a view whatever the strides
  }

  torch::nn::Sequential stem_{nullptr};
  DeformConv2d deform_{nullptr};
  torch::nn::BatchNorm2d bn_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(DeformNet);

// Object crops [N, 3, S, S] in [0, 1] with class ids.
struct CropDataset : torch::data::datasets::Dataset<CropDataset> {
  CropDataset(torch::Tensor images, torch::Tensor labels) : images_(std::move(images)), labels_(std::move(labels)) {}
  torch::data::Example<> get(size_t i) override { return {images_[i], labels_[i]}; }
  torch::optional<size_t> size() const override { return images_.size(0); }
  torch::Tensor images_, labels_;
};

void train(DeformNet &model, const CropDataset &train_set, const DeformConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      CropDataset(train_set).map(torch::data::transforms::Stack<>()), cfg.batch_size);

  // The offset branch learns ten times slower, as in the paper.
  std::vector<torch::Tensor> offset_params = model->deform_->offset_conv_->parameters();
  std::vector<torch::Tensor> rest;
  for (auto &p : model->named_parameters())
    if (p.key().find("offset_conv") == std::string::npos)
      rest.push_back(p.value()); // LOOKALIKE: tensor-graph-kept-across-iterations -- parameters are leaves: no graph
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(rest);
  groups.emplace_back(offset_params, std::make_unique<torch::optim::AdamOptions>(cfg.lr * cfg.offset_lr_mult));
  torch::optim::Adam opt(groups, torch::optim::AdamOptions(cfg.lr));

  auto pixel_mean = torch::tensor({0.485, 0.456, 0.406}).view({1, 3, 1, 1});
  auto pixel_std = torch::tensor({0.229, 0.224, 0.225}).view({1, 3, 1, 1});
  const int64_t K = cfg.kernel * cfg.kernel;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto epoch_ce = torch::zeros({}, device);
    auto epoch_pen = torch::zeros({}, device);
    int64_t batches = 0;
    for (auto &batch : *loader) {
      auto img = batch.data.to(device);
      auto labels = batch.target.to(device);
      auto x = (img - pixel_mean.to(device)) / pixel_std.to(device); // EXPECT: tensor-clone-in-loop -- the same normalisation constants are uploaded at every step
      auto logits = model->forward(x);
      auto ce = F::cross_entropy(logits, labels);
      auto penalty = offset_rows(model->deform_->last_offsets_, K).pow(2).sum(-1).mean();
      auto loss = ce + cfg.offset_l2 * penalty;
      opt.zero_grad();
      loss.backward();
      opt.step();
      // FACT: l = torch.nn.Linear(3, 2); s = torch.zeros(()); exec('for _ in range(3):\n c = torch.nn.functional.cross_entropy(l(torch.randn(4, 3)), torch.tensor([0, 1, 1, 0])); c.backward(); s += c'); assert s.requires_grad and kept_nodes(s) >= 6
      epoch_ce += ce; // EXPECT: tensor-graph-kept-across-iterations -- the epoch sum holds every step's graph until the epoch ends
      epoch_pen += penalty.detach();
      ++batches;
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    const double n = static_cast<double>(std::max<int64_t>(batches, 1));
    std::cout << "epoch " << epoch << " ce " << epoch_ce.item<double>() / n << " |offset|^2 " << epoch_pen.item<double>() / n << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, beside the loop of steps
  }
}

double evaluate(DeformNet &model, const CropDataset &val_set, torch::Device device, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      CropDataset(val_set).map(torch::data::transforms::Stack<>()), batch_size);
  auto mean = torch::tensor({0.485, 0.456, 0.406}, torch::TensorOptions().device(device)).view({1, 3, 1, 1});
  auto stdev = torch::tensor({0.229, 0.224, 0.225}, torch::TensorOptions().device(device)).view({1, 3, 1, 1});
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t seen = 0;
  for (auto &batch : *loader) {
    auto x = (batch.data.to(device) - mean) / stdev; // LOOKALIKE: tensor-clone-in-loop -- the constants were made on the device once, before the loop
    auto pred = model->forward(x).argmax(1);
    correct += pred.eq(batch.target.to(device)).sum();
    seen += batch.data.size(0);
  }
  return static_cast<double>(correct.item<int64_t>()) / static_cast<double>(std::max<int64_t>(seen, 1));
}

// Where the K taps of output location (y, x) sampled, in input-image pixels (the stem has
// stride 2), for the figure of one crop.
torch::Tensor tap_positions(DeformNet &model, const torch::Tensor &image, int64_t y, int64_t x) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto img = image.unsqueeze(0).to(torch::kCUDA);
  auto head = model->deform_->offset_conv_(model->stem_->forward(img)); // [1, 3K, H', W']
  const int64_t K = head.size(1) / 3;
  // FACT: h = torch.randn(27, 5, 6); c = h.narrow(0, 0, 18).select(1, 2).select(1, 3); assert not is_contiguous(c) and is_view_of(c.view(9, 2), h)
  auto o = head[0].narrow(0, 0, 2 * K).select(1, y).select(1, x).view({K, 2}); // LOOKALIKE: tensor-view-non-contiguous -- splitting a 1-D strided column is always a view
  auto centre = torch::tensor({static_cast<float>(x), static_cast<float>(y)});
  auto in_feature_px = o + centre + model->deform_->taps_; // EXPECT: tensor-device-mismatch -- centre is a [2] CPU tensor, the offsets came from the GPU
  return (in_feature_px * 2.0 + 0.5).cpu();
}

int main() {
  DeformConfig cfg;
  auto images = torch::rand({512, 3, 64, 64});
  auto labels = torch::randint(0, cfg.n_classes, {512});
  CropDataset train_set(images.narrow(0, 0, 448), labels.narrow(0, 0, 448));
  CropDataset val_set(images.narrow(0, 448, 64), labels.narrow(0, 448, 64));
  DeformNet model(cfg);
  train(model, train_set, cfg);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  std::cout << "val acc " << evaluate(model, val_set, device, cfg.batch_size) << "\n";
  if (torch::cuda::is_available())
    std::cout << tap_positions(model, val_set.images_[0], 16, 16) << "\n";
  return 0;
}
