#include "CrashReport.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"

namespace tensor_tidy {

// clang's ASTMatchFinder names the callback it is in (ClangTidyCheck::getID
// is the check's name) in the stack dump.
static std::string runningCheck(llvm::StringRef Log) {
  static constexpr llvm::StringLiteral Marker("ASTMatcher: Processing '");
  size_t At = Log.rfind(Marker);
  if (At == llvm::StringRef::npos)
    return "";
  llvm::StringRef Rest = Log.substr(At + Marker.size());
  size_t End = Rest.find('\'');
  return End == llvm::StringRef::npos ? "" : Rest.take_front(End).str();
}

// Where the report starts: a sanitizer's report, else LLVM's stack dump.
static size_t reportStart(llvm::StringRef Log) {
  size_t Start = llvm::StringRef::npos;
  const llvm::StringRef Markers[] = {"ERROR: AddressSanitizer",
                                     "ERROR: UndefinedBehaviorSanitizer",
                                     "runtime error:",
                                     llvm::StringRef(CrashBanner).rtrim(),
                                     "PLEASE submit a bug report",
                                     "Stack dump:"};
  for (llvm::StringRef Marker : Markers) {
    size_t At = Log.find(Marker);
    if (At != llvm::StringRef::npos && (Start == llvm::StringRef::npos || At < Start))
      Start = At;
  }
  if (Start == llvm::StringRef::npos)
    return Start;
  size_t LineStart = Log.rfind('\n', Start);
  return LineStart == llvm::StringRef::npos ? 0 : LineStart + 1;
}

CrashDetails crashDetailsFromLog(llvm::StringRef Log) {
  CrashDetails D;
  D.Check = runningCheck(Log);
  size_t Start = reportStart(Log);
  if (Start == llvm::StringRef::npos)
    return D;
  llvm::SmallVector<llvm::StringRef> Lines;
  Log.substr(Start).split(Lines, '\n', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef L : Lines) {
    if (D.Lines.size() == MaxCrashLines)
      break;
    L = L.rtrim();
    // The program arguments of a worker repeat the whole command line.
    if (L.size() > 400)
      L = L.take_front(400);
    if (!L.empty())
      D.Lines.push_back(L.str());
  }
  return D;
}

bool isStackFrame(llvm::StringRef Line) {
  Line = Line.ltrim();
  if (!Line.consume_front("#"))
    return false;
  size_t Digits = Line.find_first_not_of("0123456789");
  return Digits != 0 && Digits != llvm::StringRef::npos && Line[Digits] == ' ';
}

} // namespace tensor_tidy
