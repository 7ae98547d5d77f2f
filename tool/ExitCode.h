// The process exit codes and their precedence, decided in one place
// (exitCodeFor). --help (TensorTidy.cpp) and docs/usage.md list the same.
#ifndef TENSOR_TIDY_TOOL_EXITCODE_H
#define TENSOR_TIDY_TOOL_EXITCODE_H

namespace tensor_tidy {

enum ExitCode {
  ExitClean = 0,        // no finding at error severity
  ExitFindings = 1,     // findings at error severity (or promoted by --warnings-as-errors)
  ExitUsage = 2,        // bad command line, configuration or compilation database
  ExitParseFailed = 3,  // a TU did not parse or its worker crashed; the rest is reported
  ExitVerifyFailed = 4, // --verify: a fix failed verification or a program could not be verified
};

/// What a finished run found, as far as the exit code cares.
struct RunOutcome {
  bool UsageError = false;         // nothing (or not everything asked for) could be done
  bool VerificationFailed = false; // --verify only
  bool TUFailed = false;           // a TU did not parse or its worker died
  unsigned ErrorFindings = 0;      // findings reported at error severity
};

/// 2 > 4 > 3 > 1 > 0: a usage error means the run did not happen as asked;
/// a failed verification means applying the fixes would change behaviour,
/// which the user asked --verify to rule out (a parse failure is still
/// reported on stderr and in the report's failures); a parse failure means
/// the findings are incomplete; findings at error severity come last.
ExitCode exitCodeFor(const RunOutcome &O);

} // namespace tensor_tidy

#endif
