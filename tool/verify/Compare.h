// Comparing the original run with a fixed one: the values at the trace
// points both share, and the program output line by line, each difference
// explained when it was computed from a hazard's write (docs/verify.md).
#pragma once

#include "Trace.h"

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"

#include <set>
#include <string>
#include <vector>

namespace tensor_tidy::verify {

struct Comparison {
  unsigned Compared = 0; // values at shared trace points
  /// Value differences, "min at x.cpp:21 (sum -3.7 -> -5.4)", split by
  /// whether the original's event lies downstream of a hazard's write.
  std::vector<std::string> Explained, Unexplained;
  /// Output lines that differ, "\"a 1.0\" became \"a 2.0\"", explained when a
  /// value read to the host while the line was printed differs and is
  /// downstream of a hazard's write (then with " (item at x.cpp:9)").
  std::vector<std::string> OutputExplained, OutputUnexplained;
  bool outputDiffers() const { return !OutputExplained.empty() || !OutputUnexplained.empty(); }
};

/// Tainted: indices of the original's events downstream of the hazards'
/// writes; MapLine: an original line to the fixed file's.
Comparison compareRuns(const Trace &Orig, const Trace &Fixed, llvm::StringRef OrigOut,
                       llvm::StringRef FixedOut, const std::set<std::size_t> &Tainted,
                       llvm::function_ref<unsigned(llvm::StringRef, unsigned)> MapLine);

} // namespace tensor_tidy::verify
