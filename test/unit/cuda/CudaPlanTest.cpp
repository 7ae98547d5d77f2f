// Host-side planning of the CUDA kernels: runs without a GPU.
#include "cuda_common.cuh" // OffsetCalc is __host__ __device__: checked here on the host
#include "cuda_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

using namespace tt::cudaops;

namespace {
int fakeBase; // operands need a non-null data pointer to count as tensors

Operand op(std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides,
           DType dt = DType::Float) {
  return makeOperand(&fakeBase, dt, sizes.data(), strides.data(), static_cast<int>(sizes.size()));
}

Plan plan2(const Operand &a, const Operand &b) {
  const Operand *ops[2] = {&a, &b};
  return planElementwise(ops, 2);
}

// Element offsets of every linear index, the slow obvious way: the plan must
// visit the same (dst, src) offset pairs as a row-major walk of the operands.
std::vector<std::pair<std::int64_t, std::int64_t>> naivePairs(const Operand &a, const Operand &b) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::vector<std::int64_t> idx(a.ndim, 0);
  const std::int64_t n = a.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t oa = 0, ob = 0;
    for (int d = 0; d < a.ndim; ++d) {
      oa += idx[d] * a.strides[d];
      ob += idx[d] * b.strides[d];
    }
    out.emplace_back(oa, ob);
    for (int d = a.ndim - 1; d >= 0; --d) {
      if (++idx[d] < a.sizes[d])
        break;
      idx[d] = 0;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::int64_t, std::int64_t>> planPairs(const Plan &p) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::int64_t n = 1;
  for (int d = 0; d < p.ndim; ++d)
    n *= p.sizes[d];
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t rem = i, oa = 0, ob = 0;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const std::int64_t k = rem % p.sizes[d];
      rem /= p.sizes[d];
      oa += k * p.strides[0][d];
      ob += k * p.strides[1][d];
    }
    out.emplace_back(oa, ob);
  }
  std::sort(out.begin(), out.end());
  return out;
}
} // namespace

TEST(CudaPlan, ContiguousCoalescesToOneDim) {
  Operand a = op({4, 5, 6}, {30, 6, 1}), b = op({4, 5, 6}, {30, 6, 1});
  Plan p = plan2(a, b);
  ASSERT_EQ(p.ndim, 1);
  EXPECT_EQ(p.sizes[0], 120);
  EXPECT_TRUE(planIsMemcpy(p));
  EXPECT_FALSE(planIsTranspose(p, nullptr));
}

TEST(CudaPlan, CloneOfTransposeKeepingStridesIsAMemcpy) {
  // clone() preserves strides: dst and src are both the transposed layout.
  Operand a = op({5, 4}, {1, 5}), b = op({5, 4}, {1, 5});
  Plan p = plan2(a, b);
  EXPECT_EQ(p.ndim, 1);
  EXPECT_TRUE(planIsMemcpy(p));
}

TEST(CudaPlan, ContiguousOfTransposeIsATranspose) {
  // x = [4,5] contiguous; x.t() is [5,4] strides (1,5); contiguous() writes [5,4] dense.
  Operand dst = op({5, 4}, {4, 1}), src = op({5, 4}, {1, 5});
  Plan p = plan2(dst, src);
  EXPECT_FALSE(planIsMemcpy(p));
  TransposePlan tp;
  ASSERT_TRUE(planIsTranspose(p, &tp));
  EXPECT_EQ(tp.rows, 5);
  EXPECT_EQ(tp.cols, 4);
  EXPECT_EQ(tp.srcLd, 5);
  EXPECT_EQ(tp.batch, 1);
  EXPECT_EQ(planPairs(p), naivePairs(dst, src));
}

TEST(CudaPlan, BatchedPermuteIsABatchedTranspose) {
  // NCHW [2,3,4,5] -> permute(0,2,3,1) -> contiguous: [2,4,5,3].
  Operand src = op({2, 4, 5, 3}, {60, 5, 1, 20});
  Operand dst = op({2, 4, 5, 3}, {60, 15, 3, 1});
  Plan p = plan2(dst, src);
  TransposePlan tp;
  ASSERT_TRUE(planIsTranspose(p, &tp));
  EXPECT_EQ(tp.batch, 2);
  EXPECT_EQ(tp.rows, 20);
  EXPECT_EQ(tp.cols, 3);
  EXPECT_EQ(tp.srcLd, 20);
  EXPECT_EQ(tp.srcBatch, 60);
  EXPECT_EQ(tp.dstBatch, 60);
  EXPECT_EQ(planPairs(p), naivePairs(dst, src));
}

TEST(CudaPlan, SlicedSourceIsNeitherFastPath) {
  Operand src = op({4, 3}, {10, 2}); // x[:, ::2] of a [4,10] tensor, sort of
  Operand dst = op({4, 3}, {3, 1});
  Plan p = plan2(dst, src);
  EXPECT_FALSE(planIsMemcpy(p));
  EXPECT_FALSE(planIsTranspose(p, nullptr));
  EXPECT_EQ(p.ndim, 2);
  EXPECT_EQ(planPairs(p), naivePairs(dst, src));
}

TEST(CudaPlan, SizeOneDimsAreDroppedAndZeroSizeIsEmpty) {
  Operand a = op({1, 7, 1}, {7, 1, 1}), b = op({1, 7, 1}, {99, 1, 42});
  Plan p = plan2(a, b);
  EXPECT_EQ(p.ndim, 1);
  EXPECT_TRUE(planIsMemcpy(p));
  Operand e = op({3, 0}, {0, 1});
  Plan pe = plan2(e, e);
  ASSERT_EQ(pe.ndim, 1);
  EXPECT_EQ(pe.sizes[0], 0);
  Operand s = op({}, {});
  EXPECT_EQ(plan2(s, s).ndim, 0); // a 0-dim tensor is one element
}

TEST(CudaPlan, RandomLayoutsVisitTheSameOffsets) {
  // Permutations of a [2,3,4] tensor, with and without broadcasting.
  const std::vector<std::vector<int>> perms = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                               {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  const std::int64_t sz[3] = {2, 3, 4}, st[3] = {12, 4, 1};
  for (const auto &pa : perms)
    for (const auto &pb : perms) {
      Operand a = op({sz[pa[0]], sz[pa[1]], sz[pa[2]]}, {st[pa[0]], st[pa[1]], st[pa[2]]});
      // b: the same logical shape, a different permutation of a dense buffer
      std::int64_t bs[3];
      std::int64_t s = 1;
      for (int d = 2; d >= 0; --d) {
        bs[pb[d]] = s;
        s *= a.sizes[pb[d]];
      }
      Operand b = op({a.sizes[0], a.sizes[1], a.sizes[2]}, {bs[0], bs[1], bs[2]});
      EXPECT_EQ(planPairs(plan2(a, b)), naivePairs(a, b));
      Operand bb = op({a.sizes[0], a.sizes[1], a.sizes[2]}, {bs[0], 0, bs[2]});
      EXPECT_EQ(planPairs(plan2(a, bb)), naivePairs(a, bb));
    }
}

TEST(CudaPlan, BroadcastFollowsNumpyRules) {
  const std::int64_t to[3] = {2, 3, 4};
  Operand row = op({4}, {1});
  Operand r = broadcastTo(row, to, 3);
  EXPECT_EQ(r.ndim, 3);
  EXPECT_EQ(r.strides[0], 0);
  EXPECT_EQ(r.strides[1], 0);
  EXPECT_EQ(r.strides[2], 1);
  Operand col = op({3, 1}, {1, 1});
  Operand c = broadcastTo(col, to, 3);
  EXPECT_EQ(c.strides[1], 1);
  EXPECT_EQ(c.strides[2], 0);
  Operand bad = op({3}, {1});
  try {
    broadcastTo(bad, to, 3);
    FAIL() << "expected a broadcast error";
  } catch (const std::runtime_error &e) {
    EXPECT_STREQ(e.what(), "The expanded size of the tensor (4) must match the existing size (3) "
                           "at non-singleton dimension 2.");
  }
  Operand sc = broadcastTo(makeScalar(2.5, DType::Float), to, 3);
  EXPECT_EQ(sc.data, nullptr);
  EXPECT_EQ(sc.numel(), 24);
}

TEST(CudaPlan, TooManyDimsIsAClearError) {
  std::vector<std::int64_t> s(kMaxDims + 1, 1);
  EXPECT_THROW(makeOperand(&fakeBase, DType::Float, s.data(), s.data(), kMaxDims + 1),
               std::runtime_error);
}

TEST(CudaPlan, KernelOffsetCalculatorMatchesTheNaiveWalk) {
  // The exact index math the kernels run, executed on the host.
  const std::int64_t sz[3] = {2, 3, 4}, st[3] = {12, 4, 1};
  const std::vector<std::vector<int>> perms = {{0, 1, 2}, {2, 0, 1}, {1, 2, 0}, {2, 1, 0}};
  for (const auto &pa : perms) {
    Operand a = op({sz[pa[0]], sz[pa[1]], sz[pa[2]]}, {st[pa[0]], st[pa[1]], st[pa[2]]});
    Operand b = op({a.sizes[0], a.sizes[1], a.sizes[2]}, {a.sizes[1] * a.sizes[2], a.sizes[2], 1});
    Operand c = op({a.sizes[0], a.sizes[1], a.sizes[2]}, {0, 1, 0}); // broadcast
    const Operand *ops[3] = {&b, &a, &c};
    Plan p = planElementwise(ops, 3);
    OffsetCalc<3> oc = makeOffsetCalc<3>(p);
    std::vector<std::vector<std::int64_t>> got, want;
    for (std::int64_t i = 0; i < planNumel(p); ++i) {
      std::int64_t offs[3];
      oc.get(i, offs);
      got.push_back({offs[0], offs[1], offs[2]});
    }
    std::vector<std::int64_t> idx(3, 0);
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      std::vector<std::int64_t> w(3, 0);
      for (int d = 0; d < 3; ++d)
        for (int k = 0; k < 3; ++k)
          w[k] += idx[d] * ops[k]->strides[d];
      want.push_back(w);
      for (int d = 2; d >= 0; --d) {
        if (++idx[d] < a.sizes[d])
          break;
        idx[d] = 0;
      }
    }
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want);
  }
}
