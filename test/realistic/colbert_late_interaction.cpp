// ColBERT-style late-interaction retriever: MaxSim scoring, training with
// in-batch negatives (plus optional cross-encoder distillation), and a
// compressed index (centroid codes + fp16 residuals) for the collection.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct ColBERTConfig {
  int64_t vocab_size = 30522;
  int64_t hidden = 256;
  int64_t heads = 4;
  int64_t layers = 4;
  int64_t dim = 128;
  int64_t query_maxlen = 32;
  int64_t doc_maxlen = 180;
  int64_t pad_id = 0;
  int64_t mask_id = 103;
  double aug_weight = 0.5;       // weight of [MASK] augmentation tokens
  double distill_weight = 0.5;
  double teacher_temp = 2.0;
  double lr = 3e-6;
  int64_t log_every = 50;
};

class ColBERTEncoderImpl : public torch::nn::Module {
 public:
  explicit ColBERTEncoderImpl(const ColBERTConfig& cfg)
      : cfg_(cfg),
        tok_(torch::nn::EmbeddingOptions(cfg.vocab_size, cfg.hidden).padding_idx(cfg.pad_id)),
        pos_(cfg.doc_maxlen, cfg.hidden),
        encoder_(torch::nn::TransformerEncoderOptions(
            torch::nn::TransformerEncoderLayerOptions(cfg.hidden, cfg.heads)
                .dim_feedforward(4 * cfg.hidden)
                .dropout(0.1),
            cfg.layers)),
        proj_(torch::nn::LinearOptions(cfg.hidden, cfg.dim).bias(false)) {
    register_module("tok", tok_);
    register_module("pos", pos_);
    register_module("encoder", encoder_);
    register_module("proj", proj_);
  }

  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask) {
    const auto B = ids.size(0), L = ids.size(1);
    auto positions = torch::arange(L, ids.options());
    auto h = tok_(ids) + pos_(positions);
    h = encoder_->forward(h.transpose(0, 1), /*src_mask=*/{}, /*src_key_padding_mask=*/mask.logical_not());
    // FACT: h = torch.randn(6, 2, 8); r = h.transpose(0, 1).reshape(-1, 8); assert is_copy_of(r, h)
    auto tokens = h.transpose(0, 1).reshape({-1, cfg_.hidden});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: o = torch.nn.functional.linear(torch.randn(12, 8), torch.randn(4, 8)); assert is_view_of(o.view(2, 6, 4), o)
    auto out = proj_(tokens).view({B, L, cfg_.dim});  // LOOKALIKE: tensor-view-non-contiguous -- a fresh linear output is contiguous
    out = F::normalize(out, F::NormalizeFuncOptions().p(2).dim(-1));
    return out * mask.unsqueeze(-1);
  }

 private:
  ColBERTConfig cfg_;
  torch::nn::Embedding tok_;
  torch::nn::Embedding pos_;
  torch::nn::TransformerEncoder encoder_;
  torch::nn::Linear proj_;
};
TORCH_MODULE(ColBERTEncoder);

// Every query of the batch against every document of the batch; positives on the diagonal.
torch::Tensor maxsim_all_pairs(const torch::Tensor& Q, const torch::Tensor& D,
                               const torch::Tensor& dmask, const torch::Tensor& qw) {
  const auto B = Q.size(0), Lq = Q.size(1), Ld = D.size(1);
  // FACT: e = torch.nn.functional.normalize(torch.randn(2, 5, 4), dim=-1) * torch.ones(2, 5, 1, dtype=torch.bool); assert is_view_of(e.flatten(0, 1), e)
  auto sim = torch::matmul(Q.flatten(0, 1), D.flatten(0, 1).t());  // LOOKALIKE: tensor-reshape-non-contiguous -- encoder outputs are contiguous, flatten is a view
  auto grid = sim.view({B, Lq, B, Ld});
  // FACT: q = torch.randn(4, 3, requires_grad=True); d = torch.randn(6, 3, requires_grad=True); s = q.matmul(d.t()); s.view(2, 2, 2, 3).masked_fill_(torch.zeros(1, 1, 2, 3, dtype=torch.bool), -1e4); assert not raises(lambda: s.max(-1)[0].sum().backward())
  grid.masked_fill_(dmask.logical_not().view({1, 1, B, Ld}), -1e4);  // LOOKALIKE: tensor-inplace-on-saved -- mm saves its operands, not its output
  auto per_token = std::get<0>(grid.max(-1));
  return (per_token * qw.unsqueeze(-1)).sum(1);
}

class ColBERTImpl : public torch::nn::Module {
 public:
  explicit ColBERTImpl(const ColBERTConfig& cfg) : cfg_(cfg), encoder(ColBERTEncoder(cfg)) {
    register_module("encoder", encoder);
    logit_scale = register_parameter("logit_scale", torch::full({}, std::log(1.0 / 0.05)));
    q_weight_ = register_buffer("q_weight", torch::ones({1, cfg.query_maxlen}));
  }

  // Query augmentation: padding becomes [MASK] and is attended to.
  std::pair<torch::Tensor, torch::Tensor> encode_query(const torch::Tensor& q_ids) {
    auto is_aug = q_ids.eq(cfg_.pad_id);
    auto ids = q_ids.masked_fill(is_aug, cfg_.mask_id);
    auto Q = encoder->forward(ids, torch::ones_like(ids, torch::kBool));
    return {Q, is_aug};
  }

  torch::Tensor query_weights(const torch::Tensor& is_aug) {
    const auto B = is_aug.size(0), Lq = is_aug.size(1);
    auto w = q_weight_.narrow(1, 0, Lq).expand({B, Lq});
    // FACT: w = torch.ones(1, 8).narrow(1, 0, 4).expand(2, 4); assert raises(lambda: w.mul_(torch.rand(2, 4)), 'more than one element')
    w.mul_(1.0 - (1.0 - cfg_.aug_weight) * is_aug.to(torch::kFloat));  // EXPECT: tensor-inplace-on-expanded
    return w;
  }

  torch::Tensor forward(const torch::Tensor& q_ids, const torch::Tensor& d_ids) {
    auto [Q, is_aug] = encode_query(q_ids);
    auto dmask = d_ids.ne(cfg_.pad_id);
    auto D = encoder->forward(d_ids, dmask);
    return maxsim_all_pairs(Q, D, dmask, query_weights(is_aug)) * logit_scale.exp();
  }

  // Re-rank candidates pulled from the index for a single query.
  torch::Tensor score_candidates(const torch::Tensor& q_ids, const torch::Tensor& D,
                                 const torch::Tensor& dmask) {
    auto [Q, is_aug] = encode_query(q_ids);
    const auto Lq = Q.size(1);
    // FACT: b = torch.ones(1, 8); w = b.narrow(1, 0, 4).expand(1, 4).contiguous(); w.mul_(torch.full((1, 4), 0.5)); assert shares_storage(w, b) and float(b[0, 0]) == 0.5
    auto w = q_weight_.narrow(1, 0, Lq).expand({1, Lq}).contiguous();
    w.mul_(1.0 - (1.0 - cfg_.aug_weight) * is_aug.to(torch::kFloat));  // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-inplace-on-expanded -- expanding a single row to its own size adds no stride-0 dim
    auto sim = torch::matmul(D, Q.squeeze(0).t());
    sim = sim.masked_fill(dmask.logical_not().unsqueeze(-1), -1e4);
    auto best = std::get<0>(sim.max(1));
    return (best * w).sum(-1);
  }

  torch::Tensor logit_scale;
  ColBERTConfig cfg_;
  ColBERTEncoder encoder;

 private:
  torch::Tensor q_weight_;
};
TORCH_MODULE(ColBERT);

struct TripleBatch {
  torch::Tensor q_ids;
  torch::Tensor d_ids;
  torch::Tensor teacher_scores;
};

// Stands in for the pre-tokenized triples reader.
struct TripleReader {
  ColBERTConfig cfg;
  int64_t batch_size = 32;
  TripleBatch next() {
    auto q = torch::randint(1, cfg.vocab_size, {batch_size, cfg.query_maxlen}, torch::kLong);
    auto d = torch::randint(1, cfg.vocab_size, {batch_size, cfg.doc_maxlen}, torch::kLong);
    auto qlen = torch::randint(4, cfg.query_maxlen, {batch_size, 1}, torch::kLong);
    auto dlen = torch::randint(16, cfg.doc_maxlen, {batch_size, 1}, torch::kLong);
    q.masked_fill_(torch::arange(cfg.query_maxlen).unsqueeze(0) >= qlen, cfg.pad_id);
    d.masked_fill_(torch::arange(cfg.doc_maxlen).unsqueeze(0) >= dlen, cfg.pad_id);
    return {q, d, torch::randn({batch_size, batch_size})};
  }
};

double in_batch_mrr(const std::vector<torch::Tensor>& history) {
  torch::NoGradGuard no_grad;
  torch::Tensor rr;
  int64_t n = 0;
  for (const auto& s : history) {
    auto pos = s.diagonal().unsqueeze(1);
    auto rank = (s > pos).sum(1) + 1;
    auto batch_rr = rank.to(torch::kDouble).reciprocal().sum();
    rr = rr.defined() ? rr + batch_rr : batch_rr;
    n += s.size(0);
  }
  return n ? rr.item<double>() / n : 0.0;
}

void train(ColBERT& model, TripleReader& reader, const ColBERTConfig& cfg,
           torch::Device device, int64_t steps) {
  model->to(device);
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(0.01));
  std::vector<torch::Tensor> history;
  for (int64_t step = 1; step <= steps; ++step) {
    auto batch = reader.next();
    auto q_ids = batch.q_ids.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch each step
    auto d_ids = batch.d_ids.to(device);
    auto scores = model->forward(q_ids, d_ids);
    auto labels = torch::arange(scores.size(0));
    auto loss = F::cross_entropy(scores, labels);  // EXPECT: tensor-device-mismatch
    if (cfg.distill_weight > 0) {
      auto teacher = torch::softmax(batch.teacher_scores.to(device) / cfg.teacher_temp, -1);
      auto probs = torch::softmax(scores, -1);
      // FACT: s = torch.randn(3, 3, requires_grad=True); assert backward_fails(lambda: (lambda p: (p.clamp_(1e-6, 1.0), p.log().sum().backward()))(torch.softmax(s, -1)))
      probs.clamp_(1e-6, 1.0);  // EXPECT: tensor-inplace-on-saved
      auto kl = (teacher * (teacher.log() - probs.log())).sum(-1).mean();
      loss = loss + cfg.distill_weight * kl;
    }
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    {
      torch::NoGradGuard no_grad;
      model->logit_scale.clamp_(0.0, std::log(100.0));  // LOOKALIKE: tensor-inplace-on-leaf -- clamped under NoGradGuard after the step
    }
    history.push_back(scores);  // EXPECT: tensor-graph-kept-across-iterations
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " loss " << loss.item<double>()
                << " in-batch MRR " << in_batch_mrr(history) << std::endl;
      history.clear();
    }
  }
}

double evaluate(ColBERT& model, TripleReader& reader, int64_t batches, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  double mrr_sum = 0.0;
  int64_t n = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto batch = reader.next();
    auto scores = model->forward(batch.q_ids.to(device), batch.d_ids.to(device));
    auto target = torch::arange(scores.size(0), scores.options().dtype(torch::kLong));
    auto pos = scores.gather(1, target.unsqueeze(1));  // LOOKALIKE: tensor-device-mismatch -- target built with the scores' options
    auto rank = (scores > pos).sum(1) + 1;
    mrr_sum += rank.to(torch::kDouble).reciprocal().sum().item<double>();  // EXPECT: tensor-sync-in-loop
    n += scores.size(0);
  }
  model->train();
  return mrr_sum / static_cast<double>(n);
}

struct CompressedIndex {
  torch::Tensor centroids;
  torch::Tensor codes;
  torch::Tensor residuals;
  torch::Tensor doclens;
  std::vector<torch::Tensor> full;  // uncompressed, for exact re-ranking
};

CompressedIndex build_index(ColBERT& model, const std::vector<torch::Tensor>& doc_batches,
                            const torch::Tensor& centroids, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto& cfg = model->cfg_;
  int64_t total = 0;
  for (const auto& b : doc_batches) {
    total += b.ne(cfg.pad_id).sum().item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- CPU token ids, nothing to wait for
  }
  CompressedIndex index;
  index.codes = torch::empty({total}, torch::kInt);
  index.residuals = torch::empty({total, cfg.dim}, torch::kHalf);
  std::vector<torch::Tensor> lens;
  int64_t offset = 0;
  for (const auto& ids_cpu : doc_batches) {
    auto ids = ids_cpu.to(device);
    auto mask = ids.ne(cfg.pad_id);
    auto embs = model->encoder->forward(ids, mask);
    auto cents = centroids.to(device);  // EXPECT: tensor-clone-in-loop
    auto doc_lens = ids_cpu.ne(cfg.pad_id).sum(1);
    const int64_t n = doc_lens.sum().item<int64_t>();
    auto keep = mask.flatten();
    // FACT: e = torch.nn.functional.normalize(torch.randn(3, 5, 4), dim=-1) * torch.ones(3, 5, 1, dtype=torch.bool); f = e.flatten(0, 1); f.sub_(torch.ones(15, 4)); assert is_view_of(f, e)
    auto flat = embs.flatten(0, 1);
    auto nearest = flat.matmul(cents.t()).argmax(-1);
    index.codes.narrow(0, offset, n).copy_(nearest.index({keep}));  // EXPECT: tensor-copy-narrowing
    flat.sub_(cents.index_select(0, nearest));  // EXPECT: tensor-alias-then-mutate
    index.residuals.narrow(0, offset, n).copy_(flat.index({keep}).to(torch::kHalf));  // LOOKALIKE: tensor-copy-narrowing -- the fp16 conversion is spelled out
    index.full.push_back(embs.to(torch::kCPU));  // LOOKALIKE: tensor-graph-kept-across-iterations -- built under NoGradGuard, no graph
    lens.push_back(doc_lens);
    offset += n;
  }
  index.centroids = centroids;
  index.doclens = torch::cat(lens).to(torch::kInt);
  return index;
}

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ColBERTConfig cfg;
  ColBERT model(cfg);
  TripleReader reader{cfg};
  train(model, reader, cfg, device, 500);
  std::cout << "dev MRR@batch " << evaluate(model, reader, 20, device) << std::endl;

  std::vector<torch::Tensor> docs;
  for (int i = 0; i < 8; ++i) docs.push_back(reader.next().d_ids);
  torch::NoGradGuard no_grad;
  model->eval();
  auto sample = model->encoder->forward(docs[0].to(device), docs[0].to(device).ne(cfg.pad_id));
  auto pool = sample.flatten(0, 1).cpu();
  auto centroids = pool.index_select(0, torch::randperm(pool.size(0)).narrow(0, 0, 256));
  auto index = build_index(model, docs, centroids, device);
  std::cout << "indexed " << index.codes.size(0) << " tokens" << std::endl;

  auto q = reader.next().q_ids.narrow(0, 0, 1).to(device);
  auto cand = index.full[0].narrow(0, 0, 16).to(device);
  auto cmask = docs[0].narrow(0, 0, 16).ne(cfg.pad_id).to(device);
  auto top = model->score_candidates(q, cand, cmask).topk(5);
  std::cout << std::get<1>(top) << std::endl;
  return 0;
}
