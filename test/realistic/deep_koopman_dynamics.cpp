// Deep Koopman operator learning for the damped Duffing oscillator.
//
// An autoencoder maps the state into latent coordinates in which the dynamics are
// linear, z_{t+1} = K z_t. Training combines reconstruction, latent linearity over a
// prediction horizon, and multi-step state prediction through the decoder. After
// training: long rollouts on held-out trajectories, a DMD consistency check of K,
// and a small streaming forecaster.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

struct KoopmanConfig {
  int64_t state_dim = 2;
  int64_t latent_dim = 12;
  int64_t hidden = 80;
  int64_t n_traj = 600;
  int64_t traj_len = 250;
  int64_t horizon = 30;
  int64_t batch = 128;
  int64_t epochs = 40;
  int64_t iters_per_epoch = 100;
  int64_t history = 16;
  double dt = 0.05;
  double damping = 0.2;
  double lr = 1e-3;
  double w_rec = 1.0, w_lin = 0.5, w_pred = 1.0;
  double noise_std = 0.02;
  double latent_clip = 5.0;
};

torch::Tensor duffing_rhs(const torch::Tensor& s, double damping) {
  auto x = s.select(-1, 0);
  auto v = s.select(-1, 1);
  return torch::stack({v, x - x.pow(3) - damping * v}, -1);
}

torch::Tensor rk4_step(const torch::Tensor& s, double dt, double damping) {
  auto k1 = duffing_rhs(s, damping);
  auto k2 = duffing_rhs(s + 0.5 * dt * k1, damping);
  auto k3 = duffing_rhs(s + 0.5 * dt * k2, damping);
  auto k4 = duffing_rhs(s + dt * k3, damping);
  return s + dt / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4);
}

// Integrates all initial conditions together in float64, returns time-major float32.
torch::Tensor simulate(const torch::Tensor& x0, const KoopmanConfig& c) {
  std::vector<torch::Tensor> states;
  states.reserve(c.traj_len);
  auto s = x0.to(torch::kFloat64);
  for (int64_t t = 0; t < c.traj_len; ++t) {
    states.push_back(s);
    s = rk4_step(s, c.dt, c.damping);
  }
  return torch::stack(states, 0).to(torch::kFloat32);
}

struct EncoderImpl : torch::nn::Module {
  EncoderImpl(int64_t in, int64_t hidden, int64_t latent)
      : inp(register_module("inp", torch::nn::Linear(in, hidden))),
        mid(register_module("mid", torch::nn::Linear(hidden, hidden))),
        out(register_module("out", torch::nn::Linear(hidden, latent))) {
    torch::nn::init::orthogonal_(mid->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under NoGradGuard internally
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(inp->forward(x));
    // FACT: l1 = torch.nn.Linear(2, 8); l2 = torch.nn.Linear(8, 8); h = torch.tanh(l1(torch.randn(4, 2))); h += torch.tanh(l2(h)); assert backward_fails(lambda: h.sum().backward())
    h += torch::tanh(mid->forward(h));  // EXPECT: tensor-inplace-on-saved
    return out->forward(h);
  }

  torch::nn::Linear inp, mid, out;
};
TORCH_MODULE(Encoder);

struct DecoderImpl : torch::nn::Module {
  DecoderImpl(int64_t latent, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(latent, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}

  torch::Tensor forward(const torch::Tensor& z) {
    // FACT: assert not backward_fails(lambda: torch.nn.functional.linear(torch.randn(4, 5, 3), torch.randn(8, 3, requires_grad=True), torch.randn(8)).relu_().sum().backward())
    auto h = fc1->forward(z).relu_();  // LOOKALIKE: tensor-inplace-on-saved -- the linear output is not saved; relu_ saves its own result
    h = torch::relu(fc2->forward(h));
    return fc3->forward(h);
  }

  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Decoder);

struct KoopmanAEImpl : torch::nn::Module {
  explicit KoopmanAEImpl(const KoopmanConfig& c)
      : encoder(register_module("encoder", Encoder(c.state_dim, c.hidden, c.latent_dim))),
        decoder(register_module("decoder", Decoder(c.latent_dim, c.hidden, c.state_dim))),
        K(register_module("K", torch::nn::Linear(torch::nn::LinearOptions(c.latent_dim, c.latent_dim).bias(false)))) {
    // start near the identity: slow, nearly conservative latent dynamics
    K->weight.copy_(torch::eye(c.latent_dim) + 0.01 * torch::randn({c.latent_dim, c.latent_dim}));  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor encode(const torch::Tensor& x) { return encoder->forward(x); }
  torch::Tensor decode(const torch::Tensor& z) { return decoder->forward(z); }
  torch::Tensor advance(const torch::Tensor& z) { return K->forward(z); }

  // Clips the singular values of K to at most one so long rollouts stay bounded.
  void project_spectrum() {
    torch::NoGradGuard no_grad;
    auto W64 = K->weight.to(torch::kFloat64);
    auto [U, S, Vh] = torch::linalg::svd(W64, false, c10::nullopt);
    S.clamp_max_(1.0);
    auto Wp = U.matmul(torch::diag(S)).matmul(Vh);
    K->weight.copy_(Wp.to(K->weight.scalar_type()));  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard // LOOKALIKE: tensor-copy-narrowing -- the conversion to the weight dtype is explicit
  }

  Encoder encoder;
  Decoder decoder;
  torch::nn::Linear K;
};
TORCH_MODULE(KoopmanAE);

// Random windows of horizon + 1 consecutive states from random trajectories.
torch::Tensor sample_windows(const torch::Tensor& data, int64_t batch, int64_t horizon) {
  const auto T = data.size(0), N = data.size(1);
  auto t0 = torch::randint(0, T - horizon, {batch, 1}, torch::kLong);
  auto traj = torch::randint(0, N, {batch, 1}, torch::kLong);
  auto steps = t0 + torch::arange(horizon + 1, torch::kLong);
  return data.index({steps, traj});
}

struct LossTerms {
  torch::Tensor total, rec, lin, pred;
};

LossTerms koopman_loss(KoopmanAE& net, const torch::Tensor& batch, const KoopmanConfig& c) {
  const auto H = batch.size(1) - 1;
  const auto n = batch.size(2);
  // FACT: b = torch.randn(20, 6, 2)[torch.randint(0, 20, (8, 1)), torch.arange(4)]; assert b.is_contiguous() and shares_storage(b.contiguous(), b)
  auto noisy = batch.contiguous();
  noisy.add_(torch::randn_like(noisy) * c.noise_std);  // EXPECT: tensor-alias-then-mutate
  auto z_all = net->encode(noisy);
  auto x_rec = net->decode(z_all);
  auto rec = torch::mse_loss(x_rec, batch);

  // FACT: l = torch.nn.Linear(2, 4); d = torch.nn.Linear(4, 2); za = l(torch.randn(5, 6, 2)); xr = d(za); zt = za[:, 1:].detach(); zt.clamp_(-1, 1); assert backward_fails(lambda: xr.sum().backward())
  auto z_target = z_all.slice(1, 1).detach();
  z_target.clamp_(-c.latent_clip, c.latent_clip);  // EXPECT: tensor-inplace-on-detached

  // FACT: z0 = torch.randn(4, 3); z = z0; z = z @ torch.eye(3); assert is_copy_of(z, z0)
  torch::Tensor z = z_all.select(1, 0);
  torch::Tensor lin = torch::zeros({}, batch.options());
  std::vector<torch::Tensor> z_steps;
  for (int64_t k = 0; k < H; ++k) {
    z = net->advance(z);  // LOOKALIKE: tensor-alias-then-mutate -- z is rebound to K's output; z_all is never written
    lin = lin + torch::mse_loss(z, z_target.select(1, k));
    z_steps.push_back(z);  // LOOKALIKE: tensor-graph-kept-across-iterations -- horizon steps of one loss, backpropagated together and released with it
  }
  auto x_pred = net->decode(torch::stack(z_steps, 1));
  auto x_true = batch.slice(1, 1);
  // FACT: assert torch.nn.functional.linear(torch.randn(4, 5, 3), torch.randn(2, 3), torch.randn(2)).view(-1, 2).shape == (20, 2)
  auto pred_flat = x_pred.view({-1, n});  // LOOKALIKE: tensor-view-non-contiguous -- the decoder output is freshly allocated and contiguous
  // FACT: b = torch.randn(4, 6, 2); assert raises(lambda: b[:, 1:].view(-1, 2), "view size is not compatible")
  auto true_flat = x_true.view({-1, n});  // EXPECT: tensor-view-non-contiguous
  auto pred = torch::mse_loss(pred_flat, true_flat);

  auto total = c.w_rec * rec + c.w_lin * lin / static_cast<double>(H) + c.w_pred * pred;
  return {total, rec.detach(), lin.detach(), pred.detach()};
}

void train(KoopmanAE& net, const torch::Tensor& train_data, const KoopmanConfig& c,
           torch::Device device) {
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(c.lr).weight_decay(1e-6));
  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    net->train();
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t it = 0; it < c.iters_per_epoch; ++it) {
      auto batch = sample_windows(train_data, c.batch, c.horizon).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new random window batch every step
      auto terms = koopman_loss(net, batch, c);
      opt.zero_grad();
      terms.total.backward();
      torch::nn::utils::clip_grad_norm_(net->parameters(), 1.0);
      opt.step();
      epoch_loss += terms.total;  // EXPECT: tensor-graph-kept-across-iterations
    }
    if (epoch % 5 == 4) net->project_spectrum();
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / c.iters_per_epoch
              << "\n";
  }
}

torch::Tensor rollout(KoopmanAE& net, const torch::Tensor& x0, int64_t steps) {
  torch::NoGradGuard no_grad;
  auto Kt = net->K->weight.t().contiguous();  // LOOKALIKE: tensor-clone-in-loop -- built once, before the step loop
  auto z = net->encode(x0);
  std::vector<torch::Tensor> xs;
  for (int64_t k = 0; k < steps; ++k) {
    z = z.matmul(Kt);
    xs.push_back(net->decode(z));
  }
  return torch::stack(xs, 1);
}

// Least-squares (DMD) fit of the latent transition on encoded windows: with good
// Koopman coordinates it should agree with the learned K.
double dmd_consistency(KoopmanAE& net, const torch::Tensor& windows) {
  torch::NoGradGuard no_grad;
  const auto H = windows.size(1) - 1;
  auto z = net->encode(windows);
  const auto m = z.size(2);
  // FACT: z = torch.randn(4, 6, 3); assert is_copy_of(z[:, :5].reshape(-1, 3), z) and is_copy_of(z[:, 1:].reshape(-1, 3), z)
  auto Z0 = z.slice(1, 0, H).reshape({-1, m});  // EXPECT: tensor-reshape-non-contiguous
  auto Z1 = z.slice(1, 1).reshape({-1, m});  // EXPECT: tensor-reshape-non-contiguous
  auto A = std::get<0>(torch::linalg::lstsq(Z0, Z1, c10::nullopt, c10::nullopt));
  auto W = net->K->weight;
  return ((A.t() - W).norm() / W.norm()).item<double>();
}

// Online use: keeps the latest observations and the model's recent one-step errors.
struct StreamingForecaster {
  StreamingForecaster(KoopmanAE model, int64_t history, int64_t state_dim, torch::Device device)
      : net(std::move(model)),
        obs_hist(torch::zeros({history, state_dim}, torch::TensorOptions().device(device))),
        err_hist(torch::zeros({history}, torch::TensorOptions().device(device))) {}

  void observe(const torch::Tensor& x) {
    torch::NoGradGuard no_grad;
    const auto W = obs_hist.size(0);
    if (next_pred.defined()) {
      // FACT: e = torch.randn(16); r = e.roll(-1, 0); assert is_copy_of(r, e)
      err_hist.copy_(err_hist.roll(-1, 0));  // LOOKALIKE: tensor-inplace-overlap -- roll allocates a new tensor, the source does not alias err_hist
      err_hist[W - 1] = (x - next_pred).norm();
    }
    // FACT: h = torch.randn(16, 2); assert raises(lambda: h.narrow(0, 0, 15).copy_(h.narrow(0, 1, 15)), "single memory location")
    obs_hist.narrow(0, 0, W - 1).copy_(obs_hist.narrow(0, 1, W - 1));  // EXPECT: tensor-inplace-overlap
    obs_hist[W - 1].copy_(x);
    next_pred = net->decode(net->advance(net->encode(x.unsqueeze(0)))).squeeze(0);
  }

  torch::Tensor forecast(int64_t steps) {
    return rollout(net, obs_hist[obs_hist.size(0) - 1].unsqueeze(0), steps).squeeze(0);
  }
  double recent_error() const { return err_hist.mean().item<double>(); }

  KoopmanAE net;
  torch::Tensor obs_hist, err_hist, next_pred;
};

int main() {
  torch::manual_seed(3);
  KoopmanConfig c;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto x0 = torch::rand({c.n_traj, c.state_dim}) * 4.0 - 2.0;
  auto data = simulate(x0, c);
  auto flat = data.flatten(0, 1);
  data = (data - flat.mean(0)) / flat.std(0);
  const int64_t n_train = c.n_traj * 5 / 6;
  auto train_data = data.narrow(1, 0, n_train);
  auto test_data = data.narrow(1, n_train, c.n_traj - n_train);

  KoopmanAE net(c);
  net->to(device);
  train(net, train_data, c, device);
  net->eval();

  const int64_t steps = 100;
  auto pred = rollout(net, test_data.select(0, 0).to(device), steps);
  auto truth = test_data.slice(0, 1, steps + 1).transpose(0, 1);
  auto rmse = (pred - truth).pow(2).mean(2).mean(0).sqrt();  // EXPECT: tensor-device-mismatch
  std::cout << "rollout RMSE @10 " << rmse[9].item<double>() << " @50 " << rmse[49].item<double>()
            << " @100 " << rmse[99].item<double>() << "\n";

  auto windows = sample_windows(test_data, 256, c.horizon).to(device);
  std::cout << "DMD relative mismatch " << dmd_consistency(net, windows) << "\n";
  auto eig = torch::linalg::eigvals(net->K->weight.detach().cpu());
  std::cout << "spectral radius of K " << eig.abs().max().item<double>() << "\n";

  StreamingForecaster sf(net, c.history, c.state_dim, device);
  auto stream = test_data.select(1, 0).to(device);
  for (int64_t t = 0; t < 60; ++t) sf.observe(stream[t]);
  std::cout << "streaming one-step error " << sf.recent_error() << " next state "
            << sf.forecast(1)[0] << "\n";
  return 0;
}
