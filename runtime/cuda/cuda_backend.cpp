// The CUDA backend table (runtime/src/backend.h) over the plain kernels of
// cuda_ops.h, plus the per-device state PyTorch keeps in c10::cuda: the
// caching allocators (device and pinned host), the current stream of each
// device (thread-local, as in PyTorch), and the public tt::cuda API of
// tt/cuda.h. Registers itself with the runtime from a static initializer.
#include "backend.h"
#include "caching_allocator.h"
#include "cuda_ops.h"
#include "tt/cuda.h"

#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tt::cuda {
namespace {

using cudaalloc::CachingAllocator;
using cudaops::DType;
using cudaops::Operand;

// Throws tt::Error with PyTorch's "Found no NVIDIA driver ..." / "No CUDA GPUs
// are available" when there is no usable device; cheap once one was found.
void requireDevice() {
  static std::atomic<bool> ok{false};
  if (ok.load(std::memory_order_relaxed))
    return;
  std::string why;
  if (cudaops::deviceCountNoThrow(&why) == 0)
    throw Error(why);
  ok = true;
}

int currentDev() {
  requireDevice();
  return cudaops::currentDevice();
}

int resolve(int device) { return device < 0 ? currentDev() : device; }

// --- allocators ---------------------------------------------------------------
struct DeviceHooks : cudaalloc::Hooks {
  explicit DeviceHooks(int dev) : dev(dev) {}
  int dev;
  void *rawAlloc(std::size_t n) override { return cudaops::rawDeviceMalloc(n); }
  void rawFree(void *p) override { cudaops::rawDeviceFree(p); }
  void *recordEvent(void *stream) override {
    void *e = cudaops::eventCreate(false);
    cudaops::eventRecord(e, stream);
    return e;
  }
  bool eventDone(void *e) override { return cudaops::eventQuery(e); }
  void eventSynchronize(void *e) override { cudaops::eventSynchronize(e); }
  void releaseEvent(void *e) override { cudaops::eventDestroy(e); }
  void memInfo(std::size_t *f, std::size_t *t) override { cudaops::memInfo(f, t); }
  std::string name() const override { return "GPU " + std::to_string(dev); }
};

struct PinnedHooks : DeviceHooks {
  PinnedHooks() : DeviceHooks(-1) {}
  void *rawAlloc(std::size_t n) override { return cudaops::rawHostMalloc(n); }
  void rawFree(void *p) override { cudaops::rawHostFree(p); }
  std::string name() const override { return "pinned host memory"; }
};

// Never destroyed: tensors in static storage may be freed after main() and
// the driver may be gone by then (PyTorch leaks its allocator the same way).
struct State {
  std::mutex mu;
  std::vector<std::unique_ptr<DeviceHooks>> hooks;
  std::vector<std::unique_ptr<CachingAllocator>> device;
  PinnedHooks pinnedHooks;
  CachingAllocator pinned{pinnedHooks, /*alwaysPending=*/true};
};
State &state() {
  static State *s = new State;
  return *s;
}

CachingAllocator &deviceAllocator(int dev) {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.device.empty()) {
    requireDevice();
    const int n = cudaops::deviceCountNoThrow();
    s.hooks.resize(n);
    s.device.resize(n);
  }
  if (dev < 0 || dev >= static_cast<int>(s.device.size()))
    throw std::runtime_error("CUDA error: invalid device ordinal");
  if (!s.device[dev]) {
    s.hooks[dev] = std::make_unique<DeviceHooks>(dev);
    s.device[dev] = std::make_unique<CachingAllocator>(*s.hooks[dev], false);
  }
  return *s.device[dev];
}


// --- current streams: per thread, per device; nullptr = the default stream -----
thread_local std::vector<void *> t_current;

void *currentStreamHandle(int dev) {
  if (dev < static_cast<int>(t_current.size()))
    return t_current[dev];
  return nullptr;
}

void *cur() { return currentStreamHandle(currentDev()); }

// --- TensorDesc -> Operand ---------------------------------------------------------
DType dtypeOf(ScalarType t) { return static_cast<DType>(static_cast<int>(t)); }
static_assert(static_cast<int>(kBool) == static_cast<int>(DType::Bool) &&
                  static_cast<int>(kHalf) == static_cast<int>(DType::Half),
              "cudaops::DType must follow tt::ScalarType");
static_assert(backend::kMaxDims == cudaops::kMaxDims, "one limit on dims");

Operand operand(const backend::TensorDesc &d) {
  return cudaops::makeOperand(d.data, dtypeOf(d.dtype), d.sizes, d.strides, d.ndim);
}

// Scratch device memory from the caching allocator, stream-ordered.
struct Scratch {
  explicit Scratch(std::size_t n) : p(n ? deviceAllocator(currentDev()).allocate(n, cur()) : nullptr) {}
  ~Scratch() {
    if (p)
      deviceAllocator(currentDev()).free(p);
  }
  void *p;
};

// --- the table's functions -------------------------------------------------------------
void *allocDevice(std::size_t n) {
  const int dev = currentDev();
  return deviceAllocator(dev).allocate(n, currentStreamHandle(dev));
}

void freeDevice(void *p, std::size_t) {
  if (!p)
    return;
  State &s = state();
  for (auto &a : s.device)
    if (a && a->owns(p)) {
      a->free(p);
      return;
    }
  throw std::runtime_error("tt: freeing a CUDA pointer the caching allocator does not own");
}

void recordPinned(const void *host) {
  if (state().pinned.owns(host))
    state().pinned.recordStream(const_cast<void *>(host), cur());
}

// Blocking copies: PyTorch enqueues on the current stream and waits for it.
void h2d(void *dst, const void *src, std::size_t n) {
  cudaops::memcpyAsync(dst, src, n, cudaops::CopyKind::HostToDevice, cur());
  cudaops::streamSynchronize(cur());
}
void d2h(void *dst, const void *src, std::size_t n) {
  cudaops::memcpyAsync(dst, src, n, cudaops::CopyKind::DeviceToHost, cur());
  cudaops::streamSynchronize(cur());
}
void d2d(void *dst, const void *src, std::size_t n) {
  cudaops::memcpyAsync(dst, src, n, cudaops::CopyKind::DeviceToDevice, cur());
}
// non_blocking copies: asynchronous only when the host side is pinned (the
// driver would stage pageable memory synchronously anyway); the pinned block
// is kept from reuse until the copy is done.
void h2dAsync(void *dst, const void *src, std::size_t n) {
  if (!cudaops::isPinnedPointer(src))
    return h2d(dst, src, n);
  cudaops::memcpyAsync(dst, src, n, cudaops::CopyKind::HostToDevice, cur());
  recordPinned(src);
}
void d2hAsync(void *dst, const void *src, std::size_t n) {
  if (!cudaops::isPinnedPointer(dst))
    return d2h(dst, src, n);
  cudaops::memcpyAsync(dst, src, n, cudaops::CopyKind::DeviceToHost, cur());
  recordPinned(dst);
}
void syncDevice() { cudaops::deviceSynchronize(); }

void copyK(const backend::TensorDesc &dst, const backend::TensorDesc &src) {
  cudaops::copy(operand(dst), operand(src), cur());
}

void fillK(const backend::TensorDesc &dst, backend::ScalarValue v) {
  const bool integral = dst.dtype == kInt || dst.dtype == kLong; // Bool: d != 0
  Operand s = integral ? cudaops::makeScalarInt(v.i, dtypeOf(dst.dtype))
                       : cudaops::makeScalar(v.d, dtypeOf(dst.dtype));
  cudaops::copy(operand(dst), s, cur());
}

void unaryK(backend::UnaryOp op, const backend::TensorDesc &out, const backend::TensorDesc &in,
            const backend::UnaryParams &p) {
  using U = cudaops::UnaryOp;
  U u = U::Identity;
  switch (op) {
  case backend::UnaryOp::Neg: u = U::Neg; break;
  case backend::UnaryOp::Abs: u = U::Abs; break;
  case backend::UnaryOp::Exp: u = U::Exp; break;
  case backend::UnaryOp::Log: u = U::Log; break;
  case backend::UnaryOp::Sqrt: u = U::Sqrt; break;
  case backend::UnaryOp::Relu: u = U::Relu; break;
  case backend::UnaryOp::Sigmoid: u = U::Sigmoid; break;
  case backend::UnaryOp::Tanh: u = U::Tanh; break;
  case backend::UnaryOp::Clamp: u = U::Clamp; break;
  case backend::UnaryOp::PowScalar: u = U::PowScalar; break;
  case backend::UnaryOp::RPowScalar: u = U::RPowScalar; break;
  case backend::UnaryOp::Reciprocal: u = U::Reciprocal; break;
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const bool integral = in.dtype == kInt || in.dtype == kLong || in.dtype == kBool;
  auto val = [&](const backend::ScalarValue &s) { return integral ? double(s.i) : s.d; };
  cudaops::unary(u, operand(out), operand(in), dtypeOf(in.dtype), p.has_p0 ? val(p.p0) : nan,
                 p.has_p1 ? val(p.p1) : nan, cur());
}

void binaryK(backend::BinaryOp op, const backend::TensorDesc &out, const backend::TensorDesc &a,
             const backend::TensorDesc &b, backend::ScalarValue alpha) {
  using B = cudaops::BinaryOp;
  static const B map[] = {B::Add, B::Sub, B::Mul, B::Div, B::Pow, B::Maximum, B::Minimum};
  const bool integral = a.dtype == kInt || a.dtype == kLong || a.dtype == kBool;
  cudaops::binary(map[static_cast<int>(op)], operand(out), operand(a), operand(b),
                  dtypeOf(a.dtype), integral ? double(alpha.i) : alpha.d, cur());
}

void compareK(backend::CompareOp op, const backend::TensorDesc &out, const backend::TensorDesc &a,
              const backend::TensorDesc &b) {
  using B = cudaops::BinaryOp;
  static const B map[] = {B::Eq, B::Ne, B::Lt, B::Le, B::Gt, B::Ge};
  cudaops::binary(map[static_cast<int>(op)], operand(out), operand(a), operand(b),
                  dtypeOf(a.dtype), 1.0, cur());
}

void whereK(const backend::TensorDesc &out, const backend::TensorDesc &cond,
            const backend::TensorDesc &a, const backend::TensorDesc &b) {
  cudaops::where(operand(out), operand(cond), operand(a), operand(b), cur());
}

void reduceK(backend::ReduceOp op, const backend::TensorDesc &out, const backend::TensorDesc &in,
             const backend::TensorDesc *indices) {
  using R = cudaops::ReduceOp;
  static const R map[] = {R::Sum, R::Prod, R::Max, R::Min, R::Argmax, R::Argmin};
  std::uint64_t mask = 0;
  for (int d = 0; d < in.ndim; ++d)
    if (out.sizes[d] != in.sizes[d])
      mask |= std::uint64_t(1) << d;
  Operand i = operand(in), o = operand(out);
  Operand idx = indices ? operand(*indices) : Operand();
  Scratch scratch(cudaops::reduceScratchBytes(i, mask));
  cudaops::reduce(map[static_cast<int>(op)], o, indices ? &idx : nullptr, i, mask, scratch.p, cur());
}

// A matrix operand [B, R, C] as cuBLAS wants it: unit stride along one of the
// two matrix dims. Size-1 dims may carry any stride; give them the natural one.
struct Mat {
  const void *p;
  bool trans;
  std::int64_t ld, batchStride;
};
bool asMat(const backend::TensorDesc &d, Mat *m) {
  const std::int64_t R = d.sizes[1], C = d.sizes[2];
  std::int64_t sr = R == 1 ? std::max<std::int64_t>(C, 1) : d.strides[1];
  std::int64_t sc = C == 1 ? 1 : d.strides[2];
  if (sc == 1 && sr >= std::max<std::int64_t>(C, 1)) {
    *m = {d.data, false, sr, d.sizes[0] == 1 ? 0 : d.strides[0]};
    return true;
  }
  sc = C == 1 ? std::max<std::int64_t>(R, 1) : d.strides[2];
  sr = R == 1 ? 1 : d.strides[1];
  if (sr == 1 && sc >= std::max<std::int64_t>(R, 1)) {
    *m = {d.data, true, sc, d.sizes[0] == 1 ? 0 : d.strides[0]};
    return true;
  }
  return false;
}

void matmulK(const backend::TensorDesc &out, const backend::TensorDesc &a,
             const backend::TensorDesc &b) {
  const std::int64_t B = out.sizes[0], M = out.sizes[1], N = out.sizes[2], K = a.sizes[2];
  if (out.numel() == 0)
    return;
  if (K == 0) { // an empty sum: zeros, as PyTorch
    cudaops::fill(operand(out), 0.0, cur());
    return;
  }
  const std::size_t es = elementSize(out.dtype);
  auto dense = [&](const backend::TensorDesc &d, Scratch &buf) {
    backend::TensorDesc c = d;
    c.data = buf.p;
    c.strides[2] = 1;
    c.strides[1] = d.sizes[2];
    c.strides[0] = d.sizes[1] * d.sizes[2];
    cudaops::copy(operand(c), operand(d), cur());
    return c;
  };
  Mat ma, mb;
  Scratch sa(asMat(a, &ma) ? 0 : a.numel() * es), sb(asMat(b, &mb) ? 0 : b.numel() * es);
  if (sa.p)
    asMat(dense(a, sa), &ma);
  if (sb.p)
    asMat(dense(b, sb), &mb);
  // Output: dense rows; otherwise compute into scratch and copy back.
  const bool outOk = out.strides[2] == 1 && out.strides[1] == N &&
                     (B == 1 || out.strides[0] == M * N);
  Scratch so(outOk ? 0 : out.numel() * es);
  void *c = outOk ? out.data : so.p;
  cudaops::gemm(dtypeOf(out.dtype), ma.trans, mb.trans, M, N, K, ma.p, ma.ld, ma.batchStride,
                mb.p, mb.ld, mb.batchStride, c, N, M * N, B, cur());
  if (!outOk) {
    backend::TensorDesc tmp = out;
    tmp.data = so.p;
    tmp.strides[2] = 1;
    tmp.strides[1] = N;
    tmp.strides[0] = M * N;
    cudaops::copy(operand(out), operand(tmp), cur());
  }
}

int deviceCountK() { return cudaops::deviceCountNoThrow(); }

void *allocPinned(std::size_t n) {
  requireDevice();
  return state().pinned.allocate(n, nullptr);
}
void freePinned(void *p, std::size_t) { state().pinned.free(p); }
bool isPinned(const void *p) { return state().pinned.owns(p) || cudaops::isPinnedPointer(p); }

void cacheStats(backend::CacheStats *out) {
  *out = backend::CacheStats();
  State &s = state();
  for (auto &a : s.device) {
    if (!a)
      continue;
    const cudaalloc::Stats st = a->stats();
    out->reserved_bytes += st.reserved_bytes;
    out->peak_reserved_bytes += st.max_reserved_bytes;
    out->allocated_bytes += st.allocated_bytes;
    out->peak_allocated_bytes += st.max_allocated_bytes;
    out->raw_allocs += st.num_raw_allocs;
    out->raw_frees += st.num_raw_frees;
    out->cache_hits += st.num_cache_hits;
  }
}

void emptyCacheK() {
  State &s = state();
  for (auto &a : s.device)
    if (a)
      a->emptyCache();
  s.pinned.emptyCache();
}

const backend::Backend kCudaBackend = [] {
  backend::Backend b{};
  b.name = "CUDA";
  b.device = kCUDA;
  b.alloc = allocDevice;
  b.free = freeDevice;
  b.memcpy_h2d = h2d;
  b.memcpy_d2h = d2h;
  b.memcpy_d2d = d2d;
  b.synchronize = syncDevice;
  b.copy = copyK;
  b.fill = fillK;
  b.unary = unaryK;
  b.binary = binaryK;
  b.compare = compareK;
  b.where = whereK;
  b.reduce = reduceK;
  b.matmul = matmulK;
  b.device_count = deviceCountK;
  b.memcpy_h2d_async = h2dAsync;
  b.memcpy_d2h_async = d2hAsync;
  b.alloc_pinned = allocPinned;
  b.free_pinned = freePinned;
  b.is_pinned = isPinned;
  b.cache_stats = cacheStats;
  b.empty_cache = emptyCacheK;
  return b;
}();

[[maybe_unused]] const bool kRegistered = (backend::registerBackend(kCUDA, &kCudaBackend), true);

} // namespace

// --- tt/cuda.h ------------------------------------------------------------------------------
Stream::Stream(void *handle, int device) : handle_(handle), device_(device) {}
void Stream::synchronize() const { cudaops::streamSynchronize(handle_); }
bool Stream::query() const { return cudaops::streamQuery(handle_); }

Stream getCurrentCUDAStream(int device) {
  const int dev = resolve(device);
  return Stream(currentStreamHandle(dev), dev);
}
Stream getDefaultCUDAStream(int device) { return Stream(nullptr, resolve(device)); }

Stream getStreamFromPool(int device) {
  // A small fixed pool per device, handed out round-robin (PyTorch: 32).
  static std::mutex mu;
  static std::vector<std::vector<void *>> pools;
  static std::vector<unsigned> next;
  const int dev = resolve(device);
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(pools.size()) <= dev) {
    pools.resize(dev + 1);
    next.resize(dev + 1);
  }
  if (pools[dev].empty()) {
    const int prev = currentDev();
    cudaops::setDevice(dev);
    for (int i = 0; i < 8; ++i)
      pools[dev].push_back(cudaops::streamCreate());
    cudaops::setDevice(prev);
  }
  return Stream(pools[dev][next[dev]++ % pools[dev].size()], dev);
}

void setCurrentCUDAStream(Stream s) {
  if (static_cast<int>(t_current.size()) <= s.device())
    t_current.resize(s.device() + 1, nullptr);
  t_current[s.device()] = s.handle();
}

CUDAStreamGuard::CUDAStreamGuard(Stream s) : prev_(getCurrentCUDAStream(s.device())) {
  setCurrentCUDAStream(s);
}
CUDAStreamGuard::~CUDAStreamGuard() { setCurrentCUDAStream(prev_); }

Event::Event(bool enable_timing) : handle_(cudaops::eventCreate(enable_timing)) {}
Event::~Event() {
  try { // a destructor must not throw, e.g. after a sticky kernel fault
    if (handle_)
      cudaops::eventDestroy(handle_);
  } catch (...) {
  }
}
void Event::record(const Stream &s) { cudaops::eventRecord(handle_, s.handle()); }
void Event::record() { record(getCurrentCUDAStream()); }
void Event::block(const Stream &s) { cudaops::streamWaitEvent(s.handle(), handle_); }
void Event::synchronize() const { cudaops::eventSynchronize(handle_); }
bool Event::query() const { return cudaops::eventQuery(handle_); }
float Event::elapsed_time(const Event &end) const {
  return cudaops::eventElapsedMs(handle_, end.handle_);
}

AllocatorStats allocator_stats(int device) {
  const cudaalloc::Stats st = deviceAllocator(resolve(device)).stats();
  AllocatorStats r;
  r.allocated_bytes = static_cast<std::int64_t>(st.allocated_bytes);
  r.max_allocated_bytes = static_cast<std::int64_t>(st.max_allocated_bytes);
  r.reserved_bytes = static_cast<std::int64_t>(st.reserved_bytes);
  r.max_reserved_bytes = static_cast<std::int64_t>(st.max_reserved_bytes);
  r.num_allocs = static_cast<std::int64_t>(st.num_allocs);
  r.num_cache_hits = static_cast<std::int64_t>(st.num_cache_hits);
  r.num_device_mallocs = static_cast<std::int64_t>(st.num_raw_allocs);
  r.num_device_frees = static_cast<std::int64_t>(st.num_raw_frees);
  r.num_alloc_retries = static_cast<std::int64_t>(st.num_alloc_retries);
  r.num_ooms = static_cast<std::int64_t>(st.num_ooms);
  return r;
}
std::int64_t memory_allocated(int device) { return allocator_stats(device).allocated_bytes; }
std::int64_t max_memory_allocated(int device) { return allocator_stats(device).max_allocated_bytes; }
std::int64_t memory_reserved(int device) { return allocator_stats(device).reserved_bytes; }
std::int64_t max_memory_reserved(int device) { return allocator_stats(device).max_reserved_bytes; }
void reset_peak_memory_stats(int device) { deviceAllocator(resolve(device)).resetPeakStats(); }
void empty_cache() {
  if (cudaops::deviceCountNoThrow() > 0)
    emptyCacheK();
}

void record_stream(const Tensor &t, const Stream &s) {
  void *p = t.data_ptr();
  if (!t.is_cuda() || !p)
    return;
  deviceAllocator(s.device()).recordStream(p, s.handle());
}

} // namespace tt::cuda
