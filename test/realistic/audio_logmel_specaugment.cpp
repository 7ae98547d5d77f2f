// Keyword-spotting front end: strided framing, log-mel with a per-utterance dB floor, energy gate,
// per-utterance CMVN, SpecAugment on cached features, and a conv classifier over frames.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <random>
#include <vector>

struct FrontEndConfig {
  int64_t win_length = 400; // 25 ms at 16 kHz
  int64_t hop = 160;        // 10 ms
  int64_t n_fft = 512;
  double top_db = 80.0;
  double silence_db = -50.0;
  int64_t freq_mask = 15;
  int64_t time_mask = 20;
};

// wave [B, S] -> log-mel in dB [B, T, n_mels]; mel_fb [n_mels, n_fft / 2 + 1], window [win_length]
torch::Tensor log_mel(const torch::Tensor &wave, const torch::Tensor &mel_fb, const torch::Tensor &window,
                      const FrontEndConfig &cfg) {
  const auto B = wave.size(0), S = wave.size(1);
  const auto n_frames = (S - cfg.win_length) / cfg.hop + 1;
  auto frames = wave.as_strided({B, n_frames, cfg.win_length}, {wave.stride(0), cfg.hop, 1}); // overlapping, no copy
  auto power = torch::fft::rfft(frames * window, cfg.n_fft).abs().pow(2);                      // [B, T, F]
  auto mel = torch::matmul(power, mel_fb.t());                                                  // [B, T, n_mels]
  auto db = 10.0 * torch::log10(mel.clamp_min(1e-10));
  // FACT: p = torch.randn(2, 5, 9).abs(); fb = torch.rand(4, 9); d = 10 * torch.log10(torch.matmul(p, fb.t()).clamp_min(1e-10)); assert is_contiguous(d) and is_view_of(d.view(2, -1), d)
  auto peak = std::get<0>(db.view({B, -1}).max(1)).view({B, 1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- elementwise ops on matmul's fresh [B, T, n_mels] result stay contiguous
  return torch::max(db, peak - cfg.top_db);
}

// Frame energies in dB [B, T] for the silence gate.
torch::Tensor frame_energy_db(const torch::Tensor &wave, const FrontEndConfig &cfg) {
  const auto B = wave.size(0);
  auto frames = wave.unfold(1, cfg.win_length, cfg.hop); // [B, T, win], overlapping windows
  // FACT: w = torch.randn(3, 50); f = w.unfold(1, 8, 3); assert not is_contiguous(f) and is_copy_of(f.reshape(-1, 8), w)
  auto flat = frames.reshape({-1, cfg.win_length}); // EXPECT: tensor-reshape-non-contiguous -- overlapping windows: every sample copied win/hop times
  return (10.0 * torch::log10(flat.pow(2).mean(1) + 1e-10)).view({B, -1});
}

// Per-utterance mean/variance normalisation over time; feats [B, T, M].
torch::Tensor cmvn(const torch::Tensor &feats) {
  auto x = feats - feats.mean(1, /*keepdim=*/true);
  // FACT: f = torch.randn(3, 6, 4); x = f - f.mean(1, keepdim=True); f0 = f.clone(); x.div_(f.std(1, True, True)); assert is_copy_of(x, f) and torch.equal(f, f0)
  x.div_(feats.std({1}, /*unbiased=*/true, /*keepdim=*/true).clamp_min(1e-5)); // LOOKALIKE: tensor-alias-then-mutate -- the subtraction allocated x
  return x;
}

// SpecAugment on one cached utterance [T, M]: one frequency band and one time span zeroed (the CMVN mean).
torch::Tensor spec_augment(const torch::Tensor &feats, const FrontEndConfig &cfg, std::mt19937 &rng) {
  const auto T = feats.size(0), M = feats.size(1);
  auto out = feats.contiguous();
  auto f = std::uniform_int_distribution<int64_t>(0, cfg.freq_mask)(rng);
  auto f0 = std::uniform_int_distribution<int64_t>(0, M - f)(rng);
  auto t = std::uniform_int_distribution<int64_t>(0, std::min(cfg.time_mask, T / 5))(rng);
  auto t0 = std::uniform_int_distribution<int64_t>(0, T - t)(rng);
  // FACT: c = torch.randn(3, 6, 4)[1]; c0 = c.clone(); x = c.contiguous(); x.narrow(1, 1, 2).fill_(0.0); assert shares_storage(x, c) and not torch.equal(c, c0)
  out.narrow(1, f0, f).fill_(0.0); // EXPECT: tensor-alias-then-mutate -- contiguous() returned the cached features: masks pile up every epoch
  // FACT: c = torch.randn(3, 6, 4)[1]; c0 = c.clone(); x = c.contiguous(); x.narrow(0, 2, 3).fill_(0.0); assert shares_storage(x, c) and not torch.equal(c, c0)
  out.narrow(0, t0, t).fill_(0.0); // EXPECT: tensor-alias-then-mutate
  return out;
}

struct KwsNetImpl : torch::nn::Module {
  KwsNetImpl(int64_t n_mels, int64_t channels, int64_t n_keywords) {
    conv1 = register_module("conv1", torch::nn::Conv1d(torch::nn::Conv1dOptions(n_mels, channels, 5).padding(2)));
    conv2 = register_module("conv2", torch::nn::Conv1d(torch::nn::Conv1dOptions(channels, channels, 5).padding(2)));
    head = register_module("head", torch::nn::Linear(channels, n_keywords));
  }
  // feats [B, T, M] -> clip logits [B, n_keywords]: frame logits averaged over time.
  torch::Tensor forward(const torch::Tensor &feats) {
    const auto B = feats.size(0), T = feats.size(1);
    auto h = torch::relu(conv1(feats.transpose(1, 2))); // Conv1d wants [B, M, T]
    h = torch::relu(conv2(h));                          // [B, C, T]
    // FACT: h = torch.randn(2, 4, 6); assert raises(lambda: h.transpose(1, 2).view(-1, 4), "view size is not compatible")
    auto frame_logits = head(h.transpose(1, 2).view({-1, h.size(1)})); // EXPECT: tensor-view-non-contiguous -- [B, T, C] after the transpose
    return frame_logits.view({B, T, -1}).mean(1);
  }
  torch::nn::Conv1d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(KwsNet);

// Fixed-length clips [n, S], processed B at a time; silent clips are dropped.
std::vector<torch::Tensor> build_cache(const torch::Tensor &waves, const torch::Tensor &mel_fb, const FrontEndConfig &cfg,
                                       int64_t batch) {
  auto window = torch::hann_window(cfg.win_length);
  std::vector<torch::Tensor> cache;
  for (int64_t s = 0; s < waves.size(0); s += batch) {
    auto w = waves.narrow(0, s, std::min(batch, waves.size(0) - s));
    auto loud = std::get<0>(frame_energy_db(w, cfg).max(1)) > cfg.silence_db; // [B]
    auto feats = cmvn(log_mel(w, mel_fb, window, cfg));                         // [B, T, M]
    for (int64_t b = 0; b < feats.size(0); ++b)
      if (loud[b].item<bool>())
        cache.push_back(feats[b]);
  }
  return cache;
}

double train_epoch(KwsNet &net, torch::optim::Adam &opt, const std::vector<torch::Tensor> &cache,
                   const torch::Tensor &labels, const FrontEndConfig &cfg, int64_t batch, std::mt19937 &rng) {
  net->train();
  auto order = torch::randperm(static_cast<int64_t>(cache.size()), torch::kLong);
  double total = 0;
  int64_t steps = 0;
  for (int64_t s = 0; s + batch <= order.size(0); s += batch) {
    std::vector<torch::Tensor> xs;
    for (int64_t j = s; j < s + batch; ++j)
      xs.push_back(spec_augment(cache[order[j].item<int64_t>()], cfg, rng));
    auto logits = net->forward(torch::stack(xs));
    auto loss = torch::nn::functional::cross_entropy(logits, labels.index_select(0, order.narrow(0, s, batch)));
    opt.zero_grad();
    loss.backward();
    opt.step();
    total += loss.item<double>();
    ++steps;
  }
  std::cout << "train loss " << total / std::max<int64_t>(steps, 1) << "\n";
  return total / std::max<int64_t>(steps, 1);
}
