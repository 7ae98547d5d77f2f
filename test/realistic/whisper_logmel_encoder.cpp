// Whisper-style audio front end: 16 kHz mono clips padded/trimmed to 30 s, 25 ms Hann windows
// every 10 ms, power spectrum, 80-bin Slaney mel filterbank, log10 with an 8 dB floor below
// the peak, then the encoder's conv stem and sinusoidal positions. Includes a streaming ring.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct AudioConfig {
  int64_t sample_rate = 16000;
  int64_t n_fft = 400;
  int64_t hop = 160;
  int64_t n_mels = 80;
  int64_t chunk_seconds = 30;
  int64_t d_model = 512;
  int64_t n_ctx = 1500;
  int64_t batch_size = 8;
  int64_t n_samples() const { return sample_rate * chunk_seconds; }
  int64_t n_frames() const { return n_samples() / hop; }
};

static double hz_to_mel(double f) {
  const double f_sp = 200.0 / 3, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp;
  const double logstep = std::log(6.4) / 27.0;
  return f < min_log_hz ? f / f_sp : min_log_mel + std::log(f / min_log_hz) / logstep;
}

static torch::Tensor mel_to_hz(const torch::Tensor& m) {
  const double f_sp = 200.0 / 3, min_log_hz = 1000.0, min_log_mel = min_log_hz / f_sp;
  const double logstep = std::log(6.4) / 27.0;
  return torch::where(m < min_log_mel, m * f_sp, min_log_hz * torch::exp(logstep * (m - min_log_mel)));
}

// Slaney-normalised triangular filters: [n_mels, n_fft / 2 + 1].
torch::Tensor mel_filterbank(const AudioConfig& cfg) {
  const int64_t n_freq = cfg.n_fft / 2 + 1;
  auto fft_freqs = torch::linspace(0, cfg.sample_rate / 2.0, n_freq);
  auto mel_pts = torch::linspace(hz_to_mel(0.0), hz_to_mel(cfg.sample_rate / 2.0), cfg.n_mels + 2);
  auto hz_pts = mel_to_hz(mel_pts);
  auto fdiff = hz_pts.narrow(0, 1, cfg.n_mels + 1) - hz_pts.narrow(0, 0, cfg.n_mels + 1);
  auto ramps = hz_pts.unsqueeze(1) - fft_freqs.unsqueeze(0);
  auto lower = -ramps.narrow(0, 0, cfg.n_mels) / fdiff.narrow(0, 0, cfg.n_mels).unsqueeze(1);
  auto upper = ramps.narrow(0, 2, cfg.n_mels) / fdiff.narrow(0, 1, cfg.n_mels).unsqueeze(1);
  auto weights = torch::clamp_min(torch::min(lower, upper), 0.0);
  auto enorm = 2.0 / (hz_pts.narrow(0, 2, cfg.n_mels) - hz_pts.narrow(0, 0, cfg.n_mels));
  return weights * enorm.unsqueeze(1);
}

torch::Tensor pad_or_trim(const torch::Tensor& audio, int64_t length) {
  const int64_t n = audio.size(-1);
  if (n > length) return audio.narrow(-1, 0, length);
  if (n < length) return F::pad(audio, F::PadFuncOptions({0, length - n}));
  return audio;
}

// Remove DC and bring the clip to a common peak level before the transform.
torch::Tensor prepare_waveform(const torch::Tensor& wav, int64_t length) {
  // FACT: w = torch.randn(16000); x = w.to(torch.float32); x.sub_(x.mean()); assert shares_storage(x, w)
  auto x = wav.to(torch::kFloat);  // decoders may hand back float64
  x.sub_(x.mean()); // EXPECT: tensor-alias-then-mutate
  auto peak = x.abs().max().clamp_min(1e-5);
  return pad_or_trim(x / peak * 0.95, length);
}

class LogMelFrontend {
 public:
  explicit LogMelFrontend(const AudioConfig& cfg)
      : cfg_(cfg), window_(torch::hann_window(cfg.n_fft)), filters_(mel_filterbank(cfg)) {}

  // audio: [B, n_samples] -> log-mel [B, n_mels, n_frames]
  torch::Tensor log_mel(const torch::Tensor& audio) const {
    const int64_t B = audio.size(0);
    auto padded = F::pad(audio.unsqueeze(1), F::PadFuncOptions({cfg_.n_fft / 2, cfg_.n_fft / 2}).mode(torch::kReflect)).squeeze(1);
    auto frames = padded.unfold(1, cfg_.n_fft, cfg_.hop);  // [B, F, n_fft], overlapping windows
    const int64_t n_frames = frames.size(1);
    // FACT: a = torch.randn(2, 4000); f = a.unfold(1, 400, 160); assert is_copy_of(f.reshape(-1, 400), a)
    auto flat = frames.reshape({B * n_frames, cfg_.n_fft}); // EXPECT: tensor-reshape-non-contiguous
    auto spec = torch::fft::rfft(flat * window_, cfg_.n_fft, -1);
    // FACT: s = torch.fft.rfft(torch.randn(6, 16), 16, -1); p = s.abs().pow(2); assert is_view_of(p.view(2, 3, -1), p)
    auto power = spec.abs().pow(2).view({B, n_frames, -1}).narrow(1, 0, n_frames - 1); // LOOKALIKE: tensor-view-non-contiguous -- the rfft of a contiguous batch is contiguous
    auto mel = torch::matmul(power, filters_.t()).transpose(1, 2);  // [B, n_mels, F - 1]
    auto log_spec = torch::clamp_min(mel, 1e-10).log10();
    // FACT: m = torch.rand(2, 7, 5).transpose(1, 2); l = m.clamp_min(1e-10).log10(); assert raises(lambda: l.view(2, -1), "view size is not compatible")
    auto peak = std::get<0>(log_spec.view({B, -1}).max(1)); // EXPECT: tensor-view-non-contiguous
    log_spec = torch::maximum(log_spec, (peak - 8.0).view({B, 1, 1}));
    return (log_spec + 4.0) / 4.0;
  }

  // Long recordings: consecutive 30 s chunks, each through the same filterbank.
  std::vector<torch::Tensor> log_mel_chunks(const torch::Tensor& recording) const {
    std::vector<torch::Tensor> out;
    const int64_t n = cfg_.n_samples();
    for (int64_t start = 0; start < recording.size(0); start += n) {
      auto chunk = pad_or_trim(recording.narrow(0, start, std::min(n, recording.size(0) - start)), n);
      auto fb_t = filters_.t().contiguous(); // EXPECT: tensor-clone-in-loop
      auto windows = chunk.unfold(0, cfg_.n_fft, cfg_.hop) * window_;
      auto power = torch::fft::rfft(windows, cfg_.n_fft, -1).abs().pow(2);
      auto log_spec = torch::matmul(power, fb_t).clamp_min(1e-10).log10();
      log_spec = torch::maximum(log_spec, log_spec.max() - 8.0);
      out.push_back(((log_spec + 4.0) / 4.0).t());
    }
    return out;
  }

  const AudioConfig& config() const { return cfg_; }

 private:
  AudioConfig cfg_;
  torch::Tensor window_, filters_;
};

torch::Tensor sinusoids(int64_t length, int64_t channels, double max_timescale = 10000.0) {
  const double log_inc = std::log(max_timescale) / static_cast<double>(channels / 2 - 1);
  auto inv = torch::exp(-log_inc * torch::arange(channels / 2, torch::kFloat));
  auto scaled = torch::arange(length, torch::kFloat).unsqueeze(1) * inv.unsqueeze(0);
  return torch::cat({scaled.sin(), scaled.cos()}, 1);
}

class AudioStemImpl : public torch::nn::Module {
 public:
  explicit AudioStemImpl(const AudioConfig& cfg, double pos_scale = 1.0) : pos_scale_(pos_scale) {
    namespace nn = torch::nn;
    conv1_ = register_module("conv1", nn::Conv1d(nn::Conv1dOptions(cfg.n_mels, cfg.d_model, 3).padding(1)));
    conv2_ = register_module("conv2", nn::Conv1d(nn::Conv1dOptions(cfg.d_model, cfg.d_model, 3).stride(2).padding(1)));
    ln_post_ = register_module("ln_post", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})));
    positional_embedding_ = register_buffer("positional_embedding", sinusoids(cfg.n_ctx, cfg.d_model));
  }

  // mel: [B, n_mels, n_frames] -> [B, T, d_model]
  torch::Tensor forward(const torch::Tensor& mel) {
    auto h = F::gelu(conv1_->forward(mel));
    auto x = F::gelu(conv2_->forward(h)).permute({0, 2, 1});
    const int64_t B = x.size(0), T = x.size(1);
    auto pos = positional_embedding_.narrow(0, 0, T).unsqueeze(0).expand({B, T, -1});
    if (pos_scale_ != 1.0) {
      // FACT: p = torch.randn(10, 8); e = p.narrow(0, 0, 6).unsqueeze(0).expand(3, 6, -1); assert raises(lambda: e.mul_(0.5), "more than one element")
      pos.mul_(pos_scale_); // EXPECT: tensor-inplace-on-expanded
    }
    // FACT: p = torch.randn(10, 8); e = p.narrow(0, 0, 6).unsqueeze(0).expand(3, 6, -1); x = torch.randn(3, 8, 6).permute(0, 2, 1); x.add_(e)
    x.add_(pos); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded positions are only read
    return ln_post_->forward(x);
  }

  // Mean-pooled clip embedding plus per-frame tokens for a linear probe.
  std::pair<torch::Tensor, torch::Tensor> embed(const torch::Tensor& mel) {
    auto tokens = forward(mel);
    const int64_t D = tokens.size(2);
    // FACT: x = torch.randn(2, 8, 6).permute(0, 2, 1); y = torch.nn.LayerNorm(8)(x); assert is_contiguous(y) and is_view_of(y.reshape(-1, 8), y)
    auto frames = tokens.reshape({-1, D}); // LOOKALIKE: tensor-reshape-non-contiguous -- LayerNorm writes a contiguous output
    return {tokens.mean(1), frames};
  }

 private:
  double pos_scale_;
  torch::nn::Conv1d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::LayerNorm ln_post_{nullptr};
  torch::Tensor positional_embedding_;
};
TORCH_MODULE(AudioStem);

// Streaming: the last n_ctx mel frames (time-major) and their energies, for a VAD gate.
class MelRing {
 public:
  MelRing(int64_t n_ctx, int64_t n_mels)
      : frames_(torch::zeros({n_ctx, n_mels})), energy_(torch::zeros({n_ctx})) {}

  void push(const torch::Tensor& frame) {  // frame: [n_mels]
    const int64_t L = frames_.size(0);
    // FACT: c = torch.randn(6, 4); assert raises(lambda: c.narrow(0, 0, 5).copy_(c.narrow(0, 1, 5)), "some elements of the input tensor")
    frames_.narrow(0, 0, L - 1).copy_(frames_.narrow(0, 1, L - 1)); // EXPECT: tensor-inplace-overlap
    frames_.narrow(0, L - 1, 1).copy_(frame.unsqueeze(0));
    // FACT: e = torch.randn(6); e.narrow(0, 0, 5).copy_(e.narrow(0, 1, 5).clone())
    energy_.narrow(0, 0, L - 1).copy_(energy_.narrow(0, 1, L - 1).clone()); // LOOKALIKE: tensor-inplace-overlap -- the shifted source is cloned first
    energy_[L - 1] = frame.exp().sum().log();
  }

  // [n_mels, n_ctx]: a copy the caller can keep while the ring moves on.
  torch::Tensor window() const {
    auto w = frames_.t().clone(); // LOOKALIKE: tensor-unnecessary-clone -- returned; the ring is overwritten by the next push
    return w;
  }
  bool voiced(double thr) const { return energy_.mean().item<double>() > thr; }

 private:
  torch::Tensor frames_, energy_;
};

// Batched inference over a list of clips; returns per-clip embeddings on the host.
std::vector<torch::Tensor> encode_clips(AudioStem& encoder, const LogMelFrontend& frontend,
                                        const std::vector<torch::Tensor>& clips) {
  torch::NoGradGuard no_grad;
  const auto& cfg = frontend.config();
  const torch::Device device(torch::kCUDA);
  encoder->to(device);
  encoder->eval();
  std::vector<torch::Tensor> results;
  const int64_t n = static_cast<int64_t>(clips.size());
  for (int64_t start = 0; start < n; start += cfg.batch_size) {
    const int64_t bs = std::min(cfg.batch_size, n - start);
    auto audio = torch::zeros({bs, cfg.n_samples()});
    for (int64_t i = 0; i < bs; ++i) {
      auto wav = clips[start + i].to(torch::kFloat); // LOOKALIKE: tensor-clone-in-loop -- a different clip each iteration
      // FACT: c = [torch.randn(8)]; c0 = c[0].clone(); w = c[0].to(torch.float32); x = w.to(torch.float32); x.sub_(x.mean()); assert shares_storage(x, c[0]) and not torch.equal(c[0], c0)
      audio[i].copy_(prepare_waveform(wav, cfg.n_samples())); // EXPECT: tensor-alias-then-mutate -- prepare_waveform writes its argument: to() returned the clip itself
    }
    auto mel = frontend.log_mel(audio);
    auto emb = encoder->embed(mel).first; // EXPECT: tensor-device-mismatch
    for (int64_t i = 0; i < bs; ++i)
      results.push_back(emb[i].cpu()); // LOOKALIKE: tensor-sync-in-loop -- the host copy is the result and is kept
  }
  return results;
}
