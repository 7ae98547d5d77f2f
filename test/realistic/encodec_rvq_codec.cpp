// Residual vector quantisation for a neural audio codec (EnCodec / SoundStream style):
// conv encoder -> [B, D, T] latents -> stack of EMA codebooks -> conv decoder.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct RvqConfig {
  int64_t dim = 128;
  int64_t codebook_size = 1024;
  int64_t num_quantizers = 8;
  double decay = 0.99;
  double eps = 1e-5;
  double commitment_weight = 1.0;
  double dead_code_threshold = 2.0;
};

struct QuantizerOutput {
  torch::Tensor quantized;    // [B, D, T], straight-through estimator
  torch::Tensor codes;        // [n_q, B, T], int64
  torch::Tensor commit_loss;  // scalar
};

class EmaCodebookImpl : public nn::Module {
 public:
  EmaCodebookImpl(int64_t dim, int64_t size, double decay, double eps, double dead_threshold)
      : dim_(dim), size_(size), decay_(decay), eps_(eps), dead_threshold_(dead_threshold) {
    embed_ = register_buffer("embed", torch::randn({size, dim}));
    embed_avg_ = register_buffer("embed_avg", embed_.clone());
    cluster_size_ = register_buffer("cluster_size", torch::ones({size}));
  }

  // flat: [N, D] -> nearest code per row, [N]
  torch::Tensor encode(const torch::Tensor& flat) const {
    auto dist = flat.pow(2).sum(1, true) - 2 * flat.matmul(embed_.t()) +
                embed_.pow(2).sum(1).unsqueeze(0);
    return dist.argmin(1);
  }

  torch::Tensor decode(const torch::Tensor& codes) const { return F::embedding(codes, embed_); }

  // x: [B, D, T] -> (quantized [B, D, T], codes [B, T])
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    const auto batch = x.size(0);
    const auto frames = x.size(2);
    // FACT: x = torch.randn(2, 5, 7); assert is_copy_of(x.transpose(1, 2).reshape(-1, 5), x)
    auto flat = x.transpose(1, 2).reshape({-1, dim_});  // EXPECT: tensor-reshape-non-contiguous
    auto codes = encode(flat);
    auto q = decode(codes);
    if (is_training()) {
      ema_update(flat.detach(), codes);
      expire_dead_codes(flat.detach());
    }
    // FACT: q = torch.nn.functional.embedding(torch.tensor([0, 2, 1, 3, 0, 1]), torch.randn(4, 5)); assert is_view_of(q.view(2, 3, 5), q)
    auto q_bdt = q.view({batch, frames, dim_}).permute({0, 2, 1});  // LOOKALIKE: tensor-view-non-contiguous -- the embedding lookup returns a fresh contiguous [N, D]
    return {q_bdt, codes.view({batch, frames})};
  }

  // Debug metric: fraction of entries that moved by more than `tol` in one EMA step.
  double codebook_drift(const torch::Tensor& flat, double tol) {
    auto before = embed_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- a snapshot: ema_update rewrites embed_ while it lives
    ema_update(flat, encode(flat));
    return (embed_ - before).norm(2, {1}).gt(tol).to(torch::kFloat).mean().item<double>();
  }

 private:
  void ema_update(const torch::Tensor& flat, const torch::Tensor& codes) {
    torch::NoGradGuard no_grad;
    auto onehot = F::one_hot(codes, size_).to(flat.scalar_type());  // [N, K]
    cluster_size_.mul_(decay_).add_(onehot.sum(0), 1.0 - decay_);  // LOOKALIKE: tensor-inplace-on-leaf -- a registered buffer, updated under NoGradGuard
    embed_avg_.mul_(decay_).add_(onehot.t().matmul(flat), 1.0 - decay_);
    // Laplace smoothing keeps empty clusters from dividing by zero.
    auto n = cluster_size_.sum();
    auto smoothed = (cluster_size_ + eps_) / (n + static_cast<double>(size_) * eps_) * n;
    embed_.copy_(embed_avg_ / smoothed.unsqueeze(1));
  }

  void expire_dead_codes(const torch::Tensor& flat) {
    torch::NoGradGuard no_grad;
    auto dead = cluster_size_ < dead_threshold_;
    const auto n_dead = dead.sum().item<int64_t>();
    if (n_dead == 0) return;
    auto dead_idx = dead.nonzero().squeeze(1);
    auto pick = torch::randint(flat.size(0), {n_dead}, torch::TensorOptions().dtype(torch::kLong).device(flat.device()));
    auto samples = flat.index_select(0, pick);
    embed_.index_copy_(0, dead_idx, samples);
    embed_avg_.index_copy_(0, dead_idx, samples * dead_threshold_);
    cluster_size_.index_fill_(0, dead_idx, dead_threshold_);
  }

  int64_t dim_, size_;
  double decay_, eps_, dead_threshold_;
  torch::Tensor embed_, embed_avg_, cluster_size_;
};
TORCH_MODULE(EmaCodebook);

class ResidualVqImpl : public nn::Module {
 public:
  explicit ResidualVqImpl(const RvqConfig& cfg) : cfg_(cfg) {
    for (int64_t i = 0; i < cfg.num_quantizers; ++i) {
      layers_.push_back(register_module(
          "vq" + std::to_string(i),
          EmaCodebook(cfg.dim, cfg.codebook_size, cfg.decay, cfg.eps, cfg.dead_code_threshold)));
    }
  }

  QuantizerOutput forward(const torch::Tensor& z) {
    torch::Tensor residual = z;
    auto quantized = torch::zeros_like(z);
    std::vector<torch::Tensor> all_codes;
    std::vector<torch::Tensor> commit_losses;
    for (auto& layer : layers_) {
      auto stage = layer->forward(residual);
      commit_losses.push_back(F::mse_loss(residual, stage.first.detach()));  // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked into the returned commitment loss, which backward uses
      quantized = quantized + stage.first;
      // FACT: z = torch.randn(2, 4, 3); r = z; r -= torch.randn(2, 4, 3); assert shares_storage(r, z)
      residual -= stage.first.detach();  // EXPECT: tensor-alias-then-mutate, tensor-inplace-on-saved
      all_codes.push_back(stage.second);
    }
    auto straight_through = z + (quantized - z).detach();
    return {straight_through, torch::stack(all_codes),
            torch::stack(commit_losses).mean() * cfg_.commitment_weight};
  }

  // Inference path: codes only, [n_q, B, T].
  torch::Tensor encode_codes(const torch::Tensor& z, int64_t n_q) {
    torch::NoGradGuard no_grad;
    const auto d = z.size(1);
    // FACT: z = torch.randn(2, 5, 7); assert not raises(lambda: z.transpose(1, 2).contiguous().view(-1, 5))
    auto residual = z.transpose(1, 2).contiguous().view({-1, d});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() makes the copy first
    std::vector<torch::Tensor> codes;
    for (int64_t i = 0; i < std::min<int64_t>(n_q, layers_.size()); ++i) {
      auto idx = layers_[i]->encode(residual);
      residual = residual - layers_[i]->decode(idx);
      codes.push_back(idx.view({z.size(0), z.size(2)}));
    }
    return torch::stack(codes);
  }

  std::vector<EmaCodebook>& layers() { return layers_; }

 private:
  RvqConfig cfg_;
  std::vector<EmaCodebook> layers_;
};
TORCH_MODULE(ResidualVq);

struct ConvEncoderImpl : nn::Module {
  ConvEncoderImpl(int64_t channels, int64_t dim) {
    stem = register_module("stem", nn::Conv1d(nn::Conv1dOptions(1, channels, 7).padding(3)));
    down1 = register_module("down1", nn::Conv1d(nn::Conv1dOptions(channels, 2 * channels, 4).stride(2).padding(1)));
    down2 = register_module("down2", nn::Conv1d(nn::Conv1dOptions(2 * channels, 4 * channels, 4).stride(2).padding(1)));
    proj = register_module("proj", nn::Conv1d(nn::Conv1dOptions(4 * channels, dim, 3).padding(1)));
  }
  torch::Tensor forward(torch::Tensor wav) {  // [B, 1, L] -> [B, D, L / 4]
    auto h = F::elu(down1(F::elu(stem(wav))));
    return proj(F::elu(down2(h)));
  }
  nn::Conv1d stem{nullptr}, down1{nullptr}, down2{nullptr}, proj{nullptr};
};
TORCH_MODULE(ConvEncoder);

struct ConvDecoderImpl : nn::Module {
  ConvDecoderImpl(int64_t channels, int64_t dim) {
    proj = register_module("proj", nn::Conv1d(nn::Conv1dOptions(dim, 4 * channels, 3).padding(1)));
    up1 = register_module("up1", nn::ConvTranspose1d(nn::ConvTranspose1dOptions(4 * channels, 2 * channels, 4).stride(2).padding(1)));
    up2 = register_module("up2", nn::ConvTranspose1d(nn::ConvTranspose1dOptions(2 * channels, channels, 4).stride(2).padding(1)));
    out = register_module("out", nn::Conv1d(nn::Conv1dOptions(channels, 1, 7).padding(3)));
  }
  torch::Tensor forward(torch::Tensor z) {
    auto h = F::elu(up1(F::elu(proj(z))));
    return torch::tanh(out(F::elu(up2(h))));
  }
  nn::Conv1d proj{nullptr}, out{nullptr};
  nn::ConvTranspose1d up1{nullptr}, up2{nullptr};
};
TORCH_MODULE(ConvDecoder);

// Weighted L1 over log-magnitude spectrograms at several FFT sizes.
torch::Tensor multi_scale_stft_loss(const torch::Tensor& recon, const torch::Tensor& target,
                                    const std::vector<int64_t>& fft_sizes, const torch::Tensor& weights) {
  auto loss = F::l1_loss(recon, target);
  auto y_hat = recon.squeeze(1);
  auto y = target.squeeze(1);
  for (size_t s = 0; s < fft_sizes.size(); ++s) {
    const auto n_fft = fft_sizes[s];
    auto window = torch::hann_window(n_fft, y.options());
    auto spec_hat = torch::stft(y_hat, n_fft, n_fft / 4, n_fft, window, false, true, true).abs();
    auto spec = torch::stft(y, n_fft, n_fft / 4, n_fft, window, false, true, true).abs();
    loss = loss + weights[s] * F::l1_loss((spec_hat + 1e-5).log(), (spec + 1e-5).log());
  }
  return loss;
}

// 16-bit PCM for the listening-test export.
torch::Tensor to_pcm16(const torch::Tensor& recon) {
  auto pcm = torch::empty({recon.numel()}, torch::kInt16);
  pcm.copy_(recon.reshape({-1}) * 32767.0);  // EXPECT: tensor-copy-narrowing
  return pcm;
}

class CodecTrainer {
 public:
  CodecTrainer(const RvqConfig& cfg, std::vector<double> scale_weights)
      : cfg_(cfg),
        device_(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU),
        encoder_(32, cfg.dim),
        rvq_(cfg),
        decoder_(32, cfg.dim),
        scale_weights_(std::move(scale_weights)) {
    // Small init for the latent projection keeps the first codebook assignments stable.
    encoder_->proj->weight.mul_(0.1);  // EXPECT: tensor-inplace-on-leaf
    nn::init::zeros_(encoder_->proj->bias);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
    encoder_->to(device_);
    rvq_->to(device_);
    decoder_->to(device_);
    std::vector<torch::Tensor> params = encoder_->parameters();
    for (auto& p : decoder_->parameters()) params.push_back(p);
    opt_ = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(3e-4).betas({0.5, 0.9}));
  }

  // Seeds the codebooks' statistics from one batch and reports the relative
  // energy left after all stages.
  double warm_start(const torch::Tensor& wav) {
    auto z = encoder_(wav.to(device_));
    auto residual = z.detach();
    for (auto& layer : rvq_->layers()) {
      auto stage = layer->forward(residual);
      residual.sub_(stage.first);  // EXPECT: tensor-inplace-on-detached
    }
    return (residual.pow(2).mean() / z.pow(2).mean()).item<double>();
  }

  double train_epoch(const std::vector<torch::Tensor>& batches, int64_t log_every) {
    encoder_->train();
    rvq_->train();
    decoder_->train();
    auto scale_w = torch::tensor(scale_weights_);  // float64 on the host
    double running = 0.0;
    int64_t step = 0;
    for (const auto& wav_cpu : batches) {
      auto wav = wav_cpu.to(device_);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
      auto w = scale_w.to(device_, torch::kFloat);  // EXPECT: tensor-clone-in-loop
      auto out = rvq_(encoder_(wav));
      auto recon = decoder_(out.quantized);
      auto loss = multi_scale_stft_loss(recon, wav, fft_sizes_, w) + out.commit_loss;
      opt_->zero_grad();
      loss.backward();
      opt_->step();
      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      if (++step % log_every == 0) {
        std::cout << "step " << step << " loss " << loss.item<float>() << '\n';  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      }
    }
    return running / std::max<int64_t>(1, step);
  }

  double validate(const std::vector<torch::Tensor>& batches) {
    torch::NoGradGuard no_grad;
    encoder_->eval();
    rvq_->eval();
    decoder_->eval();
    auto total = torch::zeros({}, torch::TensorOptions().device(device_));
    for (const auto& wav_cpu : batches) {
      auto wav = wav_cpu.to(device_);
      auto recon = decoder_(rvq_(encoder_(wav)).quantized);
      total += F::l1_loss(recon, wav);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, no graph is built
    }
    return total.item<double>() / static_cast<double>(std::max<size_t>(1, batches.size()));
  }

  // Code frames for storage: [n_q, T] int32 per utterance.
  torch::Tensor export_codes(const torch::Tensor& wav, int64_t n_q) {
    torch::NoGradGuard no_grad;
    auto codes = rvq_->encode_codes(encoder_(wav.to(device_)), n_q).to(torch::kCPU);
    auto frames = torch::empty({codes.size(0), codes.size(2)}, torch::kInt);
    frames.copy_(codes.select(1, 0));  // LOOKALIKE: tensor-copy-narrowing -- code indices are below codebook_size, far inside int32
    return frames;
  }

  torch::Tensor reconstruct_pcm(const torch::Tensor& wav) {
    torch::NoGradGuard no_grad;
    auto recon = decoder_(rvq_(encoder_(wav.to(device_))).quantized).to(torch::kCPU);
    return to_pcm16(recon);
  }

 private:
  RvqConfig cfg_;
  torch::Device device_;
  ConvEncoder encoder_;
  ResidualVq rvq_;
  ConvDecoder decoder_;
  std::vector<double> scale_weights_;
  std::vector<int64_t> fft_sizes_{512, 1024, 2048};
  std::unique_ptr<torch::optim::Adam> opt_;
};
