// Storage, views, copies, version counters, autograd errors: the facts of
// docs/hazards checked against PyTorch 1.13 (expected values from the oracle).
#include "tt/tt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

using namespace tt::indexing;

namespace {
std::string errorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "<no error>";
}
std::vector<std::int64_t> v(tt::IntArrayRef a) { return a.vec(); }
using V = std::vector<std::int64_t>;
} // namespace

TEST(Views, ShareStorageAndVersion) {
  tt::Tensor a = tt::arange(12, tt::kFloat).view({3, 4});
  for (tt::Tensor w : {a.t(), a.transpose(0, 1), a.permute({1, 0}), a.narrow(1, 1, 2), a.select(0, 1),
                       a.slice(1, 0, 4, 2), a.unsqueeze(0), a.view({-1}), a.diagonal(), a.expand({2, 3, 4}),
                       a[1], a.index({Slice(), 2})}) {
    EXPECT_TRUE(w.is_alias_of(a));
    EXPECT_TRUE(w.is_view());
  }
  tt::Tensor s = a.select(0, 1);
  s.add_(1);
  EXPECT_EQ(a._version(), 1u);
  EXPECT_FLOAT_EQ(a.index({1, 0}).item<float>(), 5.0f);
  EXPECT_EQ(v(a.t().strides()), (V{1, 4}));
  EXPECT_EQ(v(a.slice(1, 0, 4, 2).strides()), (V{4, 2}));
  EXPECT_EQ(v(a.expand({2, 3, 4}).strides()), (V{0, 4, 1}));
  EXPECT_EQ(a.select(0, 2).storage_offset(), 8);
}

TEST(Views, ViewOnIncompatibleLayoutThrows) {
  tt::Tensor a = tt::zeros({3, 2});
  EXPECT_EQ(errorOf([&] { a.t().view({6}); }),
            "view size is not compatible with input tensor's size and stride (at least one dimension spans across "
            "two contiguous subspaces). Use .reshape(...) instead.");
  EXPECT_EQ(errorOf([&] { tt::zeros({3}).view({2, 2}); }), "shape '[2, 2]' is invalid for input of size 3");
  EXPECT_EQ(errorOf([&] { tt::zeros({3}).view({-1, -1}); }), "only one dimension can be inferred");
}

TEST(Reshape, CopiesExactlyWhenViewIsImpossible) {
  tt::reset_memory_stats();
  tt::Tensor a = tt::zeros({3, 4});
  tt::Tensor r = a.reshape({-1});
  EXPECT_TRUE(r.is_alias_of(a));
  tt::Tensor rt = a.t().reshape({-1});
  EXPECT_FALSE(rt.is_alias_of(a));
  EXPECT_EQ(tt::memory_stats().copies_of(tt::CopyKind::ImplicitReshape), 1);
  // A permute whose dims stay apart is still a view (PyTorch: True).
  tt::Tensor b = tt::zeros({2, 3, 4});
  EXPECT_TRUE(b.permute({1, 0, 2}).reshape({3, 2, 4}).is_alias_of(b));
  EXPECT_TRUE(b.permute({0, 2, 1}).reshape({2, 12}).is_alias_of(b) == false);
  // flatten(d, d) returns self.
  EXPECT_TRUE(a.flatten(1, 1).is_same(a));
  EXPECT_FALSE(a.t().flatten().is_alias_of(a));
  EXPECT_EQ(tt::memory_stats().copies_of(tt::CopyKind::ImplicitFlatten), 1);
}

TEST(Copies, ContiguousAndToReturnSelf) {
  tt::Tensor a = tt::ones({2, 3});
  EXPECT_TRUE(a.contiguous().is_same(a));
  EXPECT_TRUE(a.to(tt::kFloat).is_same(a));
  EXPECT_TRUE(a.to(tt::kCPU).is_same(a));
  EXPECT_FALSE(a.to(tt::kFloat, false, /*copy=*/true).is_alias_of(a));
  tt::Tensor c = a.t().contiguous();
  EXPECT_FALSE(c.is_alias_of(a));
  EXPECT_TRUE(c.is_contiguous());
  tt::Tensor d = a.to(tt::kDouble);
  EXPECT_EQ(d.dtype(), tt::kDouble);
  EXPECT_FALSE(d.is_alias_of(a));
  // to() preserves a dense permuted layout, like PyTorch.
  EXPECT_EQ(v(a.t().to(tt::kDouble).strides()), (V{1, 3}));
}

TEST(Copies, ClonePreservesStrides) {
  tt::Tensor a = tt::zeros({2, 3, 4});
  EXPECT_EQ(v(a.permute({2, 0, 1}).clone().strides()), (V{1, 12, 4}));
  EXPECT_EQ(v(a.slice(2, 0, 4, 2).clone().strides()), (V{6, 2, 1}));
  EXPECT_EQ(v(a.permute({2, 0, 1}).clone(tt::MemoryFormat::Contiguous).strides()), (V{6, 3, 1}));
}

TEST(Elementwise, ResultFollowsInputLayout) {
  tt::Tensor a = tt::zeros({2, 3});
  EXPECT_EQ(v((a.t() + 1).strides()), (V{1, 3}));
  EXPECT_EQ(v(tt::zeros({4, 6}).slice(0, 0, 4, 2).slice(1, 0, 6, 2).exp().strides()), (V{3, 1}));
  EXPECT_EQ(v((tt::zeros({3, 4}).t() + tt::zeros({4, 3})).strides()), (V{1, 4}));
  EXPECT_EQ(v((tt::zeros({4, 3}) + tt::zeros({3, 4}).t()).strides()), (V{3, 1}));
  EXPECT_EQ(v(tt::zeros({3, 1}).expand({3, 4}).exp().strides()), (V{4, 1}));
}

TEST(Math, ValuesAndPromotion) {
  tt::Tensor a = tt::tensor({1.0, 2.0, 3.0});
  tt::Tensor b = tt::tensor({4, 5, 6});
  EXPECT_EQ(b.dtype(), tt::kLong); // LibTorch: integer lists are int64
  EXPECT_EQ((a + b).dtype(), tt::kFloat);
  EXPECT_EQ((b + 1).dtype(), tt::kLong);
  EXPECT_EQ((b + 1.5).dtype(), tt::kFloat);
  EXPECT_EQ((b / 2).dtype(), tt::kFloat);
  EXPECT_EQ((a.to(tt::kDouble) + a).dtype(), tt::kDouble);
  EXPECT_EQ((tt::tensor({true, false}) + 1).dtype(), tt::kLong);
  EXPECT_TRUE(tt::allclose(a * b, tt::tensor({4.0, 10.0, 18.0})));
  EXPECT_TRUE(tt::allclose(a.sub(b, 2), tt::tensor({-7.0, -8.0, -9.0})));
  EXPECT_TRUE(tt::allclose(2 - a, tt::tensor({1.0, 0.0, -1.0})));
  EXPECT_TRUE(tt::allclose(6 / a, tt::tensor({6.0, 3.0, 2.0})));
  EXPECT_FLOAT_EQ(a.sum().item<float>(), 6.0f);
  EXPECT_FLOAT_EQ(a.mean().item<float>(), 2.0f);
  EXPECT_EQ(b.sum().dtype(), tt::kLong);
  EXPECT_EQ(b.argmax().item<std::int64_t>(), 2);
  tt::Tensor m = tt::arange(6, tt::kFloat).view({2, 3});
  EXPECT_TRUE(tt::allclose(m.sum({0}), tt::tensor({3.0, 5.0, 7.0})));
  EXPECT_EQ(v(m.sum({1}, true).sizes()), (V{2, 1}));
  auto [mx, idx] = m.max(1);
  EXPECT_TRUE(tt::allclose(mx, tt::tensor({2.0, 5.0})));
  EXPECT_EQ(idx.dtype(), tt::kLong);
  EXPECT_TRUE(tt::allclose(m.matmul(m.t()), tt::tensor({{5.0, 14.0}, {14.0, 50.0}})));
  EXPECT_TRUE(tt::allclose(tt::where(m > 2, m, tt::zeros({1})), tt::tensor({{0.0, 0.0, 0.0}, {3.0, 4.0, 5.0}})));
  EXPECT_TRUE(tt::allclose(m.clamp(1, 4).sum(), tt::tensor({15.0}).view({})));
  EXPECT_TRUE(tt::tensor({1.0, 2.0}).equal(tt::tensor({1.0, 2.0})));
  EXPECT_TRUE(tt::allclose(m.to(tt::kHalf).to(tt::kFloat), m));
  EXPECT_TRUE(tt::allclose(m.to(tt::kBFloat16).to(tt::kFloat), m));
  tt::Tensor bm = tt::randn({2, 3, 4});
  tt::Tensor bn = tt::randn({2, 4, 5});
  tt::Tensor r = bm.bmm(bn);
  EXPECT_NEAR(r.index({1, 2, 3}).item<float>(), bm[1][2].mul(bn.index({1, Slice(), 3})).sum().item<float>(), 1e-5);
}

TEST(Errors, PyTorchWording) {
  EXPECT_EQ(errorOf([] { tt::zeros({3}) + tt::zeros({4}); }),
            "The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0");
  EXPECT_EQ(errorOf([] { tt::zeros({3}).transpose(0, 2); }),
            "Dimension out of range (expected to be in range of [-1, 0], but got 2)");
  EXPECT_EQ(errorOf([] { tt::zeros({2, 3}).mm(tt::zeros({2, 3})); }),
            "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)");
  EXPECT_EQ(errorOf([] { tt::zeros({3}).to(tt::kInt).add_(1.5); }),
            "result type Float can't be cast to the desired output type Int");
  EXPECT_EQ(errorOf([] { tt::zeros({2, 2}, tt::kLong).mean(); }),
            "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. "
            "Got: Long");
  EXPECT_EQ(errorOf([] { tt::zeros({3}).select(0, 5); }),
            "select(): index 5 out of range for tensor of size [3] at dimension 0");
  EXPECT_EQ(errorOf([] { tt::zeros({3}).narrow(0, 2, 3); }), "start (2) + length (3) exceeds dimension size (3).");
  EXPECT_EQ(errorOf([] { tt::zeros({3}).copy_(tt::zeros({2, 3})); }),
            "output with shape [3] doesn't match the broadcast shape [2, 3]");
  EXPECT_EQ(errorOf([] { tt::zeros({3}).expand({3, 2}); }),
            "The expanded size of the tensor (2) must match the existing size (3) at non-singleton dimension 1.  "
            "Target sizes: [3, 2].  Tensor sizes: [3]");
  EXPECT_EQ(errorOf([] { tt::zeros({3, 2}).expand({4, 3, 2}).add_(1); }),
            "unsupported operation: more than one element of the written-to tensor refers to a single memory "
            "location. Please clone() the tensor before performing the operation.");
  EXPECT_EQ(errorOf([] { tt::zeros({2}).item<float>(); }), "a Tensor with 2 elements cannot be converted to Scalar");
  EXPECT_EQ(errorOf([] { tt::tensor({2, 3}).pow(-1); }), "Integers to negative integer powers are not allowed.");
  if (!tt::cuda::is_available())
    EXPECT_NE(errorOf([] { tt::zeros({2}, tt::kCUDA); }).find("CUDA"), std::string::npos);
}

TEST(Math, ReluKeepsNaN) {
  tt::Tensor r = tt::tensor({std::nan(""), -1.0, 2.0}).relu();
  const float *p = r.data_ptr<float>();
  EXPECT_TRUE(std::isnan(p[0])); // as PyTorch: NaN propagates
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_EQ(p[2], 2.0f);
  EXPECT_EQ(tt::tensor({2, 3}).pow(2).sum().item<std::int64_t>(), 13);
}

TEST(Versions, BumpedByEveryInPlaceAndSharedByDetach) {
  tt::Tensor a = tt::zeros({4});
  tt::Tensor d = a.detach();
  EXPECT_TRUE(d.is_alias_of(a));
  d.mul_(2);
  a += 1;
  a.index_put_({0}, 3.0);
  a.zero_();
  a.fill_(1);
  a.copy_(tt::ones({4}));
  EXPECT_EQ(a._version(), 6u);
  EXPECT_EQ(d._version(), 6u);
  tt::Tensor x = a.data();
  x.add_(1); // data(): fresh version counter
  EXPECT_EQ(a._version(), 6u);
}

TEST(Autograd, GradientsMatchPyTorch) {
  tt::Tensor x = tt::tensor({1.0, 2.0, 3.0}, tt::requires_grad());
  tt::Tensor y = (x * x + x.exp()).sum();
  y.backward();
  tt::Tensor expected = x.detach() * 2 + x.detach().exp();
  EXPECT_TRUE(tt::allclose(x.grad(), expected));
  EXPECT_EQ(y.grad_fn()->name(), "SumBackward0");
  tt::Tensor w = tt::randn({3, 2}, tt::requires_grad());
  tt::Tensor in = tt::randn({4, 3});
  in.matmul(w).relu().mean().backward();
  EXPECT_EQ(v(w.grad().sizes()), (V{3, 2}));
  tt::Tensor z = tt::ones({2, 3}, tt::requires_grad());
  (z.t().reshape({-1}) * tt::arange(6, tt::kFloat)).sum().backward();
  EXPECT_TRUE(tt::allclose(z.grad(), tt::tensor({{0.0, 2.0, 4.0}, {1.0, 3.0, 5.0}})));
}

TEST(Autograd, ModifiedSavedTensorThrows) {
  tt::Tensor a = tt::randn({3}, tt::requires_grad());
  tt::Tensor b = a.exp();
  b.add_(1);
  EXPECT_EQ(errorOf([&] { b.sum().backward(); }),
            "one of the variables needed for gradient computation has been modified by an inplace operation: "
            "[torch.FloatTensor [3]], which is output 0 of ExpBackward0, is at version 1; expected version 0 "
            "instead. Hint: enable anomaly detection to find the operation that failed to compute its gradient, "
            "with torch.autograd.set_detect_anomaly(True).");
  tt::Tensor c = a * 1;
  tt::Tensor d = c * c;
  c.add_(1);
  EXPECT_NE(errorOf([&] { d.sum().backward(); }).find("which is output 0 of AddBackward1, is at version 1"),
            std::string::npos);
  // Through detach(): the shared version counter catches it.
  tt::Tensor w = tt::randn({3}, tt::requires_grad());
  tt::Tensor z = w * w;
  w.detach().mul_(2);
  EXPECT_NE(errorOf([&] { z.sum().backward(); }).find("[torch.FloatTensor [3]] is at version 1; expected version 0"),
            std::string::npos);
}

TEST(Autograd, InPlaceOnLeafThrows) {
  tt::Tensor a = tt::randn({3}, tt::requires_grad());
  EXPECT_EQ(errorOf([&] { a.add_(1); }), "a leaf Variable that requires grad is being used in an in-place operation.");
  EXPECT_EQ(errorOf([&] { a.slice(0, 0, 2).add_(1); }),
            "a view of a leaf Variable that requires grad is being used in an in-place operation.");
  {
    tt::NoGradGuard g;
    a.mul_(2); // allowed under no_grad (optimizer step)
  }
  EXPECT_EQ(a._version(), 1u);
  tt::Tensor l = (a * 2).sum();
  l.backward();
  EXPECT_NE(errorOf([&] { l.backward(); }).find("Trying to backward through the graph a second time"),
            std::string::npos);
  EXPECT_EQ(errorOf([&] { (a * 2).backward(); }), "grad can be implicitly created only for scalar outputs");
  EXPECT_EQ(errorOf([] { tt::zeros({2}).sum().backward(); }),
            "element 0 of tensors does not require grad and does not have a grad_fn");
}

TEST(Autograd, InPlaceThroughViewOfNonLeaf) {
  tt::Tensor a = tt::ones({4}, tt::requires_grad());
  tt::Tensor b = a * 2;
  b.slice(0, 0, 2).mul_(3);
  b.sum().backward();
  EXPECT_TRUE(tt::allclose(a.grad(), tt::tensor({6.0, 6.0, 2.0, 2.0})));
}

TEST(Autograd, OtherViewsSeeAWriteThroughOneView) {
  // PyTorch regenerates v2's grad_fn from the base's new history.
  tt::Tensor a = tt::ones({3}, tt::requires_grad());
  tt::Tensor b = a * 2;
  tt::Tensor v1 = b.slice(0, 0, 2), v2 = b.slice(0, 1, 3);
  v1.mul_(3);
  EXPECT_EQ(v2.grad_fn()->name(), "AsStridedBackward0");
  EXPECT_EQ(b.grad_fn()->name(), "CopySlices");
  v2.sum().backward();
  EXPECT_TRUE(a.grad().equal(tt::tensor({0.0, 6.0, 2.0})));
}

TEST(MemoryStats, CountsBytesAndCopies) {
  tt::reset_memory_stats();
  auto before = tt::memory_stats();
  {
    tt::Tensor a = tt::empty({256}, tt::kFloat);
    auto s = tt::memory_stats();
    EXPECT_EQ(s.current_bytes - before.current_bytes, 1024);
    EXPECT_EQ(s.allocations, 1);
    tt::Tensor c = a.clone();
    tt::Tensor t = a.to(tt::kDouble);
    EXPECT_EQ(tt::memory_stats().copies_of(tt::CopyKind::Clone), 1);
    EXPECT_EQ(tt::memory_stats().copies_of(tt::CopyKind::To), 1);
    EXPECT_EQ(tt::memory_stats().peak_bytes - before.current_bytes, 1024 * 4);
  }
  EXPECT_EQ(tt::memory_stats().current_bytes, before.current_bytes);
}

TEST(Trace, WritesEventsWithLocations) {
  std::string path = ::testing::TempDir() + "tt_trace_test.jsonl";
  if (!tt::trace::available()) {
    EXPECT_FALSE(tt::trace::start(path));
    GTEST_SKIP() << "runtime built with -DTT_TRACE=OFF";
  }
  ASSERT_TRUE(tt::trace::start(path));
  {
    tt::Tensor x = tt::ones({2, 3});
    tt::Tensor y = x;
    y -= 1; int line = __LINE__;
    tt::Tensor f = x.t().reshape({-1});
    tt::trace::stop();
    std::ifstream in(path);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(all.find("\"ev\":\"start\""), std::string::npos);
    EXPECT_NE(all.find("\"ev\":\"alloc\",\"op\":\"ones\""), std::string::npos);
    std::string w = "\"ev\":\"write\",\"op\":\"sub_\",\"file\":\"" + std::string(__FILE__) +
                    "\",\"line\":" + std::to_string(line);
    EXPECT_NE(all.find(w), std::string::npos) << all;
    EXPECT_NE(all.find("\"version_before\":0,\"version_after\":1"), std::string::npos);
    EXPECT_NE(all.find("\"ev\":\"copy\",\"op\":\"reshape\""), std::string::npos);
    EXPECT_NE(all.find("\"kind\":\"reshape\""), std::string::npos);
    EXPECT_NE(all.find("\"name\":\"t\",\"kind\":\"view\""), std::string::npos);
    // One flat JSON object per line.
    std::istringstream lines(all);
    for (std::string l; std::getline(lines, l);) {
      EXPECT_EQ(l.front(), '{');
      EXPECT_EQ(l.back(), '}');
      EXPECT_NE(l.substr(l.size() - 2), "}}") << l;
    }
  }
  std::remove(path.c_str());
}

TEST(Threads, SetAndGet) {
  int before = tt::get_num_threads();
  tt::set_num_threads(1);
  EXPECT_EQ(tt::get_num_threads(), 1);
  tt::Tensor a = tt::rand({300, 300});
  tt::Tensor single = (a.t() + a).contiguous();
  tt::set_num_threads(2);
  EXPECT_EQ(tt::get_num_threads(), 2);
  EXPECT_TRUE(tt::equal((a.t() + a).contiguous(), single)); // same result with 2 threads
  EXPECT_THROW(tt::set_num_threads(0), tt::Error);
  tt::set_num_threads(before);
}

TEST(Indexing, TensorIndicesGatherAndScatter) {
  tt::Tensor x = tt::arange(12, tt::kFloat).view({3, 4});
  tt::Tensor rows = x.index({tt::tensor({2, 0})});
  EXPECT_FALSE(rows.is_alias_of(x)); // advanced indexing copies
  EXPECT_TRUE(rows.equal(tt::tensor({{8.0, 9.0, 10.0, 11.0}, {0.0, 1.0, 2.0, 3.0}})));
  EXPECT_EQ(v(x.index({Slice(), tt::tensor({1, 3}).view({2, 1})}).sizes()), (V{3, 2, 1}));
  EXPECT_TRUE(x.index({x > 5}).equal(tt::tensor({6.0, 7.0, 8.0, 9.0, 10.0, 11.0})));
  EXPECT_TRUE(x.index({tt::tensor({true, false, true})}).equal(x.index({tt::tensor({0, 2})})));
  tt::Tensor y = x.clone();
  y.index_put_({y > 5}, 0);
  EXPECT_EQ(y._version(), 1u);
  EXPECT_TRUE(y.equal(tt::tensor({{0.0, 1.0, 2.0, 3.0}, {4.0, 5.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}})));
  tt::Tensor z = x.clone();
  z.index_put_({Slice(), tt::tensor({0, 2})}, tt::tensor({-1.0, -2.0}));
  EXPECT_TRUE(z.equal(tt::tensor({{-1.0, 1.0, -2.0, 3.0}, {-1.0, 5.0, -2.0, 7.0}, {-1.0, 9.0, -2.0, 11.0}})));
  tt::Tensor w = tt::arange(12, tt::kFloat).view({3, 4}).requires_grad_();
  w.index({tt::tensor({0, 0, 2})}).sum().backward();
  EXPECT_TRUE(w.grad().equal(tt::tensor({{2.0, 2.0, 2.0, 2.0}, {0.0, 0.0, 0.0, 0.0}, {1.0, 1.0, 1.0, 1.0}})));
  EXPECT_EQ(errorOf([&] { x.index({tt::tensor({5})}); }), "index 5 is out of bounds for dimension 0 with size 3");
  EXPECT_EQ(errorOf([&] { x.index({tt::tensor({true, false})}); }),
            "The shape of the mask [2] at index 0 does not match the shape of the indexed tensor [3, 4] at index 0");
}

TEST(Reductions, NonContiguousTiesAndNaN) {
  tt::Tensor x = (tt::arange(24, tt::kFloat) * 7).sub((tt::arange(24, tt::kFloat) * 7).div(11).to(tt::kLong).mul(11))
                     .view({2, 3, 4}).permute({2, 0, 1}); // (arange*7 % 11), permuted
  EXPECT_TRUE(x.sum({0, 2}).equal(tt::tensor({55.0, 62.0})));
  EXPECT_EQ(x.argmax().item<std::int64_t>(), 15);
  EXPECT_TRUE(std::get<1>(x.max(0)).equal(tt::tensor({3, 2, 1, 2, 1, 0}).view({2, 3})));
  EXPECT_TRUE(x.argmin(2).equal(tt::tensor({0, 1, 1, 0, 0, 2, 2, 1}).view({4, 2})));
  EXPECT_EQ(v(x.sum({1}, true).sizes()), (V{4, 1, 3}));
  EXPECT_TRUE(x.mean({1, 2}).allclose(tt::tensor({4.0, 5.5, 5.166666507720947, 4.833333492279053})));
  tt::Tensor y = tt::tensor({1.0, NAN, 3.0, NAN});
  EXPECT_TRUE(std::isnan(y.max().item<float>()));
  EXPECT_EQ(y.argmax().item<std::int64_t>(), 1); // the first NaN
  tt::Tensor z = tt::tensor({2.0, 5.0, 5.0, 1.0});
  EXPECT_EQ(z.argmax().item<std::int64_t>(), 1); // the first maximum
  EXPECT_EQ(tt::ones({1000000}).sum().item<float>(), 1000000.0f); // split across threads
  tt::set_num_threads(2);
  EXPECT_EQ(tt::ones({1000000}).sum().item<float>(), 1000000.0f);
  tt::Tensor w = tt::rand({4, 100000});
  w.index_put_({3, 777}, 5.0);
  EXPECT_EQ(w.argmax().item<std::int64_t>(), 3 * 100000 + 777);
  EXPECT_EQ(std::get<1>(w.max(1)).index({3}).item<std::int64_t>(), 777);
}

TEST(Reductions, OuterDimsMatchInnerPath) {
  for (int threads : {1, 2}) {
    tt::set_num_threads(threads);
    tt::Tensor x = tt::randn({50, 40, 300}, tt::kDouble);
    // Outer reduction (rows of accumulators) vs the same sum walked inner-first.
    EXPECT_TRUE(x.sum({0}).allclose(x.permute({1, 2, 0}).contiguous().sum({2}), 1e-10, 1e-10));
    EXPECT_TRUE(x.sum({0, 1}, true).allclose(x.permute({2, 0, 1}).contiguous().sum({1, 2}).view({1, 1, 300}),
                                             1e-10, 1e-10));
    EXPECT_TRUE(x.sum({1}).allclose(x.permute({0, 2, 1}).contiguous().sum({2}), 1e-10, 1e-10));
    tt::Tensor i = tt::arange(24, tt::kInt).view({4, 6});
    EXPECT_TRUE(i.sum({0}).equal(tt::tensor({36, 40, 44, 48, 52, 56})));
  }
}

TEST(MemoryStats, LargeBlocksAreReusedNotCounted) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the block cache is off under ASan";
#endif
  if (std::getenv("TT_CPU_CACHE_MB"))
    GTEST_SKIP() << "TT_CPU_CACHE_MB is set";
  tt::Tensor a = tt::ones({1 << 20}); // 4 MiB
  void *first = a.clone().data_ptr();
  auto before = tt::memory_stats();
  tt::Tensor b = a.clone(); // the block the last clone freed
  auto after = tt::memory_stats();
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(after.current_bytes - before.current_bytes, 4 << 20); // live tensors only
  EXPECT_EQ(after.allocations - before.allocations, 1);
  EXPECT_FLOAT_EQ(b.sum().item<float>(), float(1 << 20));
}

TEST(Copies, BlockedTransposeValues) {
  for (int threads : {1, 2})
    for (auto dt : {tt::kFloat, tt::kLong, tt::kHalf, tt::kBool})
      for (auto shape : {V{67, 131}, V{300, 517}, V{1, 64}, V{64, 1}, V{129, 65}}) {
        tt::set_num_threads(threads);
        // Distinct values (mod 2 for bool; below 2048: exact in half).
        std::vector<std::int64_t> vals(static_cast<std::size_t>(shape[0] * shape[1]));
        for (std::size_t k = 0; k < vals.size(); ++k)
          vals[k] = static_cast<std::int64_t>(dt == tt::kBool ? k % 2 : k % 2048);
        tt::Tensor a = tt::tensor(tt::ArrayRef<std::int64_t>(vals)).view({shape[0], shape[1]}).to(dt);
        tt::Tensor c = a.t().contiguous();
        ASSERT_TRUE(c.is_contiguous());
        tt::Tensor ref = a.to(tt::kLong).contiguous();
        tt::Tensor got = c.to(tt::kLong).contiguous();
        const std::int64_t *pr = ref.data_ptr<std::int64_t>(), *pg = got.data_ptr<std::int64_t>();
        for (std::int64_t i = 0; i < shape[0]; ++i)
          for (std::int64_t j = 0; j < shape[1]; ++j)
            ASSERT_EQ(pg[j * shape[0] + i], pr[i * shape[1] + j]) << i << "," << j;
      }
}

// --- found by the differential test against LibTorch (test/differential) ----------------

TEST(Differential, DiagonalNamesTheDimsAsGiven) {
  // torch.zeros(2, 3).diagonal(0, -1, 1): "... identical -1, 1"
  tt::Tensor a = tt::zeros({2, 3});
  EXPECT_EQ(errorOf([&] { a.diagonal(0, -1, 1); }), "diagonal dimensions cannot be identical -1, 1");
}

TEST(Differential, SecondBackwardThroughNodesWithoutSavedTensors) {
  // x.expand(4, 3).sum().backward() twice: ExpandBackward and SumBackward
  // save no tensors, so PyTorch runs them again (x.grad = 8); x.exp() saves
  // its result and refuses.
  tt::Tensor x = tt::ones({1, 3}).requires_grad_(true);
  tt::Tensor s = x.expand({4, 3}).sum();
  s.backward();
  EXPECT_EQ(errorOf([&] { s.backward(); }), "<no error>");
  EXPECT_FLOAT_EQ(x.grad().index({0, 0}).item<float>(), 8.0f);
  tt::Tensor e = x.exp().sum();
  e.backward();
  EXPECT_NE(errorOf([&] { e.backward(); }).find("Trying to backward through the graph a second time"),
            std::string::npos);
}

TEST(Differential, BatchedMatmulOfEmptyTensors) {
  // Once a SIGFPE (numel / 0). torch.matmul(torch.zeros(2, 0, 3), torch.zeros(2, 4, 5)):
  // "Expected size for first two dimensions of batch2 tensor to be: [2, 3] but got: [2, 4]."
  EXPECT_EQ(errorOf([] { tt::matmul(tt::zeros({2, 0, 3}), tt::zeros({2, 4, 5})); }),
            "Expected size for first two dimensions of batch2 tensor to be: [2, 3] but got: [2, 4].");
  EXPECT_EQ(v(tt::matmul(tt::zeros({2, 0, 3}), tt::zeros({2, 3, 5})).sizes()), (V{2, 0, 5}));
}

TEST(Differential, GradientKeepsTheInputsDtype) {
  // A 0-d result times a double: PyTorch's engine casts the gradient back to
  // float (tt raised "expected scalar type Double but found Float").
  tt::Tensor x = tt::arange(3, tt::kFloat).requires_grad_(true);
  x.matmul(x).mul(2.0).backward();
  EXPECT_EQ(x.grad().dtype(), tt::kFloat);
  EXPECT_FLOAT_EQ(x.grad().sum().item<float>(), 12.0f);
}

TEST(Differential, CopyOntoTheSameDataDoesNothing) {
  // x = torch.ones(1, 3).expand(4, 3); x.copy_(x): no overlap error, version + 1.
  tt::Tensor x = tt::ones({1, 3}).expand({4, 3});
  std::uint32_t before = x._version();
  EXPECT_EQ(errorOf([&] { x.copy_(x); }), "<no error>");
  EXPECT_EQ(x._version(), before + 1);
  EXPECT_NE(errorOf([&] { x.copy_(tt::zeros({4, 3})); }).find("more than one element"), std::string::npos);
}

TEST(Differential, CloneOfANonDenseViewKeepsItsStrideOrder) {
  // torch.zeros(3, 4).t()[:, ::2].clone().stride() == (1, 4) (was contiguous (2, 1));
  // torch.zeros(2, 3, 4).permute(2, 0, 1)[::2].clone().stride() == (1, 6, 2).
  tt::Tensor x = tt::zeros({3, 4}).t().slice(1, 0, 4, 2);
  EXPECT_EQ(v(x.strides()), (V{1, 8}));
  EXPECT_EQ(v(x.clone().strides()), (V{1, 4}));
  EXPECT_EQ(v(tt::empty_like(x).strides()), (V{1, 4}));
  tt::Tensor y = tt::zeros({2, 3, 4}).permute({2, 0, 1}).slice(0, 0, 4, 2);
  EXPECT_EQ(v(y.clone().strides()), (V{1, 6, 2}));
  EXPECT_EQ(v(y.clone(tt::MemoryFormat::Contiguous).strides()), (V{6, 3, 1}));
}
