// Offsets and lines of a text, and where each line of an original file lands
// once fix-its are applied: how --verify matches the fixed run's trace to the
// findings.
#pragma once

#include "clang/Tooling/Core/Replacement.h"
#include "llvm/ADT/StringRef.h"

#include <vector>

namespace tensor_tidy::verify {

/// Line starts of a text, for offset <-> line (1-based).
struct Lines {
  std::vector<unsigned> Starts{0};
  explicit Lines(llvm::StringRef Text);
  unsigned lineOf(unsigned Offset) const;
  unsigned columnOf(unsigned Offset) const { return Offset - Starts[lineOf(Offset) - 1] + 1; }
};

/// M[L]: the line of the fixed text that original line L (1-based) became.
std::vector<unsigned> mapLines(llvm::StringRef Orig, llvm::StringRef Fixed,
                               const clang::tooling::Replacements &R);

} // namespace tensor_tidy::verify
