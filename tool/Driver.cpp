#include "Driver.h"

#include "Cache.h"
#include "Docs.h"
#include "Report.h"
#include "Scheduler.h"
#include "Worker.h"

#include "ClangTidy.h"
#include "ClangTidyOptions.h"
#include "GlobList.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/SHA1.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/VirtualFileSystem.h"
#include "llvm/Support/raw_ostream.h"

#include <fcntl.h>
#include <unistd.h>

#ifndef TT_VERSION
#define TT_VERSION "0"
#endif

using namespace clang;
using namespace clang::tidy;
using clang::tooling::CompileCommand;

namespace tensor_tidy {
namespace {

int fail(const llvm::Twine &Msg, int Code = ExitUsage) {
  llvm::errs() << "tensor-tidy: error: " << Msg << "\n";
  return Code;
}

/// Configuration problems found while reading .tensor-tidy/.clang-tidy files.
using ConfigErrors = std::shared_ptr<std::vector<std::string>>;

/// parseConfiguration, keeping the first YAML diagnostic as one line.
llvm::ErrorOr<ClangTidyOptions> parseConfig(llvm::MemoryBufferRef Buf, std::string &Error) {
  auto Parsed = parseConfigurationWithDiags(Buf, [&](const llvm::SMDiagnostic &D) {
    if (!Error.empty())
      return;
    llvm::raw_string_ostream OS(Error);
    OS << D.getFilename() << ":" << D.getLineNo() << ":" << D.getColumnNo() + 1 << ": "
       << D.getMessage();
  });
  if (!Parsed && Error.empty())
    Error = (Buf.getBufferIdentifier() + ": " + Parsed.getError().message()).str();
  return Parsed;
}

/// FileOptionsProvider with our own config file names. The constructor that
/// takes handlers leaves the file system unset in LLVM 19.
class TensorTidyFileOptionsProvider : public FileOptionsProvider {
public:
  using FileOptionsProvider::ConfigFileHandlers;
  TensorTidyFileOptionsProvider(ClangTidyOptions Default, ClangTidyOptions Override,
                                ConfigFileHandlers Handlers)
      : FileOptionsProvider(ClangTidyGlobalOptions(), std::move(Default), std::move(Override),
                            std::move(Handlers)) {
    FS = llvm::vfs::getRealFileSystem();
  }
};

std::unique_ptr<ClangTidyOptionsProvider> makeProvider(const DriverOptions &Opts,
                                                       ConfigErrors Errors, std::string &Error) {
  ClangTidyOptions Default = ClangTidyOptions::getDefaults();
  Default.Checks = "-*,tensor-*";
  ClangTidyOptions Override;
  Override.Checks = Opts.Checks;
  Override.WarningsAsErrors = Opts.WarningsAsErrors;
  Override.HeaderFilterRegex = Opts.HeaderFilter;
  Override.SystemHeaders = Opts.SystemHeaders;
  if (!Opts.ExtraArgs.empty())
    Override.ExtraArgs = Opts.ExtraArgs;
  if (!Opts.ExtraArgsBefore.empty())
    Override.ExtraArgsBefore = Opts.ExtraArgsBefore;

  std::string Text = Opts.Config, Name = "--config";
  if (!Opts.ConfigFile.empty()) {
    if (!Opts.Config.empty()) {
      Error = "--config and --config-file cannot be used together";
      return nullptr;
    }
    auto Buf = llvm::MemoryBuffer::getFile(Opts.ConfigFile, /*IsText=*/true);
    if (!Buf) {
      Error = "cannot read config file '" + Opts.ConfigFile + "': " + Buf.getError().message();
      return nullptr;
    }
    Text = (*Buf)->getBuffer().str();
    Name = Opts.ConfigFile;
  }
  if (!Text.empty() || !Opts.ConfigFile.empty()) {
    auto Parsed = parseConfig(llvm::MemoryBufferRef(Text, Name), Error);
    if (!Parsed) {
      Error = "invalid configuration: " + Error;
      return nullptr;
    }
    return std::make_unique<ConfigOptionsProvider>(ClangTidyGlobalOptions(), std::move(Default),
                                                   std::move(*Parsed), std::move(Override));
  }
  // In each directory a .tensor-tidy file wins over a .clang-tidy file.
  auto Handler = [Errors](llvm::MemoryBufferRef Buf) -> llvm::ErrorOr<ClangTidyOptions> {
    std::string Msg;
    auto Parsed = parseConfig(Buf, Msg);
    if (Parsed)
      return Parsed;
    Errors->push_back("invalid configuration: " + Msg);
    return ClangTidyOptions(); // reported by the driver; keeps the provider quiet
  };
  TensorTidyFileOptionsProvider::ConfigFileHandlers Handlers{{".tensor-tidy", Handler},
                                                   {".clang-tidy", Handler}};
  return std::make_unique<TensorTidyFileOptionsProvider>(std::move(Default), std::move(Override),
                                                         std::move(Handlers));
}

std::string absolute(llvm::StringRef Path) {
  llvm::SmallString<256> P(Path);
  llvm::sys::fs::make_absolute(P);
  llvm::sys::path::remove_dots(P, /*remove_dot_dot=*/true);
  return std::string(P);
}

std::string relativeToCwd(llvm::StringRef Path) {
  llvm::SmallString<256> Cwd;
  llvm::sys::fs::current_path(Cwd);
  llvm::StringRef Rel = Path;
  if (Rel.consume_front(Cwd) && Rel.consume_front("/"))
    return Rel.str();
  return Path.str();
}

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
  Add("tensor-tidy " TT_VERSION);
  // The executable itself stands for the checks' version while developing.
  llvm::sys::fs::file_status St;
  if (!llvm::sys::fs::status(executablePath(), St)) {
    Add(std::to_string(St.getSize()));
    Add(std::to_string(St.getLastModificationTime().time_since_epoch().count()));
  }
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

} // namespace

int runDriver(DriverOptions &Opts) {
  if (!Opts.Explain.empty()) {
    CheckDoc Doc = findCheckDoc(Opts.Explain);
    if (Doc.Path.empty())
      return fail("no documentation for check '" + Opts.Explain + "' (see --list-checks)");
    llvm::outs() << Doc.Markdown;
    return ExitClean;
  }

  auto Errors = std::make_shared<std::vector<std::string>>();
  std::string Error;
  std::unique_ptr<ClangTidyOptionsProvider> Provider = makeProvider(Opts, Errors, Error);
  if (!Provider)
    return fail(Error);
  ClangTidyContext Context(std::move(Provider));
  if (!Errors->empty())
    return fail(Errors->front());

  for (std::string &F : Opts.Files)
    F = absolute(F);

  if (Opts.ListChecks || Opts.DumpConfig) {
    std::string File = Opts.Files.empty() ? absolute("dummy.cpp") : Opts.Files.front();
    ClangTidyOptions Effective = Context.getOptionsForFile(File);
    if (!Errors->empty())
      return fail(Errors->front());
    if (Opts.DumpConfig) {
      // Every option of the enabled checks, as they read it, then any other
      // key the configuration sets.
      ClangTidyOptions::OptionMap CheckOptions = getCheckOptions(Effective, false);
      for (const auto &KV : Effective.CheckOptions)
        CheckOptions.try_emplace(KV.getKey(), KV.getValue());
      Effective.CheckOptions = std::move(CheckOptions);
      llvm::outs() << configurationAsText(Effective) << "\n";
      return ExitClean;
    }
    llvm::outs() << "Enabled checks:\n";
    for (const std::string &Name : getCheckNames(Effective, false))
      llvm::outs() << "    " << Name << "\n";
    llvm::outs() << "\n";
    return ExitClean;
  }

  for (const std::string &F : Opts.Files) {
    if (!llvm::sys::fs::exists(F))
      return fail("no such file: '" + F + "'");
    if (llvm::sys::fs::is_directory(F))
      return fail("'" + F + "' is a directory, not a source file");
  }

  // The compilation database.
  std::unique_ptr<tooling::CompilationDatabase> DB = std::move(Opts.FixedDatabase);
  bool FromFlags = DB != nullptr;
  if (DB && !Opts.BuildPath.empty())
    return fail("-p and '-- <compiler flags>' cannot be used together");
  if (!DB && !Opts.BuildPath.empty()) {
    std::string Why;
    if (!llvm::sys::fs::is_directory(Opts.BuildPath))
      return fail("build directory '" + Opts.BuildPath + "' does not exist");
    DB = tooling::CompilationDatabase::loadFromDirectory(Opts.BuildPath, Why);
    if (!DB)
      return fail("cannot load the compilation database in '" + Opts.BuildPath +
                  "': " + llvm::StringRef(Why).trim().split('\n').first);
  }
  if (!DB && !Opts.Files.empty()) {
    std::string Why;
    DB = tooling::CompilationDatabase::autoDetectFromSource(Opts.Files.front(), Why);
    if (!DB)
      return fail("no compilation database found for '" + Opts.Files.front() +
                  "'; pass -p <build-dir> or '-- <compiler flags>'");
  }
  if (!DB)
    return fail("no input files; pass files, or -p <build-dir> to analyse every file in its "
                "compile_commands.json");

  std::vector<std::string> Files = Opts.Files;
  if (Files.empty()) {
    Files = DB->getAllFiles();
    llvm::sort(Files);
    Files.erase(std::unique(Files.begin(), Files.end()), Files.end());
    if (Files.empty())
      return fail("the compilation database in '" + Opts.BuildPath + "' has no entries");
  }

  // JSON databases infer commands for files they do not list (clangd's
  // interpolation); a file named on the command line must be listed.
  llvm::StringSet<> Listed;
  if (!FromFlags)
    for (const std::string &F : DB->getAllFiles())
      Listed.insert(absolute(F));

  std::vector<Job> Jobs;
  llvm::StringMap<bool> HasChecks;
  for (const std::string &F : Files) {
    Job J;
    J.File = F;
    J.Commands = DB->getCompileCommands(F);
    if (J.Commands.empty() || (!Listed.empty() && !Listed.contains(F)))
      return fail("'" + F + "' is not in the compilation database" +
                  (Opts.BuildPath.empty() ? "" : " in '" + Opts.BuildPath + "'"));
    J.Options = Context.getOptionsForFile(F);
    if (!Errors->empty())
      return fail(Errors->front());
    std::string Checks = J.Options.Checks.value_or("");
    auto [It, New] = HasChecks.try_emplace(Checks, false);
    if (New)
      It->second = !getCheckNames(J.Options, false).empty();
    if (!It->second)
      return fail("no checks enabled (Checks: '" + Checks + "')");
    Jobs.push_back(std::move(J));
  }

  // Outputs are opened before the work so that a bad path fails fast.
  int OutFd = -1;
  if (!Opts.Output.empty())
    if (std::error_code EC = llvm::sys::fs::openFileForWrite(Opts.Output, OutFd))
      return fail("cannot write '" + Opts.Output + "': " + EC.message());
  std::unique_ptr<llvm::raw_fd_ostream> FixesOS;
  if (!Opts.ExportFixes.empty()) {
    std::error_code EC;
    FixesOS = std::make_unique<llvm::raw_fd_ostream>(Opts.ExportFixes, EC);
    if (EC)
      return fail("cannot write '" + Opts.ExportFixes + "': " + EC.message());
  }

  // The cache, then workers for what it does not have.
  std::string CacheDir;
  if (!Opts.NoCache) {
    if (!Opts.CacheDir.empty())
      CacheDir = absolute(Opts.CacheDir);
    else if (!Opts.BuildPath.empty())
      CacheDir = absolute(Opts.BuildPath + "/.tensor-tidy-cache");
  }
  ResultCache Cache(CacheDir);
  if (auto Why = Cache.prepare())
    llvm::errs() << "tensor-tidy: warning: " << *Why << "; not caching\n";

  bool Progress = Jobs.size() > 1 && !Opts.Quiet && !inCI() &&
                  llvm::sys::Process::StandardErrIsDisplayed();
  size_t Finished = 0;
  auto ShowProgress = [&](const Job &J) {
    ++Finished;
    if (Progress)
      llvm::errs() << "\r\x1b[K[" << Finished << "/" << Jobs.size() << "] "
                   << relativeToCwd(J.File);
  };

  std::vector<size_t> Pending;
  unsigned Cached = 0;
  for (size_t I = 0; I < Jobs.size(); ++I) {
    if (!Cache.enabled()) {
      Pending.push_back(I);
      continue;
    }
    Jobs[I].Key = cacheKey(Jobs[I], Cache);
    if (std::optional<TUResult> Hit = Cache.lookup(Jobs[I].Key)) {
      Jobs[I].Result = std::move(*Hit);
      ++Cached;
      ShowProgress(Jobs[I]);
    } else {
      Pending.push_back(I);
    }
  }
  unsigned Workers = Opts.Jobs ? Opts.Jobs : llvm::hardware_concurrency().compute_thread_count();
  std::string WorkerError = runInWorkers(
      Workers, Opts.TimeoutSec, Pending,
      [&](size_t I) { return analyzeTU(Jobs[I].File, Jobs[I].Commands, Jobs[I].Options); },
      [&](size_t I, TUResult R) {
        R.File = Jobs[I].File;
        Cache.store(Jobs[I].Key, R);
        Jobs[I].Result = std::move(R);
        ShowProgress(Jobs[I]);
      });
  if (Progress)
    llvm::errs() << "\r\x1b[K";
  if (!WorkerError.empty())
    return fail(WorkerError);

  // Merge in the order of the jobs; a header's finding seen from several TUs
  // is reported once.
  RunReport Report;
  Report.Files = Jobs.size();
  Report.Cached = Cached;
  llvm::StringSet<> Seen, Checks;
  for (const Job &J : Jobs) {
    if (!J.Result.Crash.empty())
      Report.Failures.emplace_back(J.File, "analysing '" + J.File + "' " + J.Result.Crash);
    else if (J.Result.Failed)
      Report.Failures.emplace_back(
          J.File, "'" + J.File + "' could not be parsed; its results are incomplete");
    for (const ClangTidyError &E : J.Result.Errors) {
      std::string Key = E.DiagnosticName + '\0' + E.Message.FilePath + '\0' +
                        std::to_string(E.Message.FileOffset) + '\0' + E.Message.Message;
      if (Seen.insert(Key).second)
        Report.Errors.push_back(E);
    }
    for (const std::string &C : getCheckNames(J.Options, false))
      if (Checks.insert(C).second)
        Report.EnabledChecks.push_back(C);
    if (J.Options.WarningsAsErrors) {
      CachedGlobList WAE(*J.Options.WarningsAsErrors);
      for (const std::string &C : Report.EnabledChecks)
        if (WAE.contains(C))
          Report.ErrorChecks.insert(C);
    }
  }
  llvm::sort(Report.EnabledChecks);

  int HookCode = 0;
  std::string HookReport;
  if (Opts.AfterAnalysis)
    HookCode = Opts.AfterAnalysis(Report.Errors, *DB, Files, HookReport);

  // Output, then fixes. clang-tidy's reporter prints text and applies fixes
  // in one go (through llvm::writeToOutput: a temporary renamed over the
  // file, never a half-written one).
  // As clang-tidy without --fix-errors: no fixes computed on a broken AST.
  if (Opts.Fix && llvm::any_of(Report.Errors, isCompilerError)) {
    llvm::errs() << "tensor-tidy: warning: found compiler errors; fixes not applied\n";
    Opts.Fix = false;
  }
  unsigned WarningsAsErrors = 0;
  auto BaseFS = llvm::vfs::getRealFileSystem();
  auto ClangTidyReport = [&] {
    handleErrors(Report.Errors, Context, Opts.Fix ? FB_Fix : FB_NoFix, WarningsAsErrors, BaseFS);
  };
  if (Opts.Format == OutputFormat::Text) {
    withStdout(OutFd, ClangTidyReport);
  } else {
    std::unique_ptr<llvm::raw_fd_ostream> File;
    if (OutFd >= 0)
      File = std::make_unique<llvm::raw_fd_ostream>(OutFd, /*shouldClose=*/false);
    llvm::raw_ostream &OS = File ? *File : llvm::outs();
    if (Opts.Format == OutputFormat::Sarif)
      writeSarif(OS, Report);
    else
      writeJson(OS, Report);
    OS.flush();
    if (Opts.Fix) {
      int Null = open("/dev/null", O_WRONLY);
      withStdout(Null, ClangTidyReport);
      if (Null >= 0)
        close(Null);
    }
  }
  if (OutFd >= 0 && close(OutFd) != 0)
    return fail("cannot write '" + Opts.Output + "'");
  if (FixesOS) {
    std::vector<ClangTidyError> ToExport = Report.Errors;
    exportReplacements(Jobs.front().File, ToExport, *FixesOS);
    FixesOS->close();
    if (FixesOS->has_error()) {
      FixesOS->clear_error();
      return fail("cannot write '" + Opts.ExportFixes + "'");
    }
  }

  llvm::outs() << HookReport;
  llvm::outs().flush();
  for (const auto &F : Report.Failures)
    llvm::errs() << "tensor-tidy: error: " << F.second << "\n";
  unsigned NumErrors = llvm::count_if(Report.Errors, [](const ClangTidyError &E) {
    return llvm::StringRef(levelName(E)) == "error";
  });
  if (!Opts.Quiet && Jobs.size() > 1)
    llvm::errs() << "tensor-tidy: " << Jobs.size() << " files (" << Cached << " from cache), "
                 << Report.Errors.size() - NumErrors << " warnings, " << NumErrors
                 << " errors\n";
  if (!Report.Failures.empty())
    return ExitParseFailed;
  if (HookCode)
    return HookCode;
  return NumErrors ? ExitFindings : ExitClean;
}

} // namespace tensor_tidy
