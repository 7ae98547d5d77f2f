// Fourier Neural Operator (Li et al., 2020) for 2-D steady-state PDEs.
//
// Inputs are coefficient fields a(x, y) sampled on an H x W grid, stored channels-last
// [N, H, W, in_channels]; targets are solution fields u(x, y) [N, H, W, out_channels].
// Each Fourier layer applies a learned complex linear map to the lowest modes of the
// rfft2 of its input and adds a pointwise (1x1 conv) path.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct FNOConfig {
  int64_t modes1 = 12;
  int64_t modes2 = 12;
  int64_t width = 32;
  int64_t n_layers = 4;
  int64_t proj_hidden = 128;
  int64_t in_channels = 1;   // permeability
  int64_t out_channels = 2;  // pressure and tracer concentration, both positive
  bool log_output = true;    // predict log-fields, exponentiate at the end
  double min_value = 1e-6;
  double max_value = 1e4;
  int64_t batch_size = 20;
  int64_t epochs = 500;
  unsigned step_size = 100;
  double gamma = 0.5;
  double lr = 1e-3;
  double weight_decay = 1e-4;
};

// (batch, in, kx, ky) x (in, out, kx, ky) -> (batch, out, kx, ky), complex.
static torch::Tensor compl_mul2d(const torch::Tensor& input, const torch::Tensor& weights) {
  return torch::einsum("bixy,ioxy->boxy", {input, weights});
}

struct SpectralConv2dImpl : torch::nn::Module {
  SpectralConv2dImpl(int64_t in_ch, int64_t out_ch, int64_t modes1, int64_t modes2)
      : in_ch_(in_ch), out_ch_(out_ch), modes1_(modes1), modes2_(modes2) {
    const double scale = 1.0 / static_cast<double>(in_ch * out_ch);
    auto opts = torch::TensorOptions().dtype(torch::kComplexFloat);
    weights1 = register_parameter("weights1", torch::rand({in_ch, out_ch, modes1, modes2}, opts));
    weights2 = register_parameter("weights2", torch::rand({in_ch, out_ch, modes1, modes2}, opts));
    torch::NoGradGuard no_grad;
    weights1.mul_(scale);  // LOOKALIKE: tensor-inplace-on-leaf -- initial scaling under NoGradGuard
    weights2.mul_(scale);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t batch = x.size(0);
    const int64_t H = x.size(-2);
    const int64_t W = x.size(-1);
    auto x_ft = torch::fft::rfft2(x);

    // Only the retained low modes get non-zero coefficients; the rest stay zero.
    auto out_ft = torch::zeros({batch, out_ch_, H, W / 2 + 1}, x_ft.options());
    // FACT: o = torch.zeros(2, 3, 8, 5, dtype=torch.cfloat); blk = o[:, :, :2, :2]; assert is_view_of(blk, o)
    auto top = out_ft.slice(2, 0, modes1_).slice(3, 0, modes2_);
    top.copy_(compl_mul2d(x_ft.slice(2, 0, modes1_).slice(3, 0, modes2_), weights1));  // LOOKALIKE: tensor-alias-then-mutate -- an explicit slice written on purpose to fill out_ft
    out_ft.slice(2, H - modes1_, H).slice(3, 0, modes2_) =
        compl_mul2d(x_ft.slice(2, H - modes1_, H).slice(3, 0, modes2_), weights2);

    std::vector<int64_t> spatial{H, W};
    return torch::fft::irfft2(out_ft, spatial);
  }

  int64_t in_ch_, out_ch_, modes1_, modes2_;
  torch::Tensor weights1, weights2;
};
TORCH_MODULE(SpectralConv2d);

struct FNO2dImpl : torch::nn::Module {
  explicit FNO2dImpl(const FNOConfig& cfg) : cfg_(cfg) {
    fc0 = register_module("fc0", torch::nn::Linear(cfg.in_channels + 2, cfg.width));
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      const auto tag = std::to_string(i);
      spectral.push_back(register_module(
          "conv" + tag, SpectralConv2d(cfg.width, cfg.width, cfg.modes1, cfg.modes2)));
      pointwise.push_back(register_module(
          "w" + tag, torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.width, cfg.width, 1))));
    }
    fc1 = register_module("fc1", torch::nn::Linear(cfg.width, cfg.proj_hidden));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.proj_hidden, cfg.out_channels));
  }

  // a: [B, H, W, in_channels] (normalised), grid: [1, H, W, 2]
  torch::Tensor forward(const torch::Tensor& a, const torch::Tensor& grid) {
    const auto batch = a.size(0);
    auto x = torch::cat({a, grid.expand({batch, -1, -1, -1})}, -1);
    x = fc0->forward(x).permute({0, 3, 1, 2});  // lift to [B, width, H, W]

    for (size_t i = 0; i < spectral.size(); ++i) {
      auto x1 = spectral[i]->forward(x);
      auto x2 = pointwise[i]->forward(x);
      // FACT: x = torch.randn(2, 4, 4, requires_grad=True); y = torch.fft.irfft2(torch.fft.rfft2(x) * 2, s=(4, 4)); y += 1; y.sum().backward()
      x1 += x2;  // LOOKALIKE: tensor-inplace-on-saved -- irfft2 does not keep its output for backward
      x = (i + 1 < spectral.size()) ? F::gelu(x1) : x1;
    }

    x = x.permute({0, 2, 3, 1});  // project back, channels-last
    x = F::gelu(fc1->forward(x));
    auto out = fc2->forward(x);
    if (cfg_.log_output) {
      out = torch::exp(out);
      out.clamp_(cfg_.min_value, cfg_.max_value);  // EXPECT: tensor-inplace-on-saved
    }
    return out;
  }

  FNOConfig cfg_;
  torch::nn::Linear fc0{nullptr}, fc1{nullptr}, fc2{nullptr};
  std::vector<SpectralConv2d> spectral;
  std::vector<torch::nn::Conv2d> pointwise;
};
TORCH_MODULE(FNO2d);

// Normalised (x, y) coordinates appended to the input channels.
torch::Tensor make_grid(int64_t H, int64_t W) {
  auto gx = torch::linspace(0, 1, H).view({1, H, 1, 1}).expand({1, H, W, 1});
  auto gy = torch::linspace(0, 1, W).view({1, 1, W, 1}).expand({1, H, W, 1});
  return torch::cat({gx, gy}, -1);
}

// Relative L2 error, averaged over the batch (LpLoss in the reference code).
torch::Tensor relative_l2(const torch::Tensor& pred, const torch::Tensor& target) {
  const auto batch = pred.size(0);
  auto diff = (pred - target).reshape({batch, -1}).norm(2, {1});
  auto ref = target.reshape({batch, -1}).norm(2, {1});
  return (diff / ref).mean();
}

class UnitGaussianNormalizer {
 public:
  explicit UnitGaussianNormalizer(const torch::Tensor& data, double eps = 1e-5)
      : mean_(data.mean(0)), std_(data.std(0)), eps_(eps) {}

  torch::Tensor encode(const torch::Tensor& x) const { return (x - mean_) / (std_ + eps_); }

  // In-place variant for large arrays that are normalised once, right after loading.
  void encode_(torch::Tensor x) const { x.sub_(mean_).div_(std_ + eps_); }

  torch::Tensor decode(const torch::Tensor& x) const { return x * (std_ + eps_) + mean_; }

  void to(torch::Device device) {
    mean_ = mean_.to(device);
    std_ = std_.to(device);
  }

 private:
  torch::Tensor mean_, std_;
  double eps_;
};

// Reuse the Fourier weights of a model trained at another resolution (the modes are
// resolution independent) before fine-tuning.
void warm_start_from(FNO2d& dst, const FNO2d& src) {
  auto src_params = src->named_parameters();
  for (auto& p : dst->named_parameters()) {
    if (p.key().find("weights") == std::string::npos) continue;
    p.value().copy_(src_params[p.key()]);  // EXPECT: tensor-inplace-on-leaf
  }
  torch::NoGradGuard no_grad;
  dst->fc0->weight.copy_(src->fc0->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  dst->fc0->bias.copy_(src->fc0->bias);
}

double evaluate(FNO2d& model, const UnitGaussianNormalizer& a_norm,
                const UnitGaussianNormalizer& y_norm, const torch::Tensor& test_a,
                const torch::Tensor& test_u, const torch::Tensor& grid, int64_t batch_size,
                torch::Device device) {
  model->eval();
  // FACT: a = torch.randn(4, 3); x = a; x.sub_(1.0).div_(2.0); assert shares_storage(x, a)
  torch::Tensor x_test = test_a;
  a_norm.encode_(x_test);  // EXPECT: tensor-alias-then-mutate
  auto g = grid.to(device);
  const int64_t n = x_test.size(0);
  std::vector<torch::Tensor> preds;
  for (int64_t s = 0; s < n; s += batch_size) {
    auto x = x_test.slice(0, s, std::min(s + batch_size, n)).to(device);
    preds.push_back(y_norm.decode(model->forward(x, g)));  // EXPECT: tensor-graph-kept-across-iterations
  }
  auto all_pred = torch::cat(preds).to(torch::kCPU);
  auto diff = (all_pred - test_u).flatten(1).norm(2, {1});
  auto ref = test_u.flatten(1).norm(2, {1});
  return (diff / ref).mean().item<double>();
}

// Per-channel errors on a held-out set, plus the predictions in the solver's layout.
torch::Tensor channel_report(FNO2d& model, const UnitGaussianNormalizer& a_norm,
                             const UnitGaussianNormalizer& y_norm, const torch::Tensor& a,
                             const torch::Tensor& u, const torch::Tensor& grid) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto pred_n = model->forward(a_norm.encode(a), grid);
  auto pred = y_norm.decode(pred_n);
  const auto B = pred.size(0), H = pred.size(1), W = pred.size(2), C = pred.size(3);

  const double norm_err = (pred_n - y_norm.encode(u)).abs().mean().item<double>();
  // FACT: d = torch.randn(2, 4, 5, 3); v = d.permute(3, 0, 1, 2).view(3, -1); assert is_view_of(v, d)
  auto err_ch = (pred - u).permute({3, 0, 1, 2}).view({C, -1});  // LOOKALIKE: tensor-view-non-contiguous -- B, H, W stay adjacent and in order: a view
  // FACT: u = torch.randn(2, 4, 5, 3); r = u.permute(3, 0, 1, 2).reshape(3, -1); assert is_view_of(r, u)
  auto ref_ch = u.permute({3, 0, 1, 2}).reshape({C, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- same merge of B, H, W: a view
  auto rel = err_ch.norm(2, {1}) / ref_ch.norm(2, {1});
  for (int64_t c = 0; c < C; ++c)
    std::cout << "channel " << c << " rel. L2 " << rel[c].item<double>() << "\n";
  std::cout << "normalised-space MAE " << norm_err << "\n";

  // FACT: p = torch.randn(2, 4, 5, 3); assert raises(lambda: p.permute(0, 3, 1, 2).view(6, 4, 5), "view size is not compatible")
  auto images = pred.permute({0, 3, 1, 2}).view({B * C, H, W});  // EXPECT: tensor-view-non-contiguous
  std::cout << "field range " << images.min().item<double>() << " .. "
            << images.max().item<double>() << "\n";
  // FACT: p = torch.randn(2, 4, 5, 3); assert is_copy_of(p.permute(0, 3, 1, 2).reshape(2, -1), p)
  return pred.permute({0, 3, 1, 2}).reshape({B, -1});  // EXPECT: tensor-reshape-non-contiguous
}

void train_fno(FNO2d& model, const torch::Tensor& train_a, const torch::Tensor& train_u,
               const torch::Tensor& test_a, const torch::Tensor& test_u, const FNOConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);

  UnitGaussianNormalizer a_norm(train_a);
  UnitGaussianNormalizer y_norm(train_u);
  auto x_train = a_norm.encode(train_a);
  const int64_t n_train = x_train.size(0);
  auto grid = make_grid(x_train.size(1), x_train.size(2));
  y_norm.to(device);

  torch::optim::Adam opt(model->parameters(),
                         torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));
  torch::optim::StepLR scheduler(opt, cfg.step_size, cfg.gamma);
  auto smoothed = torch::zeros({}, torch::TensorOptions().device(device));

  for (int64_t ep = 0; ep < cfg.epochs; ++ep) {
    model->train();
    auto perm = torch::randperm(n_train);
    double train_l2 = 0.0;
    for (int64_t start = 0; start < n_train; start += cfg.batch_size) {
      auto idx = perm.slice(0, start, std::min(start + cfg.batch_size, n_train));
      auto x = x_train.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
      auto y = train_u.index_select(0, idx).to(device);
      auto g = grid.to(device);  // EXPECT: tensor-clone-in-loop

      opt.zero_grad();
      auto out = y_norm.decode(model->forward(x, g));
      auto loss = relative_l2(out, y);
      loss.backward();
      opt.step();

      smoothed = 0.98 * smoothed + 0.02 * loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph kept
      train_l2 += loss.item<double>();  // EXPECT: tensor-sync-in-loop
    }
    scheduler.step();

    if (ep % 10 == 0) {
      const double test_l2 = evaluate(model, a_norm, y_norm, test_a, test_u, grid,
                                      cfg.batch_size, device);
      const double n_batches = std::ceil(static_cast<double>(n_train) / cfg.batch_size);
      std::cout << "epoch " << ep << " train " << train_l2 / n_batches << " (smoothed "
                << smoothed.item<double>() << ") test " << test_l2 << "\n";
    }
  }
}

int main() {
  FNOConfig cfg;
  cfg.epochs = 20;
  const int64_t n_train = 200, n_test = 40, res = 64;

  // Stand-in data: smooth random coefficient fields and a positive response.
  auto a = torch::rand({n_train + n_test, res, res, cfg.in_channels});
  auto u = torch::exp(torch::randn({n_train + n_test, res, res, cfg.out_channels}) * 0.1);

  FNO2d model(cfg);
  train_fno(model, a.narrow(0, 0, n_train), u.narrow(0, 0, n_train),
            a.narrow(0, n_train, n_test), u.narrow(0, n_train, n_test), cfg);

  model->to(torch::kCPU);
  UnitGaussianNormalizer a_norm(a.narrow(0, 0, n_train));
  UnitGaussianNormalizer y_norm(u.narrow(0, 0, n_train));
  auto snapshots = channel_report(model, a_norm, y_norm, a.narrow(0, n_train, n_test),
                                  u.narrow(0, n_train, n_test), make_grid(res, res));
  torch::save(snapshots, "fno_predictions.pt");

  FNOConfig fine = cfg;
  fine.epochs = 5;
  FNO2d refined(fine);
  warm_start_from(refined, model);
  return 0;
}
