// Trace mode: TT_TRACE=<file> writes one JSON object per line for every
// allocation, free, copy, in-place write, op and error, each with the
// user's source location. Schema: docs/runtime/trace.md.
#include "internal.h"
#include "tt/trace_schema.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

namespace tt::trace {

namespace key = trace_schema::key;
namespace ev = trace_schema::ev;

#if TT_WITH_TRACE
bool g_on = false;

namespace {
std::FILE *g_file = nullptr;
std::mutex g_mu;
std::uint64_t g_seq = 0;
thread_local int t_depth = 0;
thread_local SourceLocation t_loc;
thread_local const char *t_op = nullptr;

void jsonString(std::string &out, const char *s) {
  out += '"';
  for (; s && *s; ++s) {
    unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

// Appends ,"<k>": (the separator and the key of the next field).
void field(std::string &s, const char *k) {
  s += ",\"";
  s += k;
  s += "\":";
}

void field(std::string &s, const char *k, std::int64_t v) {
  field(s, k);
  s += std::to_string(v);
}

void jsonInts(std::string &out, const std::vector<std::int64_t> &v) {
  out += '[';
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i)
      out += ',';
    out += std::to_string(v[i]);
  }
  out += ']';
}

// Starts an event line: seq, ev, the user-facing op and its location.
std::string head(const char *event) {
  std::string s = "{\"";
  s += key::kEv;
  s += "\":";
  jsonString(s, event);
  field(s, key::kOp);
  if (t_depth > 0 && t_op)
    jsonString(s, t_op);
  else
    s += "null";
  bool located = t_depth > 0 && t_loc.file && *t_loc.file;
  field(s, key::kFile);
  if (located)
    jsonString(s, t_loc.file);
  else
    s += "null";
  for (const char *k : {key::kLine, key::kCol}) {
    field(s, k);
    s += !located ? "null" : std::to_string(k == key::kLine ? t_loc.line : t_loc.column);
  }
  return s;
}

void emit(std::string &s) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_file)
    return;
  // s ends with its "}"
  std::string line = std::string("{\"") + key::kSeq + "\":" + std::to_string(g_seq++) + "," + s.substr(1) + "\n";
  std::fwrite(line.data(), 1, line.size(), g_file);
}

// Calls f(value) for each element of a CPU tensor, in index order; false for
// other devices.
template <typename F> bool forEachValue(const TensorImpl &t, F f) {
  if (!t.storage->device().is_cpu())
    return false;
  std::int64_t n = t.numel();
  std::size_t nd = t.sizes.size();
  std::vector<std::int64_t> idx(nd, 0);
  const char *base = t.data();
  std::size_t es = elementSize(t.dtype);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < nd; ++d)
      off += idx[d] * t.strides[d];
    const char *p = base + off * static_cast<std::int64_t>(es);
    switch (t.dtype) {
    case kFloat: f(*reinterpret_cast<const float *>(p)); break;
    case kDouble: f(*reinterpret_cast<const double *>(p)); break;
    case kHalf: f(float(*reinterpret_cast<const Half *>(p))); break;
    case kBFloat16: f(float(*reinterpret_cast<const BFloat16 *>(p))); break;
    case kInt: f(*reinterpret_cast<const std::int32_t *>(p)); break;
    case kLong: f(static_cast<double>(*reinterpret_cast<const std::int64_t *>(p))); break;
    case kBool: f(*reinterpret_cast<const bool *>(p) ? 1.0 : 0.0); break;
    }
    for (std::size_t d = nd; d-- > 0;) {
      if (++idx[d] < t.sizes[d])
        break;
      idx[d] = 0;
    }
  }
  return true;
}

// Sum of a CPU tensor's values: a cheap digest of what a write produced.
bool digest(const TensorImpl &t, double &sum) {
  sum = 0;
  return forEachValue(t, [&sum](double v) { sum += v; });
}

void jsonNumber(std::string &s, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  s += (v == v && v - v == 0) ? buf : "null";
}

void describe(std::string &s, const TensorImpl &t) {
  s += ",\"shape\":";
  jsonInts(s, t.sizes);
  s += ",\"strides\":";
  jsonInts(s, t.strides);
  s += ",\"contiguous\":";
  s += t.is_contiguous() ? "true" : "false";
  s += ",\"dtype\":\"";
  s += toString(t.dtype);
  s += "\",\"device\":\"";
  s += toString(t.storage->device().type());
  s += "\"";
}

struct Init {
  Init() {
    if (const char *p = std::getenv("TT_TRACE"); p && *p)
      start(p);
  }
  ~Init() { stop(); }
} g_init;
} // namespace

bool enabled() { return g_on; }
bool available() { return true; }

bool start(const std::string &path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_file)
    std::fclose(g_file);
  g_file = std::fopen(path.c_str(), "w");
  g_on = g_file != nullptr;
  if (g_file) // line-buffered: a run that crashes or is killed keeps its events
    std::setvbuf(g_file, nullptr, _IOLBF, 1 << 16);
  if (g_file) {
    std::string line = std::string("{\"") + key::kSeq + "\":" + std::to_string(g_seq++);
    field(line, key::kEv);
    jsonString(line, ev::kStart);
    field(line, key::kSchema, trace_schema::kVersion);
    line += "}\n";
    std::fwrite(line.data(), 1, line.size(), g_file);
  }
  return g_on;
}

void stop() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_on = false;
  if (g_file) {
    std::fclose(g_file);
    g_file = nullptr;
  }
}

void Scope::enter(const char *op, const SourceLocation &loc) {
  if (t_depth++ == 0) {
    t_loc = loc;
    t_op = op;
  }
  active = true;
}

void Scope::leave() { --t_depth; }

namespace {
void storageEvent(const char *event, const Storage &st) {
  std::string s = head(event);
  field(s, key::kStorage, st.id());
  field(s, key::kBytes, st.nbytes());
  field(s, key::kDevice);
  jsonString(s, toString(st.device().type()));
  s += "}";
  emit(s);
}
} // namespace

void alloc(const Storage &st) { storageEvent(ev::kAlloc, st); }

void free(const Storage &st) { storageEvent(ev::kFree, st); }

void copy(CopyKind kind, const TensorImpl &src, const TensorImpl &dst) {
  std::string s = head(ev::kCopy);
  field(s, key::kKind);
  jsonString(s, toString(kind));
  field(s, key::kSrcStorage, src.storage->id());
  field(s, key::kDstStorage, dst.storage->id());
  field(s, key::kSrcTensor, src.id);
  field(s, key::kDstTensor, dst.id);
  field(s, key::kBytes, dst.numel() * static_cast<std::int64_t>(elementSize(dst.dtype)));
  field(s, key::kSrcDevice);
  jsonString(s, toString(src.storage->device().type()));
  field(s, key::kDstDevice);
  jsonString(s, toString(dst.storage->device().type()));
  describe(s, dst);
  s += "}";
  emit(s);
}

void convert(const TensorImpl &src, const TensorImpl &dst) {
  std::vector<double> a, b;
  if (!forEachValue(src, [&a](double v) { a.push_back(v); }) ||
      !forEachValue(dst, [&b](double v) { b.push_back(v); }))
    return;
  std::string s = head(ev::kConvert);
  field(s, key::kSrcDType);
  jsonString(s, toString(src.dtype));
  field(s, key::kDstDType);
  jsonString(s, toString(dst.dtype));
  field(s, key::kTensor, dst.id);
  field(s, key::kNumel, static_cast<std::int64_t>(b.size()));
  if (a.size() == b.size()) { // not broadcast: compare element by element
    std::int64_t changed = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
      changed += a[i] != b[i];
    field(s, key::kChanged, changed);
  }
  double sa = 0, sb = 0;
  for (double v : a)
    sa += v;
  for (double v : b)
    sb += v;
  field(s, key::kSrcSum);
  jsonNumber(s, sa);
  field(s, key::kSum);
  jsonNumber(s, sb);
  s += "}";
  emit(s);
}

void write(const char *op, const TensorImpl &t, std::uint32_t before, std::uint32_t after, long handles) {
  std::string s = head(ev::kWrite);
  field(s, key::kWriteOp);
  jsonString(s, op);
  field(s, key::kStorage, t.storage->id());
  field(s, key::kTensor, t.id);
  s += ",\"version_before\":" + std::to_string(before) + ",\"version_after\":" + std::to_string(after);
  field(s, key::kStorageRefs, t.storage.use_count());
  field(s, key::kHandles, handles);
  field(s, key::kBytes, t.numel() * static_cast<std::int64_t>(elementSize(t.dtype)));
  double sum;
  if (digest(t, sum)) {
    field(s, key::kSum);
    jsonNumber(s, sum);
  }
  describe(s, t);
  s += "}";
  emit(s);
}

namespace {
void opLine(const char *name, const std::vector<const Tensor *> &inputs, const std::vector<const Tensor *> &outs) {
  if (t_depth > 1)
    return; // only the user's call, not the ops it runs internally
  std::string s = head(ev::kOp);
  field(s, key::kName);
  jsonString(s, name);
  const semantics::OpInfo *info = semantics::lookup(name);
  field(s, key::kKind);
  if (info)
    jsonString(s, std::string(semantics::toString(info->storage)).c_str());
  else
    s += "null";
  field(s, key::kInputs);
  s += "[";
  bool first = true;
  for (const Tensor *t : inputs) {
    if (!first)
      s += ',';
    first = false;
    s += std::to_string(t->unsafeGetTensorImpl()->storage->id());
  }
  s += "]";
  field(s, key::kInputTensors);
  s += "[";
  first = true;
  for (const Tensor *t : inputs) {
    if (!first)
      s += ',';
    first = false;
    s += std::to_string(t->unsafeGetTensorImpl()->id);
  }
  s += "]";
  field(s, key::kOutputs);
  s += "[";
  for (std::size_t i = 0; i < outs.size(); ++i)
    s += (i ? "," : "") + std::to_string(outs[i]->unsafeGetTensorImpl()->storage->id());
  s += "]";
  field(s, key::kOutputTensors);
  s += "[";
  for (std::size_t i = 0; i < outs.size(); ++i)
    s += (i ? "," : "") + std::to_string(outs[i]->unsafeGetTensorImpl()->id);
  s += "]";
  bool aliased = false;
  if (inputs.size() && !outs.empty())
    aliased = (*inputs.begin())->unsafeGetTensorImpl()->storage == outs[0]->unsafeGetTensorImpl()->storage;
  s += ",\"aliases_input\":";
  s += aliased ? "true" : "false";
  bool same = inputs.size() && !outs.empty() && (*inputs.begin())->is_same(*outs[0]);
  s += ",\"returns_self\":";
  s += same ? "true" : "false";
  if (!outs.empty()) {
    describe(s, *outs[0]->unsafeGetTensorImpl());
    double sum; // the result's digest, to compare two runs (tensor-tidy --verify)
    if (digest(*outs[0]->unsafeGetTensorImpl(), sum) && sum == sum && sum - sum == 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", sum);
      field(s, key::kSum);
      s += buf;
    }
  }
  field(s, key::kGraphNodes, autograd::liveNodes());
  field(s, key::kGraphBytes, autograd::savedBytes());
  s += "}";
  emit(s);
}
} // namespace

void op(const char *name, std::initializer_list<const Tensor *> inputs, const Tensor &out) {
  opLine(name, inputs, {&out});
}

void opList(const char *name, TensorList inputs, const Tensor &out) {
  std::vector<const Tensor *> ps;
  for (const Tensor &t : inputs)
    ps.push_back(&t);
  opLine(name, ps, {&out});
}

void opMulti(const char *name, const Tensor &input, const std::vector<Tensor> &outs) {
  std::vector<const Tensor *> ps;
  for (const Tensor &t : outs)
    ps.push_back(&t);
  opLine(name, {&input}, ps);
}

void error(const char *kind, const std::string &message) {
  std::string s = head(ev::kError);
  field(s, key::kKind);
  jsonString(s, kind);
  field(s, key::kMessage);
  jsonString(s, message.c_str());
  s += "}";
  emit(s);
}

namespace {
thread_local std::vector<std::int64_t> t_saved; // saved storages the current node unpacked

void storageIds(std::string &s, const char *k, const std::vector<std::int64_t> &ids) {
  field(s, k);
  jsonInts(s, ids);
}

std::vector<std::int64_t> storagesOf(const std::vector<Tensor> &ts) {
  std::vector<std::int64_t> ids;
  for (const Tensor &t : ts)
    if (t.defined())
      ids.push_back(static_cast<std::int64_t>(t.unsafeGetTensorImpl()->storage->id()));
  return ids;
}
} // namespace

void beginNode() { t_saved.clear(); }

void savedRead(const TensorImpl &t) { t_saved.push_back(static_cast<std::int64_t>(t.storage->id())); }

void gradNode(const char *name, const std::vector<Tensor> &in, const std::vector<Tensor> &out) {
  std::string s = head(ev::kGrad);
  field(s, key::kName);
  jsonString(s, name);
  storageIds(s, key::kSaved, t_saved);
  storageIds(s, key::kGradsIn, storagesOf(in));
  storageIds(s, key::kGradsOut, storagesOf(out));
  s += "}";
  emit(s);
  t_saved.clear();
}

void read(const char *kind, const TensorImpl &t, const double *value) {
  // data_ptr: once per storage version (a loop over p[i] calls it per element).
  thread_local std::pair<std::uint64_t, std::uint32_t> t_last{~0ull, 0};
  bool dataPtr = value == nullptr && std::string_view(kind) == trace_schema::kReadDataPtr;
  std::pair<std::uint64_t, std::uint32_t> now{t.storage->id(), t.version->version.load(std::memory_order_relaxed)};
  // The runtime's own reads (item() and printing open a scope of their own),
  // or a data_ptr read already recorded.
  if (t_depth > (dataPtr ? 0 : 1) || (dataPtr && now == t_last))
    return;
  if (dataPtr)
    t_last = now;
  std::string s = head(ev::kRead);
  field(s, key::kKind);
  jsonString(s, kind);
  field(s, key::kStorage, static_cast<std::int64_t>(t.storage->id()));
  field(s, key::kTensor, static_cast<std::int64_t>(t.id));
  double sum = value ? *value : 0;
  if (value || digest(t, sum)) {
    field(s, key::kSum);
    jsonNumber(s, sum);
  }
  field(s, key::kStdoutPos, static_cast<std::int64_t>(std::ftell(stdout)));
  s += "}";
  emit(s);
}

#else // !TT_WITH_TRACE

bool enabled() { return false; }
bool available() { return false; }
bool start(const std::string &) { return false; }
void stop() {}
void Scope::enter(const char *, const SourceLocation &) {}
void Scope::leave() {}
void alloc(const Storage &) {}
void free(const Storage &) {}
void copy(CopyKind, const TensorImpl &, const TensorImpl &) {}
void convert(const TensorImpl &, const TensorImpl &) {}
void write(const char *, const TensorImpl &, std::uint32_t, std::uint32_t, long) {}
void op(const char *, std::initializer_list<const Tensor *>, const Tensor &) {}
void opList(const char *, TensorList, const Tensor &) {}
void opMulti(const char *, const Tensor &, const std::vector<Tensor> &) {}
void error(const char *, const std::string &) {}
void beginNode() {}
void savedRead(const TensorImpl &) {}
void gradNode(const char *, const std::vector<Tensor> &, const std::vector<Tensor> &) {}
void read(const char *, const TensorImpl &, const double *) {}

#endif

} // namespace tt::trace
