// MoCo v2 (He et al. 2020; Chen et al. 2020) self-supervised pretraining on CIFAR-sized images.
// A query encoder is trained with InfoNCE against one positive key (a second augmented view through
// the momentum key encoder) and a queue of K negative keys from earlier batches; the key encoder is
// an exponential moving average of the query encoder. Progress is monitored with a weighted k-NN
// classifier on the frozen features, and the final backbone is scored with the linear protocol.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct MocoConfig {
  int64_t feat_dim = 128, hidden = 2048, queue_size = 65536, batch = 256, epochs = 800;
  int64_t knn_k = 200, knn_every = 10, num_classes = 10, log_every = 50, workers = 8;
  double momentum = 0.99, temperature = 0.1, lr = 0.06, weight_decay = 5e-4, knn_t = 0.1;
  double crop_min = 0.2, blur_p = 0.5, jitter = 0.4;
  double probe_lr = 30.0;
  int64_t probe_epochs = 100;
};

void conv_bn(nn::Sequential &seq, int64_t in, int64_t out, int64_t stride) {
  seq->push_back(nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
  seq->push_back(nn::BatchNorm2d(out));
  seq->push_back(nn::ReLU(nn::ReLUOptions(true)));
}

// Backbone plus the MoCo v2 two-layer projection head.
struct EncoderImpl : nn::Module {
  explicit EncoderImpl(const MocoConfig &cfg) {
    nn::Sequential stages;
    conv_bn(stages, 3, 64, 1);
    conv_bn(stages, 64, 128, 2);
    conv_bn(stages, 128, 256, 2);
    conv_bn(stages, 256, 512, 2);
    backbone = register_module("backbone", stages);
    fc1 = register_module("fc1", nn::Linear(512, cfg.hidden));
    fc2 = register_module("fc2", nn::Linear(cfg.hidden, cfg.feat_dim));
  }
  int64_t out_dim() const { return 512; }

  // Pooled backbone features [B, 512]: what the k-NN monitor and the linear probe read.
  torch::Tensor features(const torch::Tensor &x) {
    auto h = F::adaptive_avg_pool2d(backbone->forward(x), F::AdaptiveAvgPool2dFuncOptions(1));
    // FACT: h = torch.nn.functional.adaptive_avg_pool2d(torch.nn.Conv2d(3, 8, 3)(torch.randn(2, 3, 6, 6)), 1); assert is_contiguous(h) and is_view_of(h.flatten(1), h)
    return h.flatten(1); // LOOKALIKE: tensor-reshape-non-contiguous -- the pooled map is contiguous: flatten is a view
  }
  torch::Tensor forward(const torch::Tensor &x) { return fc2(torch::relu(fc1(features(x)))); }

  nn::Sequential backbone{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Encoder);

struct MocoImpl : nn::Module {
  explicit MocoImpl(const MocoConfig &cfg) : cfg_(cfg) {
    encoder_q = register_module("encoder_q", Encoder(cfg));
    encoder_k = register_module("encoder_k", Encoder(cfg));
    auto pq = encoder_q->parameters();
    auto pk = encoder_k->parameters();
    for (size_t i = 0; i < pq.size(); ++i) {
      pk[i].data().copy_(pq[i].data()); // LOOKALIKE: tensor-inplace-on-detached, tensor-inplace-on-leaf -- the key encoder starts as a copy of the query encoder: writing its weights is the point
      pk[i].set_requires_grad(false);   // updated by momentum only
    }
    queue_ = register_buffer("queue", F::normalize(torch::randn({cfg.feat_dim, cfg.queue_size}), F::NormalizeFuncOptions().dim(0)));
    queue_ptr_ = register_buffer("queue_ptr", torch::zeros({1}, torch::kLong));
    collapse_std_ = torch::zeros({});
  }

  void momentum_update() {
    torch::NoGradGuard no_grad;
    auto pq = encoder_q->parameters();
    auto pk = encoder_k->parameters();
    const double m = cfg_.momentum;
    for (size_t i = 0; i < pq.size(); ++i)
      pk[i].mul_(m).add_(pq[i], 1.0 - m); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard, and the key encoder does not require grad
  }

  // Replace the oldest B keys of the ring buffer.
  void dequeue_and_enqueue(const torch::Tensor &keys) {
    torch::NoGradGuard no_grad;
    const auto B = keys.size(0), K = queue_.size(1);
    const auto ptr = queue_ptr_.item<int64_t>();
    TORCH_CHECK(K % B == 0, "queue size must be a multiple of the batch size");
    // FACT: q = torch.zeros(4, 8); k = torch.nn.functional.normalize(torch.randn(2, 4), dim=1); q.narrow(1, 2, 2).copy_(k.t()); assert q.dtype == k.dtype and torch.equal(q[:, 2:4], k.t())
    queue_.narrow(1, ptr, B).copy_(keys.t()); // LOOKALIKE: tensor-copy-narrowing -- the keys are float32 like the queue
    queue_ptr_[0] = (ptr + B) % K;
  }

  // InfoNCE logits [B, 1 + K]; column 0 is the positive key.
  torch::Tensor forward(const torch::Tensor &im_q, const torch::Tensor &im_k) {
    auto q = F::normalize(encoder_q->forward(im_q), F::NormalizeFuncOptions().dim(1));
    {
      // Collapse monitor (as in SimSiam): per-dimension std of the normalised queries.
      auto z = q.detach();
      // FACT: q = torch.nn.functional.normalize(torch.nn.Linear(4, 3)(torch.randn(5, 4)), dim=1); z = q.detach(); before = q.clone(); z -= z.mean(0); assert shares_storage(z, q) and not torch.equal(before, q)
      z -= z.mean(0); // EXPECT: tensor-inplace-on-detached -- centres q itself: the positive and negative logits below are computed from the centred queries
      collapse_std_ = z.pow(2).mean(0).sqrt().mean();
    }
    torch::Tensor k;
    {
      torch::NoGradGuard no_grad;
      momentum_update();
      k = F::normalize(encoder_k->forward(im_k), F::NormalizeFuncOptions().dim(1));
    }
    auto l_pos = (q * k).sum(1, /*keepdim=*/true);
    // FACT: q = torch.nn.Linear(4, 3)(torch.randn(2, 4)); queue = torch.randn(3, 6); l = torch.mm(q, queue); queue[:, 0:2].copy_(torch.randn(3, 2)); assert backward_fails(lambda: l.sum().backward())
    auto negatives = queue_.clone().detach(); // LOOKALIKE: tensor-unnecessary-clone -- mm saves the queue for q's gradient and the enqueue below overwrites it before backward
    auto l_neg = torch::mm(q, negatives);
    auto logits = torch::cat({l_pos, l_neg}, 1);
    // FACT: a = torch.randn(3, 1); b = torch.randn(3, 5); c = torch.cat([a, b], 1); c /= 0.1; assert is_copy_of(c, a) and is_copy_of(c, b)
    logits /= cfg_.temperature; // LOOKALIKE: tensor-alias-then-mutate -- cat made a tensor of its own
    dequeue_and_enqueue(k);
    return logits;
  }

  const torch::Tensor &collapse_std() const { return collapse_std_; }

  MocoConfig cfg_;
  Encoder encoder_q{nullptr}, encoder_k{nullptr};
  torch::Tensor queue_, queue_ptr_, collapse_std_;
};
TORCH_MODULE(Moco);

double uniform(double lo, double hi) { return lo + (hi - lo) * torch::rand({1}).item<double>(); }

torch::Tensor random_resized_crop(const torch::Tensor &img, double smin) {
  const auto H = img.size(1), W = img.size(2);
  const double area = static_cast<double>(H * W) * uniform(smin, 1.0), ratio = std::exp(uniform(std::log(0.75), std::log(4.0 / 3.0)));
  const auto h = std::clamp<int64_t>(std::llround(std::sqrt(area / ratio)), 1, H);
  const auto w = std::clamp<int64_t>(std::llround(std::sqrt(area * ratio)), 1, W);
  const auto top = static_cast<int64_t>(uniform(0, static_cast<double>(H - h + 1)));
  const auto left = static_cast<int64_t>(uniform(0, static_cast<double>(W - w + 1)));
  auto crop = img.narrow(1, top, h).narrow(2, left, w).unsqueeze(0);
  return F::interpolate(crop, F::InterpolateFuncOptions().size(std::vector<int64_t>{H, W}).mode(torch::kBilinear).align_corners(false)).squeeze(0);
}

// Separable Gaussian blur of a [3, H, W] image.
torch::Tensor gaussian_blur(const torch::Tensor &img, double sigma) {
  const int64_t r = 1;
  auto xs = torch::arange(-r, r + 1, img.options());
  auto k = torch::exp(-xs.pow(2) / (2 * sigma * sigma));
  k = k / k.sum();
  auto x = img.unsqueeze(0);
  x = F::conv2d(F::pad(x, F::PadFuncOptions({r, r, 0, 0}).mode(torch::kReflect)), k.view({1, 1, 1, -1}).repeat({3, 1, 1, 1}), F::Conv2dFuncOptions().groups(3));
  x = F::conv2d(F::pad(x, F::PadFuncOptions({0, 0, r, r}).mode(torch::kReflect)), k.view({1, 1, -1, 1}).repeat({3, 1, 1, 1}), F::Conv2dFuncOptions().groups(3));
  return x.squeeze(0);
}

// Images decoded once into memory: images [N, 3, H, W] in [0, 1], labels [N] (labels only for monitoring).
class TwoCropImages : public torch::data::datasets::Dataset<TwoCropImages> {
public:
  TwoCropImages(torch::Tensor images, torch::Tensor labels, const MocoConfig &cfg)
      : images_(std::move(images)), labels_(std::move(labels)), cfg_(cfg) {
    mean_ = torch::tensor({0.4914f, 0.4822f, 0.4465f}).view({3, 1, 1});
    std_ = torch::tensor({0.2470f, 0.2435f, 0.2616f}).view({3, 1, 1});
  }

  torch::Tensor augment(const torch::Tensor &img) const {
    auto v = random_resized_crop(img, cfg_.crop_min);
    // FACT: x = torch.rand(3, 8, 8); v = torch.nn.functional.interpolate(x[:, 1:5, 2:7].unsqueeze(0), size=(8, 8), mode='bilinear', align_corners=False).squeeze(0); v.mul_(1.3); assert is_copy_of(v, x)
    v.mul_(uniform(1.0 - cfg_.jitter, 1.0 + cfg_.jitter)); // LOOKALIKE: tensor-alias-then-mutate -- interpolate's output is a new tensor, not a view of the image
    if (uniform(0, 1) < cfg_.blur_p)
      v = gaussian_blur(v, uniform(0.1, 2.0));
    if (uniform(0, 1) < 0.5)
      v = v.flip({2});
    return v;
  }

  torch::data::Example<> get(size_t index) override {
    auto img = images_[static_cast<int64_t>(index)].to(torch::kFloat);
    // FACT: d = torch.rand(4, 3, 8, 8); v = d[1].to(torch.float32); v.sub_(torch.full((3, 1, 1), 0.5)).div_(torch.full((3, 1, 1), 0.25)); assert shares_storage(v, d) and d[1].min() < 0
    img.sub_(mean_).div_(std_); // EXPECT: tensor-alias-then-mutate -- the images are already float: to(kFloat) returns a view into images_, so every epoch normalises the stored images again
    return {torch::stack({augment(img), augment(img)}), labels_[static_cast<int64_t>(index)]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(images_.size(0)); }

private:
  torch::Tensor images_, labels_, mean_, std_;
  MocoConfig cfg_;
};

// Weighted k-NN (Wu et al. 2018) on the frozen backbone features; returns top-1 accuracy.
double knn_accuracy(Encoder &enc, const torch::Tensor &train_x, const torch::Tensor &train_y, const torch::Tensor &test_x,
                    const torch::Tensor &test_y, const MocoConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  enc->eval();
  const int64_t bs = 512, N = train_x.size(0), M = test_x.size(0), C = cfg.num_classes;
  std::vector<torch::Tensor> bank_parts;
  for (int64_t i = 0; i < N; i += bs) {
    auto x = train_x.narrow(0, i, std::min(bs, N - i)).to(device);
    bank_parts.push_back(F::normalize(enc->features(x), F::NormalizeFuncOptions().dim(1))); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph is recorded
  }
  auto bank = torch::cat(bank_parts).t().contiguous(); // [D, N]
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t i = 0; i < M; i += bs) {
    const auto b = std::min(bs, M - i);
    auto f = F::normalize(enc->features(test_x.narrow(0, i, b).to(device)), F::NormalizeFuncOptions().dim(1));
    auto y = test_y.narrow(0, i, b).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different slice of the test labels every iteration
    auto topk = torch::mm(f, bank).topk(cfg.knn_k, -1);
    auto bank_labels = train_y.to(device); // EXPECT: tensor-clone-in-loop -- the same training labels are copied to the device for every test batch
    auto nn_labels = torch::gather(bank_labels.expand({b, -1}), -1, std::get<1>(topk));
    auto weights = (std::get<0>(topk) / cfg.knn_t).exp();
    auto one_hot = torch::zeros({b * cfg.knn_k, C}, f.options()); // LOOKALIKE: tensor-device-mismatch -- made with f's options: on f's device
    // FACT: g = torch.gather(torch.arange(10).expand(3, -1), -1, torch.randint(0, 10, (3, 4))); assert is_contiguous(g) and is_view_of(g.view(-1, 1), g)
    one_hot.scatter_(1, nn_labels.view({-1, 1}), 1.0); // LOOKALIKE: tensor-view-non-contiguous -- gather's output is contiguous
    auto scores = (one_hot.view({b, cfg.knn_k, C}) * weights.unsqueeze(-1)).sum(1);
    correct += (scores.argmax(1) == y).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- comparison counts under NoGradGuard
  }
  enc->train();
  return correct.item<double>() / static_cast<double>(M);
}

void pretrain(Moco &model, const torch::Tensor &images, const torch::Tensor &labels, const torch::Tensor &test_x,
              const torch::Tensor &test_y, const MocoConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  auto loader = torch::data::make_data_loader(TwoCropImages(images, labels, cfg).map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions().batch_size(cfg.batch).workers(cfg.workers).drop_last(true));
  torch::optim::SGD opt(model->encoder_q->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(cfg.weight_decay));
  std::vector<torch::Tensor> pos_sim;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    const double lr = cfg.lr * 0.5 * (1.0 + std::cos(M_PI * static_cast<double>(epoch) / static_cast<double>(cfg.epochs)));
    for (auto &group : opt.param_groups())
      static_cast<torch::optim::SGDOptions &>(group.options()).lr(lr);
    double running = 0;
    int64_t batches = 0;
    for (auto &batch : *loader) {
      auto im_q = batch.data.select(1, 0).to(device);
      auto im_k = batch.data.select(1, 1).to(device);
      auto logits = model->forward(im_q, im_k);
      auto targets = torch::zeros({logits.size(0)}, torch::kLong);
      auto loss = F::cross_entropy(logits, targets); // EXPECT: tensor-device-mismatch -- the logits are on the GPU, the all-zero targets were made on the host
      opt.zero_grad();
      loss.backward();
      opt.step();
      pos_sim.push_back(logits.select(1, 0).mean() * cfg.temperature); // EXPECT: tensor-graph-kept-across-iterations -- the mean positive similarity still carries the step's graph until the epoch ends
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step only to average the loss
      ++batches;
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " collapse std " << model->collapse_std().item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    const double mean_pos = torch::stack(pos_sim).mean().item<double>();
    pos_sim.clear();
    std::cout << "epoch " << epoch << " loss " << running / std::max<int64_t>(batches, 1) << " pos sim " << mean_pos << "\n";
    if ((epoch + 1) % cfg.knn_every == 0)
      std::cout << "  knn top-1 " << knn_accuracy(model->encoder_q, images, labels, test_x, test_y, cfg, device) << "\n";
  }
}

// Linear evaluation: the backbone is frozen, a fresh classifier is trained on its pooled features.
double linear_probe(Encoder &enc, const torch::Tensor &train_x, const torch::Tensor &train_y, const torch::Tensor &test_x,
                    const torch::Tensor &test_y, const MocoConfig &cfg, torch::Device device) {
  for (auto &p : enc->parameters())
    p.set_requires_grad(false);
  enc->eval();
  nn::Linear probe(enc->out_dim(), cfg.num_classes);
  // FACT: fc = torch.nn.Linear(8, 3); assert raises(lambda: fc.weight.normal_(0.0, 0.01), "a leaf Variable that requires grad")
  probe->weight.normal_(0.0, 0.01); // EXPECT: tensor-inplace-on-leaf -- the reference code writes weight.data; the parameter itself requires grad: this throws
  // FACT: fc = torch.nn.Linear(8, 3); fc.bias.data.zero_(); assert fc.bias.is_leaf and torch.count_nonzero(fc.bias) == 0
  probe->bias.data().zero_(); // LOOKALIKE: tensor-inplace-on-detached, tensor-inplace-on-leaf -- the init idiom: data() is written on purpose, before anything uses the bias
  probe->to(device);
  torch::optim::SGD opt(probe->parameters(), torch::optim::SGDOptions(cfg.probe_lr).momentum(0.9));
  const auto N = train_x.size(0), M = test_x.size(0);
  for (int64_t epoch = 0; epoch < cfg.probe_epochs; ++epoch) {
    auto perm = torch::randperm(N);
    for (int64_t i = 0; i + cfg.batch <= N; i += cfg.batch) {
      auto idx = perm.narrow(0, i, cfg.batch);
      auto x = train_x.index_select(0, idx).to(device);
      auto y = train_y.index_select(0, idx).to(device);
      torch::Tensor feats;
      {
        torch::NoGradGuard no_grad;
        feats = enc->features(x);
      }
      auto loss = F::cross_entropy(probe(feats), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> preds;
  for (int64_t i = 0; i < M; i += cfg.batch) {
    const auto b = std::min(cfg.batch, M - i);
    preds.push_back(probe(enc->features(test_x.narrow(0, i, b).to(device))).argmax(1).cpu()); // LOOKALIKE: tensor-sync-in-loop -- the host predictions are kept, and scored once after the loop
  }
  return (torch::cat(preds) == test_y).to(torch::kDouble).mean().item<double>();
}
