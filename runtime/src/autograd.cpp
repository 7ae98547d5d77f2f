// Autograd: grad mode, autograd meta, saved-variable version checks, the
// in-place checks, CopySlices for in-place writes through views, and the
// backward engine (topological order, gradient accumulation).
#include "autograd.h"

#include <unordered_map>

namespace tt {

namespace detail_views {
Tensor sumToShape(const Tensor &g, IntArrayRef shape);
}

namespace {
thread_local bool t_grad_mode = true;
}

bool is_grad_enabled() { return t_grad_mode; }
void set_grad_enabled(bool e) { t_grad_mode = e; }
NoGradGuard::NoGradGuard() : prev_(t_grad_mode) { t_grad_mode = false; }
NoGradGuard::~NoGradGuard() { t_grad_mode = prev_; }
AutoGradMode::AutoGradMode(bool enabled) : prev_(t_grad_mode) { t_grad_mode = enabled; }
AutoGradMode::~AutoGradMode() { t_grad_mode = prev_; }

namespace autograd {

bool is_grad_mode() { return t_grad_mode; }

void destroyMeta(AutogradMeta *m) { delete m; }

AutogradMeta &meta(const Tensor &t) {
  TensorImpl *impl = t.unsafeGetTensorImpl();
  if (!impl->autograd)
    impl->autograd = new AutogradMeta();
  return *impl->autograd;
}

AutogradMeta *metaOrNull(const Tensor &t) { return t.defined() ? t.unsafeGetTensorImpl()->autograd : nullptr; }

bool requiresGrad(const Tensor &t) {
  AutogradMeta *m = metaOrNull(t);
  return m && (m->requires_grad || m->grad_fn);
}

namespace {
// The grad_fn of view `self` as a strided view of its base's current history.
std::shared_ptr<FunctionNode> viewOfBaseNode(const Tensor &self, const Edge &baseEdge) {
  const TensorImpl *impl = self.unsafeGetTensorImpl();
  Tensor base(impl->base);
  std::vector<std::int64_t> bsz = base.sizes().vec(), bst = base.strides().vec();
  std::vector<std::int64_t> vsz = self.sizes().vec(), vst = self.strides().vec();
  std::int64_t voff = self.storage_offset() - base.storage_offset();
  auto viewFn = std::make_shared<LambdaNode>(
      "AsStridedBackward0", [bsz, bst, vsz, vst, voff](const std::vector<Tensor> &g, LambdaNode &) {
        Tensor z = makeTensor(bsz, bst, g[0].dtype(), g[0].device());
        backendOf(*z.unsafeGetTensorImpl()).fill(makeDesc(*z.unsafeGetTensorImpl()), {});
        copyData(makeView(z, vsz, vst, voff), g[0], CopyKind::Other);
        return std::vector<Tensor>{z};
      });
  viewFn->next.push_back(baseEdge);
  return viewFn;
}
} // namespace

Edge gradientEdge(const Tensor &t) {
  AutogradMeta *m = metaOrNull(t);
  if (!m)
    return {};
  if (m->grad_fn && m->attr_version != AutogradMeta::kNotAView) {
    const TensorImpl *impl = t.unsafeGetTensorImpl();
    std::uint32_t now = impl->version->version.load(std::memory_order_relaxed);
    if (now != m->attr_version && impl->base) {
      Edge be = gradientEdge(Tensor(impl->base));
      if (be.valid()) {
        m->grad_fn = viewOfBaseNode(t, be);
        m->output_nr = 0;
      }
      m->attr_version = now;
    }
  }
  if (m->grad_fn)
    return {m->grad_fn, m->output_nr};
  if (!m->requires_grad)
    return {};
  auto acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.getIntrusivePtr());
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

bool shouldRecord(std::initializer_list<const Tensor *> inputs) {
  if (!t_grad_mode)
    return false;
  for (const Tensor *t : inputs)
    if (t->defined() && requiresGrad(*t))
      return true;
  return false;
}

void setHistory(const std::vector<Tensor> &outs, const std::shared_ptr<FunctionNode> &node,
                std::initializer_list<const Tensor *> inputs) {
  node->next.clear();
  for (const Tensor *t : inputs)
    node->next.push_back(t->defined() ? gradientEdge(*t) : Edge{});
  std::uint32_t nr = 0;
  for (const Tensor &o : outs) {
    AutogradMeta &m = meta(o);
    m.grad_fn = node;
    m.output_nr = nr++;
    if (o.unsafeGetTensorImpl()->base)
      m.attr_version = o._version();
  }
}

bool isViewOfLeafRequiringGrad(const Tensor &self) {
  const TensorImpl *impl = self.unsafeGetTensorImpl();
  if (!impl->base)
    return false;
  AutogradMeta *bm = impl->base->autograd;
  return bm && bm->requires_grad && !bm->grad_fn;
}

void checkInplace(const Tensor &self) {
  if (!t_grad_mode)
    return;
  AutogradMeta *m = metaOrNull(self);
  if (m && m->requires_grad && !m->grad_fn)
    fail("a leaf Variable that requires grad is being used in an in-place operation.");
  if (isViewOfLeafRequiringGrad(self))
    fail("a view of a leaf Variable that requires grad is being used in an in-place operation.");
}

Tensor detachedAlias(const Tensor &t) {
  const TensorImpl &s = *t.unsafeGetTensorImpl();
  auto impl = std::make_shared<TensorImpl>(s.storage, s.sizes, s.strides, s.storage_offset, s.dtype, s.version);
  return Tensor(std::move(impl));
}

void rebaseHistory(const Tensor &self, const std::shared_ptr<FunctionNode> &fn) {
  TensorImpl *impl = self.unsafeGetTensorImpl();
  if (!impl->base) {
    AutogradMeta &m = meta(self);
    m.grad_fn = fn;
    m.output_nr = 0;
    return;
  }
  // A write through a view: the base's history becomes CopySlices(fn), and
  // the view becomes a strided view of the new base history.
  Tensor base(impl->base);
  std::vector<std::int64_t> bsz = base.sizes().vec(), bst = base.strides().vec();
  std::vector<std::int64_t> vsz = self.sizes().vec(), vst = self.strides().vec();
  std::int64_t voff = self.storage_offset() - base.storage_offset();
  std::weak_ptr<FunctionNode> weakFn = fn;
  std::shared_ptr<FunctionNode> inner = fn;
  auto cs = std::make_shared<LambdaNode>(
      "CopySlices", [inner, bsz, bst, vsz, vst, voff](const std::vector<Tensor> &g, LambdaNode &) {
        std::vector<Tensor> res(inner->next.size());
        if (!g[0].defined())
          return res;
        Tensor result = makeTensor(bsz, bst, g[0].dtype(), g[0].device());
        copyData(result, g[0], CopyKind::Other);
        Tensor slice = makeView(result, vsz, vst, voff);
        Tensor sliceCopy = makeContiguous(vsz, g[0].dtype(), g[0].device());
        copyData(sliceCopy, slice, CopyKind::Other);
        std::vector<Tensor> r = inner->apply({sliceCopy});
        if (!r.empty() && r[0].defined())
          copyData(slice, r[0], CopyKind::Other);
        else
          backendOf(*slice.unsafeGetTensorImpl()).fill(makeDesc(*slice.unsafeGetTensorImpl()), {});
        res[0] = result;
        for (std::size_t i = 1; i < r.size(); ++i)
          res[i] = r[i];
        return res;
      });
  cs->next.push_back(gradientEdge(base));
  for (std::size_t i = 1; i < fn->next.size(); ++i)
    cs->next.push_back(fn->next[i]);
  AutogradMeta &bm = meta(base);
  bm.grad_fn = cs;
  bm.output_nr = 0;
  AutogradMeta &m = meta(self);
  m.grad_fn = viewOfBaseNode(self, Edge{cs, 0});
  m.output_nr = 0;
  m.attr_version = self._version();
}

// --- live graph ----------------------------------------------------------------------------------
namespace {
std::atomic<std::int64_t> g_live_nodes{0}, g_saved_bytes{0};

std::int64_t bytesOf(const Tensor &t) {
  return t.defined() ? t.numel() * static_cast<std::int64_t>(elementSize(t.dtype())) : 0;
}
} // namespace

std::int64_t liveNodes() { return g_live_nodes.load(std::memory_order_relaxed); }
std::int64_t savedBytes() { return g_saved_bytes.load(std::memory_order_relaxed); }
FunctionNode::FunctionNode() { g_live_nodes.fetch_add(1, std::memory_order_relaxed); }
FunctionNode::~FunctionNode() { g_live_nodes.fetch_sub(1, std::memory_order_relaxed); }

void SavedBytes::set(std::int64_t bytes) {
  g_saved_bytes.fetch_add(bytes - bytes_, std::memory_order_relaxed);
  bytes_ = bytes;
}

// --- saved variables ---------------------------------------------------------------------------
SavedVariable::SavedVariable(const Tensor &t, bool is_output, const FunctionNode *producer) {
  if (!t.defined())
    return;
  defined_ = true;
  bytes_.set(bytesOf(t));
  version_ = t._version();
  if (is_output) {
    data_ = detachedAlias(t); // no grad_fn: no reference cycle through the node
    grad_fn_name_ = producer ? producer->name() : "";
    output_nr_ = 0;
  } else {
    data_ = t;
    output_nr_ = 0;
    AutogradMeta *m = metaOrNull(t);
    if (m && m->grad_fn) {
      grad_fn_name_ = "\x01"; // resolved at unpack time (the tensor's current grad_fn)
      output_nr_ = m->output_nr;
    }
  }
}

void SavedVariable::rebase(const Tensor &t) {
  data_ = detachedAlias(t);
  bytes_.set(bytesOf(t));
  version_ = t._version();
}

Tensor SavedVariable::unpack(const FunctionNode *) const {
  if (!defined_)
    return Tensor();
  if (released_)
    fail("Trying to backward through the graph a second time (or directly access saved tensors after they have "
         "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
         "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if "
         "you need to access saved tensors after calling backward.");
  std::uint32_t cur = data_._version();
  if (cur != version_) {
    std::string fnName = grad_fn_name_;
    std::uint32_t nr = output_nr_;
    if (fnName == "\x01") {
      AutogradMeta *m = metaOrNull(data_);
      fnName = m && m->grad_fn ? m->grad_fn->name() : "";
      nr = m ? m->output_nr : 0;
    }
    std::string msg = "one of the variables needed for gradient computation has been modified by an inplace "
                      "operation: [" +
                      typeString(data_) + " " + shapeString(data_.sizes()) + "]";
    if (!fnName.empty())
      msg += ", which is output " + std::to_string(nr) + " of " + fnName + ",";
    msg += " is at version " + std::to_string(cur) + "; expected version " + std::to_string(version_) +
           " instead. Hint: enable anomaly detection to find the operation that failed to compute its gradient, "
           "with torch.autograd.set_detect_anomaly(True).";
    if (trace::on())
      trace::error("autograd", msg);
    throw Error(msg);
  }
  if (trace::on())
    trace::savedRead(*data_.unsafeGetTensorImpl());
  return data_;
}

// --- nodes -------------------------------------------------------------------------------------
std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor> grads) {
  if (grads.empty() || !grads[0].defined())
    return {};
  Tensor g = grads[0];
  Tensor var(variable);
  AutogradMeta &m = meta(var);
  if (!g.sizes().equals(var.sizes()))
    g = detail_views::sumToShape(g, var.sizes());
  if (!m.grad.defined()) {
    // PyTorch's layout contract: a dense leaf's grad has the leaf's strides.
    Tensor fresh = makeTensor(g.sizes(), preservedStrides(*var.unsafeGetTensorImpl()), var.dtype(), var.device());
    copyData(fresh, g, CopyKind::Other);
    m.grad = fresh;
  } else {
    m.grad.add_(g);
  }
  return {};
}

std::vector<Tensor> LambdaNode::apply(std::vector<Tensor> grads) {
  if (released && held_tensors)
    fail("Trying to backward through the graph a second time (or directly access saved tensors after they have "
         "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
         "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if "
         "you need to access saved tensors after calling backward.");
  return fn_(grads, *this);
}

// --- engine ---------------------------------------------------------------------------------------
namespace {
// The node's data flow for tensor-tidy --verify: grads and saved tensors read,
// grads written (a leaf's accumulated .grad included).
void traceNode(FunctionNode &n, const std::vector<Tensor> &in, std::vector<Tensor> out,
               const std::vector<Tensor> &written) {
  out.insert(out.end(), written.begin(), written.end());
  if (auto *acc = dynamic_cast<AccumulateGrad *>(&n))
    out.push_back(meta(Tensor(acc->variable)).grad);
  trace::gradNode(n.name().c_str(), in, out);
}
} // namespace

void runBackward(const Tensor &root, const Tensor &grad, bool retain_graph) {
  Edge e = gradientEdge(root);
  if (!e.valid())
    fail("element 0 of tensors does not require grad and does not have a grad_fn");
  NoGradGuard ng;
  std::unordered_map<FunctionNode *, int> deps;
  std::vector<FunctionNode *> stack{e.fn.get()};
  deps[e.fn.get()] = 0;
  std::vector<std::shared_ptr<FunctionNode>> keepAlive{e.fn};
  while (!stack.empty()) {
    FunctionNode *n = stack.back();
    stack.pop_back();
    for (const Edge &x : n->next) {
      if (!x.valid())
        continue;
      auto it = deps.find(x.fn.get());
      if (it == deps.end()) {
        deps[x.fn.get()] = 1;
        stack.push_back(x.fn.get());
        keepAlive.push_back(x.fn);
      } else {
        ++it->second;
      }
    }
  }
  std::unordered_map<FunctionNode *, std::vector<Tensor>> buffers;
  auto addTo = [&](FunctionNode *n, std::uint32_t slot, const Tensor &g) {
    auto &buf = buffers[n];
    if (buf.size() < n->num_outputs())
      buf.resize(std::max<std::size_t>(n->num_outputs(), slot + 1));
    if (buf.size() <= slot)
      buf.resize(slot + 1);
    if (!buf[slot].defined()) {
      buf[slot] = g;
      return;
    }
    Tensor sum = buf[slot] + g;
    if (trace::on()) // two paths' gradients summed: the sum reads both
      trace::gradNode("InputBuffer::accumulate", {buf[slot], g}, {sum});
    buf[slot] = sum;
  };
  addTo(e.fn.get(), e.input_nr, grad);
  std::vector<FunctionNode *> ready{e.fn.get()};
  while (!ready.empty()) {
    FunctionNode *n = ready.back();
    ready.pop_back();
    std::vector<Tensor> in = std::move(buffers[n]);
    buffers.erase(n);
    if (in.size() < n->num_outputs())
      in.resize(n->num_outputs());
    std::vector<Tensor> written; // .grad tensors this node set, for the trace
    for (auto &[impl, nr] : n->retained)
      if (auto sp = impl.lock(); sp && nr < in.size() && in[nr].defined()) {
        AutogradMeta &m = meta(Tensor(sp));
        m.grad = m.grad.defined() ? m.grad + in[nr] : in[nr].clone();
        written.push_back(m.grad);
      }
    bool any = false;
    for (const Tensor &t : in)
      any = any || t.defined();
    std::vector<Tensor> out;
    if (any && trace::on())
      trace::beginNode(); // saved tensors a failed node unpacked are not this one's
    if (any)
      out = n->apply(in);
    if (any && trace::on())
      traceNode(*n, in, out, written);
    if (!retain_graph)
      n->release();
    for (std::size_t i = 0; i < n->next.size(); ++i) {
      const Edge &x = n->next[i];
      if (!x.valid())
        continue;
      if (i < out.size() && out[i].defined())
        addTo(x.fn.get(), x.input_nr, out[i]);
      if (--deps[x.fn.get()] == 0)
        ready.push_back(x.fn.get());
    }
  }
}

} // namespace autograd

// --- Tensor autograd methods --------------------------------------------------------------------
bool Tensor::requires_grad() const { return autograd::requiresGrad(*this); }

Tensor &Tensor::requires_grad_(bool r, SourceLocation loc) const {
  trace::Scope scope("requires_grad_", loc);
  autograd::AutogradMeta *m = autograd::metaOrNull(*this);
  if (m && m->grad_fn) {
    if (!r)
      fail("you can only change requires_grad flags of leaf variables. If you want to use a computed variable in a "
           "subgraph that doesn't require differentiation use var_no_grad = var.detach().");
    return const_cast<Tensor &>(*this);
  }
  if (r && !isFloatingType(dtype()))
    fail("only Tensors of floating point dtype can require gradients");
  autograd::meta(*this).requires_grad = r;
  return const_cast<Tensor &>(*this);
}

bool Tensor::is_leaf() const {
  autograd::AutogradMeta *m = autograd::metaOrNull(*this);
  return !m || !m->grad_fn;
}

namespace {
const Tensor &undefinedTensor() {
  static const Tensor t;
  return t;
}
} // namespace

const Tensor &Tensor::grad() const {
  autograd::AutogradMeta *m = autograd::metaOrNull(*this);
  return m ? m->grad : undefinedTensor();
}

Tensor &Tensor::mutable_grad() const { return autograd::meta(*this).grad; }

void Tensor::retain_grad() const {
  autograd::AutogradMeta *m = autograd::metaOrNull(*this);
  if (!m || (!m->grad_fn && !m->requires_grad))
    fail("can't retain_grad on Tensor that has requires_grad=False");
  if (!m->grad_fn || m->retains_grad)
    return;
  m->retains_grad = true;
  m->grad_fn->retained.emplace_back(getIntrusivePtr(), m->output_nr);
}

bool Tensor::retains_grad() const {
  autograd::AutogradMeta *m = autograd::metaOrNull(*this);
  return m && m->retains_grad;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  autograd::AutogradMeta *m = autograd::metaOrNull(*this);
  if (m && m->grad_fn)
    autograd::gradientEdge(*this); // a view written through its base regenerates its grad_fn
  return m ? m->grad_fn : nullptr;
}

std::int64_t Tensor::output_nr() const {
  autograd::AutogradMeta *m = autograd::metaOrNull(*this);
  return m ? m->output_nr : 0;
}

void Tensor::backward(const Tensor &gradient, std::optional<bool> retain_graph, bool create_graph,
                      SourceLocation loc) const {
  trace::Scope scope("backward", loc);
  if (create_graph)
    fail("tt: backward(create_graph=true) is not supported");
  if (!requires_grad())
    fail("element 0 of tensors does not require grad and does not have a grad_fn");
  Tensor g = gradient;
  if (!g.defined()) {
    if (numel() != 1)
      fail("grad can be implicitly created only for scalar outputs");
    g = ones_like(*this, TensorOptions().dtype(dtype()));
  } else if (!g.sizes().equals(sizes())) {
    fail("Mismatch in shape: grad_output[0] has a shape of " + shapeString(g.sizes()) +
         " and output[0] has a shape of " + shapeString(sizes()) + ".");
  }
  autograd::runBackward(*this, g, retain_graph.value_or(create_graph));
}

} // namespace tt
