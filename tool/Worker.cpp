#include "Worker.h"

#include "ClangTidy.h"
#include "ClangTidyModule.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Frontend/CompilerInstance.h"
#include "clang/Frontend/FrontendActions.h"
#include "clang/Frontend/MultiplexConsumer.h"
#include "clang/Lex/PreprocessorOptions.h"
#include "clang/Sema/ExternalSemaSource.h"
#include "clang/Sema/SemaConsumer.h"
#include "clang/Serialization/ASTReader.h"
#include "clang/Tooling/ArgumentsAdjusters.h"
#include "clang/Tooling/Tooling.h"
#include "llvm/Support/Regex.h"

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

/// Runs before the checks' matchers: restricts the AST traversal to the
/// declarations whose diagnostics clang-tidy would report, i.e. the main
/// file's and those of headers the header filter selects (as clangd limits it
/// to the main file). Walking torch/torch.h's AST, or a shared preamble's,
/// costs as much as a check's whole run on user code.
class MainFileScope : public ASTConsumer {
public:
  explicit MainFileScope(const ClangTidyOptions &Options)
      : SystemHeaders(Options.SystemHeaders.value_or(false)),
        Include(Options.HeaderFilterRegex.value_or("")),
        Exclude(Options.ExcludeHeaderFilterRegex.value_or("")) {}

  void HandleTranslationUnit(ASTContext &Ctx) override {
    const SourceManager &SM = Ctx.getSourceManager();
    std::vector<Decl *> Scope;
    llvm::DenseMap<FileID, bool> Selected;
    for (Decl *D : Ctx.getTranslationUnitDecl()->decls()) {
      // Builtins have no location, and the invalid FileID is DenseMap's
      // empty key: never look it up (the sanitized CI run caught the read).
      if (D->getLocation().isInvalid()) {
        Scope.push_back(D);
        continue;
      }
      FileID FID = SM.getFileID(SM.getExpansionLoc(D->getLocation()));
      auto [It, New] = Selected.try_emplace(FID, false);
      if (New)
        It->second = selects(SM, FID);
      if (It->second)
        Scope.push_back(D);
    }
    Ctx.setTraversalScope(Scope);
  }

private:
  /// ClangTidyDiagnosticConsumer's filter (checkFilters) on a whole file.
  bool selects(const SourceManager &SM, FileID FID) const {
    if (FID == SM.getMainFileID())
      return true;
    OptionalFileEntryRef File = SM.getFileEntryRefForID(FID);
    // Command-line macros and the like: no file, always reported.
    if (!File)
      return true;
    if (!SystemHeaders && SrcMgr::isSystem(SM.getFileCharacteristic(SM.getLocForStartOfFile(FID))))
      return false;
    StringRef Name = File->getName();
    return !Include.empty() && llvm::Regex(Include).match(Name) &&
           (Exclude.empty() || !llvm::Regex(Exclude).match(Name));
  }

  bool SystemHeaders;
  std::string Include, Exclude;
};

/// Note [Instantiations owed by a PCH]: a PCH (the shared preamble, or one
/// the command names) leaves to each TU the template instantiations it could
/// not finish: the virtual members of every class template whose vtable it
/// used, and the functions still pending. For torch/torch.h that is about
/// two seconds of each TU, on bodies outside the traversal scope that no
/// check reads. Drop them before the TU's end asks the reader for them; the
/// TU's own uses still instantiate as they would.
class SkipPchInstantiations : public SemaConsumer {
public:
  explicit SkipPchInstantiations(CompilerInstance &CI) : CI(CI) {}
  void InitializeSema(Sema &) override {
    IntrusiveRefCntPtr<ASTReader> Reader = CI.getASTReader();
    if (!Reader)
      return;
    SmallVector<ExternalVTableUse, 0> VTables;
    Reader->ReadUsedVTables(VTables);
    SmallVector<std::pair<ValueDecl *, SourceLocation>, 0> Pending;
    Reader->ReadPendingInstantiations(Pending);
  }

private:
  CompilerInstance &CI;
};

/// Every file the source manager read, with a hash of its contents.
void recordDeps(SourceManager &SM, FileDeps &Deps) {
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
    Deps.emplace_back(std::string(Path), Buf ? hashContents(Buf->getBuffer()) : 0);
  }
}

void sortUnique(FileDeps &Deps) {
  llvm::sort(Deps);
  Deps.erase(std::unique(Deps.begin(), Deps.end()), Deps.end());
}

/// clang-tidy's ActionFactory (ClangTidy.cpp, runClangTidy), plus a look at
/// the source manager at the end of each TU for the cache's dependency list.
class ActionFactory : public FrontendActionFactory {
public:
  ActionFactory(ClangTidyContext &Context, TUResult &Result, const ClangTidyOptions &Options,
                const Preamble *P)
      : ConsumerFactory(Context), Result(Result), Options(Options), P(P) {}
  std::unique_ptr<FrontendAction> create() override {
    return std::make_unique<Action>(&ConsumerFactory, Result, Options);
  }
  bool runInvocation(std::shared_ptr<CompilerInvocation> Invocation, FileManager *Files,
                     std::shared_ptr<PCHContainerOperations> PCHContainerOps,
                     DiagnosticConsumer *DiagConsumer) override {
    Invocation->getPreprocessorOpts().SetUpStaticAnalyzer = true;
    // The worker exits after its TU: skip freeing the AST, as clang's own
    // driver does (-disable-free); for torch/torch.h that is a good part of
    // a second.
    Invocation->getFrontendOpts().DisableFree = true;
    // As -include-pch: the shared preamble's PCH stands for the TU's leading
    // includes, which its include guards then skip.
    if (P)
      Invocation->getPreprocessorOpts().ImplicitPCHInclude = P->Pch;
    return FrontendActionFactory::runInvocation(Invocation, Files, PCHContainerOps, DiagConsumer);
  }

private:
  class Action : public ASTFrontendAction {
  public:
    Action(ClangTidyASTConsumerFactory *Factory, TUResult &Result, const ClangTidyOptions &Options)
        : Factory(Factory), Result(Result), Options(Options) {}
    std::unique_ptr<ASTConsumer> CreateASTConsumer(CompilerInstance &Compiler,
                                                   StringRef File) override {
      std::unique_ptr<ASTConsumer> Tidy = Factory->createASTConsumer(Compiler, File);
      std::vector<std::unique_ptr<ASTConsumer>> Consumers;
      Consumers.push_back(std::make_unique<SkipPchInstantiations>(Compiler));
      Consumers.push_back(std::make_unique<MainFileScope>(Options));
      Consumers.push_back(std::move(Tidy));
      return std::make_unique<MultiplexConsumer>(std::move(Consumers));
    }
    void EndSourceFileAction() override {
      recordDeps(getCompilerInstance().getSourceManager(), Result.Deps);
    }

  private:
    ClangTidyASTConsumerFactory *Factory;
    TUResult &Result;
    const ClangTidyOptions &Options;
  };

  ClangTidyASTConsumerFactory ConsumerFactory;
  TUResult &Result;
  const ClangTidyOptions &Options;
  const Preamble *P;
};

/// Builds a preamble's PCH: GeneratePCH with the templates instantiated in
/// the PCH (-fpch-instantiate-templates) and no timestamps (the cache
/// checks contents; a touched header must not invalidate it).
class PchFactory : public FrontendActionFactory {
public:
  PchFactory(std::string Output, TUResult &Result) : Output(std::move(Output)), Result(Result) {}
  std::unique_ptr<FrontendAction> create() override { return std::make_unique<Action>(Result); }
  bool runInvocation(std::shared_ptr<CompilerInvocation> Invocation, FileManager *Files,
                     std::shared_ptr<PCHContainerOperations> PCHContainerOps,
                     DiagnosticConsumer *DiagConsumer) override {
    FrontendOptions &FO = Invocation->getFrontendOpts();
    FO.OutputFile = Output;
    FO.IncludeTimestamps = false;
    FO.DisableFree = true;
    Invocation->getLangOpts().PCHInstantiateTemplates = true;
    return FrontendActionFactory::runInvocation(Invocation, Files, PCHContainerOps, DiagConsumer);
  }

private:
  class Action : public GeneratePCHAction {
  public:
    explicit Action(TUResult &Result) : Result(Result) {}
    void EndSourceFileAction() override {
      recordDeps(getCompilerInstance().getSourceManager(), Result.Deps);
      GeneratePCHAction::EndSourceFileAction();
    }

  private:
    TUResult &Result;
  };
  std::string Output;
  TUResult &Result;
};

/// Counts what the compiler reports while building a PCH: any warning or
/// error would be lost to the TUs that use it, so the PCH is not used.
class CountingConsumer : public DiagnosticConsumer {
public:
  void HandleDiagnostic(DiagnosticsEngine::Level Level, const clang::Diagnostic &Info) override {
    DiagnosticConsumer::HandleDiagnostic(Level, Info);
    if (Level >= DiagnosticsEngine::Warning)
      ++Reported;
  }
  unsigned Reported = 0;
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

/// Extra arguments from the configuration, as runClangTidy adds them, and
/// no plugins.
static void adjustArguments(ClangTool &Tool, const ClangTidyOptions &Options) {
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
}

/// One parse and run of the checks, with \p P's PCH when not null.
static TUResult runChecks(const std::string &File, const std::vector<CompileCommand> &Commands,
                          const ClangTidyOptions &Options, const Preamble *P) {
  TUResult Result;
  Result.File = File;
  ClangTidyContext Context(
      std::make_unique<DefaultOptionsProvider>(ClangTidyGlobalOptions(), Options));
  OneFileDatabase DB(Commands);
  ClangTool Tool(DB, {File});
  adjustArguments(Tool, Options);

  ClangTidyDiagnosticConsumer DiagConsumer(Context);
  llvm::IntrusiveRefCntPtr<DiagnosticOptions> DiagOpts = new DiagnosticOptions();
  DiagnosticsEngine DE(new DiagnosticIDs(), DiagOpts, &DiagConsumer,
                       /*ShouldOwnClient=*/false);
  Context.setDiagnosticsEngine(&DE);
  Tool.setDiagnosticConsumer(&DiagConsumer);

  ActionFactory Factory(Context, Result, Options, P);
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
  return Result;
}

TUResult analyzeTU(const std::string &File, const std::vector<CompileCommand> &Commands,
                   const ClangTidyOptions &Options, const Preamble *P) {
  TUResult Result = runChecks(File, Commands, Options, P);
  // A PCH clang rejects (or one that breaks the parse) costs a second parse,
  // never a result.
  if (P && Result.Failed)
    Result = runChecks(File, Commands, Options, nullptr);
  else if (P) {
    Result.UsedPreamble = true;
    Result.Deps.insert(Result.Deps.end(), P->Deps.begin(), P->Deps.end());
  }
  std::string Dir = Commands.empty() ? std::string() : Commands.front().Directory;
  for (tensor::Finding &F : Result.Findings)
    F.resolvePaths(Dir);
  sortUnique(Result.Deps);
  return Result;
}

TUResult buildPreamble(const CompileCommand &Command, const std::string &Pch,
                       const ClangTidyOptions &Options) {
  TUResult Result;
  Result.File = Command.Filename;
  OneFileDatabase DB({Command});
  ClangTool Tool(DB, {Command.Filename});
  adjustArguments(Tool, Options);
  CountingConsumer Diags;
  Tool.setDiagnosticConsumer(&Diags);
  PchFactory Factory(Pch, Result);
  Result.Failed = Tool.run(&Factory) != 0 || Diags.Reported > 0;
  sortUnique(Result.Deps);
  return Result;
}

} // namespace tensor_tidy
