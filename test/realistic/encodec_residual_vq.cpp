// Neural audio codec (EnCodec-style): strided conv encoder, residual vector quantiser with EMA
// codebooks, transposed-conv decoder and a multi-scale STFT reconstruction loss.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct CodecConfig {
  int64_t channels = 32;
  int64_t latent_dim = 128;
  std::vector<int64_t> strides = {2, 4, 8, 8};
  int64_t num_quantizers = 8;
  int64_t codebook_size = 1024;
  double ema_decay = 0.99;
  double eps = 1e-5;
  double commit_weight = 0.25;
  std::vector<int64_t> stft_scales = {512, 1024, 2048};
  int64_t log_every = 100;
};

// ---- Encoder / decoder blocks
struct EncoderBlockImpl : torch::nn::Module {
  EncoderBlockImpl(int64_t in_ch, int64_t out_ch, int64_t stride)
      : res1(torch::nn::Conv1dOptions(in_ch, in_ch, 3).padding(1)),
        res2(torch::nn::Conv1dOptions(in_ch, in_ch, 1)),
        down(torch::nn::Conv1dOptions(in_ch, out_ch, 2 * stride).stride(stride).padding(stride / 2)) {
    register_module("res1", res1);
    register_module("res2", res2);
    register_module("down", down);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = res2(F::elu(res1(x)));
    h.add_(x);  // LOOKALIKE: tensor-inplace-on-saved -- a convolution saves its input, not its output
    return F::elu(down(h));
  }

  torch::nn::Conv1d res1{nullptr}, res2{nullptr}, down{nullptr};
};
TORCH_MODULE(EncoderBlock);

struct DecoderBlockImpl : torch::nn::Module {
  DecoderBlockImpl(int64_t in_ch, int64_t out_ch, int64_t stride)
      : up(torch::nn::ConvTranspose1dOptions(in_ch, out_ch, 2 * stride).stride(stride).padding(stride / 2)),
        res1(torch::nn::Conv1dOptions(out_ch, out_ch, 3).padding(1)),
        res2(torch::nn::Conv1dOptions(out_ch, out_ch, 1)) {
    register_module("up", up);
    register_module("res1", res1);
    register_module("res2", res2);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = up(F::elu(x));
    return y + res2(F::elu(res1(y)));
  }

  torch::nn::ConvTranspose1d up{nullptr};
  torch::nn::Conv1d res1{nullptr}, res2{nullptr};
};
TORCH_MODULE(DecoderBlock);

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(const CodecConfig& cfg) {
    in_conv = register_module("in_conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(1, cfg.channels, 7).padding(3)));
    int64_t ch = cfg.channels;
    for (const auto s : cfg.strides) {
      blocks->push_back(EncoderBlock(ch, 2 * ch, s));
      ch *= 2;
    }
    register_module("blocks", blocks);
    out_conv = register_module("out_conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(ch, cfg.latent_dim, 3).padding(1)));
  }

  torch::Tensor forward(torch::Tensor x) {  // [B, 1, T] -> [B, D, T / hop]
    x = in_conv(x);
    for (const auto& m : *blocks) x = m->as<EncoderBlockImpl>()->forward(x);
    return out_conv(F::elu(x));
  }

  torch::nn::Conv1d in_conv{nullptr}, out_conv{nullptr};
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(Encoder);

struct DecoderImpl : torch::nn::Module {
  explicit DecoderImpl(const CodecConfig& cfg) {
    int64_t ch = cfg.channels << cfg.strides.size();
    in_conv = register_module("in_conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.latent_dim, ch, 7).padding(3)));
    for (auto it = cfg.strides.rbegin(); it != cfg.strides.rend(); ++it) {
      blocks->push_back(DecoderBlock(ch, ch / 2, *it));
      ch /= 2;
    }
    register_module("blocks", blocks);
    out_conv = register_module("out_conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(ch, 1, 7).padding(3)));
  }

  torch::Tensor forward(const torch::Tensor& q) {
    auto x = in_conv(q);
    for (const auto& m : *blocks) x = m->as<DecoderBlockImpl>()->forward(x);
    return torch::tanh(out_conv(F::elu(x)));
  }

  torch::nn::Conv1d in_conv{nullptr}, out_conv{nullptr};
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(Decoder);

// ---- Vector quantisation
struct VectorQuantizerImpl : torch::nn::Module {
  VectorQuantizerImpl(int64_t dim, int64_t size, double decay, double eps)
      : dim_(dim), size_(size), decay_(decay), eps_(eps) {
    embed_ = register_buffer("embed", torch::randn({size, dim}));
    embed_avg_ = register_buffer("embed_avg", embed_.clone());
    cluster_size_ = register_buffer("cluster_size", torch::ones({size}));
  }

  struct Output {
    torch::Tensor quantized;  // [B, D, T]
    torch::Tensor codes;      // [B, T]
  };

  Output forward(const torch::Tensor& z) {  // z: [B, D, T]
    const auto B = z.size(0);
    const auto T = z.size(2);
    // FACT: z = torch.randn(2, 4, 5); f = z.permute(0, 2, 1).reshape(-1, 4); assert is_copy_of(f, z) and not is_contiguous(z.permute(0, 2, 1))
    auto flat = z.permute({0, 2, 1}).reshape({-1, dim_});  // EXPECT: tensor-reshape-non-contiguous
    auto dist = flat.pow(2).sum(1, true) - 2 * flat.matmul(embed_.t()) + embed_.pow(2).sum(1).unsqueeze(0);
    auto idx = dist.argmin(1);
    // FACT: d = torch.randn(6, 8); i = d.argmin(1); assert is_view_of(i.view(2, 3), i)
    auto codes = idx.view({B, T});  // LOOKALIKE: tensor-view-non-contiguous -- argmin returns a fresh contiguous [B*T] tensor
    // FACT: e = torch.randn(10, 4); q = e.index_select(0, torch.tensor([1, 2, 3, 4, 5, 6])); assert is_view_of(q.view(2, 3, 4), q)
    auto quantized = embed_.index_select(0, idx).view({B, T, dim_}).permute({0, 2, 1});  // LOOKALIKE: tensor-view-non-contiguous -- index_select materialises a contiguous [B*T, D]
    if (is_training()) update_codebook(flat, idx);
    return {quantized, codes};
  }

  void update_codebook(const torch::Tensor& flat, const torch::Tensor& idx) {
    torch::NoGradGuard no_grad;
    auto onehot = F::one_hot(idx, size_).to(flat.scalar_type());  // [N, K]
    auto counts = onehot.sum(0);
    auto embed_sum = onehot.t().matmul(flat);  // [K, D]
    cluster_size_.mul_(decay_).add_(counts, 1.0 - decay_);  // LOOKALIKE: tensor-inplace-on-leaf -- a registered buffer, updated under NoGradGuard
    embed_avg_.mul_(decay_).add_(embed_sum, 1.0 - decay_);
    const auto n = cluster_size_.sum();
    auto smoothed = (cluster_size_ + eps_) / (n + size_ * eps_) * n;
    embed_.copy_(embed_avg_ / smoothed.unsqueeze(1));  // LOOKALIKE: tensor-inplace-on-leaf -- the codebook is a buffer, not a parameter
  }

  int64_t dim_, size_;
  double decay_, eps_;
  torch::Tensor embed_, embed_avg_, cluster_size_;
};
TORCH_MODULE(VectorQuantizer);

struct ResidualVQImpl : torch::nn::Module {
  explicit ResidualVQImpl(const CodecConfig& cfg) {
    for (int64_t q = 0; q < cfg.num_quantizers; ++q) {
      layers.push_back(register_module(
          "vq" + std::to_string(q), VectorQuantizer(cfg.latent_dim, cfg.codebook_size, cfg.ema_decay, cfg.eps)));
    }
  }

  struct Output {
    torch::Tensor quantized;    // straight-through [B, D, T]
    torch::Tensor codes;        // [n_q, B, T]
    torch::Tensor commit_loss;  // scalar
  };

  Output forward(const torch::Tensor& z, int64_t n_q = -1) {
    if (n_q < 0 || n_q > static_cast<int64_t>(layers.size())) n_q = static_cast<int64_t>(layers.size());
    // the residuals are only search targets for the codebooks: no gradient through them
    auto residual = z.detach();
    auto quantized = torch::zeros_like(z);
    std::vector<torch::Tensor> codes;
    for (int64_t q = 0; q < n_q; ++q) {
      auto out = layers[q]->forward(residual);
      quantized += out.quantized;  // LOOKALIKE: tensor-graph-kept-across-iterations -- codebook rows are buffers (nothing requires grad) and the sum is returned
      // FACT: z = torch.randn(2, 3, requires_grad=True) * 1; z0 = z.detach().clone(); r = z.detach(); r.sub_(torch.ones(2, 3)); assert shares_storage(r, z) and not torch.equal(z, z0)
      residual.sub_(out.quantized);  // EXPECT: tensor-inplace-on-detached
      codes.push_back(out.codes);
    }
    auto commit = F::mse_loss(z, quantized);
    auto st = z + (quantized - z).detach();  // straight-through estimator
    return {st, torch::stack(codes, 0), commit};
  }

  std::vector<VectorQuantizer> layers;
};
TORCH_MODULE(ResidualVQ);

struct EncodecImpl : torch::nn::Module {
  explicit EncodecImpl(const CodecConfig& cfg) {
    encoder = register_module("encoder", Encoder(cfg));
    rvq = register_module("rvq", ResidualVQ(cfg));
    decoder = register_module("decoder", Decoder(cfg));
  }

  struct Output {
    torch::Tensor audio;
    torch::Tensor codes;
    torch::Tensor commit_loss;
  };

  Output forward(const torch::Tensor& wav, int64_t n_q = -1) {
    auto z = encoder->forward(wav);
    auto q = rvq->forward(z, n_q);
    auto audio = decoder->forward(q.quantized);
    audio = audio.narrow(-1, 0, std::min(audio.size(-1), wav.size(-1)));
    return {audio, q.codes, q.commit_loss};
  }

  Encoder encoder{nullptr};
  ResidualVQ rvq{nullptr};
  Decoder decoder{nullptr};
};
TORCH_MODULE(Encodec);

// ---- Losses and data preparation
torch::Tensor multiscale_stft_loss(const torch::Tensor& pred, const torch::Tensor& target, const CodecConfig& cfg) {
  auto p = pred.squeeze(1);
  auto t = target.squeeze(1);
  auto loss = torch::zeros({}, pred.options());
  for (const int64_t n_fft : cfg.stft_scales) {
    auto window = torch::hann_window(n_fft, pred.options());
    auto spec_p = torch::view_as_real(torch::stft(p, n_fft, n_fft / 4, n_fft, window, false, true, true));
    auto spec_t = torch::view_as_real(torch::stft(t, n_fft, n_fft / 4, n_fft, window, false, true, true));
    auto mag_p = spec_p.pow(2).sum(-1).sqrt();
    // FACT: x = torch.randn(4, requires_grad=True); m = x.pow(2).sqrt(); m.clamp_min_(1e-5); assert backward_fails(lambda: m.log().sum().backward())
    mag_p.clamp_min_(cfg.eps);  // EXPECT: tensor-inplace-on-saved
    auto mag_t = spec_t.pow(2).sum(-1).sqrt().clamp_min(cfg.eps);
    loss += (mag_p - mag_t).abs().mean() + (mag_p.log() - mag_t.log()).abs().mean();  // LOOKALIKE: tensor-graph-kept-across-iterations -- the per-scale sum is returned and backpropagated by the caller
  }
  return loss / static_cast<double>(cfg.stft_scales.size());
}

// Removes DC and scales every clip to unit peak.
torch::Tensor peak_normalize(const torch::Tensor& wav) {
  torch::Tensor x = wav;
  // FACT: w = torch.randn(2, 1, 8); x = w; x = x - x.mean(-1, keepdim=True); assert is_copy_of(x, w)
  x = x - x.mean({-1}, true);  // LOOKALIKE: tensor-alias-then-mutate -- rebound to an out-of-place result, the caller's wav is untouched
  auto peak = x.abs().amax({-1}, true).clamp_min(1e-4);
  auto out = x.clone();  // EXPECT: tensor-unnecessary-clone
  out.div_(peak);
  return out;
}

// ---- Training and evaluation
double train_epoch(Encodec& codec, torch::optim::Adam& opt, const std::vector<torch::Tensor>& clips,
                   const CodecConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  codec->to(device);
  codec->train();

  double running = 0.0;
  auto epoch_commit = torch::zeros({}, torch::TensorOptions().device(device));
  auto recon_sum = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (const auto& clip : clips) {
    auto wav = peak_normalize(clip).to(device);  // [B, 1, T]
    auto out = codec->forward(wav);
    auto recon_loss = multiscale_stft_loss(out.audio, wav, cfg) + F::l1_loss(out.audio, wav);
    auto loss = recon_loss + cfg.commit_weight * out.commit_loss;

    opt.zero_grad();
    loss.backward();
    opt.step();

    running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
    epoch_commit += out.commit_loss;  // EXPECT: tensor-graph-kept-across-iterations
    recon_sum = recon_sum + recon_loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no history kept
    if (++step % cfg.log_every == 0) {
      std::cout << "step " << step << " recon " << recon_loss.item<float>() << std::endl;  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
  }
  if (step > 0) {
    std::cout << "epoch: recon " << (recon_sum / step).item<double>() << " commit "
              << (epoch_commit / step).item<double>() << std::endl;
  }
  return step > 0 ? running / static_cast<double>(step) : 0.0;
}

// SNR of the reconstruction when only the first n_q codebooks are transmitted.
std::vector<double> bitrate_sweep(Encodec& codec, const torch::Tensor& wav, const CodecConfig& cfg) {
  torch::NoGradGuard no_grad;
  codec->eval();
  std::vector<double> snr_db;
  for (int64_t n_q = 1; n_q <= cfg.num_quantizers; ++n_q) {
    auto ref = wav.clone();  // EXPECT: tensor-clone-in-loop
    auto rec = codec->forward(wav, n_q).audio;
    auto noise = (rec - ref.narrow(-1, 0, rec.size(-1))).pow(2).sum().item<double>();
    auto signal = ref.pow(2).sum().item<double>();
    snr_db.push_back(10.0 * std::log10(signal / std::max(noise, 1e-12)));
  }
  return snr_db;
}
