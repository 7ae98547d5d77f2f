// Attentive Neural Process (Kim et al. 2019) for 1-D regression on curves drawn from a GP
// prior: a latent path (self-attention + mean pooling -> q(z)) and a deterministic path
// (self-attention over the context, cross-attention from the target inputs).
#include <torch/torch.h>

#include <cmath>
#include <deque>
#include <fstream>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct AnpConfig {
  int64_t batch = 16;
  int64_t max_context = 50;
  int64_t grid_points = 400;
  int64_t hidden = 128;
  int64_t latent = 128;
  int64_t heads = 8;
  double length_scale = 0.6;
  double signal_var = 1.0;
  double noise_std = 0.02;
  double context_noise = 0.05;
  int64_t iterations = 100000;
  int64_t log_every = 1000;
  int64_t eval_every = 10000;
  int64_t eval_z_samples = 16;
  double lr = 1e-4;
};

struct CurveBatch {
  torch::Tensor x_context, y_context, x_target, y_target;
};

// Curves from a GP prior with an RBF kernel, written into buffers reused across calls.
class GpCurveSampler {
 public:
  explicit GpCurveSampler(const AnpConfig& cfg)
      : cfg_(cfg), x_buf_(torch::empty({cfg.batch, cfg.grid_points, 1})), y_buf_(torch::empty_like(x_buf_)) {}

  CurveBatch sample(bool grid) {
    const int64_t nc = torch::randint(3, cfg_.max_context, {1}).item<int64_t>();
    const int64_t total = grid ? cfg_.grid_points : nc + torch::randint(2, cfg_.max_context, {1}).item<int64_t>();
    auto x = x_buf_.narrow(1, 0, total);
    if (grid) {
      x.copy_(torch::linspace(-2.0, 2.0, total).view({1, -1, 1}));
    } else {
      x.uniform_(-2.0, 2.0);
    }
    auto xd = x.to(torch::kDouble);
    auto sq_dist = (xd.unsqueeze(2) - xd.unsqueeze(1)).pow(2).sum(-1);
    auto kernel = cfg_.signal_var * torch::exp(sq_dist / (-2.0 * cfg_.length_scale * cfg_.length_scale));
    // FACT: k = torch.rand(2, 4, 4); assert raises(lambda: k.add_(k.transpose(-2, -1)), "single memory location")
    kernel.add_(kernel.transpose(-2, -1)).mul_(0.5);  // EXPECT: tensor-inplace-overlap
    // FACT: k = torch.rand(2, 4, 4); assert not raises(lambda: k.diagonal(0, -2, -1).add_(0.1))
    kernel.diagonal(0, -2, -1).add_(cfg_.noise_std * cfg_.noise_std);  // LOOKALIKE: tensor-inplace-overlap -- the diagonal view is written from a scalar, no source overlaps it
    auto chol = torch::linalg::cholesky(kernel);
    auto y = y_buf_.narrow(1, 0, total);
    y.copy_(torch::matmul(chol, torch::randn({cfg_.batch, total, 1}, torch::kDouble)));  // EXPECT: tensor-copy-narrowing
    return {x.narrow(1, 0, nc), y.narrow(1, 0, nc), x, y};
  }

 private:
  AnpConfig cfg_;
  torch::Tensor x_buf_, y_buf_;
};

torch::nn::Sequential make_mlp(const std::vector<int64_t>& sizes) {
  torch::nn::Sequential seq;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    seq->push_back(torch::nn::Linear(sizes[i], sizes[i + 1]));
    if (i + 2 < sizes.size()) seq->push_back(torch::nn::ReLU());
  }
  return seq;
}

struct MultiheadAttentionImpl : torch::nn::Module {
  MultiheadAttentionImpl(int64_t dim, int64_t heads) : heads_(heads), head_dim_(dim / heads) {
    wq = register_module("wq", torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
    wk = register_module("wk", torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
    wv = register_module("wv", torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
    wo = register_module("wo", torch::nn::Linear(dim, dim));
    const double std = 1.0 / std::sqrt(static_cast<double>(head_dim_));
    // FACT: w = torch.nn.Linear(4, 4).weight; assert raises(lambda: w.normal_(0.0, 0.5), "leaf Variable")
    wq->weight.normal_(0.0, std);  // EXPECT: tensor-inplace-on-leaf
    torch::nn::init::normal_(wk->weight, 0.0, std);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    torch::nn::init::normal_(wv->weight, 0.0, std);
  }

  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value) {
    const int64_t B = query.size(0), Nq = query.size(1);
    auto split_heads = [&](const torch::Tensor& t) {
      // FACT: x = torch.randn(2, 5, 32).view(2, 5, 4, 8).permute(0, 2, 1, 3); assert is_copy_of(x.reshape(8, 5, 8), x)
      return t.view({B, t.size(1), heads_, head_dim_}).permute({0, 2, 1, 3}).reshape({B * heads_, t.size(1), head_dim_});  // EXPECT: tensor-reshape-non-contiguous
    };
    auto q = split_heads(wq(query)), k = split_heads(wk(key)), v = split_heads(wv(value));
    auto weights = torch::softmax(torch::bmm(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(head_dim_)), -1);
    auto heads = torch::bmm(weights, v).view({B, heads_, Nq, head_dim_}).permute({0, 2, 1, 3});
    // FACT: p = torch.randn(2, 4, 5, 8).permute(0, 2, 1, 3); c = p.contiguous(); assert not is_contiguous(p) and is_copy_of(c, p) and is_view_of(c.view(2, 5, 32), c)
    return wo(heads.contiguous().view({B, Nq, heads_ * head_dim_}));  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() runs before the view
  }

  int64_t heads_, head_dim_;
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
};
TORCH_MODULE(MultiheadAttention);

struct LatentEncoderImpl : torch::nn::Module {
  explicit LatentEncoderImpl(const AnpConfig& cfg) {
    mlp = register_module("mlp", make_mlp({2, cfg.hidden, cfg.hidden, cfg.hidden}));
    self_attn = register_module("self_attn", MultiheadAttention(cfg.hidden, cfg.heads));
    pre = register_module("pre", torch::nn::Linear(cfg.hidden, cfg.hidden));
    mu_head = register_module("mu_head", torch::nn::Linear(cfg.hidden, cfg.latent));
    sigma_head = register_module("sigma_head", torch::nn::Linear(cfg.hidden, cfg.latent));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto s = mlp->forward(torch::cat({x, y}, -1));
    s = self_attn(s, s, s).mean(1);
    auto h = torch::relu(pre(s));
    auto sigma = torch::sigmoid(sigma_head(h));
    // FACT: s = torch.sigmoid(torch.randn(3, requires_grad=True)); assert backward_fails(lambda: (s.mul_(0.9).add_(0.1), s.sum().backward()))
    sigma.mul_(0.9).add_(0.1);  // EXPECT: tensor-inplace-on-saved
    return {mu_head(h), sigma};
  }

  torch::nn::Sequential mlp{nullptr};
  MultiheadAttention self_attn{nullptr};
  torch::nn::Linear pre{nullptr}, mu_head{nullptr}, sigma_head{nullptr};
};
TORCH_MODULE(LatentEncoder);

struct DeterministicEncoderImpl : torch::nn::Module {
  explicit DeterministicEncoderImpl(const AnpConfig& cfg) {
    mlp = register_module("mlp", make_mlp({2, cfg.hidden, cfg.hidden, cfg.hidden}));
    x_embed = register_module("x_embed", make_mlp({1, cfg.hidden, cfg.hidden}));
    self_attn = register_module("self_attn", MultiheadAttention(cfg.hidden, cfg.heads));
    cross_attn = register_module("cross_attn", MultiheadAttention(cfg.hidden, cfg.heads));
  }

  torch::Tensor forward(const torch::Tensor& xc, const torch::Tensor& yc, const torch::Tensor& xt) {
    auto r = mlp->forward(torch::cat({xc, yc}, -1));
    r = self_attn(r, r, r);
    return cross_attn(x_embed->forward(xt), x_embed->forward(xc), r);
  }

  torch::nn::Sequential mlp{nullptr}, x_embed{nullptr};
  MultiheadAttention self_attn{nullptr}, cross_attn{nullptr};
};
TORCH_MODULE(DeterministicEncoder);

struct DecoderImpl : torch::nn::Module {
  explicit DecoderImpl(const AnpConfig& cfg) {
    mlp = register_module("mlp", make_mlp({cfg.hidden + cfg.latent + 1, cfg.hidden, cfg.hidden, 2}));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& r, const torch::Tensor& z, const torch::Tensor& xt) {
    auto z_rep = z.unsqueeze(1).expand({z.size(0), xt.size(1), z.size(-1)});
    auto out = mlp->forward(torch::cat({r, z_rep, xt}, -1));
    auto sigma = F::softplus(out.narrow(-1, 1, 1));
    // FACT: s = torch.nn.functional.softplus(torch.randn(3, requires_grad=True)); s.mul_(0.9).add_(0.1); s.sum().backward()
    sigma.mul_(0.9).add_(0.1);  // LOOKALIKE: tensor-inplace-on-saved -- softplus saves its input, not its result
    return {out.narrow(-1, 0, 1), sigma};
  }

  torch::nn::Sequential mlp{nullptr};
};
TORCH_MODULE(Decoder);

torch::Tensor gaussian_log_prob(const torch::Tensor& y, const torch::Tensor& mu, const torch::Tensor& sigma) {
  const int64_t B = y.size(0);
  // FACT: o = torch.randn(2, 5, 2); m = o.narrow(-1, 0, 1); assert not is_contiguous(m) and is_view_of(m.reshape(2, -1), o)
  auto m = mu.reshape({B, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- only a unit dim is dropped, the narrowed layout still fits a view
  auto s = sigma.reshape({B, -1});
  auto z = (y.reshape({B, -1}) - m) / s;
  return -0.5 * z.pow(2) - s.log() - 0.5 * std::log(2.0 * M_PI);
}

torch::Tensor gaussian_kl(const torch::Tensor& mq, const torch::Tensor& sq, const torch::Tensor& mp,
                          const torch::Tensor& sp) {
  return (torch::log(sp / sq) + (sq.pow(2) + (mq - mp).pow(2)) / (2.0 * sp.pow(2)) - 0.5).sum(-1);
}

struct AnpOutput {
  torch::Tensor mu, sigma, loss;
};

struct AnpImpl : torch::nn::Module {
  explicit AnpImpl(const AnpConfig& cfg) {
    latent = register_module("latent", LatentEncoder(cfg));
    det = register_module("det", DeterministicEncoder(cfg));
    decoder = register_module("decoder", Decoder(cfg));
  }

  // With y_target (training) z comes from the posterior q(z | target) and the loss carries the KL to the prior.
  AnpOutput forward(const torch::Tensor& xc, const torch::Tensor& yc, const torch::Tensor& xt, const torch::Tensor& yt) {
    auto [prior_mu, prior_sigma] = latent(xc, yc);
    auto [post_mu, post_sigma] = latent(xt, yt);
    // FACT: m = torch.randn(3, requires_grad=True) * 1.0; s = torch.rand(3, requires_grad=True) + 0.1; torch.randn_like(m).mul_(s).add_(m).sum().backward()
    auto z = torch::randn_like(post_mu).mul_(post_sigma).add_(post_mu);  // LOOKALIKE: tensor-inplace-on-saved -- the fresh noise tensor is written, autograd keeps what it needs
    auto [mu, sigma] = decoder(det(xc, yc, xt), z, xt);
    auto kl = gaussian_kl(post_mu, post_sigma, prior_mu, prior_sigma);
    auto loss = -(gaussian_log_prob(yt, mu, sigma).mean(1) - kl / xt.size(1)).mean();
    return {mu, sigma, loss};
  }

  // Test-time prediction: S latent samples from the prior, decoded as one batch, moment-matched.
  std::pair<torch::Tensor, torch::Tensor> predict(const torch::Tensor& xc, const torch::Tensor& yc,
                                                  const torch::Tensor& xt, int64_t S) {
    auto [mu_z, sigma_z] = latent(xc, yc);
    const int64_t B = xt.size(0), Nt = xt.size(1);
    auto z = mu_z + sigma_z * torch::randn({S, B, mu_z.size(-1)}, mu_z.options());
    auto r = det(xc, yc, xt);
    // FACT: assert raises(lambda: torch.randn(2, 5, 8).unsqueeze(0).expand(3, 2, 5, 8).view(6, 5, 8), "view size is not compatible")
    auto r_s = r.unsqueeze(0).expand({S, B, Nt, r.size(-1)}).view({S * B, Nt, r.size(-1)});  // EXPECT: tensor-view-non-contiguous
    auto [mu, sigma] = decoder(r_s, z.view({S * B, -1}), xt.repeat({S, 1, 1}));
    auto mu_s = mu.view({S, B, Nt, 1}), var_s = sigma.pow(2).view({S, B, Nt, 1});
    auto mean = mu_s.mean(0);
    return {mean, ((var_s + mu_s.pow(2)).mean(0) - mean.pow(2)).clamp_min(1e-6).sqrt()};
  }

  LatentEncoder latent{nullptr};
  DeterministicEncoder det{nullptr};
  Decoder decoder{nullptr};
};
TORCH_MODULE(Anp);

// Share of targets that fall inside the predictive +-2 sigma band.
double coverage(const torch::Tensor& y, const torch::Tensor& mu, const torch::Tensor& sigma) {
  auto half_width = sigma.detach();
  // FACT: s = torch.nn.functional.softplus(torch.randn(2, 5, 1, requires_grad=True)); l = -s.reshape(2, -1).log().sum(); assert backward_fails(lambda: (s.detach().mul_(2.0), l.backward()))
  half_width.mul_(2.0);  // EXPECT: tensor-inplace-on-detached
  return ((y - mu.detach()).abs() <= half_width).to(torch::kFloat).mean().item<double>();
}

void evaluate(Anp& model, GpCurveSampler& sampler, const AnpConfig& cfg, torch::Device device, int64_t it) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto fresh = sampler.sample(/*grid=*/true);
  auto x_grid = fresh.x_target.clone();  // LOOKALIKE: tensor-unnecessary-clone -- the sampler overwrites this buffer on its next call
  auto y_grid = fresh.y_target.clone();
  auto yt = y_grid.to(device);
  const std::vector<int64_t> sizes{5, 10, 20, 50, 100};
  auto results = torch::zeros({static_cast<int64_t>(sizes.size())}, torch::kDouble);
  for (size_t k = 0; k < sizes.size(); ++k) {
    auto idx = torch::randperm(x_grid.size(1)).narrow(0, 0, sizes[k]);
    auto xc = x_grid.index_select(1, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new context subset each pass
    auto yc = y_grid.index_select(1, idx).to(device);
    auto xt = x_grid.to(device);  // EXPECT: tensor-clone-in-loop
    auto pred = model->predict(xc, yc, xt, cfg.eval_z_samples);
    results[k].copy_(gaussian_log_prob(yt, pred.first, pred.second).mean());  // LOOKALIKE: tensor-copy-narrowing -- float into a double table widens
  }
  std::cout << "iter " << it << " grid log-lik by context size: " << results << std::endl;

  auto idx = torch::randperm(x_grid.size(1)).narrow(0, 0, 10);
  auto pred = model->predict(x_grid.index_select(1, idx).to(device), y_grid.index_select(1, idx).to(device),
                             x_grid.to(device), cfg.eval_z_samples);
  auto two_sigma = pred.second.detach();
  two_sigma.mul_(2.0);  // LOOKALIKE: tensor-inplace-on-detached -- under NoGradGuard no graph holds pred.second
  auto xs = x_grid.narrow(0, 0, 1).reshape({-1});
  auto mu = pred.first.narrow(0, 0, 1).reshape({-1}).cpu();
  auto band = two_sigma.narrow(0, 0, 1).reshape({-1}).cpu();
  std::ofstream csv("anp_iter" + std::to_string(it) + ".csv");
  for (int64_t i = 0; i < xs.size(0); ++i) {
    csv << xs[i].item<float>() << ',' << y_grid[0][i][0].item<float>() << ',' << mu[i].item<float>() << ','
        << band[i].item<float>() << '\n';
  }
  model->train();
}

int main() {
  torch::manual_seed(0);
  AnpConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  GpCurveSampler sampler(cfg);
  Anp model(cfg);
  model->to(device);
  torch::optim::Adam optim(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::deque<torch::Tensor> window;

  for (int64_t it = 1; it <= cfg.iterations; ++it) {
    auto batch = sampler.sample(/*grid=*/false);
    auto y_ctx = batch.y_context;
    // FACT: y = torch.rand(2, 10, 1); c = y.narrow(1, 0, 4); c2 = c; c2.add_(1.0); assert shares_storage(c2, y) and is_view_of(c, y) and (y[:, :4] >= 1.0).all()
    y_ctx.add_(torch::randn_like(y_ctx) * cfg.context_noise);  // EXPECT: tensor-alias-then-mutate
    auto yt = batch.y_target.to(device);
    auto out = model(batch.x_context.to(device), y_ctx.to(device), batch.x_target.to(device), yt);
    window.push_back(out.loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (window.size() > 100) window.pop_front();
    if (it % cfg.log_every == 0) {
      const double cov = coverage(yt, out.mu, out.sigma);
      std::cout << "iter " << it << " loss " << torch::stack(std::vector<torch::Tensor>(window.begin(), window.end())).mean().item<double>()
                << " coverage " << cov << std::endl;
    }
    optim.zero_grad();
    out.loss.backward();
    optim.step();
    if (it % cfg.eval_every == 0) evaluate(model, sampler, cfg, device, it);
  }
  torch::save(model, "anp.pt");
  return 0;
}
