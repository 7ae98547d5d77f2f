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

// Event kinds as --verify reasons about them.
std::string normalKind(StringRef K) {
  if (K == "alloc" || K == "allocate" || K == "allocation")
    return "alloc";
  if (K == "free" || K == "dealloc" || K == "release")
    return "free";
  if (K == "copy")
    return "copy";
  if (K == "inplace" || K == "in_place" || K == "write")
    return "inplace";
  if (K == "view")
    return "view";
  if (K == "error" || K == "exception" || K == "autograd_error")
    return "error";
  return K.empty() ? "op" : K.str();
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
  for (StringRef Row : Rows) {
    auto V = json::parse(Row);
    if (!V) {
      consumeError(V.takeError()); // a run killed mid-line leaves a partial last row
      continue;
    }
    const json::Object *O = V->getAsObject();
    if (!O)
      continue;
    Event E;
    E.Index = T.Events.size();
    E.Kind = normalKind(string(*O, {"ev", "event", "kind", "type"}));
    E.Op = string(*O, {"op", "name"});
    // Location: "loc": {"file","line","col"} or "loc": "file:line:col" or top-level keys.
    const json::Object *L = O->getObject("loc");
    if (!L)
      L = O->getObject("src");
    if (L) {
      E.File = string(*L, {"file"});
      E.Line = number(*L, {"line"}).value_or(0);
      E.Col = number(*L, {"col", "column"}).value_or(0);
    } else if (auto S = O->getString("loc")) {
      auto [Rest, C] = S->rsplit(':');
      auto [F, Ln] = Rest.rsplit(':');
      E.File = F.str();
      Ln.getAsInteger(10, E.Line);
      C.getAsInteger(10, E.Col);
    } else {
      E.File = string(*O, {"file"});
      E.Line = number(*O, {"line"}).value_or(0);
      E.Col = number(*O, {"col", "column"}).value_or(0);
    }
    if (!E.File.empty())
      E.File = absolutePath(E.File, Dir);
    E.Out = number(*O, {"storage", "out", "dst", "storage_id"}).value_or(-1);
    if (const json::Array *In = O->getArray("inputs"))
      for (const json::Value &I : *In)
        if (auto N = I.getAsInteger())
          E.Inputs.push_back(*N);
    if (auto Src = number(*O, {"src", "src_storage"}))
      E.Inputs.push_back((int64_t)*Src);
    E.Bytes = number(*O, {"bytes", "nbytes"}).value_or(0);
    std::string CK = string(*O, {"copy_kind", "copy"});
    E.Implicit = O->getBoolean("implicit").value_or(false) || CK == "implicit";
    E.Handles = number(*O, {"handles", "live_handles", "sharing", "use_count"}).value_or(0);
    E.Shared = O->getBoolean("shared").value_or(false);
    E.SumBefore = number(*O, {"sum_before"});
    E.SumAfter = number(*O, {"sum_after"});
    E.Sum = number(*O, {"sum", "digest"});
    if (!E.Sum)
      E.Sum = E.SumAfter;
    E.Message = string(*O, {"message", "msg", "what"});
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
