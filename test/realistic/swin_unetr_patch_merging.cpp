// A compact 3D Swin-UNETR for CT segmentation: window partition/reverse on channels-last volumes,
// (shifted) window attention with a relative position bias, patch merging, and a sliding-window
// inference loop that stitches Gaussian-weighted patch logits back into the full volume.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;
namespace nn = torch::nn;

struct SwinConfig {
  int64_t in_ch = 1;
  int64_t out_ch = 14;
  int64_t embed = 48;
  int64_t heads = 3;
  int64_t window = 7;
  double attn_drop = 0.1;
  std::vector<int64_t> roi{96, 96, 96};
  double overlap = 0.5;
  double hu_min = -175.0, hu_max = 250.0;
};

// [B, D, H, W, C] -> [B * nW, ws^3, C]
torch::Tensor window_partition(const torch::Tensor& x, int64_t ws) {
  const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3), C = x.size(4);
  // FACT: h = torch.nn.functional.layer_norm(torch.randn(2, 4, 4, 4, 3).permute(0, 2, 1, 3, 4), (3,)); assert is_contiguous(h) and is_view_of(h.view(2, 2, 2, 2, 2, 2, 2, 3), h)
  auto v = x.view({B, D / ws, ws, H / ws, ws, W / ws, ws, C}); // LOOKALIKE: tensor-view-non-contiguous -- callers pass LayerNorm/pad/roll outputs, all contiguous
  // FACT: v = torch.randn(2, 2, 2, 2, 2, 2, 2, 3).permute(0, 1, 3, 5, 2, 4, 6, 7).contiguous(); assert v.view(-1, 8, 3).shape == (16, 8, 3)
  return v.permute({0, 1, 3, 5, 2, 4, 6, 7}).contiguous().view({-1, ws * ws * ws, C}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
}

// [B * nW, ws^3, C] -> [B, D, H, W, C]
torch::Tensor window_reverse(const torch::Tensor& windows, int64_t ws, int64_t B, int64_t D, int64_t H, int64_t W) {
  auto x = windows.view({B, D / ws, H / ws, W / ws, ws, ws, ws, -1});
  // FACT: w = torch.randn(16, 8, 3).view(2, 2, 2, 2, 2, 2, 2, -1).permute(0, 1, 4, 2, 5, 3, 6, 7).contiguous(); assert is_contiguous(w) and w.view(2, 4, 4, 4, -1).shape == (2, 4, 4, 4, 3)
  return x.permute({0, 1, 4, 2, 5, 3, 6, 7}).contiguous().view({B, D, H, W, -1}); // LOOKALIKE: tensor-view-non-contiguous -- made contiguous before the view
}

torch::Tensor relative_position_index(int64_t ws) {
  auto r = torch::arange(ws);
  auto coords = torch::stack(torch::meshgrid({r, r, r}, "ij")).flatten(1);  // [3, N]
  // FACT: c = torch.randn(3, 8); t = (c.unsqueeze(2) - c.unsqueeze(1)).permute(1, 2, 0); r = t.contiguous(); r += 1; assert not is_contiguous(t) and is_copy_of(r, t)
  auto rel = (coords.unsqueeze(2) - coords.unsqueeze(1)).permute({1, 2, 0}).contiguous();
  rel += ws - 1; // LOOKALIKE: tensor-alias-then-mutate -- contiguous() of a permuted temporary is a fresh copy
  rel.select(2, 0).mul_((2 * ws - 1) * (2 * ws - 1));
  rel.select(2, 1).mul_(2 * ws - 1);
  return rel.sum(-1);  // [N, N]
}

struct WindowAttention3DImpl : nn::Module {
  WindowAttention3DImpl(int64_t dim, int64_t heads, int64_t ws, double attn_drop)
      : heads_(heads), scale_(std::pow(static_cast<double>(dim / heads), -0.5)), attn_drop_(attn_drop) {
    qkv = register_module("qkv", nn::Linear(dim, 3 * dim));
    proj = register_module("proj", nn::Linear(dim, dim));
    const int64_t n_rel = (2 * ws - 1) * (2 * ws - 1) * (2 * ws - 1);
    bias_table = register_parameter("relative_position_bias_table", torch::zeros({n_rel, heads}));
    {
      torch::NoGradGuard no_grad;
      bias_table.normal_(0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- initialised under NoGradGuard
    }
    rel_index = register_buffer("relative_position_index", relative_position_index(ws));
  }

  // x: [Bn, N, C]; mask: [nW, N, N] or undefined.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t Bn = x.size(0), N = x.size(1), C = x.size(2);
    // FACT: t = torch.nn.Linear(6, 18)(torch.randn(4, 5, 6)); assert is_view_of(t.reshape(4, 5, 3, 2, 3), t)
    auto heads = qkv(x).reshape({Bn, N, 3, heads_, C / heads_}).permute({2, 0, 3, 1, 4}); // LOOKALIKE: tensor-reshape-non-contiguous -- splits the last dim of a contiguous Linear output: a view
    auto q = heads[0], k = heads[1], v = heads[2];
    q.mul_(scale_); // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output and the matmul comes after
    auto attn = torch::matmul(q, k.transpose(-2, -1));
    auto bias = bias_table.index_select(0, rel_index.view(-1)).view({N, N, -1}).permute({2, 0, 1});
    attn = attn + bias.unsqueeze(0);
    if (mask.defined()) {
      const int64_t nW = mask.size(0);
      // FACT: a = torch.randn(6, 3, 8, 8) + torch.randn(3, 8, 8).unsqueeze(0); assert is_contiguous(a) and is_view_of(a.view(2, 3, 3, 8, 8), a)
      attn = attn.view({Bn / nW, nW, heads_, N, N}) + mask.unsqueeze(1).unsqueeze(0); // LOOKALIKE: tensor-view-non-contiguous -- attn is a fresh sum
      attn = attn.view({-1, heads_, N, N});
    }
    attn = torch::softmax(attn, -1);
    if (is_training() && attn_drop_ > 0.0)
      F::dropout(attn, F::DropoutFuncOptions().p(attn_drop_).training(true).inplace(true)); // EXPECT: tensor-inplace-on-saved
    // FACT: m = torch.randn(2, 3, 5, 4) @ torch.randn(2, 3, 4, 4); assert is_copy_of(m.transpose(1, 2).reshape(2, 5, 12), m)
    auto out = torch::matmul(attn, v).transpose(1, 2).reshape({Bn, N, C}); // EXPECT: tensor-reshape-non-contiguous
    return proj(out);
  }

  int64_t heads_;
  double scale_, attn_drop_;
  nn::Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor bias_table, rel_index;
};
TORCH_MODULE(WindowAttention3D);

struct SwinBlock3DImpl : nn::Module {
  SwinBlock3DImpl(int64_t dim, int64_t heads, int64_t ws, int64_t shift, double attn_drop) : ws_(ws), shift_(shift) {
    norm1 = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({dim})));
    attn = register_module("attn", WindowAttention3D(dim, heads, ws, attn_drop));
    norm2 = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({dim})));
    mlp = register_module("mlp", nn::Sequential(nn::Linear(dim, 4 * dim), nn::GELU(), nn::Linear(4 * dim, dim)));
  }

  // Region ids of the cyclically shifted volume, turned into an additive [nW, N, N] mask.
  torch::Tensor shift_mask(int64_t Dp, int64_t Hp, int64_t Wp, const torch::Device& dev) const {
    auto img = torch::zeros({1, Dp, Hp, Wp, 1}, torch::TensorOptions().device(dev));
    auto bounds = [&](int64_t n) {
      return std::vector<std::pair<int64_t, int64_t>>{{0, n - ws_}, {n - ws_, n - shift_}, {n - shift_, n}};
    };
    double cnt = 0.0;
    for (const auto& d : bounds(Dp))
      for (const auto& h : bounds(Hp))
        for (const auto& w : bounds(Wp))
          img.slice(1, d.first, d.second).slice(2, h.first, h.second).slice(3, w.first, w.second).fill_(cnt++);
    auto ids = window_partition(img, ws_).squeeze(-1);
    auto diff = ids.unsqueeze(1) - ids.unsqueeze(2);
    return torch::zeros_like(diff).masked_fill(diff != 0, -100.0);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), D = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t pd = (ws_ - D % ws_) % ws_, ph = (ws_ - H % ws_) % ws_, pw = (ws_ - W % ws_) % ws_;
    auto h = F::pad(norm1(x), F::PadFuncOptions({0, 0, 0, pw, 0, ph, 0, pd}));
    const int64_t Dp = D + pd, Hp = H + ph, Wp = W + pw;
    torch::Tensor mask;
    if (shift_ > 0) {
      h = torch::roll(h, {-shift_, -shift_, -shift_}, {1, 2, 3});
      mask = shift_mask(Dp, Hp, Wp, x.device());
    }
    h = window_reverse(attn->forward(window_partition(h, ws_), mask), ws_, B, Dp, Hp, Wp);
    if (shift_ > 0) h = torch::roll(h, {shift_, shift_, shift_}, {1, 2, 3});
    auto y = x + h.slice(1, 0, D).slice(2, 0, H).slice(3, 0, W);
    return y + mlp->forward(norm2(y));
  }

  int64_t ws_, shift_;
  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  WindowAttention3D attn{nullptr};
  nn::Sequential mlp{nullptr};
};
TORCH_MODULE(SwinBlock3D);

// 2x2x2 neighbourhoods -> 8C features -> LayerNorm -> Linear(8C, 2C).
struct PatchMerging3DImpl : nn::Module {
  explicit PatchMerging3DImpl(int64_t dim)
      : norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({8 * dim})))),
        reduction(register_module("reduction", nn::Linear(nn::LinearOptions(8 * dim, 2 * dim).bias(false)))) {}

  torch::Tensor forward(torch::Tensor x) {
    const int64_t D = x.size(1), H = x.size(2), W = x.size(3);
    if (D % 2 || H % 2 || W % 2) x = F::pad(x, F::PadFuncOptions({0, 0, 0, W % 2, 0, H % 2, 0, D % 2}));
    std::vector<torch::Tensor> parts;
    for (int64_t dz : {0, 1})
      for (int64_t dy : {0, 1})
        for (int64_t dx : {0, 1})
          parts.push_back(x.slice(1, dz, c10::nullopt, 2).slice(2, dy, c10::nullopt, 2).slice(3, dx, c10::nullopt, 2)); // LOOKALIKE: tensor-graph-kept-across-iterations -- the eight slices are concatenated and returned
    return reduction(norm(torch::cat(parts, -1)));
  }

  nn::LayerNorm norm;
  nn::Linear reduction;
};
TORCH_MODULE(PatchMerging3D);

struct SwinUNETRImpl : nn::Module {
  explicit SwinUNETRImpl(const SwinConfig& c) {
    const int64_t C = c.embed, ws = c.window;
    embed = register_module("embed", nn::Conv3d(nn::Conv3dOptions(c.in_ch, C, 2).stride(2)));
    s1a = register_module("s1a", SwinBlock3D(C, c.heads, ws, 0, c.attn_drop));
    s1b = register_module("s1b", SwinBlock3D(C, c.heads, ws, ws / 2, c.attn_drop));
    merge = register_module("merge", PatchMerging3D(C));
    s2a = register_module("s2a", SwinBlock3D(2 * C, 2 * c.heads, ws, 0, c.attn_drop));
    s2b = register_module("s2b", SwinBlock3D(2 * C, 2 * c.heads, ws, ws / 2, c.attn_drop));
    up2 = register_module("up2", nn::ConvTranspose3d(nn::ConvTranspose3dOptions(2 * C, C, 2).stride(2)));
    dec = register_module("dec", nn::Conv3d(nn::Conv3dOptions(2 * C, C, 3).padding(1)));
    up1 = register_module("up1", nn::ConvTranspose3d(nn::ConvTranspose3dOptions(C, C, 2).stride(2)));
    head = register_module("head", nn::Conv3d(nn::Conv3dOptions(C, c.out_ch, 1)));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto t = embed(x).permute({0, 2, 3, 4, 1});  // channels-last for the Swin blocks
    auto s1 = s1b(s1a(t));
    auto s2 = s2b(s2a(merge(s1)));
    auto f2 = up2(s2.permute({0, 4, 1, 2, 3}));
    auto d = torch::relu(dec(torch::cat({f2, s1.permute({0, 4, 1, 2, 3})}, 1)));
    return head(up1(d));
  }

  nn::Conv3d embed{nullptr}, dec{nullptr}, head{nullptr};
  SwinBlock3D s1a{nullptr}, s1b{nullptr}, s2a{nullptr}, s2b{nullptr};
  PatchMerging3D merge{nullptr};
  nn::ConvTranspose3d up2{nullptr}, up1{nullptr};
};
TORCH_MODULE(SwinUNETR);

// HU windowing to [0, 1].
torch::Tensor scale_intensity(const torch::Tensor& volume, double lo, double hi) {
  torch::Tensor ct = volume;
  // FACT: v = torch.randn(2, 8) * 500; c = v; c.clamp_(-175, 250).sub_(-175).div_(425); assert shares_storage(v, c) and v.max() <= 1
  ct.clamp_(lo, hi).sub_(lo).div_(hi - lo); // EXPECT: tensor-alias-then-mutate
  return ct;
}

torch::Tensor gaussian_importance(const std::vector<int64_t>& roi, double sigma_scale = 0.125) {
  std::vector<torch::Tensor> axes;
  for (int64_t s : roi) {
    auto c = torch::arange(s, torch::kFloat) - (s - 1) / 2.0;
    const double sigma = sigma_scale * s;
    axes.push_back(torch::exp(-(c * c) / (2.0 * sigma * sigma)));
  }
  auto g = axes[0].view({-1, 1, 1}) * axes[1].view({1, -1, 1}) * axes[2].view({1, 1, -1});
  return (g / g.max()).clamp_min(1e-3);
}

std::vector<int64_t> window_starts(int64_t size, int64_t roi, double overlap) {
  const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(roi * (1.0 - overlap)));
  std::vector<int64_t> starts;
  for (int64_t p = 0;; p += step) {
    if (p + roi >= size) { starts.push_back(std::max<int64_t>(0, size - roi)); break; }
    starts.push_back(p);
  }
  return starts;
}

// volume: [1, C, D, H, W] on the host; patches run on the GPU, logits are stitched on the host.
torch::Tensor sliding_window_inference(SwinUNETR& model, const torch::Tensor& volume, const SwinConfig& cfg) {
  torch::NoGradGuard no_grad;
  torch::Device dev(torch::kCUDA);
  model->to(dev);
  model->eval();
  const int64_t D = volume.size(2), H = volume.size(3), W = volume.size(4);
  const auto& roi = cfg.roi;
  auto importance = gaussian_importance(roi);
  auto logits = torch::zeros({1, cfg.out_ch, D, H, W});
  auto count = torch::zeros({1, 1, D, H, W});
  for (int64_t z : window_starts(D, roi[0], cfg.overlap))
    for (int64_t y : window_starts(H, roi[1], cfg.overlap))
      for (int64_t x : window_starts(W, roi[2], cfg.overlap)) {
        auto patch = volume.slice(2, z, z + roi[0]).slice(3, y, y + roi[1]).slice(4, x, x + roi[2]);
        auto pred = model->forward(patch.to(dev)); // LOOKALIKE: tensor-clone-in-loop -- a different patch every window
        auto w = importance.to(dev); // EXPECT: tensor-clone-in-loop
        auto region = logits.slice(2, z, z + roi[0]).slice(3, y, y + roi[1]).slice(4, x, x + roi[2]);
        region.add_(pred * w); // EXPECT: tensor-device-mismatch
        count.slice(2, z, z + roi[0]).slice(3, y, y + roi[1]).slice(4, x, x + roi[2]).add_(importance);
      }
  return logits / count;
}

// Labels and an 8-bit foreground probability map for the viewer.
std::pair<torch::Tensor, torch::Tensor> export_volumes(const torch::Tensor& logits, int64_t organ) {
  const int64_t D = logits.size(2), H = logits.size(3), W = logits.size(4);
  auto probs = torch::softmax(logits, 1).squeeze(0);
  auto labels = torch::empty({D, H, W}, torch::kByte);
  labels.copy_(probs.argmax(0).to(torch::kByte)); // LOOKALIKE: tensor-copy-narrowing -- explicit conversion of class ids
  auto prob_u8 = torch::empty({D, H, W}, torch::kByte);
  prob_u8.copy_(probs.select(0, organ) * 255.0); // EXPECT: tensor-copy-narrowing
  return {labels, prob_u8};
}

torch::Tensor dice_ce_loss(const torch::Tensor& logits, const torch::Tensor& target, int64_t num_classes) {
  auto ce = F::cross_entropy(logits, target);
  auto probs = torch::softmax(logits, 1);
  auto onehot = F::one_hot(target, num_classes).permute({0, 4, 1, 2, 3}).to(torch::kFloat);
  const std::vector<int64_t> dims{0, 2, 3, 4};
  auto inter = (probs * onehot).sum(dims);
  auto denom = probs.sum(dims) + onehot.sum(dims);
  return ce + (1.0 - (2.0 * inter + 1e-5) / (denom + 1e-5)).mean();
}

struct CtBatch {
  torch::Tensor image;  // [B, 1, D, H, W] raw HU
  torch::Tensor label;  // [B, 1, D, H, W] int64, 255 = unlabelled
};

void train_epoch(SwinUNETR& model, torch::optim::Optimizer& opt, const std::vector<CtBatch>& loader, const SwinConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  model->train();
  int64_t step = 0;
  for (const auto& b : loader) {
    auto x = scale_intensity(b.image, cfg.hu_min, cfg.hu_max).to(device);
    auto seg = b.label.squeeze(1);
    auto target = seg.clone(); // EXPECT: tensor-unnecessary-clone
    target.masked_fill_(seg == 255, 0);
    auto loss = dice_ce_loss(model->forward(x), target.to(device), cfg.out_ch);
    opt.zero_grad();
    loss.backward();
    opt.step();
    std::cout << "step " << step++ << " loss " << loss.item<float>() << std::endl; // EXPECT: tensor-sync-in-loop
  }
}
