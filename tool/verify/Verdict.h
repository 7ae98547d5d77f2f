// The verdicts --verify gives each finding (docs/verify.md), as enums with
// their one spelling in the report.
#pragma once

#include "llvm/ADT/StringRef.h"

namespace tensor_tidy::verify {

enum class HazardVerdict { Confirmed, Unconfirmed, NotExercised, TimedOut, NotVerified };

enum class FixVerdict {
  Verified,
  ChangedBehaviour,
  DoesNotCompile,
  Crashed,
  TimedOut,
  NotExercised,
  None, // no fix-it, and no other finding's fix removed the hazard
  NotVerified,
};

llvm::StringRef name(HazardVerdict V);
llvm::StringRef name(FixVerdict V);

/// A fix that must not be applied blindly: it changed behaviour, did not
/// build, crashed, timed out or left the hazard in place.
bool fixFailed(FixVerdict V);
/// The program the finding is in could not be verified at all.
bool programUnverified(HazardVerdict V);
/// The finding makes the run fail verification (exit code 4).
inline bool failsVerification(HazardVerdict H, FixVerdict F) {
  return fixFailed(F) || programUnverified(H);
}

} // namespace tensor_tidy::verify
