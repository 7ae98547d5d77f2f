// matmul through cuBLAS. cuBLAS is column-major: a row-major C = A·B is the
// column-major C^T = B^T·A^T, so the operands are passed swapped.
#include "cuda_ops.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace tt::cudaops {

namespace {
const char *dtypeName(DType t) {
  switch (t) {
  case DType::Float: return "Float";
  case DType::Double: return "Double";
  case DType::Half: return "Half";
  case DType::BFloat16: return "BFloat16";
  case DType::Int: return "Int";
  case DType::Long: return "Long";
  case DType::Bool: return "Bool";
  }
  return "?";
}

void check(cublasStatus_t st, const char *what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("CUDA error: ") + cublasGetStatusString(st) +
                             " when calling `" + what + "`");
}

std::mutex g_mu;
// One per device, never destroyed: cublasDestroy after the driver unloads at
// exit can crash.
std::unordered_map<int, cublasHandle_t> g_handles;

cublasHandle_t handleFor(void *stream) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess)
    throw std::runtime_error("tt: cudaGetDevice failed");
  std::lock_guard<std::mutex> lock(g_mu);
  cublasHandle_t &h = g_handles[dev];
  if (!h)
    check(cublasCreate(&h), "cublasCreate(handle)");
  check(cublasSetStream(h, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  return h;
}
} // namespace

void gemm(DType dtype, bool transA, bool transB, std::int64_t m, std::int64_t n, std::int64_t k,
          const void *A, std::int64_t lda, std::int64_t strideA, const void *B, std::int64_t ldb,
          std::int64_t strideB, void *C, std::int64_t ldc, std::int64_t strideC,
          std::int64_t batch, void *stream) {
  cudaDataType_t type;
  cublasComputeType_t compute;
  switch (dtype) {
  case DType::Float: type = CUDA_R_32F; compute = CUBLAS_COMPUTE_32F; break;
  case DType::Double: type = CUDA_R_64F; compute = CUBLAS_COMPUTE_64F; break;
  case DType::Half: type = CUDA_R_16F; compute = CUBLAS_COMPUTE_32F; break;
  case DType::BFloat16: type = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; break;
  default:
    throw std::runtime_error(std::string("\"addmm_cuda\" not implemented for '") +
                             dtypeName(dtype) + "'");
  }
  if (m == 0 || n == 0 || batch == 0)
    return;
  const double oneD = 1.0, zeroD = 0.0;
  const float oneF = 1.0f, zeroF = 0.0f;
  const void *alpha = dtype == DType::Double ? static_cast<const void *>(&oneD) : &oneF;
  const void *beta = dtype == DType::Double ? static_cast<const void *>(&zeroD) : &zeroF;
  // k == 0: cuBLAS scales C by beta = 0, giving the zeros PyTorch returns.
  cublasHandle_t h = handleFor(stream);
  const cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Column-major view: C^T [n x m] = op(B)^T [n x k] * op(A)^T [k x m].
  check(cublasGemmStridedBatchedEx(h, opB, opA, static_cast<int>(n), static_cast<int>(m),
                                   static_cast<int>(k), alpha, B, type, static_cast<int>(ldb),
                                   strideB, A, type, static_cast<int>(lda), strideA, beta, C, type,
                                   static_cast<int>(ldc), strideC, static_cast<int>(batch), compute,
                                   CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

} // namespace tt::cudaops
