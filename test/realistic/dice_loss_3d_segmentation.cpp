// 3-D organ segmentation on CT: a small residual encoder-decoder trained on random 96^3 patches
// with soft Dice plus cross-entropy over the hardest voxels (OHEM), and a validation pass that
// tiles each volume with overlapping patches, blends the softmax outputs with a Gaussian window
// and accumulates per-class Dice, voxel counts and predicted organ volumes over the cases.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct SegConfig {
  int64_t in_ch = 1, n_classes = 4, width = 32;
  int64_t patch = 96, stride = 64, batch = 2; // patch edge and tile step in voxels
  double ce_weight = 0.5, smooth = 1e-5, ohem_frac = 0.1, lr = 2e-4;
  double hu_air = -500.0; // darker voxels are outside the body
  double voxel_ml = 1e-3; // one 1 mm^3 voxel after resampling, in ml
  std::vector<double> class_weights{0.1, 1.0, 1.0, 2.0};
};

struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t in, int64_t out) {
    namespace nn = torch::nn;
    c1 = register_module("c1", nn::Conv3d(nn::Conv3dOptions(in, out, 3).padding(1).bias(false)));
    n1 = register_module("n1", nn::InstanceNorm3d(nn::InstanceNorm3dOptions(out).affine(true)));
    c2 = register_module("c2", nn::Conv3d(nn::Conv3dOptions(out, out, 3).padding(1).bias(false)));
    n2 = register_module("n2", nn::InstanceNorm3d(nn::InstanceNorm3dOptions(out).affine(true)));
    if (in != out)
      skip = register_module("skip", nn::Conv3d(nn::Conv3dOptions(in, out, 1).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::leaky_relu(n1(c1(x)), 0.01);
    auto out = n2(c2(h));
    // FACT: n = torch.nn.InstanceNorm3d(4, affine=True); c = torch.nn.Conv3d(2, 4, 3, padding=1); x = torch.randn(2, 2, 4, 4, 4); o = n(c(x)); o += x.repeat(1, 2, 1, 1, 1); torch.nn.functional.leaky_relu(o, 0.01).sum().backward(); assert c.weight.grad is not None
    out += skip ? skip(x) : x; // LOOKALIKE: tensor-inplace-on-saved -- an instance norm does not save its output
    return torch::leaky_relu(out, 0.01);
  }
  torch::nn::Conv3d c1{nullptr}, c2{nullptr}, skip{nullptr};
  torch::nn::InstanceNorm3d n1{nullptr}, n2{nullptr};
};
TORCH_MODULE(ResBlock);

struct SegNetImpl : torch::nn::Module {
  explicit SegNetImpl(const SegConfig &cfg) {
    namespace nn = torch::nn;
    const auto w = cfg.width;
    enc1 = register_module("enc1", ResBlock(cfg.in_ch, w));
    down = register_module("down", nn::Conv3d(nn::Conv3dOptions(w, 2 * w, 2).stride(2)));
    enc2 = register_module("enc2", ResBlock(2 * w, 2 * w));
    up = register_module("up", nn::ConvTranspose3d(nn::ConvTranspose3dOptions(2 * w, w, 2).stride(2)));
    dec1 = register_module("dec1", ResBlock(2 * w, w));
    head = register_module("head", nn::Conv3d(nn::Conv3dOptions(w, cfg.n_classes, 1)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto s1 = enc1(x);
    auto b = enc2(down(s1));
    return head(dec1(torch::cat({up(b), s1}, 1)));
  }
  ResBlock enc1{nullptr}, enc2{nullptr}, dec1{nullptr};
  torch::nn::Conv3d down{nullptr}, head{nullptr};
  torch::nn::ConvTranspose3d up{nullptr};
};
TORCH_MODULE(SegNet);

// Labels [B, D, H, W] int64 -> one-hot [B, C, D, H, W] float.
torch::Tensor one_hot_3d(const torch::Tensor &labels, int64_t C) {
  return torch::one_hot(labels, C).permute({0, 4, 1, 2, 3}).to(torch::kFloat);
}

// Soft Dice per class over the whole batch, [C].
torch::Tensor soft_dice(const torch::Tensor &probs, const torch::Tensor &onehot, double smooth) {
  const auto B = probs.size(0), C = probs.size(1);
  auto p = probs.view({B, C, -1});
  // FACT: o = torch.nn.functional.one_hot(torch.randint(0, 4, (2, 3, 4, 5)), 4).permute(0, 4, 1, 2, 3).float(); assert not is_contiguous(o) and is_view_of(o.view(2, 4, -1), o)
  auto g = onehot.view({B, C, -1}); // LOOKALIKE: tensor-view-non-contiguous -- the permuted one-hot keeps D, H, W adjacent and in order: a view
  auto inter = (p * g).sum(torch::IntArrayRef{0, 2});
  auto denom = p.sum(torch::IntArrayRef{0, 2}) + g.sum(torch::IntArrayRef{0, 2});
  return (2 * inter + smooth) / (denom + smooth);
}

// Dice of all organs together, per sample, [B].
torch::Tensor foreground_dice(const torch::Tensor &probs, const torch::Tensor &onehot, double smooth) {
  const auto B = probs.size(0), C = probs.size(1);
  // FACT: p = torch.softmax(torch.randn(2, 4, 3, 4, 5), 1); assert is_view_of(p.narrow(1, 1, 3).view(2, -1), p)
  auto p = probs.narrow(1, 1, C - 1).view({B, -1}); // LOOKALIKE: tensor-view-non-contiguous -- classes 1.. of a contiguous [B, C, ...] are one block per sample
  // FACT: o = torch.nn.functional.one_hot(torch.randint(0, 4, (2, 3, 4, 5)), 4).permute(0, 4, 1, 2, 3).float(); assert raises(lambda: o.narrow(1, 1, 3).view(2, -1), "view size is not compatible")
  auto g = onehot.narrow(1, 1, C - 1).view({B, -1}); // EXPECT: tensor-view-non-contiguous -- in the permuted one-hot the class dim has stride 1 and cannot merge with D
  auto inter = (p * g).sum(1);
  return (2 * inter + smooth) / (p.sum(1) + g.sum(1) + smooth);
}

// Cross-entropy over the hardest voxels only (online hard example mining).
torch::Tensor ohem_ce(const torch::Tensor &logits, const torch::Tensor &labels, double frac) {
  const auto C = logits.size(1);
  // FACT: l = torch.randn(2, 4, 3, 4, 5); assert is_copy_of(l.permute(0, 2, 3, 4, 1).reshape(-1, 4), l)
  auto flat = logits.permute({0, 2, 3, 4, 1}).reshape({-1, C}); // EXPECT: tensor-reshape-non-contiguous -- channel-last logits of a batch are copied (cross_entropy takes [B, C, D, H, W] as is)
  // FACT: y = torch.randint(0, 4, (2, 3, 4, 5)); assert is_view_of(y.reshape(-1), y)
  auto ce = F::cross_entropy(flat, labels.reshape({-1}), F::CrossEntropyFuncOptions().reduction(torch::kNone)); // LOOKALIKE: tensor-reshape-non-contiguous -- the stacked labels are contiguous
  const auto k = std::max<int64_t>(1, static_cast<int64_t>(frac * static_cast<double>(ce.numel())));
  return std::get<0>(ce.topk(k)).mean();
}

torch::Tensor seg_loss(const torch::Tensor &logits, const torch::Tensor &labels, const torch::Tensor &body,
                       const SegConfig &cfg) {
  auto probs = torch::softmax(logits, 1);
  // FACT: c = torch.nn.Conv3d(1, 3, 1); p = torch.softmax(c(torch.randn(2, 1, 3, 4, 5)), 1); p.mul_((torch.rand(2, 1, 3, 4, 5) > 0.3).float()); assert backward_fails(lambda: p.sum().backward())
  probs.mul_(body.unsqueeze(1)); // EXPECT: tensor-inplace-on-saved -- softmax saved its output for backward
  auto onehot = one_hot_3d(labels, cfg.n_classes);
  auto dice = soft_dice(probs, onehot, cfg.smooth);
  auto fg = foreground_dice(probs, onehot, cfg.smooth);
  auto dice_loss = 1 - 0.5 * (dice.mean() + fg.mean());
  return cfg.ce_weight * ohem_ce(logits, labels, cfg.ohem_frac) + (1 - cfg.ce_weight) * dice_loss;
}

struct Case {
  torch::Tensor image; // [1, D, H, W] float32 HU
  torch::Tensor label; // [D, H, W] int64
};

std::pair<torch::Tensor, torch::Tensor> random_patch(const Case &c, int64_t P, std::mt19937 &rng) {
  auto pick = [&](int64_t n) { return std::uniform_int_distribution<int64_t>(0, std::max<int64_t>(n - P, 0))(rng); };
  const auto z = pick(c.label.size(0)), y = pick(c.label.size(1)), x = pick(c.label.size(2));
  auto img = c.image.slice(1, z, z + P).slice(2, y, y + P).slice(3, x, x + P);
  auto lbl = c.label.slice(0, z, z + P).slice(1, y, y + P).slice(2, x, x + P);
  return {img, lbl};
}

double train_epoch(SegNet &net, torch::optim::Optimizer &opt, const std::vector<Case> &cases, const SegConfig &cfg,
                   int64_t steps, std::mt19937 &rng) {
  torch::Device device(torch::kCUDA);
  net->train();
  std::uniform_int_distribution<size_t> pick_case(0, cases.size() - 1);
  auto epoch_loss = torch::zeros({}, device);
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<torch::Tensor> imgs, lbls;
    for (int64_t b = 0; b < cfg.batch; ++b) {
      auto [img, lbl] = random_patch(cases[pick_case(rng)], cfg.patch, rng);
      imgs.push_back(img);
      lbls.push_back(lbl);
    }
    auto hu = torch::stack(imgs).to(device); // [B, 1, P, P, P]
    auto y = torch::stack(lbls).to(device);  // [B, P, P, P]
    auto body = (hu.squeeze(1) > cfg.hu_air).to(torch::kFloat);
    auto x = (hu.clamp(-1000, 1000) + 1000) / 2000;
    auto loss = seg_loss(net->forward(x), y, body, cfg);
    opt.zero_grad();
    loss.backward();
    opt.step();
    epoch_loss += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
  }
  return epoch_loss.item<double>() / static_cast<double>(steps);
}

// Gaussian blending weights for one patch: the centre of a tile counts more than its borders.
torch::Tensor gaussian_window(int64_t P, torch::Device device) {
  auto r = torch::arange(P, torch::TensorOptions().dtype(torch::kFloat).device(device)) - (P - 1) / 2.0;
  auto g = torch::exp(-r * r / (2 * std::pow(P / 8.0, 2)));
  return g.view({-1, 1, 1}) * g.view({1, -1, 1}) * g.view({1, 1, -1}); // [P, P, P]
}

std::vector<int64_t> tile_starts(int64_t n, int64_t P, int64_t S) {
  std::vector<int64_t> s;
  for (int64_t a = 0; a + P < n; a += S)
    s.push_back(a);
  s.push_back(std::max<int64_t>(n - P, 0));
  return s;
}

struct ValReport {
  torch::Tensor mean_dice; // [C] soft Dice averaged over the cases
  torch::Tensor table;     // [cases, C, 4] int64: TP, FP, FN voxels, predicted volume in ml
};

ValReport validate(SegNet &net, const std::vector<Case> &cases, const SegConfig &cfg) {
  torch::Device device(torch::kCUDA);
  net->eval();
  const auto C = cfg.n_classes, P = cfg.patch;
  auto class_w = torch::tensor(cfg.class_weights);
  auto win = gaussian_window(P, device);
  auto dice_sum = torch::zeros({C}, device);
  ValReport rep;
  rep.table = torch::zeros({static_cast<int64_t>(cases.size()), C, 4}, torch::kLong);
  for (size_t i = 0; i < cases.size(); ++i) {
    auto vol = ((cases[i].image.clamp(-1000, 1000) + 1000) / 2000).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different case each iteration
    auto labels = cases[i].label.to(device);
    const auto D = labels.size(0), H = labels.size(1), W = labels.size(2);
    auto acc = torch::zeros({C, D, H, W}, vol.options());
    auto weight = torch::zeros({D, H, W}, vol.options());
    for (auto z : tile_starts(D, P, cfg.stride))
      for (auto y : tile_starts(H, P, cfg.stride))
        for (auto x : tile_starts(W, P, cfg.stride)) {
          auto patch = vol.slice(1, z, z + P).slice(2, y, y + P).slice(3, x, x + P).unsqueeze(0);
          auto probs = torch::softmax(net->forward(patch), 1)[0]; // [C, P, P, P]
          // FACT: a = torch.zeros(4, 3, 3, 3); p = torch.rand(4, 3, 3, 3); w = torch.rand(3, 3, 3); a.addcmul_(p, w.expand_as(p)); assert torch.allclose(a, p * w)
          acc.slice(1, z, z + P).slice(2, y, y + P).slice(3, x, x + P).addcmul_(probs, win.expand_as(probs)); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded window is only read
          weight.slice(0, z, z + P).slice(1, y, y + P).slice(2, x, x + P).add_(win);
        }
    auto probs = acc / weight.clamp_min(1e-6); // [C, D, H, W]
    auto p = probs.reshape({C, -1});
    // FACT: l = torch.randint(0, 4, (3, 4, 5)); o = torch.nn.functional.one_hot(l, 4).permute(3, 0, 1, 2); assert not is_contiguous(o) and is_view_of(o.reshape(4, -1), o)
    auto g = torch::one_hot(labels, C).permute({3, 0, 1, 2}).reshape({C, -1}); // LOOKALIKE: tensor-reshape-non-contiguous -- D, H, W stay adjacent after the permute: a [C, N] view with stride C
    auto soft = (2 * (p * g).sum(1) + cfg.smooth) / (p.sum(1) + g.sum(1) + cfg.smooth); // [C]
    // FACT: m = torch.nn.Conv3d(1, 2, 1); s = torch.zeros(2); exec('for _ in range(3): s += m(torch.randn(1, 1, 2, 2, 2)).mean((0, 2, 3, 4))'); assert s.requires_grad and kept_nodes(s) >= 6
    dice_sum += soft; // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every case's graph, with all its windows, stays alive
    auto score = (soft * class_w).sum() / class_w.sum(); // EXPECT: tensor-device-mismatch -- the class weights are a host tensor of C values
    std::cout << "case " << i << " weighted dice " << score.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per volume, after dozens of window forwards
    auto pred = probs.argmax(0).flatten();
    auto p_oh = torch::one_hot(pred, C).t(); // [C, N] int64
    auto tp = (p_oh * g).sum(1), fp = p_oh.sum(1) - tp, fn = g.sum(1) - tp;
    auto row = rep.table[static_cast<int64_t>(i)]; // [C, 4]
    // FACT: t = torch.zeros(4, 4, dtype=torch.long); c = torch.nn.functional.one_hot(torch.tensor([1, 2, 2]), 4).t().sum(1); t[:, 0].copy_(c); assert t[:, 0].tolist() == [0, 1, 2, 0]
    row.select(1, 0).copy_(tp); // LOOKALIKE: tensor-copy-narrowing -- int64 counts into the int64 table
    row.select(1, 1).copy_(fp);
    row.select(1, 2).copy_(fn);
    // FACT: t = torch.zeros(4, dtype=torch.long); c = torch.tensor([1500, 800, 12000, 40]); t.copy_(c * 1e-3); assert t.tolist() == [1, 0, 12, 0]
    row.select(1, 3).copy_(p_oh.sum(1) * cfg.voxel_ml); // EXPECT: tensor-copy-narrowing -- volumes in ml are truncated to whole ml (0.8 ml -> 0)
  }
  rep.mean_dice = dice_sum / static_cast<double>(cases.size());
  return rep;
}

void fit(const std::vector<Case> &train, const std::vector<Case> &val, const SegConfig &cfg, int epochs) {
  SegNet net(cfg);
  net->to(torch::Device(torch::kCUDA));
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(1e-5));
  std::mt19937 rng(0);
  for (int e = 0; e < epochs; ++e) {
    const auto loss = train_epoch(net, opt, train, cfg, 250, rng);
    auto rep = validate(net, val, cfg);
    std::cout << "epoch " << e << " loss " << loss << " dice per class " << rep.mean_dice.cpu() << "\n";
  }
}
