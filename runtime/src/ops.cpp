// Math: elementwise (broadcasting, PyTorch's type promotion and result
// layout), in-place variants (version bump, autograd checks), comparisons,
// where, reductions, matmul, cat/stack, allclose/equal, indexing.
#include "autograd.h"
#include "internal.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace tt {

namespace detail_views {
Tensor sumToShape(const Tensor &g, IntArrayRef shape);
bool canCastTo(ScalarType from, ScalarType to);
} // namespace detail_views

using autograd::LambdaNode;
using backend::BinaryOp;
using backend::CompareOp;
using backend::ReduceOp;
using backend::UnaryOp;

namespace {

// --- type promotion (torch.result_type) --------------------------------------------------
struct ResultTypeState {
  std::optional<ScalarType> dim, zero, wrapped;
  static void upd(std::optional<ScalarType> &s, ScalarType t) { s = s ? promoteTypes(*s, t) : t; }
  void add(const Tensor &t, bool isWrapped) {
    if (isWrapped) {
      ScalarType w = isFloatingType(t.dtype()) ? kFloat : t.dtype();
      upd(wrapped, w);
    } else if (t.dim() == 0) {
      upd(zero, t.dtype());
    } else {
      upd(dim, t.dtype());
    }
  }
  static std::optional<ScalarType> combine(std::optional<ScalarType> higher, std::optional<ScalarType> lower) {
    if (!higher)
      return lower;
    if (!lower)
      return higher;
    if (isFloatingType(*higher))
      return higher;
    if (*higher == kBool || isFloatingType(*lower))
      return promoteTypes(*higher, *lower);
    return higher;
  }
  ScalarType result() const { return combine(dim, combine(zero, wrapped)).value_or(kFloat); }
};

// A 0-dim tensor for a Scalar operand; not counted as an allocation.
struct Operand {
  Tensor t;
  bool wrapped = false;
};

// A 0-dim tensor of dtype dt holding s. On the CPU its 8 bytes are not a
// storage allocation: no trace event, not in memory_stats (PyTorch passes
// such scalars by value too).
Tensor scalarTensor(const Scalar &s, ScalarType dt, Device dev) {
  std::shared_ptr<Storage> st;
  if (dev.is_cpu()) {
    auto *buf = new std::uint64_t(0);
    st = std::shared_ptr<Storage>(new Storage(buf, sizeof(std::uint64_t), dev), [buf](Storage *p) {
      delete p;
      delete buf;
    });
  } else {
    st = std::make_shared<Storage>(elementSize(dt), dev);
  }
  Tensor t(std::make_shared<TensorImpl>(std::move(st), std::vector<std::int64_t>{}, std::vector<std::int64_t>{}, 0,
                                        dt, nullptr));
  backendOf(*t.unsafeGetTensorImpl()).fill(makeDesc(*t.unsafeGetTensorImpl()), scalarValue(s));
  return t;
}

Tensor wrapScalar(const Scalar &s, Device dev) { return scalarTensor(s, s.type(), dev); }

ScalarType resultType(std::initializer_list<Operand> ops) {
  ResultTypeState st;
  for (const Operand &o : ops)
    st.add(o.t, o.wrapped);
  return st.result();
}

void checkSameDevice(const Tensor &a, const Tensor &b) {
  if (a.device().type() != b.device().type() && a.dim() != 0 && b.dim() != 0) {
    Device da = a.device().is_cuda() ? Device(kCUDA, 0) : a.device();
    Device db = b.device().is_cuda() ? Device(kCUDA, 0) : b.device();
    fail("Expected all tensors to be on the same device, but found at least two devices, " + da.str() + " and " +
         db.str() + "!");
  }
}

Tensor castTo(const Tensor &t, ScalarType dt, Device dev) {
  if (t.dtype() == dt && t.device().type() == dev.type())
    return t;
  if (t.dim() == 0 && t.is_cpu() && dev.is_cpu())
    return scalarTensor(t.item(), dt, dev);
  Tensor out = makeTensor(t.sizes(), preservedStrides(*t.unsafeGetTensorImpl()), dt, dev);
  copyData(out, t, CopyKind::Other);
  return out;
}

backend::TensorDesc bdesc(const Tensor &t, IntArrayRef shape) {
  return makeDesc(*t.unsafeGetTensorImpl(), shape, broadcastStrides(*t.unsafeGetTensorImpl(), shape));
}
backend::TensorDesc odesc(const Tensor &t) { return makeDesc(*t.unsafeGetTensorImpl()); }
const backend::Backend &be(const Tensor &t) { return backendOf(*t.unsafeGetTensorImpl()); }

Tensor castGrad(const Tensor &g, const Tensor &like) {
  return g.dtype() == like.dtype() ? g : g.to(like.dtype());
}
Tensor sumTo(const Tensor &g, IntArrayRef shape) { return detail_views::sumToShape(g, shape); }

// --- unary -------------------------------------------------------------------------------
bool promotesToFloat(UnaryOp op) {
  switch (op) {
  case UnaryOp::Exp: case UnaryOp::Log: case UnaryOp::Sqrt: case UnaryOp::Sigmoid: case UnaryOp::Tanh:
  case UnaryOp::Reciprocal: case UnaryOp::RPowScalar:
    return true;
  default:
    return false;
  }
}

ScalarType unaryResultType(UnaryOp op, ScalarType in, const backend::UnaryParams &p, bool pIsFloat) {
  if (promotesToFloat(op) && !isFloatingType(in))
    return kFloat;
  if (op == UnaryOp::PowScalar && !isFloatingType(in) && pIsFloat)
    return kFloat;
  if (op == UnaryOp::Clamp && !isFloatingType(in) && pIsFloat)
    return kFloat;
  (void)p;
  return in;
}

// out = op(in) computed in `dt`; into `out` when given (same shape).
Tensor unaryRaw(UnaryOp op, const Tensor &in, ScalarType dt, const backend::UnaryParams &p, const Tensor *out) {
  if (op == UnaryOp::Neg && in.dtype() == kBool)
    fail("Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use "
         "the `~` or `logical_not()` operator instead.");
  Tensor x = castTo(in, dt, in.device());
  Tensor o = out && out->dtype() == dt ? *out
                                       : makeTensor(in.sizes(), elementwiseStrides(in.sizes(), {in.unsafeGetTensorImpl()}),
                                                    dt, in.device());
  if (o.numel())
    be(o).unary(op, odesc(o), odesc(x), p);
  if (out && !out->is_same(o))
    copyData(*out, o, CopyKind::Other);
  return out ? *out : o;
}

struct UnarySpec {
  UnaryOp op;
  const char *name;     // the op, as in ops.def
  const char *node;     // grad_fn name
  backend::UnaryParams params;
  bool pIsFloat = false;
};

std::shared_ptr<LambdaNode> unaryNode(const UnarySpec &s, const Tensor &in, const Tensor &out) {
  std::shared_ptr<LambdaNode> fn;
  auto P = s.params;
  switch (s.op) {
  case UnaryOp::Neg:
    fn = std::make_shared<LambdaNode>(s.node, [](const std::vector<Tensor> &g, LambdaNode &) {
      return std::vector<Tensor>{g[0].neg()};
    });
    break;
  case UnaryOp::Abs:
    fn = std::make_shared<LambdaNode>(s.node, [](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor a = n.get(0);
      Tensor sign = a.gt(0).to(g[0].dtype()) - a.lt(0).to(g[0].dtype());
      return std::vector<Tensor>{g[0] * sign};
    });
    fn->saved.emplace_back(in, false);
    break;
  case UnaryOp::Exp:
    fn = std::make_shared<LambdaNode>(s.node, [](const std::vector<Tensor> &g, LambdaNode &n) {
      return std::vector<Tensor>{g[0] * n.get(0)};
    });
    fn->saved.emplace_back(out, true, fn.get());
    fn->output_slots.push_back(0);
    break;
  case UnaryOp::Log:
    fn = std::make_shared<LambdaNode>(s.node, [](const std::vector<Tensor> &g, LambdaNode &n) {
      return std::vector<Tensor>{g[0] / n.get(0)};
    });
    fn->saved.emplace_back(in, false);
    break;
  case UnaryOp::Sqrt:
    fn = std::make_shared<LambdaNode>(s.node, [](const std::vector<Tensor> &g, LambdaNode &n) {
      return std::vector<Tensor>{g[0] / (n.get(0) * 2)};
    });
    fn->saved.emplace_back(out, true, fn.get());
    fn->output_slots.push_back(0);
    break;
  case UnaryOp::Relu:
    fn = std::make_shared<LambdaNode>(s.node, [](const std::vector<Tensor> &g, LambdaNode &n) {
      return std::vector<Tensor>{g[0] * n.get(0).gt(0).to(g[0].dtype())};
    });
    fn->saved.emplace_back(out, true, fn.get());
    fn->output_slots.push_back(0);
    break;
  case UnaryOp::Sigmoid:
    fn = std::make_shared<LambdaNode>(s.node, [](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor y = n.get(0);
      return std::vector<Tensor>{g[0] * y * (1 - y)};
    });
    fn->saved.emplace_back(out, true, fn.get());
    fn->output_slots.push_back(0);
    break;
  case UnaryOp::Tanh:
    fn = std::make_shared<LambdaNode>(s.node, [](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor y = n.get(0);
      return std::vector<Tensor>{g[0] * (1 - y * y)};
    });
    fn->saved.emplace_back(out, true, fn.get());
    fn->output_slots.push_back(0);
    break;
  case UnaryOp::Clamp:
    fn = std::make_shared<LambdaNode>(s.node, [P](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor a = n.get(0);
      Tensor mask = ones_like(a, kBool);
      if (P.has_p0)
        mask = mask * a.ge(P.p0.d);
      if (P.has_p1)
        mask = mask * a.le(P.p1.d);
      return std::vector<Tensor>{g[0] * mask.to(g[0].dtype())};
    });
    fn->saved.emplace_back(in, false);
    break;
  case UnaryOp::PowScalar:
    fn = std::make_shared<LambdaNode>(s.node, [P](const std::vector<Tensor> &g, LambdaNode &n) {
      double e = P.p0.d;
      if (e == 0)
        return std::vector<Tensor>{zeros_like(g[0])};
      return std::vector<Tensor>{g[0] * n.get(0).pow(e - 1) * e};
    });
    fn->saved.emplace_back(in, false);
    break;
  default:
    fn = std::make_shared<LambdaNode>(s.node, [](const std::vector<Tensor> &, LambdaNode &) -> std::vector<Tensor> {
      fail("tt: derivative not implemented");
    });
  }
  return fn;
}

Tensor unaryOp(const UnarySpec &s, const Tensor &self) {
  ScalarType dt = unaryResultType(s.op, self.dtype(), s.params, s.pIsFloat);
  Tensor out = unaryRaw(s.op, self, dt, s.params, nullptr);
  if (isFloatingType(dt) && autograd::shouldRecord({&self}))
    autograd::setHistory({out}, unaryNode(s, self, out), {&self});
  if (trace::on())
    trace::op(s.name, {&self}, out);
  return out;
}

// A clone of self's data carrying self's autograd edge: the input an
// in-place op records in place of self, so its saved values stay intact.
Tensor shadowOf(const Tensor &self) {
  const TensorImpl &s = *self.unsafeGetTensorImpl();
  Tensor sh = makeTensor(s.sizes, preservedStrides(s), s.dtype, s.storage->device());
  copyData(sh, self, CopyKind::Other);
  if (auto *m = autograd::metaOrNull(self)) {
    if (m->grad_fn) {
      autograd::AutogradMeta &sm = autograd::meta(sh);
      sm.grad_fn = m->grad_fn;
      sm.output_nr = m->output_nr;
    } else if (m->requires_grad) {
      autograd::meta(sh).requires_grad = true; // only under no_grad checks; unreachable with grad mode on
    }
  }
  return sh;
}

// The common path of every in-place op. `oop` computes the result out of
// place with autograd (from a shadow of self); `direct` writes self without.
template <typename Oop, typename Direct>
Tensor &inplace(const Tensor &self, const char *name, std::initializer_list<const Tensor *> others,
                ScalarType resultType, Oop oop, Direct direct) {
  autograd::checkInplace(self);
  if (std::strcmp(name, "fill_") != 0 && std::strcmp(name, "zero_") != 0) // as PyTorch 1.13
    assertNoInternalOverlap(*self.unsafeGetTensorImpl());
  for (const Tensor *o : others)
    assertNoPartialOverlap(*self.unsafeGetTensorImpl(), *o->unsafeGetTensorImpl());
  if (!detail_views::canCastTo(resultType, self.dtype()))
    fail(std::string("result type ") + toString(resultType) + " can't be cast to the desired output type " +
         toString(self.dtype()));
  for (const Tensor *o : others) {
    std::vector<std::int64_t> b = broadcastShapes(self.sizes(), o->sizes());
    if (!self.sizes().equals(b))
      fail("output with shape " + shapeString(self.sizes()) + " doesn't match the broadcast shape " + shapeString(b));
  }
  std::uint32_t before = self._version();
  bool rec = autograd::is_grad_mode() && (autograd::requiresGrad(self) ||
                                           std::any_of(others.begin(), others.end(),
                                                       [](const Tensor *t) { return autograd::requiresGrad(*t); }));
  if (rec && isFloatingType(self.dtype())) {
    Tensor shadow = shadowOf(self);
    Tensor r = oop(shadow);
    copyData(self, r, CopyKind::Other);
    bumpVersion(self, name, before);
    auto fn = std::static_pointer_cast<autograd::FunctionNode>(r.grad_fn());
    if (fn) {
      fn->rebaseOutput(autograd::detachedAlias(self));
      autograd::rebaseHistory(self, fn);
    }
  } else {
    direct();
    bumpVersion(self, name, before);
  }
  if (trace::on()) {
    if (others.size() == 0)
      trace::op(name, {&self}, self);
    else
      trace::op(name, {&self, *others.begin()}, self);
  }
  return const_cast<Tensor &>(self);
}

Tensor &unaryInplace(const UnarySpec &s, const Tensor &self) {
  ScalarType dt = unaryResultType(s.op, self.dtype(), s.params, s.pIsFloat);
  return inplace(
      self, s.name, {}, dt, [&](const Tensor &sh) { return unaryOp(s, sh); },
      [&] { unaryRaw(s.op, self, dt, s.params, &self); });
}

UnarySpec spec(UnaryOp op, const char *name, const char *node) { return UnarySpec{op, name, node, {}, false}; }

// --- binary ------------------------------------------------------------------------------
const char *binaryNodeName(BinaryOp op, bool scalar) {
  switch (op) {
  case BinaryOp::Add: return scalar ? "AddBackward1" : "AddBackward0";
  case BinaryOp::Sub: return scalar ? "SubBackward1" : "SubBackward0";
  case BinaryOp::Mul: return scalar ? "MulBackward1" : "MulBackward0";
  case BinaryOp::Div: return scalar ? "DivBackward1" : "DivBackward0";
  case BinaryOp::Pow: return "PowBackward1";
  case BinaryOp::Maximum: return "MaximumBackward0";
  case BinaryOp::Minimum: return "MinimumBackward0";
  }
  return "?";
}

ScalarType binaryResultType(BinaryOp op, const Operand &a, const Operand &b) {
  ScalarType rt = resultType({a, b});
  if (op == BinaryOp::Div && !isFloatingType(rt))
    rt = kFloat;
  if (op == BinaryOp::Sub && a.t.dtype() == kBool && b.t.dtype() == kBool)
    fail("Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` "
         "operator instead.");
  if (op == BinaryOp::Sub && (a.t.dtype() == kBool || b.t.dtype() == kBool) && rt == kBool)
    fail("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, "
         "use the `~` or `logical_not()` operator instead.");
  return rt;
}

// The math, no autograd: into *out (already the right shape) when given.
Tensor binaryRaw(BinaryOp op, const Tensor &a, const Tensor &b, ScalarType dt, const Scalar &alpha, const Tensor *out) {
  checkSameDevice(a, b);
  Device dev = a.dim() == 0 && b.dim() != 0 ? b.device() : a.device();
  std::vector<std::int64_t> shape = broadcastShapes(a.sizes(), b.sizes());
  Tensor ac = castTo(a, dt, dev), bc = castTo(b, dt, dev);
  Tensor o;
  if (out && out->dtype() == dt)
    o = *out;
  else
    o = makeTensor(shape, elementwiseStrides(shape, {a.unsafeGetTensorImpl(), b.unsafeGetTensorImpl()}), dt, dev);
  if (o.numel())
    be(o).binary(op, odesc(o), bdesc(ac, shape), bdesc(bc, shape), scalarValue(alpha));
  if (out && !out->is_same(o))
    copyData(*out, o, CopyKind::Other);
  return out ? *out : o;
}

// A gradient in its input's dtype, as PyTorch's engine casts it
// (validate_outputs): a saved number (x * 2.0 keeps a double) must not turn
// a float gradient into a double one.
Tensor asInputType(const Tensor &g, ScalarType dt) {
  return g.defined() && g.dtype() != dt && isFloatingType(dt) ? g.to(dt) : g;
}

// PyTorch's mul/mm/bmm: self is saved only for other's gradient and other
// only for self's (derivatives.yaml), so an in-place write to a factor whose
// partner does not require grad is fine (tt/ops.def: TT_SAVES Cross).
void saveCross(LambdaNode &fn, const Tensor &a, const Tensor &b) {
  fn.saved.emplace_back(b.requires_grad() ? a : Tensor(), false);
  fn.saved.emplace_back(a.requires_grad() ? b : Tensor(), false);
}

std::shared_ptr<LambdaNode> binaryNode(BinaryOp op, const Tensor &a, const Tensor &b, bool bScalar,
                                       const Scalar &alpha, const Tensor &out) {
  std::vector<std::int64_t> as = a.sizes().vec(), bs = b.sizes().vec();
  double al = alpha.toDouble();
  std::shared_ptr<LambdaNode> fn;
  auto make = [&](auto f) { fn = std::make_shared<LambdaNode>(binaryNodeName(op, bScalar), f); };
  switch (op) {
  case BinaryOp::Add:
  case BinaryOp::Sub: {
    double sign = op == BinaryOp::Sub ? -al : al;
    make([as, bs, sign](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor ga = sumTo(g[0], as);
      Tensor gb = n.next.size() > 1 && n.next[1].valid() ? sumTo(sign == 1 ? g[0] : g[0] * sign, bs) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
    break;
  }
  case BinaryOp::Mul:
    make([as, bs, at = a.dtype(), bt = b.dtype()](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor ga = n.next[0].valid() ? asInputType(sumTo(g[0] * n.get(1), as), at) : Tensor();
      Tensor gb = n.next.size() > 1 && n.next[1].valid() ? asInputType(sumTo(g[0] * n.get(0), bs), bt)
                                                          : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
    saveCross(*fn, a, b); // PyTorch: each factor only for the other's gradient
    break;
  case BinaryOp::Div:
    make([as, bs, at = a.dtype()](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor bb = n.get(1);
      Tensor ga = n.next[0].valid() ? asInputType(sumTo(g[0] / bb, as), at) : Tensor();
      Tensor gb = n.next.size() > 1 && n.next[1].valid() ? sumTo(-g[0] * n.get(0) / (bb * bb), bs) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
    // PyTorch: the divisor always, the dividend only for the divisor's gradient.
    fn->saved.emplace_back(b.requires_grad() ? a : Tensor(), false);
    fn->saved.emplace_back(b, false);
    break;
  case BinaryOp::Pow:
    make([as, bs](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor x = n.get(0), e = n.get(1);
      Tensor ga = n.next[0].valid() ? sumTo(g[0] * e * x.pow(e - 1), as) : Tensor();
      Tensor gb = n.next.size() > 1 && n.next[1].valid() ? sumTo(g[0] * n.get(2) * x.log(), bs) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
    fn->saved.emplace_back(a, false);
    fn->saved.emplace_back(b, false);
    // PyTorch saves the result only for a tensor exponent's gradient.
    fn->saved.emplace_back(b.requires_grad() ? out : Tensor(), true, fn.get());
    fn->output_slots.push_back(2);
    break;
  default:
    make([](const std::vector<Tensor> &, LambdaNode &) -> std::vector<Tensor> {
      fail("tt: derivative not implemented");
    });
  }
  return fn;
}

Tensor binaryOp(BinaryOp op, const char *name, const Tensor &a, const Operand &b, const Scalar &alpha) {
  ScalarType dt = binaryResultType(op, Operand{a, false}, b);
  Tensor out = binaryRaw(op, a, b.t, dt, alpha, nullptr);
  if (isFloatingType(dt) && autograd::shouldRecord({&a, &b.t}))
    autograd::setHistory({out}, binaryNode(op, a, b.t, b.wrapped, alpha, out), {&a, &b.t});
  if (trace::on()) {
    if (b.wrapped)
      trace::op(name, {&a}, out);
    else
      trace::op(name, {&a, &b.t}, out);
  }
  return out;
}

Tensor &binaryInplace(BinaryOp op, const char *name, const Tensor &self, const Operand &b, const Scalar &alpha) {
  ScalarType dt = binaryResultType(op, Operand{self, false}, b);
  std::initializer_list<const Tensor *> none = {};
  std::initializer_list<const Tensor *> one = {&b.t};
  return inplace(
      self, name, b.wrapped ? none : one, dt,
      [&](const Tensor &sh) {
        Tensor out = binaryRaw(op, sh, b.t, dt, alpha, nullptr);
        if (autograd::shouldRecord({&sh, &b.t}))
          autograd::setHistory({out}, binaryNode(op, sh, b.t, b.wrapped, alpha, out), {&sh, &b.t});
        return out;
      },
      [&] { binaryRaw(op, self, b.t, dt, alpha, &self); });
}

Operand tensorOperand(const Tensor &t) { return Operand{t, false}; }
Operand scalarOperand(const Scalar &s, const Tensor &like) { return Operand{wrapScalar(s, like.device()), true}; }

// --- compare -------------------------------------------------------------------------------
Tensor compareOp(CompareOp op, const char *name, const Tensor &a, const Operand &b) {
  checkSameDevice(a, b.t);
  ScalarType dt = resultType({Operand{a, false}, b});
  std::vector<std::int64_t> shape = broadcastShapes(a.sizes(), b.t.sizes());
  Tensor ac = castTo(a, dt, a.device()), bc = castTo(b.t, dt, a.device());
  Tensor out = makeTensor(shape, elementwiseStrides(shape, {a.unsafeGetTensorImpl(), b.t.unsafeGetTensorImpl()}),
                          kBool, a.device());
  if (out.numel())
    be(out).compare(op, odesc(out), bdesc(ac, shape), bdesc(bc, shape));
  if (trace::on()) {
    if (b.wrapped)
      trace::op(name, {&a}, out);
    else
      trace::op(name, {&a, &b.t}, out);
  }
  return out;
}

// --- reductions ----------------------------------------------------------------------------
std::vector<bool> reduceMask(const Tensor &self, IntArrayRef dims) {
  std::int64_t nd = self.dim();
  std::vector<bool> mask(static_cast<std::size_t>(std::max<std::int64_t>(nd, 1)), false);
  if (dims.empty()) {
    std::fill(mask.begin(), mask.end(), true);
    return mask;
  }
  for (auto d : dims) {
    std::int64_t w = wrapDim(d, nd);
    if (mask[w])
      fail("dim " + std::to_string(w) + " appears multiple times in the list of dims");
    mask[w] = true;
  }
  return mask;
}

// Reduces self over mask into a tensor of keepdim shape; returns it (and
// indices for Max/Min when wanted).
Tensor reduceRaw(ReduceOp op, const Tensor &self, const std::vector<bool> &mask, ScalarType outType,
                 Tensor *indices) {
  std::int64_t nd = self.dim();
  std::vector<std::int64_t> keep(nd);
  for (std::int64_t i = 0; i < nd; ++i)
    keep[i] = mask[i] ? 1 : self.size(i);
  bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  ScalarType inType = arg ? self.dtype() : outType;
  Tensor in = castTo(self, inType, self.device());
  Tensor out = makeContiguous(keep, arg ? kLong : outType, self.device());
  backend::TensorDesc idx;
  if (indices) {
    *indices = makeContiguous(keep, kLong, self.device());
    idx = odesc(*indices);
  }
  if (self.numel() == 0) {
    if (out.numel())
      be(out).fill(odesc(out), scalarValue(op == ReduceOp::Prod ? 1 : 0));
    return out;
  }
  if (nd == 0) {
    copyData(out, in, CopyKind::Other);
    if (arg)
      be(out).fill(odesc(out), scalarValue(0));
    if (indices)
      be(*indices).fill(idx, scalarValue(0));
    return out;
  }
  be(out).reduce(op, odesc(out), odesc(in), indices ? &idx : nullptr);
  return out;
}

std::vector<std::int64_t> squeezeShape(IntArrayRef keep, const std::vector<bool> &mask) {
  std::vector<std::int64_t> s;
  for (std::size_t i = 0; i < keep.size(); ++i)
    if (!mask[i])
      s.push_back(keep[i]);
  return s;
}

Tensor finishReduce(Tensor keepTensor, const std::vector<bool> &mask, bool keepdim) {
  if (keepdim)
    return keepTensor;
  std::vector<std::int64_t> s = squeezeShape(keepTensor.sizes(), mask);
  return Tensor(std::make_shared<TensorImpl>(keepTensor.unsafeGetTensorImpl()->storage, s, contiguousStrides(s), 0,
                                             keepTensor.dtype(), nullptr));
}

Tensor sumImpl(const Tensor &self, IntArrayRef dims, bool keepdim, std::optional<ScalarType> dtype, bool mean,
               const char *name) {
  ScalarType outType = dtype ? *dtype : isFloatingType(self.dtype()) ? self.dtype() : kLong;
  if (mean && !isFloatingType(outType))
    fail(std::string("mean(): could not infer output dtype. Input dtype must be either a floating point or complex "
                     "dtype. Got: ") +
         toString(outType));
  std::vector<bool> mask = reduceMask(self, dims);
  Tensor r = reduceRaw(ReduceOp::Sum, self, mask, outType, nullptr);
  std::int64_t count = 1;
  for (std::int64_t i = 0; i < self.dim(); ++i)
    if (mask[i])
      count *= self.size(i);
  if (mean) {
    Tensor c = wrapScalar(Scalar(static_cast<double>(count)), self.device());
    binaryRaw(BinaryOp::Div, r, c, outType, 1, &r);
  }
  Tensor out = finishReduce(r, mask, keepdim);
  if (isFloatingType(outType) && autograd::shouldRecord({&self})) {
    std::vector<std::int64_t> in = self.sizes().vec(), keepShape = r.sizes().vec();
    bool all = dims.empty();
    const char *node = mean ? (all ? "MeanBackward0" : "MeanBackward1") : (all ? "SumBackward0" : "SumBackward1");
    auto fn = std::make_shared<LambdaNode>(node, [in, keepShape, mean, count](const std::vector<Tensor> &g,
                                                                               LambdaNode &) {
      Tensor gg = g[0].reshape(keepShape).expand(in);
      if (mean)
        gg = gg / static_cast<double>(count);
      return std::vector<Tensor>{gg};
    });
    autograd::setHistory({out}, fn, {&self});
  }
  if (trace::on())
    trace::op(name, {&self}, out);
  return out;
}

Tensor maxAll(const Tensor &self, bool isMax) {
  const char *name = isMax ? "max" : "min";
  if (self.numel() == 0)
    fail(std::string(name) +
         "(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the "
         "'dim' argument.");
  std::vector<bool> mask = reduceMask(self, {});
  Tensor r = reduceRaw(isMax ? ReduceOp::Max : ReduceOp::Min, self, mask, self.dtype(), nullptr);
  Tensor out = finishReduce(r, mask, false);
  if (isFloatingType(self.dtype()) && autograd::shouldRecord({&self})) {
    auto fn = std::make_shared<LambdaNode>(isMax ? "MaxBackward1" : "MinBackward1",
                                           [](const std::vector<Tensor> &g, LambdaNode &n) {
                                             // evenly_distribute_backward
                                             Tensor a = n.get(0), res = n.get(1);
                                             Tensor mask = a.eq(res).to(g[0].dtype());
                                             return std::vector<Tensor>{mask * (g[0] / mask.sum())};
                                           });
    fn->saved.emplace_back(self, false);
    fn->saved.emplace_back(out, true, fn.get());
    fn->output_slots.push_back(1);
    autograd::setHistory({out}, fn, {&self});
  }
  if (trace::on())
    trace::op(name, {&self}, out);
  return out;
}

std::tuple<Tensor, Tensor> maxDim(const Tensor &self, std::int64_t dim, bool keepdim, bool isMax) {
  const char *name = isMax ? "max" : "min";
  std::int64_t d = wrapDim(dim, self.dim());
  if (self.dim() > 0 && self.size(d) == 0) {
    std::ostringstream os;
    os << name << "(): Expected reduction dim " << d << " to have non-zero size.";
    fail(os.str());
  }
  std::vector<bool> mask(static_cast<std::size_t>(std::max<std::int64_t>(self.dim(), 1)), false);
  mask[d] = true;
  Tensor idx;
  Tensor r = reduceRaw(isMax ? ReduceOp::Max : ReduceOp::Min, self, mask, self.dtype(), &idx);
  Tensor values = finishReduce(r, mask, keepdim), indices = finishReduce(idx, mask, keepdim);
  if (isFloatingType(self.dtype()) && autograd::shouldRecord({&self})) {
    std::vector<std::int64_t> in = self.sizes().vec(), keepShape = r.sizes().vec();
    std::int64_t size_d = self.dim() ? self.size(d) : 1;
    auto fn = std::make_shared<LambdaNode>(isMax ? "MaxBackward0" : "MinBackward0",
                                           [in, keepShape, d, size_d](const std::vector<Tensor> &g, LambdaNode &n) {
                                             Tensor ix = n.get(0).reshape(keepShape);
                                             std::vector<std::int64_t> shape(in.size(), 1);
                                             if (!in.empty())
                                               shape[d] = size_d;
                                             Tensor pos = arange(size_d, g[0].device()).reshape(shape);
                                             Tensor onehot = pos.eq(ix).to(g[0].dtype());
                                             return std::vector<Tensor>{onehot * g[0].reshape(keepShape)};
                                           });
    fn->saved.emplace_back(indices, false);
    autograd::setHistory({values}, fn, {&self});
  }
  if (trace::on())
    trace::op(name, {&self}, values);
  return {values, indices};
}

Tensor argImpl(const Tensor &self, std::optional<std::int64_t> dim, bool keepdim, bool isMax) {
  const char *name = isMax ? "argmax" : "argmin";
  if (self.numel() == 0)
    fail(std::string(name) + "(): Expected reduction dim to be specified for input.numel() == 0.");
  Tensor src = dim ? self : self.reshape({-1});
  std::int64_t d = dim ? wrapDim(*dim, self.dim()) : 0;
  std::vector<bool> mask(static_cast<std::size_t>(std::max<std::int64_t>(src.dim(), 1)), false);
  mask[d] = true;
  Tensor r = reduceRaw(isMax ? ReduceOp::ArgMax : ReduceOp::ArgMin, src, mask, kLong, nullptr);
  Tensor out;
  if (!dim && keepdim) {
    std::vector<std::int64_t> ones(self.dim(), 1);
    out = r.reshape(ones);
  } else {
    out = finishReduce(r, mask, keepdim);
  }
  if (trace::on())
    trace::op(name, {&self}, out);
  return out;
}

// --- matmul -----------------------------------------------------------------------------------
Tensor bmmRaw(const Tensor &a, const Tensor &b) {
  Tensor out = makeContiguous({a.size(0), a.size(1), b.size(2)}, a.dtype(), a.device());
  if (out.numel())
    be(out).matmul(odesc(out), odesc(a), odesc(b));
  return out;
}

void checkMatmulTypes(const Tensor &a, const Tensor &b) {
  if (a.dtype() != b.dtype())
    fail(std::string("expected scalar type ") + toString(a.dtype()) + " but found " + toString(b.dtype()));
  checkSameDevice(a, b);
}

Tensor mmImpl(const Tensor &a, const Tensor &b) {
  if (a.dim() != 2)
    fail("self must be a matrix");
  if (b.dim() != 2)
    fail("mat2 must be a matrix");
  if (a.size(1) != b.size(0)) {
    std::ostringstream os;
    os << "mat1 and mat2 shapes cannot be multiplied (" << a.size(0) << "x" << a.size(1) << " and " << b.size(0) << "x"
       << b.size(1) << ")";
    fail(os.str());
  }
  checkMatmulTypes(a, b);
  Tensor a3 = makeView(a, {1, a.size(0), a.size(1)}, {0, a.stride(0), a.stride(1)}, a.storage_offset());
  Tensor b3 = makeView(b, {1, b.size(0), b.size(1)}, {0, b.stride(0), b.stride(1)}, b.storage_offset());
  Tensor r = bmmRaw(a3, b3);
  Tensor out(std::make_shared<TensorImpl>(r.unsafeGetTensorImpl()->storage, std::vector<std::int64_t>{a.size(0), b.size(1)},
                                          contiguousStrides({a.size(0), b.size(1)}), 0, a.dtype(), nullptr));
  if (isFloatingType(a.dtype()) && autograd::shouldRecord({&a, &b})) {
    auto fn = std::make_shared<LambdaNode>("MmBackward0", [](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor ga = n.next[0].valid() ? g[0].mm(n.get(1).t()) : Tensor();
      Tensor gb = n.next[1].valid() ? n.get(0).t().mm(g[0]) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
    saveCross(*fn, a, b);
    autograd::setHistory({out}, fn, {&a, &b});
  }
  return out;
}

Tensor bmmImpl(const Tensor &a, const Tensor &b) {
  if (a.dim() != 3)
    fail("batch1 must be a 3D tensor");
  if (b.dim() != 3)
    fail("batch2 must be a 3D tensor");
  if (a.size(0) != b.size(0) || a.size(2) != b.size(1)) {
    std::ostringstream os;
    os << "Expected size for first two dimensions of batch2 tensor to be: [" << a.size(0) << ", " << a.size(2)
       << "] but got: [" << b.size(0) << ", " << b.size(1) << "].";
    fail(os.str());
  }
  checkMatmulTypes(a, b);
  Tensor out = bmmRaw(a, b);
  if (isFloatingType(a.dtype()) && autograd::shouldRecord({&a, &b})) {
    auto fn = std::make_shared<LambdaNode>("BmmBackward0", [](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor ga = n.next[0].valid() ? g[0].bmm(n.get(1).transpose(1, 2)) : Tensor();
      Tensor gb = n.next[1].valid() ? n.get(0).transpose(1, 2).bmm(g[0]) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
    saveCross(*fn, a, b);
    autograd::setHistory({out}, fn, {&a, &b});
  }
  return out;
}

// at::matmul's cases (1-D dot, mv, mm, batched with broadcasting).
Tensor matmulImpl(const Tensor &a, const Tensor &b) {
  std::int64_t da = a.dim(), db = b.dim();
  if (da == 0 || db == 0)
    fail("both arguments to matmul need to be at least 1D, but they are " + std::to_string(da) + "D and " +
         std::to_string(db) + "D");
  if (da == 1 && db == 1) {
    if (a.size(0) != b.size(0))
      fail("inconsistent tensor size, expected tensor [" + std::to_string(a.size(0)) + "] and src [" +
           std::to_string(b.size(0)) + "] to have the same number of elements, but got " + std::to_string(a.size(0)) +
           " and " + std::to_string(b.size(0)) + " elements respectively");
    return mmImpl(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
  }
  if (da == 2 && db == 1)
    return mmImpl(a, b.unsqueeze(1)).squeeze(-1);
  if (da == 1 && db == 2)
    return mmImpl(a.unsqueeze(0), b).squeeze(0);
  if (da == 2 && db == 2)
    return mmImpl(a, b);
  if (da >= 3 && (db == 1 || db == 2)) {
    // Fold a's batch dims into rows (reshape: copies when a is not viewable).
    Tensor bb = db == 1 ? b.unsqueeze(1) : b;
    std::vector<std::int64_t> outShape = a.sizes().vec();
    outShape.pop_back();
    if (db == 2)
      outShape.push_back(b.size(1));
    Tensor r = mmImpl(a.reshape({-1, a.size(-1)}), bb);
    return r.reshape(outShape);
  }
  // Batched: broadcast batch dims.
  Tensor A = da == 1 ? a.unsqueeze(0) : a, B = db == 1 ? b.unsqueeze(1) : b;
  // As at::matmul: broadcast the batch dims first, then bmm says what does
  // not match ([batch, m1] vs [batch, m2]). Dividing numel by n * m1 here
  // once crashed on empty tensors (SIGFPE).
  std::int64_t n = A.size(-2), m1 = A.size(-1), m2 = B.size(-2), p = B.size(-1);
  std::vector<std::int64_t> ba(A.sizes().begin(), A.sizes().end() - 2), bbs(B.sizes().begin(), B.sizes().end() - 2);
  std::vector<std::int64_t> batch = broadcastShapes(ba, bbs);
  std::int64_t nb = 1;
  for (auto s : batch)
    nb *= s;
  std::vector<std::int64_t> ea = batch, eb = batch;
  ea.push_back(n);
  ea.push_back(m1);
  eb.push_back(m2);
  eb.push_back(p);
  Tensor r = bmmImpl(A.expand(ea).reshape({nb, n, m1}), B.expand(eb).reshape({nb, m2, p}));
  std::vector<std::int64_t> outShape = batch;
  if (da > 1)
    outShape.push_back(n);
  if (db > 1)
    outShape.push_back(p);
  return r.reshape(outShape);
}

Tensor fillValue(const Tensor &like, const Scalar &s) { return wrapScalar(s, like.device()); }

} // namespace

// --- Tensor math methods -----------------------------------------------------------------------
#define TT_BINARY_METHODS(NAME, OP)                                                                                 \
  Tensor Tensor::NAME(const Tensor &other, SourceLocation loc) const {                                               \
    trace::Scope scope(#NAME, loc);                                                                                  \
    return binaryOp(OP, #NAME, *this, tensorOperand(other), 1);                                                      \
  }                                                                                                                  \
  Tensor Tensor::NAME(const Scalar &other, SourceLocation loc) const {                                               \
    trace::Scope scope(#NAME, loc);                                                                                  \
    return binaryOp(OP, #NAME, *this, scalarOperand(other, *this), 1);                                               \
  }                                                                                                                  \
  Tensor &Tensor::NAME##_(const Tensor &other, SourceLocation loc) const {                                           \
    trace::Scope scope(#NAME "_", loc);                                                                              \
    return binaryInplace(OP, #NAME "_", *this, tensorOperand(other), 1);                                             \
  }                                                                                                                  \
  Tensor &Tensor::NAME##_(const Scalar &other, SourceLocation loc) const {                                           \
    trace::Scope scope(#NAME "_", loc);                                                                              \
    return binaryInplace(OP, #NAME "_", *this, scalarOperand(other, *this), 1);                                      \
  }
TT_BINARY_METHODS(mul, BinaryOp::Mul)
TT_BINARY_METHODS(div, BinaryOp::Div)
#undef TT_BINARY_METHODS

#define TT_ALPHA_METHODS(NAME, OP)                                                                                  \
  Tensor Tensor::NAME(const Tensor &other, const Scalar &alpha, SourceLocation loc) const {                          \
    trace::Scope scope(#NAME, loc);                                                                                  \
    return binaryOp(OP, #NAME, *this, tensorOperand(other), alpha);                                                  \
  }                                                                                                                  \
  Tensor Tensor::NAME(const Scalar &other, const Scalar &alpha, SourceLocation loc) const {                          \
    trace::Scope scope(#NAME, loc);                                                                                  \
    return binaryOp(OP, #NAME, *this, scalarOperand(other, *this), alpha);                                           \
  }                                                                                                                  \
  Tensor &Tensor::NAME##_(const Tensor &other, const Scalar &alpha, SourceLocation loc) const {                      \
    trace::Scope scope(#NAME "_", loc);                                                                              \
    return binaryInplace(OP, #NAME "_", *this, tensorOperand(other), alpha);                                         \
  }                                                                                                                  \
  Tensor &Tensor::NAME##_(const Scalar &other, const Scalar &alpha, SourceLocation loc) const {                      \
    trace::Scope scope(#NAME "_", loc);                                                                              \
    return binaryInplace(OP, #NAME "_", *this, scalarOperand(other, *this), alpha);                                  \
  }
TT_ALPHA_METHODS(add, BinaryOp::Add)
TT_ALPHA_METHODS(sub, BinaryOp::Sub)
#undef TT_ALPHA_METHODS

Tensor Tensor::pow(const Tensor &e, SourceLocation loc) const {
  trace::Scope scope("pow", loc);
  return binaryOp(BinaryOp::Pow, "pow", *this, tensorOperand(e), 1);
}
Tensor &Tensor::pow_(const Tensor &e, SourceLocation loc) const {
  trace::Scope scope("pow_", loc);
  return binaryInplace(BinaryOp::Pow, "pow_", *this, tensorOperand(e), 1);
}
namespace {
UnarySpec powSpec(const Tensor &self, const Scalar &e) {
  if (isIntegralType(self.scalar_type(), /*include_bool=*/false) && !e.isFloatingPoint() && e.toLong() < 0)
    fail("Integers to negative integer powers are not allowed.");
  UnarySpec s = spec(UnaryOp::PowScalar, "pow", "PowBackward0");
  s.params.p0 = scalarValue(e);
  s.params.has_p0 = true;
  s.pIsFloat = e.isFloatingPoint();
  return s;
}
UnarySpec clampSpec(const std::optional<Scalar> &mn, const std::optional<Scalar> &mx, const char *name) {
  UnarySpec s = spec(UnaryOp::Clamp, name, "ClampBackward1");
  if (mn) {
    s.params.p0 = scalarValue(*mn);
    s.params.has_p0 = true;
    s.pIsFloat |= mn->isFloatingPoint();
  }
  if (mx) {
    s.params.p1 = scalarValue(*mx);
    s.params.has_p1 = true;
    s.pIsFloat |= mx->isFloatingPoint();
  }
  if (!mn && !mx)
    fail("torch.clamp: At least one of 'min' or 'max' must not be None");
  return s;
}
} // namespace
Tensor Tensor::pow(const Scalar &e, SourceLocation loc) const {
  trace::Scope scope("pow", loc);
  return unaryOp(powSpec(*this, e), *this);
}
Tensor &Tensor::pow_(const Scalar &e, SourceLocation loc) const {
  trace::Scope scope("pow_", loc);
  UnarySpec s = powSpec(*this, e);
  s.name = "pow_";
  return unaryInplace(s, *this);
}

#define TT_UNARY_METHODS(NAME, OP, NODE)                                                                            \
  Tensor Tensor::NAME(SourceLocation loc) const {                                                                    \
    trace::Scope scope(#NAME, loc);                                                                                  \
    return unaryOp(spec(OP, #NAME, NODE), *this);                                                                    \
  }                                                                                                                  \
  Tensor &Tensor::NAME##_(SourceLocation loc) const {                                                                \
    trace::Scope scope(#NAME "_", loc);                                                                              \
    return unaryInplace(spec(OP, #NAME "_", NODE), *this);                                                           \
  }
TT_UNARY_METHODS(neg, UnaryOp::Neg, "NegBackward0")
TT_UNARY_METHODS(abs, UnaryOp::Abs, "AbsBackward0")
TT_UNARY_METHODS(exp, UnaryOp::Exp, "ExpBackward0")
TT_UNARY_METHODS(log, UnaryOp::Log, "LogBackward0")
TT_UNARY_METHODS(sqrt, UnaryOp::Sqrt, "SqrtBackward0")
TT_UNARY_METHODS(relu, UnaryOp::Relu, "ReluBackward0")
TT_UNARY_METHODS(sigmoid, UnaryOp::Sigmoid, "SigmoidBackward0")
TT_UNARY_METHODS(tanh, UnaryOp::Tanh, "TanhBackward0")
#undef TT_UNARY_METHODS

Tensor Tensor::clamp(const std::optional<Scalar> &mn, const std::optional<Scalar> &mx, SourceLocation loc) const {
  trace::Scope scope("clamp", loc);
  return unaryOp(clampSpec(mn, mx, "clamp"), *this);
}
Tensor &Tensor::clamp_(const std::optional<Scalar> &mn, const std::optional<Scalar> &mx, SourceLocation loc) const {
  trace::Scope scope("clamp_", loc);
  return unaryInplace(clampSpec(mn, mx, "clamp_"), *this);
}

Tensor &Tensor::fill_(const Scalar &v, SourceLocation loc) const {
  trace::Scope scope("fill_", loc);
  return inplace(
      *this, "fill_", {}, dtype(),
      [&](const Tensor &sh) {
        Tensor out = full_like(sh, v);
        if (autograd::shouldRecord({&sh})) {
          auto fn = std::make_shared<LambdaNode>("FillBackward0", [](const std::vector<Tensor> &g, LambdaNode &) {
            return std::vector<Tensor>{g[0].defined() ? zeros_like(g[0]) : Tensor()};
          });
          autograd::setHistory({out}, fn, {&sh});
        }
        return out;
      },
      [&] {
        if (numel())
          be(*this).fill(odesc(*this), scalarValue(v));
      });
}

Tensor &Tensor::fill_(const Tensor &v, SourceLocation loc) const {
  trace::Scope scope("fill_", loc);
  if (v.dim() != 0)
    fail("fill_ only supports 0-dimension value tensor but got tensor with " + std::to_string(v.dim()) +
         " dimensions.");
  return fill_(v.item(), loc);
}

Tensor &Tensor::zero_(SourceLocation loc) const {
  trace::Scope scope("zero_", loc);
  return inplace(
      *this, "zero_", {}, dtype(),
      [&](const Tensor &sh) {
        Tensor out = zeros_like(sh);
        if (autograd::shouldRecord({&sh})) {
          auto fn = std::make_shared<LambdaNode>("ZeroBackward0", [](const std::vector<Tensor> &g, LambdaNode &) {
            return std::vector<Tensor>{g[0].defined() ? zeros_like(g[0]) : Tensor()};
          });
          autograd::setHistory({out}, fn, {&sh});
        }
        return out;
      },
      [&] {
        if (numel())
          be(*this).fill(odesc(*this), scalarValue(0));
      });
}

#define TT_COMPARE_METHODS(NAME, OP)                                                                                \
  Tensor Tensor::NAME(const Tensor &other, SourceLocation loc) const {                                               \
    trace::Scope scope(#NAME, loc);                                                                                  \
    return compareOp(OP, #NAME, *this, tensorOperand(other));                                                        \
  }                                                                                                                  \
  Tensor Tensor::NAME(const Scalar &other, SourceLocation loc) const {                                               \
    trace::Scope scope(#NAME, loc);                                                                                  \
    return compareOp(OP, #NAME, *this, scalarOperand(other, *this));                                                 \
  }
TT_COMPARE_METHODS(eq, CompareOp::Eq)
TT_COMPARE_METHODS(ne, CompareOp::Ne)
TT_COMPARE_METHODS(lt, CompareOp::Lt)
TT_COMPARE_METHODS(le, CompareOp::Le)
TT_COMPARE_METHODS(gt, CompareOp::Gt)
TT_COMPARE_METHODS(ge, CompareOp::Ge)
#undef TT_COMPARE_METHODS

Tensor Tensor::where(const Tensor &condition, const Tensor &other, SourceLocation loc) const {
  return tt::where(condition, *this, other, loc);
}

Tensor where(const Tensor &cond, const Tensor &a, const Tensor &b, SourceLocation loc) {
  trace::Scope scope("where", loc);
  if (cond.dtype() != kBool)
    fail(std::string("where expected condition to be a boolean tensor, but got a tensor with dtype ") +
         toString(cond.dtype()));
  checkSameDevice(a, b);
  checkSameDevice(cond, a);
  ScalarType dt = resultType({Operand{a, false}, Operand{b, false}});
  std::vector<std::int64_t> shape = broadcastShapes(broadcastShapes(cond.sizes(), a.sizes()), b.sizes());
  Tensor ac = castTo(a, dt, a.device()), bc = castTo(b, dt, a.device());
  Tensor out = makeTensor(
      shape,
      elementwiseStrides(shape, {cond.unsafeGetTensorImpl(), a.unsafeGetTensorImpl(), b.unsafeGetTensorImpl()}), dt,
      a.device());
  if (out.numel())
    be(out).where(odesc(out), bdesc(cond, shape), bdesc(ac, shape), bdesc(bc, shape));
  if (isFloatingType(dt) && autograd::shouldRecord({&a, &b})) {
    std::vector<std::int64_t> as = a.sizes().vec(), bs = b.sizes().vec();
    auto fn = std::make_shared<LambdaNode>("WhereBackward0", [as, bs](const std::vector<Tensor> &g, LambdaNode &n) {
      Tensor c = n.get(0);
      Tensor z = zeros_like(g[0]);
      Tensor ga = n.next[0].valid() ? sumTo(tt::where(c, g[0], z), as) : Tensor();
      Tensor gb = n.next[1].valid() ? sumTo(tt::where(c, z, g[0]), bs) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
    fn->saved.emplace_back(cond, false);
    autograd::setHistory({out}, fn, {&a, &b});
  }
  if (trace::on())
    trace::op("where", {&cond, &a, &b}, out);
  return out;
}
Tensor where(const Tensor &cond, const Scalar &a, const Tensor &b, SourceLocation loc) {
  Tensor at = scalar_tensor(a, TensorOptions(b.device()).dtype(isFloatingType(b.dtype()) ? b.dtype() : a.type()));
  return where(cond, at, b, loc);
}
Tensor where(const Tensor &cond, const Tensor &a, const Scalar &b, SourceLocation loc) {
  Tensor bt = scalar_tensor(b, TensorOptions(a.device()).dtype(isFloatingType(a.dtype()) ? a.dtype() : b.type()));
  return where(cond, a, bt, loc);
}
Tensor where(const Tensor &cond, const Scalar &a, const Scalar &b, SourceLocation loc) {
  ScalarType dt = a.isFloatingPoint() || b.isFloatingPoint() ? kFloat : promoteTypes(a.type(), b.type());
  return where(cond, scalar_tensor(a, TensorOptions(cond.device()).dtype(dt)),
               scalar_tensor(b, TensorOptions(cond.device()).dtype(dt)), loc);
}

Tensor Tensor::sum(std::optional<ScalarType> dt, SourceLocation loc) const {
  trace::Scope scope("sum", loc);
  return sumImpl(*this, {}, false, dt, false, "sum");
}
Tensor Tensor::sum(IntArrayRef dims, bool keepdim, std::optional<ScalarType> dt, SourceLocation loc) const {
  trace::Scope scope("sum", loc);
  return sumImpl(*this, dims, keepdim, dt, false, "sum");
}
Tensor Tensor::mean(std::optional<ScalarType> dt, SourceLocation loc) const {
  trace::Scope scope("mean", loc);
  return sumImpl(*this, {}, false, dt, true, "mean");
}
Tensor Tensor::mean(IntArrayRef dims, bool keepdim, std::optional<ScalarType> dt, SourceLocation loc) const {
  trace::Scope scope("mean", loc);
  return sumImpl(*this, dims, keepdim, dt, true, "mean");
}
Tensor Tensor::max(SourceLocation loc) const {
  trace::Scope scope("max", loc);
  return maxAll(*this, true);
}
Tensor Tensor::min(SourceLocation loc) const {
  trace::Scope scope("min", loc);
  return maxAll(*this, false);
}
std::tuple<Tensor, Tensor> Tensor::max(std::int64_t d, bool keepdim, SourceLocation loc) const {
  trace::Scope scope("max", loc);
  return maxDim(*this, d, keepdim, true);
}
std::tuple<Tensor, Tensor> Tensor::min(std::int64_t d, bool keepdim, SourceLocation loc) const {
  trace::Scope scope("min", loc);
  return maxDim(*this, d, keepdim, false);
}
Tensor Tensor::argmax(std::optional<std::int64_t> d, bool keepdim, SourceLocation loc) const {
  trace::Scope scope("argmax", loc);
  return argImpl(*this, d, keepdim, true);
}
Tensor Tensor::argmin(std::optional<std::int64_t> d, bool keepdim, SourceLocation loc) const {
  trace::Scope scope("argmin", loc);
  return argImpl(*this, d, keepdim, false);
}

namespace {
// A two-tensor op run under a trace scope, with its op event.
template <typename F>
Tensor tracedPair(const char *name, const Tensor &a, const Tensor &b, SourceLocation loc, F impl) {
  trace::Scope scope(name, loc);
  Tensor out = impl(a, b);
  if (trace::on())
    trace::op(name, {&a, &b}, out);
  return out;
}
} // namespace

Tensor Tensor::matmul(const Tensor &other, SourceLocation loc) const {
  return tracedPair("matmul", *this, other, loc, matmulImpl);
}
Tensor Tensor::mm(const Tensor &other, SourceLocation loc) const { return tracedPair("mm", *this, other, loc, mmImpl); }
Tensor Tensor::bmm(const Tensor &other, SourceLocation loc) const {
  return tracedPair("bmm", *this, other, loc, bmmImpl);
}

bool Tensor::allclose(const Tensor &other, double rtol, double atol, bool equal_nan) const {
  trace::Scope scope("allclose", SourceLocation{});
  NoGradGuard ng;
  if (dtype() != other.dtype())
    fail(std::string(tt::toString(dtype())) + " did not match " + tt::toString(other.dtype()));
  std::vector<std::int64_t> shape = broadcastShapes(sizes(), other.sizes());
  (void)shape;
  Tensor a = to(kDouble).cpu(), b = other.to(kDouble).cpu();
  Tensor ae = a.expand(shape).contiguous(), bexp = b.expand(shape).contiguous();
  const double *pa = ae.data_ptr<double>(), *pb = bexp.data_ptr<double>();
  for (std::int64_t i = 0, n = ae.numel(); i < n; ++i) {
    double x = pa[i], y = pb[i];
    if (std::isnan(x) || std::isnan(y)) {
      if (!(equal_nan && std::isnan(x) && std::isnan(y)))
        return false;
      continue;
    }
    if (x == y)
      continue;
    if (!(std::fabs(x - y) <= atol + rtol * std::fabs(y)))
      return false;
  }
  return true;
}

bool Tensor::equal(const Tensor &other) const {
  trace::Scope scope("equal", SourceLocation{});
  NoGradGuard ng;
  checkSameDevice(*this, other);
  if (!sizes().equals(other.sizes()))
    return false;
  if (numel() == 0)
    return true;
  return eq(other).to(kLong).sum().item<std::int64_t>() == numel();
}

Tensor &Tensor::operator+=(detail::LocatedTensor o) const { return add_(o.t, 1, o.loc); }
Tensor &Tensor::operator+=(detail::LocatedScalar o) const { return add_(o.s, 1, o.loc); }
Tensor &Tensor::operator-=(detail::LocatedTensor o) const { return sub_(o.t, 1, o.loc); }
Tensor &Tensor::operator-=(detail::LocatedScalar o) const { return sub_(o.s, 1, o.loc); }
Tensor &Tensor::operator*=(detail::LocatedTensor o) const { return mul_(o.t, o.loc); }
Tensor &Tensor::operator*=(detail::LocatedScalar o) const { return mul_(o.s, o.loc); }
Tensor &Tensor::operator/=(detail::LocatedTensor o) const { return div_(o.t, o.loc); }
Tensor &Tensor::operator/=(detail::LocatedScalar o) const { return div_(o.s, o.loc); }
Tensor Tensor::operator-() const { return neg(SourceLocation{}); }

// --- operators -------------------------------------------------------------------------------------
// Binary operators take the caller's location through their right operand.
Tensor operator+(const Tensor &a, detail::LocatedTensor b) { return a.add(b.t, 1, b.loc); }
Tensor operator+(const Tensor &a, detail::LocatedScalar b) { return a.add(b.s, 1, b.loc); }
Tensor operator+(const Scalar &a, detail::LocatedTensor b) { return b.t.add(a, 1, b.loc); }
Tensor operator-(const Tensor &a, detail::LocatedTensor b) { return a.sub(b.t, 1, b.loc); }
Tensor operator-(const Tensor &a, detail::LocatedScalar b) { return a.sub(b.s, 1, b.loc); }
Tensor operator-(const Scalar &a, detail::LocatedTensor b) {
  trace::Scope scope("sub", b.loc); // rsub
  return b.t.neg().add(a);
}
Tensor operator*(const Tensor &a, detail::LocatedTensor b) { return a.mul(b.t, b.loc); }
Tensor operator*(const Tensor &a, detail::LocatedScalar b) { return a.mul(b.s, b.loc); }
Tensor operator*(const Scalar &a, detail::LocatedTensor b) { return b.t.mul(a, b.loc); }
Tensor operator/(const Tensor &a, detail::LocatedTensor b) { return a.div(b.t, b.loc); }
Tensor operator/(const Tensor &a, detail::LocatedScalar b) { return a.div(b.s, b.loc); }
Tensor operator/(const Scalar &a, detail::LocatedTensor b) {
  trace::Scope scope("div", b.loc); // rdiv
  ScalarType dt = binaryResultType(BinaryOp::Div, scalarOperand(a, b.t), Operand{b.t, false});
  return full_like(b.t, a, dt).div(b.t);
}
Tensor operator==(const Tensor &a, const Tensor &b) { return a.eq(b, SourceLocation{}); }
Tensor operator==(const Tensor &a, const Scalar &b) { return a.eq(b, SourceLocation{}); }
Tensor operator!=(const Tensor &a, const Tensor &b) { return a.ne(b, SourceLocation{}); }
Tensor operator!=(const Tensor &a, const Scalar &b) { return a.ne(b, SourceLocation{}); }
Tensor operator<(const Tensor &a, const Tensor &b) { return a.lt(b, SourceLocation{}); }
Tensor operator<(const Tensor &a, const Scalar &b) { return a.lt(b, SourceLocation{}); }
Tensor operator<=(const Tensor &a, const Tensor &b) { return a.le(b, SourceLocation{}); }
Tensor operator<=(const Tensor &a, const Scalar &b) { return a.le(b, SourceLocation{}); }
Tensor operator>(const Tensor &a, const Tensor &b) { return a.gt(b, SourceLocation{}); }
Tensor operator>(const Tensor &a, const Scalar &b) { return a.gt(b, SourceLocation{}); }
Tensor operator>=(const Tensor &a, const Tensor &b) { return a.ge(b, SourceLocation{}); }
Tensor operator>=(const Tensor &a, const Scalar &b) { return a.ge(b, SourceLocation{}); }

// --- free functions -------------------------------------------------------------------------------
Tensor add(const Tensor &a, const Tensor &b, const Scalar &alpha, SourceLocation loc) { return a.add(b, alpha, loc); }
Tensor sub(const Tensor &a, const Tensor &b, const Scalar &alpha, SourceLocation loc) { return a.sub(b, alpha, loc); }
Tensor mul(const Tensor &a, const Tensor &b, SourceLocation loc) { return a.mul(b, loc); }
Tensor div(const Tensor &a, const Tensor &b, SourceLocation loc) { return a.div(b, loc); }
Tensor pow(const Tensor &a, const Tensor &e, SourceLocation loc) { return a.pow(e, loc); }
Tensor pow(const Tensor &a, const Scalar &e, SourceLocation loc) { return a.pow(e, loc); }
Tensor neg(const Tensor &a, SourceLocation loc) { return a.neg(loc); }
Tensor abs(const Tensor &a, SourceLocation loc) { return a.abs(loc); }
Tensor exp(const Tensor &a, SourceLocation loc) { return a.exp(loc); }
Tensor log(const Tensor &a, SourceLocation loc) { return a.log(loc); }
Tensor sqrt(const Tensor &a, SourceLocation loc) { return a.sqrt(loc); }
Tensor relu(const Tensor &a, SourceLocation loc) { return a.relu(loc); }
Tensor sigmoid(const Tensor &a, SourceLocation loc) { return a.sigmoid(loc); }
Tensor tanh(const Tensor &a, SourceLocation loc) { return a.tanh(loc); }
Tensor clamp(const Tensor &a, const std::optional<Scalar> &mn, const std::optional<Scalar> &mx, SourceLocation loc) {
  return a.clamp(mn, mx, loc);
}
Tensor sum(const Tensor &a, SourceLocation loc) { return a.sum(std::nullopt, loc); }
Tensor sum(const Tensor &a, IntArrayRef dim, bool keepdim, SourceLocation loc) {
  return a.sum(dim, keepdim, std::nullopt, loc);
}
Tensor mean(const Tensor &a, SourceLocation loc) { return a.mean(std::nullopt, loc); }
Tensor mean(const Tensor &a, IntArrayRef dim, bool keepdim, SourceLocation loc) {
  return a.mean(dim, keepdim, std::nullopt, loc);
}
Tensor max(const Tensor &a, SourceLocation loc) { return a.max(loc); }
std::tuple<Tensor, Tensor> max(const Tensor &a, std::int64_t dim, bool keepdim, SourceLocation loc) {
  return a.max(dim, keepdim, loc);
}
Tensor min(const Tensor &a, SourceLocation loc) { return a.min(loc); }
std::tuple<Tensor, Tensor> min(const Tensor &a, std::int64_t dim, bool keepdim, SourceLocation loc) {
  return a.min(dim, keepdim, loc);
}
Tensor argmax(const Tensor &a, std::optional<std::int64_t> dim, bool keepdim, SourceLocation loc) {
  return a.argmax(dim, keepdim, loc);
}
Tensor argmin(const Tensor &a, std::optional<std::int64_t> dim, bool keepdim, SourceLocation loc) {
  return a.argmin(dim, keepdim, loc);
}
Tensor matmul(const Tensor &a, const Tensor &b, SourceLocation loc) { return a.matmul(b, loc); }
Tensor mm(const Tensor &a, const Tensor &b, SourceLocation loc) { return a.mm(b, loc); }
Tensor bmm(const Tensor &a, const Tensor &b, SourceLocation loc) { return a.bmm(b, loc); }
bool allclose(const Tensor &a, const Tensor &b, double rtol, double atol, bool equal_nan) {
  return a.allclose(b, rtol, atol, equal_nan);
}
bool equal(const Tensor &a, const Tensor &b) { return a.equal(b); }
ScalarType result_type(const Tensor &a, const Tensor &b) { return resultType({Operand{a, false}, Operand{b, false}}); }

Tensor cat(TensorList tensors, std::int64_t dim, SourceLocation loc) {
  trace::Scope scope("cat", loc);
  if (tensors.empty())
    fail("torch.cat(): expected a non-empty list of Tensors");
  // Legacy rule: 1-D empty tensors are skipped.
  const Tensor *ref = nullptr;
  for (const Tensor &t : tensors)
    if (!(t.dim() == 1 && t.numel() == 0)) {
      ref = &t;
      break;
    }
  if (!ref)
    return empty({0}, tensors[0].options());
  std::int64_t d = wrapDim(dim, ref->dim());
  ScalarType dt = ref->dtype();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor &t = tensors[i];
    if (t.dim() == 1 && t.numel() == 0)
      continue;
    dt = promoteTypes(dt, t.dtype());
    if (t.dim() != ref->dim())
      fail("Tensors must have same number of dimensions: got " + std::to_string(ref->dim()) + " and " +
           std::to_string(t.dim()));
    for (std::int64_t k = 0; k < t.dim(); ++k)
      if (k != d && t.size(k) != ref->size(k)) {
        std::ostringstream os;
        os << "Sizes of tensors must match except in dimension " << d << ". Expected size " << ref->size(k)
           << " but got size " << t.size(k) << " for tensor number " << i << " in the list.";
        fail(os.str());
      }
    total += t.size(d);
  }
  std::vector<std::int64_t> shape = ref->sizes().vec();
  shape[d] = total;
  Tensor out = makeContiguous(shape, dt, ref->device());
  std::int64_t off = 0;
  std::vector<std::int64_t> lens;
  for (const Tensor &t : tensors) {
    if (t.dim() == 1 && t.numel() == 0) {
      lens.push_back(-1);
      continue;
    }
    std::vector<std::int64_t> st = out.strides().vec(), sz = t.sizes().vec();
    Tensor dst = makeView(out, sz, st, off * out.stride(d));
    copyData(dst, t, CopyKind::Other);
    off += t.size(d);
    lens.push_back(t.size(d));
  }
  out.unsafeGetTensorImpl()->base.reset();
  bool rec = false;
  if (autograd::is_grad_mode())
    for (const Tensor &t : tensors)
      rec = rec || autograd::requiresGrad(t);
  if (rec && isFloatingType(dt)) {
    auto fn = std::make_shared<LambdaNode>("CatBackward0", [lens, d](const std::vector<Tensor> &g, LambdaNode &) {
      std::vector<Tensor> res;
      std::int64_t o = 0;
      for (auto l : lens) {
        if (l < 0) {
          res.emplace_back();
          continue;
        }
        res.push_back(g[0].narrow(d, o, l));
        o += l;
      }
      return res;
    });
    fn->next.clear();
    for (const Tensor &t : tensors)
      fn->next.push_back(autograd::gradientEdge(t));
    autograd::meta(out).grad_fn = fn;
  }
  if (trace::on())
    trace::opList("cat", tensors, out);
  return out;
}

Tensor stack(TensorList tensors, std::int64_t dim, SourceLocation loc) {
  trace::Scope scope("stack", loc);
  if (tensors.empty())
    fail("stack expects a non-empty TensorList");
  std::int64_t d = wrapDim(dim, tensors[0].dim() + 1);
  std::vector<Tensor> us;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].sizes().equals(tensors[0].sizes()))
      fail("stack expects each tensor to be equal size, but got " + shapeString(tensors[0].sizes()) +
           " at entry 0 and " + shapeString(tensors[i].sizes()) + " at entry " + std::to_string(i));
    us.push_back(tensors[i].unsqueeze(d));
  }
  return cat(us, d, loc);
}

} // namespace tt
