// tensor-tidy --verify: proves each finding and its fix by running the code.
//
// For every input TU that defines main(): apply the findings' fix-its to a
// scratch copy (seen by the compiler through a VFS overlay, so the user's files
// are never written and source locations keep their original names), compile
// and link the original and the fixed program against the bundled runtime, run
// both with TT_TRACE on, and match the trace events to the findings by source
// location. See docs/verify.md.
#pragma once

#include "ClangTidyDiagnosticConsumer.h"
#include "clang/Tooling/CompilationDatabase.h"
#include "llvm/Support/CommandLine.h"

#include <string>
#include <vector>

namespace tensor_tidy::verify {

/// Adds the --verify options to the driver's category, so that -help lists
/// them. Call before the command line is parsed.
void registerOptions(llvm::cl::OptionCategory &Category);

/// True when --verify was given.
bool enabled();

/// Runs the verification. Reads every source before returning, so the caller
/// may apply --fix afterwards. Appends the report (text or JSON, per
/// --verify-format) to Report and returns the exit code: 0 when every finding
/// was handled and no fix failed, 4 when a fix failed verification or a
/// program could not be built or run.
int run(llvm::ArrayRef<clang::tidy::ClangTidyError> Findings,
        const clang::tooling::CompilationDatabase &DB, llvm::ArrayRef<std::string> Files,
        const char *Argv0, std::string &Report);

} // namespace tensor_tidy::verify
