#include "Trace.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

using namespace llvm;

namespace tensor_tidy::verify {

namespace {

std::string absolutePath(StringRef Path, StringRef Dir) {
  SmallString<256> P(Path);
  if (!sys::path::is_absolute(P) && !Dir.empty()) {
    SmallString<256> D(Dir);
    sys::path::append(D, P);
    P = D;
  }
  sys::path::remove_dots(P, /*remove_dot_dot=*/true);
  return std::string(P);
}

std::optional<double> number(const json::Object &O, std::initializer_list<StringRef> Keys) {
  for (StringRef K : Keys)
    if (auto V = O.getNumber(K))
      return *V;
  return std::nullopt;
}

std::string string(const json::Object &O, std::initializer_list<StringRef> Keys) {
  for (StringRef K : Keys)
    if (auto V = O.getString(K))
      return V->str();
  return "";
}

// The runtime's event names (docs/runtime/trace.md), as --verify reasons about them.
std::string normalKind(StringRef Ev) {
  if (Ev == "write")
    return "inplace";
  return Ev.str(); // alloc, free, copy, op, error, start
}

} // namespace

Trace Trace::load(StringRef Path, StringRef Dir) {
  Trace T;
  auto Buf = MemoryBuffer::getFile(Path, /*IsText=*/true, /*RequiresNullTerminator=*/false);
  if (!Buf)
    return T;
  T.Loaded = true;
  SmallVector<StringRef> Rows;
  (*Buf)->getBuffer().split(Rows, '\n', -1, false);
  int64_t Live = 0;
  std::map<int64_t, double> LastSum;
  for (StringRef Row : Rows) {
    auto V = json::parse(Row);
    if (!V) {
      consumeError(V.takeError());
      // Schema 1 writers closed write/copy rows twice ("}}"): accept those.
      if (!Row.ends_with("}}") || !(V = json::parse(Row.drop_back()))) {
        consumeError(V.takeError()); // a run killed mid-line leaves a partial last row
        continue;
      }
    }
    const json::Object *O = V->getAsObject();
    if (!O)
      continue;
    Event E;
    E.Index = T.Events.size();
    StringRef Ev = O->getString("ev").value_or("");
    E.Kind = normalKind(Ev);
    // "op" is the user-facing call the event happened in; op events name themselves.
    E.Op = string(*O, {"op", "name", "write_op"});
    if (Ev == "op")
      E.Op = string(*O, {"name", "op"});
    E.File = string(*O, {"file"});
    E.Line = number(*O, {"line"}).value_or(0);
    E.Col = number(*O, {"col"}).value_or(0);
    if (!E.File.empty())
      E.File = absolutePath(E.File, Dir);
    E.Out = number(*O, {"storage", "dst_storage"}).value_or(-1);
    if (const json::Array *Outs = O->getArray("outputs"))
      if (!Outs->empty())
        E.Out = (*Outs)[0].getAsInteger().value_or(-1);
    if (const json::Array *In = O->getArray("inputs"))
      for (const json::Value &I : *In)
        if (auto N = I.getAsInteger())
          E.Inputs.push_back(*N);
    E.Tensor = O->getInteger(Ev == "copy" ? "dst_tensor" : "tensor").value_or(-1);
    if (const json::Array *Outs = O->getArray("output_tensors"))
      if (!Outs->empty())
        E.Tensor = (*Outs)[0].getAsInteger().value_or(-1);
    if (auto Src = O->getInteger("src_storage"))
      E.Inputs.push_back(*Src);
    E.Bytes = number(*O, {"bytes"}).value_or(0);
    StringRef CopyKind = O->getString("kind").value_or("");
    E.Implicit = Ev == "copy" && (CopyKind == "reshape" || CopyKind == "flatten");
    if (Ev == "copy")
      E.Op = CopyKind.str() == "copy_" ? "copy_" : (E.Op.empty() ? CopyKind.str() : E.Op);
    // Other handles on the written storage: other tensors (views, aliases made
    // by may-alias ops) and other handles on the same tensor.
    E.Handles = std::max<int64_t>(O->getInteger("storage_refs").value_or(0),
                                  O->getInteger("handles").value_or(0));
    E.Sum = O->getNumber("sum");
    if (Ev == "write") {
      E.SumAfter = E.Sum;
      // The tensor's digest before the write: the last one the trace recorded for it.
      if (auto It = LastSum.find(E.Tensor); It != LastSum.end())
        E.SumBefore = It->second;
    }
    if (E.Sum && E.Tensor >= 0)
      LastSum[E.Tensor] = *E.Sum;
    E.Message = string(*O, {"message"});
    if (E.Kind == "alloc") {
      Live += E.Bytes;
      T.PeakBytes = std::max<uint64_t>(T.PeakBytes, Live);
    } else if (E.Kind == "free") {
      Live -= E.Bytes;
    }
    if (auto Peak = number(*O, {"peak_bytes"}))
      T.PeakBytes = std::max<uint64_t>(T.PeakBytes, *Peak);
    if (!E.File.empty())
      T.ByLine[{E.File, E.Line}].push_back(E.Index);
    T.Events.push_back(std::move(E));
  }
  return T;
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
    if (E->Kind == "error")
      return E;
  return nullptr;
}

std::set<std::size_t> Trace::downstreamOf(int64_t Storage, StringRef File, unsigned Line) const {
  std::set<std::size_t> R;
  std::size_t Start = Events.size();
  for (const Event *E : at(File, Line))
    if (E->Kind == "inplace" && E->Out == Storage) {
      Start = E->Index;
      break;
    }
  std::set<int64_t> Tainted{Storage};
  for (std::size_t I = Start; I < Events.size(); ++I) {
    const Event &E = Events[I];
    if (E.Kind == "free" || E.Kind == "alloc") {
      if (E.Kind == "free")
        Tainted.erase(E.Out); // a storage id is not reused, but stay safe
      continue;
    }
    bool Reads = I == Start || E.Out == Storage;
    for (int64_t In : E.Inputs)
      Reads |= Tainted.count(In) > 0;
    if (!Reads)
      continue;
    R.insert(I);
    if (E.Out >= 0)
      Tainted.insert(E.Out);
  }
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
