// Growing neural cellular automata: a learned local update rule that grows a
// pattern from a single seed cell, trained with a sample pool and damage so
// the pattern persists and regenerates.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
using torch::indexing::None;
using torch::indexing::Slice;

struct NCAConfig {
  int64_t channels = 16;
  int64_t hidden = 128;
  int64_t size = 40;
  int64_t pad = 6;
  int64_t pool_size = 256;
  int64_t batch = 8;
  int64_t reset_n = 1;
  int64_t damage_n = 3;
  double fire_rate = 0.5;
  double alive_threshold = 0.1;
  int min_steps = 32;
  int max_steps = 64;
  int iterations = 2000;
  int log_every = 100;
  double lr = 2e-3;
};

// identity + Sobel x/y for every channel, laid out for a depthwise conv
torch::Tensor sobel_bank(int64_t channels) {
  auto ident = torch::zeros({3, 3});
  ident[1][1] = 1.0;
  auto sx = torch::tensor({{-1.0f, 0.0f, 1.0f}, {-2.0f, 0.0f, 2.0f}, {-1.0f, 0.0f, 1.0f}}) / 8.0;
  auto bank = torch::stack({ident, sx, sx.t()});
  return bank.repeat({channels, 1, 1}).unsqueeze(1);
}

struct CAModelImpl : torch::nn::Module {
  explicit CAModelImpl(const NCAConfig& cfg)
      : cfg_(cfg),
        fc0(register_module("fc0", torch::nn::Conv2d(torch::nn::Conv2dOptions(3 * cfg.channels, cfg.hidden, 1)))),
        fc1(register_module("fc1", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.hidden, cfg.channels, 1).bias(false)))) {
    kernel_ = register_buffer("kernel", sobel_bank(cfg.channels));
    // start from the do-nothing rule
    fc1->weight.zero_();  // EXPECT: tensor-inplace-on-leaf
    torch::nn::init::zeros_(fc0->bias);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under NoGradGuard
  }

  torch::Tensor perceive(const torch::Tensor& x) {
    return F::conv2d(x, kernel_, F::Conv2dFuncOptions().padding(1).groups(cfg_.channels));
  }

  torch::Tensor alive(const torch::Tensor& x) {
    auto alpha = x.slice(1, 3, 4);
    return F::max_pool2d(alpha, F::MaxPool2dFuncOptions(3).stride(1).padding(1)) > cfg_.alive_threshold;
  }

  torch::Tensor forward(torch::Tensor x) {
    auto pre_life = alive(x);
    auto dx = fc1(torch::relu(fc0(perceive(x))));
    auto fire = torch::rand({x.size(0), 1, x.size(2), x.size(3)}, x.options()) <= cfg_.fire_rate;
    // FACT: w = torch.rand(4, 2, 1, 1, requires_grad=True); h = torch.rand(2, 2, 5, 5); d = torch.nn.functional.conv2d(h, w); d.mul_(torch.rand(2, 1, 5, 5) < 0.5); d.sum().backward()
    dx.mul_(fire);  // LOOKALIKE: tensor-inplace-on-saved -- a conv saves its input and weight, not its output
    // FACT: assert backward_fails(lambda: (lambda x: (lambda p: (x.add_(p[:, :8]), x.sum().backward()))(torch.nn.functional.conv2d(x, torch.rand(24, 1, 3, 3), padding=1, groups=8)))(torch.rand(2, 8, 5, 5, requires_grad=True) * 1))
    x.add_(dx);  // EXPECT: tensor-inplace-on-saved
    auto life = pre_life & alive(x);
    return x * life;
  }

  NCAConfig cfg_;
  torch::nn::Conv2d fc0, fc1;
  torch::Tensor kernel_;
};
TORCH_MODULE(CAModel);

struct SamplePool {
  SamplePool(const NCAConfig& cfg, const torch::Device& device) {
    seed = torch::zeros({1, cfg.channels, cfg.size, cfg.size}, device);
    seed.index_put_({0, Slice(3, None), cfg.size / 2, cfg.size / 2}, 1.0);
    states = seed.repeat({cfg.pool_size, 1, 1, 1});
  }
  torch::Tensor sample(const torch::Tensor& idx) const { return states.index_select(0, idx); }
  void commit(const torch::Tensor& idx, const torch::Tensor& x) {
    states.index_copy_(0, idx, x.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before it enters the pool
  }
  torch::Tensor seed;
  torch::Tensor states;
};

torch::Tensor make_target(int64_t size, int64_t pad) {
  const int64_t inner = size - 2 * pad;
  auto c = torch::linspace(-1.0, 1.0, inner);
  auto yy = c.view({-1, 1});
  auto xx = c.view({1, -1});
  auto r = torch::sqrt(yy * yy + xx * xx);
  auto alpha = ((r < 0.9) & (r > 0.55)).to(torch::kFloat) + (r < 0.25).to(torch::kFloat);
  auto rgb = torch::stack({0.95 * alpha, 0.5 * alpha * (1.0 - r).clamp_min(0.0), 0.7 * alpha * r.clamp_max(1.0)});
  auto rgba = torch::cat({rgb, alpha.unsqueeze(0)}, 0).unsqueeze(0);
  return F::pad(rgba, F::PadFuncOptions({pad, pad, pad, pad}));
}

torch::Tensor circle_damage_mask(int64_t n, int64_t size, const torch::TensorOptions& opts) {
  auto c = torch::linspace(-1.0, 1.0, size, opts);
  auto yy = c.view({1, size, 1});
  auto xx = c.view({1, 1, size});
  auto cy = torch::rand({n, 1, 1}, opts) - 0.5;
  auto cx = torch::rand({n, 1, 1}, opts) - 0.5;
  auto r = torch::rand({n, 1, 1}, opts) * 0.3 + 0.1;
  return (((yy - cy).pow(2) + (xx - cx).pow(2)) < r.pow(2)).unsqueeze(1);
}

// shifts every pattern one cell to the right so the rule cannot lean on absolute position
void nudge_right(torch::Tensor& x) {
  const int64_t W = x.size(3);
  // FACT: x = torch.arange(16.).view(1, 1, 2, 8); y = x.clone(); x.narrow(3, 1, 7).copy_(x.narrow(3, 0, 7)); assert not torch.equal(x.narrow(3, 1, 7), y.narrow(3, 0, 7))
  x.narrow(3, 1, W - 1).copy_(x.narrow(3, 0, W - 1));  // EXPECT: tensor-inplace-overlap
  x.narrow(3, 0, 1).zero_();
}

// mean |value| of every channel over living cells, for the log line
torch::Tensor hidden_channel_stats(const torch::Tensor& x, double threshold) {
  // FACT: x = torch.rand(2, 16, 5, 5); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(-1, 16), x)
  auto cells = x.permute({0, 2, 3, 1}).reshape({-1, x.size(1)});  // EXPECT: tensor-reshape-non-contiguous
  auto living = cells.select(1, 3) > threshold;
  return cells.index({living}).abs().mean(0);
}

void write_frame(const std::string& stem, const torch::Tensor& rgba) {
  auto cpu = rgba.to(torch::kCPU);
  auto a = cpu.slice(0, 3, 4).clamp(0.0, 1.0);
  auto rgb = (1.0 - a + cpu.slice(0, 0, 3)).clamp(0.0, 1.0);  // premultiplied, composite on white
  const int64_t H = rgb.size(1), W = rgb.size(2);
  auto pixels = torch::empty({H, W, 3}, torch::kUInt8);
  // FACT: p = torch.empty(2, dtype=torch.uint8); p.copy_(torch.tensor([254.7, 3.9])); assert p.tolist() == [254, 3]
  pixels.copy_(rgb.permute({1, 2, 0}) * 255.0);  // EXPECT: tensor-copy-narrowing
  auto mask = torch::empty({H, W}, torch::kUInt8);
  mask.copy_((a.squeeze(0) * 255.0).round().to(torch::kUInt8));  // LOOKALIKE: tensor-copy-narrowing -- rounded and converted explicitly first
  std::ofstream ppm(stem + ".ppm", std::ios::binary);
  ppm << "P6\n" << W << " " << H << "\n255\n";
  ppm.write(reinterpret_cast<const char*>(pixels.data_ptr<uint8_t>()), pixels.numel());
  std::ofstream pgm(stem + "_alpha.pgm", std::ios::binary);
  pgm << "P5\n" << W << " " << H << "\n255\n";
  pgm.write(reinterpret_cast<const char*>(mask.data_ptr<uint8_t>()), mask.numel());
}

// grows one pattern, then damages copies of it and records how they heal
void regeneration_demo(CAModel& model, const torch::Tensor& seed, const NCAConfig& cfg,
                       int64_t n, int steps) {
  torch::NoGradGuard no_grad;
  auto x = seed.clone();  // LOOKALIKE: tensor-unnecessary-clone -- forward() updates its input in place; this keeps the seed intact
  for (int s = 0; s < steps; ++s) x = model(x);
  auto copies = x.expand({n, -1, -1, -1});
  auto keep = circle_damage_mask(n, cfg.size, x.options()).logical_not();
  // FACT: assert raises(lambda: torch.rand(1, 4, 5, 5).expand(3, -1, -1, -1).mul_(torch.rand(3, 1, 5, 5) > 0.5), "more than one element")
  copies.mul_(keep);  // EXPECT: tensor-inplace-on-expanded
  for (int s = 0; s < steps; ++s) {
    copies = model(copies);
    if (s % 8 == 0) {
      auto rgba = copies.slice(1, 0, 4);
      // FACT: x = torch.rand(3, 16, 5, 5) * 2; v = x[:, :4]; v.clamp_(0.0, 1.0); assert is_view_of(v, x) and x[:, :4].max() <= 1.0
      rgba.clamp_(0.0, 1.0);  // EXPECT: tensor-alias-then-mutate
      for (int64_t i = 0; i < n; ++i)
        write_frame("regen_" + std::to_string(i) + "_" + std::to_string(s), rgba[i]);
    }
  }
}

int main() {
  NCAConfig cfg;
  torch::manual_seed(0);
  std::mt19937 rng(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto target_rgba = make_target(cfg.size, cfg.pad);
  CAModel model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  SamplePool pool(cfg, device);
  std::uniform_int_distribution<int> n_steps(cfg.min_steps, cfg.max_steps);
  std::bernoulli_distribution coin(0.25);

  std::vector<torch::Tensor> curve;
  int64_t alive_cells = 0;
  const int64_t B = cfg.batch;
  for (int it = 0; it < cfg.iterations; ++it) {
    auto idx = torch::randperm(cfg.pool_size, torch::kLong).narrow(0, 0, B).to(device);  // LOOKALIKE: tensor-clone-in-loop -- new indices every iteration
    auto target = target_rgba.to(device);  // EXPECT: tensor-clone-in-loop
    auto x = pool.sample(idx);
    {
      torch::NoGradGuard no_grad;
      auto per = (x.slice(1, 0, 4) - target).pow(2).mean({1, 2, 3});
      auto order = per.argsort(0, /*descending=*/true);
      x = x.index_select(0, order);
      idx = idx.index_select(0, order);
      // FACT: assert not raises(lambda: torch.rand(8, 16, 5, 5).narrow(0, 0, 1).copy_(torch.zeros(1, 16, 5, 5).expand(1, -1, -1, -1)))
      x.narrow(0, 0, cfg.reset_n).copy_(pool.seed.expand({cfg.reset_n, -1, -1, -1}));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded seed is only the source, x is dense
      auto damaged = x.narrow(0, B - cfg.damage_n, cfg.damage_n);
      // FACT: x = torch.rand(8, 16, 5, 5); d = x.narrow(0, 5, 3); d.masked_fill_(torch.rand(3, 1, 5, 5) > 0.5, 0.0); assert is_view_of(d, x)
      damaged.masked_fill_(circle_damage_mask(cfg.damage_n, cfg.size, x.options()), 0.0);  // LOOKALIKE: tensor-alias-then-mutate -- the narrow view exists to damage those samples of the batch
      if (coin(rng)) nudge_right(x);
    }

    const int steps = n_steps(rng);
    for (int s = 0; s < steps; ++s) {
      x = model(x);
      alive_cells += (x.select(1, 3) > cfg.alive_threshold).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    }
    // FACT: x = torch.rand(8, 16, 5, 5); assert is_view_of(x[:, 0:4].reshape(8, -1), x)
    auto per_sample = (x.slice(1, 0, 4).reshape({B, -1}) - target.reshape({1, -1})).pow(2).mean(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- a channel slice keeps each sample's block contiguous, this is a view
    auto loss = per_sample.mean();

    opt.zero_grad();
    loss.backward();
    for (auto& p : model->parameters())
      if (p.grad().defined()) p.grad().div_(p.grad().norm() + 1e-8);
    opt.step();
    pool.commit(idx, x);
    // FACT: l = (torch.rand(3, requires_grad=True) * 2).sum(); c = [l]; assert kept_nodes(c) >= 2
    curve.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations

    if (it % cfg.log_every == 0) {
      auto stats = hidden_channel_stats(x.detach(), cfg.alive_threshold);
      std::printf("it %5d  loss %.5f  alive %.1f  |h| %.4f\n", it, loss.item<float>(),  // LOOKALIKE: tensor-sync-in-loop -- read only every log_every iterations
                  static_cast<double>(alive_cells) / (cfg.log_every * B), stats.mean().item<float>());
      alive_cells = 0;
    }
  }
  std::ofstream csv("loss_curve.csv");
  auto losses = torch::stack(curve).detach().cpu();
  auto acc = losses.accessor<float, 1>();
  for (int64_t i = 0; i < acc.size(0); ++i) csv << i << "," << acc[i] << "\n";
  regeneration_demo(model, pool.seed, cfg, 4, cfg.max_steps);
  return 0;
}
