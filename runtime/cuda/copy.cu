// fill and strided copy (with dtype conversion): the core of clone,
// contiguous, reshape-copy, to(dtype) and copy_ on the GPU.
#include "cuda_common.cuh"

#include <cstring>

namespace tt::cudaops {
namespace {

constexpr int kBlock = 256;

// Same dtype: move elements of `Elem` bytes, no conversion.
template <typename Elem>
__global__ void copySameKernel(Elem *dst, const Elem *src, OffsetCalc<2> oc, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t offs[2];
    oc.get(i, offs);
    dst[offs[0]] = src[offs[1]];
  }
}

// Different dtypes (or a scalar source): convert through Acc, int64 when both
// sides are integral so that large Long values survive, else double.
template <typename Acc>
__global__ void copyConvertKernel(void *dst, DType dt, const void *src, DType st, Acc scalar,
                                  OffsetCalc<2> oc, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t offs[2];
    oc.get(i, offs);
    Acc v = src ? loadAs<Acc>(src, st, offs[1]) : scalar;
    storeAs<Acc>(dst, dt, offs[0], v);
  }
}

// Dense fill of a contiguous run: the common case of zeros/ones/full.
template <typename Elem> __global__ void fillDenseKernel(Elem *dst, Elem v, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = v;
}

// dst[b][r][c] = src[b*srcBatch + r + c*srcLd], through a 32x33 shared tile:
// reads are coalesced along r, writes along c (NVIDIA's transpose sample).
constexpr int kTile = 32, kRows = 8;
template <typename Elem>
__global__ void transposeKernel(Elem *dst, const Elem *src, TransposePlan tp) {
  __shared__ Elem tile[kTile][kTile + 1];
  const std::int64_t r0 = std::int64_t(blockIdx.x) * kTile, c0 = std::int64_t(blockIdx.y) * kTile;
  for (std::int64_t b = blockIdx.z; b < tp.batch; b += gridDim.z) {
    const Elem *s = src + b * tp.srcBatch;
    Elem *d = dst + b * tp.dstBatch;
    const std::int64_t r = r0 + threadIdx.x;
    for (int j = 0; j < kTile; j += kRows) {
      const std::int64_t c = c0 + threadIdx.y + j;
      if (r < tp.rows && c < tp.cols)
        tile[threadIdx.y + j][threadIdx.x] = s[r + c * tp.srcLd];
    }
    __syncthreads();
    const std::int64_t c = c0 + threadIdx.x;
    for (int j = 0; j < kTile; j += kRows) {
      const std::int64_t rr = r0 + threadIdx.y + j;
      if (rr < tp.rows && c < tp.cols)
        d[rr * tp.cols + c] = tile[threadIdx.x][threadIdx.y + j];
    }
    __syncthreads();
  }
}

template <typename Elem> void launchTranspose(void *dst, const void *src, const TransposePlan &tp,
                                              cudaStream_t s) {
  dim3 block(kTile, kRows);
  const std::int64_t gx = (tp.rows + kTile - 1) / kTile, gy = (tp.cols + kTile - 1) / kTile;
  if (gy > 65535) // grid.y limit: fall back (caller uses the generic path)
    throw std::logic_error("transpose grid");
  dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
            static_cast<unsigned>(tp.batch < 65535 ? tp.batch : 65535));
  transposeKernel<Elem><<<grid, block, 0, s>>>(static_cast<Elem *>(dst),
                                               static_cast<const Elem *>(src), tp);
  TT_CUDA_CHECK_LAUNCH();
}

template <typename Elem>
void launchCopySame(void *dst, const void *src, const Plan &p, std::int64_t n, cudaStream_t s) {
  copySameKernel<Elem><<<gridFor(n, kBlock), kBlock, 0, s>>>(
      static_cast<Elem *>(dst), static_cast<const Elem *>(src), makeOffsetCalc<2>(p), n);
  TT_CUDA_CHECK_LAUNCH();
}

bool isIntegral(DType t) { return t == DType::Int || t == DType::Long || t == DType::Bool; }

// Only called with sizeof(T) == sizeof(Elem); the other instantiations exist
// because the switch below is over a runtime dtype.
template <typename Elem, typename T> Elem bitsOf(T v) {
  Elem e{};
  std::memcpy(&e, &v, sizeof(T) < sizeof(Elem) ? sizeof(T) : sizeof(Elem));
  return e;
}

// The scalar as the bytes of one element of dtype dt.
template <typename Elem> Elem scalarBits(double v, DType dt) {
  switch (dt) {
  case DType::Float: return bitsOf<Elem>(static_cast<float>(v));
  case DType::Double: return bitsOf<Elem>(v);
  case DType::Half: return bitsOf<Elem>(__float2half(static_cast<float>(v)));
  case DType::BFloat16: return bitsOf<Elem>(__float2bfloat16(static_cast<float>(v)));
  case DType::Int: return bitsOf<Elem>(static_cast<std::int32_t>(v));
  case DType::Long: return bitsOf<Elem>(static_cast<std::int64_t>(v));
  case DType::Bool: return bitsOf<Elem>(static_cast<std::uint8_t>(v != 0));
  }
  return Elem{};
}

template <typename Elem> void launchFillDense(void *dst, const Operand &v, DType dt, std::int64_t n,
                                              cudaStream_t s) {
  const Elem bits = dt == DType::Long ? bitsOf<Elem>(static_cast<std::int64_t>(v.iscalar))
                    : dt == DType::Int ? bitsOf<Elem>(static_cast<std::int32_t>(v.iscalar))
                                       : scalarBits<Elem>(v.scalar, dt);
  fillDenseKernel<Elem><<<gridFor(n, kBlock), kBlock, 0, s>>>(static_cast<Elem *>(dst), bits, n);
  TT_CUDA_CHECK_LAUNCH();
}

} // namespace

void copy(const Operand &dst, const Operand &src, void *stream) {
  cudaStream_t s = asStream(stream);
  const Operand *ops[2] = {&dst, &src};
  Operand bsrc;
  if (!src.data || src.ndim != dst.ndim) { // scalars and rank-broadcast sources
    bsrc = broadcastTo(src, dst.sizes, dst.ndim);
    ops[1] = &bsrc;
  }
  const Plan p = planElementwise(ops, 2);
  const std::int64_t n = planNumel(p);
  if (n == 0)
    return;
  const Operand &sv = *ops[1];
  const std::size_t es = dtypeSize(dst.dtype);

  if (sv.data && sv.dtype == dst.dtype) {
    if (planIsMemcpy(p)) {
      TT_CUDA_CHECK(cudaMemcpyAsync(dst.data, sv.data, n * es, cudaMemcpyDeviceToDevice, s));
      return;
    }
    TransposePlan tp;
    if (planIsTranspose(p, &tp) && (tp.cols + kTile - 1) / kTile <= 65535) {
      switch (es) {
      case 1: launchTranspose<std::uint8_t>(dst.data, sv.data, tp, s); return;
      case 2: launchTranspose<std::uint16_t>(dst.data, sv.data, tp, s); return;
      case 4: launchTranspose<std::uint32_t>(dst.data, sv.data, tp, s); return;
      case 8: launchTranspose<std::uint64_t>(dst.data, sv.data, tp, s); return;
      }
    }
    switch (es) {
    case 1: launchCopySame<std::uint8_t>(dst.data, sv.data, p, n, s); return;
    case 2: launchCopySame<std::uint16_t>(dst.data, sv.data, p, n, s); return;
    case 4: launchCopySame<std::uint32_t>(dst.data, sv.data, p, n, s); return;
    case 8: launchCopySame<std::uint64_t>(dst.data, sv.data, p, n, s); return;
    }
  }
  if (!sv.data && p.ndim == 1 && p.strides[0][0] == 1) { // dense fill
    switch (es) {
    case 1: launchFillDense<std::uint8_t>(dst.data, sv, dst.dtype, n, s); return;
    case 2: launchFillDense<std::uint16_t>(dst.data, sv, dst.dtype, n, s); return;
    case 4: launchFillDense<std::uint32_t>(dst.data, sv, dst.dtype, n, s); return;
    case 8: launchFillDense<std::uint64_t>(dst.data, sv, dst.dtype, n, s); return;
    }
  }
  const OffsetCalc<2> oc = makeOffsetCalc<2>(p);
  if (isIntegral(dst.dtype) && isIntegral(sv.dtype))
    copyConvertKernel<long long><<<gridFor(n, kBlock), kBlock, 0, s>>>(
        dst.data, dst.dtype, sv.data, sv.dtype, static_cast<long long>(sv.iscalar), oc, n);
  else
    copyConvertKernel<double><<<gridFor(n, kBlock), kBlock, 0, s>>>(
        dst.data, dst.dtype, sv.data, sv.dtype, sv.scalar, oc, n);
  TT_CUDA_CHECK_LAUNCH();
}

void fill(const Operand &out, double value, void *stream) {
  copy(out, makeScalar(value, out.dtype), stream);
}

} // namespace tt::cudaops
