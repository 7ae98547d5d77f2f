#include "analysis/TensorCheck.h"

#include "NoLintDirectiveHandler.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Tooling/Core/Diagnostic.h"
#include <atomic>

namespace clang::tidy::tensor {

namespace {
std::atomic<bool> SuppressionFixes{false};

/// Asks clang-tidy's NOLINT parser about one location, as a warning of Check.
class NolintProbe : public DiagnosticConsumer {
public:
  explicit NolintProbe(StringRef Check) : Check(Check) {}
  void HandleDiagnostic(DiagnosticsEngine::Level, const Diagnostic &Info) override {
    llvm::SmallVector<tooling::Diagnostic, 1> Malformed; // clang-tidy reports those
    Suppressed = NoLintDirectiveHandler().shouldSuppress(DiagnosticsEngine::Warning, Info, Check,
                                                         Malformed, /*AllowIO=*/true,
                                                         /*EnableNoLintBlocks=*/true);
  }
  bool Suppressed = false;

private:
  std::string Check;
};
} // namespace

void TensorCheck::offerSuppressionFixes(bool On) { SuppressionFixes = On; }

TensorDiag::~TensorDiag() {
  Builder.reset(); // emits the diagnostic: the note must come after it
  if (Suppress)
    Check.diag(Suppress->RemoveRange.getBegin(), "suppress with NOLINT", DiagnosticIDs::Note)
        << *Suppress;
}

TensorDiag TensorCheck::diag(SourceLocation Loc, StringRef Description,
                             DiagnosticIDs::Level Level) {
  std::optional<FixItHint> Suppress;
  if (Level == DiagnosticIDs::Error && errorSuppressed(Loc))
    Level = DiagnosticIDs::Ignored; // its notes go with it
  else if (Level != DiagnosticIDs::Note && SuppressionFixes)
    Suppress = suppressionFix(Loc);
  return TensorDiag(ClangTidyCheck::diag(Loc, Description, Level), std::move(Suppress), *this);
}

/// clang-tidy never lets NOLINT silence an error (meant for compiler errors),
/// but ours are a check's findings like its warnings: the same comments apply.
bool TensorCheck::errorSuppressed(SourceLocation Loc) const {
  if (!SM || Loc.isInvalid())
    return false;
  NolintProbe Probe(getID());
  DiagnosticsEngine Engine(new DiagnosticIDs(), new DiagnosticOptions(), &Probe,
                           /*ShouldOwnClient=*/false);
  Engine.setSourceManager(const_cast<SourceManager *>(SM));
  Engine.Report(Loc, Engine.getCustomDiagID(DiagnosticsEngine::Warning, "probe"));
  return Probe.Suppressed;
}

/// " // NOLINT(<check>)" at the end of Loc's line, where clang-tidy (and
/// clangd) look for it; none outside the main file.
std::optional<FixItHint> TensorCheck::suppressionFix(SourceLocation Loc) const {
  if (!SM || Loc.isInvalid())
    return std::nullopt;
  SourceLocation File = SM->getFileLoc(Loc);
  if (!SM->isWrittenInMainFile(File))
    return std::nullopt;
  auto [FID, Offset] = SM->getDecomposedLoc(File);
  StringRef Buffer = SM->getBufferData(FID);
  size_t End = Buffer.find_first_of("\r\n", Offset);
  if (End == StringRef::npos)
    End = Buffer.size();
  SourceLocation At = File.getLocWithOffset(End - Offset);
  return FixItHint::CreateInsertion(At, (" // NOLINT(" + getID() + ")").str());
}

} // namespace clang::tidy::tensor
