// Alignment side of a VITS-style TTS model: text encoder, monotonic alignment
// search (MAS) over the prior log-likelihood, duration targets for the duration
// predictor, length regulation at inference and a mean-only coupling flow.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;
namespace nn = torch::nn;

struct VitsConfig {
  int64_t n_vocab = 178, hidden = 192, n_heads = 2, filter = 768, inter_channels = 192;
  int64_t wn_kernel = 5, wn_layers = 4, n_flows = 4;
  double length_scale = 1.0;
};

static constexpr double kLog2Pi = 1.8378770664093453;

torch::Tensor sequence_mask(const torch::Tensor& lengths, int64_t max_len) {
  return torch::arange(max_len, lengths.options()).unsqueeze(0) < lengths.unsqueeze(1);
}

struct TextSelfAttentionImpl : nn::Module {
  TextSelfAttentionImpl(int64_t hidden, int64_t heads) : n_heads(heads) {
    qkv = register_module("qkv", nn::Linear(hidden, 3 * hidden));
    out = register_module("out", nn::Linear(hidden, hidden));
  }
  // x: [B, T, H], key_mask: [B, 1, 1, T] (bool)
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_mask) {
    const int64_t B = x.size(0), T = x.size(1), H = x.size(2), hd = H / n_heads;
    auto parts = qkv(x).chunk(3, -1);
    // FACT: p = torch.randn(2, 5, 12).chunk(3, -1)[0]; assert is_view_of(p.view(2, 5, 2, 2), p)
    auto q = parts[0].view({B, T, n_heads, hd}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- only splits the last dim of the chunk, always a view
    auto k = parts[1].view({B, T, n_heads, hd}).transpose(1, 2), v = parts[2].view({B, T, n_heads, hd}).transpose(1, 2);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    scores = scores.masked_fill(key_mask.logical_not(), -1e4);
    auto ctx = torch::matmul(torch::softmax(scores, -1), v);  // [B, nh, T, hd]
    // FACT: y = torch.randn(2, 3, 5, 4).transpose(1, 2); assert is_copy_of(y.reshape(2, 5, 12), y)
    auto merged = ctx.transpose(1, 2).reshape({B, T, H}); // EXPECT: tensor-reshape-non-contiguous
    return out(merged);
  }
  int64_t n_heads;
  nn::Linear qkv{nullptr}, out{nullptr};
};
TORCH_MODULE(TextSelfAttention);

struct EncoderOut {
  torch::Tensor x, m_p, logs_p, x_mask;  // [B, H, T_x], [B, C, T_x] x2, [B, 1, T_x]
};

struct TextEncoderImpl : nn::Module {
  explicit TextEncoderImpl(const VitsConfig& cfg) : cfg_(cfg) {
    emb_ = register_module("emb", nn::Embedding(cfg.n_vocab, cfg.hidden));
    emb_->weight.normal_(0.0, std::pow(static_cast<double>(cfg.hidden), -0.5)); // EXPECT: tensor-inplace-on-leaf
    attn_ = register_module("attn", TextSelfAttention(cfg.hidden, cfg.n_heads));
    norm_ = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({cfg.hidden})));
    out_ = register_module("out", nn::Conv1d(nn::Conv1dOptions(cfg.hidden, cfg.hidden, 1)));
    proj_ = register_module("proj", nn::Conv1d(nn::Conv1dOptions(cfg.hidden, 2 * cfg.inter_channels, 1)));
  }
  EncoderOut forward(const torch::Tensor& tokens, const torch::Tensor& lengths) {
    const int64_t T = tokens.size(1);
    auto x = emb_(tokens) * std::sqrt(static_cast<double>(cfg_.hidden));  // [B, T, H]
    auto mask = sequence_mask(lengths, T).to(x.scalar_type());             // [B, T]
    auto key_mask = mask.to(torch::kBool).unsqueeze(1).unsqueeze(2);
    x = norm_(x + attn_(x, key_mask)) * mask.unsqueeze(-1);
    EncoderOut o;
    o.x_mask = mask.unsqueeze(1);
    o.x = out_(x.transpose(1, 2)) * o.x_mask;  // conv layout from here on
    auto stats = proj_(o.x) * o.x_mask;
    auto ms = stats.split(cfg_.inter_channels, 1);
    o.m_p = ms[0], o.logs_p = ms[1];
    return o;
  }
  VitsConfig cfg_;
  nn::Embedding emb_{nullptr};
  TextSelfAttention attn_{nullptr};
  nn::LayerNorm norm_{nullptr};
  nn::Conv1d out_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(TextEncoder);

// Deterministic duration predictor, frame-wise MLP over the encoder output.
struct DurationPredictorImpl : nn::Module {
  DurationPredictorImpl(int64_t hidden, int64_t filter) : hidden_(hidden) {
    fc1_ = register_module("fc1", nn::Linear(hidden, filter));
    fc2_ = register_module("fc2", nn::Linear(filter, 1));
  }
  // x: [B, H, T_x] (conv layout), x_mask: [B, 1, T_x] -> log durations [B, 1, T_x]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& x_mask) {
    const int64_t B = x.size(0), T = x.size(2);
    // FACT: x = torch.randn(2, 6, 5); assert raises(lambda: x.transpose(1, 2).view(-1, 6), "view size is not compatible")
    auto frames = x.transpose(1, 2).view({-1, hidden_}); // EXPECT: tensor-view-non-contiguous
    auto h = F::dropout(torch::relu(fc1_(frames)), F::DropoutFuncOptions().p(0.5).training(is_training()));
    // FACT: h = torch.nn.Linear(4, 1)(torch.randn(10, 4)); assert is_view_of(h.view(2, 1, 5), h)
    return fc2_(h).view({B, 1, T}) * x_mask; // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
  }
  int64_t hidden_;
  nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(DurationPredictor);

struct WaveNetImpl : nn::Module {
  WaveNetImpl(int64_t hidden, int64_t kernel, int64_t n_layers) : hidden_(hidden) {
    for (int64_t i = 0; i < n_layers; ++i)
      in_.push_back(register_module("in" + std::to_string(i),
          nn::Conv1d(nn::Conv1dOptions(hidden, 2 * hidden, kernel).padding(kernel / 2))));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& x_mask) {
    for (auto& conv : in_) {
      auto x_in = conv->forward(x);
      auto acts = torch::tanh(x_in.narrow(1, 0, hidden_));
      acts.mul_(torch::sigmoid(x_in.narrow(1, hidden_, hidden_))); // EXPECT: tensor-inplace-on-saved
      x = (x + acts) * x_mask;
    }
    return x;
  }
  int64_t hidden_;
  std::vector<nn::Conv1d> in_;
};
TORCH_MODULE(WaveNet);

// Mean-only residual coupling layer (the VITS prior flow).
struct CouplingImpl : nn::Module {
  CouplingImpl(int64_t channels, const VitsConfig& cfg) : half_(channels / 2) {
    pre_ = register_module("pre", nn::Conv1d(nn::Conv1dOptions(half_, cfg.hidden, 1)));
    enc_ = register_module("enc", WaveNet(cfg.hidden, cfg.wn_kernel, cfg.wn_layers));
    post_ = register_module("post", nn::Conv1d(nn::Conv1dOptions(cfg.hidden, half_, 1)));
    torch::NoGradGuard no_grad;
    post_->weight.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard: identity init of the flow
    post_->bias.zero_();
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& x_mask, bool reverse) {
    auto x0 = x.narrow(1, 0, half_), x1 = x.narrow(1, half_, half_);
    auto h = pre_(x0);
    h.mul_(x_mask); // LOOKALIKE: tensor-inplace-on-saved -- a convolution does not save its output
    auto m = post_(enc_(h, x_mask)) * x_mask;
    x1 = reverse ? (x1 - m) * x_mask : m + x1 * x_mask;
    return torch::cat({x0, x1}, 1);
  }
  int64_t half_;
  nn::Conv1d pre_{nullptr}, post_{nullptr};
  WaveNet enc_{nullptr};
};
TORCH_MODULE(Coupling);

// value: [T_y, T_x] scores of spec frame y under token x, overwritten with the
// cumulative best-path score; returns the hard alignment as int32 {0, 1}.
torch::Tensor maximum_path_single(torch::Tensor value) {
  const int64_t t_y = value.size(0), t_x = value.size(1);
  const float neg = -1e9f;
  value[0].narrow(0, 1, t_x - 1).fill_(neg);  // a path starts at token 0
  auto pad = torch::full({1}, neg, value.options());
  for (int64_t y = 1; y < t_y; ++y) {
    auto prev = value[y - 1];
    // FACT: v = torch.randn(4, 5); s = torch.maximum(v[0], torch.cat([torch.full((1,), -1e9), v[0][:4]])); assert is_copy_of(s, v)
    auto stay_or_advance = torch::maximum(prev, torch::cat({pad, prev.narrow(0, 0, t_x - 1)}));
    value[y].add_(stay_or_advance); // LOOKALIKE: tensor-inplace-overlap -- row y is written, row y-1 read: disjoint rows
  }
  auto path = torch::zeros({t_y, t_x}, torch::kInt);
  auto v = value.accessor<float, 2>();
  auto p = path.accessor<int32_t, 2>();
  int64_t index = t_x - 1;
  for (int64_t y = t_y - 1; y >= 0; --y) {
    p[y][index] = 1;
    if (index != 0 && (index == y || v[y - 1][index] < v[y - 1][index - 1])) --index;
  }
  return path;
}

// neg_cent: [B, T_y, T_x], mask: [B, T_y, T_x] -> path [B, T_y, T_x] (float)
torch::Tensor maximum_path(const torch::Tensor& neg_cent, const torch::Tensor& mask) {
  torch::NoGradGuard no_grad;
  torch::Tensor scores = neg_cent.to(torch::kCPU);  // MAS runs on the host
  // A per-frame constant does not change the best path; keeps the sums small.
  // FACT: a = torch.randn(2, 5, 3); s = a.to("cpu"); s -= s.max(2, keepdim=True)[0]; assert shares_storage(s, a) and (a <= 0).all()
  scores -= std::get<0>(scores.max(2, true)); // EXPECT: tensor-alias-then-mutate
  auto t_ys = mask.select(2, 0).sum(1).to(torch::kLong);
  auto t_xs = mask.select(1, 0).sum(1).to(torch::kLong);
  auto out = torch::zeros_like(scores);
  for (int64_t b = 0; b < scores.size(0); ++b) {
    const int64_t ty = t_ys[b].item<int64_t>(), tx = t_xs[b].item<int64_t>();
    auto value = scores[b].narrow(0, 0, ty).narrow(1, 0, tx).clone(); // LOOKALIKE: tensor-clone-in-loop, tensor-unnecessary-clone -- a new slice each b, and the DP overwrites it
    auto path = maximum_path_single(value);
    out[b].narrow(0, 0, ty).narrow(1, 0, tx).copy_(path); // LOOKALIKE: tensor-copy-narrowing -- int32 {0,1} into float32 is exact
  }
  return out.to(neg_cent.device());
}

// Gaussian log-likelihood of every z_p frame under every text prior: [B, T_y, T_x].
torch::Tensor prior_log_likelihood(const torch::Tensor& z_p, const torch::Tensor& m_p,
                                   const torch::Tensor& logs_p) {
  auto s_p_sq_r = torch::exp(-2.0 * logs_p);
  auto c1 = torch::sum(-0.5 * kLog2Pi - logs_p, {1}, true);
  auto c2 = torch::matmul(-0.5 * z_p.pow(2).transpose(1, 2), s_p_sq_r);
  auto c3 = torch::matmul(z_p.transpose(1, 2), m_p * s_p_sq_r);
  auto c4 = torch::sum(-0.5 * m_p.pow(2) * s_p_sq_r, {1}, true);
  return c1 + c2 + c3 + c4;
}

// durations: [B, 1, T_x] int64, mask: [B, 1, T_y, T_x] -> path [B, 1, T_y, T_x]
torch::Tensor generate_path(const torch::Tensor& durations, const torch::Tensor& mask) {
  const int64_t B = mask.size(0), T_y = mask.size(2), T_x = mask.size(3);
  auto cum = torch::cumsum(durations, -1).view({B * T_x});
  auto frames = torch::arange(T_y, cum.options());
  auto path = (frames.unsqueeze(0) < cum.unsqueeze(1)).to(mask.scalar_type()).view({B, T_x, T_y});
  // token x owns frames [cum[x-1], cum[x]): remove the previous token's prefix
  // FACT: p = (torch.arange(6)[None] < torch.tensor([2, 5, 6, 1, 3, 6])[:, None]).float().view(2, 3, 6); e = p - torch.nn.functional.pad(p, [0, 0, 1, 0])[:, :-1]; p.narrow(1, 1, 2).sub_(p.narrow(1, 0, 2)); assert not torch.equal(p, e)
  path.narrow(1, 1, T_x - 1).sub_(path.narrow(1, 0, T_x - 1)); // EXPECT: tensor-inplace-overlap
  return path.unsqueeze(1).transpose(2, 3) * mask;
}

struct VitsAlignerImpl : nn::Module {
  explicit VitsAlignerImpl(const VitsConfig& c) : cfg(c) {
    encoder = register_module("encoder", TextEncoder(c));
    dp = register_module("dp", DurationPredictor(c.hidden, c.filter));
    for (int64_t i = 0; i < c.n_flows; ++i)
      flows.push_back(register_module("flow" + std::to_string(i), Coupling(c.inter_channels, c)));
  }
  torch::Tensor flow(torch::Tensor z, const torch::Tensor& y_mask, bool reverse) {
    if (!reverse)
      for (auto& f : flows) z = torch::flip(f->forward(z, y_mask, false), {1});
    else
      for (auto it = flows.rbegin(); it != flows.rend(); ++it) z = (*it)->forward(torch::flip(z, {1}), y_mask, true);
    return z;
  }
  VitsConfig cfg;
  TextEncoder encoder{nullptr};
  DurationPredictor dp{nullptr};
  std::vector<Coupling> flows;
};
TORCH_MODULE(VitsAligner);

struct AlignBatch {
  torch::Tensor tokens, text_lengths, z, spec_lengths;  // [B, T_x], [B], latents [B, C, T_y], [B]
};

void train_alignment_epoch(VitsAligner& model, const std::vector<AlignBatch>& batches,
                           torch::optim::Optimizer& opt) {
  model->train();
  torch::Tensor epoch_dur = torch::zeros({});
  double epoch_nll = 0.0;
  for (const auto& b : batches) {
    auto enc = model->encoder->forward(b.tokens, b.text_lengths);
    auto y_mask = sequence_mask(b.spec_lengths, b.z.size(2)).unsqueeze(1).to(torch::kFloat);
    auto z_p = model->flow(b.z, y_mask, false);
    torch::Tensor attn;
    {
      torch::NoGradGuard no_grad;
      auto neg_cent = prior_log_likelihood(z_p, enc.m_p, enc.logs_p);
      auto attn_mask = enc.x_mask.unsqueeze(2) * y_mask.unsqueeze(-1);  // [B, 1, T_y, T_x]
      attn = maximum_path(neg_cent, attn_mask.squeeze(1)).unsqueeze(1);
    }
    auto w = attn.sum(2);  // frames per token, [B, 1, T_x]
    auto logw_target = torch::log(w + 1e-6) * enc.x_mask;
    auto logw = model->dp->forward(enc.x.detach(), enc.x_mask);
    auto loss_dur = torch::sum(torch::pow(logw - logw_target, 2)) / torch::sum(enc.x_mask);
    auto a = attn.squeeze(1);
    auto m_y = torch::matmul(a, enc.m_p.transpose(1, 2)).transpose(1, 2);
    auto logs_y = torch::matmul(a, enc.logs_p.transpose(1, 2)).transpose(1, 2);
    auto nll = torch::sum((logs_y + 0.5 * torch::exp(-2.0 * logs_y) * (z_p - m_y).pow(2)) * y_mask) /
               torch::sum(y_mask);
    opt.zero_grad();
    (nll + loss_dur).backward();
    opt.step();
    epoch_dur += loss_dur; // EXPECT: tensor-graph-kept-across-iterations
    epoch_nll += nll.item<double>(); // LOOKALIKE: tensor-graph-kept-across-iterations -- item() keeps no graph
  }
  const auto n = static_cast<double>(batches.size());
  std::cout << "nll " << epoch_nll / n << " dur " << epoch_dur.item<double>() / n << "\n";
}

torch::Tensor synthesize_prior(VitsAligner& model, const torch::Tensor& tokens,
                               const torch::Tensor& lengths, double noise_scale) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto enc = model->encoder->forward(tokens, lengths);
  auto logw = model->dp->forward(enc.x, enc.x_mask);
  auto w = torch::exp(logw) * enc.x_mask * model->cfg.length_scale;
  auto w_ceil = torch::ceil(w);
  auto durations = torch::zeros({w.size(0), 1, w.size(2)}, torch::kLong);
  durations.copy_(w_ceil); // LOOKALIKE: tensor-copy-narrowing -- ceil gives whole numbers
  auto y_lengths = torch::zeros({w.size(0)}, torch::kLong);
  y_lengths.copy_(torch::sum(w, {1, 2})); // EXPECT: tensor-copy-narrowing
  y_lengths.clamp_min_(1);
  const int64_t T_y = y_lengths.max().item<int64_t>();
  auto y_mask = sequence_mask(y_lengths, T_y).unsqueeze(1).to(torch::kFloat);
  auto attn_mask = enc.x_mask.unsqueeze(2) * y_mask.unsqueeze(-1);
  auto path = generate_path(durations, attn_mask).squeeze(1);  // [B, T_y, T_x]
  auto m_y = torch::matmul(path, enc.m_p.transpose(1, 2)).transpose(1, 2);
  auto logs_y = torch::matmul(path, enc.logs_p.transpose(1, 2)).transpose(1, 2);
  auto z_p = m_y + torch::randn_like(m_y) * torch::exp(logs_y) * noise_scale;
  return model->flow(z_p, y_mask, true) * y_mask;
}

