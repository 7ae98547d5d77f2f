// Shared by the .cu files: error checks, dtype loads/stores, and the offset
// calculator that maps a linear index to per-operand element offsets.
#pragma once

#include "cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace tt::cudaops {

[[noreturn]] void throwCudaError(cudaError_t err, const char *what);

#define TT_CUDA_CHECK(expr)                                                                        \
  do {                                                                                             \
    cudaError_t tt_err_ = (expr);                                                                  \
    if (tt_err_ != cudaSuccess)                                                                    \
      ::tt::cudaops::throwCudaError(tt_err_, #expr);                                               \
  } while (0)

// After a launch: configuration errors show up here, faults asynchronously.
#define TT_CUDA_CHECK_LAUNCH() TT_CUDA_CHECK(cudaGetLastError())

inline cudaStream_t asStream(void *s) { return static_cast<cudaStream_t>(s); }

// Grid for a grid-stride loop over n elements.
inline unsigned gridFor(std::int64_t n, int block) {
  std::int64_t g = (n + block - 1) / block;
  if (g > 65535LL * 16) // enough to fill any GPU; the loop covers the rest
    g = 65535LL * 16;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

// --- loads and stores through the runtime dtype (host-callable for the tests) ---
template <typename Acc>
__host__ __device__ __forceinline__ Acc loadAs(const void *base, DType dt, std::int64_t off) {
  switch (dt) {
  case DType::Float: return static_cast<Acc>(static_cast<const float *>(base)[off]);
  case DType::Double: return static_cast<Acc>(static_cast<const double *>(base)[off]);
  case DType::Half: return static_cast<Acc>(__half2float(static_cast<const __half *>(base)[off]));
  case DType::BFloat16:
    return static_cast<Acc>(__bfloat162float(static_cast<const __nv_bfloat16 *>(base)[off]));
  case DType::Int: return static_cast<Acc>(static_cast<const int *>(base)[off]);
  case DType::Long: return static_cast<Acc>(static_cast<const long long *>(base)[off]);
  case DType::Bool: return static_cast<Acc>(static_cast<const bool *>(base)[off] ? 1 : 0);
  }
  return Acc(0);
}

// Float -> integer conversions truncate like C++ (out-of-range is
// unspecified in PyTorch too); anything -> bool is "!= 0" (NaN is true).
template <typename Acc>
__host__ __device__ __forceinline__ void storeAs(void *base, DType dt, std::int64_t off, Acc v) {
  switch (dt) {
  case DType::Float: static_cast<float *>(base)[off] = static_cast<float>(v); return;
  case DType::Double: static_cast<double *>(base)[off] = static_cast<double>(v); return;
  case DType::Half: static_cast<__half *>(base)[off] = __float2half(static_cast<float>(v)); return;
  case DType::BFloat16:
    static_cast<__nv_bfloat16 *>(base)[off] = __float2bfloat16(static_cast<float>(v));
    return;
  case DType::Int: static_cast<int *>(base)[off] = static_cast<int>(static_cast<long long>(v)); return;
  case DType::Long: static_cast<long long *>(base)[off] = static_cast<long long>(v); return;
  case DType::Bool: static_cast<bool *>(base)[off] = (v != Acc(0)); return;
  }
}

// --- offset calculator -----------------------------------------------------------
// Dims are stored innermost first so the divide loop runs outward.
template <int N> struct OffsetCalc {
  int ndim;
  std::int64_t sizes[kMaxDims];
  std::int64_t strides[N][kMaxDims];

  __host__ __device__ void get(std::int64_t linear, std::int64_t *offs) const {
    if (ndim == 1) { // coalesced dense operands: no 64-bit division
      for (int k = 0; k < N; ++k)
        offs[k] = linear * strides[k][0];
      return;
    }
    for (int k = 0; k < N; ++k)
      offs[k] = 0;
    for (int d = 0; d < ndim; ++d) {
      std::int64_t i = linear % sizes[d];
      linear /= sizes[d];
      for (int k = 0; k < N; ++k)
        offs[k] += i * strides[k][d];
    }
  }
};

// From a Plan (outermost first) to an OffsetCalc (innermost first).
template <int N> OffsetCalc<N> makeOffsetCalc(const Plan &p) {
  OffsetCalc<N> oc{};
  oc.ndim = p.ndim;
  for (int d = 0; d < p.ndim; ++d) {
    oc.sizes[d] = p.sizes[p.ndim - 1 - d];
    for (int k = 0; k < N; ++k)
      oc.strides[k][d] = p.strides[k][p.ndim - 1 - d];
  }
  return oc;
}

inline std::int64_t planNumel(const Plan &p) {
  std::int64_t n = 1;
  for (int d = 0; d < p.ndim; ++d)
    n *= p.sizes[d];
  return n;
}

} // namespace tt::cudaops
