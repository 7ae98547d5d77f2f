// Reading clang-tidy configuration the way tensor-tidy does: shared by the
// driver and tensor-clangd, so both see the same files with the same precedence.
#ifndef TENSOR_TIDY_TOOL_CONFIGFILES_H
#define TENSOR_TIDY_TOOL_CONFIGFILES_H

#include "ClangTidyOptions.h"
#include <functional>
#include <memory>
#include <string>

namespace tensor_tidy {

/// parseConfiguration, keeping the first YAML diagnostic as one line in Error.
llvm::ErrorOr<clang::tidy::ClangTidyOptions> parseConfig(llvm::MemoryBufferRef Buf,
                                                         std::string &Error);

/// Looks upwards from each file for .tensor-tidy, then .clang-tidy (in one
/// directory .tensor-tidy wins). A file that does not parse counts as empty
/// and its one-line error goes to OnError.
std::unique_ptr<clang::tidy::FileOptionsProvider>
makeConfigFileProvider(clang::tidy::ClangTidyOptions Default,
                       clang::tidy::ClangTidyOptions Override,
                       std::function<void(const std::string &)> OnError);

} // namespace tensor_tidy

#endif
