// Each CUDA kernel against a CPU reference written beside it (llm.c style),
// through the backend's plain interface. Skips without a GPU, saying why.
#include "cuda_ops.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace tt::cudaops;

namespace {

class CudaKernels : public ::testing::Test {
protected:
  void SetUp() override {
    std::string why;
    if (deviceCountNoThrow(&why) == 0)
      GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// A device buffer holding a copy of host data.
template <typename T> struct DevBuf {
  T *p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(const std::vector<T> &h) : n(h.size()) {
    p = static_cast<T *>(rawDeviceMalloc(std::max<std::size_t>(1, n) * sizeof(T)));
    if (n)
      memcpyAsync(p, h.data(), n * sizeof(T), CopyKind::HostToDevice, nullptr);
    streamSynchronize(nullptr);
  }
  explicit DevBuf(std::size_t count) : DevBuf(std::vector<T>(count)) {}
  ~DevBuf() { rawDeviceFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    streamSynchronize(nullptr);
    if (n)
      memcpyAsync(h.data(), p, n * sizeof(T), CopyKind::DeviceToHost, nullptr);
    streamSynchronize(nullptr);
    return h;
  }
};

template <typename T> DType dtypeOf();
template <> DType dtypeOf<float>() { return DType::Float; }
template <> DType dtypeOf<double>() { return DType::Double; }
template <> DType dtypeOf<std::int32_t>() { return DType::Int; }
template <> DType dtypeOf<long long>() { return DType::Long; }
template <> DType dtypeOf<std::uint8_t>() { return DType::Bool; } // bytes 0/1
template <> DType dtypeOf<std::uint16_t>() { return DType::Half; } // raw half bits

template <typename T>
Operand desc(T *p, std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides = {}) {
  if (strides.empty()) {
    strides.resize(sizes.size());
    std::int64_t s = 1;
    for (std::size_t i = sizes.size(); i-- > 0;) {
      strides[i] = s;
      s *= sizes[i];
    }
  }
  return makeOperand(p, dtypeOf<T>(), sizes.data(), strides.data(), static_cast<int>(sizes.size()));
}

// Row-major walk of an operand's logical elements: the offsets.
std::vector<std::int64_t> offsets(const Operand &o) {
  std::vector<std::int64_t> out, idx(o.ndim, 0);
  for (std::int64_t i = 0, n = o.numel(); i < n; ++i) {
    std::int64_t off = 0;
    for (int d = 0; d < o.ndim; ++d)
      off += idx[d] * o.strides[d];
    out.push_back(off);
    for (int d = o.ndim - 1; d >= 0; --d) {
      if (++idx[d] < o.sizes[d])
        break;
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<float> randomFloats(std::size_t n, unsigned seed, float lo = -2, float hi = 2) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v)
    x = u(g);
  return v;
}

// CPU reference of copy(): dst[offs_d[i]] = src[offs_s[i]].
template <typename D, typename S>
void copyCpu(std::vector<D> &dst, const Operand &dd, const std::vector<S> &src, const Operand &sd) {
  auto od = offsets(dd), os = offsets(sd);
  for (std::size_t i = 0; i < od.size(); ++i)
    dst[od[i]] = static_cast<D>(src[os[i]]);
}

} // namespace

TEST_F(CudaKernels, CopyContiguousTransposedSlicedAndPermuted) {
  struct Case {
    std::vector<std::int64_t> sizes, srcStrides, dstStrides;
    std::size_t srcLen, dstLen;
  };
  const std::vector<Case> cases = {
      {{1000}, {1}, {1}, 1000, 1000},                          // memcpy
      {{37, 45}, {1, 37}, {45, 1}, 37 * 45, 37 * 45},          // transpose, ragged tiles
      {{64, 96}, {1, 70}, {96, 1}, 70 * 96, 64 * 96},          // transpose with padded ld
      {{2, 20, 3}, {60, 1, 20}, {60, 3, 1}, 120, 120},         // batched (NCHW->NHWC)
      {{5, 7}, {20, 2}, {7, 1}, 100, 35},                      // strided slice
      {{3, 4, 5}, {1, 3, 12}, {20, 5, 1}, 60, 60},             // full reversal permute
      {{4, 6}, {0, 1}, {6, 1}, 6, 24},                         // expanded source
  };
  for (const Case &c : cases) {
    auto hs = randomFloats(c.srcLen, 1);
    DevBuf<float> s(hs), d(std::vector<float>(c.dstLen, -7.f));
    Operand sd = desc(s.p, c.sizes, c.srcStrides), dd = desc(d.p, c.sizes, c.dstStrides);
    copy(dd, sd, nullptr);
    std::vector<float> ref(c.dstLen, -7.f);
    copyCpu(ref, dd, hs, sd);
    EXPECT_EQ(d.host(), ref) << "sizes[0]=" << c.sizes[0];
  }
}

TEST_F(CudaKernels, LargeTransposeAllElementSizes) {
  const std::int64_t R = 513, C = 1031;
  std::vector<double> hs(R * C);
  for (std::size_t i = 0; i < hs.size(); ++i)
    hs[i] = static_cast<double>(i);
  DevBuf<double> s(hs), d(R * C);
  copy(desc(d.p, {C, R}), desc(s.p, {C, R}, {1, C}), nullptr);
  auto out = d.host();
  for (std::int64_t i = 0; i < C; ++i)
    for (std::int64_t j = 0; j < R; ++j)
      ASSERT_EQ(out[i * R + j], hs[j * C + i]);
  std::vector<std::uint16_t> hh(R * C);
  for (std::size_t i = 0; i < hh.size(); ++i)
    hh[i] = static_cast<std::uint16_t>(i * 7);
  DevBuf<std::uint16_t> s2(hh), d2(R * C);
  copy(desc(d2.p, {C, R}), desc(s2.p, {C, R}, {1, C}), nullptr);
  auto out2 = d2.host();
  for (std::int64_t i = 0; i < C; ++i)
    for (std::int64_t j = 0; j < R; ++j)
      ASSERT_EQ(out2[i * R + j], hh[j * C + i]);
}

TEST_F(CudaKernels, CopyConvertsDtypes) {
  std::vector<float> hf = {-2.75f, -1.f, -0.5f, 0.f, 0.25f, 1.5f, 3.99f, 1e6f};
  DevBuf<float> f(hf);
  DevBuf<std::int32_t> i(hf.size());
  DevBuf<std::uint8_t> b(hf.size());
  DevBuf<double> dd(hf.size());
  copy(desc(i.p, {8}), desc(f.p, {8}), nullptr);
  copy(desc(b.p, {8}), desc(f.p, {8}), nullptr);
  copy(desc(dd.p, {8}), desc(f.p, {8}), nullptr);
  auto hi = i.host();
  auto hb = b.host();
  auto hd = dd.host();
  for (std::size_t k = 0; k < hf.size(); ++k) {
    EXPECT_EQ(hi[k], static_cast<std::int32_t>(hf[k]));
    EXPECT_EQ(hb[k], hf[k] != 0.f);
    EXPECT_EQ(hd[k], static_cast<double>(hf[k]));
  }
  // Long values beyond 2^53 survive Long -> Long conversions through int64.
  std::vector<long long> hl = {(1LL << 60) + 1, -(1LL << 55) - 3};
  DevBuf<long long> l(hl), l2(2);
  copy(desc(l2.p, {2}, {1}), desc(l.p, {2}, {1}), nullptr);
  EXPECT_EQ(l2.host(), hl);
  // float -> half -> float rounds like the CPU's Half (1/3 is not exact).
  std::vector<float> third = {1.f / 3.f, 65504.f, 1e-8f};
  DevBuf<float> t(third), back(3);
  DevBuf<std::uint16_t> h(3);
  copy(desc(h.p, {3}), desc(t.p, {3}), nullptr);
  copy(desc(back.p, {3}), desc(h.p, {3}), nullptr);
  auto hb2 = back.host();
  EXPECT_FLOAT_EQ(hb2[0], 0.333251953125f);
  EXPECT_FLOAT_EQ(hb2[1], 65504.f);
  EXPECT_FLOAT_EQ(hb2[2], 0.f);
}

TEST_F(CudaKernels, FillEveryDtypeAndStridedFill) {
  DevBuf<float> f(10);
  fill(desc(f.p, {10}), 2.5, nullptr);
  EXPECT_EQ(f.host(), std::vector<float>(10, 2.5f));
  DevBuf<long long> l(4);
  fill(desc(l.p, {4}), -3, nullptr);
  EXPECT_EQ(l.host(), std::vector<long long>(4, -3));
  DevBuf<std::uint8_t> b(3);
  fill(desc(b.p, {3}), 0.5, nullptr);
  EXPECT_EQ(b.host(), std::vector<std::uint8_t>(3, 1));
  DevBuf<std::uint16_t> h(2);
  fill(desc(h.p, {2}), 1.0, nullptr);
  EXPECT_EQ(h.host(), std::vector<std::uint16_t>(2, 0x3c00)); // half 1.0
  DevBuf<float> g(std::vector<float>(12, 0.f));
  fill(desc(g.p, {3, 2}, {4, 2}), 9.0, nullptr); // g.view(3,4)[:, ::2]
  auto hg = g.host();
  for (int k = 0; k < 12; ++k)
    EXPECT_EQ(hg[k], (k % 2 == 0) ? 9.f : 0.f) << k;
}

TEST_F(CudaKernels, UnaryOpsMatchTheCpu) {
  auto hx = randomFloats(1000, 2, 0.1f, 3.f);
  hx[0] = NAN;
  DevBuf<float> x(hx), y(hx.size());
  struct U {
    UnaryOp op;
    double a, b;
    float (*ref)(float);
  };
  const U ops[] = {
      {UnaryOp::Neg, NAN, NAN, [](float v) { return -v; }},
      {UnaryOp::Abs, NAN, NAN, [](float v) { return std::fabs(v); }},
      {UnaryOp::Exp, NAN, NAN, [](float v) { return std::exp(v); }},
      {UnaryOp::Log, NAN, NAN, [](float v) { return std::log(v); }},
      {UnaryOp::Sqrt, NAN, NAN, [](float v) { return std::sqrt(v); }},
      {UnaryOp::Relu, NAN, NAN, [](float v) { return std::isnan(v) ? v : std::max(v, 0.f); }},
      {UnaryOp::Sigmoid, NAN, NAN, [](float v) { return 1.f / (1.f + std::exp(-v)); }},
      {UnaryOp::Tanh, NAN, NAN, [](float v) { return std::tanh(v); }},
      {UnaryOp::Clamp, 0.5, 2.0,
       [](float v) { return std::isnan(v) ? v : std::min(std::max(v, 0.5f), 2.f); }},
      {UnaryOp::Clamp, NAN, 1.0, [](float v) { return std::isnan(v) ? v : std::min(v, 1.f); }},
      {UnaryOp::PowScalar, 2.0, NAN, [](float v) { return v * v; }},
      {UnaryOp::RPowScalar, 2.0, NAN, [](float v) { return std::pow(2.f, v); }},
      {UnaryOp::Reciprocal, NAN, NAN, [](float v) { return 1.f / v; }},
  };
  for (const U &u : ops) {
    unary(u.op, desc(y.p, {1000}), desc(x.p, {1000}), DType::Float, u.a, u.b, nullptr);
    auto hy = y.host();
    for (std::size_t k = 0; k < hx.size(); ++k) {
      const float r = u.ref(hx[k]);
      if (std::isnan(r))
        EXPECT_TRUE(std::isnan(hy[k])) << static_cast<int>(u.op) << " at " << k;
      else
        EXPECT_NEAR(hy[k], r, 1e-5f * std::max(1.f, std::fabs(r))) << static_cast<int>(u.op);
    }
  }
  // Integer abs/neg stay exact in int64.
  std::vector<long long> hl = {-5, 0, 7, -(1LL << 62)};
  DevBuf<long long> l(hl), lo(4);
  unary(UnaryOp::Abs, desc(lo.p, {4}), desc(l.p, {4}), DType::Long, NAN, NAN, nullptr);
  EXPECT_EQ(lo.host(), (std::vector<long long>{5, 0, 7, 1LL << 62}));
}

TEST_F(CudaKernels, BinaryBroadcastsAndComparesLikeTheCpu) {
  auto ha = randomFloats(6 * 5, 3), hb = randomFloats(5, 4);
  hb[2] = ha[2]; // an equal pair for the comparisons
  DevBuf<float> a(ha), b(hb), out(30);
  DevBuf<std::uint8_t> cmp(30);
  Operand oa = desc(a.p, {6, 5}), ob = desc(b.p, {5}), oo = desc(out.p, {6, 5});
  binary(BinaryOp::Add, oo, oa, ob, DType::Float, 2.0, nullptr);
  auto ho = out.host();
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 5; ++j)
      EXPECT_FLOAT_EQ(ho[i * 5 + j], ha[i * 5 + j] + 2.f * hb[j]);
  binary(BinaryOp::Maximum, oo, ob, oa, DType::Float, 1.0, nullptr);
  ho = out.host();
  for (int i = 0; i < 30; ++i)
    EXPECT_EQ(ho[i], std::max(ha[i], hb[i % 5]));
  const BinaryOp cmps[] = {BinaryOp::Eq, BinaryOp::Ne, BinaryOp::Lt,
                           BinaryOp::Le, BinaryOp::Gt, BinaryOp::Ge};
  for (BinaryOp op : cmps) {
    binary(op, desc(cmp.p, {6, 5}), oa, ob, DType::Float, 1.0, nullptr);
    auto hc = cmp.host();
    for (int i = 0; i < 30; ++i) {
      const float x = ha[i], y = hb[i % 5];
      const bool r = op == BinaryOp::Eq   ? x == y
                     : op == BinaryOp::Ne ? x != y
                     : op == BinaryOp::Lt ? x < y
                     : op == BinaryOp::Le ? x <= y
                     : op == BinaryOp::Gt ? x > y
                                          : x >= y;
      EXPECT_EQ(hc[i], r) << static_cast<int>(op) << " at " << i;
    }
  }
  // tensor-scalar without a device allocation for the scalar
  binary(BinaryOp::Mul, oo, oa, makeScalar(-0.5, DType::Float), DType::Float, 1.0, nullptr);
  ho = out.host();
  for (int i = 0; i < 30; ++i)
    EXPECT_FLOAT_EQ(ho[i], ha[i] * -0.5f);
  // int64 math stays exact
  std::vector<long long> hl = {3, -4, 1LL << 30};
  DevBuf<long long> l(hl), lo(3);
  binary(BinaryOp::Pow, desc(lo.p, {3}), desc(l.p, {3}), makeScalar(2, DType::Long), DType::Long,
         1.0, nullptr);
  EXPECT_EQ(lo.host(), (std::vector<long long>{9, 16, 1LL << 60}));
}

TEST_F(CudaKernels, WhereSelectsWithBroadcasting) {
  std::vector<std::uint8_t> hc = {1, 0, 1};
  std::vector<float> ha = randomFloats(2 * 3, 5);
  DevBuf<std::uint8_t> c(hc);
  DevBuf<float> a(ha), out(6);
  where(desc(out.p, {2, 3}), desc(c.p, {3}), desc(a.p, {2, 3}), makeScalar(0, DType::Float),
        nullptr);
  auto ho = out.host();
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(ho[i], hc[i % 3] ? ha[i] : 0.f);
}

namespace {
// CPU reference reduction of a dense [n0, n1, n2] float tensor over `mask`.
struct RefResult {
  std::vector<double> value;
  std::vector<long long> index;
};
RefResult reduceCpu(ReduceOp op, const std::vector<float> &x, std::int64_t n0, std::int64_t n1,
                    std::int64_t n2, unsigned mask) {
  const std::int64_t n[3] = {n0, n1, n2};
  std::int64_t outN[3];
  for (int d = 0; d < 3; ++d)
    outN[d] = (mask >> d & 1) ? 1 : n[d];
  RefResult r;
  const std::int64_t nout = outN[0] * outN[1] * outN[2];
  const bool ext = op != ReduceOp::Sum && op != ReduceOp::Mean && op != ReduceOp::Prod;
  const bool isMax = op == ReduceOp::Max || op == ReduceOp::Argmax;
  r.value.assign(nout, op == ReduceOp::Prod ? 1.0 : 0.0);
  r.index.assign(nout, -1);
  std::vector<std::int64_t> count(nout, 0);
  for (std::int64_t i = 0; i < n0; ++i)
    for (std::int64_t j = 0; j < n1; ++j)
      for (std::int64_t k = 0; k < n2; ++k) {
        const std::int64_t idx[3] = {i, j, k};
        std::int64_t o = 0, rr = 0;
        for (int d = 0; d < 3; ++d) {
          o = o * outN[d] + ((mask >> d & 1) ? 0 : idx[d]);
          if (mask >> d & 1)
            rr = rr * n[d] + idx[d];
        }
        const double v = x[(i * n1 + j) * n2 + k];
        ++count[o];
        if (!ext) {
          r.value[o] = op == ReduceOp::Prod ? r.value[o] * v : r.value[o] + v;
          continue;
        }
        const double cur = r.value[o];
        const bool take = r.index[o] < 0 || (std::isnan(v) && !std::isnan(cur)) ||
                          (!std::isnan(cur) && (isMax ? v > cur : v < cur));
        if (take) {
          r.value[o] = v;
          r.index[o] = rr;
        }
      }
  if (op == ReduceOp::Mean)
    for (std::int64_t o = 0; o < nout; ++o)
      r.value[o] /= static_cast<double>(count[o]);
  return r;
}
} // namespace

TEST_F(CudaKernels, ReductionsOverEveryDimSetAndSize) {
  // Shapes chosen to hit each thread-group size and the split path.
  const std::int64_t shapes[][3] = {{3, 4, 5}, {2, 100, 70}, {1, 3, 300000}, {1000, 2, 50}};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max,   ReduceOp::Min,
                          ReduceOp::Argmax, ReduceOp::Argmin, ReduceOp::Prod};
  for (const auto &sh : shapes) {
    const std::int64_t n = sh[0] * sh[1] * sh[2];
    auto hx = randomFloats(n, 7, -1.f, 1.f);
    for (std::int64_t k = 0; k < n; k += 97)
      hx[k] = 0.5f; // ties: the first index must win
    DevBuf<float> x(hx);
    for (unsigned mask = 1; mask < 8; ++mask)
      for (ReduceOp op : ops) {
        if (op == ReduceOp::Prod && n > 1000)
          continue; // products of many values under/overflow: tested on small shapes
        const std::int64_t on[3] = {(mask & 1) ? 1 : sh[0], (mask & 2) ? 1 : sh[1],
                                    (mask & 4) ? 1 : sh[2]};
        const std::int64_t nout = on[0] * on[1] * on[2];
        const bool argOut = op == ReduceOp::Argmax || op == ReduceOp::Argmin;
        DevBuf<float> out(nout);
        DevBuf<long long> idx(nout);
        Operand in = desc(x.p, {sh[0], sh[1], sh[2]});
        Operand od = argOut ? desc(idx.p, {on[0], on[1], on[2]}) : desc(out.p, {on[0], on[1], on[2]});
        Operand id = desc(idx.p, {on[0], on[1], on[2]});
        const bool withIdx = op == ReduceOp::Max || op == ReduceOp::Min;
        DevBuf<char> scratch(reduceScratchBytes(in, mask));
        reduce(op, od, withIdx ? &id : nullptr, in, mask, scratch.p, nullptr);
        RefResult ref = reduceCpu(op, hx, sh[0], sh[1], sh[2], mask);
        auto hv = out.host();
        auto hi = idx.host();
        for (std::int64_t o = 0; o < nout; ++o) {
          if (argOut) {
            ASSERT_EQ(hi[o], ref.index[o]) << "op " << static_cast<int>(op) << " mask " << mask;
            continue;
          }
          ASSERT_NEAR(hv[o], ref.value[o], 1e-4 * std::max(1.0, std::fabs(ref.value[o])) +
                                               (op == ReduceOp::Sum ? 1e-6 * n : 0))
              << "op " << static_cast<int>(op) << " mask " << mask << " shape " << sh[2];
          if (withIdx)
            ASSERT_EQ(hi[o], ref.index[o]);
        }
      }
  }
}

TEST_F(CudaKernels, MaxPropagatesNaN) {
  std::vector<float> hx = {1.f, NAN, 3.f, NAN};
  DevBuf<float> x(hx), out(1);
  DevBuf<long long> idx(1);
  Operand o = desc(out.p, {1}), id = desc(idx.p, {1});
  reduce(ReduceOp::Max, o, &id, desc(x.p, {4}), 1, nullptr, nullptr);
  EXPECT_TRUE(std::isnan(out.host()[0]));
  EXPECT_EQ(idx.host()[0], 1);
}

TEST_F(CudaKernels, GemmMatchesNaiveProduct) {
  const std::int64_t B = 3, M = 17, K = 33, N = 9;
  auto ha = randomFloats(B * M * K, 8), hb = randomFloats(B * K * N, 9);
  DevBuf<float> a(ha), b(hb), c(B * M * N);
  gemm(DType::Float, false, false, M, N, K, a.p, K, M * K, b.p, N, K * N, c.p, N, M * N, B, nullptr);
  auto hc = c.host();
  for (std::int64_t z = 0; z < B; ++z)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (std::int64_t k = 0; k < K; ++k)
          s += ha[z * M * K + i * K + k] * hb[z * K * N + k * N + j];
        ASSERT_NEAR(hc[z * M * N + i * N + j], s, 1e-3);
      }
  // A given transposed (stored [K, M]), B broadcast over the batch (stride 0).
  auto hat = randomFloats(K * M, 10);
  DevBuf<float> at(hat), c2(B * M * N);
  gemm(DType::Float, true, false, M, N, K, at.p, M, 0, b.p, N, K * N, c2.p, N, M * N, B, nullptr);
  auto hc2 = c2.host();
  for (std::int64_t z = 0; z < B; ++z)
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (std::int64_t k = 0; k < K; ++k)
          s += hat[k * M + i] * hb[z * K * N + k * N + j];
        ASSERT_NEAR(hc2[z * M * N + i * N + j], s, 1e-3);
      }
  EXPECT_THROW(gemm(DType::Long, false, false, 1, 1, 1, a.p, 1, 0, b.p, 1, 0, c.p, 1, 0, 1, nullptr),
               std::runtime_error);
}
