// What the fuzz targets share: a scratch directory for inputs that the code
// under test reads from disk.
#ifndef TENSOR_TIDY_FUZZ_FUZZSUPPORT_H
#define TENSOR_TIDY_FUZZ_FUZZSUPPORT_H

#include "llvm/Support/FileSystem.h"
#include <string>

namespace tensor_tidy {

/// A directory of its own, made once per fuzzer process.
inline const std::string &scratchDir(const char *Prefix) {
  static std::string Dir = [Prefix] {
    llvm::SmallString<128> P;
    llvm::sys::fs::createUniqueDirectory(Prefix, P);
    return std::string(P);
  }();
  return Dir;
}

} // namespace tensor_tidy

#endif
