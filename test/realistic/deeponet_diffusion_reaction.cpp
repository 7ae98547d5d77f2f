// DeepONet (Lu et al., 2021) learning the solution operator of a diffusion-reaction
// equation u_t = D u_xx + k u^2 + f(x) with zero initial and boundary values:
// the branch net reads the source term f at fixed sensors, the trunk net reads (x, t).
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <vector>

using torch::indexing::Slice;

struct DeepONetConfig {
  int64_t nx = 201;            // spatial nodes of the reference solver
  int64_t nt = 101;            // recorded time levels
  int64_t sensor_stride = 2;   // branch sensors on every other node
  double diffusivity = 0.01;
  double reaction = 0.01;
  double length_scale = 0.2;
  int64_t latent = 128;
  int64_t width = 256;
  int64_t queries_per_sample = 256;
  int64_t query_chunk = 4096;
  int64_t batch_size = 64;
  int64_t epochs = 300;
  int64_t gen_chunk = 250;
  double lr = 1e-3;
};

struct DRDataset {
  torch::Tensor f, u;
};

struct InputStats {
  double mean = 0.0, std = 1.0;
};

// Source terms drawn from a Gaussian random field with a squared-exponential kernel.
torch::Tensor sample_grf(int64_t n, const torch::Tensor& x, double length_scale) {
  auto diff = x.unsqueeze(0) - x.unsqueeze(1);
  auto cov = torch::exp(-0.5 * diff.pow(2) / (length_scale * length_scale));
  // FACT: C=torch.randn(5,5); assert raises(lambda: C.add_(C.t()), "single memory location")
  cov.add_(cov.t()).mul_(0.5);  // EXPECT: tensor-inplace-overlap
  // FACT: C=torch.randn(4,4); d0=C.diagonal().clone(); C.diagonal().add_(1e-6); assert torch.equal(C.diagonal(), d0+1e-6)
  cov.diagonal().add_(1e-10);  // LOOKALIKE: tensor-inplace-overlap -- a scalar is added through the diagonal view, nothing of the buffer is read
  auto L = torch::linalg_cholesky(cov);
  return torch::randn({n, x.size(0)}, x.options()).matmul(L.t());
}

// Explicit finite differences; returns the recorded time levels for every source term.
torch::Tensor solve_diffusion_reaction(const torch::Tensor& f, const DeepONetConfig& cfg) {
  const int64_t nx = f.size(1);
  const double h = 1.0 / static_cast<double>(nx - 1);
  const int64_t record_every = 8, steps = (cfg.nt - 1) * record_every;
  const double dt = 1.0 / static_cast<double>(steps);
  auto u = torch::zeros_like(f);
  auto inner = u.slice(1, 1, nx - 1);
  auto f_inner = f.slice(1, 1, nx - 1);
  std::vector<torch::Tensor> frames{u.clone()};
  for (int64_t s = 1; s <= steps; ++s) {
    auto lap = (u.slice(1, 2, nx) - 2.0 * inner + u.slice(1, 0, nx - 2)) / (h * h);
    // FACT: u=torch.randn(2,7); e=u.clone(); e[:,1:-1]+=0.1*(u[:,2:]-2*u[:,1:-1]+u[:,:-2]); i=u[:,1:-1]; i.add_(0.1*(u[:,2:]-2*i+u[:,:-2])); assert torch.equal(u,e)
    inner.add_(dt * (cfg.diffusivity * lap + cfg.reaction * inner * inner + f_inner));  // LOOKALIKE: tensor-inplace-overlap -- the update is materialised in a temporary before add_ writes u
    if (s % record_every == 0) frames.push_back(u.clone());  // LOOKALIKE: tensor-unnecessary-clone -- u is advanced in place, every frame needs its own copy
  }
  return torch::stack(frames, 1);
}

DRDataset make_dataset(int64_t n, const DeepONetConfig& cfg) {
  auto x = torch::linspace(0.0, 1.0, cfg.nx, torch::kFloat64);
  DRDataset ds{torch::empty({n, cfg.nx}), torch::empty({n, cfg.nt, cfg.nx})};
  for (int64_t lo = 0; lo < n; lo += cfg.gen_chunk) {
    const int64_t hi = std::min(n, lo + cfg.gen_chunk);
    auto f = sample_grf(hi - lo, x, cfg.length_scale);
    auto u = solve_diffusion_reaction(f, cfg);
    ds.f.index_put_({Slice(lo, hi)}, f);  // EXPECT: tensor-copy-narrowing
    ds.u.index_put_({Slice(lo, hi)}, u.to(torch::kFloat32));
  }
  return ds;
}

torch::Tensor query_grid(int64_t nx, int64_t nt) {
  auto mesh = torch::meshgrid({torch::linspace(0.0, 1.0, nx), torch::linspace(0.0, 1.0, nt)}, "ij");
  // FACT: g=torch.stack(torch.meshgrid(torch.linspace(0,1,5),torch.linspace(0,1,3),indexing='ij'),-1); assert is_view_of(g.reshape(-1,2), g)
  return torch::stack(mesh, -1).reshape({-1, 2});  // LOOKALIKE: tensor-reshape-non-contiguous -- stack writes a fresh contiguous tensor, reshape is a view
}

torch::Tensor sample_sensors(const torch::Tensor& f, int64_t stride) {
  auto s = f.slice(1, 0, f.size(1), stride);
  // FACT: f=torch.randn(4,21); s=f[:, ::2]; assert not is_contiguous(s) and is_view_of(s.flatten(1), f)
  return s.flatten(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- flatten(1) of a 2-d tensor changes nothing and copies nothing
}

torch::Tensor branch_input(const torch::Tensor& f, const InputStats& stats, int64_t stride) {
  auto sensors = sample_sensors(f, stride);
  // FACT: f=torch.randn(6,21); s=f[2:4].to('cpu')[:, ::2].flatten(1); s.sub_(1.0); assert shares_storage(s, f)
  sensors.sub_(stats.mean).div_(stats.std);  // EXPECT: tensor-alias-then-mutate
  return sensors;
}

struct MLPImpl : torch::nn::Module {
  explicit MLPImpl(const std::vector<int64_t>& widths) {
    layers = register_module("layers", torch::nn::ModuleList());
    for (size_t i = 0; i + 1 < widths.size(); ++i) layers->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers->size(); ++i) {
      x = layers[i]->as<torch::nn::Linear>()->forward(x);
      if (i + 1 < layers->size()) x = torch::tanh(x);
    }
    return x;
  }
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(MLP);

struct DeepONetImpl : torch::nn::Module {
  explicit DeepONetImpl(const DeepONetConfig& cfg) {
    const int64_t sensors = (cfg.nx + cfg.sensor_stride - 1) / cfg.sensor_stride;
    branch = register_module("branch", MLP(std::vector<int64_t>{sensors, cfg.width, cfg.width, cfg.latent}));
    trunk = register_module("trunk", MLP(std::vector<int64_t>{2, cfg.width, cfg.width, cfg.latent}));
    bias = register_parameter("bias", torch::zeros({1}));
    reset_parameters();
  }

  void reset_parameters() {
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      if (item.key().find("weight") != std::string::npos)
        torch::nn::init::xavier_normal_(item.value());
      else
        item.value().zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- runs under NoGradGuard
    }
  }

  void init_output_bias(double value) {
    bias.fill_(value);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor trunk_features(const torch::Tensor& y) { return torch::tanh(trunk(y)); }

  // Each input function with its own set of query points.
  torch::Tensor forward(const torch::Tensor& sensors, const torch::Tensor& y) {
    auto b = branch(sensors);
    auto t = trunk_features(y);
    return (b.unsqueeze(1) * t).sum(-1) + bias;
  }

  MLP branch{nullptr}, trunk{nullptr};
  torch::Tensor bias;
};
TORCH_MODULE(DeepONet);

// All grid points for a batch of functions; the queries are chunked to bound memory.
torch::Tensor predict_on_grid(DeepONet& model, const torch::Tensor& sensors, const torch::Tensor& grid,
                              int64_t chunk) {
  auto b = model->branch(sensors);
  std::vector<torch::Tensor> rows;
  for (int64_t lo = 0; lo < grid.size(0); lo += chunk)
    rows.push_back(model->trunk_features(grid.slice(0, lo, lo + chunk)).matmul(b.t()));
  return torch::cat(rows).t() + model->bias;
}

torch::Tensor relative_l2(const torch::Tensor& pred, const torch::Tensor& target) {
  return (pred - target).pow(2).sum(1).sqrt() / target.pow(2).sum(1).sqrt();
}

struct ValidationSet {
  torch::Tensor sensors, target;
};

torch::Tensor validation_error(DeepONet& model, const ValidationSet& val, const torch::Tensor& grid) {
  const int64_t n = val.sensors.size(0);
  auto y = grid.to(val.sensors.device()).unsqueeze(0).expand({n, grid.size(0), 2});
  // FACT: g=torch.rand(6,2); assert raises(lambda: g.unsqueeze(0).expand(3,6,2).mul_(2.0), "more than one element")
  y.mul_(2.0).sub_(1.0);  // EXPECT: tensor-inplace-on-expanded
  return relative_l2(model->forward(val.sensors, y), val.target).mean();
}

void train(DeepONet& model, const DRDataset& data, const ValidationSet& val, const InputStats& stats,
           const DeepONetConfig& cfg, torch::Device device) {
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  torch::optim::StepLR sched(opt, /*step_size=*/100, /*gamma=*/0.5);
  const auto grid = query_grid(cfg.nx, cfg.nt);
  const auto u_scale = data.u.abs().max();
  const int64_t n = data.f.size(0), n_points = grid.size(0), P = cfg.queries_per_sample;
  std::vector<torch::Tensor> val_history;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(n);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t lo = 0; lo + cfg.batch_size <= n; lo += cfg.batch_size) {
      auto idx = perm.slice(0, lo, lo + cfg.batch_size);
      const int64_t B = idx.size(0);
      auto f = data.f.index_select(0, idx).to(device);
      auto u = data.u.index_select(0, idx).to(device);
      auto q = torch::randint(n_points, {B, P}, torch::TensorOptions().dtype(torch::kLong).device(device));
      auto y = grid.to(device).index_select(0, q.flatten()).view({B, P, 2});  // EXPECT: tensor-clone-in-loop
      // FACT: g=torch.rand(10,2); y=g.index_select(0, torch.tensor([1,3,3,4])).view(2,2,2); y.mul_(2.0).sub_(1.0); assert is_copy_of(y, g)
      y.mul_(2.0).sub_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- index_select returned a fresh tensor, the grid is untouched
      // FACT: u=torch.randn(3,5,7); assert not is_contiguous(u.transpose(1,2)) and is_copy_of(u.transpose(1,2).reshape(3,-1), u)
      auto target = u.transpose(1, 2).reshape({B, -1}).gather(1, q);  // EXPECT: tensor-reshape-non-contiguous
      target = target / u_scale;  // LOOKALIKE: tensor-device-mismatch -- u_scale is a 0-dim CPU tensor, which may meet CUDA tensors

      auto pred = model->forward(branch_input(f, stats, cfg.sensor_stride), y);
      auto loss = torch::mse_loss(pred, target);
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.detach();
    }
    sched.step();
    if (epoch % 10 == 0) {
      val_history.push_back(validation_error(model, val, grid));  // EXPECT: tensor-graph-kept-across-iterations
      std::printf("epoch %4lld  train mse %.3e  val rel-L2 %.4f\n", static_cast<long long>(epoch),
                  epoch_loss.item<double>() * cfg.batch_size / n, val_history.back().item<double>());
    }
  }
}

double evaluate(DeepONet& model, const DRDataset& test, const InputStats& stats, double u_scale,
                const DeepONetConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto grid = query_grid(cfg.nx, cfg.nt).to(device).mul(2.0).sub(1.0);
  std::vector<torch::Tensor> errors;
  const int64_t n = test.f.size(0);
  for (int64_t lo = 0; lo < n; lo += cfg.batch_size) {
    const int64_t hi = std::min(n, lo + cfg.batch_size), B = hi - lo;
    auto sensors = branch_input(test.f.slice(0, lo, hi).to(device), stats, cfg.sensor_stride);
    auto pred = predict_on_grid(model, sensors, grid, cfg.query_chunk) * u_scale;
    // FACT: o=torch.randn(12,3); p=(o.t()+torch.zeros(1))*2.0; f=p.reshape(3,4,3); assert not is_contiguous(p) and is_view_of(f, p) and is_view_of(f.view(3,-1), p)
    auto field = pred.reshape({B, cfg.nx, cfg.nt});  // LOOKALIKE: tensor-reshape-non-contiguous -- only splits a dimension, which is always a view
    // FACT: u=torch.randn(3,5,7); assert raises(lambda: u.transpose(1,2).view(3,-1), "view size is not compatible")
    auto target = test.u.slice(0, lo, hi).to(device).transpose(1, 2).view({B, -1});  // EXPECT: tensor-view-non-contiguous
    errors.push_back(relative_l2(field.view({B, -1}), target));  // LOOKALIKE: tensor-view-non-contiguous -- the split dims of field merge back with compatible strides
  }
  return torch::cat(errors).mean().item<double>();
}

int main() {
  torch::manual_seed(0);
  DeepONetConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto data = make_dataset(1000, cfg);
  auto test = make_dataset(200, cfg);
  const InputStats stats{data.f.mean().item<double>(), data.f.std().item<double>()};
  const double u_scale = data.u.abs().max().item<double>();

  ValidationSet val;
  val.sensors = branch_input(test.f.slice(0, 0, 32).to(device), stats, cfg.sensor_stride);
  val.target = (test.u.slice(0, 0, 32).transpose(1, 2).contiguous().view({32, -1}) / u_scale).to(device);

  DeepONet model(cfg);
  model->init_output_bias(data.u.mean().item<double>() / u_scale);
  train(model, data, val, stats, cfg, device);
  std::printf("test relative L2: %.4f\n", evaluate(model, test, stats, u_scale, cfg, device));
  return 0;
}
