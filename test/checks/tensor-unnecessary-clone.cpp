// RUN: %check_tensor_tidy %s tensor-unnecessary-clone %t
// RUN: %check_tensor_tidy --runner=clang-tidy %s tensor-unnecessary-clone %t.plugin
#include "tt/tt.h"

// FIXME: positive cases with CHECK-MESSAGES / CHECK-FIXES, and as many negative cases.
