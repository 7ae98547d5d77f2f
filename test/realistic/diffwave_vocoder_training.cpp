// DiffWave neural vocoder (Kong et al., 2021): a stack of dilated residual blocks
// conditioned on an upsampled log-mel spectrogram and a diffusion-step embedding,
// trained to predict the noise added at a random step, sampled with the reverse chain.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct DiffWaveConfig {
  int64_t sample_rate = 22050, n_fft = 1024, hop = 256, n_mels = 80;
  double preemphasis = 0.97;
  int64_t residual_channels = 64, residual_layers = 30, dilation_cycle = 10;
  int64_t diffusion_steps = 50;
  double beta_start = 1e-4, beta_end = 0.05;
  int64_t batch_size = 16, crop_frames = 62, max_steps = 1000000, log_every = 100;
  double lr = 2e-4, grad_clip = 1e9, ema_decay = 0.9999;
  int64_t chunk_frames = 200, context_frames = 8;
  std::string checkpoint = "diffwave.pt";
};

torch::Tensor mel_filterbank(const DiffWaveConfig& cfg, double fmin = 0.0, double fmax = 8000.0) {
  auto hz_to_mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  auto mels = torch::linspace(hz_to_mel(fmin), hz_to_mel(fmax), cfg.n_mels + 2, torch::kDouble);
  auto hz = 700.0 * (torch::pow(10.0, mels / 2595.0) - 1.0);
  auto freqs = torch::linspace(0.0, cfg.sample_rate / 2.0, cfg.n_fft / 2 + 1, torch::kDouble);
  auto lo = hz.narrow(0, 0, cfg.n_mels).unsqueeze(1), mid = hz.narrow(0, 1, cfg.n_mels).unsqueeze(1),
       hi = hz.narrow(0, 2, cfg.n_mels).unsqueeze(1);
  auto up = (freqs - lo) / (mid - lo), down = (hi - freqs) / (hi - mid);
  return torch::min(up, down).clamp_min(0.0).to(torch::kFloat);
}

torch::Tensor compute_mel(const torch::Tensor& pcm16, const torch::Tensor& mel_basis, const DiffWaveConfig& cfg) {
  auto wav = pcm16.to(torch::kFloat);
  // FACT: r = torch.zeros(16, dtype=torch.int16); w = r.to(torch.float); w.div_(32768.0); assert is_copy_of(w, r)
  wav.div_(32768.0);  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) converts the int16 samples into a new tensor
  if (cfg.preemphasis > 0.0) {
    const int64_t L = wav.size(0);
    // FACT: y = torch.rand(16); assert raises(lambda: y.narrow(0, 1, 15).sub_(y.narrow(0, 0, 15), alpha=0.97), "some elements")
    wav.narrow(0, 1, L - 1).sub_(wav.narrow(0, 0, L - 1), cfg.preemphasis);  // EXPECT: tensor-inplace-overlap
  }
  auto spec = torch::stft(wav, cfg.n_fft, cfg.hop, cfg.n_fft, torch::hann_window(cfg.n_fft), /*center=*/true,
                          "reflect", /*normalized=*/false, /*onesided=*/true, /*return_complex=*/true);
  auto power = spec.abs();
  // FACT: m = torch.rand(5, 7); r = m * m; m.mul_(m); assert torch.equal(m, r)
  power.mul_(power);  // LOOKALIKE: tensor-inplace-overlap -- source and destination are the very same elements, each read before it is written
  return torch::log(torch::matmul(mel_basis, power).clamp_min(1e-5));
}

struct VocoderDataset { std::vector<torch::Tensor> pcm, mels; };
struct Batch { torch::Tensor audio, mel; };

Batch sample_batch(const VocoderDataset& ds, const DiffWaveConfig& cfg, std::mt19937& rng) {
  const int64_t B = cfg.batch_size, frames = cfg.crop_frames, seg = frames * cfg.hop;
  auto audio = torch::empty({B, seg}, torch::kFloat);
  auto mel = torch::empty({B, cfg.n_mels, frames}, torch::kFloat);
  std::uniform_int_distribution<size_t> pick(0, ds.pcm.size() - 1);
  for (int64_t b = 0; b < B; ++b) {
    const size_t i = pick(rng);
    std::uniform_int_distribution<int64_t> start(0, ds.mels[i].size(1) - frames - 1);
    const int64_t f0 = start(rng);
    audio[b].copy_(ds.pcm[i].narrow(0, f0 * cfg.hop, seg));  // LOOKALIKE: tensor-copy-narrowing -- int16 into float32 widens exactly
    mel[b].copy_(ds.mels[i].narrow(1, f0, frames));
  }
  audio.div_(32768.0);
  return {audio, mel};
}

// Running per-bin statistics of the log-mel features, gathered in a pass over random crops.
struct MelNormalizer {
  torch::Tensor sum, sq_sum;
  int64_t count = 0;
  void update(const torch::Tensor& mel_batch) {
    const int64_t n_mels = mel_batch.size(1);
    // FACT: m = torch.rand(2, 4, 6); assert raises(lambda: m.transpose(1, 2).view(-1, 4), "view size is not compatible")
    auto frames = mel_batch.transpose(1, 2).view({-1, n_mels});  // EXPECT: tensor-view-non-contiguous
    if (!sum.defined()) sum = torch::zeros({n_mels}, torch::kDouble), sq_sum = torch::zeros({n_mels}, torch::kDouble);
    sum += frames.sum(0).to(torch::kDouble);
    sq_sum += frames.pow(2).sum(0).to(torch::kDouble);
    count += frames.size(0);
  }
  std::pair<torch::Tensor, torch::Tensor> stats() const {
    auto mean = sum / count;
    auto std = (sq_sum / count - mean * mean).clamp_min(1e-8).sqrt();
    return {mean.to(torch::kFloat).view({1, -1, 1}), std.to(torch::kFloat).view({1, -1, 1})};
  }
};

struct DiffusionEmbeddingImpl : torch::nn::Module {
  torch::Tensor table;
  torch::nn::Linear proj1{nullptr}, proj2{nullptr};
  explicit DiffusionEmbeddingImpl(int64_t max_steps) {
    auto steps = torch::arange(max_steps, torch::kFloat).unsqueeze(1);
    auto dims = torch::arange(64, torch::kFloat).unsqueeze(0);
    auto angles = steps * torch::pow(10.0, dims * 4.0 / 63.0);
    table = register_buffer("table", torch::cat({torch::sin(angles), torch::cos(angles)}, 1));
    proj1 = register_module("proj1", torch::nn::Linear(128, 512));
    proj2 = register_module("proj2", torch::nn::Linear(512, 512));
  }

  torch::Tensor forward(const torch::Tensor& t) {
    return F::silu(proj2(F::silu(proj1(table.index_select(0, t)))));
  }
};
TORCH_MODULE(DiffusionEmbedding);

struct SpectrogramUpsamplerImpl : torch::nn::Module {
  torch::nn::ConvTranspose2d conv1{nullptr}, conv2{nullptr};
  SpectrogramUpsamplerImpl() {
    auto opts = torch::nn::ConvTranspose2dOptions(1, 1, {3, 32}).stride({1, 16}).padding({1, 8});
    conv1 = register_module("conv1", torch::nn::ConvTranspose2d(opts));
    conv2 = register_module("conv2", torch::nn::ConvTranspose2d(opts));
  }

  torch::Tensor forward(const torch::Tensor& mel) {
    auto x = F::leaky_relu(conv1(mel.unsqueeze(1)), F::LeakyReLUFuncOptions().negative_slope(0.4));
    x = F::leaky_relu(conv2(x), F::LeakyReLUFuncOptions().negative_slope(0.4));
    // FACT: o = torch.nn.functional.leaky_relu(torch.nn.functional.conv_transpose2d(torch.rand(2, 1, 4, 5), torch.rand(1, 1, 3, 32), stride=(1, 16), padding=(1, 8)), 0.4); assert is_contiguous(o) and o.view(2, 4, -1).shape[-1] == 80
    return x.view({x.size(0), x.size(2), -1});  // LOOKALIKE: tensor-view-non-contiguous -- the transposed-conv output is contiguous
  }
};
TORCH_MODULE(SpectrogramUpsampler);

struct ResidualBlockImpl : torch::nn::Module {
  torch::nn::Conv1d dilated{nullptr}, cond_proj{nullptr}, out_proj{nullptr};
  torch::nn::Linear step_proj{nullptr};
  ResidualBlockImpl(int64_t n_mels, int64_t C, int64_t dilation) {
    dilated = register_module("dilated", torch::nn::Conv1d(torch::nn::Conv1dOptions(C, 2 * C, 3).padding(dilation).dilation(dilation)));
    cond_proj = register_module("cond_proj", torch::nn::Conv1d(torch::nn::Conv1dOptions(n_mels, 2 * C, 1)));
    out_proj = register_module("out_proj", torch::nn::Conv1d(torch::nn::Conv1dOptions(C, 2 * C, 1)));
    step_proj = register_module("step_proj", torch::nn::Linear(512, C));
    for (auto* conv : {&dilated, &cond_proj, &out_proj})
      torch::nn::init::kaiming_normal_((*conv)->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions write under NoGradGuard
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& cond,
                                                  const torch::Tensor& step_emb) {
    auto y = step_proj(step_emb).unsqueeze(-1).expand_as(x);
    // FACT: d = torch.rand(2, 3, 1).expand(2, 3, 5); assert raises(lambda: d.add_(torch.rand(2, 3, 5)), "more than one element")
    y += x;  // EXPECT: tensor-inplace-on-expanded
    y = dilated(y) + cond_proj(cond);
    auto gf = y.chunk(2, 1);
    auto gate = torch::sigmoid(gf[0]);
    gate.mul_(torch::tanh(gf[1]));  // EXPECT: tensor-inplace-on-saved
    auto rs = out_proj(gate).chunk(2, 1);
    auto out = x + rs[0];
    out.div_(std::sqrt(2.0));  // LOOKALIKE: tensor-inplace-on-saved -- add saves nothing and dividing by a constant needs no saved input
    return {out, rs[1]};
  }
};
TORCH_MODULE(ResidualBlock);

struct DiffWaveImpl : torch::nn::Module {
  torch::nn::Conv1d input_proj{nullptr}, skip_proj{nullptr}, output_proj{nullptr};
  DiffusionEmbedding embedding{nullptr};
  SpectrogramUpsampler upsampler{nullptr};
  std::vector<ResidualBlock> blocks;
  explicit DiffWaveImpl(const DiffWaveConfig& cfg) {
    const int64_t C = cfg.residual_channels;
    input_proj = register_module("input_proj", torch::nn::Conv1d(torch::nn::Conv1dOptions(1, C, 1)));
    embedding = register_module("embedding", DiffusionEmbedding(cfg.diffusion_steps));
    upsampler = register_module("upsampler", SpectrogramUpsampler());
    for (int64_t i = 0; i < cfg.residual_layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i),
                                       ResidualBlock(cfg.n_mels, C, int64_t{1} << (i % cfg.dilation_cycle))));
    skip_proj = register_module("skip_proj", torch::nn::Conv1d(torch::nn::Conv1dOptions(C, C, 1)));
    output_proj = register_module("output_proj", torch::nn::Conv1d(torch::nn::Conv1dOptions(C, 1, 1)));
    output_proj->weight.zero_();  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& audio, const torch::Tensor& mel, const torch::Tensor& t) {
    auto x = torch::relu(input_proj(audio.unsqueeze(1)));
    auto step_emb = embedding(t);
    auto cond = upsampler(mel);
    torch::Tensor skip;
    for (auto& block : blocks) {
      auto res = block->forward(x, cond, step_emb);
      x = res.first;
      skip = skip.defined() ? skip + res.second : res.second;
    }
    x = torch::relu(skip_proj(skip / std::sqrt(static_cast<double>(blocks.size()))));
    return output_proj(x).squeeze(1);
  }
};
TORCH_MODULE(DiffWave);

struct NoiseSchedule {
  torch::Tensor beta, alpha, alpha_bar;
  explicit NoiseSchedule(const DiffWaveConfig& cfg)
      : beta(torch::linspace(cfg.beta_start, cfg.beta_end, cfg.diffusion_steps)), alpha(1.0 - beta),
        alpha_bar(torch::cumprod(alpha, 0)) {}
  int64_t steps() const { return beta.size(0); }
};

struct Ema {
  std::vector<torch::Tensor> shadow;
  double decay;
  Ema(DiffWave& model, double d) : decay(d) {
    for (const auto& p : model->parameters()) shadow.push_back(p.detach().clone());
  }
  void update(DiffWave& model) {
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) shadow[i].mul_(decay).add_(params[i], 1.0 - decay);
  }
  void copy_to(DiffWave& model) {
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].data().copy_(shadow[i]);  // LOOKALIKE: tensor-inplace-on-detached -- overwriting the weights with their EMA is the point, done under NoGradGuard
  }
};

void train(DiffWave& model, const VocoderDataset& ds, const MelNormalizer& norm, const DiffWaveConfig& cfg,
           torch::Device device) {
  NoiseSchedule sched(cfg);
  auto alpha_bar = sched.alpha_bar.to(device);
  auto mel_stats = norm.stats();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  Ema ema(model, cfg.ema_decay);
  std::mt19937 rng(1234);
  double running = 0.0;
  model->train();
  for (int64_t step = 1; step <= cfg.max_steps; ++step) {
    auto batch = sample_batch(ds, cfg, rng);
    auto audio = batch.audio.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a fresh random batch every step
    auto mel = ((batch.mel - mel_stats.first) / mel_stats.second).to(device);
    const int64_t B = audio.size(0);
    auto t = torch::randint(0, sched.steps(), {B}, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto ab = alpha_bar.index_select(0, t).unsqueeze(1);
    auto noise = torch::randn({B, audio.size(1)});
    auto noisy = ab.sqrt() * audio + (1.0 - ab).sqrt() * noise;  // EXPECT: tensor-device-mismatch
    auto loss = F::l1_loss(model->forward(noisy, mel, t), noise);
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.grad_clip);
    opt.step();
    ema.update(model);
    running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " l1 " << running / cfg.log_every << "\n";
      running = 0.0;
    }
  }
  ema.copy_to(model);
  torch::save(model, cfg.checkpoint);
}

torch::Tensor sample(DiffWave& model, const torch::Tensor& mel, const NoiseSchedule& s, const DiffWaveConfig& cfg,
                     torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t B = mel.size(0);
  auto audio = torch::randn({B, mel.size(2) * cfg.hop}, torch::TensorOptions().device(device));
  for (int64_t n = s.steps() - 1; n >= 0; --n) {
    auto cond = mel.to(device);  // EXPECT: tensor-clone-in-loop
    auto t = torch::full({B}, n, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto eps = model->forward(audio, cond, t);
    auto c2 = s.beta[n] / (1.0 - s.alpha_bar[n]).sqrt();
    audio = (audio - c2 * eps) / s.alpha[n].sqrt();  // LOOKALIKE: tensor-device-mismatch -- alpha[n] and c2 are 0-dim CPU tensors, which may mix with CUDA operands
    if (n > 0) {
      auto sigma = ((1.0 - s.alpha_bar[n - 1]) / (1.0 - s.alpha_bar[n]) * s.beta[n]).sqrt();
      audio += sigma * torch::randn_like(audio);
    }
    audio.clamp_(-1.0, 1.0);
  }
  return audio;
}

// Long utterances: overlapping mel chunks are vocoded as one batch, then the context is trimmed.
torch::Tensor vocode_long(DiffWave& model, const torch::Tensor& mel, const DiffWaveConfig& cfg, torch::Device device) {
  const int64_t frames = mel.size(1), chunk = cfg.chunk_frames, ctx = cfg.context_frames;
  const int64_t n_chunks = (frames + chunk - 1) / chunk;
  auto padded = F::pad(mel.unsqueeze(0), F::PadFuncOptions({ctx, n_chunks * chunk - frames + ctx}).mode(torch::kReplicate));
  auto chunks = padded.squeeze(0).unfold(1, chunk + 2 * ctx, chunk).permute({1, 0, 2});
  auto audio = sample(model, chunks, NoiseSchedule(cfg), cfg, device);
  // FACT: a = torch.rand(3, 40); assert is_copy_of(a.narrow(1, 8, 24).reshape(-1), a)
  auto joined = audio.narrow(1, ctx * cfg.hop, chunk * cfg.hop).reshape({-1});  // EXPECT: tensor-reshape-non-contiguous
  return joined.narrow(0, 0, frames * cfg.hop);
}

void write_pcm16(const torch::Tensor& audio, const std::string& path) {
  auto pcm = torch::empty({audio.numel()}, torch::kInt16);
  pcm.copy_(audio.flatten().mul(32767.0));  // EXPECT: tensor-copy-narrowing
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(pcm.data_ptr<int16_t>()), pcm.numel() * sizeof(int16_t));
}

int main() {
  DiffWaveConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto basis = mel_filterbank(cfg);
  VocoderDataset ds;
  for (int i = 0; i < 64; ++i) {
    auto tt = torch::arange(cfg.sample_rate * 4, torch::kFloat) / cfg.sample_rate;
    auto wav = 0.5 * torch::sin(2.0 * M_PI * (110.0 + 20.0 * i) * tt * (1.0 + 0.1 * tt));
    ds.pcm.push_back((wav * 32767.0).to(torch::kInt16));
    ds.mels.push_back(compute_mel(ds.pcm.back(), basis, cfg));
  }
  MelNormalizer norm;  // first pass over random crops
  std::mt19937 rng(7);
  for (int i = 0; i < 32; ++i) norm.update(sample_batch(ds, cfg, rng).mel);

  DiffWave model(cfg);
  model->to(device);
  train(model, ds, norm, cfg, device);
  auto stats = norm.stats();
  auto mel = ((ds.mels.front().unsqueeze(0) - stats.first) / stats.second).squeeze(0);
  write_pcm16(vocode_long(model, mel, cfg, device), "sample.pcm");
}
