// tensor-clangd: clangd 19 from Debian's libraries with the tensor-* checks
// linked in (rules/TensorTidyModule.cpp registers them). clangd's headers are
// not installed, so the three internals we adjust are declared here by their
// symbol names and substituted with ld's --wrap (clangd/CMakeLists.txt):
//  - isFastTidyCheck: our checks are known to clangd's FastCheckFilter, with
//    the overhead measured in TensorFastChecks.inc;
//  - provideDefaultChecks: tensor-* is on unless configuration turns it off;
//  - provideClangTidyFiles: .tensor-tidy/.clang-tidy are read as the CLI does.
// Diagnostics link to our check docs (DocLinks.h) and offer a NOLINT fix.
#include "ConfigFiles.h"
#include "DocLinks.h"
#include "Docs.h"
#include "analysis/TensorCheck.h"

#include "ClangTidyOptions.h"
#include "llvm/ADT/FunctionExtras.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/raw_ostream.h"
#include <optional>
#include <string>
#include <vector>

namespace clang::clangd {
int clangdMain(int argc, char *argv[]);
class ThreadsafeFS;
// As clangd 19's TidyProvider.h declares them (return types are not part of
// the symbol names: a mismatch is not caught by the linker, the tests catch it).
using TidyProvider =
    llvm::unique_function<void(tidy::ClangTidyOptions &, llvm::StringRef /*Filename*/) const>;
using TidyProviderRef = llvm::function_ref<void(tidy::ClangTidyOptions &, llvm::StringRef)>;
} // namespace clang::clangd

namespace tensor_clangd {
using clang::clangd::ThreadsafeFS;
using clang::clangd::TidyProvider;
using clang::clangd::TidyProviderRef;
using clang::tidy::ClangTidyOptions;

// TT_IS_FAST, TT_DEFAULT_CHECKS, TT_TIDY_FILES: the symbols, from CMake.
#define TT_WRAP(SYM) asm("__wrap_" SYM)
#define TT_REAL(SYM) asm("__real_" SYM)

std::optional<bool> realIsFastTidyCheck(llvm::StringRef Check) TT_REAL(TT_IS_FAST);
TidyProviderRef realProvideDefaultChecks() TT_REAL(TT_DEFAULT_CHECKS);

std::optional<bool> isFastTidyCheck(llvm::StringRef Check) TT_WRAP(TT_IS_FAST);
TidyProviderRef provideDefaultChecks() TT_WRAP(TT_DEFAULT_CHECKS);
TidyProvider provideClangTidyFiles(ThreadsafeFS &) TT_WRAP(TT_TIDY_FILES);

/// Our checks' verdicts, in clangd's format and with its thresholds
/// (bench/clangd_fast_checks.py measures them); clangd's table for the rest.
std::optional<bool> isFastTidyCheck(llvm::StringRef Check) {
  static const llvm::StringMap<bool> Ours = {
#define FAST(CHECK, DELTA) {#CHECK, true},
#define SLOW(CHECK, DELTA) {#CHECK, false},
#include "TensorFastChecks.inc"
#undef FAST
#undef SLOW
  };
  if (auto It = Ours.find(Check); It != Ours.end())
    return It->second;
  return realIsFastTidyCheck(Check);
}

/// clangd's defaults (applied when nothing else chose checks), then tensor-*
/// in front: the lowest priority, as the CLI's "-*,tensor-*" default, so any
/// later "-*" or "-tensor-..." from .clangd or a config file turns it off.
TidyProviderRef provideDefaultChecks() {
  static const auto WithTensor = [](ClangTidyOptions &Opts, llvm::StringRef File) {
    realProvideDefaultChecks()(Opts, File);
    Opts.Checks = "tensor-*," + Opts.Checks.value_or("");
  };
  return WithTensor; // a function_ref: the callable must outlive it
}

/// The CLI's lookup instead of clangd's .clang-tidy-only one. A fresh provider
/// per parse: FileOptionsProvider caches each directory for its lifetime, and
/// an editor's server must see config files edited while it runs.
TidyProvider provideClangTidyFiles(ThreadsafeFS &) {
  return [](ClangTidyOptions &Opts, llvm::StringRef File) {
    auto Provider = tensor_tidy::makeConfigFileProvider(
        ClangTidyOptions(), ClangTidyOptions(),
        [](const std::string &Msg) { llvm::errs() << "tensor-clangd: " << Msg << "\n"; });
    unsigned Order = 1;
    for (const auto &Source : Provider->getRawOptions(File))
      Opts.mergeWith(Source.first, Order++);
  };
}

/// argv with --resource-dir=<LLVM 19's> unless given: clangd derives it from
/// its own path (<bin>/../lib/clang/19), which is Debian's clangd-19's place
/// but not ours.
std::vector<char *> withResourceDir(int argc, char *argv[]) {
  static std::string Flag = "--resource-dir=" TT_CLANG_RESOURCE_DIR;
  std::vector<char *> Args(argv, argv + argc);
  bool Given = llvm::any_of(Args, [](llvm::StringRef A) { return A.contains("-resource-dir"); });
  if (!Given)
    Args.insert(Args.begin() + 1, Flag.data());
  Args.push_back(nullptr);
  return Args;
}

} // namespace tensor_clangd

int main(int argc, char *argv[]) {
  tensor_tidy::setExecutablePath(argv[0]); // the check docs are found beside it
  clang::tidy::tensor::TensorCheck::offerSuppressionFixes(true);
  // Static: also drained and restored when clangd calls exit() (--version does).
  static tensor_clangd::DocLinkRewriter Links;
  std::vector<char *> Args = tensor_clangd::withResourceDir(argc, argv);
  return clang::clangd::clangdMain(Args.size() - 1, Args.data());
}
