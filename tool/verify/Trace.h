// Reads the runtime's TT_TRACE file (JSON Lines, tt/trace_schema.h, docs/runtime/trace.md) into
// events indexed by user source line, for tensor-tidy --verify.
#pragma once

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace tensor_tidy::verify {

/// The event kinds of runtime/include/tt/trace_schema.h.
enum class EventKind { Start, Alloc, Free, Copy, Write, Op, Error, Convert, Grad, Read, Other };

struct Event {
  std::size_t Index = 0;
  EventKind Kind = EventKind::Other;
  std::string Op;
  std::string File; // absolute
  unsigned Line = 0, Col = 0;
  std::int64_t Out = -1;            // storage written or produced (the first)
  std::int64_t Tensor = -1;         // tensor written or produced
  std::vector<std::int64_t> Inputs; // storages read (grad: saved tensors and incoming grads)
  std::vector<std::int64_t> Outs;   // every storage produced (op: outputs, grad: grads written)
  std::int64_t StdoutPos = -1;      // read: stdout's offset when the values were read
  std::int64_t FeedsUntil = -1;     // read: the output offsets [StdoutPos, FeedsUntil) it feeds
  std::uint64_t Bytes = 0;
  std::string Device, SrcDevice; // alloc/free: the storage's; copy: destination's and source's
  bool Implicit = false;         // a copy the user did not ask for (reshape/flatten)
  std::int64_t Handles = 0;      // live handles on the written storage
  bool Shared = false;           // the written storage was reachable from another live handle
  std::optional<double> SumBefore, SumAfter, Sum;
  /// op: the autograd graph alive after it (-1 when the trace has no count).
  std::int64_t GraphNodes = -1, GraphBytes = -1;
  std::string Message; // error: the message; grad: the node; read: the kind
  // convert: the dtypes (runtime names), elements, and how many changed (-1: not compared)
  std::string FromDType, ToDType;
  std::int64_t Numel = 0, Changed = -1;
};

struct Trace {
  bool Loaded = false;
  std::vector<Event> Events;
  std::uint64_t PeakBytes = 0; // the most bytes allocated at once (alloc minus free)
  std::map<std::pair<std::string, unsigned>, std::vector<std::size_t>> ByLine;
  bool UsedCuda = false;          // some storage lived on a CUDA device
  std::vector<std::size_t> Reads; // the read events, in order

  /// Relative file names in the trace are resolved against Dir (the compile directory).
  static Trace load(llvm::StringRef Path, llvm::StringRef Dir);
  /// The same from the trace's text (JSON Lines).
  static Trace parse(llvm::StringRef Text, llvm::StringRef Dir);
  std::vector<const Event *> at(llvm::StringRef File, unsigned Line) const;
  void linkWrites();
  void spanReads();
  const Event *errorAt(llvm::StringRef File, unsigned Line) const;
  /// Events computed, directly or through other ops, from Storage after the
  /// in-place write to it at File:Line (the write included).
  std::set<std::size_t> downstreamOf(std::int64_t Storage, llvm::StringRef File,
                                     unsigned Line) const;
  /// The read events (item(), data_ptr, printing) whose values fed the
  /// output bytes [Begin, End): those read while stdout stood in that range.
  std::vector<const Event *> readsFeeding(std::int64_t Begin, std::int64_t End) const;
  /// Events with a value digest that both traces have at the same point: same
  /// file, same line (this trace's lines mapped through MapLine), same op, same
  /// occurrence.
  std::vector<std::pair<const Event *, const Event *>>
  pairWith(const Trace &Other,
           llvm::function_ref<unsigned(llvm::StringRef, unsigned)> MapLine) const;
};

} // namespace tensor_tidy::verify
