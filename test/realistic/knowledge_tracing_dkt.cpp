// Deep Knowledge Tracing (Piech et al. 2015): an LSTM reads a student's
// (skill, correct) interactions and predicts, for every skill, the chance of
// answering the next exercise correctly. Sequences are padded, sorted and packed.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <numeric>
#include <vector>

namespace F = torch::nn::functional;
namespace rnn = torch::nn::utils::rnn;
using torch::Tensor;

struct DKTConfig {
  int64_t num_skills = 110;
  int64_t hidden = 200;
  int64_t layers = 1;
  double dropout = 0.2;
  double lr = 1e-3;
  int64_t window = 50;
};

struct StudentSeq {
  std::vector<int64_t> skills;
  std::vector<int64_t> correct;
};

struct KTBatch {
  Tensor skills;   // [B, T] int64, -1 on padding
  Tensor correct;  // [B, T] int64
  Tensor lengths;  // [B] int64, on the CPU (pack_padded_sequence wants it there)
};

KTBatch collate(const std::vector<StudentSeq> &students) {
  const int64_t B = static_cast<int64_t>(students.size());
  int64_t T = 0;
  for (const auto &s : students)
    T = std::max<int64_t>(T, static_cast<int64_t>(s.skills.size()));
  KTBatch b;
  b.skills = torch::full({B, T}, -1, torch::kLong);
  b.correct = torch::zeros({B, T}, torch::kLong);
  b.lengths = torch::empty({B}, torch::kLong);
  for (int64_t i = 0; i < B; ++i) {
    const int64_t n = static_cast<int64_t>(students[i].skills.size());
    b.skills[i].narrow(0, 0, n).copy_(torch::tensor(students[i].skills));
    b.correct[i].narrow(0, 0, n).copy_(torch::tensor(students[i].correct));
    b.lengths[i] = n;
  }
  return b;
}

// x_t = one_hot(skill + num_skills * correct) over 2 * num_skills slots.
Tensor encode_interactions(KTBatch &b, int64_t num_skills) {
  // FACT: s = torch.randint(0, 5, (2, 4)); i = s; i.add_(s * 5); assert shares_storage(i, s)
  Tensor idx = b.skills;
  idx.add_(b.correct * num_skills); // EXPECT: tensor-alias-then-mutate
  auto valid = b.skills.ge(0);
  auto x = F::one_hot(idx.clamp_min(0), 2 * num_skills).to(torch::kFloat);
  return x * valid.unsqueeze(-1);
}

struct DKTImpl : torch::nn::Module {
  explicit DKTImpl(const DKTConfig &cfg) : cfg_(cfg) {
    lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(2 * cfg.num_skills, cfg.hidden)
                                                       .num_layers(cfg.layers)
                                                       .batch_first(true)));
    drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
    out = register_module("out", torch::nn::Linear(cfg.hidden, cfg.num_skills));
  }

  // Hidden states [B, T, hidden] of the padded batch.
  Tensor encode(const Tensor &x, const Tensor &lengths) {
    auto packed = rnn::pack_padded_sequence(x, lengths, /*batch_first=*/true, /*enforce_sorted=*/false); // LOOKALIKE: tensor-device-mismatch -- pack_padded_sequence takes CPU lengths with inputs on any device
    auto res = lstm->forward_with_packed_input(packed);
    auto padded = rnn::pad_packed_sequence(std::get<0>(res), /*batch_first=*/true, 0.0, x.size(1));
    return std::get<0>(padded);
  }

  // Logits [B, T, num_skills].
  Tensor forward(const Tensor &x, const Tensor &lengths) {
    auto h = encode(x, lengths);
    const int64_t B = h.size(0), T = h.size(1);
    // FACT: o = torch.randn(5, 3, 6).transpose(0, 1); r = o.reshape(-1, 6); assert is_copy_of(r, o)
    auto flat = h.reshape({B * T, cfg_.hidden}); // EXPECT: tensor-reshape-non-contiguous
    auto logits = out(drop(flat));
    // FACT: l = torch.nn.Linear(6, 4)(torch.randn(15, 6)); assert is_view_of(l.view(3, 5, 4), l)
    return logits.view({B, T, cfg_.num_skills}); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous
  }

  // Knowledge-state embedding of every step, for clustering students offline.
  Tensor knowledge_states(const Tensor &x, const Tensor &lengths) {
    torch::NoGradGuard no_grad;
    auto h = encode(x, lengths);
    // FACT: lstm = torch.nn.LSTM(4, 6, batch_first=True); o, _ = lstm(torch.nn.utils.rnn.pack_padded_sequence(torch.randn(3, 5, 4), torch.tensor([5, 4, 2]), batch_first=True)); h, _ = torch.nn.utils.rnn.pad_packed_sequence(o, batch_first=True); assert raises(lambda: h.view(-1, 6), "view size is not compatible")
    return h.view({-1, cfg_.hidden}); // EXPECT: tensor-view-non-contiguous
  }

  DKTConfig cfg_;
  torch::nn::LSTM lstm{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(DKT);

// Prediction at step t is for the exercise at t + 1: gather that skill's logit.
struct NextStep {
  Tensor logits;  // [N] over valid (t, t+1) pairs
  Tensor targets; // [N] float
};

NextStep gather_next(const Tensor &logits, const KTBatch &b) {
  const int64_t T = logits.size(1);
  auto next_skill = b.skills.narrow(1, 1, T - 1);
  auto next_correct = b.correct.narrow(1, 1, T - 1);
  auto valid = next_skill.ge(0);
  auto picked = logits.narrow(1, 0, T - 1).gather(2, next_skill.clamp_min(0).unsqueeze(-1)).squeeze(-1);
  return {picked.masked_select(valid), next_correct.masked_select(valid).to(torch::kFloat)};
}

// Rank-based AUC on the host (Mann-Whitney U), ties ignored.
double host_auc(const Tensor &scores, const Tensor &labels) {
  auto s = scores.to(torch::kCPU, torch::kDouble);
  auto y = labels.to(torch::kCPU, torch::kLong);
  auto order = std::get<1>(s.sort());
  auto ranks = torch::empty_like(s);
  ranks.index_put_({order}, torch::arange(1, s.size(0) + 1, torch::kDouble));
  const double pos = y.sum().item<double>();
  const double neg = static_cast<double>(y.size(0)) - pos;
  if (pos == 0 || neg == 0)
    return 0.5;
  const double rank_sum = ranks.masked_select(y.eq(1)).sum().item<double>();
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

void train(DKT &model, std::vector<std::vector<StudentSeq>> &batches, const DKTConfig &cfg, int epochs) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    double running = 0.0;
    int64_t step = 0;
    for (auto &students : batches) {
      auto b = collate(students);
      auto x = encode_interactions(b, cfg.num_skills).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
      auto logits = model->forward(x, b.lengths);
      b.skills = b.skills.to(device);
      b.correct = b.correct.to(device);
      auto ns = gather_next(logits, b);
      auto pred = torch::sigmoid(ns.logits);
      auto shown = pred.detach();
      shown.clamp_(1e-4, 1.0 - 1e-4); // EXPECT: tensor-inplace-on-detached
      auto loss = F::binary_cross_entropy(pred, ns.targets);
      opt.zero_grad();
      loss.backward();
      opt.step();
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- item() gives a host double
      if (++step % 50 == 0)
        std::cout << "step " << step << " bce " << loss.item<float>() << " p " << shown.mean().item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every 50 steps
    }
    std::cout << "epoch " << epoch << " loss " << running / std::max<int64_t>(step, 1) << "\n";
  }
}

double evaluate(DKT &model, std::vector<std::vector<StudentSeq>> &batches, const DKTConfig &cfg,
                torch::Device device) {
  model->eval();
  Tensor val_loss = torch::zeros({}, device);
  std::vector<Tensor> probs, labels;
  for (auto &students : batches) {
    auto b = collate(students);
    auto x = encode_interactions(b, cfg.num_skills).to(device);
    b.skills = b.skills.to(device);
    b.correct = b.correct.to(device);
    auto ns = gather_next(model->forward(x, b.lengths), b);
    val_loss += F::binary_cross_entropy_with_logits(ns.logits, ns.targets); // EXPECT: tensor-graph-kept-across-iterations
    {
      torch::NoGradGuard no_grad;
      probs.push_back(torch::sigmoid(ns.logits)); // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard
    }
    labels.push_back(ns.targets);
  }
  std::cout << "val bce " << val_loss.item<double>() / batches.size() << "\n";
  return host_auc(torch::cat(probs), torch::cat(labels));
}

// Online tutor: keeps the last `window` interactions of one student and
// re-scores all skills after every answer.
struct OnlineTracer {
  OnlineTracer(DKT model, const DKTConfig &cfg) : model_(model), cfg_(cfg) {
    window_ = torch::zeros({cfg.window, 2 * cfg.num_skills});
  }

  Tensor observe(int64_t skill, bool correct) {
    const int64_t W = window_.size(0);
    if (filled_ == W) {
      // FACT: w = torch.randn(6, 4); assert raises(lambda: w.narrow(0, 0, 5).copy_(w.narrow(0, 1, 5)), "some elements")
      window_.narrow(0, 0, W - 1).copy_(window_.narrow(0, 1, W - 1)); // EXPECT: tensor-inplace-overlap
      --filled_;
    }
    // FACT: w = torch.zeros(6, 4); r = w[2]; r.zero_(); assert is_view_of(r, w)
    auto row = window_[filled_];
    row.zero_(); // LOOKALIKE: tensor-alias-then-mutate -- writing one row of the window through select is the intent
    row[skill + (correct ? cfg_.num_skills : 0)] = 1.0;
    ++filled_;
    torch::NoGradGuard no_grad;
    auto lengths = torch::full({1}, filled_, torch::kLong);
    auto logits = model_->forward(window_.unsqueeze(0), lengths);
    return torch::sigmoid(logits.select(1, filled_ - 1)).squeeze(0);
  }

  DKT model_;
  DKTConfig cfg_;
  Tensor window_;
  int64_t filled_ = 0;
};

// Smoke test of a trained checkpoint on the GPU.
void gpu_smoke(DKT &model, const DKTConfig &cfg) {
  torch::NoGradGuard no_grad;
  model->to(torch::kCUDA);
  model->eval();
  auto x = torch::zeros({1, 4, 2 * cfg.num_skills});
  x.select(1, 0)[0][3] = 1.0;
  auto lengths = torch::full({1}, 4, torch::kLong);
  auto logits = model->forward(x, lengths); // EXPECT: tensor-device-mismatch
  std::cout << torch::sigmoid(logits).cpu().max() << "\n";
}

std::vector<std::vector<StudentSeq>> synthetic(int64_t n_batches, int64_t bs, const DKTConfig &cfg) {
  std::vector<std::vector<StudentSeq>> out(n_batches);
  for (auto &batch : out)
    for (int64_t i = 0; i < bs; ++i) {
      StudentSeq s;
      const int64_t len = torch::randint(5, 40, {1}).item<int64_t>();
      for (int64_t t = 0; t < len; ++t) {
        s.skills.push_back(torch::randint(0, cfg.num_skills, {1}).item<int64_t>());
        s.correct.push_back(torch::randint(0, 2, {1}).item<int64_t>());
      }
      batch.push_back(s);
    }
  return out;
}

int main() {
  DKTConfig cfg;
  DKT model(cfg);
  auto train_set = synthetic(20, 16, cfg);
  auto val_set = synthetic(4, 16, cfg);
  train(model, train_set, cfg, 2);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  std::cout << "val auc " << evaluate(model, val_set, cfg, device) << "\n";
  model->to(torch::kCPU);
  OnlineTracer tracer(model, cfg);
  auto p = tracer.observe(3, true);
  std::cout << "p(skill 3) " << p[3].item<float>() << "\n";
  if (torch::cuda::is_available())
    gpu_smoke(model, cfg);
}
