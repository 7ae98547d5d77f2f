// Batched CTC decoding for the ASR eval job: conv-subsampled LSTM encoder -> CTC log-probs ->
// prefix beam search on the CPU with a bigram LM (shallow fusion) -> word error rate.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct DecodeConfig {
  int64_t beam_size = 8;
  int64_t prune_topk = 16;  // tokens kept per frame before extending prefixes
  double lm_weight = 0.5;
  double token_bonus = 0.8;
  double blank_penalty = 0.0;
  double blank_skip = -0.01;  // frames whose blank log-prob is above this are skipped
  double temperature = 1.0;
  int64_t blank = 0;
  int64_t space = 1;  // word boundary token
  int64_t bos = 2;
};

class AcousticEncoderImpl : public nn::Module {
 public:
  AcousticEncoderImpl(int64_t n_mels, int64_t channels, int64_t hidden, int64_t vocab)
      : hidden_(hidden),
        conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, channels, 3).stride(2)))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).stride(2)))),
        proj_in(register_module("proj_in", nn::Linear(channels * (((n_mels - 1) / 2 - 1) / 2), hidden))),
        lstm(register_module("lstm", nn::LSTM(nn::LSTMOptions(hidden, hidden).num_layers(2).batch_first(true)))),
        out(register_module("out", nn::Linear(hidden, vocab))) {}

  // feats: [B, T, F] -> logits [B, T', V]
  torch::Tensor forward(const torch::Tensor& feats) {
    auto x = torch::relu(conv1(feats.unsqueeze(1)));
    x = torch::relu(conv2(x));  // [B, C, T', F']
    const int64_t B = x.size(0), C = x.size(1), Tp = x.size(2), Fp = x.size(3);
    // FACT: x = torch.randn(2, 4, 5, 3); assert is_contiguous(x.transpose(1, 2).contiguous()) and x.transpose(1, 2).contiguous().view(2, 5, 12).shape == (2, 5, 12)
    x = x.transpose(1, 2).contiguous().view({B, Tp, C * Fp});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() right before the view
    auto rnn = lstm->forward(proj_in(x));
    auto h = std::get<0>(rnn);  // [B, T', H]
    // FACT: lstm = torch.nn.LSTM(4, 6, batch_first=True); h, _ = lstm(torch.randn(3, 5, 4)); assert raises(lambda: h.view(-1, 6), "view size is not compatible")
    auto frames = h.view({-1, hidden_});  // EXPECT: tensor-view-non-contiguous
    return out(frames).view({B, Tp, -1});
  }

 private:
  int64_t hidden_;
  nn::Conv2d conv1, conv2;
  nn::Linear proj_in;
  nn::LSTM lstm;
  nn::Linear out;
};
TORCH_MODULE(AcousticEncoder);

// Bigram LM as a dense [V, V] table of log P(token | previous token), float32.
class BigramLM {
 public:
  explicit BigramLM(int64_t vocab) : table_(torch::full({vocab, vocab}, -10.0)) {}
  void load(const std::vector<float>& logp) {
    const int64_t V = table_.size(0);
    TORCH_CHECK(static_cast<int64_t>(logp.size()) == V * V, "bigram table size mismatch");
    table_.copy_(torch::from_blob(const_cast<float*>(logp.data()), {V, V}, torch::kFloat));
  }
  const torch::Tensor& table() const { return table_; }

 private:
  torch::Tensor table_;
};

// Utterance-level CMVN; Kaldi pitch features (appended after the mel bins) only get the mean.
torch::Tensor normalize_features(const torch::Tensor& feats, int64_t n_mels) {
  if (feats.size(2) == n_mels) {
    auto x = feats.contiguous();
    // FACT: f = torch.randn(2, 5, 4); x = f.contiguous(); x.sub_(x.mean(1, keepdim=True)); assert shares_storage(x, f) and f.mean(1).abs().max() < 1e-5
    x.sub_(x.mean({1}, true)).div_(x.std({1}, true, true).clamp_min(1e-5));  // EXPECT: tensor-alias-then-mutate
    return x;
  }
  auto fbank = feats.narrow(2, 0, n_mels);
  auto pitch = feats.narrow(2, n_mels, feats.size(2) - n_mels).contiguous();
  // FACT: f = torch.randn(2, 5, 83); p = f.narrow(2, 80, 3).contiguous(); p.sub_(1.0); assert is_copy_of(p, f)
  pitch.sub_(pitch.mean({1}, true));  // LOOKALIKE: tensor-alias-then-mutate -- trailing columns are not contiguous, so contiguous() copied
  auto fb = (fbank - fbank.mean({1}, true)) / fbank.std({1}, true, true).clamp_min(1e-5);
  return torch::cat({fb, pitch}, 2);
}

struct Hypothesis {
  std::vector<int64_t> tokens;
  double score;
};

static double log_add(double a, double b) {
  if (a == -std::numeric_limits<double>::infinity()) return b;
  if (b == -std::numeric_limits<double>::infinity()) return a;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::fabs(a - b)));
}

// CTC prefix beam search over one utterance's [T, V] CPU log-probs.
std::vector<Hypothesis> prefix_beam_search(const torch::Tensor& log_probs, const torch::Tensor& lm_table,
                                           const DecodeConfig& cfg) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  struct Score { double pb = kNegInf, pnb = kNegInf; double total() const { return log_add(pb, pnb); } };
  const int64_t T = log_probs.size(0), V = log_probs.size(1);
  auto lp = log_probs.accessor<float, 2>();
  auto lm = lm_table.accessor<double, 2>();

  std::map<std::vector<int64_t>, Score> beams;
  beams[{}].pb = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    if (log_probs[t][cfg.blank].item<float>() > cfg.blank_skip) continue;  // LOOKALIKE: tensor-sync-in-loop -- a CPU tensor, and the value steers the loop
    auto top_ids = std::get<1>(log_probs[t].topk(std::min(cfg.prune_topk, V)));
    auto ids = top_ids.accessor<int64_t, 1>();
    std::map<std::vector<int64_t>, Score> next;
    for (const auto& entry : beams) {
      const auto& prefix = entry.first;
      const Score& sc = entry.second;
      const int64_t last = prefix.empty() ? -1 : prefix.back();
      for (int64_t j = 0; j < ids.size(0); ++j) {
        const int64_t c = ids[j];
        const double p = lp[t][c];
        if (c == cfg.blank) {
          next[prefix].pb = log_add(next[prefix].pb, sc.total() + p - cfg.blank_penalty);
          continue;
        }
        auto ext = prefix;
        ext.push_back(c);
        const double fused = cfg.lm_weight * lm[last < 0 ? cfg.bos : last][c] + cfg.token_bonus;
        if (c == last) {
          next[ext].pnb = log_add(next[ext].pnb, sc.pb + p + fused);
          next[prefix].pnb = log_add(next[prefix].pnb, sc.pnb + p);
        } else {
          next[ext].pnb = log_add(next[ext].pnb, sc.total() + p + fused);
        }
      }
    }
    std::vector<std::pair<double, std::vector<int64_t>>> ranked;
    for (const auto& e : next) ranked.emplace_back(e.second.total(), e.first);
    const auto keep = std::min<size_t>(ranked.size(), static_cast<size_t>(cfg.beam_size));
    std::partial_sort(ranked.begin(), ranked.begin() + keep, ranked.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    beams.clear();
    for (size_t i = 0; i < keep; ++i) beams[ranked[i].second] = next[ranked[i].second];
  }
  std::vector<Hypothesis> out;
  for (const auto& e : beams) out.push_back({e.first, e.second.total()});
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.score > b.score; });
  return out;
}

using Words = std::vector<std::vector<int64_t>>;

Words words_of(const std::vector<int64_t>& tokens, int64_t space) {
  Words words(1);
  for (int64_t tok : tokens) {
    if (tok == space) {
      if (!words.back().empty()) words.emplace_back();
    } else {
      words.back().push_back(tok);
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

class WerMeter {
 public:
  void update(const Words& hyp, const Words& ref) {
    const size_t n = hyp.size(), m = ref.size();
    std::vector<std::vector<int64_t>> d(n + 1, std::vector<int64_t>(m + 1, 0));
    for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int64_t>(i);
    for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int64_t>(j);
    for (size_t i = 1; i <= n; ++i)
      for (size_t j = 1; j <= m; ++j)
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (hyp[i - 1] != ref[j - 1])});
    errors_ += d[n][m];
    ref_words_ += static_cast<int64_t>(m);
    per_utt_.push_back(static_cast<double>(d[n][m]) / std::max<size_t>(1, m));
  }
  double value() const { return static_cast<double>(errors_) / std::max<int64_t>(1, ref_words_); }
  torch::Tensor per_utterance() const { return torch::tensor(per_utt_); }

 private:
  int64_t errors_ = 0, ref_words_ = 0;
  std::vector<double> per_utt_;
};

struct UtteranceBatch {
  torch::Tensor feats;                       // [B, T, F], zero padded
  torch::Tensor lens;                        // [B] frame counts, int64
  std::vector<std::vector<int64_t>> refs;    // reference token ids
};

double evaluate(AcousticEncoder encoder, const BigramLM& lm, const std::vector<UtteranceBatch>& test_set,
                const DecodeConfig& cfg, int64_t n_mels,
                std::vector<std::pair<torch::Tensor, torch::Tensor>>& nbest_stats,
                std::vector<torch::Tensor>& posterior_dump) {
  c10::InferenceMode guard;
  torch::Device device(torch::kCUDA);
  encoder->to(device);
  encoder->eval();
  WerMeter wer;
  auto lm_table = lm.table();
  const auto inv_temp = torch::tensor(1.0 / cfg.temperature);

  for (const auto& batch : test_set) {
    auto x = normalize_features(batch.feats, n_mels).to(device);
    auto logits = encoder->forward(x) * inv_temp;  // LOOKALIKE: tensor-device-mismatch -- inv_temp is a 0-dim CPU scalar, allowed with CUDA
    const int64_t V = logits.size(-1);
    auto blank_bias = torch::zeros({V});
    blank_bias[cfg.blank] = -cfg.blank_penalty;
    logits = logits + blank_bias;  // EXPECT: tensor-device-mismatch
    auto host = F::log_softmax(logits, -1).cpu();  // [B, T', V]
    // FACT: lp = torch.randn(3, 7, 5); assert is_copy_of(lp.transpose(0, 1).flatten(0, 1), lp)
    posterior_dump.push_back(host.transpose(0, 1).flatten(0, 1));  // EXPECT: tensor-reshape-non-contiguous // LOOKALIKE: tensor-graph-kept-across-iterations -- under InferenceMode, nothing records a graph
    auto out_lens = torch::div(torch::div(batch.lens - 1, 2, "floor") - 1, 2, "floor");

    const int64_t B = host.size(0);
    std::vector<float> best_scores;
    std::vector<int64_t> hyp_len_vec;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t T_b = out_lens[b].item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- out_lens is a CPU tensor and T_b is used as a size
      auto lp = host[b].narrow(0, 0, T_b).clone();  // EXPECT: tensor-unnecessary-clone
      auto lm_scores = lm_table.to(torch::kDouble);  // EXPECT: tensor-clone-in-loop
      auto hyps = prefix_beam_search(lp, lm_scores, cfg);
      const Hypothesis& best = hyps.front();
      wer.update(words_of(best.tokens, cfg.space), words_of(batch.refs[b], cfg.space));
      best_scores.push_back(static_cast<float>(best.score));
      hyp_len_vec.push_back(static_cast<int64_t>(best.tokens.size()));
    }

    auto hyp_lens = torch::zeros({B}, torch::kLong);
    hyp_lens.copy_(torch::tensor(hyp_len_vec));  // LOOKALIKE: tensor-copy-narrowing -- int64 values into an int64 tensor
    auto scores = torch::empty_like(hyp_lens);
    scores.copy_(torch::tensor(best_scores));  // EXPECT: tensor-copy-narrowing
    nbest_stats.emplace_back(hyp_lens, scores);
  }
  std::cout << "WER " << 100.0 * wer.value() << "% over " << test_set.size() << " batches" << std::endl;
  return wer.value();
}
