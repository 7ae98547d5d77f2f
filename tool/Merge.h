// tensor-tidy --merge: joins the JSON or SARIF reports of --shard=K/N runs
// into the report one unsharded run writes (docs/design.md, "Shards").
#ifndef TENSOR_TIDY_TOOL_MERGE_H
#define TENSOR_TIDY_TOOL_MERGE_H

#include "ExitCode.h"
#include "llvm/ADT/ArrayRef.h"
#include <string>

namespace tensor_tidy {

/// Writes the merged report to \p Output (stdout when empty), in the
/// inputs' format. Returns the exit code the unsharded run would have had;
/// unreadable or mixed inputs are a usage error with one line on stderr.
ExitCode mergeReports(llvm::ArrayRef<std::string> Inputs, const std::string &Output);

} // namespace tensor_tidy

#endif
