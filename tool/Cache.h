// The result cache. An entry is found by a key over everything the driver
// knows before parsing (tool build, effective configuration, compile commands,
// main file contents) and is valid while every file the TU read still has the
// contents it had (the dependency list the worker recorded, as ccache's
// direct mode does).
#ifndef TENSOR_TIDY_TOOL_CACHE_H
#define TENSOR_TIDY_TOOL_CACHE_H

#include "Diagnostics.h"
#include "llvm/ADT/StringMap.h"
#include <optional>

namespace tensor_tidy {

/// Stands for the checks' version in cache keys: the release, and the
/// executable's size and time while developing.
std::string toolStamp();

class ResultCache {
public:
  /// An empty \p Dir disables the cache.
  explicit ResultCache(std::string Dir) : Dir(std::move(Dir)) {}
  bool enabled() const { return !Dir.empty(); }
  const std::string &dir() const { return Dir; }
  /// Creates the directory; on failure the cache is disabled and the reason
  /// returned.
  std::optional<std::string> prepare();

  std::optional<TUResult> lookup(llvm::StringRef Key);
  void store(llvm::StringRef Key, const TUResult &R);

  /// Hash of a file's current contents (memoized for this run); 0 if it
  /// cannot be read.
  uint64_t fileHash(llvm::StringRef Path);

private:
  std::string entryPath(llvm::StringRef Key) const;
  std::string Dir;
  llvm::StringMap<uint64_t> Hashes;
};

} // namespace tensor_tidy

#endif
