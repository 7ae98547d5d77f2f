#include "ConfigFiles.h"

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

std::unique_ptr<FileOptionsProvider>
makeConfigFileProvider(ClangTidyOptions Default, ClangTidyOptions Override,
                       std::function<void(const std::string &)> OnError) {
  auto Handler = [OnError](llvm::MemoryBufferRef Buf) -> llvm::ErrorOr<ClangTidyOptions> {
    std::string Msg;
    auto Parsed = parseConfig(Buf, Msg);
    if (Parsed)
      return Parsed;
    OnError("invalid configuration: " + Msg);
    return ClangTidyOptions(); // reported through OnError; keeps the provider quiet
  };
  TensorTidyFileOptionsProvider::ConfigFileHandlers Handlers{{".tensor-tidy", Handler},
                                                             {".clang-tidy", Handler}};
  return std::make_unique<TensorTidyFileOptionsProvider>(std::move(Default), std::move(Override),
                                                         std::move(Handlers));
}

} // namespace tensor_tidy
