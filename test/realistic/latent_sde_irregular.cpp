// Latent SDE (Li et al., 2020) for irregularly sampled multivariate series:
// backward GRU posterior encoder, Euler-Maruyama solver, KL path term.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace lsde {

struct SDEConfig {
  int64_t obs_dim = 6;
  int64_t latent_dim = 8;
  int64_t context_dim = 32;
  int64_t hidden = 64;
  double dt = 0.01;
  double time_scale = 24.0;  // raw stamps are hours
  double lr = 3e-3;
  int64_t epochs = 300;
  int64_t kl_anneal_iters = 1000;
  int64_t forecast_steps = 200;
  int64_t forecast_samples = 16;
};

struct Batch {
  torch::Tensor times;  // union of the batch's observation times, sorted
  torch::Tensor values;
  torch::Tensor mask;
};

class IrregularDataset {
 public:
  IrregularDataset(const std::string& path, int64_t obs_dim) : obs_dim_(obs_dim) {
    std::ifstream in(path, std::ios::binary);
    int64_t header[2];
    while (in.read(reinterpret_cast<char*>(header), sizeof(header))) {
      const int64_t B = header[0], T = header[1];
      std::vector<double> t_raw(T), v_raw(B * T * obs_dim);
      std::vector<uint8_t> m_raw(B * T * obs_dim);
      in.read(reinterpret_cast<char*>(t_raw.data()), T * sizeof(double));
      in.read(reinterpret_cast<char*>(v_raw.data()), v_raw.size() * sizeof(double));
      in.read(reinterpret_cast<char*>(m_raw.data()), m_raw.size());
      Batch b;
      b.times = torch::empty({T});
      b.times.copy_(torch::from_blob(t_raw.data(), {T}, torch::kFloat64));  // EXPECT: tensor-copy-narrowing
      b.values = torch::from_blob(v_raw.data(), {B, T, obs_dim}, torch::kFloat64).to(torch::kFloat);  // LOOKALIKE: tensor-copy-narrowing -- explicit to() conversion, not a silent copy_
      b.mask = torch::from_blob(m_raw.data(), {B, T, obs_dim}, torch::kUInt8).to(torch::kBool);
      batches_.push_back(std::move(b));
    }
  }

  size_t size() const { return batches_.size(); }
  Batch get(size_t i) const { return batches_[i]; }

  // Per-channel spread of the observed entries, used as the fixed emission scale.
  torch::Tensor observation_std() const {
    auto sum = torch::zeros({obs_dim_}, torch::kDouble);
    auto sq = torch::zeros({obs_dim_}, torch::kDouble);
    auto cnt = torch::zeros({obs_dim_}, torch::kDouble);
    for (const auto& b : batches_) {
      auto m = b.mask.to(torch::kDouble);
      auto v = b.values.to(torch::kDouble);
      // FACT: v=torch.randn(2,3,4); d=v.to(torch.float64); d.mul_(0.0); assert is_copy_of(d,v) and v.abs().sum()>0
      v.mul_(m);  // LOOKALIKE: tensor-alias-then-mutate -- to(kDouble) converted from float, so v is a fresh tensor
      sum += v.sum(torch::IntArrayRef{0, 1});
      sq += (v * v).sum(torch::IntArrayRef{0, 1});
      cnt += m.sum(torch::IntArrayRef{0, 1});
    }
    cnt.clamp_min_(1.0);
    return (sq / cnt - (sum / cnt).pow(2)).clamp_min(1e-6).sqrt().to(torch::kFloat);
  }

 private:
  int64_t obs_dim_;
  std::vector<Batch> batches_;
};

torch::nn::Sequential mlp(int64_t in, int64_t hidden, int64_t out) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::Softplus(),
                               torch::nn::Linear(hidden, hidden), torch::nn::Softplus(),
                               torch::nn::Linear(hidden, out));
}

struct PosteriorEncoderImpl : torch::nn::Module {
  explicit PosteriorEncoderImpl(const SDEConfig& c)
      : gru_(torch::nn::GRUOptions(2 * c.obs_dim + 1, c.hidden).batch_first(true)),
        to_ctx_(c.hidden, c.context_dim),
        to_qz0_(c.hidden, 2 * c.latent_dim) {
    register_module("gru", gru_);
    register_module("to_ctx", to_ctx_);
    register_module("to_qz0", to_qz0_);
  }

  // The GRU runs backwards in time, so the context at an observation summarises everything after it.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& times, const torch::Tensor& values,
                                                  const torch::Tensor& mask) {
    const int64_t B = values.size(0), T = values.size(1);
    auto gaps = torch::cat({torch::zeros({1}, times.options()), times.diff()}).view({1, T, 1}).expand({B, T, 1});
    auto maskf = mask.to(values.scalar_type());
    auto inp = torch::cat({values * maskf, maskf, gaps}, -1).flip({1});
    auto out = std::get<0>(gru_->forward(inp)).flip({1});
    // FACT: o=torch.randn(2,5,4).flip(1); assert raises(lambda: o.transpose(0,1).view(10,4), "view size is not compatible")
    auto ctx = to_ctx_->forward(out.transpose(0, 1).view({T * B, -1})).view({T, B, -1});  // EXPECT: tensor-view-non-contiguous
    return {ctx, to_qz0_->forward(out.select(1, 0))};
  }

  torch::nn::GRU gru_;
  torch::nn::Linear to_ctx_, to_qz0_;
};
TORCH_MODULE(PosteriorEncoder);

struct SolveResult {
  std::vector<torch::Tensor> states;  // latent state at each observation time
  torch::Tensor log_ratio;
};

struct ModelOutput {
  torch::Tensor log_px, kl_z0, kl_path, z_last;
};

struct LatentSDEImpl : torch::nn::Module {
  explicit LatentSDEImpl(const SDEConfig& c) : cfg_(c) {
    encoder_ = register_module("encoder", PosteriorEncoder(c));
    f_post_ = register_module("f_post", mlp(c.latent_dim + c.context_dim, c.hidden, c.latent_dim));
    h_prior_ = register_module("h_prior", mlp(c.latent_dim, c.hidden, c.latent_dim));
    g_net_ = register_module("g_net", mlp(c.latent_dim, c.hidden, c.latent_dim));
    decoder_ = register_module("decoder", torch::nn::Linear(c.latent_dim, c.obs_dim));
    pz0_mean_ = register_parameter("pz0_mean", torch::zeros({1, c.latent_dim}));
    pz0_logstd_ = register_parameter("pz0_logstd", torch::zeros({1, c.latent_dim}));
  }

  std::vector<int64_t> observation_steps(const torch::Tensor& times) const {
    auto acc = times.accessor<float, 1>();
    std::vector<int64_t> steps;
    for (int64_t i = 0; i < acc.size(0); ++i) steps.push_back(std::lround((acc[i] - acc[0]) / cfg_.dt));
    return steps;
  }

  SolveResult solve(const torch::Tensor& z0, const torch::Tensor& ctx, const std::vector<int64_t>& steps) {
    const double sqrt_dt = std::sqrt(cfg_.dt);
    const size_t last = steps.size() - 1;
    auto z = z0.clone();  // EXPECT: tensor-unnecessary-clone
    auto log_ratio = torch::zeros({z.size(0)}, z.options());
    SolveResult res;
    res.states.push_back(z);
    size_t next_obs = 1;
    for (int64_t k = 0; k < steps.back(); ++k) {
      auto c = ctx[std::min(next_obs, last)];
      auto f = f_post_->forward(torch::cat({z, c}, -1));
      auto h = h_prior_->forward(z);
      auto g = torch::sigmoid(g_net_->forward(z));
      // FACT: x=torch.randn(4,3,requires_grad=True); g=torch.sigmoid(x); g.add_(1e-3); u=x/g; assert backward_fails(lambda: u.sum().backward())
      g.add_(1e-3);  // EXPECT: tensor-inplace-on-saved
      auto u = (f - h) / g;
      log_ratio = log_ratio + 0.5 * (u * u).sum(-1) * cfg_.dt;
      z = z + f * cfg_.dt + g * torch::randn({z.size(0), z.size(1)}) * sqrt_dt;  // EXPECT: tensor-device-mismatch
      while (next_obs <= last && steps[next_obs] == k + 1) {
        res.states.push_back(z);  // LOOKALIKE: tensor-graph-kept-across-iterations -- the path feeds this step's likelihood and is released after backward
        ++next_obs;
      }
    }
    res.log_ratio = log_ratio;
    return res;
  }

  ModelOutput forward(const torch::Tensor& times_cpu, const torch::Tensor& values, const torch::Tensor& mask,
                      const torch::Tensor& obs_std) {
    auto times = times_cpu.to(values.device());
    auto enc = encoder_->forward(times, values, mask);
    const auto& ctx = enc.first;
    auto qz0_mean = enc.second.narrow(-1, 0, cfg_.latent_dim);
    auto qz0_logstd = enc.second.narrow(-1, cfg_.latent_dim, cfg_.latent_dim).clamp(-6.0, 2.0);
    auto z0 = qz0_mean + qz0_logstd.exp() * torch::randn_like(qz0_mean);  // LOOKALIKE: tensor-device-mismatch -- randn_like follows qz0_mean's device
    auto path = solve(z0, ctx, observation_steps(times_cpu));

    const int64_t T = static_cast<int64_t>(path.states.size());
    auto zs = torch::stack(path.states, 0);
    // FACT: z=torch.stack([torch.randn(2,8) for _ in range(5)],0); assert is_view_of(z.view(-1,8),z)
    auto xs = decoder_->forward(zs.view({-1, cfg_.latent_dim})).view({T, values.size(0), -1});  // LOOKALIKE: tensor-view-non-contiguous -- stack along dim 0 gives a contiguous tensor
    auto log_px = torch::zeros({values.size(0)}, values.options());
    for (int64_t i = 0; i < T; ++i) {
      auto sd = obs_std.to(values.device());  // EXPECT: tensor-clone-in-loop
      auto resid = values.select(1, i) - xs[i];
      // FACT: x=torch.randn(3,requires_grad=True); r=x-1.0; r.div_(torch.full((3,),2.0)); r.pow(2).sum().backward(); assert x.grad is not None
      resid.div_(sd);  // LOOKALIKE: tensor-inplace-on-saved -- the subtraction saves neither operand and nothing has used resid yet
      auto m = mask.select(1, i).to(resid.scalar_type());
      log_px = log_px - 0.5 * (resid.pow(2) * m).sum(-1) - (sd.log() * m).sum(-1);
    }

    auto pz0_logstd = pz0_logstd_.clamp(-5.0, 2.0);
    auto kl_z0 = (pz0_logstd - qz0_logstd +
                  (torch::exp(2 * qz0_logstd) + (qz0_mean - pz0_mean_).pow(2)) / (2 * torch::exp(2 * pz0_logstd)) - 0.5)
                     .sum(-1);
    return {log_px, kl_z0, path.log_ratio, path.states.back()};
  }

  // Prior-SDE samples continuing from the last posterior state; frames every `every` steps.
  torch::Tensor forecast(const torch::Tensor& z_last, int64_t horizon, int64_t num_samples, int64_t every) {
    torch::NoGradGuard no_grad;
    const int64_t B = z_last.size(0);
    auto z = z_last.repeat({num_samples, 1});
    std::vector<torch::Tensor> frames;
    for (int64_t k = 1; k <= horizon; ++k) {
      auto g = torch::sigmoid(g_net_->forward(z)) + 1e-3;
      z = z + h_prior_->forward(z) * cfg_.dt + g * torch::randn_like(z) * std::sqrt(cfg_.dt);
      if (k % every == 0) frames.push_back(decoder_->forward(z).view({num_samples, B, -1}));
    }
    return torch::stack(frames, 0);
  }

  torch::Tensor& pz0_logstd() { return pz0_logstd_; }

  SDEConfig cfg_;
  PosteriorEncoder encoder_{nullptr};
  torch::nn::Sequential f_post_{nullptr}, h_prior_{nullptr}, g_net_{nullptr};
  torch::nn::Linear decoder_{nullptr};
  torch::Tensor pz0_mean_, pz0_logstd_;
};
TORCH_MODULE(LatentSDE);

std::vector<torch::Tensor> train(LatentSDE& model, const IrregularDataset& data, const SDEConfig& cfg,
                                 const torch::Tensor& obs_std, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::vector<torch::Tensor> loss_history;
  int64_t iter = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double kl_running = 0.0;
    for (size_t i = 0; i < data.size(); ++i, ++iter) {
      auto b = data.get(i);
      auto t = b.times;
      // FACT: a=torch.tensor([0.0,6.0,30.0]); t=a; t/=24.0; assert shares_storage(t,a) and a[1].item()==0.25
      t.div_(cfg.time_scale);  // EXPECT: tensor-alias-then-mutate
      const double span = (t[-1] - t[0]).item<double>();  // LOOKALIKE: tensor-sync-in-loop -- t lives on the CPU, nothing waits on the device
      if (span < cfg.dt) continue;

      auto values = b.values.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto mask = b.mask.to(device);
      auto out = model->forward(t, values, mask, obs_std);
      const double beta = std::min(1.0, static_cast<double>(iter) / static_cast<double>(cfg.kl_anneal_iters));
      auto kl = (out.kl_z0 + out.kl_path).mean();
      auto loss = -out.log_px.mean() + beta * kl;

      opt.zero_grad();
      loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        model->pz0_logstd().clamp_(-5.0, 2.0);  // LOOKALIKE: tensor-inplace-on-leaf -- projection step under NoGradGuard
      }

      loss_history.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      kl_running += kl.item<double>();  // EXPECT: tensor-sync-in-loop
    }
    std::printf("epoch %ld  mean KL %.4f\n", static_cast<long>(epoch), kl_running / std::max<size_t>(data.size(), 1));
  }
  return loss_history;
}

void write_forecasts(LatentSDE& model, const IrregularDataset& data, const SDEConfig& cfg,
                     const torch::Tensor& obs_std, torch::Device device, const std::string& path) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::ofstream out(path);
  for (size_t i = 0; i < data.size(); ++i) {
    auto b = data.get(i);
    auto values = b.values.to(device);
    auto res = model->forward(b.times, values, b.mask.to(device), obs_std);
    auto samples = model->forecast(res.z_last, cfg.forecast_steps, cfg.forecast_samples, 10);
    // FACT: x=torch.randn(20,16,3,6); r=x.permute(2,0,1,3).reshape(3,-1); assert is_copy_of(r,x)
    auto rows = samples.permute({2, 0, 1, 3}).reshape({values.size(0), -1}).cpu();  // EXPECT: tensor-reshape-non-contiguous // LOOKALIKE: tensor-sync-in-loop -- the forecasts are the output and have to reach the host to be written
    auto acc = rows.accessor<float, 2>();
    for (int64_t r = 0; r < acc.size(0); ++r) {
      out << i << ',' << r;
      for (int64_t c = 0; c < acc.size(1); ++c) out << ',' << acc[r][c];
      out << '\n';
    }
  }
}

}  // namespace lsde

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s series.bin [forecast.csv]\n", argv[0]);
    return 1;
  }
  torch::manual_seed(7);
  lsde::SDEConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  lsde::IrregularDataset data(argv[1], cfg.obs_dim);
  const auto obs_std = data.observation_std();

  lsde::LatentSDE model(cfg);
  model->to(device);
  auto history = lsde::train(model, data, cfg, obs_std, device);
  auto curve = torch::stack(history).detach().cpu();
  std::printf("final loss %.4f (best %.4f)\n", curve[-1].item<double>(), curve.min().item<double>());
  torch::save(model, "latent_sde.pt");
  lsde::write_forecasts(model, data, cfg, obs_std, device, argc > 2 ? argv[2] : "forecast.csv");
  return 0;
}
