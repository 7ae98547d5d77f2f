// Base of every tensor-* check: the `TensorTypes` option, the tensor model
// built from it, C++-only activation, and the checks' diagnostics.
#pragma once

#include "ClangTidyCheck.h"
#include "analysis/Finding.h"
#include "analysis/TensorModel.h"
#include <optional>
#include <utility>

namespace clang::tidy::tensor {

/// A check's diagnostic, streamed into like clang's DiagnosticBuilder. With
/// suppression fixes on (an editor: tensor-clangd), a warning or error is
/// followed by a note whose fix-it appends "// NOLINT(<check>)" to its line:
/// clangd turns a note's fix-it into a quick fix of the diagnostic.
class TensorDiag {
public:
  TensorDiag(DiagnosticBuilder B, std::optional<FixItHint> Suppress, ClangTidyCheck &Check)
      : Builder(std::move(B)), Suppress(std::move(Suppress)), Check(Check) {}
  /// Takes the diagnostic over, as DiagnosticBuilder's copy does (so that
  /// `auto D = diag(...) << X;` emits once, when D goes).
  TensorDiag(const TensorDiag &O)
      : Builder(std::exchange(O.Builder, std::nullopt)),
        Suppress(std::exchange(O.Suppress, std::nullopt)), Check(O.Check) {}
  TensorDiag &operator=(const TensorDiag &) = delete;
  ~TensorDiag();

  template <typename T> friend const TensorDiag &operator<<(const TensorDiag &D, const T &V) {
    *D.Builder << V;
    return D;
  }

private:
  mutable std::optional<DiagnosticBuilder> Builder;
  mutable std::optional<FixItHint> Suppress;
  ClangTidyCheck &Check;
};

class TensorCheck : public ClangTidyCheck {
public:
  TensorCheck(StringRef Name, ClangTidyContext *Context)
      : ClangTidyCheck(Name, Context),
        TensorTypes(Options.get("TensorTypes", TensorModel::DefaultTensorTypes)),
        Model(TensorTypes) {}

  void storeOptions(ClangTidyOptions::OptionMap &Opts) override {
    Options.store(Opts, "TensorTypes", TensorTypes);
  }
  bool isLanguageVersionSupported(const LangOptions &LangOpts) const override {
    return LangOpts.CPlusPlus;
  }
  void registerPPCallbacks(const SourceManager &SM, Preprocessor *, Preprocessor *) override {
    this->SM = &SM;
  }

  /// Each warning and error gets a "suppress with NOLINT" fix (editors only:
  /// the CLI and clang-tidy would print it as a note).
  static void offerSuppressionFixes(bool On);

  TensorDiag diag(SourceLocation Loc, StringRef Description,
                  DiagnosticIDs::Level Level = DiagnosticIDs::Warning);
  /// A message built whole, quoting source text: emitted as it is, not read
  /// as a format (a '%' in `x[i % n]` would be taken for an argument).
  TensorDiag diagText(SourceLocation Loc, const std::string &Message,
                      DiagnosticIDs::Level Level = DiagnosticIDs::Warning) {
    return diag(Loc, "%0", Level) << Message;
  }

protected:
  // Bool options as strings: OptionsView's bool specialisations are not
  // exported in a form GCC-built objects can link against.
  bool boolOption(StringRef Name, bool Default) const {
    return StringRef(Options.get(Name, Default ? "true" : "false")).equals_insensitive("true");
  }
  void storeBool(ClangTidyOptions::OptionMap &Opts, StringRef Name, bool Value) {
    Options.store(Opts, Name, Value ? "true" : "false");
  }

  const std::string TensorTypes;
  const TensorModel Model;

private:
  std::optional<FixItHint> suppressionFix(SourceLocation Loc) const;
  bool errorSuppressed(SourceLocation Loc) const;

  const SourceManager *SM = nullptr;
};

} // namespace clang::tidy::tensor
