// The autograd tape: grad_fn nodes with edges to their inputs' nodes, saved
// tensors with the version they were saved at, leaves' AccumulateGrad.
#pragma once

#include "internal.h"

#include <functional>
#include <string>
#include <vector>

namespace tt::autograd {

class FunctionNode;

struct Edge {
  std::shared_ptr<FunctionNode> fn;
  std::uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

struct AutogradMeta {
  bool requires_grad = false; // leaves only; non-leaves require grad through grad_fn
  std::shared_ptr<FunctionNode> grad_fn;
  std::uint32_t output_nr = 0;
  std::weak_ptr<FunctionNode> grad_accumulator;
  Tensor grad;
  bool retains_grad = false;
  // Views: the version counter's value when grad_fn was set. When the base
  // has been written since (through it or another view), the view's grad_fn
  // is regenerated from the base's history, as PyTorch does.
  static constexpr std::uint32_t kNotAView = 0xffffffffu;
  std::uint32_t attr_version = kNotAView;
};

// The bytes a saved tensor keeps, counted in savedBytes() while held.
class SavedBytes {
public:
  SavedBytes() = default;
  SavedBytes(const SavedBytes &o) { set(o.bytes_); }
  SavedBytes &operator=(const SavedBytes &o) {
    set(o.bytes_);
    return *this;
  }
  ~SavedBytes() { set(0); }
  void set(std::int64_t bytes);

private:
  std::int64_t bytes_ = 0;
};

// A tensor saved for backward: its data (no autograd link, so no cycle) and
// the version it had, checked when backward unpacks it.
class SavedVariable {
public:
  SavedVariable() = default;
  SavedVariable(const Tensor &t, bool is_output, const FunctionNode *producer = nullptr);
  Tensor unpack(const FunctionNode *owner) const;
  void reset() {
    data_ = Tensor();
    bytes_.set(0);
    released_ = true;
  }
  bool defined() const { return defined_; }
  // In-place ops re-point a saved output at the tensor they wrote.
  void rebase(const Tensor &t);

private:
  Tensor data_;
  std::uint32_t version_ = 0;
  bool defined_ = false;
  bool released_ = false;
  std::string grad_fn_name_; // "" for leaves
  std::uint32_t output_nr_ = 0;
  SavedBytes bytes_;
};

class FunctionNode : public Node {
public:
  FunctionNode();
  ~FunctionNode() override;
  std::vector<Edge> next;
  // Gradients w.r.t. the outputs -> gradients w.r.t. the inputs (one per edge).
  virtual std::vector<Tensor> apply(std::vector<Tensor> grads) = 0;
  virtual void release() {}
  virtual std::size_t num_outputs() const { return 1; }
  // Saved outputs, so an in-place op can re-point them at the written tensor.
  virtual void rebaseOutput(const Tensor &) {}
  bool released = false;
  // Non-leaf tensors that called retain_grad(): (tensor, output_nr).
  std::vector<std::pair<std::weak_ptr<TensorImpl>, std::uint32_t>> retained;
};

// Leaves: adds incoming gradients into .grad().
class AccumulateGrad : public FunctionNode {
public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> v) : variable(std::move(v)) {}
  std::string name() const override { return "torch::autograd::AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor> grads) override;
  std::shared_ptr<TensorImpl> variable;
};

// A node whose backward is a closure over saved variables.
class LambdaNode : public FunctionNode {
public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor> &grads, LambdaNode &self)>;
  LambdaNode(std::string name, Fn fn, std::size_t outputs = 1) : name_(std::move(name)), fn_(std::move(fn)), outputs_(outputs) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor> grads) override;
  void release() override {
    for (auto &s : saved) {
      held_tensors = held_tensors || s.defined();
      s.reset();
    }
    released = true;
  }
  std::size_t num_outputs() const override { return outputs_; }
  void rebaseOutput(const Tensor &t) override {
    for (std::size_t i : output_slots)
      saved[i].rebase(t);
  }
  // Unpacks saved[i], checking its version.
  Tensor get(std::size_t i) const { return saved[i].unpack(this); }
  std::vector<SavedVariable> saved;
  std::vector<std::size_t> output_slots; // which saved entries are outputs
  std::vector<std::vector<std::int64_t>> shapes; // input shapes etc.
  std::vector<ScalarType> dtypes;
  std::vector<Scalar> scalars;
  // Whether release() freed saved tensors: only such a node refuses a second
  // backward, as in PyTorch (a node that saved only sizes runs again).
  bool held_tensors = false;

private:
  std::string name_;
  Fn fn_;
  std::size_t outputs_;
};

bool is_grad_mode();
AutogradMeta &meta(const Tensor &t); // creates it
AutogradMeta *metaOrNull(const Tensor &t);
Edge gradientEdge(const Tensor &t);
bool requiresGrad(const Tensor &t);
// True when any input requires grad and grad mode is on.
bool shouldRecord(std::initializer_list<const Tensor *> inputs);
// Makes node the grad_fn of outs (output_nr 0..), with edges to the inputs.
void setHistory(const std::vector<Tensor> &outs, const std::shared_ptr<FunctionNode> &node,
                std::initializer_list<const Tensor *> inputs);
// The check PyTorch does before an in-place write on self.
void checkInplace(const Tensor &self);
// After an in-place op on self recorded as fn: fn becomes self's grad_fn,
// or, for a view, its base's (CopySlices) and self gets a view node of it.
void rebaseHistory(const Tensor &self, const std::shared_ptr<FunctionNode> &fn);
// Whether self's base chain ends at a leaf that requires grad.
bool isViewOfLeafRequiringGrad(const Tensor &self);
// A copy of t without autograd information sharing storage and version.
Tensor detachedAlias(const Tensor &t);

void runBackward(const Tensor &root, const Tensor &grad, bool retain_graph);

} // namespace tt::autograd
