// The CPU backend: the kernels of backend.h over strided operands, with a
// small TensorIterator-like loop (drop size-1 dims, order dims by the first
// operand's strides, coalesce, run a typed inner loop) split across OpenMP
// threads. matmul goes to OpenBLAS for float/double.
#include "backend.h"
#include "cpu_vec.h"
#include "internal.h"

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __SSE2__
#include <immintrin.h>
#endif

namespace tt::backend {
namespace {

constexpr int kMaxOps = 4;
constexpr std::int64_t kGrain = 32768; // elements per thread before splitting

// Operands flattened to a coalesced loop nest (byte strides).
struct Loop {
  int nops = 0;
  int ndim = 0; // dims ordered outermost first
  std::int64_t sizes[kMaxDims] = {};
  std::int64_t strides[kMaxOps][kMaxDims] = {};
  char *base[kMaxOps] = {};
  std::int64_t numel = 1;
};

Loop makeLoop(std::initializer_list<const TensorDesc *> ops) {
  Loop L;
  L.nops = static_cast<int>(ops.size());
  const TensorDesc &first = **ops.begin();
  int nd = first.ndim;
  // Dims with size 1 do not move anything.
  std::vector<int> dims;
  for (int d = 0; d < nd; ++d) {
    L.numel *= first.sizes[d];
    if (first.sizes[d] != 1)
      dims.push_back(d);
  }
  // Innermost: the smallest stride of the first operand (the output), ties by
  // the next operands: follows memory order like TensorIterator.
  std::stable_sort(dims.begin(), dims.end(), [&](int a, int b) {
    for (const TensorDesc *op : ops) {
      std::int64_t sa = std::llabs(op->strides[a]), sb = std::llabs(op->strides[b]);
      if (sa == 0 || sb == 0)
        continue;
      if (sa != sb)
        return sa > sb;
    }
    return false;
  });
  int k = 0;
  for (int d : dims) {
    L.sizes[k] = first.sizes[d];
    int i = 0;
    for (const TensorDesc *op : ops)
      L.strides[i++][k] = op->strides[d] * static_cast<std::int64_t>(elementSize(op->dtype));
    ++k;
  }
  L.ndim = k;
  // Coalesce dim j-1 into j when every operand steps through them as one.
  int out = 0;
  for (int j = 1; j < L.ndim; ++j) {
    bool can = true;
    for (int i = 0; i < L.nops; ++i)
      if (L.strides[i][out] != L.strides[i][j] * L.sizes[j])
        can = false;
    if (can) {
      L.sizes[out] *= L.sizes[j];
      for (int i = 0; i < L.nops; ++i)
        L.strides[i][out] = L.strides[i][j];
    } else {
      ++out;
      L.sizes[out] = L.sizes[j];
      for (int i = 0; i < L.nops; ++i)
        L.strides[i][out] = L.strides[i][j];
    }
  }
  if (L.ndim > 0)
    L.ndim = out + 1;
  int i = 0;
  for (const TensorDesc *op : ops)
    L.base[i++] = static_cast<char *>(op->data);
  return L;
}

} // namespace
int maxThreads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
namespace {

// Runs f(begin, end) over [0, items) in parallel chunks, each item costing
// about `cost` elements: split only when every thread gets kGrain of them.
template <typename F> void parallelItems(std::int64_t items, std::int64_t cost, F f) {
  int nt = maxThreads();
  std::int64_t work = items * cost;
  if (nt <= 1 || items < 2 || work < 2 * kGrain) {
    f(std::int64_t(0), items);
    return;
  }
  std::int64_t chunks = std::min<std::int64_t>({nt, work / kGrain, items});
#ifdef _OPENMP
#pragma omp parallel for num_threads(static_cast<int>(chunks)) schedule(static)
#endif
  for (std::int64_t c = 0; c < chunks; ++c)
    f(items * c / chunks, items * (c + 1) / chunks);
}
template <typename F> void parallelFor(std::int64_t n, F f) { parallelItems(n, 1, f); }

struct NoChunkEnd {
  void operator()() const {}
};

// Calls inner(ptrs, inner_strides, count) over every innermost run of L, and
// chunkEnd() on each thread after its last run.
template <typename Inner, typename ChunkEnd = NoChunkEnd>
void runLoop(const Loop &L, Inner inner, ChunkEnd chunkEnd = {}) {
  if (L.numel == 0)
    return;
  if (L.ndim == 0) {
    char *ptrs[kMaxOps];
    std::int64_t st[kMaxOps] = {};
    for (int i = 0; i < L.nops; ++i)
      ptrs[i] = L.base[i];
    inner(ptrs, st, std::int64_t(1));
    return;
  }
  const int nd = L.ndim;
  const std::int64_t innerSize = L.sizes[nd - 1];
  std::int64_t innerStrides[kMaxOps];
  for (int i = 0; i < L.nops; ++i)
    innerStrides[i] = L.strides[i][nd - 1];
  parallelFor(L.numel, [&](std::int64_t begin, std::int64_t end) {
    // Position of linear index `begin` in the loop nest.
    std::int64_t idx[kMaxDims];
    std::int64_t rem = begin;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rem % L.sizes[d];
      rem /= L.sizes[d];
    }
    std::int64_t pos = begin;
    while (pos < end) {
      char *ptrs[kMaxOps];
      for (int i = 0; i < L.nops; ++i) {
        std::int64_t off = 0;
        for (int d = 0; d < nd; ++d)
          off += idx[d] * L.strides[i][d];
        ptrs[i] = L.base[i] + off;
      }
      std::int64_t count = std::min(innerSize - idx[nd - 1], end - pos);
      inner(ptrs, innerStrides, count);
      pos += count;
      idx[nd - 1] += count;
      for (int d = nd - 1; d > 0 && idx[d] >= L.sizes[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
    chunkEnd();
  });
}

// --- dtype dispatch ---------------------------------------------------------------------
// clang-format off
template <typename T> struct Tag { using type = T; };
template <typename F> void dispatch(ScalarType t, F f) {
  switch (t) {
  case kFloat: f(Tag<float>{}); break;
  case kDouble: f(Tag<double>{}); break;
  case kHalf: f(Tag<Half>{}); break;
  case kBFloat16: f(Tag<BFloat16>{}); break;
  case kInt: f(Tag<std::int32_t>{}); break;
  case kLong: f(Tag<std::int64_t>{}); break;
  case kBool: f(Tag<bool>{}); break;
  }
}
// clang-format on

// The type arithmetic is done in.
template <typename T> struct Acc {
  using type = T;
};
template <> struct Acc<Half> {
  using type = float;
};
template <> struct Acc<BFloat16> {
  using type = float;
};
template <> struct Acc<bool> {
  using type = std::int64_t;
};
template <typename T> using acc_t = typename Acc<T>::type;

template <typename T> acc_t<T> fromScalar(ScalarValue v) {
  if constexpr (std::is_floating_point_v<acc_t<T>>)
    return static_cast<acc_t<T>>(v.d);
  else
    return static_cast<acc_t<T>>(v.i);
}

template <typename T, typename A> T store(A v) {
  if constexpr (std::is_same_v<T, bool>)
    return v != 0;
  else
    return static_cast<T>(v);
}

// Elementwise map over nops operands: out = f(in...), typed.
template <typename Tout, typename Tin, int NIn, typename F> void mapKernel(const Loop &L, F f) {
  runLoop(L, [&](char **p, const std::int64_t *s, std::int64_t n) {
    auto *o = reinterpret_cast<Tout *>(p[0]);
    if constexpr (NIn == 1) {
      const auto *a = reinterpret_cast<const Tin *>(p[1]);
      if (s[0] == sizeof(Tout) && s[1] == sizeof(Tin)) {
        for (std::int64_t i = 0; i < n; ++i)
          o[i] = f(a[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i)
          *reinterpret_cast<Tout *>(p[0] + i * s[0]) =
              f(*reinterpret_cast<const Tin *>(p[1] + i * s[1]));
      }
    } else {
      const auto *a = reinterpret_cast<const Tin *>(p[1]);
      const auto *b = reinterpret_cast<const Tin *>(p[2]);
      if (s[0] == sizeof(Tout) && s[1] == sizeof(Tin) && s[2] == sizeof(Tin)) {
        for (std::int64_t i = 0; i < n; ++i)
          o[i] = f(a[i], b[i]);
      } else if (s[0] == sizeof(Tout) && s[1] == sizeof(Tin) && s[2] == 0) {
        const Tin bv = *b;
        for (std::int64_t i = 0; i < n; ++i)
          o[i] = f(a[i], bv);
      } else if (s[0] == sizeof(Tout) && s[1] == 0 && s[2] == sizeof(Tin)) {
        const Tin av = *a;
        for (std::int64_t i = 0; i < n; ++i)
          o[i] = f(av, b[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i)
          *reinterpret_cast<Tout *>(p[0] + i * s[0]) =
              f(*reinterpret_cast<const Tin *>(p[1] + i * s[1]),
                *reinterpret_cast<const Tin *>(p[2] + i * s[2]));
      }
    }
  });
}

// One element from S to D (16-bit floats and bool through float).
template <typename D, typename S> D convert(S v) {
  if constexpr (std::is_same_v<D, bool>) {
    return static_cast<float>(v) != 0.0f;
  } else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) {
    return D(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
    return static_cast<D>(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

// --- memory -----------------------------------------------------------------------------
// Blocks of 1 MiB and more are kept after free (rounded to 64 KiB, up to
// TT_CPU_CACHE_MB, default 1024) and handed out again for the same rounded
// size: a clone or temporary in a loop then reuses pages that are already
// mapped instead of faulting fresh ones in every time (the cost that makes a
// fresh 64 MiB clone several times slower than memcpy). Small blocks go
// straight to malloc, which caches them itself.
class BlockCache {
public:
  static constexpr std::size_t kMin = std::size_t(1) << 20;
  static std::size_t roundUp(std::size_t n) {
    return n < kMin ? (n + 63) / 64 * 64 : (n + 65535) / 65536 * 65536;
  }
  void *take(std::size_t rounded) {
    if (rounded < kMin)
      return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it == free_.end() || it->second.empty())
      return nullptr;
    void *p = it->second.back();
    it->second.pop_back();
    cached_ -= rounded;
    return p;
  }
  bool give(void *p, std::size_t rounded) {
    if (rounded < kMin)
      return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + rounded > limit()) {
      // Make room: drop other sizes first (oldest sizes are not tracked).
      for (auto it = free_.begin(); it != free_.end() && cached_ + rounded > limit(); ++it)
        while (!it->second.empty() && cached_ + rounded > limit()) {
          std::free(it->second.back());
          it->second.pop_back();
          cached_ -= it->first;
        }
      if (cached_ + rounded > limit())
        return false;
    }
    free_[rounded].push_back(p);
    cached_ += rounded;
    return true;
  }
  ~BlockCache() {
    for (auto &kv : free_)
      for (void *p : kv.second)
        std::free(p);
  }

private:
  static std::size_t limit() {
    static const std::size_t l = [] {
#if defined(__SANITIZE_ADDRESS__)
      return std::size_t(0); // let ASan see every use after free
#endif
      const char *e = std::getenv("TT_CPU_CACHE_MB");
      return (e ? static_cast<std::size_t>(std::strtoull(e, nullptr, 10)) : std::size_t(1024))
             << 20;
    }();
    return l;
  }
  std::mutex mu_;
  std::map<std::size_t, std::vector<void *>> free_;
  std::size_t cached_ = 0;
};

BlockCache &blockCache() {
  static BlockCache *c = new BlockCache(); // never destroyed: frees may run at exit
  return *c;
}

// Note [huge pages for large blocks]: a block of 2 MiB or more starts on a
// 2 MiB boundary and asks for transparent huge pages (LibTorch 2.x does the
// same under THP_MEM_ALLOC_ENABLE): fewer TLB misses. In paired runs
// against memcpy, clones of 4 and 256 MiB gained 3-10%; the elementwise ops
// showed no difference beyond the noise.
constexpr std::size_t kHugePage = std::size_t(2) << 20;
void *alignedBlock(std::size_t rounded) {
  const bool huge = rounded >= kHugePage;
  // posix_memalign, not aligned_alloc: the size need not be a multiple of
  // the alignment, so a block just over 2 MiB does not take 4 (its tail
  // stays on 4 KiB pages).
  void *p = nullptr;
  if (posix_memalign(&p, huge ? kHugePage : 64, rounded) != 0)
    throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (huge)
    madvise(p, rounded, MADV_HUGEPAGE); // advice only: failure leaves 4 KiB pages
#endif
  return p;
}

void *cpuAlloc(std::size_t nbytes) {
  if (nbytes == 0)
    return nullptr;
  std::size_t rounded = BlockCache::roundUp(nbytes);
  if (void *p = blockCache().take(rounded))
    return p;
  return alignedBlock(rounded);
}
void cpuFree(void *p, std::size_t nbytes) {
  if (!p)
    return;
  if (!blockCache().give(p, BlockCache::roundUp(nbytes)))
    std::free(p);
}
void cpuMemcpy(void *dst, const void *src, std::size_t n) {
  if (n)
    std::memcpy(dst, src, n);
}
void cpuSync() {}

// --- copy -------------------------------------------------------------------------------
// A copy whose destination and source are unit-strided in different dims:
// the two are tiled (LibTorch's scheme for 2-D, here for any rank), every
// other dim is iterated. Element (r, c) of a 2-D slice is at r * es + c *
// sCol in src (rows contiguous) and r * dRow + c * es in dst.
struct TransposePlan {
  std::int64_t rows = 0, cols = 0, dRow = 0, sCol = 0;
  Loop outer; // the other dims, byte strides of dst (0) and src (1)
};
constexpr std::int64_t kTile = 64;

// The plan for L (dst, src of element size es), or false when no dim pair fits.
bool planTranspose(const Loop &L, std::int64_t es, TransposePlan &P) {
  const int nd = L.ndim, in = nd - 1;
  if (nd < 2 || L.strides[0][in] != es || L.strides[1][in] == es)
    return false;
  int k = -1;
  for (int d = 0; d < in; ++d)
    if (L.strides[1][d] == es)
      k = d;
  if (k < 0 || L.sizes[k] < 8 || L.sizes[in] < 8) // thin tiles: the strided loop is as good
    return false;
  P.rows = L.sizes[k];
  P.cols = L.sizes[in];
  P.dRow = L.strides[0][k];
  P.sCol = L.strides[1][in];
  P.outer.nops = 2;
  for (int d = 0; d < in; ++d)
    if (d != k) {
      P.outer.sizes[P.outer.ndim] = L.sizes[d];
      P.outer.strides[0][P.outer.ndim] = L.strides[0][d];
      P.outer.strides[1][P.outer.ndim] = L.strides[1][d];
      P.outer.numel *= L.sizes[d];
      ++P.outer.ndim;
    }
  P.outer.base[0] = L.base[0];
  P.outer.base[1] = L.base[1];
  return true;
}

// One tile of at most kTile x kTile: src's columns into an L1-resident
// buffer, transposed there, its rows out, so every access to memory outside
// the buffer is contiguous.
template <typename T>
void transposeTile(char *dst, const char *src, std::int64_t nr, std::int64_t nc, std::int64_t dRow,
                   std::int64_t sCol, T *buf) {
  for (std::int64_t c = 0; c < nc; ++c)
    std::memcpy(buf + c * kTile, src + c * sCol, static_cast<std::size_t>(nr) * sizeof(T));
  for (std::int64_t r = 0; r < kTile; ++r)
    for (std::int64_t c = 0; c < r; ++c)
      std::swap(buf[r + kTile * c], buf[r * kTile + c]);
  for (std::int64_t r = 0; r < nr; ++r)
    std::memcpy(dst + r * dRow, buf + r * kTile, static_cast<std::size_t>(nc) * sizeof(T));
}

#ifdef __SSE2__
// A 4-byte tile straight from src, 4x4 blocks transposed in SSE registers
// (pure moves: bit-exact). Faster than the buffer when src's columns do not
// fall into the same cache sets (sCol not a multiple of 4 KiB).
void transposeTile4Direct(char *dst, const char *src, std::int64_t nr, std::int64_t nc,
                          std::int64_t dRow, std::int64_t sCol) {
  const std::int64_t r4 = nr & ~std::int64_t(3), c4 = nc & ~std::int64_t(3);
  auto at = [](const char *p) { return _mm_loadu_ps(reinterpret_cast<const float *>(p)); };
  for (std::int64_t r = 0; r < r4; r += 4)
    for (std::int64_t c = 0; c < c4; c += 4) {
      const char *s = src + r * 4 + c * sCol;
      __m128 a0 = at(s), a1 = at(s + sCol), a2 = at(s + 2 * sCol), a3 = at(s + 3 * sCol);
      _MM_TRANSPOSE4_PS(a0, a1, a2, a3);
      char *d = dst + r * dRow + c * 4;
      _mm_storeu_ps(reinterpret_cast<float *>(d), a0);
      _mm_storeu_ps(reinterpret_cast<float *>(d + dRow), a1);
      _mm_storeu_ps(reinterpret_cast<float *>(d + 2 * dRow), a2);
      _mm_storeu_ps(reinterpret_cast<float *>(d + 3 * dRow), a3);
    }
  for (std::int64_t r = 0; r < nr; ++r) // the edges
    for (std::int64_t c = r < r4 ? c4 : 0; c < nc; ++c)
      std::memcpy(dst + r * dRow + c * 4, src + r * 4 + c * sCol, 4);
}
#endif

// Every tile of P, split across threads; tile t is (outer index, row block,
// column block), column blocks innermost.
template <typename T> void transposeCopy(const TransposePlan &P) {
  const std::int64_t rb = (P.rows + kTile - 1) / kTile, cb = (P.cols + kTile - 1) / kTile;
  const std::int64_t es = sizeof(T);
  parallelItems(P.outer.numel * rb * cb, kTile * kTile, [&](std::int64_t t0, std::int64_t t1) {
    alignas(64) T buf[kTile * kTile];
    for (std::int64_t t = t0; t < t1; ++t) {
      std::int64_t o = t / (rb * cb), r = (t / cb) % rb * kTile, c = t % cb * kTile;
      std::int64_t dOff = 0, sOff = 0;
      for (int d = P.outer.ndim - 1; d >= 0; --d) {
        std::int64_t i = o % P.outer.sizes[d];
        o /= P.outer.sizes[d];
        dOff += i * P.outer.strides[0][d];
        sOff += i * P.outer.strides[1][d];
      }
      char *d = P.outer.base[0] + dOff + r * P.dRow + c * es;
      const char *s = P.outer.base[1] + sOff + r * es + c * P.sCol;
      const std::int64_t nr = std::min(kTile, P.rows - r), nc = std::min(kTile, P.cols - c);
#ifdef __SSE2__
      if (es == 4 && P.sCol % 4096 != 0) {
        transposeTile4Direct(d, s, nr, nc, P.dRow, P.sCol);
        continue;
      }
#endif
      transposeTile<T>(d, s, nr, nc, P.dRow, P.sCol, buf);
    }
  });
}

// Same-dtype copy of L through the tiled transpose; false when it does not apply.
bool tryTransposeCopy(const Loop &L, std::int64_t es) {
  TransposePlan P;
  if (!planTranspose(L, es, P))
    return false;
  // clang-format off
  switch (es) {
  case 1: transposeCopy<std::uint8_t>(P); return true;
  case 2: transposeCopy<std::uint16_t>(P); return true;
  case 4: transposeCopy<std::uint32_t>(P); return true;
  case 8: transposeCopy<std::uint64_t>(P); return true;
  default: return false;
  }
  // clang-format on
}

void cpuCopy(const TensorDesc &dst, const TensorDesc &src) {
  Loop L = makeLoop({&dst, &src});
  if (L.numel == 0)
    return;
  const std::int64_t es = static_cast<std::int64_t>(elementSize(dst.dtype));
  if (dst.dtype == src.dtype) {
    if (L.ndim <= 1 && (L.ndim == 0 || (L.strides[0][0] == es && L.strides[1][0] == es))) {
      std::size_t bytes = static_cast<std::size_t>(L.numel * es);
      char *d = L.base[0];
      const char *s = L.base[1];
      parallelFor(static_cast<std::int64_t>(bytes) / 4, [&](std::int64_t b, std::int64_t e) {
        std::int64_t lo = b * 4, hi = e == static_cast<std::int64_t>(bytes) / 4
                                          ? static_cast<std::int64_t>(bytes)
                                          : e * 4;
        std::memcpy(d + lo, s + lo, static_cast<std::size_t>(hi - lo));
      });
      if (bytes < 4)
        std::memcpy(d, s, bytes);
      return;
    }
    if (tryTransposeCopy(L, es))
      return;
  }
  dispatch(dst.dtype, [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch(src.dtype, [&](auto stag) {
      using S = typename decltype(stag)::type;
      mapKernel<D, S, 1>(L, [](S v) -> D { return convert<D>(v); });
    });
  });
}

void cpuFill(const TensorDesc &dst, ScalarValue v) {
  Loop L = makeLoop({&dst});
  dispatch(dst.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T val;
    if constexpr (std::is_same_v<T, bool>)
      val = v.d != 0;
    else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      val = T(static_cast<float>(v.d));
    else if constexpr (std::is_floating_point_v<T>)
      val = static_cast<T>(v.d);
    else
      val = static_cast<T>(v.i);
    runLoop(L, [&](char **p, const std::int64_t *s, std::int64_t n) {
      if (s[0] == sizeof(T)) {
        T *o = reinterpret_cast<T *>(p[0]);
        std::fill(o, o + n, val);
      } else {
        for (std::int64_t i = 0; i < n; ++i)
          *reinterpret_cast<T *>(p[0] + i * s[0]) = val;
      }
    });
  });
}

// --- unary / binary / compare / where -------------------------------------------------------
template <typename A> A sigmoidOf(A x) {
  if constexpr (std::is_floating_point_v<A>)
    return A(1) / (A(1) + std::exp(-x));
  else
    return x;
}

// The unary ops without parameters, through run(f); false for the others.
template <typename A, typename Run> bool runPlainUnary(UnaryOp op, Run run) {
  switch (op) {
  case UnaryOp::Neg:
    run([](A x) { return A(-x); });
    return true;
  case UnaryOp::Abs:
    run([](A x) { return x < A(0) ? A(-x) : x; });
    return true;
  case UnaryOp::Exp:
    run([](A x) { return A(std::exp(x)); });
    return true;
  case UnaryOp::Log:
    run([](A x) { return A(std::log(x)); });
    return true;
  case UnaryOp::Sqrt:
    run([](A x) { return A(std::sqrt(x)); });
    return true;
  case UnaryOp::Relu:
    run([](A x) { return x > A(0) || x != x ? x : A(0); }); // NaN stays NaN
    return true;
  case UnaryOp::Sigmoid:
    run([](A x) { return sigmoidOf(x); });
    return true;
  case UnaryOp::Tanh:
    run([](A x) { return A(std::tanh(x)); });
    return true;
  case UnaryOp::Reciprocal:
    run([](A x) { return A(A(1) / x); });
    return true;
  default:
    return false;
  }
}

template <typename A, typename Run> void runClamp(bool lo, A p0, bool hi, A p1, Run run) {
  run([=](A x) {
    if constexpr (std::is_floating_point_v<A>)
      if (std::isnan(x))
        return x;
    if (lo && x < p0)
      x = p0;
    if (hi && x > p1)
      x = p1;
    return x;
  });
}

// x ** p0 (d0: the exponent as given): squares exactly, integers by repeated products.
template <typename A, typename Run> void runPowScalar(double d0, A p0, Run run) {
  if constexpr (std::is_floating_point_v<A>) {
    if (d0 == 2.0)
      run([](A x) { return x * x; });
    else
      run([=](A x) { return A(std::pow(x, p0)); });
  } else {
    run([=](A x) {
      A r = 1;
      for (A e = p0; e > 0; --e)
        r *= x;
      return r;
    });
  }
}

void cpuUnary(UnaryOp op, const TensorDesc &out, const TensorDesc &in, const UnaryParams &pr) {
  Loop L = makeLoop({&out, &in});
  dispatch(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    auto run = [&](auto f) {
      mapKernel<T, T, 1>(L, [&](T x) -> T { return store<T>(f(static_cast<A>(x))); });
    };
    const A p0 = fromScalar<T>(pr.p0), p1 = fromScalar<T>(pr.p1);
    if (runPlainUnary<A>(op, run))
      return;
    if (op == UnaryOp::Clamp)
      runClamp(pr.has_p0, p0, pr.has_p1, p1, run);
    else if (op == UnaryOp::PowScalar)
      runPowScalar(pr.p0.d, p0, run);
    else if (op == UnaryOp::RPowScalar)
      run([=](A x) { return A(std::pow(p0, x)); });
  });
}

template <typename A> A ipow(A b, A e) {
  if constexpr (std::is_floating_point_v<A>) {
    return std::pow(b, e);
  } else {
    if (e < 0)
      return b == 1 ? 1 : (b == -1 ? (e % 2 ? -1 : 1) : 0);
    A r = 1;
    while (e) {
      if (e & 1)
        r *= b;
      b *= b;
      e >>= 1;
    }
    return r;
  }
}

// The size of CPU 0's cache at `level` (2, 3) as sysfs reports it, or 0.
std::int64_t sysfsCacheBytes(int level) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    long lvl = 0, kib = 0;
    std::FILE *f = std::fopen((dir + "/level").c_str(), "r");
    if (!f)
      return 0;
    bool ok = std::fscanf(f, "%ld", &lvl) == 1;
    std::fclose(f);
    if (!ok || lvl != level || !(f = std::fopen((dir + "/size").c_str(), "r")))
      continue;
    ok = std::fscanf(f, "%ldK", &kib) == 1;
    std::fclose(f);
    return ok ? static_cast<std::int64_t>(kib) << 10 : 0;
  }
  return 0;
}

// The size of CPU 0's cache at `level` (2, 3), or 0. Some VMs have no sysfs
// cache directories; glibc's sysconf then reads CPUID, where a hypervisor may
// give the whole socket's L3 (508 MiB on a 2-vCPU guest), so a size no core
// could draw on alone is dropped.
std::int64_t cacheBytes(int level) {
  if (const std::int64_t b = sysfsCacheBytes(level))
    return b;
#if defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
  const long b = sysconf(level == 2 ? _SC_LEVEL2_CACHE_SIZE : _SC_LEVEL3_CACHE_SIZE);
  if (b >= (256L << 10) && b <= (256L << 20))
    return b;
#endif
  return 0;
}

// When streaming stores pay (Note [streaming stores] in cpu_vec.h), measured:
// - one thread's share of the output is a third of the L3 or more: a core's
//   own traffic to the L3, doubled by write-allocate, is the limit;
// - or the operands do not fit in the L3 and the threads' L2s together: they
//   go to DRAM whatever the stores, and streaming saves the write-allocate
//   reads. Below that, several cores draw on the L3 faster than DRAM takes
//   streamed writes (two threads: a 16 MiB column broadcast 0.65x streamed).
// TT_CPU_STREAM_MIN_KB replaces the first bound and drops the second (0:
// stream every fresh output). An unknown L3 counts as 32 MiB (one Zen CCD,
// a large Intel slice): a smaller guess streams a two-thread 16 MiB
// broadcast, 0.83-0.90x LibTorch against 0.95-1.0x cached.
struct StreamBounds {
  std::int64_t minShare, l2, l3; // bytes
};
const StreamBounds &streamBounds() {
  static const StreamBounds b = [] {
    if (const char *e = std::getenv("TT_CPU_STREAM_MIN_KB"))
      return StreamBounds{std::strtoll(e, nullptr, 10) << 10, 0, INT64_MAX / 2};
    const std::int64_t known = cacheBytes(3), l3 = known > 0 ? known : std::int64_t(32) << 20;
    return StreamBounds{l3 / 3, cacheBytes(2), l3};
  }();
  return b;
}

// The bytes operand i of L touches (a broadcast operand's own size).
std::int64_t footprint(const Loop &L, int i, std::int64_t es) {
  std::int64_t n = es;
  for (int d = 0; d < L.ndim; ++d)
    if (L.strides[i][d] != 0)
      n *= L.sizes[d];
  return n;
}

// Streaming pays only for a fresh output: an in-place one is already in the cache.
vec::Store storeFor(const Loop &L, std::int64_t es) {
  if (L.base[0] == L.base[1] || L.base[0] == L.base[2])
    return vec::Store::Cached;
  const StreamBounds &b = streamBounds();
  const int threads = std::max(1, maxThreads());
  const std::int64_t out = L.numel * es;
  const std::int64_t all = out + footprint(L, 1, es) + footprint(L, 2, es);
  const bool stream = out / threads >= b.minShare || all > b.l3 + threads * b.l2;
  return stream ? vec::Store::Streaming : vec::Store::Cached;
}

// A 2-D L (inner runs contiguous or broadcast) through fn, rows split among the threads.
template <typename T> bool runVecRows(const Loop &L, vec::BinaryRowsFn<T> fn, T alpha) {
  if (!fn)
    return false;
  const std::int64_t es = sizeof(T), n = L.sizes[1];
  const std::int64_t sa = L.strides[1][1] / es, sb = L.strides[2][1] / es;
  parallelItems(L.sizes[0], n, [&](std::int64_t begin, std::int64_t end) {
    const vec::RowSteps r{end - begin, L.strides[0][0] / es, L.strides[1][0] / es,
                          L.strides[2][0] / es};
    fn(reinterpret_cast<T *>(L.base[0]) + begin * r.ro,
       reinterpret_cast<const T *>(L.base[1]) + begin * r.ra, sa,
       reinterpret_cast<const T *>(L.base[2]) + begin * r.rb, sb, alpha, n, r);
  });
  return true;
}

// Runs L through a loop of cpu_vec.h when every inner run is contiguous, or a
// broadcast scalar, in each operand; false otherwise.
template <typename T> bool runVecBinary(const Loop &L, BinaryOp op, bool unitAlpha, T alpha) {
  const std::int64_t es = sizeof(T);
  if (L.ndim == 0)
    return false;
  const std::int64_t s0 = L.strides[0][L.ndim - 1], s1 = L.strides[1][L.ndim - 1],
                     s2 = L.strides[2][L.ndim - 1];
  if (s0 != es || (s1 != es && s1 != 0) || (s2 != es && s2 != 0) || (s1 == 0 && s2 == 0))
    return false;
  const vec::Store store = storeFor(L, es);
  if (store == vec::Store::Cached && L.ndim == 2)
    return runVecRows<T>(L, vec::binaryRows<T>(op, unitAlpha), alpha);
  const vec::BinaryFn<T> fn = vec::binary<T>(op, unitAlpha, store);
  if (!fn)
    return false;
  auto inner = [&](char **p, const std::int64_t *, std::int64_t n) {
    fn(reinterpret_cast<T *>(p[0]), reinterpret_cast<const T *>(p[1]), s1 / es,
       reinterpret_cast<const T *>(p[2]), s2 / es, alpha, n);
  };
  if (store == vec::Store::Streaming)
    runLoop(L, inner, vec::streamFence);
  else
    runLoop(L, inner);
  return true;
}

void cpuBinary(BinaryOp op, const TensorDesc &out, const TensorDesc &a, const TensorDesc &b,
               ScalarValue alpha) {
  Loop L = makeLoop({&out, &a, &b});
  dispatch(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A al = fromScalar<T>(alpha);
    if constexpr (vec::kHasBinary<T>)
      if (runVecBinary<T>(L, op, al == A(1), al))
        return;
    auto run = [&](auto f) {
      mapKernel<T, T, 2>(
          L, [&](T x, T y) -> T { return store<T>(f(static_cast<A>(x), static_cast<A>(y))); });
    };
    switch (op) {
    case BinaryOp::Add:
      if (al == A(1))
        run([](A x, A y) { return A(x + y); });
      else
        run([=](A x, A y) { return A(x + al * y); });
      break;
    case BinaryOp::Sub:
      if (al == A(1))
        run([](A x, A y) { return A(x - y); });
      else
        run([=](A x, A y) { return A(x - al * y); });
      break;
    case BinaryOp::Mul:
      run([](A x, A y) { return A(x * y); });
      break;
    case BinaryOp::Div:
      if constexpr (std::is_floating_point_v<A>) {
        run([](A x, A y) { return A(x / y); });
      } else {
        run([](A x, A y) { // floor division of integers never reaches here with y == 0
          if (y == 0)
            return A(0);
          A q = x / y;
          if ((x % y != 0) && ((x < 0) != (y < 0)))
            --q;
          return q;
        });
      }
      break;
    case BinaryOp::Pow:
      run([](A x, A y) { return ipow(x, y); });
      break;
    case BinaryOp::Maximum:
      run([](A x, A y) { return x > y ? x : y; });
      break;
    case BinaryOp::Minimum:
      run([](A x, A y) { return x < y ? x : y; });
      break;
    }
  });
}

void cpuCompare(CompareOp op, const TensorDesc &out, const TensorDesc &a, const TensorDesc &b) {
  Loop L = makeLoop({&out, &a, &b});
  dispatch(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    auto run = [&](auto f) {
      mapKernel<bool, T, 2>(
          L, [&](T x, T y) -> bool { return f(static_cast<A>(x), static_cast<A>(y)); });
    };
    switch (op) {
    case CompareOp::Eq:
      run([](A x, A y) { return x == y; });
      break;
    case CompareOp::Ne:
      run([](A x, A y) { return x != y; });
      break;
    case CompareOp::Lt:
      run([](A x, A y) { return x < y; });
      break;
    case CompareOp::Le:
      run([](A x, A y) { return x <= y; });
      break;
    case CompareOp::Gt:
      run([](A x, A y) { return x > y; });
      break;
    case CompareOp::Ge:
      run([](A x, A y) { return x >= y; });
      break;
    }
  });
}

void cpuWhere(const TensorDesc &out, const TensorDesc &cond, const TensorDesc &a,
              const TensorDesc &b) {
  Loop L = makeLoop({&out, &cond, &a, &b});
  dispatch(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    runLoop(L, [&](char **p, const std::int64_t *s, std::int64_t n) {
      for (std::int64_t i = 0; i < n; ++i) {
        bool c = *reinterpret_cast<const bool *>(p[1] + i * s[1]);
        *reinterpret_cast<T *>(p[0] + i * s[0]) = c ? *reinterpret_cast<const T *>(p[2] + i * s[2])
                                                    : *reinterpret_cast<const T *>(p[3] + i * s[3]);
      }
    });
  });
}

// --- reductions -------------------------------------------------------------------------
template <typename T> struct RAcc {
  using type = std::conditional_t<std::is_floating_point_v<acc_t<T>>, double, std::int64_t>;
};

// The running result of one reduction (or of one chunk of it).
template <typename R> struct Partial {
  R v = 0;
  std::int64_t best = -1; // linear index in the reduced space (arg ops)
  bool nan = false;
};

bool isArgLike(ReduceOp op) { return op != ReduceOp::Sum && op != ReduceOp::Prod; }
bool isMaxLike(ReduceOp op) { return op == ReduceOp::Max || op == ReduceOp::ArgMax; }

// Folds v (at linear reduced index r) into acc: the first NaN wins, then the
// first strictly better value, like PyTorch.
template <typename R> inline void fold(ReduceOp op, Partial<R> &acc, R v, std::int64_t r) {
  bool vnan = false;
  if constexpr (std::is_floating_point_v<R>)
    vnan = std::isnan(v);
  if (acc.best < 0 || (!acc.nan && (vnan || (isMaxLike(op) ? v > acc.v : v < acc.v)))) {
    acc.v = v;
    acc.best = r;
    acc.nan = vnan;
  }
}

template <typename R> void combine(ReduceOp op, Partial<R> &acc, const Partial<R> &later) {
  if (op == ReduceOp::Sum)
    acc.v += later.v;
  else if (op == ReduceOp::Prod)
    acc.v *= later.v;
  else if (later.best >= 0)
    fold(op, acc, later.v, later.best);
}

// Reduced dims, coalesced in their original order (so linear indices stay
// row-major, as arg ops need).
struct RedDims {
  int n = 0;
  std::int64_t sizes[kMaxDims], strides[kMaxDims];
};

template <typename T, typename R>
Partial<R> reduceRange(ReduceOp op, const T *base, const RedDims &rd, std::int64_t begin,
                       std::int64_t end) {
  Partial<R> acc;
  acc.v = op == ReduceOp::Prod ? R(1) : R(0);
  if (begin >= end)
    return acc;
  const int nd = rd.n;
  std::int64_t idx[kMaxDims], rem = begin, off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % rd.sizes[d];
    rem /= rd.sizes[d];
    off += idx[d] * rd.strides[d];
  }
  const std::int64_t inner = rd.sizes[nd - 1], s = rd.strides[nd - 1];
  std::int64_t pos = begin;
  while (pos < end) {
    std::int64_t cnt = std::min(inner - idx[nd - 1], end - pos);
    const T *p = base + off;
    if (op == ReduceOp::Sum && std::is_same_v<T, float> && s == 1) {
      // Blocks of 1024 summed in 8 float lanes (vectorised), blocks in double:
      // fast and as accurate as PyTorch's cascade sum for these sizes.
      const float *f = reinterpret_cast<const float *>(p);
      std::int64_t i = 0;
      for (; i + 1024 <= cnt; i += 1024) {
        float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (std::int64_t j = 0; j < 1024; j += 8)
          for (int k = 0; k < 8; ++k)
            lane[k] += f[i + j + k];
        acc.v += static_cast<R>((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                 static_cast<R>((lane[4] + lane[5]) + (lane[6] + lane[7]));
      }
      for (; i < cnt; ++i)
        acc.v += static_cast<R>(f[i]);
    } else if (op == ReduceOp::Sum) {
      R a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      std::int64_t i = 0;
      if (s == 1) {
        for (; i + 4 <= cnt; i += 4) {
          a0 += static_cast<R>(static_cast<acc_t<T>>(p[i]));
          a1 += static_cast<R>(static_cast<acc_t<T>>(p[i + 1]));
          a2 += static_cast<R>(static_cast<acc_t<T>>(p[i + 2]));
          a3 += static_cast<R>(static_cast<acc_t<T>>(p[i + 3]));
        }
      }
      for (; i < cnt; ++i)
        a0 += static_cast<R>(static_cast<acc_t<T>>(p[i * s]));
      acc.v += (a0 + a1) + (a2 + a3);
    } else if (op == ReduceOp::Prod) {
      for (std::int64_t i = 0; i < cnt; ++i)
        acc.v *= static_cast<R>(static_cast<acc_t<T>>(p[i * s]));
    } else {
      for (std::int64_t i = 0; i < cnt; ++i)
        fold(op, acc, static_cast<R>(static_cast<acc_t<T>>(p[i * s])), pos + i);
    }
    pos += cnt;
    off += cnt * s;
    idx[nd - 1] += cnt;
    for (int d = nd - 1; d > 0 && idx[d] >= rd.sizes[d]; --d) {
      off -= idx[d] * rd.strides[d];
      idx[d] = 0;
      ++idx[d - 1];
      off += rd.strides[d - 1];
    }
  }
  return acc;
}

// The loop nest of a reduction: kept dims index the outputs, the reduced
// dims (coalesced) are walked for each output.
struct ReducePlan {
  std::vector<int> kept;
  RedDims rd;
  std::int64_t nout = 1, nred = 1;
};
ReducePlan planReduce(const TensorDesc &out, const TensorDesc &in) {
  ReducePlan P;
  RedDims &rd = P.rd;
  for (int d = 0; d < in.ndim; ++d) {
    if (out.sizes[d] != in.sizes[d]) {
      P.nred *= in.sizes[d];
      if (rd.n > 0 && rd.strides[rd.n - 1] == in.strides[d] * in.sizes[d]) {
        rd.sizes[rd.n - 1] *= in.sizes[d];
        rd.strides[rd.n - 1] = in.strides[d];
      } else {
        rd.sizes[rd.n] = in.sizes[d];
        rd.strides[rd.n] = in.strides[d];
        ++rd.n;
      }
    } else if (in.sizes[d] != 1) {
      P.kept.push_back(d);
      P.nout *= in.sizes[d];
    }
  }
  if (rd.n == 0) { // nothing reduced: a 1-element reduced space
    rd.sizes[0] = 1;
    rd.strides[0] = 0;
    rd.n = 1;
  }
  return P;
}

// Runs f(c) for c in [0, chunks) on `chunks` threads.
template <typename F> void parallelChunks(int chunks, F f) {
  if (chunks <= 1) {
    f(0);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel for num_threads(chunks) schedule(static)
#endif
  for (int c = 0; c < chunks; ++c)
    f(c);
}

// One reduction on dtype T (accumulating in R): three ways to split it.
template <typename T, typename R> class Reducer {
public:
  Reducer(ReduceOp op, const TensorDesc &out, const TensorDesc &in, const TensorDesc *indices,
          const ReducePlan &P)
      : op_(op), out_(out), in_(in), indices_(indices), P_(P),
        src_(static_cast<const T *>(in.data)) {}

  void run() {
    const int nt = maxThreads();
    const std::int64_t nout = P_.nout, nred = P_.nred;
    if (op_ == ReduceOp::Sum && !P_.kept.empty() && in_.strides[P_.kept.back()] == 1 &&
        P_.rd.strides[P_.rd.n - 1] != 1)
      sumRows(nout * nred >= 2 * kGrain ? nt : 1);
    else if (nout < nt && nred >= 2 * kGrain && nt > 1)
      splitEachReduction(nt);
    else
      perOutput(nout * nred >= 2 * kGrain && nout > 1 && nt > 1
                    ? static_cast<int>(std::min<std::int64_t>(nt, nout))
                    : 1);
  }

private:
  // Where output o's reduction starts in the input.
  const T *inBase(std::int64_t o) const {
    std::int64_t off = 0, rem = o;
    for (int k = static_cast<int>(P_.kept.size()) - 1; k >= 0; --k) {
      int d = P_.kept[k];
      off += (rem % in_.sizes[d]) * in_.strides[d];
      rem /= in_.sizes[d];
    }
    return src_ + off;
  }

  // Writes output o (and its index, for max/min with indices and arg ops).
  void store1(std::int64_t o, const Partial<R> &acc) const {
    std::int64_t outOff = 0, idxOff = 0, rem = o;
    for (int k = static_cast<int>(P_.kept.size()) - 1; k >= 0; --k) {
      int d = P_.kept[k];
      std::int64_t i = rem % in_.sizes[d];
      rem /= in_.sizes[d];
      outOff += i * out_.strides[d];
      if (indices_)
        idxOff += i * indices_->strides[d];
    }
    if (op_ == ReduceOp::ArgMax || op_ == ReduceOp::ArgMin) {
      static_cast<std::int64_t *>(out_.data)[outOff] = std::max<std::int64_t>(acc.best, 0);
      return;
    }
    static_cast<T *>(out_.data)[outOff] = store<T>(static_cast<acc_t<T>>(acc.v));
    if (indices_)
      static_cast<std::int64_t *>(indices_->data)[idxOff] = std::max<std::int64_t>(acc.best, 0);
  }

  // Sum over outer dims of rows contiguous in the innermost kept dim: whole
  // rows are added into a row of accumulators (contiguous, vectorised)
  // instead of walking each output's column. Split by rows, or by columns
  // when there are fewer rows than threads.
  void sumRows(int chunks) const {
    const std::int64_t width = in_.sizes[P_.kept.back()], nrow = P_.nout / width;
    if (chunks <= 1 || nrow >= chunks)
      parallelChunks(chunks,
                     [&](int c) { rows(nrow * c / chunks, nrow * (c + 1) / chunks, 0, width); });
    else
      parallelChunks(chunks,
                     [&](int c) { rows(0, nrow, width * c / chunks, width * (c + 1) / chunks); });
  }
  void rows(std::int64_t rb, std::int64_t re, std::int64_t jb, std::int64_t je) const {
    const RedDims &rd = P_.rd;
    const std::int64_t width = in_.sizes[P_.kept.back()];
    std::vector<R> acc(static_cast<std::size_t>(je - jb));
    for (std::int64_t row = rb; row < re; ++row) {
      std::fill(acc.begin(), acc.end(), R(0));
      const T *base = inBase(row * width) + jb;
      std::int64_t idx[kMaxDims] = {}, off = 0;
      for (std::int64_t r = 0; r < P_.nred; ++r) {
        const T *p = base + off;
        for (std::int64_t j = 0; j < je - jb; ++j)
          acc[j] += static_cast<R>(static_cast<acc_t<T>>(p[j]));
        for (int d = rd.n - 1; d >= 0; --d) {
          off += rd.strides[d];
          if (++idx[d] < rd.sizes[d])
            break;
          off -= idx[d] * rd.strides[d];
          idx[d] = 0;
        }
      }
      for (std::int64_t j = jb; j < je; ++j) {
        Partial<R> part;
        part.v = acc[j - jb];
        store1(row * width + j, part);
      }
    }
  }

  // The common case: each thread reduces whole outputs.
  void perOutput(int chunks) const {
    parallelChunks(chunks, [&](int c) {
      for (std::int64_t o = P_.nout * c / chunks; o < P_.nout * (c + 1) / chunks; ++o)
        store1(o, reduceRange<T, R>(op_, inBase(o), P_.rd, 0, P_.nred));
    });
  }

  // Few outputs, long reductions: each reduction split across the threads.
  void splitEachReduction(int nt) const {
    for (std::int64_t o = 0; o < P_.nout; ++o) {
      std::vector<Partial<R>> parts(static_cast<std::size_t>(nt));
      const T *base = inBase(o);
      parallelChunks(nt, [&](int c) {
        parts[c] = reduceRange<T, R>(op_, base, P_.rd, P_.nred * c / nt, P_.nred * (c + 1) / nt);
      });
      Partial<R> acc = parts[0];
      for (int c = 1; c < nt; ++c)
        combine(op_, acc, parts[c]);
      store1(o, acc);
    }
  }

  ReduceOp op_;
  const TensorDesc &out_, &in_;
  const TensorDesc *indices_;
  const ReducePlan &P_;
  const T *src_;
};

void cpuReduce(ReduceOp op, const TensorDesc &out, const TensorDesc &in,
               const TensorDesc *indices) {
  const ReducePlan P = planReduce(out, in);
  dispatch(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    Reducer<T, typename RAcc<T>::type>(op, out, in, indices, P).run();
  });
}

// --- matmul ------------------------------------------------------------------------------
// One [M,K] operand as BLAS sees it: transposed or not, leading dimension.
bool blasLayout(std::int64_t rows, std::int64_t cols, std::int64_t s0, std::int64_t s1,
                CBLAS_TRANSPOSE &tr, std::int64_t &ld) {
  if (s1 == 1 && s0 >= std::max<std::int64_t>(1, cols)) {
    tr = CblasNoTrans;
    ld = s0;
    return true;
  }
  if (s0 == 1 && s1 >= std::max<std::int64_t>(1, rows)) {
    tr = CblasTrans;
    ld = s1;
    return true;
  }
  if (rows == 1 && s1 == 1) {
    tr = CblasNoTrans;
    ld = std::max<std::int64_t>(1, cols);
    return true;
  }
  if (cols == 1 && s0 == 1) {
    tr = CblasTrans;
    ld = std::max<std::int64_t>(1, rows);
    return true;
  }
  return false;
}

template <typename T>
void gemmBlas(std::int64_t M, std::int64_t N, std::int64_t K, const T *a, std::int64_t sa0,
              std::int64_t sa1, const T *b, std::int64_t sb0, std::int64_t sb1, T *c,
              std::int64_t sc0, std::int64_t sc1) {
  CBLAS_TRANSPOSE ta, tb;
  std::int64_t lda, ldb;
  std::vector<T> ta_buf, tb_buf, tc_buf;
  // An operand BLAS cannot address (neither dim unit-strided) is packed dense.
  auto operand = [](std::int64_t rows, std::int64_t cols, const T *&p, std::int64_t s0,
                    std::int64_t s1, CBLAS_TRANSPOSE &trans, std::int64_t &ld,
                    std::vector<T> &buf) {
    if (blasLayout(rows, cols, s0, s1, trans, ld))
      return;
    buf.resize(static_cast<std::size_t>(rows * cols));
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j)
        buf[i * cols + j] = p[i * s0 + j * s1];
    p = buf.data();
    trans = CblasNoTrans;
    ld = std::max<std::int64_t>(1, cols);
  };
  operand(M, K, a, sa0, sa1, ta, lda, ta_buf);
  operand(K, N, b, sb0, sb1, tb, ldb, tb_buf);
  bool direct = sc1 == 1 && sc0 >= std::max<std::int64_t>(1, N);
  T *cc = c;
  std::int64_t ldc = sc0;
  if (!direct) {
    tc_buf.resize(static_cast<std::size_t>(M * N));
    cc = tc_buf.data();
    ldc = std::max<std::int64_t>(1, N);
  }
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, ta, tb, int(M), int(N), int(K), 1.0f, a, int(lda), b, int(ldb), 0.0f,
                cc, int(ldc));
  else
    cblas_dgemm(CblasRowMajor, ta, tb, int(M), int(N), int(K), 1.0, a, int(lda), b, int(ldb), 0.0,
                cc, int(ldc));
  if (!direct)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j)
        c[i * sc0 + j * sc1] = tc_buf[i * N + j];
}

void cpuMatmul(const TensorDesc &out, const TensorDesc &a, const TensorDesc &b) {
  const std::int64_t B = out.sizes[0], M = out.sizes[1], N = out.sizes[2], K = a.sizes[2];
  dispatch(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T *c = static_cast<T *>(out.data);
    const T *pa = static_cast<const T *>(a.data);
    const T *pb = static_cast<const T *>(b.data);
    for (std::int64_t bi = 0; bi < B; ++bi) {
      T *cb = c + bi * out.strides[0];
      const T *ab = pa + bi * a.strides[0];
      const T *bb = pb + bi * b.strides[0];
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        if (M == 0 || N == 0)
          continue;
        if (K == 0) {
          for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j)
              cb[i * out.strides[1] + j * out.strides[2]] = T(0);
          continue;
        }
        gemmBlas<T>(M, N, K, ab, a.strides[1], a.strides[2], bb, b.strides[1], b.strides[2], cb,
                    out.strides[1], out.strides[2]);
      } else {
        using A = typename RAcc<T>::type;
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            A acc = 0;
            for (std::int64_t k = 0; k < K; ++k)
              acc +=
                  static_cast<A>(static_cast<acc_t<T>>(ab[i * a.strides[1] + k * a.strides[2]])) *
                  static_cast<A>(static_cast<acc_t<T>>(bb[k * b.strides[1] + j * b.strides[2]]));
            cb[i * out.strides[1] + j * out.strides[2]] = store<T>(static_cast<acc_t<T>>(acc));
          }
      }
    }
  });
}

const Backend kCpuBackend = {
    "cpu",   kCPU,    cpuAlloc, cpuFree,   cpuMemcpy,  cpuMemcpy, cpuMemcpy, cpuSync,
    cpuCopy, cpuFill, cpuUnary, cpuBinary, cpuCompare, cpuWhere,  cpuReduce, cpuMatmul,
};

const Backend *g_backends[2] = {&kCpuBackend, nullptr};

} // namespace

const Backend &cpuBackend() { return kCpuBackend; }

} // namespace tt::backend

namespace tt {
void set_num_threads(int n) {
  if (n < 1)
    fail("set_num_threads expects a positive integer");
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  openblas_set_num_threads(n);
}
int get_num_threads() { return backend::maxThreads(); }
} // namespace tt

namespace tt::backend {

const Backend &get(DeviceType device) {
  const Backend *b = g_backends[static_cast<int>(device)];
  if (!b)
    fail(std::string("Could not run this operator with arguments from the '") +
         (device == kCUDA ? "CUDA" : "CPU") +
         "' backend: this build of the tt runtime has no CUDA backend (Torch not compiled with "
         "CUDA enabled)");
  return *b;
}

bool available(DeviceType device) { return g_backends[static_cast<int>(device)] != nullptr; }

void registerBackend(DeviceType device, const Backend *b) {
  g_backends[static_cast<int>(device)] = b;
}

} // namespace tt::backend
