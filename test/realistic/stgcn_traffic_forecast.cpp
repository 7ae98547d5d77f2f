// Spatio-temporal graph convolutional network (Yu, Yin & Zhu, IJCAI 2018) for traffic speed
// forecasting on a loop-detector network (METR-LA style: 207 sensors, 5-minute readings, 0 mph
// where a sensor reported nothing). The graph comes from pairwise road distances through a
// thresholded Gaussian kernel, symmetrised and renormalised as D^-1/2 (A + I) D^-1/2. Two ST-Conv
// blocks (gated temporal conv, Chebyshev graph conv, gated temporal conv) feed an output block that
// predicts all 12 horizons at once; training minimises a masked MAE over sensors in mph.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct StgcnConfig {
  int64_t n_his = 12, n_pred = 12, kt = 3, ks = 3, c_temporal = 64, c_spatial = 16, c_out_hidden = 128;
  int64_t batch = 50, epochs = 50, log_every = 100;
  double dist_scale_km = 10.0, sigma2 = 0.1, kernel_eps = 0.5, lr = 1e-3, weight_decay = 1e-4, dropout = 0.3;
  std::vector<int64_t> horizons = {3, 6, 12}; // 15, 30 and 60 minutes
};

struct ZScore {
  torch::Tensor mean, std; // [N] per sensor, over the valid training readings
};

struct TrafficBatch {
  torch::Tensor x, y; // x [B, 1, n_his, N] z-scored; y [B, n_pred, N] in mph, 0 = missing
};

// dist_km: [N, N] driving distances (directed; inf where no route). Returns the graph shift operator.
torch::Tensor normalized_adjacency(const torch::Tensor &dist_km, const StgcnConfig &cfg) {
  const auto N = dist_km.size(0);
  auto w = torch::exp(-(dist_km / cfg.dist_scale_km).pow(2) / cfg.sigma2);
  // FACT: d = torch.rand(5, 5); w = torch.exp(-d.pow(2)); w.masked_fill_(w < 0.5, 0.0); assert is_copy_of(w, d)
  w.masked_fill_(w < cfg.kernel_eps, 0.0); // LOOKALIKE: tensor-alias-then-mutate -- exp made a new tensor: the distances are untouched
  // The convolution wants a symmetric operator; one-way streets make the kernel directed.
  // FACT: w = torch.rand(5, 5); assert raises(lambda: w.add_(w.t()), "some elements of the input tensor and the written-to tensor refer to a single memory location")
  w.add_(w.t()).mul_(0.5); // EXPECT: tensor-inplace-overlap -- w.t() is the same storage in another order: PyTorch refuses the write
  w += torch::eye(N, w.options()); // LOOKALIKE: tensor-device-mismatch -- eye made with w's options
  auto d_inv_sqrt = w.sum(1).pow(-0.5);
  return d_inv_sqrt.unsqueeze(1) * w * d_inv_sqrt.unsqueeze(0);
}

// Gated linear unit over time: [B, C_in, T, N] -> [B, C_out, T - kt + 1, N].
struct TemporalGatedConvImpl : nn::Module {
  TemporalGatedConvImpl(int64_t c_in, int64_t c_out, int64_t kt) : c_in(c_in), c_out(c_out), kt(kt) {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(c_in, 2 * c_out, {kt, 1})));
    if (c_in > c_out)
      align = register_module("align", nn::Conv2d(nn::Conv2dOptions(c_in, c_out, 1)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto res = x.narrow(2, kt - 1, x.size(2) - kt + 1);
    if (!align.is_empty())
      res = align(res);
    else if (c_in < c_out)
      res = F::pad(res, F::PadFuncOptions({0, 0, 0, 0, 0, c_out - c_in}));
    auto pq = conv(x);
    return (pq.narrow(1, 0, c_out) + res) * torch::sigmoid(pq.narrow(1, c_out, c_out));
  }
  int64_t c_in, c_out, kt;
  nn::Conv2d conv{nullptr}, align{nullptr};
};
TORCH_MODULE(TemporalGatedConv);

// Chebyshev graph convolution of order ks over the node dimension: [B, C_in, T, N] -> [B, C_out, T, N].
struct ChebGraphConvImpl : nn::Module {
  ChebGraphConvImpl(int64_t c_in, int64_t c_out, int64_t ks) : ks(ks) {
    theta = register_parameter("theta", torch::empty({ks, c_in, c_out}));
    bias = register_parameter("bias", torch::zeros({c_out}));
    nn::init::kaiming_uniform_(theta, std::sqrt(5.0)); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &gso) {
    const auto B = x.size(0), C = x.size(1), T = x.size(2), N = x.size(3);
    // FACT: x = torch.randn(2, 3, 4, 5); r = x.permute(0, 2, 3, 1).reshape(-1, 5, 3); assert is_copy_of(r, x)
    auto h = x.permute({0, 2, 3, 1}).reshape({B * T, N, C}); // EXPECT: tensor-reshape-non-contiguous -- channels move last: batch and time cannot merge, the whole feature map is copied
    std::vector<torch::Tensor> terms{h};
    if (ks > 1)
      terms.push_back(torch::matmul(gso, h));
    for (int64_t k = 2; k < ks; ++k)
      terms.push_back(2 * torch::matmul(gso, terms[k - 1]) - terms[k - 2]);
    auto out = torch::einsum("bknc,kco->bno", {torch::stack(terms, 1), theta}) + bias;
    // FACT: s = torch.randn(6, 3, 7, 4); th = torch.randn(3, 4, 8); o = torch.einsum("bknc,kco->bno", s, th) + torch.zeros(8); assert is_view_of(o.view(2, 3, 7, -1), o)
    return out.view({B, T, N, -1}).permute({0, 3, 1, 2}); // LOOKALIKE: tensor-view-non-contiguous -- the einsum result plus bias is a fresh contiguous tensor
  }
  int64_t ks;
  torch::Tensor theta, bias;
};
TORCH_MODULE(ChebGraphConv);

struct STConvBlockImpl : nn::Module {
  STConvBlockImpl(int64_t c_in, const StgcnConfig &cfg, int64_t n_nodes) {
    tconv1 = register_module("tconv1", TemporalGatedConv(c_in, cfg.c_temporal, cfg.kt));
    gconv = register_module("gconv", ChebGraphConv(cfg.c_temporal, cfg.c_spatial, cfg.ks));
    tconv2 = register_module("tconv2", TemporalGatedConv(cfg.c_spatial, cfg.c_temporal, cfg.kt));
    ln = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({n_nodes, cfg.c_temporal})));
    drop = register_module("drop", nn::Dropout(cfg.dropout));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &gso) {
    auto h = torch::relu(gconv(tconv1(x), gso));
    h = tconv2(h);
    h = ln(h.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});
    return drop(h);
  }
  TemporalGatedConv tconv1{nullptr}, tconv2{nullptr};
  ChebGraphConv gconv{nullptr};
  nn::LayerNorm ln{nullptr};
  nn::Dropout drop{nullptr};
};
TORCH_MODULE(STConvBlock);

// Collapses the remaining time steps and maps channels to the horizons: -> [B, n_pred, 1, N].
struct OutputBlockImpl : nn::Module {
  OutputBlockImpl(const StgcnConfig &cfg, int64_t t_left, int64_t n_nodes) {
    tconv = register_module("tconv", TemporalGatedConv(cfg.c_temporal, cfg.c_out_hidden, t_left));
    ln = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({n_nodes, cfg.c_out_hidden})));
    fc1 = register_module("fc1", nn::Linear(cfg.c_out_hidden, cfg.c_out_hidden));
    fc2 = register_module("fc2", nn::Linear(cfg.c_out_hidden, cfg.n_pred));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = ln(tconv(x).permute({0, 2, 3, 1})); // [B, 1, N, C]
    return fc2(torch::relu(fc1(h))).permute({0, 3, 1, 2});
  }
  TemporalGatedConv tconv{nullptr};
  nn::LayerNorm ln{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(OutputBlock);

struct StgcnImpl : nn::Module {
  StgcnImpl(const StgcnConfig &cfg, torch::Tensor gso) {
    const auto n_nodes = gso.size(0);
    gso_ = register_buffer("gso", std::move(gso));
    block1 = register_module("block1", STConvBlock(1, cfg, n_nodes));
    block2 = register_module("block2", STConvBlock(cfg.c_temporal, cfg, n_nodes));
    output = register_module("output", OutputBlock(cfg, cfg.n_his - 4 * (cfg.kt - 1), n_nodes));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = block1(x, gso_); // LOOKALIKE: tensor-device-mismatch -- a registered buffer: model->to(device) moved it with the weights
    return output(block2(h, gso_));
  }
  torch::Tensor gso_;
  STConvBlock block1{nullptr}, block2{nullptr};
  OutputBlock output{nullptr};
};
TORCH_MODULE(Stgcn);

class TrafficWindows {
public:
  // speed: [T, N] mph from the loader; the first n_train rows are the training period.
  TrafficWindows(torch::Tensor speed, int64_t n_train, const StgcnConfig &cfg) : raw_(std::move(speed)), cfg_(cfg) {
    TORCH_CHECK(raw_.dim() == 2 && raw_.scalar_type() == torch::kFloat, "speed must be a float32 [T, N] matrix");
    auto train = raw_.narrow(0, 0, n_train);
    auto valid = (train != 0).to(torch::kFloat);
    auto count = valid.sum(0).clamp_min(1.0);
    scaler_.mean = (train * valid).sum(0) / count;
    scaler_.std = (((train - scaler_.mean) * valid).pow(2).sum(0) / count).sqrt().clamp_min(1e-3);
    norm_ = raw_.to(torch::kFloat);
    // FACT: s = torch.rand(10, 4) * 70; n = s.to(torch.float32); n.sub_(s.mean(0)).div_(s.std(0)); assert shares_storage(n, s) and s.max() < 10
    norm_.sub_(scaler_.mean).div_(scaler_.std); // EXPECT: tensor-alias-then-mutate -- raw_ is float32, so to(kFloat) returned it: the mph targets (and their 0 = missing marks) are z-scored too
  }

  TrafficBatch batch(const std::vector<int64_t> &starts, size_t from, int64_t size) const {
    const auto B = std::min<int64_t>(size, static_cast<int64_t>(starts.size() - from)), N = raw_.size(1);
    auto x = torch::empty({B, cfg_.n_his, N});
    std::vector<torch::Tensor> ys;
    for (int64_t b = 0; b < B; ++b) {
      const auto t = starts[from + b];
      x.select(0, b).copy_(norm_.narrow(0, t, cfg_.n_his)); // LOOKALIKE: tensor-copy-narrowing -- float32 readings into a float32 batch
      ys.push_back(raw_.narrow(0, t + cfg_.n_his, cfg_.n_pred));
    }
    return {x.unsqueeze(1), torch::stack(ys)};
  }

  int64_t num_windows() const { return raw_.size(0) - cfg_.n_his - cfg_.n_pred + 1; }
  const ZScore &scaler() const { return scaler_; }

private:
  torch::Tensor raw_, norm_;
  ZScore scaler_;
  StgcnConfig cfg_;
};

// Absolute error per point, masked where the reading is missing or the sensor is out of service;
// the mask is renormalised so that batches with many gaps weigh the same (as in DCRNN).
class MaskedMae {
public:
  MaskedMae(const torch::Tensor &sensor_ok, torch::Device device) : sensor_ok_(sensor_ok.to(device, torch::kFloat)) {}
  torch::Tensor per_point(const torch::Tensor &pred, const torch::Tensor &target) const {
    auto mask = sensor_ok_.expand_as(target);
    // FACT: m = torch.ones(5); t = torch.randn(2, 3, 5); assert raises(lambda: m.expand_as(t).mul_(t != 0), "single memory location")
    mask.mul_(target != 0.0); // EXPECT: tensor-inplace-on-expanded -- expand_as made a stride-0 view of the [N] sensor mask: PyTorch refuses the write
    mask = mask / mask.mean();
    auto err = torch::abs(pred - target) * mask;
    // FACT: p = torch.randn(4, 3, 5, requires_grad=True); e = torch.abs(p - torch.randn(4, 3, 5)) * torch.ones(4, 3, 5); e.masked_fill_(torch.isnan(e), 0.0); e.mean().backward(); assert p.grad is not None
    err.masked_fill_(torch::isnan(err), 0.0); // LOOKALIKE: tensor-inplace-on-saved -- mul saved its factors, not its result
    return err;
  }

private:
  torch::Tensor sensor_ok_;
};

struct Metrics {
  std::vector<double> mae, rmse, mape;
};

Metrics evaluate(Stgcn &model, const TrafficWindows &data, const std::vector<int64_t> &starts, const ZScore &scaler,
                 torch::Device device, const StgcnConfig &cfg) {
  model->eval();
  std::vector<torch::Tensor> preds, targets;
  for (size_t i = 0; i < starts.size(); i += static_cast<size_t>(cfg.batch)) {
    auto batch = data.batch(starts, i, cfg.batch);
    const auto B = batch.x.size(0);
    // FACT: y = torch.randn(4, 1, 7, 3).permute(0, 3, 1, 2); assert raises(lambda: y.view(4, -1), "view size is not compatible")
    auto z = model->forward(batch.x.to(device)).view({B, -1}); // EXPECT: tensor-view-non-contiguous -- the output block permutes [B, 1, N, P] to [B, P, 1, N]: horizons and sensors cannot merge
    auto mph = z.view({B, cfg.n_pred, -1}) * scaler.std.to(device) + scaler.mean.to(device); // EXPECT: tensor-clone-in-loop -- the same per-sensor statistics are copied to the device for every batch
    preds.push_back(mph); // EXPECT: tensor-graph-kept-across-iterations -- eval() does not stop autograd: every batch's forward graph stays alive until the metrics are done
    targets.push_back(batch.y.to(device)); // LOOKALIKE: tensor-graph-kept-across-iterations -- readings from the data set carry no gradient
  }
  auto pred = torch::cat(preds), y = torch::cat(targets);
  Metrics m;
  for (auto h : cfg.horizons) {
    auto p = pred.select(1, h - 1), t = y.select(1, h - 1);
    auto valid = (t != 0).to(torch::kFloat);
    // FACT: t = torch.rand(4, 5); v = (t != 0).to(torch.float32); v /= v.mean(); assert is_copy_of(v, t)
    valid /= valid.mean(); // LOOKALIKE: tensor-alias-then-mutate -- the comparison is a new bool tensor and to(kFloat) copies it
    auto abs_err = (p - t).abs() * valid;
    m.mae.push_back(abs_err.mean().item<double>()); // LOOKALIKE: tensor-sync-in-loop -- once per horizon after the pass over the data, and kept as data
    m.rmse.push_back(((p - t).pow(2) * valid).mean().sqrt().item<double>());
    m.mape.push_back((abs_err / t.abs().clamp_min(1.0)).mean().item<double>() * 100.0);
  }
  model->train();
  return m;
}

void train(Stgcn &model, const TrafficWindows &data, std::vector<int64_t> train_starts, const std::vector<int64_t> &val_starts,
           const torch::Tensor &sensor_ok, const StgcnConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  MaskedMae loss_fn(sensor_ok, device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));
  const auto &scaler = data.scaler();
  auto mean = scaler.mean.to(device), stdv = scaler.std.to(device);
  // Later horizons are harder: weigh them up so the 60-minute error is not neglected.
  auto horizon_w = torch::linspace(1.0, 2.0, cfg.n_pred).view({1, -1, 1});
  std::mt19937 rng(0);
  double best = std::numeric_limits<double>::infinity();
  std::vector<torch::Tensor> best_state;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::shuffle(train_starts.begin(), train_starts.end(), rng);
    double epoch_loss = 0;
    int64_t batches = 0;
    for (size_t i = 0; i < train_starts.size(); i += static_cast<size_t>(cfg.batch)) {
      auto batch = data.batch(train_starts, i, cfg.batch);
      auto x = batch.x.to(device), y = batch.y.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto pred = model->forward(x).squeeze(2) * stdv + mean;
      auto loss = (loss_fn.per_point(pred, y) * horizon_w).mean(); // EXPECT: tensor-device-mismatch -- the horizon weights were made on the host, the errors are on the GPU
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step only to sum the loss
      ++batches;
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " masked mae " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    const auto val = evaluate(model, data, val_starts, scaler, device, cfg);
    std::cout << "epoch " << epoch << " train " << epoch_loss / static_cast<double>(std::max<int64_t>(batches, 1)) << " val mae@60 "
              << val.mae.back() << "\n";
    if (val.mae.back() < best) {
      best = val.mae.back();
      best_state.clear();
      for (const auto &p : model->parameters())
        best_state.push_back(p.detach().clone()); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- every snapshot is kept, and training moves the weights on
    }
  }
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    params[i].copy_(best_state[i]); // LOOKALIKE: tensor-inplace-on-leaf -- restoring the best weights under NoGradGuard
}
