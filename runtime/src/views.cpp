// Views (share storage and version counter), copies (clone, contiguous, to,
// copy_), detach, and indexing. Reshape follows PyTorch's computeStride:
// a view whenever the new shape can be expressed with strides, else a copy.
#include "autograd.h"
#include "internal.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <sstream>

namespace tt {

using autograd::LambdaNode;

namespace {

// Records a single-input differentiable op: backward maps the output's
// gradient to the input's.
template <typename Back> void recordUnary(const Tensor &self, const Tensor &out, const char *node, Back back) {
  if (!autograd::shouldRecord({&self}))
    return;
  auto fn = std::make_shared<LambdaNode>(node, [back](const std::vector<Tensor> &g, LambdaNode &) {
    return std::vector<Tensor>{g[0].defined() ? back(g[0]) : Tensor()};
  });
  autograd::setHistory({out}, fn, {&self});
}

Tensor finishView(const Tensor &self, Tensor out, const char *op) {
  if (trace::on())
    trace::op(op, {&self}, out);
  return out;
}

// PyTorch's infer_size: one -1 inferred, numel must match.
std::vector<std::int64_t> inferSize(IntArrayRef shape, std::int64_t numel) {
  std::vector<std::int64_t> res = shape.vec();
  std::int64_t newsize = 1;
  std::optional<std::size_t> infer;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer)
        fail("only one dimension can be inferred");
      infer = i;
    } else if (shape[i] >= 0) {
      newsize *= shape[i];
    } else {
      fail("invalid shape dimension " + std::to_string(shape[i]));
    }
  }
  if (numel == newsize || (infer && newsize > 0 && numel % newsize == 0)) {
    if (infer) {
      if (newsize == 0)
        fail("cannot reshape tensor of 0 elements into shape " + shapeString(shape) +
             " because the unspecified dimension size -1 can be any value and is ambiguous");
      res[*infer] = numel / newsize;
    }
    return res;
  }
  fail("shape '" + shapeString(shape) + "' is invalid for input of size " + std::to_string(numel));
}

// PyTorch's computeStride (aten/src/ATen/TensorUtils.cpp): the strides of a
// view of (oldshape, oldstride) with newshape, or nullopt when none exists.
std::optional<std::vector<std::int64_t>> computeStride(IntArrayRef oldshape, IntArrayRef oldstride,
                                                        IntArrayRef newshape) {
  if (oldshape.empty())
    return std::vector<std::int64_t>(newshape.size(), 1);
  std::int64_t numel = 1;
  for (auto s : oldshape)
    numel *= s;
  if (numel == 0 && oldshape.equals(newshape))
    return oldstride.vec();
  std::vector<std::int64_t> newstride(newshape.size());
  if (numel == 0) {
    for (std::int64_t view_d = static_cast<std::int64_t>(newshape.size()) - 1; view_d >= 0; view_d--) {
      if (view_d == static_cast<std::int64_t>(newshape.size()) - 1)
        newstride[view_d] = 1;
      else
        newstride[view_d] = std::max<std::int64_t>(newshape[view_d + 1], 1) * newstride[view_d + 1];
    }
    return newstride;
  }
  std::int64_t view_d = static_cast<std::int64_t>(newshape.size()) - 1;
  std::int64_t chunk_base_stride = oldstride.back();
  std::int64_t tensor_numel = 1;
  std::int64_t view_numel = 1;
  for (std::int64_t tensor_d = static_cast<std::int64_t>(oldshape.size()) - 1; tensor_d >= 0; tensor_d--) {
    tensor_numel *= oldshape[tensor_d];
    if (tensor_d == 0 ||
        (oldshape[tensor_d - 1] != 1 && oldstride[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || newshape[view_d] == 1)) {
        newstride[view_d] = view_numel * chunk_base_stride;
        view_numel *= newshape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel)
        return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = oldstride[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1)
    return std::nullopt;
  return newstride;
}

Tensor viewImpl(const Tensor &self, IntArrayRef size, const char *node) {
  std::vector<std::int64_t> shape = inferSize(size, self.numel());
  auto stride = computeStride(self.sizes(), self.strides(), shape);
  if (!stride)
    fail("view size is not compatible with input tensor's size and stride (at least one dimension spans across "
         "two contiguous subspaces). Use .reshape(...) instead.");
  Tensor out = makeView(self, shape, *stride, self.storage_offset());
  std::vector<std::int64_t> in = self.sizes().vec();
  recordUnary(self, out, node, [in](const Tensor &g) { return g.reshape(in); });
  return out;
}

// reshape/flatten: a view when possible, else a contiguous copy (counted
// under `kind`).
Tensor reshapeImpl(const Tensor &self, IntArrayRef proposed, CopyKind kind) {
  std::vector<std::int64_t> shape = inferSize(proposed, self.numel());
  if (auto stride = computeStride(self.sizes(), self.strides(), shape)) {
    Tensor out = makeView(self, shape, *stride, self.storage_offset());
    std::vector<std::int64_t> in = self.sizes().vec();
    recordUnary(self, out, "ReshapeAliasBackward0", [in](const Tensor &g) { return g.reshape(in); });
    return out;
  }
  const TensorImpl &s = *self.unsafeGetTensorImpl();
  Tensor copy = makeContiguous(s.sizes, s.dtype, s.storage->device());
  copyData(copy, self, kind);
  // _unsafe_view: the copy's storage with the new shape, not a view.
  Tensor out(std::make_shared<TensorImpl>(copy.unsafeGetTensorImpl()->storage, shape, contiguousStrides(shape), 0,
                                          s.dtype, nullptr));
  std::vector<std::int64_t> in = self.sizes().vec();
  recordUnary(self, out, "UnsafeViewBackward0", [in](const Tensor &g) { return g.reshape(in); });
  return out;
}

// Sums g down to `shape` (the inverse of broadcasting/expand).
Tensor sumTo(const Tensor &g, IntArrayRef shape) {
  if (g.sizes().equals(shape))
    return g;
  std::vector<std::int64_t> dims;
  std::int64_t lead = g.dim() - static_cast<std::int64_t>(shape.size());
  for (std::int64_t i = 0; i < g.dim(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g.size(i) != 1))
      dims.push_back(i);
  Tensor r = dims.empty() ? g : g.sum(dims, true);
  return r.reshape(shape);
}

Tensor sliceImpl(const Tensor &self, std::int64_t dim, std::optional<std::int64_t> start_opt,
                 std::optional<std::int64_t> end_opt, std::int64_t step) {
  if (self.dim() == 0)
    fail("slice() cannot be applied to a 0-dim tensor.");
  dim = wrapDim(dim, self.dim());
  if (step <= 0)
    fail("slice step must be positive");
  std::int64_t n = self.size(dim);
  std::int64_t start = start_opt.value_or(0), end = end_opt.value_or(n);
  if (start < 0)
    start += n;
  if (end < 0)
    end += n;
  start = std::clamp<std::int64_t>(start, 0, n);
  end = std::clamp<std::int64_t>(end, start, n);
  std::vector<std::int64_t> sizes = self.sizes().vec(), strides = self.strides().vec();
  sizes[dim] = (end - start + step - 1) / step;
  strides[dim] *= step;
  Tensor out = makeView(self, sizes, strides, self.storage_offset() + start * self.stride(dim));
  std::vector<std::int64_t> in = self.sizes().vec();
  recordUnary(self, out, "SliceBackward0", [in, dim, start, end, step](const Tensor &g) {
    Tensor z = zeros(in, g.options());
    z.slice(dim, start, end, step).copy_(g);
    return z;
  });
  return out;
}

Tensor selectImpl(const Tensor &self, std::int64_t dim, std::int64_t index, const char *node) {
  if (self.dim() == 0)
    fail("select() cannot be applied to a 0-dim tensor.");
  dim = wrapDim(dim, self.dim());
  std::int64_t n = self.size(dim);
  if (index < -n || index >= n) {
    std::ostringstream os;
    os << "select(): index " << index << " out of range for tensor of size " << shapeString(self.sizes())
       << " at dimension " << dim;
    fail(os.str());
  }
  if (index < 0)
    index += n;
  std::vector<std::int64_t> sizes = self.sizes().vec(), strides = self.strides().vec();
  std::int64_t off = self.storage_offset() + index * strides[dim];
  sizes.erase(sizes.begin() + dim);
  strides.erase(strides.begin() + dim);
  Tensor out = makeView(self, sizes, strides, off);
  std::vector<std::int64_t> in = self.sizes().vec();
  recordUnary(self, out, node, [in, dim, index](const Tensor &g) {
    Tensor z = zeros(in, g.options());
    z.select(dim, index).copy_(g);
    return z;
  });
  return out;
}

Tensor narrowImpl(const Tensor &self, std::int64_t dim, std::int64_t start, std::int64_t length) {
  if (self.dim() == 0)
    fail("narrow() cannot be applied to a 0-dim tensor.");
  dim = wrapDim(dim, self.dim());
  std::int64_t n = self.size(dim);
  if (start < -n || start > n) {
    std::ostringstream os;
    os << "start out of range (expected to be in range of [" << -n << ", " << n << "], but got " << start << ")";
    fail(os.str());
  }
  if (start < 0)
    start += n;
  if (length < 0 || start > n - length) {
    std::ostringstream os;
    os << "start (" << start << ") + length (" << length << ") exceeds dimension size (" << n << ").";
    fail(os.str());
  }
  return sliceImpl(self, dim, start, start + length, 1);
}

// Checks the in-place write preconditions shared by every in-place op.
void checkWritable(const Tensor &self) {
  autograd::checkInplace(self);
  assertNoInternalOverlap(*self.unsafeGetTensorImpl());
}

bool canCast(ScalarType from, ScalarType to) {
  if (isFloatingType(from) && !isFloatingType(to))
    return false;
  if (from != kBool && to == kBool)
    return false;
  return true;
}

Tensor toImpl(const Tensor &self, ScalarType dt, Device dev, bool copy, std::optional<MemoryFormat> fmt,
              bool non_blocking = false) {
  const TensorImpl &s = *self.unsafeGetTensorImpl();
  bool sameFormat = !fmt || *fmt == MemoryFormat::Preserve || self.is_contiguous();
  if (dt == s.dtype && dev.type() == s.storage->device().type() && !copy && sameFormat)
    return self;
  std::vector<std::int64_t> strides =
      fmt && *fmt == MemoryFormat::Contiguous ? contiguousStrides(s.sizes) : preservedStrides(s);
  // PyTorch: a non_blocking copy to the CPU lands in pinned memory, so that it
  // can really be asynchronous.
  const bool pin = non_blocking && dev.is_cpu() && s.storage->device().is_cuda();
  Tensor out = makeTensor(s.sizes, strides, dt, dev, pin);
  copyData(out, self, CopyKind::To, non_blocking);
  if (isFloatingType(dt)) {
    ScalarType from = s.dtype;
    Device fromDev = s.storage->device();
    recordUnary(self, out, "ToCopyBackward0", [from, fromDev](const Tensor &g) { return g.to(fromDev, from); });
  }
  return out;
}

Tensor cloneImpl(const Tensor &self, MemoryFormat fmt, CopyKind kind) {
  const TensorImpl &s = *self.unsafeGetTensorImpl();
  std::vector<std::int64_t> strides = fmt == MemoryFormat::Contiguous ? contiguousStrides(s.sizes) : denseStridesLike(s);
  Tensor out = makeTensor(s.sizes, strides, s.dtype, s.storage->device());
  copyData(out, self, kind);
  recordUnary(self, out, "CloneBackward0", [](const Tensor &g) { return g; });
  return out;
}

} // namespace

namespace detail_views {
Tensor sumToShape(const Tensor &g, IntArrayRef shape) { return sumTo(g, shape); }
bool canCastTo(ScalarType from, ScalarType to) { return canCast(from, to); }
} // namespace detail_views

// --- views ------------------------------------------------------------------------------------
Tensor Tensor::view(IntArrayRef size, SourceLocation loc) const {
  trace::Scope scope("view", loc);
  return finishView(*this, viewImpl(*this, size, "ViewBackward0"), "view");
}

Tensor Tensor::view(ScalarType dt, SourceLocation loc) const {
  trace::Scope scope("view", loc);
  if (elementSize(dt) != element_size())
    fail("tt: view(dtype) between dtypes of different sizes is not supported");
  Tensor out = makeView(*this, sizes(), strides(), storage_offset());
  out.unsafeGetTensorImpl()->dtype = dt;
  return finishView(*this, out, "view");
}

Tensor Tensor::view_as(const Tensor &other, SourceLocation loc) const {
  trace::Scope scope("view_as", loc);
  return finishView(*this, viewImpl(*this, other.sizes(), "ViewBackward0"), "view_as");
}

Tensor Tensor::reshape(IntArrayRef shape, SourceLocation loc) const {
  trace::Scope scope("reshape", loc);
  return finishView(*this, reshapeImpl(*this, shape, CopyKind::ImplicitReshape), "reshape");
}

Tensor Tensor::reshape_as(const Tensor &other, SourceLocation loc) const {
  trace::Scope scope("reshape_as", loc);
  return finishView(*this, reshapeImpl(*this, other.sizes(), CopyKind::ImplicitReshape), "reshape_as");
}

Tensor Tensor::flatten(std::int64_t start_dim, std::int64_t end_dim, SourceLocation loc) const {
  trace::Scope scope("flatten", loc);
  if (dim() == 0)
    return finishView(*this, reshapeImpl(*this, {1}, CopyKind::ImplicitFlatten), "flatten");
  start_dim = wrapDim(start_dim, dim());
  end_dim = wrapDim(end_dim, dim());
  if (start_dim > end_dim)
    fail("flatten() has invalid args: start_dim cannot come after end_dim");
  if (start_dim == end_dim)
    return finishView(*this, *this, "flatten"); // PyTorch returns self
  std::vector<std::int64_t> shape;
  std::int64_t prod = 1;
  for (std::int64_t i = 0; i < dim(); ++i) {
    if (i < start_dim || i > end_dim)
      shape.push_back(size(i));
    else
      prod *= size(i);
    if (i == end_dim)
      shape.push_back(prod);
  }
  return finishView(*this, reshapeImpl(*this, shape, CopyKind::ImplicitFlatten), "flatten");
}

Tensor Tensor::transpose(std::int64_t d0, std::int64_t d1, SourceLocation loc) const {
  trace::Scope scope("transpose", loc);
  std::int64_t nd = dim();
  d0 = wrapDim(d0, nd);
  d1 = wrapDim(d1, nd);
  std::vector<std::int64_t> sz = sizes().vec(), st = strides().vec();
  if (nd > 0) {
    std::swap(sz[d0], sz[d1]);
    std::swap(st[d0], st[d1]);
  }
  Tensor out = makeView(*this, sz, st, storage_offset());
  recordUnary(*this, out, "TransposeBackward0", [d0, d1](const Tensor &g) { return g.transpose(d0, d1); });
  return finishView(*this, out, "transpose");
}

Tensor Tensor::t(SourceLocation loc) const {
  trace::Scope scope("t", loc);
  if (dim() > 2)
    fail("t() expects a tensor with <= 2 dimensions, but self is " + std::to_string(dim()) + "D");
  std::vector<std::int64_t> sz = sizes().vec(), st = strides().vec();
  std::reverse(sz.begin(), sz.end());
  std::reverse(st.begin(), st.end());
  Tensor out = makeView(*this, sz, st, storage_offset());
  recordUnary(*this, out, "TBackward0", [](const Tensor &g) { return g.t(); });
  return finishView(*this, out, "t");
}

Tensor Tensor::permute(IntArrayRef dims, SourceLocation loc) const {
  trace::Scope scope("permute", loc);
  std::int64_t nd = dim();
  if (static_cast<std::int64_t>(dims.size()) != nd) {
    std::ostringstream os;
    os << "permute(sparse_coo): number of dimensions in the tensor input does not match the length of the desired "
          "ordering of dimensions i.e. input.dim() = "
       << nd << " is not equal to len(dims) = " << dims.size();
    fail(os.str());
  }
  std::vector<std::int64_t> sz(nd), st(nd), inv(nd);
  std::vector<bool> seen(nd, false);
  for (std::int64_t i = 0; i < nd; ++i) {
    std::int64_t d = wrapDim(dims[i], nd);
    if (seen[d])
      fail("permute(): duplicate dims are not allowed.");
    seen[d] = true;
    sz[i] = size(d);
    st[i] = stride(d);
    inv[d] = i;
  }
  Tensor out = makeView(*this, sz, st, storage_offset());
  recordUnary(*this, out, "PermuteBackward0", [inv](const Tensor &g) { return g.permute(inv); });
  return finishView(*this, out, "permute");
}

Tensor Tensor::narrow(std::int64_t d, std::int64_t start, std::int64_t length, SourceLocation loc) const {
  trace::Scope scope("narrow", loc);
  return finishView(*this, narrowImpl(*this, d, start, length), "narrow");
}

Tensor Tensor::select(std::int64_t d, std::int64_t index, SourceLocation loc) const {
  trace::Scope scope("select", loc);
  return finishView(*this, selectImpl(*this, d, index, "SelectBackward0"), "select");
}

Tensor Tensor::slice(std::int64_t d, std::optional<std::int64_t> start, std::optional<std::int64_t> end,
                     std::int64_t step, SourceLocation loc) const {
  trace::Scope scope("slice", loc);
  return finishView(*this, sliceImpl(*this, d, start, end, step), "slice");
}

Tensor Tensor::squeeze(SourceLocation loc) const {
  trace::Scope scope("squeeze", loc);
  std::vector<std::int64_t> sz, st;
  for (std::int64_t i = 0; i < dim(); ++i)
    if (size(i) != 1) {
      sz.push_back(size(i));
      st.push_back(stride(i));
    }
  Tensor out = makeView(*this, sz, st, storage_offset());
  std::vector<std::int64_t> in = sizes().vec();
  recordUnary(*this, out, "SqueezeBackward0", [in](const Tensor &g) { return g.reshape(in); });
  return finishView(*this, out, "squeeze");
}

Tensor Tensor::squeeze(std::int64_t d, SourceLocation loc) const {
  trace::Scope scope("squeeze", loc);
  d = wrapDim(d, dim());
  std::vector<std::int64_t> sz = sizes().vec(), st = strides().vec();
  if (dim() > 0 && sz[d] == 1) {
    sz.erase(sz.begin() + d);
    st.erase(st.begin() + d);
  }
  Tensor out = makeView(*this, sz, st, storage_offset());
  std::vector<std::int64_t> in = sizes().vec();
  recordUnary(*this, out, "SqueezeBackward1", [in](const Tensor &g) { return g.reshape(in); });
  return finishView(*this, out, "squeeze");
}

Tensor Tensor::unsqueeze(std::int64_t d, SourceLocation loc) const {
  trace::Scope scope("unsqueeze", loc);
  d = wrapDim(d, dim() + 1);
  std::vector<std::int64_t> sz = sizes().vec(), st = strides().vec();
  std::int64_t ns = d >= dim() ? 1 : sz[d] * st[d];
  sz.insert(sz.begin() + d, 1);
  st.insert(st.begin() + d, ns);
  Tensor out = makeView(*this, sz, st, storage_offset());
  recordUnary(*this, out, "UnsqueezeBackward0", [d](const Tensor &g) { return g.squeeze(d); });
  return finishView(*this, out, "unsqueeze");
}

Tensor Tensor::expand(IntArrayRef size, bool, SourceLocation loc) const {
  trace::Scope scope("expand", loc);
  std::int64_t nd = dim(), ns = static_cast<std::int64_t>(size.size());
  if (ns < nd) {
    std::ostringstream os;
    os << "expand(" << typeString(*this) << "{" << shapeString(sizes()) << "}, size=" << shapeString(size)
       << "): the number of sizes provided (" << ns
       << ") must be greater or equal to the number of dimensions in the tensor (" << nd << ")";
    fail(os.str());
  }
  std::vector<std::int64_t> sz(ns), st(ns);
  for (std::int64_t i = ns - 1; i >= 0; --i) {
    std::int64_t off = nd - ns + i;
    std::int64_t cur = off >= 0 ? this->size(off) : 1;
    std::int64_t curStride = off >= 0 ? stride(off) : (i + 1 < ns ? sz[i + 1] * st[i + 1] : 1);
    std::int64_t target = size[i];
    if (target == -1) {
      if (off < 0)
        fail("The expanded size of the tensor (-1) isn't allowed in a leading, non-existing dimension " +
             std::to_string(i));
      target = cur;
    }
    if (cur != target) {
      if (cur != 1) {
        std::ostringstream os;
        os << "The expanded size of the tensor (" << target << ") must match the existing size (" << cur
           << ") at non-singleton dimension " << i << ".  Target sizes: " << shapeString(size)
           << ".  Tensor sizes: " << shapeString(sizes());
        fail(os.str());
      }
      curStride = 0;
    }
    sz[i] = target;
    st[i] = curStride;
  }
  Tensor out = makeView(*this, sz, st, storage_offset());
  std::vector<std::int64_t> in = sizes().vec();
  recordUnary(*this, out, "ExpandBackward0", [in](const Tensor &g) { return sumTo(g, in); });
  return finishView(*this, out, "expand");
}

Tensor Tensor::expand_as(const Tensor &other, SourceLocation loc) const {
  trace::Scope scope("expand_as", loc);
  return expand(other.sizes(), false, loc);
}

Tensor Tensor::as_strided(IntArrayRef size, IntArrayRef stride, std::optional<std::int64_t> offset,
                          SourceLocation loc) const {
  trace::Scope scope("as_strided", loc);
  if (size.size() != stride.size())
    fail("mismatch in length of strides and shape");
  std::int64_t off = offset.value_or(storage_offset());
  std::int64_t span = off;
  for (std::size_t i = 0; i < size.size(); ++i) {
    if (size[i] < 0 || stride[i] < 0)
      fail("as_strided: Negative strides are not supported at the moment, got strides: " + shapeString(stride));
    if (size[i] == 0)
      span = -1;
    else if (span >= 0)
      span += (size[i] - 1) * stride[i];
  }
  std::int64_t storageElems =
      static_cast<std::int64_t>(unsafeGetTensorImpl()->storage->nbytes() / element_size());
  if (span >= storageElems) {
    std::ostringstream os;
    os << "setStorage: sizes " << shapeString(size) << ", strides " << shapeString(stride)
       << ", storage offset " << off << ", and itemsize " << element_size() << " requiring a storage size of "
       << (span + 1) * static_cast<std::int64_t>(element_size()) << " are out of bounds for storage of size "
       << storageElems * static_cast<std::int64_t>(element_size());
    fail(os.str());
  }
  Tensor out = makeView(*this, size, stride, off);
  recordUnary(*this, out, "AsStridedBackward0", [](const Tensor &) -> Tensor {
    fail("tt: the derivative of as_strided is not implemented");
  });
  return finishView(*this, out, "as_strided");
}

Tensor Tensor::diagonal(std::int64_t offset, std::int64_t dim1, std::int64_t dim2, SourceLocation loc) const {
  trace::Scope scope("diagonal", loc);
  std::int64_t nd = dim();
  // PyTorch names the dims as given (diagonal(0, -1, 1) of a matrix: "-1, 1").
  std::string given = std::to_string(dim1) + ", " + std::to_string(dim2);
  dim1 = wrapDim(dim1, nd);
  dim2 = wrapDim(dim2, nd);
  if (dim1 == dim2)
    fail("diagonal dimensions cannot be identical " + given);
  std::int64_t off = storage_offset(), len;
  if (offset >= 0) {
    len = std::max<std::int64_t>(std::min(size(dim1), size(dim2) - offset), 0);
    off += offset * stride(dim2);
  } else {
    len = std::max<std::int64_t>(std::min(size(dim1) + offset, size(dim2)), 0);
    off -= offset * stride(dim1);
  }
  if (len == 0)
    off = storage_offset();
  std::vector<std::int64_t> sz, st;
  for (std::int64_t i = 0; i < nd; ++i)
    if (i != dim1 && i != dim2) {
      sz.push_back(size(i));
      st.push_back(stride(i));
    }
  sz.push_back(len);
  st.push_back(stride(dim1) + stride(dim2));
  Tensor out = makeView(*this, sz, st, off);
  std::vector<std::int64_t> in = sizes().vec();
  recordUnary(*this, out, "DiagonalBackward0", [in, offset, dim1, dim2](const Tensor &g) {
    Tensor z = zeros(in, g.options());
    z.diagonal(offset, dim1, dim2).copy_(g);
    return z;
  });
  return finishView(*this, out, "diagonal");
}

std::vector<Tensor> Tensor::split(std::int64_t split_size, std::int64_t d, SourceLocation loc) const {
  trace::Scope scope("split", loc);
  if (dim() == 0)
    fail("split expects at least a 1-dimensional tensor");
  d = wrapDim(d, dim());
  if (split_size < 0)
    fail("split expects split_size be non-negative, but got split_size=" + std::to_string(split_size));
  std::int64_t n = size(d);
  std::vector<Tensor> out;
  if (split_size == 0 && n != 0)
    fail("split_size can only be 0 if dimension size is 0, but got dimension size of " + std::to_string(n));
  std::int64_t chunks = split_size == 0 ? 1 : std::max<std::int64_t>((n + split_size - 1) / split_size, 1);
  for (std::int64_t i = 0; i < chunks; ++i) {
    std::int64_t len = std::min(split_size, n - i * split_size);
    out.push_back(narrowImpl(*this, d, i * split_size, std::max<std::int64_t>(len, 0)));
  }
  if (trace::on())
    trace::opMulti("split", *this, out);
  return out;
}

std::vector<Tensor> Tensor::split_with_sizes(IntArrayRef split_sizes, std::int64_t d, SourceLocation loc) const {
  trace::Scope scope("split", loc);
  if (dim() == 0)
    fail("split expects at least a 1-dimensional tensor");
  d = wrapDim(d, dim());
  std::int64_t total = 0;
  for (auto s : split_sizes)
    total += s;
  if (total != size(d)) {
    std::ostringstream os;
    os << "split_with_sizes expects split_sizes to sum exactly to " << size(d) << " (input tensor's size at dimension "
       << d << "), but got split_sizes=" << shapeString(split_sizes);
    fail(os.str());
  }
  std::vector<Tensor> out;
  std::int64_t start = 0;
  for (auto s : split_sizes) {
    out.push_back(narrowImpl(*this, d, start, s));
    start += s;
  }
  if (trace::on())
    trace::opMulti("split", *this, out);
  return out;
}

std::vector<Tensor> Tensor::split(IntArrayRef split_sizes, std::int64_t d, SourceLocation loc) const {
  return split_with_sizes(split_sizes, d, loc);
}

std::vector<Tensor> Tensor::chunk(std::int64_t chunks, std::int64_t d, SourceLocation loc) const {
  trace::Scope scope("chunk", loc);
  if (dim() == 0)
    fail("chunk expects at least a 1-dimensional tensor");
  if (chunks <= 0)
    fail("chunk expects `chunks` to be greater than 0, got: " + std::to_string(chunks));
  d = wrapDim(d, dim());
  std::int64_t n = size(d);
  std::int64_t split_size = (n + chunks - 1) / chunks;
  if (split_size == 0 && n == 0) {
    std::vector<std::int64_t> sizes(chunks, 0);
    return split_with_sizes(sizes, d, loc);
  }
  return split(split_size, d, loc);
}

std::vector<Tensor> Tensor::unbind(std::int64_t d, SourceLocation loc) const {
  trace::Scope scope("unbind", loc);
  if (dim() == 0)
    fail("Dimension specified as 0 but tensor has no dimensions");
  d = wrapDim(d, dim());
  std::vector<Tensor> out;
  for (std::int64_t i = 0; i < size(d); ++i)
    out.push_back(selectImpl(*this, d, i, "UnbindBackward0"));
  if (trace::on())
    trace::opMulti("unbind", *this, out);
  return out;
}

// --- copies ------------------------------------------------------------------------------------
Tensor Tensor::clone(std::optional<MemoryFormat> fmt, SourceLocation loc) const {
  trace::Scope scope("clone", loc);
  Tensor out = cloneImpl(*this, fmt.value_or(MemoryFormat::Preserve), CopyKind::Clone);
  if (trace::on())
    trace::op("clone", {this}, out);
  return out;
}

Tensor Tensor::contiguous(MemoryFormat, SourceLocation loc) const {
  trace::Scope scope("contiguous", loc);
  Tensor out = is_contiguous() ? *this : cloneImpl(*this, MemoryFormat::Contiguous, CopyKind::Contiguous);
  if (trace::on())
    trace::op("contiguous", {this}, out);
  return out;
}

Tensor &Tensor::copy_(const Tensor &src, bool non_blocking, SourceLocation loc) const {
  trace::Scope scope("copy_", loc);
  autograd::checkInplace(*this);
  // As at::copy_ (1.13): copying a tensor onto itself does nothing (no
  // overlap check either: x.copy_(x) of an expanded x is fine); the version
  // still bumps and autograd still records. Another handle on the same data
  // is copied (and checked) as usual.
  bool sameData = is_same(src);
  if (!sameData) {
    assertNoInternalOverlap(*unsafeGetTensorImpl());
    assertNoPartialOverlap(*unsafeGetTensorImpl(), *src.unsafeGetTensorImpl());
    std::vector<std::int64_t> b = broadcastShapes(sizes(), src.sizes());
    if (!sizes().equals(b))
      fail("output with shape " + shapeString(sizes()) + " doesn't match the broadcast shape " + shapeString(b));
  }
  std::uint32_t before = _version();
  bool rec = autograd::shouldRecord({this, &src});
  if (!sameData)
    copyData(*this, src, CopyKind::Copy_, non_blocking);
  if (trace::on() && src.dtype() != dtype())
    trace::convert(*src.unsafeGetTensorImpl(), *unsafeGetTensorImpl());
  bumpVersion(*this, "copy_", before);
  if (rec) {
    std::vector<std::int64_t> srcShape = src.sizes().vec();
    ScalarType srcType = src.dtype();
    Device srcDev = src.device();
    auto fn = std::make_shared<LambdaNode>("CopyBackwards", [srcShape, srcType, srcDev](const std::vector<Tensor> &g,
                                                                                         LambdaNode &) {
      if (!g[0].defined())
        return std::vector<Tensor>{Tensor(), Tensor()};
      return std::vector<Tensor>{zeros_like(g[0]), sumTo(g[0], srcShape).to(srcDev, srcType)};
    });
    autograd::setHistory({}, fn, {this, &src});
    autograd::rebaseHistory(*this, fn);
  }
  if (trace::on())
    trace::op("copy_", {this, &src}, *this);
  return const_cast<Tensor &>(*this);
}

namespace {
// to()/cpu()/cuda(): a conversion under a trace scope, with its op event.
Tensor tracedTo(const char *name, const Tensor &self, ScalarType dt, Device dev, bool copy,
                std::optional<MemoryFormat> fmt, bool non_blocking, SourceLocation loc, bool requires_grad = false) {
  trace::Scope scope(name, loc);
  Tensor out = toImpl(self, dt, dev, copy, fmt, non_blocking);
  if (requires_grad && !out.requires_grad())
    out.requires_grad_();
  if (trace::on())
    trace::op(name, {&self}, out);
  return out;
}
} // namespace

Tensor Tensor::to(TensorOptions o, bool non_blocking, bool copy, std::optional<MemoryFormat> fmt,
                  SourceLocation loc) const {
  return tracedTo("to", *this, o.has_dtype() ? o.dtype() : dtype(), o.has_device() ? o.device() : device(), copy, fmt,
                  non_blocking, loc, o.requires_grad());
}
Tensor Tensor::to(Device d, ScalarType dt, bool non_blocking, bool copy, std::optional<MemoryFormat> fmt,
                  SourceLocation loc) const {
  return tracedTo("to", *this, dt, d, copy, fmt, non_blocking, loc);
}
Tensor Tensor::to(ScalarType dt, bool non_blocking, bool copy, std::optional<MemoryFormat> fmt,
                  SourceLocation loc) const {
  return tracedTo("to", *this, dt, device(), copy, fmt, non_blocking, loc);
}
Tensor Tensor::to(const Tensor &other, bool non_blocking, bool copy, std::optional<MemoryFormat> fmt,
                  SourceLocation loc) const {
  return tracedTo("to", *this, other.dtype(), other.device(), copy, fmt, non_blocking, loc);
}
Tensor Tensor::toType(ScalarType t, SourceLocation loc) const { return to(t, false, false, std::nullopt, loc); }
Tensor Tensor::cpu(SourceLocation loc) const {
  return tracedTo("cpu", *this, dtype(), Device(kCPU), false, std::nullopt, false, loc);
}
Tensor Tensor::cuda(SourceLocation loc) const {
  return tracedTo("cuda", *this, dtype(), Device(kCUDA), false, std::nullopt, false, loc);
}

Tensor Tensor::pin_memory(SourceLocation loc) const {
  trace::Scope scope("pin_memory", loc);
  if (!is_cpu())
    fail("cannot pin '" + typeString(*this) + "' only dense CPU tensors can be pinned");
  if (is_pinned())
    return *this;
  const TensorImpl &s = *unsafeGetTensorImpl();
  Tensor out = makeTensor(s.sizes, preservedStrides(s), s.dtype, s.storage->device(), /*pinned=*/true);
  copyData(out, *this, CopyKind::Other);
  recordUnary(*this, out, "PinMemoryBackward0", [](const Tensor &g) { return g; });
  return out;
}

bool Tensor::is_pinned() const {
  const Storage &st = *unsafeGetTensorImpl()->storage;
  if (st.pinned())
    return true;
  return is_cpu() && backend::available(kCUDA) && backend::get(kCUDA).is_pinned &&
         backend::get(kCUDA).is_pinned(st.data());
}

Tensor Tensor::detach(SourceLocation loc) const {
  trace::Scope scope("detach", loc);
  Tensor out = autograd::detachedAlias(*this);
  if (trace::on())
    trace::op("detach", {this}, out);
  return out;
}

Tensor &Tensor::detach_(SourceLocation loc) const {
  trace::Scope scope("detach_", loc);
  if (is_view()) // PyTorch 1.13 refuses every view, requiring grad or not
    fail("Can't detach views in-place. Use detach() instead. If you are using DistributedDataParallel (DDP) for "
         "training, and gradient_as_bucket_view is set as True, gradients are views of DDP buckets, and hence "
         "detach_() cannot be called on these gradients. To fix this error, please refer to the "
         "Optimizer.zero_grad() function in torch/optim/optimizer.py as the solution.");
  if (auto *m = autograd::metaOrNull(*this)) {
    m->grad_fn.reset();
    m->requires_grad = false;
    m->output_nr = 0;
  }
  return const_cast<Tensor &>(*this);
}

Tensor Tensor::data(SourceLocation loc) const {
  trace::Scope scope("data", loc);
  const TensorImpl &s = impl();
  // A fresh version counter: autograd does not see writes through it.
  Tensor out(std::make_shared<TensorImpl>(s.storage, s.sizes, s.strides, s.storage_offset, s.dtype, nullptr));
  if (trace::on())
    trace::op("data", {this}, out);
  return out;
}

Tensor Tensor::variable_data(SourceLocation loc) const {
  trace::Scope scope("variable_data", loc);
  const TensorImpl &s = impl();
  Tensor out(std::make_shared<TensorImpl>(s.storage, s.sizes, s.strides, s.storage_offset, s.dtype, nullptr));
  if (trace::on())
    trace::op("variable_data", {this}, out);
  return out;
}

// Operators cannot take a defaulted location: these events get none.
Tensor &Tensor::operator=(const Tensor &src) && {
  copy_(src, false, SourceLocation{});
  return *this;
}

Tensor &Tensor::operator=(const Scalar &v) && {
  fill_(v, SourceLocation{});
  return *this;
}

// --- free-function forms of views/copies ---------------------------------------------------
Tensor transpose(const Tensor &a, std::int64_t d0, std::int64_t d1, SourceLocation loc) { return a.transpose(d0, d1, loc); }
Tensor reshape(const Tensor &a, IntArrayRef shape, SourceLocation loc) { return a.reshape(shape, loc); }
Tensor flatten(const Tensor &a, std::int64_t s, std::int64_t e, SourceLocation loc) { return a.flatten(s, e, loc); }
Tensor squeeze(const Tensor &a, SourceLocation loc) { return a.squeeze(loc); }
Tensor unsqueeze(const Tensor &a, std::int64_t d, SourceLocation loc) { return a.unsqueeze(d, loc); }
Tensor clone(const Tensor &a, SourceLocation loc) { return a.clone(std::nullopt, loc); }

} // namespace tt
