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

/// Takes over the run when --verify is given: runs the driver (diagnostics are
/// reported as usual, fixes go to a scratch file first), then verifies every
/// finding, appends the verdicts to the report (text: after the diagnostics;
/// json/sarif: as properties of each result), and applies --fix last. Returns
/// the driver's exit code when it failed (2, 3), else 0 when no fix failed
/// verification and 4 when one did or a program could not be verified.
int runVerify(DriverOptions &Opts, const char *Argv0);

} // namespace tensor_tidy::verify
