// kNN-LM (Khandelwal et al., 2020) on top of an LSTM language model, plus the continuous cache
// of Grave et al. for single-document streaming evaluation.
//
//   1. build: run the LM over the training stream in chunks and store (hidden state -> next token)
//   2. search: squared-L2 nearest neighbours of every query state, in query batches
//   3. p(w) = lambda * p_kNN(w) + (1 - lambda) * p_LM(w), evaluated as perplexity
//
// The datastore lives in host memory (fp16 keys, 16-bit values, as in the reference code); the LM
// runs on the GPU.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct KnnLMConfig {
  int64_t vocab_size = 50257;
  int64_t d_embed = 400;
  int64_t hidden = 1024;
  int64_t n_layers = 2;
  int64_t dstore_capacity = 1 << 22;
  int64_t k = 64;
  int64_t query_batch = 512;
  double knn_temperature = 10.0;
  double lambda = 0.25;
  int64_t cache_size = 2000;
  double cache_theta = 0.3;
  double cache_lambda = 0.1;
  int64_t log_every = 50;
};

struct LMBatch {
  torch::Tensor input;   // [B, T] token ids
  torch::Tensor target;  // [B, T] next tokens
};

struct LMOutput {
  torch::Tensor logits;  // [B, T, V]
  torch::Tensor hidden;  // [B, T, H], the last LSTM layer: the kNN key
};

struct LSTMLanguageModelImpl : torch::nn::Module {
  explicit LSTMLanguageModelImpl(const KnnLMConfig& cfg) {
    emb = register_module("emb", torch::nn::Embedding(cfg.vocab_size, cfg.d_embed));
    lstm = register_module(
        "lstm", torch::nn::LSTM(torch::nn::LSTMOptions(cfg.d_embed, cfg.hidden).num_layers(cfg.n_layers).batch_first(true)));
    proj = register_module("proj", torch::nn::Linear(cfg.hidden, cfg.vocab_size));
  }

  LMOutput forward(const torch::Tensor& ids) {
    auto h = std::get<0>(lstm->forward(emb(ids)));
    return {proj(h), h};
  }

  torch::nn::Embedding emb{nullptr};
  torch::nn::LSTM lstm{nullptr};
  torch::nn::Linear proj{nullptr};
};
TORCH_MODULE(LSTMLanguageModel);

void load_embeddings(LSTMLanguageModel& lm, const torch::Tensor& vectors) {
  torch::NoGradGuard no_grad;
  lm->emb->weight.copy_(vectors);  // LOOKALIKE: tensor-inplace-on-leaf -- weight loading under NoGradGuard
}

// ---------------------------------------------------------------------------------------------

class Datastore {
 public:
  Datastore(int64_t capacity, int64_t dim)
      : keys_(torch::empty({capacity, dim}, torch::kHalf)), vals_(torch::empty({capacity}, torch::kInt16)) {}

  int64_t size() const { return size_; }

  void add(const torch::Tensor& keys, const torch::Tensor& next_tokens) {
    const auto n = keys.size(0);
    TORCH_CHECK(size_ + n <= keys_.size(0), "datastore is full");
    keys_.narrow(0, size_, n).copy_(keys);  // LOOKALIKE: tensor-copy-narrowing -- float32 -> float16 keys; LSTM states lie in (-1, 1)
    vals_.narrow(0, size_, n).copy_(next_tokens);  // EXPECT: tensor-copy-narrowing
    size_ += n;
  }

  // Squared L2 distances [Q, k] and next-token ids [Q, k] of the k nearest keys.
  std::pair<torch::Tensor, torch::Tensor> search(const torch::Tensor& queries, int64_t k, int64_t batch) const {
    const auto Q = queries.size(0);
    auto keys = keys_.narrow(0, 0, size_);
    std::vector<torch::Tensor> dists, ids;
    for (int64_t s = 0; s < Q; s += batch) {
      const auto n = std::min(batch, Q - s);
      auto q = queries.narrow(0, s, n);
      auto kf = keys.to(torch::kFloat);  // EXPECT: tensor-clone-in-loop
      auto d = q.pow(2).sum(-1, /*keepdim=*/true) - 2 * q.matmul(kf.t()) + kf.pow(2).sum(-1).unsqueeze(0);
      auto top = d.topk(k, -1, /*largest=*/false);
      dists.push_back(std::get<0>(top));
      ids.push_back(std::get<1>(top));
    }
    auto idx = torch::cat(ids, 0);
    // FACT: v = torch.zeros(10, dtype=torch.int16); i = torch.randint(0, 10, (6, 4)); g = v.index_select(0, i.flatten()); assert is_contiguous(g) and is_view_of(g.view_as(i), g)
    auto toks = vals_.index_select(0, idx.flatten()).view_as(idx);  // LOOKALIKE: tensor-view-non-contiguous -- index_select output is contiguous
    return {torch::cat(dists, 0), toks.to(torch::kLong)};
  }

 private:
  torch::Tensor keys_;
  torch::Tensor vals_;
  int64_t size_ = 0;
};

Datastore build_datastore(LSTMLanguageModel& lm, const std::vector<LMBatch>& train, const KnnLMConfig& cfg) {
  torch::NoGradGuard no_grad;
  lm->eval();
  Datastore ds(cfg.dstore_capacity, cfg.hidden);
  for (const auto& batch : train) {
    auto out = lm->forward(batch.input);
    // FACT: lstm = torch.nn.LSTM(4, 6, num_layers=2, batch_first=True); h = lstm(torch.randn(3, 5, 4))[0]; assert not is_contiguous(h) and is_copy_of(h.reshape(-1, 6), h)
    auto keys = out.hidden.reshape({-1, out.hidden.size(-1)});  // EXPECT: tensor-reshape-non-contiguous
    ds.add(keys, batch.target.flatten());
    if (ds.size() >= cfg.dstore_capacity) break;
  }
  std::cout << "datastore: " << ds.size() << " entries" << std::endl;
  return ds;
}

// log p_kNN over the vocabulary from neighbour distances and their next tokens.
torch::Tensor knn_log_probs(const torch::Tensor& dists, const torch::Tensor& tokens, int64_t vocab, double temperature) {
  // FACT: d = torch.rand(6, 4); t = d.to(torch.float); t.div_(-10.0); assert shares_storage(t, d) and bool((d <= 0).all())
  auto logits = dists.to(torch::kFloat);  // fp16 stores hand back half distances
  logits.div_(-temperature);  // EXPECT: tensor-alias-then-mutate
  auto w = torch::softmax(logits, -1);
  auto probs = torch::zeros({dists.size(0), vocab}).scatter_add_(1, tokens, w);
  return probs.clamp_min(1e-10).log();
}

// ---------------------------------------------------------------------------------------------

double evaluate_knn_lm(LSTMLanguageModel& lm, const Datastore& ds, const std::vector<LMBatch>& eval,
                       const KnnLMConfig& cfg) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  lm->to(device);
  lm->eval();

  auto log1m_lambda = torch::tensor(std::log1p(-cfg.lambda));
  auto log_lambda = torch::tensor(std::log(cfg.lambda));
  double lm_nll_sum = 0.0, mean_nn_dist = 0.0;
  int64_t n_tokens = 0, step = 0;
  std::vector<torch::Tensor> knn_nll_per_batch;

  for (const auto& batch : eval) {
    const auto B = batch.input.size(0), T = batch.input.size(1);
    auto target = batch.target.to(device);
    auto out = lm->forward(batch.input.to(device));
    auto lm_lp = torch::log_softmax(out.logits, -1);  // [B, T, V]

    // FACT: lstm = torch.nn.LSTM(4, 6, batch_first=True); h = lstm(torch.randn(3, 5, 4))[0].contiguous(); assert is_view_of(h.view(-1, 6), h)
    auto queries = out.hidden.contiguous().view({-1, out.hidden.size(-1)});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
    auto nn = ds.search(queries.cpu(), cfg.k, cfg.query_batch);
    auto knn_lp = knn_log_probs(nn.first, nn.second, cfg.vocab_size, cfg.knn_temperature).view({B, T, -1});

    auto lm_part = lm_lp + log1m_lambda;  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor is allowed with CUDA operands
    auto mixed = torch::logaddexp(lm_part, knn_lp + log_lambda);  // EXPECT: tensor-device-mismatch
    auto knn_nll = -mixed.gather(-1, target.unsqueeze(-1)).squeeze(-1);
    auto lm_nll = -lm_lp.gather(-1, target.unsqueeze(-1)).squeeze(-1);

    knn_nll_per_batch.push_back(knn_nll.sum());  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    lm_nll_sum += lm_nll.sum().item<double>();  // EXPECT: tensor-sync-in-loop
    mean_nn_dist += nn.first.select(1, 0).mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- search results live on the host
    n_tokens += B * T;

    if (++step % cfg.log_every == 0)
      std::cout << "batch " << step << " lm nll/token " << lm_nll.mean().item<float>() << std::endl;  // LOOKALIKE: tensor-sync-in-loop -- only every log_every batches
  }

  const double knn_nll_sum = torch::stack(knn_nll_per_batch).sum().item<double>();
  std::cout << "LM ppl " << std::exp(lm_nll_sum / n_tokens) << "  kNN-LM ppl " << std::exp(knn_nll_sum / n_tokens)
            << "  mean 1-NN dist " << mean_nn_dist / std::max<int64_t>(step, 1) << std::endl;
  return std::exp(knn_nll_sum / n_tokens);
}

// ---------------------------------------------------------------------------------------------
// Continuous cache for streaming evaluation of one document (batch of one, on the host).

class RecentStateCache {
 public:
  RecentStateCache(int64_t size, int64_t dim)
      : states_(torch::zeros({size, dim})), tokens_(torch::zeros({size}, torch::kLong)) {}

  void push(const torch::Tensor& h, int64_t next_token) {
    const auto n = states_.size(0);
    // FACT: s = torch.randn(6, 3); assert raises(lambda: s.narrow(0, 0, 5).copy_(s.narrow(0, 1, 5)), "some elements")
    states_.narrow(0, 0, n - 1).copy_(states_.narrow(0, 1, n - 1));  // EXPECT: tensor-inplace-overlap
    // FACT: s = torch.zeros(6, 3); h = torch.randn(3); s[5].copy_(h); assert torch.equal(s[5], h) and not shares_storage(s, h)
    states_[n - 1].copy_(h);  // LOOKALIKE: tensor-inplace-overlap -- the source is another tensor
    tokens_ = torch::roll(tokens_, -1, 0);
    tokens_[n - 1] = next_token;
    filled_ = std::min(filled_ + 1, n);
  }

  torch::Tensor mix(const torch::Tensor& p_lm, const torch::Tensor& h, double theta, double lam) const {
    if (filled_ == 0) return p_lm;
    const auto n = states_.size(0);
    auto recent = states_.narrow(0, n - filled_, filled_);
    auto w = torch::softmax(theta * recent.matmul(h), 0);
    auto p_cache = torch::zeros_like(p_lm).index_add_(0, tokens_.narrow(0, n - filled_, filled_), w);
    return (1.0 - lam) * p_lm + lam * p_cache;
  }

 private:
  torch::Tensor states_, tokens_;
  int64_t filled_ = 0;
};

double stream_nll_with_cache(LSTMLanguageModel& lm, const torch::Tensor& doc, const KnnLMConfig& cfg) {
  torch::NoGradGuard no_grad;
  lm->to(torch::kCPU);
  const auto T = doc.size(0) - 1;
  auto out = lm->forward(doc.narrow(0, 0, T).unsqueeze(0));
  auto lm_p = torch::softmax(out.logits.squeeze(0), -1);  // [T, V]
  auto hidden = out.hidden.squeeze(0);                     // [T, H]
  RecentStateCache cache(cfg.cache_size, hidden.size(-1));
  double nll = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const auto next = doc[t + 1].item<int64_t>();
    auto p = cache.mix(lm_p[t], hidden[t], cfg.cache_theta, cfg.cache_lambda);
    nll -= std::log(p[next].item<double>());  // LOOKALIKE: tensor-sync-in-loop -- everything here is on the CPU
    cache.push(hidden[t], next);
  }
  return nll / static_cast<double>(T);
}

int main() {
  KnnLMConfig cfg;
  cfg.hidden = 256;
  cfg.d_embed = 128;
  cfg.dstore_capacity = 1 << 16;
  LSTMLanguageModel lm(cfg);
  load_embeddings(lm, torch::randn({cfg.vocab_size, cfg.d_embed}) * 0.1);

  std::vector<LMBatch> train, eval;
  for (int i = 0; i < 8; ++i) {
    auto stream = torch::randint(0, cfg.vocab_size, {4, 129});
    LMBatch b{stream.narrow(1, 0, 128).contiguous(), stream.narrow(1, 1, 128).contiguous()};
    (i < 6 ? train : eval).push_back(b);
  }
  auto ds = build_datastore(lm, train, cfg);
  evaluate_knn_lm(lm, ds, eval, cfg);
  std::cout << "cache ppl " << std::exp(stream_nll_with_cache(lm, torch::randint(0, cfg.vocab_size, {300}), cfg))
            << std::endl;
  return 0;
}
