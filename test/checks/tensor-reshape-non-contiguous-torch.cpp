// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-reshape-non-contiguous %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-reshape-non-contiguous %t.plugin -- --quiet -- %torch_pch
#include <torch/torch.h>

torch::Tensor featureMap() {
  auto p = torch::zeros({64, 256, 56, 56}).permute({0, 2, 3, 1});
  return p.reshape({64, -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'reshape' silently copies the non-contiguous result of 'permute' (196.0 MiB): the new shape cannot be a view of its strides; make the copy explicit with '.contiguous().view(...)'
  // CHECK-FIXES: return p.contiguous().view({64, -1});
}

torch::Tensor half() {
  auto h = torch::ones({512, 512}, torch::kHalf).t();
  return h.flatten();
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'flatten' silently copies the non-contiguous result of 't' (512.0 KiB)
}

torch::Tensor heads(const torch::Tensor &x, int64_t nh) {
  auto B = x.size(0), T = x.size(1), C = x.size(2);
  auto y = x.view({B, T, nh, C / nh}).transpose(1, 2);
  return y.reshape({B, T, C});
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless
}

// Real code shows no layout: inputs and results of calls are taken as
// contiguous, sizes as > 1, and the message says so.
torch::Tensor f1(const torch::Tensor &x) {
  auto y = x.transpose(1, 2);
  return y.reshape({x.size(0), -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming 'x' is contiguous, as nearly all tensors are)
}

torch::Tensor f2(torch::Tensor a, torch::Tensor b) {
  return torch::matmul(a, b).transpose(1, 2).reshape({2, 12});
  // CHECK-MESSAGES: :[[@LINE-1]]:46: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
}

torch::Tensor nchwToRows(const torch::Tensor &x) {
  return x.permute({0, 2, 3, 1}).reshape({-1, x.size(1)});
  // CHECK-MESSAGES: :[[@LINE-1]]:34: warning: 'reshape' silently copies the non-contiguous result of 'permute'
}

torch::Tensor lstmOut(torch::nn::LSTM &lstm, const torch::Tensor &x) {
  auto out = std::get<0>(lstm->forward(x));
  // Note [no-op at the smallest rank]: a no-op on a 2-D output, so meant for 3-D.
  auto swapped = out.transpose(0, 1).flatten(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:38: warning: 'flatten' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming the result of 'std::get<0>(lstm->forward(x))' is contiguous, as nearly all tensors are, and has 3 or more dimensions: with fewer, the new shape is its own)
  return out.transpose(1, 2).flatten(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:30: warning: 'flatten' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming the result of 'std::get<0>(lstm->forward(x))' is contiguous
}

void negatives(const torch::Tensor &x, torch::nn::Linear &l) {
  torch::zeros({64, 256, 56, 56}).permute({0, 2, 3, 1}).reshape({64, 56, 56, 256}); // a view
  torch::zeros({4, 6}).narrow(0, 1, 2).reshape({12});
  x.permute({0, 2, 3, 1}).reshape({x.size(0), x.size(2), x.size(3), 1, -1}); // splits only
  x.transpose(1, 2).contiguous().reshape({x.size(0), -1}); // the explicit copy
  x.unsqueeze(1).transpose(0, 1).reshape({-1});            // swaps a size-1 dim
  l(x).reshape({-1, 4});                                   // a module output: contiguous
  torch::softmax(x.transpose(1, 2), -1).reshape({x.size(0), -1}); // softmax allocates
  x.transpose(1, 2).relu().transpose(1, 2).reshape({-1});  // two transposes cancel? unknown rank: no claim
}

// What a helper of the TU returns: its body read with the defaults.
torch::Tensor splitHeads(const torch::Tensor &t, int64_t nh, int64_t dh) {
  return t.view({t.size(0), t.size(1), nh, dh}).transpose(1, 2);
}
torch::Tensor mergeAfterHelper(const torch::Tensor &x, int64_t nh, int64_t dh) {
  auto q = splitHeads(x, nh, dh);
  return q.reshape({x.size(0), -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming 't' in 'splitHeads' is contiguous, as nearly all tensors are)
}
torch::Tensor attentionMerge(const torch::Tensor &x, int64_t nh, int64_t dh) {
  auto q = splitHeads(x, nh, dh), k = splitHeads(x * 2, nh, dh);
  auto o = torch::matmul(torch::softmax(torch::matmul(q, k.transpose(2, 3)), -1), q);
  return o.transpose(1, 2).reshape({x.size(0), x.size(1), nh * dh});
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
}
// Overlapping windows (hop != frame length) cannot be merged by a view.
torch::Tensor frameRows(const torch::Tensor &wave, int64_t frame, int64_t hop) {
  return wave.unfold(1, frame, hop).reshape({wave.size(0), -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:37: warning: 'reshape' silently copies the non-contiguous result of 'unfold': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming 'wave' is contiguous, as nearly all tensors are)
}
torch::Tensor windowsOf(const torch::Tensor &wave, int64_t frame, int64_t hop) {
  return wave.unfold(-1, frame, hop);
}
torch::Tensor flatWindows(const torch::Tensor &wave, int64_t frame, int64_t hop) {
  return windowsOf(wave, frame, hop).flatten();
  // CHECK-MESSAGES: :[[@LINE-1]]:38: warning: 'flatten' silently copies the non-contiguous result of 'unfold'
}

struct Base {
  virtual ~Base() = default;
  virtual torch::Tensor heads(const torch::Tensor &t) { return t.transpose(1, 2); }
};
torch::Tensor contiguousHelper(const torch::Tensor &t) { return t.transpose(1, 2).contiguous(); }
torch::Tensor identityHelper(const torch::Tensor &t) { return t; }
int64_t width(const torch::Tensor &t) { return t.size(1); }
torch::Tensor recursive(const torch::Tensor &t, int n) {
  return n ? recursive(t.transpose(0, 1), n - 1) : t;
}

void helperNegatives(const torch::Tensor &x, Base &b, int64_t frame) {
  b.heads(x).reshape({x.size(0), -1});               // virtual: another body may run
  contiguousHelper(x).reshape({x.size(0), -1});      // the helper made it contiguous
  identityHelper(x.transpose(1, 2)).reshape({-1});   // the helper's input is not followed: no claim
  recursive(x, 3).reshape({x.size(0), -1});          // a recursive helper: no claim
  x.unfold(1, frame, frame).reshape({x.size(0), -1}); // back-to-back patches: may be a view
  (x.unfold(1, frame, 2) * 2).reshape({x.size(0), -1}); // a fresh product of the windows
  x.unfold(1, frame, 2).contiguous().view({x.size(0), -1}); // the explicit copy
  x.unfold(1, frame, 2).reshape({x.size(0), x.size(1), -1, frame}); // keeps every run
  splitHeads(x, 4, width(x) / 4).reshape({x.size(0), 4, x.size(1), -1}); // splits only
}

// A batch_first GRU's output is its [seq, batch, hidden] result transposed
// (Note [batch_first RNN outputs]): merging batch and time copies it.
struct SeqClassifierImpl : torch::nn::Module {
  SeqClassifierImpl(int64_t in, int64_t hidden, int64_t classes) {
    gru = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(in, hidden).batch_first(true)));
    head = register_module("head", torch::nn::Linear(hidden, classes));
  }
  torch::Tensor perStep(torch::Tensor x) {
    auto [out, h] = gru->forward(x);
    return head(out.flatten(0, 1));
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'flatten' silently copies the non-contiguous result of 'batch_first GRU'
  }
  torch::Tensor applied(torch::Tensor x) {
    auto [out, h] = gru->forward(x);
    return head(out).reshape({-1, out.size(1)}); // the Linear's output is fresh
  }
  torch::Tensor split(torch::Tensor x) {
    auto [out, h] = gru->forward(x);
    return out.reshape({out.size(0), out.size(1), 2, -1}); // splits the last dim only: a view
  }
  torch::nn::GRU gru{nullptr};
  torch::nn::Linear head{nullptr};
};

// Without batch_first the output is a fresh [T, B, H] (an input of unknown rank
// taken as batched): time-major rows are a view, batch-major rows a copy.
struct StepTaggerImpl : torch::nn::Module {
  StepTaggerImpl(int64_t in, int64_t hidden) {
    lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(in, hidden)));
  }
  torch::Tensor rows(const torch::Tensor &x) {
    const int64_t T = x.size(0), B = x.size(1);
    auto seq = std::get<0>(lstm->forward(x));
    auto timeMajor = seq.view({T * B, -1});
    return seq.transpose(0, 1).reshape({B * T, -1}) + timeMajor;
    // CHECK-MESSAGES: :[[@LINE-1]]:32: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1; make
  }
  torch::nn::LSTM lstm{nullptr};
};

// Note [rank across a join]: a value contiguous on both paths, of a known rank
// on one and unknown on the other, keeps an identity for its sizes, so a
// permute after the loop names its rank.
torch::Tensor invConv(const torch::Tensor &z, const torch::Tensor &w) {
  return torch::conv1d(z, w);
}
torch::Tensor flowInfer(const torch::Tensor &spect, const torch::Tensor &w, int64_t flows) {
  const int64_t B = spect.size(0);
  auto audio = torch::randn({B, 8, spect.size(2)});
  for (int64_t k = 0; k < flows; ++k)
    audio = invConv(torch::cat({audio.narrow(1, 4, 4), audio.narrow(1, 0, 4)}, 1), w);
  auto same = audio.permute({0, 1, 2}).reshape({B, -1}); // the identity permutation: a view
  return audio.permute({0, 2, 1}).reshape({B, -1}) + same;
  // CHECK-MESSAGES: :[[@LINE-1]]:35: warning: 'reshape' silently copies the non-contiguous result of 'permute'
}

// Unknown rank: `x.size(-1)` is x's last dim at each rank tried (a copy at
// every one here). A reshape that is a no-op at rank 2 and a copy above it is
// meant for 3 dims or more, as the LSTM output above; one that fits rank 2
// only is a no-op.
torch::Tensor timeMajorRows(const torch::Tensor &feats, const torch::Tensor &images) {
  auto rows = feats.transpose(0, 1).reshape({-1, feats.size(-1)});
  // CHECK-MESSAGES: :[[@LINE-1]]:37: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
  auto spread = images.transpose(0, 1).reshape({images.size(1), -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:40: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming 'images' is contiguous, as nearly all tensors are, and has 3 or more dimensions: with fewer, the new shape is its own)
  auto same = feats.transpose(0, 1).reshape({feats.size(1), feats.size(0)}); // fits rank 2 only
  return rows.sum() + spread.sum() + same.sum();
}

// Head merges after the layers real blocks put between the split and the
// merge: a library module that keeps its input's shape (Dropout), a bias
// of unknown rank (taken to broadcast into the activations), a sum whose
// first operand is contiguous (TensorIterator lays the result out as it).
struct RelAttentionImpl : torch::nn::Module {
  torch::Tensor merged(torch::Tensor x, int64_t B, int64_t T, int64_t C) {
    auto q = x.view({B, T, 4, -1}).transpose(1, 2), v = q;
    auto attn = drop(torch::softmax(torch::matmul(q, q.transpose(-2, -1)), -1));
    return torch::matmul(attn, v).transpose(1, 2).reshape({B, T, C});
    // CHECK-MESSAGES: :[[@LINE-1]]:51: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
  }
  torch::Tensor biased(torch::Tensor x, int64_t B, int64_t T, int64_t H) {
    auto q = x.view({B, T, H, -1});
    return (q + pos_bias).transpose(1, 2).reshape({B, H, -1});
    // CHECK-MESSAGES: :[[@LINE-1]]:43: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
  }
  torch::Tensor shifted(torch::Tensor ac, torch::Tensor x, int64_t B, int64_t T) {
    auto a = ac.view({B, T, 4, 4});
    auto bd = x.view({B, T, 4, 8}).narrow(-1, 0, 4); // not contiguous
    return (a + bd).transpose(1, 2).reshape({B, 4, -1});
    // CHECK-MESSAGES: :[[@LINE-1]]:37: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
  }
  // Not claimed: the first operand's layout decides, and it is not known.
  torch::Tensor biasFirst(torch::Tensor x, int64_t B, int64_t T, int64_t H) {
    auto q = x.view({B, T, H, -1});
    return (pos_bias + q).transpose(1, 2).reshape({B, H, -1});
  }
  torch::Tensor transposedFirst(torch::Tensor x, int64_t B, int64_t T, int64_t H) {
    auto q = x.view({B, T, H, -1});
    auto k = x.view({B, H, T, -1}).transpose(1, 2);
    return (k + q).transpose(1, 2).reshape({B, H, -1}); // k's layout: the merge may be a view
  }
  torch::Tensor activation(torch::Tensor x, int64_t B, int64_t T) {
    return act(x.view({B, T, 4, -1}).transpose(1, 2)).reshape({B, 4, -1}); // GELU keeps the strides
  }
  torch::nn::Dropout drop{nullptr};
  torch::nn::GELU act{nullptr};
  torch::Tensor pos_bias;
};

// Attention with an optional cache: v's rank is unknown on one path, and the
// batched matmul is taken as of q's rank, so y is [B, H, T, D].
struct KvCache {
  torch::Tensor k, v;
  int64_t len = 0;
};
torch::Tensor mergeHeadsCached(const torch::Tensor &x, KvCache *cache, int64_t H, int64_t D) {
  const auto B = x.size(0), T = x.size(1), C = x.size(2);
  auto q = x.view({B, T, H, D}).transpose(1, 2);
  auto v = x.view({B, T, H, D}).transpose(1, 2);
  if (cache)
    v = cache->v.narrow(2, 0, cache->len);
  auto y = torch::softmax(q.matmul(q.transpose(-2, -1)), -1).matmul(v);
  return y.transpose(1, 2).reshape({B, T, C});
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1; make the copy explicit with '.contiguous().view(...)' [tensor-reshape-non-contiguous]
}

// A view of a contiguous tensor is contiguous even where the analysis cannot
// relate the element counts (the head's out_features against num_actions_):
// the quantile network returns a contiguous [B, N, A].
struct QuantileNet : torch::nn::Module {
  QuantileNet(int64_t h, int64_t a) : num_actions_(a) {
    fc_ = register_module("fc", torch::nn::Linear(h, h));
    head_ = register_module("head", torch::nn::Linear(h, a));
  }
  torch::Tensor forward(const torch::Tensor &emb, int64_t B, int64_t N) {
    auto h = torch::relu(fc_->forward(emb));
    auto q = head_->forward(h.view({B * N, -1}));
    return q.view({B, N, num_actions_});
  }
  torch::nn::Linear fc_{nullptr}, head_{nullptr};
  int64_t num_actions_;
};
torch::Tensor quantileRows(QuantileNet &net, const torch::Tensor &emb, int64_t B, int64_t N) {
  auto q = net.forward(emb, B, N);
  auto byAction = q.permute({2, 0, 1}).reshape({q.size(2), -1}); // batch and quantile dims stay in order: a view
  return q.transpose(1, 2).flatten(0, 1) + byAction.t();
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: 'flatten' silently copies the non-contiguous result of 'transpose'
}

// Call-site shapes: a helper that does not say its input's rank takes the
// rank every call passes. Merging heads after the swap copies at rank 4...
torch::Tensor mergeHeads(const torch::Tensor &o) {
  return o.transpose(1, 2).reshape({o.size(0), o.size(2), -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
}
// ...and is a no-op at rank 3, where one of the calls passes a [B, T, C]:
torch::Tensor mergeAny(const torch::Tensor &o) {
  return o.transpose(1, 2).reshape({o.size(0), o.size(2), -1});
}
// A call with a size-1 dim (one sample) keeps the defaults: no rank.
torch::Tensor mergeOne(const torch::Tensor &o) {
  return o.transpose(1, 2).reshape({o.size(0), o.size(2), -1});
}
// A non-contiguous argument says nothing about a contiguous parameter.
torch::Tensor mergeStrided(const torch::Tensor &o) {
  return o.transpose(1, 2).reshape({o.size(0), o.size(2), -1});
}
torch::Tensor attend(const torch::Tensor &x, int64_t H) {
  const auto B = x.size(0), T = x.size(1);
  auto q = x.view({B, T, H, -1}).transpose(1, 2);
  auto ctx = torch::matmul(torch::softmax(q.matmul(q.transpose(-2, -1)), -1), q);
  auto both = torch::cat({ctx, ctx}, 2); // cat keeps the rank
  return mergeHeads(ctx) + mergeHeads(both).narrow(1, 0, T) + mergeAny(ctx) + mergeAny(x) +
         mergeOne(ctx.narrow(0, 0, 1).contiguous().view({1, H, T, -1})) + mergeStrided(q);
}

// bmm always returns [b, n, m], whatever its operands' ranks say.
torch::Tensor perTree(const torch::Tensor &mu, const torch::Tensor &leaves, int64_t N) {
  auto perTree = torch::bmm(mu.transpose(0, 1), leaves);
  return perTree.transpose(0, 1).reshape({N, -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:34: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
}

// An op computing from an expanded tensor allocates a dense result: the
// stride-0 dim does not order it (TensorIterator), so it is contiguous here.
torch::Tensor positions(const torch::Tensor &pad, int64_t b, int64_t n) {
  auto pos = torch::arange(0, n, pad.options()).unsqueeze(0).expand({b, n});
  return pos.clamp_min(0).flatten() + (pos - pad.unsqueeze(1)).flatten();
}

// The elements of a vector of tensors the function is given are inputs, as
// parameters are: contiguous by default.
std::vector<torch::Tensor> levelRows(const std::vector<torch::Tensor> &outs) {
  std::vector<torch::Tensor> rows;
  for (const auto &out : outs)
    rows.push_back(out.detach().permute({0, 2, 3, 1}).reshape({-1, out.size(1)}));
  // CHECK-MESSAGES: :[[@LINE-1]]:55: warning: 'reshape' silently copies the non-contiguous result of 'permute'
  for (const auto &out : outs)
    rows.push_back(out.flatten(1)); // contiguous: a view
  return rows;
}
// A local vector's elements are whatever it was given (chunks along dim 1).
torch::Tensor localChunks(const torch::Tensor &x) {
  std::vector<torch::Tensor> parts = x.chunk(2, 1);
  torch::Tensor total;
  for (const auto &p : parts)
    total = p.permute({0, 2, 3, 1}).reshape({-1, p.size(1)});
  return total;
}

// Note [stacked symbols]: a stack of tensors of unknown rank has their dims
// after the list's length; `a.size(1)` says a has two dims at least.
torch::Tensor interleave(const torch::Tensor &a, const torch::Tensor &p, const torch::Tensor &n) {
  const auto T = a.size(1);
  return torch::stack({a, p, n}).transpose(0, 1).reshape({-1, T});
  // CHECK-MESSAGES: :[[@LINE-1]]:50: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
}
torch::Tensor interleaveDim1(const torch::Tensor &a, const torch::Tensor &p) {
  const auto T = a.size(1);
  return torch::stack({a, p}, 1).reshape({-1, T}); // stacked along dim 1: contiguous
}
torch::Tensor pairs(const torch::Tensor &z1, const torch::Tensor &z2) {
  return torch::stack({z1, z2}).transpose(0, 1).reshape({z1.size(0), -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:49: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming the result of 'torch::stack({z1, z2})' is contiguous, as nearly all tensors are, and has 3 or more dimensions: with fewer, the new shape is its own)
}

// A literal 1 where a swapped dim lands says that dim has size 1 (one
// decoding step, [B, H, 1, D]): no claim.
torch::Tensor mergeStep(const torch::Tensor &o, int64_t batch) {
  return o.transpose(1, 2).reshape({batch, 1, -1});
}

// A helper's result with its parameter's sizes has the argument's sizes at
// the call: the [B, H, 1, D] query stays one, so the swap moves a size-1 dim.
static torch::Tensor rotate(const torch::Tensor &q) {
  auto r = q.clone();
  r.mul_(2.0);
  return r;
}
torch::Tensor stepOut(const torch::Tensor &x, const torch::Tensor &s, int64_t h, int64_t d) {
  const auto b = x.size(0);
  auto q = rotate(x.view({b, 1, h, d}).transpose(1, 2));
  return q.matmul(s).transpose(1, 2).reshape({b, -1});
}

// Note [dense results]: an op on a tensor with gaps allocates a dense one.
torch::Tensor stdRows(torch::nn::Linear &proj, const torch::Tensor &h) {
  const int64_t B = h.size(0);
  auto raw = proj(h).view({B, 3, 9});
  return raw.narrow(2, 5, 4).exp().reshape({B, -1}) + raw.narrow(2, 1, 4).clone().reshape({B, -1});
}

// A struct's field holds what the function that made it returns there.
struct LmOut {
  torch::Tensor logits, hidden;
};
struct LmImpl : torch::nn::Module {
  torch::nn::LSTM lstm{nullptr};
  LmImpl() {
    lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(4, 8).batch_first(true)));
  }
  LmOut forward(const torch::Tensor &x) {
    auto h = std::get<0>(lstm->forward(x));
    LmOut o;
    o.hidden = h;
    o.logits = torch::ones({2, 8});
    return o;
  }
};
TORCH_MODULE(Lm);
torch::Tensor lmKeys(Lm &lm, const torch::Tensor &x) {
  auto out = lm->forward(x);
  return out.hidden.reshape({-1, out.hidden.size(-1)}) + out.logits.reshape({-1, 8});
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'reshape' silently copies the non-contiguous result of 'batch_first LSTM'
}

// Note [kept outer dim]: the size the code does not relate in `reshape({-1,
// hidden})` is the tensor's own last, so the encoder's sequence-first output,
// swapped back, is merged across its swapped dims at any rank above 2.
struct TokenEncoderImpl : torch::nn::Module {
  int64_t hidden = 16;
  torch::nn::TransformerEncoder encoder{nullptr};
  torch::Tensor forward(const torch::Tensor &h) {
    auto out = encoder->forward(h.transpose(0, 1));
    return out.transpose(0, 1).reshape({-1, hidden});
    // CHECK-MESSAGES: :[[@LINE-1]]:32: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming the result of 'encoder->forward(h.transpose(0, 1))' is contiguous, as nearly all tensors are, and has 3 or more dimensions: with fewer, the new shape is its own)
  }
};
// t() takes a matrix, where the new shape is its own; three sizes are no
// flattening: no claim.
torch::Tensor keptOuterNegatives(const torch::Tensor &w, const torch::Tensor &x, int64_t d) {
  return w.t().reshape({-1, d}).sum() + x.transpose(1, 2).reshape({x.size(0), -1, d}).sum();
}

// A narrow from 0 along dim 0 stays contiguous with its source's other
// sizes: the permute after it names them (round 23's memory readout).
torch::Tensor memoryReadout(const torch::Tensor &keys, int64_t used) {
  auto flat = keys.narrow(0, 0, used).reshape({used, -1});
  return keys.narrow(0, 0, used).permute({1, 2, 0, 3}).reshape({keys.size(1), keys.size(2), -1}) +
         flat.sum();
  // CHECK-MESSAGES: :[[@LINE-2]]:56: warning: 'reshape' silently copies the non-contiguous result of 'permute'
}
