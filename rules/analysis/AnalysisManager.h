// The analyses of one translation unit, shared by every check of a run:
// the alias analysis (with its callee summaries) and, per function or lambda,
// the layout, loop and autograd analyses, each computed once on first use.
#pragma once

#include "analysis/AliasAnalysis.h"
#include "analysis/CallSites.h"
#include "analysis/DeviceFacts.h"
#include "analysis/FrozenParameters.h"
#include "analysis/GradFacts.h"
#include "analysis/LayoutAnalysis.h"
#include "analysis/LoopAnalysis.h"
#include "analysis/ModuleDevices.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <memory>

namespace clang::tidy::tensor {

class AnalysisManager {
public:
  AnalysisManager(const TensorModel &Model, ASTContext &Ctx);

  /// The instance for this TU and tensor types; checks release every
  /// instance in onEndOfTranslationUnit (release()).
  static AnalysisManager &get(const TensorModel &Model, ASTContext &Ctx);
  static void release();

  AliasAnalysis &alias() { return Alias; }
  /// The layout facts of the function or lambda enclosing S (null if none).
  const LayoutAnalysis *layoutAt(const Stmt *S);
  /// What the layout facts say a conversion call (`to`, `contiguous`) does.
  const ConversionQuery *conversionAt(const CallExpr *Call);
  /// Conv's result is pixel bytes scaled in place (Note [pixel bytes]): a
  /// conversion to a floating dtype (ConversionQuery::ToFloating) of them copies.
  bool convertsBytes(const CallExpr *Conv);
  /// The loop analysis of the function or lambda enclosing S (null if none).
  LoopAnalysis *loopsAt(const Stmt *S);
  /// The autograd facts of the function or lambda enclosing S (null if none).
  const GradFacts *gradAt(const Stmt *S);
  /// The device facts of the function or lambda enclosing S (null if none).
  DeviceFacts *devicesAt(const Stmt *S);
  /// What the autograd facts read off the TU's classes (layer methods,
  /// parameter and leaf fields), memoised for the whole TU.
  GradClassFacts &gradClasses() { return GradClasses; }
  /// Where the main file calls each function (built on first use).
  CallSites &calls();
  /// Where the user's module class RD computes (Note [module device]).
  DeviceKnown moduleDevice(const CXXRecordDecl *RD) { return Modules.of(RD, *this); }
  /// ModuleDevices::touchedOutside, indexed once per TU.
  bool moduleFieldTouchedOutside(const FieldDecl *F) { return Modules.touchedOutside(F, Ctx); }

private:
  /// The analysis of S's function in Slots, made by Make(FD) on first use.
  template <typename T, typename MakeFn>
  T *cachedFor(const Stmt *S, llvm::DenseMap<const FunctionDecl *, std::unique_ptr<T>> &Slots,
               MakeFn Make);

  const LayoutAnalysis *baseLayout(const FunctionDecl *FD);
  std::unique_ptr<LayoutAnalysis> makeLayout(const FunctionDecl *FD, ParamFacts Params);
  /// What every call passes FD's tensor parameters, where the calls agree
  /// (Note [call-site facts]).
  ParamFacts paramFacts(const FunctionDecl *FD);
  /// convertsBytes without its memo: Conv's result is divided by 255 (or 127.5) in place.
  bool scaledAsBytes(const CallExpr *Conv);
  std::optional<ParamFact> argumentFact(const CallSites::Site &S, const FunctionDecl *FD,
                                        unsigned I);
  /// FD is called in the main file, and only with grad mode off: under a
  /// no-grad guard at each call, or in a caller that is itself (two levels).
  bool gradOffAtEntry(const FunctionDecl *FD, unsigned Depth = 0);
  /// FD's tensor parameters (and plain structs of them) that every call in
  /// the main file with grad mode on (at least one) passes a value requiring
  /// grad: they require grad at entry.
  GradFacts::EntryFacts gradOfParams(const FunctionDecl *FD);
  /// FD's result requires grad when only its I-th parameter does: FD's
  /// autograd facts with that parameter a non-leaf (memoised; Unknown in a
  /// recursion).
  Tri calleeResultGrad(const FunctionDecl *FD, unsigned I);
  GradFacts::CalleeFn calleeGrads() {
    return [this](const FunctionDecl *FD, unsigned I) { return calleeResultGrad(FD, I); };
  }
  /// The call at S's I-th argument when it requires grad there; null when
  /// grad mode is off at S; none when it may not require grad.
  std::optional<const Expr *> gradArgument(const CallSites::Site &S, unsigned I);
  const FrozenParameters &frozen();

  const TensorModel &Model;
  ASTContext &Ctx;
  llvm::DenseSet<const FunctionDecl *> InLayout; // being analysed
  std::optional<CallSites> Calls;                // built on first use
  ModuleDevices Modules;
  std::optional<FrozenParameters> Frozen;        // built on first use
  llvm::DenseSet<const FunctionDecl *> InEntryQuery;
  llvm::DenseSet<const FunctionDecl *> InGrad; // autograd facts being computed
  llvm::DenseSet<const FunctionDecl *> InCalleeGrad; // calleeResultGrad's in progress
  llvm::DenseMap<std::pair<const FunctionDecl *, unsigned>, Tri> CalleeGrads;
  AliasAnalysis Alias;
  GradClassFacts GradClasses;
  LayoutClassFacts LayoutClasses;
  /// Layout facts: without callers' shapes (BaseLayouts, what callers
  /// import), with them where they say something (InContext); Layouts is
  /// what the checks see, one of the two.
  llvm::DenseMap<const FunctionDecl *, std::unique_ptr<LayoutAnalysis>> BaseLayouts, InContext;
  llvm::DenseMap<const FunctionDecl *, const LayoutAnalysis *> Layouts;
  llvm::DenseMap<const FunctionDecl *, std::unique_ptr<LoopAnalysis>> Loops;
  llvm::DenseMap<const FunctionDecl *, std::unique_ptr<GradFacts>> Grads;
  llvm::DenseMap<const FunctionDecl *, std::unique_ptr<DeviceFacts>> Devices;
  llvm::DenseMap<const CallExpr *, bool> BytesConversions; // convertsBytes' answers
};

} // namespace clang::tidy::tensor
