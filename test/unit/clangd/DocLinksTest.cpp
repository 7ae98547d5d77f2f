// tensor-clangd's rewriting of clangd's output: links to tensor-* check pages
// point at our docs, Content-Length follows the new body, anything else passes
// unchanged, and messages split across reads are assembled first.
#include "DocLinks.h"

#include <gtest/gtest.h>

using namespace tensor_clangd;

namespace {
const std::string Clangd = "https://clang.llvm.org/extra/clang-tidy/checks/";
const std::string Ours = "https://example.org/docs/checks/";

std::string frame(const std::string &Body) {
  return "Content-Length: " + std::to_string(Body.size()) + "\r\n\r\n" + Body;
}

std::string diag(const std::string &Href) {
  return R"({"codeDescription":{"href":")" + Href + R"("},"code":"x"})";
}
} // namespace

TEST(DocLinks, TensorChecksPointAtOurDocs) {
  EXPECT_EQ(rewriteDocLinks(diag(Clangd + "tensor/clone-in-loop.html")),
            diag(Ours + "tensor-clone-in-loop.md"));
  // Two in one message; other checks' pages are clangd's and stay.
  std::string Two = diag(Clangd + "tensor/view-non-contiguous.html") +
                    diag(Clangd + "bugprone/use-after-move.html") +
                    diag(Clangd + "tensor/sync-in-loop.html");
  EXPECT_EQ(rewriteDocLinks(Two), diag(Ours + "tensor-view-non-contiguous.md") +
                                      diag(Clangd + "bugprone/use-after-move.html") +
                                      diag(Ours + "tensor-sync-in-loop.md"));
  // Not a page name: left alone.
  std::string Odd = diag(Clangd + "tensor/a/b.html");
  EXPECT_EQ(rewriteDocLinks(Odd), Odd);
}

TEST(DocLinks, LengthFollowsTheBody) {
  std::string Buf = frame(diag(Clangd + "tensor/clone-in-loop.html")), Out;
  forwardMessages(Buf, Out);
  EXPECT_EQ(Out, frame(diag(Ours + "tensor-clone-in-loop.md")));
  EXPECT_TRUE(Buf.empty());
}

TEST(DocLinks, SplitReadsAreAssembled) {
  std::string Whole = frame(diag(Clangd + "tensor/clone-in-loop.html")) + frame("{}");
  std::string Buf, Out;
  for (char C : Whole) { // one byte per read: the worst split
    Buf += C;
    forwardMessages(Buf, Out);
  }
  EXPECT_EQ(Out, frame(diag(Ours + "tensor-clone-in-loop.md")) + frame("{}"));
  EXPECT_TRUE(Buf.empty());
}

TEST(DocLinks, OtherOutputPassesUnchanged) {
  std::string Buf = "clangd --help text\n" + frame("{}"), Out;
  forwardMessages(Buf, Out);
  EXPECT_EQ(Out, "clangd --help text\n" + frame("{}"));
  // An incomplete message waits.
  Buf = "Content-Length: 10\r\n\r\n{\"a\"";
  Out.clear();
  forwardMessages(Buf, Out);
  EXPECT_EQ(Out, "");
  EXPECT_EQ(Buf, "Content-Length: 10\r\n\r\n{\"a\"");
}
