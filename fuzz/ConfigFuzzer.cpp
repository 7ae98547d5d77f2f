// The configuration loader on arbitrary text: as --config, and as a
// .tensor-tidy file found above a source file. Then what the driver does
// with a configuration: the enabled checks, their options, the dump.
#include "Config.h"
#include "FuzzSupport.h"
#include "Paths.h"

#include "ClangTidy.h"
#include "llvm/Support/Path.h"

#include <cstdint>

using namespace clang::tidy;
using namespace tensor_tidy;

namespace clang::tidy {
extern volatile int TensorTidyModuleAnchorSource;
static int LLVM_ATTRIBUTE_UNUSED TensorTidyModuleAnchorDestination = TensorTidyModuleAnchorSource;
} // namespace clang::tidy

static void useOptions(ClangTidyOptionsProvider &Provider, const std::string &File) {
  ClangTidyContext Context(std::make_unique<DefaultOptionsProvider>(ClangTidyGlobalOptions(),
                                                                    Provider.getOptions(File)));
  ClangTidyOptions Options = Context.getOptionsForFile(File);
  (void)getCheckNames(Options, false);
  (void)getCheckOptions(Options, false);
  (void)configurationAsText(Options);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  std::string Text(reinterpret_cast<const char *>(Data), Size);
  std::string Error;
  DriverOptions Opts;
  Opts.Config = Text.empty() ? " " : Text;
  auto Errors = std::make_shared<std::vector<std::string>>();
  if (auto Provider = makeProvider(Opts, Errors, Error))
    useOptions(*Provider, "/fuzz/src/a.cpp");

  // The same text as a .tensor-tidy file (the file provider's handlers).
  std::string Dir = scratchDir("tt-fuzz-config");
  if (!writeFile(Dir + "/.tensor-tidy", Text))
    return 0;
  DriverOptions FileOpts;
  Error.clear();
  if (auto Provider = makeProvider(FileOpts, Errors, Error))
    useOptions(*Provider, Dir + "/a.cpp");
  return 0;
}
