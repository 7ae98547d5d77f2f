// Conditional flow matching / rectified flow (Lipman et al. 2023; Liu et al. 2023) for class-conditional
// 32x32 images. A small DiT-style transformer predicts the velocity v(x_t, t, y) on the straight path
// x_t = (1 - (1 - sigma_min) t) x0 + t x1 from Gaussian noise x0 to an image x1, regressed onto
// x1 - (1 - sigma_min) x0 with logit-normal times. Sampling integrates dx/dt = v from t = 0 to 1 with
// Euler or Heun steps and classifier-free guidance; a reflow pass stores (noise, sample) couplings as
// 8-bit images, and a straightness score tracks how close the learned paths are to straight lines.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct FlowConfig {
  int64_t channels = 3, image_size = 32, patch = 2, dim = 384, depth = 6, heads = 6, num_classes = 10;
  int64_t epochs = 400, log_every = 100, sample_steps = 32, time_embed = 256;
  double lr = 1e-4, ema_decay = 0.9999, guidance = 2.0, label_drop = 0.1, sigma_min = 1e-4;
  double logit_mean = 0.0, logit_std = 1.0, grad_clip = 1.0, hist_range = 4.0;
};

struct ImageBatch {
  torch::Tensor images; // [B, C, H, W] float in [-1, 1]
  torch::Tensor labels; // [B] int64
};

// Sinusoidal embedding of t in [0, 1], scaled to the DDPM step range as in DiT.
torch::Tensor timestep_embedding(const torch::Tensor &t, int64_t dim) {
  const auto half = dim / 2;
  auto freqs = torch::exp(torch::arange(half, t.options()) * (-std::log(10000.0) / static_cast<double>(half)));
  auto args = t.unsqueeze(1) * 1000.0 * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

torch::Tensor modulate(const torch::Tensor &x, const torch::Tensor &shift, const torch::Tensor &scale) {
  return x * (1 + scale) + shift;
}

// [B, C, H, W] -> [B, H/p, W/p, C, p, p]: the grid of non-overlapping p x p patches.
torch::Tensor patch_grid(const torch::Tensor &x, int64_t p) {
  const auto B = x.size(0), C = x.size(1), gh = x.size(2) / p, gw = x.size(3) / p;
  // FACT: x = torch.randn(2, 3, 8, 8); assert is_view_of(x.view(2, 3, 4, 2, 4, 2), x)
  return x.view({B, C, gh, p, gw, p}).permute({0, 2, 4, 1, 3, 5}); // LOOKALIKE: tensor-view-non-contiguous -- x_t and the guidance batch are fresh, contiguous tensors: splitting H and W is a view
}

// Transformer block with adaLN modulation: shift, scale and gate come from the conditioning vector.
struct DiTBlockImpl : nn::Module {
  DiTBlockImpl(int64_t dim, int64_t heads) : heads_(heads) {
    norm1 = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({dim}).elementwise_affine(false).eps(1e-6)));
    norm2 = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({dim}).elementwise_affine(false).eps(1e-6)));
    qkv = register_module("qkv", nn::Linear(dim, 3 * dim));
    proj = register_module("proj", nn::Linear(dim, dim));
    fc1 = register_module("fc1", nn::Linear(dim, 4 * dim));
    fc2 = register_module("fc2", nn::Linear(4 * dim, dim));
    ada = register_module("ada", nn::Linear(dim, 6 * dim));
  }

  torch::Tensor attention(const torch::Tensor &x) {
    const auto B = x.size(0), N = x.size(1), D = x.size(2), hd = D / heads_;
    // FACT: y = torch.nn.Linear(8, 24)(torch.randn(2, 5, 8)); assert is_view_of(y.view(2, 5, 3, 2, 4), y)
    auto parts = qkv(x).view({B, N, 3, heads_, hd}).permute({2, 0, 3, 1, 4}); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous
    auto q = parts[0], k = parts[1], v = parts[2];
    auto att = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd)), -1);
    auto out = torch::matmul(att, v); // [B, heads, N, hd]
    // FACT: o = torch.matmul(torch.rand(2, 3, 5, 5), torch.randn(2, 3, 5, 4)); assert raises(lambda: o.transpose(1, 2).view(2, 5, 12), "view size is not compatible")
    return proj(out.transpose(1, 2).view({B, N, D})); // EXPECT: tensor-view-non-contiguous -- heads and tokens are swapped: merging them back needs a copy, view throws
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &c) {
    auto mod = ada(torch::silu(c)).unsqueeze(1).chunk(6, -1);
    // Sigmoid gates scaled to (0, 2): an untrained block passes the residual branch at weight 1.
    auto gate_msa = torch::sigmoid(mod[2]);
    // FACT: m = torch.randn(2, 1, 4, requires_grad=True); g = torch.sigmoid(m); g.mul_(2.0); assert backward_fails(lambda: g.sum().backward())
    gate_msa.mul_(2.0); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its result for backward: the first backward through the block fails
    auto h = x + gate_msa * attention(modulate(norm1(x), mod[0], mod[1]));
    auto mlp = fc2(torch::gelu(fc1(modulate(norm2(h), mod[3], mod[4]))));
    return h + mod[5] * mlp;
  }

  int64_t heads_;
  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr}, ada{nullptr};
};
TORCH_MODULE(DiTBlock);

struct VelocityNetImpl : nn::Module {
  explicit VelocityNetImpl(const FlowConfig &cfg) : cfg_(cfg) {
    const auto p = cfg.patch, n_tok = (cfg.image_size / p) * (cfg.image_size / p);
    patch_embed = register_module("patch_embed", nn::Linear(cfg.channels * p * p, cfg.dim));
    pos_embed = register_parameter("pos_embed", torch::randn({1, n_tok, cfg.dim}) * 0.02);
    t_mlp = register_module("t_mlp", nn::Sequential(nn::Linear(cfg.time_embed, cfg.dim), nn::SiLU(), nn::Linear(cfg.dim, cfg.dim)));
    y_embed = register_module("y_embed", nn::Embedding(cfg.num_classes + 1, cfg.dim)); // last row: the null class
    for (int64_t i = 0; i < cfg.depth; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), DiTBlock(cfg.dim, cfg.heads)));
    final_norm = register_module("final_norm", nn::LayerNorm(nn::LayerNormOptions({cfg.dim}).elementwise_affine(false).eps(1e-6)));
    final_ada = register_module("final_ada", nn::Linear(cfg.dim, 2 * cfg.dim));
    final_fc = register_module("final_fc", nn::Linear(cfg.dim, p * p * cfg.channels));
  }

  // [B, C, H, W] -> [B, N, C p p] patch tokens.
  torch::Tensor patchify(const torch::Tensor &x) {
    auto g = patch_grid(x, cfg_.patch);
    // FACT: x = torch.randn(2, 3, 8, 8); g = x.view(2, 3, 4, 2, 4, 2).permute(0, 2, 4, 1, 3, 5); assert is_copy_of(g.reshape(2, 16, -1), x)
    return g.reshape({x.size(0), g.size(1) * g.size(2), -1}); // EXPECT: tensor-reshape-non-contiguous -- the permuted patch grid cannot be merged by strides: a full copy of the batch every call
  }

  // [B, N, C p p] -> [B, C, H, W].
  torch::Tensor unpatchify(const torch::Tensor &tokens) {
    const auto p = cfg_.patch, g = cfg_.image_size / p, B = tokens.size(0);
    auto grid = tokens.view({B, g, g, cfg_.channels, p, p}).permute({0, 3, 1, 4, 2, 5});
    // FACT: t = torch.nn.Linear(4, 12)(torch.randn(2, 16, 4)); g = t.view(2, 4, 4, 3, 2, 2).permute(0, 3, 1, 4, 2, 5); assert not raises(lambda: g.contiguous().view(2, 3, 8, 8))
    return grid.contiguous().view({B, cfg_.channels, g * p, g * p}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first: the view is of the copy
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &t, const torch::Tensor &y) {
    auto tok = patch_embed(patchify(x)) + pos_embed;
    auto c = t_mlp->forward(timestep_embedding(t, cfg_.time_embed));
    // FACT: l = torch.nn.Linear(4, 4); c = l(torch.randn(2, 4)); c += torch.randn(2, 4); c.sum().backward(); assert l.weight.grad is not None
    c += y_embed(y); // LOOKALIKE: tensor-inplace-on-saved -- the last Linear of t_mlp does not save its output
    for (auto &blk : blocks)
      tok = blk->forward(tok, c);
    auto mod = final_ada(torch::silu(c)).unsqueeze(1).chunk(2, -1);
    return unpatchify(final_fc(modulate(final_norm(tok), mod[0], mod[1])));
  }

  FlowConfig cfg_;
  nn::Linear patch_embed{nullptr}, final_ada{nullptr}, final_fc{nullptr};
  torch::Tensor pos_embed;
  nn::Sequential t_mlp{nullptr};
  nn::Embedding y_embed{nullptr};
  std::vector<DiTBlock> blocks;
  nn::LayerNorm final_norm{nullptr};
};
TORCH_MODULE(VelocityNet);

void ema_update(VelocityNet &ema, VelocityNet &net, double decay) {
  torch::NoGradGuard no_grad;
  auto src = net->parameters(), dst = ema->parameters();
  for (size_t i = 0; i < dst.size(); ++i)
    dst[i].mul_(decay).add_(src[i], 1.0 - decay); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

// Classifier-free guidance training: a fraction of the labels becomes the null class.
torch::Tensor drop_labels(const torch::Tensor &y, const FlowConfig &cfg) {
  auto drop = torch::rand({y.size(0)}, torch::TensorOptions().device(y.device())) < cfg.label_drop;
  return y.masked_fill(drop, cfg.num_classes);
}

void train_flow(VelocityNet &net, VelocityNet &ema, const std::vector<ImageBatch> &data, const FlowConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  net->to(device);
  ema->to(device);
  for (auto &p : ema->parameters())
    p.requires_grad_(false);
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(0.0));
  auto vel_hist = torch::zeros({64}, torch::TensorOptions().device(device));
  auto ema_loss = torch::zeros({}, torch::TensorOptions().device(device));
  double running = 0;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    net->train();
    for (const auto &batch : data) {
      auto x1 = batch.images.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      const auto B = x1.size(0);
      auto x0 = torch::randn_like(x1);
      auto t = torch::sigmoid(torch::randn({B}) * cfg.logit_std + cfg.logit_mean); // logit-normal times
      auto tb = t.view({B, 1, 1, 1});
      auto xt = (1.0 - (1.0 - cfg.sigma_min) * tb) * x0 + tb * x1; // EXPECT: tensor-device-mismatch -- the times were drawn on the host, the images are on the GPU
      auto target = x1 - (1.0 - cfg.sigma_min) * x0;
      auto v_pred = net->forward(xt, t.to(device), drop_labels(batch.labels.to(device), cfg));
      // Velocity histogram for the dashboard, clipped to the plotted range.
      auto v_hist = v_pred.detach();
      // FACT: v = torch.nn.Linear(4, 4)(torch.randn(3, 4)) * 10; h = v.detach(); h.clamp_(-1.0, 1.0); assert shares_storage(h, v) and v.detach().abs().max() <= 1.0
      v_hist.clamp_(-cfg.hist_range, cfg.hist_range); // EXPECT: tensor-inplace-on-detached -- clamps v_pred itself: the loss below regresses clipped velocities
      vel_hist += torch::histc(v_hist, 64, -cfg.hist_range, cfg.hist_range); // LOOKALIKE: tensor-graph-kept-across-iterations -- a histogram of detached values carries no graph
      auto loss = F::mse_loss(v_pred, target);
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(net->parameters(), cfg.grad_clip);
      opt.step();
      ema_update(ema, net, cfg.ema_decay);
      ema_loss = 0.99 * ema_loss + 0.01 * loss; // EXPECT: tensor-graph-kept-across-iterations -- the smoothed loss chains every step's graph to the next
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- the GPU is drained every step only to sum the loss
      if (++step % cfg.log_every == 0) {
        std::cout << "step " << step << " loss " << running / static_cast<double>(cfg.log_every) << " ema "
                  << ema_loss.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
        running = 0;
      }
    }
  }
}

class FlowSampler {
public:
  FlowSampler(VelocityNet net, const FlowConfig &cfg, torch::Device device) : net_(std::move(net)), cfg_(cfg), device_(device) {}

  // Classifier-free guidance: v = v_uncond + w (v_cond - v_uncond), both halves in one batch.
  torch::Tensor velocity(const torch::Tensor &x, const torch::Tensor &t, const torch::Tensor &y) {
    auto null = torch::full_like(y, cfg_.num_classes);
    auto v = net_->forward(torch::cat({x, x}), torch::cat({t, t}), torch::cat({y, null})).chunk(2, 0);
    return v[1] + cfg_.guidance * (v[0] - v[1]);
  }

  // Integrates dx/dt = v(x, t) from noise at t = 0 to an image at t = 1.
  torch::Tensor sample(const torch::Tensor &noise, const torch::Tensor &labels, bool heun) {
    torch::NoGradGuard no_grad;
    net_->eval();
    const auto n = noise.size(0), steps = cfg_.sample_steps;
    const double dt = 1.0 / static_cast<double>(steps);
    auto x = noise.to(device_);
    for (int64_t i = 0; i < steps; ++i) {
      auto y = labels.to(device_); // EXPECT: tensor-clone-in-loop -- the same labels are copied to the device at every ODE step
      auto t = torch::full({n}, static_cast<double>(i) * dt, x.options()); // LOOKALIKE: tensor-device-mismatch -- made with x's options, on x's device
      auto v1 = velocity(x, t, y);
      if (!heun || i + 1 == steps) {
        x = x + dt * v1;
        continue;
      }
      auto x_euler = x;
      // FACT: x = torch.randn(2, 3); x0 = x.clone(); e = x; e += 0.1 * torch.ones(2, 3); assert shares_storage(e, x) and not torch.equal(x, x0)
      x_euler += dt * v1; // EXPECT: tensor-alias-then-mutate -- x_euler is x: the Heun average below starts from the Euler point, not from x
      auto v2 = velocity(x_euler, t + dt, y);
      x = x + 0.5 * dt * (v1 + v2);
    }
    return x;
  }

  // Reflow couplings: each noise draw with the image the current model maps it to, stored as 8-bit.
  std::pair<torch::Tensor, torch::Tensor> reflow_pairs(const torch::Tensor &labels, int64_t chunk) {
    const auto n = labels.size(0), S = cfg_.image_size;
    auto noise = torch::empty({n, cfg_.channels, S, S});
    auto images = torch::empty({n, cfg_.channels, S, S}, torch::kByte);
    for (int64_t off = 0; off < n; off += chunk) {
      const auto b = std::min(chunk, n - off);
      auto z = noise.narrow(0, off, b);
      // FACT: buf = torch.empty(6, 2); z = buf.narrow(0, 2, 2); z.normal_(); assert is_view_of(z, buf) and torch.equal(buf[2:4], z)
      z.normal_(); // LOOKALIKE: tensor-alias-then-mutate -- narrow is an explicit view: filling this chunk of the buffer is the point
      auto x1 = sample(z, labels.narrow(0, off, b), /*heun=*/true).cpu();
      // FACT: o = torch.empty(3, dtype=torch.uint8); o.copy_(((torch.tensor([0.999, -1.0, 0.0]) + 1.0) * 127.5).round().clamp(0, 255)); assert o.tolist() == [255, 0, 128]
      images.narrow(0, off, b).copy_(((x1 + 1.0) * 127.5).round().clamp(0, 255)); // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to [0, 255] before the uint8 store
    }
    return {noise, images};
  }

  // Straightness: mean squared gap between the velocity along the Euler path and its net displacement.
  double straightness(const torch::Tensor &noise, const torch::Tensor &labels) {
    torch::NoGradGuard no_grad;
    const auto n = noise.size(0), steps = cfg_.sample_steps;
    const double dt = 1.0 / static_cast<double>(steps);
    auto x = noise.to(device_);
    auto y = labels.to(device_); // LOOKALIKE: tensor-clone-in-loop -- moved once, before the loop
    auto disp = sample(noise, labels, /*heun=*/false) - x;
    auto gap = torch::zeros({}, x.options());
    for (int64_t i = 0; i < steps; ++i) {
      auto v = velocity(x, torch::full({n}, static_cast<double>(i) * dt, x.options()), y);
      gap += (disp - v).pow(2).mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
      x = x + dt * v;
    }
    return gap.item<double>() / static_cast<double>(steps); // LOOKALIKE: tensor-sync-in-loop -- read once, after the loop
  }

private:
  VelocityNet net_;
  FlowConfig cfg_;
  torch::Device device_;
};
