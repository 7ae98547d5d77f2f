// tensor-tidy: runs the tensor-* checks through clang-tidy's library.
// Thin on purpose: the command line lives here, the run in Driver.cpp, the
// analysis in rules/.
#include "CrashReport.h"
#include "Docs.h"
#include "Driver.h"
#include "Merge.h"
#include "Paths.h"
#include "verify/Verify.h"

#include "clang/Tooling/CompilationDatabase.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/PrettyStackTrace.h"
#include "llvm/Support/raw_ostream.h"

using namespace tensor_tidy;
namespace cl = llvm::cl;

namespace clang::tidy {
extern volatile int TensorTidyModuleAnchorSource;
static int LLVM_ATTRIBUTE_UNUSED TensorTidyModuleAnchorDestination = TensorTidyModuleAnchorSource;
} // namespace clang::tidy

// A sanitized build (-DTT_SANITIZE=ON): clang's frontend leaves its AST and
// options unfreed on purpose, so leak checking would report only that; a
// sanitizer's report ends in abort() so that LLVM's crash handler adds the
// stack dump that names the running check (CrashReport.h).
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
extern "C" const char *__asan_default_options() { return "detect_leaks=0:abort_on_error=1"; }
#endif
#endif

static cl::OptionCategory Category("tensor-tidy options");

static cl::list<std::string> Files(cl::Positional, cl::desc("[<file> ...]"), cl::cat(Category));
static cl::opt<std::string> BuildPath("p", cl::desc("Build directory with compile_commands.json"),
                                      cl::value_desc("build-dir"), cl::cat(Category));
static cl::opt<std::string> Checks("checks",
                                   cl::desc("Comma-separated globs of checks (default: tensor-*)"),
                                   cl::cat(Category));
static cl::opt<std::string> WarningsAsErrors("warnings-as-errors",
                                             cl::desc("Globs of checks whose warnings are errors"),
                                             cl::cat(Category));
static cl::opt<std::string> HeaderFilter("header-filter",
                                         cl::desc("Regex of headers to report diagnostics from"),
                                         cl::cat(Category));
static cl::opt<bool> SystemHeaders("system-headers", cl::desc("Report findings in system headers"),
                                   cl::cat(Category));
static cl::opt<std::string> Config("config",
                                   cl::desc("Configuration in .clang-tidy format (YAML/JSON)"),
                                   cl::cat(Category));
static cl::opt<std::string> ConfigFile("config-file",
                                       cl::desc("Read the configuration from this file"),
                                       cl::value_desc("file"), cl::cat(Category));
static cl::list<std::string> ExtraArgs("extra-arg", cl::desc("Append an argument to each compile"),
                                       cl::cat(Category));
static cl::list<std::string> ExtraArgsBefore("extra-arg-before",
                                             cl::desc("Prepend an argument to each compile"),
                                             cl::cat(Category));
static cl::opt<bool> Fix("fix", cl::desc("Apply the fix-its in place"), cl::cat(Category));
static cl::opt<std::string>
    ExportFixes("export-fixes", cl::desc("Write fixes as YAML for clang-apply-replacements"),
                cl::value_desc("file"), cl::cat(Category));
static cl::opt<std::string>
    Stats("tu-stats", cl::desc("Write each TU's time and peak memory (of its worker) as JSON"),
          cl::value_desc("file"), cl::cat(Category));
static cl::opt<bool> ListChecks("list-checks", cl::desc("List the enabled checks and exit"),
                                cl::cat(Category));
static cl::opt<bool> DumpConfig("dump-config",
                                cl::desc("Print the effective configuration for the first file "
                                         "(or the working directory) and exit"),
                                cl::cat(Category));
static cl::opt<std::string> Explain("explain", cl::desc("Print the documentation of a check"),
                                    cl::value_desc("check"), cl::cat(Category));
static cl::opt<OutputFormat>
    Format("format", cl::desc("Output format"), cl::init(OutputFormat::Text),
           cl::values(clEnumValN(OutputFormat::Text, "text", "clang-style diagnostics (default)"),
                      clEnumValN(OutputFormat::Sarif, "sarif", "SARIF 2.1.0"),
                      clEnumValN(OutputFormat::Json, "json", "tensor-tidy's JSON")),
           cl::cat(Category));
static cl::opt<std::string> Output("output", cl::desc("Write the report to this file"),
                                   cl::value_desc("file"), cl::cat(Category));
static cl::alias OutputShort("o", cl::desc("Alias for --output"), cl::aliasopt(Output),
                             cl::cat(Category));
static cl::opt<unsigned> Jobs("j", cl::Prefix, cl::desc("Parallel workers (default: one per core)"),
                              cl::init(0), cl::cat(Category));
static cl::opt<unsigned>
    Timeout("timeout", cl::desc("Give up on a TU after this many seconds (default: never)"),
            cl::value_desc("seconds"), cl::init(0), cl::cat(Category));
static cl::opt<bool> Quiet("quiet", cl::desc("No progress or summary lines"), cl::cat(Category));
static cl::opt<std::string>
    CacheDir("cache-dir", cl::desc("Result cache (default: <build-dir>/.tensor-tidy-cache)"),
             cl::value_desc("dir"), cl::cat(Category));
static cl::opt<bool> NoCache("no-cache", cl::desc("Neither read nor write the result cache"),
                             cl::cat(Category));

static cl::opt<bool>
    NoPch("no-pch",
          cl::desc("Parse every file's includes itself (default: TUs that share their leading "
                   "#include <...> lines and flags share one precompiled header in the cache)"),
          cl::cat(Category));

static cl::opt<std::string>
    Shard("shard",
          cl::desc("Analyse only the K-th of N deterministic parts of the files (CI matrix "
                   "jobs); join the parts' reports with --merge"),
          cl::value_desc("K/N"), cl::cat(Category));
static cl::opt<bool> Merge("merge",
                           cl::desc("Join the JSON or SARIF reports named (from --shard runs) "
                                    "into one, as an unsharded run writes it"),
                           cl::cat(Category));

static const char Overview[] =
    "Finds tensor aliasing, layout and autograd hazards in C++ (torch::Tensor, tt::Tensor).\n\n"
    "  tensor-tidy -p <build-dir> [files...]   files from compile_commands.json (all if none)\n"
    "  tensor-tidy <file> -- <compiler flags>  one file without a database\n\n"
    "Exit codes: 0 clean (warnings only), 1 findings at error severity, 2 usage, configuration\n"
    "or database error, 3 a file could not be parsed (the rest is still reported), 4 with\n"
    "--verify: a fix failed verification or a program could not be verified. When several\n"
    "apply: 2, then 4, then 3, then 1.\n";

/// The parsed command-line options, as the driver takes them.
static void fillOptions(DriverOptions &Opts) {
  Opts.Files.assign(Files.begin(), Files.end());
  Opts.BuildPath = BuildPath;
  if (Checks.getNumOccurrences())
    Opts.Checks = Checks;
  if (WarningsAsErrors.getNumOccurrences())
    Opts.WarningsAsErrors = WarningsAsErrors;
  if (HeaderFilter.getNumOccurrences())
    Opts.HeaderFilter = HeaderFilter;
  if (SystemHeaders.getNumOccurrences())
    Opts.SystemHeaders = SystemHeaders;
  Opts.Config = Config;
  Opts.ConfigFile = ConfigFile;
  Opts.ExtraArgs.assign(ExtraArgs.begin(), ExtraArgs.end());
  Opts.ExtraArgsBefore.assign(ExtraArgsBefore.begin(), ExtraArgsBefore.end());
  Opts.Fix = Fix;
  Opts.ExportFixes = ExportFixes;
  Opts.StatsFile = Stats;
  Opts.ListChecks = ListChecks;
  Opts.DumpConfig = DumpConfig;
  Opts.Explain = Explain;
  Opts.Format = Format;
  Opts.Output = Output;
  Opts.Jobs = Jobs;
  Opts.TimeoutSec = Timeout;
  Opts.Quiet = Quiet;
  Opts.CacheDir = CacheDir;
  Opts.NoCache = NoCache;
  Opts.NoPch = NoPch;
  Opts.Shard = Shard;
}

/// Parses argv into Opts (the flags after "--" into its fixed database);
/// false, with one error line printed, on a usage error.
static bool parseCommandLine(int argc, const char **argv, DriverOptions &Opts) {
  std::string DbError;
  Opts.FixedDatabase =
      clang::tooling::FixedCompilationDatabase::loadFromCommandLine(argc, argv, DbError);
  std::string ParseErrors;
  llvm::raw_string_ostream ErrOS(ParseErrors);
  if (!cl::ParseCommandLineOptions(argc, argv, Overview, &ErrOS)) {
    ErrOS.flush();
    llvm::errs() << llvm::StringRef(ParseErrors).trim().split('\n').first << "\n";
    return false;
  }
  if (!DbError.empty()) {
    llvm::StringRef Line = llvm::StringRef(DbError).trim().split('\n').first;
    Line.consume_front("error: ");
    reportError(Line);
    return false;
  }
  fillOptions(Opts);
  return true;
}

int main(int argc, const char **argv) {
  llvm::InitLLVM X(argc, argv);
  // The first line of a crashed worker's report (CrashReport.h), not LLVM's.
  llvm::setBugReportMsg(CrashBanner);
  setExecutablePath(argv[0]);
  verify::registerOptions(Category);
  cl::HideUnrelatedOptions(Category);
  cl::SetVersionPrinter([](llvm::raw_ostream &OS) { OS << "tensor-tidy " TT_VERSION "\n"; });

  DriverOptions Opts;
  if (!parseCommandLine(argc, argv, Opts))
    return ExitUsage;
  if (Merge)
    return mergeReports(Opts.Files, Opts.Output);

  // --verify (tool/verify/) hooks in here: register its options before the
  // parse above, then set Opts.AfterAnalysis when it is enabled.
  if (verify::enabled())
    return verify::runVerify(Opts, argv[0]);

  return runDriver(Opts).Exit;
}
