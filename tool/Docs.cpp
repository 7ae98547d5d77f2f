#include "Docs.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

namespace tensor_tidy {

static std::string ExePath;

void setExecutablePath(const char *Argv0) {
  ExePath = llvm::sys::fs::getMainExecutable(Argv0, (void *)&setExecutablePath);
}

const std::string &executablePath() { return ExePath; }

static std::string docsDir() {
  llvm::SmallString<256> Dir(llvm::sys::path::parent_path(ExePath));
  llvm::sys::path::append(Dir, "..", "share", "tensor-tidy", "checks");
  llvm::sys::path::remove_dots(Dir, /*remove_dot_dot=*/true);
  return std::string(Dir);
}

static std::string fileUri(llvm::StringRef Path) { return "file://" + Path.str(); }

/// The first paragraph after the title, joined into one line.
static std::string firstParagraph(llvm::StringRef Md) {
  std::string Para;
  llvm::SmallVector<llvm::StringRef> Lines;
  Md.split(Lines, '\n');
  bool InPara = false;
  for (llvm::StringRef L : Lines) {
    L = L.trim();
    if (L.starts_with("#") || L.starts_with("```") || L.starts_with("|")) {
      if (InPara)
        break;
      continue;
    }
    if (L.empty()) {
      if (InPara)
        break;
      continue;
    }
    InPara = true;
    if (!Para.empty())
      Para += ' ';
    Para += L.str();
  }
  return Para;
}

static std::string firstSentence(llvm::StringRef Para) {
  for (size_t I = 0; I + 1 < Para.size(); ++I)
    if (Para[I] == '.' && Para[I + 1] == ' ')
      return Para.substr(0, I + 1).str();
  return Para.str();
}

CheckDoc findCheckDoc(llvm::StringRef Check) {
  CheckDoc Doc;
  // Compiler warnings: clang's diagnostics reference (-Wshadow -> #wshadow).
  if (Check.consume_front("clang-diagnostic-")) {
    Doc.HelpUri = ("https://clang.llvm.org/docs/DiagnosticsReference.html#w" + Check).str();
    return Doc;
  }
  // Stock clang-tidy checks are documented on clang.llvm.org:
  // bugprone-use-after-move -> checks/bugprone/use-after-move.html.
  if (!Check.starts_with("tensor-")) {
    auto [Module, Name] = Check.split('-');
    if (!Name.empty())
      Doc.HelpUri =
          ("https://clang.llvm.org/extra/clang-tidy/checks/" + Module + "/" + Name + ".html").str();
    return Doc;
  }
  // Check names are globs elsewhere: keep paths to plain names.
  if (Check.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != llvm::StringRef::npos)
    return Doc;
  llvm::SmallString<256> Path(docsDir());
  llvm::sys::path::append(Path, Check + ".md");
#ifdef TT_DOCS_BASE_URL
  if (llvm::StringRef(TT_DOCS_BASE_URL).size())
    Doc.HelpUri = (llvm::StringRef(TT_DOCS_BASE_URL).rtrim('/') + "/" + Check + ".md").str();
#endif
  if (Doc.HelpUri.empty())
    Doc.HelpUri = fileUri(Path);
  auto Buf = llvm::MemoryBuffer::getFile(Path, /*IsText=*/true);
  if (!Buf)
    return Doc;
  Doc.Path = std::string(Path);
  Doc.Markdown = (*Buf)->getBuffer().str();
  Doc.Full = firstParagraph(Doc.Markdown);
  Doc.Short = firstSentence(Doc.Full);
  return Doc;
}

} // namespace tensor_tidy
