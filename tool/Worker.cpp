#include "Worker.h"

#include "ClangTidy.h"
#include "ClangTidyModule.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Frontend/CompilerInstance.h"
#include "clang/Frontend/FrontendActions.h"
#include "clang/Frontend/MultiplexConsumer.h"
#include "clang/Lex/PreprocessorOptions.h"
#include "clang/Tooling/ArgumentsAdjusters.h"
#include "clang/Tooling/Tooling.h"

#include <cstdlib>

using namespace clang;
using namespace clang::tidy;
using namespace clang::tooling;

namespace tensor_tidy {
namespace {

/// The compile commands of the one file this worker analyses.
class OneFileDatabase : public CompilationDatabase {
public:
  explicit OneFileDatabase(std::vector<CompileCommand> Commands) : Commands(std::move(Commands)) {}
  std::vector<CompileCommand> getCompileCommands(StringRef) const override { return Commands; }

private:
  std::vector<CompileCommand> Commands;
};

/// Runs before the checks' matchers: restricts the AST traversal to
/// declarations outside system headers (as clangd restricts it to the main
/// file). Findings there are dropped unless --system-headers, and walking
/// torch/torch.h's AST costs as much as a check's whole run on user code.
class SkipSystemHeaders : public ASTConsumer {
  void HandleTranslationUnit(ASTContext &Ctx) override {
    const SourceManager &SM = Ctx.getSourceManager();
    std::vector<Decl *> Scope;
    for (Decl *D : Ctx.getTranslationUnitDecl()->decls())
      if (!SM.isInSystemHeader(SM.getExpansionLoc(D->getLocation())))
        Scope.push_back(D);
    Ctx.setTraversalScope(Scope);
  }
};

/// clang-tidy's ActionFactory (ClangTidy.cpp, runClangTidy), plus a look at
/// the source manager at the end of each TU for the cache's dependency list.
class ActionFactory : public FrontendActionFactory {
public:
  ActionFactory(ClangTidyContext &Context, TUResult &Result, bool SystemHeaders)
      : ConsumerFactory(Context), Result(Result), SystemHeaders(SystemHeaders) {}
  std::unique_ptr<FrontendAction> create() override {
    return std::make_unique<Action>(&ConsumerFactory, Result, SystemHeaders);
  }
  bool runInvocation(std::shared_ptr<CompilerInvocation> Invocation, FileManager *Files,
                     std::shared_ptr<PCHContainerOperations> PCHContainerOps,
                     DiagnosticConsumer *DiagConsumer) override {
    Invocation->getPreprocessorOpts().SetUpStaticAnalyzer = true;
    // The worker exits after its TU: skip freeing the AST, as clang's own
    // driver does (-disable-free); for torch/torch.h that is a good part of
    // a second.
    Invocation->getFrontendOpts().DisableFree = true;
    return FrontendActionFactory::runInvocation(Invocation, Files, PCHContainerOps, DiagConsumer);
  }

private:
  class Action : public ASTFrontendAction {
  public:
    Action(ClangTidyASTConsumerFactory *Factory, TUResult &Result, bool SystemHeaders)
        : Factory(Factory), Result(Result), SystemHeaders(SystemHeaders) {}
    std::unique_ptr<ASTConsumer> CreateASTConsumer(CompilerInstance &Compiler,
                                                   StringRef File) override {
      std::unique_ptr<ASTConsumer> Tidy = Factory->createASTConsumer(Compiler, File);
      if (SystemHeaders)
        return Tidy;
      std::vector<std::unique_ptr<ASTConsumer>> Consumers;
      Consumers.push_back(std::make_unique<SkipSystemHeaders>());
      Consumers.push_back(std::move(Tidy));
      return std::make_unique<MultiplexConsumer>(std::move(Consumers));
    }
    void EndSourceFileAction() override {
      SourceManager &SM = getCompilerInstance().getSourceManager();
      for (auto It = SM.fileinfo_begin(), End = SM.fileinfo_end(); It != End; ++It) {
        std::optional<llvm::MemoryBufferRef> Buf =
            It->second->getBufferOrNone(SM.getDiagnostics(), SM.getFileManager());
        llvm::SmallString<256> Path(It->first.getFileEntry().tryGetRealPathName());
        if (Path.empty()) {
          Path = It->first.getName();
          SM.getFileManager().makeAbsolutePath(Path);
        }
        // A file whose contents were never read cannot key the cache: hash
        // its absence so that any later contents miss.
        Result.Deps.emplace_back(std::string(Path), Buf ? hashContents(Buf->getBuffer()) : 0);
      }
    }

  private:
    ClangTidyASTConsumerFactory *Factory;
    TUResult &Result;
    bool SystemHeaders;
  };

  ClangTidyASTConsumerFactory ConsumerFactory;
  TUResult &Result;
  bool SystemHeaders;
};

} // namespace

/// Test-only (docs/robustness.md): TENSOR_TIDY_TEST_CRASH=<check> makes the
/// worker crash when that check reports a finding, inside the check's
/// callback, so that the crash reporting can be tested end to end.
static void crashForTestsIn(llvm::StringRef Check) {
  static const char *Victim = std::getenv("TENSOR_TIDY_TEST_CRASH");
  // abort(), as a failed assertion or llvm_unreachable in a check would.
  if (Victim && Check == Victim)
    std::abort();
}

/// Paths in diagnostics are relative to the build directory of the command;
/// the driver merges TUs from many directories, so make them absolute.
static std::string absoluteIn(llvm::StringRef Dir, llvm::StringRef Path) {
  if (Path.empty() || llvm::sys::path::is_absolute(Path) || Dir.empty())
    return Path.str();
  llvm::SmallString<256> P(Dir);
  llvm::sys::path::append(P, Path);
  llvm::sys::path::remove_dots(P, /*remove_dot_dot=*/false);
  return std::string(P);
}

static void makeAbsolute(llvm::StringRef Dir, tooling::DiagnosticMessage &M) {
  M.FilePath = absoluteIn(Dir, M.FilePath);
  for (tooling::FileByteRange &R : M.Ranges)
    R.FilePath = absoluteIn(Dir, R.FilePath);
  llvm::StringMap<Replacements> Fix;
  for (const auto &FileAndRepls : M.Fix) {
    Replacements &Out = Fix[absoluteIn(Dir, FileAndRepls.first())];
    for (const Replacement &R : FileAndRepls.second)
      llvm::consumeError(Out.add(Replacement(absoluteIn(Dir, R.getFilePath()), R.getOffset(),
                                             R.getLength(), R.getReplacementText())));
  }
  M.Fix = std::move(Fix);
}

TUResult analyzeTU(const std::string &File, const std::vector<CompileCommand> &Commands,
                   const ClangTidyOptions &Options) {
  TUResult Result;
  Result.File = File;
  ClangTidyContext Context(
      std::make_unique<DefaultOptionsProvider>(ClangTidyGlobalOptions(), Options));
  OneFileDatabase DB(Commands);
  ClangTool Tool(DB, {File});
  // Extra arguments from the configuration, as runClangTidy adds them.
  Tool.appendArgumentsAdjuster([&Options](const CommandLineArguments &Args, StringRef) {
    CommandLineArguments Adjusted = Args;
    if (Options.ExtraArgsBefore) {
      auto I = Adjusted.begin();
      if (I != Adjusted.end() && !StringRef(*I).starts_with("-"))
        ++I;
      Adjusted.insert(I, Options.ExtraArgsBefore->begin(), Options.ExtraArgsBefore->end());
    }
    if (Options.ExtraArgs)
      Adjusted.insert(Adjusted.end(), Options.ExtraArgs->begin(), Options.ExtraArgs->end());
    return Adjusted;
  });
  Tool.appendArgumentsAdjuster(getStripPluginsAdjuster());

  ClangTidyDiagnosticConsumer DiagConsumer(Context);
  llvm::IntrusiveRefCntPtr<DiagnosticOptions> DiagOpts = new DiagnosticOptions();
  DiagnosticsEngine DE(new DiagnosticIDs(), DiagOpts, &DiagConsumer,
                       /*ShouldOwnClient=*/false);
  Context.setDiagnosticsEngine(&DE);
  Tool.setDiagnosticConsumer(&DiagConsumer);

  ActionFactory Factory(Context, Result, Options.SystemHeaders.value_or(false));
  // The checks' typed findings, next to their diagnostics (rules/analysis/Finding.h).
  tensor::setFindingSink([&Result](tensor::Finding F) {
    crashForTestsIn(F.Check);
    Result.Findings.push_back(std::move(F));
  });
  bool RunFailed = Tool.run(&Factory) != 0;
  tensor::setFindingSink(nullptr);
  Result.Errors = DiagConsumer.take();
  // A check that reports at error severity fails the compiler's run too: only
  // compiler errors (or a failure with no error to show) mean "did not parse".
  Result.Failed = llvm::any_of(Result.Errors, isCompilerError) ||
                  (RunFailed && llvm::none_of(Result.Errors, [](const ClangTidyError &E) {
                     return E.DiagLevel == ClangTidyError::Error;
                   }));
  for (ClangTidyError &E : Result.Errors) {
    makeAbsolute(E.BuildDirectory, E.Message);
    for (auto &N : E.Notes)
      makeAbsolute(E.BuildDirectory, N);
  }
  std::string Dir = Commands.empty() ? std::string() : Commands.front().Directory;
  for (tensor::Finding &F : Result.Findings)
    F.resolvePaths(Dir);
  llvm::sort(Result.Deps);
  Result.Deps.erase(std::unique(Result.Deps.begin(), Result.Deps.end()), Result.Deps.end());
  return Result;
}

} // namespace tensor_tidy
