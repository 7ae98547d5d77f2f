// FixMatch on CIFAR-10 with a small wide-ResNet: confident predictions on weakly augmented
// unlabeled images are pseudo labels for their strong views; an EMA copy is used for evaluation.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

constexpr double kPi = 3.14159265358979323846;

struct Config {
  std::string data_dir = "data/cifar-10-batches-bin";
  int64_t num_classes = 10, num_labeled = 4000, batch_size = 64, mu = 7, width = 32;
  double lr = 0.03, weight_decay = 5e-4, threshold = 0.95, lambda_u = 1.0, ema_decay = 0.999;
  int64_t total_steps = 1 << 17, eval_every = 1024, log_every = 64;
};

std::mt19937 rng(1234);

// CIFAR-10 binary batches: a label byte followed by the image, per record.
std::pair<torch::Tensor, torch::Tensor> read_cifar(const std::vector<std::string>& files) {
  const int64_t per_file = 10000, record = 1 + 3 * 32 * 32;
  auto raw = torch::empty({static_cast<int64_t>(files.size()) * per_file, record}, torch::kUInt8);
  for (size_t f = 0; f < files.size(); ++f) {
    std::ifstream in(files[f], std::ios::binary);
    auto* dst = reinterpret_cast<char*>(raw[static_cast<int64_t>(f) * per_file].data_ptr<uint8_t>());
    TORCH_CHECK(in.read(dst, per_file * record), "cannot read ", files[f]);
  }
  auto labels = raw.select(1, 0).to(torch::kLong);
  // FACT: r=torch.zeros(4,1+3*4*4,dtype=torch.uint8); v=r.narrow(1,1,48).view(-1,3,4,4); assert not is_contiguous(r.narrow(1,1,48)) and is_view_of(v,r)
  // FACT: r=torch.zeros(4,1+48,dtype=torch.uint8).narrow(1,1,48).view(-1,3,4,4); assert is_copy_of(r.to(torch.float32), r)
  auto images = raw.narrow(1, 1, record - 1).view({-1, 3, 32, 32}).to(torch::kFloat).div_(255);  // LOOKALIKE: tensor-view-non-contiguous, tensor-alias-then-mutate -- view only splits the narrowed row, which is dense; to(kFloat) from uint8 is a new tensor
  return {images, labels};
}

torch::Tensor normalize(const torch::Tensor& images, const torch::Tensor& mean, const torch::Tensor& stdev) {
  auto out = images.contiguous();
  // FACT: a=torch.rand(4,3,8,8); b=a.contiguous(); b.sub_(0.5); assert shares_storage(a,b) and torch.equal(a,b)
  out.sub_(mean).div_(stdev);  // EXPECT: tensor-alias-then-mutate
  return out;
}

// Shift the batch horizontally, repeating the edge columns.
torch::Tensor translate_x(torch::Tensor x, int64_t s) {
  const auto w = x.size(3);
  // FACT: x=torch.rand(2,3,8,8); assert shares_storage(x.narrow(3,2,6), x.narrow(3,0,6)) and not raises(lambda: x.narrow(3,2,6).copy_(x.narrow(3,0,6)))
  if (s > 0) {
    x.narrow(3, s, w - s).copy_(x.narrow(3, 0, w - s));  // EXPECT: tensor-inplace-overlap
  } else if (s < 0) {
    // FACT: x=torch.rand(2,3,8,8); src=x.narrow(3,2,6).clone(); assert is_copy_of(src,x); x.narrow(3,0,6).copy_(src)
    x.narrow(3, 0, w + s).copy_(x.narrow(3, -s, w + s).clone());  // LOOKALIKE: tensor-inplace-overlap, tensor-unnecessary-clone -- the clone breaks the overlap between source and destination
  }
  return x;
}

torch::Tensor weak_augment(const torch::Tensor& x) {
  const auto n = x.size(0);
  auto flip = (torch::rand({n}) < 0.5).view({n, 1, 1, 1});
  auto out = torch::where(flip, x.flip({3}), x);
  std::uniform_int_distribution<int64_t> shift(-4, 4);
  return translate_x(out, shift(rng));
}

torch::Tensor saturate(const torch::Tensor& x, const torch::Tensor& factor) {
  auto out = x.mean(1, /*keepdim=*/true).expand_as(x);
  // FACT: x=torch.rand(2,3,4,4); g=x.mean(1,keepdim=True).expand_as(x); assert raises(lambda: g.lerp_(x, torch.rand(2,1,1,1)), "more than one element")
  out.lerp_(x, factor);  // EXPECT: tensor-inplace-on-expanded
  return out;
}

// RandAugment-lite: colour mixing, contrast, saturation and Cutout.
torch::Tensor strong_augment(const torch::Tensor& x) {
  const auto n = x.size(0), h = x.size(2), w = x.size(3);
  auto mix = torch::eye(3).expand({n, 3, 3}) + 0.1 * torch::randn({n, 3, 3});
  // FACT: x=torch.rand(2,3,4,4); assert is_view_of(x.permute(0,2,3,1).reshape(2,16,3), x)
  auto pixels = x.permute({0, 2, 3, 1}).reshape({n, h * w, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent after the permute, so this is a view
  auto out = torch::bmm(pixels, mix).view({n, h, w, 3}).permute({0, 3, 1, 2});
  auto contrast = torch::empty({n, 1, 1, 1}).uniform_(0.6, 1.4);
  auto level = out.mean({1, 2, 3}, true);
  out = (out - level) * contrast + level;
  out = saturate(out, torch::empty({n, 1, 1, 1}).uniform_(0.0, 2.0));
  // Cutout: blank one random 16x16 square per image.
  auto keep = torch::ones({n, 1, h, w}, x.options());
  std::uniform_int_distribution<int64_t> row(0, h - 16), col(0, w - 16);
  for (int64_t i = 0; i < n; ++i) keep[i].narrow(1, row(rng), 16).narrow(2, col(rng), 16).zero_();
  return out.clamp(0, 1) * keep;
}

struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    bn1 = register_module("bn1", nn::BatchNorm2d(nn::BatchNorm2dOptions(in).momentum(0.001)));
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn2 = register_module("bn2", nn::BatchNorm2d(nn::BatchNorm2dOptions(out).momentum(0.001)));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    if (stride != 1 || in != out) {
      shortcut = register_module("shortcut", nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto act = F::LeakyReLUFuncOptions().negative_slope(0.1);
    auto o = F::leaky_relu(bn1(x), act);
    auto y = conv2(F::leaky_relu(bn2(conv1(o)), act));
    // FACT: c=torch.nn.Conv2d(2,2,3,padding=1); i=torch.rand(1,2,4,4,requires_grad=True); assert not backward_fails(lambda: (lambda y: (y.add_(1), y.sum().backward()))(c(i)))
    y += shortcut.is_empty() ? x : shortcut(o);  // LOOKALIKE: tensor-inplace-on-saved -- convolution saves its input and weight, not its output
    return y;
  }

  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

struct WideNetImpl : nn::Module {
  WideNetImpl(int64_t num_classes, int64_t width) {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)));
    const std::vector<int64_t> ch{16, width, width * 2, width * 4};
    for (size_t g = 0; g < 3; ++g) {
      blocks->push_back(BasicBlock(ch[g], ch[g + 1], g == 0 ? 1 : 2));
      blocks->push_back(BasicBlock(ch[g + 1], ch[g + 1], 1));
    }
    register_module("blocks", blocks);
    bn = register_module("bn", nn::BatchNorm2d(nn::BatchNorm2dOptions(ch[3]).momentum(0.001)));
    fc = register_module("fc", nn::Linear(ch[3], num_classes));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = F::leaky_relu(bn(blocks->forward(stem(x))), F::LeakyReLUFuncOptions().negative_slope(0.1));
    return fc(F::adaptive_avg_pool2d(h, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1));
  }

  nn::Conv2d stem{nullptr};
  nn::Sequential blocks;
  nn::BatchNorm2d bn{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(WideNet);

void init_weights(WideNet& net) {
  for (auto& m : net->modules(/*include_self=*/false)) {
    if (auto* conv = m->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kLeakyReLU);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under NoGradGuard
    } else if (auto* fc = m->as<nn::Linear>()) {
      nn::init::xavier_normal_(fc->weight);
      fc->bias.zero_();  // EXPECT: tensor-inplace-on-leaf
    }
  }
}

struct ModelEMA {
  ModelEMA(const WideNet& model, const Config& cfg, torch::Device device)
      : shadow(cfg.num_classes, cfg.width), decay(cfg.ema_decay) {
    shadow->to(device);
    torch::NoGradGuard no_grad;
    auto src = model->named_parameters();
    for (auto& item : shadow->named_parameters()) {
      item.value().copy_(src[item.key()]);
      item.value().set_requires_grad(false);
    }
    shadow->eval();
  }

  void update(const WideNet& model) {
    torch::NoGradGuard no_grad;
    auto src = model->named_parameters();
    for (auto& item : shadow->named_parameters()) {
      auto w = item.value().detach();
      w.mul_(decay).add_(src[item.key()].detach(), 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-detached -- the EMA update writes the shadow weights on purpose, under NoGradGuard
    }
    auto src_buffers = model->named_buffers();
    for (auto& item : shadow->named_buffers()) item.value().copy_(src_buffers[item.key()]);
  }

  WideNet shadow;
  double decay;
};

// Distribution alignment: pull the marginal of unlabeled predictions toward the labeled prior.
struct DistAlign {
  DistAlign(const torch::Tensor& labels, int64_t k, torch::Device device)
      : p_target(torch::bincount(labels, {}, k).to(torch::kFloat) / labels.size(0)),
        p_model(torch::full({k}, 1.0 / k, torch::TensorOptions().device(device))) {}

  torch::Tensor operator()(torch::Tensor probs) {
    p_model.mul_(0.999).add_(probs.mean(0), 0.001);  // LOOKALIKE: tensor-device-mismatch -- p_model was created on the training device
    probs.mul_(p_target / p_model);  // EXPECT: tensor-device-mismatch
    return probs / probs.sum(1, true);
  }

  torch::Tensor p_target, p_model;
};

std::vector<torch::Tensor> sample_batch(const std::vector<torch::Tensor>& data, int64_t batch) {
  auto idx = torch::randint(data[0].size(0), {batch});
  std::vector<torch::Tensor> out;
  for (const auto& d : data) out.push_back(d.index_select(0, idx));
  return out;
}

// Mix labeled and unlabeled samples so every BatchNorm batch sees both.
torch::Tensor interleave(const torch::Tensor& x, int64_t size) {
  const auto c = x.size(1), h = x.size(2), w = x.size(3);
  // FACT: y=torch.rand(3*4,3,8,8); assert is_copy_of(y.reshape(-1,3,3,8,8).transpose(0,1).reshape(-1,3,8,8), y)
  return x.reshape({-1, size, c, h, w}).transpose(0, 1).reshape({-1, c, h, w});  // EXPECT: tensor-reshape-non-contiguous
}

torch::Tensor de_interleave(const torch::Tensor& logits, int64_t size) {
  const auto k = logits.size(1);
  // FACT: y=torch.rand(3*4,10); t=y.reshape(3,-1,10).transpose(0,1); assert raises(lambda: t.view(-1,10)) and is_contiguous(t.contiguous().view(-1,10))
  return logits.reshape({size, -1, k}).transpose(0, 1).contiguous().view({-1, k});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() runs before the view
}

double evaluate(WideNet& net, const torch::Tensor& images, const torch::Tensor& labels,
                torch::Device device, int64_t batch) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t i = 0; i < images.size(0); i += batch) {
    const auto len = std::min(batch, images.size(0) - i);
    auto x = images.narrow(0, i, len).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice every iteration
    auto y = labels.narrow(0, i, len).to(device);
    correct += net(x).argmax(1).eq(y).sum();
  }
  return correct.item<double>() / static_cast<double>(images.size(0));
}

void train(const Config& cfg, torch::Device device) {
  std::vector<std::string> train_files;
  for (int i = 1; i <= 5; ++i) train_files.push_back(cfg.data_dir + "/data_batch_" + std::to_string(i) + ".bin");
  auto [train_x, train_y] = read_cifar(train_files);
  auto [test_x, test_y] = read_cifar({cfg.data_dir + "/test_batch.bin"});
  const auto mean = torch::tensor({0.4914, 0.4822, 0.4465}).view({1, 3, 1, 1});
  const auto stdev = torch::tensor({0.2471, 0.2435, 0.2616}).view({1, 3, 1, 1});
  auto test_norm = normalize(test_x, mean, stdev);

  auto pick = torch::randperm(train_x.size(0)).narrow(0, 0, cfg.num_labeled);
  auto labeled_y = train_y.index_select(0, pick);
  const std::vector<torch::Tensor> labeled{train_x.index_select(0, pick), labeled_y};

  WideNet model(cfg.num_classes, cfg.width);
  init_weights(model);
  model->to(device);
  ModelEMA ema(model, cfg, device);
  DistAlign dist_align(labeled_y, cfg.num_classes, device);
  // Per-class counts of confident pseudo labels over the last 256 steps.
  auto pl_hist = torch::zeros({256, cfg.num_classes}, torch::TensorOptions().dtype(torch::kInt32).device(device));

  torch::optim::SGD optimizer(
      model->parameters(),
      torch::optim::SGDOptions(cfg.lr).momentum(0.9).nesterov(true).weight_decay(cfg.weight_decay));

  const int64_t k = 2 * cfg.mu + 1;
  std::vector<torch::Tensor> recent_losses;
  double mask_rate = 0.0;
  for (int64_t step = 0; step < cfg.total_steps; ++step) {
    const double lr = cfg.lr * std::cos(7.0 * kPi * step / (16.0 * cfg.total_steps));
    for (auto& g : optimizer.param_groups()) static_cast<torch::optim::SGDOptions&>(g.options()).lr(lr);

    model->train();
    auto lb = sample_batch(labeled, cfg.batch_size);
    auto ub = sample_batch({train_x}, cfg.batch_size * cfg.mu);
    auto x_l = weak_augment(normalize(lb[0], mean, stdev));
    auto x_w = weak_augment(normalize(ub[0], mean, stdev));
    auto x_s = normalize(strong_augment(ub[0]), mean, stdev);

    auto inputs = interleave(torch::cat({x_l, x_w, x_s}), k).to(device);
    auto logits = de_interleave(model(inputs), k);
    auto logits_x = logits.narrow(0, 0, cfg.batch_size);
    auto halves = logits.narrow(0, cfg.batch_size, logits.size(0) - cfg.batch_size).chunk(2);
    auto loss_x = F::cross_entropy(logits_x, lb[1].to(device));

    auto probs = dist_align(torch::softmax(halves[0].detach(), -1));
    auto [max_probs, targets_u] = probs.max(-1);
    auto mask = max_probs.ge(cfg.threshold);
    pl_hist[step % 256].copy_(torch::bincount(targets_u.masked_select(mask), {}, cfg.num_classes));  // EXPECT: tensor-copy-narrowing
    auto per_sample = F::cross_entropy(halves[1], targets_u,
                                       F::CrossEntropyFuncOptions().reduction(torch::kNone));
    auto loss_u = (per_sample * mask.to(torch::kFloat)).mean();
    auto loss = loss_x + cfg.lambda_u * loss_u;

    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    ema.update(model);

    // FACT: w=torch.rand(3,requires_grad=True); l=(w.exp()*2).sum(); l.backward(); assert kept_nodes([l]) >= 3
    recent_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    mask_rate += mask.to(torch::kFloat).mean().item<double>();  // EXPECT: tensor-sync-in-loop
    if ((step + 1) % cfg.log_every == 0) {
      const double avg = torch::stack(recent_losses).mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- read once per logging interval, not every step
      auto share = pl_hist.sum(0).to(torch::kFloat);
      std::cout << "step " << step + 1 << " lr " << lr << " loss " << avg << " mask "
                << mask_rate / cfg.log_every << " pseudo-label share " << share / share.sum().clamp_min(1.0) << "\n";
      recent_losses.clear();
      mask_rate = 0.0;
    }
    if ((step + 1) % cfg.eval_every == 0)
      std::cout << "  ema top-1 " << evaluate(ema.shadow, test_norm, test_y, device, 512) << "\n";
  }
  torch::save(ema.shadow, "fixmatch_ema.pt");
}

int main(int argc, char** argv) {
  Config cfg;
  if (argc > 1) cfg.data_dir = argv[1];
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  train(cfg, device);
  return 0;
}
