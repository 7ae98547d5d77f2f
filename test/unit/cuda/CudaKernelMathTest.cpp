// The kernels' per-element math and dtype conversions (kernel_math.cuh,
// cuda_common.cuh: __host__ __device__), run on the host against PyTorch's
// semantics and the CPU runtime: no GPU needed.
#include "cuda_common.cuh"
#include "kernel_math.cuh"
#include "tt/types.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

using namespace tt::cudaops;

namespace {
template <typename Acc> Params<Acc> params(int op, bool hasA = false, Acc a = 0, bool hasB = false, Acc b = 0) {
  Params<Acc> p{};
  p.op = op;
  p.hasA = hasA;
  p.a = a;
  p.hasB = hasB;
  p.b = b;
  p.alpha = 1;
  return p;
}
template <typename Acc> Acc bin(BinaryOp op, Acc x, Acc y) {
  return applyBinary(params<Acc>(static_cast<int>(op)), x, y);
}
template <typename Acc> Acc un(UnaryOp op, Acc x, bool hasA = false, Acc a = 0, bool hasB = false, Acc b = 0) {
  return applyUnary(params<Acc>(static_cast<int>(op), hasA, a, hasB, b), x);
}
const float kNan = NAN;
} // namespace

TEST(CudaKernelMath, NanPropagatesLikePyTorch) {
  EXPECT_TRUE(std::isnan(un(UnaryOp::Relu, kNan)));          // torch.relu(nan) = nan
  EXPECT_EQ(un(UnaryOp::Relu, -2.f), 0.f);
  EXPECT_TRUE(std::isnan(un(UnaryOp::Clamp, kNan, true, 0.f, true, 1.f)));
  EXPECT_EQ(un(UnaryOp::Clamp, 5.f, true, 0.f, true, 1.f), 1.f);
  EXPECT_EQ(un(UnaryOp::Clamp, -5.f, true, 0.f, false, 0.f), 0.f);
  EXPECT_TRUE(std::isnan(bin(BinaryOp::Maximum, kNan, 1.f)));
  EXPECT_TRUE(std::isnan(bin(BinaryOp::Minimum, 1.f, kNan)));
  EXPECT_EQ(bin(BinaryOp::Eq, kNan, kNan), 0.f);
  EXPECT_EQ(bin(BinaryOp::Ne, kNan, kNan), 1.f);
}

TEST(CudaKernelMath, IntegerDivisionFloorsAndPowersAreExact) {
  EXPECT_EQ(bin<long long>(BinaryOp::Div, -7, 2), -4);
  EXPECT_EQ(bin<long long>(BinaryOp::Div, 7, -2), -4);
  EXPECT_EQ(bin<long long>(BinaryOp::Div, 6, 3), 2);
  EXPECT_EQ(bin<long long>(BinaryOp::Div, -6, 3), -2);
  EXPECT_EQ(bin<long long>(BinaryOp::Div, 5, 0), 0); // no trap on the device
  EXPECT_EQ(bin<long long>(BinaryOp::Pow, 3, 4), 81);
  EXPECT_EQ(bin<long long>(BinaryOp::Pow, 2, 62), 1LL << 62);
  EXPECT_EQ(bin<long long>(BinaryOp::Pow, 2, -1), 0);
  EXPECT_EQ(bin<long long>(BinaryOp::Pow, -1, -3), -1);
  EXPECT_EQ(un<long long>(UnaryOp::PowScalar, -3, true, 3), -27);
  EXPECT_EQ(un<long long>(UnaryOp::Abs, -(1LL << 62)), 1LL << 62);
  Params<long long> p = params<long long>(static_cast<int>(BinaryOp::Sub));
  p.alpha = 3;
  EXPECT_EQ(applyBinary(p, 10LL, 2LL), 4);
}

TEST(CudaKernelMath, FloatOpsMatchTheCpuFormulas) {
  EXPECT_FLOAT_EQ(un(UnaryOp::Sigmoid, 0.f), 0.5f);
  EXPECT_NEAR(un(UnaryOp::Sigmoid, 2.f), 1.f / (1.f + std::exp(-2.f)), 1e-7);
  EXPECT_FLOAT_EQ(un(UnaryOp::RPowScalar, 3.f, true, 2.f), 8.f);
  EXPECT_FLOAT_EQ(un(UnaryOp::Reciprocal, 4.f), 0.25f);
  EXPECT_TRUE(std::isinf(un(UnaryOp::Reciprocal, 0.f)));
  EXPECT_DOUBLE_EQ(un<double>(UnaryOp::Tanh, 0.5), std::tanh(0.5));
}

TEST(CudaKernelMath, ExtremaPreferNanThenTheFirstIndex) {
  using P = Pair<float>;
  const P nan1{kNan, 1}, nan3{kNan, 3}, five2{5.f, 2}, five7{5.f, 7}, one0{1.f, 0};
  const P id = identity<float>(ReduceOp::Max);
  EXPECT_EQ(combine(ReduceOp::Max, id, one0).i, 0);
  EXPECT_EQ(combine(ReduceOp::Max, one0, five2).i, 2);
  EXPECT_EQ(combine(ReduceOp::Max, five7, five2).i, 2); // tie: the smaller index, either order
  EXPECT_EQ(combine(ReduceOp::Max, five2, five7).i, 2);
  EXPECT_EQ(combine(ReduceOp::Min, five2, one0).i, 0);
  EXPECT_EQ(combine(ReduceOp::Max, five2, nan3).i, 3);  // NaN wins
  EXPECT_EQ(combine(ReduceOp::Min, nan3, one0).i, 3);
  EXPECT_EQ(combine(ReduceOp::Argmax, nan3, nan1).i, 1); // the first NaN
  EXPECT_EQ(combine(ReduceOp::Sum, P{2.f, -1}, P{3.f, -1}).v, 5.f);
  EXPECT_EQ(combine(ReduceOp::Prod, identity<float>(ReduceOp::Prod), P{3.f, -1}).v, 3.f);
  const Pair<long long> lid = identity<long long>(ReduceOp::Min);
  EXPECT_EQ(combine(ReduceOp::Min, lid, Pair<long long>{LLONG_MAX, 4}).i, 4);
}

// The kernels' dtype conversions (loadAs/storeAs, host-callable) against the
// CPU runtime's: every half and bfloat16 bit pattern, and rounding from float.
TEST(CudaKernelMath, HalfAndBFloat16ConversionsMatchTheCpuBitForBit) {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const std::uint16_t h = static_cast<std::uint16_t>(bits);
    const float gpu = loadAs<float>(&h, DType::Half, 0);
    const float cpu = tt::Half::toFloat(h);
    if (std::isnan(cpu)) {
      EXPECT_TRUE(std::isnan(gpu)) << bits;
      continue;
    }
    ASSERT_EQ(std::memcmp(&gpu, &cpu, 4), 0) << "half bits " << bits;
    tt::BFloat16 b;
    b.x = h;
    const float gb = loadAs<float>(&h, DType::BFloat16, 0);
    if (!std::isnan(float(b)))
      ASSERT_EQ(gb, float(b)) << "bf16 bits " << bits;
  }
  std::mt19937 g(11);
  std::uniform_int_distribution<std::uint32_t> u;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t fb = u(g);
    float f;
    std::memcpy(&f, &fb, 4);
    if (std::isnan(f))
      continue;
    std::uint16_t gh = 0, gb = 0;
    storeAs<float>(&gh, DType::Half, 0, f);
    storeAs<float>(&gb, DType::BFloat16, 0, f);
    ASSERT_EQ(gh, tt::Half::fromFloat(f)) << f;
    ASSERT_EQ(gb, tt::BFloat16::fromFloat(f)) << f;
  }
}

TEST(CudaKernelMath, IntegerAndBoolConversionsFollowCpp) {
  bool b = false;
  storeAs<double>(&b, DType::Bool, 0, 0.25);
  EXPECT_TRUE(b);
  storeAs<double>(&b, DType::Bool, 0, NAN);
  EXPECT_TRUE(b); // NaN != 0
  std::int32_t i = 0;
  storeAs<double>(&i, DType::Int, 0, -2.75);
  EXPECT_EQ(i, -2);
  long long l = 0;
  storeAs<long long>(&l, DType::Long, 0, (1LL << 60) + 1);
  EXPECT_EQ(l, (1LL << 60) + 1);
  const bool t = true;
  EXPECT_EQ(loadAs<long long>(&t, DType::Bool, 0), 1);
}
