// Small helpers the driver, --verify and the trace reader share: paths and
// the one-line error report.
#ifndef TENSOR_TIDY_TOOL_PATHS_H
#define TENSOR_TIDY_TOOL_PATHS_H

#include "llvm/ADT/StringRef.h"
#include "llvm/ADT/Twine.h"
#include <string>

namespace tensor_tidy {

/// Path made absolute against Dir (the working directory when Dir is empty),
/// with . and .. removed.
std::string absolutePath(llvm::StringRef Path, llvm::StringRef Dir = "");

/// The working directory.
std::string currentDir();

/// Path relative to the working directory when it is below it, else as is.
std::string relativeToCwd(llvm::StringRef Path);

/// The whole file, or "" when it cannot be read.
std::string readFile(llvm::StringRef Path);
bool writeFile(llvm::StringRef Path, llvm::StringRef Text);

/// Prints "tensor-tidy: error: <Msg>" on stderr.
void reportError(const llvm::Twine &Msg);

} // namespace tensor_tidy

#endif
