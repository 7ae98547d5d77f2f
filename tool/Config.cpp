#include "Config.h"

#include "llvm/Support/MemoryBuffer.h"

using namespace clang::tidy;

namespace tensor_tidy {

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
  return makeConfigFileProvider(std::move(Default), std::move(Override),
                                [Errors](const std::string &Msg) { Errors->push_back(Msg); });
}

} // namespace tensor_tidy
