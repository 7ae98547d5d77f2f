// SwAV: online clustering with Sinkhorn-Knopp codes, swapped prediction across
// multi-crop views, an embedding queue and prototypes frozen for the first iterations.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct SwAVConfig {
  int64_t feat_dim = 128;
  int64_t hidden = 512;
  int64_t n_prototypes = 300;
  int64_t batch = 64;
  int64_t n_global = 2;
  int64_t global_size = 32;
  int64_t local_grid = 2;
  std::vector<int64_t> crops_for_assign{0, 1};
  double temperature = 0.1;
  double epsilon = 0.05;
  int sinkhorn_iters = 3;
  int64_t queue_length = 1920;
  int64_t epoch_queue_starts = 5;
  int64_t freeze_prototypes_iters = 300;
  int64_t epochs = 50;
  double lr = 0.6;
};

struct SwAVNetImpl : torch::nn::Module {
  explicit SwAVNetImpl(const SwAVConfig& c) {
    encoder = register_module("encoder", torch::nn::Sequential(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 3).padding(1).bias(false)),
        torch::nn::BatchNorm2d(64), torch::nn::ReLU(true),
        torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 3).stride(2).padding(1).bias(false)),
        torch::nn::BatchNorm2d(128), torch::nn::ReLU(true),
        torch::nn::Conv2d(torch::nn::Conv2dOptions(128, 256, 3).stride(2).padding(1).bias(false)),
        torch::nn::BatchNorm2d(256), torch::nn::ReLU(true),
        torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten()));
    fc1 = register_module("fc1", torch::nn::Linear(256, c.hidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(c.hidden));
    fc2 = register_module("fc2", torch::nn::Linear(c.hidden, c.feat_dim));
    prototypes = register_module("prototypes",
        torch::nn::Linear(torch::nn::LinearOptions(c.feat_dim, c.n_prototypes).bias(false)));
  }

  // Crops of one resolution go through the encoder together.
  std::pair<torch::Tensor, torch::Tensor> forward(const std::vector<torch::Tensor>& crops) {
    std::vector<torch::Tensor> feats;
    size_t start = 0;
    while (start < crops.size()) {
      size_t end = start + 1;
      while (end < crops.size() && crops[end].size(-1) == crops[start].size(-1)) ++end;
      feats.push_back(encoder->forward(torch::cat(std::vector<torch::Tensor>(crops.begin() + start, crops.begin() + end))));
      start = end;
    }
    // FACT: x = torch.randn(4, 3, requires_grad=True); assert not backward_fails(lambda: [(b := torch.nn.functional.batch_norm(x, None, None, training=True)), b.relu_(), torch.nn.functional.linear(b, torch.randn(2, 3)).sum().backward()])
    auto h = bn(fc1(torch::cat(feats)));
    h.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- batch_norm keeps its input for backward, not its output
    auto z = F::normalize(fc2(h), F::NormalizeFuncOptions().dim(1));
    return {z, prototypes(z)};
  }

  torch::nn::Sequential encoder{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, prototypes{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(SwAVNet);

struct MultiCrop {
  explicit MultiCrop(const SwAVConfig& c)
      : cfg(c), mean_(torch::tensor({0.4914f, 0.4822f, 0.4465f}).view({1, 3, 1, 1})),
        std_(torch::tensor({0.2470f, 0.2435f, 0.2616f}).view({1, 3, 1, 1})) {}

  // Colour distortion as a random per-image mix of the RGB channels.
  static torch::Tensor colour_mix(const torch::Tensor& images, double strength) {
    const auto n = images.size(0), h = images.size(2), w = images.size(3);
    // FACT: x = torch.rand(2, 8, 8, 3).permute(0, 3, 1, 2); assert not is_contiguous(x) and is_view_of(x.permute(0, 2, 3, 1).reshape(2, -1, 3), x)
    auto pix = images.permute({0, 2, 3, 1}).reshape({n, -1, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- the batch is an NHWC buffer, so permuting back is contiguous
    auto mix = torch::eye(3, images.options()) + strength * torch::randn({n, 3, 3}, images.options());
    return torch::bmm(pix, mix).clamp(0.0, 1.0).view({n, h, w, 3}).permute({0, 3, 1, 2});
  }

  static torch::Tensor random_resized_crop(const torch::Tensor& x, int64_t out, double min_scale) {
    const auto h = x.size(2), w = x.size(3);
    const auto area = torch::empty({1}).uniform_(min_scale, 1.0).item<double>();
    const auto side = std::max<int64_t>(4, static_cast<int64_t>(std::sqrt(area) * std::min(h, w)));
    const auto y0 = torch::randint(0, h - side + 1, {1}).item<int64_t>();
    const auto x0 = torch::randint(0, w - side + 1, {1}).item<int64_t>();
    auto crop = x.narrow(2, y0, side).narrow(3, x0, side);
    crop = torch::where(torch::rand({x.size(0), 1, 1, 1}, x.options()) < 0.5, crop.flip({3}), crop);
    return F::interpolate(crop, F::InterpolateFuncOptions()
                                    .size(std::vector<int64_t>{out, out})
                                    .mode(torch::kBilinear)
                                    .align_corners(false));
  }

  std::vector<torch::Tensor> operator()(const torch::Tensor& images) const {
    auto x = colour_mix(images, 0.2);
    std::vector<torch::Tensor> crops;
    for (int64_t i = 0; i < cfg.n_global; ++i) {
      auto crop = random_resized_crop(x, cfg.global_size, 0.14);
      crops.push_back((crop - mean_.to(crop.device())) / std_.to(crop.device()));  // EXPECT: tensor-clone-in-loop
    }
    const auto s = x.size(2) / cfg.local_grid;
    // FACT: x = torch.randn(2, 8, 8, 3).permute(0, 3, 1, 2); t = x.unfold(2, 4, 4).unfold(3, 4, 4); assert not is_contiguous(t) and is_copy_of(t.permute(2, 3, 0, 1, 4, 5).reshape(4, 2, 3, 4, 4), x)
    auto tiles = x.unfold(2, s, s).unfold(3, s, s);
    auto local = tiles.permute({2, 3, 0, 1, 4, 5}).reshape({-1, x.size(0), x.size(1), s, s});  // EXPECT: tensor-reshape-non-contiguous
    auto m = mean_.to(x.device()), sd = std_.to(x.device());
    for (const auto& t : local.unbind(0)) crops.push_back((t - m) / sd);
    return crops;
  }

  SwAVConfig cfg;
  torch::Tensor mean_, std_;
};

// Equipartitioned soft codes for a batch of prototype scores.
static torch::Tensor sinkhorn(const torch::Tensor& scores, double eps, int iters) {
  torch::NoGradGuard no_grad;
  // FACT: o = torch.randn(6, 3); before = o.clone(); Q = o.narrow(0, 2, 2).detach(); Q.div_(0.05).exp_(); assert shares_storage(Q, o) and not torch.equal(o, before)
  auto Q = scores.detach();
  Q.div_(eps).exp_();  // EXPECT: tensor-inplace-on-detached
  Q = Q.t();
  const auto K = Q.size(0), B = Q.size(1);
  // FACT: Q = torch.exp(torch.randn(4, 3) / 0.05).t(); assert is_copy_of(Q.sum(), Q) and is_copy_of(Q.sum(1, keepdim=True), Q)
  Q.div_(Q.sum());  // LOOKALIKE: tensor-inplace-overlap -- the divisor is a fresh reduction, not a view of Q
  for (int it = 0; it < iters; ++it) {
    Q.div_(Q.sum(1, true)).div_(static_cast<double>(K));
    Q.div_(Q.sum(0, true)).div_(static_cast<double>(B));
  }
  return Q.mul_(static_cast<double>(B)).t();
}

struct FeatureQueue {
  FeatureQueue(int64_t n_assign, int64_t length, int64_t dim) : feats(torch::zeros({n_assign, length, dim})) {}

  bool filled(int64_t i) const { return !torch::all(feats[i][-1] == 0).item<bool>(); }

  void push(int64_t i, const torch::Tensor& emb) {
    const auto bs = emb.size(0), len = feats.size(1);
    auto q = feats[i];
    // FACT: f = torch.zeros(2, 10, 4); q = f[1]; assert is_view_of(q, f) and raises(lambda: q.narrow(0, 2, 8).copy_(q.narrow(0, 0, 8)), "some elements")
    q.narrow(0, bs, len - bs).copy_(q.narrow(0, 0, len - bs));  // EXPECT: tensor-inplace-overlap // LOOKALIKE: tensor-alias-then-mutate -- q is a row of the queue and rewriting the queue is the point
    // FACT: q = torch.zeros(4, 3); e = torch.randn(2, 3, requires_grad=True) * 2; q.narrow(0, 0, 2).copy_(e); assert q.requires_grad and kept_nodes(q) > 0
    q.narrow(0, 0, bs).copy_(emb);  // EXPECT: tensor-graph-kept-across-iterations // LOOKALIKE: tensor-copy-narrowing -- queue and embeddings are both float32
  }

  torch::Tensor feats;
};

static void normalize_prototypes(SwAVNet& net) {
  torch::NoGradGuard no_grad;
  // FACT: l = torch.nn.Linear(4, 3, bias=False); w = l.weight; assert shares_storage(w, l.weight) and raises(lambda: w.div_(2.0), "leaf Variable")
  auto w = net->prototypes->weight;
  w.div_(w.norm(2, 1, true));  // LOOKALIKE: tensor-alias-then-mutate, tensor-inplace-on-leaf -- w is the prototype weight on purpose, written under NoGradGuard
}

// Start the prototypes on real embeddings instead of random directions.
static void warm_start_prototypes(SwAVNet& net, const MultiCrop& mc, const torch::Tensor& train_u8,
                                  int64_t batches, int64_t bs, torch::Device dev) {
  std::vector<torch::Tensor> feats;
  {
    torch::NoGradGuard no_grad;
    net->eval();
    for (int64_t b = 0; b < batches; ++b) {
      auto images = train_u8.narrow(0, b * bs, bs).to(dev).to(torch::kFloat).div_(255.0).permute({0, 3, 1, 2});
      feats.push_back(net->forward({mc(images).front()}).first);  // LOOKALIKE: tensor-graph-kept-across-iterations -- collected under NoGradGuard, no graph attached
    }
    net->train();
  }
  // FACT: l = torch.nn.Linear(4, 3, bias=False); assert raises(lambda: l.weight.copy_(torch.randn(3, 4)), "leaf Variable")
  auto bank = torch::cat(feats);
  auto pick = torch::randperm(bank.size(0), torch::TensorOptions().dtype(torch::kLong).device(dev))
                  .narrow(0, 0, net->prototypes->weight.size(0));
  net->prototypes->weight.copy_(bank.index_select(0, pick));  // EXPECT: tensor-inplace-on-leaf
}

void train_swav(const torch::Tensor& train_u8, const SwAVConfig& cfg) {
  torch::Device dev(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  SwAVNet net(cfg);
  net->to(dev);
  MultiCrop multicrop(cfg);
  warm_start_prototypes(net, multicrop, train_u8, 8, cfg.batch, dev);

  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(1e-6));
  FeatureQueue queue(static_cast<int64_t>(cfg.crops_for_assign.size()), cfg.queue_length, cfg.feat_dim);
  const auto temp = torch::scalar_tensor(cfg.temperature);
  const int64_t steps = train_u8.size(0) / cfg.batch;
  const int64_t n_crops = cfg.n_global + cfg.local_grid * cfg.local_grid;
  int64_t iteration = 0;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    const bool queue_on = epoch >= cfg.epoch_queue_starts;
    bool use_queue = false;
    auto perm = torch::randperm(train_u8.size(0));
    auto epoch_assign = torch::empty({steps * cfg.batch}, torch::TensorOptions().dtype(torch::kInt).device(dev));
    auto loss_sum = torch::zeros({}, torch::TensorOptions().device(dev));
    auto usage = torch::zeros({cfg.n_prototypes}, torch::TensorOptions().device(dev));

    for (int64_t step = 0; step < steps; ++step, ++iteration) {
      normalize_prototypes(net);
      auto batch = train_u8.index_select(0, perm.narrow(0, step * cfg.batch, cfg.batch)).to(dev);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto crops = multicrop(batch.to(torch::kFloat).div_(255.0).permute({0, 3, 1, 2}));
      auto [embedding, output] = net->forward(crops);
      const auto bs = crops.front().size(0);
      const bool monitor = iteration % 100 == 0;

      auto loss = torch::zeros({}, output.options());
      for (size_t i = 0; i < cfg.crops_for_assign.size(); ++i) {
        const auto crop_id = cfg.crops_for_assign[i];
        auto out = output.narrow(0, bs * crop_id, bs);
        if (queue_on) {
          if (use_queue || queue.filled(static_cast<int64_t>(i))) {
            use_queue = true;
            out = torch::cat({torch::mm(queue.feats[i], net->prototypes->weight.t()), out});  // EXPECT: tensor-device-mismatch
          }
          queue.push(static_cast<int64_t>(i), embedding.narrow(0, bs * crop_id, bs));
        }
        auto q = sinkhorn(out, cfg.epsilon, cfg.sinkhorn_iters);
        q = q.narrow(0, q.size(0) - bs, bs);
        if (i == 0) epoch_assign.narrow(0, step * bs, bs).copy_(q.argmax(1));  // EXPECT: tensor-copy-narrowing

        auto subloss = torch::zeros({}, output.options());
        for (int64_t v = 0; v < n_crops; ++v) {
          if (v == crop_id) continue;
          // FACT: s = torch.randn(4, 3, requires_grad=True); q = torch.rand(4, 3); assert backward_fails(lambda: [(lp := torch.log_softmax(s / 0.1, 1)), (l := -(q * lp).sum(1).mean()), lp.exp_(), l.backward()])
          auto logits = output.narrow(0, bs * v, bs).clone().div_(temp);  // EXPECT: tensor-unnecessary-clone // LOOKALIKE: tensor-device-mismatch -- temp is a 0-dim CPU tensor, accepted next to CUDA operands
          auto logp = torch::log_softmax(logits, 1);
          subloss = subloss - (q * logp).sum(1).mean();
          if (monitor) usage += logp.exp_().detach().mean(0);  // EXPECT: tensor-inplace-on-saved
        }
        loss = loss + subloss / static_cast<double>(n_crops - 1);
      }
      loss = loss / static_cast<double>(cfg.crops_for_assign.size());

      opt.zero_grad();
      loss.backward();
      if (iteration < cfg.freeze_prototypes_iters) net->prototypes->weight.mutable_grad().reset();
      opt.step();
      loss_sum += loss.detach();

      if (monitor) {
        std::cout << "it " << iteration << " loss " << loss.item<double>()  // LOOKALIKE: tensor-sync-in-loop -- read only every 100 iterations
                  << " max usage " << usage.max().item<double>() << "\n";
        usage.zero_();
      }
    }
    auto used = torch::bincount(epoch_assign.to(torch::kLong), {}, cfg.n_prototypes).gt(0).sum();
    std::cout << "epoch " << epoch << " loss " << (loss_sum / static_cast<double>(steps)).item<double>()
              << " prototypes used " << used.item<int64_t>() << "\n";
  }
}

int main() {
  torch::manual_seed(0);
  SwAVConfig cfg;
  cfg.epochs = 10;
  auto train_u8 = torch::randint(0, 256, {6400, 32, 32, 3}, torch::kUInt8);
  train_swav(train_u8, cfg);
  return 0;
}
