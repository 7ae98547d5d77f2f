// RUN: %check_tensor_tidy %s tensor-view-non-contiguous %t
// RUN: %check_tensor_tidy --runner=clang-tidy %s tensor-view-non-contiguous %t.plugin
#include "tt/tt.h"

namespace tt {
// Minimal view API until the runtime grows it.
}

struct Fake { Fake t() const; Fake view(int) const; };

void negative(Fake f) {
  f.t().view(1); // not a tensor type: silent
}
