#include "Rules.h"

#include "analysis/LayoutAnalysis.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

#include <cstdio>
#include <set>

using namespace llvm;
using clang::tidy::tensor::Finding;
using clang::tidy::tensor::HandleRole;
using clang::tidy::tensor::HazardKind;

namespace tensor_tidy::verify {

std::string formatSize(double Bytes) {
  return clang::tidy::tensor::LayoutAnalysis::formatBytes(static_cast<std::int64_t>(Bytes));
}

std::string formatNumber(double V) {
  char Buf[32];
  std::snprintf(Buf, sizeof Buf, "%.6g", V);
  return Buf;
}

Counts count(ArrayRef<const Event *> Evs) {
  Counts C;
  for (const Event *E : Evs) {
    if (E->Kind == EventKind::Alloc) {
      ++C.Allocs;
      C.AllocBytes += E->Bytes;
      if (C.AllocOp.empty())
        C.AllocOp = E->Op;
    } else if (E->Kind == EventKind::Copy) {
      ++C.Copies;
      C.CopyBytes += E->Bytes;
      if (E->Implicit) {
        ++C.Implicit;
        C.ImplicitBytes += E->Bytes;
        C.LargestImplicit = std::max(C.LargestImplicit, E->Bytes);
        C.ImplicitOp = E->Op;
      }
    }
  }
  return C;
}

namespace {

const char *plural(std::uint64_t N, const char *S = "s") { return N == 1 ? "" : S; }

// ------------------------------------------------------- view that throws --

// An op that throws: the error event at the finding's line is the evidence.
HazardJudgement errorHazard(const HazardInput &In, StringRef What) {
  HazardJudgement J;
  J.Verdict = In.Err ? HazardVerdict::Confirmed : HazardVerdict::Unconfirmed;
  J.Evidence.push_back(In.Err ? formatv("{0} at {1} threw \"{2}\"",
                                        In.Err->Op.empty() ? What : StringRef(In.Err->Op), In.Where,
                                        In.Err->Message)
                                    .str()
                              : What.str() + " at " + In.Where + " ran without error");
  return J;
}

HazardJudgement viewHazard(const HazardInput &In, json::Object &) {
  return errorHazard(In, "view");
}

// A write into an expanded tensor, or one whose input partially overlaps its
// output, throws. An overlap PyTorch cannot detect runs: nothing to confirm.
// Where PyTorch cannot detect the overlap the op runs: the evidence is an op
// that read the storage it wrote through another tensor than its output.
HazardJudgement overlapWriteHazard(const HazardInput &In, json::Object &Figures) {
  HazardJudgement J = errorHazard(In, "the in-place write");
  if (In.Err || !In.Typed || In.Typed->Hazard != HazardKind::OverlapOrderDependent)
    return J;
  for (const Event *E : In.At) {
    if (E->Kind != EventKind::Op || E->Out < 0 || llvm::count(E->Inputs, E->Out) < 2)
      continue;
    Figures["written_storage"] = E->Out;
    J.Verdict = HazardVerdict::Confirmed;
    J.Evidence.back() =
        formatv("{0} at {1} read the storage #{2} it wrote (an overlap PyTorch does not detect: "
                "the result depends on the order of the writes)",
                E->Op, In.Where, E->Out)
            .str();
    break;
  }
  return J;
}

FixJudgement viewFix(const FixInput &In, json::Object &) {
  FixJudgement J;
  if (In.Fixed.errorAt(In.File, In.FixedLine)) {
    J.Remains = "the fixed program still throws at " + In.Where;
    return J;
  }
  Counts N = count(In.AtFix);
  J.Gone = "no error at " + In.Where +
           (N.Copies ? formatv(" (it copies {0} instead, {1} time{2})",
                               formatSize(N.CopyBytes / N.Copies), N.Copies, plural(N.Copies))
                           .str()
                     : std::string(""));
  return J;
}

// --------------------------------------------------- implicit reshape copy --

// Without the implicit copies of other ops on the line (a matmul reshaping
// its operand inside copies under its own name).
std::vector<const Event *> reshapeCopies(ArrayRef<const Event *> Evs) {
  std::vector<const Event *> R;
  for (const Event *E : Evs)
    if (!E->Implicit || StringRef(E->Op).starts_with("reshape") ||
        StringRef(E->Op).starts_with("flatten"))
      R.push_back(E);
  return R;
}

HazardJudgement reshapeHazard(const HazardInput &In, json::Object &Figures) {
  Counts N = count(reshapeCopies(In.At));
  Figures["implicit_copies"] = N.Implicit;
  Figures["implicit_copy_bytes"] = static_cast<int64_t>(N.ImplicitBytes);
  HazardJudgement J;
  J.Verdict = N.Implicit ? HazardVerdict::Confirmed : HazardVerdict::Unconfirmed;
  J.Evidence.push_back(
      N.Implicit ? formatv("{0} at {1} copied {2} implicitly, {3} time{4}", N.ImplicitOp, In.Where,
                           formatSize(N.LargestImplicit), N.Implicit, plural(N.Implicit))
                       .str()
                 : "the reshape at " + In.Where + " ran as a view (no implicit copy)");
  return J;
}

FixJudgement reshapeFix(const FixInput &In, json::Object &Figures) {
  Counts N = count(reshapeCopies(In.AtFix));
  Figures["implicit_copies_after"] = N.Implicit;
  Figures["explicit_copies_after"] = N.Copies - N.Implicit;
  FixJudgement J;
  if (N.Implicit)
    J.Remains = formatv("{0} implicit copies remain at {1}", N.Implicit, In.Where).str();
  else
    J.Gone = formatv("implicit copies {0} -> 0 (the copy is explicit now: {1})",
                     Figures.getInteger("implicit_copies").value_or(0), N.Copies)
                 .str();
  return J;
}

// ------------------------------------------------ copy in a loop, each time --

HazardJudgement loopCopyHazard(const HazardInput &In, json::Object &Figures) {
  Counts N = count(In.At);
  Figures["allocations"] = N.Allocs;
  Figures["allocated_bytes"] = static_cast<int64_t>(N.AllocBytes);
  Figures["copies"] = N.Copies;
  HazardJudgement J;
  J.Verdict = N.Allocs > 1 || N.Copies > 1 ? HazardVerdict::Confirmed : HazardVerdict::Unconfirmed;
  if (N.Allocs > 1)
    J.Evidence.push_back(formatv("{0} at {1} allocated {2} times, {3} in all", N.AllocOp, In.Where,
                                 N.Allocs, formatSize(N.AllocBytes))
                             .str());
  else
    J.Evidence.push_back(
        formatv("the copy at {0} ran {1} time{2}", In.Where, N.Copies, plural(N.Copies)).str());
  return J;
}

FixJudgement loopCopyFix(const FixInput &In, json::Object &Figures) {
  Counts N = count(In.AtFix);
  int64_t Before = Figures.getInteger("allocations").value_or(0);
  Figures["allocations_after"] = N.Allocs;
  Figures["copies_after"] = N.Copies;
  FixJudgement J;
  if (Before > 1 && N.Allocs >= Before) {
    J.Remains = formatv("allocations {0} -> {1}: no fewer", Before, N.Allocs).str();
    return J;
  }
  J.Gone = formatv("allocations {0} -> {1}", Before, N.Allocs).str();
  int64_t CopiesBefore = Figures.getInteger("copies").value_or(0);
  if (CopiesBefore != N.Copies)
    J.Gone += formatv(", copies {0} -> {1}", CopiesBefore, N.Copies).str();
  std::uint64_t PeakBefore = In.Orig.PeakBytes, PeakAfter = In.Fixed.PeakBytes;
  if (PeakBefore && PeakAfter && PeakBefore != PeakAfter) {
    int64_t D = static_cast<int64_t>(PeakAfter) - static_cast<int64_t>(PeakBefore);
    Figures["peak_bytes_before"] = static_cast<int64_t>(PeakBefore);
    Figures["peak_bytes_after"] = static_cast<int64_t>(PeakAfter);
    J.Gone += ", peak memory " + std::string(D < 0 ? "-" : "+") + formatSize(std::abs(D));
  }
  return J;
}

// ------------------------------------------------- a clone nothing needs --

HazardJudgement cloneHazard(const HazardInput &In, json::Object &Figures) {
  Counts N = count(In.At);
  Figures["allocations"] = N.Allocs;
  Figures["copies"] = N.Copies;
  Figures["copied_bytes"] = static_cast<int64_t>(N.CopyBytes);
  HazardJudgement J;
  J.Verdict = N.Copies ? HazardVerdict::Confirmed : HazardVerdict::Unconfirmed;
  J.Evidence.push_back(N.Copies
                           ? formatv("the clone at {0} copied {1}, {2} time{3}", In.Where,
                                     formatSize(N.CopyBytes / N.Copies), N.Copies, plural(N.Copies))
                                 .str()
                           : "no copy at " + In.Where + " in the trace");
  return J;
}

FixJudgement cloneFix(const FixInput &In, json::Object &Figures) {
  Counts N = count(In.AtFix);
  int64_t Copies = Figures.getInteger("copies").value_or(0);
  int64_t Allocs = Figures.getInteger("allocations").value_or(0);
  Figures["copies_after"] = N.Copies;
  Figures["allocations_after"] = N.Allocs;
  FixJudgement J;
  if (N.Copies >= Copies)
    J.Remains = formatv("copies {0} -> {1}: no fewer", Copies, N.Copies).str();
  else
    J.Gone =
        formatv("copies {0} -> {1}, allocations {2} -> {3}", Copies, N.Copies, Allocs, N.Allocs)
            .str();
  return J;
}

// ------------------------------------- a device-to-host wait per iteration --

unsigned toHost(ArrayRef<const Event *> Evs) {
  return count_if(Evs, [](const Event *E) {
    return E->Kind == EventKind::Copy && E->SrcDevice == "cuda" && E->Device == "cpu";
  });
}

HazardJudgement syncHazard(const HazardInput &In, json::Object &Figures) {
  unsigned N = toHost(In.At);
  Figures["device_to_host"] = N;
  HazardJudgement J;
  J.Verdict = N > 1 ? HazardVerdict::Confirmed : HazardVerdict::Unconfirmed;
  J.Evidence.push_back(formatv("{0} device-to-host {1} at {2}, each waiting for the GPU", N,
                               N == 1 ? "copy" : "copies", In.Where)
                           .str());
  return J;
}

FixJudgement syncFix(const FixInput &In, json::Object &Figures) {
  unsigned N = toHost(In.AtFix);
  int64_t Before = Figures.getInteger("device_to_host").value_or(0);
  Figures["device_to_host_after"] = N;
  FixJudgement J;
  if (N > 1 && N >= Before)
    J.Remains = formatv("device-to-host copies {0} -> {1}: no fewer", Before, N).str();
  else
    J.Gone = formatv("device-to-host copies {0} -> {1}", Before, N).str();
  return J;
}

// ------------------------------------------ a write another handle sees --

/// "`images` (aliased at main.cpp:9)", from the typed finding.
std::string holderOf(const Finding *F, std::string &Name) {
  const clang::tidy::tensor::Handle *H = F ? F->handle(HandleRole::Changed) : nullptr;
  Name = H ? H->Name : "";
  std::string Holder = Name.empty() ? std::string("another handle") : "`" + Name + "`";
  if (F && F->Origin.valid())
    Holder += " (aliased at " + sys::path::filename(F->Origin.File).str() + ":" +
              std::to_string(F->Origin.Line) + ")";
  return Holder;
}

HazardJudgement writeHazard(const HazardInput &In, json::Object &Figures) {
  HazardJudgement J;
  const Event *W = nullptr;
  for (const Event *E : In.At)
    if (E->Kind == EventKind::Write && (!W || E->Handles > W->Handles))
      W = E;
  if (!W) {
    J.Evidence.push_back("no in-place write at " + In.Where + " in the trace");
    return J;
  }
  Figures["written_storage"] = W->Out;
  std::string Name, Holder = holderOf(In.Typed, Name);
  if (W->Handles > 1) {
    J.Verdict = HazardVerdict::Confirmed;
    std::string S = formatv("{0} at {1} wrote storage #{2} while {3} still held it", W->Op,
                            In.Where, W->Out, Holder)
                        .str();
    if (W->SumBefore && W->SumAfter && *W->SumBefore != *W->SumAfter)
      S +=
          formatv("; {0} changed from sum {1} to {2}", Name.empty() ? "its data" : "`" + Name + "`",
                  formatNumber(*W->SumBefore), formatNumber(*W->SumAfter))
              .str();
    J.Evidence.push_back(S);
  } else {
    J.Evidence.push_back(formatv("{0} at {1} wrote storage #{2}, which no other handle held", W->Op,
                                 In.Where, W->Out)
                             .str());
  }
  // backward() through a saved tensor this write changed.
  for (const Event &E : In.T.Events)
    if (E.Kind == EventKind::Error && E.Index > W->Index &&
        StringRef(E.Message).contains("modified by an inplace")) {
      J.Verdict = HazardVerdict::Confirmed;
      J.Evidence.push_back("backward() failed: a saved tensor was modified in place at " +
                           In.Where);
      break;
    }
  return J;
}

FixJudgement writeFix(const FixInput &In, json::Object &) {
  const Event *Shared = nullptr;
  for (const Event *E : In.AtFix)
    if (E->Kind == EventKind::Write && E->Handles > 1)
      Shared = E;
  FixJudgement J;
  if (Shared)
    J.Remains =
        formatv("{0} at {1} still writes a storage another handle holds", Shared->Op, In.Where)
            .str();
  else
    J.Gone = "no shared storage is written at " + In.Where + " any more";
  return J;
}

// ------------------------------------------------------- narrowing copy_ --

const Event *conversionAt(ArrayRef<const Event *> Evs) {
  for (const Event *E : Evs)
    if (E->Kind == EventKind::Convert)
      return E;
  return nullptr;
}

HazardJudgement narrowingHazard(const HazardInput &In, json::Object &Figures) {
  HazardJudgement J;
  const Event *C = conversionAt(In.At);
  if (!C) {
    J.Evidence.push_back("no dtype conversion in a copy at " + In.Where + " in the trace");
    return J;
  }
  Figures["changed_values"] = C->Changed;
  Figures["values"] = C->Numel;
  J.Verdict = C->Changed > 0 ? HazardVerdict::Confirmed : HazardVerdict::Unconfirmed;
  std::string S = formatv("{0} at {1} converted {2} to {3}", C->Op.empty() ? "copy_" : C->Op,
                          In.Where, C->FromDType, C->ToDType)
                      .str();
  if (C->Changed >= 0)
    S += formatv(": {0} of {1} value{2} changed", C->Changed, C->Numel, plural(C->Numel)).str();
  if (C->SumBefore && C->SumAfter)
    S +=
        formatv(" (sum {0} -> {1})", formatNumber(*C->SumBefore), formatNumber(*C->SumAfter)).str();
  J.Evidence.push_back(S);
  return J;
}

FixJudgement narrowingFix(const FixInput &In, json::Object &) {
  FixJudgement J;
  if (const Event *C = conversionAt(In.AtFix))
    J.Remains = formatv("the copy at {0} still converts {1} to {2} implicitly", In.Where,
                        C->FromDType, C->ToDType)
                    .str();
  else
    J.Gone = "the copy at " + In.Where + " no longer converts: the conversion is explicit";
  return J;
}

// ------------------------------------------------------- device mismatch --

HazardJudgement deviceHazard(const HazardInput &In, json::Object &) {
  HazardJudgement J;
  bool Thrown =
      In.Err &&
      StringRef(In.Err->Message).contains("Expected all tensors to be on the same device");
  J.Verdict = Thrown ? HazardVerdict::Confirmed : HazardVerdict::Unconfirmed;
  J.Evidence.push_back(
      Thrown ? formatv("{0} at {1} threw \"{2}\"", In.Err->Op, In.Where, In.Err->Message).str()
             : "the op at " + In.Where + " ran without a device error");
  return J;
}

FixJudgement deviceFix(const FixInput &In, json::Object &) {
  FixJudgement J;
  if (const Event *E = In.Fixed.errorAt(In.File, In.FixedLine))
    J.Remains = "the fixed program still throws at " + In.Where + ": " + E->Message;
  else
    J.Gone = "no device error at " + In.Where;
  return J;
}

// ----------------------------------------------------- autograd refusals --

// The first error event after index From whose message contains Text.
const Event *errorAfter(const Trace &T, std::size_t From, StringRef Text) {
  for (const Event &E : T.Events)
    if (E.Kind == EventKind::Error && E.Index >= From && StringRef(E.Message).contains(Text))
      return &E;
  return nullptr;
}

constexpr StringLiteral LeafError = "leaf Variable that requires grad";
constexpr StringLiteral SavedError = "modified by an inplace operation";

HazardJudgement leafHazard(const HazardInput &In, json::Object &) {
  HazardJudgement J;
  if (In.Err && StringRef(In.Err->Message).contains(LeafError)) {
    J.Verdict = HazardVerdict::Confirmed;
    J.Evidence.push_back(
        formatv("the in-place write at {0} raised \"{1}\"", In.Where, In.Err->Message).str());
  } else {
    J.Evidence.push_back("the write at " + In.Where + " ran without the leaf error");
  }
  return J;
}

FixJudgement leafFix(const FixInput &In, json::Object &) {
  FixJudgement J;
  if (const Event *E = In.Fixed.errorAt(In.File, In.FixedLine);
      E && StringRef(E->Message).contains(LeafError))
    J.Remains = "the fixed program still raises the leaf error at " + In.Where;
  else
    J.Gone = "the write at " + In.Where + " ran under no-grad, without the leaf error";
  return J;
}

HazardJudgement savedHazard(const HazardInput &In, json::Object &Figures) {
  HazardJudgement J;
  const Event *W = nullptr;
  for (const Event *E : In.At)
    if (E->Kind == EventKind::Write && !W)
      W = E;
  if (!W) {
    J.Evidence.push_back("no in-place write at " + In.Where + " in the trace");
    return J;
  }
  Figures["written_storage"] = W->Out;
  if (const Event *E = errorAfter(In.T, W->Index, SavedError)) {
    J.Verdict = HazardVerdict::Confirmed;
    J.Evidence.push_back(formatv("{0} at {1} wrote storage #{2}, then backward() raised \"{3}\"",
                                 W->Op, In.Where, W->Out, E->Message)
                             .str());
  } else {
    J.Evidence.push_back(
        formatv("{0} at {1} wrote storage #{2}; no backward() raised", W->Op, In.Where, W->Out)
            .str());
  }
  return J;
}

FixJudgement savedFix(const FixInput &In, json::Object &) {
  FixJudgement J;
  if (errorAfter(In.Fixed, 0, SavedError))
    J.Remains = "backward() in the fixed program still finds a saved tensor modified";
  else
    J.Gone = "backward() ran: nothing it saved was written in place at " + In.Where;
  return J;
}

// ------------------------------------- a graph kept across iterations --

/// The live autograd graph after each run of one op at a line in the loop:
/// the first line from where the kept value is made (the finding's origin) to
/// the accumulation with op events that repeat, its first op's occurrences.
struct GraphSeries {
  unsigned Line = 0;
  std::string Op;
  std::vector<const Event *> Evs;
  bool grows() const {
    if (Evs.size() < 2)
      return false;
    for (size_t I = 1; I < Evs.size(); ++I)
      if (Evs[I]->GraphNodes <= Evs[I - 1]->GraphNodes)
        return false;
    return true;
  }
  std::string text(StringRef File) const {
    const Event *A = Evs.front(), *B = Evs.back();
    std::string At = formatv("{0} at {1}:{2}", Op, sys::path::filename(File), Line).str();
    if (A->GraphNodes == B->GraphNodes)
      return formatv("live autograd nodes after {0} stay at {1}", At, A->GraphNodes).str();
    std::string Text = formatv("live autograd nodes after {0} grew {1} -> {2} over {3} iterations",
                               At, A->GraphNodes, B->GraphNodes, Evs.size());
    if (A->GraphBytes != B->GraphBytes)
      Text += "; tensors saved for backward " + formatSize(A->GraphBytes) + " -> " +
              formatSize(B->GraphBytes);
    return Text;
  }
};

// The last op of one run of line L: the ops before the first one repeats.
const Event *lastOpOfLine(llvm::ArrayRef<const Event *> At) {
  const Event *Last = nullptr;
  std::set<std::string> Seen;
  for (const Event *E : At)
    if (E->Kind == EventKind::Op && E->GraphNodes >= 0) {
      if (!Seen.insert(E->Op).second)
        break;
      Last = E;
    }
  return Last;
}

GraphSeries graphSeries(const Trace &T, StringRef File, unsigned From, unsigned To) {
  GraphSeries S;
  for (unsigned L = std::min(From, To); L <= std::max(From, To); ++L) {
    std::vector<const Event *> At = T.at(File, L);
    const Event *Last = lastOpOfLine(At);
    if (!Last)
      continue;
    for (const Event *E : At)
      if (E->Kind == EventKind::Op && E->Op == Last->Op)
        S.Evs.push_back(E);
    if (S.Evs.size() < 2) {
      S.Evs.clear();
      continue;
    }
    S.Line = L;
    S.Op = Last->Op;
    return S;
  }
  return S;
}

HazardJudgement graphHazard(const HazardInput &In, json::Object &Figures) {
  HazardJudgement J;
  unsigned Line = In.Typed ? In.Typed->Where.Line : 0;
  StringRef File = In.Typed ? StringRef(In.Typed->Where.File) : StringRef();
  unsigned From = In.Typed && In.Typed->Origin.valid() ? In.Typed->Origin.Line : Line;
  Figures["finding_line"] = Line;
  Figures["origin_line"] = From;
  GraphSeries S = graphSeries(In.T, File, From, Line);
  if (S.Evs.empty()) {
    J.Verdict = HazardVerdict::NotExercised;
    J.Evidence.push_back("no op from where the kept value is made to " + In.Where +
                         " ran more than once with the graph counted");
    return J;
  }
  Figures["graph_nodes_first"] = S.Evs.front()->GraphNodes;
  Figures["graph_nodes_last"] = S.Evs.back()->GraphNodes;
  Figures["graph_saved_bytes_last"] = S.Evs.back()->GraphBytes;
  J.Verdict = S.grows() ? HazardVerdict::Confirmed : HazardVerdict::Unconfirmed;
  J.Evidence.push_back(S.text(File));
  return J;
}

FixJudgement graphFix(const FixInput &In, json::Object &Figures) {
  FixJudgement J;
  // The origin line, as the hazard saw it, shifted as the finding's line was.
  int64_t Delta = static_cast<int64_t>(In.FixedLine) -
                  Figures.getInteger("finding_line").value_or(In.FixedLine);
  unsigned From = static_cast<unsigned>(
      Figures.getInteger("origin_line").value_or(In.FixedLine - Delta) + Delta);
  GraphSeries S = graphSeries(In.Fixed, In.File, From, In.FixedLine);
  if (S.Evs.empty()) {
    J.Gone = "no graph is kept at " + In.Where;
    return J;
  }
  Figures["graph_nodes_last_after"] = S.Evs.back()->GraphNodes;
  if (S.grows())
    J.Remains = S.text(In.File);
  else
    J.Gone = S.text(In.File) + formatv(" (were {0} -> {1})",
                                       Figures.getInteger("graph_nodes_first").value_or(0),
                                       Figures.getInteger("graph_nodes_last").value_or(0))
                                   .str();
  return J;
}

// ------------------------------------------------------------- the table --

const CheckRule Rules[] = {
    {"tensor-alias-then-mutate", HazardKind::SharedStorageWrite, true, writeHazard, writeFix},
    {"tensor-inplace-on-detached", HazardKind::DetachedWrite, true, writeHazard, writeFix},
    {"tensor-view-non-contiguous", HazardKind::ViewThrows, false, viewHazard, viewFix},
    {"tensor-reshape-non-contiguous", HazardKind::ImplicitCopy, false, reshapeHazard, reshapeFix},
    {"tensor-clone-in-loop", HazardKind::LoopInvariantCopy, false, loopCopyHazard, loopCopyFix},
    {"tensor-inplace-on-expanded", HazardKind::ExpandedWrite, false, overlapWriteHazard, viewFix},
    {"tensor-inplace-overlap", HazardKind::OverlapThrows, true, overlapWriteHazard, viewFix},
    {"tensor-copy-narrowing", HazardKind::NarrowingCopy, false, narrowingHazard, narrowingFix},
    {"tensor-device-mismatch", HazardKind::DeviceMismatch, false, deviceHazard, deviceFix, true},
    {"tensor-inplace-on-leaf", HazardKind::LeafInplace, true, leafHazard, leafFix},
    {"tensor-inplace-on-saved", HazardKind::SavedInplace, true, savedHazard, savedFix},
    {"tensor-graph-kept-across-iterations", HazardKind::GraphKept, false, graphHazard, graphFix,
     /*NeedsCuda=*/false, /*QuietLine=*/true},
    {"tensor-unnecessary-clone", HazardKind::UnneededCopy, false, cloneHazard, cloneFix},
    {"tensor-sync-in-loop", HazardKind::DeviceSyncInLoop, false, syncHazard, syncFix, true},
};

} // namespace

const CheckRule &ruleFor(StringRef Check, const Finding *Typed) {
  for (const CheckRule &R : Rules)
    if (R.Check == Check)
      return R;
  if (Typed)
    for (const CheckRule &R : Rules)
      if (R.Hazard == Typed->Hazard)
        return R;
  return Rules[0];
}

} // namespace tensor_tidy::verify
