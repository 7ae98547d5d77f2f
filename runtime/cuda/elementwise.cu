// Elementwise unary, binary (broadcast by strides of 0) and where. One kernel
// per (compute type, arity); the op is a uniform runtime switch, which keeps
// nvcc's work small and costs nothing measurable on memory-bound kernels.
#include "cuda_common.cuh"
#include "kernel_math.cuh"

#include <cmath>

namespace tt::cudaops {
namespace {

constexpr int kBlock = 256;

template <typename Acc> struct Inputs {
  const void *data[3];
  DType dtype[3];
  Acc scalar[3];
};

// N = operands including the output; N-1 inputs. Arity 4 is where().
template <typename Acc, int N>
__global__ void elementwiseKernel(void *out, DType ot, Inputs<Acc> in, Params<Acc> p,
                                  OffsetCalc<N> oc, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t offs[N];
    oc.get(i, offs);
    Acc v[N - 1];
#pragma unroll
    for (int k = 0; k < N - 1; ++k)
      v[k] = in.data[k] ? loadAs<Acc>(in.data[k], in.dtype[k], offs[k + 1]) : in.scalar[k];
    Acc r;
    if constexpr (N == 2) {
      r = applyUnary(p, v[0]);
    } else if constexpr (N == 3) {
      r = applyBinary(p, v[0], v[1]);
    } else {
      // where: the condition is read as double so any dtype works
      const bool c = in.data[0] ? loadAs<double>(in.data[0], in.dtype[0], offs[1]) != 0.0
                                : in.scalar[0] != Acc(0);
      r = c ? v[1] : v[2];
    }
    storeAs<Acc>(out, ot, offs[0], r);
  }
}

template <typename Acc, int N>
void launch(const Operand *const *ops, Params<Acc> p, cudaStream_t s) {
  const Plan plan = planElementwise(ops, N);
  const std::int64_t n = planNumel(plan);
  if (n == 0)
    return;
  Inputs<Acc> in{};
  for (int k = 1; k < N; ++k) {
    in.data[k - 1] = ops[k]->data;
    in.dtype[k - 1] = ops[k]->dtype;
    if constexpr (std::is_integral_v<Acc>)
      in.scalar[k - 1] = static_cast<Acc>(ops[k]->iscalar);
    else
      in.scalar[k - 1] = static_cast<Acc>(ops[k]->scalar);
  }
  elementwiseKernel<Acc, N><<<gridFor(n, kBlock), kBlock, 0, s>>>(
      ops[0]->data, ops[0]->dtype, in, p, makeOffsetCalc<N>(plan), n);
  TT_CUDA_CHECK_LAUNCH();
}

enum class Compute { F32, F64, I64 };
Compute computeOf(DType t) {
  switch (t) {
  case DType::Float: case DType::Half: case DType::BFloat16: return Compute::F32;
  case DType::Double: return Compute::F64;
  default: return Compute::I64;
  }
}

template <typename Acc>
Params<Acc> makeParams(int op, double a, double b, double alpha) {
  Params<Acc> p{};
  p.op = op;
  p.hasA = !std::isnan(a);
  p.hasB = !std::isnan(b);
  p.a = p.hasA ? static_cast<Acc>(a) : Acc(0);
  p.b = p.hasB ? static_cast<Acc>(b) : Acc(0);
  p.alpha = static_cast<Acc>(alpha);
  return p;
}

template <int N>
void dispatch(DType compute, const Operand *const *ops, int op, double a, double b, double alpha,
              cudaStream_t s) {
  switch (computeOf(compute)) {
  case Compute::F32: launch<float, N>(ops, makeParams<float>(op, a, b, alpha), s); return;
  case Compute::F64: launch<double, N>(ops, makeParams<double>(op, a, b, alpha), s); return;
  case Compute::I64:
    launch<long long, N>(ops, makeParams<long long>(op, a, b, alpha), s);
    return;
  }
}

} // namespace

void unary(UnaryOp op, const Operand &out, const Operand &in, DType compute, double a, double b,
           void *stream) {
  Operand bin = broadcastTo(in, out.sizes, out.ndim);
  const Operand *ops[2] = {&out, &bin};
  dispatch<2>(compute, ops, static_cast<int>(op), a, b, 1.0, asStream(stream));
}

void binary(BinaryOp op, const Operand &out, const Operand &a, const Operand &b, DType compute,
            double alpha, void *stream) {
  Operand ba = broadcastTo(a, out.sizes, out.ndim), bb = broadcastTo(b, out.sizes, out.ndim);
  const Operand *ops[3] = {&out, &ba, &bb};
  dispatch<3>(compute, ops, static_cast<int>(op), NAN, NAN, alpha, asStream(stream));
}

void where(const Operand &out, const Operand &cond, const Operand &a, const Operand &b,
           void *stream) {
  Operand bc = broadcastTo(cond, out.sizes, out.ndim), ba = broadcastTo(a, out.sizes, out.ndim),
          bb = broadcastTo(b, out.sizes, out.ndim);
  const Operand *ops[4] = {&out, &bc, &ba, &bb};
  dispatch<4>(out.dtype, ops, 0, NAN, NAN, 1.0, asStream(stream));
}

} // namespace tt::cudaops
