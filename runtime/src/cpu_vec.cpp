// The multiversioned elementwise loops of cpu_vec.h. Each is one simple loop
// the compiler vectorises; target_clones compiles it for AVX-512, AVX2 and the
// baseline (SSE2 on x86-64) and the dynamic linker picks the best the CPU has.
// Clang does not multiversion templates, hence the macro over plain functions.
#include "cpu_vec.h"

#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__))
#define TT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TT_CLONES
#endif

namespace tt::backend::vec {
namespace {

// Inlined into every clone, so each gets the body compiled for its ISA.
template <typename T, typename Op>
inline __attribute__((always_inline)) void binaryBody(T *o, const T *a, std::int64_t sa, const T *b,
                                                      std::int64_t sb, T alpha, std::int64_t n,
                                                      Op op) {
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

#define TT_VEC_BINARY(NAME, T, EXPR)                                                               \
  TT_CLONES void NAME(T *o, const T *a, std::int64_t sa, const T *b, std::int64_t sb, T alpha,     \
                      std::int64_t n) {                                                            \
    binaryBody(o, a, sa, b, sb, alpha, n, [](T x, T y, T al) {                                     \
      (void)al;                                                                                    \
      return static_cast<T>(EXPR);                                                                 \
    });                                                                                            \
  }
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

// The table row of one dtype: add, add with alpha, sub, sub with alpha, mul, div.
template <typename T> struct Row {
  BinaryFn<T> fns[6];
};
template <typename T> Row<T> row();
template <> Row<float> row() {
  return {{addF32, addAlphaF32, subF32, subAlphaF32, mulF32, divF32}};
}
template <> Row<double> row() {
  return {{addF64, addAlphaF64, subF64, subAlphaF64, mulF64, divF64}};
}
template <> Row<std::int32_t> row() {
  return {{addI32, addAlphaI32, subI32, subAlphaI32, mulI32, nullptr}};
}
template <> Row<std::int64_t> row() {
  return {{addI64, addAlphaI64, subI64, subAlphaI64, mulI64, nullptr}};
}

} // namespace

template <typename T> BinaryFn<T> binary(BinaryOp op, bool unitAlpha) {
  const Row<T> r = row<T>();
  switch (op) {
  case BinaryOp::Add:
    return r.fns[unitAlpha ? 0 : 1];
  case BinaryOp::Sub:
    return r.fns[unitAlpha ? 2 : 3];
  case BinaryOp::Mul:
    return r.fns[4];
  case BinaryOp::Div:
    return r.fns[5];
  default:
    return nullptr;
  }
}

template BinaryFn<float> binary<float>(BinaryOp, bool);
template BinaryFn<double> binary<double>(BinaryOp, bool);
template BinaryFn<std::int32_t> binary<std::int32_t>(BinaryOp, bool);
template BinaryFn<std::int64_t> binary<std::int64_t>(BinaryOp, bool);

} // namespace tt::backend::vec
