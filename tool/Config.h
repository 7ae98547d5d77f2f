// The configuration: --config, --config-file, or the .tensor-tidy and
// .clang-tidy files above each source file (ConfigFiles.h: a .tensor-tidy
// file wins in its directory). A fuzz target (fuzz/) drives these directly.
#ifndef TENSOR_TIDY_TOOL_CONFIG_H
#define TENSOR_TIDY_TOOL_CONFIG_H

#include "ConfigFiles.h"
#include "Driver.h"

#include "ClangTidyOptions.h"
#include "llvm/Support/ErrorOr.h"
#include "llvm/Support/MemoryBufferRef.h"
#include <memory>
#include <string>
#include <vector>

namespace tensor_tidy {

/// Configuration problems found while reading .tensor-tidy/.clang-tidy files.
using ConfigErrors = std::shared_ptr<std::vector<std::string>>;

/// The options provider for a run: defaults, the configuration, then the
/// command line's overrides. Null (with \p Error) when --config or
/// --config-file is bad; problems in files found later go to \p Errors.
std::unique_ptr<clang::tidy::ClangTidyOptionsProvider>
makeProvider(const DriverOptions &Opts, ConfigErrors Errors, std::string &Error);

} // namespace tensor_tidy

#endif
