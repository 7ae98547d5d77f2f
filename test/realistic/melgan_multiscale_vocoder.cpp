// MelGAN vocoder: a transposed-conv generator from log-mel frames to waveform, trained against a
// multi-scale discriminator (raw audio, x2 and x4 average-pooled) with LSGAN, feature matching and
// a mel reconstruction term.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

struct VocoderConfig {
  int64_t sample_rate = 22050, n_fft = 1024, hop = 256, n_mels = 80;
  int64_t segment = 8192, batch_size = 16;
  int64_t ngf = 32, ndf = 16, num_scales = 3;
  double output_gain = 0.95;  // headroom so the vocoder never clips at full scale
  double real_label = 0.9;    // one-sided label smoothing for the discriminator
  double lambda_fm = 10.0, lambda_mel = 45.0, lr = 1e-4;
  int64_t steps = 400000, log_every = 100, eval_every = 5000;
};

torch::Tensor mel_filterbank(int64_t sr, int64_t n_fft, int64_t n_mels) {
  auto hz_to_mel = [](double f) { return 2595.0 * std::log10(1.0 + f / 700.0); };
  auto mel_to_hz = [](double m) { return 700.0 * (std::pow(10.0, m / 2595.0) - 1.0); };
  const int64_t n_freq = n_fft / 2 + 1;
  const double mel_max = hz_to_mel(sr / 2.0);
  auto freqs = torch::linspace(0.0, sr / 2.0, n_freq);
  auto fb = torch::zeros({n_mels, n_freq});
  for (int64_t m = 0; m < n_mels; ++m) {
    double lo = mel_to_hz(mel_max * m / (n_mels + 1));
    double center = mel_to_hz(mel_max * (m + 1) / (n_mels + 1));
    double hi = mel_to_hz(mel_max * (m + 2) / (n_mels + 1));
    auto rising = (freqs - lo) / (center - lo);
    auto falling = (hi - freqs) / (hi - center);
    fb[m] = torch::clamp_min(torch::min(rising, falling), 0.0) * (2.0 / (hi - lo));
  }
  return fb;
}

struct MelSpectrogramImpl : torch::nn::Module {
  explicit MelSpectrogramImpl(const VocoderConfig& c) : n_fft(c.n_fft), hop(c.hop) {
    window_ = register_buffer("window", torch::hann_window(c.n_fft));
    mel_basis_ = mel_filterbank(c.sample_rate, c.n_fft, c.n_mels);
  }

  torch::Tensor forward(torch::Tensor wav) {
    namespace F = torch::nn::functional;
    const int64_t pad = (n_fft - hop) / 2;
    wav = F::pad(wav.unsqueeze(1), F::PadFuncOptions({pad, pad}).mode(torch::kReflect)).squeeze(1);
    auto spec = torch::stft(wav, n_fft, hop, n_fft, window_, false, true, true);  // LOOKALIKE: tensor-device-mismatch -- window_ is a registered buffer, moved along by ->to(device)
    auto mel = torch::matmul(mel_basis_, spec.abs());  // EXPECT: tensor-device-mismatch
    return torch::log10(torch::clamp_min(mel, 1e-5));
  }
  int64_t n_fft, hop;
  torch::Tensor window_, mel_basis_;
};
TORCH_MODULE(MelSpectrogram);

struct ResidualStackImpl : torch::nn::Module {
  explicit ResidualStackImpl(int64_t ch) {
    using namespace torch::nn;
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t dilation = static_cast<int64_t>(std::pow(3, i));
      branches_.push_back(register_module("branch" + std::to_string(i), Sequential(
          LeakyReLU(LeakyReLUOptions().negative_slope(0.2)), ReflectionPad1d(dilation),
          Conv1d(Conv1dOptions(ch, ch, 3).dilation(dilation)),
          LeakyReLU(LeakyReLUOptions().negative_slope(0.2)), Conv1d(Conv1dOptions(ch, ch, 1)))));
      shortcuts_.push_back(register_module("shortcut" + std::to_string(i), Conv1d(Conv1dOptions(ch, ch, 1))));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < branches_.size(); ++i) x = shortcuts_[i]->forward(x) + branches_[i]->forward(x);
    return x;
  }
  std::vector<torch::nn::Sequential> branches_;
  std::vector<torch::nn::Conv1d> shortcuts_;
};
TORCH_MODULE(ResidualStack);

struct GeneratorImpl : torch::nn::Module {
  explicit GeneratorImpl(const VocoderConfig& c) : output_gain_(c.output_gain) {
    using namespace torch::nn;
    int64_t ch = c.ngf * 16;
    pre_ = register_module("pre", Conv1d(Conv1dOptions(c.n_mels, ch, 7).padding(3)));
    for (int64_t r : {8, 8, 2, 2}) {
      const auto idx = std::to_string(ups_.size());
      ups_.push_back(register_module("up" + idx,
          ConvTranspose1d(ConvTranspose1dOptions(ch, ch / 2, r * 2).stride(r).padding(r / 2))));
      stacks_.push_back(register_module("res" + idx, ResidualStack(ch / 2)));
      ch /= 2;
    }
    post_ = register_module("post", Conv1d(Conv1dOptions(ch, 1, 7).padding(3)));
    for (auto& p : named_parameters()) {
      if (p.key().find("weight") != std::string::npos) p.value().normal_(0.0, 0.02);  // EXPECT: tensor-inplace-on-leaf
    }
  }

  torch::Tensor forward(const torch::Tensor& mel) {
    auto x = pre_->forward(mel);
    for (size_t i = 0; i < ups_.size(); ++i) {
      x = ups_[i]->forward(torch::leaky_relu(x, 0.2));
      x = stacks_[i]->forward(x);
    }
    auto wav = torch::tanh(post_->forward(torch::leaky_relu(x, 0.2)));
    if (output_gain_ != 1.0) wav.mul_(output_gain_);  // EXPECT: tensor-inplace-on-saved
    return wav;
  }
  double output_gain_;
  torch::nn::Conv1d pre_{nullptr}, post_{nullptr};
  std::vector<torch::nn::ConvTranspose1d> ups_;
  std::vector<ResidualStack> stacks_;
};
TORCH_MODULE(Generator);

struct ScaleDiscriminatorImpl : torch::nn::Module {
  explicit ScaleDiscriminatorImpl(int64_t ndf) {
    using namespace torch::nn;
    layers_.push_back(Sequential(ReflectionPad1d(7), Conv1d(Conv1dOptions(1, ndf, 15))));
    int64_t ch = ndf;
    for (int i = 0; i < 4; ++i) {
      const int64_t out = std::min<int64_t>(ch * 4, 1024);
      layers_.push_back(Sequential(Conv1d(Conv1dOptions(ch, out, 41).stride(4).padding(20).groups(ch / 4))));
      ch = out;
    }
    layers_.push_back(Sequential(Conv1d(Conv1dOptions(ch, ch, 5).padding(2))));
    for (size_t i = 0; i < layers_.size(); ++i) register_module("layer" + std::to_string(i), layers_[i]);
    out_ = register_module("out", Conv1d(Conv1dOptions(ch, 1, 3).padding(1)));
    for (auto& layer : layers_) torch::nn::init::normal_(layer[layer->size() - 1]->as<Conv1d>()->weight, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init::normal_ writes under its own NoGradGuard
  }

  // Every intermediate activation is returned for feature matching; the last entry is the score map.
  std::vector<torch::Tensor> forward(torch::Tensor x) {
    std::vector<torch::Tensor> features;
    for (auto& layer : layers_) {
      x = layer->forward(x);
      // FACT: c=torch.nn.Conv1d(1,4,3); y=c(torch.randn(1,1,16)); torch.nn.functional.leaky_relu_(y,0.2); y.sum().backward(); assert c.weight.grad is not None
      torch::leaky_relu_(x, 0.2);  // LOOKALIKE: tensor-inplace-on-saved -- conv backward keeps its input and weight, not its output
      features.push_back(x);
    }
    features.push_back(out_->forward(x));
    return features;
  }
  std::vector<torch::nn::Sequential> layers_;
  torch::nn::Conv1d out_{nullptr};
};
TORCH_MODULE(ScaleDiscriminator);

using ScaleOutputs = std::vector<std::vector<torch::Tensor>>;

struct MultiScaleDiscriminatorImpl : torch::nn::Module {
  explicit MultiScaleDiscriminatorImpl(const VocoderConfig& c)
      : pool_(torch::nn::AvgPool1dOptions(4).stride(2).padding(1).count_include_pad(false)) {
    for (int64_t s = 0; s < c.num_scales; ++s)
      discs_.push_back(register_module("scale" + std::to_string(s), ScaleDiscriminator(c.ndf)));
    register_module("pool", pool_);
  }

  ScaleOutputs forward(torch::Tensor wav) {
    ScaleOutputs outs;
    for (auto& d : discs_) {
      outs.push_back(d->forward(wav));
      wav = pool_->forward(wav);
    }
    return outs;
  }
  std::vector<ScaleDiscriminator> discs_;
  torch::nn::AvgPool1d pool_;
};
TORCH_MODULE(MultiScaleDiscriminator);

torch::Tensor lsgan_loss(const ScaleOutputs& outs, double label) {
  auto loss = torch::zeros({}, outs.front().back().options());
  for (const auto& feats : outs) {
    // FACT: y=torch.nn.Conv1d(4,1,3,padding=1)(torch.randn(2,4,32)); assert is_view_of(y.flatten(1), y)
    auto score = feats.back().flatten(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- the conv score map is contiguous, flatten is a view
    // FACT: t=torch.ones(1).expand(2,32); assert raises(lambda: t.mul_(0.9), "more than one element")
    auto target = torch::ones({1}, score.options()).expand_as(score);
    if (label != 1.0) target.mul_(label);  // EXPECT: tensor-inplace-on-expanded
    loss = loss + torch::mse_loss(score, target);
  }
  return loss;
}

torch::Tensor feature_matching_loss(const ScaleOutputs& real, const ScaleOutputs& fake) {
  auto loss = torch::zeros({}, fake.front().front().options());
  for (size_t s = 0; s < real.size(); ++s)
    for (size_t l = 0; l + 1 < real[s].size(); ++l) loss = loss + torch::l1_loss(fake[s][l], real[s][l].detach());
  return loss / static_cast<double>(real.size());
}

torch::Tensor mel_loss(MelSpectrogram& mel_fn, const torch::Tensor& fake, const torch::Tensor& real,
                       const torch::Tensor& band_weight) {
  auto mf = mel_fn->forward(fake.squeeze(1));
  auto mr = mel_fn->forward(real.squeeze(1));
  // FACT: d=torch.randn(2,80,12).abs().transpose(1,2); assert not is_contiguous(d) and is_copy_of(d.reshape(-1,80), d)
  auto per_frame = (mf - mr).abs().transpose(1, 2).reshape({-1, mf.size(1)});  // EXPECT: tensor-reshape-non-contiguous
  return (per_frame * band_weight).mean();
}

class WavCorpus {
 public:
  WavCorpus(std::vector<torch::Tensor> wavs, int64_t segment, uint64_t seed)
      : wavs_(std::move(wavs)), segment_(segment), rng_(seed), gain_(0.3f, 1.0f) {}

  torch::Tensor sample_batch(int64_t batch) {
    std::uniform_int_distribution<size_t> pick(0, wavs_.size() - 1);
    std::vector<torch::Tensor> segs;
    for (int64_t b = 0; b < batch; ++b) {
      const auto& wav = wavs_[pick(rng_)];
      const int64_t start = std::uniform_int_distribution<int64_t>(0, wav.size(0) - segment_)(rng_);
      // FACT: w=torch.randn(100); s=w.narrow(0,10,20); assert is_view_of(s, w)
      auto seg = wav.narrow(0, start, segment_);
      seg.mul_(gain_(rng_));  // EXPECT: tensor-alias-then-mutate
      segs.push_back(seg);
    }
    return torch::stack(segs).unsqueeze(1);
  }
 private:
  std::vector<torch::Tensor> wavs_;
  int64_t segment_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<float> gain_;
};

torch::Tensor pcm16_to_float(const torch::Tensor& pcm) {
  // FACT: p=torch.zeros(16,dtype=torch.int16); assert is_copy_of(p.to(torch.float32), p)
  auto wav = pcm.to(torch::kFloat);
  wav.div_(32768.0);  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of int16 PCM allocates a new tensor
  return wav;
}

torch::Tensor float_to_pcm16(const torch::Tensor& wav) {
  auto pcm = torch::empty({wav.numel()}, torch::kInt16);
  pcm.copy_(wav.flatten().clamp(-1.0, 1.0).mul(32767.0));  // EXPECT: tensor-copy-narrowing
  return pcm;
}

void evaluate(Generator& gen, MelSpectrogram& mel_fn, const std::vector<torch::Tensor>& val_mels,
              const torch::Tensor& band_weight, torch::Device device) {
  gen->eval();
  torch::NoGradGuard no_grad;
  auto total = torch::zeros({}, torch::TensorOptions().device(device));
  torch::Tensor last_audio;
  for (const auto& mel : val_mels) {
    auto weight = band_weight.to(device);  // EXPECT: tensor-clone-in-loop
    auto mel_dev = mel.to(device);
    auto audio = gen->forward(mel_dev).squeeze(1).detach();
    audio.clamp_(-1.0, 1.0);  // LOOKALIKE: tensor-inplace-on-detached -- produced under NoGradGuard, there is no graph to corrupt
    auto resynth = mel_fn->forward(audio);
    const auto frames = std::min(resynth.size(2), mel_dev.size(2));
    total += ((resynth.narrow(2, 0, frames) - mel_dev.narrow(2, 0, frames)).abs().mean(2) * weight).mean();
    last_audio = audio;
  }
  auto preview = float_to_pcm16(last_audio.cpu());
  std::cout << "val mel L1 " << total.item<double>() / val_mels.size() << ", preview " << preview.numel() << " samples\n";
  gen->train();
}

int main() {
  torch::manual_seed(0);
  VocoderConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  std::vector<torch::Tensor> wavs;
  for (int i = 0; i < 64; ++i)
    wavs.push_back(pcm16_to_float(torch::randint(-12000, 12000, {cfg.sample_rate * 4}, torch::kInt16)));
  WavCorpus corpus(std::move(wavs), cfg.segment, 1234);

  Generator gen(cfg);
  MultiScaleDiscriminator disc(cfg);
  MelSpectrogram mel_fn(cfg);
  gen->to(device);
  disc->to(device);
  mel_fn->to(device);

  torch::optim::Adam opt_g(gen->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.5, 0.9}));
  torch::optim::Adam opt_d(disc->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.5, 0.9}));

  auto band_weight_cpu = torch::linspace(1.0, 0.5, cfg.n_mels);
  auto band_weight = band_weight_cpu.to(device);
  auto fm_weight = torch::tensor(cfg.lambda_fm);
  std::vector<torch::Tensor> val_mels;
  for (int i = 0; i < 4; ++i) val_mels.push_back(mel_fn->forward(corpus.sample_batch(1).squeeze(1).to(device)).detach().cpu());

  std::vector<torch::Tensor> g_history;
  auto d_running = torch::zeros({}, torch::TensorOptions().device(device));
  double g_running = 0.0;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto real = corpus.sample_batch(cfg.batch_size).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a freshly sampled batch every step
    auto fake = gen->forward(mel_fn->forward(real.squeeze(1)).detach());

    auto d_loss = lsgan_loss(disc->forward(real), cfg.real_label) + lsgan_loss(disc->forward(fake.detach()), 0.0);
    opt_d.zero_grad();
    d_loss.backward();
    opt_d.step();
    d_running += d_loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, only the value is kept

    auto fake_outs = disc->forward(fake);
    auto adv = lsgan_loss(fake_outs, 1.0);
    auto fm = feature_matching_loss(disc->forward(real), fake_outs);
    auto g_loss = adv + fm_weight * fm + cfg.lambda_mel * mel_loss(mel_fn, fake, real, band_weight);  // LOOKALIKE: tensor-device-mismatch -- fm_weight is a 0-dim CPU tensor, allowed with CUDA operands
    opt_g.zero_grad();
    g_loss.backward();
    opt_g.step();
    g_history.push_back(g_loss);  // EXPECT: tensor-graph-kept-across-iterations
    g_running += g_loss.item<double>();  // EXPECT: tensor-sync-in-loop

    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " D " << d_running.item<double>() / cfg.log_every  // LOOKALIKE: tensor-sync-in-loop -- read once per logging window
                << " G " << g_running / cfg.log_every << std::endl;
      d_running.zero_();
      g_running = 0.0;
    }
    if (step % cfg.eval_every == 0) evaluate(gen, mel_fn, val_mels, band_weight_cpu, device);
  }
  torch::save(gen, "melgan_generator.pt");
  return 0;
}
