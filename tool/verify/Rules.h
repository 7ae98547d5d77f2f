// The one table of check-specific verification knowledge: per check, what in
// the original run's trace is evidence of the hazard, and what in the fixed
// run's trace is evidence the fix removed it. A new check adds one row
// (Rules.cpp); nothing else in tool/ names a check.
#pragma once

#include "Trace.h"
#include "Verdict.h"

#include "analysis/Finding.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/JSON.h"

#include <string>
#include <vector>

namespace tensor_tidy::verify {

/// Allocations and copies among some events.
struct Counts {
  unsigned Allocs = 0, Copies = 0, Implicit = 0;
  std::uint64_t AllocBytes = 0, CopyBytes = 0, ImplicitBytes = 0, LargestImplicit = 0;
  std::string AllocOp, ImplicitOp;
};
Counts count(llvm::ArrayRef<const Event *> Evs);

/// The original run at a finding's line (some event there, or an error).
struct HazardInput {
  const Trace &T;
  std::string Where; // "file.cpp:12"
  std::vector<const Event *> At;
  const Event *Err = nullptr;
  const clang::tidy::tensor::Finding *Typed = nullptr;
};
struct HazardJudgement {
  HazardVerdict Verdict = HazardVerdict::Unconfirmed;
  std::vector<std::string> Evidence;
};

/// The fixed run at the lines the fix wrote and the finding's line.
struct FixInput {
  const Trace &Orig, &Fixed;
  std::string File;   // absolute
  unsigned FixedLine; // the finding's line in the fixed file
  std::string Where;  // "file.cpp:<FixedLine>"
  std::vector<const Event *> AtFix;
};
/// Exactly one is set: the hazard's events are gone, or what remains.
struct FixJudgement {
  std::string Gone, Remains;
};

struct CheckRule {
  llvm::StringRef Check;
  clang::tidy::tensor::HazardKind Hazard;
  /// The hazard is a write: values computed from it may differ in the fixed run.
  bool Writes;
  HazardJudgement (*JudgeHazard)(const HazardInput &In, llvm::json::Object &Figures);
  FixJudgement (*JudgeFix)(const FixInput &In, llvm::json::Object &Figures);
  /// The hazard exists only on a CUDA device: a run that used none cannot show it.
  bool CudaOnly = false;
};

/// The row for a check; for an unknown check, the row of its typed hazard
/// kind, else the write row.
const CheckRule &ruleFor(llvm::StringRef Check, const clang::tidy::tensor::Finding *Typed);

/// "512 B", "1.5 KiB", "3.0 MiB": sizes in the evidence.
std::string formatSize(double Bytes);
/// A number as %.6g.
std::string formatNumber(double V);

} // namespace tensor_tidy::verify
