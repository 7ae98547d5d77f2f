// TransE knowledge-graph embeddings: margin ranking over corrupted triples,
// entity renormalisation after every update, filtered link-prediction eval.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;

struct KGConfig {
  int64_t num_entities = 40943;
  int64_t num_relations = 18;
  int64_t dim = 200;
  int64_t p_norm = 1;
  double margin = 4.0;
  double lr = 1e-3;
  int64_t batch_size = 1024;
  int64_t num_negatives = 32;
  int64_t epochs = 100;
  int64_t eval_batch = 256;
  int64_t log_every = 200;
};

class TransEImpl : public torch::nn::Module {
 public:
  explicit TransEImpl(const KGConfig& cfg) : cfg_(cfg) {
    ent = register_module("ent", torch::nn::Embedding(cfg.num_entities, cfg.dim));
    rel = register_module("rel", torch::nn::Embedding(cfg.num_relations, cfg.dim));
    const double bound = 6.0 / std::sqrt(static_cast<double>(cfg.dim));
    torch::nn::init::uniform_(ent->weight, -bound, bound);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own no-grad guard
    torch::nn::init::uniform_(rel->weight, -bound, bound);
    // Bordes et al.: relation vectors are normalised once, at initialisation.
    rel->weight.div_(rel->weight.norm(2, 1, true));  // EXPECT: tensor-inplace-on-leaf
  }

  // Plausibility of (h, r, t); index tensors of any matching shape, higher is better.
  torch::Tensor score(const torch::Tensor& h, const torch::Tensor& r, const torch::Tensor& t) {
    auto eh = ent(h);
    auto er = rel(r);
    auto et = ent(t);
    return -(eh + er - et).norm(cfg_.p_norm, -1);
  }

  // Keep every entity vector inside the unit ball (the TransE constraint).
  void renormalize_entities() {
    torch::NoGradGuard no_grad;
    auto w = ent->weight;
    // FACT: e = torch.nn.Embedding(6, 4); w = e.weight; torch.set_grad_enabled(False); w.div_(w.norm(2, 1, True).clamp_min(1.0)); torch.set_grad_enabled(True); assert shares_storage(w, e.weight)
    w.div_(w.norm(2, 1, true).clamp_min(1.0));  // LOOKALIKE: tensor-alias-then-mutate, tensor-inplace-on-leaf -- the parameter itself is meant to change, under NoGradGuard
  }

  const KGConfig& config() const { return cfg_; }

  torch::nn::Embedding ent{nullptr};
  torch::nn::Embedding rel{nullptr};

 private:
  KGConfig cfg_;
};
TORCH_MODULE(TransE);

// Uniform corruption: each negative replaces either the head or the tail.
struct NegativeSampler {
  int64_t num_entities;
  int64_t k;

  // pos: [B, 3] (h, r, t) int64 -> [B, k, 3]
  torch::Tensor corrupt(const torch::Tensor& pos) const {
    const auto B = pos.size(0);
    auto neg = pos.unsqueeze(1).expand({B, k, 3});
    auto replace_head = torch::rand({B, k}) < 0.5;
    auto random_ent = torch::randint(num_entities, {B, k}, torch::kLong);
    auto heads = torch::where(replace_head, random_ent, neg.select(2, 0));
    auto tails = torch::where(replace_head, neg.select(2, 2), random_ent);
    // FACT: p = torch.randint(0, 9, (4, 3)); n = p.unsqueeze(1).expand(4, 5, 3); assert raises(lambda: n.select(2, 0).copy_(torch.randint(0, 9, (4, 5))), "more than one element")
    neg.select(2, 0).copy_(heads);  // EXPECT: tensor-inplace-on-expanded
    neg.select(2, 2).copy_(tails);
    return neg;
  }
};

void train_transe(TransE& model, const torch::Tensor& train_triples, const KGConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  NegativeSampler sampler{cfg.num_entities, cfg.num_negatives};
  const int64_t n = train_triples.size(0);
  auto margin_opts = F::MarginRankingLossFuncOptions().margin(cfg.margin);

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(n);
    double running = 0.0;
    int64_t steps = 0;
    for (int64_t off = 0; off < n; off += cfg.batch_size) {
      const int64_t b = std::min(cfg.batch_size, n - off);
      auto pos = train_triples.index_select(0, perm.narrow(0, off, b));
      auto neg = sampler.corrupt(pos);
      pos = pos.to(device);
      neg = neg.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a fresh batch every iteration
      auto pos_score = model->score(pos.select(1, 0), pos.select(1, 1), pos.select(1, 2));
      auto neg_score = model->score(neg.select(2, 0), neg.select(2, 1), neg.select(2, 2));
      // Negative-major order so that the j-th block lines up with pos_score.repeat().
      // FACT: s = torch.randn(6, 4); assert not is_contiguous(s.t()) and is_copy_of(s.t().reshape(-1), s)
      auto neg_flat = neg_score.t().reshape({-1});  // EXPECT: tensor-reshape-non-contiguous
      auto pos_rep = pos_score.repeat({cfg.num_negatives});
      auto target = torch::ones_like(pos_rep);
      auto loss = F::margin_ranking_loss(pos_rep, neg_flat, target, margin_opts);

      opt.zero_grad();
      loss.backward();
      opt.step();
      model->renormalize_entities();

      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      ++steps;
      if (steps % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << steps << " loss " << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      }
    }
    std::cout << "epoch " << epoch << " mean loss " << running / std::max<int64_t>(steps, 1) << "\n";
  }
}

struct RankMetrics {
  double mrr_raw = 0.0;
  double mrr = 0.0;
  double hits1 = 0.0;
  double hits3 = 0.0;
  double hits10 = 0.0;
};

// Tail prediction against every entity. true_tails[i] lists all known tails of
// (h_i, r_i) in train/valid/test, for the filtered setting.
RankMetrics evaluate_tails(const torch::Tensor& ent_table, const torch::Tensor& rel_table,
                           const torch::Tensor& test,
                           const std::vector<std::vector<int64_t>>& true_tails,
                           const KGConfig& cfg) {
  torch::NoGradGuard no_grad;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const int64_t n = test.size(0);
  const int64_t num_ent = ent_table.size(0);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  auto ranks_raw = torch::zeros({n}, torch::kLong);
  auto ranks_filt = torch::zeros({n}, torch::kLong);

  for (int64_t off = 0; off < n; off += cfg.eval_batch) {
    const int64_t b = std::min(cfg.eval_batch, n - off);
    auto batch = test.narrow(0, off, b);
    auto h = batch.select(1, 0);
    auto r = batch.select(1, 1);
    auto t = batch.select(1, 2);

    auto q = ent_table.index_select(0, h) + rel_table.index_select(0, r);  // [b, D]
    auto table = ent_table.to(device);  // EXPECT: tensor-clone-in-loop
    auto scores = -torch::cdist(q.to(device), table, static_cast<double>(cfg.p_norm)).cpu();
    auto target = scores.gather(1, t.unsqueeze(1));  // [b, 1]

    auto known = torch::zeros({b, num_ent}, torch::kBool);
    for (int64_t i = 0; i < b; ++i) {
      known[i].index_fill_(0, torch::tensor(true_tails[off + i]), true);
    }
    auto filtered = scores;
    // FACT: s = torch.randn(3, 5); m = torch.zeros(3, 5, dtype=torch.bool); m[0, 1] = True; f = s; f.masked_fill_(m, float('-inf')); assert shares_storage(f, s) and bool(torch.isinf(s[0, 1]))
    filtered.masked_fill_(known, neg_inf);  // EXPECT: tensor-alias-then-mutate
    ranks_raw.narrow(0, off, b).copy_((scores > target).sum(1) + 1);
    ranks_filt.narrow(0, off, b).copy_((filtered > target).sum(1) + 1);  // LOOKALIKE: tensor-copy-narrowing -- a count of bools is int64, as is the destination
  }

  RankMetrics m;
  m.mrr_raw = ranks_raw.to(torch::kDouble).reciprocal().mean().item<double>();
  auto rf = ranks_filt.to(torch::kDouble);
  // FACT: r = torch.ones(5, dtype=torch.long); d = r.to(torch.float64); d.reciprocal_(); assert is_copy_of(d, r)
  rf.reciprocal_();  // LOOKALIKE: tensor-alias-then-mutate -- to(kDouble) of an int64 tensor is a new tensor
  m.mrr = rf.mean().item<double>();
  auto ks = torch::tensor({1, 3, 10}, torch::kLong);
  // FACT: r = torch.zeros(7, dtype=torch.long); assert is_view_of(r.view(-1, 1), r)
  auto hits = (ranks_filt.view({-1, 1}) <= ks.view({1, -1})).to(torch::kDouble).mean(0);  // LOOKALIKE: tensor-view-non-contiguous -- a fresh 1-D factory tensor is contiguous
  m.hits1 = hits[0].item<double>();
  m.hits3 = hits[1].item<double>();
  m.hits10 = hits[2].item<double>();
  return m;
}

int main() {
  KGConfig cfg;
  cfg.num_entities = 500;
  cfg.num_relations = 12;
  cfg.dim = 32;
  cfg.epochs = 2;
  cfg.batch_size = 128;
  cfg.num_negatives = 8;

  const int64_t n_train = 4000;
  auto heads = torch::randint(cfg.num_entities, {n_train}, torch::kLong);
  auto rels = torch::randint(cfg.num_relations, {n_train}, torch::kLong);
  auto tails = torch::randint(cfg.num_entities, {n_train}, torch::kLong);
  auto train = torch::stack({heads, rels, tails}, 1);

  TransE model(cfg);
  train_transe(model, train, cfg);

  auto test = train.narrow(0, 0, 300);
  std::vector<std::vector<int64_t>> true_tails(test.size(0));
  for (int64_t i = 0; i < test.size(0); ++i) {
    true_tails[i].push_back(test[i][2].item<int64_t>());
  }
  auto ent_w = model->ent->weight.detach().cpu();
  auto rel_w = model->rel->weight.detach().cpu();
  auto m = evaluate_tails(ent_w, rel_w, test, true_tails, cfg);
  std::cout << std::fixed << std::setprecision(4) << "MRR(raw) " << m.mrr_raw << " MRR " << m.mrr
            << " H@1 " << m.hits1 << " H@3 " << m.hits3 << " H@10 " << m.hits10 << "\n";
  return 0;
}
