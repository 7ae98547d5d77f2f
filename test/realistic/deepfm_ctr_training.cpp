// DeepFM (Guo et al. 2017) for click-through-rate prediction, trained day by day on impression
// logs. Raw 64-bit ids of every categorical field are hashed into the field's bucket range of one
// shared table; the impression time adds two derived fields (hour of day, gap since the user's
// previous impression). The FM part (first-order weights plus the second-order term
// 0.5 * ((sum v)^2 - sum v^2)) and the MLP share the factor embeddings. Negatives are
// downsampled in the logs, so scores are corrected before the next day's log loss and AUC.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct CtrConfig {
  // user, ad, campaign, advertiser, site, app, device model, os | hour of day, log2 gap
  std::vector<int64_t> buckets = {1000003, 200003, 50021, 10007, 100003, 30011, 5003, 101, 24, 21};
  std::vector<int64_t> hidden = {400, 400, 400};
  int64_t embed_dim = 16, batch_size = 4096, log_every = 500, auc_bins = 10000;
  int64_t hash_seed = 0x2545F4914F6CDD1DLL;
  double lr = 1e-3, dropout = 0.2, neg_sample_rate = 0.1;
};

// One day of impressions as read from the columnar log files.
struct DayLog {
  torch::Tensor raw_ids;            // [n, F_raw] raw categorical ids, int64
  torch::Tensor clicks;             // [n] 0/1
  torch::Tensor evicted_rows;       // table rows whose ids left the vocabulary overnight
  std::vector<double> timestamps;   // unix seconds
  std::vector<double> prev_seen;    // unix seconds of the same user's previous impression
};

struct CtrTensors {
  torch::Tensor ids, clicks; // [n, F] bucket ids, [n]
};

// Multiplicative hashing into [0, buckets); every field gets its own seed.
torch::Tensor hash_ids(const torch::Tensor &raw, int64_t buckets, int64_t seed) {
  auto h = raw.bitwise_xor(seed);
  // FACT: r = torch.tensor([5, 17, 2 ** 40 + 3]); r0 = r.clone(); h = r.bitwise_xor(12345); h.mul_(-7046029254386353131); assert is_copy_of(h, r) and torch.equal(r, r0)
  h.mul_(static_cast<int64_t>(0x9E3779B97F4A7C15ULL)); // LOOKALIKE: tensor-alias-then-mutate -- bitwise_xor made a new tensor: the raw ids are untouched
  return h.remainder(buckets); // takes the divisor's sign: never negative
}

CtrTensors build_features(const DayLog &log, const CtrConfig &cfg) {
  const int64_t n = log.raw_ids.size(0), n_raw = log.raw_ids.size(1);
  auto ids = torch::empty({n, n_raw + 2}, torch::kLong);
  for (int64_t f = 0; f < n_raw; ++f)
    ids.select(1, f).copy_(hash_ids(log.raw_ids.select(1, f), cfg.buckets[f], cfg.hash_seed + f)); // LOOKALIKE: tensor-copy-narrowing -- int64 hashes into an int64 column

  // Context columns: when the impression happened, and how long after the previous one.
  auto ts = torch::tensor(log.timestamps, torch::kDouble);
  auto prev = torch::tensor(log.prev_seen, torch::kDouble);
  auto context = torch::empty({n, 2});
  // FACT: t = torch.tensor([1700000037.0], dtype=torch.float64); d = torch.zeros(1); d.copy_(t); assert float(d[0]) != float(t[0]) and abs(float(d[0]) - float(t[0])) > 30
  context.select(1, 0).copy_(ts); // EXPECT: tensor-copy-narrowing -- unix seconds need 31 bits, float32 keeps 24: every time is rounded to 128 s before the hour is taken
  context.select(1, 1).copy_((ts - prev).clamp_min(0.0).to(torch::kFloat)); // LOOKALIKE: tensor-copy-narrowing -- the gap is converted explicitly, and small
  auto hour = context.select(1, 0).fmod(86400.0).div(3600.0).floor().to(torch::kLong);
  auto gap = context.select(1, 1).add(1.0).log2().floor().clamp(0, 20).to(torch::kLong);
  ids.select(1, n_raw).copy_(hour);
  ids.select(1, n_raw + 1).copy_(gap);
  return {ids, log.clicks.to(torch::kFloat)};
}

struct DeepFMImpl : torch::nn::Module {
  explicit DeepFMImpl(const CtrConfig &cfg) {
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (auto b : cfg.buckets) {
      offsets.push_back(total);
      total += b;
    }
    field_offsets_ = register_buffer("field_offsets", torch::tensor(offsets, torch::kLong));
    linear_ = register_module("linear", torch::nn::Embedding(total, 1));
    factors_ = register_module("factors", torch::nn::Embedding(total, cfg.embed_dim));
    bias_ = register_parameter("bias", torch::zeros({1}));
    // FACT: e = torch.nn.Embedding(10, 4); torch.nn.init.normal_(e.weight, 0.0, 0.01); assert e.weight.is_leaf and e.weight.requires_grad
    torch::nn::init::normal_(factors_->weight, 0.0, 1e-2); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    torch::nn::init::zeros_(linear_->weight);

    torch::nn::Sequential mlp;
    int64_t in = static_cast<int64_t>(cfg.buckets.size()) * cfg.embed_dim;
    for (auto h : cfg.hidden) {
      mlp->push_back(torch::nn::Linear(in, h));
      mlp->push_back(torch::nn::BatchNorm1d(h));
      mlp->push_back(torch::nn::ReLU());
      mlp->push_back(torch::nn::Dropout(cfg.dropout));
      in = h;
    }
    mlp->push_back(torch::nn::Linear(in, 1));
    mlp_ = register_module("mlp", mlp);
  }

  // ids: [B, F] bucket ids per field -> click logits [B].
  torch::Tensor forward(const torch::Tensor &ids) {
    auto rows = ids + field_offsets_; // LOOKALIKE: tensor-device-mismatch -- the offsets are a buffer: they move with the module
    auto v = factors_(rows);          // [B, F, D]
    auto first = linear_(rows).sum({1, 2});
    auto sum_v = v.sum(1);
    auto second = 0.5 * (sum_v.pow(2) - v.pow(2).sum(1)).sum(1);
    // FACT: e = torch.nn.Embedding(50, 4); v = e(torch.randint(0, 50, (8, 6))); assert is_view_of(v.view(8, -1), v)
    auto deep = mlp_->forward(v.view({v.size(0), -1})).squeeze(1); // LOOKALIKE: tensor-view-non-contiguous -- an embedding lookup is contiguous
    return bias_ + first + second + deep;
  }

  // Buckets whose ids were evicted start over: no first-order weight, no interactions.
  void reset_rows(const torch::Tensor &rows) {
    auto r = rows.to(factors_->weight.device());
    // FACT: e = torch.nn.Embedding(10, 3); assert raises(lambda: e.weight.index_fill_(0, torch.tensor([1, 2]), 0.0), "a leaf Variable that requires grad")
    factors_->weight.index_fill_(0, r, 0.0); // EXPECT: tensor-inplace-on-leaf -- the table's weight requires grad and grad mode is on
    linear_->weight.index_fill_(0, r, 0.0); // EXPECT: tensor-inplace-on-leaf -- same for the first-order weights
  }

  torch::nn::Embedding linear_{nullptr}, factors_{nullptr};
  torch::nn::Sequential mlp_{nullptr};
  torch::Tensor field_offsets_, bias_;
};
TORCH_MODULE(DeepFM);

struct ClickDataset : torch::data::datasets::Dataset<ClickDataset> {
  explicit ClickDataset(CtrTensors t) : t_(std::move(t)) {}
  torch::data::Example<> get(size_t i) override { return {t_.ids[i], t_.clicks[i]}; }
  torch::optional<size_t> size() const override { return t_.ids.size(0); }
  CtrTensors t_;
};

double train_day(DeepFM &model, torch::optim::Optimizer &opt, const CtrTensors &day, const CtrConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  model->train();
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      ClickDataset(day).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(cfg.batch_size).workers(2));
  double logloss_sum = 0;
  int64_t steps = 0;
  for (auto &batch : *loader) {
    auto ids = batch.data.to(device);
    auto y = batch.target.to(device);
    auto prob = torch::sigmoid(model->forward(ids));
    auto loss = F::binary_cross_entropy(prob, y);
    // Predicted vs observed log-odds, a calibration monitor; clamped so log() stays finite.
    auto p = prob.detach();
    // FACT: x = torch.randn(8, requires_grad=True); y = torch.rand(8).round(); assert backward_fails(lambda: (lambda pr: (torch.nn.functional.binary_cross_entropy(pr, y), pr.detach().clamp_(1e-7, 1 - 1e-7))[0].backward())(torch.sigmoid(x)))
    p.clamp_(1e-7, 1.0 - 1e-7); // EXPECT: tensor-inplace-on-detached -- detach() shares prob's storage and version: sigmoid and the loss saved it, so backward() raises
    auto pred_odds = (p / (1 - p)).log().mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    logloss_sum += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step only to add up the loss
    if (++steps % cfg.log_every == 0) {
      const double ctr = y.mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
      std::cout << "step " << steps << " logloss " << logloss_sum / steps << " pred log-odds " << pred_odds.item<double>()
                << " observed " << std::log(ctr / (1 - ctr)) << "\n"; // LOOKALIKE: tensor-sync-in-loop -- inside the same every-log_every branch
    }
  }
  return logloss_sum / std::max<int64_t>(steps, 1);
}

// Ranks from a two-part histogram [negatives | positives] of scores: P(pos > neg) + P(tie) / 2.
double auc_from_histogram(const torch::Tensor &hist, int64_t bins) {
  // FACT: h = torch.randint(0, 9, (20,)); d = h.to(torch.float64); assert is_copy_of(d, h) and is_view_of(d.view(2, 10), d)
  auto h = hist.to(torch::kDouble).view({2, bins}); // LOOKALIKE: tensor-view-non-contiguous -- the conversion made a new contiguous tensor
  auto neg = h[0], pos = h[1];
  auto neg_below = torch::cumsum(neg, 0) - neg;
  auto wins = (pos * (neg_below + 0.5 * neg)).sum();
  return (wins / (pos.sum() * neg.sum()).clamp_min(1.0)).item<double>();
}

struct DayMetrics {
  double logloss = 0, auc = 0;
};

DayMetrics evaluate_day(DeepFM &model, const CtrTensors &day, const CtrConfig &cfg) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  const int64_t n = day.ids.size(0);
  auto hist = torch::zeros({2 * cfg.auc_bins}, torch::kLong);
  auto ll_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  const double log_rate = std::log(cfg.neg_sample_rate);
  for (int64_t start = 0; start < n; start += cfg.batch_size) {
    const int64_t len = std::min(cfg.batch_size, n - start);
    auto ids = day.ids.narrow(0, start, len).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different slice every iteration
    auto y = day.clicks.narrow(0, start, len).to(device);
    auto logits = model->forward(ids);
    auto corrected = logits.clone(); // EXPECT: tensor-unnecessary-clone -- overwritten at once: logits.add(log_rate) makes it in one pass
    corrected.add_(log_rate); // negatives were kept at rate w: the odds were 1/w too high
    auto p = torch::sigmoid(corrected);
    ll_sum += F::binary_cross_entropy(p, y, F::BinaryCrossEntropyFuncOptions().reduction(torch::kSum)).to(torch::kDouble); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    auto bin = (p * (cfg.auc_bins - 1)).round().to(torch::kLong);
    auto clicked = (y > 0.5).to(torch::kLong);
    hist += torch::bincount(bin + cfg.auc_bins * clicked, {}, 2 * cfg.auc_bins); // EXPECT: tensor-device-mismatch -- the histogram stays on the host, the counts are computed on the GPU
  }
  DayMetrics m;
  m.logloss = ll_sum.item<double>() / static_cast<double>(std::max<int64_t>(n, 1)); // LOOKALIKE: tensor-sync-in-loop -- once, after the loop
  m.auc = auc_from_histogram(hist, cfg.auc_bins);
  return m;
}

void run(const std::vector<DayLog> &days, const CtrConfig &cfg) {
  DeepFM model(cfg);
  model->to(torch::Device(torch::kCUDA));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  for (size_t d = 0; d + 1 < days.size(); ++d) {
    if (d > 0)
      model->reset_rows(days[d].evicted_rows);
    // FACT: e = torch.nn.Embedding(10, 3); w0 = e.weight.detach().clone(); exec('with torch.no_grad(): e.weight.add_(1.0)'); assert is_copy_of(w0, e.weight) and not torch.equal(w0, e.weight)
    auto w0 = model->factors_->weight.detach().clone(); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- a snapshot: train_day changes the table while it lives
    const double train_ll = train_day(model, opt, build_features(days[d], cfg), cfg);
    const double drift = (model->factors_->weight.detach() - w0).norm().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- once per day, after a whole day of training steps
    const auto next = evaluate_day(model, build_features(days[d + 1], cfg), cfg);
    std::cout << "day " << d << " train logloss " << train_ll << " factor drift " << drift << " | next day logloss "
              << next.logloss << " auc " << next.auc << "\n";
  }
}

int main() {
  CtrConfig cfg;
  std::vector<DayLog> days;
  const int64_t n = 20000, n_raw = 8;
  for (int day = 0; day < 3; ++day) {
    DayLog log;
    log.raw_ids = torch::randint(0, int64_t{1} << 40, {n, n_raw});
    log.clicks = torch::bernoulli(torch::full({n}, 0.05));
    log.evicted_rows = torch::randint(0, 1000003, {100});
    for (int64_t i = 0; i < n; ++i) {
      log.timestamps.push_back(1.7e9 + 86400.0 * day + 4.3 * static_cast<double>(i));
      log.prev_seen.push_back(log.timestamps.back() - 600.0);
    }
    days.push_back(std::move(log));
  }
  run(days, cfg);
  return 0;
}
