// The tensor-tidy driver: which files, with which configuration, analysed by
// whom (cache or worker), reported how. Option parsing stays in
// TensorTidy.cpp.
#ifndef TENSOR_TIDY_TOOL_DRIVER_H
#define TENSOR_TIDY_TOOL_DRIVER_H

#include "ClangTidyDiagnosticConsumer.h"
#include "ExitCode.h"
#include "Report.h"
#include "clang/Tooling/CompilationDatabase.h"
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tensor_tidy {

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
  /// No shared preambles (Preamble.h): every TU parses its own includes.
  bool NoPch = false;
  /// --shard=K/N (1 <= K <= N): only the K-th of N parts of the files.
  std::string Shard;
  std::string ExportFixes, Explain, Output, CacheDir;
  std::string StatsFile; // per-TU time and peak memory, as JSON
  OutputFormat Format = OutputFormat::Text;
  unsigned Jobs = 0;       // 0: one per core
  unsigned TimeoutSec = 0; // per TU; 0: none
  /// Runs on the merged report before anything is written or fixed (the
  /// --verify hook): annotates it (verdicts, summary, text, whether
  /// verification failed). The exit code is decided after it (exitCodeFor).
  std::function<void(RunReport &Report, const clang::tooling::CompilationDatabase &DB,
                     llvm::ArrayRef<std::string> Files)>
      AfterAnalysis;
};

/// The whole run: configuration -> jobs -> analysis (cache, workers) ->
/// merge -> AfterAnalysis -> output. Returns the report as written, with its
/// exit code; on a usage error the report is empty and Exit is ExitUsage.
RunReport runDriver(DriverOptions &Opts);

} // namespace tensor_tidy

#endif
