// Point cloud completion in the style of PCN: a PointNet encoder produces a
// global code, an MLP decodes a coarse cloud and a folding decoder grows a
// small 2-D patch around every coarse point.  Trained with Chamfer distance
// on synthetic partial scans of random ellipsoids.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

struct PCNConfig {
  int64_t num_input = 1024;
  int64_t num_coarse = 256;
  int64_t grid_size = 4;
  int64_t latent = 512;
  double grid_scale = 0.05;

  int epochs = 40;
  int64_t batch_size = 16;
  int64_t steps_per_epoch = 200;
  double lr = 1e-4;
  double ema_decay = 0.999;
  double scene_scale = 2.5;  // metres per unit of the normalised clouds
  double fscore_tau = 0.02;
  int log_every = 50;

  int64_t num_fine() const { return num_coarse * grid_size * grid_size; }
};

class PCNEncoderImpl : public torch::nn::Module {
 public:
  explicit PCNEncoderImpl(int64_t latent) {
    conv1 = register_module("conv1", torch::nn::Conv1d(torch::nn::Conv1dOptions(3, 128, 1)));
    conv2 = register_module("conv2", torch::nn::Conv1d(torch::nn::Conv1dOptions(128, 256, 1)));
    conv3 = register_module("conv3", torch::nn::Conv1d(torch::nn::Conv1dOptions(512, 512, 1)));
    conv4 = register_module("conv4", torch::nn::Conv1d(torch::nn::Conv1dOptions(512, latent, 1)));
  }

  torch::Tensor forward(const torch::Tensor& points) {
    const int64_t b = points.size(0), n = points.size(1);
    auto f = conv2(torch::relu(conv1(points.transpose(1, 2))));
    auto g = std::get<0>(f.max(2, /*keepdim=*/true));
    f = conv4(torch::relu(conv3(torch::cat({g.expand({-1, -1, n}), f}, 1))));
    // FACT: g=torch.randn(2,16,10).max(2)[0]; assert is_contiguous(g) and is_view_of(g.view(2,-1), g)
    return std::get<0>(f.max(2)).view({b, -1});  // LOOKALIKE: tensor-view-non-contiguous -- the reduction result is freshly allocated and contiguous
  }

  torch::nn::Conv1d conv1{nullptr}, conv2{nullptr}, conv3{nullptr}, conv4{nullptr};
};
TORCH_MODULE(PCNEncoder);

class PCNDecoderImpl : public torch::nn::Module {
 public:
  explicit PCNDecoderImpl(const PCNConfig& cfg)
      : nc_(cfg.num_coarse), patch_(cfg.grid_size * cfg.grid_size), nf_(cfg.num_fine()) {
    mlp = register_module("mlp", torch::nn::Sequential(
        torch::nn::Linear(cfg.latent, 1024), torch::nn::ReLU(),
        torch::nn::Linear(1024, 1024), torch::nn::ReLU(),
        torch::nn::Linear(1024, 3 * nc_)));
    fold1 = register_module("fold1", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.latent + 5, 512, 1)));
    fold2 = register_module("fold2", torch::nn::Conv1d(torch::nn::Conv1dOptions(512, 512, 1)));
    fold3 = register_module("fold3", torch::nn::Conv1d(torch::nn::Conv1dOptions(512, 3, 1)));
    auto lin = torch::linspace(-cfg.grid_scale, cfg.grid_scale, cfg.grid_size);
    auto mesh = torch::meshgrid({lin, lin}, "ij");
    grid = register_buffer("grid", torch::stack({mesh[0], mesh[1]}, 0).view({2, -1}));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& code) {
    const int64_t b = code.size(0);
    // FACT: y=torch.nn.functional.linear(torch.randn(2,8), torch.randn(12,8)); assert is_view_of(y.reshape(2,4,3), y)
    auto coarse = mlp->forward(code).reshape({b, nc_, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- the Linear output is contiguous, reshape is a view
    // FACT: c=torch.randn(2,4,3); r=c.unsqueeze(2).expand(2,4,9,3).reshape(2,36,3); assert is_copy_of(r, c)
    auto centers = coarse.unsqueeze(2).expand({b, nc_, patch_, 3}).reshape({b, nf_, 3}).transpose(1, 2);  // EXPECT: tensor-reshape-non-contiguous
    auto seeds = grid.unsqueeze(0).repeat({b, 1, nc_});
    auto global = code.unsqueeze(2).expand({-1, -1, nf_});
    auto feat = torch::cat({global, seeds, centers}, 1);
    auto fine = fold3(torch::relu(fold2(torch::relu(fold1(feat))))) + centers;
    return {coarse, fine.transpose(1, 2)};
  }

  torch::nn::Sequential mlp{nullptr};
  torch::nn::Conv1d fold1{nullptr}, fold2{nullptr}, fold3{nullptr};
  torch::Tensor grid;

 private:
  int64_t nc_, patch_, nf_;
};
TORCH_MODULE(PCNDecoder);

class PCNImpl : public torch::nn::Cloneable<PCNImpl> {
 public:
  explicit PCNImpl(const PCNConfig& cfg) : cfg_(cfg) { reset(); }

  void reset() override {
    encoder = register_module("encoder", PCNEncoder(cfg_.latent));
    decoder = register_module("decoder", PCNDecoder(cfg_));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& partial) {
    return decoder->forward(encoder->forward(partial));
  }

  PCNEncoder encoder{nullptr};
  PCNDecoder decoder{nullptr};

 private:
  PCNConfig cfg_;
};
TORCH_MODULE(PCN);

// Symmetric squared Chamfer distance, one value per cloud.
torch::Tensor chamfer(const torch::Tensor& a, const torch::Tensor& b) {
  auto d = torch::cdist(a, b).pow(2);
  return std::get<0>(d.min(2)).mean(1) + std::get<0>(d.min(1)).mean(1);
}

double fscore(const torch::Tensor& pred, const torch::Tensor& gt, double scale, double tau) {
  auto p = pred.detach();
  // FACT: c=torch.nn.functional.linear(torch.randn(2,8,requires_grad=True), torch.randn(90,8)).reshape(2,30,3); d=torch.cdist(c, torch.randn(2,40,3)); assert backward_fails(lambda: (c.detach().mul_(2.5), d.sum().backward()))
  p.mul_(scale);  // EXPECT: tensor-inplace-on-detached
  auto d = torch::cdist(p, gt * scale);
  auto precision = std::get<0>(d.min(2)).lt(tau).to(torch::kFloat32).mean();
  auto recall = std::get<0>(d.min(1)).lt(tau).to(torch::kFloat32).mean();
  return (2 * precision * recall / (precision + recall + 1e-8)).item<double>();
}

struct Sample {
  torch::Tensor partial, complete;
};

// A random ellipsoid, centred, seen from one side.
Sample make_sample(const PCNConfig& cfg) {
  auto full = torch::randn({cfg.num_fine(), 3}, torch::kFloat64);
  full /= full.norm(2, 1, /*keepdim=*/true);
  full *= torch::rand({1, 3}, torch::kFloat64) * 0.6 + 0.2;
  auto center = full.mean(0);
  torch::Tensor complete = full;
  // FACT: f=torch.randn(8,3,dtype=torch.float64); keep=f.clone(); g=f; g-=f.mean(0); assert shares_storage(f, g) and not torch.equal(f, keep)
  complete -= center;  // EXPECT: tensor-alias-then-mutate

  auto view_dir = torch::randn({3}, torch::kFloat64);
  view_dir /= view_dir.norm();
  auto visible = full.matmul(view_dir).gt(-0.05).nonzero().squeeze(1);
  // FACT: f=torch.randn(8,3); p=f.index_select(0, torch.tensor([0,2,5])); assert is_copy_of(p, f)
  auto partial = full.index_select(0, visible);
  partial -= center;  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathered the visible points into new storage
  auto pick = torch::randint(partial.size(0), {cfg.num_input}, torch::kLong);
  return {partial.index_select(0, pick), complete};
}

struct Batch {
  torch::Tensor partial, complete;
};

Batch make_batch(const PCNConfig& cfg, int64_t b) {
  Batch out{torch::empty({b, cfg.num_input, 3}), torch::empty({b, cfg.num_fine(), 3})};
  for (int64_t i = 0; i < b; ++i) {
    auto s = make_sample(cfg);
    out.partial[i].copy_(s.partial);  // EXPECT: tensor-copy-narrowing
    out.complete[i].copy_(s.complete.to(torch::kFloat32));  // LOOKALIKE: tensor-copy-narrowing -- the conversion to float32 is explicit
  }
  return out;
}

void save_xyz(const std::string& path, const torch::Tensor& points) {
  auto host = points.to(torch::kCPU).contiguous();
  std::ofstream out(path);
  auto acc = host.accessor<float, 2>();
  for (int64_t i = 0; i < host.size(0); ++i) {
    out << acc[i][0] << ' ' << acc[i][1] << ' ' << acc[i][2] << '\n';
  }
}

void train(PCN& model, const PCNConfig& cfg, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  PCN ema(cfg);
  ema->to(device);
  {
    torch::NoGradGuard no_grad;
    auto src = model->parameters();
    auto dst = ema->parameters();
    for (size_t i = 0; i < src.size(); ++i) {
      dst[i].copy_(src[i]);
    }
  }
  auto alphas = torch::tensor({0.01, 0.1, 0.5, 1.0}, torch::kFloat32);
  double best = 1e9;
  std::vector<torch::Tensor> best_state;

  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto alpha = alphas[std::min<int64_t>(epoch / 10, 3)];
    auto running = torch::zeros({}, torch::TensorOptions().device(device));
    auto running_fine = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t step = 0; step < cfg.steps_per_epoch; ++step) {
      auto batch = make_batch(cfg, cfg.batch_size);
      auto partial = batch.partial.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch is generated and moved every step
      auto gt = batch.complete.to(device);
      auto coarse_idx = torch::randperm(cfg.num_fine(), torch::TensorOptions().dtype(torch::kLong).device(device));

      auto out = model->forward(partial);
      auto cd_coarse = chamfer(out.first, gt.index_select(1, coarse_idx.narrow(0, 0, cfg.num_coarse))).mean();
      auto cd_fine = chamfer(out.second, gt).mean();
      auto loss = cd_coarse + alpha * cd_fine;  // LOOKALIKE: tensor-device-mismatch -- alpha is a 0-dim CPU tensor, which may join CUDA operands
      if (step % cfg.log_every == 0) {
        std::cout << "  step " << step << " coarse F@" << cfg.fscore_tau << "m "
                  << fscore(out.first, gt, cfg.scene_scale, cfg.fscore_tau) << "\n";
      }

      opt.zero_grad();
      loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        auto src = model->parameters();
        auto dst = ema->parameters();
        for (size_t i = 0; i < src.size(); ++i) {
          dst[i].detach().mul_(cfg.ema_decay).add_(src[i].detach(), 1.0 - cfg.ema_decay);  // LOOKALIKE: tensor-inplace-on-detached -- EMA shadow weights under NoGradGuard, written on purpose
        }
      }
      running += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations, tensor-sync-in-loop -- detached and kept on the device, no graph and no host read
      running_fine += cd_fine;  // EXPECT: tensor-graph-kept-across-iterations
    }
    const double mean_loss = running.item<double>() / cfg.steps_per_epoch;  // LOOKALIKE: tensor-sync-in-loop -- one read per epoch, after the step loop
    std::cout << "epoch " << epoch << " loss " << mean_loss << " fine "
              << running_fine.item<double>() / cfg.steps_per_epoch << "\n";
    if (mean_loss < best) {
      best = mean_loss;
      best_state.clear();
      for (const auto& p : model->parameters()) {
        best_state.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- the optimizer keeps rewriting p in place, the snapshot must own its data
      }
    }
  }
}

void evaluate(PCN& model, const PCNConfig& cfg, torch::Device device, int64_t batches) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto totals = torch::zeros({2}, torch::kFloat64);
  torch::Tensor last_pred;
  for (int64_t i = 0; i < batches; ++i) {
    auto batch = make_batch(cfg, cfg.batch_size);
    auto partial = batch.partial.to(device);
    auto out = model->forward(partial);
    // accuracy: prediction to ground truth; completeness: ground truth to prediction
    auto d = torch::cdist(out.second, batch.complete);  // EXPECT: tensor-device-mismatch
    auto scores = torch::stack({std::get<0>(d.min(2)).mean(), std::get<0>(d.min(1)).mean()});
    totals += scores.to(torch::kCPU);  // EXPECT: tensor-sync-in-loop
    last_pred = out.second.clone();  // EXPECT: tensor-unnecessary-clone
  }
  totals /= batches;
  std::cout << "eval accuracy " << totals[0].item<double>() << " completeness " << totals[1].item<double>() << "\n";
  // FACT: f=torch.randn(2,3,8).transpose(1,2).clone(); assert not is_contiguous(f) and raises(lambda: f.view(-1,3), "view size is not compatible")
  save_xyz("last_batch.xyz", last_pred.view({-1, 3}));  // EXPECT: tensor-view-non-contiguous
  model->train();
}

int main() {
  torch::manual_seed(3);
  PCNConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  PCN model(cfg);
  model->to(device);
  train(model, cfg, device);
  evaluate(model, cfg, device, 20);
  torch::save(model, "pcn.pt");
  return 0;
}
