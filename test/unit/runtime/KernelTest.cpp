// The CPU kernels against element-by-element references: the tiled
// permute/transpose copy at every rank, element size and thread count, and the
// vectorised elementwise loops (same shape, row and column broadcast, lengths
// that leave vector tails).
#include "tt/tt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace {

using Shape = std::vector<std::int64_t>;

std::int64_t numelOf(const Shape &s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t(1), std::multiplies<>());
}

// The values of a contiguous tensor, as int64.
std::vector<std::int64_t> longs(const tt::Tensor &t) {
  tt::Tensor l = t.to(tt::kLong).contiguous();
  const std::int64_t *p = l.data_ptr<std::int64_t>();
  return {p, p + l.numel()};
}

// What x.permute(perm).contiguous() holds, computed index by index from x.
std::vector<std::int64_t> permutedReference(const std::vector<std::int64_t> &x, const Shape &shape,
                                            const Shape &perm) {
  const int nd = static_cast<int>(shape.size());
  Shape stride(nd, 1), outShape(nd), idx(nd, 0);
  for (int d = nd - 2; d >= 0; --d)
    stride[d] = stride[d + 1] * shape[d + 1];
  for (int d = 0; d < nd; ++d)
    outShape[d] = shape[perm[d]];
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < numelOf(shape); ++i) {
    std::int64_t src = 0;
    for (int d = 0; d < nd; ++d)
      src += idx[d] * stride[perm[d]];
    out.push_back(x[src]);
    for (int d = nd - 1; d >= 0 && ++idx[d] == outShape[d]; --d)
      idx[d] = 0;
  }
  return out;
}

void expectPermutedCopies(const Shape &shape, tt::ScalarType dtype) {
  tt::Tensor x = tt::arange(numelOf(shape), tt::kLong).view(shape).to(dtype);
  const std::vector<std::int64_t> values = longs(x);
  Shape perm(shape.size());
  std::iota(perm.begin(), perm.end(), 0);
  do {
    SCOPED_TRACE(::testing::PrintToString(perm));
    std::vector<std::int64_t> want = permutedReference(values, shape, perm);
    tt::Tensor p = x.permute(perm);
    EXPECT_EQ(longs(p.contiguous()), want);
    // The same layouts the other way round: a permuted destination.
    Shape inverse(perm.size());
    for (std::size_t d = 0; d < perm.size(); ++d)
      inverse[perm[d]] = static_cast<std::int64_t>(d);
    tt::Tensor back = tt::empty(tt::IntArrayRef(shape), tt::dtype(dtype)).permute(perm);
    back.copy_(p.contiguous());
    EXPECT_EQ(longs(back.permute(inverse)), values);
  } while (std::next_permutation(perm.begin(), perm.end()));
}

class PermutedCopy : public ::testing::TestWithParam<int> {
protected:
  void SetUp() override { tt::set_num_threads(GetParam()); }
  void TearDown() override { tt::set_num_threads(1); }
};

// Sizes off the 64-element tiles and the 4x4 register blocks; element sizes
// 1, 2, 4 and 8 bytes.
TEST_P(PermutedCopy, EveryRankAndElementSizeMatchesTheReference) {
  for (tt::ScalarType dt : {tt::kFloat, tt::kDouble, tt::kHalf, tt::kBool, tt::kInt, tt::kLong}) {
    SCOPED_TRACE(tt::toString(dt));
    expectPermutedCopies({130, 67}, dt);
    expectPermutedCopies({5, 66, 131}, dt);
    expectPermutedCopies({3, 70, 9, 13}, dt);
  }
  expectPermutedCopies({2, 3, 17, 9, 11}, tt::kFloat);
}

// Large enough to be split across threads (NCHW -> NHWC, as in the benchmark).
TEST_P(PermutedCopy, LargeNchwToNhwcMatchesTheReference) {
  Shape shape{4, 64, 40, 41};
  tt::Tensor x = tt::arange(numelOf(shape), tt::kLong).view(shape).to(tt::kFloat);
  EXPECT_EQ(longs(x.permute({0, 2, 3, 1}).contiguous()),
            permutedReference(longs(x), shape, {0, 2, 3, 1}));
  EXPECT_EQ(longs(x.view({4 * 64, 40 * 41}).t().contiguous()),
            permutedReference(longs(x), {4 * 64, 40 * 41}, {1, 0}));
}

INSTANTIATE_TEST_SUITE_P(Threads, PermutedCopy, ::testing::Values(1, 2));

// --- elementwise ---------------------------------------------------------------------------
// a op b for a of `rows` x `cols` and b of bShape (same, [cols] or [rows, 1]),
// against the same computed element by element in double.
void expectBinary(std::int64_t rows, std::int64_t cols, const Shape &bShape, tt::ScalarType dt) {
  tt::Tensor a = tt::arange(rows * cols, tt::kLong).view({rows, cols}).to(dt);
  tt::Tensor b = tt::arange(numelOf(bShape), tt::kLong).view(bShape).add(3).to(dt);
  std::vector<std::int64_t> av = longs(a), bv = longs(b);
  std::vector<std::int64_t> sum, sum2, diff, prod;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      std::int64_t y = bv[bShape.size() == 1 ? c : bShape[1] == 1 ? r : r * cols + c];
      std::int64_t x = av[r * cols + c];
      sum.push_back(x + y);
      sum2.push_back(x + 2 * y);
      diff.push_back(x - y);
      prod.push_back(x * y);
    }
  EXPECT_EQ(longs(a.add(b)), sum);
  EXPECT_EQ(longs(a.add(b, 2)), sum2);
  EXPECT_EQ(longs(a.sub(b)), diff);
  EXPECT_EQ(longs(a.mul(b)), prod);
  EXPECT_EQ(longs(b.mul(a)), prod); // the broadcast operand first
  tt::Tensor c = a.clone();
  c.add_(b); // in place: never streamed
  EXPECT_EQ(longs(c), sum);
}

TEST(Elementwise, AddAndMulMatchTheReferenceForEveryLayout) {
  for (tt::ScalarType dt : {tt::kFloat, tt::kDouble, tt::kInt, tt::kLong}) {
    SCOPED_TRACE(tt::toString(dt));
    for (std::int64_t cols : {1, 7, 16, 33, 100, 515}) {
      SCOPED_TRACE(cols);
      expectBinary(9, cols, {9, cols}, dt);
      expectBinary(9, cols, {cols}, dt);
      expectBinary(9, cols, {9, 1}, dt);
    }
  }
}

// Outputs large enough to be split across threads, at a row length that puts
// the second thread's first element off any vector boundary (its loop starts
// with a scalar head). test/runtime/streaming-stores.test runs this with every
// output streamed.
TEST(Elementwise, LargeOutputsMatchTheReferenceAtEveryThreadCount) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    tt::set_num_threads(threads);
    expectBinary(129, 2051, {129, 2051}, tt::kDouble); // exact products
    expectBinary(129, 2051, {2051}, tt::kDouble);
    expectBinary(129, 2051, {129, 1}, tt::kDouble);
  }
  tt::set_num_threads(1);
}

// Column slices: rows further apart than their length, in the output (in place)
// and in both operands, including a [rows, 1] column of a wider tensor.
TEST(Elementwise, ColumnSlicesMatchTheContiguousResult) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    tt::set_num_threads(threads);
    const std::int64_t rows = 129, cols = 2051;
    tt::Tensor wide =
        tt::arange(rows * (cols + 3), tt::kLong).view({rows, cols + 3}).to(tt::kDouble);
    tt::Tensor a = wide.narrow(1, 2, cols), col = wide.narrow(1, 1, 1);
    for (const tt::Tensor &b : {col, wide.narrow(1, 0, cols)}) {
      tt::Tensor want = a.contiguous().sub(b.contiguous(), 2);
      EXPECT_EQ(longs(a.sub(b, 2)), longs(want));
      tt::Tensor c = wide.clone();
      c.narrow(1, 2, cols).sub_(b, 2);
      EXPECT_EQ(longs(c.narrow(1, 2, cols)), longs(want));
    }
  }
  tt::set_num_threads(1);
}

// Note [huge pages for large blocks]: blocks of 2 MiB and more start on a 2 MiB boundary.
TEST(Allocator, LargeBlocksAreHugePageAligned) {
  tt::Tensor big = tt::empty({std::int64_t(1) << 20}, tt::dtype(tt::kFloat)); // 4 MiB
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.data_ptr()) % (std::uintptr_t(2) << 20), 0u);
}

} // namespace
