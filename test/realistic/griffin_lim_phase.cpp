// Griffin-Lim vocoder for a TTS front end that predicts normalised dB mel spectrograms:
// mel -> linear magnitude through the pseudo-inverse of the mel filterbank, then the fast
// Griffin-Lim iteration (Perraudin et al. 2013, momentum 0.99) with the STFT and ISTFT written out
// by hand (centre reflect padding, periodic Hann window, rfft of unfold frames, overlap-add
// divided by the summed squared window), de-emphasis, and 16-bit PCM for the WAV writer.
// Copy synthesis rebuilds reference recordings from their own mels to measure the phase error
// alone, without any acoustic-model error.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

constexpr double kPi = 3.14159265358979323846;

struct GriffinLimConfig {
  int64_t sample_rate = 22050, n_fft = 1024, hop = 256, n_mels = 80, n_iter = 60;
  double fmin = 0.0, fmax = 8000.0, momentum = 0.99, power = 1.5, preemph = 0.97;
  double min_db = -100.0, ref_db = 20.0;
};

double hz_to_mel(double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); }

// Triangular filters on the HTK mel scale, Slaney area normalisation: [n_mels, n_fft / 2 + 1].
torch::Tensor mel_filterbank(const GriffinLimConfig &c) {
  const int64_t n_freqs = c.n_fft / 2 + 1;
  auto fft_hz = torch::linspace(0.0, c.sample_rate / 2.0, n_freqs);
  auto mel_pts = torch::linspace(hz_to_mel(c.fmin), hz_to_mel(c.fmax), c.n_mels + 2);
  auto hz_pts = 700.0 * (torch::pow(10.0, mel_pts / 2595.0) - 1.0);
  auto width = hz_pts.slice(0, 1) - hz_pts.slice(0, 0, -1);
  auto ramps = hz_pts.unsqueeze(1) - fft_hz.unsqueeze(0);
  auto lower = -ramps.slice(0, 0, c.n_mels) / width.slice(0, 0, c.n_mels).unsqueeze(1);
  auto upper = ramps.slice(0, 2) / width.slice(0, 1).unsqueeze(1);
  auto fb = torch::clamp_min(torch::min(lower, upper), 0.0);
  auto enorm = 2.0 / (hz_pts.slice(0, 2) - hz_pts.slice(0, 0, c.n_mels));
  return fb * enorm.unsqueeze(1);
}

// Normalised dB mel in [0, 1], [B, n_mels, T] or [n_mels, T] -> linear magnitude^power [B, F, T].
torch::Tensor mel_to_linear(const torch::Tensor &mel, const torch::Tensor &inv_fb, const GriffinLimConfig &c) {
  auto db = mel.reshape({-1, mel.size(-2), mel.size(-1)});
  // FACT: mel = torch.rand(80, 50); m0 = mel.clone(); db = mel.reshape(-1, mel.size(-2), mel.size(-1)); db.clamp_(0, 1).mul_(100.0).add_(-80.0); assert shares_storage(db, mel) and not torch.equal(mel, m0)
  db.clamp_(0.0, 1.0).mul_(-c.min_db).add_(c.min_db + c.ref_db); // EXPECT: tensor-alias-then-mutate -- reshape of the caller's contiguous mel is a view: its mel is denormalised in place
  auto amp = torch::pow(10.0, db / 20.0);
  auto lin = torch::matmul(inv_fb, amp);
  // FACT: inv = torch.randn(9, 4); a = torch.rand(2, 4, 6); lin = torch.matmul(inv, a); lin.clamp_min_(1e-10).pow_(1.5); assert is_copy_of(lin, a) and is_copy_of(lin, inv)
  lin.clamp_min_(1e-10).pow_(c.power); // LOOKALIKE: tensor-alias-then-mutate -- matmul made a new tensor
  return lin;
}

// wave [B, L] (or [..., L]) -> complex spectrogram [B, F, T] in torch.stft's layout.
torch::Tensor stft(const torch::Tensor &wave, const torch::Tensor &window, const GriffinLimConfig &c) {
  namespace F = torch::nn::functional;
  // FACT: w = torch.randn(2, 100)[:, 10:90]; x = torch.randn(2, 3, 100); assert is_view_of(w.reshape(-1, w.size(-1)), w) and is_view_of(x.reshape(-1, x.size(-1)), x)
  auto x = wave.reshape({-1, wave.size(-1)}); // LOOKALIKE: tensor-reshape-non-contiguous -- the sample dim stays apart: a view, even of a narrowed batch
  auto padded = F::pad(x.unsqueeze(1), F::PadFuncOptions({c.n_fft / 2, c.n_fft / 2}).mode(torch::kReflect)).squeeze(1);
  auto frames = padded.unfold(1, c.n_fft, c.hop);
  auto spec = torch::fft::rfft(frames * window, c.n_fft, -1);
  return spec.transpose(1, 2);
}

// spec [B, F, T] -> wave [B, hop * (T - 1)]: inverse rfft of each frame, window, overlap-add,
// divided by the summed squared window (Hann at hop <= n_fft / 2 never sums to zero inside).
torch::Tensor istft(const torch::Tensor &spec, const torch::Tensor &window, const GriffinLimConfig &c) {
  auto frames = torch::fft::irfft(spec.transpose(1, 2), c.n_fft, -1) * window;
  const int64_t B = frames.size(0), T = frames.size(1);
  const int64_t L = c.n_fft + c.hop * (T - 1);
  auto out = torch::zeros({B, L}, frames.options());
  auto wsum = torch::zeros({L}, frames.options());
  auto wsq = window.pow(2);
  for (int64_t t = 0; t < T; ++t) {
    // FACT: out = torch.zeros(2, 40); fr = torch.randn(2, 5, 16); s = fr.select(1, 1); out.narrow(1, 8, 16).add_(s); assert is_copy_of(out, fr) and torch.equal(out[:, 8:24], s)
    out.narrow(1, t * c.hop, c.n_fft).add_(frames.select(1, t)); // LOOKALIKE: tensor-inplace-overlap -- the frames are another tensor: the windows of out overlap only each other
    wsum.narrow(0, t * c.hop, c.n_fft).add_(wsq);
  }
  out.div_(wsum.clamp_min(1e-11));
  return out.narrow(1, c.n_fft / 2, c.hop * (T - 1));
}

struct Reconstruction {
  torch::Tensor wave;        // [B, hop * (T - 1)] on the reconstruction device
  torch::Tensor convergence; // [B] spectral convergence of the final estimate, on the host
};

// Fast Griffin-Lim from a linear magnitude [B, F, T].
Reconstruction griffin_lim(const torch::Tensor &mag, const GriffinLimConfig &c) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto target = mag.to(device);
  const int64_t B = target.size(0);
  auto window = torch::hann_window(c.n_fft);
  auto angles = torch::polar(torch::ones_like(target), 2.0 * kPi * torch::rand_like(target)); // LOOKALIKE: tensor-device-mismatch -- the random phases are made like the target, on its device
  const double m = c.momentum / (1.0 + c.momentum);
  torch::Tensor tprev = torch::zeros_like(angles), rebuilt, wave;
  for (int64_t i = 0; i < c.n_iter; ++i) {
    auto win = window.to(device); // EXPECT: tensor-clone-in-loop -- the same window is copied to the GPU every iteration
    wave = istft(target * angles, win, c);
    rebuilt = stft(wave, win, c);
    // FACT: r_prev = torch.randn(4, dtype=torch.cfloat); tprev = r_prev; r = torch.randn(4, dtype=torch.cfloat); r0 = r.clone(); a = r - tprev.mul_(0.5); assert not shares_storage(tprev, r) and torch.equal(r, r0)
    angles = rebuilt - tprev.mul_(m); // LOOKALIKE: tensor-alias-then-mutate -- tprev holds the previous rebuilt spectrum, which nothing reads any more
    angles = angles / angles.abs().add(1e-16);
    tprev = rebuilt;
    auto sc = (rebuilt.abs() - target).norm() / target.norm();
    std::cout << "griffin-lim " << i << " spectral convergence " << sc.item<float>() << "\n"; // EXPECT: tensor-sync-in-loop -- waits for the GPU every iteration to print
  }
  // FACT: m = torch.matmul(torch.randn(9, 4), torch.rand(2, 4, 7)).clamp_min_(1e-10).pow_(1.5); assert is_view_of(m.view(2, -1), m)
  auto ref_norm = target.view({B, -1}).norm(2, 1); // LOOKALIKE: tensor-view-non-contiguous -- the magnitude from mel_to_linear is contiguous
  // FACT: sp = torch.fft.rfft(torch.randn(2, 7, 16), dim=-1).transpose(1, 2); m = torch.rand(2, 9, 7); assert raises(lambda: (sp.abs() - m).view(2, -1), "view size is not compatible")
  auto err = (rebuilt.abs() - target).view({B, -1}).norm(2, 1); // EXPECT: tensor-view-non-contiguous -- the difference takes the transposed layout of the STFT's spectrum
  return {wave, (err / ref_norm).cpu()};
}

// Pre-emphasis in place, as the feature extractor applied it: x[n] -= k x[n - 1].
void preemphasis_(torch::Tensor wav, double k) {
  // FACT: w = torch.randn(100); assert raises(lambda: w[1:].sub_(w[:-1], alpha=0.97), "some elements of the input tensor and the written-to tensor refer to a single memory location")
  wav.slice(0, 1).sub_(wav.slice(0, 0, -1), k); // EXPECT: tensor-inplace-overlap -- the source is the same samples shifted by one
}

// De-emphasis y[n] = x[n] + k y[n - 1]: a recursion, run on the host.
torch::Tensor deemphasis(const torch::Tensor &wav, double k) {
  // FACT: w = torch.randn(5); assert shares_storage(w.cpu(), w) and is_copy_of(w.cpu().clone(), w)
  auto y = wav.cpu().clone(); // LOOKALIKE: tensor-unnecessary-clone -- the accessor writes it, and cpu() of a host tensor is the caller's own
  auto a = y.accessor<float, 1>();
  for (int64_t n = 1; n < a.size(0); ++n)
    a[n] += static_cast<float>(k) * a[n - 1];
  return y;
}

torch::Tensor load_pcm16(const std::vector<int16_t> &samples) {
  auto raw = torch::from_blob(const_cast<int16_t *>(samples.data()), {static_cast<int64_t>(samples.size())}, torch::kShort);
  auto wav = torch::empty({raw.size(0)});
  // FACT: raw = torch.tensor([-32768, 123], dtype=torch.short); w = torch.empty(2); w.copy_(raw); assert w.tolist() == [-32768.0, 123.0]
  wav.copy_(raw); // LOOKALIKE: tensor-copy-narrowing -- int16 into float32 is exact
  wav.div_(32768.0);
  return wav;
}

std::vector<int16_t> to_pcm16(const torch::Tensor &wave) {
  // FACT: w = torch.randn(3, 40)[:, 8:32]; r = w[1]; assert r.is_contiguous() and shares_storage(r.flatten(), w)
  auto flat = wave.flatten(); // LOOKALIKE: tensor-reshape-non-contiguous -- one row of the batch: 1-D and contiguous already
  auto peak = flat.abs().max().clamp_min(1e-8);
  auto pcm = torch::empty({flat.numel()}, torch::kShort);
  // FACT: w = torch.tensor([0.5, -0.99999]); p = torch.empty(2, dtype=torch.short); p.copy_(w.flatten() / w.abs().max().clamp_min(1e-8) * 32767.0); assert p.tolist() == [16383, -32767]
  pcm.copy_(flat / peak * 32767.0); // EXPECT: tensor-copy-narrowing -- float samples truncated toward zero into int16
  return std::vector<int16_t>(pcm.data_ptr<int16_t>(), pcm.data_ptr<int16_t>() + pcm.numel());
}

// Predicted mels -> one 16-bit waveform per utterance.
std::vector<std::vector<int16_t>> synthesize(const std::vector<torch::Tensor> &mels, const GriffinLimConfig &c) {
  const auto inv_fb = torch::linalg::pinv(mel_filterbank(c));
  std::vector<std::vector<int16_t>> out;
  for (const auto &mel : mels) {
    auto rec = griffin_lim(mel_to_linear(mel, inv_fb, c), c);
    for (int64_t b = 0; b < rec.wave.size(0); ++b) {
      std::cout << "utterance " << out.size() << " spectral convergence " << rec.convergence[b].item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- the convergence came back to the host once
      out.push_back(to_pcm16(deemphasis(rec.wave[b], c.preemph)));
    }
  }
  return out;
}

// Mels of different lengths as one batch: padded to the longest with 0, the floor of the
// normalised dB scale (silence), so that one Griffin-Lim run serves the whole batch.
struct MelBatch {
  torch::Tensor mels;          // [B, n_mels, T_max]
  std::vector<int64_t> frames; // each utterance's own length
};

MelBatch pad_batch(const std::vector<torch::Tensor> &mels) {
  int64_t t_max = 0;
  for (const auto &m : mels)
    t_max = std::max(t_max, m.size(1));
  MelBatch batch{torch::zeros({static_cast<int64_t>(mels.size()), mels.at(0).size(0), t_max}), {}};
  for (size_t i = 0; i < mels.size(); ++i) {
    // FACT: b = torch.zeros(2, 4, 9); m = torch.rand(4, 6); b[1].narrow(1, 0, 6).copy_(m); assert torch.equal(b[1, :, :6], m)
    batch.mels[static_cast<int64_t>(i)].narrow(1, 0, mels[i].size(1)).copy_(mels[i]); // LOOKALIKE: tensor-copy-narrowing -- float32 mels into a float32 batch: nothing converts
    batch.frames.push_back(mels[i].size(1));
  }
  return batch;
}

std::vector<std::vector<int16_t>> synthesize_batched(const std::vector<torch::Tensor> &mels, const GriffinLimConfig &c) {
  const auto inv_fb = torch::linalg::pinv(mel_filterbank(c));
  auto batch = pad_batch(mels);
  auto rec = griffin_lim(mel_to_linear(batch.mels, inv_fb, c), c);
  std::vector<std::vector<int16_t>> out;
  for (size_t i = 0; i < mels.size(); ++i) {
    auto wave = rec.wave[static_cast<int64_t>(i)].narrow(0, 0, c.hop * (batch.frames[i] - 1));
    out.push_back(to_pcm16(deemphasis(wave, c.preemph)));
  }
  return out;
}

// Copy synthesis: recordings -> their own normalised mels -> Griffin-Lim. Mean spectral convergence.
double copy_synthesis_error(const std::vector<std::vector<int16_t>> &recordings, const GriffinLimConfig &c) {
  const auto fb = mel_filterbank(c);
  const auto inv_fb = torch::linalg::pinv(fb);
  auto window = torch::hann_window(c.n_fft);
  double total = 0.0;
  for (const auto &pcm : recordings) {
    auto wav = load_pcm16(pcm);
    preemphasis_(wav, c.preemph);
    auto lin = stft(wav.unsqueeze(0), window, c).abs();
    auto mel_db = 20.0 * torch::log10(torch::matmul(fb, lin).clamp_min(1e-5)) - c.ref_db;
    auto mel = ((mel_db - c.min_db) / -c.min_db).clamp(0.0, 1.0);
    auto rec = griffin_lim(mel_to_linear(mel, inv_fb, c), c);
    total += rec.convergence.mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- a host tensor, read once per recording after a whole reconstruction
  }
  return recordings.empty() ? 0.0 : total / static_cast<double>(recordings.size());
}
