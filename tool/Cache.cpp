#include "Cache.h"

#include "Docs.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#ifndef TT_VERSION
#define TT_VERSION "0"
#endif

namespace tensor_tidy {

std::string toolStamp() {
  std::string Stamp = "tensor-tidy " TT_VERSION;
  llvm::sys::fs::file_status St;
  if (!llvm::sys::fs::status(executablePath(), St))
    Stamp += " " + std::to_string(St.getSize()) + " " +
             std::to_string(St.getLastModificationTime().time_since_epoch().count());
  return Stamp;
}

std::optional<std::string> ResultCache::prepare() {
  if (!enabled())
    return std::nullopt;
  if (std::error_code EC = llvm::sys::fs::create_directories(Dir)) {
    std::string Why = "cannot create cache directory '" + Dir + "': " + EC.message();
    Dir.clear();
    return Why;
  }
  return std::nullopt;
}

std::string ResultCache::entryPath(llvm::StringRef Key) const {
  llvm::SmallString<256> P(Dir);
  llvm::sys::path::append(P, Key.take_front(2), Key.str() + ".json");
  return std::string(P);
}

uint64_t ResultCache::fileHash(llvm::StringRef Path) {
  auto It = Hashes.find(Path);
  if (It != Hashes.end())
    return It->second;
  uint64_t H = 0;
  if (auto Buf = llvm::MemoryBuffer::getFile(Path, /*IsText=*/false,
                                             /*RequiresNullTerminator=*/false))
    H = hashContents((*Buf)->getBuffer());
  Hashes[Path] = H;
  return H;
}

std::optional<TUResult> ResultCache::lookup(llvm::StringRef Key) {
  if (!enabled())
    return std::nullopt;
  auto Buf = llvm::MemoryBuffer::getFile(entryPath(Key));
  if (!Buf)
    return std::nullopt;
  llvm::Expected<llvm::json::Value> V = llvm::json::parse((*Buf)->getBuffer());
  TUResult R;
  if (!V) {
    llvm::consumeError(V.takeError());
    return std::nullopt;
  }
  if (!fromJSON(*V, R) || R.Deps.empty())
    return std::nullopt;
  for (const auto &[Path, Hash] : R.Deps)
    if (Hash == 0 || fileHash(Path) != Hash)
      return std::nullopt;
  R.FromCache = true;
  return R;
}

void ResultCache::store(llvm::StringRef Key, const TUResult &R) {
  // A TU that did not parse is analysed again next time: the fix is usually
  // outside what the dependency list can see (a missing header, a flag).
  if (!enabled() || R.Failed || !R.Crash.empty() || R.Deps.empty())
    return;
  std::string Path = entryPath(Key);
  if (llvm::sys::fs::create_directories(llvm::sys::path::parent_path(Path)))
    return;
  // Written to a temporary and renamed, so that a concurrent run never reads
  // half an entry.
  llvm::Error Err = llvm::writeToOutput(Path, [&](llvm::raw_ostream &OS) {
    OS << toJSON(R);
    return llvm::Error::success();
  });
  llvm::consumeError(std::move(Err));
}

} // namespace tensor_tidy
