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

template <typename T>
inline constexpr bool kHasBinary =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t>;

// The loop for op on T (unitAlpha: alpha is 1), or nullptr where there is none
// (integer Div floors and checks for zero; Pow, Maximum, Minimum: scalar code).
template <typename T> BinaryFn<T> binary(BinaryOp op, bool unitAlpha);

} // namespace tt::backend::vec
