// The device backend interface: one table of kernels per device type, in the
// style of ggml's ggml-backend-impl.h. The front end (tensor.cpp, ops.cpp)
// does everything device-independent -- shapes, broadcasting, strides of the
// result, type promotion, autograd, tracing, memory statistics -- and calls a
// backend only with operands already described by TensorDesc:
//   * every operand of one call has the same ndim and sizes; a broadcast input
//     has stride 0 in the broadcast dims (the front end precomputes them);
//   * strides are in elements, may be anything (negative is never produced,
//     0 means broadcast), data points at element 0 (storage offset applied);
//   * unless said otherwise all operands of a call share one dtype (the front
//     end converts inputs to the computation dtype first);
//   * ops with a scalar take it as a ScalarValue (double and int64 forms).
// The CPU backend is cpu_backend.cpp; the CUDA one lives in runtime/cuda/ and
// registers itself with registerBackend(kCUDA, ...) from a static initializer.
// See docs/runtime/backends.md.
#pragma once

#include "tt/types.h"

#include <cstddef>
#include <cstdint>

namespace tt::backend {

inline constexpr int kMaxDims = 16;

struct TensorDesc {
  void *data = nullptr;
  ScalarType dtype = kFloat;
  int ndim = 0;
  std::int64_t sizes[kMaxDims] = {};
  std::int64_t strides[kMaxDims] = {};
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < ndim; ++i)
      n *= sizes[i];
    return n;
  }
};

// A scalar operand in both forms; kernels read the one matching their dtype.
struct ScalarValue {
  double d = 0;
  std::int64_t i = 0;
};

enum class UnaryOp : std::uint8_t {
  Neg, Abs, Exp, Log, Sqrt, Relu, Sigmoid, Tanh,
  Clamp,     // p0 = min (if has_p0), p1 = max (if has_p1)
  PowScalar, // x ** p0
  RPowScalar, // p0 ** x
  Reciprocal,
};
struct UnaryParams {
  ScalarValue p0, p1;
  bool has_p0 = false, has_p1 = false;
};

// out = a (op) alpha*b for Add/Sub; out = a (op) b otherwise.
enum class BinaryOp : std::uint8_t { Add, Sub, Mul, Div, Pow, Maximum, Minimum };
enum class CompareOp : std::uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
enum class ReduceOp : std::uint8_t { Sum, Prod, Max, Min, ArgMax, ArgMin };

// A caching allocator's figures, for memory_stats() of its device.
struct CacheStats {
  std::int64_t allocated_bytes = 0, peak_allocated_bytes = 0;
  std::int64_t reserved_bytes = 0, peak_reserved_bytes = 0;
  std::int64_t raw_allocs = 0, raw_frees = 0, cache_hits = 0;
};

struct Backend {
  const char *name;
  DeviceType device;

  // --- memory -----------------------------------------------------------------------
  void *(*alloc)(std::size_t nbytes);          // throws std::bad_alloc / runtime_error
  void (*free)(void *ptr, std::size_t nbytes);
  void (*memcpy_h2d)(void *dst, const void *src, std::size_t nbytes);
  void (*memcpy_d2h)(void *dst, const void *src, std::size_t nbytes);
  void (*memcpy_d2d)(void *dst, const void *src, std::size_t nbytes);
  void (*synchronize)();

  // --- kernels (all operands on this device) -------------------------------------------
  // dst = src, any strides to any strides, converting src.dtype to dst.dtype.
  void (*copy)(const TensorDesc &dst, const TensorDesc &src);
  void (*fill)(const TensorDesc &dst, ScalarValue value);
  void (*unary)(UnaryOp op, const TensorDesc &out, const TensorDesc &in, const UnaryParams &params);
  void (*binary)(BinaryOp op, const TensorDesc &out, const TensorDesc &a, const TensorDesc &b, ScalarValue alpha);
  // out.dtype is kBool; a and b share a dtype.
  void (*compare)(CompareOp op, const TensorDesc &out, const TensorDesc &a, const TensorDesc &b);
  // cond.dtype is kBool; out, a, b share a dtype.
  void (*where)(const TensorDesc &out, const TensorDesc &cond, const TensorDesc &a, const TensorDesc &b);
  // out has in's ndim, size 1 in the reduced dims (the dims where out and in
  // differ). Sum/Prod/Max/Min: out.dtype == in.dtype. ArgMax/ArgMin: out is
  // kLong. Max/Min also write the arg index to *indices (kLong, out's
  // geometry) when it is not null. Empty reductions: Sum 0, Prod 1; the front
  // end rejects empty Max/Min/Arg*.
  void (*reduce)(ReduceOp op, const TensorDesc &out, const TensorDesc &in, const TensorDesc *indices);
  // Batched matrix product: out [B,M,N] = a [B,M,K] x b [B,K,N]; 3-D descs,
  // any strides (B may be broadcast with stride 0).
  void (*matmul)(const TensorDesc &out, const TensorDesc &a, const TensorDesc &b);

  // --- optional: nullptr for a device without them (CPU) --------------------------------
  // Usable devices; 0, never an exception, when there is no driver or GPU.
  int (*device_count)();
  // non_blocking copies: asynchronous on the current stream when the host side
  // is pinned, else the same as memcpy_h2d / memcpy_d2h.
  void (*memcpy_h2d_async)(void *dst, const void *src, std::size_t nbytes);
  void (*memcpy_d2h_async)(void *dst, const void *src, std::size_t nbytes);
  // Page-locked host memory for pin_memory(): CPU storage freed by free_pinned.
  void *(*alloc_pinned)(std::size_t nbytes);
  void (*free_pinned)(void *ptr, std::size_t nbytes);
  bool (*is_pinned)(const void *ptr);
  // The caching allocator's figures (memory_stats) and empty_cache().
  void (*cache_stats)(CacheStats *out);
  void (*empty_cache)();
};

// The table for a device type; throws "Could not run ... CUDA backend" style
// errors when the device has no backend in this build.
const Backend &get(DeviceType device);
bool available(DeviceType device);
void registerBackend(DeviceType device, const Backend *backend);

const Backend &cpuBackend();

} // namespace tt::backend
