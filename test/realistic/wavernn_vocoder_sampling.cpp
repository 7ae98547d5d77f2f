// WaveRNN-style vocoder: mel frames are upsampled to the sample rate, a GRU predicts a
// categorical distribution over 2^bits mu-law classes for each sample. Training is
// teacher-forced over whole segments with nn::GRU; generation steps a GRUCell that
// shares the GRU's weights, one sample at a time, sampling from the softmax.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct WaveRNNConfig {
  int64_t n_mels = 80;
  int64_t hop = 256;  // samples per mel frame
  int64_t bits = 9;   // 512 classes
  int64_t cond_dim = 128;
  int64_t rnn_dims = 512;
  int64_t fc_dims = 512;
  double dither = 1.0 / 32768.0;
  double lr = 1e-4;
  double clip = 4.0;
  int64_t steps = 200000;
  int64_t log_every = 100;
  size_t smooth = 50;
};

struct VocoderBatch {
  torch::Tensor mel;  // [B, n_mels, F]
  torch::Tensor wav;  // [B, F * hop + 1], float in [-1, 1]
};

// x in [-1, 1] -> int64 classes in [0, 2^bits - 1]; optional dither before quantising.
torch::Tensor mu_law_encode(const torch::Tensor& wav, int64_t bits, double dither = 0.0) {
  const double mu = std::pow(2.0, static_cast<double>(bits)) - 1.0;
  torch::Tensor x = wav;
  // FACT: a = torch.randn(2, 9); x = a; x += 1e-4 * torch.randn_like(x); assert shares_storage(a, x)
  if (dither > 0.0) x += dither * torch::randn_like(x);  // EXPECT: tensor-alias-then-mutate
  x = x.clamp(-1.0, 1.0);
  auto y = torch::sign(x) * torch::log1p(mu * torch::abs(x)) / std::log1p(mu);
  return ((y + 1.0) / 2.0 * mu + 0.5).to(torch::kLong);
}

// int64 classes -> float samples in [-1, 1].
torch::Tensor mu_law_decode(const torch::Tensor& classes, int64_t bits) {
  const double mu = std::pow(2.0, static_cast<double>(bits)) - 1.0;
  auto y = classes.to(torch::kFloat);
  // FACT: c = torch.randint(0, 512, (3, 7)); assert is_copy_of(c.to(torch.float), c)
  y.div_(mu).mul_(2.0).sub_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- classes are int64, to(kFloat) made a copy
  return torch::sign(y) / mu * (torch::pow(1.0 + mu, torch::abs(y)) - 1.0);
}

// 16-bit PCM for writing a WAV file.
torch::Tensor to_pcm16(const torch::Tensor& audio) {
  auto pcm = torch::empty(audio.sizes(), torch::kShort);
  pcm.copy_((audio * 32767.0).round().clamp(-32768, 32767));  // LOOKALIKE: tensor-copy-narrowing -- rounded whole numbers within int16 range
  return pcm;
}

// mel [B, n_mels, F] -> conditioning [B, cond_dim, F * hop]
struct UpsampleNetImpl : nn::Module {
  explicit UpsampleNetImpl(const WaveRNNConfig& cfg)
      : hop_(cfg.hop),
        pre_(nn::Conv1dOptions(cfg.n_mels, cfg.cond_dim, 5).padding(2)),
        smooth_(nn::Conv2dOptions(1, 1, {1, 2 * cfg.hop + 1}).padding({0, cfg.hop}).bias(false)) {
    register_module("pre", pre_);
    register_module("smooth", smooth_);
    {
      torch::NoGradGuard no_grad;
      smooth_->weight.fill_(1.0 / static_cast<double>(2 * cfg.hop + 1));  // LOOKALIKE: tensor-inplace-on-leaf -- box-filter init under NoGradGuard
    }
  }

  torch::Tensor forward(const torch::Tensor& mel) {
    auto c = pre_(mel).repeat_interleave(hop_, 2);
    return smooth_(c.unsqueeze(1)).squeeze(1);
  }

  int64_t hop_;
  nn::Conv1d pre_;
  nn::Conv2d smooth_;
};
TORCH_MODULE(UpsampleNet);

struct WaveRNNImpl : nn::Module {
  explicit WaveRNNImpl(const WaveRNNConfig& cfg)
      : cfg_(cfg),
        upsample_(cfg),
        sample_in_(1, cfg.rnn_dims),
        cond_in_(nn::LinearOptions(cfg.cond_dim, cfg.rnn_dims).bias(false)),
        gru_(nn::GRUOptions(cfg.rnn_dims, cfg.rnn_dims).batch_first(true)),
        cell_(nn::GRUCellOptions(cfg.rnn_dims, cfg.rnn_dims)),
        fc1_(cfg.rnn_dims, cfg.fc_dims),
        fc2_(cfg.fc_dims, int64_t{1} << cfg.bits) {
    register_module("upsample", upsample_);
    register_module("sample_in", sample_in_);
    register_module("cond_in", cond_in_);
    register_module("gru", gru_);
    register_module("cell", cell_);
    register_module("fc1", fc1_);
    register_module("fc2", fc2_);
    // Start the update gate (rows H..2H of bias_hh) biased towards keeping the state.
    const int64_t H = cfg.rnn_dims;
    gru_->named_parameters()["bias_hh_l0"].narrow(0, H, H).fill_(1.0);  // EXPECT: tensor-inplace-on-leaf
  }

  // Teacher forcing: prev [B, T] true previous samples, mel [B, n_mels, T / hop].
  torch::Tensor forward(const torch::Tensor& prev, const torch::Tensor& mel) {
    auto cond = upsample_(mel).transpose(1, 2);  // [B, T, D]
    auto x = sample_in_(prev.unsqueeze(-1)) + cond_in_(cond);
    auto h = std::get<0>(gru_->forward(x));
    return fc2_(torch::relu(fc1_(h)));  // [B, T, classes]
  }

  // Ancestral sampling, one sample per GRUCell step.
  torch::Tensor generate(const torch::Tensor& mel, double temperature) {
    torch::NoGradGuard no_grad;
    eval();
    auto tied = gru_->all_weights();
    cell_->weight_ih.copy_(tied[0]);  // LOOKALIKE: tensor-inplace-on-leaf -- weight tying under NoGradGuard
    cell_->weight_hh.copy_(tied[1]);
    cell_->bias_ih.copy_(tied[2]);
    cell_->bias_hh.copy_(tied[3]);

    const auto device = mel.device();
    auto cond = upsample_(mel).transpose(1, 2);  // [B, T, D]
    const int64_t B = cond.size(0), T = cond.size(1), D = cond.size(2);
    // FACT: c = torch.randn(2, 16, 50).transpose(1, 2); assert not is_contiguous(c) and is_copy_of(c.reshape(-1, 16), c)
    auto flat_cond = cond.reshape({B * T, D});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: p = torch.nn.Linear(16, 8, bias=False)(torch.randn(100, 16)); assert is_view_of(p.view(2, 50, 8), p)
    auto cond_proj = cond_in_(flat_cond).view({B, T, cfg_.rnn_dims});  // LOOKALIKE: tensor-view-non-contiguous -- Linear output is contiguous
    const int64_t classes = int64_t{1} << cfg_.bits;
    auto table = mu_law_decode(torch::arange(classes), cfg_.bits);

    auto h = torch::zeros({B, cfg_.rnn_dims}, cond.options());
    // FACT: p = torch.zeros(1, 1).expand(4, 1); assert raises(lambda: p.copy_(torch.randn(4, 1)), "more than one element")
    auto prev = torch::zeros({1, 1}, cond.options()).expand({B, 1});
    std::vector<torch::Tensor> samples;
    samples.reserve(T);
    for (int64_t t = 0; t < T; ++t) {
      h = cell_(sample_in_(prev) + cond_proj.select(1, t), h);
      auto logits = fc2_(torch::relu(fc1_(h))) / temperature;
      auto cls = torch::multinomial(torch::softmax(logits, -1), 1).squeeze(1);
      auto lut = table.to(device);  // EXPECT: tensor-clone-in-loop
      auto x = lut.index_select(0, cls).unsqueeze(1);  // [B, 1]
      prev.copy_(x);  // EXPECT: tensor-inplace-on-expanded
      samples.push_back(x);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    }
    return torch::cat(samples, 1);  // [B, T]
  }

  WaveRNNConfig cfg_;
  UpsampleNet upsample_;
  nn::Linear sample_in_, cond_in_;
  nn::GRU gru_;
  nn::GRUCell cell_;
  nn::Linear fc1_, fc2_;
};
TORCH_MODULE(WaveRNN);

// Vocodes one normalised-dB mel spectrogram on the GPU.
torch::Tensor vocode_on_gpu(WaveRNN& model, const torch::Tensor& mel_db,
                            const std::vector<float>& mel_mean, const std::vector<float>& mel_std,
                            float ref_level_db, double temperature) {
  model->to(torch::kCUDA);
  auto mean = torch::tensor(mel_mean).view({1, -1, 1});
  auto stdv = torch::tensor(mel_std).view({1, -1, 1});
  auto ref = torch::tensor(ref_level_db);
  auto m = mel_db.to(torch::kCUDA) - ref;  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may meet a CUDA one
  auto normed = (m - mean) / stdv;  // EXPECT: tensor-device-mismatch
  return to_pcm16(model->generate(normed.unsqueeze(0), temperature).cpu());
}

void train(WaveRNN& model, std::vector<VocoderBatch>& data, const WaveRNNConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::vector<torch::Tensor> window;
  int64_t step = 0;
  while (step < cfg.steps) {
    model->train();
    for (auto& b : data) {
      auto mel = b.mel.to(device);
      auto wav = b.wav.to(device);
      const int64_t T = wav.size(1) - 1;
      auto target = mu_law_encode(wav, cfg.bits, cfg.dither).narrow(1, 1, T);
      auto logits = model->forward(wav.narrow(1, 0, T), mel);
      auto probs = torch::softmax(logits, -1);
      probs.clamp_min_(1e-7);  // EXPECT: tensor-inplace-on-saved
      auto loss = -torch::log(probs).gather(-1, target.unsqueeze(-1)).mean();
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();

      window.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      if (window.size() > cfg.smooth) window.erase(window.begin());
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " nll " << torch::stack(window).mean().item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      if (step >= cfg.steps) break;
    }
  }
}
