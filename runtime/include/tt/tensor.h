// tt::Tensor: a refcounted handle over a TensorImpl (sizes, strides, offset)
// over a Storage. Copying a handle aliases; only ops that copy allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <vector>

namespace tt {

enum class ScalarType : std::int8_t { Float, Double, Half, BFloat16, Int, Long, Bool };
inline constexpr ScalarType kFloat = ScalarType::Float;
inline constexpr ScalarType kDouble = ScalarType::Double;
inline constexpr ScalarType kHalf = ScalarType::Half;
inline constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
inline constexpr ScalarType kInt = ScalarType::Int;
inline constexpr ScalarType kLong = ScalarType::Long;
inline constexpr ScalarType kBool = ScalarType::Bool;

std::size_t elementSize(ScalarType t);
const char *toString(ScalarType t);

enum class DeviceType : std::int8_t { CPU, CUDA };
inline constexpr DeviceType kCPU = DeviceType::CPU;
inline constexpr DeviceType kCUDA = DeviceType::CUDA;

using IntArrayRef = std::vector<std::int64_t>;

// Raw bytes plus the bookkeeping PyTorch keeps on StorageImpl.
class Storage {
public:
  Storage(std::size_t nbytes, DeviceType device);
  ~Storage();
  Storage(const Storage &) = delete;
  Storage &operator=(const Storage &) = delete;

  void *data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  DeviceType device() const { return device_; }
  std::uint64_t id() const { return id_; }

private:
  void *data_ = nullptr;
  std::size_t nbytes_ = 0;
  DeviceType device_;
  std::uint64_t id_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  IntArrayRef sizes;
  IntArrayRef strides;
  std::int64_t storage_offset = 0;
  ScalarType dtype = kFloat;
};

class Tensor {
public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const IntArrayRef &sizes() const;
  const IntArrayRef &strides() const;
  std::int64_t dim() const { return static_cast<std::int64_t>(sizes().size()); }
  std::int64_t size(std::int64_t d) const;
  std::int64_t stride(std::int64_t d) const;
  std::int64_t numel() const;
  std::int64_t storage_offset() const;
  ScalarType dtype() const;
  DeviceType device() const;
  bool is_contiguous() const;
  // True when both handles are backed by the same Storage (views, aliases).
  bool is_alias_of(const Tensor &other) const;

  template <typename T> T *data_ptr() const;
  template <typename T> T item() const;

private:
  const TensorImpl &impl() const;
  std::shared_ptr<TensorImpl> impl_;
};

Tensor empty(const IntArrayRef &sizes, ScalarType dtype = kFloat);
Tensor zeros(const IntArrayRef &sizes, ScalarType dtype = kFloat);
Tensor ones(const IntArrayRef &sizes, ScalarType dtype = kFloat);
Tensor full(const IntArrayRef &sizes, double value, ScalarType dtype = kFloat);

std::ostream &operator<<(std::ostream &os, const Tensor &t);

} // namespace tt
