// Two-speaker separation (wsj0-2mix style) in the STFT domain: a BLSTM reads the mixture's
// log-magnitude and estimates one ratio mask per speaker; the masked magnitudes are put back
// with the mixture phase and inverted with istft. Training minimises negative SI-SDR under the
// best speaker assignment (utterance-level PIT) with on-the-fly remixing. Long recordings are
// separated in overlapping chunks and stitched by overlap-add; a low-latency mode keeps the last
// few frames of context and emits 16-bit PCM frame by frame.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <utility>
#include <vector>

struct SepConfig {
  int64_t n_fft = 512, hop = 128, hidden = 300, layers = 3, n_src = 2;
  int64_t chunk = 64000, chunk_hop = 48000, context_frames = 16;
  double lr = 1e-3, clip = 5.0, gain_db = 5.0;
  int epochs = 100;
};

struct Example {
  torch::Tensor sources; // [B, S, L] clean speakers; the mixture is their sum
};

struct Spec {
  torch::Tensor complex, mag, phase; // [B, F, T]
};

Spec analyse(const torch::Tensor &wave, const torch::Tensor &window, const SepConfig &cfg) {
  auto spec = torch::stft(wave, cfg.n_fft, cfg.hop, cfg.n_fft, window, /*center=*/true, "reflect",
                          /*normalized=*/false, /*onesided=*/true, /*return_complex=*/true);
  return {spec, spec.abs(), torch::angle(spec)};
}

struct MaskNetImpl : torch::nn::Module {
  explicit MaskNetImpl(const SepConfig &cfg) : n_src_(cfg.n_src), n_freq_(cfg.n_fft / 2 + 1) {
    namespace nn = torch::nn;
    blstm_ = register_module("blstm", nn::LSTM(nn::LSTMOptions(n_freq_, cfg.hidden).num_layers(cfg.layers)
                                                   .bidirectional(true).batch_first(true).dropout(0.3)));
    proj_ = register_module("proj", nn::Linear(2 * cfg.hidden, n_src_ * n_freq_));
    mean_ = register_buffer("feat_mean", torch::zeros({n_freq_}));
    std_ = register_buffer("feat_std", torch::ones({n_freq_}));
  }

  void set_stats(const torch::Tensor &mean, const torch::Tensor &stdev) {
    torch::NoGradGuard no_grad;
    // FACT: b = torch.zeros(4); m = torch.randn(4, dtype=torch.float64); b.copy_(m.to(b.dtype)); assert b.dtype == torch.float32 and not b.requires_grad
    mean_.copy_(mean.to(mean_.scalar_type())); // LOOKALIKE: tensor-copy-narrowing, tensor-inplace-on-leaf -- the conversion is explicit; a buffer, not a parameter
    std_.copy_(stdev.to(std_.scalar_type()));
  }

  // magnitude [B, F, T] as torch::stft lays it out -> masks [B, S, F, T] in (0, 1)
  torch::Tensor forward(const torch::Tensor &mag) {
    const auto B = mag.size(0), T = mag.size(2);
    auto feats = (torch::log1p(mag).transpose(1, 2) - mean_) / std_; // [B, T, F]
    auto out = std::get<0>(blstm_->forward(feats));                   // [B, T, 2H]
    // FACT: o, _ = torch.nn.LSTM(6, 5, batch_first=True, bidirectional=True)(torch.randn(2, 4, 6)); assert raises(lambda: o.view(8, -1), "view size is not compatible")
    auto logits = proj_(out.view({B * T, -1})); // EXPECT: tensor-view-non-contiguous -- a batch_first LSTM returns its time-major output transposed
    // FACT: m = torch.sigmoid(torch.nn.Linear(5, 12)(torch.randn(6, 5))); assert is_view_of(m.view(2, 3, 2, 6), m)
    return torch::sigmoid(logits).view({B, T, n_src_, n_freq_}).permute({0, 2, 3, 1}); // LOOKALIKE: tensor-view-non-contiguous -- the Linear's output is contiguous; the permute comes after the view
  }

  int64_t n_src_, n_freq_;
  torch::nn::LSTM blstm_{nullptr};
  torch::nn::Linear proj_{nullptr};
  torch::Tensor mean_, std_;
};
TORCH_MODULE(MaskNet);

// Per-frequency mean and std of log-magnitudes over the training mixtures.
std::pair<torch::Tensor, torch::Tensor> feature_stats(const std::vector<Example> &set, const torch::Tensor &window,
                                                      const SepConfig &cfg) {
  torch::NoGradGuard no_grad;
  const auto F = cfg.n_fft / 2 + 1;
  auto sum = torch::zeros({F}, window.options().dtype(torch::kDouble)), sq = torch::zeros_like(sum);
  int64_t n = 0;
  for (const auto &ex : set) {
    auto spec = analyse(ex.sources.sum(1).to(window.device()), window, cfg);
    // FACT: s = torch.stft(torch.randn(2, 4000), 256, 64, window=torch.hann_window(256), return_complex=True); f = torch.log1p(s.abs()).transpose(1, 2); assert is_contiguous(f) and is_view_of(f.view(-1, 129), f)
    auto frames = torch::log1p(spec.mag).transpose(1, 2).view({-1, F}); // LOOKALIKE: tensor-view-non-contiguous -- stft returns [B, F, T] with frequency innermost: the transpose is the contiguous one
    sum += frames.sum(0).to(torch::kDouble);
    sq += frames.pow(2).sum(0).to(torch::kDouble);
    n += frames.size(0);
  }
  auto mean = sum / n;
  return {mean, (sq / n - mean.pow(2)).clamp_min(1e-10).sqrt()};
}

// Masked magnitudes with the mixture phase, back to waveforms [B, S, L].
torch::Tensor apply_masks(const torch::Tensor &masks, const Spec &mix, const torch::Tensor &window, const SepConfig &cfg,
                          int64_t length) {
  std::vector<torch::Tensor> waves;
  for (int64_t s = 0; s < masks.size(1); ++s) {
    auto est = torch::polar(masks.select(1, s) * mix.mag, mix.phase);
    auto wav = torch::istft(est, cfg.n_fft, cfg.hop, cfg.n_fft, window, /*center=*/true, /*normalized=*/false,
                            /*onesided=*/true, length);
    // FACT: x = torch.randn(2, 16, requires_grad=True); w = x * torch.rand(16); w.sub_(w.mean(-1, True)); assert backward_fails(lambda: w.pow(2).sum().backward())
    wav.sub_(wav.mean(-1, true)); // EXPECT: tensor-inplace-on-saved -- mean over a dim saves its input in 1.13 (MeanBackward1): the DC removal breaks backward
    waves.push_back(wav); // LOOKALIKE: tensor-graph-kept-across-iterations -- one entry per source, stacked and returned for the loss
  }
  return torch::stack(waves, 1);
}

// SI-SDR in dB of every estimate against its reference: [B, S, L] x [B, S, L] -> [B, S].
torch::Tensor si_sdr(const torch::Tensor &est, const torch::Tensor &ref, double eps = 1e-8) {
  auto r = ref.clone(); // EXPECT: tensor-unnecessary-clone -- centred in place at once: ref - ref.mean(-1, true) is one pass
  r.sub_(r.mean(-1, true));
  auto e = est - est.mean(-1, true);
  auto target = (e * r).sum(-1, true) / (r.pow(2).sum(-1, true) + eps) * r;
  auto noise = e - target;
  return 10 * torch::log10(target.pow(2).sum(-1) / (noise.pow(2).sum(-1) + eps) + eps);
}

// Utterance-level PIT: the mean SI-SDR [B] of the best of the S! speaker assignments.
torch::Tensor pit_si_sdr(const torch::Tensor &est, const torch::Tensor &ref) {
  std::vector<int64_t> perm(static_cast<size_t>(est.size(1)));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::vector<torch::Tensor> scores;
  do {
    auto idx = torch::tensor(perm, torch::kLong).to(est.device()); // LOOKALIKE: tensor-clone-in-loop -- a different permutation every time
    scores.push_back(si_sdr(est.index_select(1, idx), ref).mean(1)); // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked and returned: the loss is taken through them
  } while (std::next_permutation(perm.begin(), perm.end()));
  return std::get<0>(torch::stack(scores, 1).max(1));
}

// On-the-fly remixing: random gains per speaker, so each epoch sees new mixtures.
torch::Tensor remix(const torch::Tensor &sources, const SepConfig &cfg) {
  auto srcs = sources.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
  auto gain_db = torch::empty({srcs.size(0), srcs.size(1), 1}).uniform_(-cfg.gain_db, cfg.gain_db);
  // FACT: s = torch.randn(2, 3, 8); s0 = s.clone(); x = s.to(torch.float, copy=True); x.mul_(2.0); assert is_copy_of(x, s) and torch.equal(s, s0)
  srcs.mul_(torch::pow(10.0, gain_db / 20)); // LOOKALIKE: tensor-alias-then-mutate -- copy=true: the dataset's sources stay as loaded
  return srcs;
}

double validate(MaskNet &net, const std::vector<Example> &set, const torch::Tensor &window, const SepConfig &cfg) {
  net->eval();
  auto total = torch::zeros({}, window.options());
  int64_t n = 0;
  for (const auto &ex : set) {
    auto refs = ex.sources.to(window.device());
    auto mix = analyse(refs.sum(1), window, cfg);
    auto est = apply_masks(net->forward(mix.mag), mix, window, cfg, refs.size(-1));
    // FACT: l = torch.nn.Linear(4, 4); t = torch.zeros(()); exec('for _ in range(3):\n t += l(torch.randn(2, 4)).sum()'); assert t.requires_grad and kept_nodes(t) >= 3
    total += pit_si_sdr(est, refs).sum(); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every validation batch's graph stays reachable from the total
    n += refs.size(0);
  }
  return total.item<double>() / std::max<int64_t>(n, 1);
}

void train(MaskNet &net, const std::vector<Example> &train_set, const std::vector<Example> &val_set, const SepConfig &cfg) {
  torch::Device device(torch::kCUDA);
  net->to(device);
  auto window = torch::hann_window(cfg.n_fft, torch::TensorOptions().device(device));
  auto stats = feature_stats(train_set, window, cfg);
  net->set_stats(stats.first, stats.second);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr));
  double best = -1e9;
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    net->train();
    auto epoch_loss = torch::zeros({}, window.options());
    for (const auto &ex : train_set) {
      auto refs = remix(ex.sources, cfg).to(device);
      auto mix = analyse(refs.sum(1), window, cfg); // LOOKALIKE: tensor-device-mismatch -- the window was made on the training device
      auto est = apply_masks(net->forward(mix.mag), mix, window, cfg, refs.size(-1));
      auto loss = -pit_si_sdr(est, refs).mean();
      if (!std::isfinite(loss.item<double>())) // LOOKALIKE: tensor-sync-in-loop -- the value decides whether the step runs
        continue;
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(net->parameters(), cfg.clip);
      opt.step();
      epoch_loss += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
    }
    const double val = validate(net, val_set, window, cfg);
    std::cout << "epoch " << epoch << " train -SI-SDR " << epoch_loss.item<double>() / train_set.size() << " val SI-SDR " << val << "\n";
    if (val > best) {
      best = val;
      torch::save(net, "masknet_best.pt");
    }
  }
}

// Long recordings [L]: overlapping chunks, speakers aligned across chunks, Hann-weighted overlap-add.
torch::Tensor separate_long(MaskNet &net, const torch::Tensor &recording, const SepConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  const auto L = recording.size(0), N = cfg.chunk, H = cfg.chunk_hop;
  auto window = torch::hann_window(cfg.n_fft);
  auto fade = torch::hann_window(N, torch::TensorOptions().device(device)).clamp_min(1e-3);
  auto out = torch::zeros({cfg.n_src, L}, fade.options());
  auto weight = torch::zeros({L}, fade.options());
  for (int64_t start = 0; start < L; start += H) {
    const auto len = std::min(N, L - start);
    auto chunk = recording.narrow(0, start, len).to(device).unsqueeze(0); // LOOKALIKE: tensor-clone-in-loop -- a different slice of the recording each time
    auto win = window.to(device); // EXPECT: tensor-clone-in-loop -- the same STFT window is copied to the device for every chunk
    auto mix = analyse(chunk, win, cfg);
    auto est = apply_masks(net->forward(mix.mag), mix, win, cfg, len).squeeze(0); // [S, len]
    if (start > 0) {
      const auto ov = std::min(N - H, len);
      auto prev = out.narrow(1, start, ov), cur = est.narrow(1, 0, ov);
      if ((prev * cur.flip(0)).sum().item<double>() > (prev * cur).sum().item<double>()) // LOOKALIKE: tensor-sync-in-loop -- compared: decides the speaker order
        est = est.flip(0);
    }
    // FACT: o = torch.zeros(2, 10); e = torch.randn(2, 6); o.narrow(1, 4, 6).add_(e); o.narrow(1, 0, 6).add_(e); assert torch.allclose(o[:, 4:6], e[:, :2] + e[:, 4:])
    out.narrow(1, start, len).add_(est * fade.narrow(0, 0, len)); // LOOKALIKE: tensor-inplace-overlap -- chunks overlap in time, but the source is a fresh estimate, not a slice of out
    weight.narrow(0, start, len).add_(fade.narrow(0, 0, len));
  }
  return out / weight;
}

// Low-latency mode: one STFT frame in, one 16-bit frame per speaker out (the caller runs the OLA).
class StreamingSeparator {
public:
  StreamingSeparator(MaskNet net, const SepConfig &cfg) : net_(std::move(net)), cfg_(cfg) {
    ctx_ = torch::zeros({cfg.context_frames, cfg.n_fft / 2 + 1});
    net_->eval();
  }

  // frame: [F] complex spectrum of the newest hop -> [S, n_fft] int16 windowed segments
  torch::Tensor push(const torch::Tensor &frame, const torch::Tensor &synth_window) {
    torch::NoGradGuard no_grad;
    const auto K = ctx_.size(0);
    // FACT: c = torch.zeros(8, 129); assert raises(lambda: c.narrow(0, 0, 7).copy_(c.narrow(0, 1, 7)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    ctx_.narrow(0, 0, K - 1).copy_(ctx_.narrow(0, 1, K - 1)); // EXPECT: tensor-inplace-overlap -- rows 1..K-1 moved onto rows 0..K-2 of the same buffer
    // FACT: c = torch.zeros(8, 129); f = torch.randn(129, dtype=torch.complex64); c[7].copy_(f.abs()); assert f.abs().dtype == torch.float32 and torch.equal(c[7], f.abs()) and c[6].abs().sum() == 0
    ctx_[K - 1].copy_(frame.abs()); // LOOKALIKE: tensor-inplace-overlap, tensor-copy-narrowing -- the newest row from a tensor of its own; abs of a complex64 frame is float32
    auto masks = net_->forward(ctx_.t().unsqueeze(0)).select(0, 0).select(-1, K - 1); // [S, F]
    auto seg = torch::fft::irfft(masks * frame, cfg_.n_fft) * synth_window;
    auto pcm = torch::empty({seg.size(0), seg.size(1)}, torch::kShort);
    // FACT: p = torch.empty(3, dtype=torch.int16); p.copy_(torch.tensor([0.5, 1.3, -0.00004]) * 32767); assert p.tolist() == [16383, -22939, -1]
    pcm.copy_(seg * 32767); // EXPECT: tensor-copy-narrowing -- SI-SDR leaves the scale free: samples past +-1 wrap around, the rest are truncated
    return pcm;
  }

private:
  MaskNet net_;
  SepConfig cfg_;
  torch::Tensor ctx_; // last K magnitude frames [K, F]
};
