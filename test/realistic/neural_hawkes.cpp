// Neural Hawkes process (Mei & Eisner): a continuous-time LSTM whose cell decays
// between events drives K softplus intensities. Trained by maximum likelihood with a
// Monte-Carlo estimate of the compensator; next events are drawn by thinning.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

struct HawkesConfig {
  int64_t num_types = 6;
  int64_t hidden = 32;
  int64_t mc_samples = 10;
  double lr = 1e-3;
  double prior_weight = 1e-3;
  size_t batch_size = 32;
  int64_t epochs = 20;
  double max_gap = 3600.0;
};

struct EventSeq {
  std::vector<double> times;  // unix timestamps
  std::vector<int64_t> types;
};

struct EventBatch { torch::Tensor times, dt, types, mask; };

EventBatch collate(const std::vector<EventSeq>& seqs, size_t begin, size_t end, int64_t pad_type) {
  const int64_t batch = static_cast<int64_t>(end - begin);
  int64_t len = 1;
  for (size_t i = begin; i < end; ++i) len = std::max<int64_t>(len, seqs[i].times.size());
  auto times = torch::zeros({batch, len});
  auto types = torch::full({batch, len}, pad_type, torch::kLong);
  auto mask = torch::zeros({batch, len});
  for (int64_t b = 0; b < batch; ++b) {
    const auto& s = seqs[begin + b];
    const int64_t n = static_cast<int64_t>(s.times.size());
    // FACT: a = torch.zeros(2); a.copy_(torch.tensor([1.6e9 + 1.0, 1.6e9 + 30.0], dtype=torch.float64)); assert float(a[1] - a[0]) != 29.0
    times[b].narrow(0, 0, n).copy_(torch::from_blob(const_cast<double*>(s.times.data()), {n}, torch::kDouble));  // EXPECT: tensor-copy-narrowing
    types[b].narrow(0, 0, n).copy_(torch::tensor(s.types));  // LOOKALIKE: tensor-copy-narrowing -- int64 types into an int64 buffer
    mask[b].narrow(0, 0, n).fill_(1.0);
  }
  times = (times - times.narrow(1, 0, 1)) * mask;
  auto dt = times.clone();  // LOOKALIKE: tensor-unnecessary-clone -- only the tail slice is rewritten, column 0 keeps the first time
  // FACT: t = torch.cumsum(torch.rand(3, 6), 1); d = t.clone(); assert shares_storage(d.narrow(1, 1, 5), d.narrow(1, 0, 5)) and not raises(lambda: d.narrow(1, 1, 5).sub_(d.narrow(1, 0, 5)))
  dt.narrow(1, 1, len - 1).sub_(dt.narrow(1, 0, len - 1));  // EXPECT: tensor-inplace-overlap
  dt.mul_(mask);
  return {times, dt, types, mask};
}

struct CTState { torch::Tensor c, c_bar, delta, o; };

class CTLSTMCellImpl : public torch::nn::Module {
 public:
  CTLSTMCellImpl(int64_t input_size, int64_t hidden) {
    gates = register_module("gates", torch::nn::Linear(input_size + hidden, 7 * hidden));
  }

  CTState update(const torch::Tensor& x, const torch::Tensor& h_t, const torch::Tensor& c_t,
                 const torch::Tensor& c_bar) {
    auto g = gates(torch::cat({x, h_t}, -1)).chunk(7, -1);
    auto z = torch::tanh(g[2]);
    CTState s;
    s.c = torch::sigmoid(g[1]) * c_t + torch::sigmoid(g[0]) * z;
    s.c_bar = torch::sigmoid(g[5]) * c_bar + torch::sigmoid(g[4]) * z;
    s.delta = torch::softplus(g[6]);
    s.o = torch::sigmoid(g[3]);
    return s;
  }

  // Cell and hidden state at the elapsed times dt after the last event.
  static std::pair<torch::Tensor, torch::Tensor> decay(const CTState& s, const torch::Tensor& dt) {
    auto gamma = torch::exp(-s.delta.unsqueeze(1) * dt.unsqueeze(-1));
    // FACT: d = torch.rand(3, 4, requires_grad=True); assert backward_fails(lambda: (lambda g: (g.clamp_min_(1e-12), g.sum().backward()))(torch.exp(-d)))
    gamma.clamp_min_(1e-12);  // EXPECT: tensor-inplace-on-saved
    auto c_t = s.c_bar.unsqueeze(1) + (s.c - s.c_bar).unsqueeze(1) * gamma;
    return {c_t, s.o.unsqueeze(1) * torch::tanh(c_t)};
  }

  torch::nn::Linear gates{nullptr};
};
TORCH_MODULE(CTLSTMCell);

class IntensityImpl : public torch::nn::Module {
 public:
  IntensityImpl(int64_t hidden, int64_t num_types) {
    proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, num_types).bias(false)));
    base = register_parameter("base", torch::zeros({num_types}));
    scale = register_parameter("scale", torch::ones({num_types}));
  }

  torch::Tensor forward(const torch::Tensor& h) {
    auto x = proj(h) + base;
    return scale * torch::softplus(x / scale);
  }

  void init_base_rates(const torch::Tensor& rates) {
    // FACT: p = torch.nn.Parameter(torch.zeros(3)); assert raises(lambda: p.copy_(torch.ones(3)), "leaf Variable")
    base.copy_(torch::log(torch::expm1(rates)));  // EXPECT: tensor-inplace-on-leaf
  }

  void project() {
    torch::NoGradGuard no_grad;
    scale.clamp_min_(1e-3);  // LOOKALIKE: tensor-inplace-on-leaf -- positivity projection under NoGradGuard
  }

  torch::nn::Linear proj{nullptr};
  torch::Tensor base, scale;
};
TORCH_MODULE(Intensity);

class NeuralHawkesImpl : public torch::nn::Module {
 public:
  explicit NeuralHawkesImpl(const HawkesConfig& cfg) : num_types_(cfg.num_types), hidden_(cfg.hidden) {
    emb = register_module("emb", torch::nn::Embedding(cfg.num_types + 1, cfg.hidden));
    cell = register_module("cell", CTLSTMCell(cfg.hidden, cfg.hidden));
    intensity = register_module("intensity", Intensity(cfg.hidden, cfg.num_types));
  }

  CTState start(int64_t batch, const torch::TensorOptions& opts) {
    auto zeros = torch::zeros({batch, hidden_}, opts);
    auto bos = torch::full({batch}, num_types_, torch::dtype(torch::kLong).device(opts.device()));
    return cell->update(emb(bos), zeros, zeros, zeros);
  }

  // Per-sequence log-likelihood: sum of log-intensities at the events minus the compensator.
  torch::Tensor log_likelihood(const EventBatch& b, int64_t mc) {
    const int64_t batch = b.types.size(0), len = b.types.size(1);
    CTState s = start(batch, b.dt.options());
    std::vector<torch::Tensor> h_events, h_samples;
    for (int64_t i = 0; i < len; ++i) {
      auto gap = b.dt.select(1, i).unsqueeze(1);
      auto u = torch::rand({batch, mc});
      auto query = torch::cat({gap, u * gap}, 1);  // EXPECT: tensor-device-mismatch
      auto [c_t, h_t] = CTLSTMCellImpl::decay(s, query);
      h_events.push_back(h_t.select(1, 0));
      h_samples.push_back(h_t.narrow(1, 1, mc));
      s = cell->update(emb(b.types.select(1, i)), h_t.select(1, 0), c_t.select(1, 0), s.c_bar);
    }
    // FACT: s = torch.stack([torch.randn(3, 8) for _ in range(5)], 1); assert is_view_of(s.reshape(-1, 8), s)
    auto h_ev = torch::stack(h_events, 1).reshape({-1, hidden_});  // LOOKALIKE: tensor-reshape-non-contiguous -- stacking along dim 1 gives a contiguous tensor, the reshape is a view
    auto lam_events = intensity(h_ev).view({batch, len, num_types_});
    // FACT: s = torch.randn(5, 3, 4, 8); assert is_copy_of(s.permute(1, 0, 2, 3).reshape(3, 20, 8), s)
    auto h_mc = torch::stack(h_samples, 0).permute({1, 0, 2, 3}).reshape({batch, len * mc, hidden_});  // EXPECT: tensor-reshape-non-contiguous
    auto lam_samples = intensity(h_mc).sum(-1).view({batch, len, mc});

    auto types = b.types.clamp_max(num_types_ - 1);
    auto lam_k = lam_events.gather(2, types.unsqueeze(2)).squeeze(2);
    auto event_term = (torch::log(lam_k + 1e-9) * b.mask).sum(1);
    auto integral = lam_samples.mean(-1) * b.dt;
    integral.mul_(b.mask);  // LOOKALIKE: tensor-inplace-on-saved -- a product's result is not saved by its own backward
    return event_term - integral.sum(1);
  }

  // State right after the last real event of every sequence.
  CTState encode(const EventBatch& b) {
    CTState s = start(b.types.size(0), b.dt.options());
    for (int64_t i = 0; i < b.types.size(1); ++i) {
      auto decayed = CTLSTMCellImpl::decay(s, b.dt.narrow(1, i, 1));
      auto next = cell->update(emb(b.types.select(1, i)), decayed.second.select(1, 0),
                               decayed.first.select(1, 0), s.c_bar);
      auto m = b.mask.select(1, i).unsqueeze(1).to(torch::kBool);
      s = {torch::where(m, next.c, s.c), torch::where(m, next.c_bar, s.c_bar),
           torch::where(m, next.delta, s.delta), torch::where(m, next.o, s.o)};
    }
    return s;
  }

  int64_t num_types() const { return num_types_; }

  torch::nn::Embedding emb{nullptr};
  CTLSTMCell cell{nullptr};
  Intensity intensity{nullptr};

 private:
  int64_t num_types_, hidden_;
};
TORCH_MODULE(NeuralHawkes);

// Thinning: propose from a homogeneous process at an upper bound of the total intensity and
// accept each proposal with probability lambda(t) / bound.
std::pair<torch::Tensor, torch::Tensor> sample_next(NeuralHawkes& model, const CTState& s,
                                                    const torch::Tensor& t_last, double max_gap,
                                                    int64_t max_rounds = 50, int64_t proposals = 16) {
  torch::NoGradGuard no_grad;
  const int64_t batch = t_last.size(0), k = model->num_types();
  auto opts = t_last.options();
  auto probe = torch::linspace(0.0, max_gap, 64, opts).unsqueeze(0).expand({batch, 64});
  auto lam_probe = model->intensity(CTLSTMCellImpl::decay(s, probe).second).sum(-1);
  // FACT: m = torch.rand(3, 1).expand(3, 16); assert raises(lambda: m.mul_(1.5), "more than one element of the written-to tensor")
  auto bound = std::get<0>(lam_probe.max(1, true)).expand({batch, proposals});
  bound.mul_(1.5);  // EXPECT: tensor-inplace-on-expanded

  torch::Tensor t = t_last;
  auto next_time = t_last + max_gap;
  auto next_type = torch::zeros({batch}, torch::dtype(torch::kLong).device(t_last.device()));
  auto done = torch::zeros({batch}, torch::dtype(torch::kBool).device(t_last.device()));
  for (int64_t r = 0; r < max_rounds; ++r) {
    auto gaps = torch::empty({batch, proposals}, opts).exponential_(1.0) / bound;
    auto prop = t.unsqueeze(1) + gaps.cumsum(1);
    // FACT: e = torch.rand(3, 4) - torch.rand(3).unsqueeze(1).expand(3, 4); assert not raises(lambda: e.clamp_max_(0.5))
    auto elapsed = prop - t_last.unsqueeze(1).expand_as(prop);
    elapsed.clamp_max_(max_gap);  // LOOKALIKE: tensor-inplace-on-expanded -- the difference is a fresh dense tensor
    auto lam = model->intensity(CTLSTMCellImpl::decay(s, elapsed).second);
    auto total = lam.sum(-1);
    auto accept = (torch::rand_like(total) * bound).lt(total);
    auto hit = accept.any(1).logical_and(done.logical_not());
    auto first = accept.to(torch::kFloat).argmax(1, true);
    next_time = torch::where(hit, prop.gather(1, first).squeeze(1), next_time);
    auto lam_first = lam.gather(1, first.unsqueeze(-1).expand({batch, 1, k})).squeeze(1);
    next_type = torch::where(hit, torch::multinomial(lam_first, 1).squeeze(1), next_type);
    done.logical_or_(hit);
    // FACT: a = torch.zeros(3); t = a; t.add_(1.0); assert bool((a == 1).all())
    t.add_(gaps.sum(1));  // EXPECT: tensor-alias-then-mutate
    if (done.all().item<bool>()) break;  // LOOKALIKE: tensor-sync-in-loop -- the flag decides the early exit
  }
  return {next_time, next_type};
}

torch::Tensor empirical_rates(const std::vector<EventSeq>& seqs, int64_t num_types) {
  std::vector<double> counts(num_types, 1.0);
  double span = 1.0;
  for (const auto& s : seqs) {
    for (int64_t k : s.types) counts[k] += 1.0;
    span += s.times.back() - s.times.front();
  }
  for (auto& c : counts) c /= span;
  return torch::tensor(counts).to(torch::kFloat);
}

void train(NeuralHawkes& model, const std::vector<EventSeq>& seqs, const HawkesConfig& cfg,
           torch::Device device) {
  auto rates = empirical_rates(seqs, cfg.num_types);
  model->intensity->init_base_rates(rates);
  auto prior_base = torch::log(torch::expm1(rates));
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    torch::Tensor epoch_ll = torch::zeros({}, device);
    double total_events = 0.0;
    for (size_t start = 0; start < seqs.size(); start += cfg.batch_size) {
      auto batch = collate(seqs, start, std::min(seqs.size(), start + cfg.batch_size), cfg.num_types);
      total_events += batch.mask.sum().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the collated batch is still on the host
      for (auto* t : {&batch.times, &batch.dt, &batch.types, &batch.mask}) *t = t->to(device);  // LOOKALIKE: tensor-clone-in-loop -- every step moves its own new batch

      opt.zero_grad();
      auto ll = model->log_likelihood(batch, cfg.mc_samples);
      auto prior = prior_base.to(device);  // EXPECT: tensor-clone-in-loop
      auto loss = -ll.sum() / batch.mask.sum() +
                  cfg.prior_weight * (model->intensity->base - prior).pow(2).sum();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      model->intensity->project();
      epoch_ll = epoch_ll + ll.sum();  // EXPECT: tensor-graph-kept-across-iterations
    }
    std::cout << "epoch " << epoch << " ll/event " << epoch_ll.item<double>() / total_events << std::endl;
  }
}

double next_time_rmse(NeuralHawkes& model, const std::vector<EventSeq>& seqs, const HawkesConfig& cfg,
                      torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto se = torch::zeros({}, device);
  for (size_t start = 0; start < seqs.size(); start += cfg.batch_size) {
    const size_t end = std::min(seqs.size(), start + cfg.batch_size);
    std::vector<EventSeq> history(seqs.begin() + start, seqs.begin() + end);
    std::vector<float> true_gap;
    for (auto& h : history) {
      true_gap.push_back(static_cast<float>(h.times.back() - h.times[h.times.size() - 2]));
      h.times.pop_back();
      h.types.pop_back();
    }
    auto b = collate(history, 0, history.size(), cfg.num_types);
    for (auto* t : {&b.times, &b.dt, &b.types, &b.mask}) *t = t->to(device);
    auto t_last = std::get<0>(b.times.max(1));
    auto next = sample_next(model, model->encode(b), t_last, cfg.max_gap);
    se += (next.first - t_last - torch::tensor(true_gap).to(device)).pow(2).sum();
  }
  return std::sqrt(se.item<double>() / static_cast<double>(seqs.size()));
}

static std::vector<EventSeq> synthetic_sequences(size_t n, int64_t num_types, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> day(0.0, 86400.0);
  std::uniform_int_distribution<int64_t> len(5, 60);
  std::vector<EventSeq> out(n);
  for (auto& s : out) {
    double t = 1.6e9 + day(rng);
    int64_t k = static_cast<int64_t>(rng() % num_types);
    for (int64_t i = 0, m = len(rng); i < m; ++i) {
      s.times.push_back(t);
      s.types.push_back(k);
      std::exponential_distribution<double> gap(1.0 / (60.0 * (1 + k)));
      t += gap(rng);
      k = (k + 1 + static_cast<int64_t>(rng() % 2)) % num_types;
    }
  }
  return out;
}

int main() {
  torch::manual_seed(5);
  HawkesConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto train_seqs = synthetic_sequences(2000, cfg.num_types, 21);
  auto test_seqs = synthetic_sequences(300, cfg.num_types, 22);

  NeuralHawkes model(cfg);
  train(model, train_seqs, cfg, device);
  std::cout << "next-event time RMSE (s): " << next_time_rmse(model, test_seqs, cfg, device) << std::endl;
  return 0;
}
