#include "CopyNarrowingCheck.h"

#include "analysis/AstHelpers.h"

#include "clang/AST/ExprCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Lex/Lexer.h"
#include "llvm/ADT/StringSwitch.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

namespace {

enum class Kind { Floating, Integral, Bool, Other };

Kind kindOf(StringRef DT) {
  return llvm::StringSwitch<Kind>(DT)
      .Cases("Float", "Double", "Half", "BFloat16", Kind::Floating)
      .Cases("Long", "Int", "Short", "Char", "Byte", Kind::Integral)
      .Case("Bool", Kind::Bool)
      .Default(Kind::Other);
}

// PyTorch's name of a dtype, as its messages print it.
StringRef torchName(StringRef DT) {
  return llvm::StringSwitch<StringRef>(DT)
      .Case("Float", "float32")
      .Case("Double", "float64")
      .Case("Half", "float16")
      .Case("BFloat16", "bfloat16")
      .Case("Long", "int64")
      .Case("Int", "int32")
      .Case("Short", "int16")
      .Case("Char", "int8")
      .Case("Byte", "uint8")
      .Case("Bool", "bool")
      .Default(DT);
}

unsigned intBytes(StringRef DT) {
  return llvm::StringSwitch<unsigned>(DT)
      .Case("Long", 8)
      .Case("Int", 4)
      .Case("Short", 2)
      .Cases("Char", "Byte", 1)
      .Default(0);
}

// What is lost converting Src into Dst ("" when the conversion is exact or
// not one this check reports). float32 -> float16/bfloat16 is left out: it is
// how mixed-precision code fills its half-precision copies.
std::string loss(StringRef Src, StringRef Dst) {
  Kind S = kindOf(Src), D = kindOf(Dst);
  if (S == Kind::Floating && D == Kind::Floating)
    return Src == "Double" && Dst != "Double" ? "precision (and range) is lost" : "";
  if (S == Kind::Floating && D == Kind::Integral)
    return "fractions are truncated toward zero";
  if (S == Kind::Floating && D == Kind::Bool)
    return "every non-zero value becomes true";
  if (S == Kind::Integral && D == Kind::Bool)
    return "every non-zero value becomes true";
  if (S == Kind::Integral && D == Kind::Integral &&
      (intBytes(Dst) < intBytes(Src) || (Dst == "Byte" && Src != "Byte")))
    return "values out of range wrap around";
  return "";
}

// The tensor a view chain starts from (`buf` of `buf.narrow(0, i, n)[j]`):
// the destination named in the fix-it, the source whose name is read.
const Expr *baseOf(const Expr *E) {
  for (int I = 0; E && I < 8; ++I) {
    E = stripHandle(E);
    if (const auto *MC = dyn_cast<CXXMemberCallExpr>(E)) {
      E = MC->getImplicitObjectArgument();
      continue;
    }
    const auto *OC = dyn_cast<CXXOperatorCallExpr>(E);
    if (OC && OC->getOperator() == OO_Subscript && OC->getNumArgs() == 2) {
      E = OC->getArg(0);
      continue;
    }
    // `rois * scale`, `2 * x`: the tensor operand of scalar arithmetic.
    if (OC && OC->getNumArgs() == 2 &&
        llvm::is_contained({OO_Plus, OO_Minus, OO_Star, OO_Slash}, OC->getOperator())) {
      E = OC->getArg(OC->getArg(0)->getType()->isBuiltinType() ? 1 : 0);
      continue;
    }
    break;
  }
  return E && isa<DeclRefExpr, MemberExpr>(E) ? E : nullptr;
}

// A collate step, `batch.atoms[i].narrow(0, 0, n).copy_(item.atoms)`: the
// source and the destination are fields of one name, so they hold the same
// kind of data (no float32 default for the source).
bool sameField(const Expr *Src, const Expr *Dst) {
  const auto *A = dyn_cast_or_null<MemberExpr>(Src);
  const auto *B = dyn_cast_or_null<MemberExpr>(Dst);
  return A && B && A->getMemberDecl()->getDeclName() == B->getMemberDecl()->getDeclName();
}

} // namespace

struct CopyNarrowingCheck::Copy {
  const Expr *Call, *Dst, *Src;
  SourceLocation Loc;
  StringRef What; // "copy_", "index_put_", "assignment into an indexed view"
};

CopyNarrowingCheck::CopyNarrowingCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context), AssumeFloatSources(boolOption("AssumeFloatSources", true)) {}

void CopyNarrowingCheck::storeOptions(ClangTidyOptions::OptionMap &Opts) {
  TensorCheck::storeOptions(Opts);
  storeBool(Opts, "AssumeFloatSources", AssumeFloatSources);
}

void CopyNarrowingCheck::registerMatchers(MatchFinder *Finder) {
  Finder->addMatcher(cxxMemberCallExpr(callee(cxxMethodDecl(hasAnyName("copy_", "index_put_"))),
                                       unless(isExpansionInSystemHeader()))
                         .bind("call"),
                     this);
  // `dst[i] = src`: the rvalue-qualified operator= of a view is copy_.
  Finder->addMatcher(
      cxxOperatorCallExpr(hasOverloadedOperatorName("="), unless(isExpansionInSystemHeader()))
          .bind("assign"),
      this);
}

// index_put_ with a tensor among the indices raises on a dtype mismatch.
static bool tensorIndexed(const Expr *List, const TensorModel &Model) {
  bool Found = false;
  std::function<void(const Stmt *)> Walk = [&](const Stmt *S) {
    if (!S || Found)
      return;
    if (const auto *E = dyn_cast<Expr>(S); E && Model.isTensorExpr(E)) {
      Found = true;
      return;
    }
    for (const Stmt *C : S->children())
      Walk(C);
  };
  Walk(List);
  return Found;
}

void CopyNarrowingCheck::check(const MatchFinder::MatchResult &Result) {
  if (const auto *MC = Result.Nodes.getNodeAs<CXXMemberCallExpr>("call")) {
    const Expr *Self = MC->getImplicitObjectArgument();
    const auto *ME = dyn_cast<MemberExpr>(MC->getCallee());
    if (!Self || !ME || !Model.isTensorExpr(Self))
      return;
    StringRef Name = MC->getMethodDecl()->getName();
    if (Name == "copy_" && MC->getNumArgs() >= 1 && Model.isTensorExpr(MC->getArg(0)))
      return report({MC, Self, MC->getArg(0), ME->getMemberLoc(), "copy_"}, Result);
    if (Name == "index_put_" && MC->getNumArgs() >= 2 && Model.isTensorExpr(MC->getArg(1)) &&
        !tensorIndexed(MC->getArg(0), Model))
      return report({MC, Self, MC->getArg(1), ME->getMemberLoc(), "index_put_"}, Result);
    return;
  }
  const auto *OC = Result.Nodes.getNodeAs<CXXOperatorCallExpr>("assign");
  const auto *MD = OC ? dyn_cast_or_null<CXXMethodDecl>(OC->getDirectCallee()) : nullptr;
  if (!MD || MD->getRefQualifier() != RQ_RValue || OC->getNumArgs() != 2 ||
      !Model.isTensorExpr(OC->getArg(0)) || !Model.isTensorExpr(OC->getArg(1)))
    return;
  const auto *Sub = dyn_cast<CXXOperatorCallExpr>(stripHandle(OC->getArg(0)));
  if (Sub && Sub->getOperator() == OO_Subscript && Sub->getNumArgs() == 2 &&
      Model.isTensorExpr(Sub->getArg(1)))
    return; // dst[mask] = src: index_put_ with a tensor index raises instead
  report({OC, OC->getArg(0), OC->getArg(1), OC->getOperatorLoc(), "assignment into a view"},
         Result);
}

// `src.to(dst.scalar_type())` with dst the tensor the view chain starts from;
// "" where no fix-it is safe (macros, templates, a destination without a name).
static std::string fixText(const CopyNarrowingCheck::Copy &C, const SourceManager &SM,
                           ASTContext &Ctx) {
  const Expr *Base = baseOf(C.Dst);
  if (!Base || C.Src->getBeginLoc().isMacroID() || C.Src->getEndLoc().isMacroID() ||
      inTemplateInstantiation(C.Call, Ctx))
    return "";
  auto Text = [&](const Expr *E) {
    return Lexer::getSourceText(CharSourceRange::getTokenRange(E->getSourceRange()), SM,
                                Ctx.getLangOpts())
        .str();
  };
  const Expr *Src = stripHandle(C.Src);
  const auto *OC = dyn_cast<CXXOperatorCallExpr>(Src);
  bool Postfix = OC ? OC->getOperator() == OO_Subscript || OC->getOperator() == OO_Call
                    : isa<DeclRefExpr, MemberExpr, CallExpr, ParenExpr>(Src);
  std::string S = Postfix ? Text(C.Src) : "(" + Text(C.Src) + ")";
  return S + ".to(" + Text(Base) + ".scalar_type())";
}

// The source's dtype: shown, floating for certain (softmax, exp...), or an
// input of unknown dtype taken as float32 when the destination is integral.
std::optional<CopyNarrowingCheck::SourceDType>
CopyNarrowingCheck::sourceDType(const Copy &C, const TensorFact &D, const TensorFact &S,
                                const MatchFinder::MatchResult &Result) const {
  if (S.FloatingOp && (S.DType.empty() || S.DTypeAssumed))
    return SourceDType{"Float", true, "", Fact::DTypesKnown};
  if (!S.DTypeAssumed)
    return S.DType.empty() ? std::nullopt
                           : std::optional(SourceDType{S.DType, false, "", Fact::DTypesKnown});
  const Expr *Base = baseOf(C.Src);
  if (!AssumeFloatSources || kindOf(D.DType) == Kind::Floating || !Base ||
      S.KindSource.CallResult || sameField(Base, baseOf(C.Dst)))
    return std::nullopt;
  std::string Name = Lexer::getSourceText(CharSourceRange::getTokenRange(Base->getSourceRange()),
                                          *Result.SourceManager, Result.Context->getLangOpts())
                         .str();
  // Integer data (`y` of `y = batch.target.to(dev)`, `residue_index`) is
  // int64 as nearly all is: only an int8/int16 destination narrows it.
  if (S.IntegerNamed || namesIntegerData(Name)) {
    if (D.DType != "Char" && D.DType != "Short")
      return std::nullopt;
    return SourceDType{"Long", false,
                       " (assuming " + S.KindSource.Text +
                           " holds int64 values, as integer data nearly always does)",
                       Fact::AssumedInt64};
  }
  return SourceDType{"Float", false,
                     " (assuming " + S.KindSource.Text +
                         " is float32, as nearly all such tensors are)",
                     Fact::AssumedFloat32};
}

void CopyNarrowingCheck::report(const Copy &C, const MatchFinder::MatchResult &Result) {
  ASTContext &Ctx = *Result.Context;
  const LayoutAnalysis *LA = AnalysisManager::get(Model, Ctx).layoutAt(C.Call);
  const TensorFact *D = LA ? LA->factOf(C.Dst) : nullptr;
  const TensorFact *S = LA ? LA->factOf(C.Src) : nullptr;
  if (!D || !S || D->DType.empty() || D->DTypeAssumed)
    return;
  std::optional<SourceDType> Src = sourceDType(C, *D, *S, Result);
  if (!Src)
    return;
  StringRef SrcDT = Src->DType;
  const std::string &Assumed = Src->Assumed;
  bool Floating = Src->Floating;
  std::string Lost = loss(SrcDT, D->DType);
  // `(x * 1000).round()` into int32: no fraction to truncate.
  bool NoFraction = S->WholeValues && kindOf(D->DType) == Kind::Integral;
  if (Lost.empty() || NoFraction || !Reported.first(C.Loc))
    return;
  const SourceManager &SM = *Result.SourceManager;
  std::string Fix = fixText(C, SM, Ctx);
  std::string From = Floating ? std::string("floating-point") : torchName(SrcDT).str();
  std::string Msg = C.What.str() + " silently converts " + From + " to " +
                    torchName(D->DType).str() + " (the destination's dtype): " + Lost + Assumed +
                    "; make the conversion explicit with '" +
                    (Fix.empty() ? std::string("src.to(dst.scalar_type())") : Fix) + "'";
  {
    auto Diag = diagText(C.Loc, Msg, DiagnosticIDs::Warning);
    if (!Fix.empty())
      Diag << FixItHint::CreateReplacement(CharSourceRange::getTokenRange(C.Src->getSourceRange()),
                                           Fix);
  }
  Finding F;
  F.Check = getID().str();
  F.Hazard = HazardKind::NarrowingCopy;
  F.Where = SourcePoint::at(C.Loc, SM);
  F.Op = F.Where;
  F.OpName = C.What == "index_put_" ? "index_put_" : "copy_";
  F.Fix = Fix.empty() ? FixKind::None : FixKind::ExplicitConvert;
  F.Facts.push_back(Src->Why);
  emitFinding(std::move(F));
}

} // namespace clang::tidy::tensor
