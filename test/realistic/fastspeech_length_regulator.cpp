// FastSpeech 2 (Ren et al., 2021) acoustic model: padded phoneme batches -> 80-bin log-mel frames.
// A feed-forward Transformer encoder, a variance adaptor (duration, pitch and energy predictors;
// pitch and energy quantised into embedding buckets, ground truth used while training), a length
// regulator that repeats each phoneme's state by its duration in frames, and a decoder with a
// linear mel head and a conv postnet. All losses are masked to the real phonemes and frames.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct FsConfig {
  int64_t vocab = 360, d_model = 256, heads = 2, enc_layers = 4, dec_layers = 6, ffn_filter = 1024, ffn_kernel = 9, epochs = 600;
  int64_t var_filter = 256, var_kernel = 3, n_bins = 256, n_mels = 80, max_positions = 2000, postnet_layers = 5, postnet_dim = 512;
  double dropout = 0.2, var_dropout = 0.5, pitch_min = -2.9, pitch_max = 11.5, energy_min = -1.4, energy_max = 8.2, lr = 5e-4, grad_clip = 1.0;
};

struct Batch {
  torch::Tensor phonemes, text_lens; // [B, L] int64 (0 = pad), [B]
  torch::Tensor mels, mel_lens;      // [B, n_mels, T] channels-first as the feature extractor writes them, [B]
  torch::Tensor durations;           // [B, L] int64 frames per phoneme, from forced alignment
  torch::Tensor pitch, energy;       // [B, L] phoneme-averaged, normalised
};

struct MelStats { torch::Tensor mel_mean, mel_std; }; // [n_mels] over the training set

// True at padded positions: [B, max_len].
torch::Tensor padding_mask(const torch::Tensor &lens, int64_t max_len) {
  auto pos = torch::arange(max_len, lens.options()).unsqueeze(0); // LOOKALIKE: tensor-device-mismatch -- made with the lengths' options
  return pos >= lens.unsqueeze(1);
}

torch::Tensor sinusoid_table(int64_t n, int64_t d) {
  auto pos = torch::arange(n, torch::kFloat).unsqueeze(1);
  auto freq = torch::exp(torch::arange(0, d, 2, torch::kFloat) * (-std::log(10000.0) / static_cast<double>(d)));
  auto table = torch::zeros({n, d});
  table.slice(1, 0, d, 2).copy_(torch::sin(pos * freq));
  table.slice(1, 1, d, 2).copy_(torch::cos(pos * freq));
  return table;
}

// Self-attention and a conv feed-forward, post-norm, padded positions zeroed.
struct FftBlockImpl : nn::Module {
  explicit FftBlockImpl(const FsConfig &c) : heads_(c.heads) {
    qkv = register_module("qkv", nn::Linear(c.d_model, 3 * c.d_model));
    proj = register_module("proj", nn::Linear(c.d_model, c.d_model));
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({c.d_model})));
    conv1 = register_module("conv1", nn::Conv1d(nn::Conv1dOptions(c.d_model, c.ffn_filter, c.ffn_kernel).padding(c.ffn_kernel / 2)));
    conv2 = register_module("conv2", nn::Conv1d(nn::Conv1dOptions(c.ffn_filter, c.d_model, 1)));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({c.d_model})));
    drop = register_module("drop", nn::Dropout(c.dropout));
  }
  // [B, T, H * dk] -> [B, H, T, dk]
  torch::Tensor split_heads(const torch::Tensor &x) const {
    // FACT: y = torch.nn.Linear(8, 24)(torch.randn(2, 5, 8)); q = y.chunk(3, -1)[0]; assert not is_contiguous(q) and is_view_of(q.view(2, 5, 2, 4), y)
    return x.view({x.size(0), x.size(1), heads_, -1}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- splits only the last dim, which a chunk keeps dense
  }
  // [B, H, T, dk] -> [B, T, H * dk]
  torch::Tensor merge_heads(const torch::Tensor &ctx) const {
    // FACT: c = torch.randn(2, 3, 5, 4); assert is_copy_of(c.transpose(1, 2).reshape(2, 5, -1), c)
    return ctx.transpose(1, 2).reshape({ctx.size(0), ctx.size(2), -1}); // EXPECT: tensor-reshape-non-contiguous
  }
  torch::Tensor attend(const torch::Tensor &x, const torch::Tensor &pad) {
    auto parts = qkv(x).chunk(3, -1);
    auto q = split_heads(parts[0]), k = split_heads(parts[1]), v = split_heads(parts[2]);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
    // FACT: q = torch.randn(2, 3, 4, requires_grad=True); a = torch.matmul(q, q.transpose(1, 2)) / 2.0; a.masked_fill_(torch.zeros(2, 1, 3, dtype=torch.bool), -1e9); a.softmax(-1).sum().backward(); assert q.grad is not None
    scores.masked_fill_(pad.unsqueeze(1).unsqueeze(1), -1e9); // LOOKALIKE: tensor-inplace-on-saved -- a quotient by a number: matmul saved q and k, not its output
    return proj(merge_heads(torch::matmul(drop(torch::softmax(scores, -1)), v)));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &pad) {
    auto h = ln1(x + drop(attend(x, pad)));
    // FACT: ln = torch.nn.LayerNorm(4); o = ln(torch.randn(2, 3, 4)); o.masked_fill_(torch.zeros(2, 3, 1, dtype=torch.bool), 0.0); o.sum().backward(); assert ln.weight.grad is not None
    h.masked_fill_(pad.unsqueeze(-1), 0.0); // LOOKALIKE: tensor-inplace-on-saved -- layer_norm saves its input and statistics, not its output
    auto ff = conv2(torch::relu(conv1(h.transpose(1, 2)))).transpose(1, 2);
    return ln2(h + drop(ff)).masked_fill(pad.unsqueeze(-1), 0.0);
  }
  int64_t heads_;
  nn::Linear qkv{nullptr}, proj{nullptr};
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  nn::Conv1d conv1{nullptr}, conv2{nullptr};
  nn::Dropout drop{nullptr};
};
TORCH_MODULE(FftBlock);

// Scaled sinusoidal positions and a stack of FFT blocks (the encoder and the decoder).
struct FftStackImpl : nn::Module {
  FftStackImpl(const FsConfig &c, int64_t layers) {
    pos_table_ = register_buffer("pos_table", sinusoid_table(c.max_positions, c.d_model));
    alpha = register_parameter("alpha", torch::ones({1}));
    blocks = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i)
      blocks->push_back(FftBlock(c));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &pad) {
    const auto B = x.size(0), T = x.size(1);
    auto pe = pos_table_.narrow(0, 0, T).unsqueeze(0).expand({B, T, -1});
    // FACT: t = torch.randn(10, 8); a = torch.nn.Parameter(torch.ones(1)); pe = t.narrow(0, 0, 5).unsqueeze(0).expand(3, -1, -1); assert raises(lambda: pe.mul_(a), "single memory location")
    pe.mul_(alpha); // EXPECT: tensor-inplace-on-expanded
    auto h = x + pe;
    for (const auto &m : *blocks)
      h = m->as<FftBlockImpl>()->forward(h, pad);
    return h;
  }
  torch::Tensor pos_table_, alpha;
  nn::ModuleList blocks{nullptr};
};
TORCH_MODULE(FftStack);

// Two conv layers with ReLU, layer norm and dropout, then a scalar per phoneme: [B, L, d] -> [B, L].
struct VariancePredictorImpl : nn::Module {
  explicit VariancePredictorImpl(const FsConfig &c) {
    const auto k = c.var_kernel, f = c.var_filter;
    conv1 = register_module("conv1", nn::Conv1d(nn::Conv1dOptions(c.d_model, f, k).padding((k - 1) / 2)));
    conv2 = register_module("conv2", nn::Conv1d(nn::Conv1dOptions(f, f, k).padding((k - 1) / 2)));
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({f})));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({f})));
    drop = register_module("drop", nn::Dropout(c.var_dropout));
    proj = register_module("proj", nn::Linear(f, 1));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &pad) {
    auto h = torch::relu(conv1(x.transpose(1, 2))); // [B, f, L]
    // FACT: c = torch.nn.Conv1d(4, 6, 3, padding=1); h = torch.relu(c(torch.randn(2, 4, 5))); h.masked_fill_(torch.zeros(2, 1, 5, dtype=torch.bool), 0.0); assert backward_fails(lambda: h.sum().backward())
    h.masked_fill_(pad.unsqueeze(1), 0.0); // EXPECT: tensor-inplace-on-saved
    h = drop(ln1(h.transpose(1, 2)));
    h = drop(ln2(torch::relu(conv2(h.transpose(1, 2))).transpose(1, 2)));
    auto out = proj(h).squeeze(-1);
    // FACT: lin = torch.nn.Linear(6, 1); o = lin(torch.randn(2, 5, 6)).squeeze(-1); o.masked_fill_(torch.zeros(2, 5, dtype=torch.bool), 0.0); o.sum().backward(); assert lin.weight.grad is not None
    out.masked_fill_(pad, 0.0); // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    return out;
  }
  nn::Conv1d conv1{nullptr}, conv2{nullptr};
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  nn::Dropout drop{nullptr};
  nn::Linear proj{nullptr};
};
TORCH_MODULE(VariancePredictor);

struct Regulated { torch::Tensor x, lens; };
// Repeats each phoneme state by its duration and pads to max_len frames (the longest when 0).
Regulated length_regulate(const torch::Tensor &x, const torch::Tensor &durations, int64_t max_len) {
  auto lens = durations.sum(1);
  const auto T = max_len > 0 ? max_len : std::max<int64_t>(1, lens.max().item<int64_t>());
  auto out = torch::zeros({x.size(0), T, x.size(2)}, x.options());
  for (int64_t b = 0; b < x.size(0); ++b) {
    auto frames = torch::repeat_interleave(x[b], durations[b], 0);
    const auto n = std::min(frames.size(0), T);
    out[b].narrow(0, 0, n).copy_(frames.narrow(0, 0, n)); // LOOKALIKE: tensor-copy-narrowing -- out is made with x's options: the same dtype
  }
  return {out, lens.clamp_max(T)};
}

struct FsOutput { torch::Tensor mel, mel_post, log_dur, pitch, energy, src_pad, mel_pad; };
struct FastSpeech2Impl : nn::Module {
  explicit FastSpeech2Impl(const FsConfig &c) {
    embed = register_module("embed", nn::Embedding(nn::EmbeddingOptions(c.vocab, c.d_model).padding_idx(0)));
    encoder = register_module("encoder", FftStack(c, c.enc_layers));
    decoder = register_module("decoder", FftStack(c, c.dec_layers));
    duration = register_module("duration", VariancePredictor(c));
    pitch = register_module("pitch", VariancePredictor(c));
    energy = register_module("energy", VariancePredictor(c));
    pitch_emb = register_module("pitch_emb", nn::Embedding(c.n_bins, c.d_model));
    energy_emb = register_module("energy_emb", nn::Embedding(c.n_bins, c.d_model));
    pitch_bins_ = register_buffer("pitch_bins", torch::linspace(c.pitch_min, c.pitch_max, c.n_bins - 1));
    energy_bins_ = register_buffer("energy_bins", torch::linspace(c.energy_min, c.energy_max, c.n_bins - 1));
    mel_head = register_module("mel_head", nn::Linear(c.d_model, c.n_mels));
    for (int64_t i = 0; i < c.postnet_layers; ++i) {
      const auto in = i == 0 ? c.n_mels : c.postnet_dim, out = i + 1 == c.postnet_layers ? c.n_mels : c.postnet_dim;
      post_convs.push_back(register_module("post_conv" + std::to_string(i), nn::Conv1d(nn::Conv1dOptions(in, out, 5).padding(2))));
      post_bns.push_back(register_module("post_bn" + std::to_string(i), nn::BatchNorm1d(out)));
    }
  }
  // [B, T, n_mels] -> the postnet's residual, [B, T, n_mels].
  torch::Tensor postnet(const torch::Tensor &mel) {
    auto h = mel.transpose(1, 2);
    for (size_t i = 0; i < post_convs.size(); ++i) {
      h = post_bns[i](post_convs[i](h));
      h = F::dropout(i + 1 < post_convs.size() ? torch::tanh(h) : h, F::DropoutFuncOptions().p(0.5).training(is_training()));
    }
    return h.transpose(1, 2);
  }
  // Ground-truth durations, pitch and energy when given (training); else the predictions.
  FsOutput forward(const torch::Tensor &phonemes, const torch::Tensor &text_lens, const torch::Tensor &dur_target, const torch::Tensor &pitch_target,
                   const torch::Tensor &energy_target, int64_t max_len, double d_control = 1.0) {
    FsOutput o;
    o.src_pad = padding_mask(text_lens, phonemes.size(1));
    auto x = encoder(embed(phonemes), o.src_pad);
    o.log_dur = duration(x, o.src_pad);
    o.pitch = pitch(x, o.src_pad);
    o.energy = energy(x, o.src_pad);
    auto p = pitch_target.defined() ? pitch_target : o.pitch.detach();
    auto e = energy_target.defined() ? energy_target : o.energy.detach();
    x = x + pitch_emb(torch::bucketize(p, pitch_bins_)) + energy_emb(torch::bucketize(e, energy_bins_));
    auto dur = dur_target;
    if (!dur.defined()) {
      dur = torch::zeros({x.size(0), x.size(1)}, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
      // FACT: d = torch.zeros(3, dtype=torch.long); d.copy_(torch.tensor([2.97, 0.6, 4.5])); assert d.tolist() == [2, 0, 4]
      dur.copy_((torch::exp(o.log_dur) - 1.0).clamp_min(0.0) * d_control); // EXPECT: tensor-copy-narrowing
      dur.masked_fill_(o.src_pad, 0);
    }
    auto reg = length_regulate(x, dur, max_len);
    o.mel_pad = padding_mask(reg.lens, reg.x.size(1));
    o.mel = mel_head(decoder(reg.x, o.mel_pad));
    o.mel_post = o.mel + postnet(o.mel);
    return o;
  }
  nn::Embedding embed{nullptr}, pitch_emb{nullptr}, energy_emb{nullptr};
  FftStack encoder{nullptr}, decoder{nullptr};
  VariancePredictor duration{nullptr}, pitch{nullptr}, energy{nullptr};
  nn::Linear mel_head{nullptr};
  std::vector<nn::Conv1d> post_convs;
  std::vector<nn::BatchNorm1d> post_bns;
  torch::Tensor pitch_bins_, energy_bins_;
};
TORCH_MODULE(FastSpeech2);

struct Losses { torch::Tensor total, mel, postnet, duration, pitch, energy; };
// Predictions are [B, T, n_mels]; the targets stay channels-first, [B, n_mels, T], as loaded.
Losses fastspeech2_loss(const FsOutput &o, const Batch &b) {
  const auto n_mels = o.mel.size(-1);
  auto target = b.mels.transpose(1, 2); // [B, T, n_mels] like the prediction
  auto src_keep = o.src_pad.logical_not(), keep = o.mel_pad.logical_not();
  auto dur = b.durations.clone(); // EXPECT: tensor-unnecessary-clone
  auto log_dur_target = torch::log(dur.to(torch::kFloat) + 1.0);
  Losses l;
  l.duration = F::mse_loss(o.log_dur.masked_select(src_keep), log_dur_target.masked_select(src_keep));
  l.pitch = F::mse_loss(o.pitch.masked_select(src_keep), b.pitch.masked_select(src_keep));
  l.energy = F::mse_loss(o.energy.masked_select(src_keep), b.energy.masked_select(src_keep));
  // FACT: p = torch.arange(7).unsqueeze(0) >= torch.tensor([3, 7]).unsqueeze(1); k = p.logical_not(); assert is_view_of(k.view(-1), k)
  auto frames = keep.view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- a fresh [B, T] mask is contiguous
  // FACT: m = torch.randn(2, 80, 7); assert raises(lambda: m.transpose(1, 2).view(-1, 80), "view size is not compatible")
  auto target_frames = target.view({-1, n_mels}).index({frames}); // EXPECT: tensor-view-non-contiguous
  // FACT: y = torch.nn.Linear(4, 80)(torch.randn(2, 7, 4)); assert is_view_of(y.reshape(-1, 80), y)
  l.mel = F::l1_loss(o.mel.reshape({-1, n_mels}).index({frames}), target_frames); // LOOKALIKE: tensor-reshape-non-contiguous -- the mel head's output is contiguous: a view
  // FACT: a = torch.randn(2, 7, 80); s = a + torch.randn(2, 80, 7).transpose(1, 2); assert is_view_of(s.reshape(-1, 80), s)
  l.postnet = F::l1_loss(o.mel_post.reshape({-1, n_mels}).index({frames}), target_frames); // LOOKALIKE: tensor-reshape-non-contiguous -- the sum takes the contiguous mel's layout
  l.total = l.mel + l.postnet + l.duration + l.pitch + l.energy;
  return l;
}

Batch to_device(const Batch &b, torch::Device d) {
  return {b.phonemes.to(d), b.text_lens.to(d), b.mels.to(d), b.mel_lens.to(d), b.durations.to(d), b.pitch.to(d), b.energy.to(d)};
}

double validate(FastSpeech2 &model, const std::vector<Batch> &val, const MelStats &stats, torch::Device device) {
  model->eval();
  auto mean = stats.mel_mean.to(device).view({1, -1, 1}), stdev = stats.mel_std.to(device).view({1, -1, 1});
  auto total = torch::zeros({}, torch::TensorOptions().device(device));
  for (const auto &batch : val) {
    auto b = to_device(batch, device);
    b.mels = (b.mels - mean) / stdev;
    auto out = model->forward(b.phonemes, b.text_lens, b.durations, b.pitch, b.energy, b.mels.size(2));
    total += fastspeech2_loss(out, b).mel; // EXPECT: tensor-graph-kept-across-iterations
  }
  model->train();
  return total.item<double>() / static_cast<double>(val.size());
}

void train(FastSpeech2 &model, const std::vector<Batch> &data, const std::vector<Batch> &val, const MelStats &stats, const FsConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.9, 0.98}).eps(1e-9));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto &batch : data) {
      auto b = to_device(batch, device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      b.mels = (b.mels - stats.mel_mean.to(device).view({1, -1, 1})) / stats.mel_std.to(device).view({1, -1, 1}); // EXPECT: tensor-clone-in-loop
      auto l = fastspeech2_loss(model->forward(b.phonemes, b.text_lens, b.durations, b.pitch, b.energy, b.mels.size(2)), b);
      opt.zero_grad();
      l.total.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.grad_clip);
      opt.step();
      epoch_loss += l.total.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
    }
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / static_cast<double>(data.size()) // LOOKALIKE: tensor-sync-in-loop -- once per pass over the data
              << " val mel l1 " << validate(model, val, stats, device) << "\n";
  }
}

// Each sentence alone (a batch of one), at the requested speaking rate; mels for the vocoder.
std::vector<torch::Tensor> synthesize(FastSpeech2 &model, const std::vector<std::vector<int64_t>> &sentences, const MelStats &stats, double rate) {
  torch::NoGradGuard no_grad;
  const torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  auto mean = stats.mel_mean.to(device), stdev = stats.mel_std.to(device); // LOOKALIKE: tensor-clone-in-loop -- moved once, before the loop
  std::vector<torch::Tensor> mels;
  for (const auto &ids : sentences) {
    auto phonemes = torch::tensor(ids, torch::kLong).unsqueeze(0).to(device);
    auto lens = torch::full({1}, static_cast<int64_t>(ids.size()), torch::TensorOptions().dtype(torch::kLong).device(device));
    auto out = model->forward(phonemes, lens, {}, {}, {}, 0, 1.0 / rate);
    mels.push_back((out.mel_post.squeeze(0) * stdev + mean).t().cpu()); // LOOKALIKE: tensor-sync-in-loop -- the host mel is kept for the vocoder
  }
  return mels;
}
