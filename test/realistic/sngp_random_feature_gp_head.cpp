// SNGP (Liu et al., 2020) on two moons: a spectrally normalised residual MLP as the
// distance-preserving feature extractor, a random-Fourier-feature GP output layer whose
// Laplace precision is accumulated over each epoch, and mean-field logits at evaluation.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

namespace F = torch::nn::functional;

struct SNGPConfig {
  int64_t in_dim = 2;
  int64_t hidden = 128;
  int64_t depth = 6;
  int64_t num_classes = 2;
  int64_t num_features = 1024;
  double sn_coeff = 0.95;
  int n_power_iter = 1;
  double dropout = 0.1;
  double ridge = 1.0;
  double kernel_scale = 2.0;
  double cov_momentum = -1.0;  // < 0: exact accumulation over the epoch
  double mean_field_factor = M_PI / 8.0;
};

// Soft spectral normalisation: W / max(1, sigma(W) / c), sigma estimated by power iteration.
struct SpectralLinearImpl : torch::nn::Module {
  SpectralLinearImpl(int64_t in, int64_t out, double coeff, int n_iter)
      : coeff(coeff), n_iter(n_iter) {
    weight = register_parameter("weight", torch::empty({out, in}));
    bias = register_parameter("bias", torch::zeros({out}));
    torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs its fill under NoGradGuard
    auto unit = F::NormalizeFuncOptions().dim(0);
    u_ = register_buffer("u", F::normalize(torch::randn({out}), unit));
    v_ = register_buffer("v", F::normalize(torch::randn({in}), unit));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    if (is_training()) {
      torch::NoGradGuard no_grad;
      auto unit = F::NormalizeFuncOptions().dim(0);
      for (int i = 0; i < n_iter; ++i) {
        v_.copy_(F::normalize(torch::mv(weight.t(), u_), unit));
        u_.copy_(F::normalize(torch::mv(weight, v_), unit));  // LOOKALIKE: tensor-inplace-on-saved -- the last step's backward already consumed the u saved by dot
      }
    }
    auto sigma = torch::dot(u_, torch::mv(weight, v_));
    auto w = weight / torch::clamp_min(sigma / coeff, 1.0);
    return F::linear(x, w, bias);
  }

  double coeff;
  int n_iter;
  torch::Tensor weight, bias, u_, v_;
};
TORCH_MODULE(SpectralLinear);

struct ResidualBlockImpl : torch::nn::Module {
  explicit ResidualBlockImpl(const SNGPConfig& c)
      : fc(register_module("fc", SpectralLinear(c.hidden, c.hidden, c.sn_coeff, c.n_power_iter))),
        drop(register_module("drop", torch::nn::Dropout(c.dropout))) {}

  torch::Tensor forward(const torch::Tensor& x) { return x + drop(torch::relu(fc(x))); }

  SpectralLinear fc;
  torch::nn::Dropout drop;
};
TORCH_MODULE(ResidualBlock);

struct FeatureExtractorImpl : torch::nn::Module {
  explicit FeatureExtractorImpl(const SNGPConfig& c) {
    input = register_module("input", torch::nn::Linear(c.in_dim, c.hidden));
    blocks = register_module("blocks", torch::nn::Sequential());
    for (int64_t i = 0; i < c.depth; ++i) blocks->push_back(ResidualBlock(c));
  }
  torch::Tensor forward(const torch::Tensor& x) { return blocks->forward(input(x)); }

  torch::nn::Linear input{nullptr};
  torch::nn::Sequential blocks{nullptr};
};
TORCH_MODULE(FeatureExtractor);

struct RandomFeatureGPImpl : torch::nn::Module {
  explicit RandomFeatureGPImpl(const SNGPConfig& c)
      : num_features(c.num_features), ridge(c.ridge), momentum(c.cov_momentum),
        mf_factor(c.mean_field_factor) {
    rff_w = register_buffer("rff_w", torch::randn({c.num_features, c.hidden}) / c.kernel_scale);
    rff_b = register_buffer("rff_b", torch::rand({c.num_features}) * (2.0 * M_PI));
    beta = register_module("beta", torch::nn::Linear(torch::nn::LinearOptions(c.num_features, c.num_classes).bias(false)));
    precision_ = register_buffer("precision", torch::eye(c.num_features, torch::kDouble) * ridge);
    covariance_ = register_buffer("covariance", torch::eye(c.num_features) / ridge);
  }

  torch::Tensor random_features(const torch::Tensor& h) {
    auto proj = h.matmul(rff_w.t());
    // FACT: p = torch.randn(4, 6); b = torch.rand(6); assert not raises(lambda: p.add_(b.unsqueeze(0).expand_as(p)))
    proj.add_(rff_b.unsqueeze(0).expand_as(proj));  // LOOKALIKE: tensor-inplace-on-expanded -- the written tensor is the fresh matmul result; the expanded bias is only read
    return torch::cos(proj) * std::sqrt(2.0 / static_cast<double>(num_features));
  }

  torch::Tensor forward(const torch::Tensor& h) {
    auto phi = random_features(h);
    auto logits = beta(phi);
    if (is_training()) {
      update_precision(phi);
      return logits;
    }
    return mean_field_logits(logits, predictive_variance(phi));
  }

  void reset_precision() {
    torch::NoGradGuard no_grad;
    precision_.copy_(torch::eye(num_features, torch::kDouble) * ridge);  // LOOKALIKE: tensor-device-mismatch -- copy_ may read a CPU source into a CUDA buffer
  }

  void update_precision(const torch::Tensor& phi) {
    const bool ema = momentum > 0.0;
    const double decay = ema ? momentum : 1.0;
    const double weight = ema ? (1.0 - momentum) / static_cast<double>(phi.size(0)) : 1.0;
    // FACT: P = torch.zeros(3, 3, dtype=torch.double); [P.add_(x.t().matmul(x)) for x in [torch.randn(4, 3, requires_grad=True) for _ in range(3)]]; assert P.requires_grad and kept_nodes(P) > 6
    precision_.mul_(decay).add_(phi.t().matmul(phi), weight);  // EXPECT: tensor-graph-kept-across-iterations
  }

  void finalize_covariance() {
    torch::NoGradGuard no_grad;
    // FACT: P = torch.randn(5, 5); assert raises(lambda: P.add_(P.t()), "single memory location")
    precision_.add_(precision_.t()).mul_(0.5);  // EXPECT: tensor-inplace-overlap
    auto jitter = 1e-6 * torch::eye(precision_.size(0), torch::kDouble);
    auto chol = torch::linalg::cholesky(precision_ + jitter);  // EXPECT: tensor-device-mismatch
    auto cov = torch::cholesky_inverse(chol);
    // FACT: c = torch.randn(5, 5); s = (c + c.t()) * 0.5; assert is_copy_of(s, c)
    cov = (cov + cov.t()) * 0.5;  // LOOKALIKE: tensor-inplace-overlap -- out-of-place sum, the transpose is only read
    covariance_.copy_(cov);  // EXPECT: tensor-copy-narrowing
  }

  torch::Tensor predictive_variance(const torch::Tensor& phi) const {
    return (phi.matmul(covariance_) * phi).sum(-1) * ridge;
  }

  torch::Tensor mean_field_logits(const torch::Tensor& logits, const torch::Tensor& var) const {
    if (mf_factor < 0.0) return logits;
    auto scale = var.unsqueeze(-1).expand_as(logits);
    // FACT: s = torch.rand(4).unsqueeze(-1).expand(4, 2); assert raises(lambda: s.mul_(0.39), "more than one element")
    scale.mul_(mf_factor).add_(1.0).rsqrt_();  // EXPECT: tensor-inplace-on-expanded
    return logits * scale;
  }

  int64_t num_features;
  double ridge, momentum, mf_factor;
  torch::nn::Linear beta{nullptr};
  torch::Tensor rff_w, rff_b, precision_, covariance_;
};
TORCH_MODULE(RandomFeatureGP);

struct SNGPNetImpl : torch::nn::Module {
  explicit SNGPNetImpl(const SNGPConfig& c)
      : extractor(register_module("extractor", FeatureExtractor(c))),
        gp(register_module("gp", RandomFeatureGP(c))) {}
  torch::Tensor forward(const torch::Tensor& x) { return gp(extractor(x)); }

  FeatureExtractor extractor;
  RandomFeatureGP gp;
};
TORCH_MODULE(SNGPNet);

// ---------------------------------------------------------------------------
struct MoonsData {
  torch::Tensor x, y;
};

MoonsData make_moons(int64_t n, double noise) {
  MoonsData d{torch::empty({n, 2}), torch::empty({n}, torch::kLong)};
  auto t = torch::rand({n}, torch::kDouble) * M_PI;
  auto upper = torch::arange(n) < n / 2;
  auto px = torch::where(upper, torch::cos(t), 1.0 - torch::cos(t));
  auto py = torch::where(upper, torch::sin(t), 0.5 - torch::sin(t));
  d.x.copy_(torch::stack({px, py}, 1).to(d.x.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the double-to-float conversion is spelled out
  d.x.add_(torch::randn_like(d.x) * noise);
  d.y.copy_(upper.logical_not());
  return d;
}

torch::Tensor make_ood(int64_t n) {
  auto angle = torch::rand({n}) * (2.0 * M_PI);
  auto radius = 3.0 + 0.3 * torch::randn({n});
  return torch::stack({radius * torch::cos(angle) + 0.5, radius * torch::sin(angle) + 0.25}, 1);
}

struct Normalizer {
  torch::Tensor mean, std;
};

struct EvalResult {
  double accuracy = 0.0;
  double uncertainty = 0.0;
};

EvalResult evaluate(SNGPNet& model, torch::Tensor x, const torch::Tensor& y, const Normalizer& norm,
                    int64_t batch) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0;
  auto unc_sum = torch::zeros({}, x.options());
  for (int64_t i = 0; i < x.size(0); i += batch) {
    const int64_t n = std::min(batch, x.size(0) - i);
    auto xb = x.narrow(0, i, n);
    // FACT: X = torch.randn(10, 2); xb = X.narrow(0, 0, 4); xb.sub_(1.0); assert is_view_of(xb, X)
    xb.sub_(norm.mean).div_(norm.std);  // EXPECT: tensor-alias-then-mutate
    auto probs = torch::softmax(model->forward(xb), -1);
    unc_sum += (1.0 - std::get<0>(probs.max(-1))).sum();
    if (y.defined())
      correct += probs.argmax(-1).eq(y.narrow(0, i, n)).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
  }
  model->train();
  const double n_total = static_cast<double>(x.size(0));
  return {correct / n_total, unc_sum.item<double>() / n_total};  // LOOKALIKE: tensor-sync-in-loop -- one read per evaluation, after the batch loop
}

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  SNGPConfig cfg;
  const int64_t epochs = 40, batch = 128;

  auto train = make_moons(2000, 0.1);
  auto test = make_moons(1000, 0.1);
  auto ood_x = make_ood(500);
  Normalizer norm{train.x.mean(0).to(device), train.x.std(0).to(device)};
  auto train_x = train.x.to(device), train_y = train.y.to(device);
  auto test_x = test.x.to(device), test_y = test.y.to(device);

  SNGPNet model(cfg);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(1e-4));

  const int64_t n = train_x.size(0);
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    model->gp->reset_precision();
    auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto spread_sum = torch::zeros({}, train_x.options());
    int64_t steps = 0;
    for (int64_t i = 0; i < n; i += batch) {
      auto idx = perm.narrow(0, i, std::min(batch, n - i));
      auto xb = train_x.index_select(0, idx);
      // FACT: X = torch.randn(8, 2); xb = X.index_select(0, torch.tensor([3, 1])); xb.sub_(1.0); assert is_copy_of(xb, X)
      xb.sub_(norm.mean).div_(norm.std);  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into a new tensor
      auto yb = train_y.index_select(0, idx);

      auto h = model->extractor(xb);
      auto f = h.detach();
      // FACT: h = torch.randn(4, 3, requires_grad=True) * 1.0; f = h.detach(); f.sub_(f.mean(0)); assert shares_storage(f, h) and torch.allclose(h.mean(0), torch.zeros(3), atol=1e-6)
      f.sub_(f.mean(0));  // EXPECT: tensor-inplace-on-detached
      spread_sum += f.pow(2).sum(1).mean();  // LOOKALIKE: tensor-graph-kept-across-iterations -- built from a detached tensor, no graph attached
      auto logits = model->gp(h);
      auto loss = F::cross_entropy(logits, yb);

      opt.zero_grad();
      loss.backward();
      opt.step();
      ++steps;
    }
    model->gp->finalize_covariance();

    auto ood = ood_x.to(device);  // EXPECT: tensor-clone-in-loop
    auto in_res = evaluate(model, test_x, test_y, norm, 256);
    auto ood_res = evaluate(model, ood, torch::Tensor(), norm, 256);
    std::printf("epoch %3lld  acc %.4f  unc(in) %.4f  unc(ood) %.4f  spread %.3f\n",
                static_cast<long long>(epoch), in_res.accuracy, in_res.uncertainty,
                ood_res.uncertainty, spread_sum.item<double>() / std::max<int64_t>(steps, 1));
  }
  return 0;
}
