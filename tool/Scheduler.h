// Runs one worker process per translation unit, at most N at a time.
// Workers are forked from the driver (no exec: the parent is single-threaded
// and has already loaded the database and the configuration); each writes its
// TUResult as JSON to a file and exits. A worker that crashes or hangs loses
// only its own TU.
#ifndef TENSOR_TIDY_TOOL_SCHEDULER_H
#define TENSOR_TIDY_TOOL_SCHEDULER_H

#include "Diagnostics.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include <string>

namespace tensor_tidy {

/// Analyses the jobs in \p Pending (indices) with \p Work, in worker
/// processes, calling \p Done in the parent as each one finishes (in
/// completion order; the caller orders the output). Returns an error message
/// when no worker could be started at all.
/// A worker still running after \p TimeoutSec seconds (0: no limit) is
/// killed and its TU reported as timed out.
std::string runInWorkers(unsigned Jobs, unsigned TimeoutSec, const std::vector<size_t> &Pending,
                         llvm::function_ref<TUResult(size_t)> Work,
                         llvm::function_ref<void(size_t, TUResult)> Done);

} // namespace tensor_tidy

#endif
