#include "Verdict.h"

namespace tensor_tidy::verify {

llvm::StringRef name(HazardVerdict V) {
  switch (V) {
  case HazardVerdict::Confirmed:
    return "confirmed";
  case HazardVerdict::Unconfirmed:
    return "unconfirmed";
  case HazardVerdict::NotExercised:
    return "not exercised";
  case HazardVerdict::TimedOut:
    return "timed out";
  case HazardVerdict::NotVerified:
    return "not verified";
  }
  return "";
}

llvm::StringRef name(FixVerdict V) {
  switch (V) {
  case FixVerdict::Verified:
    return "verified";
  case FixVerdict::ChangedBehaviour:
    return "changed behaviour";
  case FixVerdict::DoesNotCompile:
    return "does not compile";
  case FixVerdict::Crashed:
    return "crashed";
  case FixVerdict::TimedOut:
    return "timed out";
  case FixVerdict::NotExercised:
    return "not exercised";
  case FixVerdict::None:
    return "none";
  case FixVerdict::NotVerified:
    return "not verified";
  }
  return "";
}

bool fixFailed(FixVerdict V) {
  switch (V) {
  case FixVerdict::ChangedBehaviour:
  case FixVerdict::DoesNotCompile:
  case FixVerdict::Crashed:
  case FixVerdict::TimedOut:
  case FixVerdict::NotVerified:
    return true;
  default:
    return false;
  }
}

bool programUnverified(HazardVerdict V) {
  return V == HazardVerdict::NotVerified || V == HazardVerdict::TimedOut;
}

} // namespace tensor_tidy::verify
