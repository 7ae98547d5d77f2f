// The multiversioned elementwise loops of cpu_vec.h. Each is one simple loop
// the compiler vectorises; target_clones compiles it for AVX-512, AVX2 and the
// baseline (SSE2 on x86-64) and the dynamic linker picks the best the CPU has.
// Clang does not multiversion templates, hence the macro over plain functions.
//
// The streaming variants (Note [streaming stores] in cpu_vec.h) cannot be
// clones: each ISA has its own non-temporal store instruction. They are
// stamped out once per ISA with the target attribute and picked once by
// __builtin_cpu_supports; the op itself is the same scalar lambda, applied to
// one vector's worth of elements that the compiler turns into one vector op.
#include "cpu_vec.h"

#include <cstring>

#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__))
#define TT_VEC_X86 1
#include <immintrin.h>
#define TT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TT_VEC_X86 0
#define TT_CLONES
#endif
#define TT_INLINE inline __attribute__((always_inline))

namespace tt::backend::vec {
namespace {

// Inlined into every clone, so each gets the body compiled for its ISA.
template <typename T, typename Op>
TT_INLINE void binaryBody(T *o, const T *a, std::int64_t sa, const T *b, std::int64_t sb, T alpha,
                          std::int64_t n, Op op) {
  if (sa && sb) {
    for (std::int64_t i = 0; i < n; ++i)
      o[i] = op(a[i], b[i], alpha);
  } else if (sa) {
    const T y = *b;
    for (std::int64_t i = 0; i < n; ++i)
      o[i] = op(a[i], y, alpha);
  } else {
    const T x = *a;
    for (std::int64_t i = 0; i < n; ++i)
      o[i] = op(x, b[i], alpha);
  }
}

#if TT_VEC_X86
// One non-temporal store of Bytes from `from` to the Bytes-aligned `to`, per
// ISA. Vectors cross only pointers: Clang rejects a 512-bit vector argument to
// a function compiled without AVX-512, even an always_inline one.
__attribute__((target("avx512f"))) TT_INLINE void streamStore64(void *to, const void *from) {
  __m512i v;
  std::memcpy(&v, from, sizeof v);
  _mm512_stream_si512(static_cast<__m512i *>(to), v);
}
__attribute__((target("avx2"))) TT_INLINE void streamStore32(void *to, const void *from) {
  __m256i v;
  std::memcpy(&v, from, sizeof v);
  _mm256_stream_si256(static_cast<__m256i *>(to), v);
}
TT_INLINE void streamStore16(void *to, const void *from) {
  __m128i v;
  std::memcpy(&v, from, sizeof v);
  _mm_stream_si128(static_cast<__m128i *>(to), v);
}

// The streaming loop of op NAME on T for one ISA: o[i] = a[i * sa] (op) b[i * sb],
// a scalar head up to the first BYTES-aligned output element, then whole
// vectors (GCC vector extensions: EXPR is the same expression on vectors, with
// al a scalar), then a scalar tail. A macro, not a template: the vector code
// must sit in the function that carries the target attribute (see above).
#define TT_VEC_STREAM(NAME, T, EXPR, TARGET, BYTES)                                                \
  TARGET void NAME##Stream##BYTES(T *o, const T *a, std::int64_t sa, const T *b, std::int64_t sb,  \
                                  T al, std::int64_t n) {                                          \
    typedef T V __attribute__((vector_size(BYTES)));                                               \
    constexpr std::int64_t kLanes = BYTES / static_cast<std::int64_t>(sizeof(T));                  \
    std::int64_t i = 0;                                                                            \
    for (; i < n && reinterpret_cast<std::uintptr_t>(o + i) % BYTES != 0; ++i)                     \
      o[i] = NAME##Op(a[i * sa], b[i * sb], al);                                                   \
    V xs, ys; /* the broadcast operand's value in every lane */                                    \
    for (std::int64_t k = 0; k < kLanes; ++k)                                                      \
      xs[k] = a[0], ys[k] = b[0];                                                                  \
    for (; i + kLanes <= n; i += kLanes) {                                                         \
      V x = xs, y = ys;                                                                            \
      if (sa)                                                                                      \
        std::memcpy(&x, a + i, BYTES);                                                             \
      if (sb)                                                                                      \
        std::memcpy(&y, b + i, BYTES);                                                             \
      const V r = EXPR;                                                                            \
      streamStore##BYTES(o + i, &r);                                                               \
    }                                                                                              \
    for (; i < n; ++i)                                                                             \
      o[i] = NAME##Op(a[i * sa], b[i * sb], al);                                                   \
  }
#define TT_VEC_STREAMS(NAME, T, EXPR)                                                              \
  TT_VEC_STREAM(NAME, T, EXPR, __attribute__((target("avx512f"))), 64)                             \
  TT_VEC_STREAM(NAME, T, EXPR, __attribute__((target("avx2"))), 32)                                \
  TT_VEC_STREAM(NAME, T, EXPR, , 16)
#define TT_STREAM_FNS(NAME) {NAME##Stream64, NAME##Stream32, NAME##Stream16}
#else
#define TT_VEC_STREAMS(NAME, T, EXPR)
#define TT_STREAM_FNS(NAME) {nullptr, nullptr, nullptr}
#endif

// One op on one dtype: the scalar op, its cached-store clones and its streaming loops.
#define TT_VEC_BINARY(NAME, T, EXPR)                                                               \
  TT_INLINE T NAME##Op(T x, T y, T al) {                                                           \
    (void)al;                                                                                      \
    return static_cast<T>(EXPR);                                                                   \
  }                                                                                                \
  TT_CLONES void NAME(T *o, const T *a, std::int64_t sa, const T *b, std::int64_t sb, T alpha,     \
                      std::int64_t n) {                                                            \
    binaryBody(o, a, sa, b, sb, alpha, n, NAME##Op);                                               \
  }                                                                                                \
  TT_CLONES void NAME##Rows(T *o, const T *a, std::int64_t sa, const T *b, std::int64_t sb,        \
                            T alpha, std::int64_t n, const RowSteps &r) {                          \
    for (std::int64_t i = 0; i < r.rows; ++i)                                                      \
      binaryBody(o + i * r.ro, a + i * r.ra, sa, b + i * r.rb, sb, alpha, n, NAME##Op);            \
  }                                                                                                \
  TT_VEC_STREAMS(NAME, T, EXPR)
#define TT_VEC_BINARY_ALL(SUFFIX, T)                                                               \
  TT_VEC_BINARY(add##SUFFIX, T, x + y)                                                             \
  TT_VEC_BINARY(addAlpha##SUFFIX, T, x + al * y)                                                   \
  TT_VEC_BINARY(sub##SUFFIX, T, x - y)                                                             \
  TT_VEC_BINARY(subAlpha##SUFFIX, T, x - al * y)                                                   \
  TT_VEC_BINARY(mul##SUFFIX, T, x *y)

TT_VEC_BINARY_ALL(F32, float)
TT_VEC_BINARY_ALL(F64, double)
TT_VEC_BINARY_ALL(I32, std::int32_t)
TT_VEC_BINARY_ALL(I64, std::int64_t)
TT_VEC_BINARY(divF32, float, x / y)
TT_VEC_BINARY(divF64, double, x / y)

// One op's loops: the clones, then the streaming loop per ISA (widest first).
template <typename T> struct Fns {
  BinaryFn<T> cached;
  BinaryRowsFn<T> rows;
  BinaryFn<T> stream[3];
};
#define TT_FNS(NAME) {NAME, NAME##Rows, TT_STREAM_FNS(NAME)}

// The table row of one dtype: add, add with alpha, sub, sub with alpha, mul, div.
template <typename T> struct Row {
  Fns<T> fns[6];
};
// add, add with alpha, sub, sub with alpha, mul of the dtype with suffix S.
#define TT_ROW_FNS(S)                                                                              \
  TT_FNS(add##S), TT_FNS(addAlpha##S), TT_FNS(sub##S), TT_FNS(subAlpha##S), TT_FNS(mul##S)
template <typename T> Row<T> row();
template <> Row<float> row() { return {{TT_ROW_FNS(F32), TT_FNS(divF32)}}; }
template <> Row<double> row() { return {{TT_ROW_FNS(F64), TT_FNS(divF64)}}; }
template <> Row<std::int32_t> row() { return {{TT_ROW_FNS(I32), {}}}; }
template <> Row<std::int64_t> row() { return {{TT_ROW_FNS(I64), {}}}; }

template <typename T> const Fns<T> *find(BinaryOp op, bool unitAlpha) {
  static const Row<T> r = row<T>();
  switch (op) {
  case BinaryOp::Add:
    return &r.fns[unitAlpha ? 0 : 1];
  case BinaryOp::Sub:
    return &r.fns[unitAlpha ? 2 : 3];
  case BinaryOp::Mul:
    return &r.fns[4];
  case BinaryOp::Div:
    return &r.fns[5];
  default:
    return nullptr;
  }
}

// Index into Fns::stream of the widest streaming store the CPU has.
int streamIsa() {
#if TT_VEC_X86
  static const int isa = __builtin_cpu_supports("avx512f") ? 0
                         : __builtin_cpu_supports("avx2")  ? 1
                                                           : 2;
  return isa;
#else
  return 0;
#endif
}

} // namespace

template <typename T> BinaryFn<T> binary(BinaryOp op, bool unitAlpha, Store store) {
  const Fns<T> *f = find<T>(op, unitAlpha);
  if (!f)
    return nullptr;
  const BinaryFn<T> streaming = f->stream[streamIsa()]; // nullptr off x86-64
  return store == Store::Streaming && streaming ? streaming : f->cached;
}

template <typename T> BinaryRowsFn<T> binaryRows(BinaryOp op, bool unitAlpha) {
  const Fns<T> *f = find<T>(op, unitAlpha);
  return f ? f->rows : nullptr;
}

#define TT_VEC_INSTANTIATE(T)                                                                      \
  template BinaryFn<T> binary<T>(BinaryOp, bool, Store);                                           \
  template BinaryRowsFn<T> binaryRows<T>(BinaryOp, bool);
TT_VEC_INSTANTIATE(float)
TT_VEC_INSTANTIATE(double)
TT_VEC_INSTANTIATE(std::int32_t)
TT_VEC_INSTANTIATE(std::int64_t)

void streamFence() {
#if TT_VEC_X86
  _mm_sfence();
#endif
}

} // namespace tt::backend::vec
