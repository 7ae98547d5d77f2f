// Framing a waveform and computing a magnitude spectrogram for a keyword spotter.
#include <torch/torch.h>

torch::Tensor frames(const torch::Tensor &wave, int64_t frame_len, int64_t hop) {
  // wave: [B, N] -> [B, n_frames, frame_len] (overlapping windows)
  return wave.unfold(1, frame_len, hop);
}

torch::Tensor log_mel(const torch::Tensor &wave, const torch::Tensor &mel_fb, int64_t n_fft, int64_t hop) {
  auto window = torch::hann_window(n_fft);
  auto spec = torch::stft(wave, n_fft, hop, n_fft, window, true, "reflect", false, c10::nullopt, true);
  auto mag = spec.abs().pow(2);              // [B, F, T]
  auto mel = torch::matmul(mel_fb, mag);     // [B, M, T]
  return torch::log(mel + 1e-6);
}

torch::Tensor frame_features(const torch::Tensor &wave, int64_t frame_len, int64_t hop) {
  auto f = frames(wave, frame_len, hop);
  auto B = wave.size(0);
  // FACT: w = torch.randn(2, 20); f = w.unfold(1, 4, 2); assert not is_contiguous(f) and is_copy_of(f.reshape(2, -1), w)
  return f.reshape({B, -1}); // EXPECT: tensor-reshape-non-contiguous
}

torch::Tensor time_major(const torch::Tensor &log_mel_bmt) {
  auto T = log_mel_bmt.size(2);
  // FACT: m = torch.randn(2, 3, 4); assert is_view_of(m.permute(2, 0, 1).reshape(4, -1), m)
  return log_mel_bmt.permute({2, 0, 1}).reshape({T, -1}); // LOOKALIKE: tensor-reshape-non-contiguous -- B and M keep their order and strides: a view
}
