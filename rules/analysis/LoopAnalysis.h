// Loop-invariance analysis for one function (or lambda) body: which loop
// encloses a statement, what a loop writes (directly, through views and
// handle aliases, through non-const references, in place), whether an
// expression has the same value on every iteration, and whether a value made
// in an iteration escapes it. Conservative: when unsure, "varies"/"escapes".
#pragma once

#include "analysis/AstHelpers.h"
#include "analysis/TensorModel.h"

#include "clang/AST/ASTContext.h"
#include "clang/AST/Decl.h"
#include "clang/AST/Stmt.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <memory>

namespace clang::tidy::tensor {

class LoopAnalysis {
public:
  LoopAnalysis(const TensorModel &Model, ASTContext &Ctx, const FunctionDecl *FD);

  /// The innermost for/range-for/while/do whose body, condition or increment
  /// contains S, without leaving the enclosing function or lambda.
  static const Stmt *innermostLoop(const Stmt *S, ASTContext &Ctx);

  /// The loop whose every iteration runs S: innermostLoop, or, for S in the
  /// body of a lambda written in a loop and called or handed to a call there
  /// (an optimizer's closure: `opt.step(closure)`), that loop, in the
  /// function around the lambda. Its analysis is loopsAt(the loop).
  static const Stmt *loopRunning(const Stmt *S, ASTContext &Ctx);

  /// S is in a closure that Loop (from loopRunning(S)) runs, not in Loop's own function.
  static bool inClosure(const Stmt *S, const Stmt *Loop, ASTContext &Ctx);

  /// S runs on Loop's first iteration only: a branch taken when the loop's
  /// counter still holds its initial value (`for (int r = 0; ...)` with S in
  /// `r == 0 ? S : ...` or `if (r == 0) S`).
  static bool firstIterationOnly(const Stmt *S, const Stmt *Loop, ASTContext &Ctx);

  /// E has the same value on every iteration of Loop.
  bool isInvariant(const Expr *E, const Stmt *Loop, unsigned Depth = 0);

  /// V is declared inside Loop (its body, condition, increment or loop variable).
  bool isDeclaredIn(const VarDecl *V, const Stmt *Loop) const;

  struct Use {
    bool Escapes = false;    // returned, stored outside the iteration, captured, moved
    bool Written = false;    // written in place (or may be, by a call we cannot see)
    bool Reassigned = false; // the handle itself is rebound in the loop
  };
  /// How the value of V (declared in Loop) and its in-loop aliases are used in Loop.
  Use usesOf(const VarDecl *V, const Stmt *Loop);
  /// How a temporary tensor value E inside Loop is used: escape and in-place
  /// writes through the chain of ops applied to it.
  Use usesOfTemporary(const Expr *E, const Stmt *Loop);

  /// The data of the tensor E (a variable declared before Region, or a
  /// member of `this`) may change while Region's statements run: in place,
  /// through an alias, a non-const reference, or code we cannot see. The
  /// judgement isInvariant makes of a loop, for a stretch of statements.
  bool mayChangeIn(const Expr *E, llvm::ArrayRef<const Stmt *> Region);

  /// The variables E may share storage with (views, handle copies, may-alias ops).
  void basesOf(const Expr *E, llvm::SmallVectorImpl<const VarDecl *> &Out) const;

private:
  struct LoopFacts {
    llvm::DenseSet<const VarDecl *> Written;   // storage written (through any alias)
    llvm::DenseSet<const VarDecl *> Rebound;   // handles assigned another tensor
    llvm::DenseSet<const FieldDecl *> WrittenFields;
    bool Opaque = false;      // a call that may write storage we cannot see
    bool ThisMutated = false; // a non-const method of *this, or this passed out
    llvm::SmallPtrSet<const FunctionDecl *, 4> OwnMethodsRead; // collectOwnMethod's bodies
  };
  static constexpr unsigned kMaxOwnMethods = 16;
  bool collectOwnMethod(const CXXMethodDecl *MD, LoopFacts &F);
  bool transparentMethod(const CXXMethodDecl *MD);
  llvm::DenseMap<const FunctionDecl *, bool> Transparent; // transparentMethod's answers
  const LoopFacts &factsOf(const Stmt *Loop);
  void collect(const Stmt *S, LoopFacts &F);
  void collectCall(const CallExpr *C, LoopFacts &F);
  void collectMethodCall(const CXXMethodDecl *MD, const Expr *Obj, LoopFacts &F);
  void collectArgs(const CallExpr *C, const FunctionDecl *Callee, LoopFacts &F);
  void markWritten(const Expr *E, LoopFacts &F);
  bool classWritten(const VarDecl *V, const LoopFacts &F);
  bool isInvariantVar(const DeclRefExpr *D, const Stmt *Loop, const LoopFacts &F, unsigned Depth);
  bool isInvariantMember(const MemberExpr *ME, const Stmt *Loop, const LoopFacts &F,
                         unsigned Depth);
  bool isInvariantCall(const CallExpr *C, const Stmt *Loop, unsigned Depth);
  /// V, declared outside the code F describes, keeps its data there.
  bool keptOutside(const VarDecl *V, const LoopFacts &F);
  /// Field Fl may be written where F holds.
  bool fieldWritten(const FieldDecl *Fl, const LoopFacts &F) const;
  const VarDecl *root(const VarDecl *V);
  void unite(const VarDecl *A, const VarDecl *B);
  void callBasesOf(const CallExpr *C, llvm::SmallVectorImpl<const VarDecl *> &Out) const;
  /// Every `return` of the TU function F hands back newly allocated storage.
  bool returnsFresh(const FunctionDecl *F, unsigned Depth = 0) const;
  bool isFreshValue(const Expr *E, unsigned Depth) const;
  bool isFreshLocal(const VarDecl *V, unsigned Depth) const;
  bool rootsForeign(const Expr *E) const;
  bool isCallerTensor(const VarDecl *V) const;
  /// E's storage comes only from the caller's tensors.
  bool fromCallerTensors(const Expr *E) const;
  void useOfValue(const Expr *E, const Stmt *Loop, Use &U,
                  llvm::SmallVectorImpl<const VarDecl *> &Work);
  void useByVariable(const VarDecl *V, const Stmt *Loop, Use &U,
                     llvm::SmallVectorImpl<const VarDecl *> &Work);
  const Stmt *climbExpr(const Stmt *P, const Stmt *Cur, Use &U);
  const Stmt *climbCall(const CallExpr *C, const Expr *Cur, const Stmt *Loop, Use &U,
                        llvm::SmallVectorImpl<const VarDecl *> &Work);
  bool useAsArgument(const CallExpr *C, const FunctionDecl *Callee, const Expr *Cur, Use &U);
  /// A call of Callee may write (in place) the tensor passed as argument I:
  /// true unless its body is visible and only reads it.
  bool mayWriteArg(const FunctionDecl *Callee, unsigned I, unsigned Depth = 0) const;
  bool bodyWritesParam(const FunctionDecl *Def, unsigned I, unsigned Depth) const;
  struct ArgAliases;
  bool callWritesAlias(const CallExpr *C, ArgAliases &A, unsigned Depth) const;
  void trackRebinding(const CXXOperatorCallExpr *OC, ArgAliases &A) const;
  bool mayKeepArg(const FunctionDecl *Callee, unsigned I) const;
  bool bodyKeepsParam(const FunctionDecl *Def, unsigned I) const;
  bool namesAny(const Expr *E, const llvm::DenseSet<const VarDecl *> &Alias) const;

  const TensorModel &Model;
  ASTContext &Ctx;
  const FunctionDecl *FD;
  llvm::DenseMap<const VarDecl *, const VarDecl *> Parent;
  llvm::DenseSet<const VarDecl *> Foreign;       // by class root, after prepare
  llvm::DenseSet<const VarDecl *> ForeignVars;   // before roots are known
  llvm::DenseSet<const VarDecl *> CallerDerived; // handles made from the caller's tensors
  llvm::DenseSet<const VarDecl *> AddressTaken;
  llvm::DenseSet<const VarDecl *> HandedOver; // given to an object that may keep them
  void handOver(const Stmt *Init);
  // The lambdas capturing a variable by reference: they may write it wherever they run.
  llvm::DenseMap<const VarDecl *, llvm::SmallVector<const LambdaExpr *, 2>> RefCaptures;
  /// Whether V may change in Loop behind the analysis's back: its address is
  /// taken, or a lambda outside Loop (whose body the loop's facts do not
  /// cover) captures it by reference.
  bool pinnedIn(const VarDecl *V, const Stmt *Loop) const;
  /// Its address is taken or a lambda captures it by reference.
  bool pinned(const VarDecl *V) const;
  /// Local objects (not tensors) that code we cannot see may reach: passed to
  /// a call or constructor, or given tensors by a call that may keep them.
  llvm::DenseSet<const VarDecl *> ExposedObjects;
  void noteObjectUses(const CallExpr *C);
  /// V is a local object no opaque call can reach (Note [Opaque calls]).
  bool privateObject(const VarDecl *V) const;
  mutable llvm::DenseMap<const FunctionDecl *, bool> FreshReturns; // returnsFresh, per function
  // bodyKeepsParam's memo.
  mutable llvm::DenseMap<std::pair<const FunctionDecl *, unsigned>, bool> KeptParams;
  // mayWriteArg's answers, per (function, parameter).
  mutable llvm::DenseMap<std::pair<const FunctionDecl *, unsigned>, bool> WrittenParams;
  mutable FixedLocals Fixed; // isFreshLocal's locals, in any function it reads
  llvm::DenseMap<const Stmt *, std::unique_ptr<LoopFacts>> Loops;
};

} // namespace clang::tidy::tensor
