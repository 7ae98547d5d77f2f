// Contiguous elementwise loops compiled for several ISAs and picked at run
// time (GCC/Clang function multiversioning: target_clones, resolved once per
// function through an ifunc). See docs/runtime/backends.md.
#pragma once

#include "backend.h"

#include <cstdint>
#include <type_traits>

namespace tt::backend::vec {

// out[i] = a[i * sa] (op) b[i * sb], sa and sb 0 (a broadcast scalar) or 1;
// Add/Sub scale b by alpha.
template <typename T>
using BinaryFn = void (*)(T *out, const T *a, std::int64_t sa, const T *b, std::int64_t sb, T alpha,
                          std::int64_t n);

// The same loop over `rows` runs of n elements, run r starting r * ro, r * ra
// and r * rb elements in: a 2-D broadcast in one call, with no call and no
// offset arithmetic per row.
struct RowSteps {
  std::int64_t rows, ro, ra, rb;
};
template <typename T>
using BinaryRowsFn = void (*)(T *out, const T *a, std::int64_t sa, const T *b, std::int64_t sb,
                              T alpha, std::int64_t n, const RowSteps &r);

template <typename T>
inline constexpr bool kHasBinary =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t>;

// Note [streaming stores]: an output too large to stay in the cache beside
// its inputs is written with non-temporal stores, which skip the read of each
// output line that a plain store makes first (write-allocate) and leave the
// inputs in the cache; glibc's memcpy does the same above its threshold.
// Measured on one thread (docs/benchmarks.md): a chain of two float adds
// gains from 8 MiB outputs on a 32 MiB L3 and loses below 6 MiB, where the
// next op would have found the output in the cache. Several threads draw on
// the L3 faster than DRAM takes streamed writes; storeFor in cpu_backend.cpp
// has the bounds and why.
// Streaming loops, where the ISA has none, fall back to the cached ones. A
// streaming loop needs streamFence() on the same thread before another
// thread may read what it wrote.
enum class Store { Cached, Streaming };

// The loop for op on T (unitAlpha: alpha is 1), or nullptr where there is none
// (integer Div floors and checks for zero; Pow, Maximum, Minimum: scalar code).
template <typename T> BinaryFn<T> binary(BinaryOp op, bool unitAlpha, Store store);
// The rows form of binary's cached-store loop, or nullptr where there is none.
template <typename T> BinaryRowsFn<T> binaryRows(BinaryOp op, bool unitAlpha);

// Orders this thread's streaming stores before its later stores (sfence).
void streamFence();

} // namespace tt::backend::vec
