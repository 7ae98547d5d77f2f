// The compilation-database reader on arbitrary compile_commands.json text,
// the way the driver loads it (-p <dir>: CompilationDatabase::loadFromDirectory,
// with clang's response-file expansion and interpolation) and asks it for
// every file's commands.
#include "FuzzSupport.h"
#include "Paths.h"

#include "clang/Tooling/CompilationDatabase.h"

#include <cstdint>

using namespace tensor_tidy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *Data, size_t Size) {
  const std::string &Dir = scratchDir("tt-fuzz-compdb");
  if (!writeFile(Dir + "/compile_commands.json",
                 llvm::StringRef(reinterpret_cast<const char *>(Data), Size)))
    return 0;
  std::string Why;
  auto DB = clang::tooling::CompilationDatabase::loadFromDirectory(Dir, Why);
  if (!DB)
    return 0;
  std::vector<std::string> Files = DB->getAllFiles();
  Files.push_back(Dir + "/not-listed.cpp"); // inferred from its neighbours
  for (const std::string &F : Files)
    for (const clang::tooling::CompileCommand &C : DB->getCompileCommands(absolutePath(F))) {
      (void)absolutePath(C.Filename, C.Directory);
      (void)relativeToCwd(C.Filename);
    }
  (void)DB->getAllCompileCommands();
  return 0;
}
