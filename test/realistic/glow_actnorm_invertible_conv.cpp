// Glow (Kingma & Dhariwal, 2018): multi-scale flow of actnorm, invertible 1x1 conv and affine coupling.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <tuple>
#include <vector>

namespace glow {

using torch::Tensor;
namespace nn = torch::nn;

struct GlowConfig {
  int64_t in_channels = 3, image_size = 32, hidden = 512;
  int64_t n_flow = 16, n_levels = 3, n_bits = 5;
  int64_t batch_size = 64, epochs = 200, log_every = 50, sample_every = 1000, n_samples = 16;
  double lr = 1e-4, clip = 50.0;
  std::vector<double> temperatures{0.5, 0.6, 0.7, 0.8, 1.0};
};

const double kLog2Pi = std::log(2.0 * M_PI);

// Per-sample log density under a standard normal.
Tensor gaussian_log_p(const Tensor& z) {
  // FACT: z=torch.randn(2,8,4,4).chunk(2,1)[1]; assert not is_contiguous(z) and is_view_of(z.flatten(1), z)
  auto flat = z.flatten(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- a channel chunk keeps C,H,W packed, so flatten(1) stays a view
  return -0.5 * (flat.pow(2) + kLog2Pi).sum(1);
}

Tensor squeeze2d(const Tensor& x) {
  const auto b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  // FACT: z=torch.randn(2,8,4,4).chunk(2,1)[0]; assert not is_contiguous(z) and is_view_of(z.view(2,4,2,2,2,2), z)
  auto y = x.view({b, c, h / 2, 2, w / 2, 2});  // LOOKALIKE: tensor-view-non-contiguous -- splitting H and W of a channel chunk is expressible with strides
  // FACT: x=torch.randn(2,3,4,4); y=x.view(2,3,2,2,2,2).permute(0,1,3,5,2,4); assert is_copy_of(y.reshape(2,12,2,2), x)
  return y.permute({0, 1, 3, 5, 2, 4}).reshape({b, c * 4, h / 2, w / 2});  // EXPECT: tensor-reshape-non-contiguous
}

Tensor unsqueeze2d(const Tensor& x) {
  const auto b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  auto y = x.view({b, c / 4, 2, 2, h, w}).permute({0, 1, 4, 2, 5, 3});
  // FACT: z=torch.randn(2,12,2,2); assert raises(lambda: z.view(2,3,2,2,2,2).permute(0,1,4,2,5,3).view(2,3,4,4), "view size is not compatible")
  return y.view({b, c / 4, h * 2, w * 2});  // EXPECT: tensor-view-non-contiguous
}

struct ActNormImpl : nn::Module {
  explicit ActNormImpl(int64_t channels) {
    loc_ = register_parameter("loc", torch::zeros({1, channels, 1, 1}));
    logs_ = register_parameter("logs", torch::zeros({1, channels, 1, 1}));
  }

  // Data-dependent init: the first batch comes out with zero mean and unit variance per channel.
  void initialize(const Tensor& x) {
    torch::NoGradGuard no_grad;
    auto xd = x.to(torch::kFloat64);
    auto mean = xd.mean({0, 2, 3}, /*keepdim=*/true);
    auto centered = xd.clone().sub_(mean);  // EXPECT: tensor-unnecessary-clone
    auto std = centered.pow(2).mean({0, 2, 3}, /*keepdim=*/true).sqrt();
    // FACT: p=torch.zeros(3); p.copy_(torch.tensor([0.1,0.2,0.3],dtype=torch.float64)); assert p.dtype==torch.float32
    loc_.copy_(-mean);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-inplace-on-leaf -- runs under NoGradGuard
    logs_.copy_(torch::log(1.0 / (std + 1e-6)).to(logs_.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- converted to the parameter's dtype first
    initialized_ = true;
  }

  std::pair<Tensor, Tensor> forward(const Tensor& x) {
    if (!initialized_ && is_training()) initialize(x);
    const auto hw = x.size(2) * x.size(3);
    auto y = (x + loc_) * torch::exp(logs_);
    auto logdet = (hw * logs_.sum()).expand({x.size(0)});
    return {y, logdet};
  }
  Tensor reverse(const Tensor& y) { return y * torch::exp(-logs_) - loc_; }
  Tensor loc_, logs_;
  bool initialized_ = false;
};
TORCH_MODULE(ActNorm);

struct InvConv1x1Impl : nn::Module {
  explicit InvConv1x1Impl(int64_t channels) {
    weight_ = register_parameter("weight", torch::empty({channels, channels}));
    auto q = std::get<0>(torch::linalg::qr(torch::randn({channels, channels})));
    // FACT: p=torch.nn.Parameter(torch.empty(4,4)); assert raises(lambda: p.copy_(torch.linalg.qr(torch.randn(4,4))[0]), "leaf Variable")
    weight_.copy_(q);  // EXPECT: tensor-inplace-on-leaf
  }

  std::pair<Tensor, Tensor> forward(const Tensor& x) {
    const auto c = weight_.size(0), hw = x.size(2) * x.size(3);
    auto out = torch::conv2d(x, weight_.view({c, c, 1, 1}));
    auto logdet = hw * std::get<1>(torch::linalg::slogdet(weight_));
    return {out, logdet};
  }
  Tensor reverse(const Tensor& y) {
    const auto c = weight_.size(0);
    auto w_inv = torch::inverse(weight_);
    // FACT: w=torch.inverse(torch.randn(4,4)); assert not is_contiguous(w) and is_view_of(w.view(4,4,1,1), w)
    return torch::conv2d(y, w_inv.view({c, c, 1, 1}));  // LOOKALIKE: tensor-view-non-contiguous -- only unit dims are added, any strides allow that
  }
  Tensor weight_;
};
TORCH_MODULE(InvConv1x1);

// Last layer of the coupling network starts at zero so every coupling begins as the identity.
struct ZeroConv2dImpl : nn::Module {
  ZeroConv2dImpl(int64_t in, int64_t out)
      : conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1)))) {
    scale_ = register_parameter("scale", torch::zeros({1, out, 1, 1}));
    nn::init::zeros_(conv->weight);
    nn::init::zeros_(conv->bias);
  }

  Tensor forward(const Tensor& x) {
    auto out = conv->forward(x);
    // FACT: w=torch.randn(2,2,3,3,requires_grad=True); s=torch.zeros(1,2,1,1,requires_grad=True); o=torch.nn.functional.conv2d(torch.randn(1,2,4,4), w, padding=1); o.mul_(torch.exp(s*3)); o.sum().backward(); assert s.grad is not None
    out.mul_(torch::exp(scale_ * 3.0));  // LOOKALIKE: tensor-inplace-on-saved -- conv2d saves its input and weight, not its output
    return out;
  }
  nn::Conv2d conv;
  Tensor scale_;
};
TORCH_MODULE(ZeroConv2d);

struct AffineCouplingImpl : nn::Module {
  AffineCouplingImpl(int64_t channels, int64_t hidden) {
    net_ = register_module("net", nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(channels / 2, hidden, 3).padding(1)), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(hidden, hidden, 1)), nn::ReLU(),
        ZeroConv2d(hidden, channels)));
  }

  std::pair<Tensor, Tensor> shift_scale(const Tensor& xa) {
    auto h = net_->forward(xa);
    const auto c = h.size(1);
    auto shift = h.slice(1, 0, c, 2);
    auto scale = torch::sigmoid(h.slice(1, 1, c, 2) + 2.0);
    return {shift, scale};
  }

  std::pair<Tensor, Tensor> forward(const Tensor& x) {
    auto halves = x.chunk(2, 1);
    auto [shift, scale] = shift_scale(halves[0]);
    // FACT: h=torch.randn(2,4,3,3,requires_grad=True); s=torch.sigmoid(h.narrow(1,1,2)+2.0); s.clamp_min_(1e-6); assert backward_fails(lambda: ((h.narrow(1,0,2)+1)*s).sum().backward())
    scale.clamp_min_(1e-6);  // EXPECT: tensor-inplace-on-saved
    auto zb = (halves[1] + shift) * scale;
    auto logdet = torch::log(scale).flatten(1).sum(1);
    return {torch::cat({halves[0], zb}, 1), logdet};
  }
  Tensor reverse(const Tensor& z) {
    auto halves = z.chunk(2, 1);
    auto [shift, scale] = shift_scale(halves[0]);
    auto xb = halves[1];
    // FACT: z=torch.randn(2,4,3,3); zb=z.chunk(2,1)[1]; zb.div_(2.0); assert is_view_of(zb, z) and torch.equal(z[:,2:], zb)
    xb.div_(scale).sub_(shift);  // EXPECT: tensor-alias-then-mutate
    return torch::cat({halves[0], xb}, 1);
  }
  nn::Sequential net_{nullptr};
};
TORCH_MODULE(AffineCoupling);

struct FlowStepImpl : nn::Module {
  FlowStepImpl(int64_t channels, int64_t hidden)
      : actnorm_(register_module("actnorm", ActNorm(channels))),
        invconv_(register_module("invconv", InvConv1x1(channels))),
        coupling_(register_module("coupling", AffineCoupling(channels, hidden))) {}

  std::pair<Tensor, Tensor> forward(const Tensor& x) {
    auto [h, logdet] = actnorm_->forward(x);
    auto [h2, ld_w] = invconv_->forward(h);
    // FACT: ld=(torch.zeros(3,requires_grad=True).sum()*16).expand(2); assert raises(lambda: ld.add_(torch.tensor(1.0)), "more than one element")
    logdet += ld_w;  // EXPECT: tensor-inplace-on-expanded
    auto [out, ld_c] = coupling_->forward(h2);
    return {out, logdet + ld_c};
  }
  Tensor reverse(const Tensor& y) { return actnorm_->reverse(invconv_->reverse(coupling_->reverse(y))); }
  ActNorm actnorm_;
  InvConv1x1 invconv_;
  AffineCoupling coupling_;
};
TORCH_MODULE(FlowStep);

struct GlowImpl : nn::Module {
  explicit GlowImpl(const GlowConfig& cfg) : cfg_(cfg) {
    int64_t c = cfg.in_channels;
    for (int64_t l = 0; l < cfg.n_levels; ++l) {
      c *= 4;
      for (int64_t k = 0; k < cfg.n_flow; ++k)
        steps_.push_back(register_module("flow_" + std::to_string(l) + "_" + std::to_string(k),
                                         FlowStep(c, cfg.hidden)));
      if (l < cfg.n_levels - 1) c /= 2;
    }
  }

  // Returns the latents of every level, the summed log-determinant and the prior log density.
  std::tuple<std::vector<Tensor>, Tensor, Tensor> forward(const Tensor& x) {
    std::vector<Tensor> zs;
    auto logdet = torch::zeros({x.size(0)}, x.options());
    auto log_p = torch::zeros({x.size(0)}, x.options());
    Tensor h = x;
    for (int64_t l = 0; l < cfg_.n_levels; ++l) {
      h = squeeze2d(h);
      for (int64_t k = 0; k < cfg_.n_flow; ++k) {
        auto [out, ld] = steps_[l * cfg_.n_flow + k]->forward(h);
        h = out;
        logdet = logdet + ld;
      }
      if (l < cfg_.n_levels - 1) {
        auto halves = h.chunk(2, 1);
        h = halves[0];
        zs.push_back(halves[1]);
      } else zs.push_back(h);
      log_p = log_p + gaussian_log_p(zs.back());
    }
    return {zs, logdet, log_p};
  }
  Tensor reverse(std::vector<Tensor> zs) {
    Tensor h = zs.back();
    for (int64_t l = cfg_.n_levels - 1; l >= 0; --l) {
      if (l < cfg_.n_levels - 1) h = torch::cat({h, zs[l]}, 1);
      for (int64_t k = cfg_.n_flow - 1; k >= 0; --k) h = steps_[l * cfg_.n_flow + k]->reverse(h);
      h = unsqueeze2d(h);
    }
    return h;
  }

  std::vector<Tensor> sample_latents(int64_t n, torch::Device device) const {
    std::vector<Tensor> zs;
    int64_t c = cfg_.in_channels, s = cfg_.image_size / 2;
    for (int64_t l = 0; l < cfg_.n_levels; ++l, s /= 2) {
      c *= 4;
      const bool last = l == cfg_.n_levels - 1;
      zs.push_back(torch::randn({n, last ? c : c / 2, s, s}, torch::TensorOptions(device)));
      if (!last) c /= 2;
    }
    return zs;
  }
  GlowConfig cfg_;
  std::vector<FlowStep> steps_;
};
TORCH_MODULE(Glow);

// One grid row per temperature, all from the same latents so the rows are comparable.
std::vector<Tensor> temperature_sweep(Glow& model, const std::vector<Tensor>& z_cpu,
                                      const std::vector<double>& temps, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<Tensor> rows;
  for (double t : temps) {
    std::vector<Tensor> zs;
    for (const auto& z : z_cpu) zs.push_back(z.to(device) * t);  // EXPECT: tensor-clone-in-loop
    rows.push_back(model->reverse(zs).clamp(-0.5, 0.5).add_(0.5).cpu());
  }
  model->train();
  return rows;
}

void train(Glow& model, const GlowConfig& cfg, const Tensor& images, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  const double n_bins = std::pow(2.0, cfg.n_bits);
  const double n_pixel = static_cast<double>(cfg.in_channels * cfg.image_size * cfg.image_size);
  auto fixed_z = model->sample_latents(cfg.n_samples, device);
  auto running = torch::zeros({}, torch::TensorOptions(device));
  const int64_t n = images.size(0);
  int64_t step = 0;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(n);
    for (int64_t i = 0; i + cfg.batch_size <= n; i += cfg.batch_size) {
      auto idx = perm.slice(0, i, i + cfg.batch_size);
      auto x = images.index_select(0, idx).to(device).to(torch::kFloat);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      // FACT: u=torch.zeros(4,3,2,2,dtype=torch.uint8); x=u.index_select(0,torch.tensor([0,1])).to(torch.float); assert is_copy_of(x,u)
      x.div_(std::pow(2.0, 8 - cfg.n_bits)).floor_().div_(n_bins).sub_(0.5);  // LOOKALIKE: tensor-alias-then-mutate -- index_select and the uint8->float cast made a fresh tensor
      auto noisy = x + torch::rand_like(x) / n_bins;
      auto [zs, logdet, log_p] = model->forward(noisy);
      auto nll = -(log_p + logdet - std::log(n_bins) * n_pixel);
      auto loss = (nll / (std::log(2.0) * n_pixel)).mean();

      // Latent tail monitor for the top level.
      auto z_top = zs.back().detach();
      // FACT: z=torch.randn(2,4,requires_grad=True)*1; lp=-0.5*z.flatten(1).pow(2).sum(1); z.detach().clamp_(-1,1); assert backward_fails(lambda: lp.sum().backward())
      z_top.clamp_(-4.0, 4.0);  // EXPECT: tensor-inplace-on-detached
      auto z_hist = torch::histc(z_top, 32, -4.0, 4.0);
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      running += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detach() drops the graph
      if (++step % cfg.log_every == 0) {
        const double bpd = (running / static_cast<double>(cfg.log_every)).item<double>();  // LOOKALIKE: tensor-sync-in-loop -- read once per log_every steps
        const double tail = (z_hist.narrow(0, 0, 1) + z_hist.narrow(0, 31, 1)).item<double>();
        std::cout << "epoch " << epoch << " step " << step << " bpd " << bpd << " tail " << tail << '\n';
        running.zero_();
      }
      if (step % cfg.sample_every == 0) {
        torch::NoGradGuard no_grad;
        model->eval();
        auto imgs = model->reverse(fixed_z).clamp(-0.5, 0.5) + 0.5;
        torch::save(imgs.cpu(), "glow_samples_" + std::to_string(step) + ".pt");
        model->train();
      }
    }
  }

  auto z_cpu = model->sample_latents(cfg.n_samples, torch::kCPU);
  auto rows = temperature_sweep(model, z_cpu, cfg.temperatures, device);
  torch::save(torch::cat(rows, 0), "glow_temperatures.pt");
}

}  // namespace glow

int main(int argc, char** argv) {
  if (argc < 2) return std::cerr << "usage: glow <uint8 images.pt>\n", 1;
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  glow::GlowConfig cfg;
  torch::Tensor images;
  torch::load(images, argv[1]);
  glow::Glow model(cfg);
  model->to(device);
  glow::train(model, cfg, images, device);
  torch::save(model, "glow.pt");
  return 0;
}
