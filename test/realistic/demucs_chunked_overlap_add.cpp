// Offline and streaming separation of a long stereo recording with a small
// Demucs-style U-Net (strided conv encoder, BLSTM bottleneck, transposed conv
// decoder). Long inputs are cut into overlapping segments; every segment's
// estimate is weighted by a triangular window, overlap-added, and divided by
// the summed window.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct SeparatorConfig {
  int64_t sample_rate = 44100;
  double segment_seconds = 6.0;
  double overlap = 0.25;
  double transition_power = 1.0;
  double silence = 1e-4;
  int64_t sources = 4;
  int64_t channels = 2;
  int64_t depth = 4;
  int64_t hidden = 32;
  int64_t kernel = 8;
  int64_t stride = 4;
};

class BLSTMImpl : public torch::nn::Module {
 public:
  explicit BLSTMImpl(int64_t dim)
      : lstm(register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(dim, dim).num_layers(2).bidirectional(true)))),
        proj(register_module("proj", torch::nn::Linear(2 * dim, dim))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = std::get<0>(lstm(x.permute({2, 0, 1})));
    return proj(y).permute({1, 2, 0});
  }

  torch::nn::LSTM lstm;
  torch::nn::Linear proj;
};
TORCH_MODULE(BLSTM);

class DemucsImpl : public torch::nn::Module {
 public:
  explicit DemucsImpl(const SeparatorConfig& cfg) : cfg_(cfg) {
    int64_t in_ch = cfg.channels, ch = cfg.hidden;
    for (int64_t i = 0; i < cfg.depth; ++i) {
      torch::nn::Sequential enc(
          torch::nn::Conv1d(torch::nn::Conv1dOptions(in_ch, ch, cfg.kernel).stride(cfg.stride)), torch::nn::ReLU(),
          torch::nn::Conv1d(torch::nn::Conv1dOptions(ch, 2 * ch, 1)), torch::nn::GLU(torch::nn::GLUOptions(1)));
      encoder.push_back(register_module("enc" + std::to_string(i), enc));
      const int64_t out_ch = i == 0 ? cfg.sources * cfg.channels : in_ch;
      torch::nn::Sequential dec(
          torch::nn::Conv1d(torch::nn::Conv1dOptions(ch, 2 * ch, 1)), torch::nn::GLU(torch::nn::GLUOptions(1)),
          torch::nn::ConvTranspose1d(torch::nn::ConvTranspose1dOptions(ch, out_ch, cfg.kernel).stride(cfg.stride)));
      if (i > 0) dec->push_back(torch::nn::ReLU());
      decoder.insert(decoder.begin(), register_module("dec" + std::to_string(i), dec));
      in_ch = ch;
      ch *= 2;
    }
    lstm = register_module("lstm", BLSTM(in_ch));
  }

  int64_t valid_length(int64_t length) const {
    for (int64_t i = 0; i < cfg_.depth; ++i)
      length = std::max<int64_t>(1, (length - cfg_.kernel + cfg_.stride - 1) / cfg_.stride + 1);
    for (int64_t i = 0; i < cfg_.depth; ++i) length = (length - 1) * cfg_.stride + cfg_.kernel;
    return length;
  }

  torch::Tensor forward(const torch::Tensor& mix) {
    const auto length = mix.size(-1);
    const auto delta = valid_length(length) - length;
    auto x = F::pad(mix, F::PadFuncOptions({delta / 2, delta - delta / 2}));
    std::vector<torch::Tensor> skips;
    for (auto& enc : encoder) {
      x = enc->forward(x);
      skips.push_back(x);
    }
    x = lstm(x);
    for (auto& dec : decoder) {
      x = dec->forward(x + skips.back());
      skips.pop_back();
    }
    x = x.narrow(-1, delta / 2, length);
    // FACT: x=torch.randn(1,8,20).narrow(-1,2,16); v=x.view(1,4,2,16); assert not is_contiguous(x) and is_view_of(v,x)
    return x.view({x.size(0), cfg_.sources, cfg_.channels, length});  // LOOKALIKE: tensor-view-non-contiguous -- only the time axis was cropped; splitting the channel axis is still expressible with strides
  }

  SeparatorConfig cfg_;
  std::vector<torch::nn::Sequential> encoder, decoder;
  BLSTM lstm{nullptr};
};
TORCH_MODULE(Demucs);

torch::Tensor triangular_window(int64_t length) {
  auto up = torch::arange(1, length / 2 + 1, torch::kFloat);
  auto down = torch::arange(length - length / 2, 0, -1, torch::kFloat);
  auto w = torch::cat({up, down});
  return w / w.max();
}

// Per-sample weight of one segment estimate, broadcast over sources and channels.
torch::Tensor segment_weight(const SeparatorConfig& cfg, int64_t segment) {
  auto w = triangular_window(segment).view({1, 1, segment}).expand({cfg.sources, cfg.channels, segment});
  // FACT: w=torch.rand(6).view(1,1,6).expand(4,2,6); assert raises(lambda: w.pow_(1.0), 'more than one element')
  w.pow_(cfg.transition_power);  // EXPECT: tensor-inplace-on-expanded
  return w;
}

struct Normalised {
  torch::Tensor wav;
  torch::Tensor mean, stdev;
};

Normalised normalise(const torch::Tensor& mix) {
  auto ref = mix.mean(0);
  auto mean = ref.mean();
  auto stdev = ref.std();
  // FACT: m=torch.zeros(2,8); w=m; w-=1.0; w/=2.0; assert shares_storage(m,w) and m.sum()==-8
  auto wav = mix;
  wav -= mean;  // EXPECT: tensor-alias-then-mutate
  wav /= stdev + 1e-8;
  return {wav, mean, stdev};
}

torch::Tensor apply_chunked(Demucs& model, const torch::Tensor& wav, const SeparatorConfig& cfg,
                            const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const auto channels = wav.size(0), total = wav.size(1);
  const auto segment = static_cast<int64_t>(cfg.segment_seconds * cfg.sample_rate);
  const auto hop = static_cast<int64_t>((1.0 - cfg.overlap) * segment);

  auto out = torch::zeros({cfg.sources, channels, total}, wav.options());
  auto sum_weight = torch::zeros({total}, wav.options());
  auto weight = segment_weight(cfg, segment);
  auto window = weight[0][0];
  float peak = 0.f;

  for (int64_t offset = 0; offset < total; offset += hop) {
    const auto len = std::min(segment, total - offset);
    sum_weight.narrow(0, offset, len).add_(window.narrow(0, 0, len));
    auto chunk = wav.narrow(1, offset, len).clone();  // EXPECT: tensor-unnecessary-clone
    if (chunk.abs().max().item<float>() < cfg.silence) continue;  // LOOKALIKE: tensor-sync-in-loop -- the chunk is still on the host, and the value decides whether the model runs

    auto est = model->forward(chunk.unsqueeze(0).to(device)).squeeze(0);  // LOOKALIKE: tensor-clone-in-loop -- a new segment of the mix every iteration
    auto w = weight.to(device);  // EXPECT: tensor-clone-in-loop
    peak = std::max(peak, est.abs().max().item<float>());  // EXPECT: tensor-sync-in-loop
    // FACT: acc=torch.zeros(4,2,10); w=torch.rand(10).expand(4,2,10); acc.add_(torch.ones(4,2,10)*w); assert w.stride()[0]==0 and acc.sum()>0
    out.narrow(2, offset, len).add_(est * w.narrow(2, 0, len));  // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-inplace-on-expanded -- the expanded window is only read; the write goes into out
    if (offset + segment >= total) break;
  }
  std::cout << "segment peak " << peak << std::endl;
  return out / sum_weight.clamp_min(1e-8);
}

// Low-latency path: keeps the last segment of input and the pending
// overlap-add tail on the device, and returns one hop of one stem per call as
// interleaved 16-bit samples for the audio callback.
class StreamingSeparator {
 public:
  StreamingSeparator(Demucs model, const SeparatorConfig& cfg, torch::Device device, int64_t stem)
      : model_(std::move(model)), device_(device), stem_(stem) {
    segment_ = static_cast<int64_t>(cfg.segment_seconds * cfg.sample_rate) / 4;
    hop_ = static_cast<int64_t>((1.0 - cfg.overlap) * segment_);
    channels_ = cfg.channels;
    window_ = triangular_window(segment_).to(device_);
    history_ = torch::zeros({cfg.channels, segment_});
    pending_ = torch::zeros({cfg.sources, cfg.channels, segment_}, torch::TensorOptions().device(device_));
    pending_w_ = torch::zeros({segment_}, torch::TensorOptions().device(device_));
    playback_ = torch::empty({hop_ * cfg.channels}, torch::kInt16);
  }

  int64_t hop() const { return hop_; }

  const torch::Tensor& push(const torch::Tensor& block) {
    torch::NoGradGuard no_grad;
    const auto keep = segment_ - hop_;
    // FACT: b=torch.arange(20.).view(2,10); b.narrow(1,0,7).copy_(b.narrow(1,3,7).clone()); assert b[1,0]==13
    history_.narrow(1, 0, keep).copy_(history_.narrow(1, hop_, keep).clone());  // LOOKALIKE: tensor-inplace-overlap -- the shifted source is cloned before it is written back
    // FACT: b=torch.randn(40); f=b.view(20,2).t(); assert is_view_of(f,b)
    history_.narrow(1, keep, hop_).copy_(block.view({hop_, channels_}).t());  // LOOKALIKE: tensor-view-non-contiguous -- the callback's interleaved block is contiguous; t() comes after the view

    auto est = model_->forward(history_.unsqueeze(0).to(device_)).squeeze(0);
    pending_.add_(est * window_);  // LOOKALIKE: tensor-device-mismatch -- window_ was moved to the device once, in the constructor
    pending_w_.add_(window_);
    auto ready = pending_.narrow(2, 0, hop_) / pending_w_.narrow(0, 0, hop_).clamp_min(1e-6);

    // FACT: b=torch.arange(10.); assert raises(lambda: b.narrow(0,0,7).copy_(b.narrow(0,3,7)), 'single memory location')
    pending_w_.narrow(0, 0, keep).copy_(pending_w_.narrow(0, hop_, keep));  // EXPECT: tensor-inplace-overlap
    pending_w_.narrow(0, keep, hop_).zero_();
    pending_ = torch::cat({pending_.narrow(2, hop_, keep), torch::zeros_like(pending_.narrow(2, 0, hop_))}, 2);

    // FACT: s=torch.randn(2,50); assert raises(lambda: s.t().view(-1), 'view size is not compatible')
    auto interleaved = ready.select(0, stem_).t().view({-1});  // EXPECT: tensor-view-non-contiguous
    playback_.copy_(interleaved.clamp(-1.0, 1.0) * 32767.0);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ may read from another device
    return playback_;
  }

 private:
  Demucs model_;
  torch::Device device_;
  int64_t stem_, segment_ = 0, hop_ = 0, channels_ = 0;
  torch::Tensor window_, history_, pending_, pending_w_, playback_;
};

// Interleaved 16-bit PCM, one row per stem, for the WAV writer.
torch::Tensor stems_to_pcm16(const torch::Tensor& sources) {
  // FACT: s=torch.randn(4,2,50); r=s.permute(0,2,1).reshape(4,-1); assert is_copy_of(r,s)
  auto interleaved = sources.permute({0, 2, 1}).reshape({sources.size(0), -1});  // EXPECT: tensor-reshape-non-contiguous
  return (interleaved.clamp(-1.0, 1.0) * 32767.0).round().to(torch::kInt16);  // LOOKALIKE: tensor-copy-narrowing -- the float-to-int16 conversion is explicit and clamped first
}

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  SeparatorConfig cfg;
  Demucs model(cfg);
  model->to(device);
  model->eval();

  const int64_t seconds = 30;
  auto t = torch::arange(seconds * cfg.sample_rate, torch::kFloat) / cfg.sample_rate;
  auto mix = torch::stack({0.3 * torch::sin(2 * M_PI * 220 * t), 0.3 * torch::sin(2 * M_PI * 331 * t)}) +
             0.05 * torch::randn({2, t.size(0)});

  auto norm = normalise(mix);
  auto sources = apply_chunked(model, norm.wav, cfg, device);
  // FACT: a=torch.randn(4,2,10); s=a/(torch.rand(10)+1); s.mul_(2.0); assert is_copy_of(s,a)
  sources.mul_(norm.stdev).add_(norm.mean);  // LOOKALIKE: tensor-alias-then-mutate -- the division at the end of apply_chunked allocated sources; nobody else holds it
  auto residual = mix - sources.sum(0);
  std::cout << "residual rms " << residual.pow(2).mean().sqrt().item<double>() << std::endl;

  auto pcm = stems_to_pcm16(sources);
  std::cout << "pcm " << pcm.sizes() << std::endl;

  StreamingSeparator stream(model, cfg, device, /*stem=*/3);
  auto interleaved_mix = mix.t().contiguous().view({-1});
  const auto block = stream.hop() * cfg.channels;
  int64_t emitted = 0;
  for (int64_t pos = 0; pos + block <= std::min<int64_t>(interleaved_mix.numel(), 20 * block); pos += block) {
    emitted += stream.push(interleaved_mix.narrow(0, pos, block)).numel();
  }
  std::cout << "streamed " << emitted << " samples" << std::endl;
  return 0;
}
