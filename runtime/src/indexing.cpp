// t.index({...}) / index_put_ / operator[]: integers, slices, None and
// Ellipsis are views (select/slice/unsqueeze); tensor indices are not
// supported yet and say so.
#include "internal.h"

namespace tt {
namespace indexing {

Slice::Slice(std::optional<std::int64_t> start, std::optional<std::int64_t> stop, std::optional<std::int64_t> step)
    : start_(start.value_or(0)), stop_(stop.value_or(INT64_MAX)), step_(step.value_or(1)) {
  if (step_ == 0)
    fail("slice step cannot be zero");
}

TensorIndex::TensorIndex(const char *s) : kind_(Kind::Ellipsis) {
  if (std::string(s) != "...")
    fail("Expected \"...\" to represent an ellipsis index, but got \"" + std::string(s) + "\"");
}
TensorIndex::TensorIndex(Tensor t) : kind_(Kind::Tensor), tensor_(std::make_shared<Tensor>(std::move(t))) {}
TensorIndex::~TensorIndex() = default;
TensorIndex::TensorIndex(const TensorIndex &) = default;
TensorIndex &TensorIndex::operator=(const TensorIndex &) = default;
const Tensor &TensorIndex::tensor() const { return *tensor_; }

} // namespace indexing

namespace {
using indexing::TensorIndex;

Tensor applyIndices(const Tensor &self, ArrayRef<TensorIndex> indices) {
  std::int64_t consumed = 0;
  for (const TensorIndex &i : indices)
    if (i.kind() == TensorIndex::Kind::Integer || i.kind() == TensorIndex::Kind::Slice ||
        i.kind() == TensorIndex::Kind::Tensor)
      ++consumed;
  if (consumed > self.dim())
    fail("too many indices for tensor of dimension " + std::to_string(self.dim()));
  Tensor r = self;
  std::int64_t dim = 0;
  for (const TensorIndex &i : indices) {
    switch (i.kind()) {
    case TensorIndex::Kind::None:
      r = r.unsqueeze(dim++);
      break;
    case TensorIndex::Kind::Ellipsis:
      dim += self.dim() - consumed;
      break;
    case TensorIndex::Kind::Integer: {
      std::int64_t n = r.size(dim);
      std::int64_t k = i.integer();
      if (k < -n || k >= n)
        fail("index " + std::to_string(k) + " is out of bounds for dimension " + std::to_string(dim) +
             " with size " + std::to_string(n));
      r = r.select(dim, k);
      break;
    }
    case TensorIndex::Kind::Slice: {
      const indexing::Slice &s = i.slice();
      r = r.slice(dim, s.start(), s.stop() == INT64_MAX ? std::optional<std::int64_t>() : s.stop(), s.step());
      ++dim;
      break;
    }
    case TensorIndex::Kind::Boolean:
      r = r.unsqueeze(dim);
      if (!i.boolean())
        r = r.slice(dim, 0, 0);
      ++dim;
      break;
    case TensorIndex::Kind::Tensor:
      fail("tt: indexing with a tensor (advanced indexing) is not supported; use integers and slices");
    }
  }
  return r;
}
} // namespace

Tensor Tensor::index(ArrayRef<indexing::TensorIndex> indices, SourceLocation loc) const {
  trace::Scope scope("index", loc);
  Tensor out = applyIndices(*this, indices);
  if (out.is_same(*this))
    out = makeView(*this, sizes(), strides(), storage_offset());
  if (trace::on())
    trace::op("index", {this}, out);
  return out;
}
Tensor Tensor::index(std::initializer_list<indexing::TensorIndex> indices, SourceLocation loc) const {
  return index(ArrayRef<indexing::TensorIndex>(indices.begin(), indices.size()), loc);
}
Tensor &Tensor::index_put_(ArrayRef<indexing::TensorIndex> indices, const Tensor &rhs, SourceLocation loc) const {
  trace::Scope scope("index_put_", loc);
  applyIndices(*this, indices).copy_(rhs);
  return const_cast<Tensor &>(*this);
}
Tensor &Tensor::index_put_(ArrayRef<indexing::TensorIndex> indices, const Scalar &v, SourceLocation loc) const {
  trace::Scope scope("index_put_", loc);
  applyIndices(*this, indices).fill_(v);
  return const_cast<Tensor &>(*this);
}
Tensor &Tensor::index_put_(std::initializer_list<indexing::TensorIndex> indices, const Tensor &rhs,
                           SourceLocation loc) const {
  return index_put_(ArrayRef<indexing::TensorIndex>(indices.begin(), indices.size()), rhs, loc);
}
Tensor &Tensor::index_put_(std::initializer_list<indexing::TensorIndex> indices, const Scalar &v,
                           SourceLocation loc) const {
  return index_put_(ArrayRef<indexing::TensorIndex>(indices.begin(), indices.size()), v, loc);
}
// Operators cannot take a defaulted location: events get none (null).
Tensor Tensor::operator[](std::int64_t i) const { return select(0, i, SourceLocation{}); }
Tensor Tensor::operator[](const Tensor &i) const { return index({indexing::TensorIndex(i)}, SourceLocation{}); }

} // namespace tt
