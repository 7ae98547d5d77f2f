// Host-side planning for the CUDA kernels: operands, broadcasting, dim
// reordering and coalescing. Plain C++ so the unit tests check it without a GPU.
#include "cuda_ops.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace tt::cudaops {

std::size_t dtypeSize(DType t) {
  switch (t) {
  case DType::Float: case DType::Int: return 4;
  case DType::Double: case DType::Long: return 8;
  case DType::Half: case DType::BFloat16: return 2;
  case DType::Bool: return 1;
  }
  return 0;
}

std::int64_t Operand::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < ndim; ++d)
    n *= sizes[d];
  return n;
}

static void checkDims(int ndim) {
  if (ndim < 0 || ndim > kMaxDims)
    throw std::runtime_error("tt: the CUDA backend supports tensors of at most " +
                             std::to_string(kMaxDims) + " dims, got " + std::to_string(ndim));
}

Operand makeOperand(void *data, DType dtype, const std::int64_t *sizes, const std::int64_t *strides,
                    int ndim) {
  checkDims(ndim);
  Operand op;
  op.data = data;
  op.dtype = dtype;
  op.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    op.sizes[d] = sizes[d];
    op.strides[d] = strides[d];
  }
  return op;
}

Operand makeScalar(double value, DType dtype) {
  Operand op;
  op.dtype = dtype;
  op.scalar = value;
  // bool(0.5) is true; int64(0.5) is 0
  op.iscalar = dtype == DType::Bool ? (value != 0) : static_cast<std::int64_t>(value);
  return op;
}

Operand makeScalarInt(std::int64_t value, DType dtype) {
  Operand op;
  op.dtype = dtype;
  op.scalar = static_cast<double>(value);
  op.iscalar = value;
  return op;
}

Operand broadcastTo(const Operand &op, const std::int64_t *sizes, int ndim) {
  checkDims(ndim);
  if (!op.data) { // a scalar broadcasts to anything
    Operand r = op;
    r.ndim = ndim;
    std::copy(sizes, sizes + ndim, r.sizes);
    return r;
  }
  if (op.ndim > ndim)
    throw std::runtime_error("tt: cannot broadcast a " + std::to_string(op.ndim) +
                             "-dim operand to " + std::to_string(ndim) + " dims");
  Operand r = op;
  r.ndim = ndim;
  const int lead = ndim - op.ndim;
  for (int d = 0; d < ndim; ++d) {
    r.sizes[d] = sizes[d];
    if (d < lead) {
      r.strides[d] = 0;
      continue;
    }
    const std::int64_t s = op.sizes[d - lead];
    if (s == sizes[d]) {
      r.strides[d] = op.strides[d - lead];
    } else if (s == 1) {
      r.strides[d] = 0;
    } else {
      std::ostringstream os; // PyTorch's expand() wording
      os << "The expanded size of the tensor (" << sizes[d] << ") must match the existing size ("
         << s << ") at non-singleton dimension " << d << ".";
      throw std::runtime_error(os.str());
    }
  }
  return r;
}

Plan planElementwise(const Operand *const *ops, int nops) {
  if (nops < 1 || nops > 4)
    throw std::logic_error("tt: planElementwise takes 1 to 4 operands");
  const Operand &o0 = *ops[0];
  for (int k = 1; k < nops; ++k) {
    if (!ops[k]->data)
      continue;
    bool same = ops[k]->ndim == o0.ndim;
    for (int d = 0; same && d < o0.ndim; ++d)
      same = ops[k]->sizes[d] == o0.sizes[d];
    if (!same)
      throw std::logic_error("tt: elementwise operands must be broadcast to one shape first");
  }
  // Dims that matter (size > 1), outermost first.
  int dims[kMaxDims];
  int n = 0;
  for (int d = 0; d < o0.ndim; ++d)
    if (o0.sizes[d] != 1)
      dims[n++] = d;
  auto stride = [&](int k, int d) -> std::int64_t { return ops[k]->data ? ops[k]->strides[d] : 0; };
  // a goes inside b when the first operand with non-zero strides in both
  // says so (TensorIterator's rule); ties keep the original order.
  auto inner = [&](int a, int b) {
    for (int k = 0; k < nops; ++k) {
      std::int64_t sa = stride(k, a), sb = stride(k, b);
      if (sa == 0 || sb == 0)
        continue;
      if (sa != sb)
        return sa < sb;
    }
    return false;
  };
  // Insertion sort, outermost first: stable and n <= kMaxDims.
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && inner(dims[j - 1], dims[j]); --j)
      std::swap(dims[j - 1], dims[j]);

  Plan p;
  p.nops = nops;
  // Coalesce from the innermost dim outward.
  for (int i = n - 1; i >= 0; --i) {
    const int d = dims[i];
    if (p.ndim > 0) {
      const int cur = kMaxDims - p.ndim; // the dim built so far, stored at the back
      bool merge = true;
      for (int k = 0; k < nops && merge; ++k)
        merge = stride(k, d) == p.strides[k][cur] * p.sizes[cur];
      if (merge) {
        p.sizes[cur] *= o0.sizes[d];
        continue;
      }
    }
    ++p.ndim;
    const int slot = kMaxDims - p.ndim;
    p.sizes[slot] = o0.sizes[d];
    for (int k = 0; k < nops; ++k)
      p.strides[k][slot] = stride(k, d);
  }
  // Move the dims from the back to the front.
  const int off = kMaxDims - p.ndim;
  for (int d = 0; d < p.ndim; ++d) {
    p.sizes[d] = p.sizes[off + d];
    for (int k = 0; k < nops; ++k)
      p.strides[k][d] = p.strides[k][off + d];
  }
  for (int d = p.ndim; d < kMaxDims; ++d) {
    p.sizes[d] = 0;
    for (int k = 0; k < nops; ++k)
      p.strides[k][d] = 0;
  }
  // A zero-size dim makes the whole launch empty: say so with one dim of 0.
  for (int d = 0; d < o0.ndim; ++d)
    if (o0.sizes[d] == 0) {
      p.ndim = 1;
      p.sizes[0] = 0;
    }
  return p;
}

bool planIsMemcpy(const Plan &p) {
  if (p.nops != 2)
    return false;
  return p.ndim == 0 || (p.ndim == 1 && p.strides[0][0] == 1 && p.strides[1][0] == 1);
}

bool planIsTranspose(const Plan &p, TransposePlan *tp) {
  if (p.nops != 2 || (p.ndim != 2 && p.ndim != 3))
    return false;
  const int r = p.ndim - 2, c = p.ndim - 1;
  const std::int64_t rows = p.sizes[r], cols = p.sizes[c];
  // dst dense [.., R, C]; src: unit stride along R, leading dim along C.
  if (p.strides[0][c] != 1 || p.strides[0][r] != cols || p.strides[1][r] != 1 ||
      p.strides[1][c] < rows)
    return false;
  TransposePlan t;
  t.rows = rows;
  t.cols = cols;
  t.srcLd = p.strides[1][c];
  if (p.ndim == 3) {
    if (p.strides[0][0] != rows * cols)
      return false;
    t.batch = p.sizes[0];
    t.srcBatch = p.strides[1][0];
    t.dstBatch = p.strides[0][0];
  }
  if (tp)
    *tp = t;
  return true;
}

} // namespace tt::cudaops
