// Whisper-style transcription: log-mel input, encoder once per 30 s window, decoder with a per-layer
// KV cache, beam search under the reference decoder's timestamp grammar.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct WhisperDims {
  int64_t n_mels = 80, n_audio_ctx = 1500, n_state = 512, n_head = 8;
  int64_t n_audio_layer = 6, n_text_layer = 6, n_vocab = 51865, n_text_ctx = 448;
};

struct DecodeOptions {
  int64_t beam_size = 5, sample_len = 224;
  double length_penalty = 0.0;  // 0: divide by the length, otherwise the GNMT penalty
  int64_t sot = 50258, eot = 50257, no_timestamps = 50363, timestamp_begin = 50364;
  double max_initial_timestamp = 1.0;
  std::vector<int64_t> suppress_tokens;
  std::vector<int64_t> prompt;  // sot, language, task
};

torch::Tensor normalize_log_mel(const torch::Tensor& mel_power) {
  auto log_spec = mel_power.to(torch::kFloat);
  // FACT: m = torch.rand(80, 30); l = m.to(torch.float32); assert shares_storage(m, l)
  log_spec.clamp_min_(1e-10).log10_();  // EXPECT: tensor-alias-then-mutate
  log_spec = torch::maximum(log_spec, log_spec.max() - 8.0);
  return (log_spec + 4.0) / 4.0;
}

// log-mel [n_mels, frames] of a 30 s window, and the per-frame log energy the silence gate reads
std::pair<torch::Tensor, torch::Tensor> log_mel_window(const torch::Tensor& audio, const torch::Tensor& filters,
                                                       int64_t n_fft = 400, int64_t hop = 160) {
  const int64_t missing = std::max<int64_t>(0, 480000 - audio.size(0));
  auto padded = F::pad(audio, F::PadFuncOptions({0, missing}));
  auto spec = torch::stft(padded, n_fft, hop, n_fft, torch::hann_window(n_fft, audio.options()), false, true, true);
  auto mel = torch::matmul(filters, spec.narrow(-1, 0, spec.size(-1) - 1).abs().pow(2));
  auto log_mel = normalize_log_mel(mel);
  return {log_mel, mel.sum(0).clamp_min(1e-10).log10()};
}

struct KVCache {
  std::vector<torch::Tensor> self_k, self_v, cross_k, cross_v;
  explicit KVCache(int64_t n) : self_k(n), self_v(n), cross_k(n), cross_v(n) {}
  int64_t offset() const { return self_k.empty() || !self_k[0].defined() ? 0 : self_k[0].size(1); }
  void reorder(const torch::Tensor& source) {  // beams were re-ranked: follow their histories
    for (auto* list : {&self_k, &self_v})
      for (auto& t : *list) t = t.defined() ? t.index_select(0, source) : t;
  }
};

class MultiHeadAttentionImpl : public nn::Module {
 public:
  MultiHeadAttentionImpl(int64_t n_state, int64_t n_head)
      : n_head_(n_head),
        query(register_module("query", nn::Linear(n_state, n_state))),
        key(register_module("key", nn::Linear(nn::LinearOptions(n_state, n_state).bias(false)))),
        value(register_module("value", nn::Linear(n_state, n_state))),
        out(register_module("out", nn::Linear(n_state, n_state))) {}
  torch::Tensor self_attend(const torch::Tensor& x, const torch::Tensor& mask, KVCache* cache, int64_t layer) {
    auto k = key(x);
    auto v = value(x);
    if (cache != nullptr) {  // grow this layer's cache by the new positions
      auto& ck = cache->self_k[layer];
      auto& cv = cache->self_v[layer];
      if (ck.defined()) std::tie(k, v) = std::make_tuple(torch::cat({ck, k}, 1), torch::cat({cv, v}, 1));
      std::tie(ck, cv) = std::make_tuple(k, v);
    }
    return attend(query(x), k, v, mask);
  }
  torch::Tensor cross_attend(const torch::Tensor& x, const torch::Tensor& xa, KVCache* cache, int64_t layer) {
    const bool cached = cache != nullptr && cache->cross_k[layer].defined();
    auto k = cached ? cache->cross_k[layer] : key(xa);  // the audio side is projected once per window
    auto v = cached ? cache->cross_v[layer] : value(xa);
    if (cache != nullptr && !cached) std::tie(cache->cross_k[layer], cache->cross_v[layer]) = std::make_tuple(k, v);
    return attend(query(x), k, v, torch::Tensor());
  }
 private:
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask) {
    const int64_t B = q.size(0), Tq = q.size(1), Tk = k.size(1), D = q.size(2) / n_head_;
    const double scale = std::pow(static_cast<double>(D), -0.25);
    // FACT: q = torch.randn(2, 5, 16); assert is_view_of(q.view(2, 5, 4, 4), q)
    auto qh = q.view({B, Tq, n_head_, D}).permute({0, 2, 1, 3}) * scale;  // LOOKALIKE: tensor-view-non-contiguous -- q is a Linear output, contiguous
    auto kh = k.view({B, Tk, n_head_, D}).permute({0, 2, 3, 1}) * scale;
    // FACT: a = torch.randn(2, 3, 16); b = torch.randn(2, 1, 16); kv = torch.cat([a, b], 1); assert is_view_of(kv.view(2, 4, 4, 4), kv)
    auto vh = v.view({B, Tk, n_head_, D}).permute({0, 2, 1, 3});  // LOOKALIKE: tensor-view-non-contiguous -- the values come from cat or a Linear: contiguous
    auto qk = mask.defined() ? torch::matmul(qh, kh) + mask.narrow(0, Tk - Tq, Tq).narrow(1, 0, Tk) : torch::matmul(qh, kh);
    auto wv = torch::matmul(torch::softmax(qk.to(torch::kFloat), -1).to(q.scalar_type()), vh);
    // FACT: wv = torch.randn(2, 4, 6, 8); f = wv.permute(0, 2, 1, 3).flatten(2); assert is_copy_of(f, wv)
    return out(wv.permute({0, 2, 1, 3}).flatten(2));  // EXPECT: tensor-reshape-non-contiguous
  }
  int64_t n_head_;
  nn::Linear query, key, value, out;  // initialised in this order by the constructor
};
TORCH_MODULE(MultiHeadAttention);

class ResidualAttentionBlockImpl : public nn::Module {
 public:
  ResidualAttentionBlockImpl(int64_t n_state, int64_t n_head, bool cross_attention) {
    attn = register_module("attn", MultiHeadAttention(n_state, n_head));
    attn_ln = register_module("attn_ln", nn::LayerNorm(nn::LayerNormOptions({n_state})));
    if (cross_attention) {
      cross_attn = register_module("cross_attn", MultiHeadAttention(n_state, n_head));
      cross_attn_ln = register_module("cross_attn_ln", nn::LayerNorm(nn::LayerNormOptions({n_state})));
    }
    mlp = register_module("mlp", nn::Sequential(nn::Linear(n_state, 4 * n_state), nn::GELU(), nn::Linear(4 * n_state, n_state)));
    mlp_ln = register_module("mlp_ln", nn::LayerNorm(nn::LayerNormOptions({n_state})));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& xa, const torch::Tensor& mask, KVCache* cache, int64_t layer) {
    x = x + attn->self_attend(attn_ln(x), mask, cache, layer);
    if (cross_attn) x = x + cross_attn->cross_attend(cross_attn_ln(x), xa, cache, layer);
    return x + mlp->forward(mlp_ln(x));
  }
  MultiHeadAttention attn{nullptr}, cross_attn{nullptr};
  nn::LayerNorm attn_ln{nullptr}, cross_attn_ln{nullptr}, mlp_ln{nullptr};
  nn::Sequential mlp{nullptr};
};
TORCH_MODULE(ResidualAttentionBlock);

class WhisperImpl : public nn::Module {
 public:
  explicit WhisperImpl(const WhisperDims& d) : dims(d) {
    conv1 = register_module("conv1", nn::Conv1d(nn::Conv1dOptions(d.n_mels, d.n_state, 3).padding(1)));
    conv2 = register_module("conv2", nn::Conv1d(nn::Conv1dOptions(d.n_state, d.n_state, 3).stride(2).padding(1)));
    auto inv = torch::exp(-std::log(10000.0) / (d.n_state / 2 - 1) * torch::arange(d.n_state / 2, torch::kFloat));
    auto scaled = torch::arange(d.n_audio_ctx, torch::kFloat).unsqueeze(1) * inv.unsqueeze(0);
    audio_pos = register_buffer("audio_pos", torch::cat({torch::sin(scaled), torch::cos(scaled)}, 1));
    for (int64_t i = 0; i < d.n_audio_layer; ++i)
      enc_blocks.push_back(register_module("enc_" + std::to_string(i), ResidualAttentionBlock(d.n_state, d.n_head, false)));
    ln_post = register_module("ln_post", nn::LayerNorm(nn::LayerNormOptions({d.n_state})));
    token_embedding = register_module("token_embedding", nn::Embedding(d.n_vocab, d.n_state));
    text_pos = register_parameter("text_pos", torch::empty({d.n_text_ctx, d.n_state}));
    for (int64_t i = 0; i < d.n_text_layer; ++i)
      dec_blocks.push_back(register_module("dec_" + std::to_string(i), ResidualAttentionBlock(d.n_state, d.n_head, true)));
    ln = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({d.n_state})));
    mask = register_buffer("mask", torch::full({d.n_text_ctx, d.n_text_ctx}, -INFINITY).triu_(1));
  }
  torch::Tensor encode(const torch::Tensor& mel) {  // [B, n_mels, 3000] -> [B, 1500, n_state]
    auto x = F::gelu(conv2(F::gelu(conv1(mel)))).permute({0, 2, 1});
    x = x + audio_pos.narrow(0, 0, x.size(1));
    for (auto& blk : enc_blocks) x = blk->forward(x, torch::Tensor(), torch::Tensor(), nullptr, 0);
    return ln_post(x);
  }
  // tokens [B, T] -> logits [B, T, V]; with a cache only the new tokens are passed
  torch::Tensor decode(const torch::Tensor& tokens, const torch::Tensor& xa, KVCache* cache) {
    const int64_t offset = cache != nullptr ? cache->offset() : 0;
    auto x = token_embedding(tokens) + text_pos.narrow(0, offset, tokens.size(1));
    for (size_t i = 0; i < dec_blocks.size(); ++i) x = dec_blocks[i]->forward(x, xa, mask, cache, static_cast<int64_t>(i));
    return torch::matmul(ln(x), token_embedding->weight.t());
  }
  WhisperDims dims;
  nn::Conv1d conv1{nullptr}, conv2{nullptr};
  nn::LayerNorm ln_post{nullptr}, ln{nullptr};
  nn::Embedding token_embedding{nullptr};
  torch::Tensor audio_pos, text_pos, mask;
  std::vector<ResidualAttentionBlock> enc_blocks, dec_blocks;
};
TORCH_MODULE(Whisper);

// Marks in `suppress` ([n_beams, V], bool) every token the timestamp grammar forbids next.
void apply_timestamp_rules(torch::Tensor suppress, const torch::Tensor& logits, const torch::Tensor& tokens,
                           int64_t sample_begin, const DecodeOptions& opt) {
  const int64_t V = logits.size(-1), tb = opt.timestamp_begin, len = tokens.size(1) - sample_begin;
  auto ts_cols = suppress.narrow(1, tb, V - tb);
  if (len == 0) {
    suppress.narrow(1, 0, tb).fill_(true);  // the first sampled token is a timestamp
    const int64_t last_allowed = tb + static_cast<int64_t>(std::round(opt.max_initial_timestamp / 0.02));
    if (last_allowed + 1 < V) suppress.narrow(1, last_allowed + 1, V - last_allowed - 1).fill_(true);
  } else {
    auto seq = tokens.narrow(1, sample_begin, len);
    auto is_ts = seq >= tb, last_ts = is_ts.select(1, len - 1);
    auto penult_ts = len >= 2 ? is_ts.select(1, len - 2) : torch::ones_like(last_ts);
    auto opened = last_ts & penult_ts.logical_not();
    // FACT: m = torch.zeros(3, 10, dtype=torch.bool); c = m.narrow(1, 6, 4); c.masked_fill_(torch.tensor([[True], [False], [True]]), True); assert m[0, 6:].all() and not m[1].any()
    ts_cols.masked_fill_((last_ts & penult_ts).unsqueeze(1), true);  // LOOKALIKE: tensor-alias-then-mutate -- a narrow view of the mask this function exists to fill
    suppress.narrow(1, 0, opt.eot).masked_fill_(opened.unsqueeze(1), true);
    // timestamps never go backwards; an opening timestamp may be repeated once to close the pair
    auto last_value = std::get<0>(seq.masked_fill(is_ts.logical_not(), tb).max(1));
    auto floor_value = torch::where(is_ts.any(1), last_value + opened.logical_not().to(torch::kLong), torch::full_like(last_value, tb));
    ts_cols.logical_or_(torch::arange(tb, V, seq.options()).unsqueeze(0) < floor_value.unsqueeze(1));
  }
  // when the timestamps together outweigh every single text token, a timestamp must come next
  auto masked_logits = logits.clone();  // EXPECT: tensor-unnecessary-clone
  masked_logits.masked_fill_(suppress, -INFINITY);
  auto logprobs = F::log_softmax(masked_logits.to(torch::kFloat), -1), ts_mass = logprobs.narrow(1, tb, V - tb).logsumexp(-1);
  auto best_text = std::get<0>(logprobs.narrow(1, 0, tb).max(-1));
  suppress.narrow(1, 0, tb).masked_fill_((ts_mass > best_text).unsqueeze(1), true);
}

struct Hypothesis { std::vector<int64_t> tokens; double sum_logprob = 0.0, score = 0.0; };

double length_normalised(const Hypothesis& h, double penalty) {
  const double len = static_cast<double>(std::max<size_t>(h.tokens.size(), 1));
  return h.sum_logprob / (penalty > 0.0 ? std::pow((5.0 + len) / 6.0, penalty) : len);
}

Hypothesis beam_decode(Whisper& model, const torch::Tensor& log_mel, const DecodeOptions& opt) {
  torch::NoGradGuard no_grad;
  const int64_t n_beams = opt.beam_size, V = model->dims.n_vocab;
  auto audio_features = model->encode(log_mel.unsqueeze(0)).repeat({n_beams, 1, 1});
  const auto device = audio_features.device();
  KVCache cache(model->dims.n_text_layer);
  auto tokens = torch::tensor(opt.prompt, torch::kLong).unsqueeze(0).repeat({n_beams, 1});  // host copy
  const int64_t sample_begin = tokens.size(1);
  auto sum_logprobs = torch::zeros({n_beams}, audio_features.options()), base_suppress = torch::zeros({n_beams, V}, torch::kBool);
  if (!opt.suppress_tokens.empty()) base_suppress.index_fill_(1, torch::tensor(opt.suppress_tokens, torch::kLong), true);
  base_suppress.select(1, opt.no_timestamps).fill_(true);
  auto hypothesis_of = [&](int64_t beam, double sum) {
    auto row = tokens[beam].narrow(0, sample_begin, tokens.size(1) - sample_begin).contiguous();
    Hypothesis h{std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()), sum, 0.0};
    h.score = length_normalised(h, opt.length_penalty);
    return h;
  };
  std::vector<Hypothesis> finished;
  double best_finished = -INFINITY;  // best length-normalised score among finished beams
  auto step_input = tokens.to(device);
  for (int64_t i = 0; i < opt.sample_len; ++i) {
    auto logits = model->decode(step_input, audio_features, &cache).select(1, -1).cpu();
    torch::Tensor suppress = base_suppress.clone();  // EXPECT: tensor-clone-in-loop
    // FACT: b = torch.zeros(3, 10, dtype=torch.bool); s = b.clone(); assert is_copy_of(s, b)
    apply_timestamp_rules(suppress, logits, tokens, sample_begin, opt);  // LOOKALIKE: tensor-alias-then-mutate -- suppress is this step's own clone
    logits.masked_fill_(suppress, -INFINITY);  // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is recorded
    auto logprobs = F::log_softmax(logits.to(torch::kFloat), -1).to(device);
    // FACT: s = torch.randn(4); e = s.unsqueeze(1).expand(4, 10); assert raises(lambda: e.add_(torch.randn(4, 10)), "more than one element")
    auto scores = sum_logprobs.unsqueeze(1).expand_as(logprobs);
    scores += logprobs;  // EXPECT: tensor-inplace-on-expanded
    auto top = scores.topk(n_beams + 1, -1);
    auto top_scores = std::get<0>(top).to(torch::kCPU, torch::kDouble), top_tokens = std::get<1>(top).cpu();
    auto s_acc = top_scores.accessor<double, 2>();
    auto t_acc = top_tokens.accessor<int64_t, 2>();
    std::vector<std::tuple<double, int64_t, int64_t>> cands;  // score, beam, token
    for (int64_t b = 0; b < n_beams; ++b)
      for (int64_t j = 0; j <= n_beams; ++j) cands.emplace_back(s_acc[b][j], b, t_acc[b][j]);
    std::sort(cands.begin(), cands.end(), [](const auto& a, const auto& c) { return std::get<0>(a) > std::get<0>(c); });
    std::vector<int64_t> keep_beam, keep_token;
    for (const auto& [score, beam, token] : cands) {
      if (token == opt.eot && static_cast<int64_t>(finished.size()) < n_beams) {
        finished.push_back(hypothesis_of(beam, score));
        best_finished = std::max(best_finished, finished.back().score);
      } else if (token != opt.eot && static_cast<int64_t>(keep_beam.size()) < n_beams) {
        keep_beam.push_back(beam);
        keep_token.push_back(token);
      }
    }
    if (static_cast<int64_t>(finished.size()) >= n_beams || static_cast<int64_t>(keep_beam.size()) < n_beams) break;
    auto source = torch::tensor(keep_beam, torch::kLong), next = torch::tensor(keep_token, torch::kLong);
    auto source_dev = source.to(device), next_dev = next.to(device);
    tokens = torch::cat({tokens.index_select(0, source), next.unsqueeze(1)}, 1);
    sum_logprobs = sum_logprobs.index_select(0, source_dev) + logprobs.index_select(0, source_dev).gather(1, next_dev.unsqueeze(1)).squeeze(1);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph
    cache.reorder(source_dev);
    step_input = next_dev.unsqueeze(1);
    // sums only decrease: stop once no live beam can beat the best finished hypothesis
    if (sum_logprobs.max().item<double>() / static_cast<double>(tokens.size(1) - sample_begin) < best_finished) break;  // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to stop
  }
  if (finished.empty())  // no beam ended within sample_len: rank the live ones
    for (int64_t b = 0; b < n_beams; ++b) finished.push_back(hypothesis_of(b, sum_logprobs[b].item<double>()));
  return *std::max_element(finished.begin(), finished.end(),
                           [](const Hypothesis& a, const Hypothesis& b) { return a.score < b.score; });
}

// [n, 2] int32 centiseconds for the SRT writer and [n, 2] int64 encoder frames for word alignment
std::pair<torch::Tensor, torch::Tensor> segment_bounds(const Hypothesis& h, const DecodeOptions& opt, double window_start_s) {
  std::vector<int64_t> edges;  // timestamp tokens in order; they pair up into segments
  for (int64_t t : h.tokens)
    if (t >= opt.timestamp_begin) edges.push_back(t);
  if (edges.size() % 2 == 1) edges.push_back(edges.back());
  const int64_t n_seg = static_cast<int64_t>(edges.size()) / 2;
  auto secs = (torch::tensor(edges, torch::kLong).view({n_seg, 2}) - opt.timestamp_begin).to(torch::kFloat) * 0.02 + window_start_s;
  auto bounds = torch::empty({n_seg, 2}, torch::kInt32), frames = torch::empty({n_seg, 2}, torch::kLong);
  // FACT: t = (torch.arange(1500) * 0.02 + 30.0) * 100; z = torch.zeros(1500, dtype=torch.int32); z.copy_(t); assert (z != t.round().int()).any()
  bounds.copy_(secs * 100.0);  // EXPECT: tensor-copy-narrowing
  frames.copy_((secs * 50.0).round());  // LOOKALIKE: tensor-copy-narrowing -- rounded first: whole numbers
  return {bounds, frames};
}

struct Utterance { torch::Tensor mel, tokens; };  // [n_mels, 3000], [L] int64 sot ... eot

// Teacher-forced token loss on held-out utterances, run after each fine-tuning epoch.
double heldout_token_loss(Whisper& model, const std::vector<Utterance>& data) {
  model->eval();
  torch::Tensor total = torch::zeros({});
  int64_t n_tokens = 0;  // tokens predicted (sot is given)
  for (const auto& utt : data) {
    const int64_t L = utt.tokens.size(0);
    auto logits = model->decode(utt.tokens.narrow(0, 0, L - 1).unsqueeze(0), model->encode(utt.mel.unsqueeze(0)), nullptr);
    auto loss = F::cross_entropy(logits.squeeze(0), utt.tokens.narrow(0, 1, L - 1),
                                 F::CrossEntropyFuncOptions().reduction(torch::kSum));
    total += loss;  // EXPECT: tensor-graph-kept-across-iterations
    n_tokens += L - 1;
  }
  model->train();
  return total.item<double>() / static_cast<double>(std::max<int64_t>(n_tokens, 1));
}
