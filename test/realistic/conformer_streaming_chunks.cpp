// Streaming Conformer-CTC recognition for a captioning service. Log-mel chunks [B, n_mels, T] are
// CMVN-normalised, stacked 4:1 in time and run through the encoder in time-first layout [T, B, D].
// Every layer keeps a left-context cache: the normalised inputs of its last left_chunks * chunk
// frames for self-attention and the last kernel-1 frames of its causal depthwise convolution.
// Greedy CTC ids are kept per chunk until an endpoint (trailing silence), then collapsed on the
// host (repeats merged across chunk boundaries, blanks dropped). A dev scorer runs the same chunks.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct StreamConfig {
  int64_t n_mels = 80, stack = 4, d_model = 256, n_head = 4, ff_mult = 4, conv_kernel = 15;
  int64_t n_layers = 12, vocab = 1024, blank = 0, chunk = 16, left_chunks = 4, endpoint_frames = 32;
  double energy_floor = 1e-3;
};

struct CmvnStats {
  torch::Tensor mean, stdev; // global CMVN from the training set, [n_mels, 1] each
};

struct LayerCache {
  torch::Tensor attn; // [L, B, D]: normalised inputs of the last L frames, oldest first
  torch::Tensor conv; // [B, D, K - 1]: GLU outputs of the last K - 1 frames
  int64_t filled = 0; // rows of attn that hold audio (the others are zero padding)
};

struct AudioChunk {
  torch::Tensor feats; // [B, n_mels, T] log-mel frames, T a multiple of the stacking factor
  bool final = false;  // the client closed the stream
};

struct DevUtterance {
  torch::Tensor feats, tokens; // [1, n_mels, T] log-mel, [S] int64
};
struct ChunkAttentionImpl : nn::Module {
  explicit ChunkAttentionImpl(const StreamConfig &cfg) : heads_(cfg.n_head), dk_(cfg.d_model / cfg.n_head) {
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})));
    q_proj = register_module("q_proj", nn::Linear(cfg.d_model, cfg.d_model));
    kv_proj = register_module("kv_proj", nn::Linear(cfg.d_model, 2 * cfg.d_model));
    out_proj = register_module("out_proj", nn::Linear(cfg.d_model, cfg.d_model));
  }

  // [T, B, D] -> [B * H, T, dk], the layout bmm wants.
  torch::Tensor split_heads(const torch::Tensor &x) const {
    // FACT: kv = torch.randn(5, 2, 16); k = kv.chunk(2, -1)[0]; assert raises(lambda: k.view(5, 8, 2), "view size is not compatible")
    return x.view({x.size(0), x.size(1) * heads_, dk_}).transpose(0, 1); // EXPECT: tensor-view-non-contiguous -- k and v are halves of the fused kv projection: batch and heads cannot be merged by a view
  }

  // Slides the left context by one chunk: the oldest T rows go, this chunk's inputs come in.
  static void update_cache(LayerCache &cache, const torch::Tensor &h) {
    const auto L = cache.attn.size(0), T = h.size(0);
    // FACT: c = torch.randn(8, 2, 4); assert raises(lambda: c.narrow(0, 0, 6).copy_(c.narrow(0, 2, 6)), "single memory location")
    cache.attn.narrow(0, 0, L - T).copy_(cache.attn.narrow(0, T, L - T)); // EXPECT: tensor-inplace-overlap -- the kept rows overlap the rows they are copied into: PyTorch refuses the shift
    // FACT: c = torch.zeros(8, 2, 4); h = torch.randn(2, 2, 4); c.narrow(0, 6, 2).copy_(h); assert is_copy_of(c, h) and torch.equal(c[6:], h)
    cache.attn.narrow(0, L - T, T).copy_(h); // LOOKALIKE: tensor-inplace-overlap -- the chunk is a tensor of its own
    cache.filled = std::min(L, cache.filled + T);
  }

  // x: [T, B, D] this chunk; pad_mask: [L + T] bool, true for context slots without audio.
  torch::Tensor forward(const torch::Tensor &x, LayerCache &cache, const torch::Tensor &pad_mask) {
    const auto T = x.size(0), B = x.size(1), D = x.size(2), L = cache.attn.size(0);
    auto h = norm(x);
    auto ctx_in = torch::cat({cache.attn, h}, 0); // [L + T, B, D]
    // FACT: q = torch.nn.Linear(8, 8)(torch.randn(5, 2, 8)); assert is_view_of(q.view(5, 8, 2), q)
    auto q = q_proj(h).view({T, B * heads_, dk_}).transpose(0, 1); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto kv = kv_proj(ctx_in).chunk(2, -1);
    auto k = split_heads(kv[0]), v = split_heads(kv[1]);
    auto scores = torch::bmm(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(dk_)); // [B * H, T, L + T]
    // FACT: s = torch.bmm(torch.randn(8, 3, 2), torch.randn(8, 2, 7)) / 2.0; assert is_view_of(s.view(2, 4, 3, 7), s)
    scores.view({B, heads_, T, L + T}).masked_fill_(pad_mask.view({1, 1, 1, L + T}), -std::numeric_limits<float>::infinity()); // LOOKALIKE: tensor-view-non-contiguous, tensor-inplace-on-saved -- bmm's output is contiguous, and the division saved only the scalar
    auto probs = torch::softmax(scores, -1);
    auto ctx = torch::bmm(probs, v); // [B * H, T, dk]
    // FACT: c = torch.randn(8, 3, 2); m = c.transpose(0, 1).contiguous(); assert is_contiguous(m) and is_view_of(m.view(3, 2, 8), m)
    auto merged = ctx.transpose(0, 1).contiguous().view({T, B, D}); // LOOKALIKE: tensor-view-non-contiguous -- made contiguous first
    update_cache(cache, h);
    return out_proj(merged);
  }

  int64_t heads_, dk_;
  nn::LayerNorm norm{nullptr};
  nn::Linear q_proj{nullptr}, kv_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(ChunkAttention);

// Pointwise conv + GLU, causal depthwise conv fed from the cache, BatchNorm, Swish, pointwise conv.
struct CausalConvModuleImpl : nn::Module {
  explicit CausalConvModuleImpl(const StreamConfig &cfg) : kernel_(cfg.conv_kernel) {
    const auto D = cfg.d_model;
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({D})));
    pointwise1 = register_module("pointwise1", nn::Conv1d(nn::Conv1dOptions(D, 2 * D, 1)));
    depthwise = register_module("depthwise", nn::Conv1d(nn::Conv1dOptions(D, D, cfg.conv_kernel).groups(D))); // no padding: the cache gives the left frames
    bn = register_module("bn", nn::BatchNorm1d(D));
    pointwise2 = register_module("pointwise2", nn::Conv1d(nn::Conv1dOptions(D, D, 1)));
  }
  // [T, B, D] -> [T, B, D]
  torch::Tensor forward(const torch::Tensor &x, LayerCache &cache) {
    auto h = F::glu(pointwise1(norm(x).permute({1, 2, 0})), 1); // [B, D, T]
    auto padded = torch::cat({cache.conv, h}, 2);               // [B, D, K - 1 + T]
    cache.conv = padded.narrow(2, padded.size(2) - (kernel_ - 1), kernel_ - 1);
    h = bn(depthwise(padded));
    h = h * torch::sigmoid(h);
    return pointwise2(h).permute({2, 0, 1});
  }
  int64_t kernel_;
  nn::LayerNorm norm{nullptr};
  nn::Conv1d pointwise1{nullptr}, depthwise{nullptr}, pointwise2{nullptr};
  nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(CausalConvModule);

struct StreamingConformerLayerImpl : nn::Module {
  explicit StreamingConformerLayerImpl(const StreamConfig &cfg) {
    const auto D = cfg.d_model, H = cfg.ff_mult * cfg.d_model;
    ff1 = register_module("ff1", nn::Sequential(nn::LayerNorm(nn::LayerNormOptions({D})), nn::Linear(D, H), nn::SiLU(), nn::Linear(H, D)));
    attn = register_module("attn", ChunkAttention(cfg));
    conv = register_module("conv", CausalConvModule(cfg));
    ff2 = register_module("ff2", nn::Sequential(nn::LayerNorm(nn::LayerNormOptions({D})), nn::Linear(D, H), nn::SiLU(), nn::Linear(H, D)));
    final_norm = register_module("final_norm", nn::LayerNorm(nn::LayerNormOptions({D})));
  }
  torch::Tensor forward(torch::Tensor x, LayerCache &cache, const torch::Tensor &pad_mask) {
    x = x + 0.5 * ff1->forward(x);
    x = x + attn->forward(x, cache, pad_mask);
    x = x + conv->forward(x, cache);
    x = x + 0.5 * ff2->forward(x);
    return final_norm(x);
  }
  nn::Sequential ff1{nullptr}, ff2{nullptr};
  ChunkAttention attn{nullptr};
  CausalConvModule conv{nullptr};
  nn::LayerNorm final_norm{nullptr};
};
TORCH_MODULE(StreamingConformerLayer);

struct StreamingEncoderImpl : nn::Module {
  explicit StreamingEncoderImpl(const StreamConfig &cfg) : cfg_(cfg) {
    embed = register_module("embed", nn::Linear(cfg.stack * cfg.n_mels, cfg.d_model));
    layers = register_module("layers", nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      layers->push_back(StreamingConformerLayer(cfg));
    ctc = register_module("ctc", nn::Linear(cfg.d_model, cfg.vocab));
    nn::init::xavier_uniform_(embed->weight); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    torch::NoGradGuard no_grad;
    ctc->bias.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  // [B, n_mels, T] -> [B, T / stack, stack * n_mels]: consecutive frames side by side.
  torch::Tensor stack_frames(const torch::Tensor &feats) const {
    const auto B = feats.size(0), M = feats.size(1), T = feats.size(2);
    // FACT: x = torch.randn(2, 3, 8); y = x.transpose(1, 2).reshape(2, 2, 12); assert is_copy_of(y, x)
    return feats.transpose(1, 2).reshape({B, T / cfg_.stack, cfg_.stack * M}); // EXPECT: tensor-reshape-non-contiguous -- the mel-major chunk is turned frame-major: reshape silently copies every chunk
  }

  std::vector<LayerCache> init_caches(int64_t B, const torch::TensorOptions &opts) const {
    std::vector<LayerCache> caches(static_cast<size_t>(cfg_.n_layers));
    for (auto &c : caches) {
      c.attn = torch::zeros({cfg_.left_chunks * cfg_.chunk, B, cfg_.d_model}, opts);
      c.conv = torch::zeros({B, cfg_.d_model, cfg_.conv_kernel - 1}, opts);
    }
    return caches;
  }

  // One chunk of normalised log-mel frames -> CTC log-probabilities [T', B, vocab].
  torch::Tensor forward_chunk(const torch::Tensor &feats, std::vector<LayerCache> &caches) {
    auto x = embed(stack_frames(feats)).transpose(0, 1); // [T', B, D]
    const auto T = x.size(0), L = caches.front().attn.size(0);
    auto slot = torch::arange(L + T, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
    auto pad_mask = slot < (L - caches.front().filled); // LOOKALIKE: tensor-device-mismatch -- made on the chunk's device
    for (size_t i = 0; i < layers->size(); ++i)
      x = layers->ptr<StreamingConformerLayerImpl>(i)->forward(x, caches[i], pad_mask);
    return torch::log_softmax(ctc(x), -1);
  }

  StreamConfig cfg_;
  nn::Linear embed{nullptr}, ctc{nullptr};
  nn::ModuleList layers{nullptr};
};
TORCH_MODULE(StreamingEncoder);

// Global CMVN on a [B, n_mels, T] chunk.
torch::Tensor apply_cmvn(const torch::Tensor &feats, const torch::Tensor &mean, const torch::Tensor &stdev) {
  auto x = feats.contiguous();
  // FACT: f = torch.randn(2, 4, 6); x = f.contiguous(); x.sub_(torch.randn(4, 1)).div_(torch.rand(4, 1) + 0.5); assert shares_storage(x, f)
  x.sub_(mean).div_(stdev); // EXPECT: tensor-alias-then-mutate -- the frontend's chunk is already contiguous: the caller's features are normalised in place
  return x;
}

// Trailing-silence detector on raw log-mel frames: mean power of the last `tail` frames.
bool is_endpoint(const torch::Tensor &log_mel, double floor, int64_t tail) {
  auto power = log_mel.detach();
  // FACT: f = torch.randn(2, 4, 6); e = f.detach(); e.exp_(); assert shares_storage(e, f) and bool((f > 0).all())
  power.exp_(); // EXPECT: tensor-inplace-on-detached -- detach() shares storage: the log-mel chunk that is normalised and encoded next becomes linear power
  auto tail_power = power.narrow(2, power.size(2) - tail, tail).mean({1, 2});
  return (tail_power < floor).all().item<bool>();
}

struct Transcript {
  std::vector<std::vector<int64_t>> tokens; // one hypothesis per stream
  double avg_logprob = 0;
  int64_t chunks = 0;
};

Transcript stream_utterance(StreamingEncoder &enc, const std::vector<AudioChunk> &chunks, const CmvnStats &stats,
                            const StreamConfig &cfg) {
  torch::NoGradGuard no_grad;
  enc->eval();
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  enc->to(device);
  const auto B = chunks.front().feats.size(0);
  auto caches = enc->init_caches(B, torch::TensorOptions().device(device));
  Transcript out;
  out.tokens.resize(static_cast<size_t>(B));
  std::vector<torch::Tensor> chunk_ids;
  double score = 0;
  int64_t frames = 0;
  for (const auto &chunk : chunks) {
    const bool silent = is_endpoint(chunk.feats, cfg.energy_floor, cfg.endpoint_frames);
    auto feats = chunk.feats.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new chunk every iteration
    auto normed = apply_cmvn(feats, stats.mean.to(device), stats.stdev.to(device)); // EXPECT: tensor-clone-in-loop -- the same CMVN statistics are copied to the device for every chunk
    auto log_probs = enc->forward_chunk(normed, caches);
    auto best = log_probs.max(-1); // values and ids, [T', B]
    score += std::get<0>(best).sum().item<double>(); // EXPECT: tensor-sync-in-loop -- on a GPU every chunk waits here only to add up the confidence
    chunk_ids.push_back(std::get<1>(best)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, and argmax ids carry no gradient
    frames += log_probs.size(0);
    ++out.chunks;
    if (chunk.final || silent)
      break;
  }
  // One transfer per segment; repeats are collapsed across chunk boundaries and blanks dropped.
  auto ids = torch::cat(chunk_ids, 0).transpose(0, 1).contiguous().cpu(); // LOOKALIKE: tensor-sync-in-loop -- once, after the loop
  auto acc = ids.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t prev = cfg.blank;
    for (int64_t t = 0; t < acc.size(1); ++t) {
      const int64_t tok = acc[b][t];
      if (tok != cfg.blank && tok != prev)
        out.tokens[static_cast<size_t>(b)].push_back(tok);
      prev = tok;
    }
  }
  out.avg_logprob = score / static_cast<double>(std::max<int64_t>(frames * B, 1));
  return out;
}

// Dev-set CTC loss through the same chunked encoder (utterances one at a time).
double dev_ctc_loss(StreamingEncoder &enc, const std::vector<DevUtterance> &dev, const CmvnStats &stats, const StreamConfig &cfg,
                    torch::Device device) {
  enc->eval();
  enc->to(device);
  const auto mean = stats.mean.to(device), stdev = stats.stdev.to(device); // LOOKALIKE: tensor-clone-in-loop -- moved once, before the loop
  const auto step = cfg.chunk * cfg.stack;
  double total = 0;
  for (const auto &utt : dev) {
    auto feats = utt.feats.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different utterance every iteration
    auto caches = enc->init_caches(1, feats.options());
    std::vector<torch::Tensor> emissions;
    for (int64_t s = 0; s + step <= feats.size(2); s += step) {
      auto piece = apply_cmvn(feats.narrow(2, s, step), mean, stdev);
      emissions.push_back(enc->forward_chunk(piece, caches)); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every chunk's graph and activations stay alive until the utterance is scored
    }
    auto log_probs = torch::cat(emissions, 0); // [T', 1, V]
    auto in_len = torch::full({1}, log_probs.size(0), torch::kLong), tgt_len = torch::full({1}, utt.tokens.size(0), torch::kLong);
    auto loss = F::ctc_loss(log_probs, utt.tokens.unsqueeze(0).to(device), in_len, tgt_len,
                            F::CTCLossFuncOptions().blank(cfg.blank).zero_infinity(true));
    total += loss.item<double>(); // LOOKALIKE: tensor-graph-kept-across-iterations -- item() keeps a number, not the graph
  }
  return total / static_cast<double>(std::max<size_t>(dev.size(), 1));
}

// Weights exported from the PyTorch training run: name -> tensor, in LibTorch naming.
void load_exported(StreamingEncoder &enc, const std::unordered_map<std::string, torch::Tensor> &weights) {
  for (auto &item : enc->named_parameters()) {
    auto it = weights.find(item.key());
    TORCH_CHECK(it != weights.end(), "missing parameter ", item.key());
    // FACT: p = torch.nn.Parameter(torch.zeros(3, 4)); assert raises(lambda: p.copy_(torch.randn(3, 4)), "a leaf Variable that requires grad")
    item.value().copy_(it->second); // EXPECT: tensor-inplace-on-leaf -- a parameter written with grad mode on: PyTorch refuses
  }
  torch::NoGradGuard no_grad;
  for (auto &item : enc->named_buffers()) {
    if (auto it = weights.find(item.key()); it != weights.end())
      item.value().copy_(it->second); // LOOKALIKE: tensor-inplace-on-leaf, tensor-copy-narrowing -- BatchNorm statistics are buffers, exported with their own dtypes
  }
}

void run_captioning(const std::unordered_map<std::string, torch::Tensor> &weights, const CmvnStats &stats,
                    const std::vector<DevUtterance> &dev, const std::vector<AudioChunk> &live, const StreamConfig &cfg) {
  StreamingEncoder enc(cfg);
  load_exported(enc, weights);
  std::cout << "dev ctc " << dev_ctc_loss(enc, dev, stats, cfg, torch::kCPU) << "\n";
  const auto tr = stream_utterance(enc, live, stats, cfg);
  std::cout << tr.tokens.size() << " streams, " << tr.chunks << " chunks, mean log-prob " << tr.avg_logprob << "\n";
}
