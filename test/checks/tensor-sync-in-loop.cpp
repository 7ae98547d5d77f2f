// RUN: %check_tensor_tidy %s tensor-sync-in-loop %t
// RUN: %check_tensor_tidy --runner=clang-tidy %s tensor-sync-in-loop %t.plugin
#include "tt/tt.h"

// FIXME: positive cases with CHECK-MESSAGES / CHECK-FIXES, and as many negative cases.
