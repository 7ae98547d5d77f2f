#include "Trace.h"

#include "../Paths.h"
#include "tt/trace_schema.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace llvm;
namespace key = tt::trace_schema::key;
namespace ev = tt::trace_schema::ev;

namespace tensor_tidy::verify {

namespace {

EventKind kindOf(StringRef Ev) {
  static const std::pair<const char *, EventKind> Kinds[] = {
      {ev::kStart, EventKind::Start}, {ev::kAlloc, EventKind::Alloc},
      {ev::kFree, EventKind::Free},   {ev::kCopy, EventKind::Copy},
      {ev::kWrite, EventKind::Write}, {ev::kOp, EventKind::Op},
      {ev::kError, EventKind::Error}, {ev::kConvert, EventKind::Convert},
      {ev::kGrad, EventKind::Grad},   {ev::kRead, EventKind::Read}};
  for (const auto &[Name, Kind] : Kinds)
    if (Ev == Name)
      return Kind;
  return EventKind::Other;
}

std::string str(const json::Object &O, const char *Key) {
  return O.getString(Key).value_or("").str();
}

/// The first id of an array field, or -1.
int64_t firstOf(const json::Object &O, const char *Key) {
  if (const json::Array *A = O.getArray(Key))
    if (!A->empty())
      return (*A)[0].getAsInteger().value_or(-1);
  return -1;
}

/// Every id of an array field, appended to Ids.
void idsOf(const json::Object &O, const char *Key, std::vector<int64_t> &Ids) {
  if (const json::Array *A = O.getArray(Key))
    for (const json::Value &I : *A)
      if (auto N = I.getAsInteger())
        Ids.push_back(*N);
}

/// One row; schema 1 writers closed write/copy rows twice ("}}"): accept
/// those. A run killed mid-line leaves a partial last row: skipped.
std::optional<json::Value> parseRow(StringRef Row) {
  auto V = json::parse(Row);
  if (V)
    return std::move(*V);
  consumeError(V.takeError());
  if (!Row.ends_with("}}"))
    return std::nullopt;
  auto W = json::parse(Row.drop_back());
  if (W)
    return std::move(*W);
  consumeError(W.takeError());
  return std::nullopt;
}

/// The fields each kind of event has (tt/trace_schema.h).
void readFields(const json::Object &O, Event &E) {
  // The user-facing call the event happened in; op events name themselves.
  E.Op = str(O, key::kOp);
  switch (E.Kind) {
  case EventKind::Alloc:
  case EventKind::Free:
    E.Out = O.getInteger(key::kStorage).value_or(-1);
    E.Device = str(O, key::kDevice);
    break;
  case EventKind::Write:
    if (E.Op.empty())
      E.Op = str(O, key::kWriteOp);
    E.Out = O.getInteger(key::kStorage).value_or(-1);
    E.Tensor = O.getInteger(key::kTensor).value_or(-1);
    // Other handles on the written storage: other tensors (views, aliases
    // made by may-alias ops) and other handles on the same tensor.
    E.Handles = std::max<int64_t>(O.getInteger(key::kStorageRefs).value_or(0),
                                  O.getInteger(key::kHandles).value_or(0));
    break;
  case EventKind::Copy: {
    StringRef CopyKind = O.getString(key::kKind).value_or("");
    E.Implicit =
        CopyKind == tt::trace_schema::kCopyReshape || CopyKind == tt::trace_schema::kCopyFlatten;
    if (CopyKind == tt::trace_schema::kCopyCopyInto || E.Op.empty())
      E.Op = CopyKind.str();
    E.Out = O.getInteger(key::kDstStorage).value_or(-1);
    E.Tensor = O.getInteger(key::kDstTensor).value_or(-1);
    if (auto Src = O.getInteger(key::kSrcStorage))
      E.Inputs.push_back(*Src);
    E.Device = str(O, key::kDstDevice);
    E.SrcDevice = str(O, key::kSrcDevice);
    break;
  }
  case EventKind::Op:
    E.Op = str(O, key::kName);
    E.Out = firstOf(O, key::kOutputs);
    E.Tensor = firstOf(O, key::kOutputTensors);
    idsOf(O, key::kInputs, E.Inputs);
    idsOf(O, key::kOutputs, E.Outs);
    E.GraphNodes = O.getInteger(key::kGraphNodes).value_or(-1);
    E.GraphBytes = O.getInteger(key::kGraphBytes).value_or(-1);
    break;
  case EventKind::Error:
    E.Message = str(O, key::kMessage);
    break;
  case EventKind::Grad: // a backward node: saved tensors and grads in -> grads out
    E.Message = str(O, key::kName);
    idsOf(O, key::kSaved, E.Inputs);
    idsOf(O, key::kGradsIn, E.Inputs);
    idsOf(O, key::kGradsOut, E.Outs);
    E.Out = E.Outs.empty() ? -1 : E.Outs.front();
    break;
  case EventKind::Read:
    E.Tensor = O.getInteger(key::kTensor).value_or(-1);
    if (auto S = O.getInteger(key::kStorage))
      E.Inputs.push_back(*S);
    E.StdoutPos = O.getInteger(key::kStdoutPos).value_or(-1);
    E.Message = str(O, key::kKind);
    break;
  case EventKind::Convert:
    E.Tensor = O.getInteger(key::kTensor).value_or(-1);
    E.FromDType = str(O, key::kSrcDType);
    E.ToDType = str(O, key::kDstDType);
    E.Numel = O.getInteger(key::kNumel).value_or(0);
    E.Changed = O.getInteger(key::kChanged).value_or(-1);
    E.SumBefore = O.getNumber(key::kSrcSum);
    E.SumAfter = O.getNumber(key::kSum);
    break;
  default:
    break;
  }
  E.Bytes = O.getInteger(key::kBytes).value_or(0);
  E.Sum = O.getNumber(key::kSum);
}

} // namespace

Trace Trace::load(StringRef Path, StringRef Dir) {
  auto Buf = MemoryBuffer::getFile(Path, /*IsText=*/true, /*RequiresNullTerminator=*/false);
  if (!Buf)
    return Trace();
  return parse((*Buf)->getBuffer(), Dir);
}

Trace Trace::parse(StringRef Text, StringRef Dir) {
  Trace T;
  T.Loaded = true;
  SmallVector<StringRef> Rows;
  Text.split(Rows, '\n', -1, false);
  int64_t Live = 0;
  std::map<int64_t, double> LastSum;
  for (StringRef Row : Rows) {
    std::optional<json::Value> V = parseRow(Row);
    const json::Object *O = V ? V->getAsObject() : nullptr;
    if (!O)
      continue;
    Event E;
    E.Index = T.Events.size();
    E.Kind = kindOf(O->getString(key::kEv).value_or(""));
    readFields(*O, E);
    E.File = str(*O, key::kFile);
    E.Line = O->getInteger(key::kLine).value_or(0);
    E.Col = O->getInteger(key::kCol).value_or(0);
    if (!E.File.empty())
      E.File = absolutePath(E.File, Dir);
    if (E.Kind == EventKind::Write) {
      E.SumAfter = E.Sum;
      // The tensor's digest before the write: the last one the trace recorded for it.
      if (auto It = LastSum.find(E.Tensor); It != LastSum.end())
        E.SumBefore = It->second;
    }
    if (E.Sum && E.Tensor >= 0)
      LastSum[E.Tensor] = *E.Sum;
    T.UsedCuda |= E.Device == "cuda" || E.SrcDevice == "cuda";
    if (E.Kind == EventKind::Alloc) {
      Live += E.Bytes;
      T.PeakBytes = std::max<uint64_t>(T.PeakBytes, Live);
    } else if (E.Kind == EventKind::Free) {
      Live -= E.Bytes;
    }
    if (!E.File.empty())
      T.ByLine[{E.File, E.Line}].push_back(E.Index);
    if (E.Kind == EventKind::Read)
      T.Reads.push_back(E.Index);
    T.Events.push_back(std::move(E));
  }
  T.linkWrites();
  T.spanReads();
  return T;
}

// An in-place write is traced before the op (or backward node) that made it,
// which lists what it read: the write reads that too.
void Trace::linkWrites() {
  for (Event &E : Events) {
    if ((E.Kind != EventKind::Op && E.Kind != EventKind::Grad) || E.Inputs.empty())
      continue;
    for (size_t Back = 1; Back <= 4 && Back <= E.Index; ++Back) {
      Event &W = Events[E.Index - Back];
      if (W.Kind == EventKind::Op || W.Kind == EventKind::Grad)
        break;
      if (W.Kind == EventKind::Write && llvm::is_contained(E.Outs, W.Out))
        W.Inputs.insert(W.Inputs.end(), E.Inputs.begin(), E.Inputs.end());
    }
  }
}

// A data_ptr read feeds the lines printed until the next read (the pointer is
// dereferenced later); item() and printing the line they were read in.
void Trace::spanReads() {
  Event *Prev = nullptr;
  for (std::size_t I : Reads) {
    Event &E = Events[I];
    if (E.StdoutPos < 0)
      continue;
    E.FeedsUntil = E.StdoutPos + 1;
    if (Prev && Prev->Message == tt::trace_schema::kReadDataPtr)
      Prev->FeedsUntil = std::max(Prev->FeedsUntil, E.StdoutPos);
    Prev = &E;
  }
  if (Prev && Prev->Message == tt::trace_schema::kReadDataPtr)
    Prev->FeedsUntil = INT64_MAX;
}

std::vector<const Event *> Trace::at(StringRef File, unsigned Line) const {
  std::vector<const Event *> R;
  auto It = ByLine.find({File.str(), Line});
  if (It != ByLine.end())
    for (std::size_t I : It->second)
      R.push_back(&Events[I]);
  return R;
}

const Event *Trace::errorAt(StringRef File, unsigned Line) const {
  for (const Event *E : at(File, Line))
    if (E->Kind == EventKind::Error)
      return E;
  return nullptr;
}

std::set<std::size_t> Trace::downstreamOf(int64_t Storage, StringRef File, unsigned Line) const {
  // Every run of the write at the line: in a loop each writes a fresh storage.
  std::set<std::size_t> Writes;
  for (const Event *E : at(File, Line))
    if (E->Kind == EventKind::Write)
      Writes.insert(E->Index);
  std::set<std::size_t> R;
  std::set<int64_t> Tainted{Storage};
  for (std::size_t I = Writes.empty() ? Events.size() : *Writes.begin(); I < Events.size(); ++I) {
    const Event &E = Events[I];
    if (E.Kind == EventKind::Free || E.Kind == EventKind::Alloc) {
      if (E.Kind == EventKind::Free)
        Tainted.erase(E.Out); // a storage id is not reused, but stay safe
      continue;
    }
    bool Reads =
        Writes.count(I) || E.Out == Storage || (E.Kind == EventKind::Write && Tainted.count(E.Out));
    for (int64_t In : E.Inputs)
      Reads |= Tainted.count(In) > 0;
    if (!Reads)
      continue;
    R.insert(I);
    if (E.Out >= 0)
      Tainted.insert(E.Out);
    Tainted.insert(E.Outs.begin(), E.Outs.end());
  }
  return R;
}

std::vector<const Event *> Trace::readsFeeding(int64_t Begin, int64_t End) const {
  std::vector<const Event *> R;
  for (std::size_t I : Reads)
    if (const Event &E = Events[I]; E.StdoutPos >= 0 && E.StdoutPos < End && E.FeedsUntil > Begin)
      R.push_back(&E);
  return R;
}

std::vector<std::pair<const Event *, const Event *>>
Trace::pairWith(const Trace &Other, function_ref<unsigned(StringRef, unsigned)> MapLine) const {
  using Key = std::tuple<std::string, unsigned, std::string, unsigned>;
  std::map<Key, const Event *> Theirs;
  std::map<std::tuple<std::string, unsigned, std::string>, unsigned> Seen;
  for (const Event &E : Other.Events)
    if (E.Sum && !E.File.empty())
      Theirs[{E.File, E.Line, E.Op, Seen[{E.File, E.Line, E.Op}]++}] = &E;
  Seen.clear();
  std::vector<std::pair<const Event *, const Event *>> R;
  for (const Event &E : Events) {
    if (!E.Sum || E.File.empty())
      continue;
    unsigned L = MapLine(E.File, E.Line);
    auto It = Theirs.find({E.File, L, E.Op, Seen[{E.File, L, E.Op}]++});
    if (It != Theirs.end())
      R.emplace_back(&E, It->second);
  }
  return R;
}

} // namespace tensor_tidy::verify
