#include "Compare.h"

#include "Rules.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

#include <cmath>
#include <map>

using namespace llvm;

namespace tensor_tidy::verify {

namespace {

bool sameValue(double A, double B) { return std::abs(A - B) <= 1e-5 * std::max(1.0, std::abs(A)); }

std::string at(const Event &E) {
  return E.Op + " at " + sys::path::filename(E.File).str() + ":" + std::to_string(E.Line);
}

/// A line with runs of spaces squeezed, for the report.
std::string squeeze(StringRef L) {
  SmallVector<StringRef> W;
  L.split(W, ' ', -1, false);
  return "\"" + join(W, " ") + "\"";
}

struct OutLine {
  StringRef Text;
  int64_t Begin = 0, End = 0; // byte offsets, End past the newline
};

std::vector<OutLine> outLines(StringRef Out) {
  std::vector<OutLine> R;
  int64_t Pos = 0;
  while (Pos < static_cast<int64_t>(Out.size())) {
    size_t NL = Out.find('\n', Pos);
    int64_t End = NL == StringRef::npos ? Out.size() : NL + 1;
    R.push_back({Out.slice(Pos, NL == StringRef::npos ? Out.size() : NL), Pos, End});
    Pos = End;
  }
  return R;
}

using Pairs = std::map<const Event *, const Event *>;

/// The read that explains a differing line: its value differs from the fixed
/// run's (or has no counterpart there) and was computed from a write.
const Event *explainingRead(const Trace &Orig, const OutLine &L, const Pairs &P,
                            const std::set<std::size_t> &Tainted) {
  for (const Event *R : Orig.readsFeeding(L.Begin, L.End)) {
    auto It = P.find(R);
    bool Differs =
        It == P.end() || !R->Sum || !It->second->Sum || !sameValue(*R->Sum, *It->second->Sum);
    if (Differs && Tainted.count(R->Index))
      return R;
  }
  return nullptr;
}

void compareOutput(const Trace &Orig, StringRef OrigOut, StringRef FixedOut, const Pairs &P,
                   const std::set<std::size_t> &Tainted, Comparison &C) {
  std::vector<OutLine> A = outLines(OrigOut), B = outLines(FixedOut);
  for (size_t I = 0; I < std::max(A.size(), B.size()); ++I) {
    StringRef X = I < A.size() ? A[I].Text : "", Y = I < B.size() ? B[I].Text : "";
    if (X == Y)
      continue;
    std::string D = squeeze(X) + " became " + squeeze(Y);
    const Event *R = I < A.size() ? explainingRead(Orig, A[I], P, Tainted) : nullptr;
    if (R)
      C.OutputExplained.push_back(D + " (" + (R->File.empty() ? R->Message + " read" : at(*R)) +
                                  ")");
    else
      C.OutputUnexplained.push_back(D);
  }
}

} // namespace

Comparison compareRuns(const Trace &Orig, const Trace &Fixed, StringRef OrigOut, StringRef FixedOut,
                       const std::set<std::size_t> &Tainted,
                       function_ref<unsigned(StringRef, unsigned)> MapLine) {
  Comparison C;
  Pairs P;
  for (const auto &[A, B] : Orig.pairWith(Fixed, MapLine)) {
    P[A] = B;
    ++C.Compared;
    if (sameValue(*A->Sum, *B->Sum))
      continue;
    std::string D =
        formatv("{0} (sum {1} -> {2})", at(*A), formatNumber(*A->Sum), formatNumber(*B->Sum)).str();
    (Tainted.count(A->Index) ? C.Explained : C.Unexplained).push_back(D);
  }
  compareOutput(Orig, OrigOut, FixedOut, P, Tainted, C);
  return C;
}

} // namespace tensor_tidy::verify
