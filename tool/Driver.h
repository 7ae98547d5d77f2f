// The tensor-tidy driver: which files, with which configuration, analysed by
// whom (cache or worker), reported how. Option parsing stays in
// TensorTidy.cpp.
#ifndef TENSOR_TIDY_TOOL_DRIVER_H
#define TENSOR_TIDY_TOOL_DRIVER_H

#include "ClangTidyDiagnosticConsumer.h"
#include "clang/Tooling/CompilationDatabase.h"
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tensor_tidy {

/// Exit codes (docs/usage.md).
enum ExitCode {
  ExitClean = 0,       // no finding at error severity
  ExitFindings = 1,    // findings at error severity (or promoted by --warnings-as-errors)
  ExitUsage = 2,       // bad command line, configuration or compilation database
  ExitParseFailed = 3, // a TU did not parse or its worker crashed; the rest is reported
};

enum class OutputFormat { Text, Sarif, Json };

struct DriverOptions {
  std::vector<std::string> Files;
  std::string BuildPath;
  /// From "-- <flags>": a database that compiles any file with those flags.
  std::unique_ptr<clang::tooling::CompilationDatabase> FixedDatabase;
  std::optional<std::string> Checks, WarningsAsErrors, HeaderFilter;
  std::optional<bool> SystemHeaders;
  std::string Config, ConfigFile;
  std::vector<std::string> ExtraArgs, ExtraArgsBefore;
  bool Fix = false, ListChecks = false, DumpConfig = false, Quiet = false, NoCache = false;
  std::string ExportFixes, Explain, Output, CacheDir;
  OutputFormat Format = OutputFormat::Text;
  unsigned Jobs = 0; // 0: one per core
  unsigned TimeoutSec = 0; // per TU; 0: none
  /// Runs on the merged findings before they are reported or fixed (the
  /// --verify hook). Appends its report to the string, printed after the
  /// diagnostics; a non-zero result becomes the exit code unless the run
  /// already failed harder (usage or parse errors).
  std::function<int(llvm::ArrayRef<clang::tidy::ClangTidyError> Findings,
                    const clang::tooling::CompilationDatabase &DB,
                    llvm::ArrayRef<std::string> Files, std::string &Report)>
      AfterAnalysis;
};

int runDriver(DriverOptions &Opts);

} // namespace tensor_tidy

#endif
