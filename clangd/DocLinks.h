// clangd links each clang-tidy diagnostic (LSP codeDescription) to
// clang.llvm.org's page for the check, which does not exist for ours. clangd
// builds that link inside one object file, where ld --wrap cannot reach, so
// the fix sits on the wire: clangd's stdout goes through a pipe and a thread
// that points those links at our check docs (tool/Docs) in each LSP message.
#ifndef TENSOR_TIDY_CLANGD_DOCLINKS_H
#define TENSOR_TIDY_CLANGD_DOCLINKS_H

#include "llvm/ADT/StringRef.h"
#include <string>
#include <thread>

namespace tensor_clangd {

/// One LSP message body with clangd's links to tensor-* check pages replaced.
std::string rewriteDocLinks(llvm::StringRef Body);

/// Moves every complete message at the front of Buf to Out, rewritten, with
/// its Content-Length recomputed; bytes that are not a message pass as they
/// are. An incomplete message stays in Buf.
void forwardMessages(std::string &Buf, std::string &Out);

/// While alive, stdout is a pipe drained by a thread that forwards clangd's
/// messages through forwardMessages to the real stdout.
class DocLinkRewriter {
public:
  DocLinkRewriter();
  /// Flushes clangd's output, waits until it is forwarded, restores stdout.
  ~DocLinkRewriter();
  DocLinkRewriter(const DocLinkRewriter &) = delete;
  DocLinkRewriter &operator=(const DocLinkRewriter &) = delete;

private:
  void run();
  int RealOut = -1; // the original stdout
  int PipeIn = -1;  // read end of the pipe that is now fd 1
  std::thread Thread;
};

} // namespace tensor_clangd

#endif
