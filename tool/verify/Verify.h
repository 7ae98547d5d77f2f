// tensor-tidy --verify: proves each finding and its fix by running the code.
//
// For every input TU that defines main(): apply the findings' fix-its to a
// scratch copy (seen by the compiler through a VFS overlay, so the user's files
// are never written and source locations keep their original names), compile
// and link the original and the fixed program against the bundled runtime, run
// both with TT_TRACE on, and match the trace events to the findings by source
// location. See docs/verify.md.
#pragma once

#include "../Driver.h"

#include "llvm/Support/CommandLine.h"

#include <string>
#include <vector>

namespace tensor_tidy::verify {

/// Adds the --verify options to the driver's category, so that -help lists
/// them. Call before the command line is parsed.
void registerOptions(llvm::cl::OptionCategory &Category);

/// True when --verify was given.
bool enabled();

/// Takes over the run when --verify is given: runs the driver with a hook
/// that, once the findings are merged and before anything is written or
/// fixed, verifies every finding and annotates the report (RunReport's
/// Verdicts, VerifySummary, VerifyText, VerificationFailed). Returns the
/// run's exit code (exitCodeFor: 4 when a fix failed verification or a
/// program could not be verified, unless the command line was unusable).
int runVerify(DriverOptions &Opts, const char *Argv0);

} // namespace tensor_tidy::verify
