// What the checks built on the layout analysis share.
#pragma once

#include "analysis/Finding.h"
#include "analysis/LayoutAnalysis.h"

namespace clang::tidy::tensor {

// The typed finding of a view/reshape call whose input layout Q describes.
Finding layoutFinding(StringRef Check, HazardKind Hazard, const Expr *Call, const ViewQuery &Q,
                      FixKind Fix, const SourceManager &SM);

} // namespace clang::tidy::tensor
