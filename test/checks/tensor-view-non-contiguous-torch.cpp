// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-view-non-contiguous %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-view-non-contiguous %t.plugin -- --fix-errors -- %torch_pch
#include <torch/torch.h>

torch::Tensor certain() {
  auto x = torch::randn({3, 4});
  return x.t().view({12});
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: 'view' on the non-contiguous result of 't' always throws at run time: sizes [4, 3] with strides [1, 4] cannot be viewed as [12]
  // CHECK-FIXES: return x.t().contiguous().view({12});
}

torch::Tensor mergeHeads(const torch::Tensor &y, int64_t B, int64_t T, int64_t nh, int64_t hs) {
  auto att = y.view({B, T, nh, hs}).transpose(1, 2); // [B, nh, T, hs]
  return att.view({B, T, nh * hs});
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1 (assuming 'y' is contiguous, as nearly all tensors are)
  // CHECK-FIXES: return att.contiguous().view({B, T, nh * hs});
}

torch::Tensor matrix(const torch::Tensor &w) {
  return torch::transpose(w, 0, 1).view(-1);
  // CHECK-MESSAGES: :[[@LINE-1]]:36: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1 (assuming 'w' is contiguous
  // CHECK-FIXES: return torch::transpose(w, 0, 1).reshape(-1);
}

void negatives(const torch::Tensor &x, int64_t B, int64_t T, int64_t nh, int64_t hs) {
  torch::randn({3, 4}).t().view({4, 3});              // the transposed shape
  x.view({B, T, nh, hs}).transpose(1, 2).view({B, nh, T, hs}); // no merge
  x.view({B, T, nh, hs}).transpose(1, 2).contiguous().view({B, T, nh * hs});
  torch::zeros({2, 3, 4}).permute({0, 2, 1}).view({2, 12}).sum(); // merges 4 and 3: no
  // CHECK-MESSAGES: :[[@LINE-1]]:46: error: 'view' on the non-contiguous result of 'permute' always throws
}

// expand of a tensor whose sizes the code does not show: the target names the
// rank, and a dim it changes is taken as the broadcast size-1 dim it must be.
torch::Tensor headsMask(const torch::Tensor &pad_mask, int64_t n_heads) {
  auto B = pad_mask.size(0), T = pad_mask.size(2);
  auto m = pad_mask.expand({B, n_heads, T, T});
  return m.view({B * n_heads, T, T});
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'view' on the non-contiguous result of 'expand' throws at run time unless the dimensions it merges have size 1 (assuming 'pad_mask' is contiguous
  // CHECK-FIXES: return m.contiguous().view({B * n_heads, T, T});
}

torch::Tensor alibiFlat(const torch::Tensor &slopes, const torch::Tensor &scores) {
  auto bias = slopes.view({1, -1, 1, 1}).expand_as(scores);
  return bias.view({-1});
  // CHECK-MESSAGES: :[[@LINE-1]]:15: warning: 'view' on the non-contiguous result of 'expand_as' throws at run time
  // CHECK-FIXES: return bias.contiguous().view({-1});
}

// Look-alikes: merging only dims expand kept, expanding a new leading dim.
torch::Tensor expandNegatives(const torch::Tensor &pad_mask, const torch::Tensor &pos,
                              const torch::Tensor &slopes, const torch::Tensor &scores,
                              int64_t n_heads) {
  auto B = pad_mask.size(0), T = pad_mask.size(2);
  auto m = pad_mask.expand({B, n_heads, T, T}).view({B, n_heads, T * T});
  auto p = pos.unsqueeze(0).expand({B, -1, -1}).view({B, -1});
  auto s = slopes.view({1, -1, 1, 1}).expand_as(scores).sum();
  return m.sum() + p.sum() + s;
}

// In-place ops outside the table (index_add_, masked_fill_) return self with
// its layout: the transpose of their result is still not viewable.
torch::Tensor gatherHeads(const torch::Tensor &h, const torch::Tensor &dst, const torch::Tensor &msg,
                          int64_t n) {
  auto agg = torch::zeros({4, n, h.size(2)}, h.options()).index_add_(1, dst, msg);
  auto nodeMajor = agg.transpose(0, 1);
  return nodeMajor.view({n, -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:20: error: 'view' on the non-contiguous result of 'transpose'
}

torch::Tensor ctcTimeMajor(const torch::Tensor &feats, const torch::Tensor &pad) {
  auto logProbs = torch::log_softmax(feats, 2);
  logProbs.masked_fill_(pad.unsqueeze(2), 0.0);
  auto tm = logProbs.transpose(0, 1);
  return tm.view({-1, tm.size(2)});
  // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'view' on the non-contiguous result of 'transpose'
}

// t_ transposes self back (TT_RESHAPES_SELF): its layout is not followed.
torch::Tensor transposedBack(const torch::Tensor &x) {
  auto y = x.transpose(0, 1);
  y.t_();
  return y.view({-1});
}

// A batch_first LSTM/GRU/RNN returns its [seq, batch, hidden] output
// transposed (Note [batch_first RNN outputs]): no view to fewer dims.
struct TaggerImpl : torch::nn::Module {
  TaggerImpl(int64_t in, int64_t hidden) : hidden_(hidden) {
    lstm = register_module(
        "lstm", torch::nn::LSTM(torch::nn::LSTMOptions(in, hidden).batch_first(true)));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto out = std::get<0>(lstm->forward(x));
    return out.view({-1, hidden_});
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'view' on the non-contiguous result of 'batch_first LSTM' throws at run time unless the dimensions it merges have size 1
    // CHECK-MESSAGES: :[[@LINE-3]]:34: note: made non-contiguous here by 'batch_first LSTM'
    // CHECK-FIXES: return out.contiguous().view({-1, hidden_});
  }
  // The last step of each sequence is a contiguous [B, H].
  torch::Tensor lastStep(torch::Tensor x) {
    auto [out, state] = lstm->forward(x);
    return out.select(1, -1).view({x.size(0), -1});
  }
  torch::Tensor copied(torch::Tensor x) {
    auto out = std::get<0>(lstm(x));
    return out.contiguous().view({-1, hidden_});
  }
  // One step (`x.unsqueeze(1)`): the dim the transpose swaps has size 1.
  torch::Tensor oneStep(torch::Tensor x) {
    auto res = lstm->forward(x.unsqueeze(1));
    return std::get<0>(res).view({x.size(0), hidden_});
  }
  // h_n is [layers, B, H] and contiguous whatever batch_first says.
  torch::Tensor hidden(torch::Tensor x) {
    auto [out, state] = lstm->forward(x);
    return std::get<0>(state).view({-1, hidden_});
  }
  int64_t hidden_;
  torch::nn::LSTM lstm{nullptr};
};

struct GruEncoderImpl : torch::nn::Module {
  GruEncoderImpl(int64_t in, int64_t hidden) {
    auto opts = torch::nn::GRUOptions(in, hidden).num_layers(2);
    opts.batch_first(true);
    gru = register_module("gru", torch::nn::GRU(opts));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto res = gru(x);
    auto out = std::get<0>(res);
    return out.view({out.size(0) * out.size(1), out.size(2)});
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'view' on the non-contiguous result of 'batch_first GRU'
  }
  torch::nn::GRU gru{nullptr};
};

// Sequence-first (the default), or a flag the TU does not show: not reported.
struct SeqFirstImpl : torch::nn::Module {
  SeqFirstImpl(int64_t in, int64_t hidden) : gru(torch::nn::GRUOptions(in, hidden)) {
    register_module("gru", gru);
  }
  torch::Tensor forward(torch::Tensor x) { return std::get<0>(gru(x)).view({-1, 8}); }
  torch::nn::GRU gru;
};
struct ConfiguredImpl : torch::nn::Module {
  ConfiguredImpl(int64_t in, bool batchFirst) {
    lstm = register_module(
        "lstm", torch::nn::LSTM(torch::nn::LSTMOptions(in, 16).batch_first(batchFirst)));
  }
  torch::Tensor forward(torch::Tensor x) { return std::get<0>(lstm(x)).view({-1, 16}); }
  torch::nn::LSTM lstm{nullptr};
};
struct GivenImpl : torch::nn::Module {
  explicit GivenImpl(torch::nn::LSTMOptions o) : lstm(o) {}
  torch::Tensor forward(torch::Tensor x) { return std::get<0>(lstm(x)).view({-1, 16}); }
  torch::nn::LSTM lstm;
};
torch::Tensor unbatched(torch::nn::RNN rnn, int64_t t) {
  torch::nn::RNN local(torch::nn::RNNOptions(4, 8).batch_first(true));
  return std::get<0>(local->forward(torch::randn({t, 4}))).view({-1});
}

torch::Tensor padded(torch::nn::LSTM lstm, torch::Tensor x, torch::Tensor lens) {
  namespace rnn = torch::nn::utils::rnn;
  auto packed = std::get<0>(lstm->forward_with_packed_input(rnn::pack_padded_sequence(x, lens, true)));
  auto [seqFirst, l1] = rnn::pad_packed_sequence(packed);
  auto [batchFirst, l2] = rnn::pad_packed_sequence(packed, /*batch_first=*/true);
  return seqFirst.view({-1, 8}) + batchFirst.view({-1, 8});
  // CHECK-MESSAGES: :[[@LINE-1]]:46: warning: 'view' on the non-contiguous result of 'batch_first pad_packed_sequence'
  // CHECK-MESSAGES: :[[@LINE-3]]:27: note: made non-contiguous here by 'batch_first pad_packed_sequence'
}

// A Linear keeps its input's leading dims: [B, T, H] -> [B, T, tags].
struct EmissionsImpl : torch::nn::Module {
  EmissionsImpl(int64_t in, int64_t hidden, int64_t tags) {
    gru = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(in, hidden).batch_first(true)));
    out = register_module("out", torch::nn::Linear(hidden, tags));
  }
  torch::Tensor timeMajor(torch::Tensor x) {
    auto logits = out(std::get<0>(gru(x)));
    auto T = logits.size(1);
    return logits.transpose(0, 1).view({T, -1});
    // CHECK-MESSAGES: :[[@LINE-1]]:35: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1
  }
  torch::Tensor flat(torch::Tensor x) {
    auto logits = out->forward(std::get<0>(gru(x)));
    return logits.view({-1, logits.size(2)}); // the Linear's output is fresh and contiguous
  }
  torch::nn::GRU gru{nullptr};
  torch::nn::Linear out{nullptr};
};

// A convolution keeps its input's rank and batch and makes a contiguous
// output; a residual sum whose first operand is that output is laid out as
// it (TensorIterator), so frames are not rows of its transpose.
struct TemporalConvImpl : torch::nn::Module {
  torch::Tensor residual(torch::Tensor pooled, int64_t T) {
    const auto N = pooled.size(0) / T, C = pooled.size(1);
    auto seq = pooled.view({N, T, C}).transpose(1, 2);
    auto feat = torch::relu(tconv(seq)) + seq;
    return feat.transpose(1, 2).view({N * T, C});
    // CHECK-MESSAGES: :[[@LINE-1]]:33: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1
  }
  torch::Tensor seqFirst(torch::Tensor pooled, int64_t T) {
    const auto N = pooled.size(0) / T, C = pooled.size(1);
    auto seq = pooled.view({N, T, C}).transpose(1, 2);
    auto feat = seq + torch::relu(tconv(seq)); // laid out as seq: the transpose is contiguous
    return feat.transpose(1, 2).view({N * T, C});
  }
  torch::Tensor pooledMap(torch::Tensor x) {
    return pool(x.view({x.size(0), 3, 32, 32})).view({x.size(0), -1}); // pooling a contiguous input
  }
  torch::nn::Conv1d tconv{nullptr};
  torch::nn::MaxPool2d pool{nullptr};
};

// mm's result is [n, m] whatever its operands: its transpose cannot be flattened.
torch::Tensor transformedPoints(const torch::Tensor &R, const torch::Tensor &pts,
                                const torch::Tensor &t) {
  auto world = (R.mm(pts.t()) + t.unsqueeze(1)).t();
  return world.view({-1});
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: 'view' on the non-contiguous result of 't' throws at run time unless the dimensions it merges have size 1 ('view size is not compatible with input tensor's size and stride'); make the copy explicit with '.contiguous().view(...)' or use 'reshape' [tensor-view-non-contiguous]
  // CHECK-FIXES: {{^}}  return world.contiguous().view({-1});{{$}}
}

// A leading 1 in the new shape says the input's leading size is 1 (a batch
// of one): [1, gh, gw, D] merges gh and gw, adjacent after the permute.
torch::Tensor posForGrid(const torch::Tensor &resized, int64_t gh, int64_t gw, int64_t D) {
  return resized.permute({0, 2, 3, 1}).view({1, gh * gw, D});
}

// Without it the batch is a chunk of its own.
torch::Tensor tokensOfBatch(const torch::Tensor &x) {
  return x.permute({0, 2, 3, 1}).view({-1, x.size(1)});
  // CHECK-MESSAGES: :[[@LINE-1]]:34: warning: 'view' on the non-contiguous result of 'permute' throws at run time unless the dimensions it merges have size 1
}

// Element counts that differ ([B*N, s] viewed as [B, N]) say a size taken as
// generic is 1 (a Linear's out_features): the layout decides nothing, and a
// contiguous input is viewable anyway.
torch::Tensor confidences(const torch::Tensor &fs, torch::nn::Linear score) {
  const auto B = fs.size(0), N = fs.size(2), D = fs.size(1);
  auto rows = fs.transpose(1, 2).reshape({B * N, D});
  auto conf = torch::sigmoid(score(rows)).view({B, N});
  return conf + score(rows).view({B, N, 1}).squeeze(-1);
}

// Counts that differ do not hide the chunks: after the transpose [B, T, H,
// Dh] is four runs, which three new dims cannot cover, whatever d_model is.
torch::Tensor mergeHeads(int64_t B, int64_t H, int64_t T, int64_t Dh, int64_t d_model) {
  auto attn = torch::randn({B, H, T, Dh});
  return attn.transpose(1, 2).view({B, T, d_model});
  // CHECK-MESSAGES: :[[@LINE-1]]:31: error: 'view' on the non-contiguous result of 'transpose' throws at run time unless
}

// A helper of the file permutes; its result's sizes are the argument's, so the
// caller's view merging B and H (the argument's sizes) cannot be a view.
torch::Tensor toRows(const torch::Tensor &x) { return x.permute({0, 2, 3, 1}); }
torch::Tensor rowsOf(const torch::Tensor &fl) {
  const auto B = fl.size(0), C = fl.size(1), H = fl.size(2), W = fl.size(3);
  return toRows(fl).view({B * H, W, C});
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'view' on the non-contiguous result of 'permute'
}
torch::Tensor rowsKeptOrder(const torch::Tensor &fl) {
  const auto B = fl.size(0), H = fl.size(2), W = fl.size(3), C = fl.size(1);
  return toRows(fl).view({B, H * W, C}); // merges H and W, adjacent after the permute
}

// Fields of a local aggregate keep their initialisers' layouts, also after a
// read-only method call on another field.
struct RowsCols {
  torch::Tensor rows, cols;
};

torch::Tensor flattenBoth(const torch::Tensor &x) {
  RowsCols v{x.contiguous(), x.transpose(0, 1)};
  auto a = v.rows.view({-1}); // contiguous: a view
  return v.cols.view({-1}) + a;
  // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: 'view' on the non-contiguous result of 'transpose' throws at run time
}

// log10 (and log2, tan, ...) keep their input's layout, as every unary op.
torch::Tensor peakPerClip(const torch::Tensor &power, const torch::Tensor &filters, int64_t B) {
  auto mel = torch::matmul(power, filters.t()).transpose(1, 2);
  auto logSpec = torch::clamp_min(mel, 1e-10).log10();
  return std::get<0>(logSpec.view({B, -1}).max(1));
  // CHECK-MESSAGES: :[[@LINE-1]]:30: warning: 'view' on the non-contiguous result of 'transpose'
}

// An input of unknown rank, taken as contiguous, decides the layout of an
// elementwise op with a 0-d tensor, a vector or another unranked operand: the
// result keeps its dims, which t() swaps.
torch::Tensor attentionRows(const torch::Tensor &e, const torch::Tensor &bias) {
  auto alpha = (e - e.max().detach()).exp() + bias;
  return alpha.detach().t().view({-1});
  // CHECK-MESSAGES: :[[@LINE-1]]:29: warning: 'view' on the non-contiguous result of 't'
}
// The other way round: a vector first takes the unranked operand's dims, so
// nothing is known of the result's layout.
torch::Tensor biasFirst(const torch::Tensor &e, const torch::Tensor &bias) {
  auto b = bias.view({-1});
  return (b + e).t().view({-1});
}
// A size-1 dim of the unranked operand (unsqueeze) leaves the layout open.
torch::Tensor unitDim(const torch::Tensor &e, const torch::Tensor &s) {
  return (e.unsqueeze(0) * s).transpose(0, 1).view({-1});
}

// Note [rank across a join]: a KV cache concatenated on one path keeps the
// rank of the keys; the concatenated dim becomes a size of its own.
torch::Tensor cachedKeys(const torch::Tensor &x, const torch::Tensor &cache_k, bool use_cache,
                         int64_t B, int64_t T, int64_t H, int64_t D) {
  auto k = x.view({B, T, H, D}).transpose(1, 2).contiguous();
  if (use_cache)
    k = torch::cat({cache_k, k}, 2);
  auto heads = k.view({B, H, -1}); // contiguous on both paths: a view
  return k.transpose(1, 2).view({B, -1, H * D}) + heads.sum();
  // CHECK-MESSAGES: :[[@LINE-1]]:28: error: 'view' on the non-contiguous result of 'transpose'
}
// A size 1 on one path is not generalised: decoding one token.
torch::Tensor oneToken(const torch::Tensor &x, const torch::Tensor &cache_k, bool use_cache,
                       int64_t B, int64_t H, int64_t D) {
  auto k = x.view({B, 1, H, D}).transpose(1, 2).contiguous();
  if (use_cache)
    k = torch::cat({cache_k, k}, 2);
  return k.transpose(1, 2).view({B, -1, H * D});
}

// torch::stack of a braced list without a dim stacks along dim 0 (the default
// argument): the elements' rank plus one.
torch::Tensor stackedPairs(const torch::Tensor &x, const torch::Tensor &y, int64_t B, int64_t D) {
  auto s = torch::stack({x.view({B, D}), y.view({B, D})});
  auto rows = s.view({2 * B, D}); // contiguous: a view
  return s.transpose(0, 1).view({B, 2 * D}) + rows.sum();
  // CHECK-MESSAGES: :[[@LINE-1]]:28: error: 'view' on the non-contiguous result of 'transpose'
}

// Pooling over a window a run-time size gives (global pooling) leaves size-1
// dims, so its layout is not decided from the sizes > 1 default.
torch::Tensor pooledFeatures(torch::nn::Linear &model, const torch::Tensor &x) {
  namespace F = torch::nn::functional;
  auto out = model->forward(x);
  auto global = F::max_pool1d(out.transpose(1, 2), F::MaxPool1dFuncOptions(out.size(1)));
  auto windows = F::max_pool1d(out.transpose(1, 2), F::MaxPool1dFuncOptions(3));
  auto perWindow = windows.transpose(1, 2).view({x.size(0), -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:44: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1
  return global.transpose(1, 2).view({x.size(0), -1}) + perWindow;
}

// A struct's field holds what the function that made it returns there, through
// a forward that returns another module's struct. An op on a tensor with gaps
// allocates a dense result (Note [dense results]).
struct Mixture {
  torch::Tensor logits, means, stds;
};
struct MixtureHeadImpl : torch::nn::Module {
  torch::nn::Linear proj{nullptr};
  MixtureHeadImpl() { proj = register_module("proj", torch::nn::Linear(8, 27)); }
  Mixture forward(const torch::Tensor &h) {
    const int64_t B = h.size(0);
    auto raw = proj(h).view({B, 3, 9});
    return {raw.select(2, 0), raw.narrow(2, 1, 4), raw.narrow(2, 5, 4).exp()};
  }
};
TORCH_MODULE(MixtureHead);
struct MixturePolicyImpl : torch::nn::Module {
  MixtureHead head;
  Mixture forward(const torch::Tensor &obs) { return head->forward(obs); }
};
TORCH_MODULE(MixturePolicy);
torch::Tensor mixtureRows(MixturePolicy &policy, const torch::Tensor &obs) {
  auto out = policy->forward(obs);
  const int64_t B = obs.size(0);
  auto means = out.means.view({B, -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:26: warning: 'view' on the non-contiguous result of 'narrow' throws at run time unless the dimensions it merges have size 1
  auto stds = out.stds.view({B, -1});
  return torch::cat({means, stds}, 1);
}

// expand keeps a dim for each -1, any number of them; the chunks of the
// expanded tensor decide a new shape whose sizes cannot be related to it.
torch::Tensor repeatCodes(torch::nn::Embedding &codes, const torch::Tensor &idx,
                          const torch::Tensor &samples) {
  const auto shapes = samples.size(0), per = samples.size(1);
  auto lat = codes(idx);
  auto kept = lat.unsqueeze(1).expand({-1, per, -1}).view({shapes, per, -1}); // splits only
  return lat.unsqueeze(1).expand({-1, per, -1}).view({shapes * per, -1}) + kept.sum();
  // CHECK-MESSAGES: :[[@LINE-1]]:49: warning: 'view' on the non-contiguous result of 'expand' throws at run time unless the dimensions it merges have size 1
}

// A narrow of a tensor of unknown rank keeps its source's strides: dropping
// the first step of every sequence and merging the rest throws at any rank
// where `seq.size(-1)` is the last dim. An op on it, or contiguous(), gives a
// dense tensor (Note [dense results]).
torch::Tensor laterSteps(const torch::Tensor &seq) {
  const auto T = seq.size(1), V = seq.size(-1);
  auto later = seq.narrow(1, 1, T - 1);
  auto dense = later.exp().view({-1, V}) + later.contiguous().view({-1, V});
  return later.view({-1, V}) + dense;
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'view' on the non-contiguous result of 'narrow' throws at run time unless the dimensions it merges have size 1 (assuming 'seq' is contiguous, as nearly all tensors are)
}

// Note [kept outer dim]: the first size of `view({n, -1})` the code does not
// relate is the tensor's own first; t() takes a matrix (no claim).
torch::Tensor envMajor(const torch::Tensor &arr, const torch::Tensor &z, int64_t n) {
  return arr.transpose(0, 1).view({n, -1}).sum() + z.t().view({n, -1}).sum();
  // CHECK-MESSAGES: :[[@LINE-1]]:30: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1 (assuming 'arr' is contiguous, as nearly all tensors are, and has 3 or more dimensions: with fewer, the new shape is its own)
}

// A lambda of the file is read as a function: what its body returns.
torch::Tensor lambdaHeads(const torch::Tensor &x, int64_t H, int64_t D) {
  const auto B = x.size(0), T = x.size(1);
  auto split = [&](const torch::Tensor &t) { return t.view({B, -1, H, D}).transpose(1, 2); };
  auto packed = [&](const torch::Tensor &t) { return split(t).contiguous(); };
  auto qh = split(x), vh = split(x);
  auto ctx = torch::matmul(torch::softmax(torch::matmul(qh, qh.transpose(-2, -1)), -1), vh);
  auto merged = packed(x).view({B, H, -1});
  return ctx.transpose(1, 2).view({B, T, H * D}) + merged.sum();
  // CHECK-MESSAGES: :[[@LINE-1]]:30: error: 'view' on the non-contiguous result of 'transpose' throws at run time
}

// Source text quoted in a message may hold '%': it is printed, not read as
// a format argument (this crashed the check before).
torch::Tensor moduloBatch(const std::vector<torch::Tensor> &data, int64_t step) {
  auto batch = data[step % data.size()];
  return batch.narrow(1, 1, 4).view(-1);
  // CHECK-MESSAGES: :[[@LINE-1]]:32: warning: 'view' on the non-contiguous result of 'narrow' throws at run time unless the dimensions it merges have size 1 (assuming the result of 'data[step % data.size()]' is contiguous
}

// A slice with a step of 1 is a narrow: `tokens.slice(1, 1)` drops the class
// token and merging the batch with the rest throws; a slice with a step
// changes the stride (not followed), one along dim 0 stays contiguous.
torch::Tensor patchTokens(const torch::Tensor &tokens) {
  auto flat0 = tokens.slice(0, 1).view({-1, tokens.size(2)});
  auto stepped = tokens.slice(1, 1, tokens.size(1), 2);
  return tokens.slice(1, 1).view({-1, tokens.size(2)}) + flat0.sum() + stepped.sum();
  // CHECK-MESSAGES: :[[@LINE-1]]:29: warning: 'view' on the non-contiguous result of 'slice' throws at run time unless the dimensions it merges have size 1 (assuming 'tokens' is contiguous, as nearly all tensors are, and has 3 or more dimensions
}

// An elementwise op on a narrow orders its result's dims as the narrow's
// strides do: contiguous, so its transpose is not (Note [dense results]).
torch::Tensor readyHop(const torch::Tensor &pending, const torch::Tensor &weights, int64_t hop) {
  auto ready = pending.narrow(2, 1, hop) / weights.narrow(0, 1, hop).clamp_min(1e-6);
  return ready.select(0, 0).t().view({-1});
  // CHECK-MESSAGES: :[[@LINE-1]]:33: warning: 'view' on the non-contiguous result of 't' throws at run time unless the dimensions it merges have size 1
}
// A narrow from 0 may keep its whole dim, but its strides are in order all
// the same: the op's result is contiguous either way (demucs_chunked_overlap_add).
torch::Tensor readyFromStart(const torch::Tensor &pending, const torch::Tensor &weights,
                             int64_t hop) {
  auto ready = pending.narrow(2, 0, hop) / weights.narrow(0, 0, hop).clamp_min(1e-6);
  return ready.select(0, 0).t().view({-1});
  // CHECK-MESSAGES: :[[@LINE-1]]:33: warning: 'view' on the non-contiguous result of 't' throws at run time unless the dimensions it merges have size 1
}
// Whether a view of the narrow itself works depends on the length: silent.
torch::Tensor headRows(const torch::Tensor &x, int64_t n) {
  auto head = x.narrow(1, 0, n).view({-1});
  return head + (x.narrow(2, 0, n) * 2).view({-1}).sum();
}
