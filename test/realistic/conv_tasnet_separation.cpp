// Conv-TasNet (Luo & Mesgarani, 2019): learned conv encoder, dilated-TCN mask separator,
// transposed-conv decoder; trained on negative SI-SNR with permutation-invariant training.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct TasNetConfig {
  int64_t enc_kernel = 16;   // L: filter length in samples
  int64_t enc_dim = 512;     // N: number of basis filters
  int64_t bottleneck = 128;  // B
  int64_t hidden = 512;      // H: channels inside a TCN block
  int64_t kernel = 3;        // P
  int64_t blocks = 8;        // X: dilations 1..2^(X-1)
  int64_t repeats = 3;       // R
  int64_t speakers = 2;      // C
  double mask_floor = 0.0;   // optional lower bound on masks
  double lr = 1e-3;
  double clip = 5.0;
  double gain_db = 6.0;
  int64_t epochs = 100;
  int64_t log_every = 50;
};

struct Batch {
  torch::Tensor mixture;  // [B, T]
  torch::Tensor sources;  // [B, C, T]
};

// Global layer norm over channels and time (gLN in the paper).
struct GlobalLayerNormImpl : nn::Module {
  explicit GlobalLayerNormImpl(int64_t channels) {
    gamma = register_parameter("gamma", torch::ones({1, channels, 1}));
    beta = register_parameter("beta", torch::zeros({1, channels, 1}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto mean = x.mean({1, 2}, /*keepdim=*/true);
    auto var = (x - mean).pow(2).mean({1, 2}, /*keepdim=*/true);
    return gamma * (x - mean) / torch::sqrt(var + 1e-8) + beta;
  }
  torch::Tensor gamma, beta;
};
TORCH_MODULE(GlobalLayerNorm);

// Channel-wise layer norm at the separator input (cLN): LayerNorm over N per frame.
struct ChannelNormImpl : nn::Module {
  explicit ChannelNormImpl(int64_t channels) : ln(nn::LayerNormOptions({channels})) {
    register_module("ln", ln);
  }
  torch::Tensor forward(const torch::Tensor& x) {  // [B, N, T]
    const auto batch = x.size(0), channels = x.size(1), frames = x.size(2);
    // FACT: x = torch.randn(2, 8, 5); assert not is_contiguous(x.transpose(1, 2)) and is_copy_of(x.transpose(1, 2).reshape(10, 8), x)
    auto rows = x.transpose(1, 2).reshape({batch * frames, channels});  // EXPECT: tensor-reshape-non-contiguous
    return ln(rows).view({batch, frames, channels}).transpose(1, 2);
  }
  nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(ChannelNorm);

// 1x1 conv -> PReLU -> gLN -> depthwise dilated conv -> PReLU -> gLN -> (residual, skip).
struct TemporalBlockImpl : nn::Module {
  TemporalBlockImpl(int64_t in_ch, int64_t hid, int64_t k, int64_t dilation)
      : in_conv(nn::Conv1dOptions(in_ch, hid, 1)),
        dw_conv(nn::Conv1dOptions(hid, hid, k)
                    .dilation(dilation)
                    .padding(dilation * (k - 1) / 2)
                    .groups(hid)),
        res_conv(nn::Conv1dOptions(hid, in_ch, 1)),
        skip_conv(nn::Conv1dOptions(hid, in_ch, 1)),
        norm1(hid),
        norm2(hid) {
    register_module("in_conv", in_conv);
    register_module("dw_conv", dw_conv);
    register_module("res_conv", res_conv);
    register_module("skip_conv", skip_conv);
    register_module("act1", act1);
    register_module("act2", act2);
    register_module("norm1", norm1);
    register_module("norm2", norm2);
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    auto y = norm1(act1(in_conv(x)));
    y = norm2(act2(dw_conv(y)));
    auto residual = res_conv(y);
    auto skip = skip_conv(y);
    residual += x;  // LOOKALIKE: tensor-inplace-on-saved -- a convolution does not save its output for backward
    return {residual, skip};
  }

  nn::Conv1d in_conv, dw_conv, res_conv, skip_conv;
  nn::PReLU act1, act2;
  GlobalLayerNorm norm1, norm2;
};
TORCH_MODULE(TemporalBlock);

struct SeparatorImpl : nn::Module {
  explicit SeparatorImpl(const TasNetConfig& cfg)
      : cfg_(cfg),
        norm(cfg.enc_dim),
        bottleneck(nn::Conv1dOptions(cfg.enc_dim, cfg.bottleneck, 1)),
        mask_conv(nn::Conv1dOptions(cfg.bottleneck, cfg.speakers * cfg.enc_dim, 1)) {
    register_module("norm", norm);
    register_module("bottleneck", bottleneck);
    register_module("prelu", prelu);
    register_module("mask_conv", mask_conv);
    for (int64_t r = 0; r < cfg.repeats; ++r)
      for (int64_t x = 0; x < cfg.blocks; ++x) {
        tcn.push_back(TemporalBlock(cfg.bottleneck, cfg.hidden, cfg.kernel, int64_t{1} << x));
        register_module("tcn_" + std::to_string(r) + "_" + std::to_string(x), tcn.back());
      }
  }

  // w: encoder output [B, N, T'] -> masks [B, C, N, T']
  torch::Tensor forward(const torch::Tensor& w) {
    const auto batch = w.size(0), frames = w.size(2);
    auto y = bottleneck(norm(w));
    auto skip_sum = torch::zeros_like(y);
    for (auto& block : tcn) {
      auto out = block->forward(y);
      y = out.first;
      skip_sum = skip_sum + out.second;  // LOOKALIKE: tensor-graph-kept-across-iterations -- the sum feeds the masks this forward returns
    }
    auto masks = torch::sigmoid(mask_conv(prelu(skip_sum)));
    if (cfg_.mask_floor > 0.0) {
      masks.clamp_min_(cfg_.mask_floor);  // EXPECT: tensor-inplace-on-saved
    }
    // FACT: m = torch.sigmoid(torch.randn(2, 12, 7)); assert is_view_of(m.view(2, 3, 4, 7), m)
    return masks.view({batch, cfg_.speakers, cfg_.enc_dim, frames});  // LOOKALIKE: tensor-view-non-contiguous -- sigmoid's result is contiguous
  }

  TasNetConfig cfg_;
  ChannelNorm norm;
  nn::Conv1d bottleneck;
  nn::PReLU prelu;
  nn::Conv1d mask_conv;
  std::vector<TemporalBlock> tcn;
};
TORCH_MODULE(Separator);

struct ConvTasNetImpl : nn::Module {
  explicit ConvTasNetImpl(const TasNetConfig& cfg)
      : cfg_(cfg),
        encoder(nn::Conv1dOptions(1, cfg.enc_dim, cfg.enc_kernel).stride(cfg.enc_kernel / 2).bias(false)),
        separator(cfg),
        decoder(nn::ConvTranspose1dOptions(cfg.enc_dim, 1, cfg.enc_kernel)
                    .stride(cfg.enc_kernel / 2)
                    .bias(false)) {
    register_module("encoder", encoder);
    register_module("separator", separator);
    register_module("decoder", decoder);
  }

  // mixture: [B, T] -> estimated sources [B, C, T]
  torch::Tensor forward(const torch::Tensor& mixture) {
    const auto batch = mixture.size(0), samples = mixture.size(1);
    auto w = torch::relu(encoder(mixture.unsqueeze(1)));
    auto masks = separator(w);
    auto masked = masks * w.unsqueeze(1);
    // FACT: m = torch.rand(2, 3, 4, 5) * torch.rand(2, 1, 4, 5); assert is_view_of(m.view(6, 4, -1), m)
    auto flat = masked.view({batch * cfg_.speakers, cfg_.enc_dim, -1});  // LOOKALIKE: tensor-view-non-contiguous -- the product is freshly allocated and contiguous
    auto est = decoder(flat).view({batch, cfg_.speakers, -1});
    const int64_t missing = std::max<int64_t>(0, samples - est.size(2));
    est = F::pad(est, F::PadFuncOptions({0, missing}));
    return est.narrow(2, 0, samples);
  }

  int64_t speakers() const { return cfg_.speakers; }

  TasNetConfig cfg_;
  nn::Conv1d encoder;
  Separator separator;
  nn::ConvTranspose1d decoder;
};
TORCH_MODULE(ConvTasNet);

// Scale-invariant SNR in dB along the last dim; broadcasts over leading dims.
torch::Tensor si_snr(torch::Tensor est, torch::Tensor ref, double eps = 1e-8) {
  est = est - est.mean(-1, /*keepdim=*/true);
  ref = ref - ref.mean(-1, /*keepdim=*/true);
  auto dot = (est * ref).sum(-1, /*keepdim=*/true);
  auto s_target = dot * ref / (ref.pow(2).sum(-1, /*keepdim=*/true) + eps);
  auto e_noise = est - s_target;
  return 10 * torch::log10(s_target.pow(2).sum(-1) / (e_noise.pow(2).sum(-1) + eps) + eps);
}

// Negative SI-SNR of the best speaker permutation, averaged over the batch.
torch::Tensor pit_si_snr_loss(const torch::Tensor& est, const torch::Tensor& ref) {
  const int64_t C = est.size(1);
  auto pairwise = si_snr(est.unsqueeze(2), ref.unsqueeze(1));  // [B, C(est), C(ref)]
  std::vector<int64_t> perm(C);
  std::iota(perm.begin(), perm.end(), 0);
  auto rows = torch::arange(C);
  std::vector<torch::Tensor> scores;
  do {
    auto cols = torch::tensor(perm, torch::kLong);
    auto s = pairwise.index({torch::indexing::Slice(), rows, cols}).mean(-1);
    scores.push_back(s);  // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked into the returned loss
  } while (std::next_permutation(perm.begin(), perm.end()));
  auto best = std::get<0>(torch::stack(scores, 1).max(1));
  return -best.mean();
}

// Random-gain augmentation: the separator should not depend on the input level.
std::pair<torch::Tensor, torch::Tensor> augment_gain(const torch::Tensor& mixture,
                                                     const torch::Tensor& sources, double max_db) {
  auto db = (torch::rand({mixture.size(0), 1}) * 2 - 1) * max_db;
  auto gain = torch::pow(10.0, db / 20.0);
  torch::Tensor mix = mixture;
  // FACT: a = torch.randn(2, 5); b = a; b *= 2.0; assert shares_storage(a, b)
  mix *= gain;  // EXPECT: tensor-alias-then-mutate
  auto src = sources * gain.unsqueeze(1);
  return {mix, src};
}

// SI-SNR improvement over the unprocessed mixture, in dB (evaluation only).
double si_snr_improvement(const torch::Tensor& est, const torch::Tensor& ref,
                          const torch::Tensor& mix) {
  auto ref_centered = ref.clone();  // EXPECT: tensor-unnecessary-clone
  ref_centered -= ref.mean(-1, /*keepdim=*/true);
  auto baseline_in = mix.unsqueeze(1).expand_as(ref);  // LOOKALIKE: tensor-inplace-on-expanded -- only read by si_snr
  auto base = si_snr(baseline_in, ref_centered).mean();
  auto sep = -pit_si_snr_loss(est, ref_centered);
  return (sep - base).item<double>();
}

// Separates long recordings [B, T] in overlapping segments, then overlap-adds.
torch::Tensor separate_long(ConvTasNet& model, const torch::Tensor& waves, int64_t seg,
                            int64_t seg_batch, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t hop = seg / 2;
  const int64_t B = waves.size(0), total = waves.size(1);
  const int64_t n_seg = std::max<int64_t>(1, (total - seg + hop - 1) / hop + 1);
  const int64_t padded_len = (n_seg - 1) * hop + seg;
  auto padded = F::pad(waves, F::PadFuncOptions({0, std::max<int64_t>(0, padded_len - total)}));
  // FACT: x = torch.randn(2, 1000); u = x.unfold(1, 100, 50); assert not is_contiguous(u) and is_copy_of(u.reshape(2 * u.size(1), 100), x)
  auto segments = padded.unfold(1, seg, hop).reshape({B * n_seg, seg});  // EXPECT: tensor-reshape-non-contiguous
  auto window = torch::hann_window(seg);
  auto out = torch::zeros({B * n_seg, model->speakers(), seg});
  for (int64_t s = 0; s < B * n_seg; s += seg_batch) {
    const int64_t n = std::min(seg_batch, B * n_seg - s);
    auto chunk = segments.narrow(0, s, n).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice every iteration
    auto est = model->forward(chunk) * window.to(device);  // EXPECT: tensor-clone-in-loop
    out.narrow(0, s, n).copy_(est);
  }
  // FACT: o = torch.zeros(6, 2, 8); assert is_view_of(o.view(2, 3, 2, 8), o)
  auto per_wave = out.view({B, n_seg, -1, seg});  // LOOKALIKE: tensor-view-non-contiguous -- a fresh zeros buffer
  auto result = torch::zeros({B, per_wave.size(2), padded_len});
  for (int64_t k = 0; k < n_seg; ++k) result.narrow(2, k * hop, seg) += per_wave.select(1, k);
  return result.narrow(2, 0, total);
}

double validate(ConvTasNet& model, const std::vector<Batch>& val, torch::Device device) {
  model->eval();
  torch::Tensor total = torch::zeros({}, device);
  for (const auto& b : val) {
    auto est = model->forward(b.mixture.to(device));
    total += -pit_si_snr_loss(est, b.sources.to(device));  // EXPECT: tensor-graph-kept-across-iterations
  }
  return total.item<double>() / static_cast<double>(val.size());
}

void train(ConvTasNet& model, std::vector<Batch>& data, const std::vector<Batch>& val,
           const TasNetConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double running = 0.0;
    for (auto& batch : data) {
      auto aug = augment_gain(batch.mixture, batch.sources, cfg.gain_db);
      auto mix = aug.first.to(device);
      auto ref = aug.second.to(device);
      opt.zero_grad();
      auto loss = pit_si_snr_loss(model->forward(mix), ref);
      loss.backward();
      for (auto& p : model->parameters())
        if (p.grad().defined()) p.grad().nan_to_num_(0.0);  // LOOKALIKE: tensor-inplace-on-leaf -- writes the gradient, not the parameter
      nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    const double val_snr = validate(model, val, device);
    std::cout << "epoch " << epoch << " train " << running / data.size() << " val SI-SNR "
              << val_snr << " dB\n";
  }
}
