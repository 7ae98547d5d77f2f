// World Models (Ha & Schmidhuber, 2018): V = convolutional VAE over 64x64 frames,
// M = MDN-RNN predicting the next latent, reward and termination, C = a linear
// controller on [z, h] trained with an evolution strategy inside the dream.
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <iostream>
#include <tuple>
#include <vector>

namespace wm {

struct WMConfig {
  int64_t z_dim = 32;
  int64_t action_dim = 3;
  int64_t hidden = 256;
  int64_t mixtures = 5;
  int64_t batch_size = 32;
  int vae_epochs = 10;
  int rnn_epochs = 20;
  int preview_every = 500;
  double kl_tolerance = 0.5;
  double min_sigma = 1e-3;
  double temperature = 1.15;
  int dream_horizon = 1000;
  int64_t population = 64;
  int generations = 300;
  double es_sigma = 0.1;
  double es_lr = 0.03;
};

using LstmState = std::tuple<torch::Tensor, torch::Tensor>;

struct ConvVAEImpl : torch::nn::Module {
  explicit ConvVAEImpl(int64_t z_dim) {
    namespace nn = torch::nn;
    enc = register_module("enc", nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(3, 32, 4).stride(2)), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(32, 64, 4).stride(2)), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(64, 128, 4).stride(2)), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(128, 256, 4).stride(2)), nn::ReLU()));
    fc_mu = register_module("fc_mu", nn::Linear(1024, z_dim));
    fc_logvar = register_module("fc_logvar", nn::Linear(1024, z_dim));
    fc_dec = register_module("fc_dec", nn::Linear(z_dim, 1024));
    dec = register_module("dec", nn::Sequential(
        nn::ConvTranspose2d(nn::ConvTranspose2dOptions(1024, 128, 5).stride(2)), nn::ReLU(),
        nn::ConvTranspose2d(nn::ConvTranspose2dOptions(128, 64, 5).stride(2)), nn::ReLU(),
        nn::ConvTranspose2d(nn::ConvTranspose2dOptions(64, 32, 6).stride(2)), nn::ReLU(),
        nn::ConvTranspose2d(nn::ConvTranspose2dOptions(32, 3, 6).stride(2))));
  }

  std::pair<torch::Tensor, torch::Tensor> encode(const torch::Tensor& x) {
    auto h = enc->forward(x).flatten(1);
    return {fc_mu(h), fc_logvar(h)};
  }

  torch::Tensor decode(const torch::Tensor& z) {
    return torch::sigmoid(dec->forward(fc_dec(z).view({-1, 1024, 1, 1})));
  }

  torch::nn::Sequential enc{nullptr}, dec{nullptr};
  torch::nn::Linear fc_mu{nullptr}, fc_logvar{nullptr}, fc_dec{nullptr};
};
TORCH_MODULE(ConvVAE);

struct MdnOut {
  torch::Tensor mus, sigmas, logpi, reward, done_logit;
};

struct MDNRNNImpl : torch::nn::Module {
  explicit MDNRNNImpl(const WMConfig& cfg)
      : z_dim(cfg.z_dim), k(cfg.mixtures), hidden(cfg.hidden), min_sigma(cfg.min_sigma),
        lstm(register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(cfg.z_dim + cfg.action_dim, cfg.hidden)))),
        head(register_module("head", torch::nn::Linear(cfg.hidden, (2 * cfg.z_dim + 1) * cfg.mixtures + 2))) {
    // forget gate starts open
    // FACT: assert raises(lambda: torch.nn.LSTM(3, 4).bias_ih_l0.narrow(0, 4, 4).fill_(1.0), 'leaf Variable')
    lstm->named_parameters()["bias_ih_l0"].narrow(0, hidden, hidden).fill_(1.0);  // EXPECT: tensor-inplace-on-leaf
  }

  LstmState initial_state(int64_t batch, torch::Device device) const {
    auto opts = torch::TensorOptions().device(device);
    return {torch::zeros({1, batch, hidden}, opts), torch::zeros({1, batch, hidden}, opts)};
  }

  std::tuple<torch::Tensor, LstmState> forward(const torch::Tensor& inputs,
                                               torch::optional<LstmState> state = {}) {
    return lstm->forward(inputs, state);
  }

  MdnOut split(const torch::Tensor& out) {
    auto y = head(out);
    const int64_t kz = k * z_dim;
    MdnOut o;
    // FACT: o = torch.rand(5, 3, 22); assert is_view_of(o.narrow(-1, 0, 12).view(-1, 3, 4), o)
    o.mus = y.narrow(-1, 0, kz).view({-1, k, z_dim});  // LOOKALIKE: tensor-view-non-contiguous -- only the last dim is narrowed; time and batch still merge and the slice splits cleanly
    o.sigmas = torch::exp(y.narrow(-1, kz, kz).view({-1, k, z_dim}));
    // FACT: assert backward_fails(lambda: (lambda s: (s.clamp_min_(1e-3), s.sum().backward()))(torch.exp(torch.rand(3, requires_grad=True) * 1)))
    o.sigmas.clamp_min_(min_sigma);  // EXPECT: tensor-inplace-on-saved
    o.logpi = torch::log_softmax(y.narrow(-1, 2 * kz, k).view({-1, k}), -1);
    // FACT: y = torch.rand(5, 3, 22); assert is_view_of(y.select(-1, 20).reshape(-1), y)
    o.reward = y.select(-1, 2 * kz + k).reshape({-1});  // LOOKALIKE: tensor-reshape-non-contiguous -- selecting the last dim leaves time and batch mergeable, so this is a view
    o.done_logit = y.select(-1, 2 * kz + k + 1).reshape({-1});
    return o;
  }

  int64_t z_dim, k, hidden;
  double min_sigma;
  torch::nn::LSTM lstm;
  torch::nn::Linear head;
};
TORCH_MODULE(MDNRNN);

struct ControllerImpl : torch::nn::Module {
  ControllerImpl(int64_t in, int64_t out) : fc(register_module("fc", torch::nn::Linear(in, out))) {}
  torch::Tensor forward(const torch::Tensor& z, const torch::Tensor& h) {
    return torch::tanh(fc(torch::cat({z, h}, 1)));
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Controller);

torch::Tensor gmm_nll(const torch::Tensor& target, const MdnOut& o) {
  static const double kLogSqrt2Pi = 0.5 * std::log(2.0 * 3.14159265358979323846);
  auto x = target.unsqueeze(1);
  auto log_probs = (-0.5 * ((x - o.mus) / o.sigmas).pow(2) - o.sigmas.log() - kLogSqrt2Pi).sum(-1);
  return -torch::logsumexp(o.logpi + log_probs, -1).mean();
}

torch::Tensor sample_mdn(const MdnOut& o, double tau) {
  auto comp = torch::multinomial(torch::softmax(o.logpi / tau, -1), 1);
  auto pick = comp.unsqueeze(-1).expand({-1, 1, o.mus.size(-1)});
  auto mu = o.mus.gather(1, pick).squeeze(1);
  auto sigma = o.sigmas.gather(1, pick).squeeze(1) * std::sqrt(tau);
  return mu + sigma * torch::randn_like(sigma);
}

void train_vae(ConvVAE& vae, const torch::Tensor& frames_nhwc, const WMConfig& cfg, torch::Device device,
               std::vector<torch::Tensor>& previews) {
  torch::optim::Adam opt(vae->parameters(), 1e-3);
  const auto n = frames_nhwc.size(0);
  int64_t step = 0;
  for (int epoch = 0; epoch < cfg.vae_epochs; ++epoch) {
    auto perm = torch::randperm(n);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t s = 0; s + cfg.batch_size <= n; s += cfg.batch_size, ++step) {
      auto batch = frames_nhwc.index_select(0, perm.narrow(0, s, cfg.batch_size)).to(device, torch::kFloat);
      // FACT: f = torch.rand(2, 8, 8, 3); assert is_copy_of(f.permute(0, 3, 1, 2).contiguous(), f)
      auto x = batch.permute({0, 3, 1, 2}).contiguous();
      x.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- contiguous() of the NHWC batch allocated a new NCHW buffer
      auto [mu, logvar] = vae->encode(x);
      auto sd = (0.5 * logvar).exp();
      auto z = torch::randn_like(sd).mul_(sd).add_(mu);  // LOOKALIKE: tensor-inplace-on-saved -- only the fresh noise buffer is written; nothing saved is modified
      auto recon = vae->decode(z);
      auto rec = (recon - x).pow(2).sum({1, 2, 3}).mean();
      auto kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1);
      auto loss = rec + kl.clamp_min(cfg.kl_tolerance * cfg.z_dim).mean();
      if (step % cfg.preview_every == 0) {
        auto grid = recon.detach();
        // FACT: assert backward_fails(lambda: (lambda r: (r.detach().mul_(255.0), r.sum().backward()))(torch.sigmoid(torch.rand(3, requires_grad=True) * 1)))
        grid.mul_(255.0);  // EXPECT: tensor-inplace-on-detached
        previews.push_back(grid.to(torch::kByte).cpu());
      }
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
    }
    std::cout << "vae epoch " << epoch << " loss " << epoch_loss.item<double>() / (n / cfg.batch_size) << '\n';
  }
}

void train_mdnrnn(MDNRNN& rnn, const torch::Tensor& mus, const torch::Tensor& logvars,
                  const torch::Tensor& actions, const torch::Tensor& rewards, const torch::Tensor& dones,
                  const WMConfig& cfg, torch::Device device) {
  torch::optim::Adam opt(rnn->parameters(), 1e-3);
  const auto episodes = mus.size(0), horizon = actions.size(1);
  for (int epoch = 0; epoch < cfg.rnn_epochs; ++epoch) {
    auto perm = torch::randperm(episodes);
    auto loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t steps = 0;
    for (int64_t s = 0; s + cfg.batch_size <= episodes; s += cfg.batch_size, ++steps) {
      auto idx = perm.narrow(0, s, cfg.batch_size);
      auto mu = mus.index_select(0, idx).to(device);
      auto lv = logvars.index_select(0, idx).to(device);
      auto z_tm = (mu + (0.5 * lv).exp() * torch::randn_like(mu)).transpose(0, 1);
      auto a_tm = actions.index_select(0, idx).to(device).transpose(0, 1);
      auto out = std::get<0>(rnn->forward(torch::cat({z_tm.narrow(0, 0, horizon), a_tm}, -1)));
      auto pred = rnn->split(out);
      // FACT: z = torch.rand(3, 6, 4); assert is_copy_of(z.transpose(0, 1)[1:].reshape(-1, 4), z)
      auto target = z_tm.narrow(0, 1, horizon).reshape({-1, cfg.z_dim});  // EXPECT: tensor-reshape-non-contiguous
      auto rd = torch::stack({rewards.index_select(0, idx), dones.index_select(0, idx)}, -1).to(device);
      // FACT: rd = torch.rand(3, 5, 2); assert raises(lambda: rd.transpose(0, 1).view(-1, 2), 'view size is not compatible')
      auto rd_flat = rd.transpose(0, 1).view({-1, 2});  // EXPECT: tensor-view-non-contiguous
      auto loss = gmm_nll(target, pred) +
                  torch::mse_loss(pred.reward, rd_flat.select(1, 0)) +
                  torch::binary_cross_entropy_with_logits(pred.done_logit, rd_flat.select(1, 1));
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(rnn->parameters(), 1.0);
      opt.step();
      loss_sum += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: only the value is summed, on the device
    }
    std::cout << "mdn-rnn epoch " << epoch << " nll " << loss_sum.item<double>() / steps << '\n';
  }
}

double dream_rollout(MDNRNN& rnn, Controller& ctrl, torch::Tensor z, const WMConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto state = rnn->initial_state(1, z.device());
  double total_reward = 0.0;
  for (int t = 0; t < cfg.dream_horizon; ++t) {
    auto action = ctrl->forward(z, std::get<0>(state)[0]);
    auto step = rnn->forward(torch::cat({z, action}, 1).unsqueeze(0), state);
    auto pred = rnn->split(std::get<0>(step));
    state = std::get<1>(step);
    z = sample_mdn(pred, cfg.temperature);
    total_reward += pred.reward.item<double>();  // EXPECT: tensor-sync-in-loop
    if (torch::sigmoid(pred.done_logit).item<double>() > 0.5) break;  // LOOKALIKE: tensor-sync-in-loop -- the value decides whether the dream episode goes on
  }
  return total_reward;
}

// The ES keeps its search distribution in double precision.
void load_flat(Controller& ctrl, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : ctrl->parameters()) {
    p.copy_(flat.narrow(0, offset, p.numel()).view_as(p));  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard
    offset += p.numel();
  }
}

torch::Tensor train_controller(MDNRNN& rnn, Controller& ctrl, const torch::Tensor& initial_z, const WMConfig& cfg) {
  int64_t n_params = 0;
  for (const auto& p : ctrl->parameters()) n_params += p.numel();
  auto mean = torch::zeros({n_params}, torch::kDouble);
  double sigma = cfg.es_sigma;
  for (int gen = 0; gen < cfg.generations; ++gen) {
    auto noise = torch::randn({cfg.population / 2, n_params}, torch::kDouble);
    auto eps = torch::cat({noise, -noise});
    auto fitness = torch::empty({cfg.population}, torch::kDouble);
    for (int64_t i = 0; i < cfg.population; ++i) {
      load_flat(ctrl, mean + sigma * eps[i]);
      auto start = initial_z[i % initial_z.size(0)].unsqueeze(0);
      fitness[i] = dream_rollout(rnn, ctrl, start, cfg);
    }
    auto ranks = fitness.argsort().argsort().to(torch::kDouble) / (cfg.population - 1) - 0.5;
    auto prev_mean = mean;
    // FACT: a = torch.zeros(6, dtype=torch.float64); b = a; a.add_(1.0); assert shares_storage(a, b) and b.sum() == 6
    mean.add_(eps.t().mv(ranks), cfg.es_lr / (cfg.population * sigma));  // EXPECT: tensor-alias-then-mutate
    const double moved = (mean - prev_mean).norm().item<double>();
    sigma *= moved > 0.5 * sigma ? 1.02 : 0.98;
    std::cout << "gen " << gen << " best " << fitness.max().item<double>() << " sigma " << sigma << '\n';
  }
  load_flat(ctrl, mean);
  return mean;
}

struct CarRacingEnv {
  virtual ~CarRacingEnv() = default;
  virtual std::vector<uint8_t> reset() = 0;
  virtual std::tuple<std::vector<uint8_t>, float, bool> step(const std::array<float, 3>& action) = 0;
};

double real_rollout(CarRacingEnv& env, ConvVAE& vae, MDNRNN& rnn, Controller& ctrl, torch::Device device,
                    int max_steps) {
  torch::NoGradGuard no_grad;
  auto frame_buf = torch::empty({64, 64, 3}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  auto obs = env.reset();
  auto state = rnn->initial_state(1, device);
  double total = 0.0;
  for (int t = 0; t < max_steps; ++t) {
    frame_buf.copy_(torch::from_blob(obs.data(), {64, 64, 3}, torch::kUInt8));  // LOOKALIKE: tensor-device-mismatch -- copy_ is allowed to move host data into the device buffer
    auto x = frame_buf.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat).div(255.0);
    auto z = vae->encode(x).first;
    auto action = ctrl->forward(z, std::get<0>(state)[0]);
    auto a_host = action.to(torch::kCPU).clamp(-1.0, 1.0);  // LOOKALIKE: tensor-sync-in-loop -- the simulator needs the action every step
    auto acc = a_host.accessor<float, 2>();
    auto [next_obs, reward, done] = env.step({acc[0][0], acc[0][1], acc[0][2]});
    state = std::get<1>(rnn->forward(torch::cat({z, a_host}, 1).unsqueeze(0), state));  // EXPECT: tensor-device-mismatch
    total += reward;
    obs = std::move(next_obs);
    if (done) break;
  }
  return total;
}

}  // namespace wm
