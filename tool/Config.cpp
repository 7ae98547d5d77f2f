#include "Config.h"

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/VirtualFileSystem.h"
#include "llvm/Support/raw_ostream.h"

using namespace clang::tidy;

namespace tensor_tidy {
namespace {

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

} // namespace

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

} // namespace tensor_tidy
