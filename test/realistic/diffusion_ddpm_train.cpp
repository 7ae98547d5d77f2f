// DDPM: linear noise schedule, epsilon-prediction training with an EMA copy of the denoiser, ancestral sampling.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <vector>

struct Schedule {
  explicit Schedule(int64_t steps) : T(steps) {
    betas_ = torch::linspace(1e-4, 0.02, T);
    alphas_ = 1 - betas_;
    alphas_cumprod_ = torch::cumprod(alphas_, 0);
    auto prev = torch::cat({torch::ones({1}), alphas_cumprod_.narrow(0, 0, T - 1)});
    auto posterior_var = betas_;
    // FACT: b = torch.linspace(1e-4, 0.02, 5); v = b; v *= 0.5; assert shares_storage(v, b) and abs(b[-1].item() - 0.01) < 1e-6
    posterior_var *= (1 - prev) / (1 - alphas_cumprod_); // EXPECT: tensor-alias-then-mutate -- rescales the member betas_ the sampler reads
    posterior_std_ = posterior_var.sqrt();
  }
  int64_t T;
  torch::Tensor betas_, alphas_, alphas_cumprod_, posterior_std_;
};

// Denoiser: an MLP over flattened images, conditioned on a fixed sinusoidal timestep embedding.
struct DenoiserImpl : torch::nn::Module {
  DenoiserImpl(int64_t dim, int64_t T, int64_t emb) {
    temb_ = register_module("temb", torch::nn::Embedding(T, emb));
    net_ = register_module("net", torch::nn::Sequential(torch::nn::Linear(dim + emb, 512), torch::nn::SiLU(),
                                                        torch::nn::Linear(512, 512), torch::nn::SiLU(),
                                                        torch::nn::Linear(512, dim)));
    auto pos = torch::arange(T).unsqueeze(1).to(torch::kFloat);
    auto freq = torch::exp(torch::arange(0, emb, 2).to(torch::kFloat) * (-std::log(10000.0) / emb));
    auto table = torch::cat({torch::sin(pos * freq), torch::cos(pos * freq)}, 1);
    // FACT: e = torch.nn.Embedding(4, 2); assert raises(lambda: e.weight.copy_(torch.zeros(4, 2)), "a leaf Variable that requires grad")
    temb_->weight.copy_(table); // EXPECT: tensor-inplace-on-leaf -- loading the table outside NoGradGuard
    temb_->weight.requires_grad_(false);
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &t) {
    return net_->forward(torch::cat({x.flatten(1), temb_(t)}, 1)).view_as(x);
  }
  torch::nn::Embedding temb_{nullptr};
  torch::nn::Sequential net_{nullptr};
};
TORCH_MODULE(Denoiser);

torch::Tensor q_sample(const torch::Tensor &x0, const torch::Tensor &t, const torch::Tensor &alphas_cumprod,
                       const torch::Tensor &noise) {
  auto a_bar = alphas_cumprod.index_select(0, t);
  // FACT: a = torch.rand(10); s = a.index_select(0, torch.tensor([1, 3])); assert is_view_of(s.view(-1, 1, 1, 1), s)
  auto a = a_bar.view({-1, 1, 1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a fresh contiguous tensor
  return a.sqrt() * x0 + (1 - a).sqrt() * noise;
}

void ema_update(Denoiser &ema, Denoiser &model, double decay) {
  torch::NoGradGuard no_grad;
  auto ema_params = ema->parameters();
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    ema_params[i].mul_(decay).add_(params[i], 1 - decay); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

void train(Denoiser &model, Denoiser &ema, const Schedule &sched, const std::vector<torch::Tensor> &batches,
           torch::Device device, int log_every) {
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(2e-4));
  torch::Tensor smoothed = torch::zeros({});
  int64_t step = 0;
  for (const auto &batch : batches) {
    auto x0 = batch.to(device);
    auto t = torch::randint(0, sched.T, {x0.size(0)}, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto noise = torch::randn_like(x0);
    auto ac = sched.alphas_cumprod_.to(device); // EXPECT: tensor-clone-in-loop -- the schedule is moved to the device every step
    auto loss = torch::mse_loss(model->forward(q_sample(x0, t, ac, noise), t), noise);
    opt.zero_grad();
    loss.backward();
    opt.step();
    ema_update(ema, model, 0.999);
    // FACT: m = torch.nn.Linear(3, 1); s = torch.zeros(()); exec('for _ in range(3):\n l = m(torch.randn(2, 3)).pow(2).mean(); l.backward(); s = 0.98 * s + 0.02 * l'); assert kept_nodes(s) >= 6
    smoothed = 0.98 * smoothed + 0.02 * loss; // EXPECT: tensor-graph-kept-across-iterations -- only printed, never differentiated
    if (++step % log_every == 0)
      std::cout << "step " << step << " loss " << smoothed.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps
  }
}

std::vector<torch::Tensor> sample(Denoiser &ema, const Schedule &sched, torch::IntArrayRef shape) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  ema->to(device);
  auto alphas = sched.alphas_.to(device), ac = sched.alphas_cumprod_.to(device), betas = sched.betas_.to(device);
  auto sigma = sched.posterior_std_.to(device);
  auto x = torch::randn(shape, torch::TensorOptions().device(device));
  std::vector<torch::Tensor> trajectory;
  for (int64_t i = sched.T - 1; i >= 0; --i) {
    auto t = torch::full({shape[0]}, i, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto eps = ema->forward(x, t);
    x = (x - betas[i] / (1 - ac[i]).sqrt() * eps) / alphas[i].sqrt();
    if (i > 0)
      x = x + sigma[i] * torch::randn_like(x);
    std::cout << "t=" << i << " std " << x.std().item<float>() << "\n"; // EXPECT: tensor-sync-in-loop -- every one of the T steps
    if (i % 100 == 0)
      trajectory.push_back(x.cpu()); // LOOKALIKE: tensor-clone-in-loop, tensor-sync-in-loop -- every 100th step, and each copy is kept
  }
  return trajectory;
}
