// Diffusion policy: conv + spatial-softmax encoder, temporal-conv noise predictor over action
// chunks [B, horizon, action_dim], DDPM training with EMA, receding-horizon execution.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct DiffusionConfig {
  int64_t image_channels = 3;
  int64_t proprio_dim = 14;  // joint positions + offset to the goal
  int64_t feature_dim = 256;
  int64_t horizon = 16;      // length of a predicted action chunk
  int64_t exec_horizon = 8;  // actions executed before re-planning
  int64_t action_dim = 7;
  int64_t hidden = 256;
  int64_t time_dim = 128;
  int64_t diffusion_steps = 100;
  double beta_start = 1e-4;
  double beta_end = 2e-2;
  double lr = 1e-4;
  double ema_decay = 0.995;
};

struct NormStats {
  torch::Tensor obs_mean, obs_std;  // proprioception
  torch::Tensor act_mean, act_std;  // actions
};

struct Batch {
  torch::Tensor image;    // [B, C, H, W] float in [0, 1]
  torch::Tensor proprio;  // [B, P]
  torch::Tensor actions;  // [B, horizon, action_dim]
};

// Linear beta schedule; lives on the host and is indexed per denoising step.
struct NoiseSchedule {
  torch::Tensor betas, alphas, alphas_cumprod;
  explicit NoiseSchedule(const DiffusionConfig &cfg) {
    betas = torch::linspace(cfg.beta_start, cfg.beta_end, cfg.diffusion_steps);
    alphas = 1.0 - betas;
    alphas_cumprod = torch::cumprod(alphas, 0);
  }
};

torch::Tensor normalize(const torch::Tensor &x, const torch::Tensor &mean, const torch::Tensor &stdev) {
  torch::Tensor z = x;
  z = z - mean;
  // FACT: x = torch.randn(4, 3); z = x; z = z - x.mean(0); z.div_(2.0); assert is_copy_of(z, x)
  z.div_(stdev);  // LOOKALIKE: tensor-alias-then-mutate -- z was rebound to the fresh result of z - mean first
  return z;
}

torch::Tensor timestep_embedding(const torch::Tensor &t, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(torch::arange(half, torch::TensorOptions().device(t.device())) *
                          (-std::log(10000.0) / static_cast<double>(half)));
  auto args = t.to(torch::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({args.sin(), args.cos()}, 1);
}

struct ObsEncoderImpl : torch::nn::Module {
  torch::nn::Conv2d c1{nullptr}, c2{nullptr}, c3{nullptr};
  torch::nn::Linear keypoint_fc{nullptr}, proprio_fc{nullptr};

  explicit ObsEncoderImpl(const DiffusionConfig &cfg) {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.image_channels, 32, 5).stride(2)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(2)));
    c3 = register_module("c3", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 64, 3).padding(1)));
    keypoint_fc = register_module("keypoint_fc", torch::nn::Linear(2 * 64, cfg.feature_dim - 64));
    proprio_fc = register_module("proprio_fc", torch::nn::Linear(cfg.proprio_dim, 64));
  }

  // Returns the conditioning vector [B, feature_dim].
  torch::Tensor forward(const torch::Tensor &image, const torch::Tensor &proprio) {
    auto h = F::relu(c1(image));
    h = F::relu(c2(h));
    h = c3(h);
    const int64_t B = h.size(0), C = h.size(1), Hh = h.size(2), Ww = h.size(3);
    // Spatial softmax: one expected (x, y) keypoint per feature channel.
    // FACT: h = torch.nn.Conv2d(3, 4, 3)(torch.randn(2, 3, 8, 8)); assert is_contiguous(h) and is_view_of(h.view(2, 4, 36), h)
    auto attn = torch::softmax(h.view({B, C, Hh * Ww}), -1);  // LOOKALIKE: tensor-view-non-contiguous -- a convolution's output is contiguous
    auto xs = torch::linspace(-1.0, 1.0, Ww, h.options()).repeat({Hh});
    auto ys = torch::linspace(-1.0, 1.0, Hh, h.options()).repeat_interleave(Ww);
    auto kx = (attn * xs).sum(-1);
    auto ky = (attn * ys).sum(-1);
    auto img_feat = F::relu(keypoint_fc(torch::cat({kx, ky}, 1)));
    return torch::cat({img_feat, F::relu(proprio_fc(proprio))}, 1);
  }
};
TORCH_MODULE(ObsEncoder);

// 1-D temporal conv over the chunk, FiLM-conditioned on the observation and the timestep.
struct NoisePredNetImpl : torch::nn::Module {
  int64_t horizon, action_dim, hidden, time_dim;
  torch::nn::Conv1d in_conv{nullptr}, mid_conv{nullptr};
  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Linear time_mlp{nullptr}, film{nullptr}, out{nullptr};

  NoisePredNetImpl(const DiffusionConfig &cfg, int64_t cond_dim)
      : horizon(cfg.horizon), action_dim(cfg.action_dim), hidden(cfg.hidden), time_dim(cfg.time_dim) {
    in_conv = register_module("in_conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(action_dim, hidden, 5).padding(2)));
    mid_conv = register_module("mid_conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(hidden, hidden, 5).padding(2)));
    norm = register_module("norm", torch::nn::GroupNorm(8, hidden));
    time_mlp = register_module("time_mlp", torch::nn::Linear(time_dim, hidden));
    film = register_module("film", torch::nn::Linear(cond_dim + hidden, 2 * hidden));
    out = register_module("out", torch::nn::Linear(hidden, action_dim));
    // Start close to "predict zero noise" so early samples stay near the data mean.
    torch::nn::init::zeros_(out->bias);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under no-grad
    out->weight.normal_(0.0, 1e-3);  // EXPECT: tensor-inplace-on-leaf
  }

  // x: noisy chunk [B, horizon, action_dim]; t: [B] int64; cond: [B, cond_dim].
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &t, const torch::Tensor &cond) {
    const int64_t B = x.size(0);
    auto temb = F::silu(time_mlp(timestep_embedding(t, time_dim)));
    auto h = in_conv(x.transpose(1, 2));  // [B, hidden, horizon]
    h.add_(temb.unsqueeze(-1));  // LOOKALIKE: tensor-inplace-on-saved -- a convolution does not save its output for backward
    auto gain_shift = film(torch::cat({cond, temb}, 1));
    auto gate = torch::sigmoid(gain_shift.narrow(1, 0, hidden));
    auto shift = gain_shift.narrow(1, hidden, hidden);
    gate.mul_(2.0);  // EXPECT: tensor-inplace-on-saved
    h = torch::mish(norm(mid_conv(h))) * gate.unsqueeze(-1) + shift.unsqueeze(-1);

    // Per-timestep projection back to the action space.
    // FACT: h = torch.randn(2, 6, 5); assert is_copy_of(h.transpose(1, 2).reshape(10, 6), h)
    auto per_step = h.transpose(1, 2).reshape({B * horizon, hidden});  // EXPECT: tensor-reshape-non-contiguous
    auto eps = out(per_step);
    // FACT: y = torch.nn.Linear(6, 3)(torch.randn(10, 6)); assert is_contiguous(y) and is_view_of(y.view(2, 5, 3), y)
    return eps.view({B, horizon, action_dim});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear's output is contiguous
  }
};
TORCH_MODULE(NoisePredNet);

struct DiffusionPolicyImpl : torch::nn::Module {
  DiffusionConfig cfg;
  ObsEncoder encoder{nullptr};
  NoisePredNet noise_net{nullptr};
  explicit DiffusionPolicyImpl(const DiffusionConfig &c) : cfg(c) {
    encoder = register_module("encoder", ObsEncoder(cfg));
    noise_net = register_module("noise_net", NoisePredNet(cfg, cfg.feature_dim));
  }
};
TORCH_MODULE(DiffusionPolicy);

torch::Tensor ddpm_loss(DiffusionPolicy &policy, const NoiseSchedule &sched, const Batch &batch,
                        const NormStats &stats) {
  const int64_t B = batch.actions.size(0);
  auto a0 = normalize(batch.actions, stats.act_mean, stats.act_std);
  auto cond = policy->encoder->forward(batch.image, normalize(batch.proprio, stats.obs_mean, stats.obs_std));
  auto t = torch::randint(0, policy->cfg.diffusion_steps, {B},
                          torch::TensorOptions().dtype(torch::kLong).device(a0.device()));
  auto noise = torch::randn_like(a0);
  // FACT: ac = torch.rand(10); t = torch.randint(0, 10, (4,)); s = ac.index_select(0, t); assert is_contiguous(s) and is_view_of(s.view(4, 1, 1), s)
  auto abar = sched.alphas_cumprod.to(a0.device()).index_select(0, t).view({B, 1, 1});  // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a fresh contiguous tensor
  auto noisy = abar.sqrt() * a0 + (1.0 - abar).sqrt() * noise;
  return F::mse_loss(policy->noise_net->forward(noisy, t, cond), noise);
}

// Reverse DDPM process; returns a normalized chunk [B, horizon, action_dim] in [-1, 1].
torch::Tensor ddpm_sample(DiffusionPolicy &policy, const NoiseSchedule &sched, const torch::Tensor &cond,
                          std::vector<torch::Tensor> *trajectory) {
  torch::NoGradGuard no_grad;
  const auto &cfg = policy->cfg;
  const int64_t B = cond.size(0);
  auto x = torch::randn({B, cfg.horizon, cfg.action_dim}, cond.options());
  for (int64_t k = cfg.diffusion_steps - 1; k >= 0; --k) {
    auto t = torch::full({B}, k, torch::TensorOptions().dtype(torch::kLong).device(cond.device()));
    auto eps = policy->noise_net->forward(x, t, cond);
    auto betas = sched.betas.to(cond.device());  // EXPECT: tensor-clone-in-loop
    auto alpha = sched.alphas[k];
    auto abar = sched.alphas_cumprod[k];
    x = (x - betas[k] / (1.0 - abar).sqrt() * eps) / alpha.sqrt();  // LOOKALIKE: tensor-device-mismatch -- alpha and abar are 0-dim CPU tensors, which PyTorch accepts beside CUDA operands
    if (k > 0) x = x + betas[k].sqrt() * torch::randn_like(x);
    if (trajectory != nullptr) trajectory->push_back(x.clone());  // LOOKALIKE: tensor-clone-in-loop -- every copy is kept, and x changes each step
  }
  auto a = x.clone();  // EXPECT: tensor-unnecessary-clone
  a.clamp_(-1.0, 1.0);
  return a;
}

void train(DiffusionPolicy &policy, DiffusionPolicy &ema, const std::vector<Batch> &batches,
           const NormStats &host_stats, int64_t epochs) {
  torch::Device device(torch::kCUDA);
  policy->to(device);
  ema->to(device);
  NormStats stats{host_stats.obs_mean.to(device), host_stats.obs_std.to(device),
                  host_stats.act_mean.to(device), host_stats.act_std.to(device)};
  NoiseSchedule sched(policy->cfg);
  const double decay = policy->cfg.ema_decay;
  torch::optim::AdamW opt(policy->parameters(), torch::optim::AdamWOptions(policy->cfg.lr).weight_decay(1e-6));
  auto params = policy->parameters();
  auto ema_params = ema->parameters();
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    torch::Tensor epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t step = 0;
    for (const auto &b : batches) {
      Batch gpu{b.image.to(device), b.proprio.to(device), b.actions.to(device)};
      auto loss = ddpm_loss(policy, sched, gpu, stats);
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(policy->parameters(), 1.0);
      opt.step();
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i) {
          auto shadow = ema_params[i].data();
          shadow.mul_(decay).add_(params[i], 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-detached -- EMA write through data() under NoGradGuard is the intent
        }
      }
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      if (++step % 100 == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- logged once every 100 steps
    }
    std::cout << "epoch " << epoch << " mean loss " << (epoch_loss / std::max<int64_t>(step, 1)).item<float>() << "\n";
  }
}

// Batched reaching simulator used for closed-loop evaluation.
struct ReachSim {
  torch::Tensor q, goal;
  int64_t image_size = 96;
  ReachSim(int64_t n, int64_t dof) : q(torch::zeros({n, dof})), goal(torch::rand({n, dof})) {}
  Batch observe() const {
    auto img = torch::zeros({q.size(0), 3, image_size, image_size});
    return Batch{img, torch::cat({q, goal - q}, 1), torch::Tensor()};
  }
  void step(const torch::Tensor &action) { q = q + 0.05 * action.narrow(1, 0, q.size(1)); }
  double mean_distance() const { return (goal - q).norm(2, 1).mean().item<double>(); }
};

// Plans a chunk, executes its first exec_horizon actions, re-plans (receding horizon).
double evaluate(DiffusionPolicy &policy, ReachSim &sim, const NormStats &stats, int64_t max_steps,
                std::vector<torch::Tensor> &executed) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  policy->to(device);
  policy->eval();
  const auto &cfg = policy->cfg;
  NoiseSchedule sched(cfg);
  const int64_t n_exec = cfg.exec_horizon, A = cfg.action_dim;
  double jerk = 0.0;
  for (int64_t t = 0; t < max_steps; t += n_exec) {
    auto obs = sim.observe();
    auto proprio = normalize(obs.proprio, stats.obs_mean, stats.obs_std);
    auto cond = policy->encoder->forward(obs.image.to(device), proprio.to(device));
    auto chunk = ddpm_sample(policy, sched, cond, nullptr);
    auto act = chunk.cpu() * stats.act_std + stats.act_mean;  // [B, horizon, A]
    const int64_t B = act.size(0);
    auto exec = act.narrow(1, 0, n_exec);
    // FACT: a = torch.randn(3, 16, 7); assert is_view_of(a.narrow(1, 0, 8).reshape(3, -1), a)
    auto per_env = exec.reshape({B, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- dropping trailing steps keeps each env's block contiguous: a view
    auto diffs = per_env.narrow(1, A, (n_exec - 1) * A) - per_env.narrow(1, 0, (n_exec - 1) * A);
    jerk += diffs.pow(2).sum(1).mean().item<double>();
    auto time_major = exec.transpose(0, 1);  // [n_exec, B, A]
    for (int64_t s = 0; s < n_exec; ++s) sim.step(time_major[s]);
    // FACT: a = torch.randn(3, 16, 7); assert raises(lambda: a.narrow(1, 0, 8).transpose(0, 1).view(-1, 7), "view size is not compatible")
    executed.push_back(time_major.view({-1, A}));  // EXPECT: tensor-view-non-contiguous
  }
  std::cout << "final distance " << sim.mean_distance() << " jerk " << jerk / max_steps << "\n";
  return sim.mean_distance();
}

// On-robot executor: one action per control tick from the current plan, re-planning every
// exec_horizon ticks. The plan is kept denormalized on the host.
class ChunkExecutor {
 public:
  ChunkExecutor(DiffusionPolicy policy, NormStats stats, torch::Device device)
      : policy_(std::move(policy)), stats_(std::move(stats)), sched_(policy_->cfg), device_(device) {}

  torch::Tensor tick(const torch::Tensor &image, const torch::Tensor &proprio) {
    if (!plan_.defined() || ticks_since_plan_ >= policy_->cfg.exec_horizon) {
      replan(image, proprio);
    } else {
      const int64_t H = plan_.size(0);
      // FACT: p = torch.randn(16, 7); assert raises(lambda: p.narrow(0, 0, 15).copy_(p.narrow(0, 1, 15)), "some elements of the input tensor")
      plan_.narrow(0, 0, H - 1).copy_(plan_.narrow(0, 1, H - 1));  // EXPECT: tensor-inplace-overlap
      // FACT: p = torch.randn(16, 7); p[15].copy_(p[14]); assert torch.equal(p[15], p[14])
      plan_[H - 1].copy_(plan_[H - 2]);  // LOOKALIKE: tensor-inplace-overlap -- two different rows: disjoint memory
    }
    ++ticks_since_plan_;
    return plan_[0].clone();
  }

 private:
  void replan(const torch::Tensor &image, const torch::Tensor &proprio) {
    torch::NoGradGuard no_grad;
    auto p = normalize(proprio, stats_.obs_mean, stats_.obs_std);
    auto cond = policy_->encoder->forward(image.unsqueeze(0).to(device_), p.unsqueeze(0).to(device_));
    auto chunk = ddpm_sample(policy_, sched_, cond, nullptr)[0];  // [horizon, A]
    plan_ = chunk.cpu() * stats_.act_std + stats_.act_mean;
    ticks_since_plan_ = 0;
  }

  DiffusionPolicy policy_;
  NormStats stats_;
  NoiseSchedule sched_;
  torch::Device device_;
  torch::Tensor plan_;
  int64_t ticks_since_plan_ = 0;
};
