// The gating and variable-selection half of a Temporal Fusion Transformer (Lim et al. 2021) for
// multi-horizon retail demand: gated residual networks with GLU gates, variable selection over the
// static (store, item family, region), past-observed and known-future inputs, an LSTM
// encoder-decoder seeded from the static context, static enrichment, and a quantile loss summed
// over the horizon. The interpretable attention block lives in its own file. The median forecast
// goes into the integer unit table the replenishment job reads.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

namespace nn = torch::nn;

struct TFTConfig {
  std::vector<int64_t> static_cardinalities{1200, 45, 9}; // store, item family, region
  int64_t n_past = 6, n_future = 4, d_model = 64, horizon = 28;
  std::vector<double> quantiles{0.1, 0.5, 0.9};
  double dropout = 0.1, lr = 1e-3, clip = 1.0;
  int64_t epochs = 30, log_every = 50;
};

// One batch of series windows as the feature pipeline writes them.
struct TFTBatch {
  torch::Tensor static_ids; // [B, S] int64
  torch::Tensor past;       // [B, V_past, T_enc]: one row per observed variable (sales, price, promo...)
  torch::Tensor future;     // [B, T_enc + H, V_future]: calendar inputs known in advance
  torch::Tensor target;     // [B, H] scaled sales
  torch::Tensor series;     // [B] int64 row of each series in the scale table
};

// GLU(x) = sigmoid(W4 x + b4) * (W5 x + b5)
struct GatedLinearUnitImpl : nn::Module {
  GatedLinearUnitImpl(int64_t in, int64_t out) {
    gate_ = register_module("gate", nn::Linear(in, out));
    value_ = register_module("value", nn::Linear(in, out));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto g = torch::sigmoid(gate_(x));
    // FACT: l = torch.nn.Linear(4, 4); v = torch.nn.Linear(4, 4); x = torch.randn(3, 4); g = torch.sigmoid(l(x)); g.mul_(v(x)); assert backward_fails(lambda: g.sum().backward())
    g.mul_(value_(x)); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its output for backward, and the gate is overwritten with the gated value
    return g;
  }
  nn::Linear gate_{nullptr}, value_{nullptr};
};
TORCH_MODULE(GatedLinearUnit);

// GRN(a, c) = LayerNorm(skip(a) + GLU(W1 ELU(W2 a + W3 c + b2) + b1))
struct GatedResidualNetworkImpl : nn::Module {
  GatedResidualNetworkImpl(int64_t in, int64_t hidden, int64_t out, int64_t ctx, double dropout) {
    fc1_ = register_module("fc1", nn::Linear(in, hidden));
    fc2_ = register_module("fc2", nn::Linear(hidden, hidden));
    if (ctx > 0)
      ctx_ = register_module("ctx", nn::Linear(nn::LinearOptions(ctx, hidden).bias(false)));
    if (in != out)
      skip_ = register_module("skip", nn::Linear(in, out));
    glu_ = register_module("glu", GatedLinearUnit(hidden, out));
    norm_ = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({out})));
    drop_ = register_module("drop", nn::Dropout(dropout));
  }
  torch::Tensor forward(const torch::Tensor &a, const torch::Tensor &c = {}) {
    auto residual = skip_.is_empty() ? a : skip_(a);
    auto h = fc1_(a);
    if (c.defined() && !ctx_.is_empty()) {
      auto cc = ctx_(c);
      while (cc.dim() < h.dim())
        cc = cc.unsqueeze(-2); // a static context broadcast over time
      // FACT: l = torch.nn.Linear(4, 5); c = torch.nn.Linear(3, 5, bias=False); h = l(torch.randn(2, 4)); h.add_(c(torch.randn(2, 3))); torch.nn.functional.elu(h).sum().backward(); assert l.weight.grad is not None
      h.add_(cc); // LOOKALIKE: tensor-inplace-on-saved -- a Linear does not save its output: elu reads h after the add
    }
    h = drop_(fc2_(torch::elu(h)));
    return norm_(residual + glu_(h));
  }
  nn::Linear fc1_{nullptr}, fc2_{nullptr}, ctx_{nullptr}, skip_{nullptr};
  GatedLinearUnit glu_{nullptr};
  nn::LayerNorm norm_{nullptr};
  nn::Dropout drop_{nullptr};
};
TORCH_MODULE(GatedResidualNetwork);

// x [..., V, D] per-variable embeddings -> ([..., D] weighted sum, [..., V] selection weights)
struct VariableSelectionImpl : nn::Module {
  VariableSelectionImpl(int64_t n_vars, int64_t d, int64_t ctx, double dropout) {
    selector_ = register_module("selector", GatedResidualNetwork(n_vars * d, d, n_vars, ctx, dropout));
    for (int64_t v = 0; v < n_vars; ++v)
      per_var_.push_back(register_module("var" + std::to_string(v), GatedResidualNetwork(d, d, d, 0, dropout)));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x, const torch::Tensor &ctx = {}) {
    // FACT: f = torch.randn(2, 7, 3, 4); n = f.narrow(1, 5, 2); assert not n.is_contiguous() and is_view_of(n.flatten(-2), f)
    auto flat = x.flatten(-2); // LOOKALIKE: tensor-reshape-non-contiguous -- merges only the variable and feature dims, adjacent in memory even in a time slice
    auto weights = torch::softmax(selector_->forward(flat, ctx), -1);
    std::vector<torch::Tensor> processed;
    for (size_t v = 0; v < per_var_.size(); ++v)
      processed.push_back(per_var_[v]->forward(x.select(-2, static_cast<int64_t>(v))));
    auto combined = (weights.unsqueeze(-1) * torch::stack(processed, -2)).sum(-2);
    return {combined, weights};
  }
  GatedResidualNetwork selector_{nullptr};
  std::vector<GatedResidualNetwork> per_var_;
};
TORCH_MODULE(VariableSelection);

struct TFTOutput {
  torch::Tensor quantiles;    // [B, H, Q]
  torch::Tensor past_weights; // [B, T_enc, V_past] variable selection weights
};

struct TemporalFusionImpl : nn::Module {
  explicit TemporalFusionImpl(const TFTConfig &cfg) : d_(cfg.d_model) {
    const auto d = cfg.d_model;
    for (size_t i = 0; i < cfg.static_cardinalities.size(); ++i)
      static_emb_.push_back(register_module("static_emb" + std::to_string(i), nn::Embedding(cfg.static_cardinalities[i], d)));
    past_w_ = register_parameter("past_w", torch::randn({cfg.n_past, d}) * 0.1);
    past_b_ = register_parameter("past_b", torch::zeros({cfg.n_past, d}));
    fut_w_ = register_parameter("fut_w", torch::randn({cfg.n_future, d}) * 0.1);
    fut_b_ = register_parameter("fut_b", torch::zeros({cfg.n_future, d}));
    const auto n_static = static_cast<int64_t>(cfg.static_cardinalities.size());
    static_vsn_ = register_module("static_vsn", VariableSelection(n_static, d, 0, cfg.dropout));
    past_vsn_ = register_module("past_vsn", VariableSelection(cfg.n_past, d, d, cfg.dropout));
    future_vsn_ = register_module("future_vsn", VariableSelection(cfg.n_future, d, d, cfg.dropout));
    ctx_select_ = register_module("ctx_select", GatedResidualNetwork(d, d, d, 0, cfg.dropout));
    ctx_enrich_ = register_module("ctx_enrich", GatedResidualNetwork(d, d, d, 0, cfg.dropout));
    ctx_h_ = register_module("ctx_h", GatedResidualNetwork(d, d, d, 0, cfg.dropout));
    ctx_c_ = register_module("ctx_c", GatedResidualNetwork(d, d, d, 0, cfg.dropout));
    encoder_ = register_module("encoder", nn::LSTM(nn::LSTMOptions(d, d).batch_first(true)));
    decoder_ = register_module("decoder", nn::LSTM(nn::LSTMOptions(d, d).batch_first(true)));
    post_lstm_ = register_module("post_lstm", GatedLinearUnit(d, d));
    post_norm_ = register_module("post_norm", nn::LayerNorm(nn::LayerNormOptions({d})));
    enrich_ = register_module("enrich", GatedResidualNetwork(d, d, d, d, cfg.dropout));
    out_grn_ = register_module("out_grn", GatedResidualNetwork(d, d, d, 0, cfg.dropout));
    head_ = register_module("head", nn::Linear(d, static_cast<int64_t>(cfg.quantiles.size())));
  }

  TFTOutput forward(const torch::Tensor &static_ids, const torch::Tensor &past, const torch::Tensor &future) {
    const auto B = past.size(0), V = past.size(1), T = past.size(2);
    const auto H = future.size(1) - T;
    std::vector<torch::Tensor> s;
    for (size_t i = 0; i < static_emb_.size(); ++i)
      s.push_back(static_emb_[i](static_ids.select(1, static_cast<int64_t>(i))));
    auto static_vec = std::get<0>(static_vsn_->forward(torch::stack(s, 1)));
    auto c_sel = ctx_select_->forward(static_vec), c_enrich = ctx_enrich_->forward(static_vec);

    // the pipeline stores one row per variable: time-distribute to [B * T, V]
    // FACT: x = torch.randn(2, 3, 5); r = x.permute(0, 2, 1).reshape(10, 3); assert is_copy_of(r, x)
    auto steps = past.permute({0, 2, 1}).reshape({B * T, V}); // EXPECT: tensor-reshape-non-contiguous -- B and T of the permuted rows cannot merge: the whole past window is copied on every forward
    // FACT: s = torch.randn(10, 3).unsqueeze(-1) * torch.randn(3, 4) + torch.randn(3, 4); assert is_view_of(s.view(2, 5, 3, 4), s)
    auto past_emb = (steps.unsqueeze(-1) * past_w_ + past_b_).view({B, T, V, d_}); // LOOKALIKE: tensor-view-non-contiguous -- the affine embedding is a fresh contiguous tensor
    auto fut_emb = future.unsqueeze(-1) * fut_w_ + fut_b_;
    auto [past_sel, past_weights] = past_vsn_->forward(past_emb, c_sel);
    auto fut_sel = std::get<0>(future_vsn_->forward(fut_emb.narrow(1, T, H), c_sel));

    auto state = std::make_tuple(ctx_h_->forward(static_vec).unsqueeze(0), ctx_c_->forward(static_vec).unsqueeze(0));
    auto enc = encoder_->forward(past_sel, state);
    auto dec = decoder_->forward(fut_sel, std::get<1>(enc));
    auto lstm_out = torch::cat({std::get<0>(enc), std::get<0>(dec)}, 1);
    auto temporal = post_norm_(torch::cat({past_sel, fut_sel}, 1) + post_lstm_->forward(lstm_out));
    auto enriched = enrich_->forward(temporal, c_enrich);
    auto out = out_grn_->forward(enriched.narrow(1, T, H));
    return {head_(out), past_weights};
  }

  int64_t d_;
  std::vector<nn::Embedding> static_emb_;
  torch::Tensor past_w_, past_b_, fut_w_, fut_b_;
  VariableSelection static_vsn_{nullptr}, past_vsn_{nullptr}, future_vsn_{nullptr};
  GatedResidualNetwork ctx_select_{nullptr}, ctx_enrich_{nullptr}, ctx_h_{nullptr}, ctx_c_{nullptr};
  GatedResidualNetwork enrich_{nullptr}, out_grn_{nullptr};
  nn::LSTM encoder_{nullptr}, decoder_{nullptr};
  GatedLinearUnit post_lstm_{nullptr};
  nn::LayerNorm post_norm_{nullptr};
  nn::Linear head_{nullptr};
};
TORCH_MODULE(TemporalFusion);

// Mean quantile loss over the validation windows, in the model's scaled units.
double validate(TemporalFusion &model, const std::vector<TFTBatch> &data, const TFTConfig &cfg, torch::Device device) {
  model->eval();
  auto q = torch::tensor(cfg.quantiles, torch::TensorOptions().device(device)).view({1, 1, -1});
  auto total = torch::zeros({}, torch::TensorOptions().device(device));
  for (const auto &b : data) {
    auto out = model->forward(b.static_ids.to(device), b.past.to(device), b.future.to(device));
    auto err = b.target.to(device).unsqueeze(-1) - out.quantiles;
    auto ql = torch::max(q * err, (q - 1) * err); // LOOKALIKE: tensor-device-mismatch -- these quantile levels are made on the model's device
    // FACT: l = torch.nn.Linear(3, 1); tot = torch.zeros(()); exec("for _ in range(3): tot += l(torch.randn(4, 3)).pow(2).mean()"); assert tot.requires_grad and kept_nodes(tot) >= 3
    total += ql.sum(1).mean(); // EXPECT: tensor-graph-kept-across-iterations -- eval() is not no_grad: every validation batch's graph stays reachable from total
  }
  return total.item<double>() / static_cast<double>(data.size());
}

void train(TemporalFusion &model, const std::vector<TFTBatch> &train_set, const std::vector<TFTBatch> &val_set,
           const TFTConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto q = torch::tensor(cfg.quantiles).view({1, 1, -1}); // [1, 1, Q]
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto running = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t step = 0;
    for (const auto &b : train_set) {
      auto past = b.past.to(device); // LOOKALIKE: tensor-clone-in-loop -- each batch's own window: the source changes every iteration
      auto out = model->forward(b.static_ids.to(device), past, b.future.to(device));
      auto err = b.target.to(device).unsqueeze(-1) - out.quantiles;
      auto loss = torch::max(q * err, (q - 1) * err).sum(1).mean(); // EXPECT: tensor-device-mismatch -- the quantile levels stay a [1, 1, Q] host tensor while the forecasts are on the GPU
      opt.zero_grad();
      loss.backward();
      // FACT: m = torch.nn.Linear(3, 1); m(torch.randn(4, 3)).pow(2).sum().backward(); w0 = m.weight.detach().clone(); torch.nn.utils.clip_grad_norm_(m.parameters(), 0.01); assert torch.equal(m.weight.detach(), w0) and m.weight.is_leaf
      nn::utils::clip_grad_norm_(model->parameters(), cfg.clip); // LOOKALIKE: tensor-inplace-on-leaf -- scales the gradients, not the parameters
      opt.step();
      running = running + loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: only the value is kept
      if (++step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step << " loss " << (running / step).item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps
        // FACT: w = torch.softmax(torch.randn(2, 3, 4, requires_grad=True), -1); i = w.detach().mean(0).mean(0); i.div_(i.sum()); assert is_copy_of(i, w)
        auto imp = out.past_weights.detach().mean(0).mean(0); // over batch and time
        imp.div_(imp.sum()); // LOOKALIKE: tensor-inplace-on-detached -- mean() made a new tensor: the selection weights are untouched
        std::cout << "  past variable importance " << imp << "\n";
      }
    }
    std::cout << "epoch " << epoch << " val quantile loss " << validate(model, val_set, cfg, device) << "\n";
  }
}

struct Forecast {
  torch::Tensor units;     // [N, H] int32 median units for replenishment
  torch::Tensor quantiles; // [N, H, Q] float64 for the planning report
};

// Median and quantile forecasts of every series, back in sales units.
Forecast forecast(TemporalFusion &model, const std::vector<TFTBatch> &batches, const torch::Tensor &series_scale,
                  const TFTConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t n = 0;
  for (const auto &b : batches)
    n += b.past.size(0);
  const auto Q = static_cast<int64_t>(cfg.quantiles.size());
  const auto median = std::distance(cfg.quantiles.begin(), std::find(cfg.quantiles.begin(), cfg.quantiles.end(), 0.5));
  auto units = torch::zeros({n, cfg.horizon}, torch::kInt);
  auto quantiles = torch::zeros({n, cfg.horizon, Q}, torch::kDouble);
  int64_t row = 0;
  for (const auto &b : batches) {
    const auto B = b.past.size(0);
    auto scale = series_scale.to(device); // EXPECT: tensor-clone-in-loop -- the whole scale table is uploaded again for every batch
    auto out = model->forward(b.static_ids.to(device), b.past.to(device), b.future.to(device));
    auto pred = (out.quantiles * scale.index_select(0, b.series.to(device)).view({-1, 1, 1})).clamp_min(0).cpu(); // LOOKALIKE: tensor-sync-in-loop -- the host copy is the forecast itself, written to the tables
    // FACT: d = torch.zeros(2, 3, dtype=torch.float64); p = torch.tensor([[0.1, 1.7, 2.25], [3.0, 4.5, 5.125]]); d.copy_(p); assert torch.equal(d, p.double())
    quantiles.narrow(0, row, B).copy_(pred); // LOOKALIKE: tensor-copy-narrowing -- float32 into float64 widens
    // FACT: t = torch.zeros(2, dtype=torch.int32); t.copy_(torch.tensor([2.97, 0.6])); assert t.tolist() == [2, 0]
    units.narrow(0, row, B).copy_(pred.select(-1, median)); // EXPECT: tensor-copy-narrowing -- fractional units are truncated, not rounded: 2.97 becomes 2 and every forecast under 1 becomes 0
    row += B;
  }
  return {units, quantiles};
}
