#include "ExitCode.h"

namespace tensor_tidy {

ExitCode exitCodeFor(const RunOutcome &O) {
  if (O.UsageError)
    return ExitUsage;
  if (O.VerificationFailed)
    return ExitVerifyFailed;
  if (O.TUFailed)
    return ExitParseFailed;
  return O.ErrorFindings ? ExitFindings : ExitClean;
}

} // namespace tensor_tidy
