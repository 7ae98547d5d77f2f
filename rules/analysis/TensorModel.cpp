#include "analysis/TensorModel.h"

#include "analysis/AstHelpers.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "llvm/ADT/StringSwitch.h"

namespace clang::tidy::tensor {

TensorModel::TensorModel(llvm::StringRef TensorTypes) {
  llvm::SmallVector<llvm::StringRef, 4> Parts;
  TensorTypes.split(Parts, ';', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef P : Parts) {
    P = P.trim();
    if (P.consume_front("::"))
      ;
    if (!P.empty())
      Names.push_back(P.str());
  }
}

bool TensorModel::isTensorType(QualType T) const {
  if (T.isNull())
    return false;
  T = T.getNonReferenceType().getCanonicalType();
  const auto *RD = T->getAsCXXRecordDecl();
  if (!RD)
    return false;
  std::string QN = RD->getQualifiedNameAsString();
  for (const std::string &N : Names)
    if (QN == N)
      return true;
  return false;
}

bool TensorModel::isTensorExpr(const Expr *E) const { return E && isTensorType(E->getType()); }

const Expr *TensorModel::tensorOperand(const Expr *E) const {
  if (isTensorExpr(E))
    return E;
  const auto *CE = E ? dyn_cast<CXXConstructExpr>(E->IgnoreImplicit()) : nullptr;
  if (CE && CE->getNumArgs() >= 1 && !CE->isListInitialization() && isTensorExpr(CE->getArg(0)))
    return CE->getArg(0);
  return nullptr;
}

void TensorModel::tensorOperands(const Expr *Arg, llvm::SmallVectorImpl<const Expr *> &Out) const {
  if (const Expr *T = tensorOperand(Arg))
    return Out.push_back(T);
  for (const Expr *E : bracedElements(Arg))
    if (isTensorExpr(E))
      Out.push_back(E);
}

const Expr *TensorModel::selfOf(const CallExpr *Call) {
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call))
    return MC->getImplicitObjectArgument();
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call))
    return OC->getNumArgs() ? OC->getArg(0) : nullptr;
  return nullptr;
}

bool TensorModel::isFactoryCall(const Expr *E) {
  const auto *C = dyn_cast_or_null<CallExpr>(E ? E->IgnoreImplicit() : nullptr);
  const FunctionDecl *F = C ? C->getDirectCallee() : nullptr;
  if (!F || isa<CXXMethodDecl>(F) || !F->getIdentifier() || !isTensorApi(F))
    return false;
  const sem::OpInfo *Op = sem::lookup(F->getName());
  return F->getName() == "from_blob" || (Op && Op->storage == sem::Storage::Factory);
}

const sem::OpInfo *TensorModel::opOf(const CallExpr *Call) const {
  const auto *FD = Call->getDirectCallee();
  if (!FD || !FD->getIdentifier())
    return nullptr;
  const Expr *Self = selfOf(Call);
  if (!Self && Call->getNumArgs())
    Self = Call->getArg(0);
  bool ListFirst = FD->getNumParams() && isTensorListType(FD->getParamDecl(0)->getType());
  if (!isTensorExpr(Self) && !ListFirst)
    return nullptr;
  llvm::StringRef Name = rowName(Call, FD->getName());
  return sem::lookup(Name);
}

// Whether S (an index() argument) builds a TensorIndex from a tensor. Calls
// are not entered: `t.index({x.size(0) - 1})` is an integer index.
static bool buildsTensorIndex(const TensorModel &M, const Stmt *S) {
  if (!S || (isa<CallExpr>(S) && !isa<CXXConstructExpr>(S)))
    return false;
  if (const auto *CE = dyn_cast<CXXConstructExpr>(S)) {
    const CXXRecordDecl *RD = CE->getType()->getAsCXXRecordDecl();
    if (RD && RD->getName() == "TensorIndex" && CE->getNumArgs() >= 1)
      return M.tensorOperand(CE->getArg(0)->IgnoreImplicit()) != nullptr;
  }
  for (const Stmt *Child : S->children())
    if (buildsTensorIndex(M, Child))
      return true;
  return false;
}

// LibTorch's mean over dims saves its input for backward (MeanBackward1 in
// 1.13); the mean of all elements, and tt's mean, save nothing.
static bool isLibTorchMeanOverDims(const CallExpr *Call) {
  const FunctionDecl *FD = Call->getDirectCallee();
  if (!FD)
    return false;
  std::string Q = FD->getQualifiedNameAsString();
  unsigned First = isa<CXXMethodDecl>(FD) ? 0 : 1;
  return (llvm::StringRef(Q).starts_with("at::") || llvm::StringRef(Q).starts_with("torch::")) &&
         FD->getNumParams() > First &&
         llvm::StringRef(FD->getParamDecl(First)->getType().getAsString()).contains("ArrayRef");
}

llvm::StringRef TensorModel::rowName(const CallExpr *Call, llvm::StringRef Name) const {
  if (Name == "logsigmoid") // torch::nn::functional's spelling of the row
    return "log_sigmoid";
  if (Name == "mean" && isLibTorchMeanOverDims(Call))
    return "mean_dim";
  if (Name != "index")
    return Name;
  for (const Expr *A : Call->arguments())
    if (buildsTensorIndex(*this, A))
      return "index_tensor";
  return Name;
}

const Expr *TensorModel::viewRoot(const Expr *E) const {
  while (E) {
    E = stripHandle(E);
    const auto *Call = dyn_cast<CallExpr>(E);
    if (!Call)
      return E;
    const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call);
    if (OC && OC->getOperator() == OO_Subscript && isTensorExpr(OC->getArg(0))) {
      E = OC->getArg(0);
      continue;
    }
    const sem::OpInfo *Op = OC ? nullptr : opOf(Call);
    if (!Op || Op->storage != sem::Storage::View)
      return E;
    const Expr *Self = selfOf(Call);
    E = Self ? Self : Call->getArg(0);
  }
  return E;
}

// An options argument that says `inplace(true)`: the setter, or a constructor
// whose parameter is named `inplace` (ReLUFuncOptions(bool inplace)).
static bool saysInPlace(const Expr *E, const ASTContext &Ctx) {
  auto True = [&](const Expr *A) {
    bool V = false;
    return A && !isa<CXXDefaultArgExpr>(A) && A->EvaluateAsBooleanCondition(V, Ctx) && V;
  };
  E = E->IgnoreImplicit();
  if (const auto *FC = dyn_cast<CXXFunctionalCastExpr>(E)) // `ReLUFuncOptions(true)`
    E = FC->getSubExpr()->IgnoreImplicit();
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(E)) {
    const auto *MD = MC->getMethodDecl();
    if (MD && MD->getIdentifier() && MD->getName() == "inplace" && MC->getNumArgs() == 1)
      return True(MC->getArg(0));
    return saysInPlace(MC->getImplicitObjectArgument(), Ctx);
  }
  if (const auto *CE = dyn_cast<CXXConstructExpr>(E)) {
    const CXXConstructorDecl *CD = CE->getConstructor();
    for (unsigned I = 0; I < CE->getNumArgs() && I < CD->getNumParams(); ++I) {
      const ParmVarDecl *P = CD->getParamDecl(I);
      if (P->getIdentifier() && P->getName() == "inplace" ? True(CE->getArg(I))
                                                           : saysInPlace(CE->getArg(I), Ctx))
        return true;
    }
  }
  return false;
}

bool TensorModel::isInPlaceCall(const CallExpr *Call) {
  const auto *FD = Call->getDirectCallee();
  if (!FD || !FD->getIdentifier())
    return false;
  if (sem::isInPlaceName(FD->getName()))
    return true;
  const auto *NS = dyn_cast<NamespaceDecl>(FD->getDeclContext()->getRedeclContext());
  if (!NS || NS->getName() != "functional" || Call->getNumArgs() < 2)
    return false;
  for (unsigned I = 1; I < Call->getNumArgs(); ++I)
    if (saysInPlace(Call->getArg(I), FD->getASTContext()))
      return true;
  return false;
}

const Expr *TensorModel::inPlaceTarget(const Expr *E) const {
  E = E->IgnoreParenImpCasts();
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(E)) {
    if (OC->getNumArgs() != 2 || !isTensorExpr(OC->getArg(0)))
      return nullptr;
    switch (OC->getOperator()) {
    case OO_PlusEqual:
    case OO_MinusEqual:
    case OO_StarEqual:
    case OO_SlashEqual:
    case OO_PercentEqual:
    case OO_AmpEqual:
    case OO_PipeEqual:
    case OO_CaretEqual:
    case OO_LessLessEqual:
    case OO_GreaterGreaterEqual:
      return OC->getArg(0);
    case OO_Equal: {
      // Only assignment to a temporary writes data; `b = a` rebinds b, and
      // so does `v[0] = a` of a vector (its operator[] gives an lvalue).
      const Expr *L = OC->getArg(0)->IgnoreImplicit();
      if (isa<CallExpr>(L) && L->isPRValue())
        return OC->getArg(0);
      return nullptr;
    }
    default:
      return nullptr;
    }
  }
  const auto *Call = dyn_cast<CallExpr>(E);
  if (!Call || isa<CXXOperatorCallExpr>(Call))
    return nullptr;
  if (!isInPlaceCall(Call))
    return nullptr;
  const Expr *Self = selfOf(Call);
  if (!Self && !isa<CXXMemberCallExpr>(Call) && Call->getNumArgs())
    Self = Call->getArg(0);
  return isTensorExpr(Self) ? Self : nullptr;
}

bool TensorModel::isMetadataMethod(llvm::StringRef Name) {
  return llvm::StringSwitch<bool>(Name)
      .Cases("size", "sizes", "dim", "ndimension", "numel", "dtype", "scalar_type", true)
      .Cases("device", "options", "is_contiguous", "strides", "stride", "defined", true)
      .Cases("is_cuda", "is_cpu", "requires_grad", "element_size", "nbytes", "itemsize", true)
      .Cases("storage_offset", "layout", "get_device", "is_floating_point", "sym_sizes", true)
      .Cases("is_alias_of", "has_storage", "use_count", "is_leaf", "name", true)
      .Default(false);
}

namespace {
bool isPlainStruct(const CXXRecordDecl *RD) {
  return RD && RD->hasDefinition() && RD->isAggregate() && !RD->isLambda() &&
         !RD->isInStdNamespace();
}
} // namespace

bool TensorModel::isTensorStruct(QualType T) const {
  const auto *RD = T.getNonReferenceType()->getAsCXXRecordDecl();
  return isPlainStruct(RD) && llvm::any_of(RD->fields(), [&](const FieldDecl *F) {
           return isTensorType(F->getType());
         });
}

bool TensorModel::isTensorStructField(const ValueDecl *D) const {
  const auto *F = dyn_cast_or_null<FieldDecl>(D);
  return F && isTensorType(F->getType()) && isPlainStruct(dyn_cast<CXXRecordDecl>(F->getParent()));
}

bool TensorModel::isTensorVectorType(QualType T) const {
  const auto *TS = dyn_cast_or_null<ClassTemplateSpecializationDecl>(
      T.getNonReferenceType()->getAsCXXRecordDecl());
  if (!TS || !TS->isInStdNamespace() || !TS->getIdentifier() || TS->getName() != "vector")
    return false;
  const TemplateArgument &A = TS->getTemplateArgs()[0];
  return A.getKind() == TemplateArgument::Type && isTensorType(A.getAsType());
}

bool TensorModel::isTensorListType(QualType T) const {
  const auto *TS = dyn_cast_or_null<ClassTemplateSpecializationDecl>(
      T.getNonReferenceType()->getAsCXXRecordDecl());
  if (!TS || !TS->getIdentifier() || !llvm::is_contained({"ArrayRef", "IListRef"}, TS->getName()))
    return false;
  const TemplateArgument &A = TS->getTemplateArgs()[0];
  return A.getKind() == TemplateArgument::Type && isTensorType(A.getAsType());
}

bool TensorModel::isTensorBundle(QualType T) const {
  if (isTensorType(T) || isTensorStruct(T))
    return true;
  const auto *TS = dyn_cast_or_null<ClassTemplateSpecializationDecl>(T->getAsCXXRecordDecl());
  return TS && TS->isInStdNamespace() && TS->getIdentifier() &&
         llvm::is_contained({"pair", "tuple"}, TS->getName()) && mayHoldTensors(T);
}

bool TensorModel::mayHoldTensors(QualType T, unsigned Depth) const {
  T = T.getNonReferenceType();
  if (T->isPointerType())
    return true;
  if (isTensorType(T))
    return true;
  const auto *RD = T->getAsCXXRecordDecl();
  if (!RD || Depth > 3)
    return RD != nullptr;
  if (const auto *TS = dyn_cast<ClassTemplateSpecializationDecl>(RD)) {
    for (const TemplateArgument &A : TS->getTemplateArgs().asArray()) {
      ArrayRef<TemplateArgument> Args =
          A.getKind() == TemplateArgument::Pack ? A.pack_elements() : ArrayRef(A);
      for (const TemplateArgument &E : Args)
        if (E.getKind() == TemplateArgument::Type && mayHoldTensors(E.getAsType(), Depth + 1))
          return true;
    }
    // A standard container holds only its elements (its own pointers do not
    // reach tensors): vector<double> holds none.
    if (TS->isInStdNamespace() && TS->getIdentifier() &&
        llvm::is_contained({"vector", "deque", "list", "map", "unordered_map", "set", "array",
                            "pair", "tuple", "optional", "basic_string"},
                           TS->getName()))
      return false;
  }
  if (!RD->hasDefinition())
    return true;
  for (const FieldDecl *Fd : RD->fields())
    if (mayHoldTensors(Fd->getType(), Depth + 1))
      return true;
  for (const CXXBaseSpecifier &B : RD->bases())
    if (mayHoldTensors(B.getType(), Depth + 1))
      return true;
  return false;
}

} // namespace clang::tidy::tensor
