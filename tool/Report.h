// Machine-readable output: SARIF 2.1.0 and tensor-tidy's own JSON. Text
// output is clang-tidy's own (handleErrors), see Driver.cpp.
#ifndef TENSOR_TIDY_TOOL_REPORT_H
#define TENSOR_TIDY_TOOL_REPORT_H

#include "ClangTidyDiagnosticConsumer.h"
#include "ExitCode.h"
#include "analysis/Finding.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tensor_tidy {

/// What a run hands its hooks and its writers. runDriver fills it, the
/// AfterAnalysis hook (--verify) annotates it, then it is written.
struct RunReport {
  /// Deduplicated, in the deterministic order of the run.
  std::vector<clang::tidy::ClangTidyError> Errors;
  /// The typed finding behind each error (same index); none for compiler
  /// diagnostics and under a check that emits none.
  std::vector<std::optional<clang::tidy::tensor::Finding>> Typed;
  /// The translation unit that reported each error (same index): --merge
  /// orders the reports of --shard runs by it.
  std::vector<std::string> TUs;
  /// A translation unit that could not be (fully) analysed.
  struct Failure {
    enum Kind { ParseError, Crash, Timeout };
    std::string File, Reason;
    Kind What = ParseError;
    std::string Check;            // the check that crashed, when one did
    std::vector<std::string> Log; // a crash's report (stack dump, sanitizer)
  };
  std::vector<Failure> Failures;
  std::vector<std::string> EnabledChecks;
  /// Checks whose findings are errors by configuration (WarningsAsErrors).
  std::set<std::string> ErrorChecks;
  unsigned Files = 0, Cached = 0;

  /// Set by --verify: per error (same index, null where none) the verdict;
  /// the run's summary; the text report printed after the diagnostics.
  std::vector<llvm::json::Value> Verdicts;
  std::optional<llvm::json::Object> VerifySummary;
  std::string VerifyText;
  bool VerificationFailed = false;

  /// The exit code (exitCodeFor), decided before the report is written.
  ExitCode Exit = ExitClean;
  /// Findings reported at error severity.
  unsigned errorCount() const;
};

/// The severity a finding is reported at: "error", "warning" or "note".
const char *levelName(const clang::tidy::ClangTidyError &E);

void writeSarif(llvm::raw_ostream &OS, const RunReport &R);
void writeJson(llvm::raw_ostream &OS, const RunReport &R);

} // namespace tensor_tidy

#endif
