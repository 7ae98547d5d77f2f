// BYOL / SimSiam self-supervised pretraining of a small conv encoder.
// online = encoder + projector (+ predictor); target = encoder + projector, an EMA of the
// online weights. SimSiam: no target network, the stop-gradient is a detach() of the projection.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct ByolConfig {
  int64_t in_channels = 3;
  int64_t width = 32;
  int64_t proj_hidden = 1024;
  int64_t proj_dim = 256;
  int64_t crop = 64;
  int64_t batch_size = 256;
  int64_t epochs = 100;
  int64_t log_every = 50;
  double base_tau = 0.996;
  double lr = 3e-4;
  double jitter = 0.4;
  bool simsiam = false;  // drop the target network, stop-grad only
};

// Projector / predictor: Linear -> BN -> ReLU -> Linear.
struct MLPHeadImpl : torch::nn::Module {
  MLPHeadImpl(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        bn1(register_module("bn1", torch::nn::BatchNorm1d(hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, out))) {
    torch::nn::init::normal_(fc2->weight, 0.0, 0.01); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
  }

  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(bn1(fc1(x)))); }

  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn1;
  torch::nn::Linear fc2;
};
TORCH_MODULE(MLPHead);

struct EncoderImpl : torch::nn::Module {
  EncoderImpl(int64_t in_ch, int64_t width) : out_dim(4 * width) {
    using torch::nn::Conv2dOptions;
    stem = register_module("stem", torch::nn::Conv2d(Conv2dOptions(in_ch, width, 3).padding(1).bias(false)));
    bn0 = register_module("bn0", torch::nn::BatchNorm2d(width));
    down1 = register_module("down1", torch::nn::Conv2d(Conv2dOptions(width, 2 * width, 3).stride(2).padding(1).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(2 * width));
    down2 = register_module("down2", torch::nn::Conv2d(Conv2dOptions(2 * width, out_dim, 3).stride(2).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(out_dim));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn0(stem(x)));
    x = torch::relu(bn1(down1(x)));
    x = torch::relu(bn2(down2(x)));
    auto pooled = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1));
    // FACT: p = torch.nn.functional.adaptive_avg_pool2d(torch.randn(4, 8, 5, 5), 1); assert is_contiguous(p) and p.view(4, -1).shape == (4, 8)
    return pooled.view({pooled.size(0), -1}); // LOOKALIKE: tensor-view-non-contiguous -- the pooled map is a fresh contiguous [B, C, 1, 1]
  }

  int64_t out_dim;
  torch::nn::Conv2d stem{nullptr}, down1{nullptr}, down2{nullptr};
  torch::nn::BatchNorm2d bn0{nullptr}, bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(Encoder);

struct BranchImpl : torch::nn::Module {
  explicit BranchImpl(const ByolConfig& c)
      : encoder(register_module("encoder", Encoder(c.in_channels, c.width))),
        projector(register_module("projector", MLPHead(4 * c.width, c.proj_hidden, c.proj_dim))) {}

  torch::Tensor forward(const torch::Tensor& x) { return projector(encoder(x)); }

  Encoder encoder;
  MLPHead projector;
};
TORCH_MODULE(Branch);

// Cosine features for the kNN monitor (and the SimSiam loss).
torch::Tensor l2_normalize(torch::Tensor feats) {
  auto out = feats.to(torch::kFloat); // the encoder may hand back half features under autocast
  // FACT: f = torch.randn(4, 6); o = f.to(torch.float32); o.div_(o.norm(2, 1, True)); assert shares_storage(o, f) and torch.allclose(f.norm(dim=1), torch.ones(4))
  out.div_(out.norm(2, 1, true).clamp_min(1e-6)); // EXPECT: tensor-alias-then-mutate
  return out;
}

torch::Tensor regression_loss(const torch::Tensor& p, const torch::Tensor& z) {
  auto pn = F::normalize(p, F::NormalizeFuncOptions().dim(1));
  auto zn = F::normalize(z, F::NormalizeFuncOptions().dim(1));
  return 2.0 - 2.0 * (pn * zn).sum(1).mean();
}

struct ByolImpl : torch::nn::Module {
  explicit ByolImpl(const ByolConfig& c)
      : cfg(c),
        online(register_module("online", Branch(c))),
        target(register_module("target", Branch(c))),
        predictor(register_module("predictor", MLPHead(c.proj_dim, c.proj_hidden, c.proj_dim))) {
    hard_sync_target();
  }

  // Start the target from the online weights.
  void hard_sync_target() {
    auto tp = target->parameters();
    auto op = online->parameters();
    for (size_t i = 0; i < tp.size(); ++i)
      tp[i].copy_(op[i]); // EXPECT: tensor-inplace-on-leaf
  }

  void update_target(double tau) {
    torch::NoGradGuard no_grad;
    auto tp = target->parameters();
    auto op = online->parameters();
    for (size_t i = 0; i < tp.size(); ++i)
      tp[i].mul_(tau).add_(op[i], 1.0 - tau); // LOOKALIKE: tensor-inplace-on-leaf -- EMA step under NoGradGuard
    auto tb = target->buffers();
    auto ob = online->buffers();
    for (size_t i = 0; i < tb.size(); ++i) tb[i].copy_(ob[i]);
  }

  torch::Tensor embed(const torch::Tensor& x) { return online->encoder(x); }
  torch::Tensor loss(const torch::Tensor& x1, const torch::Tensor& x2) {
    auto z1 = online(x1);
    auto z2 = online(x2);
    auto p1 = predictor(z1);
    if (cfg.simsiam) {
      // Negative cosine with stop-gradient on the projections (Chen & He, 2021).
      p1.div_(p1.norm(2, 1, true).clamp_min(1e-6)); // EXPECT: tensor-inplace-on-saved
      auto t1 = z1.detach();
      t1 = t1 / t1.norm(2, 1, true).clamp_min(1e-6); // LOOKALIKE: tensor-inplace-on-detached -- out-of-place, t1 is rebound
      auto t2 = z2.detach();
      t2.div_(t2.norm(2, 1, true).clamp_min(1e-6)); // EXPECT: tensor-inplace-on-detached
      auto p2 = F::normalize(predictor(z2), F::NormalizeFuncOptions().dim(1));
      return -0.5 * ((p1 * t2).sum(1).mean() + (p2 * t1).sum(1).mean());
    }
    auto p2 = predictor(z2);
    torch::Tensor t1, t2;
    {
      torch::NoGradGuard no_grad;
      t1 = target(x1), t2 = target(x2);
    }
    return regression_loss(p1, t2) + regression_loss(p2, t1);
  }

  ByolConfig cfg;
  Branch online, target;
  MLPHead predictor;
};
TORCH_MODULE(Byol);

class TwoViewAugment {
 public:
  explicit TwoViewAugment(const ByolConfig& cfg) : cfg_(cfg), gen_(1234) {
    luma_ = torch::tensor({0.299f, 0.587f, 0.114f});
  }

  std::pair<torch::Tensor, torch::Tensor> operator()(const torch::Tensor& images) {
    auto v1 = color_jitter(random_resized_crop(images), cfg_.jitter);
    auto v2 = cutout(color_jitter(random_resized_crop(images), 0.5 * cfg_.jitter));
    return {v1, v2};
  }

 private:
  torch::Tensor random_resized_crop(const torch::Tensor& img) {
    const int64_t H = img.size(2), W = img.size(3);
    std::uniform_real_distribution<double> area(0.25, 1.0);
    const double s = std::sqrt(area(gen_));
    const int64_t h = std::max<int64_t>(8, static_cast<int64_t>(H * s));
    const int64_t w = std::max<int64_t>(8, static_cast<int64_t>(W * s));
    const int64_t y0 = std::uniform_int_distribution<int64_t>(0, H - h)(gen_);
    const int64_t x0 = std::uniform_int_distribution<int64_t>(0, W - w)(gen_);
    auto patch = img.slice(2, y0, y0 + h).slice(3, x0, x0 + w);
    return F::interpolate(patch, F::InterpolateFuncOptions()
                                     .size(std::vector<int64_t>{cfg_.crop, cfg_.crop})
                                     .mode(torch::kBilinear)
                                     .align_corners(false));
  }

  torch::Tensor color_jitter(const torch::Tensor& img, double strength) {
    std::uniform_real_distribution<double> u(1.0 - strength, 1.0 + strength);
    const int64_t B = img.size(0), C = img.size(1), H = img.size(2), W = img.size(3);
    auto bright = img * u(gen_);
    // Saturation: blend each pixel with its luma, channels-last.
    // FACT: x = torch.randn(2, 3, 5, 6); assert is_view_of(x.permute(0, 2, 3, 1).reshape(2, 30, 3), x)
    auto pix = bright.permute({0, 2, 3, 1}).reshape({B, H * W, C}); // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent: a view
    auto gray = torch::matmul(pix, luma_).unsqueeze(-1);
    const double sat = u(gen_);
    auto mixed = pix * sat + gray * (1.0 - sat);
    // FACT: m = torch.randn(2, 30, 3); assert is_view_of(m.view(2, 5, 6, 3), m)
    auto chw = mixed.view({B, H, W, C}).permute({0, 3, 1, 2}); // LOOKALIKE: tensor-view-non-contiguous -- mixed is a fresh contiguous result
    // Contrast around the per-image mean.
    // FACT: x = torch.randn(2, 3, 5, 6); p = x.permute(0, 2, 3, 1).reshape(2, 30, 3); m = p * 0.5 + p.sum(-1, keepdim=True); c = m.view(2, 5, 6, 3).permute(0, 3, 1, 2); assert is_view_of(c.reshape(2, -1), m)
    auto flat = chw.reshape({B, -1}); // LOOKALIKE: tensor-reshape-non-contiguous -- the blend keeps pix's channel-first strides, so chw is contiguous again: a view
    auto mean = flat.mean(1).view({B, 1, 1, 1});
    const double con = u(gen_);
    return ((chw - mean) * con + mean).clamp(0.0, 1.0);
  }

  torch::Tensor cutout(const torch::Tensor& img) {
    const int64_t H = img.size(2), W = img.size(3);
    const int64_t side = H / 4;
    const int64_t y0 = std::uniform_int_distribution<int64_t>(0, H - side)(gen_);
    const int64_t x0 = std::uniform_int_distribution<int64_t>(0, W - side)(gen_);
    auto out = img.clone(); // LOOKALIKE: tensor-unnecessary-clone -- written through a view and returned
    out.slice(2, y0, y0 + side).slice(3, x0, x0 + side).zero_();
    return out;
  }

  ByolConfig cfg_;
  std::mt19937 gen_;
  torch::Tensor luma_;
};

// Frozen-encoder features of a labelled set, for the kNN monitor.
torch::Tensor build_bank(Byol& model, const std::vector<torch::Tensor>& batches) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> feats;
  for (const auto& x : batches)
    feats.push_back(model->embed(x)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
  return l2_normalize(torch::cat(feats));
}

double knn_top1(Byol& model, const torch::Tensor& bank, const torch::Tensor& bank_labels,
                const std::vector<std::pair<torch::Tensor, torch::Tensor>>& val, int64_t k,
                int64_t num_classes) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0, total = 0;
  for (const auto& item : val) {
    const auto& y = item.second;
    auto q = l2_normalize(model->embed(item.first));
    auto keys = bank.clone(); // EXPECT: tensor-clone-in-loop
    auto sim = torch::mm(q, keys.t());
    torch::Tensor top_sim, top_idx;
    std::tie(top_sim, top_idx) = sim.topk(k, 1);
    // FACT: i = torch.randn(4, 10).topk(3, 1)[1]; assert is_contiguous(i) and is_view_of(i.view(-1), i)
    auto nb = bank_labels.index_select(0, top_idx.view(-1)).view({q.size(0), k}); // LOOKALIKE: tensor-view-non-contiguous -- topk indices and index_select results are contiguous
    auto votes = torch::zeros({q.size(0), num_classes}).scatter_add_(1, nb, (top_sim / 0.07).exp());
    correct += (votes.argmax(1) == y).sum().item<int64_t>();
    total += y.size(0);
  }
  model->train();
  return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}

// Both views' embeddings side by side, [B, 2 * D], for offline analysis.
torch::Tensor paired_embeddings(Byol& model, const torch::Tensor& x1, const torch::Tensor& x2) {
  torch::NoGradGuard no_grad;
  auto z1 = model->embed(x1);
  auto z2 = model->embed(x2);
  // FACT: z = torch.randn(2, 4, 6); assert raises(lambda: z.transpose(0, 1).view(4, -1), "view size is not compatible")
  return torch::stack({z1, z2}).transpose(0, 1).view({z1.size(0), -1}); // EXPECT: tensor-view-non-contiguous
}

void pretrain(const ByolConfig& cfg, const torch::Tensor& images) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Byol model(cfg);
  model->to(device);

  std::vector<torch::Tensor> params = model->online->parameters();
  for (auto& p : model->predictor->parameters())
    params.push_back(p); // LOOKALIKE: tensor-graph-kept-across-iterations -- parameters are leaves, no graph
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(cfg.lr).weight_decay(1e-6));
  TwoViewAugment augment(cfg);

  const int64_t N = images.size(0);
  const int64_t total_steps = cfg.epochs * (N / cfg.batch_size);
  std::vector<torch::Tensor> curve;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(N);
    for (int64_t s = 0; s + cfg.batch_size <= N; s += cfg.batch_size) {
      auto batch = images.index_select(0, perm.narrow(0, s, cfg.batch_size));
      auto views = augment(batch);
      auto x1 = views.first.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto x2 = views.second.to(device);

      auto loss = model->loss(x1, x2);
      opt.zero_grad();
      loss.backward();
      opt.step();

      const double progress = static_cast<double>(step) / static_cast<double>(total_steps);
      const double tau = 1.0 - (1.0 - cfg.base_tau) * (std::cos(M_PI * progress) + 1.0) / 2.0;
      if (!cfg.simsiam) model->update_target(tau);

      curve.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations
      if (step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>() << '\n'; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      ++step;
    }
  }
  std::cout << "mean loss " << torch::stack(curve).mean().item<double>() << '\n';
  torch::save(model, "byol_encoder.pt");
}
