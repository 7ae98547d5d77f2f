// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-copy-narrowing %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-copy-narrowing %t.plugin -- --quiet -- %torch_pch
#include <torch/torch.h>

using torch::Tensor;
using torch::indexing::Slice;
Tensor cropEval(const Tensor &pred); // a function the analysis cannot see

// ===== positives ============================================================

void quantizeScores(const Tensor &logits, int64_t n) {
  Tensor probs = torch::softmax(logits, -1);
  auto buckets = torch::zeros({n}, torch::kLong);
  buckets.copy_(probs.mul(10));
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: copy_ silently converts floating-point to int64 (the destination's dtype): fractions are truncated toward zero; make the conversion explicit with 'probs.mul(10).to(buckets.scalar_type())' [tensor-copy-narrowing]
  // CHECK-FIXES: {{^}}  buckets.copy_(probs.mul(10).to(buckets.scalar_type()));{{$}}
}

void storeDoubleStats(int64_t steps) {
  Tensor history = torch::zeros({steps, 3});
  for (int64_t t = 0; t < steps; ++t) {
    Tensor stats = torch::randn({3}, torch::dtype(torch::kFloat64));
    history[t] = stats;
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: assignment into a view silently converts float64 to float32
    // CHECK-FIXES: {{^}}    history[t] = stats.to(history.scalar_type());{{$}}
  }
}

void fillActions(const Tensor &probs, int64_t batch) {
  Tensor actions = torch::empty({batch}, torch::TensorOptions().dtype(torch::kInt64));
  actions.copy_(probs);
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: copy_ silently converts float32 to int64 (the destination's dtype): fractions are truncated toward zero (assuming 'probs' is float32, as nearly all such tensors are)
  // CHECK-FIXES: {{^}}  actions.copy_(probs.to(actions.scalar_type()));{{$}}
}

void writeColumn(int64_t rows) {
  Tensor table = torch::zeros({rows, 4}, torch::kInt32);
  Tensor col = torch::arange(rows);
  table.index_put_({Slice(), 0}, col);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: index_put_ silently converts int64 to int32 (the destination's dtype): values out of range wrap around
  // CHECK-FIXES: {{^}}  table.index_put_({Slice(), 0}, col.to(table.scalar_type()));{{$}}
}

void halfCache(const Tensor &x) {
  Tensor cache = torch::zeros({16, 8}, torch::kHalf);
  Tensor acc = x.to(torch::kDouble).cumsum(0);
  cache.narrow(0, 0, 4).copy_(acc);
  // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: copy_ silently converts float64 to float16
  // CHECK-FIXES: {{^}}  cache.narrow(0, 0, 4).copy_(acc.to(cache.scalar_type()));{{$}}
}

// interpolate's result is floating for certain (it rejects integers); an
// element of a container, unknown, is not taken as float32 (token ids).
Tensor cropStrip(const std::vector<Tensor> &views, int64_t cell) {
  namespace F = torch::nn::functional;
  auto strip = torch::zeros({3, cell, cell * 2}, torch::kByte);
  auto img = F::interpolate(views[0].unsqueeze(0), F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}));
  strip.narrow(2, 0, cell).copy_(img.squeeze(0) * 255);
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: copy_ silently converts floating-point to uint8 (the destination's dtype): fractions are truncated toward zero; make the conversion explicit with '(img.squeeze(0) * 255).to(strip.scalar_type())' [tensor-copy-narrowing]
  // CHECK-FIXES: {{^}}  strip.narrow(2, 0, cell).copy_((img.squeeze(0) * 255).to(strip.scalar_type()));{{$}}
  strip.narrow(2, cell, cell).copy_(views[1]);
  return strip;
}

// Integer data is int64, as nearly all is: an int8 buffer wraps it.
Tensor relativeOffsets(const Tensor &residue_index) {
  auto rel = torch::empty({residue_index.size(0), residue_index.size(0)}, torch::kChar);
  rel.copy_(residue_index.unsqueeze(0) - residue_index.unsqueeze(1));
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: copy_ silently converts int64 to int8 (the destination's dtype): values out of range wrap around (assuming 'residue_index' holds int64 values, as integer data nearly always does)
  return rel;
}

// The values of a (values, indices) result keep self's dtype: a softmax's
// maxima are fractions.
void confidencesIntoLabels(const Tensor &logits, int64_t n) {
  auto labels = torch::empty({n}, torch::kLong);
  auto conf = torch::empty_like(labels);
  auto top = torch::softmax(logits, 1).max(1);
  conf.copy_(std::get<0>(top));
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: copy_ silently converts floating-point to int64 (the destination's dtype): fractions are truncated toward zero; make the conversion explicit with 'std::get<0>(top).to(conf.scalar_type())' [tensor-copy-narrowing]
  // CHECK-FIXES: {{^}}  conf.copy_(std::get<0>(top).to(conf.scalar_type()));{{$}}
  auto [values, where] = logits.softmax(1).topk(2);
  conf.copy_(values);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: copy_ silently converts floating-point to int64
}

void meanIntoCounts(const Tensor &x) {
  Tensor counts = torch::zeros({4}, torch::kLong);
  counts.copy_(x.mean(0));
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: copy_ silently converts floating-point to int64
  // CHECK-FIXES: {{^}}  counts.copy_(x.mean(0).to(counts.scalar_type()));{{$}}
}

// ===== negatives ============================================================

void masterWeightsToHalf(torch::nn::Linear &fc, const Tensor &master) {
  Tensor half_w = torch::zeros({4, 4}, torch::kHalf);
  half_w.copy_(torch::randn({4, 4})); // float32 -> float16: mixed precision
  fc->weight.data().copy_(master);    // destination dtype not shown
}

void labelsIntoBuffer(const Tensor &labels, const Tensor &indices) {
  Tensor buf = torch::zeros({8}, torch::kLong);
  buf.copy_(labels);
  buf.narrow(0, 0, 4).copy_(indices.narrow(0, 0, 4));
}

// Not every op promotes for a floating scalar (ops.def TT_SCALAR_PROMOTES):
// nan_to_num, index_fill, threshold keep an int64 self int64; an integer
// scalar keeps the unknown dtype of a function's result.
void scalarsThatKeepTheDType(const Tensor &pred, const Tensor &idx) {
  auto counts = torch::zeros({4}, torch::kLong);
  auto out = torch::empty({4}, torch::kLong);
  out.copy_(counts.nan_to_num(0.5));
  out.copy_(counts.index_fill(0, idx, 2.5));
  out.copy_(torch::threshold(counts, 0.5, 0.0));
  out.copy_(cropEval(pred) * 2);
}

void argmaxIntoLong(const Tensor &logits) {
  Tensor pred = torch::zeros({4}, torch::kLong);
  pred.copy_(logits.argmax(1));
}

void maskedScatterRaisesInstead(const Tensor &mask) {
  Tensor dst = torch::zeros({4}, torch::kLong);
  dst.masked_scatter_(mask, torch::randn({4}));
  dst.index_put_({mask}, torch::randn({4}));
}

void explicitConversion(const Tensor &x) {
  Tensor out = torch::zeros({4}, torch::kLong);
  out.copy_(x.to(out.scalar_type()));
  out.copy_(x.round().to(torch::kLong));
}

void widening(const Tensor &x) {
  Tensor d = torch::zeros({4}, torch::kDouble);
  d.copy_(torch::rand({4}));
  Tensor f = torch::zeros({4});
  f.copy_(torch::arange(4));
}

// Scalar arithmetic names its tensor: `rois * stride` (an integer scalar) is
// taken as float32, as `rois` is; a source whose name says it holds symbols
// is not. (`rois * 0.5` would be floating whatever `rois` holds.)
void quantiseRois(const torch::Tensor &rois, const torch::Tensor &text, int64_t stride, int64_t k) {
  auto grid = torch::empty({k, 4}, torch::kLong);
  grid.copy_(rois * stride);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: copy_ silently converts float32 to int64 (the destination's dtype): fractions are truncated toward zero (assuming 'rois' is float32
  // CHECK-FIXES: grid.copy_((rois * stride).to(grid.scalar_type()));
  auto padded = torch::zeros({k, 8}, torch::kLong);
  padded.narrow(1, 0, 4).copy_(text);
}

// Integer data into an int32 buffer (the usual width for a kernel's
// indices), and the elements of a container the function filled itself.
void labelsAndOutputs(const Tensor &labels, const Tensor &x, int64_t n) {
  auto narrow = torch::empty({n}, torch::kInt);
  narrow.copy_(labels);
  std::vector<Tensor> outs;
  outs.push_back(x.round());
  auto counts = torch::zeros({n}, torch::kLong);
  counts.copy_(outs[0]);
}

// Options of an int64 tensor make an int64 buffer.
void scoresIntoIdsBuffer(const Tensor &x, int64_t n) {
  auto ids = torch::arange(n);
  auto buf = torch::empty({n}, ids.options());
  buf.copy_(x.softmax(0));
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: copy_ silently converts floating-point to int64 (the destination's dtype)
  auto probs = torch::empty({n}, x.softmax(0).options());
  probs.copy_(x.softmax(0));
}

// The indices of a (values, indices) result are int64, whatever the input.
void indicesIntoLong(const Tensor &scores, int64_t n) {
  auto preds = torch::empty({n}, torch::kLong);
  auto top = scores.max(1);
  preds.copy_(std::get<1>(top));
  auto [values, where] = scores.sort(1, /*descending=*/true);
  preds.copy_(where.select(1, 0));
  preds.copy_(std::get<1>(torch::max(scores, 1)));
}

// A prompt holds token ids, int64 like the output buffer.
void promptIds(const Tensor &prompt, int64_t total) {
  auto out = torch::zeros({1, total}, torch::kLong);
  out.narrow(1, 0, prompt.size(1)).copy_(prompt);
}

// round/floor/ceil/trunc (ops.def TT_WHOLE_RESULT) leave no fraction to
// truncate, nor does a view of their result; an op after them may.
void wholeNumbersIntoInt(const Tensor &est) {
  auto out = torch::empty({est.size(0), 3}, torch::kInt);
  out.copy_((est * 1000.0).round());
  out.copy_(est.floor().select(1, 0));
  out.copy_(est.div(2, "floor"));
  out.copy_(est.round() * 0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: copy_ silently converts floating-point to int32 (the destination's dtype): fractions are truncated toward zero; make
}

// A floating scalar makes the result floating whatever the input's dtype
// (ops.def TT_SCALAR_PROMOTES): `int64 * 0.5` is float32. No default needed.
struct ServoConfig {
  double ticks_per_unit = 2048.0;
};
void storeScaled(const Tensor &pred, const Tensor &action, const ServoConfig &cfg) {
  auto png = torch::empty({4, 4}, torch::kInt32);
  png.copy_(cropEval(pred)[0] * 256.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: copy_ silently converts floating-point to int32 (the destination's dtype): fractions are truncated toward zero; make the conversion explicit with '(cropEval(pred)[0] * 256.0).to(png.scalar_type())' [tensor-copy-narrowing]
  auto ticks = torch::zeros({3}, torch::kInt);
  ticks.copy_(action.cpu() * cfg.ticks_per_unit);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: copy_ silently converts floating-point to int32 (the destination's dtype): fractions are truncated toward zero; make the conversion explicit with '(action.cpu() * cfg.ticks_per_unit).to(ticks.scalar_type())' [tensor-copy-narrowing]
}

// clamp, relu, abs, neg keep whole numbers whole (ops.def TT_KEEPS_WHOLE)
// when their bounds are whole: the usual 8-bit image store.
void wholeNumbersIntoBytes(const Tensor &img) {
  auto out = torch::empty_like(img, torch::kByte);
  out.copy_(((img + 1.0) * 127.5).round().clamp(0, 255));
  out.copy_((img * 255.0).round().clamp(0.0, 255.0));
  out.copy_((img * 255.0).floor().relu());
  out.copy_((img * 255.0).round().clamp(0.5, 254.5));
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: copy_ silently converts floating-point to uint8 (the destination's dtype): fractions are truncated toward zero; make
  out.copy_((img * 255.0).clamp(0, 255));
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: copy_ silently converts floating-point to uint8 (the destination's dtype): fractions are truncated toward zero; make
}

// A member every value of which its class makes with one dtype has it.
struct CountTable {
  Tensor stats_;
  Tensor scale_ = torch::ones({4});
  void build(int64_t R) { stats_ = torch::zeros({R, 5}, torch::kLong); }
  void average(const Tensor &n) {
    stats_.select(1, 3).copy_(n / stats_.select(1, 1).clamp_min(1).to(torch::kFloat));
    // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: copy_ silently converts floating-point to int64 (the destination's dtype)
    scale_.copy_(n.softmax(0));
  }
};

// One value of another dtype (zeros_like: its input's) and the member's is unknown.
struct ResetTable {
  Tensor stats_;
  void build(int64_t R) { stats_ = torch::zeros({R, 5}, torch::kLong); }
  void reset(const Tensor &like) { stats_ = torch::zeros_like(like); }
  void average(const Tensor &n) { stats_.select(1, 3).copy_(n.softmax(0)); }
};

// `from_blob` with a dtype: the options name the source's dtype.
void timestamps(std::vector<double> &ts, std::vector<float> &fs) {
  const auto n = static_cast<int64_t>(ts.size());
  auto t = torch::empty({n}, torch::kFloat);
  t.copy_(torch::from_blob(ts.data(), {n}, torch::kDouble));
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: copy_ silently converts float64 to float32 (the destination's dtype)
  auto d = torch::empty({n}, torch::kDouble);
  d.copy_(torch::from_blob(ts.data(), {n}, torch::kDouble));
  t.copy_(torch::from_blob(fs.data(), {n}, torch::TensorOptions().dtype(torch::kFloat)));
}

// A field of a local struct keeps the value the body gave it, until the
// variable is assigned whole, a field is bound to a reference or written by
// a call, or paths disagree.
struct Interactions { torch::Tensor users, timestamps; };
void writeTimestamp(torch::Tensor &t);
Interactions loadInteractions(std::vector<double> &ts, bool flag) {
  const auto n = static_cast<int64_t>(ts.size());
  auto src = torch::from_blob(ts.data(), {n}, torch::kDouble);
  Interactions data;
  data.timestamps = torch::empty({n}, torch::kFloat);
  data.timestamps.copy_(src);
  // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: copy_ silently converts float64 to float32 (the destination's dtype)
  Interactions both;
  both.timestamps = torch::empty({n}, torch::kFloat);
  if (flag)
    both.timestamps = torch::empty({n}, torch::kDouble);
  both.timestamps.copy_(src);
  Interactions called;
  called.timestamps = torch::empty({n}, torch::kFloat);
  writeTimestamp(called.timestamps);
  called.timestamps.copy_(src);
  Interactions bound;
  bound.timestamps = torch::empty({n}, torch::kFloat);
  auto &t = bound.timestamps;
  t = torch::empty({n}, torch::kDouble);
  bound.timestamps.copy_(src);
  Interactions whole;
  whole.timestamps = torch::empty({n}, torch::kFloat);
  whole = Interactions{src, src};
  whole.timestamps.copy_(src);
  return data;
}

// Collating: an item's field copied into the batch's field of the same name
// holds the same kind of data, whatever the item's dtype is.
struct Molecule { torch::Tensor atoms, charges; };
struct MolBatch { torch::Tensor atoms, counts; };
MolBatch collate(const std::vector<Molecule> &mols, int64_t n) {
  const auto B = static_cast<int64_t>(mols.size());
  MolBatch g;
  g.atoms = torch::zeros({B, n}, torch::kLong);
  g.counts = torch::zeros({B, n}, torch::kLong);
  for (int64_t i = 0; i < B; ++i) {
    g.atoms[i].copy_(mols[i].atoms);
    g.counts[i].copy_(mols[i].charges);
    // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: copy_ silently converts float32 to int64 (the destination's dtype): fractions are truncated toward zero (assuming member 'charges' is float32
  }
  return g;
}

// Indices and masks do not change the dtype of what they pick from: the
// labels picked by the matched indices are the labels' dtype (int64 by name),
// and scores picked by a mask stay float32.
torch::Tensor matched_labels(const torch::Tensor &gt_classes, const torch::Tensor &iou, int64_t K) {
  auto labels = torch::zeros({K}, torch::kLong);
  labels.copy_(gt_classes.index_select(0, std::get<1>(iou.max(1))));
  labels.copy_(gt_classes + iou.argmax(1));
  return labels;
}
torch::Tensor picked_scores(const torch::Tensor &scores, const torch::Tensor &iou, int64_t K) {
  auto bins = torch::zeros({K}, torch::kLong);
  bins.copy_(scores.index_select(0, iou.argmax(1)) * (iou.amax(1) > 0.5));
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: copy_ silently converts float32 to int64 (the destination's dtype): fractions are truncated toward zero (assuming 'scores' is float32
  return bins;
}

// An index or mask operand takes no part in the result's dtype (ops.def: Own):
// the rows index a float64 table, whatever the default dtype of a parameter.
torch::Tensor edge_weights(const torch::Tensor &rows, const torch::Tensor &cols, int64_t n) {
  auto dinv = torch::bincount(rows, {}, n).to(torch::kDouble).clamp_min(1.0).rsqrt();
  auto vals = torch::empty({rows.size(0)});
  vals.copy_(dinv.index_select(0, rows) * dinv.gather(0, cols));
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: copy_ silently converts float64 to float32 (the destination's dtype): precision (and range) is lost
  auto same = torch::empty({rows.size(0)}, torch::kDouble);
  same.copy_(dinv.index_select(0, rows).masked_fill(rows == cols, 0.0));
  return vals + same;
}

// Each conjunct of an assertion holds after it: both frames are uint8.
struct FrameReplay {
  Tensor obs_ = torch::zeros({8, 4, 84, 84}, torch::kByte), next_ = torch::zeros({8, 4, 84, 84}, torch::kByte);
  int64_t pos_ = 0;
  void push(const Tensor &obs, const Tensor &next_obs) {
    TORCH_CHECK(obs.scalar_type() == torch::kByte && next_obs.scalar_type() == torch::kByte, "uint8 frames");
    obs_[pos_].copy_(obs);
    next_[pos_].copy_(next_obs);
  }
};

// A member its class makes with a plain float factory (sizes only) is
// float32, as a local made so is; one also given another value is unknown.
class StateBuffer {
public:
  StateBuffer(int64_t cap, int64_t dim)
      : obs_(torch::zeros({cap, dim})), any_(torch::zeros({cap, dim})) {}
  void add(std::vector<double> &obs, int64_t pos) {
    auto o = torch::from_blob(obs.data(), {static_cast<int64_t>(obs.size())}, torch::kFloat64);
    obs_[pos].copy_(o);
    // CHECK-MESSAGES: :[[@LINE-1]]:15: warning: copy_ silently converts float64 to float32 (the destination's dtype)
    any_[pos].copy_(o);
  }
  void widen() { any_ = any_.to(torch::kDouble); }

private:
  Tensor obs_, any_;
};

// where's condition takes no part in the result's dtype: int64 values give
// int64, whatever the mask.
void appendTokens(torch::Tensor &generated, const torch::Tensor &scores,
                  const torch::Tensor &finished, int64_t t, int64_t pad) {
  auto out = torch::zeros({scores.size(0), 8}, torch::kInt);
  auto next = scores.argmax(-1);
  next = torch::where(finished, torch::full_like(next, pad), next);
  out.select(1, t).copy_(next);
  // CHECK-MESSAGES: :[[@LINE-1]]:20: warning: copy_ silently converts int64 to int32 (the destination's dtype): values out of range wrap around; make the conversion explicit with 'next.to(out.scalar_type())' [tensor-copy-narrowing]
  generated.copy_(out);
}

// Call-site dtypes (Note [call-site facts]): what every call passes decides
// the parameter's dtype; the float32 default holds only where no call shows one.
struct PixelBuffer {
  Tensor frames_ = torch::zeros({64, 84, 84}, torch::kUInt8);
  Tensor values_ = torch::zeros({64});
  int64_t n_ = 0;
  void add(const Tensor &frame) { frames_[n_++].copy_(frame); }
  void addValue(const Tensor &v) { values_[n_].copy_(v); }
  // CHECK-MESSAGES: :[[@LINE-1]]:48: warning: copy_ silently converts float64 to float32 (the destination's dtype): precision (and range) is lost; make the conversion explicit with 'v.to(values_.scalar_type())' [tensor-copy-narrowing]
  // CHECK-FIXES: void addValue(const Tensor &v) { values_[n_].copy_(v.to(values_.scalar_type())); }
};
void fillPixels(PixelBuffer &buf, int64_t steps) {
  auto stack = torch::zeros({84, 84}, torch::kUInt8);
  for (int64_t i = 0; i < steps; ++i) {
    buf.add(stack);
    buf.addValue(torch::ones({}, torch::kDouble));
  }
  buf.add(torch::full({84, 84}, 3, torch::kUInt8));
}
// Calls that disagree leave the default, which a float32 destination keeps.
struct ValueLog {
  Tensor values_ = torch::zeros({64});
  void put(const Tensor &v, int64_t i) { values_[i].copy_(v); }
};
void fillValues(ValueLog &log) {
  log.put(torch::ones({}, torch::kDouble), 0);
  log.put(torch::ones({}), 1);
}

// torch::tensor(data) takes its dtype from the data: integers make int64,
// floating numbers the default float32 (LibTorch 1.13).
void storeHistory(const std::vector<int64_t> &tail, const std::vector<double> &rewards) {
  auto seqs = torch::zeros({16}, torch::kInt);
  seqs.narrow(0, 0, 4).copy_(torch::tensor(tail));
  // CHECK-MESSAGES: :[[@LINE-1]]:24: warning: copy_ silently converts int64 to int32 (the destination's dtype): values out of range wrap around
  auto ids = torch::zeros({16}, torch::kLong);
  ids.narrow(0, 0, 4).copy_(torch::tensor(tail));
  auto returns = torch::zeros({16});
  returns.narrow(0, 0, 4).copy_(torch::tensor(rewards));
}

// A member made in the constructor from a local TensorOptions naming its
// dtype has that dtype; options taken from a tensor name none (unknown).
class RewardBuffer {
public:
  RewardBuffer(int64_t capacity, torch::Device device, const torch::Tensor &like) {
    auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    rewards_ = torch::empty({capacity, 1}, opts);
    auto same = like.options();
    mirror_ = torch::empty({capacity, 1}, same);
  }
  void add(int64_t i, double r) {
    rewards_[i].copy_(torch::tensor(r, torch::kFloat64));
    // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: copy_ silently converts float64 to float32 (the destination's dtype)
    mirror_[i].copy_(torch::tensor(r, torch::kFloat64));
  }

private:
  torch::Tensor rewards_, mirror_;
};

// A member registered as a buffer has the dtype of the value registered,
// through ops that keep self's dtype (`triu`, `to(device)`): a bool mask
// copied into a bool mask converts nothing; float64 weights into float32 do.
struct MaskedAttentionImpl : torch::nn::Module {
  explicit MaskedAttentionImpl(int64_t len, torch::Device device) {
    causal_ = register_buffer("causal", torch::ones({len, len}, torch::kBool).triu(1));
    prior_ = register_buffer("prior", torch::rand({len}, torch::kFloat64).to(device));
  }
  torch::Tensor maskFor(int64_t mem, int64_t len) {
    auto full = torch::zeros({mem + len, mem + len}, torch::kBool);
    full.narrow(0, mem, len).narrow(1, mem, len).copy_(causal_);
    auto weights = torch::empty({len}, torch::kFloat32);
    weights.copy_(prior_);
    // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: copy_ silently converts float64 to float32 (the destination's dtype)
    return full.logical_or(weights.gt(0.5).any());
  }
  torch::Tensor causal_, prior_;
};
TORCH_MODULE(MaskedAttention);
