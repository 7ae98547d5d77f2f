// SimSiam pretraining on a CIFAR-sized image tensor: two augmented views, projector
// and predictor heads, stop-gradient on the target branch, kNN monitor on a feature bank.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct SimSiamConfig {
  int64_t feat_dim = 512;
  int64_t proj_dim = 2048;
  int64_t pred_hidden = 512;
  int64_t batch = 256;
  int64_t epochs = 200;
  double lr = 0.06;
  double weight_decay = 5e-4;
  int64_t knn_k = 200;
  double knn_t = 0.1;
  int64_t num_classes = 10;
  int64_t log_every = 50;
  double jitter = 0.4;
  double p_gray = 0.2;
};

// Channel mean/std of the uint8 NHWC training images.
static std::pair<torch::Tensor, torch::Tensor> channel_stats(const torch::Tensor& images_nhwc) {
  // FACT: x = torch.zeros(2, 8, 8, 3, dtype=torch.uint8).permute(0, 3, 1, 2); assert not is_contiguous(x) and is_view_of(x.flatten(2), x)
  auto x = images_nhwc.permute({0, 3, 1, 2}).flatten(2);  // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent after the permute, so flatten is a view
  // FACT: x = torch.zeros(2, 3, 64, dtype=torch.uint8); assert is_copy_of(x.to(torch.float), x)
  auto xf = x.to(torch::kFloat).div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 to float conversion allocates, the images stay intact
  const std::vector<int64_t> dims{0, 2};
  return {xf.mean(dims), xf.std(dims, /*unbiased=*/true, /*keepdim=*/false)};
}

struct Augment {
  Augment(const torch::Tensor& mean, const torch::Tensor& sd, const SimSiamConfig& c, torch::Device dev)
      : mean_(mean.view({1, 3, 1, 1}).to(dev)), std_(sd.view({1, 3, 1, 1}).to(dev)),
        luma_(torch::tensor({0.299f, 0.587f, 0.114f}).view({1, 3, 1, 1}).to(dev)),
        jitter(c.jitter), p_gray(c.p_gray) {}

  torch::Tensor operator()(const torch::Tensor& batch) const {
    const auto n = batch.size(0), h = batch.size(2), w = batch.size(3);
    // FACT: b = torch.rand(2, 3, 4, 4); before = b.clone(); x = b; x.mul_(1.3); assert shares_storage(x, b) and not torch.equal(b, before)
    auto x = batch;
    auto bright = torch::empty({n, 1, 1, 1}, x.options()).uniform_(1.0 - jitter, 1.0 + jitter);
    x.mul_(bright).clamp_(0.0, 1.0);  // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-device-mismatch -- bright is drawn with x's options

    const auto area = torch::empty({1}).uniform_(0.2, 1.0).item<double>();
    const auto ch = std::max<int64_t>(8, static_cast<int64_t>(h * std::sqrt(area)));
    const auto cw = std::max<int64_t>(8, static_cast<int64_t>(w * std::sqrt(area)));
    const auto y0 = torch::randint(0, h - ch + 1, {1}).item<int64_t>();
    const auto x0 = torch::randint(0, w - cw + 1, {1}).item<int64_t>();
    auto crop = x.narrow(2, y0, ch).narrow(3, x0, cw);

    auto contrast = torch::empty({n, 1, 1, 1}).uniform_(1.0 - jitter, 1.0 + jitter);
    // FACT: p = torch.randn(2, 3, 12, 12); c = p.narrow(2, 1, 8).narrow(3, 2, 8); assert not is_contiguous(c) and is_copy_of(c.reshape(2, -1), c)
    auto m = crop.reshape({n, -1}).mean(1).view({n, 1, 1, 1});  // EXPECT: tensor-reshape-non-contiguous
    auto y = (crop - m) * contrast + m;  // EXPECT: tensor-device-mismatch
    y = F::interpolate(y, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{h, w})
                              .mode(torch::kBilinear)
                              .align_corners(false));

    // FACT: g = torch.rand(2, 1, 4, 4).expand(-1, 3, -1, -1); assert raises(lambda: g.clamp_(0.0, 1.0), "more than one element")
    auto gray = (y * luma_).sum(1, true).expand_as(y);
    gray.clamp_(0.0, 1.0);  // EXPECT: tensor-inplace-on-expanded
    y = torch::where(torch::rand({n, 1, 1, 1}, y.options()) < p_gray, gray, y);
    y = torch::where(torch::rand({n, 1, 1, 1}, y.options()) < 0.5, y.flip({3}), y);
    // FACT: y = torch.rand(2, 3, 4, 4); m = torch.rand(1, 3, 1, 1).expand_as(y); assert not raises(lambda: y.sub_(m))
    return y.sub_(mean_.expand_as(y)).div_(std_.expand_as(y));  // LOOKALIKE: tensor-inplace-on-expanded -- y is dense, only the operands are expanded
  }

  torch::Tensor mean_, std_, luma_;
  double jitter, p_gray;
};

struct BackboneImpl : torch::nn::Module {
  explicit BackboneImpl(int64_t out_dim) {
    const int64_t widths[] = {64, 128, 256, out_dim};
    int64_t in = 3;
    for (int i = 0; i < 4; ++i) {
      convs.push_back(register_module("conv" + std::to_string(i),
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, widths[i], 3).stride(i == 0 ? 1 : 2).padding(1).bias(false))));
      bns.push_back(register_module("bn" + std::to_string(i), torch::nn::BatchNorm2d(widths[i])));
      in = widths[i];
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < convs.size(); ++i) x = torch::relu(bns[i](convs[i](x)));
    return torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  }
  std::vector<torch::nn::Conv2d> convs;
  std::vector<torch::nn::BatchNorm2d> bns;
};
TORCH_MODULE(Backbone);

struct SimSiamImpl : torch::nn::Module {
  explicit SimSiamImpl(const SimSiamConfig& c) {
    backbone = register_module("backbone", Backbone(c.feat_dim));
    projector = register_module("projector", torch::nn::Sequential(
        torch::nn::Linear(torch::nn::LinearOptions(c.feat_dim, c.proj_dim).bias(false)),
        torch::nn::BatchNorm1d(c.proj_dim), torch::nn::ReLU(true),
        torch::nn::Linear(torch::nn::LinearOptions(c.proj_dim, c.proj_dim).bias(false)),
        torch::nn::BatchNorm1d(c.proj_dim), torch::nn::ReLU(true),
        torch::nn::Linear(torch::nn::LinearOptions(c.proj_dim, c.proj_dim).bias(false)),
        torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(c.proj_dim).affine(false))));
    predictor = register_module("predictor", torch::nn::Sequential(
        torch::nn::Linear(torch::nn::LinearOptions(c.proj_dim, c.pred_hidden).bias(false)),
        torch::nn::BatchNorm1d(c.pred_hidden), torch::nn::ReLU(true),
        torch::nn::Linear(c.pred_hidden, c.proj_dim)));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    auto z = projector->forward(backbone(x));
    return {z, predictor->forward(z)};
  }
  Backbone backbone{nullptr};
  torch::nn::Sequential projector{nullptr}, predictor{nullptr};
};
TORCH_MODULE(SimSiam);

// Negative cosine similarity with the stop-gradient on the target branch.
static torch::Tensor neg_cosine(const torch::Tensor& p, const torch::Tensor& z) {
  auto target = z.detach().clone();  // EXPECT: tensor-unnecessary-clone
  return -F::cosine_similarity(p, target, F::CosineSimilarityFuncOptions().dim(1)).mean();
}

// Collapse check from the paper: std of the l2-normalised output, about 1/sqrt(d) when healthy.
// FACT: lin = torch.nn.Linear(4, 4); x = torch.randn(3, 4, requires_grad=True); assert backward_fails(lambda: [(z := x * 2), (p := lin(z)), (t := z.detach()), t.div_(t.norm(2, 1, keepdim=True)), p.sum().backward()])
static double output_std(const torch::Tensor& z) {
  auto zn = z.detach();
  zn.div_(zn.norm(2, 1, true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-detached
  return zn.std(0).mean().item<double>();
}

struct FeatureBank {
  FeatureBank(int64_t n, int64_t d, torch::Device dev)
      : feats(torch::empty({n, d}, torch::TensorOptions().dtype(torch::kHalf).device(dev))),
        labels(torch::empty({n}, torch::TensorOptions().dtype(torch::kLong).device(dev))) {}

  // FACT: h = torch.empty(2, dtype=torch.half); h.copy_(torch.tensor([1.0001, 70000.0])); assert h[0].item() == 1.0 and torch.isinf(h[1])
  void add(const torch::Tensor& f, const torch::Tensor& y) {
    const auto n = f.size(0);
    feats.narrow(0, ptr, n).copy_(f);  // EXPECT: tensor-copy-narrowing
    labels.narrow(0, ptr, n).copy_(y);  // LOOKALIKE: tensor-copy-narrowing -- labels and bank are both int64
    ptr += n;
  }

  torch::Tensor feats, labels;
  int64_t ptr = 0;
};

static torch::Tensor knn_predict(const torch::Tensor& feature, const torch::Tensor& bank_t,
                                 const torch::Tensor& bank_labels, const SimSiamConfig& c) {
  const auto b = feature.size(0);
  auto sim = torch::mm(feature, bank_t);
  auto [sim_w, sim_idx] = sim.topk(c.knn_k, -1);
  auto sim_labels = torch::gather(bank_labels.expand({b, -1}), -1, sim_idx);
  auto one_hot = torch::zeros({b * c.knn_k, c.num_classes}, feature.options());
  // FACT: lab = torch.randint(0, 5, (7,)); g = torch.gather(lab.expand(3, -1), -1, torch.randint(0, 7, (3, 2))); assert is_contiguous(g) and is_view_of(g.view(-1, 1), g)
  one_hot.scatter_(-1, sim_labels.view({-1, 1}), 1.0);  // LOOKALIKE: tensor-view-non-contiguous -- gather returns a fresh contiguous tensor even from an expanded input
  auto weights = (sim_w / c.knn_t).exp();
  auto scores = (one_hot.view({b, -1, c.num_classes}) * weights.unsqueeze(-1)).sum(1);
  return scores.argmax(-1);
}

static torch::Tensor to_float_nchw(const torch::Tensor& u8_nhwc, torch::Device dev) {
  return u8_nhwc.to(dev).permute({0, 3, 1, 2}).to(torch::kFloat).div_(255.0);
}

static double knn_accuracy(SimSiam& net, const Augment& aug, const torch::Tensor& train_x, const torch::Tensor& train_y,
                           const torch::Tensor& test_x, const torch::Tensor& test_y, const SimSiamConfig& c,
                           torch::Device dev) {
  torch::NoGradGuard no_grad;
  net->eval();
  FeatureBank bank(train_x.size(0), c.feat_dim, dev);
  auto normalize = [&](const torch::Tensor& imgs) {
    return imgs.sub(aug.mean_).div(aug.std_);
  };
  for (int64_t i = 0; i < train_x.size(0); i += c.batch) {
    const auto n = std::min(c.batch, train_x.size(0) - i);
    auto f = net->backbone(normalize(to_float_nchw(train_x.narrow(0, i, n), dev))).detach();
    f.div_(f.norm(2, 1, true));  // LOOKALIKE: tensor-inplace-on-detached -- computed under NoGradGuard, there is no graph to corrupt
    bank.add(f, train_y.narrow(0, i, n));
  }

  int64_t correct = 0, total = 0;
  for (int64_t i = 0; i < test_x.size(0); i += c.batch) {
    const auto n = std::min(c.batch, test_x.size(0) - i);
    auto f = F::normalize(net->backbone(normalize(to_float_nchw(test_x.narrow(0, i, n), dev))),
                          F::NormalizeFuncOptions().dim(1));
    auto bank_t = bank.feats.to(torch::kFloat).t().contiguous();  // EXPECT: tensor-clone-in-loop
    auto pred = knn_predict(f, bank_t, bank.labels, c);
    auto y = test_y.narrow(0, i, n).to(dev);
    correct += (pred == y).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    total += n;
  }
  net->train();
  return static_cast<double>(correct) / static_cast<double>(total);
}

void pretrain(const torch::Tensor& train_x, const torch::Tensor& train_y, const torch::Tensor& test_x,
              const torch::Tensor& test_y, const SimSiamConfig& c) {
  torch::Device dev(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto [mean, sd] = channel_stats(train_x);
  Augment aug(mean, sd, c, dev);
  SimSiam net(c);
  net->to(dev);

  const double base_lr = c.lr * c.batch / 256.0;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(base_lr).momentum(0.9).weight_decay(c.weight_decay));
  const int64_t steps_per_epoch = train_x.size(0) / c.batch;

  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    const double lr = base_lr * 0.5 * (1.0 + std::cos(M_PI * epoch / c.epochs));
    for (auto& group : opt.param_groups()) static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);

    auto perm = torch::randperm(train_x.size(0));
    std::vector<torch::Tensor> epoch_losses;
    auto loss_sum = torch::zeros({}, torch::TensorOptions().device(dev));
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      auto idx = perm.narrow(0, step * c.batch, c.batch);
      auto batch = train_x.index_select(0, idx).to(dev, /*non_blocking=*/true);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto images = batch.permute({0, 3, 1, 2}).to(torch::kFloat).div_(255.0);
      auto x1 = aug(images);
      auto x2 = aug(images);

      auto [z1, p1] = net->forward(x1);
      auto [z2, p2] = net->forward(x2);
      auto loss = 0.5 * (neg_cosine(p1, z2) + neg_cosine(p2, z1));
      // FACT: l = (torch.randn(3, requires_grad=True) * 2).sum(); assert kept_nodes([l]) > 0 and kept_nodes([l.detach()]) == 0
      epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      loss_sum += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, only the value is summed on the device

      if (step % c.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<double>()  // LOOKALIKE: tensor-sync-in-loop -- read only on logging steps
                  << " z-std " << output_std(z1) << "\n";

      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    auto curve = torch::stack(epoch_losses).to(torch::kCPU);
    std::cout << "epoch " << epoch << " mean loss " << (loss_sum / steps_per_epoch).item<double>()
              << " last " << curve[-1].item<double>() << "\n";
    if (epoch % 10 == 9)
      std::cout << "knn top-1 " << knn_accuracy(net, aug, train_x, train_y, test_x, test_y, c, dev) << "\n";
  }
}

int main() {
  torch::manual_seed(0);
  SimSiamConfig c;
  c.epochs = 20;
  auto train_x = torch::randint(0, 256, {4096, 32, 32, 3}, torch::kUInt8);
  auto train_y = torch::randint(0, c.num_classes, {4096});
  auto test_x = torch::randint(0, 256, {1024, 32, 32, 3}, torch::kUInt8);
  auto test_y = torch::randint(0, c.num_classes, {1024});
  pretrain(train_x, train_y, test_x, test_y, c);
  return 0;
}
