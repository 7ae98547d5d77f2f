// Pixel-space DiT (Peebles & Xie, "Scalable Diffusion Models with Transformers") for 32x32
// class-conditional images: patchify, adaLN-Zero blocks conditioned on timestep + class,
// epsilon-prediction training and DDIM sampling with classifier-free guidance.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

struct DiTConfig {
  int64_t image_size = 32;
  int64_t patch = 2;
  int64_t in_channels = 3;
  int64_t hidden = 384;
  int64_t depth = 12;
  int64_t heads = 6;
  double mlp_ratio = 4.0;
  int64_t num_classes = 10;
  double class_dropout = 0.1;
  bool learn_sigma = true;
  int64_t diffusion_steps = 1000;
};

// adaLN modulation of a freshly normalised activation.
static torch::Tensor modulate(torch::Tensor x, const torch::Tensor& shift, const torch::Tensor& scale) {
  // FACT: x=torch.randn(2,5,8,requires_grad=True); s=torch.randn(2,8,requires_grad=True); y=torch.nn.functional.layer_norm(x,(8,)).mul_(1+s.unsqueeze(1)).add_(s.unsqueeze(1)); y.sum().backward(); assert x.grad is not None
  return x.mul_(1 + scale.unsqueeze(1)).add_(shift.unsqueeze(1));  // LOOKALIKE: tensor-inplace-on-saved -- layer_norm saves its input and stats, not its output
}

// Fixed 2-D sin-cos position table, as in MAE / DiT.
static torch::Tensor sincos_pos_embed(int64_t dim, int64_t grid) {
  auto rows = torch::arange(grid, torch::kFloat64).repeat_interleave(grid);
  auto cols = torch::arange(grid, torch::kFloat64).repeat({grid});
  auto omega = 1.0 / torch::pow(10000.0, torch::arange(dim / 4, torch::kFloat64) / (dim / 4.0));
  auto axis = [&](const torch::Tensor& pos) {
    auto out = torch::outer(pos, omega);
    return torch::cat({out.sin(), out.cos()}, 1);
  };
  return torch::cat({axis(rows), axis(cols)}, 1).to(torch::kFloat32);
}

struct TimestepEmbedderImpl : torch::nn::Module {
  TimestepEmbedderImpl(int64_t hidden, int64_t freq_dim = 256) : freq_dim_(freq_dim) {
    fc1 = register_module("fc1", torch::nn::Linear(freq_dim, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    torch::nn::init::normal_(fc1->weight, 0.0, 0.02);
    torch::nn::init::normal_(fc2->weight, 0.0, 0.02);
  }
  torch::Tensor forward(const torch::Tensor& t) {
    const int64_t half = freq_dim_ / 2;
    auto freqs = torch::exp(-std::log(10000.0) *
                            torch::arange(half, t.options().dtype(torch::kFloat32)) / half);
    auto args = t.to(torch::kFloat32).unsqueeze(1) * freqs.unsqueeze(0);
    auto emb = torch::cat({torch::cos(args), torch::sin(args)}, -1);
    return fc2(torch::silu(fc1(emb)));
  }
  int64_t freq_dim_;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TimestepEmbedder);

// Class embedding with an extra "null" row used for classifier-free guidance.
struct LabelEmbedderImpl : torch::nn::Module {
  LabelEmbedderImpl(int64_t num_classes, int64_t hidden, double dropout)
      : num_classes_(num_classes), dropout_(dropout) {
    table = register_module("table", torch::nn::Embedding(num_classes + 1, hidden));
    torch::nn::init::normal_(table->weight, 0.0, 0.02);
  }
  torch::Tensor forward(torch::Tensor labels, bool train) {
    if (train && dropout_ > 0) {
      auto drop = torch::rand({labels.size(0)}, torch::TensorOptions().device(labels.device())) < dropout_;
      auto y = labels;
      // FACT: y=torch.tensor([3,1,4,1]); l=y; l.masked_fill_(torch.tensor([True,False,False,True]),10); assert shares_storage(l,y) and int(y[0])==10
      y.masked_fill_(drop, num_classes_);  // EXPECT: tensor-alias-then-mutate
      return table(y);
    }
    return table(labels);
  }
  int64_t num_classes_;
  double dropout_;
  torch::nn::Embedding table{nullptr};
};
TORCH_MODULE(LabelEmbedder);

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t dim, int64_t heads)
      : heads_(heads), head_dim_(dim / heads), scale_(1.0 / std::sqrt(static_cast<double>(dim / heads))) {
    qkv = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    proj = register_module("proj", torch::nn::Linear(dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), N = x.size(1), D = x.size(2);
    auto parts = qkv(x).reshape({B, N, 3, heads_, head_dim_}).permute({2, 0, 3, 1, 4});
    auto q = parts[0], k = parts[1], v = parts[2];
    auto attn = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) * scale_, -1);
    auto out = torch::matmul(attn, v);
    // FACT: o=torch.randn(2,6,5,8).transpose(1,2); assert raises(lambda: o.view(2,5,48)) and is_contiguous(o.contiguous().view(2,5,48))
    out = out.transpose(1, 2).contiguous().view({B, N, D});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() right before the view
    return proj(out);
  }
  int64_t heads_, head_dim_;
  double scale_;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(Attention);

struct DiTBlockImpl : torch::nn::Module {
  DiTBlockImpl(int64_t hidden, int64_t heads, double mlp_ratio) {
    const auto mlp_hidden = static_cast<int64_t>(hidden * mlp_ratio);
    auto ln = torch::nn::LayerNormOptions({hidden}).elementwise_affine(false).eps(1e-6);
    norm1 = register_module("norm1", torch::nn::LayerNorm(ln));
    norm2 = register_module("norm2", torch::nn::LayerNorm(ln));
    attn = register_module("attn", Attention(hidden, heads));
    fc1 = register_module("fc1", torch::nn::Linear(hidden, mlp_hidden));
    fc2 = register_module("fc2", torch::nn::Linear(mlp_hidden, hidden));
    adaLN = register_module("adaLN", torch::nn::Linear(hidden, 6 * hidden));
    // adaLN-Zero: every block starts out as the identity map.
    torch::nn::init::constant_(adaLN->weight, 0.0);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under NoGradGuard
    torch::nn::init::constant_(adaLN->bias, 0.0);
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& c) {
    auto mod = adaLN(torch::silu(c)).chunk(6, 1);
    const auto &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
    const auto &shift_mlp = mod[3], &scale_mlp = mod[4], &gate_mlp = mod[5];
    // FACT: x=torch.randn(2,3,4,requires_grad=True)*1; h=torch.nn.functional.layer_norm(x,(4,)); x.add_(h*2); assert backward_fails(lambda: x.sum().backward())
    x += gate_msa.unsqueeze(1) * attn(modulate(norm1(x), shift_msa, scale_msa));  // EXPECT: tensor-inplace-on-saved
    auto h = fc2(torch::gelu(fc1(modulate(norm2(x), shift_mlp, scale_mlp)), "tanh"));
    return x + gate_mlp.unsqueeze(1) * h;
  }
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, adaLN{nullptr};
};
TORCH_MODULE(DiTBlock);

struct FinalLayerImpl : torch::nn::Module {
  FinalLayerImpl(int64_t hidden, int64_t patch, int64_t out_channels) {
    norm = register_module("norm", torch::nn::LayerNorm(
        torch::nn::LayerNormOptions({hidden}).elementwise_affine(false).eps(1e-6)));
    linear = register_module("linear", torch::nn::Linear(hidden, patch * patch * out_channels));
    adaLN = register_module("adaLN", torch::nn::Linear(hidden, 2 * hidden));
    // Zero the output head so the untrained model predicts zero noise.
    for (auto& p : parameters()) p.zero_();  // EXPECT: tensor-inplace-on-leaf
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& c) {
    auto mod = adaLN(torch::silu(c)).chunk(2, 1);
    return linear(modulate(norm(x), mod[0], mod[1]));
  }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear linear{nullptr}, adaLN{nullptr};
};
TORCH_MODULE(FinalLayer);

struct DiTImpl : torch::nn::Module {
  explicit DiTImpl(const DiTConfig& cfg) : cfg_(cfg) {
    out_channels_ = cfg.learn_sigma ? 2 * cfg.in_channels : cfg.in_channels;
    grid_ = cfg.image_size / cfg.patch;
    x_embed = register_module("x_embed", torch::nn::Conv2d(
        torch::nn::Conv2dOptions(cfg.in_channels, cfg.hidden, cfg.patch).stride(cfg.patch)));
    t_embed = register_module("t_embed", TimestepEmbedder(cfg.hidden));
    y_embed = register_module("y_embed", LabelEmbedder(cfg.num_classes, cfg.hidden, cfg.class_dropout));
    pos_embed_ = register_parameter("pos_embed", torch::zeros({1, grid_ * grid_, cfg.hidden}),
                                    /*requires_grad=*/false);
    pos_embed_.copy_(sincos_pos_embed(cfg.hidden, grid_).unsqueeze(0));  // LOOKALIKE: tensor-inplace-on-leaf -- frozen table, registered without grad
    for (int64_t i = 0; i < cfg.depth; ++i) {
      blocks_.push_back(register_module("block" + std::to_string(i),
                                        DiTBlock(cfg.hidden, cfg.heads, cfg.mlp_ratio)));
    }
    final_layer = register_module("final_layer", FinalLayer(cfg.hidden, cfg.patch, out_channels_));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& y) {
    const auto B = x.size(0);
    // FACT: x=torch.randn(2,8,4,4); assert is_view_of(x.permute(0,2,3,1).reshape(2,16,8), x)
    auto tokens = x_embed(x).permute({0, 2, 3, 1}).reshape({B, grid_ * grid_, cfg_.hidden});  // LOOKALIKE: tensor-reshape-non-contiguous -- merges h,w which stay adjacent: a view
    // FACT: x=torch.randn(2,16,8); p=torch.randn(1,16,8); assert not raises(lambda: x.add_(p.expand_as(x)))
    tokens.add_(pos_embed_.expand_as(tokens));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only the source
    auto c = t_embed(t) + y_embed(y, is_training());
    for (auto& blk : blocks_) tokens = blk(tokens, c);
    return unpatchify(final_layer(tokens, c));
  }

  torch::Tensor unpatchify(const torch::Tensor& x) {
    const auto B = x.size(0), p = cfg_.patch, h = grid_;
    auto patches = x.view({B, h, h, p, p, out_channels_});
    // FACT: x=torch.randn(2,4,4,2,2,6); assert is_copy_of(x.permute(0,5,1,3,2,4).reshape(2,6,8,8), x)
    return patches.permute({0, 5, 1, 3, 2, 4}).reshape({B, out_channels_, h * p, h * p});  // EXPECT: tensor-reshape-non-contiguous
  }

  DiTConfig cfg_;
  int64_t out_channels_, grid_;
  torch::nn::Conv2d x_embed{nullptr};
  TimestepEmbedder t_embed{nullptr};
  LabelEmbedder y_embed{nullptr};
  torch::Tensor pos_embed_;
  std::vector<DiTBlock> blocks_;
  FinalLayer final_layer{nullptr};
};
TORCH_MODULE(DiT);

struct GaussianDiffusion {
  explicit GaussianDiffusion(int64_t steps) {
    auto betas = torch::linspace(1e-4, 0.02, steps, torch::kFloat64);
    alphas_cumprod = torch::cumprod(1.0 - betas, 0).to(torch::kFloat32);
  }
  int64_t steps() const { return alphas_cumprod.size(0); }
  torch::Tensor alphas_cumprod;  // host copy
};

static std::pair<torch::Tensor, torch::Tensor> next_batch(int64_t B, const DiTConfig& cfg) {
  auto images = torch::randint(0, 256, {B, cfg.in_channels, cfg.image_size, cfg.image_size}, torch::kUInt8);
  auto labels = torch::randint(0, cfg.num_classes, {B}, torch::kLong);
  return {images, labels};
}

// Per-channel statistics of generated samples, logged next to the data statistics.
static std::pair<torch::Tensor, torch::Tensor> channel_stats(const torch::Tensor& samples) {
  const auto C = samples.size(1);
  // FACT: s=torch.randn(2,3,4,4); assert raises(lambda: s.permute(0,2,3,1).view(-1,3), "view size is not compatible")
  auto pixels = samples.permute({0, 2, 3, 1}).view({-1, C});  // EXPECT: tensor-view-non-contiguous
  return {pixels.mean(0), pixels.std(0)};
}

void train(DiT& model, const GaussianDiffusion& diffusion, const DiTConfig& cfg, torch::Device device,
           int64_t steps, int64_t batch_size = 32, int64_t log_every = 100) {
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(0.0));
  std::deque<torch::Tensor> recent;
  auto class_seen = torch::zeros({cfg.num_classes}, torch::TensorOptions().dtype(torch::kLong).device(device));
  const int64_t B = batch_size;
  model->train();
  for (int64_t step = 1; step <= steps; ++step) {
    auto batch = next_batch(B, cfg);
    auto x0 = batch.first.to(device, torch::kFloat32);
    // FACT: a=torch.randint(0,255,(2,3,4,4),dtype=torch.uint8); assert is_copy_of(a.to(torch.float32), a)
    x0.div_(127.5).sub_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- to() with a new dtype always allocates
    auto y = batch.second.to(device);
    auto t = torch::randint(0, diffusion.steps(), {B}, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto noise = torch::randn_like(x0);
    auto ab = diffusion.alphas_cumprod.to(device).index_select(0, t).view({B, 1, 1, 1});  // EXPECT: tensor-clone-in-loop
    auto x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * noise;

    auto out = model->forward(x_t, t, y);
    auto eps = out.narrow(1, 0, cfg.in_channels);  // second half: variance head (VLB term omitted)
    // FACT: o=torch.randn(2,6,4,4); e=o.narrow(1,0,3); assert not is_contiguous(e) and is_view_of(e.view(2,-1), o)
    auto per_sample = torch::mse_loss(eps.view({B, -1}), noise.view({B, -1}), at::Reduction::None).mean(1);  // LOOKALIKE: tensor-view-non-contiguous -- batch dim kept apart, the rest is dense
    auto loss = per_sample.mean();

    // x0 estimate for the preview grid.
    auto x0_hat = eps.detach();
    // FACT: o=torch.randn(2,6,4,4,requires_grad=True)*1; e=o.narrow(1,0,3); l=torch.nn.functional.mse_loss(e.view(2,-1),torch.zeros(2,48)); e.detach().mul_(2); assert backward_fails(lambda: l.backward())
    x0_hat.mul_(-(1 - ab).sqrt()).add_(x_t).div_(ab.sqrt());  // EXPECT: tensor-inplace-on-detached

    opt.zero_grad();
    loss.backward();
    opt.step();

    class_seen.index_add_(0, y, torch::ones_like(y));
    recent.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (recent.size() > 50) recent.pop_front();
    if (step % log_every == 0) {
      auto smoothed = torch::stack(std::vector<torch::Tensor>(recent.begin(), recent.end())).mean();
      std::printf("step %ld  loss %.4f  smoothed %.4f  |x0_hat| %.3f\n", static_cast<long>(step),
                  loss.item<double>(), smoothed.item<double>(), x0_hat.abs().mean().item<double>());  // LOOKALIKE: tensor-sync-in-loop -- read only on logging steps
    }
  }
}

torch::Tensor sample_cfg(DiT& model, const GaussianDiffusion& diffusion, const DiTConfig& cfg,
                         torch::Tensor y, double guidance, int64_t num_steps, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  y = y.to(device);
  const int64_t B = y.size(0);
  auto x = torch::randn({B, cfg.in_channels, cfg.image_size, cfg.image_size}, torch::TensorOptions().device(device));
  auto y_null = torch::full({B}, cfg.num_classes, torch::kLong);
  auto y_in = torch::cat({y, y_null});  // EXPECT: tensor-device-mismatch
  const auto& ac = diffusion.alphas_cumprod;
  const int64_t stride = diffusion.steps() / num_steps;
  std::vector<float> x_std;
  for (int64_t i = diffusion.steps() - 1; i >= 0; i -= stride) {
    auto t_in = torch::full({2 * B}, i, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto out = model->forward(torch::cat({x, x}), t_in, y_in).narrow(1, 0, cfg.in_channels);
    auto halves = out.chunk(2, 0);
    auto eps = halves[1] + guidance * (halves[0] - halves[1]);
    auto a_t = ac[i];
    auto a_prev = i >= stride ? ac[i - stride] : torch::ones({});
    auto x0 = (x - (1 - a_t).sqrt() * eps) / a_t.sqrt();  // LOOKALIKE: tensor-device-mismatch -- 0-dim CPU scalars mix with CUDA tensors
    x0.clamp_(-1.0, 1.0);
    x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps;
    x_std.push_back(x.std().item<float>());  // EXPECT: tensor-sync-in-loop
  }
  std::printf("final sample std %.3f after %zu steps\n", x_std.back(), x_std.size());
  return x;
}

int main() {
  torch::manual_seed(0);
  const auto device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  DiTConfig cfg;
  cfg.depth = 4;
  cfg.hidden = 192;
  cfg.heads = 3;
  DiT model(cfg);
  model->to(device);
  GaussianDiffusion diffusion(cfg.diffusion_steps);
  train(model, diffusion, cfg, device, /*steps=*/200);
  auto labels = torch::arange(cfg.num_classes, torch::kLong);
  auto samples = sample_cfg(model, diffusion, cfg, labels, /*guidance=*/4.0, /*num_steps=*/50, device);
  auto stats = channel_stats(samples);
  std::cout << "channel mean " << stats.first << "\nchannel std " << stats.second << std::endl;
  return 0;
}
