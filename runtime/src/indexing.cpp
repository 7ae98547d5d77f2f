// t.index({...}) / index_put_ / operator[]: integers, slices, None and
// Ellipsis are views (select/slice/unsqueeze); one tensor index (long/int
// positions or a bool mask) gathers a copy, or scatters for index_put_.
#include "autograd.h"
#include "internal.h"

#include <cstdio>

namespace tt {
namespace indexing {

Slice::Slice(std::optional<std::int64_t> start, std::optional<std::int64_t> stop,
             std::optional<std::int64_t> step)
    : start_(start.value_or(0)), stop_(stop.value_or(INT64_MAX)), step_(step.value_or(1)) {
  if (step_ == 0)
    fail("slice step cannot be zero");
}

TensorIndex::TensorIndex(const char *s) : kind_(Kind::Ellipsis) {
  if (std::string(s) != "...")
    fail("Expected \"...\" to represent an ellipsis index, but got \"" + std::string(s) + "\"");
}
TensorIndex::TensorIndex(Tensor t)
    : kind_(Kind::Tensor), tensor_(std::make_shared<Tensor>(std::move(t))) {}
TensorIndex::~TensorIndex() = default;
TensorIndex::TensorIndex(const TensorIndex &) = default;
TensorIndex &TensorIndex::operator=(const TensorIndex &) = default;
const Tensor &TensorIndex::tensor() const { return *tensor_; }

} // namespace indexing

namespace {
using indexing::TensorIndex;

// The result of the basic indices, plus at most one tensor index applied at
// dim `dim` of `view` (advanced indexing: gathers, i.e. copies).
struct Indexed {
  Tensor view;
  const Tensor *index = nullptr;
  std::int64_t dim = 0;
};

// r.select(dim, k) with indexing's bounds message.
Tensor selectChecked(const Tensor &r, std::int64_t dim, std::int64_t k) {
  std::int64_t n = r.size(dim);
  if (k < -n || k >= n)
    fail("index " + std::to_string(k) + " is out of bounds for dimension " + std::to_string(dim) +
         " with size " + std::to_string(n));
  return r.select(dim, k);
}

Indexed applyIndices(const Tensor &self, ArrayRef<TensorIndex> indices) {
  std::int64_t consumed = 0;
  for (const TensorIndex &i : indices) {
    if (i.kind() == TensorIndex::Kind::Integer || i.kind() == TensorIndex::Kind::Slice)
      ++consumed;
    else if (i.kind() == TensorIndex::Kind::Tensor)
      consumed += i.tensor().dtype() == kBool ? std::max<std::int64_t>(i.tensor().dim(), 1) : 1;
  }
  if (consumed > self.dim())
    fail("too many indices for tensor of dimension " + std::to_string(self.dim()));
  Indexed out;
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
    case TensorIndex::Kind::Integer:
      r = selectChecked(r, dim, i.integer());
      break;
    case TensorIndex::Kind::Slice: {
      const indexing::Slice &s = i.slice();
      r = r.slice(dim, s.start(), s.stop() == INT64_MAX ? std::optional<std::int64_t>() : s.stop(),
                  s.step());
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
      if (i.tensor().dim() == 0 && isIntegralType(i.tensor().dtype(), false)) {
        r = selectChecked(r, dim, i.tensor().item<std::int64_t>()); // LibTorch: an integer, a view
        break;
      }
      if (out.index)
        fail("tt: indexing with more than one tensor is not supported");
      out.index = &i.tensor();
      out.dim = dim;
      dim += i.tensor().dtype() == kBool ? std::max<std::int64_t>(i.tensor().dim(), 1) : 1;
      break;
    }
  }
  out.view = r;
  return out;
}

Tensor rawSelect(const Tensor &t, std::int64_t d, std::int64_t i) {
  std::vector<std::int64_t> sz = t.sizes().vec(), st = t.strides().vec();
  std::int64_t off = t.storage_offset() + i * st[d];
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  return makeView(t, sz, st, off);
}

// The positions a tensor index selects in dims [d, d+k) of src: k indices
// each, in order; and the shape the selected dims become.
struct Positions {
  std::vector<std::vector<std::int64_t>> at;
  std::vector<std::int64_t> shape;
  std::int64_t k = 1;
};

Positions positionsOf(const Tensor &src, std::int64_t d, const Tensor &index) {
  Positions p;
  if (index.dtype() == kBool) {
    Tensor mask = index.dim() == 0 ? index.reshape({1}) : index;
    p.k = mask.dim();
    for (std::int64_t j = 0; j < p.k; ++j)
      if (d + j >= src.dim() || mask.size(j) != src.size(d + j))
        fail("The shape of the mask " + shapeString(mask.sizes()) + " at index " +
             std::to_string(j) + " does not match the shape of the indexed tensor " +
             shapeString(src.sizes()) + " at index " + std::to_string(d + j));
    Tensor m = mask.cpu().contiguous();
    const bool *mp = m.data_ptr<bool>();
    std::vector<std::int64_t> idx(static_cast<std::size_t>(p.k), 0);
    for (std::int64_t n = 0, total = m.numel(); n < total; ++n) {
      if (mp[n])
        p.at.push_back(idx);
      for (std::int64_t j = p.k - 1; j >= 0; --j) {
        if (++idx[j] < m.size(j))
          break;
        idx[j] = 0;
      }
    }
    p.shape = {static_cast<std::int64_t>(p.at.size())};
    return p;
  }
  if (index.dtype() != kLong && index.dtype() != kInt)
    fail("tensors used as indices must be long, int, byte or bool tensors");
  Tensor ix = index.to(kLong).cpu().contiguous();
  const std::int64_t *ip = ix.data_ptr<std::int64_t>();
  std::int64_t n = src.size(d);
  for (std::int64_t j = 0, total = ix.numel(); j < total; ++j) {
    std::int64_t v = ip[j];
    if (v < -n || v >= n)
      fail("index " + std::to_string(v) + " is out of bounds for dimension " + std::to_string(d) +
           " with size " + std::to_string(n));
    p.at.push_back({v < 0 ? v + n : v});
  }
  p.shape = ix.sizes().vec();
  return p;
}

Tensor selectAt(Tensor t, std::int64_t d, const std::vector<std::int64_t> &pos) {
  for (std::int64_t i : pos)
    t = rawSelect(t, d, i);
  return t;
}

// out = src[..., index, ...] at dim d (a copy).
Tensor gather(const Tensor &src, std::int64_t d, const Tensor &index) {
  Positions p = positionsOf(src, d, index);
  std::int64_t m = static_cast<std::int64_t>(p.at.size());
  std::vector<std::int64_t> pre(src.sizes().begin(), src.sizes().begin() + d);
  std::vector<std::int64_t> post(src.sizes().begin() + d + p.k, src.sizes().end());
  std::vector<std::int64_t> flat = pre, shape = pre;
  flat.push_back(m);
  flat.insert(flat.end(), post.begin(), post.end());
  shape.insert(shape.end(), p.shape.begin(), p.shape.end());
  shape.insert(shape.end(), post.begin(), post.end());
  Tensor out = makeContiguous(flat, src.dtype(), src.device());
  for (std::int64_t j = 0; j < m; ++j)
    copyData(rawSelect(out, d, j), selectAt(src, d, p.at[j]), CopyKind::Other);
  out = Tensor(std::make_shared<TensorImpl>(out.unsafeGetTensorImpl()->storage, shape,
                                            contiguousStrides(shape), 0, src.dtype(), nullptr));
  if (autograd::shouldRecord({&src})) {
    std::vector<std::int64_t> in = src.sizes().vec();
    auto at = p.at;
    auto fn = std::make_shared<autograd::LambdaNode>(
        "IndexBackward0", [in, d, at, flat](const std::vector<Tensor> &g, autograd::LambdaNode &) {
          Tensor z = zeros(in, g[0].options());
          Tensor gf = g[0].reshape(flat);
          for (std::size_t j = 0; j < at.size(); ++j)
            selectAt(z, d, at[j]).add_(rawSelect(gf, d, static_cast<std::int64_t>(j)));
          return std::vector<Tensor>{z};
        });
    autograd::setHistory({out}, fn, {&src});
  }
  return out;
}

// PyTorch 1.13 only warns (once) before index_put_ into an expanded tensor:
// the write goes to the shared elements.
void warnIfExpanded(const Tensor &self) {
  static bool warned = false;
  const TensorImpl &t = *self.unsafeGetTensorImpl();
  if (warned || t.is_non_overlapping_and_dense())
    return;
  for (std::size_t i = 0; i < t.sizes.size(); ++i)
    if (t.strides[i] == 0 && t.sizes[i] > 1) {
      warned = true;
      std::fprintf(
          stderr,
          "UserWarning: Use of index_put_ on expanded tensors is deprecated. Please clone() the "
          "tensor before performing this operation. This also applies to advanced indexing e.g. "
          "tensor[indices] = tensor\n");
      return;
    }
}

// dst[..., index, ...] = rhs (broadcast), one version bump.
void scatter(const Tensor &self, const Tensor &dst, std::int64_t d, const Tensor &index,
             const Tensor &rhs) {
  if (autograd::shouldRecord({&self, &rhs}))
    fail("tt: index_put_ with a tensor index on tensors that require grad is not supported");
  autograd::checkInplace(self);
  warnIfExpanded(self);
  assertNoPartialOverlap(*self.unsafeGetTensorImpl(), *rhs.unsafeGetTensorImpl());
  Positions p = positionsOf(dst, d, index);
  std::int64_t m = static_cast<std::int64_t>(p.at.size());
  std::vector<std::int64_t> pre(dst.sizes().begin(), dst.sizes().begin() + d);
  std::vector<std::int64_t> post(dst.sizes().begin() + d + p.k, dst.sizes().end());
  std::vector<std::int64_t> flat = pre, shape = pre;
  flat.push_back(m);
  flat.insert(flat.end(), post.begin(), post.end());
  shape.insert(shape.end(), p.shape.begin(), p.shape.end());
  shape.insert(shape.end(), post.begin(), post.end());
  std::vector<std::int64_t> b = broadcastShapes(shape, rhs.sizes());
  if (!IntArrayRef(b).equals(shape))
    fail("shape mismatch: value tensor of shape " + shapeString(rhs.sizes()) +
         " cannot be broadcast to indexing result of shape " + shapeString(shape));
  Tensor vals = makeContiguous(shape, dst.dtype(), dst.device());
  copyData(vals, rhs, CopyKind::Other);
  vals = makeView(vals, flat, contiguousStrides(flat), 0);
  std::uint32_t before = self._version();
  for (std::int64_t j = 0; j < m; ++j)
    copyData(selectAt(dst, d, p.at[j]), rawSelect(vals, d, j), CopyKind::Other);
  bumpVersion(self, "index_put_", before);
}
} // namespace

Tensor Tensor::index(ArrayRef<indexing::TensorIndex> indices, SourceLocation loc) const {
  trace::Scope scope("index", loc);
  Indexed ix = applyIndices(*this, indices);
  Tensor out = ix.index ? gather(ix.view, ix.dim, *ix.index) : ix.view;
  if (out.is_same(*this))
    out = makeView(*this, sizes(), strides(), storage_offset());
  if (trace::on()) // a tensor index copies: its own row of ops.def
    trace::op(ix.index ? "index_tensor" : "index", {this}, out);
  return out;
}
Tensor Tensor::index(std::initializer_list<indexing::TensorIndex> indices,
                     SourceLocation loc) const {
  return index(ArrayRef<indexing::TensorIndex>(indices.begin(), indices.size()), loc);
}
Tensor &Tensor::index_put_(ArrayRef<indexing::TensorIndex> indices, const Tensor &rhs,
                           SourceLocation loc) const {
  trace::Scope scope("index_put_", loc);
  Indexed ix = applyIndices(*this, indices);
  if (ix.index)
    scatter(*this, ix.view, ix.dim, *ix.index, rhs);
  else
    ix.view.copy_(rhs);
  if (trace::on())
    trace::op("index_put_", {this, &rhs}, *this);
  return const_cast<Tensor &>(*this);
}
Tensor &Tensor::index_put_(ArrayRef<indexing::TensorIndex> indices, const Scalar &v,
                           SourceLocation loc) const {
  trace::Scope scope("index_put_", loc);
  Indexed ix = applyIndices(*this, indices);
  if (ix.index)
    scatter(*this, ix.view, ix.dim, *ix.index,
            scalar_tensor(v, TensorOptions(device()).dtype(dtype())));
  else
    ix.view.fill_(v);
  if (trace::on())
    trace::op("index_put_", {this}, *this);
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
Tensor Tensor::operator[](const Tensor &i) const {
  return index({indexing::TensorIndex(i)}, SourceLocation{});
}

} // namespace tt
