// The trace reader (--verify) on arbitrary JSON Lines, then every query
// --verify makes of a trace: events by line, errors, what is downstream of a
// write, and pairing with another trace.
#include "verify/Trace.h"

#include <cstdint>

using namespace tensor_tidy::verify;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  Trace T = Trace::parse(llvm::StringRef(reinterpret_cast<const char *>(Data), Size), "/fuzz");
  for (const Event &E : T.Events) {
    (void)T.at(E.File, E.Line);
    (void)T.errorAt(E.File, E.Line);
    if (E.Kind == EventKind::Write)
      (void)T.downstreamOf(E.Out, E.File, E.Line);
  }
  (void)T.pairWith(T, [](llvm::StringRef, unsigned Line) { return Line; });
  (void)T.pairWith(Trace(), [](llvm::StringRef, unsigned Line) { return Line + 1; });
  return 0;
}
