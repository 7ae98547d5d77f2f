// TransE (Bordes et al. 2013) knowledge-graph embeddings on an FB15k-237 style triple store.
// A triple (h, r, t) is plausible when h + r is close to t. Training minimises a margin ranking loss
// between the true triples and corrupted ones (Bernoulli negative sampling, Wang et al. 2014, which
// corrupts the head of 1-to-N relations more often), renormalising the entity vectors before
// every batch as in the paper. Evaluation ranks the true tail among all entities, in the raw and
// in the filtered setting (other known true tails removed), and reports MR, MRR and Hits@k.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nn = torch::nn;

struct TransEConfig {
  int64_t dim = 200, batch = 2048, epochs = 1000, eval_every = 50, eval_batch = 128, p_norm = 1;
  double margin = 5.0, lr = 1e-3;
  bool normalize_lookups = false; // normalise the looked-up vectors instead of the whole table
};

struct TripleSet {
  torch::Tensor triples; // [N, 3] int64 on the host: head, relation, tail
  int64_t n_ent = 0, n_rel = 0;
};

struct TransEImpl : nn::Module {
  TransEImpl(int64_t n_ent, int64_t n_rel, const TransEConfig &cfg) : p_(static_cast<double>(cfg.p_norm)), normalize_lookups_(cfg.normalize_lookups) {
    ent_ = register_module("ent", nn::Embedding(n_ent, cfg.dim));
    rel_ = register_module("rel", nn::Embedding(n_rel, cfg.dim));
    const double bound = 6.0 / std::sqrt(static_cast<double>(cfg.dim));
    nn::init::uniform_(ent_->weight, -bound, bound); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    nn::init::uniform_(rel_->weight, -bound, bound);
    // FACT: w = torch.nn.Embedding(5, 4).weight; assert raises(lambda: w.div_(w.norm(2, 1, True)), "a leaf Variable that requires grad")
    rel_->weight.div_(rel_->weight.norm(2, 1, true)); // EXPECT: tensor-inplace-on-leaf -- the paper normalises relations once at init, but here grad mode is on and the table requires grad: this throws
  }

  // ||h + r - t||_p for every triple of [B, 3]; lower is more plausible.
  torch::Tensor forward(const torch::Tensor &triples) {
    auto h = ent_(triples.select(1, 0));
    auto r = rel_(triples.select(1, 1));
    auto t = ent_(triples.select(1, 2));
    if (normalize_lookups_) {
      // FACT: e = torch.nn.Embedding(5, 4); h = e(torch.tensor([0, 1])); h.div_(h.norm(2, -1, True)); assert backward_fails(lambda: h.sum().backward())
      h.div_(h.norm(2, -1, true)); // EXPECT: tensor-inplace-on-saved -- norm saved h to compute its gradient; dividing h in place makes the loss's backward raise
      t.div_(t.norm(2, -1, true)); // EXPECT: tensor-inplace-on-saved -- the same for t
    }
    return (h + r - t).norm(p_, -1);
  }

  // Entities at unit length: the first step of each batch in the paper's algorithm.
  void normalize_entities() {
    auto w = ent_->weight.data();
    w.div_(w.norm(2, 1, true).clamp_min(1e-12)); // LOOKALIKE: tensor-inplace-on-detached, tensor-inplace-on-leaf -- the weights are meant to change; it runs before this batch's forward, and an embedding's backward saves only the indices
  }

  // Distances of (h, r, ?) to every entity: [B, n_ent].
  torch::Tensor tail_distances(const torch::Tensor &heads, const torch::Tensor &rels) {
    auto q = ent_(heads) + rel_(rels);
    return torch::cdist(q, ent_->weight, p_);
  }

  double p_;
  bool normalize_lookups_;
  nn::Embedding ent_{nullptr}, rel_{nullptr};
};
TORCH_MODULE(TransE);

// Bernoulli corruption: replace the head with probability tph / (tph + hpt) of the triple's relation.
class BernoulliSampler {
public:
  explicit BernoulliSampler(const TripleSet &train) : n_ent_(train.n_ent) {
    const auto R = train.n_rel;
    auto h = train.triples.select(1, 0), r = train.triples.select(1, 1), t = train.triples.select(1, 2);
    auto rh = std::get<0>(torch::unique_dim(torch::stack({r, h}, 1), 0));
    auto rt = std::get<0>(torch::unique_dim(torch::stack({r, t}, 1), 0));
    // Per relation: #triples, #distinct heads, #distinct tails, tails per head, heads per tail.
    stats_ = torch::zeros({R, 5}, torch::kLong);
    // FACT: s = torch.zeros(3, 5, dtype=torch.long); c = torch.bincount(torch.tensor([0, 2, 2]), minlength=3); s.select(1, 0).copy_(c); assert c.dtype == torch.long and s[:, 0].tolist() == [1, 0, 2]
    stats_.select(1, 0).copy_(torch::bincount(r, {}, R)); // LOOKALIKE: tensor-copy-narrowing -- bincount counts in int64, like the table
    stats_.select(1, 1).copy_(torch::bincount(rh.select(1, 0), {}, R));
    stats_.select(1, 2).copy_(torch::bincount(rt.select(1, 0), {}, R));
    auto n = stats_.select(1, 0).to(torch::kFloat);
    // FACT: s = torch.zeros(2, 5, dtype=torch.long); s.select(1, 3).copy_(torch.tensor([7.0, 5.0]) / torch.tensor([4.0, 2.0])); assert s[:, 3].tolist() == [1, 2]
    stats_.select(1, 3).copy_(n / stats_.select(1, 1).clamp_min(1).to(torch::kFloat)); // EXPECT: tensor-copy-narrowing -- the averages go into the int64 count table: 1.75 tails per head is stored as 1
    stats_.select(1, 4).copy_(n / stats_.select(1, 2).clamp_min(1).to(torch::kFloat)); // EXPECT: tensor-copy-narrowing -- the same for heads per tail
    auto tph = stats_.select(1, 3).to(torch::kFloat), hpt = stats_.select(1, 4).to(torch::kFloat);
    head_prob_ = tph / (tph + hpt).clamp_min(1e-6);
  }

  // Positives [B, 3] on the host -> one corrupted triple per positive.
  torch::Tensor corrupt(const torch::Tensor &pos) const {
    const auto B = pos.size(0);
    auto replace_head = torch::rand({B}) < head_prob_.index_select(0, pos.select(1, 1)); // LOOKALIKE: tensor-device-mismatch -- sampling stays on the host: both sides are CPU tensors
    auto random_ent = torch::randint(n_ent_, {B}, torch::kLong);
    // FACT: p = torch.tensor([[0, 1, 2], [3, 0, 4]]); n = p.clone(); n.select(1, 0).copy_(torch.tensor([9, 3])); assert is_copy_of(n, p) and p[0, 0] == 0
    auto neg = pos.clone(); // LOOKALIKE: tensor-unnecessary-clone -- written through select views below; the positives must stay intact
    neg.select(1, 0).copy_(torch::where(replace_head, random_ent, pos.select(1, 0))); // LOOKALIKE: tensor-copy-narrowing -- random ids and triples are both int64
    neg.select(1, 2).copy_(torch::where(replace_head, pos.select(1, 2), random_ent));
    return neg;
  }

  const torch::Tensor &stats() const { return stats_; }

private:
  int64_t n_ent_;
  torch::Tensor stats_, head_prob_;
};

// Known true tails of every (head, relation) over all splits: the filter of the filtered setting.
using TailFilter = std::unordered_map<int64_t, std::vector<int64_t>>;

TailFilter build_filter(const std::vector<const TripleSet *> &splits) {
  TailFilter filter;
  for (const auto *split : splits) {
    auto acc = split->triples.accessor<int64_t, 2>();
    for (int64_t i = 0; i < acc.size(0); ++i)
      filter[acc[i][0] * split->n_rel + acc[i][1]].push_back(acc[i][2]);
  }
  return filter;
}

struct RankMetrics {
  double mr = 0, mrr = 0, hits1 = 0, hits3 = 0, hits10 = 0;
};

RankMetrics summarize(const torch::Tensor &ranks) {
  RankMetrics m;
  auto r = ranks.to(torch::kDouble);
  m.mr = r.mean().item<double>();
  m.hits1 = (r <= 1).to(torch::kDouble).mean().item<double>();
  m.hits3 = (r <= 3).to(torch::kDouble).mean().item<double>();
  m.hits10 = (r <= 10).to(torch::kDouble).mean().item<double>();
  // FACT: k = torch.tensor([1, 4, 2]); r = k.to(torch.float64); r.reciprocal_(); assert is_copy_of(r, k) and k.tolist() == [1, 4, 2]
  r.reciprocal_(); // LOOKALIKE: tensor-alias-then-mutate -- the ranks are int64: to(kDouble) made a copy
  m.mrr = r.mean().item<double>();
  return m;
}

// Tail prediction over a split; returns (raw, filtered) metrics.
std::pair<RankMetrics, RankMetrics> evaluate(TransE &model, const TripleSet &split, const TailFilter &filter,
                                             const TransEConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto M = split.triples.size(0);
  auto raw = torch::empty({M}, torch::kLong), filt = torch::empty({M}, torch::kLong);
  auto acc = split.triples.accessor<int64_t, 2>();
  for (int64_t i = 0; i < M; i += cfg.eval_batch) {
    const auto b = std::min(cfg.eval_batch, M - i);
    auto batch = split.triples.narrow(0, i, b).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different slice of the split every iteration
    auto dist = model->tail_distances(batch.select(1, 0), batch.select(1, 1));
    auto target = dist.gather(1, batch.select(1, 2).unsqueeze(1));
    std::vector<int64_t> rows, cols;
    for (int64_t j = 0; j < b; ++j) {
      const auto h = acc[i + j][0], r = acc[i + j][1], t = acc[i + j][2];
      for (auto known : filter.at(h * split.n_rel + r))
        if (known != t) {
          rows.push_back(j);
          cols.push_back(known);
        }
    }
    torch::Tensor filtered = dist;
    // FACT: s = torch.randn(2, 5); f = s; f.index_put_((torch.tensor([0]), torch.tensor([3])), torch.tensor(float('inf'))); assert shares_storage(f, s) and s[0, 3] == float('inf')
    filtered.index_put_({torch::tensor(rows), torch::tensor(cols)}, std::numeric_limits<float>::infinity()); // EXPECT: tensor-alias-then-mutate -- filtered is dist: the raw ranks below are computed on the filtered distances too
    // FACT: r = torch.empty(6, dtype=torch.long); c = (torch.randn(3, 7) < torch.randn(3, 1)).sum(1) + 1; r.narrow(0, 2, 3).copy_(c); assert c.dtype == torch.long and torch.equal(r[2:5], c)
    raw.narrow(0, i, b).copy_((dist < target).sum(1) + 1); // LOOKALIKE: tensor-copy-narrowing, tensor-device-mismatch -- int64 counts into an int64 buffer; copy_ may cross devices
    filt.narrow(0, i, b).copy_((filtered < target).sum(1) + 1);
  }
  model->train();
  return {summarize(raw), summarize(filt)};
}

void train_transe(TransE &model, const TripleSet &train, const TripleSet &valid, const TailFilter &filter, const TransEConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  BernoulliSampler sampler(train);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto rel_loss = torch::zeros({train.n_rel}, torch::TensorOptions().device(device));
  auto rel_count = torch::zeros({train.n_rel}, torch::TensorOptions().device(device));
  const auto N = train.triples.size(0);
  double best_mrr = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(N);
    double epoch_loss = 0;
    rel_loss.zero_();
    rel_count.zero_();
    for (int64_t i = 0; i < N; i += cfg.batch) {
      if (!cfg.normalize_lookups)
        model->normalize_entities();
      auto pos = train.triples.index_select(0, perm.narrow(0, i, std::min(cfg.batch, N - i)));
      auto neg = sampler.corrupt(pos);
      auto d_pos = model->forward(pos.to(device));
      auto d_neg = model->forward(neg.to(device));
      auto per = cfg.margin + d_pos - d_neg;
      // FACT: d = torch.randn(4, requires_grad=True); per = 1.0 + d.abs().exp() - d.exp(); per.clamp_min_(0); per.mean().backward(); assert d.grad is not None
      per.clamp_min_(0); // LOOKALIKE: tensor-inplace-on-saved -- the sum and the difference save nothing: backward is fine
      auto loss = per.mean();
      opt.zero_grad();
      loss.backward();
      opt.step();
      // Per-relation loss, to see which relation types the model struggles with.
      auto rels = pos.select(1, 1).to(device);
      rel_loss.index_add_(0, rels, per); // EXPECT: tensor-graph-kept-across-iterations -- per still requires grad: every batch's graph is chained into rel_loss for the whole epoch
      rel_count.index_add_(0, rels, torch::ones({rels.size(0)}, rel_count.options())); // LOOKALIKE: tensor-graph-kept-across-iterations -- counting ones: no graph
      epoch_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every batch only to sum the loss
    }
    auto worst = std::get<1>((rel_loss / rel_count.clamp_min(1)).topk(std::min<int64_t>(5, train.n_rel))).cpu();
    std::cout << "epoch " << epoch << " loss " << epoch_loss << " hardest relations:";
    for (int64_t k = 0; k < worst.size(0); ++k)
      std::cout << " " << worst[k].item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- the indices were copied to the host once
    std::cout << "\n";
    if ((epoch + 1) % cfg.eval_every == 0) {
      auto [raw, filt] = evaluate(model, valid, filter, cfg, device);
      std::cout << "  valid raw MRR " << raw.mrr << " filtered MRR " << filt.mrr << " Hits@10 " << filt.hits10 << "\n";
      if (filt.mrr > best_mrr) {
        best_mrr = filt.mrr;
        torch::save(model, "transe_best.pt");
      }
    }
  }
}

void run_transe(const TripleSet &train, const TripleSet &valid, const TripleSet &test, const TransEConfig &cfg) {
  TransE model(train.n_ent, train.n_rel, cfg);
  const auto filter = build_filter({&train, &valid, &test});
  train_transe(model, train, valid, filter, cfg);
  torch::load(model, "transe_best.pt");
  auto [raw, filt] = evaluate(model, test, filter, cfg, torch::Device(torch::kCUDA));
  std::cout << "test raw: MR " << raw.mr << " MRR " << raw.mrr << " Hits@10 " << raw.hits10 << "\n"
            << "test filtered: MR " << filt.mr << " MRR " << filt.mrr << " Hits@1 " << filt.hits1 << " Hits@3 "
            << filt.hits3 << " Hits@10 " << filt.hits10 << "\n";
}
