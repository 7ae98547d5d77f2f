// GRU-D (Che et al., 2018) for in-hospital mortality prediction from irregularly sampled ICU
// vitals and labs (PhysioNet 2012 style). Each stay is a list of timestamped measurements of D
// variables; the collate step bins them into T hourly steps with an observation mask and the time
// since each variable was last seen. GRU-D decays the last observation towards the training mean
// and the hidden state towards zero as that time grows. The classifier is trained with a
// class-weighted BCE (about 14% of stays end in death) and scored by AUROC and AUPRC.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct GruDConfig {
  int64_t num_vars = 35, hidden = 64, steps = 48, epochs = 60, log_every = 50;
  double bin_hours = 1.0, lr = 1e-3, weight_decay = 1e-4, dropout = 0.3, grad_clip = 5.0;
  double clip_z = 6.0;
};

// One ICU stay as exported by the EHR pipeline.
struct Stay {
  std::vector<double> timestamps; // Unix seconds of each measurement
  std::vector<int64_t> var_ids;   // which of the D variables was measured
  std::vector<float> values;      // raw value in the variable's unit
  double admit_time = 0;          // Unix seconds
  int64_t died = 0;
};

struct Batch {
  torch::Tensor values; // [B, D, T] variable-major, as binned
  torch::Tensor mask;   // [B, D, T] 1 where the variable was observed in the bin
  torch::Tensor delta;  // [B, D, T] hours since the variable was last observed
  torch::Tensor labels; // [B] float 0/1
};

// [B, D, T] -> [B, T, D]: the recurrence consumes one time step at a time.
torch::Tensor time_major(const torch::Tensor &series) { return series.transpose(1, 2); }

Batch collate(const std::vector<Stay> &stays, const GruDConfig &cfg) {
  const auto B = static_cast<int64_t>(stays.size()), D = cfg.num_vars, T = cfg.steps;
  auto values = torch::zeros({B, D, T});
  auto mask = torch::zeros({B, D, T});
  auto labels = torch::empty({B});
  for (int64_t i = 0; i < B; ++i) {
    const auto &s = stays[static_cast<size_t>(i)];
    const auto n = static_cast<int64_t>(s.timestamps.size());
    auto ts = torch::empty({n});
    // FACT: t = torch.tensor([1.7e9 + 10.0, 1.7e9 + 60.0], dtype=torch.float64); f = torch.empty(2); f.copy_(t); assert f[0] == f[1]
    ts.copy_(torch::from_blob(const_cast<double *>(s.timestamps.data()), {n}, torch::kDouble)); // EXPECT: tensor-copy-narrowing
    auto hours = (ts - s.admit_time) / 3600.0;
    auto bin = (hours / cfg.bin_hours).floor().clamp(0, T - 1).to(torch::kLong);
    auto var = torch::tensor(s.var_ids, torch::kLong);
    auto vals = torch::tensor(s.values);
    // Several measurements in one bin: the last one wins, as in the reference preprocessing.
    values[i].index_put_({var, bin}, vals);
    auto seen = torch::zeros({D, T}, torch::kBool);
    seen.index_put_({var, bin}, true);
    // FACT: m = torch.zeros(2, 3); s = torch.tensor([[True, False, True], [False, True, False]]); m.copy_(s); assert torch.equal(m, s.float())
    mask[i].copy_(seen); // LOOKALIKE: tensor-copy-narrowing -- bool into float is exact
    labels[i] = static_cast<double>(s.died);
  }
  // delta_t = bin width + delta_{t-1} while the variable stays unobserved (GRU-D, eq. 2).
  auto delta = torch::zeros({B, D, T});
  for (int64_t t = 1; t < T; ++t) {
    auto prev = delta.select(2, t - 1);
    // FACT: d = torch.zeros(2, 3, 4); m = torch.ones(2, 3, 4); d.select(2, 1).copy_(1.0 + (1 - m.select(2, 0)) * d.select(2, 0)); assert torch.equal(d.select(2, 1), torch.ones(2, 3))
    delta.select(2, t).copy_(cfg.bin_hours + (1 - mask.select(2, t - 1)) * prev); // LOOKALIKE: tensor-inplace-overlap -- column t is written from a new tensor built from column t-1: no shared elements
  }
  return {values, mask, delta, labels};
}

// Per-variable z-scoring with statistics of the observed entries of the training set.
class Standardizer {
public:
  void fit(const torch::Tensor &values, const torch::Tensor &mask) {
    const auto D = values.size(1);
    auto counts = time_major(mask).sum(std::vector<int64_t>{0, 1}).clamp_min(1);
    // FACT: v = torch.randn(4, 5, 6); assert raises(lambda: v.transpose(1, 2).view(-1, 5), "view size is not compatible")
    auto rows = time_major(values * mask).view({-1, D}); // EXPECT: tensor-view-non-contiguous
    mean_ = rows.sum(0) / counts;
    // FACT: s = torch.rand(5) / torch.rand(5); assert is_view_of(s.view(1, -1, 1), s)
    auto centred = values - mean_.view({1, -1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- a quotient of two [D] tensors is contiguous
    auto sq = time_major(centred.pow(2) * mask).sum(std::vector<int64_t>{0, 1});
    std_ = (sq / counts).sqrt().clamp_min(1e-3);
  }

  torch::Tensor apply(const torch::Tensor &values, const torch::Tensor &mask) const {
    auto z = values.contiguous();
    // FACT: s = torch.rand(5); assert is_view_of(s.view(1, -1, 1), s)
    // FACT: v = torch.randn(2, 3, 4); v0 = v.clone(); z = v.contiguous(); z.sub_(torch.randn(1, 3, 1)).div_(torch.rand(1, 3, 1) + 0.5); assert shares_storage(z, v) and not torch.equal(v, v0)
    z.sub_(mean_.view({1, -1, 1})).div_(std_.view({1, -1, 1})); // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-view-non-contiguous -- mean_ and std_ are fresh [D] reductions
    return z.clamp(-clip_, clip_) * mask;
  }

  double clip_ = 6.0;

private:
  torch::Tensor mean_, std_;
};

struct GruDCellImpl : nn::Module {
  GruDCellImpl(int64_t D, int64_t H) {
    decay_x = register_module("decay_x", nn::Linear(D, D));
    decay_h = register_module("decay_h", nn::Linear(D, H));
    gates = register_module("gates", nn::Linear(2 * D + H, 2 * H));
    cand_x = register_module("cand_x", nn::Linear(2 * D, H));
    cand_h = register_module("cand_h", nn::Linear(nn::LinearOptions(H, H).bias(false)));
    diag_ = register_buffer("diag", torch::eye(D));
    // Standardised inputs: the empirical mean the imputation decays towards is 0.
    x_mean_ = register_buffer("x_mean", torch::zeros({D}));
    // FACT: lin = torch.nn.Linear(4, 4); assert raises(lambda: lin.weight.mul_(torch.eye(4)), "a leaf Variable that requires grad")
    decay_x->weight.mul_(diag_); // EXPECT: tensor-inplace-on-leaf
    nn::init::zeros_(decay_h->bias); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
  }

  // W_gamma_x is diagonal in GRU-D: each variable's decay depends only on its own delta.
  void project_diagonal() {
    torch::NoGradGuard no_grad;
    decay_x->weight.mul_(diag_); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard, after the optimizer step
  }

  // One GRU-D step. x_t, m_t, d_t: [B, D]; x_last: [B, D]; h: [B, H].
  torch::Tensor step(const torch::Tensor &x_t, const torch::Tensor &m_t, const torch::Tensor &d_t, const torch::Tensor &x_last,
                     const torch::Tensor &h) {
    auto gamma_x = torch::exp(-torch::relu(decay_x(d_t)));
    auto gamma_h = torch::exp(-torch::relu(decay_h(d_t)));
    auto x_hat = gamma_x * x_last;
    // FACT: a = torch.rand(2, 3, requires_grad=True); b = torch.randn(2, 3); y = a * b; y += 0.5 * (1 - a); y.sum().backward(); assert a.grad is not None
    x_hat += (1 - gamma_x) * x_mean_; // LOOKALIKE: tensor-inplace-on-saved -- mul saved its operands, not the product written here
    x_hat = m_t * x_t + (1 - m_t) * x_hat;
    // FACT: lin = torch.nn.Linear(3, 4); g = torch.exp(-torch.relu(lin(torch.rand(2, 3)))); g.mul_(torch.randn(2, 4)); assert backward_fails(lambda: g.sum().backward())
    auto h_dec = gamma_h.mul_(h); // EXPECT: tensor-inplace-on-saved
    auto zr = torch::sigmoid(gates(torch::cat({x_hat, h_dec, m_t}, 1))).chunk(2, 1);
    auto h_tilde = torch::tanh(cand_x(torch::cat({x_hat, m_t}, 1)) + cand_h(zr[1] * h_dec));
    return (1 - zr[0]) * h_dec + zr[0] * h_tilde;
  }

  nn::Linear decay_x{nullptr}, decay_h{nullptr}, gates{nullptr}, cand_x{nullptr}, cand_h{nullptr};
  torch::Tensor diag_, x_mean_;
};
TORCH_MODULE(GruDCell);

struct GruDImpl : nn::Module {
  explicit GruDImpl(const GruDConfig &cfg) : hidden_(cfg.hidden) {
    cell = register_module("cell", GruDCell(cfg.num_vars, cfg.hidden));
    drop = register_module("drop", nn::Dropout(cfg.dropout));
    head = register_module("head", nn::Linear(cfg.hidden, 1));
  }

  // values, mask, delta: [B, D, T] as collated; returns mortality logits [B].
  torch::Tensor forward(const torch::Tensor &values, const torch::Tensor &mask, const torch::Tensor &delta) {
    auto x = time_major(values), m = time_major(mask), d = time_major(delta);
    const auto B = x.size(0), T = x.size(1);
    auto h = torch::zeros({B, hidden_}, x.options()); // LOOKALIKE: tensor-device-mismatch -- made with the input's options
    // Variables not yet measured start at the (standardised) mean, 0.
    auto x_last = x.select(1, 0).clone(); // EXPECT: tensor-unnecessary-clone
    x_last.mul_(m.select(1, 0));
    for (int64_t t = 0; t < T; ++t) {
      auto x_t = x.select(1, t), m_t = m.select(1, t);
      h = cell->step(x_t, m_t, d.select(1, t), x_last, h);
      x_last = m_t * x_t + (1 - m_t) * x_last;
    }
    return head(drop(h)).squeeze(-1);
  }

  int64_t hidden_;
  GruDCell cell{nullptr};
  nn::Dropout drop{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(GruD);

// Mann-Whitney AUROC of host tensors.
double auroc(const torch::Tensor &probs, const torch::Tensor &labels) {
  const auto n = probs.size(0);
  auto ranks = torch::empty_like(probs);
  ranks.index_put_({probs.argsort()}, torch::arange(1, n + 1, probs.options()));
  auto pos = labels > 0.5;
  const double n_pos = pos.sum().item<double>(), n_neg = static_cast<double>(n) - n_pos;
  if (n_pos == 0 || n_neg == 0)
    return 0.5;
  return (ranks.masked_select(pos).sum().item<double>() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg);
}

// Average precision: mean of the precision at each positive, ranked by score.
double auprc(const torch::Tensor &probs, const torch::Tensor &labels) {
  auto order = probs.argsort(0, /*descending=*/true);
  auto hits = labels.index_select(0, order);
  auto tp = hits.cumsum(0);
  auto precision = tp / torch::arange(1, probs.size(0) + 1, probs.options());
  return (precision * hits).sum().item<double>() / std::max(1.0, hits.sum().item<double>());
}

struct Metrics {
  double auroc = 0, auprc = 0, brier = 0;
};

Metrics evaluate(GruD &model, const Standardizer &norm, const std::vector<Batch> &data, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> probs, labels;
  for (const auto &batch : data) {
    auto logits = model->forward(norm.apply(batch.values, batch.mask).to(device), batch.mask.to(device), batch.delta.to(device));
    probs.push_back(torch::sigmoid(logits).cpu()); // LOOKALIKE: tensor-graph-kept-across-iterations, tensor-sync-in-loop -- under NoGradGuard; the host copies are kept and scored once
    labels.push_back(batch.labels);
  }
  auto p = torch::cat(probs), y = torch::cat(labels);
  model->train();
  return {auroc(p, y), auprc(p, y), (p - y).pow(2).mean().item<double>()};
}

void train(GruD &model, const std::vector<Batch> &train_set, const std::vector<Batch> &val_set, const torch::Tensor &class_weights,
           const GruDConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Standardizer norm;
  norm.clip_ = cfg.clip_z;
  std::vector<torch::Tensor> all_values, all_masks;
  for (const auto &b : train_set) {
    all_values.push_back(b.values);
    all_masks.push_back(b.mask);
  }
  norm.fit(torch::cat(all_values), torch::cat(all_masks));
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));
  std::vector<torch::Tensor> train_probs, train_labels;
  int64_t step = 0;
  double best_auprc = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double running = 0;
    for (const auto &batch : train_set) {
      auto x = norm.apply(batch.values, batch.mask).to(device);
      auto m = batch.mask.to(device), d = batch.delta.to(device);
      auto y = batch.labels.to(device); // LOOKALIKE: tensor-clone-in-loop -- every batch is moved once
      auto w = class_weights.to(device); // EXPECT: tensor-clone-in-loop
      auto logits = model->forward(x, m, d);
      auto sample_w = w.index_select(0, y.to(torch::kLong));
      auto loss = F::binary_cross_entropy_with_logits(logits, y, F::BinaryCrossEntropyWithLogitsFuncOptions().weight(sample_w));
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.grad_clip);
      opt.step();
      model->cell->project_diagonal();
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop
      train_probs.push_back(torch::sigmoid(logits)); // EXPECT: tensor-graph-kept-across-iterations
      train_labels.push_back(y); // LOOKALIKE: tensor-graph-kept-across-iterations -- labels carry no graph
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    const double train_auc = auroc(torch::cat(train_probs).detach().cpu(), torch::cat(train_labels).cpu());
    train_probs.clear();
    train_labels.clear();
    const auto val = evaluate(model, norm, val_set, device);
    std::cout << "epoch " << epoch << " loss " << running / static_cast<double>(train_set.size()) << " train auroc " << train_auc
              << " val auroc " << val.auroc << " auprc " << val.auprc << " brier " << val.brier << "\n";
    if (val.auprc > best_auprc) {
      best_auprc = val.auprc;
      torch::save(model, "grud_best.pt");
    }
  }
}
