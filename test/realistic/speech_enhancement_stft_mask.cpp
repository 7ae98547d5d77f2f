// Single-channel speech enhancement by spectral masking. Noisy waveforms (clean speech mixed
// on the fly with noise clips at a random SNR) go through an STFT with return_complex; a causal
// convolutional mask network reads the log-magnitude frames and predicts a gain per bin, applied
// to the magnitude and recombined with the noisy phase before the inverse STFT. Training
// minimises negative SI-SDR plus a small waveform L1 term. Inference comes in two forms: long
// files in overlapping chunks with a cross-fade, and a hop-by-hop low-latency streamer.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct EnhanceConfig {
  int64_t n_fft = 512, hop = 128, hidden = 256, context = 4, segment = 32000, batch = 16;
  int64_t epochs = 60, steps_per_epoch = 2000, log_every = 200, preview_every = 1000, chunk = 64000, overlap = 8000;
  double lr = 5e-4, mask_floor = 0.05, snr_min = -5.0, snr_max = 20.0, clip = 5.0, l1_weight = 10.0;
};

// Waveforms [B, L] at 16 kHz, float in [-1, 1].
struct NoisyBatch { torch::Tensor noisy, clean; };

// [B, H, T] -> [B, T, H]: one feature vector per STFT frame.
torch::Tensor frames_last(const torch::Tensor &h) { return h.transpose(1, 2); }

struct MaskNetImpl : nn::Module {
  MaskNetImpl(int64_t freq_bins, const EnhanceConfig &cfg) : context_(cfg.context), floor_(cfg.mask_floor) {
    conv = register_module("conv", nn::Conv1d(nn::Conv1dOptions(freq_bins, cfg.hidden, cfg.context)));
    fc1 = register_module("fc1", nn::Linear(cfg.hidden, cfg.hidden));
    fc2 = register_module("fc2", nn::Linear(cfg.hidden, freq_bins));
    torch::NoGradGuard no_grad;
    fc2->bias.fill_(2.0); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard: masks start near 0.88, close to pass-through
  }
  // log-magnitude [B, F, T] -> mask [B, F, T] in [floor, 1]; frame t sees frames t - context + 1 .. t.
  torch::Tensor forward(const torch::Tensor &logmag) {
    const auto B = logmag.size(0), Fq = logmag.size(1), T = logmag.size(2);
    auto h = torch::relu(conv(F::pad(logmag, F::PadFuncOptions({context_ - 1, 0}))));
    // FACT: h = torch.relu(torch.randn(2, 16, 10)); r = h.transpose(1, 2).reshape(20, -1); assert is_copy_of(r, h)
    auto frames = frames_last(h).reshape({B * T, -1}); // EXPECT: tensor-reshape-non-contiguous
    auto m = torch::sigmoid(fc2(torch::relu(fc1(frames))));
    // FACT: x = torch.randn(6, 8, requires_grad=True); m = torch.sigmoid(x); m.clamp_(0.05, 1.0); assert backward_fails(lambda: (m * 2).sum().backward())
    m.clamp_(floor_, 1.0); // EXPECT: tensor-inplace-on-saved
    // FACT: m = torch.sigmoid(torch.nn.Linear(8, 257)(torch.randn(20, 8))); assert is_view_of(m.view(2, 10, 257), m)
    return m.view({B, T, Fq}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- the Linear/sigmoid output is contiguous
  }
  int64_t context_;
  double floor_;
  nn::Conv1d conv{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(MaskNet);

struct EnhancerImpl : nn::Module {
  explicit EnhancerImpl(const EnhanceConfig &cfg) : n_fft_(cfg.n_fft), hop_(cfg.hop) {
    window_ = register_buffer("window", torch::hann_window(cfg.n_fft));
    masknet = register_module("masknet", MaskNet(cfg.n_fft / 2 + 1, cfg));
  }
  // [B, L] -> complex [B, n_fft / 2 + 1, frames]
  torch::Tensor spectrum(const torch::Tensor &wav) {
    return torch::stft(wav, n_fft_, hop_, n_fft_, window_, /*center=*/true, "reflect", /*normalized=*/false, /*onesided=*/true, // LOOKALIKE: tensor-device-mismatch -- the window is a registered buffer: it moves with the module
                       /*return_complex=*/true);
  }
  torch::Tensor forward(const torch::Tensor &noisy) {
    auto spec = spectrum(noisy);
    auto mag = spec.abs(), phase = torch::angle(spec);
    auto mask = masknet(torch::log1p(mag));
    auto est = torch::polar(mag * mask, phase);
    return torch::istft(est, n_fft_, hop_, n_fft_, window_, /*center=*/true, /*normalized=*/false, /*onesided=*/true, noisy.size(-1));
  }
  int64_t n_fft_, hop_;
  torch::Tensor window_;
  MaskNet masknet{nullptr};
};
TORCH_MODULE(Enhancer);

// Scale-invariant SDR in dB per row of [B, L].
torch::Tensor si_sdr(const torch::Tensor &est, const torch::Tensor &ref, double eps = 1e-8) {
  auto e = est - est.mean(-1, /*keepdim=*/true);
  auto s = ref - ref.mean(-1, /*keepdim=*/true);
  auto target = (e * s).sum(-1, true) / (s.pow(2).sum(-1, true) + eps) * s;
  auto noise = e - target;
  return 10 * torch::log10(target.pow(2).sum(-1) / (noise.pow(2).sum(-1) + eps) + eps);
}

// Scales the noise to the requested SNR against the clean segment and adds it.
torch::Tensor mix_at_snr(const torch::Tensor &clean, const torch::Tensor &noise, double snr_db) {
  auto n = noise.flatten();
  auto gain = torch::sqrt(clean.pow(2).mean() / n.pow(2).mean().clamp_min(1e-10)) * std::pow(10.0, -snr_db / 20.0);
  // FACT: bank = torch.randn(3, 100); seg = bank[1].narrow(0, 10, 50); n = seg.flatten(); n.mul_(0.1); assert shares_storage(n, bank)
  n.mul_(gain); // EXPECT: tensor-alias-then-mutate
  auto noisy = clean + n;
  // FACT: c = torch.randn(50); n = torch.randn(50); y = c + n; y.clamp_(-1.0, 1.0); assert is_copy_of(y, c) and is_copy_of(y, n)
  noisy.clamp_(-1.0, 1.0); // LOOKALIKE: tensor-alias-then-mutate -- the sum is a new tensor
  return noisy;
}

int64_t rand_index(size_t n) { return torch::randint(0, static_cast<int64_t>(n), {1}).item<int64_t>(); }

torch::Tensor random_segment(const torch::Tensor &wav, int64_t len) {
  const auto off = torch::randint(0, wav.size(0) - len + 1, {1}).item<int64_t>();
  return wav.narrow(0, off, len);
}

class NoiseMixer {
public:
  NoiseMixer(std::vector<torch::Tensor> noise_bank, const EnhanceConfig &cfg) : bank_(std::move(noise_bank)), cfg_(cfg) {}

  NoisyBatch sample(const std::vector<torch::Tensor> &utts) const {
    std::vector<torch::Tensor> noisy, clean;
    for (int64_t i = 0; i < cfg_.batch; ++i) {
      auto c = random_segment(utts[rand_index(utts.size())], cfg_.segment);
      auto n = random_segment(bank_[rand_index(bank_.size())], cfg_.segment);
      const double snr = cfg_.snr_min + (cfg_.snr_max - cfg_.snr_min) * torch::rand({1}).item<double>();
      noisy.push_back(mix_at_snr(c, n, snr));
      clean.push_back(c);
    }
    return {torch::stack(noisy), torch::stack(clean)};
  }

private:
  std::vector<torch::Tensor> bank_;
  EnhanceConfig cfg_;
};

double validate(Enhancer &model, const std::vector<NoisyBatch> &val, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> scores;
  for (const auto &b : val)
    scores.push_back(si_sdr(model->forward(b.noisy.to(device)), b.clean.to(device))); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
  return torch::cat(scores).mean().item<double>();
}

void train_enhancer(Enhancer &model, const NoiseMixer &mixer, const std::vector<torch::Tensor> &train_utts, const std::vector<NoisyBatch> &val,
                    const EnhanceConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::vector<torch::Tensor> previews;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double running = 0;
    for (int64_t it = 0; it < cfg.steps_per_epoch; ++it) {
      auto batch = mixer.sample(train_utts);
      auto noisy = batch.noisy.to(device), clean = batch.clean.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new mixture every step
      auto est = model->forward(noisy);
      if (++step % cfg.preview_every == 0) {
        auto preview = est.detach()[0];
        // FACT: e = torch.nn.Linear(8, 8)(torch.randn(2, 8)); before = e.detach().clone(); p = e.detach()[0]; p.div_(p.abs().max()); assert shares_storage(p, e) and not torch.equal(e.detach(), before)
        preview.div_(preview.abs().max().clamp_min(1e-4)); // EXPECT: tensor-inplace-on-detached
        previews.push_back(preview.cpu()); // LOOKALIKE: tensor-graph-kept-across-iterations, tensor-sync-in-loop -- a detached host copy, kept as data
      }
      auto loss = -si_sdr(est, clean).mean() + cfg.l1_weight * (est - clean).abs().mean();
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop
      if (step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << running / static_cast<double>(it + 1) << "\n";
    }
    std::cout << "epoch " << epoch << " val SI-SDR " << validate(model, val, device) << " dB, " << previews.size() << " previews\n";
  }
}

// Long recordings: chunks of cfg.chunk samples overlapping by cfg.overlap, cross-faded linearly.
torch::Tensor enhance_file(Enhancer &model, const torch::Tensor &wav, const EnhanceConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  const auto L = wav.size(0), C = cfg.chunk, O = cfg.overlap;
  auto fade_in = torch::linspace(0.0, 1.0, O);
  auto fade_out = fade_in.flip({0});
  std::vector<torch::Tensor> pieces;
  torch::Tensor tail;
  for (int64_t start = 0; start < L; start += C - O) {
    const auto len = std::min(C, L - start);
    auto y = model->forward(wav.narrow(0, start, len).to(device).unsqueeze(0)).squeeze(0); // LOOKALIKE: tensor-clone-in-loop -- a different chunk every iteration
    if (tail.defined()) {
      auto blended = y.narrow(0, 0, O) * fade_in + tail * fade_out; // EXPECT: tensor-device-mismatch
      y = torch::cat({blended, y.narrow(0, O, len - O)});
    }
    const bool last = start + C >= L;
    pieces.push_back(last ? y : y.narrow(0, 0, len - O)); // EXPECT: tensor-graph-kept-across-iterations
    if (last)
      break;
    tail = y.narrow(0, len - O, O); // LOOKALIKE: tensor-graph-kept-across-iterations -- one handle, overwritten every chunk
  }
  return torch::cat(pieces).cpu();
}

// Low-latency mode on the CPU: one hop in, one hop out (latency n_fft samples). The mask network
// sees the last `context` log-magnitude frames, kept in a small history.
class StreamingEnhancer {
public:
  StreamingEnhancer(Enhancer model, const EnhanceConfig &cfg) : model_(std::move(model)), cfg_(cfg) {
    model_->eval();
    window_ = torch::hann_window(cfg.n_fft);
    in_buf_ = torch::zeros({cfg.n_fft});
    out_buf_ = torch::zeros({cfg.n_fft});
    history_ = torch::zeros({cfg.context, cfg.n_fft / 2 + 1});
  }

  torch::Tensor push(const torch::Tensor &hop_samples) {
    torch::NoGradGuard no_grad;
    const auto N = cfg_.n_fft, H = cfg_.hop, K = cfg_.context;
    // FACT: b = torch.randn(512); h = torch.randn(128); nb = torch.cat([b.narrow(0, 128, 384), h]); assert is_copy_of(nb, b)
    in_buf_ = torch::cat({in_buf_.narrow(0, H, N - H), hop_samples}); // LOOKALIKE: tensor-inplace-overlap -- cat writes a new buffer
    auto spec = torch::fft::rfft(in_buf_ * window_);
    // FACT: h = torch.zeros(4, 257); assert raises(lambda: h.narrow(0, 0, 3).copy_(h.narrow(0, 1, 3)), "refer to a single memory location")
    history_.narrow(0, 0, K - 1).copy_(history_.narrow(0, 1, K - 1)); // EXPECT: tensor-inplace-overlap
    history_[K - 1] = torch::log1p(spec.abs()); // LOOKALIKE: tensor-copy-narrowing -- float32 magnitudes into a float32 history
    auto mask = model_->masknet(history_.t().unsqueeze(0)).select(2, K - 1).squeeze(0);
    auto frame = torch::fft::irfft(spec * mask, N) * window_;
    // FACT: o = torch.zeros(512); f = torch.fft.irfft(torch.randn(257, dtype=torch.complex64), 512); o.add_(f, alpha=0.5); assert is_copy_of(o, f)
    out_buf_.add_(frame, 8.0 * static_cast<double>(H) / (3.0 * static_cast<double>(N))); // LOOKALIKE: tensor-inplace-overlap -- the frame is irfft's own tensor
    auto out = out_buf_.narrow(0, 0, H);
    out_buf_ = torch::cat({out_buf_.narrow(0, H, N - H), torch::zeros({H})});
    return out;
  }

private:
  Enhancer model_;
  EnhanceConfig cfg_;
  torch::Tensor window_, in_buf_, out_buf_, history_;
};
