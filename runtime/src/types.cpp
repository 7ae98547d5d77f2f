// Value types: dtypes, promotion, 16-bit floats, devices, scalars.
#include "internal.h"

#include <cmath>
#include <sstream>

namespace tt {

void fail(const std::string &msg) {
  if (trace::on())
    trace::error("error", msg);
  throw Error(msg);
}

std::size_t elementSize(ScalarType t) {
  switch (t) {
  case kFloat: case kInt: return 4;
  case kDouble: case kLong: return 8;
  case kHalf: case kBFloat16: return 2;
  case kBool: return 1;
  }
  return 0;
}

const char *toString(ScalarType t) {
  switch (t) {
  case kFloat: return "Float";
  case kDouble: return "Double";
  case kHalf: return "Half";
  case kBFloat16: return "BFloat16";
  case kInt: return "Int";
  case kLong: return "Long";
  case kBool: return "Bool";
  }
  return "?";
}

const char *toString(DeviceType t) { return t == kCPU ? "cpu" : "cuda"; }

std::string Device::str() const {
  std::string s = toString(type_);
  if (index_ >= 0)
    s += ":" + std::to_string(index_);
  return s;
}
std::ostream &operator<<(std::ostream &os, const Device &d) { return os << d.str(); }

// torch.promote_types: bool < integers < floating; Half with BFloat16 -> Float.
ScalarType promoteTypes(ScalarType a, ScalarType b) {
  if (a == b)
    return a;
  if (a == kBool)
    return b;
  if (b == kBool)
    return a;
  bool fa = isFloatingType(a), fb = isFloatingType(b);
  if (fa && !fb)
    return a;
  if (fb && !fa)
    return b;
  if (!fa) // Int, Long
    return kLong;
  if (a == kDouble || b == kDouble)
    return kDouble;
  if (a == kFloat || b == kFloat)
    return kFloat;
  return kFloat; // Half + BFloat16
}

std::uint16_t Half::fromFloat(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) // inf or nan
    return std::uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) // rounds to >= 65520: inf
    return std::uint16_t(sign | 0x7c00u);
  if (absx < 0x38800000u) { // subnormal half (or zero)
    float a;
    std::memcpy(&a, &absx, 4);
    // Adding 0.5 aligns the subnormal's bits at the bottom, rounding to even.
    float r = a + 0.5f;
    std::uint32_t u;
    std::memcpy(&u, &r, 4);
    return std::uint16_t(sign | (u - 0x3f000000u));
  }
  std::uint32_t mant_odd = (absx >> 13) & 1u;
  absx += 0xc8000fffu + mant_odd; // rebias exponent (-112 << 23) and round to even
  return std::uint16_t(sign | (absx >> 13));
}

float Half::toFloat(std::uint16_t h) {
  std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else { // subnormal
      float f = std::ldexp(static_cast<float>(mant), -24);
      std::memcpy(&out, &f, 4);
      out |= sign;
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

Scalar Scalar::operator-() const {
  if (tag_ == Tag::Double)
    return Scalar(-d_);
  return Scalar(-i_);
}

std::ostream &operator<<(std::ostream &os, const Scalar &s) {
  if (s.isFloatingPoint())
    return os << s.toDouble();
  if (s.isBoolean())
    return os << (s.toBool() ? "true" : "false");
  return os << s.toLong();
}

} // namespace tt
