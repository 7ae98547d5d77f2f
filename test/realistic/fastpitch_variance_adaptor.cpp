// FastPitch-style TTS: FFT encoder/decoder, duration and pitch predictors, length regulation.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

namespace fastpitch {

struct PredictorConfig {
  int64_t in_dim = 384, filter_size = 256, kernel_size = 3, n_layers = 2;
  double dropout = 0.1, init_bias = 0.0;
};

struct Config {
  int64_t n_symbols = 148, n_speakers = 4, n_mel = 80;
  int64_t d_model = 384, n_heads = 2, d_inner = 1536, n_layers = 6;
  PredictorConfig duration{384, 256, 3, 2, 0.1, 1.0};
  PredictorConfig pitch{384, 256, 3, 2, 0.1, 0.0};
  double pitch_mean = 214.72, pitch_std = 65.72;
  double dur_weight = 0.1, pitch_weight = 0.1;
  double max_duration = 75.0;
};

torch::Tensor sequence_mask(const torch::Tensor& lengths, int64_t max_len) {
  auto ids = torch::arange(max_len, lengths.options());  // LOOKALIKE: tensor-device-mismatch -- arange is created on the device of lengths
  return ids.unsqueeze(0) < lengths.unsqueeze(1);
}

struct FFTBlockImpl : torch::nn::Module {
  FFTBlockImpl(int64_t d_model, int64_t n_heads, int64_t d_inner, int64_t kernel, double dropout)
      : n_heads(n_heads), d_head(d_model / n_heads) {
    qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    proj = register_module("proj", torch::nn::Linear(d_model, d_model));
    conv1 = register_module(
        "conv1", torch::nn::Conv1d(torch::nn::Conv1dOptions(d_model, d_inner, kernel).padding(kernel / 2)));
    conv2 = register_module("conv2", torch::nn::Conv1d(torch::nn::Conv1dOptions(d_inner, d_model, 1)));
    norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    drop = register_module("drop", torch::nn::Dropout(dropout));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const auto B = x.size(0), T = x.size(1);
    auto parts = qkv(x).chunk(3, -1);
    // FACT: assert (lambda y: is_view_of(y.chunk(3, -1)[0].view(2, 5, 2, 2), y) and not is_contiguous(y.chunk(3, -1)[0]))(torch.randn(2, 5, 12))
    auto q = parts[0].view({B, T, n_heads, d_head}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- only the last dim of the chunk is split, which any stride allows
    auto k = parts[1].view({B, T, n_heads, d_head}).transpose(1, 2);
    auto v = parts[2].view({B, T, n_heads, d_head}).transpose(1, 2);

    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d_head));
    scores.masked_fill_(~mask.view({B, 1, 1, T}), -1e4);
    auto attn = torch::softmax(scores, -1);
    // FACT: assert backward_fails(lambda: (lambda a: (a.masked_fill_(torch.tensor([True, False, False]), 0.0), a.sum().backward()))(torch.softmax(torch.randn(3, requires_grad=True), -1)))
    attn.masked_fill_(~mask.view({B, 1, T, 1}), 0.0);  // EXPECT: tensor-inplace-on-saved
    auto ctx = torch::matmul(drop(attn), v);
    // FACT: assert raises(lambda: torch.randn(2, 2, 5, 3).transpose(1, 2).view(2, 5, 6), "view size is not compatible")
    auto merged = ctx.transpose(1, 2).view({B, T, n_heads * d_head});  // EXPECT: tensor-view-non-contiguous
    auto m = mask.unsqueeze(-1).to(x.scalar_type());
    auto h = norm1(x + drop(proj(merged))) * m;
    auto ff = conv2(torch::relu(conv1(h.transpose(1, 2)))).transpose(1, 2);
    return norm2(h + drop(ff)) * m;
  }

  int64_t n_heads, d_head;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::nn::Conv1d conv1{nullptr}, conv2{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(FFTBlock);

torch::Tensor run_stack(const torch::nn::ModuleList& layers, torch::Tensor x, const torch::Tensor& mask) {
  for (const auto& layer : *layers) x = layer->as<FFTBlock>()->forward(x, mask);
  return x;
}

struct ConvReLUNormImpl : torch::nn::Module {
  ConvReLUNormImpl(int64_t in_ch, int64_t out_ch, int64_t kernel, double dropout) {
    conv = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(in_ch, out_ch, kernel).padding(kernel / 2)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({out_ch})));
    drop = register_module("drop", torch::nn::Dropout(dropout));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(conv(x.transpose(1, 2)));
    return drop(norm(h.transpose(1, 2)));
  }

  torch::nn::Conv1d conv{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(ConvReLUNorm);

struct TemporalPredictorImpl : torch::nn::Module {
  explicit TemporalPredictorImpl(const PredictorConfig& c) {
    for (int64_t i = 0; i < c.n_layers; ++i)
      layers->push_back(ConvReLUNorm(i == 0 ? c.in_dim : c.filter_size, c.filter_size, c.kernel_size, c.dropout));
    register_module("layers", layers);
    fc = register_module("fc", torch::nn::Linear(c.filter_size, 1));
    // FACT: assert raises(lambda: torch.nn.Linear(4, 1).bias.fill_(1.0), "leaf Variable")
    fc->bias.fill_(c.init_bias);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& enc, const torch::Tensor& mask) {
    auto m = mask.unsqueeze(-1).to(enc.scalar_type());
    auto h = enc * m;
    for (const auto& layer : *layers) {
      h = layer->as<ConvReLUNorm>()->forward(h);
      // FACT: assert not raises(lambda: (lambda x: (lambda h: (h.mul_(0.5), h.sum().backward()))(torch.nn.functional.dropout(torch.nn.functional.layer_norm(x, (4,)), 0.1, True)))(torch.randn(3, 4, requires_grad=True)))
      h.mul_(m);  // LOOKALIKE: tensor-inplace-on-saved -- neither layer_norm nor dropout saves its output for backward
    }
    return (fc(h) * m).squeeze(-1);
  }

  torch::nn::ModuleList layers;
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TemporalPredictor);

// Repeats every encoder frame durations[b][i] times (scaled by 1 / pace).
std::pair<torch::Tensor, torch::Tensor> regulate_length(const torch::Tensor& enc, const torch::Tensor& durations,
                                                        double pace) {
  auto reps = torch::round(durations.to(torch::kFloat) / pace).to(torch::kLong);
  auto dec_lens = reps.sum(1);
  const auto max_len = dec_lens.max().item<int64_t>();
  auto ends = torch::cumsum(reps, 1);
  auto starts = ends - reps;
  auto frames = torch::arange(max_len).view({1, 1, -1});
  auto span = (frames >= starts.unsqueeze(-1)) & (frames < ends.unsqueeze(-1));  // EXPECT: tensor-device-mismatch
  return {torch::matmul(span.transpose(1, 2).to(enc.scalar_type()), enc), dec_lens};
}

// Voiced frames to zero mean / unit variance; unvoiced frames stay at zero.
torch::Tensor normalize_pitch(const torch::Tensor& pitch_hz, double mean, double std) {
  auto voiced = pitch_hz > 0.0;
  // FACT: assert (lambda a: shares_storage(a.to(torch.float32), a))(torch.rand(2, 7))
  auto pitch = pitch_hz.to(torch::kFloat);
  pitch.sub_(mean).div_(std);  // EXPECT: tensor-alias-then-mutate
  return pitch.masked_fill_(~voiced, 0.0);
}

struct Output { torch::Tensor mel, mel_lens, log_dur, pitch; };

struct FastPitchImpl : torch::nn::Module {
  explicit FastPitchImpl(const Config& c) : cfg(c) {
    embed = register_module("embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(c.n_symbols, c.d_model).padding_idx(0)));
    speaker = register_module("speaker", torch::nn::Embedding(c.n_speakers, c.d_model));
    for (int64_t i = 0; i < c.n_layers; ++i) {
      encoder->push_back(FFTBlock(c.d_model, c.n_heads, c.d_inner, 3, 0.1));
      decoder->push_back(FFTBlock(c.d_model, c.n_heads, c.d_inner, 3, 0.1));
    }
    register_module("encoder", encoder);
    register_module("decoder", decoder);
    dur_pred = register_module("dur_pred", TemporalPredictor(c.duration));
    pitch_pred = register_module("pitch_pred", TemporalPredictor(c.pitch));
    pitch_emb = register_module("pitch_emb", torch::nn::Conv1d(torch::nn::Conv1dOptions(1, c.d_model, 3).padding(1)));
    proj = register_module("proj", torch::nn::Linear(c.d_model, c.n_mel));
    torch::NoGradGuard no_grad;
    speaker->weight.normal_(0.0, 0.1);  // LOOKALIKE: tensor-inplace-on-leaf -- initialisation runs under NoGradGuard
  }

  Output forward(const torch::Tensor& text, const torch::Tensor& text_lens, const torch::Tensor& speaker_ids,
                 const torch::Tensor& dur_tgt, const torch::Tensor& pitch_tgt, double pace = 1.0) {
    auto mask = sequence_mask(text_lens, text.size(1));
    auto x = embed(text);
    auto spk = speaker(speaker_ids).unsqueeze(1).expand_as(x);
    // FACT: assert raises(lambda: torch.randn(2, 1, 4).expand(2, 3, 4).mul_(torch.ones(2, 3, 1)), "more than one element")
    spk.mul_(mask.unsqueeze(-1));  // EXPECT: tensor-inplace-on-expanded
    auto enc = run_stack(encoder, x + spk, mask);

    auto log_dur = dur_pred(enc, mask);
    auto pitch = pitch_pred(enc, mask);
    auto pitch_in = pitch_tgt.defined() ? pitch_tgt : pitch;
    enc = enc + pitch_emb(pitch_in.unsqueeze(1)).transpose(1, 2);

    torch::Tensor durations = dur_tgt;
    if (!durations.defined()) {
      durations = torch::empty_like(log_dur, torch::kLong);
      durations.copy_(torch::clamp(torch::exp(log_dur) - 1.0, 0.0, cfg.max_duration));  // EXPECT: tensor-copy-narrowing
    }
    auto [frames, mel_lens] = regulate_length(enc, durations, pace);
    auto mel = proj(run_stack(decoder, frames, sequence_mask(mel_lens, frames.size(1))));
    return {mel, mel_lens, log_dur, pitch};
  }

  Config cfg;
  torch::nn::Embedding embed{nullptr}, speaker{nullptr};
  torch::nn::ModuleList encoder, decoder;
  TemporalPredictor dur_pred{nullptr}, pitch_pred{nullptr};
  torch::nn::Conv1d pitch_emb{nullptr};
  torch::nn::Linear proj{nullptr};
};
TORCH_MODULE(FastPitch);

struct Losses { torch::Tensor total, mel, dur, pitch; };

Losses fastpitch_loss(const Output& out, const torch::Tensor& mel_tgt, const torch::Tensor& mel_lens,
                      const torch::Tensor& dur_tgt, const torch::Tensor& pitch_tgt, const torch::Tensor& text_lens,
                      const Config& cfg) {
  auto mel_mask = sequence_mask(mel_lens, mel_tgt.size(1)).unsqueeze(-1).to(mel_tgt.scalar_type());
  auto mel_err = torch::mse_loss(out.mel, mel_tgt, at::Reduction::None);
  // FACT: assert not raises(lambda: (lambda x: torch.nn.functional.mse_loss(x * 1.0, torch.zeros(3), reduction="none").mul_(torch.ones(3)).sum().backward())(torch.randn(3, requires_grad=True)))
  mel_err.mul_(mel_mask);  // LOOKALIKE: tensor-inplace-on-saved -- mse_loss saves its inputs, not its result
  auto mel_loss = mel_err.sum() / (mel_mask.sum() * cfg.n_mel);

  auto txt_mask = sequence_mask(text_lens, dur_tgt.size(1)).to(mel_tgt.scalar_type());
  auto n_tokens = txt_mask.sum();
  auto log_dur_tgt = torch::log1p(dur_tgt.to(torch::kFloat));
  auto dur_loss = (torch::mse_loss(out.log_dur, log_dur_tgt, at::Reduction::None) * txt_mask).sum() / n_tokens;
  auto pitch_loss = (torch::mse_loss(out.pitch, pitch_tgt, at::Reduction::None) * txt_mask).sum() / n_tokens;
  return {mel_loss + cfg.dur_weight * dur_loss + cfg.pitch_weight * pitch_loss, mel_loss, dur_loss, pitch_loss};
}

struct Batch { torch::Tensor text, text_lens, mel, mel_lens, durations, pitch, speaker; };

struct LossMeter {
  explicit LossMeter(torch::Device d) : mel(torch::zeros({}, d)), dur(torch::zeros({}, d)) {}
  torch::Tensor mel, dur;
  int64_t steps = 0;
};

double train_epoch(FastPitch& model, torch::optim::Optimizer& opt, std::vector<Batch>& batches, const Config& cfg,
                   torch::Device device, LossMeter& meter, int64_t log_every = 50) {
  model->train();
  double running = 0.0;
  for (auto& b : batches) {
    auto pitch_hz = b.pitch.to(device);
    auto pitch_tgt = normalize_pitch(pitch_hz, cfg.pitch_mean, cfg.pitch_std);
    auto text_lens = b.text_lens.to(device);
    auto durations = b.durations.to(device);
    auto out = model->forward(b.text.to(device), text_lens, b.speaker.to(device), durations, pitch_tgt);
    auto losses = fastpitch_loss(out, b.mel.to(device), b.mel_lens.to(device), durations, pitch_tgt, text_lens, cfg);

    opt.zero_grad();
    losses.total.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1000.0);
    opt.step();

    meter.mel += losses.mel.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- the detached value carries no graph
    meter.dur += losses.dur;  // EXPECT: tensor-graph-kept-across-iterations
    running += losses.total.item<double>();  // EXPECT: tensor-sync-in-loop
    if (++meter.steps % log_every == 0) {
      auto f0 = pitch_hz.masked_select(pitch_hz > 0.0).mean();
      std::cout << "step " << meter.steps << " mel " << losses.mel.item<double>()  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
                << " mean f0 " << f0.item<double>() << " Hz\n";
    }
  }
  return running / static_cast<double>(batches.size());
}

std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> synthesize(
    FastPitch& model, const std::vector<torch::Tensor>& texts, const torch::Tensor& speaker_ids, const Config& cfg,
    torch::Device device, double pace = 1.0) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> mels, f0s;
  for (const auto& t : texts) {
    auto text = t.unsqueeze(0).to(device);
    auto lens = torch::full({1}, t.size(0), torch::TensorOptions().dtype(torch::kLong).device(device));
    auto spk = speaker_ids.to(device);  // EXPECT: tensor-clone-in-loop
    auto out = model->forward(text, lens, spk, torch::Tensor(), torch::Tensor(), pace);
    // FACT: assert (lambda p: is_copy_of(p * 2.0 + 1.0, p))(torch.randn(1, 7))
    auto f0 = out.pitch * cfg.pitch_std + cfg.pitch_mean;
    f0.clamp_min_(0.0);  // LOOKALIKE: tensor-alias-then-mutate -- f0 is a fresh result, out.pitch is untouched
    const auto n = out.mel_lens.item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the frame count is needed on the host to trim the output
    mels.push_back(out.mel[0].narrow(0, 0, n).cpu());
    f0s.push_back(f0.squeeze(0).cpu());
  }
  return {mels, f0s};
}

torch::Tensor pad_mels(const std::vector<torch::Tensor>& mels, int64_t n_mel) {
  int64_t max_len = 0;
  for (const auto& m : mels) max_len = std::max(max_len, m.size(0));
  auto out = torch::zeros({static_cast<int64_t>(mels.size()), max_len, n_mel});
  for (size_t i = 0; i < mels.size(); ++i) {
    out[i].narrow(0, 0, mels[i].size(0)).copy_(mels[i]);  // LOOKALIKE: tensor-copy-narrowing -- both sides are float32
  }
  return out;
}

}  // namespace fastpitch

int main() {
  using namespace fastpitch;
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Config cfg;
  FastPitch model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(),
                         torch::optim::AdamOptions(1e-3).betas(std::make_tuple(0.9, 0.98)).eps(1e-9));

  std::vector<Batch> batches;
  for (int i = 0; i < 8; ++i) {
    auto dur = torch::randint(1, 6, {4, 40});
    auto frames = dur.sum(1);
    batches.push_back({torch::randint(1, cfg.n_symbols, {4, 40}), torch::full({4}, 40, torch::kLong),
                       torch::randn({4, frames.max().item<int64_t>(), cfg.n_mel}), frames, dur,
                       torch::rand({4, 40}) * 300.0, torch::randint(0, cfg.n_speakers, {4})});
  }

  LossMeter meter(device);
  for (int epoch = 0; epoch < 3; ++epoch) {
    const double avg = train_epoch(model, opt, batches, cfg, device, meter);
    std::cout << "epoch " << epoch << " loss " << avg << " dur " << (meter.dur / meter.steps).item<double>() << "\n";
  }

  std::vector<torch::Tensor> texts = {torch::randint(1, cfg.n_symbols, {23}), torch::randint(1, cfg.n_symbols, {31})};
  auto [mels, f0s] = synthesize(model, texts, torch::tensor({1}, torch::kLong), cfg, device);
  std::cout << "synthesized " << pad_mels(mels, cfg.n_mel).sizes() << "\n";
  return 0;
}
