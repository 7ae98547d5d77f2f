// The CUDA backend's plain C++ interface: no CUDA headers, no tt::Tensor.
// Operands are raw device pointers with sizes and element strides, so the
// kernels build and test on their own and the runtime adapts to them in one
// place (cuda_backend.cpp). Every call is asynchronous on `stream` (a
// cudaStream_t passed as void*; nullptr = the legacy default stream) unless
// it says otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tt::cudaops {

// Element types, in tt::ScalarType's order (the adapter maps them).
enum class DType : std::int8_t { Float, Double, Half, BFloat16, Int, Long, Bool };
std::size_t dtypeSize(DType t);

// As the runtime's backend::kMaxDims; more dims fail loudly.
constexpr int kMaxDims = 16;

// One strided operand. `data` already includes the storage offset. A null
// `data` makes it a scalar operand whose value is `scalar` (used for
// tensor-scalar math without a device allocation).
struct Operand {
  void *data = nullptr;
  DType dtype = DType::Float;
  int ndim = 0;
  std::int64_t sizes[kMaxDims] = {};
  std::int64_t strides[kMaxDims] = {}; // in elements; 0 for broadcast dims
  double scalar = 0;
  std::int64_t iscalar = 0; // the same value, exact for integral compute

  std::int64_t numel() const;
};

Operand makeOperand(void *data, DType dtype, const std::int64_t *sizes, const std::int64_t *strides,
                    int ndim);
Operand makeScalar(double value, DType dtype);
Operand makeScalarInt(std::int64_t value, DType dtype);
// `op` viewed with `ndim` sizes (numpy broadcasting from the right): size-1 or
// missing dims get stride 0. Throws when the shapes do not broadcast.
Operand broadcastTo(const Operand &op, const std::int64_t *sizes, int ndim);

// --- device, errors, memory --------------------------------------------------
// Number of usable devices; throws std::runtime_error with PyTorch's words
// ("Found no NVIDIA driver on your system..." / "No CUDA GPUs are available")
// when there are none.
int deviceCount();
// Like deviceCount() but returns 0 instead of throwing; `why` gets the reason.
int deviceCountNoThrow(std::string *why = nullptr);
int currentDevice();
void setDevice(int device);

// Raw (uncached) device and pinned-host memory; throws on failure.
void *rawDeviceMalloc(std::size_t nbytes);
void rawDeviceFree(void *p);
void *rawHostMalloc(std::size_t nbytes); // page-locked
void rawHostFree(void *p);
bool isPinnedPointer(const void *p);
void memInfo(std::size_t *freeBytes, std::size_t *totalBytes); // cudaMemGetInfo

// --- streams and events (opaque handles) ------------------------------------
void *streamCreate();
void streamDestroy(void *stream);
void streamSynchronize(void *stream);
bool streamQuery(void *stream); // true when all work on it is done
void deviceSynchronize();
void *eventCreate(bool timing = false);
void eventDestroy(void *event);
void eventRecord(void *event, void *stream);
void eventSynchronize(void *event);
bool eventQuery(void *event);
void streamWaitEvent(void *stream, void *event);
float eventElapsedMs(void *start, void *end);

// --- transfers -----------------------------------------------------------------
enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
// Contiguous bytes. Async on `stream`; with pageable host memory the CUDA
// driver stages the copy and the host returns only once the source is read.
void memcpyAsync(void *dst, const void *src, std::size_t nbytes, CopyKind kind, void *stream);

// --- kernels (CPU reference: the same op in runtime/src's CPU backend) --------
// out[i] = value, any strides.
void fill(const Operand &out, double value, void *stream);
// dst[i] = convert(src[i]); same sizes, any strides and dtypes. Fast paths:
// memcpy when both are dense in the same order, a shared-memory tiled
// transpose when one is the transpose of the other.
void copy(const Operand &dst, const Operand &src, void *stream);

enum class UnaryOp {
  Neg, Abs, Exp, Log, Sqrt, Relu, Sigmoid, Tanh, Clamp, PowScalar, RPowScalar, Reciprocal, Identity
};
// out = op(in [, a, b]); computed in `compute` (Float for Half/BFloat16).
// Clamp uses a (min) and b (max), NaN meaning "no bound"; PowScalar is
// x ** a, RPowScalar a ** x.
void unary(UnaryOp op, const Operand &out, const Operand &in, DType compute, double a, double b,
           void *stream);

enum class BinaryOp { Add, Sub, Mul, Div, Pow, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge };
// out = a op b (Add/Sub: a op alpha*b), operands already broadcast to out's
// sizes, computed in `compute` (the promoted dtype), stored as out's dtype.
void binary(BinaryOp op, const Operand &out, const Operand &a, const Operand &b, DType compute,
            double alpha, void *stream);
// out = cond ? a : b, operands broadcast to out's sizes.
void where(const Operand &out, const Operand &cond, const Operand &a, const Operand &b,
           void *stream);

enum class ReduceOp { Sum, Mean, Prod, Max, Min, Argmax, Argmin };
// Reduces `in` over the dims whose bit is set in `reduceMask`. `out` has in's
// ndim with reduced dims of size 1 (keepdim form; the caller squeezes).
// Max/Min also write the index of the first extremum to `indices` (Long,
// same shape as out) when it is non-null. Argmax/Argmin write the row-major
// index within the reduced dims into `out` (Long). NaN wins max and min, as in
// PyTorch. `scratch` is caller-owned device memory of reduceScratchBytes().
std::size_t reduceScratchBytes(const Operand &in, std::uint64_t reduceMask);
void reduce(ReduceOp op, const Operand &out, const Operand *indices, const Operand &in,
            std::uint64_t reduceMask, void *scratch, void *stream);

// Row-major batched C = A·B (cuBLAS). A is [m,k] with row stride lda (or its
// transpose when transA: stored [k,m]), likewise B [k,n]; C is [m,n] dense
// with row stride ldc. Float, Double, Half, BFloat16; other dtypes throw
// PyTorch's '"addmm_cuda" not implemented for ...'.
void gemm(DType dtype, bool transA, bool transB, std::int64_t m, std::int64_t n, std::int64_t k,
          const void *A, std::int64_t lda, std::int64_t strideA, const void *B, std::int64_t ldb,
          std::int64_t strideB, void *C, std::int64_t ldc, std::int64_t strideC,
          std::int64_t batch, void *stream);

// --- host-side planning, exposed for unit tests (no GPU needed) --------------
// Operands of one elementwise launch after PyTorch TensorIterator-style
// reordering (dims sorted by the first operand's strides, innermost last) and
// coalescing (adjacent dims merged when every operand allows, size-1 dims
// dropped). Scalars (data == nullptr) are carried unchanged.
struct Plan {
  int nops = 0;
  int ndim = 0;
  std::int64_t sizes[kMaxDims] = {};
  std::int64_t strides[4][kMaxDims] = {};
};
Plan planElementwise(const Operand *const *ops, int nops);
// A dense same-dtype copy is one memcpy when the plan has at most one dim
// with unit strides.
bool planIsMemcpy(const Plan &p);
// The plan is a (batched) transpose: dst dense [B,R,C] and src with unit
// stride on R. Fills rows/cols/batch and src/dst leading strides.
struct TransposePlan {
  std::int64_t batch = 1, rows = 0, cols = 0;
  std::int64_t srcLd = 0, srcBatch = 0, dstBatch = 0;
};
bool planIsTranspose(const Plan &p, TransposePlan *tp);

} // namespace tt::cudaops
