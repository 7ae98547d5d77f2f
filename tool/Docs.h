// The check documentation (docs/checks/<check>.md), found next to the
// executable: <prefix>/share/tensor-tidy/checks in the build tree and in an
// install alike.
#ifndef TENSOR_TIDY_TOOL_DOCS_H
#define TENSOR_TIDY_TOOL_DOCS_H

#include "llvm/ADT/StringRef.h"
#include <optional>
#include <string>

namespace tensor_tidy {

/// Remembers argv[0] so that the executable's directory can be found.
void setExecutablePath(const char *Argv0);
const std::string &executablePath();

struct CheckDoc {
  std::string Path;     // the .md file; empty when there is none
  std::string Markdown; // the whole page
  std::string Short;    // first sentence of the first paragraph
  std::string Full;     // first paragraph
  std::string HelpUri;  // where the page can be read
};

/// The documentation of \p Check. For checks that tensor-tidy does not ship
/// (clang-diagnostic-*, stock clang-tidy checks) only HelpUri may be set.
CheckDoc findCheckDoc(llvm::StringRef Check);

} // namespace tensor_tidy

#endif
