// Self-supervised pre-training in the SimCLR style (Chen et al. 2020) with a MoCo-like queue of
// negatives: two augmented views per image, a small ResNet-ish encoder and an MLP projection head,
// the NT-Xent loss over the 2N views with the self-similarities masked out, hardness-aware
// weights on the queued negatives, a momentum key encoder whose keys enter a fixed-size FIFO
// memory bank after every step, and a linear probe on the frozen features at the end.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct PretrainConfig {
  int64_t width = 64, feat_dim = 256, proj_hidden = 512, proj_dim = 128, queue_size = 4096, num_classes = 10;
  double temperature = 0.2, hard_beta = 0.5, momentum = 0.99, jitter = 0.5;
  double lr = 0.3, probe_lr = 0.1;
  int64_t epochs = 200, probe_epochs = 30, probe_batch = 512;
};

struct ImageBatch {
  torch::Tensor images; // [N, 3, H, W] in [0, 1]
  torch::Tensor labels; // [N] int64, used by the probe only
};

// Brightness and contrast jitter with one random factor per image.
torch::Tensor color_jitter(const torch::Tensor &imgs, double strength) {
  const auto N = imgs.size(0);
  auto brightness = 1.0 + (torch::rand({N, 1, 1, 1}, imgs.options()) * 2.0 - 1.0) * 0.8 * strength;
  auto contrast = 1.0 + (torch::rand({N, 1, 1, 1}, imgs.options()) * 2.0 - 1.0) * 0.8 * strength;
  // FACT: x = torch.rand(2, 3, 4, 4); f = torch.full((2, 1, 1, 1), 1.2); y = x.clone(); y.mul_(f); assert torch.equal(y, x.mul(f)) and is_copy_of(x.mul(f), x)
  auto out = imgs.clone(); // EXPECT: tensor-unnecessary-clone -- imgs * brightness gives the same tensor in one pass
  out.mul_(brightness);
  auto mean = out.mean({1, 2, 3}, true);
  out = (out - mean) * contrast + mean;
  return out.clamp_(0.0, 1.0);
}

// Grayscale with probability p, per image.
torch::Tensor random_grayscale(const torch::Tensor &imgs, double p) {
  auto luma = (imgs.select(1, 0) * 0.299 + imgs.select(1, 1) * 0.587 + imgs.select(1, 2) * 0.114).unsqueeze(1);
  auto pick = torch::rand({imgs.size(0)}, imgs.options()) < p;
  // FACT: m = torch.rand(4) < 0.5; l = torch.rand(4, 1, 3, 3); x = torch.rand(4, 3, 3, 3); y = torch.where(m.view(-1, 1, 1, 1), l.expand_as(x), x); assert is_view_of(m.view(-1, 1, 1, 1), m) and is_contiguous(y)
  return torch::where(pick.view({-1, 1, 1, 1}), luma.expand_as(imgs), imgs); // LOOKALIKE: tensor-view-non-contiguous, tensor-inplace-on-expanded -- a fresh comparison result; the expanded luma is only read
}

torch::Tensor random_flip(const torch::Tensor &imgs) {
  auto pick = torch::rand({imgs.size(0), 1, 1, 1}, imgs.options()) < 0.5;
  return torch::where(pick, imgs.flip({3}), imgs);
}

torch::Tensor augment(const torch::Tensor &imgs, const PretrainConfig &cfg) {
  return random_grayscale(color_jitter(random_flip(imgs), cfg.jitter), 0.2);
}

struct SimCLRImpl : nn::Module {
  explicit SimCLRImpl(const PretrainConfig &cfg) {
    const auto w = cfg.width;
    enc_ = register_module(
        "enc", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, w, 3).padding(1).bias(false)), nn::BatchNorm2d(w), nn::ReLU(),
                              nn::Conv2d(nn::Conv2dOptions(w, 2 * w, 3).stride(2).padding(1).bias(false)), nn::BatchNorm2d(2 * w), nn::ReLU(),
                              nn::Conv2d(nn::Conv2dOptions(2 * w, 4 * w, 3).stride(2).padding(1).bias(false)), nn::BatchNorm2d(4 * w), nn::ReLU(),
                              nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})), nn::Flatten()));
    head_ = register_module("head", nn::Sequential(nn::Linear(cfg.feat_dim, cfg.proj_hidden), nn::BatchNorm1d(cfg.proj_hidden), nn::ReLU(),
                                                   nn::Linear(cfg.proj_hidden, cfg.proj_dim)));
  }
  // Unit-norm projections [N, proj_dim].
  torch::Tensor forward(const torch::Tensor &x) { return F::normalize(head_->forward(enc_->forward(x)), F::NormalizeFuncOptions().dim(1)); }

  nn::Sequential enc_{nullptr}, head_{nullptr};
};
TORCH_MODULE(SimCLR);

// NT-Xent over the 2N views; the queued keys are extra negatives, reweighted towards the hard ones
// (Robinson et al. 2021: weights exp(beta * s), mean one per row, no gradient through them).
torch::Tensor nt_xent_with_queue(const torch::Tensor &z1, const torch::Tensor &z2, const torch::Tensor &queue, const PretrainConfig &cfg) {
  const auto N = z1.size(0);
  const double tau = cfg.temperature;
  auto z = torch::cat({z1, z2}, 0); // [2N, D]
  auto self_mask = torch::eye(2 * N, torch::TensorOptions().dtype(torch::kBool).device(z.device()));
  auto exp_sim = torch::exp(torch::matmul(z, z.t()) / tau);
  // FACT: z = torch.nn.functional.normalize(torch.randn(6, 4), dim=1).requires_grad_(); e = torch.exp(z @ z.t() / 0.2); e.masked_fill_(torch.eye(6, dtype=torch.bool), 0.0); assert backward_fails(lambda: e.sum().backward())
  exp_sim.masked_fill_(self_mask, 0.0); // EXPECT: tensor-inplace-on-saved -- exp saved its result for backward
  auto pos = torch::exp((z1 * z2).sum(1) / tau).repeat({2}); // [2N]
  auto l_neg = torch::matmul(z, queue.t());                  // [2N, K]
  // FACT: z = torch.randn(4, 3, requires_grad=True); q = torch.randn(5, 3); l = z @ q.t(); l.div_(0.2); torch.exp(l).sum().backward(); assert z.grad is not None
  l_neg.div_(tau); // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
  auto neg = torch::exp(l_neg);
  auto w = neg.detach();
  // FACT: l = torch.randn(4, 5, requires_grad=True); n = torch.exp(l); w = n.detach(); w.pow_(0.5); w.div_(w.mean(1, keepdim=True)); assert shares_storage(w, n) and backward_fails(lambda: (w * n).sum().backward())
  w.pow_(cfg.hard_beta).div_(w.mean(1, true)); // EXPECT: tensor-inplace-on-detached -- the weights overwrite the negatives they are meant to weight
  auto denom = exp_sim.sum(1) + (w * neg).sum(1);
  return -torch::log(pos / denom).mean();
}

// FIFO memory bank of the key encoder's outputs, newest first.
class KeyQueue {
 public:
  KeyQueue(int64_t size, int64_t dim, torch::Device device)
      : keys_(F::normalize(torch::randn({size, dim}, torch::TensorOptions().device(device)), F::NormalizeFuncOptions().dim(1))) {}

  void push(const torch::Tensor &k) {
    const auto B = k.size(0), K = keys_.size(0);
    // FACT: q = torch.randn(8, 3); assert raises(lambda: q.narrow(0, 2, 6).copy_(q.narrow(0, 0, 6)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    keys_.narrow(0, B, K - B).copy_(keys_.narrow(0, 0, K - B)); // EXPECT: tensor-inplace-overlap -- shifting the bank inside its own storage
    // FACT: q = torch.randn(8, 3); k = torch.randn(2, 3); q.narrow(0, 0, 2).copy_(k); assert torch.equal(q[:2], k) and not shares_storage(q, k)
    keys_.narrow(0, 0, B).copy_(k); // LOOKALIKE: tensor-inplace-overlap -- the new keys are another tensor
  }
  const torch::Tensor &keys() const { return keys_; }

 private:
  torch::Tensor keys_;
};

// The key encoder starts as a copy of the online one.
void copy_weights(SimCLR &from, SimCLR &to) {
  torch::NoGradGuard no_grad;
  auto src = from->parameters(), dst = to->parameters();
  for (size_t i = 0; i < dst.size(); ++i)
    dst[i].copy_(src[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  auto sb = from->buffers(), db = to->buffers();
  for (size_t i = 0; i < db.size(); ++i)
    db[i].copy_(sb[i]);
}

// theta_k <- m * theta_k + (1 - m) * theta_q, after every optimizer step.
void momentum_update(SimCLR &online, SimCLR &key, double m) {
  auto pq = online->parameters(), pk = key->parameters();
  for (size_t i = 0; i < pk.size(); ++i)
    // FACT: p = torch.nn.Parameter(torch.randn(3)); assert raises(lambda: p.mul_(0.99), "a leaf Variable that requires grad")
    pk[i].mul_(m).add_(pq[i].detach(), 1.0 - m); // EXPECT: tensor-inplace-on-leaf -- the key encoder's parameters still require grad, and grad mode is on
}

void pretrain(SimCLR &model, SimCLR &key_model, const std::vector<ImageBatch> &loader, const PretrainConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  key_model->to(device);
  copy_weights(model, key_model);
  KeyQueue queue(cfg.queue_size, cfg.proj_dim, device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(1e-6));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    key_model->train();
    auto epoch_loss = torch::zeros({}, device);
    int64_t steps = 0;
    for (const auto &b : loader) {
      auto x = b.images.to(device);
      auto v1 = augment(x, cfg), v2 = augment(x, cfg);
      auto loss = nt_xent_with_queue(model->forward(v1), model->forward(v2), queue.keys(), cfg);
      opt.zero_grad();
      loss.backward();
      opt.step();
      momentum_update(model, key_model, cfg.momentum);
      torch::Tensor keys;
      {
        torch::NoGradGuard no_grad;
        keys = key_model->forward(v2);
      }
      queue.push(keys);
      epoch_loss += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
      ++steps;
    }
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / steps << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, beside the loop of steps
  }
}

// Frozen features of a whole split for the linear probe; labels returned through 'labels'.
torch::Tensor extract_features(SimCLR &model, const std::vector<ImageBatch> &loader, torch::Device device, torch::Tensor &labels) {
  model->eval();
  std::vector<torch::Tensor> feats, ys;
  for (const auto &b : loader) {
    // FACT: m = torch.nn.Linear(3, 2); m.eval(); feats = [m(torch.randn(4, 3)) for _ in range(3)]; assert all(f.requires_grad for f in feats) and kept_nodes(feats) > kept_nodes(feats[:1])
    feats.push_back(model->enc_->forward(b.images.to(device))); // EXPECT: tensor-graph-kept-across-iterations -- grad mode is on: every batch's activations stay alive until the end
    ys.push_back(b.labels.to(device)); // LOOKALIKE: tensor-graph-kept-across-iterations -- labels carry no graph
  }
  labels = torch::cat(ys);
  return torch::cat(feats).detach();
}

double linear_probe(SimCLR &model, const std::vector<ImageBatch> &train_set, const std::vector<ImageBatch> &test_set, const PretrainConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::Tensor ytr, yte;
  auto xtr = extract_features(model, train_set, device, ytr);
  auto xte = extract_features(model, test_set, device, yte);
  auto mu = xtr.mean({0}, true), sd = xtr.std({0}, true, true) + 1e-6;
  xtr = (xtr - mu) / sd;
  xte = (xte - mu) / sd;
  nn::Linear probe(cfg.feat_dim, cfg.num_classes);
  probe->to(device);
  torch::optim::SGD opt(probe->parameters(), torch::optim::SGDOptions(cfg.probe_lr).momentum(0.9));
  const auto n = xtr.size(0);
  for (int64_t epoch = 0; epoch < cfg.probe_epochs; ++epoch) {
    auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(device));
    double loss_sum = 0.0;
    for (int64_t i = 0; i < n; i += cfg.probe_batch) {
      auto idx = perm.narrow(0, i, std::min(cfg.probe_batch, n - i));
      auto loss = F::cross_entropy(probe(xtr.index_select(0, idx)), ytr.index_select(0, idx)); // LOOKALIKE: tensor-device-mismatch -- the permutation is drawn on the GPU
      opt.zero_grad();
      loss.backward();
      opt.step();
      loss_sum += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- a wait for the GPU every mini-batch, only to sum
    }
    std::cout << "probe epoch " << epoch << " loss " << loss_sum * cfg.probe_batch / n << "\n";
  }
  torch::NoGradGuard no_grad;
  return probe(xte).argmax(1).eq(yte).to(torch::kFloat).mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- read once
}
