// Machine-readable output: SARIF 2.1.0 and tensor-tidy's own JSON. Text
// output is clang-tidy's own (handleErrors), see Driver.cpp.
#ifndef TENSOR_TIDY_TOOL_REPORT_H
#define TENSOR_TIDY_TOOL_REPORT_H

#include "ClangTidyDiagnosticConsumer.h"
#include "llvm/Support/raw_ostream.h"
#include <set>
#include <string>
#include <vector>

namespace tensor_tidy {

struct RunReport {
  /// Deduplicated, in the deterministic order of the run.
  std::vector<clang::tidy::ClangTidyError> Errors;
  /// Translation units that could not be (fully) analysed: file, reason.
  std::vector<std::pair<std::string, std::string>> Failures;
  std::vector<std::string> EnabledChecks;
  /// Checks whose findings are errors by configuration (WarningsAsErrors).
  std::set<std::string> ErrorChecks;
  unsigned Files = 0, Cached = 0;
};

/// The severity a finding is reported at: "error", "warning" or "note".
const char *levelName(const clang::tidy::ClangTidyError &E);

void writeSarif(llvm::raw_ostream &OS, const RunReport &R);
void writeJson(llvm::raw_ostream &OS, const RunReport &R);

} // namespace tensor_tidy

#endif
