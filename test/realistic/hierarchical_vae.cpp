// Hierarchical VAE in the spirit of NVAE: residual cells with squeeze-excite,
// a top-down stack of latent groups, KL warm-up with KL balancing and a
// spectral regulariser on the conv weights.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct NvaeConfig {
  int64_t in_channels = 3, hidden = 64, latent = 20, num_groups = 4;
  int64_t batch_size = 32, epochs = 40, steps_per_epoch = 500, log_every = 200;
  int64_t kl_warmup_steps = 10000, power_iters = 1;
  double kl_min_coeff = 1e-4, spectral_coeff = 0.1, lr = 1e-2, min_log_sigma = -7.0;
};

class SqueezeExciteImpl : public torch::nn::Module {
 public:
  explicit SqueezeExciteImpl(int64_t channels, int64_t reduction = 16) {
    const int64_t mid = std::max<int64_t>(channels / reduction, 4);
    fc1 = register_module("fc1", torch::nn::Linear(channels, mid));
    fc2 = register_module("fc2", torch::nn::Linear(mid, channels));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto s = torch::relu(fc1(x.mean({2, 3})));
    auto gate = torch::sigmoid(fc2(s));
    // FACT: g = torch.sigmoid(torch.nn.functional.linear(torch.rand(2, 4), torch.rand(8, 4))); assert is_view_of(g.view(2, 8, 1, 1), g)
    return x * gate.view({x.size(0), x.size(1), 1, 1});  // LOOKALIKE: tensor-view-non-contiguous -- the linear layer's output is contiguous
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(SqueezeExcite);

class ResidualCellImpl : public torch::nn::Module {
 public:
  explicit ResidualCellImpl(int64_t c) {
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(c));
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(c));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1)));
    se = register_module("se", SqueezeExcite(c));
    {
      // Start every residual branch close to the identity.
      torch::NoGradGuard no_grad;
      conv2->weight.mul_(0.1);  // LOOKALIKE: tensor-inplace-on-leaf -- rescaled under NoGradGuard
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = conv1(torch::silu(bn1(x)));
    h = conv2(torch::silu(bn2(h)));
    return x + 0.1 * se(h);
  }
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  SqueezeExcite se{nullptr};
};
TORCH_MODULE(ResidualCell);

struct GroupOutput { torch::Tensor state, kl_map; };

class LatentGroupImpl : public torch::nn::Module {
 public:
  LatentGroupImpl(int64_t hidden, int64_t latent, double min_log_sigma)
      : latent_(latent), min_log_sigma_(min_log_sigma) {
    p_head = register_module("p_head", torch::nn::Conv2d(torch::nn::Conv2dOptions(hidden, 2 * latent, 3).padding(1)));
    q_head = register_module("q_head", torch::nn::Conv2d(torch::nn::Conv2dOptions(2 * hidden, 2 * latent, 3).padding(1)));
    z_proj = register_module("z_proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(latent, hidden, 1)));
    dec_cell = register_module("dec_cell", ResidualCell(hidden));
  }
  GroupOutput forward(const torch::Tensor& enc, const torch::Tensor& state) {
    auto p = p_head(torch::silu(state)).chunk(2, 1);
    auto q = q_head(torch::cat({enc, state}, 1)).chunk(2, 1);
    auto mu_p = p[0];
    auto log_sig_p = p[1].clamp_min(min_log_sigma_);
    // Residual normal: the posterior is parameterised relative to the prior.
    auto mu_q = mu_p + q[0];
    auto log_sig_q = (log_sig_p + q[1]).clamp_min(min_log_sigma_);
    auto sig_p = torch::exp(log_sig_p);
    auto sig_q = torch::exp(log_sig_q);
    sig_q.clamp_min_(1e-4);  // EXPECT: tensor-inplace-on-saved
    auto z = mu_q + sig_q * torch::randn_like(mu_q);  // LOOKALIKE: tensor-device-mismatch -- randn_like allocates on mu_q's device
    auto kl = log_sig_p - log_sig_q + (sig_q.pow(2) + (mu_q - mu_p).pow(2)) / (2.0 * sig_p.pow(2)) - 0.5;
    return {dec_cell(state + z_proj(z)), kl};
  }
  torch::Tensor sample_step(const torch::Tensor& state, double temperature) {
    auto p = p_head(torch::silu(state)).chunk(2, 1);
    auto sig = torch::exp(p[1].clamp_min(min_log_sigma_)) * temperature;
    auto eps = torch::randn({state.size(0), latent_, state.size(2), state.size(3)});
    auto z = p[0] + sig * eps;  // EXPECT: tensor-device-mismatch
    return dec_cell(state + z_proj(z));
  }
  torch::nn::Conv2d p_head{nullptr}, q_head{nullptr}, z_proj{nullptr};
  ResidualCell dec_cell{nullptr};
 private:
  int64_t latent_;
  double min_log_sigma_;
};
TORCH_MODULE(LatentGroup);

struct VaeOutput {
  torch::Tensor recon;
  std::vector<torch::Tensor> kls, kl_maps;
};

class HierVaeImpl : public torch::nn::Module {
 public:
  explicit HierVaeImpl(const NvaeConfig& cfg) {
    const auto c = cfg.hidden;
    stem = register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.in_channels, c, 3).padding(1)));
    down1 = register_module("down1", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 4).stride(2).padding(1)));
    down2 = register_module("down2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 4).stride(2).padding(1)));
    for (int64_t g = 0; g < cfg.num_groups; ++g) {
      enc_cells.push_back(register_module("enc" + std::to_string(g), ResidualCell(c)));
      groups.push_back(register_module("group" + std::to_string(g), LatentGroup(c, cfg.latent, cfg.min_log_sigma)));
    }
    h0 = register_parameter("h0", torch::zeros({1, c, 8, 8}));
    up1 = register_module("up1", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(c, c, 4).stride(2).padding(1)));
    up2 = register_module("up2", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(c, c, 4).stride(2).padding(1)));
    out_conv = register_module("out_conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, cfg.in_channels, 3).padding(1)));
  }
  VaeOutput forward(const torch::Tensor& x) {
    auto h = torch::silu(down2(torch::silu(down1(stem(x)))));
    std::vector<torch::Tensor> feats;
    for (auto& cell : enc_cells) {
      h = cell(h);
      feats.push_back(h);
    }
    VaeOutput out;
    auto state = h0.expand({x.size(0), -1, -1, -1});
    for (size_t g = 0; g < groups.size(); ++g) {
      auto res = groups[g](feats[feats.size() - 1 - g], state);
      state = res.state;
      out.kls.push_back(res.kl_map.sum({1, 2, 3}));
      out.kl_maps.push_back(res.kl_map);
    }
    out.recon = decode(state);
    return out;
  }
  torch::Tensor sample(int64_t n, double temperature) {
    torch::NoGradGuard no_grad;
    auto state = h0.expand({n, -1, -1, -1});
    for (auto& group : groups) state = group->sample_step(state, temperature);
    return decode(state);
  }
  torch::Tensor decode(const torch::Tensor& state) {
    auto y = torch::silu(up2(torch::silu(up1(state))));
    return torch::tanh(out_conv(y));
  }
  torch::nn::Conv2d stem{nullptr}, down1{nullptr}, down2{nullptr}, out_conv{nullptr};
  torch::nn::ConvTranspose2d up1{nullptr}, up2{nullptr};
  std::vector<ResidualCell> enc_cells;
  std::vector<LatentGroup> groups;
  torch::Tensor h0;
};
TORCH_MODULE(HierVae);

// Largest singular value of every conv, estimated by power iteration.
class SpectralRegulariser {
 public:
  explicit SpectralRegulariser(int64_t iters) : iters_(iters) {}
  void attach(const torch::nn::Module& model) {
    auto opts = F::NormalizeFuncOptions().dim(0);
    for (const auto& item : model.named_parameters()) {
      const auto& w = item.value();
      if (w.dim() != 4) continue;
      const bool transposed = item.key().rfind("up", 0) == 0;
      auto mat = weight_matrix(w, transposed);
      entries_.push_back({w, transposed,
                          F::normalize(torch::randn({mat.size(0)}, w.options()), opts),
                          F::normalize(torch::randn({mat.size(1)}, w.options()), opts)});
    }
  }
  torch::Tensor loss() {
    auto opts = F::NormalizeFuncOptions().dim(0);
    auto total = torch::zeros({}, entries_.front().weight.options());
    for (auto& e : entries_) {
      auto mat = weight_matrix(e.weight, e.transposed);
      {
        torch::NoGradGuard no_grad;
        for (int64_t i = 0; i < iters_; ++i) {
          e.v = F::normalize(torch::mv(mat.t(), e.u), opts);
          e.u = F::normalize(torch::mv(mat, e.v), opts);
        }
      }
      total = total + torch::dot(e.u, torch::mv(mat, e.v));
    }
    return total;
  }
 private:
  struct Entry { torch::Tensor weight; bool transposed; torch::Tensor u, v; };
  static torch::Tensor weight_matrix(const torch::Tensor& w, bool transposed) {
    // FACT: w = torch.rand(8, 4, 3, 3); assert is_copy_of(w.transpose(0, 1).reshape(4, -1), w)
    // FACT: w = torch.rand(8, 4, 3, 3); assert is_view_of(w.reshape(8, -1), w)
    if (transposed) return w.transpose(0, 1).reshape({w.size(1), -1});  // EXPECT: tensor-reshape-non-contiguous
    return w.reshape({w.size(0), -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- conv weights are contiguous, this is a view
  }
  int64_t iters_;
  std::vector<Entry> entries_;
};

double kl_beta(int64_t step, const NvaeConfig& cfg) {
  const double frac = static_cast<double>(step) / static_cast<double>(cfg.kl_warmup_steps);
  return std::max(std::min(frac, 1.0), cfg.kl_min_coeff);
}

// KL balancing: during warm-up, groups with a small KL get a smaller weight so
// that no group collapses before the others have had a chance to be used.
torch::Tensor balanced_kl(const std::vector<torch::Tensor>& kls, const torch::Tensor& group_sizes, double beta) {
  auto kl_all = torch::stack(kls, 1);
  if (beta >= 1.0) return kl_all.sum(1);
  torch::Tensor coeff;
  {
    torch::NoGradGuard no_grad;
    auto kl_avg = kl_all.abs().mean(0, true) + 0.01;
    coeff = group_sizes.unsqueeze(0).expand_as(kl_all);
    // FACT: assert raises(lambda: torch.ones(3).unsqueeze(0).expand(4, 3).mul_(torch.rand(1, 3)), "more than one element")
    coeff.mul_(kl_avg);  // EXPECT: tensor-inplace-on-expanded
    coeff.div_(coeff.mean(1, true));
  }
  return (kl_all * coeff).sum(1);
}

torch::Tensor per_channel_kl(const torch::Tensor& kl_map) {
  // FACT: assert raises(lambda: torch.rand(4, 6, 3, 3).transpose(0, 1).view(6, -1), "view size is not compatible")
  auto per_channel = kl_map.transpose(0, 1).view({kl_map.size(1), -1});  // EXPECT: tensor-view-non-contiguous
  return per_channel.mean(1);
}

struct ImageLoader {
  torch::Tensor images;  // preloaded, scaled to [0, 1]
  torch::Tensor perm;
  int64_t cursor = 0;
  torch::Tensor next(int64_t bs) {
    if (!perm.defined() || cursor + bs > images.size(0)) {
      perm = torch::randperm(images.size(0));
      cursor = 0;
    }
    auto x = images.index_select(0, perm.narrow(0, cursor, bs));
    cursor += bs;
    // FACT: d = torch.rand(10, 3, 4, 4); assert is_copy_of(d.index_select(0, torch.tensor([1, 3])), d)
    x.mul_(2.0).sub_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into new storage
    return x;
  }
  torch::Tensor fixed_batch(int64_t n) {
    auto x = images.narrow(0, 0, n);
    // FACT: d = torch.rand(10, 3, 4, 4); assert is_view_of(d.narrow(0, 0, 4), d)
    x.mul_(2.0).sub_(1.0);  // EXPECT: tensor-alias-then-mutate
    return x;
  }
};

void evaluate(HierVae& model, ImageLoader& loader, torch::Device device, int64_t step) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto x = loader.fixed_batch(64).to(device);
  auto out = model->forward(x);
  auto vis = out.recon.detach().clone();  // EXPECT: tensor-unnecessary-clone
  vis.add_(1.0).mul_(0.5);  // LOOKALIKE: tensor-inplace-on-detached -- detach().clone() owns its storage
  torch::save(vis.cpu(), "recon_" + std::to_string(step) + ".pt");
  std::vector<torch::Tensor> active;
  for (const auto& kl_map : out.kl_maps) active.push_back((per_channel_kl(kl_map) > 0.01).sum());
  auto counts = torch::stack(active).cpu();  // LOOKALIKE: tensor-sync-in-loop -- one transfer after the loop
  for (int64_t g = 0; g < counts.size(0); ++g)
    std::cout << "group " << g << ": " << counts[g].item<int64_t>() << " active channels\n";
  torch::save(model->sample(16, 0.8).cpu(), "sample_" + std::to_string(step) + ".pt");
  model->train();
}

void train(const NvaeConfig& cfg, ImageLoader& loader, torch::Device device) {
  HierVae model(cfg);
  model->to(device);
  SpectralRegulariser spectral(cfg.power_iters);
  spectral.attach(*model);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(3e-4));
  auto group_sizes = torch::full({cfg.num_groups}, static_cast<double>(cfg.latent * 8 * 8));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    double recon_sum = 0.0;
    auto epoch_kl = torch::zeros({}, device);
    auto group_kl = torch::zeros({cfg.num_groups}, device);
    for (int64_t it = 0; it < cfg.steps_per_epoch; ++it, ++step) {
      auto x = loader.next(cfg.batch_size).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto sizes = group_sizes.to(device);  // EXPECT: tensor-clone-in-loop
      auto out = model->forward(x);
      auto recon = (out.recon - x).pow(2).sum({1, 2, 3}).mean();
      const double beta = kl_beta(step, cfg);
      auto kl = balanced_kl(out.kls, sizes, beta).mean();
      auto loss = recon + beta * kl + cfg.spectral_coeff * beta * spectral.loss();
      if (step % cfg.log_every == 0) {
        auto vis = out.recon.detach();
        vis.add_(1.0).mul_(0.5);  // EXPECT: tensor-inplace-on-detached
        torch::save(vis.cpu(), "train_recon_" + std::to_string(step) + ".pt");
      }
      opt.zero_grad();
      loss.backward();
      opt.step();
      recon_sum += recon.item<double>();  // EXPECT: tensor-sync-in-loop
      epoch_kl += kl;  // EXPECT: tensor-graph-kept-across-iterations
      group_kl += torch::stack(out.kls, 1).mean(0).detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, accumulated on the device
    }
    std::cout << "epoch " << epoch << " recon " << recon_sum / cfg.steps_per_epoch << " kl "
              << epoch_kl.item<double>() / cfg.steps_per_epoch << " per group "
              << (group_kl / cfg.steps_per_epoch).cpu() << "\n";
    evaluate(model, loader, device, step);
  }
}

int main() {
  NvaeConfig cfg;
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ImageLoader loader{torch::rand({4096, cfg.in_channels, 32, 32})};
  train(cfg, loader, device);
  return 0;
}
