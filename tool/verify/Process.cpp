#include "Process.h"

#include "../Paths.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/Program.h"

#include <chrono>
#include <csignal>
#include <thread>

using namespace llvm;

namespace tensor_tidy::verify {

std::string RunResult::failure() const {
  std::string W = uncaughtWhat(Stderr);
  return "(" + (Signalled ? Signal : "exit code " + std::to_string(RC)) + ")" +
         (W.empty() ? "" : ": \"" + W + "\"");
}

namespace {

/// Waits for PI, killing it at the deadline. ExecuteAndWait's timeout is
/// alarm()-based, which is not safe with several waits on threads: poll.
int waitWithDeadline(sys::ProcessInfo PI, unsigned Seconds, std::string &ErrMsg) {
  auto Deadline = std::chrono::steady_clock::now() + std::chrono::seconds(Seconds);
  sys::ProcessInfo W;
  while ((W = sys::Wait(PI, /*SecondsToWait=*/0, &ErrMsg, nullptr, /*Polling=*/true)).Pid == 0) {
    if (std::chrono::steady_clock::now() > Deadline) {
      ::kill(PI.Pid, SIGKILL);
      sys::Wait(PI, std::nullopt);
      ErrMsg = "Child timed out";
      return -2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return W.ReturnCode;
}

} // namespace

RunResult execute(ArrayRef<std::string> Args, StringRef Cwd, std::optional<ArrayRef<StringRef>> Env,
                  StringRef Stdin, StringRef Scratch, StringRef Tag, unsigned Seconds,
                  unsigned MemMB) {
  std::vector<std::string> Full;
  if (!Cwd.empty()) // ExecuteAndWait has no working-directory parameter.
    Full = {"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", Cwd.str()};
  Full.insert(Full.end(), Args.begin(), Args.end());
  std::vector<StringRef> Refs(Full.begin(), Full.end());
  std::string Out = (Scratch + "/" + Tag + ".stdout").str();
  std::string Err = (Scratch + "/" + Tag + ".stderr").str();
  std::string In = Stdin.empty() ? std::string("/dev/null") : Stdin.str();
  std::optional<StringRef> Redirects[] = {StringRef(In), StringRef(Out), StringRef(Err)};
  std::string ErrMsg;
  bool Failed = false;
  RunResult R;
  sys::ProcessInfo PI = sys::ExecuteNoWait(Refs[0], Refs, Env, Redirects, MemMB, &ErrMsg, &Failed);
  if (!Failed)
    R.RC = waitWithDeadline(PI, Seconds, ErrMsg);
  R.Stdout = readFile(Out);
  R.Stderr = readFile(Err);
  if (Failed || R.RC == -1) {
    R.Started = false;
    R.Stderr = ErrMsg;
  } else if (R.RC == -2) {
    if (StringRef(ErrMsg).contains("timed out")) {
      R.TimedOut = true;
    } else {
      R.Signalled = true;
      R.Signal = ErrMsg;
    }
  }
  return R;
}

std::string uncaughtWhat(StringRef Stderr) {
  size_t P = Stderr.find("what():");
  if (P == StringRef::npos)
    return "";
  return Stderr.substr(P + 7).trim().split('\n').first.str();
}

std::string firstError(StringRef Out) {
  SmallVector<StringRef> L;
  Out.split(L, '\n');
  for (StringRef S : L)
    if ((S.contains("error:") && !S.contains("linker command failed")) ||
        S.contains("undefined reference"))
      return S.trim().str();
  return Out.trim().split('\n').first.str();
}

} // namespace tensor_tidy::verify
