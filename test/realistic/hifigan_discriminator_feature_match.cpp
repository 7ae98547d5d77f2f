// HiFi-GAN vocoder training: generator, multi-period discriminator (MPD),
// feature-matching + LSGAN losses and the alternating G/D training step.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct VocoderConfig {
  int64_t sample_rate = 22050;
  int64_t n_fft = 1024;
  int64_t hop = 256;
  int64_t win_length = 1024;
  int64_t n_mels = 80;
  double fmin = 0.0;
  double fmax = 8000.0;
  int64_t upsample_initial = 512;
  std::vector<int64_t> upsample_rates{8, 8, 2, 2};
  std::vector<int64_t> periods{2, 3, 5, 7, 11};
  double lr = 2e-4;
  double lambda_fm = 2.0;
  double lambda_mel = 45.0;
  int64_t log_every = 100;
};

constexpr double kSlope = 0.1;

inline torch::Tensor lrelu(const torch::Tensor& x) {
  return F::leaky_relu(x, F::LeakyReLUFuncOptions().negative_slope(kSlope));
}

// ---------------------------------------------------------------- generator
struct GeneratorImpl : nn::Module {
  explicit GeneratorImpl(const VocoderConfig& cfg) {
    conv_pre_ = register_module(
        "conv_pre", nn::Conv1d(nn::Conv1dOptions(cfg.n_mels, cfg.upsample_initial, 7).padding(3)));
    int64_t ch = cfg.upsample_initial;
    for (size_t i = 0; i < cfg.upsample_rates.size(); ++i) {
      const int64_t r = cfg.upsample_rates[i];
      ups_.push_back(register_module(
          "up" + std::to_string(i),
          nn::ConvTranspose1d(nn::ConvTranspose1dOptions(ch, ch / 2, 2 * r).stride(r).padding(r / 2))));
      ch /= 2;
    }
    conv_post_ = register_module("conv_post", nn::Conv1d(nn::Conv1dOptions(ch, 1, 7).padding(3)));

    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) {
      if (p.dim() > 1) p.normal_(0.0, 0.01); // LOOKALIKE: tensor-inplace-on-leaf -- init runs under NoGradGuard
    }
  }

  torch::Tensor forward(torch::Tensor mel) {
    auto x = conv_pre_->forward(mel);
    for (auto& up : ups_) {
      x = up->forward(lrelu(x));
    }
    return torch::tanh(conv_post_->forward(lrelu(x)));
  }

  nn::Conv1d conv_pre_{nullptr}, conv_post_{nullptr};
  std::vector<nn::ConvTranspose1d> ups_;
};
TORCH_MODULE(Generator);

// ------------------------------------------------------ period discriminator
struct DiscriminatorPImpl : nn::Module {
  explicit DiscriminatorPImpl(int64_t period) : period_(period) {
    const std::vector<int64_t> chans{1, 32, 128, 512, 1024, 1024};
    for (size_t i = 0; i + 1 < chans.size(); ++i) {
      const int64_t stride = (i + 2 < chans.size()) ? 3 : 1;
      convs_.push_back(register_module(
          "conv" + std::to_string(i),
          nn::Conv2d(nn::Conv2dOptions(chans[i], chans[i + 1], {5, 1}).stride({stride, 1}).padding({2, 0}))));
    }
    post_ = register_module("post", nn::Conv2d(nn::Conv2dOptions(1024, 1, {3, 1}).padding({1, 0})));
  }

  // x: [B, 1, T] waveform. Returns the score map (flattened) and every feature map.
  std::pair<torch::Tensor, std::vector<torch::Tensor>> forward(torch::Tensor x) {
    std::vector<torch::Tensor> fmap;
    const auto b = x.size(0);
    const auto c = x.size(1);
    auto t = x.size(2);
    if (t % period_ != 0) {
      const auto n_pad = period_ - t % period_;
      x = F::pad(x, F::PadFuncOptions({0, n_pad}).mode(torch::kReflect));
      t += n_pad;
    }
    // FACT: w = torch.randn(2, 1, 37); p = torch.nn.functional.pad(w, (0, 3), mode="reflect"); assert is_view_of(p.view(2, 1, 8, 5), p)
    x = x.view({b, c, t / period_, period_}); // LOOKALIKE: tensor-view-non-contiguous -- the padded (or incoming) waveform is contiguous, view only splits time
    for (auto& conv : convs_) {
      x = lrelu(conv->forward(x));
      fmap.push_back(x); // LOOKALIKE: tensor-graph-kept-across-iterations -- returned; the G loss backprops through the feature maps
    }
    x = post_->forward(x);
    fmap.push_back(x);
    // FACT: y = torch.nn.Conv2d(4, 1, (3, 1), padding=(1, 0))(torch.randn(2, 4, 6, 5)); assert is_view_of(y.flatten(1, -1), y)
    auto score = x.flatten(1, -1); // LOOKALIKE: tensor-reshape-non-contiguous -- conv output is contiguous, flatten is a view
    return {score, fmap};
  }

  int64_t period_;
  std::vector<nn::Conv2d> convs_;
  nn::Conv2d post_{nullptr};
};
TORCH_MODULE(DiscriminatorP);

struct MPDOutput {
  std::vector<torch::Tensor> real_scores, fake_scores;
  std::vector<std::vector<torch::Tensor>> real_fmaps, fake_fmaps;
};

struct MultiPeriodDiscriminatorImpl : nn::Module {
  explicit MultiPeriodDiscriminatorImpl(const std::vector<int64_t>& periods) {
    for (auto p : periods) discs_.push_back(register_module("p" + std::to_string(p), DiscriminatorP(p)));
  }
  MPDOutput forward(const torch::Tensor& real, const torch::Tensor& fake) {
    MPDOutput out;
    for (auto& d : discs_) {
      auto r = d->forward(real);
      auto g = d->forward(fake);
      out.real_scores.push_back(r.first);
      out.fake_scores.push_back(g.first);
      out.real_fmaps.push_back(std::move(r.second));
      out.fake_fmaps.push_back(std::move(g.second));
    }
    return out;
  }
  std::vector<DiscriminatorP> discs_;
};
TORCH_MODULE(MultiPeriodDiscriminator);

// ------------------------------------------------------------------- losses
torch::Tensor feature_matching_loss(const std::vector<std::vector<torch::Tensor>>& fr,
                                    const std::vector<std::vector<torch::Tensor>>& fg) {
  auto loss = torch::zeros({}, fg.front().front().options());
  for (size_t d = 0; d < fr.size(); ++d)
    for (size_t l = 0; l < fr[d].size(); ++l)
      loss = loss + torch::mean(torch::abs(fr[d][l] - fg[d][l])); // LOOKALIKE: tensor-graph-kept-across-iterations -- one step's sum, returned and backpropagated
  return loss;
}

torch::Tensor discriminator_loss(const std::vector<torch::Tensor>& dr, const std::vector<torch::Tensor>& dg) {
  auto loss = torch::zeros({}, dr.front().options());
  for (size_t i = 0; i < dr.size(); ++i)
    loss = loss + torch::mean(torch::pow(1.0 - dr[i], 2)) + torch::mean(torch::pow(dg[i], 2));
  return loss;
}

torch::Tensor generator_adv_loss(const std::vector<torch::Tensor>& dg) {
  auto loss = torch::zeros({}, dg.front().options());
  for (const auto& g : dg) loss = loss + torch::mean(torch::pow(1.0 - g, 2));
  return loss;
}

// ------------------------------------------------------------ audio helpers
torch::Tensor mel_filterbank(const VocoderConfig& cfg) {
  auto hz_to_mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  const int64_t n_freq = cfg.n_fft / 2 + 1;
  auto freqs = torch::linspace(0.0, cfg.sample_rate / 2.0, n_freq);
  auto mel_pts = torch::linspace(hz_to_mel(cfg.fmin), hz_to_mel(cfg.fmax), cfg.n_mels + 2);
  auto hz = 700.0 * (torch::pow(10.0, mel_pts / 2595.0) - 1.0);
  auto lower = hz.narrow(0, 0, cfg.n_mels).unsqueeze(1);
  auto center = hz.narrow(0, 1, cfg.n_mels).unsqueeze(1);
  auto upper = hz.narrow(0, 2, cfg.n_mels).unsqueeze(1);
  auto up = (freqs.unsqueeze(0) - lower) / (center - lower);
  auto down = (upper - freqs.unsqueeze(0)) / (upper - center);
  return torch::clamp_min(torch::min(up, down), 0.0);
}

// wav: [B, T] -> log-mel [B, n_mels, frames]
torch::Tensor mel_spectrogram(const torch::Tensor& wav, const torch::Tensor& basis, const torch::Tensor& window,
                              const VocoderConfig& cfg) {
  const int64_t pad = (cfg.n_fft - cfg.hop) / 2;
  auto x = F::pad(wav.unsqueeze(1), F::PadFuncOptions({pad, pad}).mode(torch::kReflect)).squeeze(1);
  auto spec = torch::view_as_real(
      torch::stft(x, cfg.n_fft, cfg.hop, cfg.win_length, window, false, true, true));
  // FACT: s = torch.rand(6, requires_grad=True); m = torch.sqrt(s + 1e-9); m.clamp_min_(1e-5); assert backward_fails(lambda: m.sum().backward())
  auto mag = torch::sqrt(spec.pow(2).sum(-1) + 1e-9);
  mag.clamp_min_(1e-5); // EXPECT: tensor-inplace-on-saved
  auto mel = torch::matmul(basis, mag);
  return torch::log(torch::clamp_min(mel, 1e-5));
}

// Scales each clip so its peak sits at `target`.
torch::Tensor peak_normalize(const torch::Tensor& wav, double target = 0.95) {
  auto y = wav;
  auto peak = y.abs().amax({-1}, true).clamp_min(1e-5);
  // FACT: w = torch.randn(2, 1, 50); y = w; y.mul_(0.5); assert shares_storage(y, w)
  y.mul_(target / peak); // EXPECT: tensor-alias-then-mutate
  return y;
}

// Per-phase RMS of a waveform folded by `period` (a periodicity diagnostic for the logs).
torch::Tensor phase_rms(const torch::Tensor& wav, int64_t period) {
  const auto b = wav.size(0);
  const auto c = wav.size(1);
  const auto n = wav.size(2) / period;
  // FACT: w = torch.randn(2, 1, 43); assert is_view_of(w.narrow(-1, 0, 40).reshape(2, 1, 8, 5), w)
  auto folded = wav.narrow(-1, 0, n * period).reshape({b, c, n, period}); // LOOKALIKE: tensor-reshape-non-contiguous -- only splits the narrowed time dim: a view
  // FACT: w = torch.randn(2, 1, 8, 5); assert is_copy_of(w.permute(0, 3, 1, 2).reshape(10, -1), w)
  auto per_phase = folded.permute({0, 3, 1, 2}).reshape({b * period, -1}); // EXPECT: tensor-reshape-non-contiguous
  return per_phase.pow(2).mean(1).sqrt().view({b, period});
}

// ------------------------------------------------------------------ training
struct AudioBatch {
  torch::Tensor wav;  // [B, 1, T]
};

void train_hifigan(Generator& gen, MultiPeriodDiscriminator& mpd, std::vector<AudioBatch>& loader,
                   const VocoderConfig& cfg, int64_t epochs) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  gen->to(device);
  mpd->to(device);
  torch::optim::AdamW opt_g(gen->parameters(), torch::optim::AdamWOptions(cfg.lr).betas({0.8, 0.99}));
  torch::optim::AdamW opt_d(mpd->parameters(), torch::optim::AdamWOptions(cfg.lr).betas({0.8, 0.99}));

  auto basis = mel_filterbank(cfg).to(device);
  auto window = torch::hann_window(cfg.win_length);
  int64_t step = 0;

  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    auto epoch_fm = torch::zeros({}, torch::TensorOptions().device(device));
    double epoch_mel_l1 = 0.0;
    for (auto& batch : loader) {
      auto wav = peak_normalize(batch.wav.to(device)); // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
      auto win = window.to(device); // EXPECT: tensor-clone-in-loop
      torch::Tensor mel_real;
      {
        torch::NoGradGuard no_grad;
        mel_real = mel_spectrogram(wav.squeeze(1), basis, win, cfg);
      }

      auto y_hat = gen->forward(mel_real);  // [B, 1, T']
      const auto len = std::min(y_hat.size(2), wav.size(2));
      y_hat = y_hat.narrow(2, 0, len);
      auto y = wav.narrow(2, 0, len);

      // ---- discriminator step
      auto d_out = mpd->forward(y, y_hat.detach());
      auto loss_d = discriminator_loss(d_out.real_scores, d_out.fake_scores);
      opt_d.zero_grad();
      loss_d.backward();
      opt_d.step();

      // ---- generator step
      auto mel_hat = mel_spectrogram(y_hat.squeeze(1), basis, win, cfg);
      if (step % cfg.log_every == 0) {
        auto vis = mel_hat.detach();  // spectrogram image for the logger, scaled to [0, 1]
        vis.sub_(vis.min()); // EXPECT: tensor-inplace-on-detached
        std::printf("mel range %.3f\n", vis.max().item<float>());
      }
      const auto frames = std::min(mel_hat.size(-1), mel_real.size(-1));
      auto loss_mel = F::l1_loss(mel_hat.narrow(-1, 0, frames), mel_real.narrow(-1, 0, frames));

      auto g_out = mpd->forward(y, y_hat);
      auto loss_fm = feature_matching_loss(g_out.real_fmaps, g_out.fake_fmaps);
      auto loss_adv = generator_adv_loss(g_out.fake_scores);
      auto loss_g = loss_adv + cfg.lambda_fm * loss_fm + cfg.lambda_mel * loss_mel;

      auto w_before = gen->conv_post_->weight.clone(); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- snapshot; opt_g.step() rewrites the weight
      opt_g.zero_grad();
      loss_g.backward();
      opt_g.step();

      epoch_fm += loss_fm; // EXPECT: tensor-graph-kept-across-iterations
      epoch_mel_l1 += loss_mel.item<double>(); // EXPECT: tensor-sync-in-loop
      if (step % cfg.log_every == 0) {
        auto update = (gen->conv_post_->weight - w_before).norm();
        auto rms = phase_rms(y_hat.detach(), cfg.periods.back());
        std::printf("step %ld  D %.4f  G %.4f  |dW| %.2e  phase-rms spread %.3f\n", static_cast<long>(step),
                    loss_d.item<float>(), loss_g.item<float>(), update.item<float>(), // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
                    (rms.max() - rms.min()).item<float>());
      }
      ++step;
    }
    std::cout << "epoch " << epoch << " fm " << epoch_fm.item<double>() / loader.size() << " mel "
              << epoch_mel_l1 / loader.size() << std::endl;
  }
}
