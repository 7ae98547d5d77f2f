// Sound event detection with a CRNN: conv blocks over log-mel patches, a bidirectional GRU over
// time, per-frame sigmoid outputs pooled to clip level with linear-softmax pooling. Trained on weak
// (clip) labels, strong (frame) labels where annotated, and a mean-teacher consistency term.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

struct SedConfig {
  int64_t n_mels = 64, n_frames = 500, n_classes = 10;
  std::vector<int64_t> channels{16, 32, 64, 128, 128};
  std::vector<int64_t> time_pool{2, 2, 1, 1, 1};
  std::vector<int64_t> freq_pool{2, 2, 2, 2, 2};
  int64_t rnn_hidden = 128;
  double dropout = 0.5;
  int64_t batch_size = 24, epochs = 200, median_window = 7;
  double lr = 1e-3, ema_decay = 0.999, consistency_weight = 2.0;
  double pseudo_threshold = 0.7, pseudo_weight = 0.5;
  double clip_seconds = 10.0;
  std::vector<float> pos_weight{2.f, 1.f, 3.f, 1.5f, 4.f, 1.f, 2.5f, 1.f, 6.f, 2.f};
  int64_t label_frames() const {
    return n_frames / std::accumulate(time_pool.begin(), time_pool.end(), int64_t{1}, std::multiplies<int64_t>());
  }
};

struct ConvBlockImpl : torch::nn::Module {
  ConvBlockImpl(int64_t in, int64_t out, int64_t time_pool, int64_t freq_pool)
      : conv(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false)),
        bn(out),
        pool(torch::nn::AvgPool2dOptions({time_pool, freq_pool})) {
    register_module("conv", conv);
    register_module("bn", bn);
    register_module("pool", pool);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = bn(conv(x));
    // FACT: bn=torch.nn.BatchNorm2d(4); y=bn(torch.randn(2,4,5,5)); torch.relu_(y); y.sum().backward(); assert bn.weight.grad is not None
    torch::relu_(x);  // LOOKALIKE: tensor-inplace-on-saved -- batch norm backward keeps its input and batch statistics, not its output
    return pool(x);
  }

  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::AvgPool2d pool;
};
TORCH_MODULE(ConvBlock);

struct CRNNImpl : torch::nn::Module {
  explicit CRNNImpl(const SedConfig& c) {
    int64_t in = 1, freq = c.n_mels;
    for (size_t i = 0; i < c.channels.size(); ++i) {
      blocks_.push_back(register_module("block" + std::to_string(i),
                                        ConvBlock(in, c.channels[i], c.time_pool[i], c.freq_pool[i])));
      in = c.channels[i];
      freq /= c.freq_pool[i];
    }
    dropout_ = register_module("dropout", torch::nn::Dropout(c.dropout));
    rnn_ = register_module("rnn", torch::nn::GRU(torch::nn::GRUOptions(in * freq, c.rnn_hidden)
                                                     .num_layers(2).batch_first(true).bidirectional(true).dropout(c.dropout)));
    head_ = register_module("head", torch::nn::Linear(2 * c.rnn_hidden, c.n_classes));
  }

  torch::Tensor forward(const torch::Tensor& mel) {
    auto x = mel.unsqueeze(1);
    for (auto& block : blocks_) x = block->forward(x);
    x = dropout_(x);
    const auto B = x.size(0), C = x.size(1), T = x.size(2), F = x.size(3);
    // FACT: x=torch.randn(2,8,10,2).permute(0,2,1,3); assert is_copy_of(x.reshape(2,10,16), x)
    x = x.permute({0, 2, 1, 3}).reshape({B, T, C * F});  // EXPECT: tensor-reshape-non-contiguous
    auto out = std::get<0>(rnn_->forward(x));
    // FACT: g=torch.nn.GRU(8,4,batch_first=True,bidirectional=True); o,_=g(torch.randn(2,5,8)); assert not is_contiguous(o) and is_copy_of(o.reshape(10,8), o)
    auto frames = out.reshape({B * T, out.size(2)});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: y=torch.nn.Linear(8,3)(torch.randn(10,8)); assert is_view_of(y.view(2,5,3), y)
    return head_(frames).view({B, T, -1});  // LOOKALIKE: tensor-view-non-contiguous -- Linear returns a fresh contiguous tensor
  }

  std::vector<ConvBlock> blocks_;
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::GRU rnn_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(CRNN);

struct SedOutput { torch::Tensor frame_logits, frame_probs, clip_probs; };

// Linear-softmax pooling: loud frames dominate the clip decision, quiet ones barely count.
SedOutput predict(CRNN& model, const torch::Tensor& mel) {
  SedOutput out;
  out.frame_logits = model->forward(mel);
  out.frame_probs = torch::sigmoid(out.frame_logits);
  // FACT: x=torch.randn(2,5,3,requires_grad=True); p=torch.sigmoid(x); p.clamp_(1e-7,1-1e-7); assert backward_fails(lambda: p.sum().backward())
  out.frame_probs.clamp_(1e-7, 1.0 - 1e-7);  // EXPECT: tensor-inplace-on-saved
  out.clip_probs = (out.frame_probs * out.frame_probs).sum(1) / out.frame_probs.sum(1);
  return out;
}

void update_teacher(CRNN& student, CRNN& teacher, double decay) {
  torch::NoGradGuard no_grad;
  auto sp = student->parameters();
  auto tp = teacher->parameters();
  for (size_t i = 0; i < sp.size(); ++i) tp[i].mul_(decay).add_(sp[i], 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-leaf -- EMA of the teacher under NoGradGuard
  auto sb = student->buffers();
  auto tb = teacher->buffers();
  for (size_t i = 0; i < sb.size(); ++i) tb[i].copy_(sb[i]);
}

struct Event { int64_t label; double onset, offset; };

struct SedBatch { torch::Tensor mel, weak, strong, labeled, has_strong; };

class SedDataset {
 public:
  explicit SedDataset(const SedConfig& c) : cfg_(c) {}

  void add_clip(torch::Tensor mel, const std::vector<Event>& events, bool labeled, bool has_strong) {
    const int64_t pool = cfg_.n_frames / cfg_.label_frames();
    auto fine = torch::zeros({cfg_.n_classes, cfg_.n_frames});
    auto weak = torch::zeros({cfg_.n_classes});
    for (const auto& e : events) {
      const auto on = static_cast<int64_t>(e.onset / cfg_.clip_seconds * cfg_.n_frames);
      const auto off = std::min<int64_t>(cfg_.n_frames, std::ceil(e.offset / cfg_.clip_seconds * cfg_.n_frames));
      // FACT: f=torch.zeros(10,500); r=f[3].narrow(0,20,40); assert is_view_of(r, f)
      fine[e.label].narrow(0, on, off - on).fill_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- writing the event roll through its row view is the intent
      weak[e.label] = 1.0;
    }
    // Strong labels are stored as bytes: the corpus is large and the targets are 0/1.
    auto strong = torch::zeros({cfg_.label_frames(), cfg_.n_classes}, torch::kUInt8);
    strong.copy_(torch::avg_pool1d(fine.unsqueeze(0), {pool}, {pool}).squeeze(0).t());  // EXPECT: tensor-copy-narrowing
    clips_.push_back({std::move(mel), weak, strong, labeled, has_strong});
  }

  size_t size() const { return clips_.size(); }

  SedBatch batch(size_t begin, size_t end, const std::vector<size_t>& order) const {
    std::vector<torch::Tensor> mel, weak, strong;
    std::vector<float> labeled, has_strong;
    for (size_t i = begin; i < end; ++i) {
      const auto& c = clips_[order[i]];
      mel.push_back(c.mel);
      weak.push_back(c.weak);
      strong.push_back(c.strong);
      labeled.push_back(c.labeled ? 1.f : 0.f);
      has_strong.push_back(c.has_strong ? 1.f : 0.f);
    }
    return {torch::stack(mel), torch::stack(weak), torch::stack(strong).to(torch::kFloat),
            torch::tensor(labeled), torch::tensor(has_strong)};
  }

 private:
  struct Clip {
    torch::Tensor mel, weak, strong;
    bool labeled, has_strong;
  };
  SedConfig cfg_;
  std::vector<Clip> clips_;
};

torch::Tensor median_filter_time(const torch::Tensor& probs, int64_t window) {
  namespace F = torch::nn::functional;
  const auto B = probs.size(0), T = probs.size(1), C = probs.size(2);
  // FACT: p=torch.rand(2,12,3); assert raises(lambda: p.transpose(1,2).view(6,1,12), "view size is not compatible")
  auto x = probs.transpose(1, 2).view({B * C, 1, T});  // EXPECT: tensor-view-non-contiguous
  x = F::pad(x, F::PadFuncOptions({window / 2, window / 2}).mode(torch::kReplicate));
  auto med = std::get<0>(x.unfold(2, window, 1).median(-1));
  // FACT: m=torch.randn(6,1,18).unfold(2,7,1).median(-1).values; assert is_contiguous(m) and is_view_of(m.view(2,3,12), m)
  return med.view({B, C, T}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- median() returns a fresh contiguous tensor
}

struct DetectedEvent { int64_t clip, label; double onset, offset; };

std::vector<DetectedEvent> decode_events(const torch::Tensor& probs, const torch::Tensor& thresholds,
                                         double frame_seconds, int64_t clip) {
  auto active = probs.clone();  // EXPECT: tensor-unnecessary-clone
  active.gt_(thresholds);
  auto acc = active.accessor<float, 2>();
  const int64_t T = probs.size(0);
  std::vector<DetectedEvent> events;
  for (int64_t c = 0; c < probs.size(1); ++c) {
    if (probs.select(1, c).max().item<float>() < thresholds[c].item<float>()) continue;  // LOOKALIKE: tensor-sync-in-loop -- CPU tensors here, and the value picks the branch
    int64_t start = -1;
    for (int64_t t = 0; t <= T; ++t) {
      const bool on = t < T && acc[t][c] > 0.5f;
      if (on && start < 0) {
        start = t;
      } else if (!on && start >= 0) {
        events.push_back({clip, c, start * frame_seconds, t * frame_seconds});
        start = -1;
      }
    }
  }
  return events;
}

void evaluate(CRNN& model, const SedDataset& val, const torch::Tensor& thresholds, const SedConfig& cfg,
              torch::Device device) {
  model->eval();
  torch::NoGradGuard no_grad;
  std::vector<size_t> order(val.size());
  std::iota(order.begin(), order.end(), 0);
  auto counts = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto tp = torch::zeros({cfg.n_classes}, counts), fp = torch::zeros({cfg.n_classes}, counts);
  auto fn = torch::zeros({cfg.n_classes}, counts);
  std::vector<torch::Tensor> all_probs;
  for (size_t s = 0; s < val.size(); s += cfg.batch_size) {
    auto batch = val.batch(s, std::min(val.size(), s + cfg.batch_size), order);
    auto thr = thresholds.to(device);  // EXPECT: tensor-clone-in-loop
    auto probs = median_filter_time(predict(model, batch.mel.to(device)).frame_probs, cfg.median_window);
    auto pred = probs.gt(thr);
    auto ref = batch.strong.to(device).gt(0.5);
    tp += (pred & ref).sum(0).sum(0);
    fp += (pred & ref.logical_not()).sum(0).sum(0);
    fn += (pred.logical_not() & ref).sum(0).sum(0);
    all_probs.push_back(probs);  // LOOKALIKE: tensor-graph-kept-across-iterations -- inference under NoGradGuard, no graph attached
  }
  auto f1 = (2 * tp) / (2 * tp + fp + fn).clamp_min(1);
  auto probs = torch::cat(all_probs).cpu();
  const double frame_seconds = cfg.clip_seconds / cfg.label_frames();
  size_t n_events = 0;
  for (int64_t i = 0; i < probs.size(0); ++i) n_events += decode_events(probs[i], thresholds, frame_seconds, i).size();
  std::cout << "frame F1 " << f1.mean().item<double>() << ", " << n_events << " events decoded\n";
  model->train();
}

int main() {
  torch::manual_seed(0);
  SedConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  std::mt19937 rng(7);

  SedDataset train(cfg), val(cfg);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < 2000; ++i) {
    std::vector<Event> events;
    for (int e = 0; e < 3; ++e) {
      const double on = u(rng) * 8.0;
      events.push_back({static_cast<int64_t>(u(rng) * cfg.n_classes), on, on + 0.3 + u(rng) * 1.7});
    }
    auto mel = torch::randn({cfg.n_frames, cfg.n_mels});
    if (i < 200) val.add_clip(mel, events, true, true);
    else train.add_clip(mel, events, u(rng) < 0.5, u(rng) < 0.2);
  }

  CRNN student(cfg), teacher(cfg);
  student->to(device);
  teacher->to(device);
  update_teacher(student, teacher, 0.0);
  torch::optim::Adam opt(student->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto pos_weight = torch::tensor(cfg.pos_weight);
  auto thresholds = torch::full({cfg.n_classes}, 0.5);
  namespace F = torch::nn::functional;

  std::vector<size_t> order(train.size());
  std::iota(order.begin(), order.end(), 0);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    auto running_consistency = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t n_batches = 0;
    for (size_t s = 0; s + cfg.batch_size <= order.size(); s += cfg.batch_size, ++step, ++n_batches) {
      auto batch = train.batch(s, s + cfg.batch_size, order);
      auto mel = batch.mel.to(device);  // LOOKALIKE: tensor-clone-in-loop -- every step moves a different batch
      auto weak = batch.weak.to(device), strong = batch.strong.to(device);
      auto labeled = batch.labeled.to(device).unsqueeze(1), has_strong = batch.has_strong.to(device);
      if (u(rng) < 0.5) {
        const double lam = 0.3 + 0.4 * u(rng);
        auto perm = torch::randperm(mel.size(0), torch::TensorOptions().dtype(torch::kLong).device(device));
        // FACT: x=torch.randn(4,3); m=x.mul(0.3); assert is_copy_of(m, x)
        mel = mel.mul(lam).add_(mel.index_select(0, perm), 1.0 - lam);  // LOOKALIKE: tensor-alias-then-mutate -- mul() allocates; add_ writes only that new tensor
        weak = weak.mul(lam).add_(weak.index_select(0, perm), 1.0 - lam);
        strong = strong.mul(lam).add_(strong.index_select(0, perm), 1.0 - lam);
        labeled = labeled.min(labeled.index_select(0, perm));
        has_strong = has_strong.min(has_strong.index_select(0, perm));
      }

      auto out = predict(student, mel);
      auto weak_bce = torch::binary_cross_entropy(out.clip_probs, weak, {}, torch::Reduction::None);
      auto weak_loss = (weak_bce * labeled).sum() / (labeled.sum() * cfg.n_classes).clamp_min(1.0);
      auto strong_bce = F::binary_cross_entropy_with_logits(
          out.frame_logits, strong, F::BinaryCrossEntropyWithLogitsFuncOptions().pos_weight(pos_weight).reduction(torch::kNone));  // EXPECT: tensor-device-mismatch
      auto strong_loss = (strong_bce.mean({1, 2}) * has_strong).sum() / has_strong.sum().clamp_min(1.0);

      torch::Tensor teacher_probs;
      {
        torch::NoGradGuard no_grad;
        teacher_probs = predict(teacher, mel).frame_probs;
      }
      auto consistency = torch::mse_loss(out.frame_probs, teacher_probs);
      // Confident clip predictions become hard targets for the unlabeled clips.
      auto pseudo = out.clip_probs.detach();
      pseudo.gt_(cfg.pseudo_threshold);  // EXPECT: tensor-inplace-on-detached
      auto unlabeled = 1.0 - labeled;
      auto pseudo_bce = torch::binary_cross_entropy(out.clip_probs, pseudo, {}, torch::Reduction::None);
      auto pseudo_loss = (pseudo_bce * unlabeled).sum() / (unlabeled.sum() * cfg.n_classes).clamp_min(1.0);

      const double ramp = std::min(1.0, step / 10000.0);
      auto loss = weak_loss + strong_loss + ramp * (cfg.consistency_weight * consistency + cfg.pseudo_weight * pseudo_loss);
      opt.zero_grad();
      loss.backward();
      opt.step();
      update_teacher(student, teacher, cfg.ema_decay);
      running_consistency += consistency;  // EXPECT: tensor-graph-kept-across-iterations
      epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, accumulated on the device
    }
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / n_batches << " consistency "
              << running_consistency.item<double>() / n_batches << std::endl;
    if (epoch % 5 == 4) evaluate(teacher, val, thresholds, cfg, device);
  }
  torch::save(teacher, "sed_crnn_teacher.pt");
  return 0;
}
