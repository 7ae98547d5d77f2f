// Reductions over any set of dims: sum, mean, max, min (with indices),
// argmax, argmin. Each output is reduced by a group of 1, 32 or 256 threads
// (by the reduced size); few outputs over a long reduction are split across
// blocks and finished by a second kernel.
#include "cuda_common.cuh"
#include "kernel_math.cuh"

#include <cfloat>
#include <climits>

namespace tt::cudaops {
namespace {

constexpr int kBlock = 256;

template <typename Acc> __device__ __forceinline__ Pair<Acc> shfl(Pair<Acc> p, int delta) {
  return {__shfl_down_sync(0xffffffffu, p.v, delta), __shfl_down_sync(0xffffffffu, p.i, delta)};
}

struct ReducePlan {
  std::int64_t numOut = 0, R = 0;
  int group = 1;  // threads per output: 1, 32 or 256
  int splits = 1; // blocks per output (group == 256 only)
  OffsetCalc<2> outer{}; // [out, in] over the kept dims
  OffsetCalc<1> inner{}; // [in] over the reduced dims, row-major index
};

ReducePlan makePlan(const Operand &in, const Operand &out, std::uint64_t mask) {
  ReducePlan rp;
  rp.numOut = 1;
  rp.R = 1;
  // innermost first, as OffsetCalc wants
  for (int d = in.ndim - 1; d >= 0; --d) {
    if (mask >> d & 1) {
      rp.inner.sizes[rp.inner.ndim] = in.sizes[d];
      rp.inner.strides[0][rp.inner.ndim] = in.strides[d];
      ++rp.inner.ndim;
      rp.R *= in.sizes[d];
    } else {
      rp.outer.sizes[rp.outer.ndim] = in.sizes[d];
      rp.outer.strides[0][rp.outer.ndim] = out.strides[d];
      rp.outer.strides[1][rp.outer.ndim] = in.strides[d];
      ++rp.outer.ndim;
      rp.numOut *= in.sizes[d];
    }
  }
  if (rp.R <= 16)
    rp.group = 1;
  else if (rp.R <= 4096 || rp.numOut >= 1024)
    rp.group = 32;
  else
    rp.group = 256;
  if (rp.group == 256 && rp.numOut < 512 && rp.R > 65536) {
    std::int64_t s = 512 / rp.numOut, byWork = (rp.R + 16383) / 16384;
    s = s < byWork ? s : byWork;
    rp.splits = static_cast<int>(s < 1 ? 1 : (s > 256 ? 256 : s));
  }
  return rp;
}

struct OutArgs {
  void *out;
  DType outType;
  void *idx; // Long, or null
  void *partial; // Pair<Acc>[numOut * splits] when splits > 1
};

template <typename Acc>
__device__ __forceinline__ void finish(ReduceOp op, const OutArgs &o, std::int64_t outOff,
                                       Pair<Acc> r, std::int64_t R) {
  switch (op) {
  case ReduceOp::Mean:
    storeAs<double>(o.out, o.outType, outOff, static_cast<double>(r.v) / static_cast<double>(R));
    return;
  case ReduceOp::Argmax: case ReduceOp::Argmin:
    static_cast<long long *>(o.out)[outOff] = r.i;
    return;
  default:
    storeAs<Acc>(o.out, o.outType, outOff, r.v);
    if (o.idx)
      static_cast<long long *>(o.idx)[outOff] = r.i;
  }
}

template <typename Acc>
__global__ void reduceKernel(ReduceOp op, const void *in, DType inType, OutArgs o, ReducePlan rp) {
  __shared__ Pair<Acc> warpResults[kBlock / 32];
  const int lane = threadIdx.x % rp.group;
  const std::int64_t out = std::int64_t(blockIdx.x) * (kBlock / rp.group) + threadIdx.x / rp.group;
  const bool live = out < rp.numOut;
  const std::int64_t chunk = (rp.R + rp.splits - 1) / rp.splits;
  const std::int64_t r0 = blockIdx.y * chunk, r1 = r0 + chunk < rp.R ? r0 + chunk : rp.R;

  Pair<Acc> acc = identity<Acc>(op);
  std::int64_t offs[2] = {0, 0};
  if (live) {
    rp.outer.get(out, offs);
    for (std::int64_t r = r0 + lane; r < r1; r += rp.group) {
      std::int64_t ioff;
      rp.inner.get(r, &ioff);
      acc = combine(op, acc, Pair<Acc>{loadAs<Acc>(in, inType, offs[1] + ioff), r});
    }
  }
  if (rp.group >= 32) { // every thread of the warp takes part, live or not
    for (int delta = 16; delta > 0; delta /= 2)
      acc = combine(op, acc, shfl(acc, delta));
  }
  if (rp.group == 256) {
    if (threadIdx.x % 32 == 0)
      warpResults[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x != 0)
      return;
    for (int w = 1; w < kBlock / 32; ++w)
      acc = combine(op, acc, warpResults[w]);
  } else if (lane != 0) {
    return;
  }
  if (!live)
    return;
  if (rp.splits > 1)
    static_cast<Pair<Acc> *>(o.partial)[out * rp.splits + blockIdx.y] = acc;
  else
    finish(op, o, offs[0], acc, rp.R);
}

template <typename Acc>
__global__ void reduceFinishKernel(ReduceOp op, OutArgs o, ReducePlan rp) {
  const std::int64_t out = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  if (out >= rp.numOut)
    return;
  const Pair<Acc> *p = static_cast<const Pair<Acc> *>(o.partial) + out * rp.splits;
  Pair<Acc> acc = p[0];
  for (int s = 1; s < rp.splits; ++s)
    acc = combine(op, acc, p[s]);
  std::int64_t offs[2];
  rp.outer.get(out, offs);
  finish(op, o, offs[0], acc, rp.R);
}

template <typename Acc>
void launchReduce(ReduceOp op, const Operand &in, const OutArgs &o, const ReducePlan &rp,
                  cudaStream_t s) {
  const std::int64_t perBlock = kBlock / rp.group;
  const std::int64_t gx = (rp.numOut + perBlock - 1) / perBlock;
  if (gx > INT_MAX)
    throw std::runtime_error("tt: reduction has too many outputs for one launch");
  dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(rp.splits));
  reduceKernel<Acc><<<grid, kBlock, 0, s>>>(op, in.data, in.dtype, o, rp);
  TT_CUDA_CHECK_LAUNCH();
  if (rp.splits > 1) {
    reduceFinishKernel<Acc><<<gridFor(rp.numOut, kBlock), kBlock, 0, s>>>(op, o, rp);
    TT_CUDA_CHECK_LAUNCH();
  }
}

} // namespace

std::size_t reduceScratchBytes(const Operand &in, std::uint64_t reduceMask) {
  const ReducePlan rp = makePlan(in, in, reduceMask);
  return rp.splits > 1 ? static_cast<std::size_t>(rp.numOut * rp.splits) * 16 : 0;
}

void reduce(ReduceOp op, const Operand &out, const Operand *indices, const Operand &in,
            std::uint64_t reduceMask, void *scratch, void *stream) {
  if (out.ndim != in.ndim || (indices && indices->ndim != in.ndim))
    throw std::logic_error("tt: reduce wants keepdim-shaped outputs");
  if (indices) // indices must share out's strides: one offset serves both
    for (int d = 0; d < out.ndim; ++d)
      if (indices->strides[d] != out.strides[d])
        throw std::logic_error("tt: reduce wants values and indices with one layout");
  const ReducePlan rp = makePlan(in, out, reduceMask);
  if (rp.numOut == 0)
    return;
  if (rp.splits > 1 && !scratch)
    throw std::logic_error("tt: reduce needs reduceScratchBytes() of scratch");
  OutArgs o{out.data, out.dtype, indices ? indices->data : nullptr, scratch};
  cudaStream_t s = asStream(stream);
  switch (in.dtype) {
  case DType::Float: case DType::Half: case DType::BFloat16:
    launchReduce<float>(op, in, o, rp, s);
    return;
  case DType::Double: launchReduce<double>(op, in, o, rp, s); return;
  default: launchReduce<long long>(op, in, o, rp, s); return;
  }
}

} // namespace tt::cudaops
