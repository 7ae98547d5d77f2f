// ConvNeXt image classifier: depthwise 7x7 conv, LayerNorm over channels-last features,
// layer scale (gamma), stochastic depth, and the train / eval loops around it.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <random>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct ConvNeXtConfig {
  std::vector<int64_t> depths{3, 3, 9, 3};
  std::vector<int64_t> dims{96, 192, 384, 768};
  int64_t in_chans = 3;
  int64_t num_classes = 1000;
  double drop_path_rate = 0.1;
  double layer_scale_init = 1e-6;
  double head_init_scale = 1.0;
  double label_smoothing = 0.1;
  double distill_temperature = 2.0;
  bool self_distill = false;
  int64_t log_every = 50;
};

struct ImageBatch {
  torch::Tensor images;  // [N, 3, H, W], float in [0, 1]
  torch::Tensor labels;  // [N], int64
};

// Stochastic depth: drops the whole residual branch of a sample.
torch::Tensor drop_path(const torch::Tensor& x, double drop_prob, bool training) {
  if (drop_prob == 0.0 || !training) return x;
  const double keep_prob = 1.0 - drop_prob;
  std::vector<int64_t> shape(x.dim(), 1);
  shape[0] = x.size(0);
  auto keep = torch::empty(shape, x.options()).bernoulli_(keep_prob);
  auto mask = keep.expand_as(x);
  // FACT: m = torch.rand(4, 1, 1, 1).bernoulli_(0.9).expand(4, 3, 5, 5); assert raises(lambda: m.div_(0.9), "more than one element")
  mask.div_(keep_prob);  // EXPECT: tensor-inplace-on-expanded
  return x * mask;
}

// LayerNorm over the channels of an NCHW map (stem and downsampling layers).
struct LayerNorm2dImpl : nn::Module {
  explicit LayerNorm2dImpl(int64_t channels, double eps = 1e-6) : channels_(channels), eps_(eps) {
    weight = register_parameter("weight", torch::ones({channels}));
    bias = register_parameter("bias", torch::zeros({channels}));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto n = x.size(0), h = x.size(2), w = x.size(3);
    // FACT: x = torch.randn(2, 3, 4, 5); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(-1, 3), x)
    auto rows = x.permute({0, 2, 3, 1}).reshape({-1, channels_});  // EXPECT: tensor-reshape-non-contiguous
    auto y = F::layer_norm(rows, F::LayerNormFuncOptions({channels_}).weight(weight).bias(bias).eps(eps_));
    // FACT: y = torch.randn(40, 3); assert is_view_of(y.view(2, 4, 5, 3), y)
    return y.view({n, h, w, channels_}).permute({0, 3, 1, 2});  // LOOKALIKE: tensor-view-non-contiguous -- layer_norm returns a fresh contiguous tensor
  }

  int64_t channels_;
  double eps_;
  torch::Tensor weight, bias;
};
TORCH_MODULE(LayerNorm2d);

struct ConvNeXtBlockImpl : nn::Module {
  ConvNeXtBlockImpl(int64_t dim, double drop_path_prob, double ls_init)
      : dwconv(nn::Conv2dOptions(dim, dim, 7).padding(3).groups(dim)),
        norm(nn::LayerNormOptions({dim}).eps(1e-6)),
        pwconv1(dim, 4 * dim),
        pwconv2(4 * dim, dim),
        drop_prob(drop_path_prob) {
    register_module("dwconv", dwconv);
    register_module("norm", norm);
    register_module("pwconv1", pwconv1);
    register_module("pwconv2", pwconv2);
    if (ls_init > 0) gamma = register_parameter("gamma", torch::full({dim}, ls_init));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = dwconv(x);
    h = h.permute({0, 2, 3, 1});  // (N, C, H, W) -> (N, H, W, C): Linear == 1x1 conv
    h = norm(h);
    h = pwconv1(h);
    h = F::gelu(h);
    h = pwconv2(h);
    if (gamma.defined()) h = gamma * h;
    h = h.permute({0, 3, 1, 2});
    return x + drop_path(h, drop_prob, is_training());
  }

  nn::Conv2d dwconv;
  nn::LayerNorm norm;
  nn::Linear pwconv1, pwconv2;
  torch::Tensor gamma;
  double drop_prob;
};
TORCH_MODULE(ConvNeXtBlock);

struct ConvNeXtImpl : nn::Module {
  explicit ConvNeXtImpl(const ConvNeXtConfig& cfg)
      : head_norm(nn::LayerNormOptions({cfg.dims.back()}).eps(1e-6)),
        head(cfg.dims.back(), cfg.num_classes) {
    stem->push_back(nn::Conv2d(nn::Conv2dOptions(cfg.in_chans, cfg.dims[0], 4).stride(4)));
    stem->push_back(LayerNorm2d(cfg.dims[0]));
    register_module("stem", stem);
    const int64_t total = std::accumulate(cfg.depths.begin(), cfg.depths.end(), int64_t{0});
    int64_t cur = 0;
    for (size_t i = 0; i < cfg.depths.size(); ++i) {
      nn::Sequential stage;
      if (i > 0) {
        stage->push_back(LayerNorm2d(cfg.dims[i - 1]));
        stage->push_back(nn::Conv2d(nn::Conv2dOptions(cfg.dims[i - 1], cfg.dims[i], 2).stride(2)));
      }
      for (int64_t j = 0; j < cfg.depths[i]; ++j, ++cur) {
        const double dp = cfg.drop_path_rate * cur / std::max<int64_t>(total - 1, 1);
        ConvNeXtBlock blk(cfg.dims[i], dp, cfg.layer_scale_init);
        blocks.push_back(blk);
        stage->push_back(blk);
      }
      stages.push_back(register_module("stage" + std::to_string(i), stage));
    }
    register_module("head_norm", head_norm);
    register_module("head", head);

    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<nn::Conv2dImpl>()) {
        nn::init::normal_(conv->weight, 0.0, 0.02);
        nn::init::zeros_(conv->bias);
      }
    }
    torch::NoGradGuard no_grad;
    nn::init::normal_(head->weight, 0.0, 0.02);
    head->weight.mul_(cfg.head_init_scale);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    head->bias.zero_();
  }

  torch::Tensor forward_features(torch::Tensor x) {
    x = stem->forward(x);
    for (auto& stage : stages) x = stage->forward(x);
    return x;
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto pooled = forward_features(x).mean({-2, -1});
    auto logits = head(head_norm(pooled));
    if (logit_temperature != 1.0) logits.div_(logit_temperature);  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    return logits;
  }

  // [N, H*W, C] tokens for a detection neck or a linear probe.
  torch::Tensor tokens(const torch::Tensor& images) {
    auto f = forward_features(images);
    const auto n = f.size(0), c = f.size(1), hw = f.size(2) * f.size(3);
    // FACT: x = torch.randn(2, 3, 4, 5); assert is_view_of(x.permute(0, 2, 3, 1).view(2, 20, 3), x)
    return f.permute({0, 2, 3, 1}).view({n, hw, c});  // LOOKALIKE: tensor-view-non-contiguous -- H and W stay adjacent, so they merge
  }

  // One row per spatial location (k-means over dense features).
  torch::Tensor dense_rows(const torch::Tensor& images) {
    auto f = forward_features(images);
    auto t = f.flatten(2).transpose(1, 2);
    // FACT: x = torch.randn(2, 3, 4, 5); assert raises(lambda: x.flatten(2).transpose(1, 2).view(-1, 3), "view size is not compatible")
    return t.view({-1, f.size(1)});  // EXPECT: tensor-view-non-contiguous
  }

  nn::Sequential stem;
  std::vector<nn::Sequential> stages;
  std::vector<ConvNeXtBlock> blocks;
  nn::LayerNorm head_norm;
  nn::Linear head;
  double logit_temperature = 1.0;
};
TORCH_MODULE(ConvNeXt);

// Re-initialise layer scale before fine-tuning at a new resolution.
void reset_layer_scale(ConvNeXt& model, double value) {
  for (auto& blk : model->blocks) {
    if (blk->gamma.defined()) blk->gamma.fill_(value);  // EXPECT: tensor-inplace-on-leaf
  }
}

void ema_update(ConvNeXt& ema, ConvNeXt& model, double decay) {
  torch::NoGradGuard no_grad;
  auto ema_params = ema->parameters();
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    auto e = ema_params[i].detach();
    e.mul_(decay).add_(params[i], 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-detached -- EMA update under NoGradGuard writes the EMA weights on purpose
  }
}

// Cross-entropy plus KL to the model's own temperature-softened predictions.
torch::Tensor self_distill_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                                const ConvNeXtConfig& cfg) {
  const double t = cfg.distill_temperature;
  auto teacher = logits.detach();
  teacher.div_(t);  // EXPECT: tensor-inplace-on-detached
  auto target = torch::softmax(teacher, 1);
  auto ce = F::cross_entropy(logits, labels);
  auto kd = F::kl_div(torch::log_softmax(logits / t, 1), target,
                      F::KLDivFuncOptions().reduction(torch::kBatchMean));
  return ce + kd * (t * t);
}

double train_one_epoch(ConvNeXt& model, ConvNeXt& ema, const std::vector<ImageBatch>& batches,
                       torch::optim::AdamW& opt, const ConvNeXtConfig& cfg,
                       const torch::Tensor& mean, const torch::Tensor& stdv) {
  model->train();
  torch::Tensor epoch_loss = torch::zeros({});
  auto head_before = model->head->weight.clone();  // LOOKALIKE: tensor-unnecessary-clone -- snapshot: opt.step() changes the weights
  int64_t step = 0;
  for (const auto& batch : batches) {
    auto x = batch.images.clone();  // EXPECT: tensor-unnecessary-clone
    x.sub_(mean).div_(stdv);
    auto logits = model->forward(x);
    auto loss = cfg.self_distill
                    ? self_distill_loss(logits, batch.labels, cfg)
                    : F::cross_entropy(logits, batch.labels,
                                       F::CrossEntropyFuncOptions().label_smoothing(cfg.label_smoothing));
    opt.zero_grad();
    loss.backward();
    opt.step();
    ema_update(ema, model, 0.9999);
    epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
    if (++step % cfg.log_every == 0)
      std::printf("step %lld loss %.4f\n", static_cast<long long>(step), loss.item<double>());  // LOOKALIKE: tensor-sync-in-loop -- conditional logging, tensors never moved to CUDA
  }
  const double drift = (model->head->weight - head_before).norm().item<double>();
  std::printf("head drift %.5f\n", drift);
  return epoch_loss.item<double>() / std::max<int64_t>(step, 1);
}

// Mixup with soft targets.
double train_step_mixup(ConvNeXt& model, torch::optim::Optimizer& opt, const ImageBatch& batch,
                        int64_t num_classes, double alpha, std::mt19937& rng) {
  std::gamma_distribution<double> ga(alpha, 1.0);
  const double g1 = ga(rng), g2 = ga(rng);
  const double lam = g1 / (g1 + g2);
  auto perm = torch::randperm(batch.images.size(0));
  auto mixed = batch.images * lam + batch.images.index_select(0, perm) * (1.0 - lam);
  auto onehot = F::one_hot(batch.labels, num_classes).to(torch::kFloat);
  auto soft = onehot * lam + onehot.index_select(0, perm) * (1.0 - lam);

  auto logits = model->forward(mixed);
  auto probs = torch::softmax(logits, 1);
  probs.clamp_(1e-7, 1.0);  // EXPECT: tensor-inplace-on-saved
  auto loss = -(soft * probs.log()).sum(1).mean();
  opt.zero_grad();
  loss.backward();
  opt.step();
  return loss.item<double>();
}

struct EvalResult {
  double top1 = 0, top5 = 0;
  torch::Tensor logits;
};

EvalResult evaluate(ConvNeXt& model, const std::vector<ImageBatch>& batches,
                    const torch::Tensor& mean, const torch::Tensor& stdv) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> all_logits;
  int64_t hit1 = 0, hit5 = 0, seen = 0;
  for (const auto& batch : batches) {
    auto images = batch.images.to(torch::kFloat);  // LOOKALIKE: tensor-clone-in-loop -- a new batch each iteration, already float
    auto logits = model->forward((images - mean) / stdv);
    all_logits.push_back(logits);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    auto top5 = std::get<1>(logits.topk(5, 1));
    auto match = top5.eq(batch.labels.unsqueeze(1));
    hit1 += match.select(1, 0).sum().item<int64_t>();
    hit5 += match.any(1).sum().item<int64_t>();
    seen += batch.labels.size(0);
  }
  EvalResult r;
  r.top1 = 100.0 * hit1 / std::max<int64_t>(seen, 1);
  r.top5 = 100.0 * hit5 / std::max<int64_t>(seen, 1);
  r.logits = torch::cat(all_logits, 0);
  return r;
}
