// WaveNet vocoder: 8-bit mu-law classes, stacks of dilated causal convolutions with gated tanh/sigmoid
// units, residual and skip connections, local conditioning on upsampled mel frames and global
// conditioning on a speaker embedding. Trained with teacher forcing; sampled one step at a time.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <tuple>
#include <vector>

struct WaveNetConfig {
  int64_t quant = 256, residual_ch = 64, gate_ch = 128, skip_ch = 256, n_mels = 80, spk_dim = 64;
  int64_t layers_per_stack = 10, stacks = 3, kernel = 2, hop = 256;
  int64_t batch_size = 8, segment = 7680, iters = 500000, log_every = 100;
  double lr = 1e-3, preemphasis = 0.97, temperature = 1.0;
};

// [-1, 1] floats -> classes in [0, mu].
torch::Tensor mulaw_encode(const torch::Tensor &x, int64_t mu) {
  auto y = torch::sign(x) * torch::log1p(mu * x.abs()) / std::log1p(double(mu));
  return ((y + 1) / 2 * mu + 0.5).to(torch::kLong);
}

// Classes in [0, mu] -> [-1, 1] floats.
torch::Tensor mulaw_decode(const torch::Tensor &q, int64_t mu) {
  auto y = 2 * q.to(torch::kFloat) / mu - 1;
  return torch::sign(y) * (torch::pow(1.0 + mu, y.abs()) - 1) / mu;
}

// Mel frames [B, n_mels, F] repeated to the sample rate and cut to T samples.
torch::Tensor upsample_cond(const torch::Tensor &mel, int64_t hop, int64_t T) {
  return mel.repeat_interleave(hop, 2).narrow(2, 0, T);
}

struct CausalConv1dImpl : torch::nn::Module {
  CausalConv1dImpl(int64_t in, int64_t out, int64_t kernel, int64_t dilation) {
    conv_ = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(in, out, kernel)
                                                          .dilation(dilation)
                                                          .padding((kernel - 1) * dilation)));
  }
  // Padding on both sides, then the first T outputs: output t sees inputs <= t only.
  torch::Tensor forward(const torch::Tensor &x) { return conv_(x).narrow(2, 0, x.size(2)); }
  torch::nn::Conv1d conv_{nullptr};
};
TORCH_MODULE(CausalConv1d);

struct GatedResidualBlockImpl : torch::nn::Module {
  GatedResidualBlockImpl(const WaveNetConfig &cfg, int64_t dilation) {
    dilated_ = register_module("dilated", CausalConv1d(cfg.residual_ch, 2 * cfg.gate_ch, cfg.kernel, dilation));
    local_ = register_module("local", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.n_mels, 2 * cfg.gate_ch, 1)));
    global_ = register_module("global", torch::nn::Linear(cfg.spk_dim, 2 * cfg.gate_ch));
    res_ = register_module("res", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.gate_ch, cfg.residual_ch, 1)));
    skip_ = register_module("skip", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.gate_ch, cfg.skip_ch, 1)));
  }
  // x [B, R, T], c [B, n_mels, T], g [B, spk_dim] -> (residual output, skip contribution).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x, const torch::Tensor &c, const torch::Tensor &g) {
    auto h = dilated_(x);
    // FACT: conv = torch.nn.Conv1d(2, 4, 2, padding=1); x = torch.randn(1, 2, 6, requires_grad=True); h = conv(x).narrow(2, 0, 6); h += torch.randn(1, 4, 6); h.sum().backward(); assert x.grad is not None
    h += local_(c) + global_(g).unsqueeze(2); // LOOKALIKE: tensor-inplace-on-saved -- a convolution does not save its output
    auto parts = h.chunk(2, 1);
    auto z = torch::tanh(parts[0]);
    // FACT: f = torch.nn.Conv1d(2, 4, 2)(torch.randn(1, 2, 6)); p = f.chunk(2, 1); o = torch.tanh(p[0]); o.mul_(torch.sigmoid(p[1])); assert backward_fails(lambda: o.sum().backward())
    z.mul_(torch::sigmoid(parts[1])); // EXPECT: tensor-inplace-on-saved -- tanh saved its result for backward; the gate overwrites it
    return {(x + res_(z)) * std::sqrt(0.5), skip_(z)};
  }
  CausalConv1d dilated_{nullptr};
  torch::nn::Conv1d local_{nullptr}, res_{nullptr}, skip_{nullptr};
  torch::nn::Linear global_{nullptr};
};
TORCH_MODULE(GatedResidualBlock);

struct WaveNetImpl : torch::nn::Module {
  explicit WaveNetImpl(const WaveNetConfig &cfg) : quant_(cfg.quant) {
    input_ = register_module("input", CausalConv1d(cfg.quant, cfg.residual_ch, cfg.kernel, 1));
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    receptive_field_ = cfg.kernel;
    for (int64_t s = 0; s < cfg.stacks; ++s)
      for (int64_t l = 0; l < cfg.layers_per_stack; ++l) {
        blocks_->push_back(GatedResidualBlock(cfg, int64_t(1) << l));
        receptive_field_ += (cfg.kernel - 1) * (int64_t(1) << l);
      }
    post1_ = register_module("post1", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.skip_ch, cfg.skip_ch, 1)));
    post2_ = register_module("post2", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.skip_ch, cfg.quant, 1)));
  }

  // codes [B, T] (int64 classes), c [B, n_mels, T], g [B, spk_dim] -> logits [B, quant, T].
  torch::Tensor forward(const torch::Tensor &codes, const torch::Tensor &c, const torch::Tensor &g) {
    auto x = input_(torch::one_hot(codes, quant_).to(torch::kFloat).transpose(1, 2));
    torch::Tensor skips = torch::zeros({}, x.options());
    for (const auto &m : *blocks_) {
      auto [res, s] = m->as<GatedResidualBlock>()->forward(x, c, g);
      x = res;
      skips = skips + s; // LOOKALIKE: tensor-graph-kept-across-iterations -- the skip sum is the forward's output: the loss differentiates it
    }
    auto h = post1_(torch::relu(skips));
    return post2_(torch::relu(h));
  }

  int64_t receptive_field() const { return receptive_field_; }

  int64_t quant_, receptive_field_;
  CausalConv1d input_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::Conv1d post1_{nullptr}, post2_{nullptr};
};
TORCH_MODULE(WaveNet);

// Batches of (audio [B, segment + 1] in [-1, 1], mel [B, n_mels, frames]) with their speakers' embeddings.
struct VocoderBatch {
  torch::Tensor audio, mel, speaker;
};

void train(WaveNet &model, std::vector<VocoderBatch> &batches, const WaveNetConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  const int64_t mu = cfg.quant - 1;
  for (int64_t step = 0; step < cfg.iters; ++step) {
    auto &batch = batches[step % batches.size()];
    auto audio = batch.audio.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
    const auto T = audio.size(1) - 1;
    // FACT: a = torch.randn(2, 6); ref = a.clone(); ref[:, 1:] = a[:, 1:] - 0.97 * a[:, :-1]; a.narrow(1, 1, 5).sub_(a.narrow(1, 0, 5) * 0.97); assert torch.allclose(a, ref)
    audio.narrow(1, 1, T).sub_(audio.narrow(1, 0, T) * cfg.preemphasis); // LOOKALIKE: tensor-inplace-overlap -- the shifted source is a fresh product, computed before the write
    auto codes = mulaw_encode(audio.clamp(-1.0, 1.0), mu);
    auto inputs = codes.narrow(1, 0, T);
    auto targets = codes.narrow(1, 1, T);
    auto c = upsample_cond(batch.mel.to(device), cfg.hop, T);
    auto logits = model->forward(inputs, c, batch.speaker.to(device)); // [B, quant, T]
    // FACT: l = torch.randn(2, 4, 6); assert is_copy_of(l.transpose(1, 2).reshape(-1, 4), l)
    auto loss = torch::cross_entropy_loss(logits.transpose(1, 2).reshape({-1, cfg.quant}), targets.reshape({-1})); // EXPECT: tensor-reshape-non-contiguous -- copies the whole [B, T, 256] logits (cross_entropy takes [B, C, T] as is)
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    if (step % cfg.log_every == 0)
      std::cout << "step " << step << " nll " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
  }
}

// Ancestral sampling, one sample per step over a window of one receptive field; returns 16-bit PCM.
torch::Tensor generate(WaveNet &model, const torch::Tensor &mel, const torch::Tensor &speaker, const WaveNetConfig &cfg) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  const int64_t R = model->receptive_field(), mu = cfg.quant - 1;
  const int64_t n = mel.size(2) * cfg.hop;
  auto c = upsample_cond(mel.to(device), cfg.hop, n);
  auto c_pad = torch::constant_pad_nd(c, {R - 1, 0});

  auto history = torch::full({R}, cfg.quant / 2, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto samples = torch::zeros({n}, torch::TensorOptions().device(device));
  for (int64_t t = 0; t < n; ++t) {
    // FACT: h = torch.full((9,), 128, dtype=torch.long); assert is_view_of(h.view(1, 9), h)
    auto window = history.view({1, R}); // LOOKALIKE: tensor-view-non-contiguous -- the history buffer is a fresh 1-D tensor
    auto logits = model->forward(window, c_pad.narrow(2, t, R), speaker.to(device)); // EXPECT: tensor-clone-in-loop -- the same speaker embedding is copied to the GPU for every sample
    auto probs = torch::softmax(logits.select(2, R - 1) / cfg.temperature, 1); // [1, quant]
    auto code = torch::multinomial(probs, 1).view({});
    // FACT: h = torch.arange(9); assert raises(lambda: h.narrow(0, 0, 8).copy_(h.narrow(0, 1, 8)), "refer to a single memory location")
    history.narrow(0, 0, R - 1).copy_(history.narrow(0, 1, R - 1)); // EXPECT: tensor-inplace-overlap -- shifting the window within one buffer: the two slices overlap
    history[R - 1] = code; // LOOKALIKE: tensor-copy-narrowing -- multinomial's int64 class into the int64 history
    samples[t] = mulaw_decode(code, mu);
  }
  // De-emphasis: y[t] = x[t] + a * y[t - 1].
  auto host = samples.cpu();
  auto acc = host.accessor<float, 1>();
  for (int64_t t = 1; t < n; ++t)
    acc[t] += float(cfg.preemphasis) * acc[t - 1];
  auto pcm = torch::empty({n}, torch::kInt16);
  // FACT: s = torch.tensor([0.6, -0.5]); p = torch.empty(2, dtype=torch.int16); p.copy_(s * 32767.0); assert p.tolist() == [19660, -16383] and (s * 32767.0).tolist() == [19660.201171875, -16383.5]
  pcm.copy_(host.clamp(-1.0, 1.0) * 32767.0); // EXPECT: tensor-copy-narrowing -- float samples truncated toward zero into int16 PCM
  return pcm;
}
