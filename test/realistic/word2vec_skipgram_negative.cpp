// Word2vec skip-gram with negative sampling (Mikolov et al. 2013) for a domain-specific corpus
// (support tickets). The corpus is packed as int32 ids; frequent words are subsampled with the
// (sqrt(f / t) + 1) * t / f rule, context windows are shrunk at random per centre word, and K
// negatives per pair are drawn from the unigram^0.75 distribution. Both embedding tables are
// sparse: plain SGD with a linearly decaying rate touches only the rows of the batch. Probe words'
// nearest neighbours and a word-similarity benchmark are reported during training, and the
// averaged input/output vectors are written out at the end.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct W2VConfig {
  int64_t dim = 300, window = 5, negatives = 5, batch_size = 4096, epochs = 5;
  double subsample_t = 1e-5, lr = 0.025, min_lr = 1e-4, noise_power = 0.75, max_score = 6.0;
  int64_t log_every = 1000, probe_every = 20000, probe_k = 8;
};

struct Vocab {
  std::vector<std::string> words;
  std::unordered_map<std::string, int64_t> index;
  std::vector<int64_t> counts; // corpus frequency of each word, index order
  int64_t total = 0;
};

// Probability of keeping an occurrence of each word, capped at 1.
torch::Tensor keep_probabilities(const Vocab &vocab, double t) {
  auto freq = torch::tensor(vocab.counts, torch::kDouble) / static_cast<double>(vocab.total);
  auto keep = (torch::sqrt(freq / t) + 1.0) * t / freq;
  return keep.clamp_max(1.0).to(torch::kFloat);
}

// Unigram counts raised to 0.75 and normalised: the noise distribution of the negatives.
torch::Tensor noise_distribution(const Vocab &vocab, double power) {
  auto counts = torch::tensor(vocab.counts, torch::kDouble);
  auto weights = counts.pow(power);
  // FACT: c = torch.tensor([50.0, 3.0, 1.0], dtype=torch.float64); w = c.pow(0.75); w /= w.sum(); assert is_copy_of(w, c) and torch.equal(c, torch.tensor([50.0, 3.0, 1.0], dtype=torch.float64))
  weights /= weights.sum(); // LOOKALIKE: tensor-alias-then-mutate -- pow made a tensor of its own: the counts are untouched
  auto probs = torch::empty({static_cast<int64_t>(vocab.counts.size())});
  // FACT: p = torch.empty(2); p.copy_(torch.tensor([0.1, 1.0 / 3.0], dtype=torch.float64)); assert p.dtype == torch.float32 and p[1].item() != 1.0 / 3.0
  probs.copy_(weights); // EXPECT: tensor-copy-narrowing -- the float64 probabilities are rounded to float32 without a word
  return probs;
}

// The corpus, packed: int32 ids (half the memory of int64), one offset per sentence start.
struct PackedCorpus {
  torch::Tensor ids;
  std::vector<int64_t> offsets;
  size_t sentences() const { return offsets.size() - 1; }
  torch::Tensor sentence(size_t i) const {
    return ids.slice(0, offsets[i], offsets[i + 1]).to(torch::kLong);
  }
};

PackedCorpus pack_corpus(const std::vector<std::vector<int64_t>> &sentences) {
  PackedCorpus c;
  c.offsets.push_back(0);
  for (const auto &s : sentences)
    c.offsets.push_back(c.offsets.back() + static_cast<int64_t>(s.size()));
  c.ids = torch::empty({c.offsets.back()}, torch::kInt);
  for (size_t i = 0; i < sentences.size(); ++i) {
    const auto n = c.offsets[i + 1] - c.offsets[i];
    // FACT: d = torch.empty(3, dtype=torch.int32); d.copy_(torch.tensor([7, 120000, 2])); assert d.tolist() == [7, 120000, 2]
    c.ids.narrow(0, c.offsets[i], n).copy_(torch::tensor(sentences[i])); // LOOKALIKE: tensor-copy-narrowing -- word ids are below the vocabulary size, far inside int32
  }
  return c;
}

struct PairBatch {
  torch::Tensor centers, contexts; // [P] int64 each
};

// Subsamples one sentence and emits its (centre, context) pairs; each centre word draws its own
// window radius in [1, window], as the reference implementation does.
PairBatch sentence_pairs(const torch::Tensor &sentence, const torch::Tensor &keep_prob, int64_t window) {
  auto keep = torch::rand({sentence.size(0)}) < keep_prob.index_select(0, sentence);
  auto kept = sentence.masked_select(keep);
  const auto L = kept.size(0);
  auto reach = torch::randint(1, window + 1, {L}, torch::kLong);
  std::vector<torch::Tensor> centers, contexts;
  for (int64_t d = 1; d <= std::min(window, L - 1); ++d) {
    auto left = kept.narrow(0, 0, L - d), right = kept.narrow(0, d, L - d);
    auto fwd = reach.narrow(0, 0, L - d) >= d; // centre on the left, context d words later
    auto bwd = reach.narrow(0, d, L - d) >= d; // centre on the right, context d words earlier
    centers.push_back(left.masked_select(fwd)); // LOOKALIKE: tensor-graph-kept-across-iterations -- integer word ids: there is no graph
    contexts.push_back(right.masked_select(fwd));
    centers.push_back(right.masked_select(bwd));
    contexts.push_back(left.masked_select(bwd));
  }
  if (centers.empty())
    return {torch::empty({0}, torch::kLong), torch::empty({0}, torch::kLong)};
  return {torch::cat(centers), torch::cat(contexts)};
}

struct SkipGramImpl : nn::Module {
  SkipGramImpl(int64_t vocab, int64_t dim, double max_score) : max_score_(max_score) {
    in_embed = register_module("in_embed", nn::Embedding(nn::EmbeddingOptions(vocab, dim).sparse(true)));
    out_embed = register_module("out_embed", nn::Embedding(nn::EmbeddingOptions(vocab, dim).sparse(true)));
    const double r = 0.5 / static_cast<double>(dim);
    // FACT: e = torch.nn.Embedding(10, 4); torch.nn.init.uniform_(e.weight, -0.1, 0.1); assert e.weight.is_leaf and e.weight.requires_grad
    nn::init::uniform_(in_embed->weight, -r, r); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    // Output vectors start at zero, as in the C implementation.
    // FACT: e = torch.nn.Embedding(10, 4); assert raises(lambda: e.weight.zero_(), "a leaf Variable that requires grad")
    out_embed->weight.zero_(); // EXPECT: tensor-inplace-on-leaf -- grad mode is on in the constructor: the write on the parameter throws
  }

  // Negative-sampling loss for centres [B], contexts [B] and negatives [B, K].
  torch::Tensor forward(const torch::Tensor &centers, const torch::Tensor &contexts, const torch::Tensor &negatives) {
    auto v = in_embed(centers);       // [B, D]
    auto u_pos = out_embed(contexts); // [B, D]
    auto u_neg = out_embed(negatives); // [B, K, D]
    auto pos = (v * u_pos).sum(1);
    // FACT: v = torch.randn(4, 3, requires_grad=True); u = torch.randn(4, 3, requires_grad=True); s = (v * u).sum(1); s.clamp_(-6.0, 6.0); torch.nn.functional.logsigmoid(s).sum().backward(); assert v.grad is not None
    pos.clamp_(-max_score_, max_score_); // LOOKALIKE: tensor-inplace-on-saved -- sum saves nothing, and logsigmoid reads the clamped values after the write
    auto neg = torch::bmm(u_neg, v.unsqueeze(2)).squeeze(2); // [B, K]
    auto p_neg = torch::sigmoid(-neg);
    // FACT: n = torch.randn(4, 5, requires_grad=True); p = torch.sigmoid(-n); p.clamp_min_(1e-7); assert backward_fails(lambda: torch.log(p).sum().backward())
    p_neg.clamp_min_(1e-7); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its result for backward: loss.backward() throws
    return -(F::logsigmoid(pos) + torch::log(p_neg).sum(1)).mean();
  }

  nn::Embedding in_embed{nullptr}, out_embed{nullptr};
  double max_score_;
};
TORCH_MODULE(SkipGram);

// Plain SGD on the rows the batch touched; the embedding gradients are sparse.
void sparse_sgd_step(SkipGram &model, double lr) {
  torch::NoGradGuard no_grad;
  for (auto &w : model->parameters()) {
    if (!w.grad().defined())
      continue;
    auto g = w.grad().coalesce();
    w.index_add_(0, g.indices().squeeze(0), g.values() * -lr); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    w.mutable_grad().reset();
  }
}

class Word2VecTrainer {
public:
  Word2VecTrainer(const Vocab &vocab, const W2VConfig &cfg)
      : vocab_(vocab), cfg_(cfg), device_(torch::kCUDA),
        model_(static_cast<int64_t>(vocab.words.size()), cfg.dim, cfg.max_score) {
    model_->to(device_);
    keep_prob_ = keep_probabilities(vocab, cfg.subsample_t);
    noise_ = noise_distribution(vocab, cfg.noise_power);
  }

  void train(const PackedCorpus &corpus, const std::vector<int64_t> &probes) {
    const auto K = cfg_.negatives;
    const double total_steps = static_cast<double>(cfg_.epochs * corpus.ids.size(0)) / static_cast<double>(cfg_.batch_size);
    int64_t step = 0;
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device_));
      int64_t batches = 0, buffered = 0;
      std::vector<torch::Tensor> c_buf, x_buf;
      for (size_t s = 0; s < corpus.sentences(); ++s) {
        auto pairs = sentence_pairs(corpus.sentence(s), keep_prob_, cfg_.window);
        if (pairs.centers.numel() == 0)
          continue;
        c_buf.push_back(pairs.centers);
        x_buf.push_back(pairs.contexts);
        buffered += pairs.centers.size(0);
        if (buffered < cfg_.batch_size)
          continue;

        auto centers = torch::cat(c_buf).to(device_); // LOOKALIKE: tensor-clone-in-loop -- a new batch of pairs every time
        auto contexts = torch::cat(x_buf).to(device_);
        c_buf.clear();
        x_buf.clear();
        buffered = 0;
        const auto B = centers.size(0);
        auto noise = noise_.to(device_); // EXPECT: tensor-clone-in-loop -- the same noise table is copied to the GPU for every batch
        // FACT: m = torch.multinomial(torch.rand(50), 4 * 5, True); assert is_contiguous(m) and is_view_of(m.view(4, 5), m)
        auto negatives = torch::multinomial(noise, B * K, /*replacement=*/true).view({B, K}); // LOOKALIKE: tensor-view-non-contiguous -- multinomial returns a fresh contiguous vector

        auto loss = model_->forward(centers, contexts, negatives);
        model_->zero_grad();
        loss.backward();
        const double lr = std::max(cfg_.min_lr, cfg_.lr * (1.0 - static_cast<double>(step) / total_steps));
        sparse_sgd_step(model_, lr);
        epoch_loss += loss; // EXPECT: tensor-graph-kept-across-iterations -- the undetached loss keeps every batch's graph until the epoch ends
        ++batches;
        if (++step % cfg_.log_every == 0)
          std::printf("step %lld lr %.5f loss %.4f\n", static_cast<long long>(step), lr, loss.item<double>()); // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
        if (step % cfg_.probe_every == 0)
          print_neighbours(probes);
      }
      std::printf("epoch %lld mean loss %.4f\n", static_cast<long long>(epoch),
                  epoch_loss.item<double>() / static_cast<double>(std::max<int64_t>(batches, 1))); // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after its batches
    }
  }

  // The k nearest words by cosine similarity of the input vectors, for each probe word.
  std::vector<std::vector<int64_t>> nearest(const std::vector<int64_t> &probe_ids, int64_t k) {
    auto emb = model_->in_embed->weight.detach();
    emb.div_(emb.norm(2, 1, /*keepdim=*/true).clamp_min(1e-8)); // EXPECT: tensor-inplace-on-detached -- normalises the live input vectors that training goes on updating
    auto ids = torch::tensor(probe_ids).to(device_);
    auto sims = emb.index_select(0, ids).mm(emb.t()); // [P, V]
    auto scores = sims.clone(); // EXPECT: tensor-unnecessary-clone -- sims is never read again: sims.scatter(...) gives the same tensor in one pass
    scores.scatter_(1, ids.unsqueeze(1), -2.0);
    auto top = std::get<1>(scores.topk(k, 1)).cpu();
    std::vector<std::vector<int64_t>> out(probe_ids.size());
    for (int64_t i = 0; i < top.size(0); ++i)
      for (int64_t j = 0; j < k; ++j)
        out[i].push_back(top[i][j].item<int64_t>()); // LOOKALIKE: tensor-sync-in-loop -- top is already a host tensor, and the ids are data
    return out;
  }

  void print_neighbours(const std::vector<int64_t> &probes) {
    const auto nn_ids = nearest(probes, cfg_.probe_k);
    for (size_t i = 0; i < probes.size(); ++i) {
      std::string line = vocab_.words[probes[i]] + ":";
      for (auto id : nn_ids[i])
        line += " " + vocab_.words[id];
      std::printf("%s\n", line.c_str());
    }
  }

  // Pearson correlation between cosine similarity and human scores on a word-pair benchmark.
  double similarity_correlation(const std::vector<int64_t> &a, const std::vector<int64_t> &b,
                                const std::vector<float> &human_scores) {
    torch::NoGradGuard no_grad;
    auto unit = F::normalize(model_->in_embed->weight, F::NormalizeFuncOptions().dim(1));
    auto ia = torch::tensor(a).to(device_), ib = torch::tensor(b).to(device_);
    auto cos = (unit.index_select(0, ia) * unit.index_select(0, ib)).sum(1);
    auto human = torch::tensor(human_scores);
    auto hc = human - human.mean();
    auto mc = cos - cos.mean();
    return ((hc * mc).sum() / (hc.norm() * mc.norm())).item<double>(); // EXPECT: tensor-device-mismatch -- the human scores stayed on the host, the cosines are on the GPU
  }

  // Final vectors: the mean of the input and output tables, one text line per word.
  void save_vectors(const std::string &path) {
    auto vecs = (model_->in_embed->weight + model_->out_embed->weight).detach().cpu();
    // FACT: a = torch.randn(4, 3, requires_grad=True); b = torch.randn(4, 3, requires_grad=True); v = (a + b).detach(); v.mul_(0.5); assert is_copy_of(v, a) and is_copy_of(v, b)
    vecs.mul_(0.5); // LOOKALIKE: tensor-inplace-on-detached -- the sum is a tensor of its own: neither table changes
    auto acc = vecs.accessor<float, 2>();
    FILE *f = std::fopen(path.c_str(), "w");
    if (!f)
      return;
    std::fprintf(f, "%lld %lld\n", static_cast<long long>(vecs.size(0)), static_cast<long long>(vecs.size(1)));
    for (int64_t i = 0; i < vecs.size(0); ++i) {
      std::fprintf(f, "%s", vocab_.words[i].c_str());
      for (int64_t j = 0; j < vecs.size(1); ++j)
        std::fprintf(f, " %.6f", acc[i][j]);
      std::fprintf(f, "\n");
    }
    std::fclose(f);
  }

private:
  const Vocab &vocab_;
  W2VConfig cfg_;
  torch::Device device_;
  SkipGram model_;
  torch::Tensor keep_prob_, noise_;
};

void run_word2vec(const Vocab &vocab, const std::vector<std::vector<int64_t>> &sentences,
                  const std::vector<std::string> &probe_words, const std::vector<int64_t> &bench_a,
                  const std::vector<int64_t> &bench_b, const std::vector<float> &bench_scores,
                  const W2VConfig &cfg, const std::string &out_path) {
  auto corpus = pack_corpus(sentences);
  std::vector<int64_t> probes;
  for (const auto &w : probe_words) {
    auto it = vocab.index.find(w);
    if (it != vocab.index.end())
      probes.push_back(it->second);
  }
  Word2VecTrainer trainer(vocab, cfg);
  trainer.train(corpus, probes);
  std::printf("word similarity r = %.3f\n", trainer.similarity_correlation(bench_a, bench_b, bench_scores));
  trainer.save_vectors(out_path);
}
