// Running the compiler and the programs --verify builds, with a time and
// memory limit, and reading what they printed.
#pragma once

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>

namespace tensor_tidy::verify {

struct RunResult {
  int RC = 0;
  bool Started = true, TimedOut = false, Signalled = false;
  std::string Signal, Stdout, Stderr;
  bool failed() const { return Signalled || RC != 0; }
  /// "(exit code 3)" or "(<signal>)", then the uncaught exception's message.
  std::string failure() const;
};

/// Runs Args[0] (a path) in Cwd (when not empty) with Env (when set) and
/// Stdin (a file; /dev/null when empty); stdout and stderr go to
/// <Scratch>/<Tag>.stdout/.stderr and are read back.
RunResult execute(llvm::ArrayRef<std::string> Args, llvm::StringRef Cwd,
                  std::optional<llvm::ArrayRef<llvm::StringRef>> Env, llvm::StringRef Stdin,
                  llvm::StringRef Scratch, llvm::StringRef Tag, unsigned Seconds, unsigned MemMB);

/// The message of an uncaught exception, from libstdc++'s terminate handler.
std::string uncaughtWhat(llvm::StringRef Stderr);

/// The first error line of a compiler's output, for the report.
std::string firstError(llvm::StringRef Out);

} // namespace tensor_tidy::verify
