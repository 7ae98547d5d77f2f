#include "Report.h"
#include "CrashReport.h"

#include "Docs.h"
#include "Paths.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/xxhash.h"

#ifndef TT_VERSION
#define TT_VERSION "0"
#endif

using namespace clang;
using namespace clang::tidy;
namespace json = llvm::json;

namespace tensor_tidy {

const char *levelName(const ClangTidyError &E) {
  if (E.IsWarningAsError || E.DiagLevel == ClangTidyError::Error)
    return "error";
  if (E.DiagLevel == ClangTidyError::Warning)
    return "warning";
  return "note";
}

unsigned RunReport::errorCount() const {
  return llvm::count_if(
      Errors, [](const ClangTidyError &E) { return llvm::StringRef(levelName(E)) == "error"; });
}

namespace {

/// The typed finding and the verdict of error I, when there are.
const clang::tidy::tensor::Finding *typedAt(const RunReport &R, size_t I) {
  return I < R.Typed.size() && R.Typed[I] ? &*R.Typed[I] : nullptr;
}
const json::Value *verdictAt(const RunReport &R, size_t I) {
  return I < R.Verdicts.size() && !R.Verdicts[I].getAsNull() ? &R.Verdicts[I] : nullptr;
}
json::Object verifySummary(const RunReport &R) {
  json::Object S = *R.VerifySummary;
  S["exit_code"] = static_cast<int>(R.Exit);
  return S;
}

struct Position {
  unsigned Line = 0, Column = 0; // 1-based; 0 when unknown
  std::string LineText;
};

/// Offsets to lines and columns (in code points, as SARIF's
/// "unicodeCodePoints" column kind has it), reading each file once.
class SourceIndex {
public:
  Position at(llvm::StringRef File, unsigned Offset) {
    auto &Buf = Files[File];
    if (!Buf) {
      auto B = llvm::MemoryBuffer::getFile(File, /*IsText=*/true);
      Buf = B ? std::move(*B) : llvm::MemoryBuffer::getMemBuffer("");
    }
    llvm::StringRef Text = Buf->getBuffer();
    Position P;
    if (File.empty() || Offset > Text.size())
      return P;
    size_t LineStart = Text.rfind('\n', Offset == 0 ? 0 : Offset - 1);
    LineStart = (LineStart == llvm::StringRef::npos || Offset == 0) ? 0 : LineStart + 1;
    P.Line = 1 + Text.take_front(LineStart).count('\n');
    P.Column = 1;
    for (char C : Text.slice(LineStart, Offset))
      if ((static_cast<unsigned char>(C) & 0xC0) != 0x80)
        ++P.Column;
    P.LineText = Text.slice(LineStart, Text.find('\n', LineStart)).rtrim("\r").str();
    return P;
  }

private:
  llvm::StringMap<std::unique_ptr<llvm::MemoryBuffer>> Files;
};

std::string percentEncode(llvm::StringRef Path) {
  std::string Out;
  for (unsigned char C : Path) {
    if (llvm::isAlnum(C) || llvm::StringRef("-._~/").contains(C))
      Out += C;
    else
      Out += "%" + llvm::utohexstr(C, /*LowerCase=*/false, /*Width=*/2);
  }
  return Out;
}

/// SARIF artifact location: relative to %SRCROOT% (the working directory)
/// when the file is below it, which is what GitHub code scanning expects from
/// a run in the checkout; an absolute file URI otherwise.
json::Object artifactLocation(llvm::StringRef File, llvm::StringRef Root) {
  llvm::StringRef Rel = File;
  if (Rel.consume_front(Root) && Rel.consume_front("/"))
    return json::Object{{"uri", percentEncode(Rel)}, {"uriBaseId", "%SRCROOT%"}};
  return json::Object{{"uri", "file://" + percentEncode(File)}};
}

json::Object region(SourceIndex &Index, llvm::StringRef File, unsigned Offset, unsigned Length) {
  Position B = Index.at(File, Offset), E = Index.at(File, Offset + Length);
  json::Object R{{"startLine", std::max(B.Line, 1u)}, {"startColumn", std::max(B.Column, 1u)}};
  if (E.Line) {
    R["endLine"] = E.Line;
    R["endColumn"] = E.Column;
  }
  return R;
}

json::Object physicalLocation(SourceIndex &Index, const tooling::DiagnosticMessage &M,
                              llvm::StringRef Root) {
  unsigned Length =
      M.Ranges.empty() || M.Ranges.front().FileOffset != M.FileOffset ? 0 : M.Ranges.front().Length;
  return json::Object{{"artifactLocation", artifactLocation(M.FilePath, Root)},
                      {"region", region(Index, M.FilePath, M.FileOffset, Length)}};
}

json::Array sarifFixes(SourceIndex &Index, const ClangTidyError &E, llvm::StringRef Root) {
  json::Array Fixes;
  const llvm::StringMap<tooling::Replacements> *Chosen = tooling::selectFirstFix(E);
  if (!Chosen)
    return Fixes;
  json::Array Changes;
  for (const auto &FileAndRepls : *Chosen) {
    json::Array Repls;
    for (const tooling::Replacement &R : FileAndRepls.second)
      Repls.push_back(json::Object{
          {"deletedRegion", region(Index, R.getFilePath(), R.getOffset(), R.getLength())},
          {"insertedContent", json::Object{{"text", R.getReplacementText()}}}});
    if (!Repls.empty())
      Changes.push_back(
          json::Object{{"artifactLocation", artifactLocation(FileAndRepls.first(), Root)},
                       {"replacements", std::move(Repls)}});
  }
  if (!Changes.empty())
    Fixes.push_back(json::Object{{"description", json::Object{{"text", E.Message.Message}}},
                                 {"artifactChanges", std::move(Changes)}});
  return Fixes;
}

/// Rules: every enabled check, then any other name a result carries; the
/// index of each by id.
json::Array sarifRules(const RunReport &Rep, llvm::StringMap<unsigned> &RuleIndex) {
  std::vector<std::string> RuleIds = Rep.EnabledChecks;
  for (const auto &E : Rep.Errors)
    if (!llvm::is_contained(RuleIds, E.DiagnosticName))
      RuleIds.push_back(E.DiagnosticName);
  // A check that reports at error severity (by itself or promoted) has error
  // as its default level.
  std::set<std::string> ErrorRules = Rep.ErrorChecks;
  for (const auto &E : Rep.Errors)
    if (llvm::StringRef(levelName(E)) == "error")
      ErrorRules.insert(E.DiagnosticName);
  json::Array Rules;
  for (const std::string &Id : RuleIds) {
    RuleIndex[Id] = Rules.size();
    CheckDoc Doc = findCheckDoc(Id);
    std::string Short = Doc.Short.empty() ? Id : Doc.Short;
    std::string Full = Doc.Full.empty() ? Short : Doc.Full;
    json::Object Rule{{"id", Id},
                      {"name", Id},
                      {"shortDescription", json::Object{{"text", Short}}},
                      {"fullDescription", json::Object{{"text", Full}}},
                      {"defaultConfiguration",
                       json::Object{{"level", ErrorRules.count(Id) ? "error" : "warning"}}}};
    if (!Doc.HelpUri.empty())
      Rule["helpUri"] = Doc.HelpUri;
    if (!Doc.Markdown.empty())
      Rule["help"] = json::Object{{"text", Full}, {"markdown", Doc.Markdown}};
    Rules.push_back(std::move(Rule));
  }
  return Rules;
}

/// The SARIF results, one per error of the report.
class SarifResults {
public:
  SarifResults(const RunReport &Rep, std::string Root) : Rep(Rep), Root(std::move(Root)) {}
  json::Array build(llvm::StringMap<unsigned> &RuleIndex) {
    json::Array Results;
    for (size_t I = 0; I < Rep.Errors.size(); ++I) {
      const ClangTidyError &E = Rep.Errors[I];
      json::Object Result{{"ruleId", E.DiagnosticName},
                          {"ruleIndex", RuleIndex[E.DiagnosticName]},
                          {"level", levelName(E)},
                          {"message", json::Object{{"text", E.Message.Message}}}};
      if (!E.Message.FilePath.empty()) {
        Result["locations"] = json::Array{
            json::Object{{"physicalLocation", physicalLocation(Index, E.Message, Root)}}};
        Result["partialFingerprints"] = json::Object{{"tensorTidyFindingHash/v1", fingerprint(E)}};
      }
      json::Array Related = relatedLocations(E);
      if (!Related.empty())
        Result["relatedLocations"] = std::move(Related);
      json::Array Fixes = sarifFixes(Index, E, Root);
      if (!Fixes.empty())
        Result["fixes"] = std::move(Fixes);
      json::Object Properties;
      if (I < Rep.TUs.size())
        Properties["tensorTidyTU"] = Rep.TUs[I];
      if (const auto *F = typedAt(Rep, I))
        Properties["tensorTidyFinding"] = toJSON(*F);
      if (const json::Value *V = verdictAt(Rep, I))
        Properties["tensorTidyVerify"] = *V;
      if (!Properties.empty())
        Result["properties"] = std::move(Properties);
      Results.push_back(std::move(Result));
    }
    return Results;
  }

private:
  /// Fingerprints ignore line numbers (edits above a finding keep it) and
  /// count repeats of the same finding on equal lines in one file.
  std::string fingerprint(const ClangTidyError &E) {
    Position P = Index.at(E.Message.FilePath, E.Message.FileOffset);
    json::Object Artifact = artifactLocation(E.Message.FilePath, Root);
    std::string Basis = E.DiagnosticName + '\0' + Artifact.getString("uri")->str() + '\0' +
                        E.Message.Message + '\0' + llvm::StringRef(P.LineText).trim().str();
    std::string Hash = llvm::utohexstr(llvm::xxh3_64bits(Basis), false, 16);
    return Hash + ":" + std::to_string(++Seen[Hash]);
  }
  json::Array relatedLocations(const ClangTidyError &E) {
    json::Array Related;
    for (const auto &Note : E.Notes) {
      if (Note.FilePath.empty())
        continue;
      Related.push_back(json::Object{{"id", static_cast<int64_t>(Related.size())},
                                     {"physicalLocation", physicalLocation(Index, Note, Root)},
                                     {"message", json::Object{{"text", Note.Message}}}});
    }
    return Related;
  }

  const RunReport &Rep;
  std::string Root;
  SourceIndex Index;
  llvm::StringMap<unsigned> Seen;
};

/// A crash as a SARIF exception: the stack's frames, each as the report
/// printed it (symbolized or not).
json::Object sarifException(const RunReport::Failure &F) {
  json::Array Frames;
  for (const std::string &L : F.Log)
    if (isStackFrame(L))
      Frames.push_back(
          json::Object{{"location", json::Object{{"message", json::Object{{"text", L}}}}}});
  return json::Object{{"kind", "crash"},
                      {"message", F.Reason},
                      {"stack", json::Object{{"frames", std::move(Frames)}}}};
}

json::Array sarifNotifications(const RunReport &Rep, llvm::StringRef Root) {
  json::Array Notifications;
  for (const RunReport::Failure &F : Rep.Failures) {
    json::Object N{
        {"level", "error"},
        {"message", json::Object{{"text", F.Reason}}},
        {"locations", json::Array{json::Object{
                          {"physicalLocation",
                           json::Object{{"artifactLocation", artifactLocation(F.File, Root)}}}}}}};
    if (!F.Check.empty())
      N["associatedRule"] = json::Object{{"id", F.Check}};
    if (!F.Log.empty()) {
      N["exception"] = sarifException(F);
      N["properties"] = json::Object{{"crashReport", json::Array(F.Log)}};
    }
    Notifications.push_back(std::move(N));
  }
  return Notifications;
}

} // namespace

void writeSarif(llvm::raw_ostream &OS, const RunReport &Rep) {
  std::string Root = currentDir();
  llvm::StringMap<unsigned> RuleIndex;
  json::Array Rules = sarifRules(Rep, RuleIndex);
  json::Array Results = SarifResults(Rep, Root).build(RuleIndex);
  json::Object Run{
      {"tool", json::Object{{"driver", json::Object{{"name", "tensor-tidy"},
                                                    {"version", TT_VERSION},
                                                    {"semanticVersion", TT_VERSION},
                                                    {"rules", std::move(Rules)}}}}},
      {"originalUriBaseIds",
       json::Object{{"%SRCROOT%", json::Object{{"uri", "file://" + percentEncode(Root) + "/"}}}}},
      {"columnKind", "unicodeCodePoints"},
      {"invocations",
       json::Array{json::Object{{"executionSuccessful", Rep.Failures.empty()},
                                {"toolExecutionNotifications", sarifNotifications(Rep, Root)}}}},
      {"results", std::move(Results)}};
  // What --merge needs to rebuild the rules of an unsharded run.
  json::Object Properties{
      {"tensorTidyChecks",
       json::Object{{"enabled", json::Array(Rep.EnabledChecks)},
                    {"errors", json::Array(std::vector<std::string>(Rep.ErrorChecks.begin(),
                                                                    Rep.ErrorChecks.end()))}}}};
  if (Rep.VerifySummary)
    Properties["tensorTidyVerify"] = verifySummary(Rep);
  Run["properties"] = std::move(Properties);
  json::Value Log = json::Object{{"$schema", "https://json.schemastore.org/sarif-2.1.0.json"},
                                 {"version", "2.1.0"},
                                 {"runs", json::Array{std::move(Run)}}};
  OS << llvm::formatv("{0:2}", Log) << "\n";
}

namespace {

json::Object locatedJson(SourceIndex &Index, const tooling::DiagnosticMessage &M) {
  Position P = Index.at(M.FilePath, M.FileOffset);
  return json::Object{{"message", M.Message},
                      {"file", M.FilePath},
                      {"line", P.Line},
                      {"column", P.Column},
                      {"offset", M.FileOffset}};
}

json::Array jsonFixes(SourceIndex &Index, const ClangTidyError &E) {
  json::Array Fixes;
  if (const auto *Chosen = tooling::selectFirstFix(E))
    for (const auto &FileAndRepls : *Chosen)
      for (const tooling::Replacement &R : FileAndRepls.second) {
        Position P = Index.at(R.getFilePath(), R.getOffset());
        Fixes.push_back(json::Object{{"file", R.getFilePath()},
                                     {"offset", R.getOffset()},
                                     {"length", R.getLength()},
                                     {"line", P.Line},
                                     {"column", P.Column},
                                     {"replacement", R.getReplacementText()}});
      }
  return Fixes;
}

/// Finding I of the run: where, which check, its notes, fixes, typed finding and verdict.
json::Object jsonDiagnostic(const RunReport &Rep, size_t I, SourceIndex &Index) {
  const ClangTidyError &E = Rep.Errors[I];
  json::Object D = locatedJson(Index, E.Message);
  D["check"] = E.DiagnosticName;
  D["level"] = levelName(E);
  json::Array Notes;
  for (const auto &N : E.Notes)
    Notes.push_back(locatedJson(Index, N));
  if (I < Rep.TUs.size())
    D["tu"] = Rep.TUs[I];
  D["notes"] = std::move(Notes);
  D["fixes"] = jsonFixes(Index, E);
  if (const auto *F = typedAt(Rep, I))
    D["finding"] = toJSON(*F);
  if (const json::Value *V = verdictAt(Rep, I))
    D["verify"] = *V;
  return D;
}

json::Array jsonFailures(const RunReport &Rep) {
  json::Array Failures;
  for (const RunReport::Failure &F : Rep.Failures) {
    static const char *const Kinds[] = {"parse-error", "crash", "timeout"};
    json::Object O{{"file", F.File}, {"kind", Kinds[F.What]}, {"reason", F.Reason}};
    if (!F.Check.empty())
      O["check"] = F.Check;
    if (!F.Log.empty())
      O["crashReport"] = json::Array(F.Log);
    Failures.push_back(std::move(O));
  }
  return Failures;
}

} // namespace

void writeJson(llvm::raw_ostream &OS, const RunReport &Rep) {
  SourceIndex Index;
  json::Array Diags;
  unsigned Warnings = 0, Errors = 0;
  for (size_t I = 0; I < Rep.Errors.size(); ++I) {
    (llvm::StringRef(levelName(Rep.Errors[I])) == "error" ? Errors : Warnings)++;
    Diags.push_back(jsonDiagnostic(Rep, I, Index));
  }
  json::Object Out{{"tool", "tensor-tidy"},
                   {"version", TT_VERSION},
                   {"diagnostics", std::move(Diags)},
                   {"failures", jsonFailures(Rep)},
                   {"summary", json::Object{{"files", Rep.Files},
                                            {"cached", Rep.Cached},
                                            {"warnings", Warnings},
                                            {"errors", Errors}}}};
  if (Rep.VerifySummary)
    Out["verify"] = verifySummary(Rep);
  OS << llvm::formatv("{0:2}", json::Value(std::move(Out))) << "\n";
}

} // namespace tensor_tidy
