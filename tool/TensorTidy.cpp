// tensor-tidy: runs the tensor-* checks through clang-tidy's library.
// Thin on purpose: option parsing and reporting live here, analysis in rules/.
#include "ClangTidy.h"
#include "ClangTidyDiagnosticConsumer.h"
#include "ClangTidyOptions.h"

#include "clang/Tooling/CommonOptionsParser.h"
#include "clang/Tooling/CompilationDatabase.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/VirtualFileSystem.h"
#include "llvm/Support/raw_ostream.h"

using namespace clang;
using namespace clang::tidy;
namespace cl = llvm::cl;

namespace clang::tidy {
extern volatile int TensorTidyModuleAnchorSource;
static int LLVM_ATTRIBUTE_UNUSED TensorTidyModuleAnchorDestination = TensorTidyModuleAnchorSource;
} // namespace clang::tidy

static cl::OptionCategory Category("tensor-tidy options");

static cl::opt<std::string> Checks("checks", cl::desc("Comma-separated globs of checks (default: tensor-*)"),
                                   cl::init(""), cl::cat(Category));
static cl::opt<std::string> WarningsAsErrors("warnings-as-errors",
                                             cl::desc("Checks whose warnings become errors"),
                                             cl::init(""), cl::cat(Category));
static cl::opt<std::string> HeaderFilter("header-filter",
                                         cl::desc("Regex of headers to report diagnostics from"),
                                         cl::init(""), cl::cat(Category));
static cl::opt<std::string> Config("config", cl::desc("Inline configuration in .clang-tidy format"),
                                   cl::init(""), cl::cat(Category));
static cl::opt<bool> Fix("fix", cl::desc("Apply fix-its in place"), cl::cat(Category));
static cl::opt<std::string> ExportFixes("export-fixes", cl::desc("Write fixes as YAML to this file"),
                                        cl::value_desc("file"), cl::cat(Category));
static cl::opt<bool> ListChecks("list-checks", cl::desc("List the enabled checks and exit"),
                                cl::cat(Category));
static cl::opt<bool> Quiet("quiet", cl::desc("No progress or summary lines"), cl::cat(Category));

static std::unique_ptr<ClangTidyOptionsProvider> makeOptionsProvider() {
  ClangTidyGlobalOptions Global;
  ClangTidyOptions Default = ClangTidyOptions::getDefaults();
  Default.Checks = "-*,tensor-*";
  ClangTidyOptions Override;
  if (!Checks.empty())
    Override.Checks = Checks;
  if (!WarningsAsErrors.empty())
    Override.WarningsAsErrors = WarningsAsErrors;
  if (!HeaderFilter.empty())
    Override.HeaderFilterRegex = HeaderFilter;
  if (!Config.empty()) {
    auto Parsed = parseConfiguration(llvm::MemoryBufferRef(Config, "--config"));
    if (!Parsed) {
      llvm::errs() << "tensor-tidy: error: invalid --config: " << Parsed.getError().message() << "\n";
      return nullptr;
    }
    return std::make_unique<ConfigOptionsProvider>(std::move(Global), std::move(Default),
                                                   std::move(*Parsed), std::move(Override));
  }
  return std::make_unique<FileOptionsProvider>(std::move(Global), std::move(Default),
                                               std::move(Override), llvm::vfs::getRealFileSystem());
}

int main(int argc, const char **argv) {
  llvm::InitLLVM X(argc, argv);
  auto Parser = tooling::CommonOptionsParser::create(argc, argv, Category, cl::ZeroOrMore);
  if (!Parser) {
    llvm::errs() << "tensor-tidy: error: " << llvm::toString(Parser.takeError()) << "\n";
    return 2;
  }
  auto Provider = makeOptionsProvider();
  if (!Provider)
    return 2;
  const auto &Files = Parser->getSourcePathList();
  std::string FirstFile = Files.empty() ? "dummy.cpp" : Files.front();
  ClangTidyOptions Effective = Provider->getOptions(FirstFile);

  if (ListChecks) {
    llvm::outs() << "Enabled checks:\n";
    for (const auto &Name : getCheckNames(Effective, false))
      llvm::outs() << "    " << Name << "\n";
    return 0;
  }
  if (Files.empty()) {
    llvm::errs() << "tensor-tidy: error: no input files\n";
    return 2;
  }
  if (getCheckNames(Effective, false).empty()) {
    llvm::errs() << "tensor-tidy: error: no checks enabled\n";
    return 2;
  }

  auto BaseFS = llvm::makeIntrusiveRefCnt<llvm::vfs::OverlayFileSystem>(llvm::vfs::getRealFileSystem());
  ClangTidyContext Context(std::move(Provider));
  std::vector<ClangTidyError> Errors =
      runClangTidy(Context, Parser->getCompilations(), Files, BaseFS, Fix || !ExportFixes.empty());
  bool FoundErrors = llvm::any_of(Errors, [](const ClangTidyError &E) {
    return E.DiagLevel == ClangTidyError::Error;
  });

  unsigned WErrorCount = 0;
  handleErrors(Errors, Context, Fix ? FB_Fix : FB_NoFix, WErrorCount, BaseFS);

  if (!ExportFixes.empty()) {
    std::error_code EC;
    llvm::raw_fd_ostream OS(ExportFixes, EC, llvm::sys::fs::OF_None);
    if (EC) {
      llvm::errs() << "tensor-tidy: error: cannot write '" << ExportFixes << "': " << EC.message() << "\n";
      return 2;
    }
    exportReplacements(FirstFile, Errors, OS);
  }
  if (FoundErrors)
    return 3;
  return WErrorCount ? 1 : 0;
}
