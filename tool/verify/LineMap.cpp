#include "LineMap.h"

#include <algorithm>

namespace tensor_tidy::verify {

Lines::Lines(llvm::StringRef Text) {
  for (unsigned I = 0; I < Text.size(); ++I)
    if (Text[I] == '\n')
      Starts.push_back(I + 1);
}

unsigned Lines::lineOf(unsigned Offset) const {
  return std::upper_bound(Starts.begin(), Starts.end(), Offset) - Starts.begin();
}

std::vector<unsigned> mapLines(llvm::StringRef Orig, llvm::StringRef Fixed,
                               const clang::tooling::Replacements &R) {
  Lines LO(Orig), LF(Fixed);
  std::vector<unsigned> M(LO.Starts.size() + 1, 0);
  for (unsigned L = 1; L <= LO.Starts.size(); ++L)
    M[L] = LF.lineOf(R.getShiftedCodePosition(LO.Starts[L - 1]));
  return M;
}

} // namespace tensor_tidy::verify
