#include "Merge.h"

#include "Paths.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"
#include <optional>
#include <set>

namespace json = llvm::json;
using llvm::StringRef;

namespace tensor_tidy {
namespace {

using Error = std::optional<std::string>;

StringRef stringAt(const json::Object &O, StringRef Key) { return O.getString(Key).value_or(""); }

/// An object's value at a path of keys, or null.
const json::Value *at(const json::Value &V, std::initializer_list<StringRef> Path) {
  const json::Value *Cur = &V;
  for (StringRef Key : Path) {
    const json::Object *O = Cur->getAsObject();
    if (!O || !(Cur = O->get(Key)))
      return nullptr;
  }
  return Cur;
}

int64_t integerAt(const json::Value &V, std::initializer_list<StringRef> Path) {
  const json::Value *I = at(V, Path);
  return I ? I->getAsInteger().value_or(0) : 0;
}

std::string serialized(const json::Value *V) {
  std::string S;
  llvm::raw_string_ostream OS(S);
  if (V)
    OS << *V;
  return S;
}

/// Every input parsed; the format is SARIF when they have "runs".
Error load(llvm::ArrayRef<std::string> Files, std::vector<json::Value> &Docs, bool &Sarif) {
  if (Files.empty())
    return std::string("--merge needs the reports to merge");
  for (size_t I = 0; I < Files.size(); ++I) {
    if (!llvm::sys::fs::is_regular_file(Files[I]))
      return "cannot read '" + Files[I] + "'";
    llvm::Expected<json::Value> V = json::parse(readFile(Files[I]));
    if (!V) {
      llvm::consumeError(V.takeError());
      return "'" + Files[I] + "' is not JSON";
    }
    const json::Object *O = V->getAsObject();
    bool IsSarif = O && O->getArray("runs") && O->getArray("runs")->size() == 1;
    if (!IsSarif && !(O && O->getArray("diagnostics") && O->getArray("failures")))
      return "'" + Files[I] + "' is not a tensor-tidy JSON or SARIF report";
    if (I > 0 && IsSarif != Sarif)
      return std::string("cannot merge SARIF and JSON reports together");
    if (O->get("verify") ||
        at(*V, {"runs"}) && at((*O->getArray("runs"))[0], {"properties", "tensorTidyVerify"}))
      return "'" + Files[I] + "' is from a --verify run: those cannot be merged";
    Sarif = IsSarif;
    Docs.push_back(std::move(*V));
  }
  return std::nullopt;
}

/// Items of all parts, stably ordered by their TU (as an unsharded run
/// orders its TUs: by path), the first of each non-empty key kept.
json::Array byTU(std::vector<json::Value> Items,
                 llvm::function_ref<std::string(const json::Value &)> TU,
                 llvm::function_ref<std::string(const json::Value &)> Key) {
  llvm::stable_sort(Items,
                    [&](const json::Value &A, const json::Value &B) { return TU(A) < TU(B); });
  llvm::StringSet<> Seen;
  json::Array Out;
  for (json::Value &V : Items) {
    std::string K = Key(V);
    if (K.empty() || Seen.insert(K).second)
      Out.push_back(std::move(V));
  }
  return Out;
}

/// All elements of the array at \p Path in every document.
std::vector<json::Value> gather(const std::vector<json::Value> &Docs,
                                std::initializer_list<StringRef> Path) {
  std::vector<json::Value> Out;
  for (const json::Value &D : Docs)
    if (const json::Value *A = at(D, Path))
      if (const json::Array *Arr = A->getAsArray())
        Out.insert(Out.end(), Arr->begin(), Arr->end());
  return Out;
}

std::string field(const json::Value &V, StringRef Key) {
  const json::Object *O = V.getAsObject();
  return O ? stringAt(*O, Key).str() : "";
}

/// The driver's merge (Driver.cpp) keys a finding by check, file, offset and message.
std::string jsonKey(const json::Value &V) {
  return field(V, "check") + '\0' + field(V, "file") + '\0' + serialized(at(V, {"offset"})) + '\0' +
         field(V, "message");
}

json::Value mergeJson(const std::vector<json::Value> &Docs, RunOutcome &Outcome) {
  json::Array Diags = byTU(
      gather(Docs, {"diagnostics"}), [](const json::Value &V) { return field(V, "tu"); }, jsonKey);
  json::Array Failures = byTU(
      gather(Docs, {"failures"}), [](const json::Value &V) { return field(V, "file"); },
      [](const json::Value &) { return std::string(); });
  int64_t Files = 0, Cached = 0, Errors = 0;
  for (const json::Value &D : Docs) {
    Files += integerAt(D, {"summary", "files"});
    Cached += integerAt(D, {"summary", "cached"});
  }
  for (const json::Value &V : Diags)
    Errors += field(V, "level") == "error";
  int64_t Warnings = int64_t(Diags.size()) - Errors;
  Outcome.TUFailed = !Failures.empty();
  Outcome.ErrorFindings = Errors;
  const json::Object &First = *Docs.front().getAsObject();
  return json::Object{{"tool", stringAt(First, "tool")},
                      {"version", stringAt(First, "version")},
                      {"diagnostics", std::move(Diags)},
                      {"failures", std::move(Failures)},
                      {"summary", json::Object{{"files", Files},
                                               {"cached", Cached},
                                               {"warnings", Warnings},
                                               {"errors", Errors}}}};
}

/// The rules of the unsharded run (Report.cpp, sarifRules): its enabled
/// checks sorted, then other rule ids in the order results use them; error
/// as the default level of the error checks and of any rule with an error.
json::Array mergeRules(const std::vector<json::Value> &Runs, const json::Array &Results,
                       std::set<std::string> &Enabled, std::set<std::string> &ErrorIds) {
  llvm::StringMap<json::Value> RuleById;
  for (const json::Value &Rule : gather(Runs, {"tool", "driver", "rules"}))
    RuleById.try_emplace(field(Rule, "id"), Rule);
  for (const json::Value &Id : gather(Runs, {"properties", "tensorTidyChecks", "enabled"}))
    Enabled.insert(Id.getAsString().value_or("").str());
  for (const json::Value &Id : gather(Runs, {"properties", "tensorTidyChecks", "errors"}))
    ErrorIds.insert(Id.getAsString().value_or("").str());
  std::vector<std::string> Ids(Enabled.begin(), Enabled.end());
  std::set<std::string> ErrorRules = ErrorIds;
  for (const json::Value &R : Results) {
    std::string Id = field(R, "ruleId");
    if (!llvm::is_contained(Ids, Id))
      Ids.push_back(Id);
    if (field(R, "level") == "error")
      ErrorRules.insert(Id);
  }
  json::Array Rules;
  for (const std::string &Id : Ids) {
    auto It = RuleById.find(Id);
    if (It == RuleById.end())
      continue;
    json::Value Rule = It->second;
    if (json::Object *Config = Rule.getAsObject()->getObject("defaultConfiguration"))
      (*Config)["level"] = ErrorRules.count(Id) ? "error" : "warning";
    Rules.push_back(std::move(Rule));
  }
  return Rules;
}

/// Rule indices and the fingerprints' repeat counts, which depend on the
/// order of the whole report.
void renumber(json::Array &Results, const json::Array &Rules) {
  llvm::StringMap<int64_t> RuleIndex, Repeats;
  for (size_t I = 0; I < Rules.size(); ++I)
    RuleIndex[field(Rules[I], "id")] = I;
  for (json::Value &R : Results) {
    json::Object &O = *R.getAsObject();
    O["ruleIndex"] = RuleIndex.lookup(stringAt(O, "ruleId"));
    json::Object *FP = O.getObject("partialFingerprints");
    if (!FP)
      continue;
    StringRef Hash = FP->getString("tensorTidyFindingHash/v1").value_or("").split(':').first;
    (*FP)["tensorTidyFindingHash/v1"] = Hash.str() + ":" + std::to_string(++Repeats[Hash]);
  }
}

/// The driver's key of a finding: check, place and message.
std::string sarifKey(const json::Value &V) {
  return field(V, "ruleId") + '\0' + serialized(at(V, {"message"})) + '\0' +
         serialized(at(V, {"locations"}));
}

std::string notificationTU(const json::Value &V) {
  const json::Value *Locs = at(V, {"locations"});
  const json::Array *A = Locs ? Locs->getAsArray() : nullptr;
  return A && !A->empty() ? serialized(at((*A)[0], {"physicalLocation", "artifactLocation", "uri"}))
                          : "";
}

Error mergeSarif(const std::vector<json::Value> &Docs, json::Value &Out, RunOutcome &Outcome) {
  std::vector<json::Value> Runs;
  for (const json::Value &D : Docs)
    Runs.push_back((*D.getAsObject()->getArray("runs"))[0]);
  std::string Root = serialized(at(Runs.front(), {"originalUriBaseIds"}));
  for (const json::Value &R : Runs)
    if (serialized(at(R, {"originalUriBaseIds"})) != Root)
      return std::string("the reports were written from different directories");
  json::Array Results = byTU(
      gather(Runs, {"results"}),
      [](const json::Value &V) { return serialized(at(V, {"properties", "tensorTidyTU"})); },
      sarifKey);
  std::set<std::string> Enabled, ErrorIds;
  json::Array Rules = mergeRules(Runs, Results, Enabled, ErrorIds);
  renumber(Results, Rules);
  std::vector<json::Value> Invocations = gather(Runs, {"invocations"});
  std::vector<json::Value> Notes;
  for (const json::Value &I : Invocations)
    if (const json::Value *N = at(I, {"toolExecutionNotifications"}))
      Notes.insert(Notes.end(), N->getAsArray()->begin(), N->getAsArray()->end());
  json::Array Notifications =
      byTU(std::move(Notes), notificationTU, [](const json::Value &) { return std::string(); });
  Outcome.TUFailed = !Notifications.empty();
  Outcome.ErrorFindings =
      llvm::count_if(Results, [](const json::Value &R) { return field(R, "level") == "error"; });
  json::Object Run = *Runs.front().getAsObject();
  (*Run.getObject("tool")->getObject("driver"))["rules"] = std::move(Rules);
  Run["invocations"] =
      json::Array{json::Object{{"executionSuccessful", Notifications.empty()},
                               {"toolExecutionNotifications", std::move(Notifications)}}};
  Run["results"] = std::move(Results);
  (*Run.getObject("properties"))["tensorTidyChecks"] = json::Object{
      {"enabled", json::Array(std::vector<std::string>(Enabled.begin(), Enabled.end()))},
      {"errors", json::Array(std::vector<std::string>(ErrorIds.begin(), ErrorIds.end()))}};
  json::Object Log = *Docs.front().getAsObject();
  Log["runs"] = json::Array{std::move(Run)};
  Out = std::move(Log);
  return std::nullopt;
}

} // namespace

ExitCode mergeReports(llvm::ArrayRef<std::string> Inputs, const std::string &Output) {
  std::vector<json::Value> Docs;
  bool Sarif = false;
  Error E = load(Inputs, Docs, Sarif);
  RunOutcome Outcome;
  json::Value Merged = nullptr;
  if (!E && Sarif)
    E = mergeSarif(Docs, Merged, Outcome);
  else if (!E)
    Merged = mergeJson(Docs, Outcome);
  if (E) {
    reportError(*E);
    return ExitUsage;
  }
  std::string Text = llvm::formatv("{0:2}", Merged).str() + "\n";
  if (Output.empty())
    llvm::outs() << Text;
  else if (!writeFile(Output, Text)) {
    reportError("cannot write '" + Output + "'");
    return ExitUsage;
  }
  return exitCodeFor(Outcome);
}

} // namespace tensor_tidy
