// Deep Sets anomaly scorer: each sample is a variable-size set of feature vectors
// (e.g. the packets of one flow), padded to the longest set in the batch. The encoder is
// phi -> masked mean pool -> rho; a running mean/variance of the training scores gives the
// alarm threshold (mean + k * std), and eval runs on the GPU.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct SetBatch {
  torch::Tensor x;        // [B, N, D] padded
  torch::Tensor lengths;  // int64 [B]
  torch::Tensor label;    // int64 [B], 1 = anomaly (eval only)
};

struct ScorerOptions {
  int64_t in_dim = 32;
  int64_t hidden = 128;
  double momentum = 0.01;
  double k_sigma = 3.0;
  double score_clip = 50.0;
};

torch::Tensor length_mask(const torch::Tensor& lengths, int64_t max_len) {
  auto steps = torch::arange(max_len, lengths.options());
  return steps.unsqueeze(0) < lengths.unsqueeze(1);  // [B, N] bool
}

struct DeepSetsImpl : torch::nn::Module {
  explicit DeepSetsImpl(const ScorerOptions& o)
      : phi1(register_module("phi1", torch::nn::Linear(o.in_dim, o.hidden))),
        phi2(register_module("phi2", torch::nn::Linear(o.hidden, o.hidden))),
        rho1(register_module("rho1", torch::nn::Linear(o.hidden, o.hidden))),
        rho_out(register_module("rho_out", torch::nn::Linear(o.hidden, 1))) {
    // start near the typical score of a normal set
    rho_out->bias.fill_(1.0);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const auto B = x.size(0);
    const auto N = x.size(1);
    // FACT: x = torch.randn(2, 3, 4); assert is_view_of(x.view(6, 4), x)
    auto flat = x.view({B * N, x.size(2)});  // LOOKALIKE: tensor-view-non-contiguous -- the batch is contiguous
    auto h = F::relu(phi1(flat)).view({B, N, -1});
    h = F::relu(phi2(h));
    h.masked_fill_(~mask.unsqueeze(-1), 0.0);  // EXPECT: tensor-inplace-on-saved
    return rho(pool(h, mask));
  }

  // masked mean over set elements
  torch::Tensor pool(const torch::Tensor& h, const torch::Tensor& mask) {
    auto denom = mask.sum(1, /*keepdim=*/true).clamp_min(1).to(h.scalar_type());  // [B, 1]
    // FACT: m = torch.ones(2, 3); h = torch.randn(2, 3, 4); w = m.unsqueeze(-1).expand_as(h); assert raises(lambda: w.div_(torch.ones(2, 1, 1)), "more than one element")
    auto weights = mask.to(h.scalar_type()).unsqueeze(-1).expand_as(h);
    weights /= denom.unsqueeze(-1);  // EXPECT: tensor-inplace-on-expanded
    return (h * weights).sum(1);
  }

  torch::Tensor rho(const torch::Tensor& pooled) {
    return rho_out(F::relu(rho1(pooled))).squeeze(-1);
  }

  torch::nn::Linear phi1, phi2, rho1, rho_out;
};
TORCH_MODULE(DeepSets);

// Exponential running mean / variance of anomaly scores.
class ScoreStats {
 public:
  explicit ScoreStats(const ScorerOptions& o)
      : momentum_(o.momentum), k_(o.k_sigma), clip_(o.score_clip) {
    mean_ = torch::zeros({});
    var_ = torch::ones({});
  }

  void update(const torch::Tensor& scores) {
    auto s = scores.detach();
    s.clamp_(-clip_, clip_);  // EXPECT: tensor-inplace-on-detached
    auto batch_mean = s.mean();
    auto batch_var = s.var(/*unbiased=*/false);
    // FACT: m = torch.zeros(()); d = torch.ones(()) - m; m.mul_(0.9); assert is_copy_of(d, m)
    auto delta = batch_mean - mean_;  // LOOKALIKE: tensor-alias-then-mutate -- subtraction makes a new tensor
    mean_.add_(delta, momentum_);
    var_.mul_(1.0 - momentum_).add_(batch_var + delta * delta * (1.0 - momentum_), momentum_);
  }

  torch::Tensor threshold() const {
    torch::Tensor thr = mean_;
    // FACT: m = torch.zeros(()); thr = m; thr += 3.0; assert shares_storage(m, thr) and m.item() == 3.0
    thr += k_ * var_.sqrt();  // EXPECT: tensor-alias-then-mutate
    return thr;
  }

  torch::Tensor z_score(const torch::Tensor& scores) const {
    // FACT: m = torch.zeros(()); z = (torch.randn(4) - m).to(torch.float); assert is_copy_of(z, m)
    auto z = (scores - mean_).to(torch::kFloat);  // LOOKALIKE: tensor-alias-then-mutate -- the difference is a fresh tensor
    z.div_(var_.sqrt() + 1e-6);
    return z;
  }

  void to(torch::Device d) {
    mean_ = mean_.to(d);
    var_ = var_.to(d);
  }

 private:
  double momentum_, k_, clip_;
  torch::Tensor mean_, var_;
};

// One-class objective: pull normal sets' scores towards zero (Deep SVDD style, on a scalar).
void train(DeepSets& model, ScoreStats& stats, std::vector<SetBatch>& loader, torch::optim::Optimizer& opt,
           int epochs) {
  model->train();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    double epoch_loss = 0.0;
    int64_t steps = 0;
    for (auto& batch : loader) {
      auto mask = length_mask(batch.lengths, batch.x.size(1));
      auto scores = model->forward(batch.x, mask);
      auto loss = scores.pow(2).mean();
      stats.update(scores);
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.item<double>();  // LOOKALIKE: tensor-graph-kept-across-iterations -- a host double, no graph
      ++steps;
    }
    std::printf("epoch %d loss %.5f\n", epoch, epoch_loss / std::max<int64_t>(steps, 1));
  }
}

struct EvalResult {
  double mean_score = 0.0;
  double precision = 0.0;
  double recall = 0.0;
  torch::Tensor permille;
};

EvalResult evaluate(DeepSets& model, ScoreStats& stats, const std::vector<SetBatch>& batches) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  stats.to(device);
  auto thr = stats.threshold();

  int64_t total = 0;
  for (const auto& b : batches) total += b.x.size(0);
  auto permille = torch::zeros({total}, torch::kInt);
  auto rounded = torch::zeros({total}, torch::kInt);
  double score_sum = 0.0;
  auto tp = torch::zeros({}, torch::TensorOptions(torch::kLong).device(device));
  auto fp = torch::zeros_like(tp), fn = torch::zeros_like(tp);
  int64_t offset = 0;
  for (const auto& b : batches) {
    auto x = b.x.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
    auto lengths = b.lengths.to(device);
    auto steps = torch::arange(x.size(1), torch::kLong);
    auto mask = steps.unsqueeze(0) < lengths.unsqueeze(1);  // EXPECT: tensor-device-mismatch
    auto scores = model->forward(x, mask);
    auto prob = torch::sigmoid(scores);
    prob.mul_(1000.0);  // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard, nothing recorded
    const auto n = x.size(0);
    permille.narrow(0, offset, n).copy_(prob);  // EXPECT: tensor-copy-narrowing
    rounded.narrow(0, offset, n).copy_(prob.round());  // LOOKALIKE: tensor-copy-narrowing -- whole numbers after round()
    auto flagged = scores > thr;
    auto truth = b.label.to(device).to(torch::kBool);
    tp += (flagged & truth).sum();
    fp += (flagged & ~truth).sum();
    fn += (~flagged & truth).sum();
    score_sum += scores.sum().item<double>();  // EXPECT: tensor-sync-in-loop
    offset += n;
  }
  EvalResult r;
  r.mean_score = score_sum / std::max<int64_t>(total, 1);
  auto tp_h = tp.item<double>(), fp_h = fp.item<double>(), fn_h = fn.item<double>();
  r.precision = tp_h / std::max(tp_h + fp_h, 1.0);
  r.recall = tp_h / std::max(tp_h + fn_h, 1.0);
  r.permille = rounded;
  return r;
}

int main() {
  ScorerOptions opts;
  DeepSets model(opts);
  ScoreStats stats(opts);
  std::vector<SetBatch> train_sets, test_sets;
  for (int i = 0; i < 50; ++i) {
    const int64_t B = 64, N = 20 + i % 7;
    auto lengths = torch::randint(1, N + 1, {B}, torch::kLong);
    train_sets.push_back({torch::randn({B, N, opts.in_dim}), lengths, torch::zeros({B}, torch::kLong)});
    test_sets.push_back({torch::randn({B, N, opts.in_dim}) * 1.5, lengths,
                         torch::randint(0, 2, {B}, torch::kLong)});
  }
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  train(model, stats, train_sets, opt, /*epochs=*/3);
  auto res = evaluate(model, stats, test_sets);
  std::cout << "precision " << res.precision << " recall " << res.recall << "\n";
}
