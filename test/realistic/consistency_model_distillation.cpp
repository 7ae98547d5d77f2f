// Consistency distillation (Song et al., 2023): a student f(x, sigma) learns to map
// any point of the teacher's probability-flow ODE straight to its endpoint, by
// matching an EMA target evaluated one Heun step closer to the data.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace cd {

struct DistillConfig {
  int64_t num_scales = 18;
  double sigma_min = 0.002, sigma_max = 80.0, sigma_data = 0.5, rho = 7.0;
  double lr = 4e-4, target_ema = 0.95;
  int64_t steps = 400000, batch_size = 64, log_every = 500, val_every = 10000;
  int64_t channels = 3, image_size = 32, width = 128, heads = 4;
  std::string teacher_path = "edm_cifar10.pt", data_path = "cifar10_train_u8.pt";
};

// Karras et al. noise levels, highest first.
std::vector<double> karras_sigmas(const DistillConfig& c) {
  std::vector<double> out(c.num_scales);
  const double hi = std::pow(c.sigma_max, 1.0 / c.rho), lo = std::pow(c.sigma_min, 1.0 / c.rho);
  for (int64_t i = 0; i < c.num_scales; ++i) {
    out[i] = std::pow(hi + double(i) / double(c.num_scales - 1) * (lo - hi), c.rho);
  }
  return out;
}

torch::Tensor fourier_features(const torch::Tensor& c_noise, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(torch::arange(half, c_noise.options()) * (-std::log(10000.0) / half));
  auto a = c_noise.view({-1, 1}) * freqs.view({1, -1});
  return torch::cat({a.cos(), a.sin()}, 1);
}

struct ResBlockImpl : torch::nn::Cloneable<ResBlockImpl> {
  ResBlockImpl(int64_t ch, int64_t emb_dim) : ch_(ch), emb_dim_(emb_dim) { reset(); }

  void reset() override {
    const auto ch = ch_, emb_dim = emb_dim_;
    norm1 = register_module("norm1", torch::nn::GroupNorm(torch::nn::GroupNormOptions(32, ch)));
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, ch, 3).padding(1)));
    emb = register_module("emb", torch::nn::Linear(emb_dim, 2 * ch));
    norm2 = register_module("norm2", torch::nn::GroupNorm(torch::nn::GroupNormOptions(32, ch)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, ch, 3).padding(1)));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& e) {
    auto h = conv1(torch::silu(norm1(x)));
    auto ss = emb(e).chunk(2, 1);
    // FACT: t = torch.randn(2, 8).chunk(2, 1)[0]; assert not is_contiguous(t) and not raises(lambda: t.view(2, 4, 1, 1))
    auto scale = ss[0].view({-1, h.size(1), 1, 1});  // LOOKALIKE: tensor-view-non-contiguous -- only appends size-1 dims to the chunk
    auto shift = ss[1].view({-1, h.size(1), 1, 1});
    h = torch::silu(norm2(h) * (1 + scale) + shift);
    return x + conv2(h);
  }

  int64_t ch_, emb_dim_;
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear emb{nullptr};
};
TORCH_MODULE(ResBlock);

struct SelfAttentionImpl : torch::nn::Cloneable<SelfAttentionImpl> {
  SelfAttentionImpl(int64_t ch, int64_t heads) : ch_(ch), heads_(heads) { reset(); }

  void reset() override {
    norm = register_module("norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(32, ch_)));
    qkv = register_module("qkv", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch_, 3 * ch_, 1)));
    proj = register_module("proj", torch::nn::Linear(ch_, ch_));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const auto L = H * W, hd = C / heads_;
    auto t = qkv(norm(x)).view({B, 3, heads_, hd, L});
    auto q = t.select(1, 0), k = t.select(1, 1), v = t.select(1, 2);
    auto w = torch::softmax(torch::matmul(q.transpose(-2, -1), k) / std::sqrt(double(hd)), -1);
    auto out = torch::matmul(w, v.transpose(-2, -1));
    // FACT: o = torch.randn(2, 2, 5, 3); assert raises(lambda: o.transpose(1, 2).view(2, 5, 6), "view size is not compatible")
    out = proj(out.transpose(1, 2).view({B, L, C}));  // EXPECT: tensor-view-non-contiguous
    // FACT: t = torch.randn(2, 12, 3).transpose(1, 2); assert not is_contiguous(t) and not raises(lambda: t.view(2, 3, 3, 4))
    return x + out.transpose(1, 2).view({B, C, H, W});  // LOOKALIKE: tensor-view-non-contiguous -- splitting the token dim into H, W is a valid view
  }

  int64_t ch_, heads_;
  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv2d qkv{nullptr};
  torch::nn::Linear proj{nullptr};
};
TORCH_MODULE(SelfAttention);

// EDM-preconditioned network. With boundary = true the skip scalings satisfy
// f(x, sigma_min) = x, which is what a consistency model needs.
struct ConsistencyNetImpl : torch::nn::Cloneable<ConsistencyNetImpl> {
  ConsistencyNetImpl(const DistillConfig& cfg, bool boundary) : cfg_(cfg), boundary_(boundary) {
    reset();
  }

  void reset() override {
    const auto w = cfg_.width;
    sigma_mlp = register_module("sigma_mlp", torch::nn::Sequential(torch::nn::Linear(w, 4 * w),
                                                                 torch::nn::SiLU(),
                                                                 torch::nn::Linear(4 * w, 4 * w)));
    conv_in = register_module("conv_in", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg_.channels, w, 3).padding(1)));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < 4; ++i) blocks->push_back(ResBlock(w, 4 * w));
    attn = register_module("attn", SelfAttention(w, cfg_.heads));
    conv_out = register_module("conv_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(w, cfg_.channels, 3).padding(1)));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& sigma) {
    const double sd = cfg_.sigma_data, s0 = boundary_ ? cfg_.sigma_min : 0.0;
    auto s = sigma.view({-1, 1, 1, 1});
    auto c_skip = sd * sd / ((s - s0).pow(2) + sd * sd);
    auto c_out = (s - s0) * sd / (s * s + sd * sd).sqrt();
    auto c_in = 1.0 / (s * s + sd * sd).sqrt();
    auto x_in = x.clone().mul_(c_in);  // EXPECT: tensor-unnecessary-clone
    auto e = sigma_mlp->forward(fourier_features(0.25 * sigma.log(), cfg_.width));
    auto h = conv_in(x_in);
    for (size_t i = 0; i < blocks->size(); ++i) {
      h = blocks[i]->as<ResBlockImpl>()->forward(h, e);
      if (i == 1) h = attn(h);
    }
    return c_skip * x + c_out * conv_out(torch::silu(h));
  }

  DistillConfig cfg_;
  bool boundary_;
  torch::nn::Sequential sigma_mlp{nullptr};
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  SelfAttention attn{nullptr};
};
TORCH_MODULE(ConsistencyNet);

// One Heun step of dx/dsigma = (x - D(x, sigma)) / sigma, from s_hi down to s_lo.
torch::Tensor heun_step(ConsistencyNet& teacher, const torch::Tensor& x, const torch::Tensor& s_hi,
                        const torch::Tensor& s_lo) {
  auto hi = s_hi.view({-1, 1, 1, 1}), lo = s_lo.view({-1, 1, 1, 1});
  auto d_hi = (x - teacher->forward(x, s_hi)) / hi;
  torch::Tensor x_lo = x;
  // FACT: a = torch.zeros(2, 3); b = a; b.add_(torch.ones(2, 3)); assert shares_storage(a, b) and a.sum().item() == 6
  x_lo.add_(d_hi * (lo - hi));  // EXPECT: tensor-alias-then-mutate
  auto d_lo = (x_lo - teacher->forward(x_lo, s_lo)) / lo;
  return x + 0.5 * (lo - hi) * (d_hi + d_lo);
}

torch::Tensor to_model_range(const torch::Tensor& u8_nhwc, torch::Device device) {
  // FACT: b = torch.randint(0, 255, (2, 4, 4, 3), dtype=torch.uint8); assert is_copy_of(b.permute(0, 3, 1, 2).to(torch.float32), b)
  auto x = u8_nhwc.permute({0, 3, 1, 2}).to(torch::kFloat32);
  x.div_(127.5).sub_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- the dtype change made a new float buffer
  return x.to(device);
}

torch::Tensor distill_step(ConsistencyNet& student, ConsistencyNet& target, ConsistencyNet& teacher,
                           const torch::Tensor& sigmas, const torch::Tensor& x0,
                           const DistillConfig& cfg, torch::Tensor* preview) {
  const auto B = x0.size(0);
  auto n = torch::randint(0, cfg.num_scales - 1, {B}, x0.options().dtype(torch::kLong));
  auto s_hi = sigmas.index_select(0, n);
  auto s_lo = sigmas.index_select(0, n + 1);
  auto noise = torch::randn({B, cfg.channels, cfg.image_size, cfg.image_size});
  auto x_hi = x0 + noise * s_hi.view({-1, 1, 1, 1});  // EXPECT: tensor-device-mismatch
  torch::Tensor x_lo;
  {
    torch::NoGradGuard no_grad;
    x_lo = heun_step(teacher, x_hi, s_hi, s_lo);
  }
  auto f_target = target->forward(x_lo, s_lo).detach();
  f_target.clamp_(-1.0, 1.0);  // LOOKALIKE: tensor-inplace-on-detached -- the target network's graph is never backpropagated
  auto f_online = student->forward(x_hi, s_hi);
  auto loss = torch::mse_loss(f_online, f_target);
  if (preview != nullptr) {
    *preview = f_online.detach();
    // FACT: assert backward_fails(lambda: (p := torch.randn(3, requires_grad=True) * 1, l := torch.nn.functional.mse_loss(p, torch.zeros(3)), p.detach().clamp_(-1, 1), l.backward()))
    preview->clamp_(-1.0, 1.0);  // EXPECT: tensor-inplace-on-detached
  }
  return loss;
}

void update_target(ConsistencyNet& target, ConsistencyNet& student, double mu) {
  auto tp = target->parameters(), sp = student->parameters();
  for (size_t i = 0; i < tp.size(); ++i) {
    // FACT: assert raises(lambda: torch.nn.Linear(2, 2).weight.mul_(0.9), "leaf Variable")
    tp[i].mul_(mu).add_(sp[i].detach(), 1.0 - mu);  // EXPECT: tensor-inplace-on-leaf
  }
}

double validate(ConsistencyNet& student, const torch::Tensor& sigmas,
                const std::vector<torch::Tensor>& val_batches) {
  student->eval();
  auto total = torch::zeros({}, sigmas.options());
  for (const auto& x0 : val_batches) {
    auto s = sigmas[0].expand({x0.size(0)});
    auto x = x0 + torch::randn_like(x0) * sigmas[0];
    total += torch::mse_loss(student->forward(x, s), x0);  // EXPECT: tensor-graph-kept-across-iterations
  }
  student->train();
  return total.item<double>() / double(val_batches.size());
}

// Multistep consistency sampling: denoise in one step, re-noise to tau, repeat.
std::vector<torch::Tensor> sample(ConsistencyNet& net, const std::vector<double>& taus, int64_t n,
                                  const DistillConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto opts = torch::TensorOptions().device(device);
  auto sig = [&](double s) { return torch::full({n}, s, opts); };
  auto x = torch::randn({n, cfg.channels, cfg.image_size, cfg.image_size}, opts) * cfg.sigma_max;
  x = net->forward(x, sig(cfg.sigma_max));
  std::vector<torch::Tensor> trajectory{x};
  for (double tau : taus) {
    auto z = torch::randn_like(x);  // LOOKALIKE: tensor-device-mismatch -- randn_like allocates on x's device
    x = net->forward(x + std::sqrt(tau * tau - cfg.sigma_min * cfg.sigma_min) * z, sig(tau));
    trajectory.push_back(x);  // LOOKALIKE: tensor-graph-kept-across-iterations -- sampling runs under NoGradGuard
  }
  return trajectory;
}

torch::Tensor make_grid(const torch::Tensor& imgs, int64_t cols) {
  using torch::indexing::Slice;
  const auto n = imgs.size(0), C = imgs.size(1), H = imgs.size(2), W = imgs.size(3);
  const auto rows = (n + cols - 1) / cols;
  auto grid = torch::zeros({C, rows * H, cols * W}, torch::kUInt8);
  auto pix = ((imgs.cpu() + 1.0) * 127.5).clamp(0, 255);
  for (int64_t i = 0; i < n; ++i) {
    const auto r = i / cols, c = i % cols;
    grid.index_put_({Slice(), Slice(r * H, (r + 1) * H), Slice(c * W, (c + 1) * W)}, pix[i]);  // EXPECT: tensor-copy-narrowing
  }
  return grid;
}

}  // namespace cd

int main() {
  using namespace cd;
  DistillConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  ConsistencyNet teacher(cfg, /*boundary=*/false), student(cfg, /*boundary=*/true);
  torch::load(teacher, cfg.teacher_path);
  teacher->to(device);
  teacher->eval();
  for (auto& p : teacher->parameters()) p.requires_grad_(false);
  student->to(device);
  {
    torch::NoGradGuard no_grad;
    auto sp = student->parameters(), tp = teacher->parameters();
    for (size_t i = 0; i < sp.size(); ++i) {
      sp[i].copy_(tp[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- initialising from the teacher under NoGradGuard
    }
  }
  ConsistencyNet target(std::dynamic_pointer_cast<ConsistencyNetImpl>(student->clone()));  // LOOKALIKE: tensor-unnecessary-clone -- Module::clone gives the EMA target its own weights, which update_target writes
  target->eval();

  auto sigmas = torch::tensor(karras_sigmas(cfg), torch::kFloat64).to(device, torch::kFloat32);  // LOOKALIKE: tensor-copy-narrowing -- explicit dtype conversion of the host table

  torch::Tensor data;
  torch::load(data, cfg.data_path);
  std::vector<torch::Tensor> val_batches;
  for (int64_t i = 0; i < 8; ++i) {
    val_batches.push_back(to_model_range(data.narrow(0, i * cfg.batch_size, cfg.batch_size), device));
  }

  torch::optim::Adam opt(student->parameters(), torch::optim::AdamOptions(cfg.lr));
  double smoothed = 0.0;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto idx = torch::randint(0, data.size(0), {cfg.batch_size}, torch::kLong);
    auto x0 = to_model_range(data.index_select(0, idx), device);
    const bool log_now = step % cfg.log_every == 0;
    torch::Tensor preview;
    auto loss = distill_step(student, target, teacher, sigmas, x0, cfg, log_now ? &preview : nullptr);
    opt.zero_grad();
    loss.backward();
    opt.step();
    update_target(target, student, cfg.target_ema);
    smoothed = 0.99 * smoothed + 0.01 * loss.item<double>();  // EXPECT: tensor-sync-in-loop
    if (log_now) {
      std::printf("step %lld loss %.5f\n", static_cast<long long>(step), smoothed);
      torch::save(make_grid(preview.to(torch::kCPU), 8), "preview.pt");  // LOOKALIKE: tensor-sync-in-loop -- only on logging steps
    }
    if (step % cfg.val_every == 0) {
      std::printf("val mse %.5f\n", validate(student, sigmas, val_batches));
      torch::save(student, "cd_student.pt");
    }
  }

  auto traj = sample(student, {0.821, 0.1}, 64, cfg, device);
  torch::save(make_grid(traj.back(), 8), "samples.pt");
  return 0;
}
