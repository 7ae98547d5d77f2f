// tt::Tensor: a refcounted handle over a TensorImpl (sizes, strides, offset,
// dtype, autograd meta) over a Storage. Copying a handle aliases; only the ops
// that copy allocate. Names and signatures follow LibTorch 1.13 (at::Tensor).
//
// Every op that can allocate, copy, alias or write takes a trailing defaulted
// SourceLocation: the trace (TT_TRACE=<file>) names the user's call with it.
// Compound assignments (+= ...) get it through their right operand.
#pragma once

#include "tt/types.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tt {

class Tensor;
class TensorImpl;
namespace autograd {
class Node;
}

using TensorList = ArrayRef<Tensor>;

enum class MemoryFormat : std::int8_t { Contiguous, Preserve };

// c10::TensorOptions: dtype, device, requires_grad; implicit from each.
class TensorOptions {
public:
  TensorOptions() = default;
  TensorOptions(ScalarType t) : dtype_(t) {} // NOLINT
  TensorOptions(Device d) : device_(d) {}    // NOLINT
  TensorOptions(DeviceType d) : device_(Device(d)) {} // NOLINT
  TensorOptions dtype(ScalarType t) const {
    TensorOptions o = *this;
    o.dtype_ = t;
    return o;
  }
  TensorOptions device(Device d) const {
    TensorOptions o = *this;
    o.device_ = d;
    return o;
  }
  TensorOptions requires_grad(bool r) const {
    TensorOptions o = *this;
    o.requires_grad_ = r;
    return o;
  }
  ScalarType dtype() const { return dtype_.value_or(kFloat); }
  Device device() const { return device_.value_or(Device(kCPU)); }
  bool requires_grad() const { return requires_grad_; }
  bool has_dtype() const { return dtype_.has_value(); }
  bool has_device() const { return device_.has_value(); }
  std::optional<ScalarType> dtype_opt() const { return dtype_; }
  std::optional<Device> device_opt() const { return device_; }

private:
  std::optional<ScalarType> dtype_;
  std::optional<Device> device_;
  bool requires_grad_ = false;
};
inline TensorOptions dtype(ScalarType t) { return TensorOptions().dtype(t); }
inline TensorOptions device(Device d) { return TensorOptions().device(d); }
inline TensorOptions requires_grad(bool r = true) { return TensorOptions().requires_grad(r); }

namespace detail {
// Right operand of a compound assignment, carrying the caller's location.
struct LocatedTensor {
  LocatedTensor(const Tensor &t, SourceLocation l = SourceLocation::current()) : t(t), loc(l) {} // NOLINT
  const Tensor &t;
  SourceLocation loc;
};
struct LocatedScalar {
  template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
  LocatedScalar(T v, SourceLocation l = SourceLocation::current()) : s(v), loc(l) {} // NOLINT
  LocatedScalar(const Scalar &v, SourceLocation l = SourceLocation::current()) : s(v), loc(l) {} // NOLINT
  Scalar s;
  SourceLocation loc;
};
} // namespace detail

namespace indexing {
struct NoneIndexType {};
struct EllipsisIndexType {};
inline constexpr NoneIndexType None{};
inline constexpr EllipsisIndexType Ellipsis{};
// Slice(start, stop, step) with Python's defaults (None -> whole dim).
class Slice {
public:
  Slice(std::optional<std::int64_t> start = std::nullopt, std::optional<std::int64_t> stop = std::nullopt,
        std::optional<std::int64_t> step = std::nullopt);
  std::int64_t start() const { return start_; }
  std::int64_t stop() const { return stop_; }
  std::int64_t step() const { return step_; }

private:
  std::int64_t start_, stop_, step_;
};
// One element of t.index({...}): None, Ellipsis, an integer, a bool, a Slice or
// a Tensor (advanced indexing: copies).
class TensorIndex {
public:
  enum class Kind : std::uint8_t { None, Ellipsis, Integer, Boolean, Slice, Tensor };
  TensorIndex(NoneIndexType) : kind_(Kind::None) {}         // NOLINT
  TensorIndex(EllipsisIndexType) : kind_(Kind::Ellipsis) {} // NOLINT
  TensorIndex(const char *s);                               // NOLINT: "..." only
  TensorIndex(std::int64_t i) : kind_(Kind::Integer), integer_(i) {} // NOLINT
  TensorIndex(int i) : kind_(Kind::Integer), integer_(i) {}          // NOLINT
  TensorIndex(bool b) : kind_(Kind::Boolean), boolean_(b) {}         // NOLINT
  TensorIndex(Slice s) : kind_(Kind::Slice), slice_(s) {}            // NOLINT
  TensorIndex(Tensor t);                                             // NOLINT
  ~TensorIndex();
  TensorIndex(const TensorIndex &);
  TensorIndex &operator=(const TensorIndex &);

  Kind kind() const { return kind_; }
  std::int64_t integer() const { return integer_; }
  bool boolean() const { return boolean_; }
  const Slice &slice() const { return slice_; }
  const Tensor &tensor() const;

private:
  Kind kind_;
  std::int64_t integer_ = 0;
  bool boolean_ = false;
  Slice slice_;
  std::shared_ptr<Tensor> tensor_;
};
} // namespace indexing

class Tensor {
public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl);
  Tensor(const Tensor &) = default;
  Tensor(Tensor &&) noexcept = default;
  ~Tensor() = default;
  // Handle assignment rebinds (aliases); it never copies data.
  Tensor &operator=(const Tensor &) & = default;
  Tensor &operator=(Tensor &&) & noexcept = default;
  // LibTorch: assigning to a temporary handle (t[0] = x, t.index({..}) = x)
  // writes into its storage (copy_ / fill_).
  Tensor &operator=(const Tensor &src) &&;
  Tensor &operator=(const Scalar &v) &&;

  // --- metadata ---------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  IntArrayRef sizes() const;
  IntArrayRef strides() const;
  std::int64_t size(std::int64_t dim) const;
  std::int64_t stride(std::int64_t dim) const;
  std::int64_t dim() const;
  std::int64_t ndimension() const { return dim(); }
  std::int64_t numel() const;
  std::int64_t storage_offset() const;
  ScalarType dtype() const;
  ScalarType scalar_type() const { return dtype(); }
  Device device() const;
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  TensorOptions options() const;
  std::size_t element_size() const { return elementSize(dtype()); }
  std::size_t itemsize() const { return element_size(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  bool is_contiguous(MemoryFormat fmt = MemoryFormat::Contiguous) const;
  bool is_non_overlapping_and_dense() const;
  bool is_floating_point() const { return isFloatingType(dtype()); }
  // LibTorch's is_alias_of: both handles are backed by the same storage.
  bool is_alias_of(const Tensor &other) const;
  // Same TensorImpl (the same tensor, not just the same storage).
  bool is_same(const Tensor &other) const { return impl_ == other.impl_; }
  // Handles sharing this TensorImpl.
  long use_count() const { return impl_.use_count(); }
  // The runtime's id of the storage (what the trace calls "storage").
  std::uint64_t storage_id() const;
  // Live TensorImpls (views, detached handles...) over this storage.
  long storage_use_count() const;
  // The version counter shared by views and detach(); bumped by in-place ops.
  std::uint32_t _version() const;
  bool is_view() const;
  // The tensor this one is a view of, or an undefined tensor.
  Tensor _base() const;

  template <typename T> T *data_ptr() const;
  void *data_ptr() const;
  // item() of a CUDA tensor copies to the host (a synchronising transfer).
  template <typename T> T item(TT_LOC) const;
  Scalar item(TT_LOC) const;
  std::string toString() const;
  void print() const;

  // --- views: share storage and version counter -------------------------------
  Tensor view(IntArrayRef size, TT_LOC) const;
  Tensor view(ScalarType dtype, TT_LOC) const;
  Tensor view_as(const Tensor &other, TT_LOC) const;
  Tensor reshape(IntArrayRef shape, TT_LOC) const; // copies only when view is impossible
  Tensor reshape_as(const Tensor &other, TT_LOC) const;
  Tensor flatten(std::int64_t start_dim = 0, std::int64_t end_dim = -1, TT_LOC) const;
  Tensor transpose(std::int64_t dim0, std::int64_t dim1, TT_LOC) const;
  Tensor t(TT_LOC) const;
  Tensor permute(IntArrayRef dims, TT_LOC) const;
  Tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length, TT_LOC) const;
  Tensor select(std::int64_t dim, std::int64_t index, TT_LOC) const;
  Tensor slice(std::int64_t dim = 0, std::optional<std::int64_t> start = std::nullopt,
               std::optional<std::int64_t> end = std::nullopt, std::int64_t step = 1, TT_LOC) const;
  Tensor squeeze(TT_LOC) const;
  Tensor squeeze(std::int64_t dim, TT_LOC) const;
  Tensor unsqueeze(std::int64_t dim, TT_LOC) const;
  Tensor expand(IntArrayRef size, bool implicit = false, TT_LOC) const;
  Tensor expand_as(const Tensor &other, TT_LOC) const;
  Tensor as_strided(IntArrayRef size, IntArrayRef stride, std::optional<std::int64_t> storage_offset = std::nullopt,
                    TT_LOC) const;
  Tensor diagonal(std::int64_t offset = 0, std::int64_t dim1 = 0, std::int64_t dim2 = 1, TT_LOC) const;
  std::vector<Tensor> chunk(std::int64_t chunks, std::int64_t dim = 0, TT_LOC) const;
  std::vector<Tensor> split(std::int64_t split_size, std::int64_t dim = 0, TT_LOC) const;
  std::vector<Tensor> split(IntArrayRef split_sizes, std::int64_t dim = 0, TT_LOC) const;
  std::vector<Tensor> split_with_sizes(IntArrayRef split_sizes, std::int64_t dim = 0, TT_LOC) const;
  std::vector<Tensor> unbind(std::int64_t dim = 0, TT_LOC) const;
  // Integers, slices, None and Ellipsis give views; Tensor indices copy.
  Tensor index(ArrayRef<indexing::TensorIndex> indices, TT_LOC) const;
  Tensor index(std::initializer_list<indexing::TensorIndex> indices, TT_LOC) const;
  Tensor &index_put_(ArrayRef<indexing::TensorIndex> indices, const Tensor &rhs, TT_LOC) const;
  Tensor &index_put_(ArrayRef<indexing::TensorIndex> indices, const Scalar &v, TT_LOC) const;
  Tensor &index_put_(std::initializer_list<indexing::TensorIndex> indices, const Tensor &rhs, TT_LOC) const;
  Tensor &index_put_(std::initializer_list<indexing::TensorIndex> indices, const Scalar &v, TT_LOC) const;
  Tensor operator[](std::int64_t index) const; // select(0, index)
  Tensor operator[](const Tensor &index) const; // advanced indexing: copies

  // --- copies and conversions ------------------------------------------------------
  Tensor clone(std::optional<MemoryFormat> memory_format = std::nullopt, TT_LOC) const;
  Tensor contiguous(MemoryFormat memory_format = MemoryFormat::Contiguous, TT_LOC) const;
  Tensor &copy_(const Tensor &src, bool non_blocking = false, TT_LOC) const;
  // to() returns self when nothing changes (unless copy=true).
  Tensor to(TensorOptions options = {}, bool non_blocking = false, bool copy = false,
            std::optional<MemoryFormat> memory_format = std::nullopt, TT_LOC) const;
  Tensor to(Device device, ScalarType dtype, bool non_blocking = false, bool copy = false,
            std::optional<MemoryFormat> memory_format = std::nullopt, TT_LOC) const;
  Tensor to(ScalarType dtype, bool non_blocking = false, bool copy = false,
            std::optional<MemoryFormat> memory_format = std::nullopt, TT_LOC) const;
  Tensor to(const Tensor &other, bool non_blocking = false, bool copy = false,
            std::optional<MemoryFormat> memory_format = std::nullopt, TT_LOC) const;
  Tensor toType(ScalarType t, TT_LOC) const;
  Tensor cpu(TT_LOC) const;
  Tensor cuda(TT_LOC) const;
  // A copy in page-locked host memory (self when already pinned); CPU only.
  // Needs the CUDA backend, as in PyTorch. is_pinned(): false without it.
  Tensor pin_memory(TT_LOC) const;
  bool is_pinned() const;
  // Shares storage and version counter; no autograd history.
  Tensor detach(TT_LOC) const;
  Tensor &detach_(TT_LOC) const;
  // LibTorch: share storage but get a fresh version counter (autograd does not
  // see writes through them).
  Tensor data(TT_LOC) const;
  Tensor variable_data(TT_LOC) const;

  // --- autograd --------------------------------------------------------------------
  bool requires_grad() const;
  Tensor &requires_grad_(bool requires_grad = true, TT_LOC) const;
  Tensor &set_requires_grad(bool requires_grad) const { return requires_grad_(requires_grad); }
  bool is_leaf() const;
  const Tensor &grad() const;
  Tensor &mutable_grad() const;
  void retain_grad() const;
  bool retains_grad() const;
  std::shared_ptr<autograd::Node> grad_fn() const;
  std::int64_t output_nr() const;
  void backward(const Tensor &gradient = {}, std::optional<bool> retain_graph = std::nullopt,
                bool create_graph = false, TT_LOC) const;

  // --- math ------------------------------------------------------------------------
  Tensor add(const Tensor &other, const Scalar &alpha = 1, TT_LOC) const;
  Tensor add(const Scalar &other, const Scalar &alpha = 1, TT_LOC) const;
  Tensor &add_(const Tensor &other, const Scalar &alpha = 1, TT_LOC) const;
  Tensor &add_(const Scalar &other, const Scalar &alpha = 1, TT_LOC) const;
  Tensor sub(const Tensor &other, const Scalar &alpha = 1, TT_LOC) const;
  Tensor sub(const Scalar &other, const Scalar &alpha = 1, TT_LOC) const;
  Tensor &sub_(const Tensor &other, const Scalar &alpha = 1, TT_LOC) const;
  Tensor &sub_(const Scalar &other, const Scalar &alpha = 1, TT_LOC) const;
  Tensor mul(const Tensor &other, TT_LOC) const;
  Tensor mul(const Scalar &other, TT_LOC) const;
  Tensor &mul_(const Tensor &other, TT_LOC) const;
  Tensor &mul_(const Scalar &other, TT_LOC) const;
  Tensor div(const Tensor &other, TT_LOC) const;
  Tensor div(const Scalar &other, TT_LOC) const;
  Tensor &div_(const Tensor &other, TT_LOC) const;
  Tensor &div_(const Scalar &other, TT_LOC) const;
  Tensor pow(const Tensor &exponent, TT_LOC) const;
  Tensor pow(const Scalar &exponent, TT_LOC) const;
  Tensor &pow_(const Tensor &exponent, TT_LOC) const;
  Tensor &pow_(const Scalar &exponent, TT_LOC) const;
  Tensor neg(TT_LOC) const;
  Tensor &neg_(TT_LOC) const;
  Tensor abs(TT_LOC) const;
  Tensor &abs_(TT_LOC) const;
  Tensor exp(TT_LOC) const;
  Tensor &exp_(TT_LOC) const;
  Tensor log(TT_LOC) const;
  Tensor &log_(TT_LOC) const;
  Tensor sqrt(TT_LOC) const;
  Tensor &sqrt_(TT_LOC) const;
  Tensor relu(TT_LOC) const;
  Tensor &relu_(TT_LOC) const;
  Tensor sigmoid(TT_LOC) const;
  Tensor &sigmoid_(TT_LOC) const;
  Tensor tanh(TT_LOC) const;
  Tensor &tanh_(TT_LOC) const;
  Tensor clamp(const std::optional<Scalar> &min = std::nullopt, const std::optional<Scalar> &max = std::nullopt,
               TT_LOC) const;
  Tensor &clamp_(const std::optional<Scalar> &min = std::nullopt, const std::optional<Scalar> &max = std::nullopt,
                 TT_LOC) const;
  Tensor &fill_(const Scalar &value, TT_LOC) const;
  Tensor &fill_(const Tensor &value, TT_LOC) const;
  Tensor &zero_(TT_LOC) const;
  Tensor where(const Tensor &condition, const Tensor &other, TT_LOC) const;

  Tensor eq(const Tensor &other, TT_LOC) const;
  Tensor eq(const Scalar &other, TT_LOC) const;
  Tensor ne(const Tensor &other, TT_LOC) const;
  Tensor ne(const Scalar &other, TT_LOC) const;
  Tensor lt(const Tensor &other, TT_LOC) const;
  Tensor lt(const Scalar &other, TT_LOC) const;
  Tensor le(const Tensor &other, TT_LOC) const;
  Tensor le(const Scalar &other, TT_LOC) const;
  Tensor gt(const Tensor &other, TT_LOC) const;
  Tensor gt(const Scalar &other, TT_LOC) const;
  Tensor ge(const Tensor &other, TT_LOC) const;
  Tensor ge(const Scalar &other, TT_LOC) const;

  Tensor sum(std::optional<ScalarType> dtype = std::nullopt, TT_LOC) const;
  Tensor sum(IntArrayRef dim, bool keepdim = false, std::optional<ScalarType> dtype = std::nullopt, TT_LOC) const;
  Tensor mean(std::optional<ScalarType> dtype = std::nullopt, TT_LOC) const;
  Tensor mean(IntArrayRef dim, bool keepdim = false, std::optional<ScalarType> dtype = std::nullopt, TT_LOC) const;
  Tensor max(TT_LOC) const;
  std::tuple<Tensor, Tensor> max(std::int64_t dim, bool keepdim = false, TT_LOC) const;
  Tensor min(TT_LOC) const;
  std::tuple<Tensor, Tensor> min(std::int64_t dim, bool keepdim = false, TT_LOC) const;
  Tensor argmax(std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false, TT_LOC) const;
  Tensor argmin(std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false, TT_LOC) const;

  Tensor matmul(const Tensor &other, TT_LOC) const;
  Tensor mm(const Tensor &mat2, TT_LOC) const;
  Tensor bmm(const Tensor &mat2, TT_LOC) const;

  bool allclose(const Tensor &other, double rtol = 1e-05, double atol = 1e-08, bool equal_nan = false) const;
  bool equal(const Tensor &other) const;

  // Compound assignment: in place, like add_ & co.
  Tensor &operator+=(detail::LocatedTensor other) const;
  Tensor &operator+=(detail::LocatedScalar other) const;
  Tensor &operator-=(detail::LocatedTensor other) const;
  Tensor &operator-=(detail::LocatedScalar other) const;
  Tensor &operator*=(detail::LocatedTensor other) const;
  Tensor &operator*=(detail::LocatedScalar other) const;
  Tensor &operator/=(detail::LocatedTensor other) const;
  Tensor &operator/=(detail::LocatedScalar other) const;
  Tensor operator-() const;

  // Runtime internals.
  TensorImpl *unsafeGetTensorImpl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl> &getIntrusivePtr() const { return impl_; }

private:
  const TensorImpl &impl() const;
  std::shared_ptr<TensorImpl> impl_;
};

// --- binary operators (out of place) -----------------------------------------------
// The right operand carries the caller's location (for the trace); it
// converts implicitly from a Tensor / a number, so `a + b`, `a * 2`, `1 - a`
// read as in LibTorch.
Tensor operator+(const Tensor &a, detail::LocatedTensor b);
Tensor operator+(const Tensor &a, detail::LocatedScalar b);
Tensor operator+(const Scalar &a, detail::LocatedTensor b);
Tensor operator-(const Tensor &a, detail::LocatedTensor b);
Tensor operator-(const Tensor &a, detail::LocatedScalar b);
Tensor operator-(const Scalar &a, detail::LocatedTensor b);
Tensor operator*(const Tensor &a, detail::LocatedTensor b);
Tensor operator*(const Tensor &a, detail::LocatedScalar b);
Tensor operator*(const Scalar &a, detail::LocatedTensor b);
Tensor operator/(const Tensor &a, detail::LocatedTensor b);
Tensor operator/(const Tensor &a, detail::LocatedScalar b);
Tensor operator/(const Scalar &a, detail::LocatedTensor b);
Tensor operator==(const Tensor &a, const Tensor &b);
Tensor operator==(const Tensor &a, const Scalar &b);
Tensor operator!=(const Tensor &a, const Tensor &b);
Tensor operator!=(const Tensor &a, const Scalar &b);
Tensor operator<(const Tensor &a, const Tensor &b);
Tensor operator<(const Tensor &a, const Scalar &b);
Tensor operator<=(const Tensor &a, const Tensor &b);
Tensor operator<=(const Tensor &a, const Scalar &b);
Tensor operator>(const Tensor &a, const Tensor &b);
Tensor operator>(const Tensor &a, const Scalar &b);
Tensor operator>=(const Tensor &a, const Tensor &b);
Tensor operator>=(const Tensor &a, const Scalar &b);

// LibTorch's printing: values, then "[ CPUFloatType{2,3} ]".
std::ostream &operator<<(std::ostream &os, const Tensor &t);

// --- factories ------------------------------------------------------------------------
Tensor empty(IntArrayRef size, TensorOptions options = {}, TT_LOC);
Tensor empty_strided(IntArrayRef size, IntArrayRef stride, TensorOptions options = {}, TT_LOC);
Tensor zeros(IntArrayRef size, TensorOptions options = {}, TT_LOC);
Tensor ones(IntArrayRef size, TensorOptions options = {}, TT_LOC);
Tensor full(IntArrayRef size, const Scalar &fill_value, TensorOptions options = {}, TT_LOC);
Tensor rand(IntArrayRef size, TensorOptions options = {}, TT_LOC);
Tensor randn(IntArrayRef size, TensorOptions options = {}, TT_LOC);
Tensor arange(const Scalar &end, TensorOptions options = {}, TT_LOC);
Tensor arange(const Scalar &start, const Scalar &end, TensorOptions options = {}, TT_LOC);
Tensor arange(const Scalar &start, const Scalar &end, const Scalar &step, TensorOptions options = {}, TT_LOC);
Tensor linspace(const Scalar &start, const Scalar &end, std::int64_t steps, TensorOptions options = {}, TT_LOC);
Tensor eye(std::int64_t n, TensorOptions options = {}, TT_LOC);
// Like the input: same size, dtype and device, and (preserve_format) its
// strides when it is dense.
Tensor empty_like(const Tensor &self, TensorOptions options = {}, TT_LOC);
Tensor zeros_like(const Tensor &self, TensorOptions options = {}, TT_LOC);
Tensor ones_like(const Tensor &self, TensorOptions options = {}, TT_LOC);
Tensor full_like(const Tensor &self, const Scalar &fill_value, TensorOptions options = {}, TT_LOC);
Tensor rand_like(const Tensor &self, TensorOptions options = {}, TT_LOC);
Tensor randn_like(const Tensor &self, TensorOptions options = {}, TT_LOC);
// torch::tensor: from values. Floating lists default to kFloat, integer lists
// to kLong (as LibTorch), bool to kBool; options.dtype() converts.
Tensor tensor(std::initializer_list<double> values, TensorOptions options = {}, TT_LOC);
Tensor tensor(std::initializer_list<float> values, TensorOptions options = {}, TT_LOC);
Tensor tensor(std::initializer_list<int> values, TensorOptions options = {}, TT_LOC);
Tensor tensor(std::initializer_list<std::int64_t> values, TensorOptions options = {}, TT_LOC);
Tensor tensor(std::initializer_list<bool> values, TensorOptions options = {}, TT_LOC);
Tensor tensor(std::initializer_list<std::initializer_list<double>> values, TensorOptions options = {}, TT_LOC);
Tensor tensor(ArrayRef<float> values, TensorOptions options = {}, TT_LOC);
Tensor tensor(ArrayRef<double> values, TensorOptions options = {}, TT_LOC);
Tensor tensor(ArrayRef<std::int64_t> values, TensorOptions options = {}, TT_LOC);
Tensor tensor(ArrayRef<int> values, TensorOptions options = {}, TT_LOC);
Tensor scalar_tensor(const Scalar &s, TensorOptions options = {}, TT_LOC);
// Wraps caller-owned memory without copying (torch::from_blob); the caller
// keeps it alive.
Tensor from_blob(void *data, IntArrayRef sizes, TensorOptions options = {}, TT_LOC);
Tensor from_blob(void *data, IntArrayRef sizes, IntArrayRef strides, TensorOptions options = {}, TT_LOC);
void manual_seed(std::uint64_t seed);
// Intra-op threads (torch::set_num_threads): the OpenMP loops and OpenBLAS.
void set_num_threads(int n);
int get_num_threads();

// --- free-function forms -----------------------------------------------------------
Tensor add(const Tensor &a, const Tensor &b, const Scalar &alpha = 1, TT_LOC);
Tensor sub(const Tensor &a, const Tensor &b, const Scalar &alpha = 1, TT_LOC);
Tensor mul(const Tensor &a, const Tensor &b, TT_LOC);
Tensor div(const Tensor &a, const Tensor &b, TT_LOC);
Tensor pow(const Tensor &a, const Tensor &exponent, TT_LOC);
Tensor pow(const Tensor &a, const Scalar &exponent, TT_LOC);
Tensor neg(const Tensor &a, TT_LOC);
Tensor abs(const Tensor &a, TT_LOC);
Tensor exp(const Tensor &a, TT_LOC);
Tensor log(const Tensor &a, TT_LOC);
Tensor sqrt(const Tensor &a, TT_LOC);
Tensor relu(const Tensor &a, TT_LOC);
Tensor sigmoid(const Tensor &a, TT_LOC);
Tensor tanh(const Tensor &a, TT_LOC);
Tensor clamp(const Tensor &a, const std::optional<Scalar> &min = std::nullopt,
             const std::optional<Scalar> &max = std::nullopt, TT_LOC);
Tensor where(const Tensor &condition, const Tensor &self, const Tensor &other, TT_LOC);
Tensor where(const Tensor &condition, const Scalar &self, const Tensor &other, TT_LOC);
Tensor where(const Tensor &condition, const Tensor &self, const Scalar &other, TT_LOC);
Tensor where(const Tensor &condition, const Scalar &self, const Scalar &other, TT_LOC);
Tensor sum(const Tensor &a, TT_LOC);
Tensor sum(const Tensor &a, IntArrayRef dim, bool keepdim = false, TT_LOC);
Tensor mean(const Tensor &a, TT_LOC);
Tensor mean(const Tensor &a, IntArrayRef dim, bool keepdim = false, TT_LOC);
Tensor max(const Tensor &a, TT_LOC);
std::tuple<Tensor, Tensor> max(const Tensor &a, std::int64_t dim, bool keepdim = false, TT_LOC);
Tensor min(const Tensor &a, TT_LOC);
std::tuple<Tensor, Tensor> min(const Tensor &a, std::int64_t dim, bool keepdim = false, TT_LOC);
Tensor argmax(const Tensor &a, std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false, TT_LOC);
Tensor argmin(const Tensor &a, std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false, TT_LOC);
Tensor matmul(const Tensor &a, const Tensor &b, TT_LOC);
Tensor mm(const Tensor &a, const Tensor &b, TT_LOC);
Tensor bmm(const Tensor &a, const Tensor &b, TT_LOC);
Tensor cat(TensorList tensors, std::int64_t dim = 0, TT_LOC);
Tensor stack(TensorList tensors, std::int64_t dim = 0, TT_LOC);
Tensor transpose(const Tensor &a, std::int64_t dim0, std::int64_t dim1, TT_LOC);
Tensor reshape(const Tensor &a, IntArrayRef shape, TT_LOC);
Tensor flatten(const Tensor &a, std::int64_t start_dim = 0, std::int64_t end_dim = -1, TT_LOC);
Tensor squeeze(const Tensor &a, TT_LOC);
Tensor unsqueeze(const Tensor &a, std::int64_t dim, TT_LOC);
Tensor clone(const Tensor &a, TT_LOC);
bool allclose(const Tensor &a, const Tensor &b, double rtol = 1e-05, double atol = 1e-08, bool equal_nan = false);
bool equal(const Tensor &a, const Tensor &b);
// torch.result_type for two tensors.
ScalarType result_type(const Tensor &a, const Tensor &b);

// --- grad mode ------------------------------------------------------------------------
bool is_grad_enabled();
void set_grad_enabled(bool enabled);
// torch::NoGradGuard: disables autograd recording in its scope (per thread).
class NoGradGuard {
public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard &) = delete;
  NoGradGuard &operator=(const NoGradGuard &) = delete;

private:
  bool prev_;
};
class AutoGradMode {
public:
  explicit AutoGradMode(bool enabled);
  ~AutoGradMode();
  AutoGradMode(const AutoGradMode &) = delete;
  AutoGradMode &operator=(const AutoGradMode &) = delete;

private:
  bool prev_;
};

namespace autograd {
// A node of the backward graph (grad_fn). name() is PyTorch's, e.g. "MulBackward0".
class Node {
public:
  virtual ~Node() = default;
  virtual std::string name() const = 0;
};
} // namespace autograd

// --- memory statistics (per device type) ----------------------------------------------
enum class CopyKind : std::uint8_t { Clone, Contiguous, To, Copy_, ImplicitReshape, ImplicitFlatten, Other };
inline constexpr int kNumCopyKinds = 7;
const char *toString(CopyKind k); // "clone", "contiguous", "to", "copy_", "reshape", "flatten", "other"

struct MemoryStats {
  std::int64_t current_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t allocations = 0; // storages allocated since start / reset
  std::int64_t frees = 0;
  // Bytes currently allocated on the device and their peak, on every device
  // (torch.cuda.memory_allocated / max_memory_allocated): on CUDA the caching
  // allocator's blocks as it rounds them, on CPU (no cache) current_bytes and
  // peak_bytes.
  std::int64_t allocated_bytes = 0, peak_allocated_bytes = 0;
  // CUDA caching allocator (0 on CPU): torch.cuda.memory_reserved and its
  // peak; cudaMalloc / cudaFree calls.
  std::int64_t reserved_bytes = 0, peak_reserved_bytes = 0;
  std::int64_t device_mallocs = 0, device_frees = 0;
  std::int64_t copies[kNumCopyKinds] = {};      // copies made, by kind
  std::int64_t copied_bytes[kNumCopyKinds] = {}; // bytes written by them
  std::int64_t copies_of(CopyKind k) const { return copies[static_cast<int>(k)]; }
  std::int64_t total_copies() const;
};
MemoryStats memory_stats(Device device = Device(kCPU));
// Peak := current, counters := 0 (current bytes stay).
void reset_memory_stats(Device device = Device(kCPU));

// --- trace ------------------------------------------------------------------------------
namespace trace {
// Whether events are being written (TT_TRACE=<file> at start-up, or start()).
bool enabled();
// Whether trace support is compiled in (false with -DTT_TRACE=OFF).
bool available();
// Start writing JSON Lines events to path (truncating it); false if it cannot
// be opened or the runtime was built with -DTT_TRACE=OFF.
bool start(const std::string &path);
void stop();
} // namespace trace

namespace cuda {
bool is_available();
int device_count();
void synchronize();
} // namespace cuda

} // namespace tt
