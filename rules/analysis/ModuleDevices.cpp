#include "analysis/ModuleDevices.h"

#include "analysis/AnalysisManager.h"
#include "analysis/AstHelpers.h"

#include "clang/AST/RecursiveASTVisitor.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace clang::tidy::tensor {

// Note [module device]
// `model->to(device)` moves what the module registered (parameters, buffers,
// submodules, and theirs), nothing else: in the forward of a module class, a
// registered submodule computes on the device its holder was moved to, while
// a tensor member made by a factory and never registered stays on the CPU.
// Real code moves the top-level model once, in main or a trainer; a class
// inherits that device from every module registering it. Where every move of
// a module holding the class (to, cuda, cpu) names CUDA, its instances
// compute on CUDA: one move to the host or to a device the code does not show
// leaves the class Unknown.

namespace {
// The user's module classes whose holders (or records) S makes or registers:
// `register_module("enc", Encoder(cfg))`, `Sequential(Block(d), Block(d))`.
void moduleClassesIn(const Stmt *S, llvm::SmallPtrSetImpl<const CXXRecordDecl *> &Out) {
  if (const auto *E = dyn_cast_or_null<Expr>(S))
    if (const CXXRecordDecl *RD = userModuleClass(E->getType()))
      Out.insert(RD);
  if (S)
    for (const Stmt *C : S->children())
      moduleClassesIn(C, Out);
}

// The fields a function names outside their own class (a derived class's
// method, a free function, another class's method).
class OutsideUses : public RecursiveASTVisitor<OutsideUses> {
public:
  explicit OutsideUses(llvm::DenseSet<const FieldDecl *> &Out) : Out(Out) {}
  bool TraverseFunctionDecl(FunctionDecl *D) { return within(D, &Base::TraverseFunctionDecl); }
  bool TraverseCXXMethodDecl(CXXMethodDecl *D) { return within(D, &Base::TraverseCXXMethodDecl); }
  bool TraverseCXXConstructorDecl(CXXConstructorDecl *D) {
    return within(D, &Base::TraverseCXXConstructorDecl);
  }
  bool VisitMemberExpr(MemberExpr *ME) {
    const auto *F = dyn_cast<FieldDecl>(ME->getMemberDecl());
    const auto *M = dyn_cast_or_null<CXXMethodDecl>(Fn);
    if (F && Fn && (!M || M->getParent() != F->getParent()))
      Out.insert(F);
    return true;
  }

private:
  using Base = RecursiveASTVisitor<OutsideUses>;
  template <typename D> bool within(D *Decl, bool (Base::*Traverse)(D *)) {
    const FunctionDecl *Outer = Fn;
    Fn = Decl;
    bool R = (this->*Traverse)(Decl);
    Fn = Outer;
    return R;
  }
  llvm::DenseSet<const FieldDecl *> &Out;
  const FunctionDecl *Fn = nullptr;
};

// `model->to(torch::kHalf)`: a dtype move, which leaves the device.
bool movesDtypeOnly(const CXXMemberCallExpr *MC) {
  return MC->getMethodDecl()->getName() == "to" && MC->getNumArgs() &&
         !isDeviceLikeType(MC->getArg(0)->getType());
}
} // namespace

void ModuleDevices::index(AnalysisManager &AM) {
  Indexed = true;
  for (const CallSites::Site &S : AM.calls().named({"to", "cuda", "cpu"})) {
    const auto *MC = dyn_cast<CXXMemberCallExpr>(S.Call);
    const CXXRecordDecl *RD =
        MC ? userModuleClass(moduleValue(MC->getImplicitObjectArgument())->getType()) : nullptr;
    if (RD && !movesDtypeOnly(MC))
      Moves.push_back({RD, MC});
  }
}

bool ModuleDevices::holds(const CXXRecordDecl *Outer, const CXXRecordDecl *Inner,
                          unsigned Depth) const {
  if (Outer == Inner)
    return true;
  if (Depth > 8 || !Outer->hasDefinition())
    return false;
  llvm::SmallPtrSet<const CXXRecordDecl *, 4> Held;
  for (const FieldDecl *F : Outer->getDefinition()->fields())
    if (isModuleHolderType(F->getType()) && movesWithModule(F)) {
      if (const CXXRecordDecl *RD = userModuleClass(F->getType()))
        Held.insert(RD);
      for (const Expr *V : valuesOfField(F)) // a Sequential's modules
        moduleClassesIn(V, Held);
    }
  return llvm::any_of(Held, [&](const CXXRecordDecl *H) {
    return H != Outer && holds(H, Inner, Depth + 1);
  });
}

DeviceKnown ModuleDevices::of(const CXXRecordDecl *RD, AnalysisManager &AM) {
  RD = RD ? RD->getDefinition() : nullptr;
  if (!RD)
    return DeviceKnown::Unknown;
  if (auto It = Memo.find(RD); It != Memo.end())
    return It->second;
  Memo[RD] = DeviceKnown::Unknown; // a move whose device reads this class
  if (!Indexed)
    index(AM);
  std::optional<DeviceKnown> D;
  for (const auto &[Moved, Call] : Moves)
    if (holds(Moved, RD)) {
      DeviceFacts *Facts = AM.devicesAt(Call);
      DeviceKnown K = Facts ? Facts->deviceOfMove(Call) : DeviceKnown::Unknown;
      D = D ? meetDevices(*D, K) : K;
    }
  return Memo[RD] = D && onCuda(*D) ? *D : DeviceKnown::Unknown;
}

bool ModuleDevices::touchedOutside(const FieldDecl *F, ASTContext &Ctx) {
  const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent());
  if (RD && llvm::any_of(RD->methods(), [](const CXXMethodDecl *M) {
        return M->getIdentifier() && llvm::is_contained({"to", "cuda", "_apply"}, M->getName());
      }))
    return true;
  if (!Outside) {
    Outside.emplace();
    OutsideUses Visitor(*Outside);
    const SourceManager &SM = Ctx.getSourceManager();
    for (Decl *D : Ctx.getTranslationUnitDecl()->decls())
      if (SM.isWrittenInMainFile(SM.getFileLoc(D->getLocation())))
        Visitor.TraverseDecl(D);
  }
  return Outside->contains(F);
}

} // namespace clang::tidy::tensor
