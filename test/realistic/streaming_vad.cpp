// Streaming voice-activity detection for several microphones at once.
// Audio is framed hop by hop, log-mel frames go into a ring buffer, a small
// causal CNN scores the latest context window, and a hysteresis state machine
// (adaptive onset, hangover) turns posteriors into speech segments.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

namespace vad {

struct Config {
  int64_t sample_rate = 16000;
  int64_t frame_len = 400;
  int64_t hop = 160;
  int64_t n_fft = 512;
  int64_t n_mels = 40;
  int64_t context = 16;
  int64_t channels = 64;
  int64_t max_chunk = 1600;
  double onset = 0.6, offset = 0.4, noise_adapt = 0.5, ema = 0.3;
  int64_t min_speech = 5, hangover = 20;
  double lr = 1e-3, speech_weight = 0.7, focal_gamma = 2.0;
  int64_t epochs = 5;
  torch::Device device = torch::kCPU;
};

struct Utterance { torch::Tensor wav, labels; };
struct Segment { int64_t stream, start, end; };

torch::Tensor mel_filterbank(int64_t n_fft, int64_t n_mels, int64_t sr) {
  auto hz_to_mel = [](double f) { return 2595.0 * std::log10(1.0 + f / 700.0); };
  auto freqs = torch::linspace(0, sr / 2.0, n_fft / 2 + 1);
  auto mels = torch::linspace(0, hz_to_mel(sr / 2.0), n_mels + 2);
  auto pts = 700.0 * (torch::pow(10.0, mels / 2595.0) - 1.0);
  auto lower = pts.slice(0, 0, n_mels).unsqueeze(1);
  auto center = pts.slice(0, 1, n_mels + 1).unsqueeze(1);
  auto upper = pts.slice(0, 2, n_mels + 2).unsqueeze(1);
  auto rising = (freqs - lower) / (center - lower);
  auto falling = (upper - freqs) / (upper - center);
  return torch::minimum(rising, falling).clamp_min(0.0);
}

struct LogMel {
  explicit LogMel(const Config& cfg)
      : n_fft(cfg.n_fft), window(torch::hann_window(cfg.frame_len)),
        fbank(mel_filterbank(cfg.n_fft, cfg.n_mels, cfg.sample_rate)) {}

  torch::Tensor operator()(const torch::Tensor& frames) const {
    auto centered = frames - frames.mean(-1, /*keepdim=*/true);
    auto spec = torch::fft::rfft(centered * window, n_fft);
    return torch::log(torch::matmul(spec.abs().pow(2), fbank.t()) + 1e-6);
  }

  int64_t n_fft;
  torch::Tensor window, fbank;
};

// Training path: frame whole utterances at once.
torch::Tensor frame_signal(const torch::Tensor& wav, int64_t frame_len, int64_t hop) {
  auto frames = wav.unfold(1, frame_len, hop);
  // FACT: w=torch.randn(2,16000); f=w.unfold(1,400,160); assert raises(lambda: f.view(-1,400), "view size is not compatible")
  return frames.view({-1, frame_len});  // EXPECT: tensor-view-non-contiguous
}

torch::Tensor frame_labels(const Utterance& utt, const Config& cfg) {
  return (utt.labels.unfold(1, cfg.frame_len, cfg.hop).mean(-1) > 0.5).to(torch::kFloat);
}

// One causal context window per frame: the frame itself and the context-1 before it.
torch::Tensor context_windows(const torch::Tensor& mel, int64_t K) {
  const auto B = mel.size(0), T = mel.size(1), M = mel.size(2);
  auto padded = torch::constant_pad_nd(mel, {0, 0, K - 1, 0});
  // FACT: m=torch.randn(4,50,40); p=torch.nn.functional.pad(m,(0,0,15,0)); assert is_copy_of(p.unfold(1,16,1).permute(0,1,3,2).reshape(200,16,40), p)
  return padded.unfold(1, K, 1).permute({0, 1, 3, 2}).reshape({B * T, K, M});  // EXPECT: tensor-reshape-non-contiguous
}

struct VADNetImpl : torch::nn::Module {
  explicit VADNetImpl(const Config& cfg)
      : conv1(register_module("conv1", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.n_mels, cfg.channels, 3)))),
        conv2(register_module("conv2", torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.channels, cfg.channels, 3).dilation(2)))),
        head(register_module("head", torch::nn::Linear(cfg.channels, 1))) {
    torch::nn::init::constant_(head->bias, -1.0);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init fills under its own NoGradGuard
  }

  // Context windows in, one speech logit per window out.
  torch::Tensor forward(const torch::Tensor& ctx) {
    auto h = torch::relu(conv1(ctx.transpose(1, 2)));
    // FACT: x=torch.randn(4,40,16,requires_grad=True); h=torch.relu(torch.nn.Conv1d(40,8,3)(x)); h.clamp_max_(6.0); assert backward_fails(lambda: h.sum().backward())
    h.clamp_max_(6.0);  // EXPECT: tensor-inplace-on-saved
    h = torch::relu(conv2(h));
    return head(h.mean(2)).squeeze(-1);
  }

  torch::nn::Conv1d conv1, conv2;
  torch::nn::Linear head;
};
TORCH_MODULE(VADNet);

// Keeps the last `capacity` frames of every stream. Each frame is written twice
// (slot and slot + capacity) so the current window is always one plain slice.
class FrameRing {
 public:
  FrameRing(int64_t capacity, int64_t n_streams, int64_t dim)
      : cap_(capacity), buf_(torch::zeros({2 * capacity, n_streams, dim})) {}

  void push(const torch::Tensor& frame) {
    buf_[head_].copy_(frame);  // LOOKALIKE: tensor-copy-narrowing -- log-mel frames and the ring are both float
    // FACT: b=torch.randn(32,2,40); assert shares_storage(b[20],b[4]) and not raises(lambda: b[20].copy_(b[4])) and torch.equal(b[20],b[4])
    buf_[head_ + cap_].copy_(buf_[head_]);  // LOOKALIKE: tensor-inplace-overlap -- two distinct rows of the buffer, nothing overlaps
    head_ = (head_ + 1) % cap_;
    filled_ = std::min(filled_ + 1, cap_);
  }

  bool full() const { return filled_ == cap_; }
  torch::Tensor window() const { return buf_.narrow(0, head_, cap_); }
  torch::Tensor snapshot() const { return window().clone(); }  // LOOKALIKE: tensor-unnecessary-clone -- the slice is overwritten by the next pushes

 private:
  int64_t cap_, head_ = 0, filled_ = 0;
  torch::Tensor buf_;
};

class HysteresisSmoother {
 public:
  HysteresisSmoother(const Config& cfg, int64_t n_streams)
      : cfg_(cfg), ema_(torch::zeros({n_streams})), noise_floor_(torch::zeros({n_streams})),
        speaking_(torch::zeros({n_streams}, torch::kBool)), run_(torch::zeros({n_streams}, torch::kLong)),
        start_(n_streams, 0) {}

  std::vector<Segment> update(const torch::Tensor& probs, int64_t frame) {
    auto p = probs;
    // FACT: pr=torch.rand(3); p=pr; p.mul_(0.3).add_(torch.rand(3),alpha=0.7); assert shares_storage(p,pr)
    p.mul_(cfg_.ema).add_(ema_, 1.0 - cfg_.ema);  // EXPECT: tensor-alias-then-mutate
    ema_.copy_(p);
    noise_floor_ = torch::where(speaking_, noise_floor_, 0.98 * noise_floor_ + 0.02 * p);
    // The onset threshold rises with each stream's background level.
    auto onset = torch::full({1}, cfg_.onset).expand_as(p);
    // FACT: t=torch.full((1,),0.6).expand(3); assert raises(lambda: t.add_(torch.rand(3),alpha=0.5), "more than one element")
    onset.add_(noise_floor_, cfg_.noise_adapt);  // EXPECT: tensor-inplace-on-expanded
    auto disagree = torch::where(speaking_, p < cfg_.offset, p > onset);
    run_ = torch::where(disagree, run_ + 1, torch::zeros_like(run_));

    std::vector<Segment> ended;
    auto sp = speaking_.accessor<bool, 1>();
    auto rn = run_.accessor<int64_t, 1>();
    for (int64_t s = 0; s < p.size(0); ++s) {
      if (!sp[s] && rn[s] >= cfg_.min_speech) {
        sp[s] = true, rn[s] = 0;
        start_[s] = frame - cfg_.min_speech;
      } else if (sp[s] && rn[s] >= cfg_.hangover) {
        sp[s] = false, rn[s] = 0;
        ended.push_back({s, start_[s], frame - cfg_.hangover});
      }
    }
    return ended;
  }

 private:
  Config cfg_;
  torch::Tensor ema_, noise_floor_, speaking_, run_;
  std::vector<int64_t> start_;
};

class StreamingVAD {
 public:
  StreamingVAD(VADNet net, const Config& cfg, int64_t n_streams)
      : net_(std::move(net)), cfg_(cfg), fe_(cfg), ring_(cfg.context, n_streams, cfg.n_mels),
        smoother_(cfg, n_streams),
        pending_(torch::zeros({n_streams, cfg.frame_len + cfg.max_chunk}, torch::kInt16)) {}

  // One chunk of resampled audio per stream.
  std::vector<Segment> accept(const torch::Tensor& chunk) {
    torch::NoGradGuard no_grad;
    net_->eval();
    const auto n = chunk.size(1);
    // FACT: p=torch.zeros(2,10,dtype=torch.int16); p[:,:4].copy_(torch.tensor([[0.5,-0.7,0.99,0.2]]*2)); assert int(p.abs().sum())==0
    pending_.narrow(1, n_pending_, n).copy_(chunk);  // EXPECT: tensor-copy-narrowing
    n_pending_ += n;
    std::vector<Segment> done;
    while (n_pending_ >= cfg_.frame_len) {
      auto frame = pending_.narrow(1, 0, cfg_.frame_len).to(torch::kFloat);
      // FACT: p=torch.zeros(2,400,dtype=torch.int16); f=p[:,:400].to(torch.float32); f.div_(32768.0); assert is_copy_of(f,p)
      frame.div_(32768.0);  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of int16 samples is a new tensor
      ring_.push(fe_(frame));
      const auto rest = n_pending_ - cfg_.hop;
      // FACT: p=torch.zeros(1,2000,dtype=torch.int16); assert shares_storage(p[:,:800],p[:,160:960]) and raises(lambda: p[:,:800].copy_(p[:,160:960]), "some elements")
      pending_.narrow(1, 0, rest).copy_(pending_.narrow(1, cfg_.hop, rest));  // EXPECT: tensor-inplace-overlap
      n_pending_ = rest;
      ++frame_idx_;
      if (!ring_.full()) continue;
      auto probs = torch::sigmoid(net_->forward(ring_.window().transpose(0, 1)));
      last_probs_ = probs;
      auto ended = smoother_.update(probs, frame_idx_);
      done.insert(done.end(), ended.begin(), ended.end());
    }
    return done;
  }

  const torch::Tensor& level_meter() const { return last_probs_; }
  torch::Tensor context_snapshot() const { return ring_.snapshot(); }

 private:
  VADNet net_;
  Config cfg_;
  LogMel fe_;
  FrameRing ring_;
  HysteresisSmoother smoother_;
  torch::Tensor pending_, last_probs_;
  int64_t n_pending_ = 0, frame_idx_ = 0;
};

void train(VADNet& net, const std::vector<Utterance>& data, const LogMel& fe, const Config& cfg) {
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr));
  const auto pos_weight = torch::tensor({cfg.speech_weight});
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    net->train();
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(cfg.device));
    int64_t correct = 0, total = 0;
    for (const auto& utt : data) {
      const auto B = utt.wav.size(0);
      // FACT: fr=torch.randn(6,400); fb=torch.rand(40,257); m=torch.log(torch.matmul(torch.fft.rfft(fr*torch.hann_window(400),512).abs().pow(2),fb.t())+1e-6); assert is_contiguous(m) and is_view_of(m.view(2,-1,40), m)
      auto mel = fe(frame_signal(utt.wav, cfg.frame_len, cfg.hop)).view({B, -1, cfg.n_mels});  // LOOKALIKE: tensor-view-non-contiguous -- the matmul inside LogMel writes a fresh contiguous result
      auto x = context_windows(mel, cfg.context).to(cfg.device);
      // FACT: l=torch.rand(2,16000); y=(l.unfold(1,400,160).mean(-1)>0.5).float(); assert is_contiguous(y) and is_view_of(y.reshape(-1), y)
      auto y = frame_labels(utt, cfg).reshape({-1}).to(cfg.device);  // LOOKALIKE: tensor-reshape-non-contiguous -- the reduction over each frame yields contiguous labels
      auto logits = net->forward(x);
      // Focal-style weights: confident, correct frames count less.
      auto focal = torch::sigmoid(logits.detach());
      focal.sub_(y).abs_().pow_(cfg.focal_gamma);  // LOOKALIKE: tensor-inplace-on-detached -- sigmoid of the detached logits is a new tensor
      auto loss = torch::binary_cross_entropy_with_logits(logits, y, focal, pos_weight.to(cfg.device));  // EXPECT: tensor-clone-in-loop
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
      correct += ((logits > 0) == (y > 0.5)).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
      total += y.numel();
    }
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / data.size()
              << " frame acc " << static_cast<double>(correct) / std::max<int64_t>(total, 1) << "\n";
  }
}

// Offline scoring: moving-average smoothing of the posteriors, then one threshold.
torch::Tensor smooth_posteriors(const torch::Tensor& probs, int64_t width) {
  auto kernel = torch::ones({1, 1, width}) / static_cast<double>(width);
  return torch::conv1d(probs.unsqueeze(1), kernel, {}, 1, width / 2).squeeze(1);  // EXPECT: tensor-device-mismatch
}

double evaluate(VADNet& net, const Utterance& utt, const LogMel& fe, const Config& cfg) {
  torch::NoGradGuard no_grad;
  net->eval();
  const auto B = utt.wav.size(0);
  auto mel = fe(frame_signal(utt.wav, cfg.frame_len, cfg.hop)).view({B, -1, cfg.n_mels});
  auto logits = net->forward(context_windows(mel, cfg.context).to(cfg.device));
  auto smoothed = smooth_posteriors(torch::sigmoid(logits).view({B, -1}), 5);
  auto decided = smoothed > torch::tensor(cfg.onset);  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may be combined with CUDA operands
  auto target = frame_labels(utt, cfg).to(cfg.device) > 0.5;
  return (decided == target).to(torch::kFloat).mean().item<double>();
}

// Toy corpus: tone bursts (speech) in noise, with sample-level labels.
Utterance make_utterance(int64_t batch, int64_t samples) {
  auto t = torch::arange(samples, torch::kFloat).div(16000.0);
  auto active = (torch::sin(2 * 3.14159265 * 0.7 * t + torch::rand({batch, 1}) * 6.28) > 0.2).to(torch::kFloat);
  auto wav = 0.3 * active * torch::sin(2 * 3.14159265 * 220.0 * t) + 0.01 * torch::randn({batch, samples});
  return {wav, active};
}

}  // namespace vad

int main() {
  torch::manual_seed(0);
  vad::Config cfg;
  cfg.device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  vad::LogMel fe(cfg);
  std::vector<vad::Utterance> data;
  for (int i = 0; i < 16; ++i) data.push_back(vad::make_utterance(4, 48000));
  vad::VADNet net(cfg);
  net->to(cfg.device);
  vad::train(net, data, fe, cfg);
  std::cout << "held-out frame accuracy " << vad::evaluate(net, vad::make_utterance(4, 48000), fe, cfg) << "\n";

  net->to(torch::kCPU);
  vad::StreamingVAD stream(net, cfg, 2);
  auto live = vad::make_utterance(2, 160000).wav;
  for (int64_t pos = 0; pos + 320 <= live.size(1); pos += 320) {
    for (const auto& seg : stream.accept(live.narrow(1, pos, 320)))
      std::cout << "stream " << seg.stream << " speech " << seg.start * 0.01 << "s - " << seg.end * 0.01 << "s\n";
  }
  std::cout << "last context " << stream.context_snapshot().sizes() << "\n";
  std::cout << "level " << stream.level_meter() << "\n";
  return 0;
}
