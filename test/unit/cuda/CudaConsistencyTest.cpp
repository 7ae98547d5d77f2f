// Backend consistency (ggml's test-backend-ops style): every op of the
// semantics table (tt/ops.def) runs on CPU and on CUDA from the same data, and
// the two runs must agree on values, dtype, shape, strides, aliasing with the
// input, version-counter bumps and errors. Skips, saying why, without a GPU;
// the coverage and CPU-driver checks run everywhere.
#include "tt/cuda.h"
#include "tt/op_semantics.h"
#include "tt/tt.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

using tt::Device;
using tt::Tensor;
using tt::indexing::Slice;

namespace {

// What one op did on one device.
struct Outcome {
  std::vector<Tensor> inputs; // inputs[0] is "self"
  std::vector<Tensor> results;
  std::vector<std::uint32_t> versionsBefore, versionsAfter;
  bool threw = false;
  std::string error;
  bool valuesComparable = true; // false for empty/rand: only geometry is compared
};

using Body = std::function<void(Device, Outcome &)>;

tt::TensorOptions on(Device d, tt::ScalarType t = tt::kFloat) {
  return tt::TensorOptions().device(d).dtype(t);
}

// Deterministic inputs built on the CPU, then moved: the same values on both.
Tensor X(Device d) { // [2,3,4] float, mixed signs, no ties
  return (tt::arange(24, tt::kFloat).reshape({2, 3, 4}) * 0.37 - 4.1).to(d);
}
Tensor Pos(Device d) { return (tt::arange(24, tt::kFloat).reshape({2, 3, 4}) * 0.25 + 0.5).to(d); }
Tensor Mat(Device d, std::int64_t r, std::int64_t c, double scale) {
  return (tt::arange(r * c, tt::kFloat).reshape({r, c}) * scale - 1.0).to(d);
}

Outcome run(Device d, const Body &body) {
  Outcome o;
  try {
    body(d, o);
  } catch (const std::exception &e) {
    o.threw = true;
    o.error = e.what();
  }
  for (const Tensor &t : o.inputs)
    o.versionsAfter.push_back(t._version());
  return o;
}

// Registers an input, remembering its version before the op.
Tensor in(Outcome &o, Tensor t) {
  o.inputs.push_back(t);
  o.versionsBefore.push_back(t._version());
  return t;
}

std::map<std::string, Body> drivers() {
  std::map<std::string, Body> m;
  auto res = [](Outcome &o, Tensor t) { o.results.push_back(std::move(t)); };
  auto resAll = [](Outcome &o, std::vector<Tensor> ts) {
    for (auto &t : ts)
      o.results.push_back(std::move(t));
  };
  // --- views
  m["as_strided"] = [=](Device d, Outcome &o) {
    res(o, in(o, X(d)).as_strided({3, 2}, {1, 3}, 2));
  };
  m["chunk"] = [=](Device d, Outcome &o) { resAll(o, in(o, X(d)).chunk(2, 2)); };
  m["diagonal"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).diagonal(0, 1, 2)); };
  m["expand"] = [=](Device d, Outcome &o) {
    res(o, in(o, X(d)).select(2, 0).unsqueeze(2).expand({2, 3, 5}));
  };
  m["expand_as"] = [=](Device d, Outcome &o) { res(o, in(o, Mat(d, 1, 4, 1.0)).expand_as(X(d))); };
  m["index"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).index({1, Slice(0, 3, 2)})); };
  m["index_tensor"] = [=](Device d, Outcome &o) {
    res(o, in(o, X(d)).index(
               {Slice(), tt::arange(2, tt::TensorOptions().device(d).dtype(tt::kLong))}));
  };
  m["narrow"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).narrow(2, 1, 2)); };
  m["permute"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).permute({2, 0, 1})); };
  m["select"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).select(1, 2)); };
  m["slice"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).slice(2, 0, 4, 3)); };
  m["split"] = [=](Device d, Outcome &o) { resAll(o, in(o, X(d)).split(2, 1)); };
  m["squeeze"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).narrow(1, 0, 1).squeeze(1)); };
  m["t"] = [=](Device d, Outcome &o) { res(o, in(o, Mat(d, 3, 5, 0.5)).t()); };
  m["transpose"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).transpose(0, 2)); };
  m["unbind"] = [=](Device d, Outcome &o) { resAll(o, in(o, X(d)).unbind(1)); };
  m["unsqueeze"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).unsqueeze(1)); };
  m["view"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).view({6, 4})); };
  m["view_as"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).view_as(Mat(d, 4, 6, 1.0))); };
  // --- detach
  m["detach"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).detach()); };
  m["data"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).data()); };
  m["variable_data"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).variable_data()); };
  // --- may alias: one call that returns self, one that copies
  m["contiguous"] = [=](Device d, Outcome &o) {
    Tensor x = in(o, X(d));
    res(o, x.contiguous());
    res(o, x.transpose(0, 2).contiguous());
  };
  // cpu()/cuda() return self only on their own device: compared in CheckMayAliasAcrossDevices.
  m["cpu"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).cpu().to(d)); };
  m["cuda"] = [=](Device d, Outcome &o) { res(o, in(o, X(d)).cpu().to(d)); };
  m["flatten"] = [=](Device d, Outcome &o) {
    Tensor x = in(o, X(d));
    res(o, x.flatten());
    res(o, x.transpose(0, 1).flatten());
  };
  m["reshape"] = [=](Device d, Outcome &o) {
    Tensor x = in(o, X(d));
    res(o, x.reshape({4, 6}));
    res(o, x.transpose(1, 2).reshape({-1}));
  };
  m["reshape_as"] = [=](Device d, Outcome &o) {
    Tensor x = in(o, X(d));
    res(o, x.transpose(0, 2).reshape_as(Mat(d, 4, 6, 1.0))); // copies
  };
  m["to"] = [=](Device d, Outcome &o) {
    Tensor x = in(o, X(d));
    res(o, x.to(tt::kFloat));
    res(o, x.to(tt::kDouble));
    res(o, x.to(tt::kLong));
    res(o, x.to(tt::kHalf));
    res(o, x.to(tt::kBool));
    res(o, x.to(d));
    res(o, x.to(tt::kFloat, false, /*copy=*/true));
  };
  m["clone"] = [=](Device d, Outcome &o) {
    Tensor x = in(o, X(d));
    res(o, x.clone());
    res(o, x.transpose(0, 2).clone()); // keeps the transposed strides
  };
  // --- in place
  auto inplace = [&](const char *name, std::function<void(const Tensor &)> f,
                     bool positive = false) {
    m[name] = [=](Device d, Outcome &o) {
      Tensor x = in(o, positive ? Pos(d) : X(d));
      Tensor v = x.narrow(2, 1, 2); // a strided view: the write goes through it
      f(v);
      res(o, x);
      res(o, v);
    };
  };
  inplace("abs_", [](const Tensor &v) { v.abs_(); });
  inplace("add_", [](const Tensor &v) { v.add_(v.neg(), 2); });
  inplace("clamp_", [](const Tensor &v) { v.clamp_(-1.0, 2.0); });
  inplace("copy_", [](const Tensor &v) { v.copy_(tt::ones({2}, tt::kLong).to(v.device())); });
  inplace("div_", [](const Tensor &v) { v.div_(3.0); });
  inplace("exp_", [](const Tensor &v) { v.exp_(); });
  inplace("fill_", [](const Tensor &v) { v.fill_(2.5); });
  inplace("index_put_", [](const Tensor &v) { v.index_put_({0, 1}, 9.0); });
  inplace("log_", [](const Tensor &v) { v.log_(); }, true);
  inplace("mul_", [](const Tensor &v) { v.mul_(v); });
  inplace("neg_", [](const Tensor &v) { v.neg_(); });
  inplace("pow_", [](const Tensor &v) { v.pow_(2); });
  inplace("relu_", [](const Tensor &v) { v.relu_(); });
  inplace("sigmoid_", [](const Tensor &v) { v.sigmoid_(); });
  inplace("sqrt_", [](const Tensor &v) { v.sqrt_(); }, true);
  inplace("sub_", [](const Tensor &v) { v.sub_(1.5); });
  inplace("tanh_", [](const Tensor &v) { v.tanh_(); });
  inplace("zero_", [](const Tensor &v) { v.zero_(); });
  m["requires_grad_"] = [=](Device d, Outcome &o) {
    Tensor x = in(o, X(d));
    x.requires_grad_();
    res(o, x);
  };
  m["detach_"] = [=](Device d, Outcome &o) {
    Tensor x = in(o, X(d)).clone(); // a leaf of its own: detach_ refuses views
    x.requires_grad_();
    x.detach_();
    res(o, x);
  };
  // --- out of place math (broadcasting, promotion, reductions)
  auto unary = [&](const char *name, std::function<Tensor(const Tensor &)> f,
                   bool positive = false) {
    m[name] = [=](Device d, Outcome &o) {
      Tensor x = in(o, positive ? Pos(d) : X(d));
      res(o, f(x));
      res(o, f(x.transpose(0, 2))); // result follows self's layout
    };
  };
  unary("abs", [](const Tensor &x) { return x.abs(); });
  unary("exp", [](const Tensor &x) { return x.exp(); });
  unary("log", [](const Tensor &x) { return x.log(); }, true);
  unary("neg", [](const Tensor &x) { return x.neg(); });
  unary("relu", [](const Tensor &x) { return x.relu(); });
  unary("sigmoid", [](const Tensor &x) { return x.sigmoid(); });
  unary("sqrt", [](const Tensor &x) { return x.sqrt(); }, true);
  unary("tanh", [](const Tensor &x) { return x.tanh(); });
  unary("clamp", [](const Tensor &x) { return x.clamp(-1.0, 1.5); });
  unary("sum", [](const Tensor &x) { return x.sum(); });
  unary("mean", [](const Tensor &x) { return x.mean({0, 2}, true); });
  unary("argmax", [](const Tensor &x) { return x.argmax(1); });
  unary("max", [](const Tensor &x) { return std::get<1>(x.max(2)); });
  unary("min", [](const Tensor &x) { return std::get<0>(x.min(0, true)); });
  auto binary = [&](const char *name, std::function<Tensor(const Tensor &, const Tensor &)> f) {
    m[name] = [=](Device d, Outcome &o) {
      Tensor x = in(o, X(d));
      Tensor row = Mat(d, 1, 4, 0.5);               // broadcasts over [2,3,4]
      Tensor ints = tt::arange(4, tt::kLong).to(d); // promotes to Float
      res(o, f(x, row));
      res(o, f(x, ints));
      res(o, f(x.transpose(0, 1), x.transpose(0, 1)));
    };
  };
  binary("add", [](const Tensor &a, const Tensor &b) { return a.add(b, 2); });
  binary("sub", [](const Tensor &a, const Tensor &b) { return a.sub(b); });
  binary("mul", [](const Tensor &a, const Tensor &b) { return a.mul(b); });
  binary("div", [](const Tensor &a, const Tensor &b) { return a.div(b); });
  binary("pow", [](const Tensor &a, const Tensor &b) { return a.abs().pow(b); });
  binary("eq", [](const Tensor &a, const Tensor &b) { return a.eq(b); });
  binary("ne", [](const Tensor &a, const Tensor &b) { return a.ne(b); });
  binary("lt", [](const Tensor &a, const Tensor &b) { return a.lt(b); });
  binary("le", [](const Tensor &a, const Tensor &b) { return a.le(b); });
  binary("gt", [](const Tensor &a, const Tensor &b) { return a.gt(b); });
  binary("ge", [](const Tensor &a, const Tensor &b) { return a.ge(b); });
  m["where"] = [=](Device d, Outcome &o) {
    Tensor x = in(o, X(d));
    res(o, tt::where(x.gt(0), x, Mat(d, 1, 4, 0.5)));
    res(o, tt::where(x.lt(-1), 0.0, x));
  };
  m["mm"] = [=](Device d, Outcome &o) {
    Tensor a = in(o, Mat(d, 5, 7, 0.1));
    Tensor b = Mat(d, 7, 3, 0.2);
    res(o, a.mm(b));
    res(o, a.mm(Mat(d, 3, 7, 0.2).t())); // transposed operand
  };
  m["matmul"] = [=](Device d, Outcome &o) {
    Tensor a = in(o, X(d));                         // [2,3,4]
    res(o, a.matmul(Mat(d, 4, 5, 0.1)));            // batched x matrix (broadcast)
    res(o, a.matmul(Mat(d, 4, 1, 0.1).squeeze(1))); // matrix x vector
  };
  m["bmm"] = [=](Device d, Outcome &o) {
    Tensor a = in(o, X(d));
    res(o, a.bmm(X(d).transpose(1, 2)));
  };
  // --- factories
  auto factory = [&](const char *name, std::function<Tensor(Device)> f, bool comparable = true) {
    m[name] = [=](Device d, Outcome &o) {
      o.valuesComparable = comparable;
      res(o, f(d));
    };
  };
  factory("arange", [](Device d) { return tt::arange(1, 10, 2, on(d, tt::kLong)); });
  factory("empty", [](Device d) { return tt::empty({3, 4}, on(d)); }, false);
  factory("empty_like", [](Device d) { return tt::empty_like(X(d)); }, false);
  factory("full", [](Device d) { return tt::full({2, 3}, 1.25, on(d, tt::kDouble)); });
  factory("full_like", [](Device d) { return tt::full_like(X(d).transpose(0, 1), 7); });
  factory("linspace", [](Device d) { return tt::linspace(-1, 1, 9, on(d)); });
  factory("ones", [](Device d) { return tt::ones({4}, on(d, tt::kInt)); });
  factory("ones_like", [](Device d) { return tt::ones_like(X(d)); });
  factory("rand", [](Device d) { return tt::rand({64}, on(d)); }, false);
  factory("randn", [](Device d) { return tt::randn({64}, on(d)); }, false);
  factory("tensor", [](Device d) { return tt::tensor({1.5, -2.0, 3.25}, on(d)); });
  factory("zeros", [](Device d) { return tt::zeros({2, 2}, on(d, tt::kBool)); });
  factory("zeros_like", [](Device d) { return tt::zeros_like(X(d).permute({2, 1, 0})); });
  return m;
}

bool isFloat(tt::ScalarType t) { return tt::isFloatingType(t); }

void expectSame(const std::string &op, const Outcome &c, const Outcome &g) {
  SCOPED_TRACE("op " + op);
  ASSERT_EQ(c.threw, g.threw) << "cpu: " << c.error << " | cuda: " << g.error;
  if (c.threw) {
    EXPECT_EQ(c.error, g.error);
    return;
  }
  ASSERT_EQ(c.results.size(), g.results.size());
  ASSERT_EQ(c.versionsAfter.size(), g.versionsAfter.size());
  for (std::size_t i = 0; i < c.inputs.size(); ++i)
    EXPECT_EQ(c.versionsAfter[i] - c.versionsBefore[i], g.versionsAfter[i] - g.versionsBefore[i])
        << "version bumps of input " << i;
  for (std::size_t i = 0; i < c.results.size(); ++i) {
    SCOPED_TRACE("result " + std::to_string(i));
    const Tensor &a = c.results[i], &b = g.results[i];
    EXPECT_EQ(b.device().type(), tt::kCUDA);
    EXPECT_EQ(a.dtype(), b.dtype());
    EXPECT_EQ(a.sizes().vec(), b.sizes().vec());
    EXPECT_EQ(a.strides().vec(), b.strides().vec());
    EXPECT_EQ(a.storage_offset(), b.storage_offset());
    EXPECT_EQ(a.requires_grad(), b.requires_grad());
    for (std::size_t k = 0; k < c.inputs.size(); ++k) {
      EXPECT_EQ(a.is_alias_of(c.inputs[k]), b.is_alias_of(g.inputs[k]))
          << "aliasing of input " << k;
      EXPECT_EQ(a.is_same(c.inputs[k]), b.is_same(g.inputs[k])) << "identity with input " << k;
    }
    if (!c.valuesComparable)
      continue;
    Tensor bh = b.cpu();
    if (isFloat(a.dtype())) {
      const double tol = a.dtype() == tt::kHalf || a.dtype() == tt::kBFloat16 ? 1e-2 : 1e-5;
      EXPECT_TRUE(a.to(tt::kDouble).allclose(bh.to(tt::kDouble), tol, tol, /*equal_nan=*/true))
          << "cpu " << a.toString() << "\ncuda " << bh.toString();
    } else {
      EXPECT_TRUE(a.equal(bh)) << "cpu " << a.toString() << "\ncuda " << bh.toString();
    }
  }
}

// Skips the test when no CUDA tensor can be made here, with the runtime's reason.
#define REQUIRE_CUDA()                                                                             \
  do {                                                                                             \
    try {                                                                                          \
      (void)tt::empty({1}, tt::TensorOptions().device(tt::kCUDA));                                 \
    } catch (const std::exception &e) {                                                            \
      GTEST_SKIP() << "no CUDA device: " << e.what();                                              \
    }                                                                                              \
  } while (0)

} // namespace

TEST(CudaConsistency, EveryTableOpHasADriver) {
  const auto m = drivers();
  for (const auto &op : tt::semantics::kOps)
    EXPECT_TRUE(m.count(std::string(op.name))) << "no consistency driver for '" << op.name << "'";
}

TEST(CudaConsistency, DriversRunOnCpu) {
  // The drivers themselves must be right, GPU or not.
  for (const auto &[name, body] : drivers()) {
    Outcome o = run(Device(tt::kCPU), body);
    EXPECT_FALSE(o.threw) << name << ": " << o.error;
    EXPECT_FALSE(o.results.empty()) << name;
  }
}

TEST(CudaConsistency, EveryOpAgreesWithCpu) {
  REQUIRE_CUDA();
  for (const auto &[name, body] : drivers())
    expectSame(name, run(Device(tt::kCPU), body), run(Device(tt::kCUDA), body));
}

TEST(CudaConsistency, MayAliasOpsReturnSelfOnlyOnTheirOwnDevice) {
  REQUIRE_CUDA();
  Tensor c = X(tt::kCPU), g = X(tt::kCUDA);
  EXPECT_TRUE(c.cpu().is_same(c));
  EXPECT_TRUE(g.cuda().is_same(g));
  EXPECT_TRUE(g.to(tt::kCUDA).is_same(g));
  EXPECT_TRUE(g.to(tt::kFloat).is_same(g));
  Tensor gc = g.cpu(), cg = c.cuda();
  EXPECT_FALSE(gc.is_alias_of(g));
  EXPECT_FALSE(cg.is_alias_of(c));
  EXPECT_EQ(gc.device().type(), tt::kCPU);
  EXPECT_EQ(cg.device().type(), tt::kCUDA);
  EXPECT_TRUE(gc.equal(c));
  EXPECT_TRUE(cg.cpu().equal(c));
  // Transposed source: the copy keeps its strides (preserve_format), as PyTorch.
  Tensor t = c.transpose(0, 2).cuda();
  EXPECT_EQ(t.strides().vec(), c.transpose(0, 2).strides().vec());
  EXPECT_TRUE(t.cpu().equal(c.transpose(0, 2)));
}

TEST(CudaConsistency, ErrorsMatchCpu) {
  REQUIRE_CUDA();
  const std::vector<std::pair<std::string, Body>> bad = {
      {"view of non-contiguous",
       [](Device d, Outcome &o) { o.results.push_back(in(o, X(d)).transpose(0, 1).view({-1})); }},
      {"write into expanded",
       [](Device d, Outcome &o) { in(o, Mat(d, 1, 4, 1.0)).expand({3, 4}).add_(1); }},
      {"shape mismatch",
       [](Device d, Outcome &o) { o.results.push_back(in(o, X(d)).add(Mat(d, 1, 5, 1.0))); }},
      {"item of many", [](Device d, Outcome &o) { (void)in(o, X(d)).item<float>(); }},
  };
  for (const auto &[what, body] : bad) {
    Outcome c = run(Device(tt::kCPU), body), g = run(Device(tt::kCUDA), body);
    EXPECT_TRUE(c.threw) << what;
    expectSame(what, c, g);
  }
  // Mixing devices fails with PyTorch's message.
  Outcome mixed = run(Device(tt::kCUDA), [](Device d, Outcome &o) {
    o.results.push_back(in(o, X(d)).add(X(tt::kCPU).sum(0)));
  });
  EXPECT_TRUE(mixed.threw);
  EXPECT_NE(mixed.error.find("Expected all tensors to be on the same device"), std::string::npos)
      << mixed.error;
}

// Integer matmul, as PyTorch 1.13: computed on the CPU, on CUDA an error
// naming the dtype (no integer GEMM in cuBLAS or in PyTorch's CUDA build).
TEST(CudaMatmul, IntegerMatmulComputesOnCpuAndNamesTheDtypeOnCuda) {
  for (tt::ScalarType dt : {tt::kInt, tt::kLong}) {
    tt::Tensor a = tt::arange(6, tt::kLong).view({2, 3}).to(dt),
               b = tt::arange(6, tt::kLong).view({3, 2}).to(dt);
    tt::Tensor c = a.matmul(b); // [[0,1,2],[3,4,5]] x [[0,1],[2,3],[4,5]]
    EXPECT_EQ(c.dtype(), dt);
    EXPECT_TRUE(
        c.to(tt::kLong).equal(tt::tensor({10.0, 13.0, 28.0, 40.0}).to(tt::kLong).view({2, 2})));
  }
  REQUIRE_CUDA();
  for (tt::ScalarType dt : {tt::kInt, tt::kLong}) {
    tt::Tensor a = tt::ones({2, 3}, tt::TensorOptions().device(tt::kCUDA).dtype(dt));
    try {
      (void)a.matmul(a.t());
      ADD_FAILURE() << "integer matmul on CUDA did not throw";
    } catch (const std::exception &e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("\"addmm_cuda\" not implemented for '") + tt::toString(dt) + "'");
    }
  }
}

TEST(CudaConsistency, AutogradAgreesWithCpu) {
  REQUIRE_CUDA();
  auto grads = [](Device d) {
    Tensor w = Mat(d, 4, 3, 0.1).requires_grad_();
    Tensor x = X(d);
    Tensor y = x.matmul(w).sigmoid().mul(x.sum(2, true)).mean();
    y.backward();
    return std::make_pair(y.cpu(), w.grad().cpu());
  };
  auto [yc, gc] = grads(tt::kCPU);
  auto [yg, gg] = grads(tt::kCUDA);
  EXPECT_TRUE(yc.allclose(yg, 1e-5, 1e-6));
  EXPECT_TRUE(gc.allclose(gg, 1e-5, 1e-6));
  // A saved tensor modified in place: the same error on both devices.
  auto stale = [](Device d, Outcome &o) {
    Tensor w = in(o, Mat(d, 2, 2, 0.5)).requires_grad_();
    Tensor s = w.mul(2);
    Tensor y = s.sigmoid(); // saves its result
    y.mul_(3);
    y.sum().backward();
  };
  Outcome c = run(Device(tt::kCPU), stale), g = run(Device(tt::kCUDA), stale);
  EXPECT_TRUE(c.threw);
  EXPECT_EQ(c.error.substr(0, 60), g.error.substr(0, 60));
}

TEST(CudaConsistency, ItemAndPrintingSynchronise) {
  REQUIRE_CUDA();
  Tensor g = X(tt::kCUDA);
  EXPECT_FLOAT_EQ(g.sum().item<float>(), X(tt::kCPU).sum().item<float>());
  EXPECT_EQ(g.max().item<float>(), X(tt::kCPU).max().item<float>());
  EXPECT_NE(g.toString().find("CUDA"), std::string::npos) << g.toString();
}

TEST(CudaNoDevice, CudaTensorsFailWithPyTorchsMessage) {
  if (tt::cuda::is_available())
    GTEST_SKIP() << "a CUDA device is present: the no-device path is not reachable here";
  EXPECT_EQ(tt::cuda::device_count(), 0);
  auto expectNoGpuError = [](const std::function<void()> &f) {
    try {
      f();
      ADD_FAILURE() << "expected an error without a GPU";
    } catch (const std::exception &e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.rfind("Found no NVIDIA driver on your system.", 0) == 0 ||
                  m.rfind("No CUDA GPUs are available", 0) == 0)
          << m;
    }
  };
  expectNoGpuError([] { (void)tt::zeros({2, 2}, tt::TensorOptions().device(tt::kCUDA)); });
  expectNoGpuError([] { (void)tt::ones({3}).cuda(); });
  expectNoGpuError([] { (void)tt::ones({3}).to(tt::kCUDA, /*non_blocking=*/true); });
  expectNoGpuError([] { (void)tt::ones({3}).pin_memory(); });
  // Queries stay answerable: nothing pinned, no CUDA memory in use.
  EXPECT_FALSE(tt::ones({3}).is_pinned());
  EXPECT_EQ(tt::memory_stats(tt::kCUDA).reserved_bytes, 0);
  tt::cuda::empty_cache(); // a no-op, as torch.cuda.empty_cache() without CUDA
}

TEST(CudaPinned, PinMemoryAndNonBlockingRoundTrip) {
  REQUIRE_CUDA();
  Tensor h = X(tt::kCPU);
  EXPECT_FALSE(h.is_pinned());
  Tensor p = h.pin_memory();
  EXPECT_TRUE(p.is_pinned());
  EXPECT_FALSE(p.is_alias_of(h));
  EXPECT_TRUE(p.pin_memory().is_same(p)); // already pinned: self
  EXPECT_TRUE(p.equal(h));
  Tensor g = p.to(tt::kCUDA, /*non_blocking=*/true);
  Tensor back = g.to(tt::kCPU, /*non_blocking=*/true); // lands in pinned memory
  EXPECT_TRUE(back.is_pinned());
  tt::cuda::synchronize();
  EXPECT_TRUE(back.equal(h));
  EXPECT_THROW((void)g.pin_memory(), std::exception);
}

TEST(CudaAllocator, CloneInALoopHitsTheCache) {
  REQUIRE_CUDA();
  Tensor x = tt::ones({1 << 20}, tt::TensorOptions().device(tt::kCUDA));
  {
    Tensor warm = x.clone();
  }
  const auto before = tt::cuda::allocator_stats();
  for (int i = 0; i < 1000; ++i)
    Tensor y = x.clone();
  const auto after = tt::cuda::allocator_stats();
  EXPECT_LE(after.num_device_mallocs - before.num_device_mallocs, 1);
  EXPECT_GE(after.num_cache_hits - before.num_cache_hits, 999);
  EXPECT_EQ(tt::cuda::memory_allocated(), before.allocated_bytes);
  const tt::MemoryStats ms = tt::memory_stats(tt::kCUDA);
  EXPECT_EQ(ms.allocated_bytes, tt::cuda::memory_allocated());
  EXPECT_EQ(ms.reserved_bytes, tt::cuda::memory_reserved());
  EXPECT_GE(ms.peak_allocated_bytes, 2 * (4 << 20));
  tt::cuda::empty_cache();
  EXPECT_EQ(tt::cuda::memory_reserved(), tt::cuda::memory_allocated());
}

TEST(CudaStreams, WorkOnAPoolStreamIsOrderedByEvents) {
  REQUIRE_CUDA();
  tt::cuda::Stream s = tt::cuda::getStreamFromPool();
  EXPECT_NE(s, tt::cuda::getDefaultCUDAStream());
  Tensor a = tt::zeros({1 << 16}, tt::TensorOptions().device(tt::kCUDA));
  // Pool streams do not wait for the default stream: order the zero-fill first.
  tt::cuda::Event zeroed, ready;
  zeroed.record();
  zeroed.block(s);
  {
    tt::cuda::CUDAStreamGuard guard(s);
    EXPECT_EQ(tt::cuda::getCurrentCUDAStream(), s);
    a.fill_(3.0);
    ready.record();
  }
  EXPECT_EQ(tt::cuda::getCurrentCUDAStream(), tt::cuda::getDefaultCUDAStream());
  ready.block(tt::cuda::getCurrentCUDAStream());
  EXPECT_EQ(a.sum().item<float>(), 3.0f * (1 << 16));
}
