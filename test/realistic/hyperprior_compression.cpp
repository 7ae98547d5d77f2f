// Learned image compression with a scale hyperprior (Balle et al. 2018).
// g_a/g_s are GDN conv transforms, the hyper-latent z goes through a factorised entropy
// bottleneck and the latent y through a zero-mean Gaussian whose scales h_s predicts.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
namespace nn = torch::nn;

struct CodecConfig {
  int64_t N = 128, M = 192;
  double lambda = 0.0130;
  double lr = 1e-4, aux_lr = 1e-3;
  int64_t batch_size = 16, patch = 256, epochs = 200, log_every = 100;
  double scale_bound = 0.11, likelihood_bound = 1e-9;
};

struct GDNImpl : nn::Module {
  GDNImpl(int64_t channels, bool inverse = false, double beta_min = 1e-6, double gamma_init = 0.1)
      : inverse_(inverse), beta_min_(beta_min) {
    beta_ = register_parameter("beta", torch::ones({channels}));
    gamma_ = register_parameter("gamma", torch::eye(channels));
    gamma_.mul_(gamma_init);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t c = x.size(1);
    auto norm = F::conv2d(x * x, gamma_.view({c, c, 1, 1}), F::Conv2dFuncOptions().bias(beta_));
    return x * (inverse_ ? torch::sqrt(norm) : torch::rsqrt(norm));
  }

  // Keep the normalisation well defined after each optimiser step.
  void project() {
    torch::NoGradGuard no_grad;
    beta_.clamp_min_(beta_min_);  // LOOKALIKE: tensor-inplace-on-leaf -- parameter projection under NoGradGuard
    gamma_.clamp_min_(0.0);
  }

  bool inverse_;
  double beta_min_;
  torch::Tensor beta_, gamma_;
};
TORCH_MODULE(GDN);

nn::Conv2d conv(int64_t in, int64_t out, int64_t k = 5, int64_t s = 2) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(s).padding(k / 2));
}
nn::ConvTranspose2d deconv(int64_t in, int64_t out, int64_t k = 5, int64_t s = 2) {
  return nn::ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, k).stride(s).padding(k / 2).output_padding(s - 1));
}

// Non-parametric factorised density per channel (Balle 2018, appendix 6.1).
struct EntropyBottleneckImpl : nn::Module {
  EntropyBottleneckImpl(int64_t channels, double likelihood_bound, double init_scale = 10.0)
      : likelihood_bound_(likelihood_bound) {
    const std::vector<int64_t> dims{1, 3, 3, 3, 1};
    const double scale = std::pow(init_scale, 1.0 / (dims.size() - 1));
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      const double init = std::log(std::expm1(1.0 / scale / dims[i + 1]));
      const auto tag = std::to_string(i);
      matrices_.push_back(register_parameter("matrix" + tag, torch::full({channels, dims[i + 1], dims[i]}, init)));
      biases_.push_back(register_parameter("bias" + tag, torch::rand({channels, dims[i + 1], 1}) - 0.5));
      if (i + 2 < dims.size())
        factors_.push_back(register_parameter("factor" + tag, torch::zeros({channels, dims[i + 1], 1})));
    }
    quantiles_ = register_parameter("quantiles", torch::tensor({-init_scale, 0.0, init_scale}).repeat({channels, 1, 1}));
    const double t = std::log(2.0 / 1e-9 - 1.0);
    target_ = register_buffer("target", torch::tensor({-t, 0.0, t}));
  }

  torch::Tensor logits_cumulative(torch::Tensor logits, bool stop_gradient) {
    auto maybe_detach = [&](const torch::Tensor& p) { return stop_gradient ? p.detach() : p; };
    for (size_t i = 0; i < matrices_.size(); ++i) {
      logits = torch::matmul(F::softplus(maybe_detach(matrices_[i])), logits);
      logits.add_(maybe_detach(biases_[i]));
      if (i < factors_.size())
        logits.add_(torch::tanh(maybe_detach(factors_[i])) * torch::tanh(logits));  // LOOKALIKE: tensor-inplace-on-saved -- tanh saves its output, matmul its operands; logits itself is not saved
    }
    return logits;
  }

  torch::Tensor medians() const { return quantiles_.narrow(2, 1, 1).detach(); }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& z) {
    const int64_t b = z.size(0), c = z.size(1), h = z.size(2), w = z.size(3);
    // FACT: z = torch.rand(2,5,4,4); assert is_copy_of(z.permute(1,0,2,3).reshape(5,1,-1), z)
    auto values = z.permute({1, 0, 2, 3}).reshape({c, 1, -1});  // EXPECT: tensor-reshape-non-contiguous
    torch::Tensor outputs;
    if (is_training()) {
      outputs = values + torch::empty_like(values).uniform_(-0.5, 0.5);  // LOOKALIKE: tensor-device-mismatch -- empty_like inherits the device
    } else {
      outputs = torch::round(values - medians()) + medians();
    }
    auto lower = logits_cumulative(outputs - 0.5, false);
    auto upper = logits_cumulative(outputs + 0.5, false);
    auto sign = -torch::sign(lower + upper).detach();
    auto lik = torch::clamp_min(torch::abs(torch::sigmoid(sign * upper) - torch::sigmoid(sign * lower)),
                                likelihood_bound_);
    // FACT: o = torch.rand(5,1,32); assert is_view_of(o.reshape(5,2,4,4), o)
    auto unflatten = [&](const torch::Tensor& t) { return t.reshape({c, b, h, w}).permute({1, 0, 2, 3}); };  // LOOKALIKE: tensor-reshape-non-contiguous -- the flat tensors are fresh and contiguous
    return {unflatten(outputs), unflatten(lik)};
  }

  torch::Tensor aux_loss() {
    auto logits = logits_cumulative(quantiles_, true);
    return (logits - target_).abs().sum();  // LOOKALIKE: tensor-device-mismatch -- target is a registered buffer and follows model->to()
  }

  double likelihood_bound_;
  std::vector<torch::Tensor> matrices_, biases_, factors_;
  torch::Tensor quantiles_, target_;
};
TORCH_MODULE(EntropyBottleneck);

torch::Tensor gaussian_likelihood(const torch::Tensor& y_hat, const torch::Tensor& scales, double bound) {
  auto std_cumulative = [](const torch::Tensor& t) { return 0.5 * torch::erfc(-M_SQRT1_2 * t); };
  auto values = y_hat.abs();
  auto lik = std_cumulative((0.5 - values) / scales) - std_cumulative((-0.5 - values) / scales);
  lik.clamp_min_(bound);  // LOOKALIKE: tensor-inplace-on-saved -- the subtraction's result is not saved by autograd
  return lik;
}

struct CodecOutput {
  torch::Tensor x_hat, y_lik, z_lik;
};

struct ScaleHyperpriorImpl : nn::Module {
  explicit ScaleHyperpriorImpl(const CodecConfig& cfg) : cfg_(cfg) {
    const int64_t N = cfg.N, M = cfg.M;
    g_a = register_module("g_a", nn::Sequential(conv(3, N), GDN(N), conv(N, N), GDN(N), conv(N, N), GDN(N), conv(N, M)));
    g_s = register_module("g_s", nn::Sequential(deconv(M, N), GDN(N, true), deconv(N, N), GDN(N, true), deconv(N, N),
                                                GDN(N, true), deconv(N, 3)));
    h_a = register_module("h_a", nn::Sequential(conv(M, N, 3, 1), nn::ReLU(), conv(N, N), nn::ReLU(), conv(N, N)));
    h_s = register_module("h_s", nn::Sequential(deconv(N, N), nn::ReLU(), deconv(N, N), nn::ReLU(), conv(N, M, 3, 1)));
    entropy_bottleneck = register_module("entropy_bottleneck", EntropyBottleneck(N, cfg.likelihood_bound));
  }

  CodecOutput forward(const torch::Tensor& x) {
    auto y = g_a->forward(x);
    auto z = h_a->forward(torch::abs(y));
    auto [z_hat, z_lik] = entropy_bottleneck->forward(z);
    auto scales = torch::exp(h_s->forward(z_hat));
    scales.clamp_min_(cfg_.scale_bound);  // EXPECT: tensor-inplace-on-saved

    torch::Tensor y_rate, y_dec;
    if (is_training()) {
      // additive noise for the rate term, straight-through rounding for the decoder
      auto noise = torch::empty(y.sizes()).uniform_(-0.5, 0.5);
      y_rate = y + noise;  // EXPECT: tensor-device-mismatch
      auto y_round = y.detach();
      y_round.round_();  // EXPECT: tensor-inplace-on-detached
      y_dec = y_round - y.detach() + y;
    } else {
      y_rate = y_dec = torch::round(y);
    }
    auto y_lik = gaussian_likelihood(y_rate, scales, cfg_.likelihood_bound);
    return {g_s->forward(y_dec), y_lik, z_lik};
  }

  void project_gdn() {
    for (const auto& m : modules(/*include_self=*/false))
      if (auto* gdn = m->as<GDNImpl>()) gdn->project();
  }

  CodecConfig cfg_;
  nn::Sequential g_a{nullptr}, g_s{nullptr}, h_a{nullptr}, h_s{nullptr};
  EntropyBottleneck entropy_bottleneck{nullptr};
};
TORCH_MODULE(ScaleHyperprior);

struct RDLoss {
  torch::Tensor loss, mse, bpp;
};

RDLoss rate_distortion(const CodecOutput& out, const torch::Tensor& x, double lambda) {
  const double num_pixels = static_cast<double>(x.size(0) * x.size(2) * x.size(3));
  auto bpp = (torch::log2(out.y_lik).sum() + torch::log2(out.z_lik).sum()) / -num_pixels;
  auto mse = F::mse_loss(out.x_hat, x);
  return {lambda * 255.0 * 255.0 * mse + bpp, mse, bpp};
}

// Symbols handed to the range coder: y is zero-mean, z is coded relative to its medians.
std::pair<torch::Tensor, torch::Tensor> quantize_for_coding(ScaleHyperprior& net, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  auto y = net->g_a->forward(x);
  auto z = net->h_a->forward(torch::abs(y));
  auto y_sym = torch::empty(y.sizes(), y.options().dtype(torch::kInt32));
  y_sym.copy_(y);  // EXPECT: tensor-copy-narrowing
  auto medians = net->entropy_bottleneck->medians().view({1, -1, 1, 1});
  auto z_sym = torch::round(z - medians).to(torch::kInt32);
  return {y_sym, z_sym};
}

torch::Tensor pad_to_multiple(const torch::Tensor& x, int64_t m) {
  const int64_t ph = (m - x.size(2) % m) % m, pw = (m - x.size(3) % m) % m;
  if (ph == 0 && pw == 0) return x;
  return F::pad(x, F::PadFuncOptions({0, pw, 0, ph}).mode(torch::kReplicate));
}

// Mean bpp and PSNR over full images (e.g. Kodak), with actual rounding.
std::pair<double, double> evaluate(ScaleHyperprior& net, const std::vector<torch::Tensor>& images, torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto stats = torch::empty({static_cast<int64_t>(images.size()), 2}, torch::dtype(torch::kFloat64).device(device));
  auto max_symbol = torch::zeros({}, torch::dtype(torch::kInt32).device(device));
  for (size_t i = 0; i < images.size(); ++i) {
    const int64_t h = images[i].size(1), w = images[i].size(2);
    auto x = pad_to_multiple(images[i].unsqueeze(0).to(device), 64);
    // FACT: x = torch.rand(1,3,8,8); assert shares_storage(x.contiguous(), x)
    auto ref = x.contiguous();
    ref.mul_(255.0).round_();  // EXPECT: tensor-alias-then-mutate
    auto out = net->forward(x);
    // FACT: r = torch.rand(1,3,8,8); assert is_copy_of(r.clamp(0, 1), r)
    auto rec = out.x_hat.clamp(0.0, 1.0).mul_(255.0).round_();  // LOOKALIKE: tensor-alias-then-mutate -- clamp already made a new tensor
    auto mse = (rec - ref).narrow(2, 0, h).narrow(3, 0, w).pow(2).mean();
    auto psnr = 10.0 * torch::log10(255.0 * 255.0 / mse);
    auto bits = out.y_lik.clone().log2_().neg_().sum() - torch::log2(out.z_lik).sum();  // EXPECT: tensor-unnecessary-clone
    auto bpp = bits / static_cast<double>(h * w);
    std::printf("image %2zu  %.4f bpp  %.2f dB\n", i, bpp.item<double>(), psnr.item<double>());  // EXPECT: tensor-sync-in-loop
    stats.select(0, static_cast<int64_t>(i)).copy_(torch::stack({bpp, psnr}));  // LOOKALIKE: tensor-copy-narrowing -- float32 results widen into a float64 buffer

    max_symbol = torch::maximum(max_symbol, quantize_for_coding(net, x).first.abs().max());
  }
  std::printf("largest |y| symbol: %d\n", max_symbol.item<int>());
  auto mean = stats.mean(0).cpu();
  return {mean[0].item<double>(), mean[1].item<double>()};
}

class CropDataset : public torch::data::datasets::Dataset<CropDataset, torch::data::TensorExample> {
 public:
  CropDataset(std::vector<torch::Tensor> images, int64_t patch) : images_(std::move(images)), patch_(patch) {}

  torch::data::TensorExample get(size_t index) override {
    thread_local std::mt19937 rng{std::random_device{}()};
    const auto& img = images_[index];
    std::uniform_int_distribution<int64_t> top(0, img.size(1) - patch_), left(0, img.size(2) - patch_);
    auto crop = img.narrow(1, top(rng), patch_).narrow(2, left(rng), patch_);
    if (rng() & 1) crop = crop.flip({2});
    return {crop};
  }

  c10::optional<size_t> size() const override { return images_.size(); }

 private:
  std::vector<torch::Tensor> images_;
  int64_t patch_;
};

std::vector<torch::Tensor> load_images(const std::string& list) {
  std::vector<torch::Tensor> images;
  std::ifstream in(list);
  for (std::string path; in >> path;) {
    images.emplace_back();
    torch::load(images.back(), path);  // float CHW in [0, 1]
  }
  return images;
}

int main(int argc, char** argv) {
  CodecConfig cfg;
  if (argc > 1) cfg.lambda = std::stod(argv[1]);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      CropDataset(load_images("train_list.txt"), cfg.patch).map(torch::data::transforms::Stack<torch::data::TensorExample>()),
      torch::data::DataLoaderOptions().batch_size(cfg.batch_size).workers(4).drop_last(true));
  const auto kodak = load_images("kodak_list.txt");

  ScaleHyperprior net(cfg);
  net->to(device);
  std::vector<torch::Tensor> main_params, aux_params;
  for (const auto& p : net->named_parameters())
    (p.key().find("quantiles") != std::string::npos ? aux_params : main_params).push_back(p.value());
  torch::optim::Adam optimizer(main_params, torch::optim::AdamOptions(cfg.lr));
  torch::optim::Adam aux_optimizer(aux_params, torch::optim::AdamOptions(cfg.aux_lr));

  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    net->train();
    torch::Tensor epoch_bpp = torch::zeros({}, device);
    RDLoss last;
    int64_t batches = 0;
    for (auto& batch : *loader) {
      auto x = batch.data.to(device);
      optimizer.zero_grad();
      aux_optimizer.zero_grad();
      auto rd = rate_distortion(net->forward(x), x, cfg.lambda);
      rd.loss.backward();
      torch::nn::utils::clip_grad_norm_(main_params, 1.0);
      optimizer.step();
      auto aux = net->entropy_bottleneck->aux_loss();
      aux.backward();
      aux_optimizer.step();
      net->project_gdn();

      epoch_bpp += rd.bpp;  // EXPECT: tensor-graph-kept-across-iterations
      last = rd;  // LOOKALIKE: tensor-graph-kept-across-iterations -- overwritten every step, only the latest graph stays alive
      ++batches;
      if (++step % cfg.log_every == 0) {
        std::printf("step %ld  loss %.4f  mse %.6f  bpp %.4f  aux %.2f\n", static_cast<long>(step),
                    rd.loss.item<double>(), rd.mse.item<double>(), rd.bpp.item<double>(), aux.item<double>());  // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
      }
    }
    const auto [bpp, psnr] = evaluate(net, kodak, device);
    std::printf("epoch %ld  train bpp %.4f  last loss %.4f  kodak %.4f bpp %.2f dB\n", static_cast<long>(epoch),
                epoch_bpp.item<double>() / batches, last.loss.item<double>(), bpp, psnr);
    torch::save(net, "hyperprior_" + std::to_string(cfg.lambda) + ".pt");
  }
  return 0;
}
