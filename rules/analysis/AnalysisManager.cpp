#include "analysis/AnalysisManager.h"

#include "analysis/AstHelpers.h"

#include "llvm/ADT/StringExtras.h"

namespace clang::tidy::tensor {

AnalysisManager::AnalysisManager(const TensorModel &Model, ASTContext &Ctx)
    : Model(Model), Ctx(Ctx), Alias(Model, Ctx) {
  // `to(kFloat)` of a uint8 tensor copies: no alias (the defaults included).
  Alias.setCopiesOracle([this](const CallExpr *Call) {
    const LayoutAnalysis *L = layoutAt(Call);
    const ConversionQuery *Q = L ? L->conversionOf(Call) : nullptr;
    return Q && Q->Result == ConversionQuery::Copies;
  });
}

namespace {
struct Instance {
  ASTContext *Ctx = nullptr;
  std::string Types;
  std::unique_ptr<AnalysisManager> AM;
};
llvm::SmallVector<Instance, 2> &instances() {
  static llvm::SmallVector<Instance, 2> I;
  return I;
}
} // namespace

AnalysisManager &AnalysisManager::get(const TensorModel &Model, ASTContext &Ctx) {
  std::string Types = llvm::join(Model.typeNames(), ";");
  for (Instance &I : instances())
    if (I.Ctx == &Ctx && I.Types == Types)
      return *I.AM;
  instances().push_back({&Ctx, Types, std::make_unique<AnalysisManager>(Model, Ctx)});
  return *instances().back().AM;
}

void AnalysisManager::release() { instances().clear(); }

const LayoutAnalysis *AnalysisManager::layoutAt(const Stmt *S) {
  const FunctionDecl *FD = enclosingFunction(S, Ctx);
  if (!FD || !FD->hasBody())
    return nullptr;
  auto &Slot = Layouts[FD];
  if (!Slot) {
    Slot = std::make_unique<LayoutAnalysis>(Model, Ctx);
    Slot->run(FD);
  }
  return Slot.get();
}

// The per-function analysis of type T in Map, made on first use as T(Model, Ctx, FD).
template <class T>
static T *perFunction(llvm::DenseMap<const FunctionDecl *, std::unique_ptr<T>> &Map,
                      const TensorModel &Model, ASTContext &Ctx, const Stmt *S) {
  const FunctionDecl *FD = enclosingFunction(S, Ctx);
  if (!FD || !FD->hasBody())
    return nullptr;
  auto &Slot = Map[FD];
  if (!Slot)
    Slot = std::make_unique<T>(Model, Ctx, FD);
  return Slot.get();
}

LoopAnalysis *AnalysisManager::loopsAt(const Stmt *S) { return perFunction(Loops, Model, Ctx, S); }

DeviceFacts *AnalysisManager::devicesAt(const Stmt *S) {
  return perFunction(Devices, Model, Ctx, S);
}

} // namespace clang::tidy::tensor
