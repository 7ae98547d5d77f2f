// RePaint: inpainting with an unconditional DDPM; the known region is re-noised from
// the input every step and the sampler jumps back in time so both regions harmonise.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace repaint {

struct Config {
  int64_t timesteps = 1000, channels = 3, base = 64, heads = 4;
  int64_t jump_length = 10, jump_n_sample = 10;
  int64_t batch_size = 16, epochs = 50, log_every = 100;
  double lr = 2e-4, ema_decay = 0.9999;
  std::string train_images = "faces64.pt";
};

// Cosine schedule (Nichol & Dhariwal), computed in double and kept on the host.
struct Schedule {
  torch::Tensor betas, sqrt_ab, sqrt_one_minus_ab;
  torch::Tensor post_c0, post_ct, post_var;

  explicit Schedule(int64_t T, double s = 0.008) {
    auto steps = torch::linspace(0, T, T + 1, torch::kFloat64);
    auto f = torch::cos((steps / T + s) / (1 + s) * M_PI * 0.5).pow(2);
    auto ab = f / f[0];
    // FACT: a = torch.arange(1., 6.); assert raises(lambda: a[1:].div_(a[:-1]), "single memory location")
    auto b64 = ab.narrow(0, 1, T);
    b64.div_(ab.narrow(0, 0, T));  // EXPECT: tensor-inplace-overlap
    b64 = (1 - b64).clamp(0.0, 0.999);
    auto alphas = 1 - b64;
    auto ab64 = torch::cumprod(alphas, 0);
    auto ab_prev = torch::ones({T}, torch::kFloat64);
    // FACT: a = torch.arange(5.); b = torch.ones(5); assert not shares_storage(a, b) and not raises(lambda: b[1:].copy_(a[:-1]))
    ab_prev.narrow(0, 1, T - 1).copy_(ab64.narrow(0, 0, T - 1));  // LOOKALIKE: tensor-inplace-overlap -- source and destination are different buffers
    auto abar = torch::empty({T});
    abar.copy_(ab64);  // EXPECT: tensor-copy-narrowing
    betas = b64.to(torch::kFloat32);
    sqrt_ab = abar.sqrt();
    sqrt_one_minus_ab = (1 - abar).sqrt();
    post_c0 = (b64 * ab_prev.sqrt() / (1 - ab64)).to(torch::kFloat32);
    post_ct = ((1 - ab_prev) * alphas.sqrt() / (1 - ab64)).to(torch::kFloat32);
    post_var = (b64 * (1 - ab_prev) / (1 - ab64)).clamp_min(1e-20).to(torch::kFloat32);
  }
};

torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(-std::log(10000.0) *
                          torch::arange(half, t.options().dtype(torch::kFloat32)) / half);
  auto args = t.to(torch::kFloat32).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t in, int64_t out, int64_t temb_dim)
      : norm1(torch::nn::GroupNormOptions(32, in)),
        conv1(torch::nn::Conv2dOptions(in, out, 3).padding(1)),
        temb_proj(temb_dim, out),
        norm2(torch::nn::GroupNormOptions(32, out)),
        conv2(torch::nn::Conv2dOptions(out, out, 3).padding(1)) {
    register_module("norm1", norm1);
    register_module("conv1", conv1);
    register_module("temb_proj", temb_proj);
    register_module("norm2", norm2);
    register_module("conv2", conv2);
    if (in != out) {
      skip = register_module("skip", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& temb) {
    auto h = conv1(torch::silu(norm1(x)));
    // FACT: conv = torch.nn.Conv2d(2, 2, 3, padding=1); assert not backward_fails(lambda: (h := conv(torch.randn(1, 2, 4, 4, requires_grad=True)), h.add_(1), torch.nn.functional.group_norm(h, 1).sum().backward()))
    h += temb_proj(torch::silu(temb)).unsqueeze(-1).unsqueeze(-1);  // LOOKALIKE: tensor-inplace-on-saved -- conv2d saves its input, not its output
    h = conv2(torch::dropout(torch::silu(norm2(h)), 0.1, is_training()));
    return (skip.is_empty() ? x : skip(x)) + h;
  }

  torch::nn::GroupNorm norm1;
  torch::nn::Conv2d conv1;
  torch::nn::Linear temb_proj;
  torch::nn::GroupNorm norm2;
  torch::nn::Conv2d conv2;
  torch::nn::Conv2d skip{nullptr};
};
TORCH_MODULE(ResBlock);

struct AttnBlockImpl : torch::nn::Module {
  AttnBlockImpl(int64_t ch, int64_t heads)
      : heads_(heads), norm(torch::nn::GroupNormOptions(32, ch)),
        to_q(ch, ch), to_k(ch, ch), to_v(ch, ch), proj(ch, ch) {
    register_module("norm", norm);
    register_module("to_q", to_q);
    register_module("to_k", to_k);
    register_module("to_v", to_v);
    register_module("proj", proj);
  }

  torch::Tensor forward(torch::Tensor x) {
    const auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const auto hd = C / heads_;
    // FACT: x = torch.randn(2, 4, 3, 5); assert is_view_of(x.permute(0, 2, 3, 1).reshape(2, 15, 4), x)
    auto tokens = norm(x).permute({0, 2, 3, 1}).reshape({B, H * W, C});  // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent after the permute, so it is a view
    auto q = to_q(tokens).view({B, H * W, heads_, hd}).transpose(1, 2);
    auto k = to_k(tokens).view({B, H * W, heads_, hd}).transpose(1, 2);
    auto v = to_v(tokens).view({B, H * W, heads_, hd}).transpose(1, 2);
    auto w = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd)), -1);
    auto out = torch::matmul(w, v);
    // FACT: o = torch.randn(2, 2, 5, 3); assert is_copy_of(o.transpose(1, 2).reshape(2, 5, 6), o)
    out = proj(out.transpose(1, 2).reshape({B, H * W, C}));  // EXPECT: tensor-reshape-non-contiguous
    // FACT: t = torch.randn(2, 12, 3).transpose(1, 2); assert not is_contiguous(t) and not raises(lambda: t.view(2, 3, 3, 4))
    auto out_img = out.transpose(1, 2).view({B, C, H, W});  // LOOKALIKE: tensor-view-non-contiguous -- splitting one dim is always expressible with strides
    // FACT: gn = torch.nn.GroupNorm(2, 4); assert backward_fails(lambda: (x := torch.randn(2, 4, 3, 3, requires_grad=True) * 1, y := gn(x), x.add_(y), x.sum().backward()))
    return x.add_(out_img);  // EXPECT: tensor-inplace-on-saved
  }

  int64_t heads_;
  torch::nn::GroupNorm norm;
  torch::nn::Linear to_q, to_k, to_v, proj;
};
TORCH_MODULE(AttnBlock);

struct UNetImpl : torch::nn::Module {
  explicit UNetImpl(const Config& cfg)
      : base_(cfg.base),
        temb1(cfg.base, 4 * cfg.base), temb2(4 * cfg.base, 4 * cfg.base),
        conv_in(torch::nn::Conv2dOptions(cfg.channels, cfg.base, 3).padding(1)),
        down1(cfg.base, cfg.base, 4 * cfg.base),
        down2(cfg.base, 2 * cfg.base, 4 * cfg.base),
        mid(2 * cfg.base, 2 * cfg.base, 4 * cfg.base),
        mid_attn(2 * cfg.base, cfg.heads),
        up1(4 * cfg.base, 2 * cfg.base, 4 * cfg.base),
        up2(3 * cfg.base, cfg.base, 4 * cfg.base),
        norm_out(torch::nn::GroupNormOptions(32, cfg.base)),
        conv_out(torch::nn::Conv2dOptions(cfg.base, cfg.channels, 3).padding(1)) {
    register_module("temb1", temb1);
    register_module("temb2", temb2);
    register_module("conv_in", conv_in);
    register_module("down1", down1);
    register_module("down2", down2);
    register_module("mid", mid);
    register_module("mid_attn", mid_attn);
    register_module("up1", up1);
    register_module("up2", up2);
    register_module("norm_out", norm_out);
    register_module("conv_out", conv_out);
    // Zero-init the last layer so the untrained net predicts zero noise.
    // FACT: assert raises(lambda: torch.nn.Conv2d(2, 2, 3).weight.zero_(), "leaf Variable")
    conv_out->weight.zero_();  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& t) {
    auto emb = temb2(torch::silu(temb1(timestep_embedding(t, base_))));
    auto h1 = down1(conv_in(x), emb);
    auto h2 = down2(torch::avg_pool2d(h1, 2), emb);
    auto u = up1(torch::cat({mid_attn(mid(h2, emb)), h2}, 1), emb);
    namespace F = torch::nn::functional;
    u = F::interpolate(u, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}));
    u = up2(torch::cat({u, h1}, 1), emb);
    return conv_out(torch::silu(norm_out(u)));
  }

  int64_t base_;
  torch::nn::Linear temb1, temb2;
  torch::nn::Conv2d conv_in;
  ResBlock down1, down2, mid;
  AttnBlock mid_attn;
  ResBlock up1, up2;
  torch::nn::GroupNorm norm_out;
  torch::nn::Conv2d conv_out;
};
TORCH_MODULE(UNet);

class TensorImageDataset : public torch::data::datasets::Dataset<TensorImageDataset> {
 public:
  explicit TensorImageDataset(const std::string& path) { torch::load(images_, path); }
  torch::data::Example<> get(size_t i) override { return {images_[i], torch::zeros({1})}; }
  torch::optional<size_t> size() const override { return images_.size(0); }
 private:
  torch::Tensor images_;
};

torch::Tensor extract(const torch::Tensor& coef, const torch::Tensor& t) {
  return coef.index_select(0, t).view({-1, 1, 1, 1});  // EXPECT: tensor-device-mismatch
}

void ema_update(UNet& ema, const UNet& model, double decay) {
  torch::NoGradGuard no_grad;
  auto dst = ema->parameters(), src = model->parameters();
  for (size_t i = 0; i < src.size(); ++i) {
    dst[i].mul_(decay).add_(src[i], 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-leaf -- the update runs under NoGradGuard
  }
}

template <typename Loader>
void train(UNet& model, UNet& ema, const Schedule& sched, Loader& loader, const Config& cfg,
           torch::Device device) {
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr));
  std::vector<torch::Tensor> losses;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    for (auto& batch : loader) {
      auto x0 = batch.data.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
      auto t = torch::randint(0, cfg.timesteps, {x0.size(0)}, x0.options().dtype(torch::kLong));
      auto noise = torch::randn_like(x0);
      auto x_t = extract(sched.sqrt_ab, t) * x0 + extract(sched.sqrt_one_minus_ab, t) * noise;
      torch::Tensor loss = torch::mse_loss(model->forward(x_t, t), noise);
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      ema_update(ema, model, cfg.ema_decay);
      losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      if (++step % cfg.log_every == 0) {
        std::printf("step %lld loss %.5f\n", static_cast<long long>(step), loss.item<float>());  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
      }
    }
    std::printf("epoch %lld mean loss %.5f\n", static_cast<long long>(epoch),
                torch::stack(losses).mean().item<double>());
    losses.clear();
  }
}

// Masks arrive as one 0/255 map shared by the whole batch.
torch::Tensor prepare_mask(const torch::Tensor& raw, int64_t batch) {
  auto m = raw.to(torch::kFloat32).div(255.0);
  // FACT: assert raises(lambda: torch.ones(1, 1, 4, 4).expand(2, 1, 4, 4).round_(), "more than one element")
  auto keep = m.expand({batch, 1, m.size(2), m.size(3)});
  keep.round_();  // EXPECT: tensor-inplace-on-expanded
  return keep;
}

// Sequence of timesteps with RePaint's jumps back in time.
std::vector<int64_t> jump_schedule(int64_t T, int64_t jump_len, int64_t jump_n) {
  std::map<int64_t, int64_t> jumps;
  for (int64_t j = 0; j < T - jump_len; j += jump_len) jumps[j] = jump_n - 1;
  int64_t t = T;
  std::vector<int64_t> ts{t};
  while (t >= 1) {
    ts.push_back(--t);
    if (jumps.count(t) && jumps[t] > 0) {
      jumps[t] -= 1;
      for (int64_t i = 0; i < jump_len; ++i) ts.push_back(++t);
    }
  }
  ts.push_back(-1);
  return ts;
}

torch::Tensor inpaint(UNet& model, const Schedule& s, const torch::Tensor& known,
                      const torch::Tensor& mask, const Config& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto x = torch::randn(known.sizes(), known.options());
  const auto ts = jump_schedule(cfg.timesteps - 1, cfg.jump_length, cfg.jump_n_sample);
  for (size_t i = 0; i + 1 < ts.size(); ++i) {
    const int64_t t_last = ts[i], t_cur = ts[i + 1];
    auto m = mask.to(device);  // EXPECT: tensor-clone-in-loop
    if (t_cur < t_last) {
      torch::Tensor x_known = known;
      if (t_cur >= 0) {
        // FACT: a = torch.ones(2, 3); b = a; b.mul_(2); assert shares_storage(a, b) and a[0, 0].item() == 2
        x_known.mul_(s.sqrt_ab[t_cur]).add_(torch::randn_like(known) * s.sqrt_one_minus_ab[t_cur]);  // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-device-mismatch -- 0-dim CPU scalars may mix with CUDA tensors
      }
      auto tt = torch::full({x.size(0)}, t_last, x.options().dtype(torch::kLong));
      auto eps = model->forward(x, tt);
      auto x0 = ((x - s.sqrt_one_minus_ab[t_last] * eps) / s.sqrt_ab[t_last]).clamp(-1.0, 1.0);
      auto x_unknown = s.post_c0[t_last] * x0 + s.post_ct[t_last] * x;
      if (t_last > 0) x_unknown = x_unknown + s.post_var[t_last].sqrt() * torch::randn_like(x);
      x = m * x_known + (1 - m) * x_unknown;
    } else {
      auto beta = s.betas[t_cur];
      x = torch::sqrt(1 - beta) * x + torch::sqrt(beta) * torch::randn_like(x);
    }
  }
  return x;
}

}  // namespace repaint

int main() {
  using namespace repaint;
  Config cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  Schedule sched(cfg.timesteps);

  UNet model(cfg), ema(cfg);
  model->to(device);
  ema->to(device);
  {
    torch::NoGradGuard no_grad;
    auto dst = ema->parameters(), src = model->parameters();
    for (size_t i = 0; i < src.size(); ++i) {
      dst[i].data().copy_(src[i].data());  // LOOKALIKE: tensor-inplace-on-detached -- writes the EMA weights on purpose, under NoGradGuard
    }
  }
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      TensorImageDataset(cfg.train_images).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(cfg.batch_size).workers(2));
  train(model, ema, sched, *loader, cfg, device);
  torch::save(ema, "repaint_ema.pt");
  torch::Tensor image, raw_mask;
  torch::load(image, "query.pt");
  torch::load(raw_mask, "query_mask.pt");
  auto known = image.to(device);
  auto mask = prepare_mask(raw_mask, known.size(0));
  auto x = inpaint(ema, sched, known, mask, cfg, device);

  // FACT: x = torch.randn(1, 3, 4, 4); assert is_copy_of(x.permute(0, 2, 3, 1).contiguous(), x)
  auto img = x.permute({0, 2, 3, 1}).contiguous();
  img.add_(1.0).mul_(127.5);  // LOOKALIKE: tensor-alias-then-mutate -- contiguous() of the permuted batch made a new buffer
  torch::save(img.clamp(0, 255).to(torch::kUInt8).cpu(), "inpainted.pt");
  return 0;
}
