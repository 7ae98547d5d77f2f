#include "Preamble.h"

#include "Paths.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/SHA1.h"
#include "llvm/Support/raw_ostream.h"

using clang::tooling::CompileCommand;
using llvm::StringRef;

namespace tensor_tidy {
namespace {

/// "#include <name>" when the line is exactly that (a trailing // comment
/// allowed). Quoted includes are left out: they resolve against the
/// including file's directory, which the PCH's header does not share.
std::optional<std::string> angledInclude(StringRef L) {
  if (!L.consume_front("#"))
    return std::nullopt;
  L = L.ltrim();
  if (!L.consume_front("include"))
    return std::nullopt;
  L = L.ltrim();
  if (!L.consume_front("<"))
    return std::nullopt;
  auto [Name, Rest] = L.split('>');
  Rest = Rest.trim();
  if (Name.empty() || Name.size() == L.size() || (!Rest.empty() && !Rest.starts_with("//")))
    return std::nullopt;
  return "#include <" + Name.str() + ">";
}

bool writeAtomically(StringRef Path, StringRef Text) {
  // A temporary renamed over the file: a concurrent run never reads half.
  llvm::Error E = llvm::writeToOutput(Path, [&](llvm::raw_ostream &OS) {
    OS << Text;
    return llvm::Error::success();
  });
  return !errorToBool(std::move(E));
}

/// True when what follows a comment's end on its line is nothing.
bool endsLine(StringRef L, size_t CommentEnd) { return L.substr(CommentEnd + 2).trim().empty(); }

bool isSourceArg(StringRef Arg, const CompileCommand &C) {
  return Arg == C.Filename ||
         absolutePath(Arg, C.Directory) == absolutePath(C.Filename, C.Directory);
}

/// The command without what names this TU's own files: the source, -c, the
/// output and dependency-file flags.
std::vector<std::string> sharedArgs(const CompileCommand &C) {
  std::vector<std::string> Out;
  const std::vector<std::string> &A = C.CommandLine;
  for (size_t I = 0; I < A.size(); ++I) {
    StringRef Arg = A[I];
    if (Arg == "-o" || Arg == "-MF" || Arg == "-MT" || Arg == "-MQ") {
      ++I;
      continue;
    }
    if (Arg == "-c" || Arg == "-MD" || Arg == "-MMD" || (Arg.starts_with("-o") && Arg.size() > 2) ||
        isSourceArg(Arg, C))
      continue;
    Out.push_back(A[I]);
  }
  return Out;
}

std::string hashOf(llvm::ArrayRef<std::string> Parts) {
  llvm::SHA1 H;
  for (const std::string &P : Parts) {
    H.update(P);
    H.update(StringRef("\0", 1));
  }
  return llvm::toHex(H.final(), /*LowerCase=*/true);
}

/// Everything two TUs must agree on to share a PCH.
std::string compatibilityKey(const PreambleInput &In) {
  const CompileCommand &C = In.Commands.front();
  std::vector<std::string> Parts{toolStamp(), clang::tidy::configurationAsText(In.Options),
                                 C.Directory};
  for (std::string &A : sharedArgs(C))
    Parts.push_back(std::move(A));
  return hashOf(Parts);
}

size_t commonPrefix(llvm::ArrayRef<std::string> A, llvm::ArrayRef<std::string> B) {
  size_t N = 0;
  while (N < A.size() && N < B.size() && A[N] == B[N])
    ++N;
  return N;
}

/// One group: its prefix header written, its command pointed at it.
std::optional<PreambleGroup> makeGroup(llvm::ArrayRef<PreambleInput> Inputs,
                                       std::vector<size_t> Members,
                                       llvm::ArrayRef<std::string> Prefix, StringRef CompatKey,
                                       StringRef Dir) {
  std::string Text = llvm::join(Prefix, "\n") + "\n";
  std::string Name = hashOf({CompatKey.str(), Text});
  PreambleGroup G;
  G.Header = (Dir + "/" + Name + ".h").str();
  G.Pch = (Dir + "/" + Name + ".pch").str();
  G.DepsFile = (Dir + "/" + Name + ".deps.json").str();
  if (readFile(G.Header) != Text && !writeAtomically(G.Header, Text))
    return std::nullopt;
  const PreambleInput &First = Inputs[Members.front()];
  G.Options = First.Options;
  G.Command = First.Commands.front();
  G.Command.CommandLine = sharedArgs(G.Command);
  for (const char *A : {"-x", "c++-header"})
    G.Command.CommandLine.push_back(A);
  G.Command.CommandLine.push_back(G.Header);
  G.Command.Filename = G.Header;
  G.Command.Output.clear();
  G.Members = std::move(Members);
  return G;
}

/// A dependency the header filter selects: its compiler warnings would be
/// reported without the PCH (and are not replayed from it).
bool selectedByFilter(const FileDeps &Deps, const clang::tidy::ClangTidyOptions &O) {
  std::string Include = O.HeaderFilterRegex.value_or("");
  if (Include.empty())
    return false;
  llvm::Regex In(Include), Ex(O.ExcludeHeaderFilterRegex.value_or(""));
  bool HasEx = !O.ExcludeHeaderFilterRegex.value_or("").empty();
  return llvm::any_of(
      Deps, [&](const auto &D) { return In.match(D.first) && !(HasEx && Ex.match(D.first)); });
}

} // namespace

namespace {

/// The text after `#keyword` when L is that directive.
std::optional<StringRef> directive(StringRef L, StringRef Keyword) {
  if (!L.consume_front("#"))
    return std::nullopt;
  L = L.ltrim();
  if (!L.consume_front(Keyword) || (!L.empty() && !llvm::isSpace(L.front())))
    return std::nullopt;
  return L.trim();
}

/// `#include "name"` when the line is exactly that: the name.
std::optional<StringRef> quotedInclude(StringRef L) {
  std::optional<StringRef> Arg = directive(L, "include");
  if (!Arg || !Arg->consume_front("\"") || !Arg->consume_back("\"") || Arg->empty() ||
      Arg->contains('"'))
    return std::nullopt;
  return Arg;
}

/// A header's include guard: `#pragma once`, or `#ifndef G` then `#define G`.
class GuardLines {
public:
  bool take(StringRef L) {
    if (directive(L, "pragma") == StringRef("once"))
      return true;
    if (std::optional<StringRef> G = directive(L, "ifndef"); G && Guard.empty() && isName(*G)) {
      Guard = *G;
      return true;
    }
    if (std::optional<StringRef> G = directive(L, "define"); G && !Defined && G == Guard) {
      Defined = true;
      return true;
    }
    return false;
  }

private:
  static bool isName(StringRef S) {
    return !S.empty() && llvm::all_of(S, [](char C) { return llvm::isAlnum(C) || C == '_'; });
  }
  StringRef Guard;
  bool Defined = false;
};

/// The leading `#include <...>` lines of Source (past comments, blank lines
/// and, in a header, its guard); Stop is the line that ended them, if any.
std::vector<std::string> scanLeading(StringRef Source, bool Header, StringRef &Stop) {
  std::vector<std::string> Out;
  bool InComment = false;
  GuardLines Guard;
  Stop = "";
  while (!Source.empty()) {
    auto [Line, Rest] = Source.split('\n');
    Source = Rest;
    StringRef L = Line.trim();
    // A line continuation could carry a comment or directive on: stop.
    if (L.ends_with("\\"))
      break;
    size_t End = L.find("*/", InComment ? 0 : 2);
    if (InComment || L.starts_with("/*")) {
      InComment = End == StringRef::npos;
      if (!InComment && !endsLine(L, End))
        break;
      continue;
    }
    if (L.empty() || L.starts_with("//") || (Header && Out.empty() && Guard.take(L)))
      continue;
    std::optional<std::string> Include = angledInclude(L);
    if (!Include) {
      Stop = L;
      break;
    }
    Out.push_back(std::move(*Include));
  }
  return Out;
}

} // namespace

std::vector<std::string> leadingIncludesOf(StringRef File) {
  std::string Path = File.str();
  for (int Depth = 0; Depth < 4; ++Depth) {
    std::string Text = readFile(Path);
    StringRef Stop;
    std::vector<std::string> Out = scanLeading(Text, Depth > 0, Stop);
    std::optional<StringRef> Quoted = Out.empty() ? quotedInclude(Stop) : std::nullopt;
    if (!Quoted)
      return Out;
    // Found beside the including file, as the compiler looks first.
    llvm::SmallString<256> Next(llvm::sys::path::parent_path(Path));
    llvm::sys::path::append(Next, *Quoted);
    if (!llvm::sys::fs::is_regular_file(Next))
      return {};
    Path = std::string(Next);
  }
  return {};
}

std::string preambleGroupKey(const PreambleInput &In) {
  if (In.Commands.size() != 1)
    return "";
  std::vector<std::string> Includes = leadingIncludesOf(In.File);
  return Includes.empty() ? "" : compatibilityKey(In) + Includes.front();
}

std::vector<unsigned> partitionByKey(llvm::ArrayRef<std::string> Keys, unsigned N) {
  llvm::StringMap<std::vector<size_t>> Members;
  std::vector<std::vector<size_t> *> Groups;
  for (size_t I = 0; I < Keys.size(); ++I) {
    auto [It, New] = Members.try_emplace(Keys[I]);
    if (New)
      Groups.push_back(&It->second);
    It->second.push_back(I);
  }
  llvm::stable_sort(Groups, [](auto *A, auto *B) { return A->size() > B->size(); });
  std::vector<size_t> Load(N, 0);
  std::vector<unsigned> Part(Keys.size(), 0);
  for (const std::vector<size_t> *G : Groups) {
    unsigned P = std::min_element(Load.begin(), Load.end()) - Load.begin();
    for (size_t M : *G)
      Part[M] = P;
    Load[P] += G->size();
  }
  return Part;
}

std::vector<PreambleGroup> planPreambles(llvm::ArrayRef<PreambleInput> Inputs, StringRef Dir) {
  // Compatible TUs, then within them by first include, in input order.
  llvm::StringMap<std::vector<size_t>> ByKey;
  std::vector<std::string> KeyOrder;
  std::vector<std::vector<std::string>> Includes(Inputs.size());
  for (size_t I = 0; I < Inputs.size(); ++I) {
    std::string Key = preambleGroupKey(Inputs[I]);
    if (Key.empty())
      continue;
    Includes[I] = leadingIncludesOf(Inputs[I].File);
    auto [It, New] = ByKey.try_emplace(Key);
    if (New)
      KeyOrder.push_back(Key);
    It->second.push_back(I);
  }
  std::vector<PreambleGroup> Groups;
  if (llvm::sys::fs::create_directories(Dir))
    return Groups;
  for (const std::string &Key : KeyOrder) {
    std::vector<size_t> &Members = ByKey[Key];
    if (Members.size() < 2)
      continue;
    size_t N = Includes[Members.front()].size();
    for (size_t M : Members)
      N = std::min(N, commonPrefix(Includes[Members.front()], Includes[M]));
    llvm::ArrayRef<std::string> Prefix(Includes[Members.front()].data(), N);
    if (auto G = makeGroup(Inputs, std::move(Members), Prefix, Key, Dir))
      Groups.push_back(std::move(*G));
  }
  return Groups;
}

bool loadPreamble(PreambleGroup &G, ResultCache &Cache) {
  TUResult Recorded;
  std::string Text = readFile(G.DepsFile);
  llvm::Expected<llvm::json::Value> V = llvm::json::parse(Text);
  if (!V) {
    llvm::consumeError(V.takeError());
    return false;
  }
  if (!fromJSON(*V, Recorded) || Recorded.Deps.empty() || !llvm::sys::fs::exists(G.Pch))
    return false;
  for (const auto &[Path, Hash] : Recorded.Deps)
    if (Hash == 0 || Cache.fileHash(Path) != Hash)
      return false;
  if (selectedByFilter(Recorded.Deps, G.Options))
    return false;
  G.Built = {G.Pch, std::move(Recorded.Deps), G.DepsFile};
  G.Reused = true;
  return true;
}

bool acceptPreamble(PreambleGroup &G, const TUResult &Built) {
  if (Built.Failed || !Built.Crash.empty() || Built.Deps.empty() || !llvm::sys::fs::exists(G.Pch) ||
      selectedByFilter(Built.Deps, G.Options))
    return false;
  TUResult Recorded;
  Recorded.File = G.Header;
  Recorded.Failed = false;
  Recorded.Deps = Built.Deps;
  std::string Text;
  llvm::raw_string_ostream OS(Text);
  OS << toJSON(Recorded);
  OS.flush();
  // Written after the PCH: a PCH without its dependency list is never used.
  if (!writeAtomically(G.DepsFile, Text))
    return false;
  G.Built = {G.Pch, Built.Deps, G.DepsFile};
  return true;
}

} // namespace tensor_tidy
