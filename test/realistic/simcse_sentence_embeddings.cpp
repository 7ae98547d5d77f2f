// SimCSE (Gao et al. 2021) sentence embeddings on a small transformer encoder.
//
// Unsupervised: each sentence is encoded twice; the two dropout masks make the positive pair and
// the rest of the batch are negatives. Supervised: (anchor, entailment, contradiction) triplets,
// the contradictions concatenated to the candidates as hard negatives. Evaluation on STS pairs
// with a Spearman rank correlation computed on the CPU.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct SimCSEConfig {
  int64_t vocab_size = 30522;
  int64_t d_model = 384;
  int64_t n_heads = 6;
  int64_t n_layers = 4;
  int64_t ffn_dim = 1536;
  int64_t max_len = 64;
  double dropout = 0.1;
  double temperature = 0.05;
  double hard_negative_weight = 0.0;  // added to the anchor/own-hard-negative logits
  double mlp_scale = 1.0;
  bool mlp_only_train = true;
  std::string pooler = "avg";  // "avg" or "cls_avg"
  double lr = 3e-5;
  int epochs = 1;
};

struct SentenceBatch {
  torch::Tensor ids;   // [B, T] int64
  torch::Tensor mask;  // [B, T] int64, 1 on real tokens
};

struct TripletBatch {
  SentenceBatch anchor, positive, negative;  // negative.ids undefined for unsupervised batches
};

// Mean of the token states over real tokens. hidden: [B, T, D].
torch::Tensor mean_pool(const torch::Tensor& hidden, const torch::Tensor& mask) {
  auto m = mask.unsqueeze(-1).to(hidden.dtype());
  // FACT: h = torch.randn(2, 3, 4); hh = h; hh *= torch.zeros(2, 3, 1); assert shares_storage(h, hh) and h.abs().sum().item() == 0
  auto h = hidden;
  h *= m; // EXPECT: tensor-alias-then-mutate
  return h.sum(1) / m.sum(1).clamp_min(1e-9);
}

class SentenceEncoderImpl : public nn::Module {
 public:
  explicit SentenceEncoderImpl(const SimCSEConfig& cfg) : cfg_(cfg) {
    tok_ = register_module("tok", nn::Embedding(cfg.vocab_size, cfg.d_model));
    pos_ = register_module("pos", nn::Embedding(cfg.max_len, cfg.d_model));
    drop_ = register_module("drop", nn::Dropout(cfg.dropout));
    nn::TransformerEncoderLayer layer(
        nn::TransformerEncoderLayerOptions(cfg.d_model, cfg.n_heads).dim_feedforward(cfg.ffn_dim).dropout(cfg.dropout));
    encoder_ = register_module("encoder", nn::TransformerEncoder(nn::TransformerEncoderOptions(layer, cfg.n_layers)));
    mlp_ = register_module("mlp", nn::Linear(cfg.d_model, cfg.d_model));
  }

  // [B, T, D] token states (a transposed view of the sequence-first encoder output)
  torch::Tensor hidden_states(const torch::Tensor& ids, const torch::Tensor& mask) {
    auto positions = torch::arange(ids.size(1), ids.options());
    auto x = drop_(tok_(ids) + pos_(positions));
    auto h = encoder_->forward(x.transpose(0, 1), torch::Tensor(), mask.eq(0));
    return h.transpose(0, 1);
  }

  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask) {
    auto h = hidden_states(ids, mask);
    auto pooled = mean_pool(h, mask);
    if (cfg_.pooler == "cls_avg") pooled = 0.5 * (pooled + h.select(1, 0));
    if (is_training() || !cfg_.mlp_only_train) {
      auto z = torch::tanh(mlp_(pooled));
      if (cfg_.mlp_scale != 1.0) z.mul_(cfg_.mlp_scale); // EXPECT: tensor-inplace-on-saved
      return z;
    }
    return pooled;
  }

 private:
  SimCSEConfig cfg_;
  nn::Embedding tok_{nullptr}, pos_{nullptr};
  nn::Dropout drop_{nullptr};
  nn::TransformerEncoder encoder_{nullptr};
  nn::Linear mlp_{nullptr};
};
TORCH_MODULE(SentenceEncoder);

// InfoNCE over cosine similarities; z3 (hard negatives) may be undefined.
torch::Tensor contrastive_loss(const torch::Tensor& z1, const torch::Tensor& z2, const torch::Tensor& z3,
                               double temperature, double hard_negative_weight) {
  const auto B = z1.size(0);
  auto norm = F::NormalizeFuncOptions().dim(-1);
  auto a = F::normalize(z1, norm);
  auto cand = F::normalize(z3.defined() ? torch::cat({z2, z3}, 0) : z2, norm);  // [B or 2B, D]
  auto sim = torch::matmul(a, cand.t());
  sim.div_(temperature); // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
  if (z3.defined() && hard_negative_weight != 0.0) {
    auto weights = torch::zeros({B, 2 * B});
    weights.narrow(1, B, B).fill_diagonal_(hard_negative_weight);
    sim = sim + weights; // EXPECT: tensor-device-mismatch
  }
  auto labels = torch::arange(B, torch::TensorOptions().dtype(torch::kLong).device(sim.device())); // LOOKALIKE: tensor-device-mismatch -- made on sim's device
  return F::cross_entropy(sim, labels);
}

void train_simcse(SentenceEncoder& model, const std::vector<TripletBatch>& data, const SimCSEConfig& cfg) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr));
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    float epoch_loss = 0.f;
    int64_t steps = 0;
    auto align = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto& tb : data) {
      const auto B = tb.anchor.ids.size(0);
      const auto T = tb.anchor.ids.size(1);
      torch::Tensor loss;
      if (tb.negative.ids.defined()) {
        // one forward over [anchor_0, pos_0, neg_0, anchor_1, ...]
        // FACT: s = torch.zeros(3, 4, 6, dtype=torch.long); assert is_copy_of(s.transpose(0, 1).reshape(-1, 6), s)
        auto ids = torch::stack({tb.anchor.ids, tb.positive.ids, tb.negative.ids}).transpose(0, 1).reshape({-1, T}).to(device); // EXPECT: tensor-reshape-non-contiguous
        // FACT: a = torch.zeros(4, 6, dtype=torch.long); s = torch.stack([a, a, a], 1); assert is_view_of(s.view(-1, 6), s)
        auto mask = torch::stack({tb.anchor.mask, tb.positive.mask, tb.negative.mask}, 1).view({-1, T}).to(device); // LOOKALIKE: tensor-view-non-contiguous -- stacked on dim 1: already interleaved and contiguous
        // FACT: z = torch.tanh(torch.randn(12, 8)); assert is_contiguous(z) and is_view_of(z.view(4, 3, -1), z)
        auto z = model->forward(ids, mask).view({B, 3, -1}); // LOOKALIKE: tensor-view-non-contiguous -- the pooled/tanh output is a fresh contiguous [3B, D]
        loss = contrastive_loss(z.select(1, 0), z.select(1, 1), z.select(1, 2), cfg.temperature, cfg.hard_negative_weight);
      } else {
        // the same sentences twice: only the dropout masks differ
        auto ids = tb.anchor.ids.to(device);
        auto mask = tb.anchor.mask.to(device);
        auto z1 = model->forward(ids, mask);
        auto z2 = model->forward(ids, mask);
        loss = contrastive_loss(z1, z2, torch::Tensor(), cfg.temperature, 0.0);
        align += (F::normalize(z1, F::NormalizeFuncOptions().dim(-1)) - F::normalize(z2, F::NormalizeFuncOptions().dim(-1))).pow(2).sum(-1).mean().detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
      }
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.item<float>(); // EXPECT: tensor-sync-in-loop
      ++steps;
    }
    std::cout << "epoch " << epoch << " loss " << epoch_loss / std::max<int64_t>(steps, 1)
              << " align " << align.item<double>() / std::max<int64_t>(steps, 1) << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch
  }
}

// Encodes chunks of sentences; `pca_proj` [D, k] optionally reduces the dimension.
torch::Tensor encode_corpus(SentenceEncoder& model, const std::vector<SentenceBatch>& chunks, const torch::Tensor& pca_proj) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> out;
  for (const auto& c : chunks) {
    auto ids = c.ids.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different chunk each iteration
    auto z = model->forward(ids, c.mask.to(device));
    if (pca_proj.defined()) {
      auto W = pca_proj.to(device); // EXPECT: tensor-clone-in-loop
      z = torch::matmul(z, W);
    }
    out.push_back(z.cpu()); // LOOKALIKE: tensor-sync-in-loop -- the host copy is kept as data, not summed
  }
  return torch::cat(out, 0);
}

torch::Tensor fit_pca(const torch::Tensor& emb, int64_t k) {
  auto centered = emb.clone(); // EXPECT: tensor-unnecessary-clone
  centered -= emb.mean(0, /*keepdim=*/true);
  auto cov = centered.t().mm(centered) / static_cast<double>(emb.size(0) - 1);
  // FACT: c = torch.randn(5, 5); assert not raises(lambda: c.add_(c.t().clone()))
  cov.add_(cov.t().clone()).mul_(0.5); // LOOKALIKE: tensor-inplace-overlap -- the transpose is cloned before the in-place add
  auto eig = torch::linalg::eigh(cov, "L");
  auto vecs = std::get<1>(eig);  // ascending eigenvalues
  return vecs.narrow(1, vecs.size(1) - k, k).flip({1});
}

SentenceBatch pad_batch(const std::vector<std::vector<int64_t>>& seqs, int64_t pad_id, int64_t max_len) {
  const auto n = static_cast<int64_t>(seqs.size());
  int64_t T = 1;
  for (const auto& s : seqs) T = std::max<int64_t>(T, std::min<int64_t>(s.size(), max_len));
  SentenceBatch b;
  b.ids = torch::full({n, T}, pad_id, torch::kLong);
  b.mask = torch::zeros({n, T}, torch::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const auto len = std::min<int64_t>(seqs[i].size(), T);
    auto row = torch::from_blob(const_cast<int64_t*>(seqs[i].data()), {len}, torch::kLong);
    b.ids[i].narrow(0, 0, len).copy_(row); // LOOKALIKE: tensor-copy-narrowing -- int64 into int64
    b.mask[i].narrow(0, 0, len).fill_(1);
  }
  return b;
}

// Ranks starting at 1; tied values share their average rank.
std::vector<double> average_ranks(const torch::Tensor& v) {
  auto x = v.to(torch::kDouble).contiguous();
  const auto n = x.size(0);
  auto acc = x.accessor<double, 1>();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return acc[i] < acc[j]; });
  std::vector<double> ranks(n);
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j + 1 < n && acc[order[j + 1]] == acc[order[i]]) ++j;
    for (int64_t k = i; k <= j; ++k) ranks[order[k]] = 0.5 * static_cast<double>(i + j) + 1.0;
    i = j + 1;
  }
  return ranks;
}

double spearman(const torch::Tensor& pred, const torch::Tensor& gold) {
  auto rp = torch::tensor(average_ranks(pred), torch::kDouble);
  auto rg = torch::tensor(average_ranks(gold), torch::kDouble);
  auto dp = rp - rp.mean();
  auto dg = rg - rg.mean();
  return ((dp * dg).sum() / (dp.norm() * dg.norm()).clamp_min(1e-12)).item<double>();
}

struct STSPair {
  std::vector<int64_t> a, b;
  float gold = 0.f;  // 0 .. 5
};

double evaluate_sts(SentenceEncoder& model, const std::vector<STSPair>& pairs, const SimCSEConfig& cfg,
                    int64_t batch_size, int64_t pad_id, const torch::Tensor& pca_proj) {
  const auto N = static_cast<int64_t>(pairs.size());
  auto gold = torch::empty({N}, torch::kLong);  // gold labels, filled chunk by chunk
  std::vector<SentenceBatch> left, right;
  for (int64_t off = 0; off < N; off += batch_size) {
    const auto n = std::min(batch_size, N - off);
    std::vector<float> scores(n);
    std::vector<std::vector<int64_t>> sa, sb;
    for (int64_t i = 0; i < n; ++i) {
      scores[i] = pairs[off + i].gold;
      sa.push_back(pairs[off + i].a);
      sb.push_back(pairs[off + i].b);
    }
    left.push_back(pad_batch(sa, pad_id, cfg.max_len));
    right.push_back(pad_batch(sb, pad_id, cfg.max_len));
    gold.narrow(0, off, n).copy_(torch::from_blob(scores.data(), {n}, torch::kFloat)); // EXPECT: tensor-copy-narrowing
  }
  auto ea = encode_corpus(model, left, pca_proj);
  auto eb = encode_corpus(model, right, pca_proj);
  auto cos = F::cosine_similarity(ea, eb, F::CosineSimilarityFuncOptions().dim(1));
  return spearman(cos, gold);
}
