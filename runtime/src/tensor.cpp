// Storage, TensorImpl, metadata, factories, memory statistics and the
// geometry helpers (broadcasting, result strides, PyTorch's computeStride).
#include "autograd.h"
#include "internal.h"
#include "tt/trace_schema.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>

namespace tt {

namespace {
std::atomic<std::uint64_t> g_next_storage_id{1};
std::atomic<std::uint64_t> g_next_tensor_id{1};

struct DeviceStats {
  std::mutex mu;
  MemoryStats s;
};
DeviceStats g_stats[2];
} // namespace

// --- memory statistics -----------------------------------------------------------------
namespace stats {
void onAlloc(Device d, std::size_t bytes) {
  DeviceStats &ds = g_stats[static_cast<int>(d.type())];
  std::lock_guard<std::mutex> lock(ds.mu);
  ds.s.current_bytes += static_cast<std::int64_t>(bytes);
  ds.s.peak_bytes = std::max(ds.s.peak_bytes, ds.s.current_bytes);
  ++ds.s.allocations;
}
void onFree(Device d, std::size_t bytes) {
  DeviceStats &ds = g_stats[static_cast<int>(d.type())];
  std::lock_guard<std::mutex> lock(ds.mu);
  ds.s.current_bytes -= static_cast<std::int64_t>(bytes);
  ++ds.s.frees;
}
void onCopy(Device d, CopyKind k, std::size_t bytes) {
  DeviceStats &ds = g_stats[static_cast<int>(d.type())];
  std::lock_guard<std::mutex> lock(ds.mu);
  ++ds.s.copies[static_cast<int>(k)];
  ds.s.copied_bytes[static_cast<int>(k)] += static_cast<std::int64_t>(bytes);
}
} // namespace stats

std::int64_t MemoryStats::total_copies() const {
  std::int64_t n = 0;
  for (auto c : copies)
    n += c;
  return n;
}

MemoryStats memory_stats(Device device) {
  DeviceStats &ds = g_stats[static_cast<int>(device.type())];
  MemoryStats r;
  {
    std::lock_guard<std::mutex> lock(ds.mu);
    r = ds.s;
  }
  if (backend::available(device.type()) && backend::get(device.type()).cache_stats) {
    backend::CacheStats c;
    backend::get(device.type()).cache_stats(&c);
    r.allocated_bytes = c.allocated_bytes;
    r.peak_allocated_bytes = c.peak_allocated_bytes;
    r.reserved_bytes = c.reserved_bytes;
    r.peak_reserved_bytes = c.peak_reserved_bytes;
    r.device_mallocs = c.raw_allocs;
    r.device_frees = c.raw_frees;
  } else {
    // No caching allocator: what is allocated is what the live storages hold.
    r.allocated_bytes = r.current_bytes;
    r.peak_allocated_bytes = r.peak_bytes;
  }
  return r;
}

void reset_memory_stats(Device device) {
  DeviceStats &ds = g_stats[static_cast<int>(device.type())];
  std::lock_guard<std::mutex> lock(ds.mu);
  std::int64_t cur = ds.s.current_bytes;
  ds.s = MemoryStats();
  ds.s.current_bytes = cur;
  ds.s.peak_bytes = cur;
}

const char *toString(CopyKind k) {
  switch (k) {
  case CopyKind::Clone: return "clone";
  case CopyKind::Contiguous: return "contiguous";
  case CopyKind::To: return "to";
  case CopyKind::Copy_: return "copy_";
  case CopyKind::ImplicitReshape: return "reshape";
  case CopyKind::ImplicitFlatten: return "flatten";
  case CopyKind::Other: return "other";
  }
  return "?";
}

// --- Storage / TensorImpl ---------------------------------------------------------------
Storage::Storage(std::size_t nbytes, Device device, bool pinned)
    : nbytes_(nbytes), device_(device), id_(g_next_storage_id++), pinned_(pinned) {
  if (pinned) {
    const backend::Backend &cuda = backend::get(kCUDA);
    data_ = cuda.alloc_pinned(nbytes);
  } else {
    data_ = backend::get(device.type()).alloc(nbytes);
  }
  stats::onAlloc(device, nbytes);
  if (trace::on())
    trace::alloc(*this);
}

Storage::Storage(void *external, std::size_t nbytes, Device device)
    : data_(external), nbytes_(nbytes), device_(device), id_(g_next_storage_id++), owned_(false) {}

Storage::~Storage() {
  if (!owned_)
    return;
  if (trace::on())
    trace::free(*this);
  stats::onFree(device_, nbytes_);
  if (pinned_)
    backend::get(kCUDA).free_pinned(data_, nbytes_);
  else
    backend::get(device_.type()).free(data_, nbytes_);
}

TensorImpl::TensorImpl(std::shared_ptr<Storage> st, std::vector<std::int64_t> sz, std::vector<std::int64_t> str,
                       std::int64_t offset, ScalarType dt, std::shared_ptr<VersionCounter> vc)
    : storage(std::move(st)), sizes(std::move(sz)), strides(std::move(str)), storage_offset(offset), dtype(dt),
      version(vc ? std::move(vc) : std::make_shared<VersionCounter>()),
      id(g_next_tensor_id.fetch_add(1, std::memory_order_relaxed)) {}

TensorImpl::~TensorImpl() { autograd::destroyMeta(autograd); }

bool TensorImpl::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1)
      continue;
    if (sizes[i] == 0)
      return true;
    if (strides[i] != expected)
      return false;
    expected *= sizes[i];
  }
  return true;
}

// c10's is_non_overlapping_and_dense: some permutation of dims is contiguous.
bool TensorImpl::is_non_overlapping_and_dense() const {
  std::size_t n = sizes.size();
  if (n == 1)
    return sizes[0] < 2 || strides[0] == 1;
  std::vector<std::size_t> perm(n);
  for (std::size_t i = 0; i < n; ++i)
    perm[i] = i;
  std::sort(perm.begin(), perm.end(), [&](std::size_t a, std::size_t b) {
    if (sizes[a] < 2)
      return false;
    if (sizes[b] < 2)
      return true;
    return strides[a] < strides[b];
  });
  std::int64_t require = 1;
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t s = sizes[perm[i]];
    if (s < 2)
      return true;
    if (strides[perm[i]] != require)
      return false;
    require *= s;
  }
  return true;
}

// --- helpers -----------------------------------------------------------------------------
std::int64_t wrapDim(std::int64_t d, std::int64_t ndim, bool scalar_ok) {
  if (ndim <= 0 && scalar_ok)
    ndim = 1;
  if (d < -ndim || d >= ndim) {
    std::ostringstream os;
    os << "Dimension out of range (expected to be in range of [" << -ndim << ", " << ndim - 1 << "], but got "
       << d << ")";
    fail(os.str());
  }
  return d < 0 ? d + ndim : d;
}

std::vector<std::int64_t> contiguousStrides(IntArrayRef sizes) {
  std::vector<std::int64_t> strides(sizes.size());
  std::int64_t s = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= sizes[i] > 1 ? sizes[i] : 1;
  }
  return strides;
}

std::string shapeString(IntArrayRef sizes) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < sizes.size(); ++i)
    os << (i ? ", " : "") << sizes[i];
  os << ']';
  return os.str();
}

std::string typeString(const Tensor &t) {
  return std::string(t.is_cuda() ? "torch.cuda." : "torch.") + toString(t.dtype()) + "Tensor";
}

std::int64_t checkedNumel(IntArrayRef sizes) {
  std::int64_t n = 1;
  for (auto s : sizes) {
    if (s < 0)
      fail("Trying to create tensor with negative dimension " + std::to_string(s) + ": " + shapeString(sizes));
    n *= s;
  }
  return n;
}

backend::TensorDesc makeDesc(const TensorImpl &t, IntArrayRef sizes, IntArrayRef strides) {
  if (sizes.size() > static_cast<std::size_t>(backend::kMaxDims))
    fail("tt: tensors with more than " + std::to_string(backend::kMaxDims) + " dimensions are not supported");
  backend::TensorDesc d;
  d.data = t.data();
  d.dtype = t.dtype;
  d.ndim = static_cast<int>(sizes.size());
  for (int i = 0; i < d.ndim; ++i) {
    d.sizes[i] = sizes[i];
    d.strides[i] = strides[i];
  }
  return d;
}
backend::TensorDesc makeDesc(const TensorImpl &t) { return makeDesc(t, t.sizes, t.strides); }

backend::ScalarValue scalarValue(const Scalar &s) {
  backend::ScalarValue v;
  v.d = s.toDouble();
  v.i = s.isFloatingPoint() ? static_cast<std::int64_t>(s.toDouble()) : s.toLong();
  return v;
}

const backend::Backend &backendOf(const TensorImpl &t) { return backend::get(t.storage->device().type()); }

Tensor makeTensor(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype, Device device, bool pinned) {
  checkedNumel(sizes);
  // Bytes spanned by the strides (they may leave gaps).
  std::int64_t span = 0;
  bool empty = false;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0)
      empty = true;
    span += (sizes[i] - 1) * strides[i];
  }
  std::size_t nbytes = empty ? 0 : static_cast<std::size_t>(span + 1) * elementSize(dtype);
  auto st = std::make_shared<Storage>(nbytes, device, pinned);
  return Tensor(std::make_shared<TensorImpl>(std::move(st), sizes.vec(), strides.vec(), 0, dtype, nullptr));
}

Tensor makeContiguous(IntArrayRef sizes, ScalarType dtype, Device device) {
  return makeTensor(sizes, contiguousStrides(sizes), dtype, device);
}

Tensor makeView(const Tensor &self, IntArrayRef sizes, IntArrayRef strides, std::int64_t offset) {
  const TensorImpl &s = *self.unsafeGetTensorImpl();
  auto impl = std::make_shared<TensorImpl>(s.storage, sizes.vec(), strides.vec(), offset, s.dtype, s.version);
  impl->base = s.base ? s.base : self.getIntrusivePtr();
  return Tensor(std::move(impl));
}

std::vector<std::int64_t> preservedStrides(const TensorImpl &self) {
  if (self.is_non_overlapping_and_dense())
    return self.strides;
  return contiguousStrides(self.sizes);
}

namespace {
// at::infer_dense_strides' order: -1 dim0 first, 1 dim1 first, 0 ambiguous
// (a stride of 0 keeps the contiguous order; equal strides: smaller size first).
int strideOrder(const TensorImpl &t, std::size_t d0, std::size_t d1) {
  std::int64_t s0 = t.strides[d0], s1 = t.strides[d1];
  if (s0 == 0 || s1 == 0)
    return 0;
  if (s0 != s1)
    return s0 < s1 ? -1 : 1;
  return t.sizes[d0] > t.sizes[d1] ? 1 : 0;
}
} // namespace

std::vector<std::int64_t> denseStridesLike(const TensorImpl &self) {
  if (self.is_non_overlapping_and_dense())
    return self.strides;
  // at::empty_like(Preserve) of a strided tensor that is not dense: dense
  // strides in the input's stride order (at::infer_dense_strides).
  std::size_t nd = self.sizes.size();
  if (nd <= 1)
    return contiguousStrides(self.sizes);
  std::vector<std::size_t> perm(nd); // perm[0]: the fastest dim
  for (std::size_t i = 0; i < nd; ++i)
    perm[i] = nd - 1 - i;
  for (std::size_t i = 1; i < nd; ++i)
    for (std::size_t d1 = i, j = 1; j <= i; ++j) { // a stable insertion sort
      std::size_t d0 = i - j;
      int c = strideOrder(self, perm[d0], perm[d1]);
      if (c < 0)
        break;
      if (c > 0) {
        std::swap(perm[d0], perm[d1]);
        d1 = d0;
      }
    }
  std::vector<std::int64_t> out(nd);
  std::int64_t cur = 1;
  for (std::size_t idx : perm) {
    out[idx] = cur;
    cur *= std::max<std::int64_t>(self.sizes[idx], 1);
  }
  return out;
}

// TensorIterator::reorder_dimensions + the output's strides: dims sorted by
// the inputs' strides (first input decides, broadcast dims skipped), so an
// elementwise result follows a permuted input's layout.
std::vector<std::int64_t> elementwiseStrides(IntArrayRef shape, const std::vector<const TensorImpl *> &inputs) {
  const std::int64_t nd = static_cast<std::int64_t>(shape.size());
  // Fast path: every input contiguous (or a broadcast scalar) -> contiguous.
  bool allContig = true;
  for (const TensorImpl *t : inputs)
    if (!(t->sizes.size() == shape.size() && t->is_contiguous()) && t->numel() != 1)
      allContig = false;
  if (allContig || nd <= 1)
    return contiguousStrides(shape);
  std::vector<std::vector<std::int64_t>> st;
  for (const TensorImpl *t : inputs)
    st.push_back(broadcastStrides(*t, shape));
  // perm[0] is the fastest-moving dim.
  std::vector<std::int64_t> perm(nd);
  for (std::int64_t i = 0; i < nd; ++i)
    perm[i] = nd - 1 - i;
  auto shouldSwap = [&](std::int64_t d0, std::int64_t d1) -> int {
    for (auto &s : st) {
      std::int64_t s0 = s[d0], s1 = s[d1];
      if (s0 == 0 || s1 == 0)
        continue;
      if (s0 < s1)
        return -1;
      if (s0 > s1)
        return 1;
      if (shape[d0] > shape[d1])
        return 1;
    }
    return 0;
  };
  for (std::int64_t i = 1; i < nd; ++i) {
    std::int64_t dim1 = i;
    for (std::int64_t dim0 = i - 1; dim0 >= 0; --dim0) {
      int c = shouldSwap(perm[dim0], perm[dim1]);
      if (c > 0) {
        std::swap(perm[dim0], perm[dim1]);
        dim1 = dim0;
      } else if (c < 0) {
        break;
      }
    }
  }
  std::vector<std::int64_t> out(nd);
  std::int64_t s = 1;
  for (std::int64_t i = 0; i < nd; ++i) {
    out[perm[i]] = s;
    s *= std::max<std::int64_t>(shape[perm[i]], 1);
  }
  return out;
}

std::vector<std::int64_t> broadcastShapes(IntArrayRef a, IntArrayRef b) {
  std::size_t n = std::max(a.size(), b.size());
  std::vector<std::int64_t> out(n);
  for (std::size_t i = n; i-- > 0;) {
    std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      std::ostringstream os;
      os << "The size of tensor a (" << da << ") must match the size of tensor b (" << db
         << ") at non-singleton dimension " << i;
      fail(os.str());
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<std::int64_t> broadcastStrides(const TensorImpl &t, IntArrayRef shape) {
  std::size_t n = shape.size(), m = t.sizes.size();
  std::vector<std::int64_t> out(n, 0);
  for (std::size_t i = 0; i < m; ++i) {
    std::size_t j = n - m + i;
    out[j] = (t.sizes[i] == 1 && shape[j] != 1) ? 0 : t.strides[i];
  }
  return out;
}

void assertNoInternalOverlap(const TensorImpl &t) {
  if (t.is_non_overlapping_and_dense())
    return;
  for (std::size_t i = 0; i < t.sizes.size(); ++i)
    if (t.strides[i] == 0 && t.sizes[i] > 1)
      fail("unsupported operation: more than one element of the written-to tensor refers to a single memory "
           "location. Please clone() the tensor before performing the operation.");
}

// at::assert_no_partial_overlap (aten/src/ATen/MemoryOverlap.cpp, 1.13):
// only two non-overlapping, dense tensors of one storage are compared; the
// same span in another order, or intersecting spans, is partial overlap.
void assertNoPartialOverlap(const TensorImpl &a, const TensorImpl &b) {
  if (&a == &b || a.numel() == 0 || b.numel() == 0 || a.storage != b.storage)
    return;
  if (!a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense())
    return; // "too hard": PyTorch runs the op
  const char *ab = a.data(), *bb = b.data();
  const char *ae = ab + a.numel() * static_cast<std::int64_t>(elementSize(a.dtype));
  const char *be = bb + b.numel() * static_cast<std::int64_t>(elementSize(b.dtype));
  bool partial = (ab == bb && ae == be) ? a.strides != b.strides : (ab < be && bb < ae);
  if (partial)
    fail("unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
         "memory location. Please clone() the tensor before performing the operation.");
}

void bumpVersion(const Tensor &t, const char *op, std::uint32_t before) {
  TensorImpl &impl = *t.unsafeGetTensorImpl();
  std::uint32_t after = impl.version->version.fetch_add(1, std::memory_order_relaxed) + 1;
  if (trace::on())
    trace::write(op, impl, before, after, t.use_count());
}

void copyData(const Tensor &dst, const Tensor &src, CopyKind kind, bool non_blocking) {
  TensorImpl &d = *dst.unsafeGetTensorImpl();
  TensorImpl &s = *src.unsafeGetTensorImpl();
  std::vector<std::int64_t> sstr = broadcastStrides(s, d.sizes);
  if (kind != CopyKind::Other) {
    stats::onCopy(d.storage->device(), kind, dst.nbytes());
    if (trace::on())
      trace::copy(kind, s, d);
  }
  if (d.numel() == 0)
    return;
  DeviceType dd = d.storage->device().type(), sd = s.storage->device().type();
  if (dd == sd) {
    backendOf(d).copy(makeDesc(d), makeDesc(s, d.sizes, sstr));
    return;
  }
  // Across devices, same dtype and one dense layout: one transfer of the span.
  const backend::Backend &dev = backend::get(dd == kCPU ? sd : dd);
  if (s.dtype == d.dtype && s.sizes == d.sizes && sstr == d.strides && s.is_non_overlapping_and_dense() &&
      d.is_non_overlapping_and_dense()) {
    const std::size_t n = dst.nbytes();
    if (dd == kCPU)
      (non_blocking && dev.memcpy_d2h_async ? dev.memcpy_d2h_async : dev.memcpy_d2h)(d.data(), s.data(), n);
    else
      (non_blocking && dev.memcpy_h2d_async ? dev.memcpy_h2d_async : dev.memcpy_h2d)(d.data(), s.data(), n);
    return;
  }
  // Otherwise stage through a contiguous buffer of src's dtype.
  Tensor staged = makeContiguous(d.sizes, s.dtype, s.storage->device());
  backendOf(s).copy(makeDesc(*staged.unsafeGetTensorImpl()), makeDesc(s, d.sizes, sstr));
  Tensor there = makeContiguous(d.sizes, s.dtype, d.storage->device());
  std::size_t bytes = there.nbytes();
  if (dd == kCPU)
    backend::get(sd).memcpy_d2h(there.unsafeGetTensorImpl()->data(), staged.unsafeGetTensorImpl()->data(), bytes);
  else
    backend::get(dd).memcpy_h2d(there.unsafeGetTensorImpl()->data(), staged.unsafeGetTensorImpl()->data(), bytes);
  backendOf(d).copy(makeDesc(d), makeDesc(*there.unsafeGetTensorImpl()));
}

// --- Tensor metadata ------------------------------------------------------------------------
Tensor::Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

const TensorImpl &Tensor::impl() const {
  if (TT_UNLIKELY(!impl_))
    fail("tt: the tensor is undefined (a default-constructed handle)");
  return *impl_;
}

IntArrayRef Tensor::sizes() const { return impl().sizes; }
IntArrayRef Tensor::strides() const { return impl().strides; }
std::int64_t Tensor::dim() const { return static_cast<std::int64_t>(impl().sizes.size()); }
std::int64_t Tensor::storage_offset() const { return impl().storage_offset; }
ScalarType Tensor::dtype() const { return impl().dtype; }
Device Tensor::device() const { return impl().storage->device(); }
std::int64_t Tensor::size(std::int64_t d) const { return impl().sizes[wrapDim(d, dim(), false)]; }
std::int64_t Tensor::stride(std::int64_t d) const { return impl().strides[wrapDim(d, dim(), false)]; }
std::int64_t Tensor::numel() const { return impl().numel(); }
bool Tensor::is_contiguous(MemoryFormat) const { return impl().is_contiguous(); }
bool Tensor::is_non_overlapping_and_dense() const { return impl().is_non_overlapping_and_dense(); }
TensorOptions Tensor::options() const { return TensorOptions().dtype(dtype()).device(device()); }
bool Tensor::is_alias_of(const Tensor &other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}
std::uint64_t Tensor::storage_id() const { return impl().storage->id(); }
long Tensor::storage_use_count() const { return impl().storage.use_count(); }
std::uint32_t Tensor::_version() const { return impl().version->version.load(std::memory_order_relaxed); }
bool Tensor::is_view() const { return impl().base != nullptr; }
Tensor Tensor::_base() const { return impl().base ? Tensor(impl().base) : Tensor(); }

void *Tensor::data_ptr() const {
  if (trace::on())
    trace::read(trace_schema::kReadDataPtr, impl());
  return impl().data();
}

template <typename T> T *Tensor::data_ptr() const {
  if (dtype() != ScalarTypeOf<T>::value)
    fail(std::string("expected scalar type ") + tt::toString(ScalarTypeOf<T>::value) + " but found " +
         tt::toString(dtype()));
  if (trace::on())
    trace::read(trace_schema::kReadDataPtr, impl());
  return reinterpret_cast<T *>(impl().data());
}

namespace {
Scalar hostScalar(const Tensor &host) {
  switch (host.dtype()) {
  case kFloat: return *host.data_ptr<float>();
  case kDouble: return *host.data_ptr<double>();
  case kHalf: return float(*host.data_ptr<Half>());
  case kBFloat16: return float(*host.data_ptr<BFloat16>());
  case kInt: return *host.data_ptr<std::int32_t>();
  case kLong: return *host.data_ptr<std::int64_t>();
  case kBool: return *host.data_ptr<bool>();
  }
  return Scalar();
}
} // namespace

Scalar Tensor::item(SourceLocation loc) const {
  trace::Scope scope("item", loc);
  if (numel() != 1) {
    std::ostringstream os;
    os << "a Tensor with " << numel() << " elements cannot be converted to Scalar";
    fail(os.str());
  }
  Scalar v = hostScalar(is_cpu() ? *this : to(kCPU));
  if (trace::on()) { // the value a printed line may show (tensor-tidy --verify)
    double d = v.to<double>();
    trace::read(trace_schema::kReadItem, impl(), &d);
  }
  return v;
}

template <typename T> T Tensor::item(SourceLocation loc) const { return item(loc).to<T>(); }

#define TT_INSTANTIATE(T)                                                                                    \
  template T *Tensor::data_ptr<T>() const;                                                                   \
  template T Tensor::item<T>(SourceLocation) const;
TT_INSTANTIATE(float)
TT_INSTANTIATE(double)
TT_INSTANTIATE(Half)
TT_INSTANTIATE(BFloat16)
TT_INSTANTIATE(std::int32_t)
TT_INSTANTIATE(std::int64_t)
TT_INSTANTIATE(bool)
#undef TT_INSTANTIATE

// --- factories ---------------------------------------------------------------------------------
namespace {
Tensor finishFactory(Tensor t, const TensorOptions &o, const char *name) {
  if (o.requires_grad()) {
    if (!isFloatingType(t.dtype()))
      fail("Only Tensors of floating point and complex dtype can require gradients");
    autograd::meta(t).requires_grad = true;
  }
  if (trace::on())
    trace::op(name, {}, t);
  return t;
}

void fillWith(const Tensor &t, const Scalar &v) {
  if (t.numel())
    backendOf(*t.unsafeGetTensorImpl()).fill(makeDesc(*t.unsafeGetTensorImpl()), scalarValue(v));
}

std::mt19937_64 &rng() {
  static std::mt19937_64 g(5489u);
  return g;
}
std::mutex g_rng_mu;

template <typename Gen> Tensor randomTensor(IntArrayRef size, const TensorOptions &o, Gen gen) {
  ScalarType dt = o.has_dtype() ? o.dtype() : kFloat;
  if (!isFloatingType(dt))
    fail(std::string("\"check_uniform_bounds\" not implemented for '") + toString(dt) + "'");
  Tensor host = makeContiguous(size, kDouble, kCPU);
  {
    std::lock_guard<std::mutex> lock(g_rng_mu);
    double *p = host.data_ptr<double>();
    for (std::int64_t i = 0, n = host.numel(); i < n; ++i)
      p[i] = gen(rng());
  }
  Tensor out = makeContiguous(size, dt, o.device());
  copyData(out, host, CopyKind::Other);
  return out;
}
} // namespace

void manual_seed(std::uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_rng_mu);
  rng().seed(seed);
}

Tensor empty(IntArrayRef size, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("empty", loc);
  return finishFactory(makeContiguous(size, options.dtype(), options.device()), options, "empty");
}

Tensor empty_strided(IntArrayRef size, IntArrayRef stride, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("empty", loc);
  if (size.size() != stride.size())
    fail("mismatch in length of strides and shape");
  return finishFactory(makeTensor(size, stride, options.dtype(), options.device()), options, "empty");
}

Tensor full(IntArrayRef size, const Scalar &v, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("full", loc);
  // full() infers its dtype from the value when none is given.
  ScalarType dt = options.has_dtype() ? options.dtype()
                  : v.isBoolean()     ? kBool
                  : v.isIntegral(false) ? kLong
                                        : kFloat;
  Tensor t = makeContiguous(size, dt, options.device());
  fillWith(t, v);
  return finishFactory(t, options, "full");
}

Tensor zeros(IntArrayRef size, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("zeros", loc);
  Tensor t = makeContiguous(size, options.dtype(), options.device());
  fillWith(t, 0);
  return finishFactory(t, options, "zeros");
}

Tensor ones(IntArrayRef size, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("ones", loc);
  Tensor t = makeContiguous(size, options.dtype(), options.device());
  fillWith(t, 1);
  return finishFactory(t, options, "ones");
}

Tensor rand(IntArrayRef size, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("rand", loc);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  return finishFactory(randomTensor(size, options, [&](std::mt19937_64 &g) { return u(g); }), options, "rand");
}

Tensor randn(IntArrayRef size, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("randn", loc);
  std::normal_distribution<double> n(0.0, 1.0);
  return finishFactory(randomTensor(size, options, [&](std::mt19937_64 &g) { return n(g); }), options, "randn");
}

Tensor arange(const Scalar &end, TensorOptions options, SourceLocation loc) {
  return arange(0, end, 1, options, loc);
}
Tensor arange(const Scalar &start, const Scalar &end, TensorOptions options, SourceLocation loc) {
  return arange(start, end, 1, options, loc);
}
Tensor arange(const Scalar &start, const Scalar &end, const Scalar &step, TensorOptions options,
              SourceLocation loc) {
  trace::Scope scope("arange", loc);
  double s = start.toDouble(), e = end.toDouble(), st = step.toDouble();
  if (st == 0)
    fail("step must be nonzero");
  if ((st > 0 && e < s) || (st < 0 && e > s))
    fail("upper bound and larger bound inconsistent with step sign");
  bool integral = start.isIntegral(true) && end.isIntegral(true) && step.isIntegral(true);
  ScalarType dt = options.has_dtype() ? options.dtype() : integral ? kLong : kFloat;
  std::int64_t n = static_cast<std::int64_t>(std::ceil((e - s) / st));
  Tensor host = makeContiguous({n}, kDouble, kCPU);
  double *p = host.data_ptr<double>();
  for (std::int64_t i = 0; i < n; ++i)
    p[i] = s + static_cast<double>(i) * st;
  Tensor out = makeContiguous({n}, dt, options.device());
  copyData(out, host, CopyKind::Other);
  return finishFactory(out, options, "arange");
}

Tensor linspace(const Scalar &start, const Scalar &end, std::int64_t steps, TensorOptions options,
                SourceLocation loc) {
  trace::Scope scope("linspace", loc);
  if (steps < 0)
    fail("number of steps must be non-negative");
  double s = start.toDouble(), e = end.toDouble();
  Tensor host = makeContiguous({steps}, kDouble, kCPU);
  double *p = host.data_ptr<double>();
  double step = steps > 1 ? (e - s) / static_cast<double>(steps - 1) : 0.0;
  // PyTorch fills the two halves from each end.
  std::int64_t half = steps == 1 ? 1 : steps / 2;
  for (std::int64_t i = 0; i < steps; ++i)
    p[i] = i < half ? s + step * static_cast<double>(i) : e - step * static_cast<double>(steps - 1 - i);
  Tensor out = makeContiguous({steps}, options.dtype(), options.device());
  copyData(out, host, CopyKind::Other);
  return finishFactory(out, options, "linspace");
}

Tensor eye(std::int64_t n, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("eye", loc);
  Tensor t = makeContiguous({n, n}, options.dtype(), options.device());
  fillWith(t, 0);
  if (n > 0)
    fillWith(makeView(t, {n}, {n + 1}, 0), 1);
  return finishFactory(t, options, "eye");
}

namespace {
Tensor likeImpl(const Tensor &self, const TensorOptions &o) {
  const TensorImpl &s = *self.unsafeGetTensorImpl();
  ScalarType dt = o.has_dtype() ? o.dtype() : s.dtype;
  Device dev = o.has_device() ? o.device() : s.storage->device();
  return makeTensor(s.sizes, denseStridesLike(s), dt, dev);
}
} // namespace

Tensor empty_like(const Tensor &self, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("empty_like", loc);
  return finishFactory(likeImpl(self, options), options, "empty_like");
}
Tensor zeros_like(const Tensor &self, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("zeros_like", loc);
  Tensor t = likeImpl(self, options);
  fillWith(t, 0);
  return finishFactory(t, options, "zeros_like");
}
Tensor ones_like(const Tensor &self, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("ones_like", loc);
  Tensor t = likeImpl(self, options);
  fillWith(t, 1);
  return finishFactory(t, options, "ones_like");
}
Tensor full_like(const Tensor &self, const Scalar &v, TensorOptions options, SourceLocation loc) {
  trace::Scope scope("full_like", loc);
  Tensor t = likeImpl(self, options);
  fillWith(t, v);
  return finishFactory(t, options, "full_like");
}
Tensor rand_like(const Tensor &self, TensorOptions options, SourceLocation loc) {
  TensorOptions o = options;
  if (!o.has_dtype())
    o = o.dtype(self.dtype());
  if (!o.has_device())
    o = o.device(self.device());
  return rand(self.sizes(), o, loc);
}
Tensor randn_like(const Tensor &self, TensorOptions options, SourceLocation loc) {
  TensorOptions o = options;
  if (!o.has_dtype())
    o = o.dtype(self.dtype());
  if (!o.has_device())
    o = o.device(self.device());
  return randn(self.sizes(), o, loc);
}

namespace {
template <typename T>
Tensor fromValues(const T *data, std::int64_t n, IntArrayRef shape, ScalarType natural, const TensorOptions &o,
                  SourceLocation loc) {
  trace::Scope scope("tensor", loc);
  Tensor host = makeContiguous(shape, natural, kCPU);
  if (n)
    std::memcpy(host.data_ptr(), data, static_cast<std::size_t>(n) * sizeof(T));
  ScalarType dt = o.has_dtype() ? o.dtype() : natural;
  Tensor out = host;
  if (dt != natural || !o.device().is_cpu()) {
    out = makeContiguous(shape, dt, o.device());
    copyData(out, host, CopyKind::Other);
  }
  return finishFactory(out, o, "tensor");
}
} // namespace

Tensor tensor(std::initializer_list<double> v, TensorOptions o, SourceLocation loc) {
  std::vector<float> f(v.begin(), v.end());
  if (o.has_dtype() && o.dtype() == kDouble) {
    std::vector<double> d(v.begin(), v.end());
    return fromValues(d.data(), static_cast<std::int64_t>(d.size()), {static_cast<std::int64_t>(d.size())},
                      kDouble, o, loc);
  }
  return fromValues(f.data(), static_cast<std::int64_t>(f.size()), {static_cast<std::int64_t>(f.size())}, kFloat, o,
                    loc);
}
Tensor tensor(std::initializer_list<float> v, TensorOptions o, SourceLocation loc) {
  return fromValues(v.begin(), static_cast<std::int64_t>(v.size()), {static_cast<std::int64_t>(v.size())}, kFloat,
                    o, loc);
}
Tensor tensor(std::initializer_list<int> v, TensorOptions o, SourceLocation loc) {
  std::vector<std::int32_t> d(v.begin(), v.end());
  return fromValues(d.data(), static_cast<std::int64_t>(d.size()), {static_cast<std::int64_t>(d.size())}, kInt,
                    o.has_dtype() ? o : o.dtype(kLong), loc);
}
Tensor tensor(std::initializer_list<std::int64_t> v, TensorOptions o, SourceLocation loc) {
  return fromValues(v.begin(), static_cast<std::int64_t>(v.size()), {static_cast<std::int64_t>(v.size())}, kLong,
                    o, loc);
}
Tensor tensor(std::initializer_list<bool> v, TensorOptions o, SourceLocation loc) {
  std::vector<std::uint8_t> d(v.begin(), v.end());
  return fromValues(d.data(), static_cast<std::int64_t>(d.size()), {static_cast<std::int64_t>(d.size())}, kBool, o,
                    loc);
}
Tensor tensor(std::initializer_list<std::initializer_list<double>> v, TensorOptions o, SourceLocation loc) {
  std::int64_t rows = static_cast<std::int64_t>(v.size());
  std::int64_t cols = rows ? static_cast<std::int64_t>(v.begin()->size()) : 0;
  std::vector<double> d;
  for (const auto &r : v) {
    if (static_cast<std::int64_t>(r.size()) != cols)
      fail("Expected all sub-lists to have sizes: " + std::to_string(cols) + " (e.g. at dimension 1)");
    d.insert(d.end(), r.begin(), r.end());
  }
  TensorOptions oo = o.has_dtype() ? o : o.dtype(kFloat);
  return fromValues(d.data(), rows * cols, {rows, cols}, kDouble, oo, loc);
}
Tensor tensor(ArrayRef<float> v, TensorOptions o, SourceLocation loc) {
  return fromValues(v.data(), static_cast<std::int64_t>(v.size()), {static_cast<std::int64_t>(v.size())}, kFloat,
                    o, loc);
}
Tensor tensor(ArrayRef<double> v, TensorOptions o, SourceLocation loc) {
  return fromValues(v.data(), static_cast<std::int64_t>(v.size()), {static_cast<std::int64_t>(v.size())}, kDouble,
                    o.has_dtype() ? o : o.dtype(kFloat), loc);
}
Tensor tensor(ArrayRef<std::int64_t> v, TensorOptions o, SourceLocation loc) {
  return fromValues(v.data(), static_cast<std::int64_t>(v.size()), {static_cast<std::int64_t>(v.size())}, kLong,
                    o, loc);
}
Tensor tensor(ArrayRef<int> v, TensorOptions o, SourceLocation loc) {
  return fromValues(v.data(), static_cast<std::int64_t>(v.size()), {static_cast<std::int64_t>(v.size())}, kInt,
                    o.has_dtype() ? o : o.dtype(kLong), loc);
}
Tensor scalar_tensor(const Scalar &s, TensorOptions o, SourceLocation loc) {
  trace::Scope scope("tensor", loc);
  ScalarType dt = o.has_dtype() ? o.dtype() : s.isFloatingPoint() ? kFloat : s.isBoolean() ? kBool : kLong;
  Tensor t = makeContiguous({}, dt, o.device());
  fillWith(t, s);
  return finishFactory(t, o, "tensor");
}

Tensor from_blob(void *data, IntArrayRef sizes, TensorOptions o, SourceLocation loc) {
  return from_blob(data, sizes, contiguousStrides(sizes), o, loc);
}
Tensor from_blob(void *data, IntArrayRef sizes, IntArrayRef strides, TensorOptions o, SourceLocation loc) {
  trace::Scope scope("from_blob", loc);
  std::int64_t span = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    span += (sizes[i] - 1) * strides[i];
  auto st = std::make_shared<Storage>(data, static_cast<std::size_t>(span + 1) * elementSize(o.dtype()), o.device());
  Tensor t(std::make_shared<TensorImpl>(std::move(st), sizes.vec(), strides.vec(), 0, o.dtype(), nullptr));
  return finishFactory(t, o, "from_blob");
}

// --- printing --------------------------------------------------------------------------------------
std::string Tensor::toString() const {
  if (!defined())
    return "UndefinedType";
  return std::string(is_cuda() ? "CUDA" : "CPU") + tt::toString(dtype()) + "Type";
}

void Tensor::print() const { std::cout << *this << std::endl; }

std::ostream &operator<<(std::ostream &os, const Tensor &t) {
  trace::Scope scope("print", SourceLocation{}); // its internal copies have no user location
  if (!t.defined())
    return os << "[ Tensor (undefined) ]";
  if (trace::on())
    trace::read(trace_schema::kReadPrint, *t.unsafeGetTensorImpl());
  Tensor h = t.is_cpu() ? t : t.to(kCPU);
  Tensor d = h.to(kDouble).contiguous();
  const double *p = d.data_ptr<double>();
  std::int64_t n = d.numel();
  std::ios flags(nullptr);
  flags.copyfmt(os);
  if (t.dim() == 0) {
    os << p[0] << "\n";
  } else {
    std::int64_t cols = t.size(-1);
    for (std::int64_t i = 0; i < n; ++i) {
      os << std::setw(10) << p[i];
      if (cols == 0 || (i + 1) % cols == 0)
        os << "\n";
    }
  }
  os.copyfmt(flags);
  os << "[ " << t.toString() << "{";
  for (std::size_t i = 0; i < t.sizes().size(); ++i)
    os << (i ? "," : "") << t.sizes()[i];
  return os << "} ]";
}

namespace cuda {
bool is_available() { return device_count() > 0; }
int device_count() {
  return backend::available(kCUDA) && backend::get(kCUDA).device_count ? backend::get(kCUDA).device_count() : 0;
}
void synchronize() {
  if (is_available())
    backend::get(kCUDA).synchronize();
}
} // namespace cuda

} // namespace tt
