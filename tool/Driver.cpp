#include "Driver.h"

#include "Cache.h"
#include "Config.h"
#include "Docs.h"
#include "Paths.h"
#include "Preamble.h"
#include "Report.h"
#include "Scheduler.h"
#include "Worker.h"

#include "ClangTidy.h"
#include "ClangTidyOptions.h"
#include "GlobList.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/SHA1.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/VirtualFileSystem.h"
#include "llvm/Support/raw_ostream.h"

#include <fcntl.h>
#include <unistd.h>

using namespace clang;
using namespace clang::tidy;
using clang::tooling::CompileCommand;

namespace tensor_tidy {
namespace {

bool inCI() {
  std::optional<std::string> CI = llvm::sys::Process::GetEnv("CI");
  return CI && !CI->empty() && *CI != "0" && *CI != "false";
}

struct Job {
  std::string File;
  std::vector<CompileCommand> Commands;
  ClangTidyOptions Options;
  std::string Key;
  TUResult Result;
};

std::string cacheKey(const Job &J, ResultCache &Cache) {
  llvm::SHA1 H;
  auto Add = [&](llvm::StringRef S) {
    H.update(S);
    H.update(llvm::StringRef("\0", 1));
  };
  Add(toolStamp());
  Add(configurationAsText(J.Options));
  for (const CompileCommand &C : J.Commands) {
    Add(C.Directory);
    Add(C.Filename);
    for (const std::string &Arg : C.CommandLine)
      Add(Arg);
  }
  Add(llvm::utohexstr(Cache.fileHash(J.File)));
  return llvm::toHex(H.final(), /*LowerCase=*/true);
}

/// Redirects stdout to \p Fd while \p Body runs: clang-tidy's text reporter
/// writes to llvm::outs() only.
void withStdout(int Fd, llvm::function_ref<void()> Body) {
  if (Fd < 0)
    return Body();
  llvm::outs().flush();
  int Saved = dup(1);
  dup2(Fd, 1);
  Body();
  llvm::outs().flush();
  dup2(Saved, 1);
  close(Saved);
}

/// The state the stages of one run share.
struct Run {
  DriverOptions &Opts;
  ConfigErrors ConfigProblems = std::make_shared<std::vector<std::string>>();
  std::unique_ptr<ClangTidyContext> Context;
  std::unique_ptr<tooling::CompilationDatabase> DB;
  bool FromFlags = false;
  std::vector<std::string> Files;
  std::vector<Job> Jobs;
  int OutFd = -1;
  std::unique_ptr<llvm::raw_fd_ostream> FixesOS;
  unsigned Cached = 0;
  /// Shared preambles (Preamble.h): the groups, each job's PCH (if any).
  std::vector<PreambleGroup> Preambles;
  std::vector<const Preamble *> PreambleOf;
  std::vector<bool> Waiting;
  unsigned PreamblesBuilt = 0, PreamblesReused = 0, WithPreamble = 0;
};

/// A stage's result: empty, or why the run stops with a usage error.
using StageError = std::optional<std::string>;

StageError configure(Run &R) {
  std::string Error;
  std::unique_ptr<ClangTidyOptionsProvider> Provider =
      makeProvider(R.Opts, R.ConfigProblems, Error);
  if (!Provider)
    return Error;
  R.Context = std::make_unique<ClangTidyContext>(std::move(Provider));
  if (!R.ConfigProblems->empty())
    return R.ConfigProblems->front();
  for (std::string &F : R.Opts.Files)
    F = absolutePath(F);
  return std::nullopt;
}

/// --explain, --list-checks, --dump-config: answered without analysing.
StageError answerQuery(Run &R) {
  const DriverOptions &Opts = R.Opts;
  if (!Opts.Explain.empty()) {
    CheckDoc Doc = findCheckDoc(Opts.Explain);
    if (Doc.Path.empty())
      return "no documentation for check '" + Opts.Explain + "' (see --list-checks)";
    llvm::outs() << Doc.Markdown;
    return std::nullopt;
  }
  std::string File = Opts.Files.empty() ? absolutePath("dummy.cpp") : Opts.Files.front();
  ClangTidyOptions Effective = R.Context->getOptionsForFile(File);
  if (!R.ConfigProblems->empty())
    return R.ConfigProblems->front();
  if (Opts.DumpConfig) {
    // Every option of the enabled checks, as they read it, then any other
    // key the configuration sets.
    ClangTidyOptions::OptionMap CheckOptions = getCheckOptions(Effective, false);
    for (const auto &KV : Effective.CheckOptions)
      CheckOptions.try_emplace(KV.getKey(), KV.getValue());
    Effective.CheckOptions = std::move(CheckOptions);
    llvm::outs() << configurationAsText(Effective) << "\n";
    return std::nullopt;
  }
  llvm::outs() << "Enabled checks:\n";
  for (const std::string &Name : getCheckNames(Effective, false))
    llvm::outs() << "    " << Name << "\n";
  llvm::outs() << "\n";
  return std::nullopt;
}

StageError loadDatabase(Run &R) {
  const DriverOptions &Opts = R.Opts;
  for (const std::string &F : Opts.Files) {
    if (!llvm::sys::fs::exists(F))
      return "no such file: '" + F + "'";
    if (llvm::sys::fs::is_directory(F))
      return "'" + F + "' is a directory, not a source file";
  }
  R.DB = std::move(R.Opts.FixedDatabase);
  R.FromFlags = R.DB != nullptr;
  if (R.DB && !Opts.BuildPath.empty())
    return std::string("-p and '-- <compiler flags>' cannot be used together");
  std::string Why;
  if (!R.DB && !Opts.BuildPath.empty()) {
    if (!llvm::sys::fs::is_directory(Opts.BuildPath))
      return "build directory '" + Opts.BuildPath + "' does not exist";
    R.DB = tooling::CompilationDatabase::loadFromDirectory(Opts.BuildPath, Why);
    if (!R.DB)
      return "cannot load the compilation database in '" + Opts.BuildPath +
             "': " + llvm::StringRef(Why).trim().split('\n').first.str();
  }
  if (!R.DB && !Opts.Files.empty()) {
    R.DB = tooling::CompilationDatabase::autoDetectFromSource(Opts.Files.front(), Why);
    if (!R.DB)
      return "no compilation database found for '" + Opts.Files.front() +
             "'; pass -p <build-dir> or '-- <compiler flags>'";
  }
  if (!R.DB)
    return std::string("no input files; pass files, or -p <build-dir> to analyse every file in "
                       "its compile_commands.json");
  R.Files = Opts.Files;
  if (R.Files.empty()) {
    R.Files = R.DB->getAllFiles();
    llvm::sort(R.Files);
    R.Files.erase(std::unique(R.Files.begin(), R.Files.end()), R.Files.end());
    if (R.Files.empty())
      return "the compilation database in '" + Opts.BuildPath + "' has no entries";
  }
  return std::nullopt;
}

StageError makeJobs(Run &R) {
  // JSON databases infer commands for files they do not list (clangd's
  // interpolation); a file named on the command line must be listed.
  llvm::StringSet<> Listed;
  if (!R.FromFlags)
    for (const std::string &F : R.DB->getAllFiles())
      Listed.insert(absolutePath(F));
  llvm::StringMap<bool> HasChecks;
  for (const std::string &F : R.Files) {
    Job J;
    J.File = F;
    J.Commands = R.DB->getCompileCommands(F);
    if (J.Commands.empty() || (!Listed.empty() && !Listed.contains(F)))
      return "'" + F + "' is not in the compilation database" +
             (R.Opts.BuildPath.empty() ? "" : " in '" + R.Opts.BuildPath + "'");
    J.Options = R.Context->getOptionsForFile(F);
    if (!R.ConfigProblems->empty())
      return R.ConfigProblems->front();
    std::string Checks = J.Options.Checks.value_or("");
    auto [It, New] = HasChecks.try_emplace(Checks, false);
    if (New)
      It->second = !getCheckNames(J.Options, false).empty();
    if (!It->second)
      return "no checks enabled (Checks: '" + Checks + "')";
    R.Jobs.push_back(std::move(J));
  }
  return std::nullopt;
}

/// --shard=K/N: keeps the K-th of N parts of the jobs, deterministically,
/// a preamble group never split (so its PCH is built once, on one runner).
StageError selectShard(Run &R) {
  if (R.Opts.Shard.empty())
    return std::nullopt;
  auto [K, N] = llvm::StringRef(R.Opts.Shard).split('/');
  unsigned Index = 0, Count = 0;
  if (K.getAsInteger(10, Index) || N.getAsInteger(10, Count) || Index < 1 || Index > Count)
    return "--shard must be K/N with 1 <= K <= N, not '" + R.Opts.Shard + "'";
  std::vector<std::string> Keys;
  for (const Job &J : R.Jobs) {
    std::string Key = preambleGroupKey({J.File, J.Commands, J.Options});
    Keys.push_back(Key.empty() ? "file:" + J.File : Key);
  }
  std::vector<unsigned> Part = partitionByKey(Keys, Count);
  std::vector<Job> Kept;
  for (size_t I = 0; I < R.Jobs.size(); ++I)
    if (Part[I] == Index - 1)
      Kept.push_back(std::move(R.Jobs[I]));
  R.Jobs = std::move(Kept);
  return std::nullopt;
}

/// Outputs are opened before the work so that a bad path fails fast.
StageError openOutputs(Run &R) {
  const DriverOptions &Opts = R.Opts;
  if (!Opts.Output.empty())
    if (std::error_code EC = llvm::sys::fs::openFileForWrite(Opts.Output, R.OutFd))
      return "cannot write '" + Opts.Output + "': " + EC.message();
  if (!Opts.ExportFixes.empty()) {
    std::error_code EC;
    R.FixesOS = std::make_unique<llvm::raw_fd_ostream>(Opts.ExportFixes, EC);
    if (EC)
      return "cannot write '" + Opts.ExportFixes + "': " + EC.message();
  }
  return std::nullopt;
}

/// Groups the jobs in \p Pending for shared preambles and takes the PCHs
/// earlier runs built from the cache. Returns the groups whose PCH is to be
/// built; their members wait for it (R.Waiting).
std::vector<size_t> planShared(Run &R, ResultCache &Cache, const std::vector<size_t> &Pending) {
  R.PreambleOf.assign(R.Jobs.size(), nullptr);
  R.Waiting.assign(R.Jobs.size(), false);
  std::vector<size_t> ToBuild;
  if (!Cache.enabled() || R.Opts.NoPch || Pending.size() < 2)
    return ToBuild;
  std::vector<PreambleInput> Inputs;
  for (size_t I : Pending)
    Inputs.push_back({R.Jobs[I].File, R.Jobs[I].Commands, R.Jobs[I].Options});
  R.Preambles = planPreambles(Inputs, Cache.dir() + "/preamble");
  for (size_t G = 0; G < R.Preambles.size(); ++G) {
    PreambleGroup &P = R.Preambles[G];
    bool Loaded = loadPreamble(P, Cache);
    R.PreamblesReused += Loaded;
    if (!Loaded)
      ToBuild.push_back(G);
    for (size_t &M : P.Members) {
      M = Pending[M]; // from now on, job indices
      R.PreambleOf[M] = Loaded ? &P.Built : nullptr;
      R.Waiting[M] = !Loaded;
    }
  }
  return ToBuild;
}

/// A PCH built (or not: a failed build leaves its group parsing as without
/// one, with nothing to report).
void finishPreamble(Run &R, PreambleGroup &G, const TUResult &Built) {
  if (!acceptPreamble(G, Built))
    return;
  ++R.PreamblesBuilt;
  for (size_t M : G.Members)
    R.PreambleOf[M] = &G.Built;
}

/// A TU that parsed without its PCH but not with it: clang rejected the PCH.
void forgetRejectedPreamble(const Preamble *P, const TUResult &Result) {
  if (P && !Result.UsedPreamble && !Result.Failed && Result.Crash.empty())
    llvm::sys::fs::remove(P->DepsFile);
}

/// Takes what the cache has; returns the jobs still to analyse.
std::vector<size_t> fromCache(Run &R, ResultCache &Cache,
                              llvm::function_ref<void(const Job &)> ShowProgress) {
  std::vector<size_t> Pending;
  for (size_t I = 0; I < R.Jobs.size(); ++I) {
    Job &J = R.Jobs[I];
    if (Cache.enabled())
      J.Key = cacheKey(J, Cache);
    std::optional<TUResult> Hit = Cache.lookup(J.Key);
    if (!Hit) {
      Pending.push_back(I);
      continue;
    }
    J.Result = std::move(*Hit);
    ++R.Cached;
    ShowProgress(J);
  }
  return Pending;
}

/// --cache-dir, else <build-dir>/.tensor-tidy-cache; empty: no cache.
std::string cacheDirOf(const DriverOptions &Opts) {
  if (Opts.NoCache)
    return "";
  if (!Opts.CacheDir.empty())
    return absolutePath(Opts.CacheDir);
  if (!Opts.BuildPath.empty())
    return absolutePath(Opts.BuildPath + "/.tensor-tidy-cache");
  return "";
}

/// The cache, then workers for what it does not have.
StageError analyse(Run &R) {
  const DriverOptions &Opts = R.Opts;
  ResultCache Cache(cacheDirOf(Opts));
  if (auto Why = Cache.prepare())
    llvm::errs() << "tensor-tidy: warning: " << *Why << "; not caching\n";

  std::vector<Job> &Jobs = R.Jobs;
  bool Progress =
      Jobs.size() > 1 && !Opts.Quiet && !inCI() && llvm::sys::Process::StandardErrIsDisplayed();
  size_t Finished = 0;
  auto ShowProgress = [&](const Job &J) {
    ++Finished;
    if (Progress)
      llvm::errs() << "\r\x1b[K[" << Finished << "/" << Jobs.size() << "] "
                   << relativeToCwd(J.File);
  };
  std::vector<size_t> Pending = fromCache(R, Cache, ShowProgress);
  unsigned Workers = Opts.Jobs ? Opts.Jobs : llvm::hardware_concurrency().compute_thread_count();
  // Workers take tasks: a job's index, or Jobs.size() + G to build preamble
  // G. First the PCHs and, beside them, the jobs that need none; then the
  // jobs that waited for one (parsed without it if it failed).
  std::vector<size_t> ToBuild = planShared(R, Cache, Pending), First, Second;
  for (size_t G : ToBuild)
    First.push_back(Jobs.size() + G);
  for (size_t I : Pending)
    (R.Waiting[I] ? Second : First).push_back(I);
  auto Work = [&](size_t T) {
    if (T >= Jobs.size()) {
      const PreambleGroup &P = R.Preambles[T - Jobs.size()];
      return buildPreamble(P.Command, P.Pch, P.Options);
    }
    return analyzeTU(Jobs[T].File, Jobs[T].Commands, Jobs[T].Options, R.PreambleOf[T]);
  };
  auto Done = [&](size_t T, TUResult Result) {
    if (T >= Jobs.size())
      return finishPreamble(R, R.Preambles[T - Jobs.size()], Result);
    Result.File = Jobs[T].File;
    R.WithPreamble += Result.UsedPreamble;
    forgetRejectedPreamble(R.PreambleOf[T], Result);
    Cache.store(Jobs[T].Key, Result);
    Jobs[T].Result = std::move(Result);
    ShowProgress(Jobs[T]);
  };
  std::string WorkerError = runInWorkers(Workers, Opts.TimeoutSec, First, Work, Done);
  if (WorkerError.empty())
    WorkerError = runInWorkers(Workers, Opts.TimeoutSec, Second, Work, Done);
  if (Progress)
    llvm::errs() << "\r\x1b[K";
  if (!WorkerError.empty())
    return WorkerError;
  return std::nullopt;
}

/// --tu-stats: per TU, in the order of the run, where the result came from, the
/// worker's wall time and peak resident memory. Apart from the report, whose
/// contents stay the same from run to run.
StageError writeStats(Run &R) {
  if (R.Opts.StatsFile.empty())
    return std::nullopt;
  llvm::json::Array Files;
  for (const Job &J : R.Jobs)
    Files.push_back(llvm::json::Object{
        {"file", J.File},
        {"cached", J.Result.FromCache},
        {"outcome", J.Result.Crash.empty() ? (J.Result.Failed ? "parse-error" : "analysed")
                                           : (J.Result.TimedOut ? "timeout" : "crash")},
        {"seconds", J.Result.Seconds},
        {"peak_rss_kib", static_cast<int64_t>(J.Result.PeakRssKiB)}});
  llvm::json::Value Out = llvm::json::Object{{"files", std::move(Files)}};
  if (llvm::Error E = llvm::writeToOutput(R.Opts.StatsFile, [&](llvm::raw_ostream &OS) {
        OS << llvm::formatv("{0:2}", Out) << "\n";
        return llvm::Error::success();
      }))
    return "cannot write '" + R.Opts.StatsFile + "': " + llvm::toString(std::move(E));
  return std::nullopt;
}

/// The typed finding a check emitted with diagnostic E, if any.
std::optional<tensor::Finding> typedFindingOf(const ClangTidyError &E, const TUResult &TU) {
  for (const tensor::Finding &F : TU.Findings)
    if (F.Check == E.DiagnosticName && F.Where.Offset == E.Message.FileOffset &&
        (F.Where.File == E.Message.FilePath ||
         llvm::sys::path::filename(F.Where.File) == llvm::sys::path::filename(E.Message.FilePath)))
      return F;
  return std::nullopt;
}

RunReport::Failure crashFailure(const std::string &File, const TUResult &TU) {
  std::string Why = "analysing '" + File + "' " + TU.Crash;
  if (!TU.CrashCheck.empty())
    Why += " in check '" + TU.CrashCheck + "'";
  return {File, std::move(Why),
          TU.TimedOut ? RunReport::Failure::Timeout : RunReport::Failure::Crash, TU.CrashCheck,
          TU.CrashLog};
}

/// A failure on stderr: one line, then a crash's report, indented.
void printFailure(const RunReport::Failure &F) {
  reportError(F.Reason);
  for (const std::string &L : F.Log)
    llvm::errs() << "  " << L << "\n";
}

/// Merges in the order of the jobs; a header's finding seen from several TUs
/// is reported once.
RunReport merge(const Run &R) {
  RunReport Report;
  Report.Files = R.Jobs.size();
  Report.Cached = R.Cached;
  llvm::StringSet<> Seen, Checks;
  for (const Job &J : R.Jobs) {
    if (!J.Result.Crash.empty())
      Report.Failures.push_back(crashFailure(J.File, J.Result));
    else if (J.Result.Failed)
      Report.Failures.push_back(
          {J.File, "'" + J.File + "' could not be parsed; its results are incomplete"});
    for (const ClangTidyError &E : J.Result.Errors) {
      std::string Key = E.DiagnosticName + '\0' + E.Message.FilePath + '\0' +
                        std::to_string(E.Message.FileOffset) + '\0' + E.Message.Message;
      if (!Seen.insert(Key).second)
        continue;
      Report.Errors.push_back(E);
      Report.Typed.push_back(typedFindingOf(E, J.Result));
      Report.TUs.push_back(J.File);
    }
    // This TU's configuration decides which of its checks are errors.
    std::optional<CachedGlobList> WAE;
    if (J.Options.WarningsAsErrors)
      WAE.emplace(*J.Options.WarningsAsErrors);
    for (const std::string &C : getCheckNames(J.Options, false)) {
      if (Checks.insert(C).second)
        Report.EnabledChecks.push_back(C);
      if (WAE && WAE->contains(C))
        Report.ErrorChecks.insert(C);
    }
  }
  llvm::sort(Report.EnabledChecks);
  return Report;
}

/// ", preambles: B built, U reused, N files" when the run had any.
std::string preambleSummary(const Run &R) {
  if (R.Preambles.empty())
    return "";
  return ", preambles: " + std::to_string(R.PreamblesBuilt) + " built, " +
         std::to_string(R.PreamblesReused) + " reused, " + std::to_string(R.WithPreamble) +
         " files";
}

/// Text (clang-tidy's reporter, which also applies --fix), JSON or SARIF, to
/// stdout or --output.
StageError writeReport(Run &R, const RunReport &Report, bool ApplyFixes) {
  auto BaseFS = llvm::vfs::getRealFileSystem();
  // clang-tidy's reporter prints text and applies fixes in one go (through
  // llvm::writeToOutput: a temporary renamed over the file, never a
  // half-written one). It counts promoted warnings itself; the exit code
  // reads IsWarningAsError through RunReport::errorCount instead.
  auto ClangTidyReport = [&] {
    std::vector<ClangTidyError> Errors = Report.Errors;
    unsigned PromotedByHandleErrors = 0;
    handleErrors(Errors, *R.Context, ApplyFixes ? FB_Fix : FB_NoFix, PromotedByHandleErrors,
                 BaseFS);
  };
  if (R.Opts.Format == OutputFormat::Text) {
    withStdout(R.OutFd, [&] {
      ClangTidyReport();
      llvm::outs() << Report.VerifyText;
    });
  } else {
    std::unique_ptr<llvm::raw_fd_ostream> File;
    if (R.OutFd >= 0)
      File = std::make_unique<llvm::raw_fd_ostream>(R.OutFd, /*shouldClose=*/false);
    llvm::raw_ostream &OS = File ? *File : llvm::outs();
    if (R.Opts.Format == OutputFormat::Sarif)
      writeSarif(OS, Report);
    else
      writeJson(OS, Report);
    OS.flush();
    if (ApplyFixes) {
      int Null = open("/dev/null", O_WRONLY);
      withStdout(Null, ClangTidyReport);
      if (Null >= 0)
        close(Null);
    }
  }
  if (R.OutFd >= 0 && close(R.OutFd) != 0)
    return "cannot write '" + R.Opts.Output + "'";
  return std::nullopt;
}

/// --export-fixes: the replacements of every finding, as clang-tidy writes them.
StageError exportFixes(Run &R, const RunReport &Report) {
  if (!R.FixesOS || R.Jobs.empty())
    return std::nullopt;
  std::vector<ClangTidyError> ToExport = Report.Errors;
  exportReplacements(R.Jobs.front().File, ToExport, *R.FixesOS);
  R.FixesOS->close();
  if (R.FixesOS->has_error()) {
    R.FixesOS->clear_error();
    return "cannot write '" + R.Opts.ExportFixes + "'";
  }
  return std::nullopt;
}

/// The report, --export-fixes, then the failures and the summary line.
StageError emit(Run &R, const RunReport &Report) {
  // As clang-tidy without --fix-errors: no fixes computed on a broken AST.
  bool ApplyFixes = R.Opts.Fix;
  if (ApplyFixes && llvm::any_of(Report.Errors, isCompilerError)) {
    llvm::errs() << "tensor-tidy: warning: found compiler errors; fixes not applied\n";
    ApplyFixes = false;
  }
  if (StageError E = writeReport(R, Report, ApplyFixes))
    return E;
  if (StageError E = exportFixes(R, Report))
    return E;
  llvm::outs().flush();
  for (const RunReport::Failure &F : Report.Failures)
    printFailure(F);
  unsigned NumErrors = Report.errorCount();
  if (!R.Opts.Quiet && R.Jobs.size() > 1)
    llvm::errs() << "tensor-tidy: " << R.Jobs.size() << " files (" << R.Cached << " from cache), "
                 << Report.Errors.size() - NumErrors << " warnings, " << NumErrors << " errors"
                 << preambleSummary(R) << "\n";
  return std::nullopt;
}

RunReport usageError(const std::string &Msg) {
  reportError(Msg);
  RunReport Report;
  Report.Exit = exitCodeFor({/*UsageError=*/true});
  return Report;
}

} // namespace

RunReport runDriver(DriverOptions &Opts) {
  Run R{Opts};
  if (!Opts.Explain.empty()) {
    if (StageError E = answerQuery(R))
      return usageError(*E);
    return RunReport();
  }
  if (StageError E = configure(R))
    return usageError(*E);
  if (Opts.ListChecks || Opts.DumpConfig) {
    if (StageError E = answerQuery(R))
      return usageError(*E);
    return RunReport();
  }
  for (auto Stage : {loadDatabase, makeJobs, selectShard, openOutputs, analyse, writeStats})
    if (StageError E = Stage(R))
      return usageError(*E);

  RunReport Report = merge(R);
  if (Opts.AfterAnalysis)
    Opts.AfterAnalysis(Report, *R.DB, R.Files);
  RunOutcome Outcome;
  Outcome.VerificationFailed = Report.VerificationFailed;
  Outcome.TUFailed = !Report.Failures.empty();
  Outcome.ErrorFindings = Report.errorCount();
  Report.Exit = exitCodeFor(Outcome);
  if (StageError E = emit(R, Report)) {
    reportError(*E);
    Report.Exit = exitCodeFor({/*UsageError=*/true});
  }
  return Report;
}

} // namespace tensor_tidy
