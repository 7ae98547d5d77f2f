// Extractive question answering (SQuAD v1 style) on a small BERT-like encoder: start/end
// logits, masking of question and padding tokens, n-best span search with a maximum answer
// length, the start/end loss, and exact-match evaluation.
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct QAConfig {
  int64_t hidden = 256;
  int64_t max_answer_len = 30;
  int64_t n_best = 20;
  double mask_value = -1e4;
  double calib_temperature = 1.5;
  int64_t log_every = 100;
};

struct QAOutput {
  torch::Tensor logits;        // [B, L, 2]
  torch::Tensor start_logits;  // [B, L]
  torch::Tensor end_logits;    // [B, L]
};

struct QABatch {
  torch::Tensor input_ids, token_type_ids, attention_mask;  // [B, L] int64
  torch::Tensor start_positions, end_positions;             // [B] int64 token indices
};

// torch::nn::TransformerEncoder works sequence-first; the head wants batch-major rows.
torch::Tensor batch_major_rows(const torch::Tensor& enc_out) {  // [L, B, H] -> [B * L, H]
  // FACT: h = torch.randn(5, 2, 8); assert is_copy_of(h.transpose(0, 1).reshape(-1, 8), h)
  return enc_out.transpose(0, 1).reshape({-1, enc_out.size(2)});  // EXPECT: tensor-reshape-non-contiguous
}

struct MiniBertImpl : torch::nn::Module {
  MiniBertImpl(int64_t vocab, int64_t max_len, int64_t hidden, int64_t heads, int64_t layers)
      : tok(register_module("tok", torch::nn::Embedding(vocab, hidden))),
        pos(register_module("pos", torch::nn::Embedding(max_len, hidden))),
        seg(register_module("seg", torch::nn::Embedding(2, hidden))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        encoder(register_module("encoder", torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(
                                               torch::nn::TransformerEncoderLayerOptions(hidden, heads), layers)))) {}

  // ids, token_type_ids, attention_mask: [B, L] -> [B, L, H]
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& token_type_ids,
                        const torch::Tensor& attention_mask) {
    const int64_t B = ids.size(0), L = ids.size(1);
    auto positions = torch::arange(L, ids.options());
    auto x = ln(tok(ids) + pos(positions).unsqueeze(0) + seg(token_type_ids));
    auto enc = encoder(x.transpose(0, 1), torch::Tensor(), attention_mask == 0);  // [L, B, H]
    auto rows = batch_major_rows(enc);
    // FACT: h = torch.randn(5, 2, 8); r = h.transpose(0, 1).reshape(-1, 8); assert is_contiguous(r) and is_view_of(r.view(2, 5, 8), r)
    return rows.view({B, L, -1});  // LOOKALIKE: tensor-view-non-contiguous -- the reshape above already copied into a contiguous buffer
  }

  torch::nn::Embedding tok, pos, seg;
  torch::nn::LayerNorm ln;
  torch::nn::TransformerEncoder encoder;
};
TORCH_MODULE(MiniBert);

// Question tokens (segment 0) and padding can never be part of the answer. [CLS] stays
// available as the "no answer" slot.
void mask_non_context(torch::Tensor logits, const torch::Tensor& token_type_ids,
                      const torch::Tensor& attention_mask, double value) {
  auto invalid = (token_type_ids == 0).logical_or(attention_mask == 0);
  invalid.select(1, 0).fill_(false);
  logits.masked_fill_(invalid, value);
}

struct QASpanHeadImpl : torch::nn::Module {
  explicit QASpanHeadImpl(const QAConfig& cfg)
      : cfg_(cfg), qa_outputs(register_module("qa_outputs", torch::nn::Linear(cfg.hidden, 2))) {}

  QAOutput forward(const torch::Tensor& hidden, const torch::Tensor& token_type_ids,
                   const torch::Tensor& attention_mask) {
    const int64_t L = hidden.size(1);
    auto logits = qa_outputs(hidden);  // [B, L, 2]
    auto start = logits.select(-1, 0);
    auto end = logits.select(-1, 1);
    // FACT: l = torch.randn(2, 5, 2); s = l.select(-1, 0); assert not is_contiguous(s) and is_view_of(s.view(-1, 5), l)
    start = start.view({-1, L});  // LOOKALIKE: tensor-view-non-contiguous -- a column of [B, L, 2] is evenly strided, rows of L are a view
    end = end.view({-1, L});
    mask_non_context(start, token_type_ids, attention_mask, cfg_.mask_value);  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    mask_non_context(end, token_type_ids, attention_mask, cfg_.mask_value);
    return {logits, start, end};
  }

  QAConfig cfg_;
  torch::nn::Linear qa_outputs;
};
TORCH_MODULE(QASpanHead);

// Mean of the start and end cross-entropies, in one call over [2B, L] rows.
torch::Tensor qa_loss(const torch::Tensor& logits, const torch::Tensor& start_positions,
                      const torch::Tensor& end_positions) {
  const int64_t L = logits.size(1);
  // answers cut off by the window point past the end and are ignored
  // FACT: p = torch.tensor([[3], [40]]); sp = p.flatten(); sp.clamp_(0, 8); assert shares_storage(sp, p) and p[1, 0].item() == 8
  auto sp = start_positions.flatten();
  sp.clamp_(0, L);  // EXPECT: tensor-alias-then-mutate
  auto ep = end_positions.flatten().clamp(0, L);
  // FACT: l = torch.randn(2, 5, 2); assert raises(lambda: l.transpose(1, 2).view(-1, 5), "view size is not compatible")
  auto rows = logits.transpose(1, 2).view({-1, L});  // EXPECT: tensor-view-non-contiguous
  // FACT: t = torch.stack([torch.tensor([1, 2]), torch.tensor([3, 4])], 1); assert is_view_of(t.view(-1), t)
  auto targets = torch::stack({sp, ep}, 1).view({-1});  // LOOKALIKE: tensor-view-non-contiguous -- stack returns a fresh contiguous tensor
  return F::cross_entropy(rows, targets, F::CrossEntropyFuncOptions().ignore_index(L));
}

torch::Tensor to_log_probs(const torch::Tensor& logits) {
  torch::Tensor lp = logits;
  // FACT: a = torch.randn(2, 6); b = a; b -= torch.logsumexp(a, -1, keepdim=True); assert shares_storage(a, b)
  lp -= torch::logsumexp(logits, -1, /*keepdim=*/true);  // EXPECT: tensor-alias-then-mutate
  return lp;
}

struct Span {
  int64_t start, end;
  double score;
};

// Top n spans per example with start <= end < start + max_answer_len, inside the context.
std::vector<std::vector<Span>> nbest_spans(const torch::Tensor& start_lp, const torch::Tensor& end_lp,
                                           const torch::Tensor& context_mask, const QAConfig& cfg) {
  const int64_t B = start_lp.size(0), L = start_lp.size(1);
  auto s = start_lp.clone();  // EXPECT: tensor-unnecessary-clone
  s.masked_fill_(context_mask.logical_not(), cfg.mask_value);
  torch::Tensor scores = s;
  // FACT: s = torch.randn(2, 4); e = torch.randn(2, 4); sc = s.unsqueeze(2) + e.unsqueeze(1); assert is_copy_of(sc, s)
  scores = scores.unsqueeze(2) + end_lp.unsqueeze(1);  // [B, L(start), L(end)]
  auto valid = torch::ones({L, L}, torch::kBool).triu().tril(cfg.max_answer_len - 1);
  scores.masked_fill_(valid.logical_not(), -std::numeric_limits<float>::infinity());  // LOOKALIKE: tensor-alias-then-mutate -- scores was rebound to a fresh sum before the write

  const int64_t k = std::min<int64_t>(cfg.n_best, L * L);
  auto top = scores.view({B, -1}).topk(k, /*dim=*/1);
  auto top_scores = std::get<0>(top);
  auto top_idx = std::get<1>(top);
  // pack (start, end, score) per candidate for the host-side post-processing
  auto packed = torch::empty({B, k, 3}, torch::kLong);
  packed.select(2, 0).copy_(torch::div(top_idx, L, "floor"));  // LOOKALIKE: tensor-copy-narrowing -- topk indices are int64 like the destination
  packed.select(2, 1).copy_(top_idx.remainder(L));
  packed.select(2, 2).copy_(top_scores);  // EXPECT: tensor-copy-narrowing

  auto acc = packed.accessor<int64_t, 3>();
  std::vector<std::vector<Span>> out(B);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < k; ++j)
      out[b].push_back({acc[b][j][0], acc[b][j][1], static_cast<double>(acc[b][j][2])});
  return out;
}

std::string normalize_answer(const std::string& text) {
  std::string lowered;
  for (unsigned char c : text)
    if (!std::ispunct(c)) lowered += static_cast<char>(std::tolower(c));
  std::istringstream words(lowered);
  std::string w, out;
  while (words >> w) {
    if (w == "a" || w == "an" || w == "the") continue;
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

bool exact_match(const std::string& pred, const std::vector<std::string>& golds) {
  const std::string p = normalize_answer(pred);
  for (const auto& g : golds)
    if (normalize_answer(g) == p) return true;
  return false;
}

struct EvalExample {
  std::string context;
  std::vector<std::pair<int64_t, int64_t>> offsets;  // char span of each token, (0, 0) outside context
  std::vector<std::string> answers;
};

double train_epoch(MiniBert& bert, QASpanHead& head, torch::optim::Optimizer& opt,
                   const std::vector<QABatch>& batches, const QAConfig& cfg) {
  bert->train();
  head->train();
  std::vector<torch::Tensor> epoch_losses;
  int64_t step = 0;
  for (const auto& b : batches) {
    auto hidden = bert(b.input_ids, b.token_type_ids, b.attention_mask);
    QAOutput out = head(hidden, b.token_type_ids, b.attention_mask);

    // calibrated confidence of the start prediction, for the training log
    auto conf_logits = out.start_logits.detach();
    conf_logits.div_(cfg.calib_temperature);  // EXPECT: tensor-inplace-on-detached
    auto confidence = std::get<0>(conf_logits.softmax(-1).max(-1)).mean();

    auto loss = qa_loss(out.logits, b.start_positions, b.end_positions);
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(opt.param_groups()[0].params(), 1.0);
    opt.step();
    epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (++step % cfg.log_every == 0)
      std::cout << "step " << step << " loss " << loss.item<double>() << " start conf "
                << confidence.item<double>() << "\n";
  }
  return epoch_losses.empty() ? 0.0 : torch::stack(epoch_losses).mean().item<double>();
}

double evaluate_exact_match(MiniBert& bert, QASpanHead& head, const std::vector<QABatch>& batches,
                            const std::vector<std::vector<EvalExample>>& examples, const QAConfig& cfg) {
  torch::NoGradGuard no_grad;
  bert->eval();
  head->eval();
  std::vector<torch::Tensor> raw_start;  // kept for the calibration report
  int64_t hits = 0, total = 0;
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    const auto& b = batches[bi];
    QAOutput out = head(bert(b.input_ids, b.token_type_ids, b.attention_mask), b.token_type_ids,
                        b.attention_mask);
    auto start_lp = to_log_probs(out.start_logits);
    auto end_lp = to_log_probs(out.end_logits);
    raw_start.push_back(out.start_logits);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard nothing records a graph
    auto context_mask = (b.token_type_ids == 1).logical_and(b.attention_mask == 1);
    auto spans = nbest_spans(start_lp, end_lp, context_mask, cfg);
    for (size_t i = 0; i < spans.size(); ++i, ++total) {
      const auto& ex = examples[bi][i];
      // the [CLS] slot wins: the model abstains, which never matches a SQuAD v1 answer
      if (out.start_logits[i].argmax().item<int64_t>() == 0) continue;  // LOOKALIKE: tensor-sync-in-loop -- a CPU tensor, and the value decides control flow
      for (const Span& sp : spans[i]) {
        if (sp.start >= static_cast<int64_t>(ex.offsets.size()) || sp.end >= static_cast<int64_t>(ex.offsets.size()))
          continue;
        const auto first = ex.offsets[sp.start].first, last = ex.offsets[sp.end].second;
        if (last <= first) continue;  // a token outside the context
        hits += exact_match(ex.context.substr(first, last - first), ex.answers) ? 1 : 0;
        break;
      }
    }
  }
  auto all_start = torch::cat(raw_start);
  std::cout << "eval: " << total << " questions, mean max start log-prob "
            << std::get<0>(torch::log_softmax(all_start, -1).max(-1)).mean().item<double>() << "\n";
  return total == 0 ? 0.0 : 100.0 * hits / total;
}
