// Analysing one translation unit. Runs inside a worker process (see
// Scheduler.h): ClangTidyContext is not thread-safe and a crash in the
// compiler must not take the whole run down.
#ifndef TENSOR_TIDY_TOOL_WORKER_H
#define TENSOR_TIDY_TOOL_WORKER_H

#include "ClangTidyOptions.h"
#include "Diagnostics.h"
#include "clang/Tooling/CompilationDatabase.h"

namespace tensor_tidy {

/// Runs the checks enabled by \p Options on \p File, compiled by \p Commands,
/// the way clang-tidy's runClangTidy does, and records the files it read.
TUResult analyzeTU(const std::string &File,
                   const std::vector<clang::tooling::CompileCommand> &Commands,
                   const clang::tidy::ClangTidyOptions &Options);

} // namespace tensor_tidy

#endif
