// The tensor model: which types are tensor handles, and what a call on one does
// to storage (from the runtime's op table, tt/ops.def).
#pragma once

#include "tt/op_semantics.h"
#include "clang/AST/Expr.h"
#include "clang/AST/Type.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <string>

namespace clang::tidy::tensor {

namespace sem = ::tt::semantics;

class TensorModel {
public:
  // Fully qualified type names, e.g. "::tt::Tensor;::at::Tensor".
  explicit TensorModel(llvm::StringRef TensorTypes);

  static constexpr llvm::StringLiteral DefaultTensorTypes = "::tt::Tensor;::at::Tensor";

  // True for a tensor handle type (also through references, cv and sugar).
  bool isTensorType(QualType T) const;
  bool isTensorExpr(const Expr *E) const;
  // The tensor an operand passes: E itself, or the tensor a wrapper is
  // implicitly built from (tt's operators take `detail::LocatedTensor`);
  // nullptr when E is no tensor.
  const Expr *tensorOperand(const Expr *E) const;
  // The tensors an argument passes: its tensorOperand, or the tensor
  // elements of a braced list (`torch::cat({a, b})`).
  void tensorOperands(const Expr *Arg, llvm::SmallVectorImpl<const Expr *> &Out) const;

  // The table row for a member call on a tensor (or a free function taking a
  // tensor or a tensor list first: `torch::cat({a, b})`), or nullptr when the
  // callee is not a tensor op we know.
  const sem::OpInfo *opOf(const CallExpr *Call) const;
  // A free function of the tensor API that makes a tensor from sizes or data:
  // a Factory row of the op table (`zeros`, `randn_like`, `tensor`...) or
  // `from_blob`, which wraps memory it is given.
  static bool isFactoryCall(const Expr *E);

  // The ops.def row name for a call of Name: "index_tensor" for index() with
  // a tensor index (advanced indexing copies; integers and slices are a view),
  // Name otherwise.
  llvm::StringRef rowName(const CallExpr *Call, llvm::StringRef Name) const;

  // The tensor a member call is made on (the implicit object), or nullptr.
  static const Expr *selfOf(const CallExpr *Call);

  llvm::ArrayRef<std::string> typeNames() const { return Names; }

  // A call that writes a tensor operand in place: a `*_` op (member or free),
  // or a `torch::nn::functional` op given `inplace(true)` options
  // (`F::dropout(a, F::DropoutFuncOptions().p(0.1).inplace(true))`,
  // `F::relu(x, F::ReLUFuncOptions(true))`), which writes its first argument.
  static bool isInPlaceCall(const CallExpr *Call);

  // The tensor expression an in-place write stores into, or nullptr when E is
  // not one: table InPlace rows, isInPlaceCall (the tensor first for a free
  // function), compound assignment operators, and assignment
  // to a temporary handle (`a[0] = x`, `a.index(...) = x`: LibTorch's
  // rvalue-qualified operator= copies into the storage).
  const Expr *inPlaceTarget(const Expr *E) const;

  // E without explicit view ops (`h[0]`, `h.select(...)`): the tensor whose
  // storage and version counter a write through E changes.
  const Expr *viewRoot(const Expr *E) const;

  // A value of type T may reach tensor storage (a tensor, a container or
  // class holding one, a pointer): c10::Device, TensorOptions, ints cannot.
  bool mayHoldTensors(QualType T, unsigned Depth = 0) const;

  // A plain struct (an aggregate of the user's, not a lambda) with a tensor
  // field: what a module method returns by value (`out.logits`). Its fields
  // come from one computation; the grad, layout and device facts read them so.
  bool isTensorStruct(QualType T) const;
  // A tensor field of such a struct.
  bool isTensorStructField(const ValueDecl *D) const;
  // What carries a computation's tensors out by value: a tensor, such a
  // struct, or a std::pair or std::tuple holding tensors.
  bool isTensorBundle(QualType T) const;
  // A list of tensors an op takes: `at::TensorList`, `at::ITensorListRef`.
  bool isTensorListType(QualType T) const;
  // `std::vector<Tensor>`, what user code collects tensors in.
  bool isTensorVectorType(QualType T) const;

  // Methods that read only metadata (shape, dtype, device, flags), never data.
  static bool isMetadataMethod(llvm::StringRef Name);

private:
  llvm::SmallVector<std::string, 4> Names;
};

} // namespace clang::tidy::tensor
