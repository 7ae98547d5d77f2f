// The per-element math of the elementwise and reduction kernels, callable
// from host code too so that the unit tests check it without a GPU (NaN
// propagation, integer division and powers, extremum ties).
#pragma once

#include "cuda_ops.h"

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <type_traits>

namespace tt::cudaops {

template <typename Acc> struct Params {
  int op;
  Acc a, b, alpha;
  bool hasA, hasB;
};

template <typename Acc> __host__ __device__ __forceinline__ bool isNan(Acc x) {
  if constexpr (std::is_floating_point_v<Acc>)
    return x != x;
  else
    return false;
}

// Integer power by squaring; negative exponents give 0 except for bases +-1.
__host__ __device__ __forceinline__ long long ipow(long long base, long long e) {
  if (e < 0)
    return base == 1 ? 1 : (base == -1 ? ((e & 1) ? -1 : 1) : 0);
  long long r = 1;
  while (e) {
    if (e & 1)
      r *= base;
    base *= base;
    e >>= 1;
  }
  return r;
}

template <typename Acc> __host__ __device__ __forceinline__ Acc fpow(Acc x, Acc y) {
  if constexpr (std::is_integral_v<Acc>)
    return ipow(x, y);
  else
    return pow(x, y);
}

// Transcendental ops on an integral compute type do not happen (the runtime
// promotes to Float first); route them through double so the code compiles.
template <typename Acc> __host__ __device__ __forceinline__ Acc fexp(Acc x) {
  if constexpr (std::is_integral_v<Acc>) return static_cast<Acc>(exp(double(x)));
  else return exp(x);
}
template <typename Acc> __host__ __device__ __forceinline__ Acc flog(Acc x) {
  if constexpr (std::is_integral_v<Acc>) return static_cast<Acc>(log(double(x)));
  else return log(x);
}
template <typename Acc> __host__ __device__ __forceinline__ Acc fsqrt(Acc x) {
  if constexpr (std::is_integral_v<Acc>) return static_cast<Acc>(sqrt(double(x)));
  else return sqrt(x);
}
template <typename Acc> __host__ __device__ __forceinline__ Acc ftanh(Acc x) {
  if constexpr (std::is_integral_v<Acc>) return static_cast<Acc>(tanh(double(x)));
  else return tanh(x);
}

template <typename Acc> __host__ __device__ __forceinline__ Acc maxNan(Acc x, Acc y) {
  return isNan(x) ? x : (isNan(y) ? y : (x > y ? x : y));
}
template <typename Acc> __host__ __device__ __forceinline__ Acc minNan(Acc x, Acc y) {
  return isNan(x) ? x : (isNan(y) ? y : (x < y ? x : y));
}

template <typename Acc>
__host__ __device__ __forceinline__ Acc applyUnary(const Params<Acc> &p, Acc x) {
  switch (static_cast<UnaryOp>(p.op)) {
  case UnaryOp::Neg: return -x;
  case UnaryOp::Abs: return x < Acc(0) ? -x : x;
  case UnaryOp::Exp: return fexp(x);
  case UnaryOp::Log: return flog(x);
  case UnaryOp::Sqrt: return fsqrt(x);
  case UnaryOp::Relu: return isNan(x) ? x : (x > Acc(0) ? x : Acc(0));
  case UnaryOp::Sigmoid: return Acc(1) / (Acc(1) + fexp(-x));
  case UnaryOp::Tanh: return ftanh(x);
  case UnaryOp::Clamp: {
    if (isNan(x))
      return x;
    Acc r = x;
    if (p.hasA)
      r = maxNan(r, p.a);
    if (p.hasB)
      r = minNan(r, p.b);
    return r;
  }
  case UnaryOp::PowScalar: return fpow(x, p.a);
  case UnaryOp::RPowScalar: return fpow(p.a, x);
  case UnaryOp::Reciprocal: return Acc(1) / x;
  case UnaryOp::Identity: return x;
  }
  return x;
}

template <typename Acc>
__host__ __device__ __forceinline__ Acc applyBinary(const Params<Acc> &p, Acc x, Acc y) {
  switch (static_cast<BinaryOp>(p.op)) {
  case BinaryOp::Add: return x + p.alpha * y;
  case BinaryOp::Sub: return x - p.alpha * y;
  case BinaryOp::Mul: return x * y;
  case BinaryOp::Div:
    if constexpr (std::is_integral_v<Acc>) { // floors, as the CPU backend; no trap on 0
      if (y == 0)
        return Acc(0);
      const Acc q = x / y;
      return (x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q;
    } else
      return x / y;
  case BinaryOp::Pow: return fpow(x, y);
  case BinaryOp::Maximum: return maxNan(x, y);
  case BinaryOp::Minimum: return minNan(x, y);
  case BinaryOp::Eq: return Acc(x == y);
  case BinaryOp::Ne: return Acc(x != y);
  case BinaryOp::Lt: return Acc(x < y);
  case BinaryOp::Le: return Acc(x <= y);
  case BinaryOp::Gt: return Acc(x > y);
  case BinaryOp::Ge: return Acc(x >= y);
  }
  return x;
}

template <typename Acc> struct Pair {
  Acc v;
  long long i;
};

__host__ __device__ inline bool isExtremum(ReduceOp op) {
  return op != ReduceOp::Sum && op != ReduceOp::Mean && op != ReduceOp::Prod;
}
__host__ __device__ inline bool isMaxLike(ReduceOp op) { return op == ReduceOp::Max || op == ReduceOp::Argmax; }

template <typename Acc> __host__ __device__ __forceinline__ bool nanOf(Acc x) {
  if constexpr (std::is_floating_point_v<Acc>)
    return x != x;
  else
    return false;
}

template <typename Acc> __host__ __device__ __forceinline__ Pair<Acc> identity(ReduceOp op) {
  if (!isExtremum(op))
    return {op == ReduceOp::Prod ? Acc(1) : Acc(0), -1};
  if constexpr (std::is_floating_point_v<Acc>)
    return {isMaxLike(op) ? -INFINITY : INFINITY, -1};
  else
    return {isMaxLike(op) ? Acc(LLONG_MIN) : Acc(LLONG_MAX), -1};
}

// Combines two partial results. Extrema: NaN wins, then the larger (smaller)
// value, then the smaller index, so the first extremum is reported.
template <typename Acc>
__host__ __device__ __forceinline__ Pair<Acc> combine(ReduceOp op, Pair<Acc> a, Pair<Acc> b) {
  if (!isExtremum(op))
    return {op == ReduceOp::Prod ? a.v * b.v : a.v + b.v, -1};
  if (b.i < 0)
    return a;
  if (a.i < 0)
    return b;
  const bool an = nanOf(a.v), bn = nanOf(b.v);
  if (an || bn) {
    if (an && bn)
      return a.i <= b.i ? a : b;
    return an ? a : b;
  }
  if (a.v == b.v)
    return a.i <= b.i ? a : b;
  const bool bWins = isMaxLike(op) ? b.v > a.v : b.v < a.v;
  return bWins ? b : a;
}

} // namespace tt::cudaops
