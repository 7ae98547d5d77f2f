// Monte-Carlo dropout (Gal & Ghahramani 2016) for a diabetic-retinopathy grader working on
// precomputed fundus embeddings. The dropout layers keep sampling at test time; T stochastic
// passes give a predictive distribution per image, from which we take the predictive entropy and
// the mutual information (BALD). Active learning sends the most uncertain pool images to the
// human graders each round; a reliability diagram checks calibration on the held-out site.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <vector>

struct McConfig {
  int64_t in_dim = 1024, hidden = 512, n_grades = 5;
  double p_drop = 0.25, lr = 1e-3, weight_decay = 1e-4;
  int64_t passes = 30, n_bins = 15, query_size = 128, rounds = 10, epochs = 20, batch_size = 64;
  int64_t log_every = 50;
  std::vector<float> grade_costs = {1.f, 1.f, 2.f, 4.f, 4.f}; // missing a severe grade costs more
  std::vector<float> site_prior = {0.55f, 0.15f, 0.15f, 0.10f, 0.05f};
  std::vector<float> init_prior = {0.70f, 0.10f, 0.12f, 0.05f, 0.03f};
};

struct GraderImpl : torch::nn::Module {
  explicit GraderImpl(const McConfig &cfg) {
    fc1 = register_module("fc1", torch::nn::Linear(cfg.in_dim, cfg.hidden));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.hidden, cfg.hidden));
    head = register_module("head", torch::nn::Linear(cfg.hidden, cfg.n_grades));
    drop1 = register_module("drop1", torch::nn::Dropout(cfg.p_drop));
    drop2 = register_module("drop2", torch::nn::Dropout(cfg.p_drop));
    // Start the head at the screening population's log-prior: less over-confidence early on.
    auto prior = torch::tensor(cfg.init_prior);
    {
      torch::NoGradGuard no_grad;
      // FACT: l = torch.nn.Linear(4, 5); exec('with torch.no_grad(): l.bias.copy_(torch.log(torch.full((5,), 0.2)))'); assert l.bias.is_leaf and l.bias.requires_grad
      head->bias.copy_(prior.log()); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = drop1(torch::relu(fc1(x)));
    h = drop2(torch::relu(fc2(h)));
    return head(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
  torch::nn::Dropout drop1{nullptr}, drop2{nullptr};
};
TORCH_MODULE(Grader);

// eval() everywhere else, but the dropout layers keep sampling.
void enable_mc_dropout(torch::nn::Module &model) {
  model.eval();
  for (auto &m : model.modules(/*include_self=*/false))
    if (auto *d = m->as<torch::nn::Dropout>())
      d->train();
}

// Entropy over the last dim of a probability tensor of any rank.
torch::Tensor entropy_of(const torch::Tensor &probs) {
  auto p = probs.clone(); // EXPECT: tensor-unnecessary-clone -- overwritten at once: probs.clamp_min(1e-12) makes the same tensor in one pass
  p.clamp_min_(1e-12);
  return -(probs * p.log()).sum(-1);
}

struct McPrediction {
  torch::Tensor mean_probs;  // [N, G]
  torch::Tensor entropy;     // [N] H[E_t p_t]
  torch::Tensor mutual_info; // [N] H[E_t p_t] - E_t H[p_t]
  torch::Tensor vote_ratio;  // [N] share of passes that agree with the modal grade
};

class McPredictor {
public:
  McPredictor(Grader model, int64_t passes, torch::Device device)
      : model_(std::move(model)), passes_(passes), device_(device) {}

  McPrediction predict(const torch::Tensor &features) {
    torch::NoGradGuard no_grad;
    enable_mc_dropout(*model_);
    std::vector<torch::Tensor> samples;
    samples.reserve(passes_);
    for (int64_t t = 0; t < passes_; ++t) {
      auto logits = model_->forward(features.to(device_)); // EXPECT: tensor-clone-in-loop -- the same host batch is copied to the device on every one of the T passes
      samples.push_back(torch::softmax(logits, -1)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: the passes keep no graph
    }
    auto probs = torch::stack(samples); // [T, N, G]
    McPrediction out;
    out.mean_probs = probs.mean(0);
    out.entropy = entropy_of(out.mean_probs);
    out.mutual_info = out.entropy - entropy_of(probs).mean(0);
    auto votes = probs.argmax(-1); // [T, N]
    auto modal = std::get<0>(votes.mode(0));
    out.vote_ratio = votes.eq(modal.unsqueeze(0)).to(torch::kFloat).mean(0);
    model_->train();
    return out;
  }

private:
  Grader model_;
  int64_t passes_;
  torch::Device device_;
};

void train_grader(Grader &model, const torch::Tensor &x, const torch::Tensor &y, const McConfig &cfg) {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  const int64_t n = x.size(0);
  auto smoothed = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(n);
    for (int64_t s = 0; s < n; s += cfg.batch_size) {
      auto idx = perm.narrow(0, s, std::min(cfg.batch_size, n - s));
      auto xb = x.index_select(0, idx).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different minibatch every step
      auto yb = y.index_select(0, idx).to(device);
      auto loss = torch::nn::functional::cross_entropy(model->forward(xb), yb);
      opt.zero_grad();
      loss.backward();
      opt.step();
      // FACT: m = torch.nn.Linear(3, 2); s = torch.zeros(()); exec('for _ in range(3):\n l = m(torch.randn(4, 3)).pow(2).mean(); l.backward(); s = 0.98 * s + 0.02 * l'); assert s.requires_grad and kept_nodes(s) >= 3 * 3
      smoothed = 0.98 * smoothed + 0.02 * loss; // EXPECT: tensor-graph-kept-across-iterations -- the smoothed loss chains every step's graph to the next one
      if (++step % cfg.log_every == 0)
        std::printf("step %lld  nll %.4f\n", static_cast<long long>(step), loss.item<double>()); // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
  }
  std::printf("smoothed nll %.4f after %lld steps\n", smoothed.item<double>(), static_cast<long long>(step));
}

double test_accuracy(Grader &model, const torch::Tensor &x, const torch::Tensor &y, int64_t batch) {
  torch::NoGradGuard no_grad;
  model->eval();
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  int64_t correct = 0;
  for (int64_t s = 0; s < x.size(0); s += batch) {
    const auto len = std::min(batch, x.size(0) - s);
    auto logits = model->forward(x.narrow(0, s, len).to(device));
    correct += logits.argmax(-1).eq(y.narrow(0, s, len).to(device)).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU after every batch only to add up a count
  }
  return static_cast<double>(correct) / static_cast<double>(x.size(0));
}

struct Reliability {
  std::vector<double> conf, acc;
  std::vector<int64_t> count;
  double ece = 0;
};

Reliability reliability_bins(const torch::Tensor &mean_probs, const torch::Tensor &labels, int64_t n_bins) {
  auto probs = mean_probs.cpu(); // the bins are read one by one on the host
  auto top = probs.max(-1);
  auto conf = std::get<0>(top);
  auto correct = std::get<1>(top).eq(labels.cpu()).to(torch::kFloat);
  const double n = static_cast<double>(conf.size(0));
  Reliability r;
  for (int64_t b = 0; b < n_bins; ++b) {
    const double lo = static_cast<double>(b) / n_bins, hi = static_cast<double>(b + 1) / n_bins;
    auto in_bin = conf.gt(lo).logical_and(conf.le(hi));
    const int64_t count = in_bin.sum().item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- the confidences were copied to the host once, before the loop
    r.count.push_back(count);
    if (count == 0) {
      r.conf.push_back(0.0);
      r.acc.push_back(0.0);
      continue;
    }
    const double c = conf.masked_select(in_bin).mean().item<double>();
    const double a = correct.masked_select(in_bin).mean().item<double>();
    r.conf.push_back(c);
    r.acc.push_back(a);
    r.ece += std::abs(a - c) * static_cast<double>(count) / n;
  }
  return r;
}

// The referral sheet lists integer grades: the modal class, and the expected grade under the MC mean.
std::pair<torch::Tensor, torch::Tensor> report_grades(const McPrediction &pred) {
  const auto N = pred.mean_probs.size(0), G = pred.mean_probs.size(1);
  auto hard = torch::empty({N}, torch::kLong);
  hard.copy_(pred.mean_probs.argmax(-1)); // LOOKALIKE: tensor-copy-narrowing -- argmax is int64 already
  auto p = pred.mean_probs.to(torch::kDouble);
  // FACT: p = torch.rand(3, 5); q = p.to(torch.double); q.mul_(torch.arange(5, dtype=torch.double)); assert is_copy_of(q, p)
  p.mul_(torch::arange(G, p.options())); // LOOKALIKE: tensor-alias-then-mutate -- to(kDouble) of the float32 mean is a copy: the prediction is untouched
  auto expected = p.sum(-1);
  auto ordinal = torch::empty({N}, torch::kLong);
  // FACT: out = torch.empty(2, dtype=torch.long); out.copy_(torch.tensor([2.97, 0.6], dtype=torch.double)); assert out.tolist() == [2, 0]
  ordinal.copy_(expected); // EXPECT: tensor-copy-narrowing -- the expected grade is truncated, not rounded: 2.97 becomes grade 2
  return {hard, ordinal};
}

// BALD-style acquisition: indices of the k highest scores among the pool images not labeled yet.
torch::Tensor select_queries(const torch::Tensor &scores, const torch::Tensor &labeled, int64_t k) {
  auto s = scores;
  // FACT: a = torch.rand(5); s = a; s.masked_fill_(torch.tensor([1, 0, 0, 1, 0]).bool(), float('-inf')); assert shares_storage(s, a) and torch.isinf(a).any()
  s.masked_fill_(labeled, -std::numeric_limits<float>::infinity()); // EXPECT: tensor-alias-then-mutate -- s is the caller's acquisition tensor: its mean is logged as -inf afterwards
  return std::get<1>(s.topk(std::min<int64_t>(k, s.size(0))));
}

// pool_x / oracle_y / test_x / test_y live on the host; the oracle answers stand in for the graders.
void active_learning(Grader &model, const torch::Tensor &pool_x, const torch::Tensor &oracle_y,
                     const torch::Tensor &test_x, const torch::Tensor &test_y, const McConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  McPredictor predictor(model, cfg.passes, device);
  const int64_t n_pool = pool_x.size(0);
  auto labeled = torch::zeros({n_pool}, torch::TensorOptions().dtype(torch::kBool).device(device));
  auto seed = torch::randperm(n_pool, torch::TensorOptions().dtype(torch::kLong).device(device));
  labeled.index_fill_(0, seed.narrow(0, 0, cfg.query_size), true);
  auto costs = torch::tensor(cfg.grade_costs).to(device); // [G]

  for (int64_t round = 0; round < cfg.rounds; ++round) {
    auto idx = labeled.nonzero().squeeze(1).cpu();
    train_grader(model, pool_x.index_select(0, idx), oracle_y.index_select(0, idx), cfg);

    auto pred = predictor.predict(pool_x);
    auto risk = (pred.mean_probs * costs).sum(-1); // LOOKALIKE: tensor-device-mismatch -- the costs were moved to the device once, before the rounds
    auto acq = pred.mutual_info * risk;
    // FACT: m = torch.zeros(6, dtype=torch.bool); b = m.clone(); m.index_fill_(0, torch.tensor([1, 4]), True); assert is_copy_of(b, m) and int((m != b).sum()) == 2
    auto before = labeled.clone(); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- labeled is written below while the snapshot lives
    auto picked = select_queries(acq, labeled, cfg.query_size);
    labeled.index_fill_(0, picked, true);
    std::cout << "round " << round << ": " << (labeled != before).sum().item<int64_t>() << " new labels, mean acquisition " << acq.mean().item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per round, after a whole training run
  }

  std::printf("test accuracy (dropout off) %.4f\n", test_accuracy(model, test_x, test_y, cfg.batch_size));
  auto test_pred = predictor.predict(test_x);
  auto rel = reliability_bins(test_pred.mean_probs, test_y, cfg.n_bins);
  std::printf("ECE %.4f over %lld bins\n", rel.ece, static_cast<long long>(cfg.n_bins));

  // Label shift: the screening site sees more severe cases than the training pool.
  auto train_prior = torch::bincount(oracle_y, {}, cfg.n_grades).to(torch::kFloat);
  // FACT: c = torch.bincount(torch.tensor([0, 2, 2]), minlength=5); f = c.to(torch.float); f /= f.sum(); assert is_copy_of(f, c) and c.dtype == torch.int64
  train_prior /= train_prior.sum(); // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of int64 counts is a copy
  auto site_prior = torch::tensor(cfg.site_prior);
  auto shifted = test_pred.mean_probs * (site_prior / train_prior); // EXPECT: tensor-device-mismatch -- the priors are [G] host tensors, the MC mean is on the GPU
  shifted = shifted / shifted.sum(-1, true);
  auto grades = report_grades(McPrediction{shifted, entropy_of(shifted), test_pred.mutual_info, test_pred.vote_ratio});
  auto uncertain = (test_pred.vote_ratio < 0.6).sum().item<int64_t>();
  std::cout << "referable (grade >= 2): " << grades.first.ge(2).sum().item<int64_t>() << ", low agreement: " << uncertain
            << "\n";
}
