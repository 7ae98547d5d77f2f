// Analysing one translation unit. Runs inside a worker process (see
// Scheduler.h): ClangTidyContext is not thread-safe and a crash in the
// compiler must not take the whole run down.
#ifndef TENSOR_TIDY_TOOL_WORKER_H
#define TENSOR_TIDY_TOOL_WORKER_H

#include "ClangTidyOptions.h"
#include "Diagnostics.h"
#include "Preamble.h"
#include "clang/Tooling/CompilationDatabase.h"

namespace tensor_tidy {

/// Runs the checks enabled by \p Options on \p File, compiled by \p Commands,
/// the way clang-tidy's runClangTidy does, and records the files it read.
/// With \p P, parses with its PCH first and without it if that fails.
TUResult analyzeTU(const std::string &File,
                   const std::vector<clang::tooling::CompileCommand> &Commands,
                   const clang::tidy::ClangTidyOptions &Options, const Preamble *P = nullptr);

/// Builds a shared preamble's PCH into \p Pch; Failed when clang failed or
/// reported anything.
TUResult buildPreamble(const clang::tooling::CompileCommand &Command, const std::string &Pch,
                       const clang::tidy::ClangTidyOptions &Options);

} // namespace tensor_tidy

#endif
