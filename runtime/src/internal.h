// Runtime internals shared by the front-end sources: TensorImpl, Storage,
// version counters, the trace hooks, and small helpers.
#pragma once

#include "backend.h"
#include "tt/op_semantics.h"
#include "tt/tensor.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#if defined(__GNUC__)
#define TT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define TT_UNLIKELY(x) (x)
#endif

#ifndef TT_WITH_TRACE
#define TT_WITH_TRACE 0
#endif

namespace tt {

[[noreturn]] void fail(const std::string &msg);

namespace autograd {
struct AutogradMeta;
void destroyMeta(AutogradMeta *m);
// The graph alive now: grad_fn nodes and the bytes of the tensors they saved
// for backward (what a graph kept across iterations accumulates; the trace).
std::int64_t liveNodes();
std::int64_t savedBytes();
} // namespace autograd

// Raw bytes on one device, plus the id the trace and memory stats use.
class Storage {
public:
  // pinned: page-locked host memory from the CUDA backend (device is CPU).
  Storage(std::size_t nbytes, Device device, bool pinned = false);
  // Wraps caller-owned memory (from_blob): never freed here.
  Storage(void *external, std::size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage &) = delete;
  Storage &operator=(const Storage &) = delete;

  void *data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  std::uint64_t id() const { return id_; }
  bool pinned() const { return pinned_; }

private:
  void *data_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
  std::uint64_t id_;
  bool owned_ = true;
  bool pinned_ = false;
};

struct VersionCounter {
  std::atomic<std::uint32_t> version{0};
};

class TensorImpl {
public:
  TensorImpl(std::shared_ptr<Storage> storage, std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides,
             std::int64_t offset, ScalarType dtype, std::shared_ptr<VersionCounter> version);
  ~TensorImpl();
  TensorImpl(const TensorImpl &) = delete;
  TensorImpl &operator=(const TensorImpl &) = delete;

  std::shared_ptr<Storage> storage;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::int64_t storage_offset = 0;
  ScalarType dtype = kFloat;
  std::shared_ptr<VersionCounter> version;
  // Set for views: the tensor at the root of the view chain (PyTorch's _base).
  std::shared_ptr<TensorImpl> base;
  autograd::AutogradMeta *autograd = nullptr; // owned; null: no autograd info
  std::uint64_t id;                           // for the trace

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : sizes)
      n *= s;
    return n;
  }
  char *data() const {
    return static_cast<char *>(storage->data()) + storage_offset * static_cast<std::int64_t>(elementSize(dtype));
  }
  bool is_contiguous() const;
  bool is_non_overlapping_and_dense() const;
};

// --- helpers ------------------------------------------------------------------------
std::int64_t wrapDim(std::int64_t dim, std::int64_t ndim, bool scalar_ok = true);
std::vector<std::int64_t> contiguousStrides(IntArrayRef sizes);
std::string shapeString(IntArrayRef sizes); // "[2, 3]"
std::string typeString(const Tensor &t);   // "torch.FloatTensor" style used in autograd messages
std::int64_t checkedNumel(IntArrayRef sizes);
backend::TensorDesc makeDesc(const TensorImpl &t);
backend::TensorDesc makeDesc(const TensorImpl &t, IntArrayRef sizes, IntArrayRef strides);
backend::ScalarValue scalarValue(const Scalar &s);
const backend::Backend &backendOf(const TensorImpl &t);

// Fresh tensor with the given geometry (no autograd info).
Tensor makeTensor(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype, Device device, bool pinned = false);
Tensor makeContiguous(IntArrayRef sizes, ScalarType dtype, Device device);
// A view of self's storage with new geometry; shares the version counter.
Tensor makeView(const Tensor &self, IntArrayRef sizes, IntArrayRef strides, std::int64_t offset);
// Strides PyTorch gives a preserve_format result of self's shape: self's own
// when self is non-overlapping and dense, else contiguous ones.
std::vector<std::int64_t> preservedStrides(const TensorImpl &self);
// clone() and empty_like() with MemoryFormat::Preserve: self's strides when
// dense, else dense strides in self's stride order (at::infer_dense_strides).
std::vector<std::int64_t> denseStridesLike(const TensorImpl &self);
// Strides of the output of an elementwise op over inputs of shape `shape`
// (TensorIterator's dimension reordering).
std::vector<std::int64_t> elementwiseStrides(IntArrayRef shape, const std::vector<const TensorImpl *> &inputs);
std::vector<std::int64_t> broadcastShapes(IntArrayRef a, IntArrayRef b);
// Strides of t broadcast to shape (0 in broadcast dims).
std::vector<std::int64_t> broadcastStrides(const TensorImpl &t, IntArrayRef shape);

// Copies src's values into dst (same shape after broadcasting src), any
// device, any dtype, no autograd. Counts the copy under `kind` when not Other.
// non_blocking: host<->device copies do not wait when the host side is pinned.
void copyData(const Tensor &dst, const Tensor &src, CopyKind kind, bool non_blocking = false);
// Checks that writing to t is not into an overlapping (expanded) layout.
void assertNoInternalOverlap(const TensorImpl &t);
// Checks that an input of an in-place op does not partially overlap its output.
void assertNoPartialOverlap(const TensorImpl &out, const TensorImpl &in);
// Bumps t's version counter (and traces the write).
void bumpVersion(const Tensor &t, const char *op, std::uint32_t before);

// --- memory statistics -------------------------------------------------------------
namespace stats {
void onAlloc(Device d, std::size_t bytes);
void onFree(Device d, std::size_t bytes);
void onCopy(Device d, CopyKind k, std::size_t bytes);
} // namespace stats

// --- trace ----------------------------------------------------------------------------
namespace trace {
#if TT_WITH_TRACE
extern bool g_on;
inline bool on() { return TT_UNLIKELY(g_on); }
#else
constexpr bool on() { return false; }
#endif
// The user-facing op being run and its caller's location (outermost wins).
struct Scope {
  Scope(const char *op, const SourceLocation &loc) {
    if (on())
      enter(op, loc);
  }
  ~Scope() {
    if (active)
      leave();
  }
  Scope(const Scope &) = delete;
  Scope &operator=(const Scope &) = delete;
  void enter(const char *op, const SourceLocation &loc);
  void leave();
  bool active = false;
};
void alloc(const Storage &s);
void free(const Storage &s);
void copy(CopyKind kind, const TensorImpl &src, const TensorImpl &dst);
// A copy_ into another dtype: both dtypes and the values before and after.
void convert(const TensorImpl &src, const TensorImpl &dst);
// handles: live Tensor handles on t itself (handle copies share one TensorImpl).
void write(const char *op, const TensorImpl &t, std::uint32_t before, std::uint32_t after, long handles = 0);
// One op: its inputs' storages -> its result's storage, with the table's kind.
void op(const char *name, std::initializer_list<const Tensor *> inputs, const Tensor &out);
// An op over a list of tensors (cat): every one is an input.
void opList(const char *name, TensorList inputs, const Tensor &out);
void opMulti(const char *name, const Tensor &input, const std::vector<Tensor> &outs);
void error(const char *kind, const std::string &message);
// Backward: a node is about to be applied; a saved tensor's storage it unpacked.
void beginNode();
void savedRead(const TensorImpl &t);
// Backward: the node applied, the gradients it read and wrote (and the
// saved tensors noted since the last node).
void gradNode(const char *name, const std::vector<Tensor> &in, const std::vector<Tensor> &out);
// Values read to the host (trace_schema::kRead*): item() passes the value;
// data_ptr and printing digest t (once per storage version for data_ptr).
void read(const char *kind, const TensorImpl &t, const double *value = nullptr);
} // namespace trace

} // namespace tt
