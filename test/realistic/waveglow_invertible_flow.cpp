// WaveGlow-style flow vocoder: invertible 1x1 convolutions, affine coupling layers
// conditioned on upsampled mel spectrograms through a WaveNet-like WN stack.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct WaveGlowConfig {
  int64_t n_mel_channels = 80, n_flows = 12, n_group = 8;
  int64_t n_early_every = 4, n_early_size = 2;
  int64_t wn_layers = 8, wn_channels = 256, wn_kernel = 3;
  int64_t hop = 256, win = 1024;
  double sigma = 1.0, max_wav_value = 32768.0;
};

class Invertible1x1ConvImpl : public torch::nn::Module {
 public:
  explicit Invertible1x1ConvImpl(int64_t channels) {
    auto W = std::get<0>(torch::linalg_qr(torch::randn({channels, channels})));
    if (torch::det(W).item<double>() < 0) {
      W.select(1, 0).mul_(-1);  // LOOKALIKE: tensor-inplace-on-leaf -- W is a plain QR factor here, registered as a parameter only below
    }
    weight = register_parameter("weight", W);
  }

  // z' = W z at every time step; log|det W| counted once per position.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& z) {
    const int64_t batch = z.size(0);
    const int64_t n_of_groups = z.size(2);
    const int64_t c = weight.size(0);
    auto log_det_W = torch::logdet(weight) * static_cast<double>(batch * n_of_groups);
    // FACT: q = torch.linalg.qr(torch.randn(4, 4))[0]; assert not is_contiguous(q) and not raises(lambda: q.view(4, 4, 1))
    auto kernel = weight.view({c, c, 1});  // LOOKALIKE: tensor-view-non-contiguous -- QR's Q is column-major, but appending a size-1 dim is always a view
    return {F::conv1d(z, kernel), log_det_W};
  }

  torch::Tensor reverse(const torch::Tensor& z) {
    if (!W_inverse_.defined()) {
      torch::NoGradGuard no_grad;
      W_inverse_ = weight.inverse().unsqueeze(-1);
    }
    return F::conv1d(z, W_inverse_);
  }

  torch::Tensor weight;

 private:
  torch::Tensor W_inverse_;
};
TORCH_MODULE(Invertible1x1Conv);

class WNImpl : public torch::nn::Module {
 public:
  WNImpl(int64_t n_in, int64_t n_cond, const WaveGlowConfig& cfg)
      : n_layers_(cfg.wn_layers), n_channels_(cfg.wn_channels) {
    using namespace torch::nn;
    start_ = register_module("start", Conv1d(Conv1dOptions(n_in, n_channels_, 1)));
    cond_ = register_module("cond_layer", Conv1d(Conv1dOptions(n_cond, 2 * n_channels_ * n_layers_, 1)));
    for (int64_t i = 0; i < n_layers_; ++i) {
      const int64_t dilation = int64_t{1} << i;
      const int64_t padding = (cfg.wn_kernel * dilation - dilation) / 2;
      in_layers_.push_back(register_module(
          "in_" + std::to_string(i),
          Conv1d(Conv1dOptions(n_channels_, 2 * n_channels_, cfg.wn_kernel).dilation(dilation).padding(padding))));
      const int64_t rs = i < n_layers_ - 1 ? 2 * n_channels_ : n_channels_;
      res_skip_.push_back(register_module("res_skip_" + std::to_string(i), Conv1d(Conv1dOptions(n_channels_, rs, 1))));
    }
    end_ = register_module("end", Conv1d(Conv1dOptions(n_channels_, 2 * n_in, 1)));
    // Zero-init the last layer so every coupling starts as the identity.
    torch::NoGradGuard no_grad;
    end_->weight.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    end_->bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor& audio, const torch::Tensor& spect) {
    auto h = start_(audio);
    auto output = torch::zeros_like(h);
    auto cond = cond_(spect);
    for (int64_t i = 0; i < n_layers_; ++i) {
      auto in_act = in_layers_[i](h) + cond.narrow(1, 2 * i * n_channels_, 2 * n_channels_);
      auto t_act = torch::tanh(in_act.narrow(1, 0, n_channels_));
      auto s_act = torch::sigmoid(in_act.narrow(1, n_channels_, n_channels_));
      t_act.mul_(s_act);  // EXPECT: tensor-inplace-on-saved
      auto res_skip = res_skip_[i](t_act);
      if (i < n_layers_ - 1) {
        h = h + res_skip.narrow(1, 0, n_channels_);
        output += res_skip.narrow(1, n_channels_, n_channels_);  // LOOKALIKE: tensor-inplace-on-saved -- a zeros_like accumulator of conv outputs; add saves nothing
      } else {
        output += res_skip;
      }
    }
    return end_(output);
  }

 private:
  int64_t n_layers_;
  int64_t n_channels_;
  torch::nn::Conv1d start_{nullptr}, cond_{nullptr}, end_{nullptr};
  std::vector<torch::nn::Conv1d> in_layers_, res_skip_;
};
TORCH_MODULE(WN);

struct FlowOutput {
  torch::Tensor z;
  std::vector<torch::Tensor> log_s;
  std::vector<torch::Tensor> log_det_W;
};

class WaveGlowImpl : public torch::nn::Module {
 public:
  explicit WaveGlowImpl(const WaveGlowConfig& cfg) : cfg_(cfg) {
    upsample_ = register_module(
        "upsample", torch::nn::ConvTranspose1d(
                        torch::nn::ConvTranspose1dOptions(cfg.n_mel_channels, cfg.n_mel_channels, cfg.win).stride(cfg.hop)));
    int64_t n_half = cfg.n_group / 2;
    int64_t n_remaining = cfg.n_group;
    for (int64_t k = 0; k < cfg.n_flows; ++k) {
      if (k % cfg.n_early_every == 0 && k > 0) {
        n_half -= cfg.n_early_size / 2;
        n_remaining -= cfg.n_early_size;
      }
      convinv_.push_back(register_module("convinv_" + std::to_string(k), Invertible1x1Conv(n_remaining)));
      wn_.push_back(register_module("wn_" + std::to_string(k), WN(n_half, cfg.n_mel_channels * cfg.n_group, cfg)));
    }
    n_remaining_channels_ = n_remaining;
  }

  // [B, n_mel, frames] -> [B, n_mel * n_group, n_samples / n_group], aligned with the squeezed audio.
  torch::Tensor group_spect(const torch::Tensor& mel, int64_t n_samples) {
    auto spect = upsample_(mel);
    if (spect.size(2) > n_samples) spect = spect.narrow(2, 0, n_samples);
    auto grouped = spect.unfold(2, cfg_.n_group, cfg_.n_group).permute({0, 2, 1, 3});
    // FACT: s = torch.randn(2, 3, 16); g = s.unfold(2, 4, 4).permute(0, 2, 1, 3); assert raises(lambda: g.view(2, 4, -1), "view size") and not raises(lambda: g.contiguous().view(2, 4, -1))
    grouped = grouped.contiguous().view({grouped.size(0), grouped.size(1), -1});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() right before the view
    return grouped.permute({0, 2, 1});
  }

  // [B, T] -> [B, n_group, T / n_group]
  torch::Tensor squeeze_audio(const torch::Tensor& audio) const {
    return audio.unfold(1, cfg_.n_group, cfg_.n_group).permute({0, 2, 1});
  }

  FlowOutput forward(const torch::Tensor& mel, const torch::Tensor& wav) {
    auto spect = group_spect(mel, wav.size(1));
    auto audio = squeeze_audio(wav);
    std::vector<torch::Tensor> early, log_s_list, log_det_list;
    for (int64_t k = 0; k < cfg_.n_flows; ++k) {
      if (k % cfg_.n_early_every == 0 && k > 0) {
        early.push_back(audio.narrow(1, 0, cfg_.n_early_size));  // LOOKALIKE: tensor-graph-kept-across-iterations -- the early outputs become z, which the loss differentiates
        audio = audio.narrow(1, cfg_.n_early_size, audio.size(1) - cfg_.n_early_size);
      }
      auto [z, log_det_W] = convinv_[k]->forward(audio);
      log_det_list.push_back(log_det_W);
      const int64_t n_half = z.size(1) / 2;
      auto audio_0 = z.narrow(1, 0, n_half);
      auto audio_1 = z.narrow(1, n_half, n_half);
      auto output = wn_[k]->forward(audio_0, spect);
      auto log_s = output.narrow(1, n_half, n_half);
      auto b = output.narrow(1, 0, n_half);
      audio_1 = torch::exp(log_s) * audio_1 + b;
      log_s_list.push_back(log_s);
      audio = torch::cat({audio_0, audio_1}, 1);
    }
    early.push_back(audio);
    return {torch::cat(early, 1), log_s_list, log_det_list};
  }

  torch::Tensor infer(const torch::Tensor& mel, double sigma) {
    torch::NoGradGuard no_grad;
    auto spect = group_spect(mel, mel.size(2) * cfg_.hop);
    const int64_t B = spect.size(0);
    const int64_t steps = spect.size(2);
    auto audio = torch::randn({B, n_remaining_channels_, steps}, spect.options()) * sigma;
    for (int64_t k = cfg_.n_flows - 1; k >= 0; --k) {
      const int64_t n_half = audio.size(1) / 2;
      auto audio_0 = audio.narrow(1, 0, n_half);
      auto audio_1 = audio.narrow(1, n_half, n_half);
      auto output = wn_[k]->forward(audio_0, spect);
      auto s = output.narrow(1, n_half, n_half);
      auto b = output.narrow(1, 0, n_half);
      audio_1 = (audio_1 - b) / torch::exp(s);
      audio = convinv_[k]->reverse(torch::cat({audio_0, audio_1}, 1));
      if (k % cfg_.n_early_every == 0 && k > 0) {
        auto z = torch::randn({B, cfg_.n_early_size, steps}, spect.options());
        audio = torch::cat({z * sigma, audio}, 1);  // LOOKALIKE: tensor-device-mismatch -- the noise was made with spect.options(), on spect's device
      }
    }
    // FACT: a = torch.randn(2, 8, 5); r = a.permute(0, 2, 1).reshape(2, -1); assert is_copy_of(r, a)
    return audio.permute({0, 2, 1}).reshape({B, -1});  // EXPECT: tensor-reshape-non-contiguous
  }

  const WaveGlowConfig& config() const { return cfg_; }

 private:
  WaveGlowConfig cfg_;
  int64_t n_remaining_channels_ = 0;
  torch::nn::ConvTranspose1d upsample_{nullptr};
  std::vector<Invertible1x1Conv> convinv_;
  std::vector<WN> wn_;
};
TORCH_MODULE(WaveGlow);

torch::Tensor waveglow_loss(const FlowOutput& out, double sigma) {
  torch::Tensor log_s_total = torch::zeros({}, out.z.options());
  torch::Tensor log_det_total = torch::zeros({}, out.z.options());
  for (size_t i = 0; i < out.log_s.size(); ++i) {
    log_s_total = log_s_total + out.log_s[i].sum();  // LOOKALIKE: tensor-graph-kept-across-iterations -- these sums are the loss itself; backward runs through them
    log_det_total = log_det_total + out.log_det_W[i];
  }
  const auto& z = out.z;
  auto loss = torch::sum(z * z) / (2 * sigma * sigma) - log_s_total - log_det_total;
  return loss / static_cast<double>(z.size(0) * z.size(1) * z.size(2));
}

// Debug view of a latent in sample order: [B, n_group, T / n_group] -> [B, T].
torch::Tensor latent_to_waveform(const torch::Tensor& z) {
  // FACT: z = torch.randn(2, 8, 5); assert raises(lambda: z.transpose(1, 2).view(2, -1), "view size is not compatible")
  return z.transpose(1, 2).view({z.size(0), -1});  // EXPECT: tensor-view-non-contiguous
}

// Int16 PCM (stored as float by the loader) -> [-1, 1] training segment.
torch::Tensor prepare_audio(const torch::Tensor& wav, const WaveGlowConfig& cfg, int64_t segment) {
  auto audio = wav.to(torch::kFloat);
  // FACT: w = torch.randn(64); a = w.to(torch.float32); a /= 32768.0; assert shares_storage(a, w) and torch.equal(a, w)
  audio /= cfg.max_wav_value;  // EXPECT: tensor-alias-then-mutate
  if (audio.size(0) >= segment) {
    const int64_t start = torch::randint(0, audio.size(0) - segment + 1, {1}).item<int64_t>();
    return audio.narrow(0, start, segment);
  }
  return F::pad(audio, F::PadFuncOptions({0, segment - audio.size(0)}));
}

// Reference waveform for SNR against the vocoder output; the loader's tensor stays untouched.
torch::Tensor reference_audio(const torch::Tensor& wav, const WaveGlowConfig& cfg) {
  auto ref = wav.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
  // FACT: w = torch.randn(64); r = w.to(torch.float32, copy=True); assert is_copy_of(r, w)
  ref.div_(cfg.max_wav_value);  // LOOKALIKE: tensor-alias-then-mutate -- to(..., copy=true) always copies
  return ref;
}

torch::Tensor to_pcm16(const torch::Tensor& audio, double max_wav_value) {
  auto pcm = torch::empty({audio.size(0)}, torch::kShort);
  pcm.copy_((audio * max_wav_value).round().clamp(-32768, 32767));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to the int16 range first
  return pcm;
}

struct MelAudioBatch {
  torch::Tensor mel;
  torch::Tensor audio;
};

void train_waveglow(WaveGlow& model, const std::vector<MelAudioBatch>& batches, int epochs) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  const double sigma = model->config().sigma;
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-4));
  double running = 0.0;
  int64_t step = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (const auto& batch : batches) {
      auto mel = batch.mel.to(device);
      auto audio = batch.audio.to(device);
      opt.zero_grad();
      auto out = model->forward(mel, audio);
      auto loss = waveglow_loss(out, sigma);
      loss.backward();
      opt.step();
      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      if (++step % 200 == 0) {
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>()  // LOOKALIKE: tensor-sync-in-loop -- only every 200th step
                  << " avg " << running / static_cast<double>(step) << "\n";
      }
    }
  }
}

// Vocodes a list of mels on the GPU and streams int16 samples into one ring buffer.
torch::Tensor synthesize(WaveGlow& model, const std::vector<torch::Tensor>& mels, double strength) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto& cfg = model->config();
  // Simple denoiser: the vocoder's response to a silent mel, kept on the host.
  auto silent = torch::full({1, cfg.n_mel_channels, 88}, -11.52).to(device);
  auto bias_audio = model->infer(silent, 0.0).cpu();
  int64_t total = 0;
  for (const auto& mel : mels) total += mel.size(1) * cfg.hop;
  auto ring = torch::zeros({total}, torch::kShort);
  int64_t offset = 0;
  for (const auto& mel : mels) {
    auto audio = model->infer(mel.unsqueeze(0).to(device), cfg.sigma).squeeze(0);
    const int64_t n = std::min(audio.size(0), bias_audio.size(1));
    audio.narrow(0, 0, n).sub_(bias_audio.select(0, 0).narrow(0, 0, n) * strength);  // EXPECT: tensor-device-mismatch
    auto wav = audio.clamp(-1.0, 1.0).cpu();
    ring.narrow(0, offset, wav.size(0)).copy_(wav * cfg.max_wav_value);  // EXPECT: tensor-copy-narrowing
    offset += wav.size(0);
  }
  return ring;
}
