// Informer (Zhou et al., AAAI 2021) for long-sequence time-series forecasting: ProbSparse
// self-attention (only the top-u "active" queries, picked on sampled keys, get full attention),
// self-attention distilling between encoder layers, and a generative one-pass decoder.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;
using torch::indexing::None;
using torch::indexing::Slice;

struct InformerConfig {
  int64_t enc_in = 7, dec_in = 7, c_out = 7;
  int64_t seq_len = 96, label_len = 48, pred_len = 24;
  int64_t d_model = 512, n_heads = 8, e_layers = 2, d_layers = 1, d_ff = 2048, factor = 5;
  int64_t epochs = 6, patience = 3;
  double dropout = 0.05, lr = 1e-4;
};

class ProbAttentionImpl : public torch::nn::Module {
 public:
  ProbAttentionImpl(int64_t factor, bool causal, double p)
      : drop(register_module("drop", torch::nn::Dropout(p))), factor_(factor), causal_(causal) {}
  // q: [B, H, L_Q, D], k/v: [B, H, L_K, D] -> context [B, H, L_Q, D]
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    const int64_t B = q.size(0), H = q.size(1), L_Q = q.size(2), D = q.size(3), L_K = k.size(2);
    const int64_t n_sample = std::min(L_K, factor_ * static_cast<int64_t>(std::ceil(std::log(L_K))));
    const int64_t n_top = std::min(L_Q, factor_ * static_cast<int64_t>(std::ceil(std::log(L_Q))));
    // Sparsity measurement M(q, K) = max - mean over randomly sampled keys.
    auto sample_idx = torch::randint(L_K, {L_Q, n_sample}, q.options().dtype(torch::kLong));
    auto k_sample = k.index({Slice(), Slice(), sample_idx});  // [B, H, L_Q, n_sample, D]
    auto qk_sample = q.unsqueeze(-2).matmul(k_sample.transpose(-2, -1)).squeeze(-2);
    auto sparsity = std::get<0>(qk_sample.max(-1)) - qk_sample.sum(-1) / L_K;
    auto top = std::get<1>(sparsity.topk(n_top, -1, true, false));  // [B, H, n_top]
    auto b_idx = torch::arange(B, top.options()).view({B, 1, 1});
    auto h_idx = torch::arange(H, top.options()).view({1, H, 1});
    auto q_reduce = q.index({b_idx, h_idx, top});  // [B, H, n_top, D]
    auto scores = q_reduce.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(D)));
    if (causal_) {
      auto tri = torch::ones({L_Q, L_K}, top.options().dtype(torch::kBool)).triu(1);
      scores.masked_fill_(tri.index({top}), -std::numeric_limits<float>::infinity());  // LOOKALIKE: tensor-inplace-on-saved -- a product with a number saves nothing; matmul saved its inputs
    }
    auto attn = drop(torch::softmax(scores, -1));
    // Lazy queries get the mean of V (encoder) or its running sum (masked decoder).
    // FACT: v = torch.randn(2, 3, 5, 4); c = v.mean(-2).unsqueeze(-2).expand(2, 3, 5, 4).clone(); c.add_(1); assert is_copy_of(c, v) and c.stride(2) == 4
    auto context = causal_ ? v.cumsum(-2) : v.mean(-2).unsqueeze(-2).expand({B, H, L_Q, v.size(3)}).clone();
    context.index_put_({b_idx, h_idx, top}, attn.matmul(v));  // LOOKALIKE: tensor-inplace-on-expanded -- the expand was cloned into memory of its own
    return context;
  }
  torch::nn::Dropout drop;
 private:
  int64_t factor_;  bool causal_;
};
TORCH_MODULE(ProbAttention);

class AttentionLayerImpl : public torch::nn::Module {
 public:
  AttentionLayerImpl(const InformerConfig& c, bool prob_sparse, bool causal, bool mix)
      : q_proj(register_module("q_proj", torch::nn::Linear(c.d_model, c.d_model))),
        k_proj(register_module("k_proj", torch::nn::Linear(c.d_model, c.d_model))),
        v_proj(register_module("v_proj", torch::nn::Linear(c.d_model, c.d_model))),
        out_proj(register_module("out_proj", torch::nn::Linear(c.d_model, c.d_model))),
        drop(register_module("drop", torch::nn::Dropout(c.dropout))), heads_(c.n_heads), mix_(mix) {
    if (prob_sparse) prob = register_module("prob", ProbAttention(c.factor, causal, c.dropout));
  }
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values) {
    const int64_t B = queries.size(0), L = queries.size(1), S = keys.size(1);
    // FACT: y = torch.nn.functional.linear(torch.randn(2, 5, 6), torch.randn(12, 6)); assert is_view_of(y.view(2, 5, 3, 4), y)
    auto q = q_proj(queries).view({B, L, heads_, -1}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto k = k_proj(keys).view({B, S, heads_, -1}).transpose(1, 2);
    auto v = v_proj(values).view({B, S, heads_, -1}).transpose(1, 2);
    torch::Tensor out;
    if (prob) {
      auto ctx = prob->forward(q, k, v).transpose(1, 2).contiguous();  // [B, L, H, D]
      if (mix_) ctx = ctx.transpose(1, 2).contiguous();  // the paper's "mix": heads folded into time
      // FACT: c = torch.randn(2, 3, 5, 4).transpose(1, 2).contiguous(); assert is_view_of(c.view(2, 5, -1), c)
      out = ctx.view({B, L, -1});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() on both paths
    } else {
      auto scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
      auto att = torch::softmax(q.matmul(k.transpose(-2, -1)) * scale, -1);
      // FACT: o = torch.randn(2, 3, 5, 4).transpose(1, 2); assert is_copy_of(o.flatten(2), o)
      out = drop(att).matmul(v).transpose(1, 2).flatten(2);  // EXPECT: tensor-reshape-non-contiguous
    }
    return out_proj(out);
  }
  torch::nn::Linear q_proj, k_proj, v_proj, out_proj;
  torch::nn::Dropout drop;
  ProbAttention prob{nullptr};
 private:
  int64_t heads_;  bool mix_;
};
TORCH_MODULE(AttentionLayer);

// Self-attention distilling: conv + ELU + stride-2 max-pool halves the sequence.
class DistilConvImpl : public torch::nn::Module {
 public:
  explicit DistilConvImpl(int64_t c)
      : conv(register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(c, c, 3).padding(1).padding_mode(torch::kCircular)))),
        norm(register_module("norm", torch::nn::BatchNorm1d(c))),
        pool(register_module("pool", torch::nn::MaxPool1d(torch::nn::MaxPool1dOptions(3).stride(2).padding(1)))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // [B, L, D] -> [B, ceil(L / 2), D]
    return pool(F::elu(norm(conv(x.permute({0, 2, 1}))))).transpose(1, 2);
  }
  torch::nn::Conv1d conv;  torch::nn::BatchNorm1d norm;  torch::nn::MaxPool1d pool;
};
TORCH_MODULE(DistilConv);

class EncoderLayerImpl : public torch::nn::Module {
 public:
  // Decoder: masked ProbSparse self-attention with "mix", then full cross-attention.
  EncoderLayerImpl(const InformerConfig& c, bool decoder)
      : attn(register_module("attn", AttentionLayer(c, true, decoder, decoder))),
        ff1(register_module("ff1", torch::nn::Linear(c.d_model, c.d_ff))),
        ff2(register_module("ff2", torch::nn::Linear(c.d_ff, c.d_model))),
        norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})))),
        drop(register_module("drop", torch::nn::Dropout(c.dropout))) {
    if (decoder) cross_attn = register_module("cross_attn", AttentionLayer(c, false, false, false));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& cross = {}) {
    x = norm1(x + drop(attn(x, x, x)));
    if (cross.defined()) x = norm1(x + drop(cross_attn(x, cross, cross)));
    return norm2(x + drop(ff2(drop(torch::gelu(ff1(x))))));
  }
  AttentionLayer attn, cross_attn{nullptr};
  torch::nn::Linear ff1, ff2;
  torch::nn::LayerNorm norm1, norm2;
  torch::nn::Dropout drop;
};
TORCH_MODULE(EncoderLayer);

class DataEmbeddingImpl : public torch::nn::Module {
 public:
  DataEmbeddingImpl(int64_t c_in, int64_t d_model, int64_t max_len, double p)
      : token(register_module("token", torch::nn::Conv1d(torch::nn::Conv1dOptions(c_in, d_model, 3).padding(1).padding_mode(torch::kCircular)))),
        temporal(register_module("temporal", torch::nn::Linear(4, d_model))),  // timeF features
        drop(register_module("drop", torch::nn::Dropout(p))) {
    auto pe = torch::zeros({max_len, d_model});
    auto position = torch::arange(0, max_len, torch::kFloat).unsqueeze(1);
    auto div = torch::exp(torch::arange(0, d_model, 2, torch::kFloat) * (-std::log(10000.0) / d_model));
    pe.index_put_({Slice(), Slice(0, None, 2)}, torch::sin(position * div));
    pe.index_put_({Slice(), Slice(1, None, 2)}, torch::cos(position * div));
    pe_ = register_buffer("pe", pe.unsqueeze(0));  // [1, max_len, d_model]
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& x_mark) {
    const int64_t B = x.size(0), L = x.size(1);
    // FACT: pe = torch.randn(1, 10, 4); e = pe.narrow(1, 0, 6).expand(3, 6, 4); assert raises(lambda: e.add_(torch.randn(3, 6, 4)), "single memory location")
    auto emb = pe_.narrow(1, 0, L).expand({B, L, pe_.size(2)});
    emb += token(x.permute({0, 2, 1})).transpose(1, 2);  // EXPECT: tensor-inplace-on-expanded
    emb += temporal(x_mark);
    return drop(emb);
  }
  torch::nn::Conv1d token;
  torch::nn::Linear temporal;
  torch::nn::Dropout drop;
  torch::Tensor pe_;
};
TORCH_MODULE(DataEmbedding);

class InformerImpl : public torch::nn::Module {
 public:
  explicit InformerImpl(const InformerConfig& c)
      : enc_emb(register_module("enc_emb", DataEmbedding(c.enc_in, c.d_model, 5000, c.dropout))),
        dec_emb(register_module("dec_emb", DataEmbedding(c.dec_in, c.d_model, 5000, c.dropout))),
        projection(register_module("projection", torch::nn::Linear(c.d_model, c.c_out))), pred_len_(c.pred_len) {
    for (int64_t i = 0; i < c.e_layers; ++i) {
      enc.push_back(register_module("enc" + std::to_string(i), EncoderLayer(c, false)));
      if (i + 1 < c.e_layers) distil.push_back(register_module("distil" + std::to_string(i), DistilConv(c.d_model)));
    }
    for (int64_t i = 0; i < c.d_layers; ++i) dec.push_back(register_module("dec" + std::to_string(i), EncoderLayer(c, true)));
  }
  // -> [B, pred_len, c_out]: the last pred_len steps of the decoder's output.
  torch::Tensor forward(const torch::Tensor& x_enc, const torch::Tensor& x_mark_enc,
                        const torch::Tensor& x_dec, const torch::Tensor& x_mark_dec) {
    auto e = enc_emb(x_enc, x_mark_enc);
    for (size_t i = 0; i < enc.size(); ++i) {
      e = enc[i]->forward(e);
      if (i < distil.size()) e = distil[i]->forward(e);
    }
    auto d = dec_emb(x_dec, x_mark_dec);
    for (auto& layer : dec) d = layer->forward(d, e);
    auto out = projection(d);
    return out.narrow(1, out.size(1) - pred_len_, pred_len_);
  }
  DataEmbedding enc_emb, dec_emb;
  torch::nn::Linear projection;
  std::vector<EncoderLayer> enc, dec;
  std::vector<DistilConv> distil;
 private:
  int64_t pred_len_;
};
TORCH_MODULE(Informer);

struct Window { torch::Tensor x, x_mark, y, y_mark; };

// timeF features of unix timestamps, each in [-0.5, 0.5]: minute, hour, weekday, day of year.
torch::Tensor time_features(const std::vector<double>& unix_seconds) {
  const int64_t n = static_cast<int64_t>(unix_seconds.size());
  auto secs = torch::empty({n});
  // FACT: s = torch.tensor([1.7e9 + 61.0], dtype=torch.float64); assert torch.empty(1).copy_(s).item() != s.item()
  secs.copy_(torch::from_blob(const_cast<double*>(unix_seconds.data()), {n}, torch::kDouble));  // EXPECT: tensor-copy-narrowing
  auto day = torch::floor(secs / 86400.0);
  return torch::stack({torch::fmod(torch::floor(secs / 60.0), 60.0) / 59.0 - 0.5,
                       torch::fmod(torch::floor(secs / 3600.0), 24.0) / 23.0 - 0.5,
                       torch::fmod(day + 3.0, 7.0) / 6.0 - 0.5, torch::fmod(day, 365.25) / 365.0 - 0.5}, 1);
}

// Batches come from the windowing loader: x [B, seq_len, C], y [B, label_len + pred_len, C].
double fit(Informer& model, const std::vector<Window>& train_batches, const std::vector<Window>& val_batches,
           const InformerConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  double best = std::numeric_limits<double>::infinity();
  int64_t bad_epochs = 0;
  std::vector<torch::Tensor> best_state;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> train_losses;
    for (const auto& w : train_batches) {
      auto x = w.x.to(device), xm = w.x_mark.to(device), y = w.y.to(device), ym = w.y_mark.to(device);
      // Generative decoder input: the known label_len steps, then zeros for the horizon.
      auto zeros = torch::zeros({y.size(0), cfg.pred_len, y.size(2)});
      auto dec_inp = torch::cat({y.narrow(1, 0, cfg.label_len), zeros}, 1);  // EXPECT: tensor-device-mismatch
      auto pred = model->forward(x, xm, dec_inp, ym);
      auto loss = F::mse_loss(pred, y.narrow(1, cfg.label_len, cfg.pred_len));
      opt.zero_grad(); loss.backward(); opt.step();
      train_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    }
    const double train_loss = torch::stack(train_losses).mean().item<double>();
    model->eval();
    int64_t n_val = 0, filled = 0, nb = 0;
    const int64_t C = cfg.c_out;
    for (const auto& w : val_batches) n_val += w.y.size(0);
    auto preds = torch::empty({n_val, cfg.pred_len, C}, torch::kDouble);
    auto trues = torch::empty({n_val * cfg.pred_len, C}, torch::kDouble);
    torch::Tensor val_sum = torch::zeros({}, torch::TensorOptions().device(device));
    {
      torch::NoGradGuard no_grad;
      for (const auto& w : val_batches) {
        auto y = w.y.to(device);
        auto dec_inp = torch::cat({y.narrow(1, 0, cfg.label_len), torch::zeros({y.size(0), cfg.pred_len, y.size(2)}, y.options())}, 1);  // LOOKALIKE: tensor-device-mismatch -- the zeros take y's device from its options
        auto pred = model->forward(w.x.to(device), w.x_mark.to(device), dec_inp, w.y_mark.to(device));
        auto target = y.narrow(1, cfg.label_len, cfg.pred_len);
        val_sum += F::mse_loss(pred, target);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, summed on the device
        const int64_t n = target.size(0);
        preds.narrow(0, filled, n).copy_(pred);  // LOOKALIKE: tensor-copy-narrowing -- float32 into a float64 buffer widens
        // FACT: t = torch.randn(2, 7, 3).narrow(1, 4, 3); assert raises(lambda: t.view(-1, 3), "view size is not compatible")
        trues.narrow(0, filled * cfg.pred_len, n * cfg.pred_len).copy_(target.view({-1, C}));  // EXPECT: tensor-view-non-contiguous
        filled += n; ++nb;
      }
    }
    const double val_loss = val_sum.item<double>() / std::max<int64_t>(nb, 1);
    auto mae = (preds.view({-1, C}) - trues).abs().mean(0);
    std::cout << "epoch " << epoch << " train " << train_loss << " val " << val_loss
              << " worst-channel MAE " << mae.max().item<double>() << "\n";
    if (val_loss < best) {
      best = val_loss; bad_epochs = 0;
      best_state.clear();
      for (const auto& p : model->parameters()) best_state.push_back(p.detach().clone());  // LOOKALIKE: tensor-clone-in-loop -- each copy is kept
    } else if (++bad_epochs >= cfg.patience) break;
  }
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size() && i < best_state.size(); ++i)
    params[i].copy_(best_state[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- restoring the best weights under NoGradGuard
  return best;
}

// Online inference: keeps the latest seq_len observations and forecasts pred_len ahead.
class StreamingForecaster {
 public:
  StreamingForecaster(Informer model, const InformerConfig& cfg, int64_t channels)
      : model_(std::move(model)), cfg_(cfg),
        history_(torch::zeros({cfg.seq_len, channels})), marks_(torch::zeros({cfg.seq_len, 4})) {}
  void push(const torch::Tensor& obs, const torch::Tensor& mark) {
    const int64_t L = history_.size(0);
    // FACT: h = torch.randn(6, 3); assert raises(lambda: h.narrow(0, 0, 5).copy_(h.narrow(0, 1, 5)), "single memory location")
    history_.narrow(0, 0, L - 1).copy_(history_.narrow(0, 1, L - 1));  // EXPECT: tensor-inplace-overlap
    history_[L - 1] = obs;
    // FACT: m = torch.randn(6, 4); assert not raises(lambda: m.narrow(0, 0, 5).copy_(m.narrow(0, 1, 5).clone()))
    marks_.narrow(0, 0, L - 1).copy_(marks_.narrow(0, 1, L - 1).clone());  // LOOKALIKE: tensor-inplace-overlap -- the source is cloned first
    marks_[L - 1] = mark;
  }
  torch::Tensor forecast(const torch::Tensor& future_marks) {  // future_marks: [pred_len, 4]
    torch::NoGradGuard no_grad;
    model_->eval();
    const int64_t L = history_.size(0), K = cfg_.label_len;
    auto x = history_.unsqueeze(0), xm = marks_.unsqueeze(0);
    auto dec = torch::cat({x.narrow(1, L - K, K), torch::zeros({1, cfg_.pred_len, x.size(2)}, x.options())}, 1);
    auto dec_mark = torch::cat({xm.narrow(1, L - K, K), future_marks.unsqueeze(0)}, 1);
    return model_->forward(x, xm, dec, dec_mark).squeeze(0);
  }
 private:
  Informer model_;  InformerConfig cfg_;
  torch::Tensor history_, marks_;
};
