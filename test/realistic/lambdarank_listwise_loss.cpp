// LambdaRank training of a listwise document scorer.
//
// Queries are padded to a fixed list length; the pairwise RankNet loss is
// weighted by the |delta NDCG| a swap of the two documents would cause.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct RankConfig {
  int64_t num_features = 46;
  int64_t list_size = 32;
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t batch_queries = 16;
  int64_t ndcg_k = 10;
  double sigma = 1.0;
  double score_l2 = 1e-4;
  double max_grade = 4.0;
  double lr = 1e-3;
  int epochs = 10;
};

struct QueryGroup {
  std::vector<std::vector<double>> docs;  // as parsed from the LETOR file
  std::vector<double> grades;
};

struct ListBatch {
  torch::Tensor features;
  torch::Tensor labels;
  torch::Tensor mask;
};

struct FeatureStats {
  torch::Tensor mean;
  torch::Tensor inv_std;
};

ListBatch collate(const std::vector<QueryGroup>& groups, size_t begin, size_t end,
                  const RankConfig& cfg) {
  const int64_t B = static_cast<int64_t>(end - begin);
  const int64_t L = cfg.list_size, D = cfg.num_features;
  ListBatch out;
  out.features = torch::zeros({B, L, D});
  out.labels = torch::zeros({B, L});
  out.mask = torch::zeros({B, L}, torch::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const QueryGroup& g = groups[begin + b];
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(g.docs.size()), L);
    std::vector<float> flat;
    flat.reserve(n * D);
    for (int64_t i = 0; i < n; ++i)
      for (double v : g.docs[i]) flat.push_back(static_cast<float>(v));
    auto rows = torch::from_blob(flat.data(), {n, D}, torch::kFloat);
    out.features[b].narrow(0, 0, n).copy_(rows);  // LOOKALIKE: tensor-copy-narrowing -- rows were converted to float on the host, same dtype
    std::vector<double> grades(g.grades.begin(), g.grades.begin() + n);
    out.labels[b].narrow(0, 0, n).copy_(torch::tensor(grades));  // LOOKALIKE: tensor-copy-narrowing -- torch::tensor of a std::vector<double> is float32 in C++ (compute_desired_dtype in TensorDataContainer.h), as labels are
    out.mask[b].narrow(0, 0, n).fill_(true);
  }
  return out;
}

FeatureStats fit_stats(const std::vector<QueryGroup>& train, int64_t D) {
  std::vector<double> flat;
  int64_t rows = 0;
  for (const auto& g : train)
    for (const auto& d : g.docs) {
      flat.insert(flat.end(), d.begin(), d.end());
      ++rows;
    }
  auto raw = torch::from_blob(flat.data(), {rows, D}, torch::kFloat64);
  auto x = raw.to(torch::kFloat);
  auto mu = x.mean(0);
  // FACT: a = torch.rand(6, 4, dtype=torch.float64); assert is_copy_of(a.to(torch.float32), a)
  x.sub_(mu);  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of a double tensor allocates, flat is untouched
  auto sd = x.pow(2).mean(0).sqrt_().clamp_min_(1e-6);
  return {mu, sd.reciprocal()};
}

struct ScorerImpl : torch::nn::Module {
  explicit ScorerImpl(const RankConfig& cfg)
      : embed(register_module("embed", torch::nn::Linear(cfg.num_features, cfg.hidden))),
        attn(register_module("attn", torch::nn::MultiheadAttention(cfg.hidden, cfg.heads))),
        mix(register_module("mix", torch::nn::Linear(2 * cfg.hidden, cfg.hidden))),
        out(register_module("out", torch::nn::Linear(cfg.hidden, 1))),
        drop(register_module("drop", torch::nn::Dropout(0.1))) {
    torch::NoGradGuard no_grad;
    out->weight.normal_(0.0, 1e-3);
    out->bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t B = x.size(0), L = x.size(1);
    auto h = torch::relu(embed(x));
    auto seq = h.transpose(0, 1);
    auto ctx = std::get<0>(attn(seq, seq, seq, mask.logical_not()));
    // FACT: c = torch.rand(5, 2, 8); assert is_copy_of(c.transpose(0, 1).reshape(10, -1), c)
    auto ctx_flat = ctx.transpose(0, 1).reshape({B * L, -1});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: h = torch.relu(torch.rand(2, 5, 8)); assert is_view_of(h.reshape(10, -1), h)
    auto h_flat = h.reshape({B * L, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- h is a fresh contiguous relu output, this is a view
    auto z = torch::relu(mix(torch::cat({h_flat, ctx_flat}, 1)));
    return out(drop(z)).view({B, L});
  }

  torch::nn::Linear embed;
  torch::nn::MultiheadAttention attn;
  torch::nn::Linear mix, out;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Scorer);

torch::Tensor discounts(int64_t n, const torch::TensorOptions& opts) {
  return 1.0 / torch::log2(torch::arange(2, n + 2, opts));
}

torch::Tensor gains_of(const torch::Tensor& labels, double max_grade) {
  auto g = labels.clone().clamp_(0.0, max_grade);  // EXPECT: tensor-unnecessary-clone
  return torch::pow(2.0, g) - 1.0;
}

torch::Tensor ideal_dcg(const torch::Tensor& gains, int64_t k) {
  auto sorted = std::get<0>(gains.sort(/*dim=*/1, /*descending=*/true));
  k = std::min<int64_t>(k, gains.size(1));
  return (sorted.narrow(1, 0, k) * discounts(k, gains.options())).sum(1);  // LOOKALIKE: tensor-device-mismatch -- discounts are built with gains.options(), same device
}

torch::Tensor lambdarank_loss(const torch::Tensor& scores, const ListBatch& batch,
                              const RankConfig& cfg) {
  const int64_t B = scores.size(0);
  auto reg = cfg.score_l2 * scores.pow(2).masked_select(batch.mask).mean();

  auto gains = gains_of(batch.labels, cfg.max_grade);
  auto idcg = ideal_dcg(gains, cfg.list_size).clamp_min(1e-10);

  // current positions come from the scores; padded documents go to the bottom
  auto s = scores.detach();
  // FACT: assert backward_fails(lambda: (lambda s: (lambda r: (s.detach().masked_fill_(s.detach() < 0, -1e9), r.backward()))(s.pow(2).mean()))(torch.randn(2, 4, requires_grad=True) * 1))
  s.masked_fill_(batch.mask.logical_not(), -1e9);  // EXPECT: tensor-inplace-on-detached
  auto ranks = s.argsort(1, /*descending=*/true).argsort(1, /*descending=*/false);
  auto disc = 1.0 / torch::log2(ranks.to(scores.scalar_type()) + 2.0);

  auto gain_diff = gains.unsqueeze(2) - gains.unsqueeze(1);
  auto disc_diff = disc.unsqueeze(2) - disc.unsqueeze(1);
  auto delta = (gain_diff * disc_diff).abs() / idcg.view({B, 1, 1});

  auto valid = (batch.labels.unsqueeze(2) > batch.labels.unsqueeze(1)) &
               batch.mask.unsqueeze(2) & batch.mask.unsqueeze(1);
  auto diff = scores.unsqueeze(2) - scores.unsqueeze(1);
  // FACT: s = torch.randn(2, 4, requires_grad=True); d = s.unsqueeze(2) - s.unsqueeze(1); d.mul_(2.0); torch.nn.functional.logsigmoid(d).sum().backward()
  diff.mul_(cfg.sigma);  // LOOKALIKE: tensor-inplace-on-saved -- sub saves neither operand, diff is not yet used
  auto p = torch::sigmoid(diff);
  // FACT: assert backward_fails(lambda: (lambda p: (p.clamp_min_(1e-8), (-torch.log(p)).sum().backward()))(torch.sigmoid(torch.randn(2, 4, 4, requires_grad=True))))
  p.clamp_min_(1e-8);  // EXPECT: tensor-inplace-on-saved
  auto pair_loss = -torch::log(p) * delta;
  auto flat_loss = pair_loss.reshape({B, -1});
  auto flat_valid = valid.reshape({B, -1}).to(flat_loss.scalar_type());
  auto per_query = (flat_loss * flat_valid).sum(1) / flat_valid.sum(1).clamp_min(1.0);
  return per_query.mean() + reg;
}

// The lambdas LambdaMART would fit: the net push each document receives.
torch::Tensor explicit_lambdas(const torch::Tensor& scores, const ListBatch& batch,
                               double sigma) {
  torch::NoGradGuard no_grad;
  auto valid = (batch.labels.unsqueeze(2) > batch.labels.unsqueeze(1)) &
               batch.mask.unsqueeze(2) & batch.mask.unsqueeze(1);
  auto diff = scores.unsqueeze(2) - scores.unsqueeze(1);
  auto lam = -sigma * torch::sigmoid(-sigma * diff);
  lam.mul_(valid);
  // FACT: assert raises(lambda: (lambda a: a.sub_(a.transpose(1, 2)))(torch.rand(2, 4, 4)), "single memory location")
  lam.sub_(lam.transpose(1, 2));  // EXPECT: tensor-inplace-overlap
  return lam.sum(2);
}

double evaluate(Scorer& model, std::vector<ListBatch>& batches, const FeatureStats& st,
                const RankConfig& cfg, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto disc_cpu = discounts(cfg.ndcg_k, torch::kFloat);
  auto total = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t queries = 0;
  for (auto& batch : batches) {
    auto feats = batch.features;
    // FACT: a = torch.rand(2, 5, 3); b = a; b.sub_(a.mean(1, True)); assert shares_storage(a, b) and torch.equal(a, b)
    feats.sub_(st.mean).mul_(st.inv_std);  // EXPECT: tensor-alias-then-mutate
    auto mask = batch.mask.to(device);
    auto labels = batch.labels.to(device);
    auto scores = model(feats.to(device), mask).detach();
    scores.masked_fill_(mask.logical_not(), -1e9);  // LOOKALIKE: tensor-inplace-on-detached -- grad mode is off and the model output has no other user
    auto top = std::get<1>(scores.topk(cfg.ndcg_k, 1));
    auto gains = torch::pow(2.0, labels.gather(1, top)) - 1.0;
    auto disc = disc_cpu.to(device);  // EXPECT: tensor-clone-in-loop
    auto dcg = (gains * disc).sum(1);
    auto idcg = ideal_dcg(gains_of(labels, cfg.max_grade), cfg.ndcg_k);
    auto ndcg = dcg / idcg.clamp_min(1e-10);
    auto has_relevant = std::get<0>(batch.labels.max(1)) > 0;
    total += (ndcg * has_relevant).sum();  // EXPECT: tensor-device-mismatch
    queries += has_relevant.sum().item<int64_t>();
  }
  return total.item<double>() / std::max<int64_t>(queries, 1);  // LOOKALIKE: tensor-sync-in-loop -- read once after the loop
}

std::vector<QueryGroup> synthetic_queries(int n, const RankConfig& cfg, std::mt19937& rng) {
  std::normal_distribution<double> noise(0.0, 1.0);
  std::uniform_int_distribution<int> len(8, static_cast<int>(cfg.list_size) + 8);
  std::vector<double> w(cfg.num_features);
  for (auto& v : w) v = noise(rng);
  std::vector<QueryGroup> out(n);
  for (auto& q : out) {
    const int docs = len(rng);
    for (int i = 0; i < docs; ++i) {
      std::vector<double> f(cfg.num_features);
      double score = 0.0;
      for (int64_t j = 0; j < cfg.num_features; ++j) {
        f[j] = noise(rng) * 3.0 + 10.0;
        score += w[j] * (f[j] - 10.0);
      }
      q.docs.push_back(std::move(f));
      q.grades.push_back(std::clamp(std::round(score / 8.0 + 1.0), 0.0, cfg.max_grade));
    }
  }
  return out;
}

int main() {
  RankConfig cfg;
  torch::manual_seed(7);
  std::mt19937 rng(7);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto train_q = synthetic_queries(512, cfg, rng);
  auto valid_q = synthetic_queries(128, cfg, rng);
  auto stats = fit_stats(train_q, cfg.num_features);

  std::vector<ListBatch> train_batches, valid_batches;
  for (size_t i = 0; i + cfg.batch_queries <= train_q.size(); i += cfg.batch_queries) {
    auto b = collate(train_q, i, i + cfg.batch_queries, cfg);
    b.features = (b.features - stats.mean) * stats.inv_std;
    train_batches.push_back(b);
  }
  for (size_t i = 0; i + cfg.batch_queries <= valid_q.size(); i += cfg.batch_queries)
    valid_batches.push_back(collate(valid_q, i, i + cfg.batch_queries, cfg));

  Scorer model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(1e-5));

  std::map<std::string, torch::Tensor> best;
  double best_ndcg = -1.0;
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::shuffle(train_batches.begin(), train_batches.end(), rng);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    auto lambda_mag = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto& cpu_batch : train_batches) {
      ListBatch batch{cpu_batch.features.to(device), cpu_batch.labels.to(device),  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
                      cpu_batch.mask.to(device)};
      auto scores = model(batch.features, batch.mask);
      auto loss = lambdarank_loss(scores, batch, cfg);
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 5.0);
      opt.step();
      // FACT: l = (torch.rand(3, requires_grad=True) * 2).sum(); t = torch.zeros(()); t += l; assert t.requires_grad and kept_nodes(t) >= 3
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      lambda_mag += explicit_lambdas(scores.detach(), batch, cfg.sigma).abs().mean();  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard from detached scores
    }
    const double ndcg = evaluate(model, valid_batches, stats, cfg, device);
    std::printf("epoch %d  loss %.4f  |lambda| %.4f  ndcg@%ld %.4f\n", epoch,
                epoch_loss.item<double>() / train_batches.size(),
                lambda_mag.item<double>() / train_batches.size(), static_cast<long>(cfg.ndcg_k), ndcg);
    if (ndcg > best_ndcg) {
      best_ndcg = ndcg;
      for (const auto& kv : model->named_parameters())
        best[kv.key()] = kv.value().detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- snapshot of parameters that keep training
    }
  }
  std::printf("best ndcg@%ld %.4f\n", static_cast<long>(cfg.ndcg_k), best_ndcg);
  return 0;
}
