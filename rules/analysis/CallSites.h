// Where the main file calls each function: the call sites of a function and
// the functions they are in, for facts that hold at a function's entry
// because they hold at every call (grad mode off: AnalysisManager).
#pragma once

#include "clang/AST/ASTContext.h"
#include "clang/AST/DeclCXX.h"
#include "clang/AST/Expr.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <vector>

namespace clang::tidy::tensor {

class CallSites {
public:
  struct Site {
    const CallExpr *Call;
    const FunctionDecl *Caller; // the function or lambda call operator it is in
  };
  struct Construction {
    const CXXConstructExpr *Construct;
    const FunctionDecl *Caller;
  };

  /// Indexes the declarations written in the main file (header code calling
  /// a user's function is rare, and indexing it would walk all of LibTorch).
  explicit CallSites(ASTContext &Ctx);

  /// Every call of FD in the main file; none when FD may also be called
  /// where the index cannot see: it is virtual, or used other than by a
  /// direct call (its address taken, passed as a callback).
  std::optional<llvm::ArrayRef<Site>> of(const FunctionDecl *FD) const;

  /// Every call in the main file of a function or method with one of Names.
  std::vector<Site> named(llvm::ArrayRef<llvm::StringRef> Names) const;

  /// Every construction the main file writes through Ctor (`Agent a(cfg,
  /// device)`, `Agent(cfg, kCPU)`); not one a library template makes for it
  /// (`make_unique<Agent>(...)`, a ModuleHolder).
  llvm::ArrayRef<Construction> constructionsOf(const CXXConstructorDecl *Ctor) const {
    auto It = Constructions.find(Ctor->getCanonicalDecl());
    return It == Constructions.end() ? llvm::ArrayRef<Construction>() : It->second;
  }
  /// The main file writes RD's type somewhere (a variable, a template
  /// argument, a qualifier): RD may be constructed there, perhaps where
  /// constructionsOf does not see it.
  bool namesRecord(const CXXRecordDecl *RD) const {
    return NamedRecords.contains(RD->getCanonicalDecl());
  }

  /// Appends to Out every value the main file gives field F of any object
  /// (`s.F = v`, `S{v, ...}`) when F's class is written there; false when F
  /// may also change out of sight (bound to a non-const reference, its
  /// address taken).
  bool addFieldWrites(const FieldDecl *F, llvm::SmallVectorImpl<const Expr *> &Out) const;

private:
  llvm::DenseMap<const FunctionDecl *, llvm::SmallVector<Site, 2>> Calls;
  llvm::DenseMap<const CXXConstructorDecl *, llvm::SmallVector<Construction, 1>> Constructions;
  llvm::DenseSet<const FunctionDecl *> Escaped;
  llvm::DenseMap<const FieldDecl *, llvm::SmallVector<const Expr *, 2>> FieldValues;
  llvm::DenseSet<const FieldDecl *> FieldsEscaped;
  llvm::DenseSet<const CXXRecordDecl *> NamedRecords;
  friend class CallSiteIndexer;
};

} // namespace clang::tidy::tensor
