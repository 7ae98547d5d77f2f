// Value types of the runtime: dtypes, devices, 16-bit floats, Scalar, ArrayRef,
// source locations. No dependency on Tensor; the backends include this only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <ostream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace tt {

// Every error the runtime throws (c10::Error's role); messages use PyTorch's words.
class Error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// --- dtypes -------------------------------------------------------------------
enum class ScalarType : std::int8_t { Float, Double, Half, BFloat16, Int, Long, Bool };
inline constexpr ScalarType kFloat = ScalarType::Float;
inline constexpr ScalarType kFloat32 = ScalarType::Float;
inline constexpr ScalarType kDouble = ScalarType::Double;
inline constexpr ScalarType kFloat64 = ScalarType::Double;
inline constexpr ScalarType kHalf = ScalarType::Half;
inline constexpr ScalarType kFloat16 = ScalarType::Half;
inline constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
inline constexpr ScalarType kInt = ScalarType::Int;
inline constexpr ScalarType kInt32 = ScalarType::Int;
inline constexpr ScalarType kLong = ScalarType::Long;
inline constexpr ScalarType kInt64 = ScalarType::Long;
inline constexpr ScalarType kBool = ScalarType::Bool;

std::size_t elementSize(ScalarType t);
// PyTorch's names: "Float", "Double", "Half", "BFloat16", "Int", "Long", "Bool".
const char *toString(ScalarType t);
inline std::ostream &operator<<(std::ostream &os, ScalarType t) { return os << toString(t); }
inline bool isFloatingType(ScalarType t) {
  return t == kFloat || t == kDouble || t == kHalf || t == kBFloat16;
}
inline bool isIntegralType(ScalarType t, bool include_bool) {
  return t == kInt || t == kLong || (include_bool && t == kBool);
}
// torch.promote_types.
ScalarType promoteTypes(ScalarType a, ScalarType b);

// --- 16-bit floating point storage types (round-to-nearest-even) --------------
struct Half {
  std::uint16_t x = 0;
  Half() = default;
  Half(float f) : x(fromFloat(f)) {} // NOLINT: implicit like c10::Half
  operator float() const { return toFloat(x); } // NOLINT
  static std::uint16_t fromFloat(float f);
  static float toFloat(std::uint16_t h);
};
struct BFloat16 {
  std::uint16_t x = 0;
  BFloat16() = default;
  BFloat16(float f) : x(fromFloat(f)) {} // NOLINT
  operator float() const { // NOLINT
    std::uint32_t u = std::uint32_t(x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static std::uint16_t fromFloat(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep it a quiet NaN
      return std::uint16_t((u >> 16) | 0x40);
    return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

template <typename T> struct ScalarTypeOf;
template <> struct ScalarTypeOf<float> { static constexpr ScalarType value = kFloat; };
template <> struct ScalarTypeOf<double> { static constexpr ScalarType value = kDouble; };
template <> struct ScalarTypeOf<Half> { static constexpr ScalarType value = kHalf; };
template <> struct ScalarTypeOf<BFloat16> { static constexpr ScalarType value = kBFloat16; };
template <> struct ScalarTypeOf<std::int32_t> { static constexpr ScalarType value = kInt; };
template <> struct ScalarTypeOf<std::int64_t> { static constexpr ScalarType value = kLong; };
template <> struct ScalarTypeOf<bool> { static constexpr ScalarType value = kBool; };

// --- devices -------------------------------------------------------------------
enum class DeviceType : std::int8_t { CPU, CUDA };
inline constexpr DeviceType kCPU = DeviceType::CPU;
inline constexpr DeviceType kCUDA = DeviceType::CUDA;
const char *toString(DeviceType t); // "cpu", "cuda"

struct Device {
  Device(DeviceType type, std::int8_t index = -1) : type_(type), index_(index) {} // NOLINT
  DeviceType type() const { return type_; }
  std::int8_t index() const { return index_; }
  bool is_cpu() const { return type_ == kCPU; }
  bool is_cuda() const { return type_ == kCUDA; }
  bool operator==(const Device &o) const { return type_ == o.type_ && index_ == o.index_; }
  bool operator!=(const Device &o) const { return !(*this == o); }
  std::string str() const;

private:
  DeviceType type_;
  std::int8_t index_;
};
std::ostream &operator<<(std::ostream &os, const Device &d);

// --- Scalar: a number passed to an op (c10::Scalar) ---------------------------
class Scalar {
public:
  enum class Tag : std::uint8_t { Double, Long, Bool };
  Scalar() : Scalar(std::int64_t(0)) {}
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : tag_(Tag::Double), d_(static_cast<double>(v)) {} // NOLINT
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : tag_(Tag::Long), i_(static_cast<std::int64_t>(v)) {} // NOLINT
  Scalar(bool v) : tag_(Tag::Bool), i_(v) {} // NOLINT
  Scalar(Half v) : Scalar(float(v)) {} // NOLINT
  Scalar(BFloat16 v) : Scalar(float(v)) {} // NOLINT

  bool isFloatingPoint() const { return tag_ == Tag::Double; }
  bool isIntegral(bool include_bool) const {
    return tag_ == Tag::Long || (include_bool && tag_ == Tag::Bool);
  }
  bool isBoolean() const { return tag_ == Tag::Bool; }
  double toDouble() const { return tag_ == Tag::Double ? d_ : static_cast<double>(i_); }
  float toFloat() const { return static_cast<float>(toDouble()); }
  std::int64_t toLong() const { return tag_ == Tag::Double ? static_cast<std::int64_t>(d_) : i_; }
  int toInt() const { return static_cast<int>(toLong()); }
  bool toBool() const { return tag_ == Tag::Double ? d_ != 0 : i_ != 0; }
  template <typename T> T to() const;
  // The dtype PyTorch gives a wrapped number: Double, Long or Bool.
  ScalarType type() const {
    return tag_ == Tag::Double ? kDouble : tag_ == Tag::Long ? kLong : kBool;
  }
  Scalar operator-() const;

private:
  Tag tag_;
  double d_ = 0;
  std::int64_t i_ = 0;
};
std::ostream &operator<<(std::ostream &os, const Scalar &s);
template <> inline float Scalar::to<float>() const { return toFloat(); }
template <> inline double Scalar::to<double>() const { return toDouble(); }
template <> inline std::int64_t Scalar::to<std::int64_t>() const { return toLong(); }
template <> inline std::int32_t Scalar::to<std::int32_t>() const { return toInt(); }
template <> inline bool Scalar::to<bool>() const { return toBool(); }
template <> inline Half Scalar::to<Half>() const { return Half(toFloat()); }
template <> inline BFloat16 Scalar::to<BFloat16>() const { return BFloat16(toFloat()); }

// --- ArrayRef: a non-owning view of a contiguous array (c10::ArrayRef) --------
// Like c10's, one built from a braced list lives until the end of the full
// expression: pass it, do not store it.
template <typename T> class ArrayRef {
public:
  using value_type = T;
  using iterator = const T *;
  using const_iterator = const T *;
  constexpr ArrayRef() = default;
  constexpr ArrayRef(const T &one) : data_(&one), size_(1) {} // NOLINT
  constexpr ArrayRef(const T *data, std::size_t n) : data_(data), size_(n) {}
  constexpr ArrayRef(const T *begin, const T *end) : data_(begin), size_(end - begin) {}
  ArrayRef(const std::vector<T> &v) : data_(v.data()), size_(v.size()) {} // NOLINT
  template <std::size_t N> constexpr ArrayRef(const T (&a)[N]) : data_(a), size_(N) {} // NOLINT
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
#endif
  constexpr ArrayRef(const std::initializer_list<T> &l) // NOLINT
      : data_(l.begin() == l.end() ? nullptr : l.begin()), size_(l.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

  constexpr const T *begin() const { return data_; }
  constexpr const T *end() const { return data_ + size_; }
  constexpr const T *data() const { return data_; }
  constexpr std::size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr const T &operator[](std::size_t i) const { return data_[i]; }
  const T &at(std::size_t i) const;
  constexpr const T &front() const { return data_[0]; }
  constexpr const T &back() const { return data_[size_ - 1]; }
  ArrayRef slice(std::size_t start, std::size_t n) const { return ArrayRef(data_ + start, n); }
  ArrayRef slice(std::size_t start) const { return ArrayRef(data_ + start, size_ - start); }
  std::vector<T> vec() const { return std::vector<T>(begin(), end()); }
  bool equals(ArrayRef o) const {
    if (size_ != o.size_)
      return false;
    for (std::size_t i = 0; i < size_; ++i)
      if (!(data_[i] == o.data_[i]))
        return false;
    return true;
  }

private:
  const T *data_ = nullptr;
  std::size_t size_ = 0;
};
template <typename T> const T &ArrayRef<T>::at(std::size_t i) const {
  if (i >= size_)
    throw std::out_of_range("ArrayRef: index out of range");
  return data_[i];
}
template <typename T> bool operator==(ArrayRef<T> a, ArrayRef<T> b) { return a.equals(b); }
template <typename T> bool operator!=(ArrayRef<T> a, ArrayRef<T> b) { return !a.equals(b); }
template <typename T> bool operator==(ArrayRef<T> a, const std::vector<T> &b) { return a.equals(b); }
template <typename T> bool operator==(const std::vector<T> &a, ArrayRef<T> b) { return b.equals(a); }
template <typename T> bool operator!=(ArrayRef<T> a, const std::vector<T> &b) { return !a.equals(b); }
template <typename T> bool operator!=(const std::vector<T> &a, ArrayRef<T> b) { return !b.equals(a); }
template <typename T> std::ostream &operator<<(std::ostream &os, ArrayRef<T> a) {
  os << '[';
  for (std::size_t i = 0; i < a.size(); ++i)
    os << (i ? ", " : "") << a[i];
  return os << ']';
}
using IntArrayRef = ArrayRef<std::int64_t>;

// --- source locations -----------------------------------------------------------
// Every public op takes a defaulted SourceLocation so that the trace can name
// the user's call (file:line:col). g++-12 has no __builtin_COLUMN: column 0.
struct SourceLocation {
  const char *file = "";
  std::uint32_t line = 0;
  std::uint32_t column = 0;
#if defined(__has_builtin)
#if __has_builtin(__builtin_COLUMN)
#define TT_HAS_BUILTIN_COLUMN 1
#endif
#endif
#ifdef TT_HAS_BUILTIN_COLUMN
  static constexpr SourceLocation current(const char *f = __builtin_FILE(), unsigned l = __builtin_LINE(),
                                          unsigned c = __builtin_COLUMN()) noexcept {
    return SourceLocation{f, l, c};
  }
#else
  static constexpr SourceLocation current(const char *f = __builtin_FILE(),
                                          unsigned l = __builtin_LINE()) noexcept {
    return SourceLocation{f, l, 0};
  }
#endif
};
#define TT_LOC ::tt::SourceLocation loc = ::tt::SourceLocation::current()

} // namespace tt
