#include "Scheduler.h"

#include "CrashReport.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tensor_tidy {

static bool timedOut(int Status, unsigned TimeoutSec) {
  return WIFSIGNALED(Status) && WTERMSIG(Status) == SIGALRM && TimeoutSec;
}

static std::string describeExit(int Status, unsigned TimeoutSec) {
  if (timedOut(Status, TimeoutSec))
    return "timed out (after " + std::to_string(TimeoutSec) + " s)";
  if (WIFSIGNALED(Status))
    return std::string("crashed (") + strsignal(WTERMSIG(Status)) + ")";
  return "crashed (exit status " + std::to_string(WEXITSTATUS(Status)) + ")";
}

// In the forked worker: output to a log so that nothing interleaves, a
// deadline by SIGALRM (its default action ends the worker), the result as
// JSON for the parent. Never returns.
[[noreturn]] static void runWorker(llvm::function_ref<TUResult()> Work, const std::string &LogPath,
                                   const std::string &JsonPath, unsigned TimeoutSec) {
  int Log = open(LogPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (Log >= 0) {
    dup2(Log, 1);
    dup2(Log, 2);
    close(Log);
  }
  if (TimeoutSec)
    alarm(TimeoutSec);
  TUResult R = Work();
  std::error_code EC;
  llvm::raw_fd_ostream OS(JsonPath, EC);
  if (EC)
    _exit(120);
  OS << toJSON(R);
  OS.close();
  _exit(OS.has_error() ? 121 : 0);
}

// A finished worker's result: its JSON when it exited cleanly, else a crash
// described from its exit status and its log (the check, the stack).
static TUResult collectResult(int Status, const std::string &JsonPath, const std::string &LogPath,
                              unsigned TimeoutSec) {
  TUResult R;
  if (WIFEXITED(Status) && WEXITSTATUS(Status) == 0)
    if (auto Buf = llvm::MemoryBuffer::getFile(JsonPath)) {
      llvm::Expected<llvm::json::Value> V = llvm::json::parse((*Buf)->getBuffer());
      if (V && fromJSON(*V, R))
        return R;
      if (!V)
        llvm::consumeError(V.takeError());
    }
  R = TUResult();
  R.Crash = describeExit(Status, TimeoutSec);
  R.TimedOut = timedOut(Status, TimeoutSec);
  if (auto Buf = llvm::MemoryBuffer::getFile(LogPath)) {
    CrashDetails D = crashDetailsFromLog((*Buf)->getBuffer());
    R.CrashCheck = std::move(D.Check);
    R.CrashLog = std::move(D.Lines);
  }
  return R;
}

std::string runInWorkers(unsigned Jobs, unsigned TimeoutSec, const std::vector<size_t> &Pending,
                         llvm::function_ref<TUResult(size_t)> Work,
                         llvm::function_ref<void(size_t, TUResult)> Done) {
  if (Pending.empty())
    return "";
  llvm::SmallString<128> TmpDir;
  if (std::error_code EC = llvm::sys::fs::createUniqueDirectory("tensor-tidy", TmpDir))
    return "cannot create a temporary directory: " + EC.message();
  auto PathFor = [&](size_t Job, llvm::StringRef Ext) {
    llvm::SmallString<128> P(TmpDir);
    llvm::sys::path::append(P, std::to_string(Job) + Ext);
    return std::string(P);
  };

  using Clock = std::chrono::steady_clock;
  struct Worker {
    size_t Job;
    Clock::time_point Start;
  };
  std::map<pid_t, Worker> Running;
  size_t Next = 0;
  std::string Error;
  while (Next < Pending.size() || !Running.empty()) {
    while (Next < Pending.size() && Running.size() < std::max(Jobs, 1u)) {
      size_t Job = Pending[Next++];
      llvm::outs().flush();
      llvm::errs().flush();
      pid_t Pid = fork();
      if (Pid == 0)
        runWorker([&] { return Work(Job); }, PathFor(Job, ".log"), PathFor(Job, ".json"),
                  TimeoutSec);
      if (Pid < 0) {
        TUResult R;
        R.Crash = std::string("could not start a worker: ") + strerror(errno);
        Done(Job, std::move(R));
        continue;
      }
      Running[Pid] = {Job, Clock::now()};
    }
    if (Running.empty())
      continue;
    int Status = 0;
    struct rusage Usage = {};
    pid_t Pid = wait4(-1, &Status, 0, &Usage);
    if (Pid < 0) {
      if (errno == EINTR)
        continue;
      Error = std::string("waiting for workers failed: ") + strerror(errno);
      break;
    }
    auto It = Running.find(Pid);
    if (It == Running.end())
      continue;
    size_t Job = It->second.Job;
    std::chrono::duration<double> Took = Clock::now() - It->second.Start;
    Running.erase(It);
    TUResult R = collectResult(Status, PathFor(Job, ".json"), PathFor(Job, ".log"), TimeoutSec);
    R.Seconds = Took.count();
    R.PeakRssKiB = Usage.ru_maxrss; // KiB on Linux
    llvm::sys::fs::remove(PathFor(Job, ".json"));
    llvm::sys::fs::remove(PathFor(Job, ".log"));
    Done(Job, std::move(R));
  }
  llvm::sys::fs::remove(TmpDir);
  return Error;
}

} // namespace tensor_tidy
