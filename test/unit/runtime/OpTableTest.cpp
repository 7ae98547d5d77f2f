// Every row of tt/ops.def against the runtime's real behaviour: View rows
// alias, Copy/Fresh/Factory rows allocate, MayAlias rows alias exactly when a
// view is possible, InPlace rows bump the version counter and return self,
// Detach rows share storage without autograd.
#include "tt/tt.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>

namespace {
namespace sem = tt::semantics;

// Runs the op on `x` (a [2,3] float tensor, or its transpose to exercise the
// copy path of MayAlias ops) and returns its (first) result.
using Driver = std::function<tt::Tensor(const tt::Tensor &x)>;

std::map<std::string, Driver> drivers() {
  using tt::Tensor;
  std::map<std::string, Driver> d;
  auto other = [](const Tensor &x) { return tt::ones(x.sizes()); };
  d["as_strided"] = [](const Tensor &x) { return x.as_strided({2}, {1}); };
  d["chunk"] = [](const Tensor &x) { return x.chunk(2, 1)[0]; };
  d["diagonal"] = [](const Tensor &x) { return x.diagonal(); };
  d["expand"] = [](const Tensor &x) { return x.expand({4, x.size(0), x.size(1)}); };
  d["expand_as"] = [](const Tensor &x) {
    return x.expand_as(tt::zeros({4, x.size(0), x.size(1)}));
  };
  d["index"] = [](const Tensor &x) { return x.index({0}); };
  d["index_tensor"] = [](const Tensor &x) { return x.index({tt::arange(2, tt::kLong)}); };
  d["narrow"] = [](const Tensor &x) { return x.narrow(1, 0, 1); };
  d["permute"] = [](const Tensor &x) { return x.permute({1, 0}); };
  d["select"] = [](const Tensor &x) { return x.select(0, 1); };
  d["slice"] = [](const Tensor &x) { return x.slice(1, 0, 2); };
  d["split"] = [](const Tensor &x) { return x.split(1, 0)[0]; };
  d["squeeze"] = [](const Tensor &x) { return x.squeeze(); };
  d["t"] = [](const Tensor &x) { return x.t(); };
  d["transpose"] = [](const Tensor &x) { return x.transpose(0, 1); };
  d["unbind"] = [](const Tensor &x) { return x.unbind(0)[0]; };
  d["unsqueeze"] = [](const Tensor &x) { return x.unsqueeze(0); };
  d["view"] = [](const Tensor &x) { return x.view({x.size(0), x.size(1)}); };
  d["view_as"] = [](const Tensor &x) { return x.view_as(tt::zeros(x.sizes())); };
  d["detach"] = [](const Tensor &x) { return x.detach(); };
  d["data"] = [](const Tensor &x) { return x.data(); };
  d["variable_data"] = [](const Tensor &x) { return x.variable_data(); };
  d["contiguous"] = [](const Tensor &x) { return x.contiguous(); };
  d["cpu"] = [](const Tensor &x) { return x.cpu(); };
  d["flatten"] = [](const Tensor &x) { return x.flatten(); };
  d["reshape"] = [](const Tensor &x) { return x.reshape({-1}); };
  d["reshape_as"] = [](const Tensor &x) { return x.reshape_as(tt::zeros({x.numel()})); };
  d["to"] = [](const Tensor &x) { return x.to(tt::kFloat); };
  d["clone"] = [](const Tensor &x) { return x.clone(); };
  d["abs_"] = [](const Tensor &x) { return x.abs_(); };
  d["add_"] = [](const Tensor &x) { return x.add_(1); };
  d["clamp_"] = [](const Tensor &x) { return x.clamp_(0, 1); };
  d["copy_"] = [=](const Tensor &x) { return x.copy_(other(x)); };
  d["div_"] = [](const Tensor &x) { return x.div_(2); };
  d["detach_"] = [](const Tensor &x) { return x.clone().detach_(); }; // x is a view: refused
  d["exp_"] = [](const Tensor &x) { return x.exp_(); };
  d["fill_"] = [](const Tensor &x) { return x.fill_(3); };
  d["index_put_"] = [](const Tensor &x) { return x.index_put_({0}, 1.0); };
  d["log_"] = [](const Tensor &x) { return x.log_(); };
  d["mul_"] = [](const Tensor &x) { return x.mul_(2); };
  d["neg_"] = [](const Tensor &x) { return x.neg_(); };
  d["pow_"] = [](const Tensor &x) { return x.pow_(2); };
  d["relu_"] = [](const Tensor &x) { return x.relu_(); };
  d["requires_grad_"] = [](const Tensor &x) { return x.requires_grad_(); };
  d["sigmoid_"] = [](const Tensor &x) { return x.sigmoid_(); };
  d["sqrt_"] = [](const Tensor &x) { return x.sqrt_(); };
  d["sub_"] = [](const Tensor &x) { return x.sub_(1); };
  d["tanh_"] = [](const Tensor &x) { return x.tanh_(); };
  d["zero_"] = [](const Tensor &x) { return x.zero_(); };
  d["abs"] = [](const Tensor &x) { return x.abs(); };
  d["add"] = [=](const Tensor &x) { return x.add(other(x)); };
  d["argmax"] = [](const Tensor &x) { return x.argmax(); };
  d["bmm"] = [](const Tensor &x) { return x.unsqueeze(0).bmm(x.t().unsqueeze(0)); };
  d["clamp"] = [](const Tensor &x) { return x.clamp(0, 1); };
  d["div"] = [](const Tensor &x) { return x.div(2); };
  d["eq"] = [](const Tensor &x) { return x.eq(1); };
  d["exp"] = [](const Tensor &x) { return x.exp(); };
  d["ge"] = [](const Tensor &x) { return x.ge(1); };
  d["gt"] = [](const Tensor &x) { return x.gt(1); };
  d["le"] = [](const Tensor &x) { return x.le(1); };
  d["log"] = [](const Tensor &x) { return x.log(); };
  d["lt"] = [](const Tensor &x) { return x.lt(1); };
  d["matmul"] = [](const Tensor &x) { return x.matmul(x.t()); };
  d["max"] = [](const Tensor &x) { return x.max(); };
  d["mean"] = [](const Tensor &x) { return x.mean(); };
  d["min"] = [](const Tensor &x) { return x.min(); };
  d["mm"] = [](const Tensor &x) { return x.mm(x.t()); };
  d["mul"] = [](const Tensor &x) { return x.mul(2); };
  d["ne"] = [](const Tensor &x) { return x.ne(1); };
  d["neg"] = [](const Tensor &x) { return x.neg(); };
  d["pow"] = [](const Tensor &x) { return x.pow(2); };
  d["relu"] = [](const Tensor &x) { return x.relu(); };
  d["sigmoid"] = [](const Tensor &x) { return x.sigmoid(); };
  d["sqrt"] = [](const Tensor &x) { return x.sqrt(); };
  d["sub"] = [](const Tensor &x) { return x.sub(1); };
  d["sum"] = [](const Tensor &x) { return x.sum(); };
  d["tanh"] = [](const Tensor &x) { return x.tanh(); };
  d["where"] = [=](const Tensor &x) { return tt::where(x > 0, x, other(x)); };
  d["arange"] = [](const Tensor &) { return tt::arange(6); };
  d["empty"] = [](const Tensor &) { return tt::empty({2, 3}); };
  d["empty_like"] = [](const Tensor &x) { return tt::empty_like(x); };
  d["full"] = [](const Tensor &) { return tt::full({2, 3}, 1.5); };
  d["full_like"] = [](const Tensor &x) { return tt::full_like(x, 1.5); };
  d["linspace"] = [](const Tensor &) { return tt::linspace(0, 1, 5); };
  d["ones"] = [](const Tensor &) { return tt::ones({2, 3}); };
  d["ones_like"] = [](const Tensor &x) { return tt::ones_like(x); };
  d["rand"] = [](const Tensor &) { return tt::rand({2, 3}); };
  d["randn"] = [](const Tensor &) { return tt::randn({2, 3}); };
  d["tensor"] = [](const Tensor &) { return tt::tensor({1.0, 2.0}); };
  d["zeros"] = [](const Tensor &) { return tt::zeros({2, 3}); };
  d["zeros_like"] = [](const Tensor &x) { return tt::zeros_like(x); };
  return d;
}

tt::Tensor input(bool transposed) {
  tt::Tensor x = tt::arange(1, 7, tt::kFloat).view({2, 3});
  return transposed ? x.t().contiguous().t() : x; // same values, column-major
}

} // namespace

TEST(OpTable, EveryRowMatchesTheRuntime) {
  auto d = drivers();
  for (const sem::OpInfo &op : sem::kOps) {
    std::string name(op.name);
    if (name == "cuda" && !tt::cuda::is_available())
      continue;
    auto it = d.find(name);
    ASSERT_NE(it, d.end()) << "no driver for ops.def row '" << name
                           << "': add one to OpTableTest.cpp";
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(name + (transposed ? " (non-contiguous input)" : ""));
      tt::Tensor x = input(transposed);
      std::uint32_t v0 = x._version();
      tt::Tensor r = it->second(x);
      switch (op.storage) {
      case sem::Storage::View:
        EXPECT_TRUE(r.is_alias_of(x));
        EXPECT_TRUE(r.is_view());
        EXPECT_EQ(x._version(), v0);
        break;
      case sem::Storage::Detach:
        EXPECT_TRUE(r.is_alias_of(x));
        EXPECT_FALSE(r.requires_grad());
        break;
      case sem::Storage::MayAlias: {
        // Aliases exactly when the layout allows: here, when x is contiguous.
        bool canAlias = !transposed || name == "to" || name == "cpu" || name == "cuda";
        EXPECT_EQ(r.is_alias_of(x), canAlias);
        break;
      }
      case sem::Storage::Copy:
      case sem::Storage::Fresh:
      case sem::Storage::Factory:
        EXPECT_FALSE(r.is_alias_of(x));
        EXPECT_EQ(x._version(), v0);
        break;
      case sem::Storage::InPlace:
        EXPECT_TRUE(r.is_same(x));
        EXPECT_EQ(x._version(), v0 + 1);
        break;
      case sem::Storage::None:
        EXPECT_EQ(x._version(), v0);
        break;
      }
      if (op.layout == sem::Layout::Contiguous && op.storage != sem::Storage::View)
        EXPECT_TRUE(r.is_contiguous() || op.storage == sem::Storage::MayAlias);
      if (op.layout == sem::Layout::Same && op.storage != sem::Storage::Factory &&
          op.storage != sem::Storage::InPlace && op.storage != sem::Storage::None)
        EXPECT_EQ(r.is_contiguous(), x.is_contiguous() || r.numel() <= 1 || r.dtype() == tt::kBool
                                         ? r.is_contiguous()
                                         : x.is_contiguous());
    }
  }
}

TEST(OpTable, TraceNamesTheRowsKind) {
  // The trace's "kind" for an op comes from this table.
  const sem::OpInfo *reshape = sem::lookup("reshape");
  ASSERT_NE(reshape, nullptr);
  EXPECT_EQ(sem::toString(reshape->storage), "may-alias");
}

// The TT_MODULE rows (checked against torch.nn by scripts/check_op_table.py)
// are well formed: one row a name, spatial dims exactly on Conv and Pool rows,
// a layout on every row whose sizes are known.
TEST(OpTable, ModuleRowsAreWellFormed) {
  std::map<std::string, int> Seen;
  for (const sem::ModuleInfo &m : sem::kModules) {
    EXPECT_EQ(++Seen[std::string(m.name)], 1) << m.name;
    bool Spatial = m.shape == sem::ModuleShape::Conv || m.shape == sem::ModuleShape::Pool;
    EXPECT_EQ(Spatial, m.dims >= 1 && m.dims <= 3) << m.name;
    EXPECT_EQ(m.shape == sem::ModuleShape::Other, m.layout == sem::ModuleLayout::Unknown) << m.name;
    EXPECT_EQ(sem::lookupModule(m.name), &m);
  }
  EXPECT_EQ(sem::lookupModule("NoSuchModule"), nullptr);
  ASSERT_NE(sem::lookupModule("BatchNorm2d"), nullptr);
  EXPECT_TRUE(sem::lookupModule("BatchNorm2d")->holdsWeights());
  EXPECT_TRUE(sem::lookupModule("RNNCell")->savesInput());
  EXPECT_TRUE(sem::lookupModule("RNNCell")->savesResult());
  EXPECT_FALSE(sem::lookupModule("Dropout")->savesInput());
}
