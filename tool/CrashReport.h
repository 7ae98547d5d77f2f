// What a crashed worker left in its log (Scheduler.cpp keeps the log): the
// check that was running and the crash report, as LLVM's crash handler
// (PrettyStackTrace, "Stack dump:") or a sanitizer prints them.
#ifndef TENSOR_TIDY_TOOL_CRASHREPORT_H
#define TENSOR_TIDY_TOOL_CRASHREPORT_H

#include "llvm/ADT/StringRef.h"
#include <string>
#include <vector>

namespace tensor_tidy {

struct CrashDetails {
  /// The check whose matcher callback was running ("" when none was).
  std::string Check;
  /// The report's lines, from its first line on (at most MaxCrashLines).
  std::vector<std::string> Lines;
};

constexpr size_t MaxCrashLines = 60;

/// The first line of LLVM's crash handler in tensor-tidy (llvm::setBugReportMsg).
constexpr const char CrashBanner[] =
    "PLEASE report this tensor-tidy crash with the report below.\n";

CrashDetails crashDetailsFromLog(llvm::StringRef Log);

/// The lines of a report that are stack frames ("#3 0x... in f file:12").
bool isStackFrame(llvm::StringRef Line);

} // namespace tensor_tidy

#endif
