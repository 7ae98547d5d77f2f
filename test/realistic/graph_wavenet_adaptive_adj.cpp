// Graph WaveNet (Wu et al., IJCAI 2019) for traffic speed forecasting.
// Dilated causal convolutions along time, diffusion graph convolutions over the
// sensor graph, and a self-adaptive adjacency learned from two node embeddings.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace gwn {

struct Config {
  int64_t num_nodes = 207, in_dim = 2, seq_len = 12, horizon = 12;
  int64_t residual_channels = 32, dilation_channels = 32, skip_channels = 256, end_channels = 512;
  int64_t blocks = 4, layers = 2, kernel_size = 2, embed_dim = 10, diffusion_order = 2;
  double dropout = 0.3;
  double adj_threshold = 0.0;  // > 0 prunes weak learned edges
  double lr = 1e-3, weight_decay = 1e-4, clip = 5.0;
  int64_t epochs = 100, batch_size = 64, log_every = 50;
};

struct StandardScaler {
  torch::Tensor mean, std;
  void fit(const torch::Tensor& x) { mean = x.mean(); std = x.std(); }
  torch::Tensor inverse_transform(const torch::Tensor& x) const {
    return x * std + mean;  // LOOKALIKE: tensor-device-mismatch -- mean and std are 0-dim, which PyTorch lets mix with CUDA tensors
  }
};

struct Split { torch::Tensor x, y; };

// The HDF5 export hands us readings as doubles, row-major by time step.
torch::Tensor load_speeds(const std::vector<double>& raw, int64_t steps, int64_t nodes) {
  auto speeds = torch::empty({steps, nodes}, torch::kFloat32);
  auto src = torch::from_blob(const_cast<double*>(raw.data()), {steps, nodes}, torch::kFloat64);
  speeds.copy_(src);  // EXPECT: tensor-copy-narrowing
  return speeds;
}

// Random-walk transition matrix D^-1 A used as a fixed diffusion support.
torch::Tensor transition(const torch::Tensor& adj) {
  auto d_inv = adj.sum(1).reciprocal();
  d_inv.masked_fill_(torch::isinf(d_inv), 0.0);
  return d_inv.unsqueeze(1) * adj;
}

Split make_windows(const torch::Tensor& speeds, const torch::Tensor& tod, const StandardScaler& scaler,
                   const Config& cfg) {
  const int64_t n = speeds.size(0) - cfg.seq_len - cfg.horizon + 1;
  // FACT: s=torch.randn(30,5); assert s.to(torch.float32) is s and shares_storage(s.to(torch.float32), s)
  auto norm = speeds.to(torch::kFloat32);
  norm.sub_(scaler.mean).div_(scaler.std);  // EXPECT: tensor-alias-then-mutate
  auto feats = torch::stack({norm, tod.unsqueeze(1).expand_as(norm)}, -1);
  std::vector<torch::Tensor> xs, ys;
  for (int64_t t = 0; t < n; ++t) {
    xs.push_back(feats.narrow(0, t, cfg.seq_len));
    ys.push_back(speeds.narrow(0, t + cfg.seq_len, cfg.horizon));
  }
  return {torch::stack(xs), torch::stack(ys)};
}

// One diffusion step: every (batch, channel, time) row of x times the support.
torch::Tensor nconv(const torch::Tensor& x, const torch::Tensor& a) {
  const auto B = x.size(0), C = x.size(1), N = x.size(2), L = x.size(3);
  // FACT: x=torch.randn(2,3,5,4); assert is_copy_of(x.permute(0,1,3,2).reshape(-1,5), x)
  auto rows = x.permute({0, 1, 3, 2}).reshape({B * C * L, N});  // EXPECT: tensor-reshape-non-contiguous
  auto out = torch::mm(rows, a);
  return out.view({B, C, L, N}).permute({0, 1, 3, 2});
}

struct GraphConvImpl : torch::nn::Module {
  GraphConvImpl(int64_t c_in, int64_t c_out, int64_t support_len, int64_t order, double dropout)
      : order_(order), dropout_(dropout) {
    mlp_ = register_module(
        "mlp", torch::nn::Conv2d(torch::nn::Conv2dOptions((order * support_len + 1) * c_in, c_out, 1)));
  }

  torch::Tensor forward(const torch::Tensor& x, const std::vector<torch::Tensor>& supports) {
    std::vector<torch::Tensor> out{x};
    for (const auto& a : supports) {
      auto x1 = nconv(x, a);
      out.push_back(x1);
      for (int64_t k = 2; k <= order_; ++k) {
        x1 = nconv(x1, a);
        out.push_back(x1);
      }
    }
    auto h = mlp_(torch::cat(out, 1));
    return torch::dropout(h, dropout_, is_training());
  }

  torch::nn::Conv2d mlp_{nullptr};
  int64_t order_;
  double dropout_;
};
TORCH_MODULE(GraphConv);

struct GWNetImpl : torch::nn::Module {
  GWNetImpl(const Config& cfg, const std::vector<torch::Tensor>& supports, torch::Tensor geo_mask)
      : cfg_(cfg), geo_mask_(std::move(geo_mask)) {
    for (size_t i = 0; i < supports.size(); ++i)
      supports_.push_back(register_buffer("support" + std::to_string(i), supports[i]));
    auto conv1x1 = [](int64_t in, int64_t out) { return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1)); };
    start_conv_ = register_module("start_conv", conv1x1(cfg.in_dim, cfg.residual_channels));
    nodevec1_ = register_parameter("nodevec1", torch::randn({cfg.num_nodes, cfg.embed_dim}));
    nodevec2_ = register_parameter("nodevec2", torch::randn({cfg.embed_dim, cfg.num_nodes}));

    const int64_t support_len = static_cast<int64_t>(supports.size()) + 1;
    int64_t idx = 0;
    for (int64_t b = 0; b < cfg.blocks; ++b) {
      int64_t dilation = 1;
      for (int64_t l = 0; l < cfg.layers; ++l, ++idx) {
        auto dil = torch::nn::Conv2dOptions(cfg.residual_channels, cfg.dilation_channels, {1, cfg.kernel_size})
                       .dilation({1, dilation});
        const auto tag = std::to_string(idx);
        filter_convs_.push_back(register_module("filter" + tag, torch::nn::Conv2d(dil)));
        gate_convs_.push_back(register_module("gate" + tag, torch::nn::Conv2d(dil)));
        skip_convs_.push_back(register_module("skip" + tag, conv1x1(cfg.dilation_channels, cfg.skip_channels)));
        bn_.push_back(register_module("bn" + tag, torch::nn::BatchNorm2d(cfg.residual_channels)));
        gconv_.push_back(register_module(
            "gconv" + tag,
            GraphConv(cfg.dilation_channels, cfg.residual_channels, support_len, cfg.diffusion_order, cfg.dropout)));
        receptive_field_ += dilation * (cfg.kernel_size - 1);
        dilation *= 2;
      }
    }
    end_conv_1_ = register_module("end_conv_1", conv1x1(cfg.skip_channels, cfg.end_channels));
    end_conv_2_ = register_module("end_conv_2", conv1x1(cfg.end_channels, cfg.horizon));
    for (auto& conv : skip_convs_)
      torch::nn::init::kaiming_normal_(conv->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions write under their own NoGradGuard
  }

  torch::Tensor adaptive_adjacency() {
    auto adp = torch::softmax(torch::relu(torch::mm(nodevec1_, nodevec2_)), 1);
    if (cfg_.adj_threshold > 0.0) {
      // FACT: e=torch.randn(5,3,requires_grad=True); assert backward_fails(lambda: (lambda a: (a.masked_fill_(a < 0.2, 0.0), a.sum().backward()))(torch.softmax(torch.relu(e @ e.t()), 1)))
      adp.masked_fill_(adp < cfg_.adj_threshold, 0.0);  // EXPECT: tensor-inplace-on-saved
    }
    return adp;
  }

  torch::Tensor forward(const torch::Tensor& input) {
    auto x = input.transpose(1, 3);
    if (x.size(3) < receptive_field_) {
      namespace F = torch::nn::functional;
      x = F::pad(x, F::PadFuncOptions({receptive_field_ - x.size(3), 0, 0, 0}));
    }
    x = start_conv_(x);
    auto adp = adaptive_adjacency();
    if (geo_mask_.defined()) adp = adp * geo_mask_;  // EXPECT: tensor-device-mismatch
    std::vector<torch::Tensor> supports = supports_;
    supports.push_back(adp);
    torch::Tensor skip;
    for (size_t i = 0; i < filter_convs_.size(); ++i) {
      auto residual = x;
      auto filter = torch::tanh(filter_convs_[i](residual));
      auto gate = torch::sigmoid(gate_convs_[i](residual));
      x = filter * gate;
      auto s = skip_convs_[i](x);
      skip = skip.defined() ? s + skip.narrow(3, skip.size(3) - s.size(3), s.size(3)) : s;
      x = gconv_[i](x, supports);
      // FACT: r=torch.randn(2,4,3,8); x=r; x=torch.tanh(x)*torch.sigmoid(x); x.add_(r); assert is_copy_of(x, r)
      x.add_(residual.narrow(3, residual.size(3) - x.size(3), x.size(3)));  // LOOKALIKE: tensor-alias-then-mutate -- x was rebound to the graph-conv output, residual is not written // LOOKALIKE: tensor-inplace-on-saved -- conv and dropout do not save their output
      x = bn_[i](x);
    }
    x = torch::relu(skip);
    x = torch::relu(end_conv_1_(x));
    return end_conv_2_(x);
  }

  Config cfg_;
  torch::Tensor geo_mask_;
  std::vector<torch::Tensor> supports_;
  torch::Tensor nodevec1_, nodevec2_;
  torch::nn::Conv2d start_conv_{nullptr}, end_conv_1_{nullptr}, end_conv_2_{nullptr};
  std::vector<torch::nn::Conv2d> filter_convs_, gate_convs_, skip_convs_;
  std::vector<torch::nn::BatchNorm2d> bn_;
  std::vector<GraphConv> gconv_;
  int64_t receptive_field_ = 1;
};
TORCH_MODULE(GWNet);

torch::Tensor masked_mae(const torch::Tensor& pred, const torch::Tensor& target, double null_val = 0.0) {
  auto mask = (target != null_val).to(torch::kFloat32);
  mask = mask / mask.mean();
  mask = torch::where(torch::isnan(mask), torch::zeros_like(mask), mask);
  auto loss = torch::abs(pred - target) * mask;
  loss = torch::where(torch::isnan(loss), torch::zeros_like(loss), loss);
  return loss.mean();
}

double evaluate(GWNet& model, const Split& split, const StandardScaler& scaler, const Config& cfg,
                torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t n = split.x.size(0);
  double mae_sum = 0.0;
  int64_t batches = 0;
  for (int64_t start = 0; start < n; start += cfg.batch_size, ++batches) {
    const int64_t len = std::min(cfg.batch_size, n - start);
    auto x = split.x.narrow(0, start, len).to(device);
    auto y = split.y.narrow(0, start, len).to(device).transpose(1, 2);
    auto out = model->forward(x);
    // FACT: o=torch.randn(2,12,5,1); assert is_view_of(o.transpose(1,3).reshape(2,5,12), o)
    auto pred = scaler.inverse_transform(out.transpose(1, 3).reshape({len, cfg.num_nodes, cfg.horizon}));  // LOOKALIKE: tensor-reshape-non-contiguous -- the only dim moved has size 1, so this is a view
    mae_sum += masked_mae(pred, y).item<double>();  // EXPECT: tensor-sync-in-loop
  }
  return mae_sum / static_cast<double>(batches);
}

void train(GWNet& model, const Split& train_set, const Split& val_set, const StandardScaler& scaler,
           const torch::Tensor& sensor_ok, const Config& cfg, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));
  const int64_t n = train_set.x.size(0);
  double best_val = std::numeric_limits<double>::infinity();
  std::map<std::string, torch::Tensor> best_state;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto perm = torch::randperm(n, torch::kLong);
    std::vector<torch::Tensor> batch_losses;
    for (int64_t start = 0, step = 0; start < n; start += cfg.batch_size, ++step) {
      auto idx = perm.narrow(0, start, std::min(cfg.batch_size, n - start));
      auto x = train_set.x.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto y = train_set.y.index_select(0, idx).to(device);
      auto ok = sensor_ok.to(device);  // EXPECT: tensor-clone-in-loop

      opt.zero_grad();
      auto pred = scaler.inverse_transform(model->forward(x).squeeze(-1));
      auto loss = masked_mae(pred * ok, y * ok);
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();

      batch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      if (step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " iter " << step << " train MAE " << loss.item<double>() << '\n';  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps for the console
    }
    const double train_mae = torch::stack(batch_losses).mean().item<double>();
    const double val_mae = evaluate(model, val_set, scaler, cfg, device);
    std::cout << "epoch " << epoch << " train " << train_mae << " val " << val_mae << '\n';
    if (val_mae < best_val) {
      best_val = val_mae;
      for (const auto& p : model->named_parameters())
        best_state[p.key()] = p.value().detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- a snapshot; the live parameters keep changing
    }
  }

  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters())
    p.value().copy_(best_state.at(p.key()));  // LOOKALIKE: tensor-inplace-on-leaf -- restoring the best weights under NoGradGuard
}

// Flat per-request forecast for the serving endpoint.
torch::Tensor forecast(GWNet& model, const torch::Tensor& history, const StandardScaler& scaler) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto out = scaler.inverse_transform(model->forward(history));
  // FACT: o=torch.randn(2,12,5,1); assert raises(lambda: o.transpose(1,3).view(2,-1), "view size is not compatible")
  return out.transpose(1, 3).view({history.size(0), -1});  // EXPECT: tensor-view-non-contiguous
}

void export_adjacency(GWNet& model, const std::string& path) {
  torch::NoGradGuard no_grad;
  auto adj = model->adaptive_adjacency().detach().cpu();
  // FACT: a=torch.rand(5,5); assert raises(lambda: a.add_(a.t()), "single memory location")
  adj.add_(adj.t()).mul_(0.5);  // EXPECT: tensor-inplace-overlap // LOOKALIKE: tensor-inplace-on-detached -- recomputed just for the file, no backward reads it
  std::ofstream out(path);
  auto acc = adj.accessor<float, 2>();
  for (int64_t i = 0; i < adj.size(0); ++i)
    for (int64_t j = 0; j < adj.size(1); ++j)
      if (acc[i][j] > 1e-3f) out << i << ',' << j << ',' << acc[i][j] << '\n';
}

}  // namespace gwn

int main() {
  using namespace gwn;
  Config cfg;
  torch::manual_seed(7);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  const int64_t steps = 4032;
  std::vector<double> raw(static_cast<size_t>(steps * cfg.num_nodes));
  for (int64_t t = 0; t < steps; ++t)
    for (int64_t v = 0; v < cfg.num_nodes; ++v)
      raw[t * cfg.num_nodes + v] = 55.0 + 10.0 * std::sin(2.0 * M_PI * (t % 288) / 288.0 + 0.03 * v);
  auto speeds = load_speeds(raw, steps, cfg.num_nodes);
  auto tod = torch::arange(steps, torch::kFloat32).fmod(288.0).div(288.0);

  const int64_t n_train = steps * 7 / 10, n_val = steps / 10;
  auto sensor_ok = (speeds.narrow(0, 0, n_train) > 0).all(0).to(torch::kFloat32);
  StandardScaler scaler;
  scaler.fit(speeds.narrow(0, 0, n_train));
  auto data = make_windows(speeds, tod, scaler, cfg);

  auto coords = torch::rand({cfg.num_nodes, 2});
  auto dist = torch::cdist(coords, coords);
  auto adj = torch::exp(-(dist / dist.std()).pow(2));
  adj.masked_fill_(adj < 0.1, 0.0);
  std::vector<torch::Tensor> supports{transition(adj), transition(adj.t())};
  GWNet model(cfg, supports, (adj > 0).to(torch::kFloat32));
  model->to(device);

  auto part = [&](int64_t from, int64_t len) { return Split{data.x.narrow(0, from, len), data.y.narrow(0, from, len)}; };
  auto train_set = part(0, n_train), val_set = part(n_train, n_val);
  auto test_set = part(n_train + n_val, data.x.size(0) - n_train - n_val);
  train(model, train_set, val_set, scaler, sensor_ok, cfg, device);
  std::cout << "test MAE " << evaluate(model, test_set, scaler, cfg, device) << '\n';

  std::cout << "served " << forecast(model, test_set.x.narrow(0, 0, 4).to(device), scaler).size(1) << " values\n";
  export_adjacency(model, "adaptive_adj.csv");
  return 0;
}
