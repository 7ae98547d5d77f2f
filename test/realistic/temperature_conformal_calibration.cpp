// Post-hoc calibration of a small classifier.
//
// 1. train an MLP on synthetic overlapping clusters (it ends up overconfident),
// 2. fit a single temperature on a held-out calibration split with LBFGS,
// 3. build split-conformal prediction sets from the calibrated probabilities and
//    report coverage / set size on the test split.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <limits>
#include <vector>

struct CalibConfig {
  int64_t num_features = 32;
  int64_t num_classes = 10;
  int64_t hidden = 128;
  int64_t n_train = 8192;
  int64_t n_calib = 2048;
  int64_t n_test = 2048;
  int64_t batch_size = 256;
  int64_t epochs = 15;
  double lr = 1e-3;
  double self_distill = 0.1;
  double cluster_noise = 2.5;
  double alpha = 0.1;  // target miscoverage
  int64_t ece_bins = 15;
  int64_t lbfgs_rounds = 10;
  double tol = 1e-7;
};

struct Split {
  torch::Tensor x, y;
};

Split make_split(int64_t n, const torch::Tensor& centers, double noise) {
  auto y = torch::randint(0, centers.size(0), {n}, torch::kLong);
  auto x = centers.index_select(0, y) + noise * torch::randn({n, centers.size(1)});
  return {x, y};
}

struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl(int64_t in, int64_t hidden, int64_t classes)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        head(register_module("head", torch::nn::Linear(hidden, classes))),
        drop(register_module("drop", torch::nn::Dropout(0.2))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1->forward(x));
    x = drop->forward(torch::relu(fc2->forward(x)));
    return head->forward(x);
  }

  torch::nn::Linear fc1, fc2, head;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Classifier);

struct TemperatureScalerImpl : torch::nn::Module {
  TemperatureScalerImpl() { temperature = register_parameter("temperature", torch::ones({1})); }

  void reset(double t) {
    torch::NoGradGuard no_grad;
    temperature.fill_(t);  // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& logits) { return logits / temperature; }

  torch::Tensor temperature;
};
TORCH_MODULE(TemperatureScaler);

void train_classifier(Classifier& net, const Split& train, const CalibConfig& cfg,
                      torch::Device device) {
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr));
  const auto n = train.x.size(0);
  net->train();
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(n, torch::kLong);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t steps = 0;
    for (int64_t off = 0; off < n; off += cfg.batch_size) {
      auto idx = perm.slice(0, off, std::min(off + cfg.batch_size, n));
      auto xb = train.x.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different minibatch every step
      auto yb = train.y.index_select(0, idx).to(device);
      auto logits = net->forward(xb);
      auto probs = torch::softmax(logits, 1);
      // self-distillation: pull towards a smoothed version of the model's own prediction
      // FACT: W = torch.randn(4, 3, requires_grad=True); p = torch.softmax(torch.randn(6, 3) @ W.t(), 1); st = p.detach(); st.mul_(0.9).add_(0.025); assert backward_fails(lambda: (-(st * torch.log(p)).sum(1).mean()).backward())
      auto soft_targets = probs.detach();
      soft_targets.mul_(1.0 - cfg.self_distill).add_(cfg.self_distill / cfg.num_classes);  // EXPECT: tensor-inplace-on-detached
      auto ce = torch::nll_loss(torch::log(probs), yb);
      auto distill = -(soft_targets * torch::log(probs)).sum(1).mean();
      auto loss = ce + 0.5 * distill;
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph is kept
      ++steps;
    }
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / steps << "\n";
  }
}

double accuracy(Classifier& net, const Split& split, int64_t batch, torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  int64_t correct = 0;
  const auto n = split.x.size(0);
  for (int64_t off = 0; off < n; off += batch) {
    const auto len = std::min(batch, n - off);
    auto pred = net->forward(split.x.narrow(0, off, len).to(device)).argmax(1);
    auto hit = pred.eq(split.y.narrow(0, off, len));  // EXPECT: tensor-device-mismatch
    correct += hit.sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
  }
  return static_cast<double>(correct) / n;
}

struct Collected {
  torch::Tensor logits, labels, preds;
};

// Runs the frozen classifier once over a split and keeps what calibration needs.
Collected collect_logits(Classifier& net, const Split& split, int64_t batch,
                         torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  const auto n = split.x.size(0);
  const auto k = net->head->weight.size(0);
  auto on_dev = torch::TensorOptions().device(device);
  auto logits = torch::empty({n, k}, on_dev);
  auto labels = torch::empty({n}, on_dev.dtype(torch::kInt));
  auto preds = torch::empty({n}, on_dev.dtype(torch::kLong));
  for (int64_t off = 0; off < n; off += batch) {
    const auto len = std::min(batch, n - off);
    auto out = net->forward(split.x.narrow(0, off, len).to(device));
    logits.narrow(0, off, len).copy_(out);
    labels.narrow(0, off, len).copy_(split.y.narrow(0, off, len));  // EXPECT: tensor-copy-narrowing
    preds.narrow(0, off, len).copy_(out.argmax(1));  // LOOKALIKE: tensor-copy-narrowing -- argmax is int64, same as the buffer
  }
  return {logits, labels, preds};
}

// Rescales logits by a fitted temperature for reporting.
torch::Tensor apply_temperature(torch::Tensor logits, double t) {
  // FACT: a = torch.randn(6, 4); b = a; b.div_(1.7); assert shares_storage(a, b) and b is a
  logits.div_(t);  // EXPECT: tensor-alias-then-mutate
  return logits;
}

double expected_calibration_error(const torch::Tensor& logits, const torch::Tensor& labels,
                                  int64_t n_bins) {
  torch::NoGradGuard no_grad;
  auto probs = torch::softmax(logits, 1);
  auto [conf, pred] = probs.max(1);
  auto correct = pred.eq(labels).to(conf.scalar_type());
  auto bins = (conf * n_bins).floor().clamp_max(n_bins - 1).to(torch::kLong);
  auto count = torch::zeros({n_bins}, conf.options()).scatter_add_(0, bins, torch::ones_like(conf));
  auto conf_sum = torch::zeros({n_bins}, conf.options()).scatter_add_(0, bins, conf);
  auto acc_sum = torch::zeros({n_bins}, conf.options()).scatter_add_(0, bins, correct);
  return ((conf_sum - acc_sum).abs().sum() / count.sum()).item<double>();
}

double fit_temperature(TemperatureScaler& scaler, const torch::Tensor& logits,
                       const torch::Tensor& labels, const CalibConfig& cfg) {
  scaler->reset(1.5);
  auto targets = labels.to(torch::kLong);
  torch::optim::LBFGS lbfgs(
      scaler->parameters(),
      torch::optim::LBFGSOptions(0.05).max_iter(50).line_search_fn("strong_wolfe"));
  std::vector<torch::Tensor> closure_losses;

  auto closure = [&]() -> torch::Tensor {
    lbfgs.zero_grad();
    auto scaled = scaler->forward(logits);
    // FACT: T = torch.ones(1, requires_grad=True); s = torch.randn(6, 4) / T; s.sub_(s.detach().amax(1, keepdim=True)); assert not backward_fails(lambda: torch.log_softmax(s, 1).sum().backward())
    scaled.sub_(scaled.detach().amax(1, true));  // LOOKALIKE: tensor-inplace-on-saved -- the division saves its operands, not its result
    auto log_probs = torch::log_softmax(scaled, 1);
    // FACT: T = torch.ones(1, requires_grad=True); lp = torch.log_softmax(torch.randn(6, 4) / T, 1); lp.clamp_min_(-30.0); assert backward_fails(lambda: torch.nn.functional.nll_loss(lp, torch.randint(0, 4, (6,))).backward())
    log_probs.clamp_min_(-30.0);  // EXPECT: tensor-inplace-on-saved
    auto loss = torch::nll_loss(log_probs, targets);
    loss.backward();
    closure_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    return loss;
  };

  double prev = std::numeric_limits<double>::infinity();
  for (int64_t round = 0; round < cfg.lbfgs_rounds; ++round) {
    double nll = lbfgs.step(closure).item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the value drives the convergence test
    scaler->temperature.clamp_(0.05, 20.0);  // EXPECT: tensor-inplace-on-leaf
    if (std::abs(prev - nll) < cfg.tol) break;
    prev = nll;
  }
  std::cout << "LBFGS closure evaluations: " << closure_losses.size() << "\n";
  return scaler->temperature.item<double>();
}

struct ConformalResult {
  double qhat = 0.0;
  double calib_coverage = 0.0;
  double coverage = 0.0;
  double avg_set_size = 0.0;
};

// Split conformal with the "1 - p(true class)" score.
ConformalResult split_conformal(const torch::Tensor& cal_logits, const torch::Tensor& cal_labels,
                                const torch::Tensor& test_logits,
                                const torch::Tensor& test_labels, double temperature,
                                const CalibConfig& cfg) {
  torch::NoGradGuard no_grad;
  ConformalResult res;
  const auto n = cal_logits.size(0);
  auto cal_targets = cal_labels.to(torch::kLong).unsqueeze(1);
  auto cal_probs = torch::softmax(cal_logits / temperature, 1);
  auto true_prob = cal_probs.gather(1, cal_targets);
  // FACT: p = torch.rand(8, 5); g = p.gather(1, torch.randint(0, 5, (8, 1))); s = g.flatten(); s.neg_().add_(1.0); assert is_view_of(s, g) and is_copy_of(s, p)
  auto scores = true_prob.flatten();  // LOOKALIKE: tensor-reshape-non-contiguous -- gather output is contiguous, flatten is a view
  scores.neg_().add_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- scores only aliases the temporary gather result
  auto sorted = scores.clone();  // EXPECT: tensor-unnecessary-clone
  sorted = std::get<0>(torch::sort(sorted));

  auto rank = static_cast<int64_t>(std::ceil((n + 1) * (1.0 - cfg.alpha))) - 1;
  rank = std::min(std::max<int64_t>(rank, 0), n - 1);
  auto qhat = sorted[rank].cpu();
  res.qhat = qhat.item<double>();

  // sanity check on the calibration split itself
  auto cal_sets = cal_probs >= (1.0 - qhat);  // LOOKALIKE: tensor-device-mismatch -- qhat is a 0-dim CPU tensor, allowed next to CUDA operands
  res.calib_coverage =
      cal_sets.gather(1, cal_targets).to(torch::kFloat).mean().item<double>();

  const auto n_test = test_logits.size(0);
  auto test_targets = test_labels.to(torch::kLong);
  auto covered = torch::zeros({}, test_logits.options());
  auto set_size = torch::zeros({}, test_logits.options());
  for (int64_t off = 0; off < n_test; off += cfg.batch_size) {
    const auto len = std::min(cfg.batch_size, n_test - off);
    auto probs = torch::softmax(test_logits.narrow(0, off, len) / temperature, 1);
    auto thresh = qhat.to(probs.device());  // EXPECT: tensor-clone-in-loop
    auto sets = probs >= (1.0 - thresh);
    auto in_set = sets.gather(1, test_targets.narrow(0, off, len).unsqueeze(1));
    covered = covered + in_set.sum();  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, no graph
    set_size = set_size + sets.sum();
  }
  res.coverage = covered.item<double>() / n_test;
  res.avg_set_size = set_size.item<double>() / n_test;
  return res;
}

int main() {
  torch::manual_seed(0);
  CalibConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto centers = 2.0 * torch::randn({cfg.num_classes, cfg.num_features});
  auto train = make_split(cfg.n_train, centers, cfg.cluster_noise);
  auto calib = make_split(cfg.n_calib, centers, cfg.cluster_noise);
  auto test = make_split(cfg.n_test, centers, cfg.cluster_noise);

  Classifier net(cfg.num_features, cfg.hidden, cfg.num_classes);
  net->to(device);
  train_classifier(net, train, cfg, device);
  std::cout << "test accuracy " << accuracy(net, test, cfg.batch_size, device) << "\n";

  auto cal = collect_logits(net, calib, cfg.batch_size, device);
  auto tst = collect_logits(net, test, cfg.batch_size, device);

  TemperatureScaler scaler;
  scaler->to(device);
  const double T = fit_temperature(scaler, cal.logits, cal.labels, cfg);
  std::cout << "fitted temperature " << T << "\n";

  auto scaled_test = apply_temperature(tst.logits, T);
  const double ece_after = expected_calibration_error(scaled_test, tst.labels, cfg.ece_bins);
  const double ece_before = expected_calibration_error(tst.logits, tst.labels, cfg.ece_bins);
  std::cout << std::fixed << std::setprecision(4) << "ECE before " << ece_before << " after "
            << ece_after << "\n";

  auto res = split_conformal(cal.logits, cal.labels, tst.logits, tst.labels, T, cfg);
  const double top1 = tst.preds.eq(tst.labels).to(torch::kFloat).mean().item<double>();
  std::cout << "qhat " << res.qhat << " calib coverage " << res.calib_coverage
            << " test coverage " << res.coverage << " (target " << 1.0 - cfg.alpha << ")"
            << " avg set size " << res.avg_set_size << " top-1 " << top1 << "\n";
  return 0;
}
