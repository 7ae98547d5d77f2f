#include "Diagnostics.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/xxhash.h"

using namespace clang;
using namespace clang::tidy;
namespace json = llvm::json;

namespace tensor_tidy {

uint64_t hashContents(llvm::StringRef Data) {
  return llvm::xxh3_64bits(llvm::arrayRefFromStringRef(Data));
}

bool isCompilerError(const ClangTidyError &E) {
  return E.DiagLevel == ClangTidyError::Error && !E.IsWarningAsError &&
         llvm::StringRef(E.DiagnosticName).starts_with("clang-diagnostic-");
}

static json::Value messageToJSON(const tooling::DiagnosticMessage &M) {
  json::Array Fixes;
  for (const auto &FileAndRepls : M.Fix)
    for (const tooling::Replacement &R : FileAndRepls.second)
      Fixes.push_back(json::Object{{"file", R.getFilePath()},
                                   {"offset", R.getOffset()},
                                   {"length", R.getLength()},
                                   {"text", R.getReplacementText()}});
  json::Array Ranges;
  for (const tooling::FileByteRange &FBR : M.Ranges)
    Ranges.push_back(
        json::Object{{"file", FBR.FilePath}, {"offset", FBR.FileOffset}, {"length", FBR.Length}});
  return json::Object{{"message", M.Message},
                      {"file", M.FilePath},
                      {"offset", M.FileOffset},
                      {"fixes", std::move(Fixes)},
                      {"ranges", std::move(Ranges)}};
}

static bool messageFromJSON(const json::Value &V, tooling::DiagnosticMessage &M) {
  const json::Object *O = V.getAsObject();
  if (!O)
    return false;
  auto Msg = O->getString("message");
  auto File = O->getString("file");
  auto Offset = O->getInteger("offset");
  if (!Msg || !File || !Offset)
    return false;
  M.Message = Msg->str();
  M.FilePath = File->str();
  M.FileOffset = *Offset;
  if (const json::Array *Fixes = O->getArray("fixes"))
    for (const json::Value &F : *Fixes) {
      const json::Object *FO = F.getAsObject();
      if (!FO)
        return false;
      auto RFile = FO->getString("file");
      auto ROff = FO->getInteger("offset");
      auto RLen = FO->getInteger("length");
      auto RText = FO->getString("text");
      if (!RFile || !ROff || !RLen || !RText)
        return false;
      tooling::Replacement R(*RFile, *ROff, *RLen, *RText);
      if (llvm::Error Err = M.Fix[*RFile].add(R)) {
        llvm::consumeError(std::move(Err));
        return false;
      }
    }
  if (const json::Array *Ranges = O->getArray("ranges"))
    for (const json::Value &R : *Ranges) {
      const json::Object *RO = R.getAsObject();
      if (!RO)
        return false;
      tooling::FileByteRange FBR;
      FBR.FilePath = RO->getString("file").value_or("").str();
      FBR.FileOffset = RO->getInteger("offset").value_or(0);
      FBR.Length = RO->getInteger("length").value_or(0);
      M.Ranges.push_back(std::move(FBR));
    }
  return true;
}

static json::Value errorToJSON(const ClangTidyError &E) {
  json::Array Notes;
  for (const auto &N : E.Notes)
    Notes.push_back(messageToJSON(N));
  json::Array Aliases;
  for (const auto &A : E.EnabledDiagnosticAliases)
    Aliases.push_back(A);
  return json::Object{{"name", E.DiagnosticName},      {"level", static_cast<int>(E.DiagLevel)},
                      {"buildDir", E.BuildDirectory},  {"warningAsError", E.IsWarningAsError},
                      {"aliases", std::move(Aliases)}, {"message", messageToJSON(E.Message)},
                      {"notes", std::move(Notes)}};
}

static bool errorFromJSON(const json::Value &V, std::vector<ClangTidyError> &Out) {
  const json::Object *O = V.getAsObject();
  if (!O)
    return false;
  auto Name = O->getString("name");
  auto Level = O->getInteger("level");
  if (!Name || !Level)
    return false;
  ClangTidyError E(*Name, static_cast<ClangTidyError::Level>(*Level),
                   O->getString("buildDir").value_or(""),
                   O->getBoolean("warningAsError").value_or(false));
  if (const json::Array *A = O->getArray("aliases"))
    for (const json::Value &S : *A)
      if (auto Str = S.getAsString())
        E.EnabledDiagnosticAliases.push_back(Str->str());
  const json::Value *Msg = O->get("message");
  if (!Msg || !messageFromJSON(*Msg, E.Message))
    return false;
  if (const json::Array *Notes = O->getArray("notes"))
    for (const json::Value &N : *Notes) {
      E.Notes.emplace_back();
      if (!messageFromJSON(N, E.Notes.back()))
        return false;
    }
  Out.push_back(std::move(E));
  return true;
}

json::Value toJSON(const TUResult &R) {
  json::Array Deps, Errors;
  for (const auto &D : R.Deps)
    Deps.push_back(json::Array{D.first, llvm::utohexstr(D.second)});
  for (const auto &E : R.Errors)
    Errors.push_back(errorToJSON(E));
  json::Array Findings;
  for (const auto &F : R.Findings)
    Findings.push_back(toJSON(F));
  return json::Object{
      {"file", R.File},          {"failed", R.Failed},          {"preamble", R.UsedPreamble},
      {"deps", std::move(Deps)}, {"errors", std::move(Errors)}, {"findings", std::move(Findings)}};
}

bool fromJSON(const json::Value &V, TUResult &R) {
  const json::Object *O = V.getAsObject();
  if (!O)
    return false;
  R.File = O->getString("file").value_or("").str();
  R.Failed = O->getBoolean("failed").value_or(true);
  R.UsedPreamble = O->getBoolean("preamble").value_or(false);
  if (const json::Array *Deps = O->getArray("deps"))
    for (const json::Value &D : *Deps) {
      const json::Array *Pair = D.getAsArray();
      uint64_t Hash;
      if (!Pair || Pair->size() != 2 || !(*Pair)[0].getAsString() || !(*Pair)[1].getAsString() ||
          (*Pair)[1].getAsString()->getAsInteger(16, Hash))
        return false;
      R.Deps.emplace_back((*Pair)[0].getAsString()->str(), Hash);
    }
  if (const json::Array *Errors = O->getArray("errors"))
    for (const json::Value &E : *Errors)
      if (!errorFromJSON(E, R.Errors))
        return false;
  if (const json::Array *Findings = O->getArray("findings"))
    for (const json::Value &F : *Findings) {
      R.Findings.emplace_back();
      if (!clang::tidy::tensor::fromJSON(F, R.Findings.back()))
        return false;
    }
  return true;
}

} // namespace tensor_tidy
