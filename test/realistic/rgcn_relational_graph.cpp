// R-GCN encoder with basis decomposition and a DistMult decoder for link
// prediction on a knowledge graph (Schlichtkrull et al., 2018).
//
// Edges carry a relation type; every relation has its own weight matrix
// W_r = sum_b a_rb V_b built from a small set of shared bases V_b.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct RGCNConfig {
  int64_t num_entities = 14541;
  int64_t num_relations = 237;  // inverse relations are added on top: 2R edge types
  int64_t num_bases = 30;
  int64_t hidden = 200;
  int64_t num_layers = 2;
  int64_t epochs = 200;
  int64_t batch_size = 4096;
  int64_t neg_ratio = 10;
  double lr = 1e-2;
  double weight_decay = 5e-4;
  double reg = 1e-2;
  double dropout = 0.2;
  double max_norm = 1.0;
  bool project_through_bases = true;  // cheaper when 2R >> num_bases
  bool residual = true;
};

struct KGraph {
  torch::Tensor edge_index;  // [2, E] int64 (src, dst)
  torch::Tensor edge_type;   // [E] int64 in [0, 2R)
  torch::Tensor edge_norm;   // [E] float, 1 / c_{i,r}
  torch::Tensor triples;     // [T, 3] int64 (s, r, o)
};

// 1 / |N_i^r|: each message is normalised by the in-degree of its target under its relation.
torch::Tensor relation_norm(const torch::Tensor& edge_index, const torch::Tensor& edge_type,
                            int64_t num_nodes, int64_t num_types) {
  auto key = edge_index[1] * num_types + edge_type;
  auto counts = torch::zeros({num_nodes * num_types}, torch::kFloat);
  counts.index_add_(0, key, torch::ones({key.size(0)}));
  return 1.0 / counts.index_select(0, key).clamp_min(1.0);
}

KGraph build_graph(const torch::Tensor& triples, int64_t num_entities, int64_t num_relations) {
  auto s = triples.select(1, 0);
  auto r = triples.select(1, 1);
  auto o = triples.select(1, 2);
  KGraph g;
  g.edge_index = torch::stack({torch::cat({s, o}), torch::cat({o, s})});
  g.edge_type = torch::cat({r, r + num_relations});
  g.edge_norm = relation_norm(g.edge_index, g.edge_type, num_entities, 2 * num_relations);
  g.triples = triples;
  return g;
}

class RGCNLayerImpl : public torch::nn::Module {
 public:
  RGCNLayerImpl(int64_t in, int64_t out, int64_t num_types, int64_t num_bases, bool through_bases)
      : in_(in), out_(out), num_types_(num_types), num_bases_(num_bases),
        through_bases_(through_bases) {
    bases = register_parameter("bases", torch::empty({num_bases, in, out}));
    coeffs = register_parameter("coeffs", torch::empty({num_types, num_bases}));
    self_loop = register_parameter("self_loop", torch::empty({in, out}));
    bias = register_parameter("bias", torch::zeros({out}));
    torch::nn::init::xavier_uniform_(bases);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own no-grad guard
    torch::nn::init::xavier_uniform_(coeffs);
    torch::nn::init::xavier_uniform_(self_loop);
  }

  // Every relation's matrix at once: [num_types, in, out].
  torch::Tensor relation_weights() const {
    // FACT: b = torch.randn(3, 4, 5); assert is_view_of(b.permute(1, 2, 0).flatten(0, 1), b)
    auto flat = bases.permute({1, 2, 0}).flatten(0, 1);  // LOOKALIKE: tensor-reshape-non-contiguous -- in and out stay adjacent and in order, so the flatten is a view
    auto w = torch::matmul(flat, coeffs.t());             // [in * out, num_types]
    // FACT: m = torch.randn(20, 3).matmul(torch.randn(7, 3).t()); assert is_contiguous(m) and is_view_of(m.view(4, 5, 7), m)
    return w.view({in_, out_, num_types_}).permute({2, 0, 1});  // LOOKALIKE: tensor-view-non-contiguous -- a matmul result is contiguous
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& edge_index,
                        const torch::Tensor& edge_type, const torch::Tensor& norm) {
    const int64_t n = x.size(0);
    auto src = edge_index[0];
    auto dst = edge_index[1];
    auto agg = torch::zeros({n, out_}, x.options());
    if (through_bases_) {
      // Project every node onto every basis once, then mix per edge with a_{r,b}.
      // FACT: b = torch.randn(3, 4, 5); assert is_copy_of(b.permute(1, 0, 2).reshape(4, 15), b)
      auto v = bases.permute({1, 0, 2}).reshape({in_, -1});  // EXPECT: tensor-reshape-non-contiguous
      // FACT: xb = torch.randn(6, 4).matmul(torch.randn(4, 15)); assert is_view_of(xb.view(6, 3, 5), xb)
      auto xb = x.matmul(v).view({n, num_bases_, out_});  // LOOKALIKE: tensor-view-non-contiguous -- matmul output is contiguous
      auto a = coeffs.index_select(0, edge_type).unsqueeze(-1);  // [E, B, 1]
      auto msg = (a * xb.index_select(0, src)).sum(1);           // [E, out]
      agg.index_add_(0, dst, msg * norm.unsqueeze(1));
    } else {
      auto w = relation_weights();
      for (int64_t r = 0; r < num_types_; ++r) {
        auto sel = (edge_type == r).nonzero().squeeze(1);
        if (sel.numel() == 0) continue;
        auto msg = x.index_select(0, src.index_select(0, sel)).matmul(w[r]);
        agg.index_add_(0, dst.index_select(0, sel), msg * norm.index_select(0, sel).unsqueeze(1));
      }
    }
    return agg + x.matmul(self_loop) + bias;
  }

  torch::Tensor bases, coeffs, self_loop, bias;

 private:
  int64_t in_, out_, num_types_, num_bases_;
  bool through_bases_;
};
TORCH_MODULE(RGCNLayer);

class RGCNLinkPredictorImpl : public torch::nn::Module {
 public:
  explicit RGCNLinkPredictorImpl(const RGCNConfig& cfg) : cfg_(cfg) {
    entity = register_module("entity", torch::nn::Embedding(cfg.num_entities, cfg.hidden));
    rel_diag = register_parameter("rel_diag", torch::empty({cfg.num_relations, cfg.hidden}));
    torch::nn::init::normal_(rel_diag, 0.0, 1.0 / std::sqrt(static_cast<double>(cfg.hidden)));
    dropout = register_module("dropout", torch::nn::Dropout(cfg.dropout));
    for (int64_t i = 0; i < cfg.num_layers; ++i) {
      layers.push_back(register_module(
          "layer" + std::to_string(i),
          RGCNLayer(cfg.hidden, cfg.hidden, 2 * cfg.num_relations, cfg.num_bases,
                    cfg.project_through_bases)));
    }
  }

  torch::Tensor encode(const KGraph& g) {
    torch::Tensor h = entity->weight;
    for (size_t i = 0; i < layers.size(); ++i) {
      auto out = layers[i]->forward(h, g.edge_index, g.edge_type, g.edge_norm);
      if (cfg_.residual && i > 0) out += h;  // LOOKALIKE: tensor-inplace-on-saved -- the layer ends in an add, which saves nothing; relu comes after
      h = i + 1 < layers.size() ? dropout(torch::relu(out)) : out;
    }
    return h;
  }

  // DistMult: <e_s, diag(r), e_o>
  torch::Tensor score(const torch::Tensor& emb, const torch::Tensor& triples) {
    auto s = emb.index_select(0, triples.select(1, 0));
    auto r = rel_diag.index_select(0, triples.select(1, 1));
    auto o = emb.index_select(0, triples.select(1, 2));
    return (s * r * o).sum(-1);
  }

  // (s, r, ?) against every entity: [B, N]
  torch::Tensor score_all_objects(const torch::Tensor& emb, const torch::Tensor& s,
                                  const torch::Tensor& r) {
    auto q = emb.index_select(0, s) * rel_diag.index_select(0, r);
    return q.matmul(emb.t());
  }

  torch::nn::Embedding entity{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::Tensor rel_diag;
  std::vector<RGCNLayer> layers;

 private:
  RGCNConfig cfg_;
};
TORCH_MODULE(RGCNLinkPredictor);

// Corrupt the subject or the object of each positive, `ratio` negatives per positive.
torch::Tensor corrupt(const torch::Tensor& pos, int64_t num_entities, int64_t ratio) {
  auto neg = pos.repeat({ratio, 1});
  const int64_t m = neg.size(0);
  auto rand_ent = torch::randint(num_entities, {m}, pos.options());
  auto head = torch::rand({m}) < 0.5;
  // FACT: p = torch.zeros(4, 3, dtype=torch.long); assert is_copy_of(p.repeat(2, 1), p)
  neg.select(1, 0).copy_(torch::where(head, rand_ent, neg.select(1, 0)));  // LOOKALIKE: tensor-alias-then-mutate -- repeat allocates, pos is untouched
  neg.select(1, 2).copy_(torch::where(head, neg.select(1, 2), rand_ent));
  return neg;
}

double train(RGCNLinkPredictor& model, const KGraph& graph, const RGCNConfig& cfg) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::vector<torch::Tensor> loss_trace;
  const int64_t num_triples = graph.triples.size(0);
  const int64_t num_types = 2 * cfg.num_relations;
  double last_epoch = 0.0;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    // Edge dropout: message passing runs on a random half of the edges each epoch.
    auto pairs = graph.edge_index.t().contiguous();  // EXPECT: tensor-clone-in-loop
    auto kept = (torch::rand({pairs.size(0)}) < 0.5).nonzero().squeeze(1);
    KGraph sub;
    sub.edge_index = pairs.index_select(0, kept).t();
    sub.edge_type = graph.edge_type.index_select(0, kept);
    sub.edge_norm = relation_norm(sub.edge_index, sub.edge_type, cfg.num_entities, num_types);

    auto perm = torch::randperm(num_triples);
    torch::Tensor epoch_loss = torch::zeros({});
    int64_t steps = 0;
    for (int64_t start = 0; start < num_triples; start += cfg.batch_size) {
      const int64_t len = std::min(cfg.batch_size, num_triples - start);
      auto pos = graph.triples.index_select(0, perm.narrow(0, start, len));
      auto neg = corrupt(pos, cfg.num_entities, cfg.neg_ratio);

      auto emb = model->encode(sub);
      auto logits = torch::cat({model->score(emb, pos), model->score(emb, neg)});
      auto labels = torch::cat({torch::ones({len}), torch::zeros({neg.size(0)})});
      // BCE written out, with probabilities kept away from 0 and 1.
      auto probs = torch::sigmoid(logits);
      probs.clamp_(1e-6, 1.0 - 1e-6);  // EXPECT: tensor-inplace-on-saved
      auto loss = -(labels * probs.log() + (1 - labels) * (1 - probs).log()).mean();
      auto reg = emb.pow(2).mean() + model->rel_diag.pow(2).mean();

      opt.zero_grad();
      (loss + cfg.reg * reg).backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      // Decoupled weight decay.
      for (auto& p : model->parameters()) p.mul_(1.0 - cfg.lr * cfg.weight_decay);  // EXPECT: tensor-inplace-on-leaf
      {
        torch::NoGradGuard no_grad;
        auto& w = model->entity->weight;
        w.div_(w.norm(2, 1, true).clamp_min(cfg.max_norm) / cfg.max_norm);  // LOOKALIKE: tensor-inplace-on-leaf -- max-norm projection under NoGradGuard
      }
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      loss_trace.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no history kept
      ++steps;
    }
    last_epoch = epoch_loss.item<double>() / std::max<int64_t>(steps, 1);
    if (epoch % 10 == 0) std::cout << "epoch " << epoch << " loss " << last_epoch << "\n";
  }
  return last_epoch;
}

// Probabilities of given triples with temperature scaling (for calibration plots).
torch::Tensor triple_probabilities(RGCNLinkPredictor& model, const KGraph& graph,
                                   const torch::Tensor& triples, double temperature) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto emb = model->encode(graph);
  auto logits = model->score(emb, triples);
  auto scaled = logits.clone();  // EXPECT: tensor-unnecessary-clone
  scaled.div_(temperature);
  return torch::sigmoid(scaled);
}

struct LinkMetrics {
  double mrr = 0, raw_mrr = 0, hits1 = 0, hits3 = 0, hits10 = 0;
};

// known_objects[i, e]: (s_i, r_i, e) is a true triple in train/valid/test.
LinkMetrics evaluate(RGCNLinkPredictor& model, const KGraph& graph, const torch::Tensor& test,
                     const torch::Tensor& known_objects, int64_t batch) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto emb = model->encode(graph);
  const int64_t n = test.size(0);
  auto filt_ranks = torch::empty({n}, torch::kLong);
  auto raw_ranks = torch::empty({n}, torch::kLong);

  for (int64_t start = 0; start < n; start += batch) {
    const int64_t len = std::min(batch, n - start);
    auto t = test.narrow(0, start, len);
    auto obj = t.select(1, 2).unsqueeze(1);
    auto scores = model->score_all_objects(emb, t.select(1, 0), t.select(1, 1));
    auto target = scores.gather(1, obj);
    // Filtered setting: every other true object is removed before ranking.
    auto others = known_objects.narrow(0, start, len).scatter(1, obj, false);
    // FACT: s = torch.randn(3, 5); f = s; f.masked_fill_(torch.rand(3, 5) < 0.5, -1e9); assert shares_storage(f, s)
    auto filtered = scores;
    filtered.masked_fill_(others, -1e9);  // EXPECT: tensor-alias-then-mutate
    auto filt = (filtered > target).sum(1) + 1;
    auto raw = (scores > target).sum(1) + 1;
    filt_ranks.narrow(0, start, len).copy_(filt);  // LOOKALIKE: tensor-copy-narrowing -- a sum of bools is int64, like the buffer
    raw_ranks.narrow(0, start, len).copy_(raw);
  }

  auto fr = filt_ranks.to(torch::kDouble);
  LinkMetrics m;
  m.mrr = fr.reciprocal().mean().item<double>();
  m.raw_mrr = raw_ranks.to(torch::kDouble).reciprocal().mean().item<double>();
  m.hits1 = (fr <= 1).to(torch::kDouble).mean().item<double>();
  m.hits3 = (fr <= 3).to(torch::kDouble).mean().item<double>();
  m.hits10 = (fr <= 10).to(torch::kDouble).mean().item<double>();
  return m;
}
