// CLAP-style audio-text contrastive pretraining with a learnable temperature.
// Audio: log-mel -> 2-D conv front end -> frame stacking -> GRU -> projection.
// Text: token embedding -> transformer encoder -> masked mean pooling -> projection.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <tuple>
#include <vector>

namespace F = torch::nn::functional;

namespace clap {

struct ClapConfig {
  // audio front end
  int64_t sample_rate = 16000, clip_samples = 16000 * 5;
  int64_t n_fft = 512, hop = 160, n_mels = 64;
  double pre_emphasis = 0.97, max_gain_db = 6.0;
  int64_t spec_mask_width = 40;
  // encoders
  int64_t vocab = 16384, max_tokens = 32, text_dim = 256;
  int64_t audio_channels = 64, embed_dim = 256, frame_stack = 4;
  // optimisation
  int64_t batch_size = 64, epochs = 20, log_every = 25;
  double lr = 3e-4, init_temperature = 0.07, max_logit_scale = 100.0;
};

torch::Tensor mel_filterbank(int64_t n_mels, int64_t n_freqs, double sample_rate) {
  auto hz_to_mel = [](const torch::Tensor& f) { return 2595.0 * torch::log10(1.0 + f / 700.0); };
  auto mel_to_hz = [](const torch::Tensor& m) { return 700.0 * (torch::pow(10.0, m / 2595.0) - 1.0); };
  auto freqs = torch::linspace(0.0, sample_rate / 2.0, n_freqs);
  auto top = hz_to_mel(torch::tensor(sample_rate / 2.0)).item<double>();
  auto hz = mel_to_hz(torch::linspace(0.0, top, n_mels + 2));
  auto lower = hz.narrow(0, 0, n_mels).unsqueeze(1);
  auto center = hz.narrow(0, 1, n_mels).unsqueeze(1);
  auto upper = hz.narrow(0, 2, n_mels).unsqueeze(1);
  auto rising = (freqs - lower) / (center - lower);
  auto falling = (upper - freqs) / (upper - center);
  return torch::clamp_min(torch::min(rising, falling), 0.0);
}

class LogMel {
 public:
  LogMel(const ClapConfig& cfg, torch::Device device) : cfg_(cfg) {
    window_ = torch::hann_window(cfg.n_fft, torch::TensorOptions().device(device));
    fb_ = mel_filterbank(cfg.n_mels, cfg.n_fft / 2 + 1, static_cast<double>(cfg.sample_rate));
  }

  torch::Tensor operator()(const torch::Tensor& wave) const {
    auto spec = torch::stft(wave, cfg_.n_fft, cfg_.hop, cfg_.n_fft, window_, /*center=*/true, "reflect",
                            /*normalized=*/false, /*onesided=*/true, /*return_complex=*/true);  // LOOKALIKE: tensor-device-mismatch -- the window was made with the featurizer's device option
    auto power = spec.abs();
    // FACT: x = torch.randn(3,5); y = x.clone(); x.mul_(x); assert torch.allclose(x, y * y)
    power.mul_(power);  // LOOKALIKE: tensor-inplace-overlap -- source and destination are the same elements; each reads only itself
    auto mel = torch::matmul(fb_, power);  // EXPECT: tensor-device-mismatch
    return torch::log(mel.clamp_min(1e-10));
  }

 private:
  ClapConfig cfg_;
  torch::Tensor window_;
  torch::Tensor fb_;
};

struct Batch { torch::Tensor wave, tokens; };

// In-memory clips: int16 PCM plus tokenised captions. The held-out split keeps
// its log-mels precomputed on the host.
class ClipStore {
 public:
  ClipStore(const ClapConfig& cfg, int64_t n_train, int64_t n_eval) : n_train_(n_train) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int64_t> word(1, cfg.vocab - 1), words(4, cfg.max_tokens);
    for (int64_t i = 0; i < n_train + n_eval; ++i) {
      auto pcm = (torch::randn({cfg.clip_samples}) * 3000.0).clamp(-32768, 32767).to(torch::kInt16);
      auto tokens = torch::zeros({cfg.max_tokens}, torch::kLong);
      for (int64_t k = 0, n = words(rng); k < n; ++k) tokens[k] = word(rng);
      pcm_.push_back(pcm);
      tokens_.push_back(tokens);
    }
    LogMel host_mel(cfg, torch::kCPU);
    for (int64_t i = n_train; i < n_train + n_eval; ++i) {
      eval_cache_.push_back(host_mel(waveform(i).unsqueeze(0)).squeeze(0));
    }
    auto all = torch::stack(eval_cache_);
    const std::vector<int64_t> dims{0, 2};
    band_mean_ = all.mean(dims, /*keepdim=*/true).squeeze(0);
    band_std_ = (all - band_mean_).pow(2).mean(dims, /*keepdim=*/true).squeeze(0).sqrt().clamp_min(1e-5);
  }

  int64_t train_size() const { return n_train_; }
  int64_t eval_size() const { return static_cast<int64_t>(eval_cache_.size()); }
  torch::Tensor waveform(int64_t i) const {
    auto x = pcm_[i].to(torch::kFloat);
    // FACT: a = torch.zeros(10, dtype=torch.int16); assert is_copy_of(a.to(torch.float32), a)
    x.div_(32768.0);  // LOOKALIKE: tensor-alias-then-mutate -- int16 PCM to float always allocates, the cached PCM is untouched
    return x;
  }

  torch::Tensor eval_mel(int64_t i) {
    auto mel = eval_cache_[i];
    // FACT: c = [torch.randn(4,6)]; m = c[0]; m.sub_(1.0).div_(2.0); assert shares_storage(m, c[0]) and torch.equal(m, c[0])
    mel.sub_(band_mean_).div_(band_std_);  // EXPECT: tensor-alias-then-mutate
    return mel;
  }

  torch::Tensor eval_tokens(int64_t i) const { return tokens_[n_train_ + i]; }
  Batch batch(const torch::Tensor& idx) const {
    std::vector<torch::Tensor> waves, toks;
    auto acc = idx.accessor<int64_t, 1>();
    for (int64_t j = 0; j < idx.size(0); ++j) {
      waves.push_back(waveform(acc[j]));
      toks.push_back(tokens_[acc[j]]);
    }
    return {torch::stack(waves), torch::stack(toks)};
  }

 private:
  int64_t n_train_;
  std::vector<torch::Tensor> pcm_, tokens_, eval_cache_;
  torch::Tensor band_mean_, band_std_;
};

torch::Tensor augment(torch::Tensor wave, const ClapConfig& cfg) {
  const auto B = wave.size(0), N = wave.size(1);
  auto gain = torch::empty({B, 1}, wave.options()).uniform_(-cfg.max_gain_db, cfg.max_gain_db).expand({B, N});
  // FACT: e = torch.rand(4,1).expand(4,100); assert raises(lambda: e.mul_(0.1), "more than one element")
  gain.mul_(std::log(10.0) / 20.0).exp_();  // EXPECT: tensor-inplace-on-expanded
  wave = wave * gain;
  // pre-emphasis: y[n] = x[n] - a * x[n - 1]
  // FACT: w = torch.arange(12.).view(2,6); r = w[:,1:] - 0.5 * w[:,:-1]; assert shares_storage(w[:,1:], w[:,:-1]) and not raises(lambda: w[:,1:].sub_(w[:,:-1], alpha=0.5)) and not torch.equal(w[:,1:], r)
  wave.narrow(1, 1, N - 1).sub_(wave.narrow(1, 0, N - 1), cfg.pre_emphasis);  // EXPECT: tensor-inplace-overlap
  return wave;
}

torch::Tensor spec_augment(torch::Tensor mel, int64_t max_width) {
  const auto B = mel.size(0), T = mel.size(2);
  auto t = torch::arange(T, mel.options().dtype(torch::kLong)).unsqueeze(0);
  auto start = torch::randint(0, T - max_width, {B, 1}, t.options());
  auto width = torch::randint(0, max_width, {B, 1}, t.options());
  auto time_mask = t.ge(start).logical_and(t.lt(start + width));
  // FACT: s = torch.randn(2,4,6); m = torch.zeros(2,6, dtype=torch.bool); m[:,1] = True; s.masked_fill_(m.unsqueeze(1).expand_as(s), 0.0); assert is_contiguous(s) and s[:,:,1].abs().sum() == 0
  mel.masked_fill_(time_mask.unsqueeze(1).expand_as(mel), 0.0);  // LOOKALIKE: tensor-inplace-on-expanded -- the written tensor is mel itself; the expanded mask is only read
  return mel;
}

torch::nn::Sequential conv_block(int64_t in, int64_t out) {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(2).padding(1).bias(false)),
      torch::nn::BatchNorm2d(out), torch::nn::ReLU());
}

struct AudioEncoderImpl : torch::nn::Module {
  explicit AudioEncoderImpl(const ClapConfig& cfg) : stack_(cfg.frame_stack) {
    c1_ = register_module("c1", conv_block(1, 32));
    c2_ = register_module("c2", conv_block(32, cfg.audio_channels));
    const int64_t freq_out = (cfg.n_mels + 3) / 4;
    frame_proj_ = register_module("frame_proj", torch::nn::Linear(cfg.audio_channels * freq_out, cfg.embed_dim));
    temporal_ = register_module("temporal", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.embed_dim, cfg.embed_dim, 5)
                                                                  .padding(2).groups(cfg.embed_dim)));
    gru_ = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(cfg.embed_dim * cfg.frame_stack, cfg.embed_dim)
                                                     .batch_first(true)));
    proj_ = register_module("proj", torch::nn::Linear(cfg.embed_dim, cfg.embed_dim));
  }

  torch::Tensor forward(const torch::Tensor& mel) {
    auto x = c2_->forward(c1_->forward(mel.unsqueeze(1)));
    const auto B = x.size(0), C = x.size(1), Fq = x.size(2), T = x.size(3);
    // FACT: x = torch.randn(2,4,5,6); assert is_view_of(x.permute(0,3,1,2).reshape(2,6,20), x)
    x = x.permute({0, 3, 1, 2}).reshape({B, T, C * Fq});  // LOOKALIKE: tensor-reshape-non-contiguous -- channel and frequency stay adjacent after the permute, so merging them is a view
    x = torch::gelu(frame_proj_(x));
    x = temporal_(x.transpose(1, 2));
    const auto Ts = (T / stack_) * stack_;
    // FACT: x = torch.randn(2,8,13)[:, :, :12]; assert is_copy_of(x.transpose(1,2).reshape(2,3,32), x)
    x = x.narrow(2, 0, Ts).transpose(1, 2).reshape({B, Ts / stack_, -1});  // EXPECT: tensor-reshape-non-contiguous
    auto out = std::get<0>(gru_(x));
    auto z = proj_(out.mean(1));
    // FACT: assert backward_fails(lambda: [x := torch.randn(4,3, requires_grad=True), a := x * 2, a.div_(a.norm(2,-1,True).clamp_min(1e-6)), a.sum().backward()])
    z.div_(z.norm(2, -1, true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-saved
    return z;
  }

  int64_t stack_;
  torch::nn::Sequential c1_{nullptr}, c2_{nullptr};
  torch::nn::Linear frame_proj_{nullptr}, proj_{nullptr};
  torch::nn::Conv1d temporal_{nullptr};
  torch::nn::GRU gru_{nullptr};
};
TORCH_MODULE(AudioEncoder);

struct TextEncoderImpl : torch::nn::Module {
  explicit TextEncoderImpl(const ClapConfig& cfg) {
    tok_ = register_module("tok", torch::nn::Embedding(torch::nn::EmbeddingOptions(cfg.vocab, cfg.text_dim).padding_idx(0)));
    pos_ = register_parameter("pos", torch::randn({cfg.max_tokens, cfg.text_dim}) * 0.02);
    enc_ = register_module("enc", torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(
                                      torch::nn::TransformerEncoderLayerOptions(cfg.text_dim, 4).dim_feedforward(4 * cfg.text_dim), 2)));
    proj_ = register_module("proj", torch::nn::Linear(cfg.text_dim, cfg.embed_dim));
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    auto pad = ids.eq(0);
    auto h = tok_(ids) + pos_.narrow(0, 0, ids.size(1));
    h = enc_(h.transpose(0, 1), /*src_mask=*/torch::Tensor(), pad).transpose(0, 1);
    auto m = pad.logical_not().unsqueeze(-1).to(h.scalar_type());
    auto pooled = (h * m).sum(1);
    // FACT: assert not backward_fails(lambda: [x := torch.randn(2,3,4, requires_grad=True), p := x.sum(1), p.div_(torch.full((2,1), 3.0)), p.pow(2).sum().backward()])
    pooled.div_(m.sum(1).clamp_min(1.0));  // LOOKALIKE: tensor-inplace-on-saved -- sum's backward keeps only sizes, so writing its output breaks nothing
    return F::normalize(proj_(pooled), F::NormalizeFuncOptions().dim(-1));
  }

  torch::nn::Embedding tok_{nullptr};
  torch::Tensor pos_;
  torch::nn::TransformerEncoder enc_{nullptr};
  torch::nn::Linear proj_{nullptr};
};
TORCH_MODULE(TextEncoder);

struct ClapModelImpl : torch::nn::Module {
  explicit ClapModelImpl(const ClapConfig& cfg) {
    audio_ = register_module("audio", AudioEncoder(cfg));
    text_ = register_module("text", TextEncoder(cfg));
    logit_scale_ = register_parameter("logit_scale", torch::empty({}));
    torch::NoGradGuard no_grad;
    logit_scale_.fill_(std::log(1.0 / cfg.init_temperature));  // LOOKALIKE: tensor-inplace-on-leaf -- written under the NoGradGuard one line up
  }

  AudioEncoder audio_{nullptr};
  TextEncoder text_{nullptr};
  torch::Tensor logit_scale_;
};
TORCH_MODULE(ClapModel);

struct LossOut { torch::Tensor loss, hardest_negative; };

LossOut clap_loss(const torch::Tensor& a, const torch::Tensor& t, const torch::Tensor& logit_scale,
                  const torch::Tensor& targets) {
  auto sim = torch::matmul(a, t.t());
  // mean hardest in-batch negative: an early warning for embedding collapse
  auto neg = sim.detach();
  // FACT: s = torch.randn(3,4, requires_grad=True) @ torch.randn(4,3); n = s.detach(); n.diagonal().fill_(-2.0); assert (s.diagonal() == -2).all()
  neg.diagonal().fill_(-2.0);  // EXPECT: tensor-inplace-on-detached
  auto hardest = std::get<0>(neg.max(1)).mean();
  auto logits = logit_scale.exp() * sim;
  auto loss = 0.5 * (F::cross_entropy(logits, targets) + F::cross_entropy(logits.t(), targets));
  return {loss, hardest};
}

double recall_at_k(const torch::Tensor& audio_emb, const torch::Tensor& text_emb, int64_t k) {
  torch::NoGradGuard no_grad;
  auto sim = torch::matmul(audio_emb, text_emb.t());
  auto scores = sim.clone();  // EXPECT: tensor-unnecessary-clone
  auto top = std::get<1>(scores.topk(k, 1));
  auto gt = torch::arange(sim.size(0), top.options()).unsqueeze(1);
  return top.eq(gt).any(1).to(torch::kFloat).mean().item<double>();
}

void evaluate(ClapModel& model, ClipStore& store, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> audio_embs, text_embs;
  for (int64_t i = 0; i < store.eval_size(); ++i) {
    auto mel = store.eval_mel(i).unsqueeze(0).to(device);
    audio_embs.push_back(model->audio_(mel));  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard no graph is recorded
    text_embs.push_back(model->text_(store.eval_tokens(i).unsqueeze(0).to(device)));
  }
  auto a = torch::cat(audio_embs), t = torch::cat(text_embs);
  std::cout << "eval R@1 " << recall_at_k(a, t, 1) << " R@10 " << recall_at_k(a, t, 10) << std::endl;
  model->train();
}

void train(const ClapConfig& cfg, torch::Device device) {
  ClipStore store(cfg, 4096, 512);
  ClapModel model(cfg);
  model->to(device);
  LogMel featurizer(cfg, device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(0.2));
  auto labels = torch::arange(cfg.batch_size, torch::kLong);

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto order = torch::randperm(store.train_size(), torch::kLong);
    auto loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t steps = 0;
    for (int64_t s = 0; s + cfg.batch_size <= store.train_size(); s += cfg.batch_size) {
      auto batch = store.batch(order.narrow(0, s, cfg.batch_size));
      auto wave = augment(batch.wave.to(device, /*non_blocking=*/true), cfg);  // LOOKALIKE: tensor-clone-in-loop -- every step brings a different batch to the device
      auto mel = spec_augment(featurizer(wave), cfg.spec_mask_width);
      auto ids = batch.tokens.to(device);
      const auto B = ids.size(0);
      auto a = model->audio_(mel);
      auto t = model->text_(ids);
      auto targets = labels.narrow(0, 0, B).to(device);  // EXPECT: tensor-clone-in-loop
      auto out = clap_loss(a, t, model->logit_scale_, targets);
      opt.zero_grad();
      out.loss.backward();
      opt.step();
      // FACT: p = torch.nn.Parameter(torch.tensor(2.6)); assert raises(lambda: p.clamp_(0, 4.6), "leaf Variable")
      model->logit_scale_.clamp_(0.0, std::log(cfg.max_logit_scale));  // EXPECT: tensor-inplace-on-leaf

      loss_sum += out.loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detach() drops the graph; the running sum stays on the device
      if (++steps % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << steps << " loss " << loss_sum.item<double>() / steps
                  << " temperature " << 1.0 / model->logit_scale_.exp().item<double>()
                  << " hardest_neg " << out.hardest_negative.item<double>() << std::endl;
      }
    }
    evaluate(model, store, device);
  }
}

}  // namespace clap

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  clap::train(clap::ClapConfig{}, device);
  return 0;
}
