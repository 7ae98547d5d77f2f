// Streaming keyword spotting on 16 kHz microphone audio.
// Audio arrives in small chunks; a ring buffer of 16-bit samples feeds 25 ms / 10 ms
// analysis frames, each turned into a log-mel vector on the fly. A causal CNN + GRU
// carries its state from chunk to chunk, posteriors are smoothed over a sliding window,
// and a keyword fires when its smoothed score crosses the threshold, followed by a
// refractory period so one utterance triggers one detection.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace nn = torch::nn;

struct KwsConfig {
  int64_t sample_rate = 16000;
  int64_t win_length = 400;  // 25 ms
  int64_t hop = 160;         // 10 ms
  int64_t n_fft = 512;
  int64_t n_mels = 40;
  int64_t conv_channels = 64;
  int64_t conv_kernel = 5;
  int64_t gru_hidden = 128;
  int64_t num_classes = 4;    // class 0 is filler / background
  int64_t smooth_window = 8;  // chunks
  int64_t refractory = 20;    // chunks
  double threshold = 0.8;
  double preemph = 0.97;
  double state_decay = 0.5;
  double norm_momentum = 0.01;
};

struct Detection {
  int64_t keyword;
  int64_t chunk_index;
  float score;
};

// Triangular mel filters [n_fft / 2 + 1, n_mels], computed in double precision.
torch::Tensor build_mel_filterbank(int64_t sr, int64_t n_fft, int64_t n_mels) {
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const double mel_max = 2595.0 * std::log10(1.0 + (sr / 2.0) / 700.0);
  auto mel_pts = torch::linspace(0.0, mel_max, n_mels + 2, opts);
  auto hz_pts = 700.0 * (torch::pow(10.0, mel_pts / 2595.0) - 1.0);
  auto fft_freqs = torch::linspace(0.0, sr / 2.0, n_fft / 2 + 1, opts).unsqueeze(1);
  auto lower = hz_pts.narrow(0, 0, n_mels).unsqueeze(0);
  auto center = hz_pts.narrow(0, 1, n_mels).unsqueeze(0);
  auto upper = hz_pts.narrow(0, 2, n_mels).unsqueeze(0);
  auto up = (fft_freqs - lower) / (center - lower);
  auto down = (upper - fft_freqs) / (upper - center);
  return torch::clamp_min(torch::min(up, down), 0.0);
}

// y[t] = x[t] - a * x[t-1], written into x; `last` carries x[-1] across chunks.
void preemphasis_(torch::Tensor x, torch::Tensor& last, double a) {
  const int64_t n = x.size(0);
  auto prev = torch::cat({last, x.narrow(0, 0, n - 1)});
  last = x.narrow(0, n - 1, 1).clone();
  // FACT: x = torch.randn(6); p = torch.cat([torch.zeros(1), x.narrow(0, 0, 5)]); assert is_copy_of(p, x)
  x.sub_(prev, a);  // LOOKALIKE: tensor-inplace-overlap -- prev is a fresh cat, not a view of x
}

// Fixed-size ring of int16 samples (what the DSP side keeps to save memory).
class PcmRing {
 public:
  explicit PcmRing(int64_t capacity)
      : pcm_(torch::zeros({capacity}, torch::kShort)), cap_(capacity) {}

  // chunk: float samples in [-1, 1]; the oldest samples are overwritten when full.
  void push(const torch::Tensor& chunk) {
    const int64_t n = std::min(chunk.size(0), cap_);
    auto src = chunk.narrow(0, chunk.size(0) - n, n);
    auto store = [&](int64_t at, const torch::Tensor& part) {
      pcm_.narrow(0, at, part.size(0)).copy_(part * 32767.0);  // EXPECT: tensor-copy-narrowing
    };
    const int64_t first = std::min(n, cap_ - write_);
    store(write_, src.narrow(0, 0, first));
    if (first < n) store(0, src.narrow(0, first, n - first));
    write_ = (write_ + n) % cap_;
    avail_ = std::min(avail_ + n, cap_);
    if (avail_ == cap_) read_ = write_;
  }

  // One analysis frame of `win` samples, advancing the read position by `hop`.
  bool pop(int64_t win, int64_t hop, torch::Tensor& frame) {
    if (avail_ < win) return false;
    auto idx = (torch::arange(win) + read_) % cap_;
    frame = pcm_.index_select(0, idx).to(torch::kFloat) / 32768.0;
    read_ = (read_ + hop) % cap_;
    avail_ -= hop;
    return true;
  }

 private:
  torch::Tensor pcm_;
  int64_t cap_;
  int64_t write_ = 0, read_ = 0, avail_ = 0;
};

struct KwsNetImpl : nn::Module {
  explicit KwsNetImpl(const KwsConfig& cfg)
      : cfg_(cfg),
        conv_(nn::Conv1dOptions(cfg.n_mels, cfg.conv_channels, cfg.conv_kernel)),
        gru_(nn::GRUOptions(cfg.conv_channels, cfg.gru_hidden).batch_first(true)),
        bn_(cfg.gru_hidden),
        head_(cfg.gru_hidden, cfg.num_classes) {
    register_module("conv", conv_);
    register_module("gru", gru_);
    register_module("bn", bn_);
    register_module("head", head_);
  }

  // mel: [B, n_mels, T + K - 1] (left context included) -> [B, C, T]
  torch::Tensor encode(const torch::Tensor& mel) { return torch::relu(conv_(mel)); }

  torch::Tensor classify(const torch::Tensor& h) { return head_(bn_(h)); }

  // Whole utterances at once: feats [B, T, n_mels] -> frame logits [B, T', classes].
  torch::Tensor forward(const torch::Tensor& feats) {
    const auto batch = feats.size(0);
    auto h = encode(feats.transpose(1, 2));
    auto gru_out = gru_->forward(h.transpose(1, 2));
    auto out = std::get<0>(gru_out);  // [B, T', H]
    // FACT: g = torch.nn.GRU(4, 8, batch_first=True); o, h = g(torch.randn(3, 5, 4)); assert raises(lambda: o.view(-1, 8), "view size is not compatible")
    auto logits = classify(out.view({-1, cfg_.gru_hidden}));  // EXPECT: tensor-view-non-contiguous
    // FACT: l = torch.nn.Linear(8, 4)(torch.randn(15, 8)); assert is_view_of(l.view(3, 5, 4), l)
    return logits.view({batch, -1, cfg_.num_classes});  // LOOKALIKE: tensor-view-non-contiguous -- Linear output is contiguous
  }

  // One chunk: frames [T, n_mels]; ctx [K - 1, n_mels] and state [1, 1, H] carried over.
  torch::Tensor step(const torch::Tensor& frames, torch::Tensor& ctx, torch::Tensor& state,
                     bool decay_state) {
    auto full = torch::cat({ctx, frames}, 0);
    const int64_t keep = ctx.size(0);
    // FACT: c = torch.randn(4, 3); f = torch.cat([c, torch.randn(5, 3)]); assert is_copy_of(f, c)
    ctx.copy_(full.narrow(0, full.size(0) - keep, keep));  // LOOKALIKE: tensor-inplace-overlap -- the source is the fresh cat, not ctx
    auto h = encode(full.t().unsqueeze(0));
    auto gru_out = gru_->forward(h.transpose(1, 2), state);
    auto h_n = std::get<1>(gru_out);
    auto carry = h_n.detach();
    if (decay_state) carry.mul_(cfg_.state_decay);  // EXPECT: tensor-inplace-on-detached
    state = carry;
    return torch::softmax(classify(h_n.select(0, -1)), -1).squeeze(0);
  }

  KwsConfig cfg_;
  nn::Conv1d conv_;
  nn::GRU gru_;
  nn::BatchNorm1d bn_;
  nn::Linear head_;
};
TORCH_MODULE(KwsNet);

class KwsStream {
 public:
  KwsStream(KwsNet net, const KwsConfig& cfg)
      : net_(std::move(net)),
        cfg_(cfg),
        ring_(cfg.sample_rate),
        window_(torch::hann_window(cfg.win_length)),
        mel_fb_(torch::empty({cfg.n_fft / 2 + 1, cfg.n_mels}, torch::kFloat)),
        feat_mean_(torch::zeros({cfg.n_mels})),
        feat_std_(torch::ones({cfg.n_mels})),
        ctx_(torch::zeros({cfg.conv_kernel - 1, cfg.n_mels})),
        state_(torch::zeros({1, 1, cfg.gru_hidden})),
        post_hist_(torch::zeros({cfg.smooth_window, cfg.num_classes})),
        last_sample_(torch::zeros({1})) {
    auto fb = build_mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels);
    mel_fb_.copy_(fb.to(torch::kFloat));  // LOOKALIKE: tensor-copy-narrowing -- the conversion is explicit
    net_->eval();
  }

  std::vector<Detection> feed(const torch::Tensor& chunk) {
    torch::NoGradGuard no_grad;
    torch::Tensor audio = chunk;
    // FACT: a = torch.randn(6); b = a; b.sub_(torch.randn(6), alpha=0.97); assert shares_storage(a, b)
    preemphasis_(audio, last_sample_, cfg_.preemph);  // EXPECT: tensor-alias-then-mutate
    ring_.push(audio);

    std::vector<torch::Tensor> mels;
    torch::Tensor frame;
    while (ring_.pop(cfg_.win_length, cfg_.hop, frame)) mels.push_back(logmel(frame));
    std::vector<Detection> found;
    if (mels.empty()) return found;

    auto feats = normalise(torch::stack(mels));
    auto post = net_->step(feats, ctx_, state_, decay_next_);
    decay_next_ = false;

    const int64_t w = post_hist_.size(0);
    // FACT: h = torch.randn(8, 4); assert raises(lambda: h.narrow(0, 0, 7).copy_(h.narrow(0, 1, 7)), "some elements of the input tensor")
    post_hist_.narrow(0, 0, w - 1).copy_(post_hist_.narrow(0, 1, w - 1));  // EXPECT: tensor-inplace-overlap
    post_hist_[w - 1].copy_(post);  // LOOKALIKE: tensor-copy-narrowing -- float posteriors into a float history
    if (auto d = detect(post_hist_.mean(0))) found.push_back(*d);
    ++chunk_index_;
    return found;
  }

  void reset() {
    state_.zero_();  // LOOKALIKE: tensor-inplace-on-detached -- the step that produced this state is long finished
    ctx_.zero_();
    post_hist_.zero_();
    refractory_left_ = 0;
  }

 private:
  torch::Tensor logmel(const torch::Tensor& frame) {
    auto spec = torch::fft::rfft(frame * window_, cfg_.n_fft);
    return torch::log(spec.abs().pow(2).matmul(mel_fb_) + 1e-6);
  }

  // Online mean/variance normalisation of the log-mel frames [T, n_mels].
  torch::Tensor normalise(const torch::Tensor& mel) {
    const double m = cfg_.norm_momentum;
    feat_mean_.mul_(1.0 - m).add_(mel.mean(0), m);  // LOOKALIKE: tensor-inplace-on-leaf -- a plain statistics tensor, not a parameter
    feat_std_.mul_(1.0 - m).add_(mel.std(0), m);
    auto x = mel.clone();  // EXPECT: tensor-unnecessary-clone
    x -= feat_mean_;
    return x / (feat_std_ + 1e-5);
  }

  std::optional<Detection> detect(const torch::Tensor& smoothed) {
    if (refractory_left_ > 0) {
      --refractory_left_;
      return std::nullopt;
    }
    auto keywords = smoothed.narrow(0, 1, cfg_.num_classes - 1);
    auto best = keywords.max(0);
    const float score = std::get<0>(best).item<float>();
    if (score < cfg_.threshold) return std::nullopt;
    refractory_left_ = cfg_.refractory;
    decay_next_ = true;
    return Detection{std::get<1>(best).item<int64_t>() + 1, chunk_index_, score};
  }

  KwsNet net_;
  KwsConfig cfg_;
  PcmRing ring_;
  torch::Tensor window_, mel_fb_, feat_mean_, feat_std_;
  torch::Tensor ctx_, state_, post_hist_, last_sample_;
  int64_t refractory_left_ = 0;
  int64_t chunk_index_ = 0;
  bool decay_next_ = false;
};

// Offline check on a test set bucketed into equal-length clips: each entry of
// `buckets` is [N, samples]; returns the frame-level argmax [N, frames] per bucket.
std::vector<torch::Tensor> evaluate_buckets(KwsNet& net, const std::vector<torch::Tensor>& buckets,
                                            const KwsConfig& cfg, torch::Device device) {
  c10::InferenceMode guard;
  net->eval();
  net->to(device);
  auto mel_fb = build_mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels).to(torch::kFloat);
  auto window = torch::hann_window(cfg.win_length).to(device);
  std::vector<torch::Tensor> decisions;
  for (const auto& clips : buckets) {
    auto x = clips.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different bucket each iteration
    auto fb = mel_fb.to(device);  // EXPECT: tensor-clone-in-loop
    auto frames = x.unfold(1, cfg.win_length, cfg.hop) * window;
    auto power = torch::fft::rfft(frames, cfg.n_fft).abs().pow(2);
    auto feats = torch::log(power.matmul(fb) + 1e-6);  // [N, frames, n_mels]
    auto pad = torch::zeros({feats.size(0), cfg.conv_kernel - 1, cfg.n_mels}, feats.options());
    auto logits = net->forward(torch::cat({pad, feats}, 1));
    decisions.push_back(logits.argmax(-1).cpu());  // LOOKALIKE: tensor-graph-kept-across-iterations -- under InferenceMode, argmax has no graph
  }
  return decisions;
}
