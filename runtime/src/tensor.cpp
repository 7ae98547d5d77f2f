#include "tt/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <string>

namespace tt {

namespace {
std::atomic<std::uint64_t> g_next_storage_id{1};

[[noreturn]] void fail(const std::string &msg) { throw std::runtime_error(msg); }

template <typename T> constexpr ScalarType scalarTypeOf();
template <> constexpr ScalarType scalarTypeOf<float>() { return kFloat; }
template <> constexpr ScalarType scalarTypeOf<double>() { return kDouble; }
template <> constexpr ScalarType scalarTypeOf<std::int32_t>() { return kInt; }
template <> constexpr ScalarType scalarTypeOf<std::int64_t>() { return kLong; }
template <> constexpr ScalarType scalarTypeOf<bool>() { return kBool; }

IntArrayRef contiguousStrides(const IntArrayRef &sizes) {
  IntArrayRef strides(sizes.size());
  std::int64_t s = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= sizes[i] > 1 ? sizes[i] : 1;
  }
  return strides;
}
} // namespace

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

Storage::Storage(std::size_t nbytes, DeviceType device)
    : nbytes_(nbytes), device_(device), id_(g_next_storage_id++) {
  if (device != kCPU)
    fail("tt: this build has no CUDA backend");
  if (nbytes) {
    data_ = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
    if (!data_)
      throw std::bad_alloc();
  }
}

Storage::~Storage() { std::free(data_); }

const TensorImpl &Tensor::impl() const {
  if (!impl_)
    fail("tt: the tensor is undefined (default-constructed handle)");
  return *impl_;
}

const IntArrayRef &Tensor::sizes() const { return impl().sizes; }
const IntArrayRef &Tensor::strides() const { return impl().strides; }
std::int64_t Tensor::storage_offset() const { return impl().storage_offset; }
ScalarType Tensor::dtype() const { return impl().dtype; }
DeviceType Tensor::device() const { return impl().storage->device(); }

static std::int64_t wrapDim(std::int64_t d, std::int64_t ndim) {
  if (d < -ndim || d >= ndim) {
    std::ostringstream os;
    os << "Dimension out of range (expected to be in range of [" << -ndim << ", " << ndim - 1
       << "], but got " << d << ")";
    fail(os.str());
  }
  return d < 0 ? d + ndim : d;
}

std::int64_t Tensor::size(std::int64_t d) const { return sizes()[wrapDim(d, dim())]; }
std::int64_t Tensor::stride(std::int64_t d) const { return strides()[wrapDim(d, dim())]; }

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (auto s : sizes())
    n *= s;
  return n;
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = sizes().size(); i-- > 0;) {
    if (sizes()[i] == 1)
      continue;
    if (strides()[i] != expected)
      return false;
    expected *= sizes()[i];
  }
  return true;
}

bool Tensor::is_alias_of(const Tensor &other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

template <typename T> T *Tensor::data_ptr() const {
  if (dtype() != scalarTypeOf<T>())
    fail(std::string("expected scalar type ") + toString(scalarTypeOf<T>()) + " but found " +
         toString(dtype()));
  return static_cast<T *>(impl().storage->data()) + storage_offset();
}

template <typename T> T Tensor::item() const {
  if (numel() != 1) {
    std::ostringstream os;
    os << "a Tensor with " << numel() << " elements cannot be converted to Scalar";
    fail(os.str());
  }
  return *data_ptr<T>();
}

#define TT_INSTANTIATE(T)                                                                          \
  template T *Tensor::data_ptr<T>() const;                                                         \
  template T Tensor::item<T>() const;
TT_INSTANTIATE(float)
TT_INSTANTIATE(double)
TT_INSTANTIATE(std::int32_t)
TT_INSTANTIATE(std::int64_t)
TT_INSTANTIATE(bool)
#undef TT_INSTANTIATE

Tensor empty(const IntArrayRef &sizes, ScalarType dtype) {
  std::int64_t n = 1;
  for (auto s : sizes) {
    if (s < 0)
      fail("Trying to create tensor with negative dimension " + std::to_string(s));
    n *= s;
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<std::size_t>(n) * elementSize(dtype), kCPU);
  impl->sizes = sizes;
  impl->strides = contiguousStrides(sizes);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

template <typename T> static void fillAs(const Tensor &t, double v) {
  T *p = t.data_ptr<T>();
  for (std::int64_t i = 0, n = t.numel(); i < n; ++i)
    p[i] = static_cast<T>(v);
}

Tensor full(const IntArrayRef &sizes, double value, ScalarType dtype) {
  Tensor t = empty(sizes, dtype);
  switch (dtype) {
  case kFloat: fillAs<float>(t, value); break;
  case kDouble: fillAs<double>(t, value); break;
  case kInt: fillAs<std::int32_t>(t, value); break;
  case kLong: fillAs<std::int64_t>(t, value); break;
  case kBool: fillAs<bool>(t, value); break;
  default: fail(std::string("full: unsupported dtype ") + toString(dtype));
  }
  return t;
}

Tensor zeros(const IntArrayRef &sizes, ScalarType dtype) { return full(sizes, 0.0, dtype); }
Tensor ones(const IntArrayRef &sizes, ScalarType dtype) { return full(sizes, 1.0, dtype); }

std::ostream &operator<<(std::ostream &os, const Tensor &t) {
  if (!t.defined())
    return os << "[ Tensor (undefined) ]";
  os << "[ " << toString(t.dtype()) << "Type{";
  for (std::size_t i = 0; i < t.sizes().size(); ++i)
    os << (i ? "," : "") << t.sizes()[i];
  return os << "} ]";
}

} // namespace tt
