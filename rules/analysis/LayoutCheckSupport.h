// What the checks built on the layout analysis share.
#pragma once

#include "analysis/Finding.h"
#include "analysis/LayoutAnalysis.h"

namespace clang::tidy::tensor {

// The typed finding of a view/reshape call whose input layout Q describes.
Finding layoutFinding(StringRef Check, HazardKind Hazard, const Expr *Call, const ViewQuery &Q,
                      FixKind Fix, const SourceManager &SM);

// The "made non-contiguous here" note for a call whose input layout Q
// describes, unless the layout was made inside the call itself.
struct OriginNote {
  static constexpr const char *Format = "made non-contiguous here by '%0'";
  SourceLocation Loc;
  std::string Origin; // the op, for %0
};
std::optional<OriginNote> originNote(const ViewQuery &Q, const Expr *Call, const SourceManager &SM);

} // namespace clang::tidy::tensor
