// PyTorch conformance: replays every case of test/conformance/golden.json
// (generated with PyTorch 1.13 by scripts/gen_conformance.py) with tt and
// compares aliasing, layout, version bumps, values and errors. It also checks
// that the op-semantics table (tt/ops.def) agrees with what PyTorch did, and
// that every row of the table has cases. Failure messages say which of the
// three disagrees: "runtime vs PyTorch" or "ops.def vs PyTorch".
#include "Json.h"

#include "tt/tt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace conformance {
// gtest prints parameters: name the case, not its address.
void PrintTo(const Json *c, std::ostream *os) { *os << (*c)["id"].asString(); }
} // namespace conformance

namespace {

using conformance::Json;
namespace sem = tt::semantics;

// --- the golden file -------------------------------------------------------------

struct Golden {
  Json doc;
  std::string error; // why it could not be read
};

const Golden &golden() {
  static const Golden g = [] {
    Golden g;
    std::ifstream in(TT_CONFORMANCE_GOLDEN);
    if (!in) {
      g.error = std::string("cannot read ") + TT_CONFORMANCE_GOLDEN;
      return g;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      g.doc = Json::parse(ss.str());
    } catch (const std::exception &e) {
      g.error = std::string(TT_CONFORMANCE_GOLDEN) + ": " + e.what();
    }
    return g;
  }();
  return g;
}

std::vector<const Json *> goldenCases() {
  std::vector<const Json *> v;
  if (golden().error.empty())
    for (const Json &c : golden().doc["cases"].items())
      v.push_back(&c);
  return v;
}

std::string paramName(const std::string &id) {
  std::string s;
  for (char c : id)
    s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}

// --- values ---------------------------------------------------------------------

tt::ScalarType dtypeNamed(const std::string &n) {
  static const std::map<std::string, tt::ScalarType> m = {
      {"float32", tt::kFloat},    {"float64", tt::kDouble}, {"int32", tt::kInt},
      {"int64", tt::kLong},       {"bool", tt::kBool},      {"float16", tt::kHalf},
      {"bfloat16", tt::kBFloat16}};
  auto it = m.find(n);
  if (it == m.end())
    throw std::runtime_error("golden file: unknown dtype " + n);
  return it->second;
}

std::string dtypeName(tt::ScalarType t) {
  switch (t) {
  case tt::kFloat:
    return "float32";
  case tt::kDouble:
    return "float64";
  case tt::kInt:
    return "int32";
  case tt::kLong:
    return "int64";
  case tt::kBool:
    return "bool";
  case tt::kHalf:
    return "float16";
  case tt::kBFloat16:
    return "bfloat16";
  }
  return "?";
}

tt::Scalar scalarOf(const Json &j) {
  if (j.isBool())
    return tt::Scalar(j.asBool());
  if (j.isInt())
    return tt::Scalar(j.asInt());
  return tt::Scalar(j.asDouble());
}

// Element k (row-major, logical order) of t, as a double.
double elementAt(const tt::Tensor &t, std::int64_t k) {
  std::int64_t off = 0;
  for (std::int64_t d = t.dim() - 1; d >= 0; --d) {
    std::int64_t n = t.size(d);
    off += (k % n) * t.stride(d);
    k /= n;
  }
  const char *p =
      static_cast<const char *>(t.data_ptr()) + off * static_cast<std::int64_t>(t.element_size());
  switch (t.dtype()) {
  case tt::kFloat:
    return *reinterpret_cast<const float *>(p);
  case tt::kDouble:
    return *reinterpret_cast<const double *>(p);
  case tt::kInt:
    return *reinterpret_cast<const std::int32_t *>(p);
  case tt::kLong:
    return static_cast<double>(*reinterpret_cast<const std::int64_t *>(p));
  case tt::kBool:
    return *reinterpret_cast<const bool *>(p);
  case tt::kHalf:
    return float(*reinterpret_cast<const tt::Half *>(p));
  case tt::kBFloat16:
    return float(*reinterpret_cast<const tt::BFloat16 *>(p));
  }
  return 0;
}

template <typename T> void writeValues(const tt::Tensor &t, const Json &values) {
  T *p = t.data_ptr<T>();
  for (const Json &v : values.items())
    *p++ = v.isBool() ? T(v.asBool()) : static_cast<T>(v.asDouble());
}

tt::Tensor makeLeaf(const Json &spec) {
  tt::ScalarType dt = dtypeNamed(spec["dtype"].asString());
  tt::Tensor t = tt::empty(spec["sizes"].asInts(), tt::TensorOptions(dt));
  switch (dt) {
  case tt::kFloat:
    writeValues<float>(t, spec["values"]);
    break;
  case tt::kDouble:
    writeValues<double>(t, spec["values"]);
    break;
  case tt::kInt:
    writeValues<std::int32_t>(t, spec["values"]);
    break;
  case tt::kLong:
    writeValues<std::int64_t>(t, spec["values"]);
    break;
  case tt::kBool:
    writeValues<bool>(t, spec["values"]);
    break;
  default:
    throw std::runtime_error("golden file: unsupported input dtype");
  }
  if (spec["requires_grad"].asBool())
    t.requires_grad_(true);
  return t;
}

// --- the tt side of the case interpreter (see scripts/gen_conformance.py) ----------

struct Outcome {
  std::vector<tt::Tensor> results;
  bool single = true; // one tensor (not a tuple / list)
};

class Call {
public:
  Call(const Json &step, std::map<std::string, tt::Tensor> &env) : step_(step), env_(env) {
    if (!step["self"].isNull())
      self = env.at(step["self"].asString());
  }

  tt::Tensor self;

  std::size_t nargs() const { return args().size(); }
  const Json &arg(std::size_t i) const { return args()[i]; }
  bool isTensor(std::size_t i) const { return arg(i).has("tensor"); }
  tt::Tensor tensor(std::size_t i) const { return tensorOf(arg(i)); }
  std::int64_t i(std::size_t n) const { return arg(n).asInt(); }
  std::int64_t i(std::size_t n, std::int64_t dflt) const { return n < nargs() ? i(n) : dflt; }
  std::vector<std::int64_t> ints(std::size_t n) const { return arg(n).asInts(); }
  tt::Scalar scalar(std::size_t n) const { return scalarOf(arg(n)); }
  bool kwBool(const char *k, bool dflt) const {
    return kwargs().has(k) ? kwargs()[k].asBool() : dflt;
  }
  tt::Scalar kwScalar(const char *k, tt::Scalar dflt) const {
    return kwargs().has(k) ? scalarOf(kwargs()[k]) : dflt;
  }
  std::optional<tt::Scalar> optScalar(std::size_t n, const char *k) const {
    if (n < nargs())
      return scalar(n);
    if (kwargs().has(k))
      return scalarOf(kwargs()[k]);
    return std::nullopt;
  }
  tt::TensorOptions options() const {
    tt::TensorOptions o;
    if (kwargs().has("dtype"))
      o = o.dtype(dtypeNamed(kwargs()["dtype"]["dtype"].asString()));
    return o;
  }
  std::vector<tt::indexing::TensorIndex> indices(std::size_t n) const {
    std::vector<tt::indexing::TensorIndex> v;
    for (const Json &j : arg(n).items()) {
      if (j.isInt()) {
        v.emplace_back(j.asInt());
        continue;
      }
      if (j.has("tensor")) {
        v.emplace_back(tensorOf(j));
        continue;
      }
      const Json &s = j["slice"];
      auto opt = [](const Json &x) {
        return x.isNull() ? std::nullopt : std::optional<std::int64_t>(x.asInt());
      };
      v.emplace_back(tt::indexing::Slice(opt(s[0]), opt(s[1]), opt(s[2])));
    }
    return v;
  }

private:
  const Json &args() const { return step_["args"]; }
  const Json &kwargs() const { return step_["kwargs"]; }
  tt::Tensor tensorOf(const Json &j) const { return env_.at(j["tensor"].asString()); }

  const Json &step_;
  std::map<std::string, tt::Tensor> &env_;
};

Outcome one(tt::Tensor t) { return Outcome{{std::move(t)}, true}; }
Outcome many(std::vector<tt::Tensor> v) { return Outcome{std::move(v), false}; }
template <typename A, typename B> Outcome many(const std::tuple<A, B> &t) {
  return Outcome{{std::get<0>(t), std::get<1>(t)}, false};
}

// tt::tensor({...}) with a braced list, the spelling users write.
template <typename T> tt::Tensor braced(const std::vector<T> &v, tt::TensorOptions o) {
  switch (v.size()) {
  case 1:
    return tt::tensor({T(v[0])}, o);
  case 2:
    return tt::tensor({T(v[0]), T(v[1])}, o);
  case 3:
    return tt::tensor({T(v[0]), T(v[1]), T(v[2])}, o);
  }
  throw std::runtime_error("golden file: tensor() cases have 1 to 3 values");
}

// Thrown for ops this interpreter does not know: the golden file is newer.
struct UnknownOp : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Outcome run(const std::string &op, Call &c) {
  const tt::Tensor &s = c.self;
  // binary ops take a tensor or a number
#define TT_BINARY(NAME)                                                                            \
  if (op == #NAME)                                                                                 \
    return one(c.isTensor(0) ? s.NAME(c.tensor(0)) : s.NAME(c.scalar(0)));
#define TT_BINARY_ALPHA(NAME)                                                                      \
  if (op == #NAME)                                                                                 \
    return one(c.isTensor(0) ? s.NAME(c.tensor(0), c.kwScalar("alpha", 1))                         \
                             : s.NAME(c.scalar(0), c.kwScalar("alpha", 1)));
#define TT_UNARY(NAME)                                                                             \
  if (op == #NAME)                                                                                 \
    return one(s.NAME());
  // views
  if (op == "as_strided")
    return one(s.as_strided(c.ints(0), c.ints(1),
                            c.nargs() > 2 ? std::optional<std::int64_t>(c.i(2)) : std::nullopt));
  if (op == "chunk")
    return many(s.chunk(c.i(0), c.i(1, 0)));
  if (op == "diagonal")
    return one(s.diagonal(c.i(0, 0), c.i(1, 0), c.i(2, 1)));
  if (op == "expand")
    return one(s.expand(c.ints(0)));
  if (op == "expand_as")
    return one(s.expand_as(c.tensor(0)));
  if (op == "index")
    return one(s.index(c.indices(0)));
  if (op == "narrow")
    return one(s.narrow(c.i(0), c.i(1), c.i(2)));
  if (op == "permute")
    return one(s.permute(c.ints(0)));
  if (op == "select")
    return one(s.select(c.i(0), c.i(1)));
  if (op == "slice")
    return one(s.slice(c.i(0), c.i(1), c.i(2), c.i(3, 1)));
  if (op == "split")
    return many(s.split(c.i(0), c.i(1, 0)));
  if (op == "squeeze")
    return one(c.nargs() ? s.squeeze(c.i(0)) : s.squeeze());
  TT_UNARY(t)
  if (op == "transpose")
    return one(s.transpose(c.i(0), c.i(1)));
  if (op == "unbind")
    return many(s.unbind(c.i(0, 0)));
  if (op == "unsqueeze")
    return one(s.unsqueeze(c.i(0)));
  if (op == "view")
    return one(s.view(c.ints(0)));
  if (op == "view_as")
    return one(s.view_as(c.tensor(0)));
  // detach
  TT_UNARY(detach)
  TT_UNARY(data)
  TT_UNARY(variable_data)
  // may alias
  TT_UNARY(contiguous)
  TT_UNARY(cpu)
  TT_UNARY(cuda)
  if (op == "flatten")
    return one(s.flatten(c.i(0, 0), c.i(1, -1)));
  if (op == "reshape")
    return one(s.reshape(c.ints(0)));
  if (op == "reshape_as")
    return one(s.reshape_as(c.tensor(0)));
  if (op == "to") {
    bool copy = c.kwBool("copy", false);
    if (c.arg(0).has("device"))
      return one(s.to(tt::TensorOptions(tt::Device(tt::kCPU)), false, copy));
    return one(s.to(dtypeNamed(c.arg(0)["dtype"].asString()), false, copy));
  }
  TT_UNARY(clone)
  // in place
  TT_UNARY(abs_)
  TT_BINARY_ALPHA(add_)
  if (op == "clamp_")
    return one(s.clamp_(c.optScalar(0, "min"), c.optScalar(1, "max")));
  if (op == "copy_")
    return one(s.copy_(c.tensor(0)));
  TT_UNARY(detach_)
  TT_BINARY(div_)
  TT_UNARY(exp_)
  if (op == "fill_")
    return one(s.fill_(c.scalar(0)));
  if (op == "index_put_")
    return one(c.isTensor(1) ? s.index_put_(c.indices(0), c.tensor(1))
                             : s.index_put_(c.indices(0), c.scalar(1)));
  TT_UNARY(log_)
  TT_BINARY(mul_)
  TT_UNARY(neg_)
  TT_BINARY(pow_)
  TT_UNARY(relu_)
  if (op == "requires_grad_")
    return one(s.requires_grad_(c.nargs() ? c.arg(0).asBool() : true));
  TT_UNARY(sigmoid_)
  TT_UNARY(sqrt_)
  TT_BINARY_ALPHA(sub_)
  TT_UNARY(tanh_)
  TT_UNARY(zero_)
  // out of place
  TT_UNARY(abs)
  TT_BINARY_ALPHA(add)
  if (op == "argmax")
    return one(s.argmax(c.nargs() ? std::optional<std::int64_t>(c.i(0)) : std::nullopt,
                        c.kwBool("keepdim", false)));
  if (op == "bmm")
    return one(s.bmm(c.tensor(0)));
  if (op == "clamp")
    return one(s.clamp(c.optScalar(0, "min"), c.optScalar(1, "max")));
  TT_BINARY(div)
  TT_BINARY(eq)
  TT_UNARY(exp)
  TT_BINARY(ge)
  TT_BINARY(gt)
  TT_BINARY(le)
  TT_UNARY(log)
  TT_BINARY(lt)
  if (op == "matmul")
    return one(s.matmul(c.tensor(0)));
  if (op == "max")
    return c.nargs() ? many(s.max(c.i(0), c.kwBool("keepdim", false))) : one(s.max());
  if (op == "mean")
    return one(c.nargs() ? s.mean(c.ints(0), c.kwBool("keepdim", false)) : s.mean());
  if (op == "min")
    return c.nargs() ? many(s.min(c.i(0), c.kwBool("keepdim", false))) : one(s.min());
  if (op == "mm")
    return one(s.mm(c.tensor(0)));
  TT_BINARY(mul)
  TT_BINARY(ne)
  TT_UNARY(neg)
  TT_BINARY(pow)
  TT_UNARY(relu)
  TT_UNARY(sigmoid)
  TT_UNARY(sqrt)
  TT_BINARY_ALPHA(sub)
  if (op == "sum")
    return one(c.nargs() ? s.sum(c.ints(0), c.kwBool("keepdim", false)) : s.sum());
  TT_UNARY(tanh)
  if (op == "where") // self is the condition, as in torch.where(cond, x, y)
    return one(c.isTensor(1) ? tt::where(s, c.tensor(0), c.tensor(1))
                             : tt::where(s, c.tensor(0), c.scalar(1)));
  // factories
  if (op == "arange") {
    if (c.nargs() == 1)
      return one(tt::arange(c.scalar(0), c.options()));
    if (c.nargs() == 2)
      return one(tt::arange(c.scalar(0), c.scalar(1), c.options()));
    return one(tt::arange(c.scalar(0), c.scalar(1), c.scalar(2), c.options()));
  }
  if (op == "empty")
    return one(tt::empty(c.ints(0), c.options()));
  if (op == "empty_like")
    return one(tt::empty_like(s, c.options()));
  if (op == "full")
    return one(tt::full(c.ints(0), c.scalar(1), c.options()));
  if (op == "full_like")
    return one(tt::full_like(s, c.scalar(0), c.options()));
  if (op == "linspace")
    return one(tt::linspace(c.scalar(0), c.scalar(1), c.i(2), c.options()));
  if (op == "ones")
    return one(tt::ones(c.ints(0), c.options()));
  if (op == "ones_like")
    return one(tt::ones_like(s, c.options()));
  if (op == "rand")
    return one(tt::rand(c.ints(0), c.options()));
  if (op == "randn")
    return one(tt::randn(c.ints(0), c.options()));
  if (op == "tensor") { // torch.tensor([1, 2]) is int64, torch.tensor([1.5]) float32
    const Json &vals = c.arg(0);
    std::vector<double> d;
    std::vector<int> n;
    std::vector<bool> b;
    for (const Json &x : vals.items()) {
      d.push_back(x.isBool() ? 0.0 : x.asDouble());
      n.push_back(x.isInt() ? static_cast<int>(x.asInt()) : 0);
      b.push_back(x.isBool() && x.asBool());
    }
    if (vals[0].isBool())
      return one(braced(b, c.options()));
    if (vals[0].isInt())
      return one(braced(n, c.options()));
    return one(braced(d, c.options()));
  }
  if (op == "zeros")
    return one(tt::zeros(c.ints(0), c.options()));
  if (op == "zeros_like")
    return one(tt::zeros_like(s, c.options()));
  // steps around the measured op
  if (op == "backward") {
    s.backward();
    return many({});
  }
  if (op == "grad")
    return one(s.grad());
#undef TT_BINARY
#undef TT_BINARY_ALPHA
#undef TT_UNARY
  throw UnknownOp("the conformance test does not know op '" + op +
                  "' (update ConformanceTest.cpp)");
}

// --- observing tt ---------------------------------------------------------------------

bool isNotImplemented(const std::string &msg) {
  std::string m;
  for (char ch : msg)
    m += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return m.find("not implemented") != std::string::npos;
}

// "not implemented" is a skip only for an op ops.def lists as unsupported
// (TT_UNSUPPORTED): an op that regresses to "not implemented" fails.
std::string notImplemented(const std::string &id, const std::string &row, const std::string &op,
                           const std::string &msg) {
  if (sem::isUnsupported(row) || sem::isUnsupported(op))
    return "";
  return "runtime: " + id + ": '" + op + "' is not implemented (" + msg +
         "), and ops.def does not list it as unsupported (TT_UNSUPPORTED)";
}

std::string str(const std::vector<std::int64_t> &v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i)
    s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string tableSays(const sem::OpInfo &row) {
  return "ops.def says '" + std::string(row.name) + "' is " +
         std::string(sem::toString(row.storage)) + ", layout " +
         std::string(sem::toString(row.layout));
}

const sem::OpInfo *rowOf(const Json &c) { return sem::lookup(c["row"].asString()); }

// Compares one tt tensor with PyTorch's description of it.
void compareTensor(const std::string &what, const tt::Tensor &r, const tt::Tensor *input,
                   const Json &want, const sem::OpInfo &row) {
  SCOPED_TRACE(what);
  std::vector<std::int64_t> sizes(r.sizes().begin(), r.sizes().end());
  std::vector<std::int64_t> strides(r.strides().begin(), r.strides().end());
  EXPECT_EQ(str(sizes), str(want["sizes"].asInts())) << "runtime vs PyTorch: sizes";
  EXPECT_EQ(str(strides), str(want["strides"].asInts())) << "runtime vs PyTorch: strides";
  EXPECT_EQ(r.storage_offset(), want["storage_offset"].asInt())
      << "runtime vs PyTorch: storage_offset";
  EXPECT_EQ(r.is_contiguous(), want["contiguous"].asBool()) << "runtime vs PyTorch: is_contiguous";
  EXPECT_EQ(dtypeName(r.dtype()), want["dtype"].asString()) << "runtime vs PyTorch: dtype";
  EXPECT_EQ(r.requires_grad(), want["requires_grad"].asBool())
      << "runtime vs PyTorch: requires_grad";
  if (input) {
    EXPECT_EQ(r.is_alias_of(*input), want["aliases_input"].asBool())
        << "runtime vs PyTorch: does the result share the input's storage? (" << tableSays(row)
        << ")";
    EXPECT_EQ(r.is_same(*input), want["is_input"].asBool())
        << "runtime vs PyTorch: is the result the input tensor itself? (" << tableSays(row) << ")";
  }
  if (want.has("values") && sizes == want["sizes"].asInts()) {
    const auto &vals = want["values"].items();
    for (std::size_t k = 0; k < vals.size() && static_cast<std::int64_t>(k) < r.numel(); ++k) {
      double got = elementAt(r, static_cast<std::int64_t>(k)),
             exp = vals[k].isBool() ? vals[k].asBool() : vals[k].asDouble();
      double tol = vals[k].isNumber() && !vals[k].isInt() ? 1e-6 + 1e-5 * std::fabs(exp) : 0.0;
      EXPECT_LE(std::fabs(got - exp), tol) << "runtime vs PyTorch: value " << k
                                           << " (row-major) is " << got << ", PyTorch has " << exp;
    }
  }
}

class RuntimeVsPyTorch : public ::testing::TestWithParam<const Json *> {};

TEST_P(RuntimeVsPyTorch, Case) {
  const Json &c = *GetParam();
  const std::string id = c["id"].asString();
  const sem::OpInfo *row = rowOf(c);
  ASSERT_NE(row, nullptr) << "case " << id << ": '" << c["row"].asString()
                          << "' is not a row of ops.def (regenerate the golden file)";
  if (c.has("no_oracle"))
    GTEST_SKIP() << "no PyTorch oracle for " << id << ": " << c["no_oracle"].asString();
  const Json &expect = c["expect"];
  const Json &err = expect["error"];
  const auto &steps = c["steps"].items();
  const std::size_t measure = static_cast<std::size_t>(c["measure"].asInt());

  tt::manual_seed(0);
  std::map<std::string, tt::Tensor> env;
  std::vector<std::unique_ptr<tt::NoGradGuard>> noGrad;
  tt::Tensor input;
  std::uint32_t versionBefore = 0;
  Outcome measured;
  try {
    for (const auto &[name, spec] : c["tensors"].members())
      env[name] = makeLeaf(spec);
  } catch (const tt::Error &e) {
    if (isNotImplemented(e.what())) {
      std::string why = notImplemented(id, c["row"].asString(), "building the inputs", e.what());
      if (!why.empty())
        FAIL() << why;
      GTEST_SKIP() << "not implemented in tt yet: building the inputs (" << e.what() << ")";
    }
    FAIL() << "runtime: building the inputs of " << id << " threw: " << e.what();
  }

  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Json &step = steps[i];
    const std::string op = step["op"].asString();
    if (op == "no_grad_begin") {
      noGrad.push_back(std::make_unique<tt::NoGradGuard>());
      continue;
    }
    if (op == "no_grad_end") {
      noGrad.pop_back();
      continue;
    }
    Outcome out;
    try {
      Call call(step, env);
      if (i == measure && call.self.defined()) {
        input = call.self;
        versionBefore = input._version();
        SCOPED_TRACE("the input of the measured step");
        const Json &want = expect["input"];
        std::vector<std::int64_t> strides(input.strides().begin(), input.strides().end());
        ASSERT_EQ(str(strides), str(want["strides"].asInts()))
            << "runtime vs PyTorch: the steps before the op built a different input";
        ASSERT_EQ(input.storage_offset(), want["storage_offset"].asInt())
            << "runtime vs PyTorch: the steps before the op built a different input";
      }
      out = run(op, call);
    } catch (const UnknownOp &e) {
      FAIL() << e.what();
    } catch (const std::exception &e) {
      const std::string msg = e.what();
      if (isNotImplemented(msg)) {
        std::string why = notImplemented(id, c["row"].asString(), op, msg);
        if (!why.empty())
          FAIL() << why;
        GTEST_SKIP() << "not implemented in tt yet: " << op << " (" << msg << ")";
      }
      if (err.isNull())
        FAIL() << "runtime vs PyTorch: tt threw at step " << i << " (" << op << "): " << msg
               << "\nPyTorch did not throw";
      EXPECT_EQ(i, static_cast<std::size_t>(err["step"].asInt()))
          << "runtime vs PyTorch: tt threw at step " << i << " (" << op << "), PyTorch at step "
          << err["step"].asInt() << ": " << msg;
      EXPECT_NE(msg.find(err["key"].asString()), std::string::npos)
          << "runtime vs PyTorch: error message\n  tt:      " << msg
          << "\n  PyTorch: " << err["message"].asString()
          << "\nshould contain: " << err["key"].asString();
      return;
    }
    if (!step["out"].isNull()) {
      const std::string outName = step["out"].asString();
      if (out.single && !out.results.empty())
        env[outName] = out.results[0];
      for (std::size_t j = 0; !out.single && j < out.results.size(); ++j)
        env[outName + "[" + std::to_string(j) + "]"] = out.results[j];
    }
    if (i == measure)
      measured = out;
  }
  if (!err.isNull())
    FAIL() << "runtime vs PyTorch: PyTorch throws at step " << err["step"].asInt() << " ("
           << steps[static_cast<std::size_t>(err["step"].asInt())]["op"].asString()
           << "): " << err["message"].asString() << "\ntt did not throw";

  const auto &want = expect["results"].items();
  ASSERT_EQ(measured.results.size(), want.size()) << "runtime vs PyTorch: number of results";
  const tt::Tensor *in = input.defined() ? &input : nullptr;
  for (std::size_t j = 0; j < want.size(); ++j)
    compareTensor("result " + std::to_string(j), measured.results[j], in, want[j], *row);
  if (in) {
    EXPECT_EQ(input._version() != versionBefore, expect["version_bumped"].asBool())
        << "runtime vs PyTorch: was the input's version counter bumped? (" << tableSays(*row)
        << ")";
  }
  if (expect.has("post")) // losses and gradients computed after the op
    for (const auto &[name, want] : expect["post"].members()) {
      auto it = env.find(name);
      if (it == env.end() || !it->second.defined()) {
        ADD_FAILURE() << "runtime vs PyTorch: '" << name << "' (after the op) is undefined in tt";
        continue;
      }
      compareTensor("'" + name + "' after the op", it->second, nullptr, want, *row);
    }
  if (in && expect.has("shares_version_counter")) {
    tt::NoGradGuard guard;
    const auto &shares = expect["shares_version_counter"].items();
    for (std::size_t j = 0; j < shares.size() && j < measured.results.size(); ++j) {
      if (shares[j].isNull())
        continue;
      std::uint32_t v = input._version();
      measured.results[j].add_(0);
      EXPECT_EQ(input._version() != v, shares[j].asBool())
          << "runtime vs PyTorch: does result " << j << " share the input's version counter? ("
          << tableSays(*row) << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, RuntimeVsPyTorch, ::testing::ValuesIn(goldenCases()),
                         [](const ::testing::TestParamInfo<const Json *> &info) {
                           return paramName((*info.param)["id"].asString());
                         });

// --- the table against PyTorch ------------------------------------------------------

TEST(OpsTable, EveryRowHasGoldenCases) {
  ASSERT_EQ(golden().error, "");
  std::map<std::string, int> count;
  std::map<std::string, std::string> names;
  for (const Json *c : goldenCases()) {
    const std::string id = (*c)["id"].asString();
    EXPECT_NE(rowOf(*c), nullptr) << "golden case " << id << " is for '" << (*c)["row"].asString()
                                  << "', which is not a row of ops.def: regenerate the golden file";
    ++count[(*c)["row"].asString()];
    auto [it, fresh] = names.emplace(paramName(id), id);
    EXPECT_TRUE(fresh) << "case ids " << it->second << " and " << id << " give the same test name";
  }
  for (const sem::OpInfo &op : sem::kOps)
    EXPECT_GT(count[std::string(op.name)], 0)
        << "ops.def row '" << op.name
        << "' has no conformance case: add cases to scripts/gen_conformance.py "
        << "and regenerate test/conformance/golden.json";
}

class TableVsPyTorch : public ::testing::TestWithParam<sem::OpInfo> {};

// What the row promises, checked on every case PyTorch ran without error.
TEST_P(TableVsPyTorch, Row) {
  const sem::OpInfo &row = GetParam();
  const std::string says = tableSays(row);
  for (const Json *cp : goldenCases()) {
    const Json &c = *cp;
    if (c["row"].asString() != row.name || !c.has("expect") || !c["expect"]["error"].isNull())
      continue;
    SCOPED_TRACE("case " + c["id"].asString());
    const Json &e = c["expect"];
    const bool hasInput = e.has("input");
    const bool inputContiguous = hasInput && e["input"]["contiguous"].asBool();
    const bool inputRequiresGrad = hasInput && e["input"]["requires_grad"].asBool();
    const bool bumped = hasInput && e["version_bumped"].asBool();
    for (const Json &r : e["results"].items()) {
      const bool aliases = r.has("aliases_input") && r["aliases_input"].asBool();
      switch (row.storage) {
      case sem::Storage::View:
        EXPECT_TRUE(aliases) << "ops.def vs PyTorch: " << says
                             << ", but PyTorch's result has its own storage";
        break;
      case sem::Storage::Detach:
        EXPECT_TRUE(aliases) << "ops.def vs PyTorch: " << says
                             << ", but PyTorch's result has its own storage";
        EXPECT_FALSE(r["requires_grad"].asBool())
            << "ops.def vs PyTorch: " << says << ", but PyTorch's result requires grad";
        break;
      case sem::Storage::Copy:
      case sem::Storage::Fresh:
      case sem::Storage::Factory:
        EXPECT_FALSE(aliases) << "ops.def vs PyTorch: " << says
                              << ", but PyTorch's result shares the input's storage";
        break;
      case sem::Storage::InPlace:
        EXPECT_TRUE(r["is_input"].asBool())
            << "ops.def vs PyTorch: " << says << ", but PyTorch's result is not the input tensor";
        break;
      case sem::Storage::MayAlias:
      case sem::Storage::None:
        break;
      }
      if (row.layout == sem::Layout::Contiguous)
        EXPECT_TRUE(r["contiguous"].asBool())
            << "ops.def vs PyTorch: " << says
            << ", but PyTorch's result is not contiguous (strides " << r["strides"].dump() << ")";
      if ((row.layout == sem::Layout::Same || row.layout == sem::Layout::ViewOfSame) &&
          inputContiguous)
        EXPECT_TRUE(r["contiguous"].asBool())
            << "ops.def vs PyTorch: " << says
            << ", but PyTorch's result of a contiguous input is not contiguous";
      const std::string dt = r["dtype"].asString();
      if (inputRequiresGrad && (dt == "float32" || dt == "float64") &&
          row.storage != sem::Storage::None) {
        if (row.autograd == sem::Autograd::NotDifferentiable)
          EXPECT_FALSE(r["requires_grad"].asBool())
              << "ops.def vs PyTorch: '" << row.name
              << "' is NotDifferentiable, but PyTorch's result requires grad";
        else
          EXPECT_TRUE(r["requires_grad"].asBool())
              << "ops.def vs PyTorch: '" << row.name
              << "' is Differentiable, but PyTorch's result does not require grad";
      }
    }
    if (row.storage == sem::Storage::InPlace)
      EXPECT_TRUE(bumped) << "ops.def vs PyTorch: " << says
                          << ", but PyTorch did not bump the version counter";
    else
      EXPECT_FALSE(bumped) << "ops.def vs PyTorch: " << says
                           << ", but PyTorch bumped the input's version counter";
  }
}

INSTANTIATE_TEST_SUITE_P(OpsDef, TableVsPyTorch, ::testing::ValuesIn(sem::kOps),
                         [](const ::testing::TestParamInfo<sem::OpInfo> &info) {
                           return paramName(std::string(info.param.name));
                         });

} // namespace
