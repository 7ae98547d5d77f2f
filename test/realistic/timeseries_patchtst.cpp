// PatchTST (Nie et al., ICLR 2023): channel-independent patch transformer for long-horizon
// multivariate forecasting.
//
//   [B, L, C] --RevIN--> patches [B*C, P, patch_len] --W_P + pos--> encoder [B*C, P, D]
//   --flatten head--> [B, C, pred_len] --> [B, pred_len, C] --RevIN^-1--> forecast
//
// Every channel is an independent sequence that shares the transformer weights, so the
// batch and channel dims are merged before the encoder and split again for the head.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct PatchTSTConfig {
  int64_t n_vars = 7;
  int64_t seq_len = 336;
  int64_t pred_len = 96;
  int64_t patch_len = 16;
  int64_t stride = 8;
  int64_t d_model = 128;
  int64_t n_heads = 16;
  int64_t d_ff = 256;
  int64_t n_layers = 3;
  double dropout = 0.2;
  double head_dropout = 0.0;

  int64_t num_patches() const { return (seq_len - patch_len) / stride + 1; }
};

// Reversible instance normalisation. The statistics of the last input are kept so that the
// forecast can be mapped back to the scale of its own window.
struct RevINImpl : nn::Module {
  explicit RevINImpl(int64_t n_vars, double eps = 1e-5) : eps_(eps) {
    weight_ = register_parameter("weight", torch::ones({n_vars}));
    bias_ = register_parameter("bias", torch::zeros({n_vars}));
  }

  torch::Tensor normalize(const torch::Tensor& x_in) {  // [B, L, C]
    mean_ = x_in.mean({1}, /*keepdim=*/true).detach();
    stdev_ = torch::sqrt(x_in.var({1}, /*unbiased=*/false, /*keepdim=*/true) + eps_).detach();
    torch::Tensor x = x_in;
    // FACT: w = torch.randn(1, 6, 3); x = w; x.sub_(w.mean(1, keepdim=True)); assert shares_storage(x, w) and abs(w.mean().item()) < 1e-5
    x.sub_(mean_).div_(stdev_);  // EXPECT: tensor-alias-then-mutate
    return x * weight_ + bias_;
  }

  torch::Tensor denormalize(const torch::Tensor& y) {  // [B, pred_len, C]
    auto out = (y - bias_) / (weight_ + eps_ * eps_);
    auto scale = stdev_.expand_as(out);
    // FACT: s = torch.rand(2, 1, 3); assert raises(lambda: s.expand(2, 5, 3).clamp_min_(1e-5), "more than one element of the written-to tensor")
    scale.clamp_min_(eps_);  // EXPECT: tensor-inplace-on-expanded
    // FACT: o = torch.randn(2, 5, 3); s = torch.rand(2, 1, 3).expand_as(o); o.mul_(s); assert s.stride(1) == 0
    out.mul_(scale);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded scale is only read
    return out + mean_;
  }

  double eps_;
  torch::Tensor weight_, bias_;
  torch::Tensor mean_, stdev_;
};
TORCH_MODULE(RevIN);

// [B, L, C] -> [B * C, P, patch_len]
torch::Tensor make_patches(const torch::Tensor& x, const PatchTSTConfig& cfg) {
  const int64_t b = x.size(0);
  const int64_t c = x.size(2);
  auto per_channel = x.permute({0, 2, 1});                                    // [B, C, L]
  auto patches = per_channel.unfold(-1, cfg.patch_len, cfg.stride);           // [B, C, P, patch_len]
  // FACT: x = torch.randn(2, 20, 3).permute(0, 2, 1).unfold(-1, 4, 2); assert is_copy_of(x.reshape(6, x.size(2), 4), x)
  return patches.reshape({b * c, patches.size(2), cfg.patch_len});  // EXPECT: tensor-reshape-non-contiguous
}

struct PatchAttentionImpl : nn::Module {
  PatchAttentionImpl(int64_t d_model, int64_t n_heads, double dropout)
      : n_heads_(n_heads), head_dim_(d_model / n_heads),
        qkv(register_module("qkv", nn::Linear(d_model, 3 * d_model))),
        proj(register_module("proj", nn::Linear(d_model, d_model))),
        drop(register_module("drop", nn::Dropout(dropout))) {}

  torch::Tensor forward(const torch::Tensor& x) {  // [N, P, D]
    const int64_t n = x.size(0);
    const int64_t p = x.size(1);
    const int64_t d = x.size(2);
    // FACT: y = torch.randn(4, 5, 24); assert is_view_of(y.view(4, 5, 3, 2, 4), y)
    auto heads = qkv(x).view({n, p, 3, n_heads_, head_dim_}).permute({2, 0, 3, 1, 4});  // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous; the view only splits its last dim
    auto q = heads[0];
    auto k = heads[1];
    auto v = heads[2];
    auto scores = torch::matmul(q, k.transpose(-2, -1));
    scores.mul_(1.0 / std::sqrt(static_cast<double>(head_dim_)));  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves q and k, not the scores
    auto attn = drop(torch::softmax(scores, -1));
    auto ctx = torch::matmul(attn, v);  // [N, H, P, Dh]
    // FACT: c = torch.randn(2, 4, 5, 3); m = c.transpose(1, 2).contiguous(); assert is_copy_of(m, c) and is_view_of(m.view(2, 5, 12), m)
    auto merged = ctx.transpose(1, 2).contiguous().view({n, p, d});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() copies before the view
    return proj(merged);
  }

  int64_t n_heads_, head_dim_;
  nn::Linear qkv, proj;
  nn::Dropout drop;
};
TORCH_MODULE(PatchAttention);

struct EncoderLayerImpl : nn::Module {
  explicit EncoderLayerImpl(const PatchTSTConfig& cfg)
      : attn(register_module("attn", PatchAttention(cfg.d_model, cfg.n_heads, cfg.dropout))),
        ff1(register_module("ff1", nn::Linear(cfg.d_model, cfg.d_ff))),
        ff2(register_module("ff2", nn::Linear(cfg.d_ff, cfg.d_model))),
        norm1(register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})))),
        norm2(register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})))),
        drop(register_module("drop", nn::Dropout(cfg.dropout))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = norm1(x + drop(attn(x)));
    auto h = ff2(drop(F::gelu(ff1(x))));
    return norm2(x + drop(h));
  }

  PatchAttention attn;
  nn::Linear ff1, ff2;
  nn::LayerNorm norm1, norm2;
  nn::Dropout drop;
};
TORCH_MODULE(EncoderLayer);

struct PatchTSTImpl : nn::Module {
  explicit PatchTSTImpl(const PatchTSTConfig& cfg) : cfg_(cfg) {
    revin = register_module("revin", RevIN(cfg.n_vars));
    w_p = register_module("w_p", nn::Linear(cfg.patch_len, cfg.d_model));
    auto pos = torch::empty({cfg.num_patches(), cfg.d_model});
    pos.uniform_(-0.02, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- written before register_parameter makes it require grad
    w_pos = register_parameter("w_pos", pos);
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      layers.push_back(register_module("layer" + std::to_string(i), EncoderLayer(cfg)));
    }
    drop = register_module("drop", nn::Dropout(cfg.dropout));
    head_drop = register_module("head_drop", nn::Dropout(cfg.head_dropout));
    head = register_module("head", nn::Linear(cfg.d_model * cfg.num_patches(), cfg.pred_len));
  }

  torch::Tensor forward(const torch::Tensor& x) {  // [B, L, C]
    const int64_t b = x.size(0);
    const int64_t c = x.size(2);
    auto patches = make_patches(revin->normalize(x), cfg_);
    auto z = drop(w_p(patches) + w_pos);
    for (auto& layer : layers) z = layer(z);

    // FACT: z = torch.randn(6, 7, 16); assert is_view_of(z.reshape(2, 3, 7, 16), z)
    auto per_var = z.reshape({b, c, z.size(1), z.size(2)});  // LOOKALIKE: tensor-reshape-non-contiguous -- splitting the merged dim of a contiguous output is a view
    auto zt = per_var.permute({0, 1, 3, 2});  // [B, C, D, P]
    // FACT: z = torch.randn(2, 3, 7, 16).permute(0, 1, 3, 2); assert is_copy_of(z.flatten(2), z)
    auto flat = zt.flatten(2);  // EXPECT: tensor-reshape-non-contiguous
    auto y = head(head_drop(flat));  // [B, C, pred_len]
    return revin->denormalize(y.permute({0, 2, 1}));
  }

  PatchTSTConfig cfg_;
  RevIN revin{nullptr};
  nn::Linear w_p{nullptr}, head{nullptr};
  torch::Tensor w_pos;
  std::vector<EncoderLayer> layers;
  nn::Dropout drop{nullptr}, head_drop{nullptr};
};
TORCH_MODULE(PatchTST);

// Seasonal synthetic series with trend; returns (observed, clean), both [T, C].
std::pair<torch::Tensor, torch::Tensor> make_series(int64_t length, int64_t n_vars) {
  auto steps = torch::arange(length, torch::kFloat);
  auto trend = steps.clone();  // EXPECT: tensor-unnecessary-clone
  trend.mul_(0.002);
  auto periods = torch::linspace(24.0, 168.0, n_vars);
  auto raw = torch::sin(2.0 * M_PI * steps.unsqueeze(0) / periods.unsqueeze(1)) + trend;  // [C, T]
  // FACT: raw = torch.randn(3, 50); s = raw.t().contiguous(); assert is_copy_of(s, raw)
  auto observed = raw.t().contiguous();
  observed.add_(0.1 * torch::randn_like(observed));  // LOOKALIKE: tensor-alias-then-mutate -- contiguous() of the transposed signal is a copy
  return {observed, raw.t()};
}

void train(PatchTST& model, const torch::Tensor& train_part, const PatchTSTConfig& cfg, int64_t steps,
           int64_t batch_size, torch::Device device) {
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4).weight_decay(1e-4));
  const int64_t max_start = train_part.size(0) - cfg.seq_len - cfg.pred_len;
  torch::Tensor smoothed = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t step = 0; step < steps; ++step) {
    auto starts = torch::randint(0, max_start, {batch_size}, torch::kLong);
    auto acc = starts.accessor<int64_t, 1>();
    std::vector<torch::Tensor> xs, ys;
    for (int64_t i = 0; i < batch_size; ++i) {
      xs.push_back(train_part.narrow(0, acc[i], cfg.seq_len));
      ys.push_back(train_part.narrow(0, acc[i] + cfg.seq_len, cfg.pred_len));
    }
    auto bx = torch::stack(xs).to(device);
    auto by = torch::stack(ys).to(device);

    auto loss = F::mse_loss(model->forward(bx), by);
    opt.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();

    smoothed = 0.98 * smoothed + 0.02 * loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- only the detached value is kept
    if (step % 200 == 0) {
      std::cout << "step " << step << " mse " << smoothed.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- logged every 200 steps only
    }
  }
}

struct RollingMetrics {
  double mse = 0.0;
  double scaled_mae = 0.0;
  torch::Tensor forecasts;  // [num_windows, pred_len, C]
};

// Walk forward over the test part of a long series with a fixed hop, one forecast per window.
RollingMetrics rolling_evaluate(PatchTST& model, const torch::Tensor& series, const PatchTSTConfig& cfg,
                                int64_t test_start, int64_t hop) {
  torch::NoGradGuard no_grad;
  model->eval();
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);

  auto scale = series.narrow(0, 0, test_start).std(0).clamp_min(1e-6);  // per-channel scale of the training part
  double mse_sum = 0.0;
  double mae_sum = 0.0;
  int64_t windows = 0;
  std::vector<torch::Tensor> forecasts;
  const int64_t total = series.size(0);
  for (int64_t t = test_start - cfg.seq_len; t + cfg.seq_len + cfg.pred_len <= total; t += hop) {
    auto window = series.narrow(0, t, cfg.seq_len).unsqueeze(0).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new window every iteration
    auto target = series.narrow(0, t + cfg.seq_len, cfg.pred_len).unsqueeze(0).to(device);
    auto pred = model->forward(window);
    auto err = pred - target;
    mse_sum += err.pow(2).mean().item<double>();  // EXPECT: tensor-sync-in-loop
    auto scaled = err.abs() / scale.to(device);  // EXPECT: tensor-clone-in-loop
    mae_sum += scaled.mean().item<double>();  // EXPECT: tensor-sync-in-loop
    forecasts.push_back(pred.squeeze(0).cpu());  // LOOKALIKE: tensor-graph-kept-across-iterations, tensor-sync-in-loop -- no graph under NoGradGuard; the host copy is kept as data
    ++windows;
  }
  RollingMetrics m;
  if (windows > 0) {
    m.mse = mse_sum / static_cast<double>(windows);
    m.scaled_mae = mae_sum / static_cast<double>(windows);
    m.forecasts = torch::stack(forecasts);
  }
  return m;
}

int main() {
  torch::manual_seed(7);
  PatchTSTConfig cfg;
  cfg.n_vars = 7;
  auto [observed, clean] = make_series(8000, cfg.n_vars);
  const int64_t split = 6000;

  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  PatchTST model(cfg);
  model->to(device);
  train(model, observed.narrow(0, 0, split), cfg, /*steps=*/2000, /*batch_size=*/32, device);

  auto metrics = rolling_evaluate(model, observed, cfg, split, /*hop=*/cfg.pred_len);
  std::cout << "rolling MSE " << metrics.mse << " scaled MAE " << metrics.scaled_mae << " over "
            << metrics.forecasts.size(0) << " windows\n";
  auto first_window = clean.narrow(0, split, cfg.pred_len);
  auto clean_mse = F::mse_loss(metrics.forecasts[0], first_window);
  std::cout << "first window error against the clean signal " << clean_mse.item<double>() << "\n";
  return 0;
}
