// Shared precompiled preambles (docs/design.md, "Shared preamble"): the TUs
// of a run whose configuration and compile command agree (but for their own
// file and output) and whose leading `#include <...>` lines share a prefix are
// parsed with one PCH of that prefix. The PCH lives in the cache directory,
// valid while every file it read keeps its contents.
#ifndef TENSOR_TIDY_TOOL_PREAMBLE_H
#define TENSOR_TIDY_TOOL_PREAMBLE_H

#include "Cache.h"
#include "ClangTidyOptions.h"
#include "Diagnostics.h"
#include "clang/Tooling/CompilationDatabase.h"
#include <string>
#include <vector>

namespace tensor_tidy {

using FileDeps = std::vector<std::pair<std::string, uint64_t>>;

/// A PCH a TU is parsed with, and the files it was built from (they join the
/// TU's own dependency list, for the result cache).
struct Preamble {
  std::string Pch;
  FileDeps Deps;
  /// Its record in the cache: removed when clang rejects the PCH, so that
  /// the next run builds it again.
  std::string DepsFile;
};

/// What the grouping needs of one TU.
struct PreambleInput {
  std::string File;
  std::vector<clang::tooling::CompileCommand> Commands;
  clang::tidy::ClangTidyOptions Options;
};

struct PreambleGroup {
  std::string Header, Pch, DepsFile; // in the cache directory
  /// Builds the PCH: a member's command, compiling Header.
  clang::tooling::CompileCommand Command;
  clang::tidy::ClangTidyOptions Options;
  std::vector<size_t> Members; // indices into the inputs (the driver's: jobs)
  Preamble Built;              // Pch empty until valid
  bool Reused = false;
};

/// The `#include <...>` lines a TU reads first: its own leading ones (past
/// comments and blank lines, up to the first line of anything else), or, when
/// it starts with `#include "h"`, those h starts with past its include guard
/// (h found beside the including file; three levels at most). A PCH of them,
/// included ahead of the TU, is what its first line would have read first.
std::vector<std::string> leadingIncludesOf(llvm::StringRef File);

/// The group a TU's preamble would be shared in: its compatibility (tool,
/// configuration, command but for its own files) and first leading include;
/// empty when it has none.
std::string preambleGroupKey(const PreambleInput &In);

/// Parts 0..N-1 for items keyed by \p Keys, items of one key in one part:
/// keys largest first (ties: first seen), each to the part with the fewest
/// items so far (ties: the lowest). Deterministic for the same keys.
std::vector<unsigned> partitionByKey(llvm::ArrayRef<std::string> Keys, unsigned N);

/// Groups of at least two of \p Inputs sharing a non-empty prefix; writes
/// each group's prefix header into \p Dir.
std::vector<PreambleGroup> planPreambles(llvm::ArrayRef<PreambleInput> Inputs, llvm::StringRef Dir);

/// Takes the group's PCH from an earlier run when every file it read is
/// unchanged.
bool loadPreamble(PreambleGroup &G, ResultCache &Cache);

/// Accepts a freshly built PCH (\p Built: its build's result) and records
/// its dependencies; false when it cannot be used.
bool acceptPreamble(PreambleGroup &G, const TUResult &Built);

} // namespace tensor_tidy

#endif
