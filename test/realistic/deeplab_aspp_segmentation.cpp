// DeepLabV3 (output stride 8) for VOC-style semantic segmentation: ASPP with parallel atrous
// convolutions and image-level pooling, bilinear upsampling to the input size, OHEM
// cross-entropy with an ignore label plus a class-weighted soft Dice term, and a validation
// pass that accumulates a confusion matrix for per-class IoU / mIoU.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;
namespace nn = torch::nn;

struct SegConfig {
  int64_t num_classes = 21;
  int64_t ignore_index = 255;
  int64_t aspp_channels = 256;
  std::vector<int64_t> atrous_rates{12, 24, 36};
  int64_t crop = 513;
  int64_t batch_size = 8;
  int64_t epochs = 30;
  double lr = 0.01;
  double momentum = 0.9;
  double weight_decay = 1e-4;
  double ohem_thresh = 0.7;
  double dice_weight = 0.5;
  double prior_tau = 1.0;
  bool dump_confidence = false;
};

class VocSegDataset : public torch::data::datasets::Dataset<VocSegDataset> {
 public:
  VocSegDataset(std::vector<torch::Tensor> images, std::vector<torch::Tensor> masks)
      : images_(std::move(images)), masks_(std::move(masks)) {}
  torch::data::Example<> get(size_t i) override { return {images_[i], masks_[i]}; }
  torch::optional<size_t> size() const override { return images_.size(); }

 private:
  std::vector<torch::Tensor> images_;  // [3, H, W] float in [0, 1]
  std::vector<torch::Tensor> masks_;   // [H, W] int64, 255 = ignore
};

static nn::Sequential conv_bn_relu(int64_t in, int64_t out, int64_t k, int64_t dilation, int64_t stride = 1) {
  const int64_t pad = k == 1 ? 0 : dilation;
  return nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).dilation(dilation).bias(false)),
      nn::BatchNorm2d(out), nn::ReLU(nn::ReLUOptions(true)));
}

struct ASPPPoolingImpl : nn::Module {
  ASPPPoolingImpl(int64_t in, int64_t out)
      : conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(in, out, 1).bias(false)))),
        bn(register_module("bn", nn::BatchNorm2d(out))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1));
    y = torch::relu(bn(conv(y)));
    return F::interpolate(y, F::InterpolateFuncOptions()
                                 .size(std::vector<int64_t>{x.size(2), x.size(3)})
                                 .mode(torch::kBilinear)
                                 .align_corners(false));
  }

  nn::Conv2d conv;
  nn::BatchNorm2d bn;
};
TORCH_MODULE(ASPPPooling);

struct ASPPImpl : nn::Module {
  ASPPImpl(int64_t in, const std::vector<int64_t>& rates, int64_t out) {
    branches.push_back(register_module("b0", conv_bn_relu(in, out, 1, 1)));
    for (size_t i = 0; i < rates.size(); ++i)
      branches.push_back(register_module("b" + std::to_string(i + 1), conv_bn_relu(in, out, 3, rates[i])));
    pooling = register_module("pooling", ASPPPooling(in, out));
    const auto cat_ch = out * static_cast<int64_t>(branches.size() + 1);
    project = register_module("project", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(cat_ch, out, 1).bias(false)),
                                                        nn::BatchNorm2d(out), nn::ReLU(nn::ReLUOptions(true)),
                                                        nn::Dropout(nn::DropoutOptions(0.5))));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    std::vector<torch::Tensor> res;
    for (auto& branch : branches)
      res.push_back(branch->forward(x));  // LOOKALIKE: tensor-graph-kept-across-iterations -- branch outputs are concatenated into the returned graph on purpose
    res.push_back(pooling->forward(x));
    return project->forward(torch::cat(res, 1));
  }

  std::vector<nn::Sequential> branches;
  ASPPPooling pooling{nullptr};
  nn::Sequential project{nullptr};
};
TORCH_MODULE(ASPP);

struct DeepLabV3Impl : nn::Module {
  explicit DeepLabV3Impl(const SegConfig& cfg) {
    // stride-8 trunk; the last two stages keep resolution and dilate instead
    backbone = register_module("backbone", nn::Sequential());
    const int64_t stages[4][4] = {{3, 64, 2, 1}, {64, 128, 2, 1}, {128, 256, 2, 1}, {256, 512, 1, 2}};
    for (const auto& st : stages) {
      backbone->push_back(nn::Conv2d(
          nn::Conv2dOptions(st[0], st[1], 3).stride(st[2]).padding(st[3]).dilation(st[3]).bias(false)));
      backbone->push_back(nn::BatchNorm2d(st[1]));
      backbone->push_back(nn::ReLU(nn::ReLUOptions(true)));
    }
    aspp = register_module("aspp", ASPP(512, cfg.atrous_rates, cfg.aspp_channels));
    classifier = register_module("classifier", conv_bn_relu(cfg.aspp_channels, cfg.aspp_channels, 3, 1));
    classifier->push_back(nn::Conv2d(nn::Conv2dOptions(cfg.aspp_channels, cfg.num_classes, 1)));
    init_weights();
  }
  void init_weights() {
    for (auto& m : modules(false))
      if (auto* conv = m->as<nn::Conv2d>())
        nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    torch::NoGradGuard no_grad;
    for (auto& m : modules(false)) {
      if (auto* bn = m->as<nn::BatchNorm2d>()) {
        bn->weight.fill_(1.0);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
        bn->bias.zero_();
      }
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto H = x.size(2), W = x.size(3);
    auto feat = backbone->forward(x);
    auto logits = classifier->forward(aspp->forward(feat));
    return F::interpolate(logits, F::InterpolateFuncOptions()
                                      .size(std::vector<int64_t>{H, W})
                                      .mode(torch::kBilinear)
                                      .align_corners(false));
  }

  nn::Sequential backbone{nullptr}, classifier{nullptr};
  ASPP aspp{nullptr};
};
TORCH_MODULE(DeepLabV3);

// OHEM cross-entropy (only pixels whose true-class probability is below a threshold) plus a
// class-weighted soft Dice over the labelled pixels.
torch::Tensor ohem_dice_loss(const torch::Tensor& logits, const torch::Tensor& target,
                             const torch::Tensor& class_weights, const SegConfig& cfg) {
  const auto C = logits.size(1);
  auto valid = target != cfg.ignore_index;
  auto safe_target = target.masked_fill(valid.logical_not(), 0);
  auto pixel_ce = F::cross_entropy(
      logits, target, F::CrossEntropyFuncOptions().ignore_index(cfg.ignore_index).reduction(torch::kNone));

  auto probs = torch::softmax(logits, 1);
  auto conf_map = probs.detach();
  // ignored pixels must never be picked as hard examples
  conf_map.masked_fill_(valid.logical_not().unsqueeze(1), 1.0);  // EXPECT: tensor-inplace-on-detached
  auto p_true = conf_map.gather(1, safe_target.unsqueeze(1)).squeeze(1);
  auto hard = (p_true < cfg.ohem_thresh).to(pixel_ce.scalar_type());
  auto ce = (pixel_ce * hard).sum() / hard.sum().clamp_min(1.0);

  auto onehot = torch::one_hot(safe_target, C).permute({0, 3, 1, 2}).to(probs.scalar_type());
  auto vmask = valid.unsqueeze(1).to(probs.scalar_type());
  auto wmap = class_weights.view({1, C, 1, 1}).expand_as(probs);
  // FACT: w = torch.rand(3); e = w.view(1, 3, 1, 1).expand(2, 3, 4, 5); assert raises(lambda: e.mul_(torch.ones(2, 1, 4, 5)), "more than one element")
  wmap.mul_(vmask);  // EXPECT: tensor-inplace-on-expanded
  auto inter = (probs * onehot * wmap).sum({0, 2, 3});
  auto denom = ((probs + onehot) * wmap).sum({0, 2, 3});
  auto dice = 1 - ((2 * inter + 1) / (denom + 1)).mean();
  return ce + cfg.dice_weight * dice;
}

class SegMetric {
 public:
  SegMetric(int64_t num_classes, int64_t ignore_index)
      : n_(num_classes), ignore_(ignore_index), conf_(torch::zeros({num_classes, num_classes}, torch::kLong)) {}

  void update(const torch::Tensor& pred, const torch::Tensor& target) {
    // FACT: x = torch.randn(2, 3, 4, 5); p = x.argmax(1); assert is_contiguous(p) and is_view_of(p.view(-1), p)
    auto p = pred.view({-1}).cpu();  // LOOKALIKE: tensor-view-non-contiguous -- argmax allocates a fresh contiguous tensor
    auto t = target.reshape({-1}).cpu();
    auto valid = (t != ignore_) & (t >= 0) & (t < n_);
    auto idx = t.index({valid}) * n_ + p.index({valid});
    conf_ += torch::bincount(idx, {}, n_ * n_).view({n_, n_});
  }

  torch::Tensor iou() const {
    auto c = conf_.to(torch::kDouble);
    // FACT: c = torch.zeros(3, 3, dtype=torch.long); d = c.to(torch.float64); d.div_(2.0); assert is_copy_of(d, c)
    c.div_(c.sum().clamp_min(1.0));  // LOOKALIKE: tensor-alias-then-mutate -- conf_ is int64, to(kDouble) always copies
    auto tp = c.diag();
    return tp / (c.sum(0) + c.sum(1) - tp).clamp_min(1e-12);
  }

  double miou() const { return iou().mean().item<double>(); }

 private:
  int64_t n_, ignore_;
  torch::Tensor conf_;  // [n, n] int64, rows = ground truth
};

torch::Tensor to_uint8_image(const torch::Tensor& img01) {
  auto out = torch::empty(img01.sizes(), torch::kByte);
  out.copy_((img01 * 255.0).round().clamp(0, 255));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to whole numbers in [0, 255]
  return out;
}

double evaluate(DeepLabV3& model, VocSegDataset val_set, const torch::Tensor& log_prior, const SegConfig& cfg,
                std::vector<torch::Tensor>& confidence_maps, std::vector<torch::Tensor>& previews) {
  torch::Device device(torch::kCUDA);
  torch::NoGradGuard no_grad;
  model->eval();
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(val_set).map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(cfg.batch_size));
  auto mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}).to(device);
  auto stdv = torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}).to(device);
  auto prior = log_prior.to(device) * cfg.prior_tau;

  SegMetric metric(cfg.num_classes, cfg.ignore_index);
  torch::Tensor val_loss = torch::zeros({}, torch::TensorOptions().device(device));
  torch::Tensor ece_bins = torch::zeros({2, 15}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  int64_t batches = 0;
  for (auto& batch : *loader) {
    auto images = batch.data.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
    auto target = batch.target.to(device);
    auto inputs = images.clone();  // EXPECT: tensor-unnecessary-clone
    inputs.sub_(mean);
    inputs.div_(stdv);
    auto logits = model->forward(inputs);
    val_loss += F::cross_entropy(logits, target, F::CrossEntropyFuncOptions().ignore_index(cfg.ignore_index));  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, no graph

    // long-tail logit adjustment by the training-set class prior
    // FACT: x = torch.randn(2, 3, 4, 5); a = torch.rand(3).view(1, -1, 1, 1).expand_as(x); x.sub_(a); assert a.stride(0) == 0
    auto adj = prior.view({1, -1, 1, 1}).expand_as(logits);
    logits.sub_(adj);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded prior is only read
    auto probs = torch::softmax(logits, 1);
    metric.update(logits.argmax(1), target);

    // calibration: confidence of the arg-max class per labelled pixel
    // FACT: x = torch.randn(2, 3, 4, 5).softmax(1); assert raises(lambda: x.permute(0, 2, 3, 1).view(-1, 3), "view size is not compatible")
    auto flat_probs = probs.permute({0, 2, 3, 1}).view({-1, cfg.num_classes});  // EXPECT: tensor-view-non-contiguous
    auto flat_t = target.reshape({-1});
    auto [conf, hit_cls] = flat_probs.max(1);
    auto keep = flat_t != cfg.ignore_index;
    auto bin = (conf * 15).floor().clamp_max(14).to(torch::kLong).index({keep});
    ece_bins[0].index_add_(0, bin, conf.index({keep}).to(torch::kDouble));
    ece_bins[1].index_add_(0, bin, (hit_cls == flat_t).index({keep}).to(torch::kDouble));

    if (cfg.dump_confidence) {
      auto conf_u8 = torch::empty({probs.size(0), probs.size(2), probs.size(3)}, torch::kByte);
      conf_u8.copy_(std::get<0>(probs.max(1)) * 255);  // EXPECT: tensor-copy-narrowing
      confidence_maps.push_back(conf_u8);
      previews.push_back(to_uint8_image(images[0].cpu()));
    }
    ++batches;
  }
  auto counts = ece_bins.sum(0).clamp_min(1.0);
  std::cout << "val loss " << val_loss.item<double>() / std::max<int64_t>(batches, 1) << " conf-acc gap "
            << (ece_bins[0] - ece_bins[1]).abs().sum().item<double>() / counts.sum().item<double>() << '\n';
  return metric.miou();
}

void train_deeplab(DeepLabV3& model, VocSegDataset train_set, VocSegDataset val_set, const torch::Tensor& log_prior,
                   const SegConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  {
    torch::NoGradGuard no_grad;
    model->eval();
    auto probe = torch::zeros({2, 3, cfg.crop, cfg.crop});
    auto probe_out = model->forward(probe);  // EXPECT: tensor-device-mismatch
    TORCH_CHECK(probe_out.size(1) == cfg.num_classes && probe_out.size(2) == cfg.crop, "unexpected head shape");
  }

  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(train_set).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(cfg.batch_size).workers(4).drop_last(true));
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).weight_decay(cfg.weight_decay));
  auto mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}).to(device);
  auto stdv = torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}).to(device);
  auto class_w = (1.0 - log_prior.exp()).clamp_min(0.05).to(device);

  std::vector<torch::Tensor> epoch_losses;
  std::vector<torch::Tensor> confidence_maps, previews;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    for (auto& batch : *loader) {
      auto images = batch.data.to(device);
      auto targets = batch.target.to(device);
      auto logits = model->forward((images - mean) / stdv);
      auto loss = ohem_dice_loss(logits, targets, class_w, cfg);
      if (!std::isfinite(loss.item<double>())) continue;  // LOOKALIKE: tensor-sync-in-loop -- the value decides whether the step runs
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    }
    const double lr = cfg.lr * std::pow(1.0 - double(epoch + 1) / cfg.epochs, 0.9);
    for (auto& group : opt.param_groups()) static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
    const double train_loss = torch::stack(epoch_losses).mean().item<double>();
    const double miou = evaluate(model, val_set, log_prior, cfg, confidence_maps, previews);
    std::cout << "epoch " << epoch << " loss " << train_loss << " mIoU " << miou << std::endl;
  }
}
