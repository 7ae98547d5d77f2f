// AST helpers every analysis and check shares: which expression a handle
// value is, where a statement lives, and whose code a declaration is.
#pragma once

#include "clang/AST/ASTContext.h"
#include "clang/AST/Decl.h"
#include "clang/AST/Expr.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/StmtCXX.h"
#include "clang/Basic/SourceManager.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "tt/op_semantics.h"

namespace clang::tidy::tensor {

/// E without the nodes that do not change which handle it denotes: implicit
/// casts, parentheses, temporaries, functional casts, copy/move construction.
const Expr *stripHandle(const Expr *E);

/// The number a Scalar argument was built from (`Scalar(0.5)`,
/// `optional<Scalar>(255)`), without its conversions.
const Expr *scalarSource(const Expr *A);

/// The variable E names (through handle copies), or null.
const VarDecl *varOf(const Expr *E);

/// `Batch b{x, y}`: the braced initialiser of a local, non-reference
/// aggregate without bases (its inits follow the fields' order), or null.
const InitListExpr *aggregateInit(const VarDecl *V);

/// The initialiser aggregateInit(V) gives field F, or null.
const Expr *aggregateFieldInit(const VarDecl *V, const FieldDecl *F);

/// The elements of a braced list argument (`torch::cat({a, b})`: an ArrayRef
/// or vector built from an initializer_list); empty when E is not one.
llvm::SmallVector<const Expr *, 4> bracedElements(const Expr *E);

/// The member of *this that E names (`f` or `this->f`), else null.
const ValueDecl *ownMember(const Expr *E);

/// D's qualified name starts with Prefix ("torch::nn::").
bool inNamespacePath(const Decl *D, llvm::StringRef Prefix);

/// RD is torch::nn::Module or derives from it.
bool isModuleRecord(const CXXRecordDecl *RD);
// RD is torch::nn::Module itself or the Cloneable<T> base between it and a user module.
bool isTorchModuleBase(const CXXRecordDecl *RD);

/// A module value: an Impl or a holder (Linear, Sequential, AnyModule...).
bool isModuleHolderType(QualType T);

/// The user's module class a value of type T is or holds (a holder's Impl,
/// the record itself, through a pointer or shared_ptr); null for the library's.
const CXXRecordDecl *userModuleClass(QualType T);

/// F, a member of a module class, moves with its module (`to`, `cuda`): a
/// value of F registers it (register_module, register_parameter, register_buffer).
bool movesWithModule(const FieldDecl *F);

/// `m(x)`: the call operator of a module value.
bool isModuleCall(const CallExpr *Call);
/// The user's `forward` a holder's `m(x)` runs (`Dec` of `TORCH_MODULE(Dec)`
/// holds a `DecImpl`): its only forward taking that many arguments; null for
/// library modules, templates and overloads it cannot tell apart.
const CXXMethodDecl *holderForward(const CallExpr *Call);
/// The body Call runs that the analyses may read: readableCallee of its
/// callee, or of the forward a holder's `m(x)` runs.
const FunctionDecl *readableBodyOf(const CallExpr *Call);
/// {L, R} of `L = R` (built-in or overloaded `=`); {null, null} for any other S.
std::pair<const Expr *, const Expr *> assignmentSides(const Stmt *S);

/// The module value E names, through a holder's `->` and `*`: `m` of `m->`.
const Expr *moduleValue(const Expr *E);

/// The module value a module call runs (`m(x)`, `m->forward(x)`,
/// `m.forward(x)`); null for other calls.
const Expr *calledModule(const CallExpr *Call);

/// A torch::nn library module's name without "Impl" ("Linear" for both
/// torch::nn::Linear and LinearImpl); "" for any other type.
llvm::StringRef libraryModuleName(QualType T);

/// The TT_MODULE row (tt/ops.def) of a torch::nn library module type: its
/// weights, what it saves, its output's layout. Null for any other type.
const ::tt::semantics::ModuleInfo *libraryModule(QualType T);

/// `forward` (or the call operator) of a class derived from
/// `torch::nn::Module`: it writes the module's own state (parameters,
/// buffers such as BatchNorm's running statistics) and its arguments, nothing
/// the module cannot reach (Note [Opaque calls] in docs/design.md).
bool isModuleForward(const CXXMethodDecl *MD);

/// `F::apply(...)` of a custom autograd Function (`struct F :
/// torch::autograd::Function<F>`): F's static `forward` with its body in
/// this TU; null for any other call.
const CXXMethodDecl *customFunctionForward(const CallExpr *Call);

/// The variable a name denotes as a handle: a variable, or the holding
/// variable of a tuple-like structured binding (`auto [a, b] = f();`);
/// nullptr otherwise.
const VarDecl *handleVar(const ValueDecl *D);

/// `std::move(x)` / `std::forward<T>(x)`: the value is x's.
bool isStdMoveLike(const CallExpr *Call);

/// D is declared in one of these top-level namespaces (or nested in one).
bool isInNamespace(const Decl *D, llvm::ArrayRef<llvm::StringRef> Names);

/// Code of the tensor libraries themselves (namespaces tt, at, c10, torch, std):
/// their bodies implement the ops the table describes; never analysed.
bool isTensorLibraryCode(const Decl *D);
/// D is the C++ standard library's: `std`, or libstdc++'s `__gnu_cxx` (the
/// iterators of `std::vector`, which a range-for over one calls).
bool isStandardLibrary(const Decl *D);

/// The one body a direct call to FD runs, when the TU has it: FD's
/// definition, outside the tensor libraries, and not a virtual method an
/// override may replace (unless final). Null otherwise.
const FunctionDecl *readableCallee(const FunctionDecl *FD);

/// An op of the tensor libraries' API (namespaces tt, at, torch), whose
/// semantics the op table gives by name.
bool isTensorApi(const FunctionDecl *FD);
/// S is a tensor's `detach()` or `data()`: what is read through it carries no graph.
bool isDetachCall(const Stmt *S);
/// A setter of a torch options struct (TORCH_ARG: `CrossEntropyFuncOptions().weight(w)`): it
/// keeps the handle it is given and reads the data only when the options are used.
bool isOptionsSetter(const FunctionDecl *FD);

/// The op of the table a tensor operator stands for: `a + b` is add, `a > b`
/// gt, `a += b` add_, `m | n` bitwise_or; "" for other operators.
llvm::StringRef operatorOpName(const CXXOperatorCallExpr *OC);

/// An operator that computes a new value from its operands by an out-of-place
/// op (`a + b`, `-a`, `~m`, `a < b`, `m & n`); not `*it`, `=`, `+=`, `[]`.
bool isComputingOperator(const CXXOperatorCallExpr *OC);

/// The function or lambda call operator whose body contains S (null if none).
const FunctionDecl *enclosingFunction(const Stmt *S, ASTContext &Ctx);
// The first parent of S when it is a statement, else null.
const Stmt *parentStmt(const Stmt *S, ASTContext &Ctx);

/// The lambda whose body S is in (the lambda of the function around S), or null.
const LambdaExpr *lambdaAround(const Stmt *S, ASTContext &Ctx);

/// S is in code instantiated from a template: a fix-it there would edit the
/// template for every instantiation (the pattern itself is checked too).
bool inTemplateInstantiation(const Stmt *S, ASTContext &Ctx);

/// The variable the value E initialises, looking through implicit nodes
/// (null when E is not an initialiser).
const VarDecl *initialisedVar(const Expr *E, ASTContext &Ctx);

/// V is never the target of an assignment in Body: its initializer is its value.
bool neverAssigned(const VarDecl *V, const Stmt *Body);

/// A tensor with this name holds integer data whatever its type says (ids,
/// labels, counts, actions...): where the code does not show its dtype, it is
/// not taken as float32.
bool namesIntegerData(llvm::StringRef Name);

/// A factory whose result has rank >= 1 whatever its arguments (`arange`,
/// `linspace`, `eye`, `randperm`): never a 0-dim tensor.
bool factoryAlwaysRanked(llvm::StringRef Name);

/// Locals that hold their initializer for life: a local variable, not
/// static, not a reference, initialised and never assigned in its function
/// (a method call on it may still change what it refers to). Memoised per
/// variable, since each answer walks the whole function body.
class FixedLocals {
public:
  /// V's initializer when V is such a local; else null.
  const Expr *initializerOf(const VarDecl *V);

private:
  llvm::DenseMap<const VarDecl *, const Expr *> Memo;
};

/// The `return` statements of a body, not those of lambdas in it.
void collectReturns(const Stmt *S, llvm::SmallVectorImpl<const ReturnStmt *> &Out);

/// A for, range-for, while or do loop.
bool isLoop(const Stmt *S);

/// A default-constructed value (`torch::Tensor mask;`, `torch::Tensor()`):
/// for a tensor, an undefined handle.
bool isDefaultConstructed(const Expr *E);

/// The body of a for, range-for, while or do loop.
const Stmt *loopBody(const Stmt *Loop);

/// The text of a statement from Begin to its final `;` at Semi, with its
/// whole line when it stands alone on it (for a fix-it that removes it).
CharSourceRange wholeLines(SourceLocation Begin, SourceLocation Semi, const SourceManager &SM);

/// Every value F's class gives F: its in-class initializer, its
/// constructors' written initializers, and `F = v` in its methods (not its
/// copy and move constructors and assignments: a copy keeps what F holds).
llvm::SmallVector<const Expr *, 4> valuesOfField(const FieldDecl *F);

/// A torch::Device or TensorOptions type: a device argument (`to(device)`).
bool isDeviceLikeType(QualType T);

} // namespace clang::tidy::tensor
