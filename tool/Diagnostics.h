// The result of analysing one translation unit, and its JSON form: what a
// worker process hands back and what the cache stores.
#ifndef TENSOR_TIDY_TOOL_DIAGNOSTICS_H
#define TENSOR_TIDY_TOOL_DIAGNOSTICS_H

#include "ClangTidyDiagnosticConsumer.h"
#include "analysis/Finding.h"
#include "llvm/Support/JSON.h"
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tensor_tidy {

struct TUResult {
  std::string File;
  /// The compiler gave up on the TU (or a file could not be read); the
  /// diagnostics hold what was found before that.
  bool Failed = false;
  /// Set by the driver, never cached: the worker died (signal or exit code),
  /// the check that was running then (if any) and its crash report.
  std::string Crash;
  bool TimedOut = false;
  std::string CrashCheck;
  std::vector<std::string> CrashLog;
  /// Every file the TU read, with a hash of the contents it saw.
  std::vector<std::pair<std::string, uint64_t>> Deps;
  std::vector<clang::tidy::ClangTidyError> Errors;
  /// The checks' typed findings (rules/analysis/Finding.h), paths absolute.
  std::vector<clang::tidy::tensor::Finding> Findings;
  bool FromCache = false;
  /// Set by the driver, never cached: the worker's wall time and peak
  /// resident memory (0 when the result came from the cache).
  double Seconds = 0;
  uint64_t PeakRssKiB = 0;
  /// Parsed with a shared preamble's PCH (Preamble.h).
  bool UsedPreamble = false;
};

llvm::json::Value toJSON(const TUResult &R);
bool fromJSON(const llvm::json::Value &V, TUResult &R);

uint64_t hashContents(llvm::StringRef Data);

/// A compiler diagnostic (clang-diagnostic-*) at error level: the TU did not
/// parse.
bool isCompilerError(const clang::tidy::ClangTidyError &E);

} // namespace tensor_tidy

#endif
