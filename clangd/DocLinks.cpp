#include "DocLinks.h"

#include "Docs.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"
#include <cerrno>
#include <cstdio>
#include <unistd.h>

namespace tensor_clangd {
namespace {

/// What clangd's getDiagnosticDocURI makes of "tensor-<name>" (module
/// "tensor", check "<name>").
constexpr llvm::StringLiteral ClangdLink =
    "\"https://clang.llvm.org/extra/clang-tidy/checks/tensor/";
constexpr llvm::StringLiteral Header = "Content-Length: ";

/// The JSON string (quoted) linking to Check's doc page.
const std::string &docLink(llvm::StringRef Check) {
  static llvm::StringMap<std::string> Links; // only the forwarding thread calls this
  auto [It, New] = Links.try_emplace(Check);
  if (New) {
    llvm::raw_string_ostream OS(It->second);
    OS << llvm::json::Value(tensor_tidy::findCheckDoc(Check).HelpUri);
  }
  return It->second;
}

void writeAll(int Fd, llvm::StringRef Data) {
  while (!Data.empty()) {
    ssize_t N = write(Fd, Data.data(), Data.size());
    if (N < 0 && errno == EINTR)
      continue;
    if (N <= 0)
      return; // the client is gone: drop the output, keep draining clangd
    Data = Data.drop_front(N);
  }
}

} // namespace

std::string rewriteDocLinks(llvm::StringRef Body) {
  std::string Out;
  for (size_t At; (At = Body.find(ClangdLink)) != llvm::StringRef::npos;) {
    llvm::StringRef Rest = Body.drop_front(At + ClangdLink.size());
    size_t End = Rest.find(".html\"");
    llvm::StringRef Name = Rest.take_front(End);
    Out += Body.take_front(At);
    if (End == llvm::StringRef::npos || Name.find_first_of("\"\\/") != llvm::StringRef::npos) {
      Out += ClangdLink; // not a link to a check page: leave it
      Body = Rest;
      continue;
    }
    Out += docLink(("tensor-" + Name).str());
    Body = Rest.drop_front(End + 6);
  }
  return Out + Body.str();
}

void forwardMessages(std::string &Buf, std::string &Out) {
  while (!Buf.empty()) {
    llvm::StringRef B(Buf);
    if (!B.starts_with(Header)) {
      if (Header.starts_with(B))
        return; // the start of a header: wait for the rest
      size_t Next = B.find(Header, 1);
      size_t N = Next == llvm::StringRef::npos ? B.size() : Next;
      Out += B.take_front(N);
      Buf.erase(0, N);
      continue;
    }
    size_t HeadersEnd = B.find("\r\n\r\n");
    if (HeadersEnd == llvm::StringRef::npos)
      return;
    llvm::StringRef Headers = B.take_front(HeadersEnd);
    auto [First, Others] = Headers.split("\r\n");
    size_t Length = 0;
    if (First.drop_front(Header.size()).trim().getAsInteger(10, Length)) {
      Out += B.take_front(HeadersEnd + 4); // not a length: pass the headers on
      Buf.erase(0, HeadersEnd + 4);
      continue;
    }
    size_t BodyStart = HeadersEnd + 4;
    if (B.size() < BodyStart + Length)
      return;
    std::string Body = rewriteDocLinks(B.substr(BodyStart, Length));
    Out += (Header + llvm::Twine(Body.size())).str();
    if (!Others.empty())
      Out += ("\r\n" + Others).str();
    Out += "\r\n\r\n" + Body;
    Buf.erase(0, BodyStart + Length);
  }
}

DocLinkRewriter::DocLinkRewriter() {
  int Pipe[2];
  RealOut = dup(STDOUT_FILENO);
  if (RealOut < 0 || pipe(Pipe) != 0) {
    if (RealOut >= 0)
      close(RealOut);
    RealOut = -1; // leave stdout alone: clangd works, with clangd's links
    return;
  }
  dup2(Pipe[1], STDOUT_FILENO);
  close(Pipe[1]);
  PipeIn = Pipe[0];
  Thread = std::thread([this] { run(); });
}

DocLinkRewriter::~DocLinkRewriter() {
  if (RealOut < 0)
    return;
  llvm::outs().flush();
  std::fflush(stdout);
  dup2(RealOut, STDOUT_FILENO); // closes the pipe's write end: the thread sees EOF
  Thread.join();
  close(PipeIn);
  close(RealOut);
}

void DocLinkRewriter::run() {
  std::string Buf, Ready;
  char Chunk[1 << 16];
  for (;;) {
    ssize_t N = read(PipeIn, Chunk, sizeof Chunk);
    if (N < 0 && errno == EINTR)
      continue;
    if (N <= 0)
      break;
    Buf.append(Chunk, N);
    forwardMessages(Buf, Ready);
    writeAll(RealOut, Ready);
    Ready.clear();
  }
  writeAll(RealOut, Buf); // an incomplete message as it is
}

} // namespace tensor_clangd
