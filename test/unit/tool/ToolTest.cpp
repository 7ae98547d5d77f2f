// Unit tests of the pure parts of tensor-tidy: exit-code precedence, the
// typed finding's JSON form, trace loading, line mapping and the verdict
// rules of the verification table.
#include "CrashReport.h"
#include "ExitCode.h"
#include "analysis/AstHelpers.h"
#include "analysis/Finding.h"
#include "verify/Compare.h"
#include "verify/LineMap.h"
#include "verify/Rules.h"
#include "verify/Trace.h"
#include "verify/Verdict.h"

#include "clang/Frontend/ASTUnit.h"
#include "clang/Tooling/Tooling.h"

#include <gtest/gtest.h>

#include <tuple>

using namespace tensor_tidy;
using namespace tensor_tidy::verify;
namespace tensor = clang::tidy::tensor;

// --- exit codes -------------------------------------------------------------------

TEST(ExitCode, Precedence) {
  auto Code = [](bool Usage, bool Verify, bool TU, unsigned Errors) {
    RunOutcome O;
    O.UsageError = Usage;
    O.VerificationFailed = Verify;
    O.TUFailed = TU;
    O.ErrorFindings = Errors;
    return exitCodeFor(O);
  };
  EXPECT_EQ(Code(false, false, false, 0), ExitClean);
  EXPECT_EQ(Code(false, false, false, 2), ExitFindings);
  EXPECT_EQ(Code(false, false, true, 2), ExitParseFailed);
  EXPECT_EQ(Code(false, true, true, 2), ExitVerifyFailed);
  EXPECT_EQ(Code(false, true, false, 0), ExitVerifyFailed);
  EXPECT_EQ(Code(true, true, true, 2), ExitUsage);
  EXPECT_EQ(static_cast<int>(ExitVerifyFailed), 4);
}

// --- the typed finding ------------------------------------------------------------

static tensor::Finding sampleFinding() {
  tensor::Finding F;
  F.Check = "some-check";
  F.Hazard = tensor::HazardKind::SharedStorageWrite;
  F.Where = {"/src/a.cpp", 5, 5, 88};
  F.Op = F.Where;
  F.OpName = "add_";
  F.Origin = {"/src/a.cpp", 4, 18, 81};
  F.Handles.push_back({tensor::HandleRole::Written, "b", {"/src/a.cpp", 4, 14, 77}});
  F.Handles.push_back({tensor::HandleRole::Changed, "a", {"/src/a.cpp", 3, 14, 45}});
  F.Fix = tensor::FixKind::CloneAtAlias;
  F.Facts = {tensor::Fact::HandleCopy, tensor::Fact::ReadLater};
  return F;
}

TEST(Finding, JsonRoundTrip) {
  tensor::Finding F = sampleFinding(), G;
  llvm::json::Value V = toJSON(F);
  ASSERT_TRUE(fromJSON(V, G));
  EXPECT_EQ(G.Check, F.Check);
  EXPECT_EQ(G.Hazard, F.Hazard);
  EXPECT_EQ(G.Fix, F.Fix);
  EXPECT_EQ(G.OpName, "add_");
  EXPECT_EQ(G.Where.Line, 5u);
  EXPECT_EQ(G.Origin.Col, 18u);
  ASSERT_EQ(G.Handles.size(), 2u);
  ASSERT_NE(G.handle(tensor::HandleRole::Changed), nullptr);
  EXPECT_EQ(G.handle(tensor::HandleRole::Changed)->Name, "a");
  EXPECT_EQ(G.handle(tensor::HandleRole::Changed)->Decl.Line, 3u);
  EXPECT_TRUE(G.has(tensor::Fact::ReadLater));
  EXPECT_FALSE(G.has(tensor::Fact::MayAliasOp));
  // The JSON form is the same after a round trip.
  EXPECT_EQ(toJSON(G), V);
}

TEST(Finding, RejectsOtherSchemaAndUnknownNames) {
  tensor::Finding G;
  llvm::json::Object O = *toJSON(sampleFinding()).getAsObject();
  O["schema"] = tensor::FindingSchemaVersion + 1;
  EXPECT_FALSE(fromJSON(llvm::json::Value(llvm::json::Object(O)), G));
  O["schema"] = tensor::FindingSchemaVersion;
  O["hazard"] = "no-such-hazard";
  EXPECT_FALSE(fromJSON(llvm::json::Value(llvm::json::Object(O)), G));
}

TEST(Finding, AbsentPointsStayInvalid) {
  tensor::Finding F = sampleFinding(), G;
  F.Origin = {};
  ASSERT_TRUE(fromJSON(toJSON(F), G));
  EXPECT_FALSE(G.Origin.valid());
}

TEST(Finding, ResolvesRelativePaths) {
  tensor::Finding F = sampleFinding();
  F.Where.File = "src/../a.cpp";
  F.resolvePaths("/build");
  EXPECT_EQ(F.Where.File, "/build/src/../a.cpp");
  EXPECT_EQ(F.Origin.File, "/src/a.cpp");
}

// --- trace loading ----------------------------------------------------------------

static const char *SampleTrace =
    R"({"seq":0,"ev":"start","schema":1}
{"seq":1,"ev":"alloc","op":"ones","file":"m.cpp","line":3,"col":1,"storage":1,"bytes":16,"device":"cpu"}
{"seq":2,"ev":"op","op":"ones","file":"m.cpp","line":3,"col":1,"name":"ones","kind":"factory","inputs":[],"outputs":[1],"output_tensors":[1],"sum":4}
{"seq":3,"ev":"alloc","op":"clone","file":"m.cpp","line":4,"col":1,"storage":2,"bytes":16,"device":"cpu"}
{"seq":4,"ev":"free","op":null,"file":null,"line":null,"col":null,"storage":2,"bytes":16,"device":"cpu"}
{"seq":5,"ev":"write","op":"add_","file":"m.cpp","line":5,"col":1,"write_op":"add_","storage":1,"tensor":1,"storage_refs":1,"handles":2,"bytes":16,"sum":8}}
{"seq":6,"ev":"copy","op":"reshape","file":"m.cpp","line":6,"col":1,"kind":"reshape","src_storage":1,"dst_storage":3,"src_tensor":1,"dst_tensor":3,"bytes":16}
{"seq":7,"ev":"op","op":"add","file":"m.cpp","line":7,"col":1,"name":"add","inputs":[3],"outputs":[4],"output_tensors":[4],"sum":1}
{"seq":8,"ev":"error","op":"view","file":"m.cpp","line":8,"col":1,"kind":"error","message":"view size is not compatible"}
{"seq":9,"ev":"op","op":"mul)";

TEST(Trace, LoadsEveryKindAndSkipsAPartialLastRow) {
  Trace T = Trace::parse(SampleTrace, "/dir");
  ASSERT_TRUE(T.Loaded);
  ASSERT_EQ(T.Events.size(), 9u);
  EXPECT_EQ(T.Events[0].Kind, EventKind::Start);
  EXPECT_EQ(T.Events[1].Kind, EventKind::Alloc);
  EXPECT_EQ(T.Events[1].File, "/dir/m.cpp");
  EXPECT_EQ(T.Events[2].Op, "ones");
  EXPECT_EQ(T.Events[2].Out, 1);
  // A schema-1 write row closed twice ("}}") is read; its sum before is the
  // last digest of the same tensor.
  const Event &W = T.Events[5];
  EXPECT_EQ(W.Kind, EventKind::Write);
  EXPECT_EQ(W.Handles, 2);
  ASSERT_TRUE(W.SumBefore && W.SumAfter);
  EXPECT_EQ(*W.SumBefore, 4);
  EXPECT_EQ(*W.SumAfter, 8);
  const Event &C = T.Events[6];
  EXPECT_EQ(C.Kind, EventKind::Copy);
  EXPECT_TRUE(C.Implicit);
  EXPECT_EQ(C.Out, 3);
  EXPECT_EQ(C.Inputs, std::vector<std::int64_t>{1});
  EXPECT_EQ(T.Events[8].Kind, EventKind::Error);
  EXPECT_EQ(T.Events[8].Message, "view size is not compatible");
  // Peak: 16 + 16 live at once.
  EXPECT_EQ(T.PeakBytes, 32u);
}

TEST(Trace, IndexesByLineAndFollowsTheWrite) {
  Trace T = Trace::parse(SampleTrace, "/dir");
  EXPECT_EQ(T.at("/dir/m.cpp", 5).size(), 1u);
  EXPECT_NE(T.errorAt("/dir/m.cpp", 8), nullptr);
  EXPECT_EQ(T.errorAt("/dir/m.cpp", 5), nullptr);
  // The write to storage 1 at line 5 reaches the reshape copy and the add.
  std::set<std::size_t> D = T.downstreamOf(1, "/dir/m.cpp", 5);
  EXPECT_TRUE(D.count(5) && D.count(6) && D.count(7));
  EXPECT_FALSE(D.count(2));
}

// The hazard writes storage 1 (saved for backward); backward's nodes read it
// and write a leaf's .grad (storage 6), which a later op and item() read; an
// independent value (storage 8) is read for the second output line.
static const char *BackwardTrace =
    R"({"seq":0,"ev":"start","schema":1}
{"seq":1,"ev":"write","op":"mul_","file":"b.cpp","line":5,"col":1,"write_op":"mul_","storage":1,"tensor":1,"handles":2,"sum":2}
{"seq":2,"ev":"op","op":"mul_","file":"b.cpp","line":5,"col":1,"name":"mul_","inputs":[1],"outputs":[1],"sum":2}
{"seq":3,"ev":"grad","op":"backward","file":"b.cpp","line":7,"col":1,"name":"MulBackward0","saved":[1],"grads_in":[4],"grads_out":[5]}
{"seq":4,"ev":"write","op":"backward","file":"b.cpp","line":7,"col":1,"write_op":"add_","storage":6,"tensor":6,"handles":1,"sum":3}
{"seq":5,"ev":"grad","op":"backward","file":"b.cpp","line":7,"col":1,"name":"torch::autograd::AccumulateGrad","saved":[],"grads_in":[5],"grads_out":[6]}
{"seq":6,"ev":"op","op":"pow","file":"b.cpp","line":8,"col":1,"name":"pow","inputs":[6],"outputs":[7],"sum":9}
{"seq":7,"ev":"read","op":"item","file":"b.cpp","line":8,"col":1,"kind":"item","storage":7,"tensor":7,"sum":9,"stdout_pos":0}
{"seq":8,"ev":"read","op":"item","file":"b.cpp","line":9,"col":1,"kind":"item","storage":8,"tensor":8,"sum":1,"stdout_pos":6}
)";

TEST(Trace, FollowsTheWriteThroughBackwardToTheGrad) {
  Trace T = Trace::parse(BackwardTrace, "/dir");
  EXPECT_EQ(T.Events[3].Kind, EventKind::Grad);
  EXPECT_EQ(T.Events[3].Inputs, (std::vector<std::int64_t>{1, 4}));
  EXPECT_EQ(T.Events[5].Outs, std::vector<std::int64_t>{6});
  // The accumulation's write reads what its node read.
  EXPECT_EQ(T.Events[4].Inputs, std::vector<std::int64_t>{5});
  std::set<std::size_t> D = T.downstreamOf(1, "/dir/b.cpp", 5);
  for (std::size_t I : {3, 4, 5, 6, 7})
    EXPECT_TRUE(D.count(I)) << I;
  EXPECT_FALSE(D.count(8));
  EXPECT_EQ(T.readsFeeding(0, 6).size(), 1u);
  EXPECT_EQ(T.readsFeeding(6, 12).size(), 1u);
}

TEST(Compare, AnOutputLineIsExplainedOnlyByADifferingReadFromTheWrite) {
  Trace A = Trace::parse(BackwardTrace, "/dir");
  std::string Fixed = BackwardTrace;
  // In the fixed run the grad and both reads differ.
  for (auto [From, To] :
       {std::pair<const char *, const char *>{"\"sum\":9,\"stdout", "\"sum\":4,\"stdout"},
        {"\"sum\":1,\"stdout", "\"sum\":5,\"stdout"}})
    Fixed.replace(Fixed.find(From), strlen(From), To);
  Trace B = Trace::parse(Fixed, "/dir");
  std::set<std::size_t> Tainted = A.downstreamOf(1, "/dir/b.cpp", 5);
  auto Same = [](llvm::StringRef, unsigned L) { return L; };
  Comparison C = compareRuns(A, B, "g 9.0\nv 1.0\n", "g 4.0\nv 5.0\n", Tainted, Same);
  ASSERT_EQ(C.OutputExplained.size(), 1u);
  EXPECT_EQ(C.OutputExplained[0], "\"g 9.0\" became \"g 4.0\" (item at b.cpp:8)");
  ASSERT_EQ(C.OutputUnexplained.size(), 1u);
  EXPECT_EQ(C.OutputUnexplained[0], "\"v 1.0\" became \"v 5.0\"");
  // The read of storage 8 is a value difference nothing explains.
  ASSERT_EQ(C.Unexplained.size(), 1u);
  EXPECT_EQ(C.Unexplained[0], "item at b.cpp:9 (sum 1 -> 5)");
}

TEST(Trace, MissingFileIsNotLoaded) {
  EXPECT_FALSE(Trace::load("/no/such/trace.jsonl", "/").Loaded);
}

// --- line mapping -----------------------------------------------------------------

TEST(LineMap, OffsetsToLinesAndColumns) {
  Lines L("ab\ncd\n\nef");
  EXPECT_EQ(L.lineOf(0), 1u);
  EXPECT_EQ(L.lineOf(3), 2u);
  EXPECT_EQ(L.columnOf(4), 2u);
  EXPECT_EQ(L.lineOf(6), 3u);
  EXPECT_EQ(L.lineOf(7), 4u);
}

TEST(LineMap, InsertedLinesShiftTheRest) {
  std::string Orig = "a\nb\nc\n";
  clang::tooling::Replacements R;
  // Insert a line before "b".
  ASSERT_FALSE(bool(R.add(clang::tooling::Replacement("f.cpp", 2, 0, "x\n"))));
  auto Fixed = clang::tooling::applyAllReplacements(Orig, R);
  ASSERT_TRUE(bool(Fixed));
  std::vector<unsigned> M = mapLines(Orig, *Fixed, R);
  EXPECT_EQ(M[1], 1u);
  EXPECT_EQ(M[2], 3u);
  EXPECT_EQ(M[3], 4u);
}

// --- verdict rules ----------------------------------------------------------------

TEST(Verdicts, SpellingsAndFailures) {
  EXPECT_EQ(name(HazardVerdict::NotExercised), "not exercised");
  EXPECT_EQ(name(FixVerdict::ChangedBehaviour), "changed behaviour");
  for (FixVerdict F : {FixVerdict::ChangedBehaviour, FixVerdict::DoesNotCompile,
                       FixVerdict::Crashed, FixVerdict::TimedOut, FixVerdict::NotVerified})
    EXPECT_TRUE(fixFailed(F)) << name(F).str();
  for (FixVerdict F : {FixVerdict::Verified, FixVerdict::None, FixVerdict::NotExercised})
    EXPECT_FALSE(fixFailed(F)) << name(F).str();
  EXPECT_TRUE(failsVerification(HazardVerdict::TimedOut, FixVerdict::None));
  EXPECT_FALSE(failsVerification(HazardVerdict::Unconfirmed, FixVerdict::None));
}

TEST(Verdicts, TableRowPerHazardKind) {
  tensor::Finding F = sampleFinding();
  for (tensor::HazardKind K :
       {tensor::HazardKind::SharedStorageWrite, tensor::HazardKind::DetachedWrite,
        tensor::HazardKind::ViewThrows, tensor::HazardKind::ImplicitCopy,
        tensor::HazardKind::LoopInvariantCopy}) {
    F.Hazard = K;
    EXPECT_EQ(ruleFor("unknown-check", &F).Hazard, K);
  }
  F.Hazard = tensor::HazardKind::ImplicitCopy;
  EXPECT_TRUE(ruleFor("unknown-check", nullptr).Writes);
  EXPECT_FALSE(ruleFor("unknown-check", &F).Writes);
}

TEST(Verdicts, SharedWriteIsConfirmedWithTheTypedHandle) {
  Trace T = Trace::parse(SampleTrace, "/dir");
  tensor::Finding F = sampleFinding();
  const CheckRule &R = ruleFor("", &F);
  HazardInput In{T, "m.cpp:5", T.at("/dir/m.cpp", 5), nullptr, &F};
  llvm::json::Object Figures;
  HazardJudgement J = R.JudgeHazard(In, Figures);
  EXPECT_EQ(J.Verdict, HazardVerdict::Confirmed);
  ASSERT_FALSE(J.Evidence.empty());
  EXPECT_NE(J.Evidence[0].find("`a` (aliased at a.cpp:4)"), std::string::npos) << J.Evidence[0];
  EXPECT_NE(J.Evidence[0].find("from sum 4 to 8"), std::string::npos) << J.Evidence[0];
  EXPECT_EQ(Figures.getInteger("written_storage"), 1);
}

/// The table's row for a hazard kind, and its hazard verdict at a line of SampleTrace.
struct RuleAt {
  Trace T = Trace::parse(SampleTrace, "/dir");
  tensor::Finding F = sampleFinding();
  llvm::json::Object Figures;
  const CheckRule *R;
  HazardJudgement J;
  RuleAt(tensor::HazardKind K, unsigned Line) {
    F.Hazard = K;
    R = &ruleFor("", &F);
    J = R->JudgeHazard({T, "m.cpp:" + std::to_string(Line), T.at("/dir/m.cpp", Line),
                        T.errorAt("/dir/m.cpp", Line), &F},
                       Figures);
  }
};

TEST(Verdicts, ImplicitCopyConfirmedThenGone) {
  RuleAt A(tensor::HazardKind::ImplicitCopy, 6);
  const Trace &T = A.T;
  const CheckRule &R = *A.R;
  llvm::json::Object &Figures = A.Figures;
  HazardJudgement &J = A.J;
  EXPECT_EQ(J.Verdict, HazardVerdict::Confirmed);
  EXPECT_EQ(Figures.getInteger("implicit_copies"), 1);
  // The fixed run has no event there: the implicit copy is gone.
  Trace Fixed = Trace::parse("", "/dir");
  FixJudgement FJ = R.JudgeFix({T, Fixed, "/dir/m.cpp", 6, "m.cpp:6", {}}, Figures);
  EXPECT_TRUE(FJ.Remains.empty());
  EXPECT_EQ(FJ.Gone, "implicit copies 1 -> 0 (the copy is explicit now: 0)");
  // An implicit copy in the fixed run remains.
  FJ = R.JudgeFix({T, T, "/dir/m.cpp", 6, "m.cpp:6", T.at("/dir/m.cpp", 6)}, Figures);
  EXPECT_FALSE(FJ.Remains.empty());
}

TEST(Verdicts, ViewErrorConfirms) {
  RuleAt A(tensor::HazardKind::ViewThrows, 8);
  EXPECT_EQ(A.J.Verdict, HazardVerdict::Confirmed);
  EXPECT_EQ(A.J.Evidence[0], "view at m.cpp:8 threw \"view size is not compatible\"");
}

// --- crash reports (docs/robustness.md) ---------------------------------------------

TEST(CrashReport, StackDumpNamesTheRunningCheck) {
  const char *Log = "some output\n"
                    "Stack dump:\n"
                    "0.\tProgram arguments: tensor-tidy a.cpp\n"
                    "1.\t<eof> parser at end of file\n"
                    "2.\tASTMatcher: Processing 'tensor-view-non-contiguous' against:\n"
                    "\tCXXMemberCallExpr : <a.cpp:3:10>\n"
                    " #0 0x00007f0000001234 llvm::sys::PrintStackTrace(llvm::raw_ostream&, int)\n"
                    " #1 0x00007f0000005678 (/lib/libLLVM.so.19+0x1234)\n";
  CrashDetails D = crashDetailsFromLog(Log);
  EXPECT_EQ(D.Check, "tensor-view-non-contiguous");
  ASSERT_EQ(D.Lines.size(), 7u);
  EXPECT_EQ(D.Lines.front(), "Stack dump:");
  EXPECT_TRUE(isStackFrame(D.Lines[5]));
  EXPECT_FALSE(isStackFrame(D.Lines[1]));
}

TEST(CrashReport, SanitizerReportComesFirst) {
  const char *Log = "==12==ERROR: AddressSanitizer: heap-use-after-free on address 0x6\n"
                    "    #0 0x55 in f(int) /src/a.cpp:3:5\n"
                    "Stack dump:\n";
  CrashDetails D = crashDetailsFromLog(Log);
  EXPECT_EQ(D.Check, "");
  ASSERT_EQ(D.Lines.size(), 3u);
  EXPECT_EQ(D.Lines[0], "==12==ERROR: AddressSanitizer: heap-use-after-free on address 0x6");
  EXPECT_TRUE(isStackFrame(D.Lines[1]));
}

TEST(CrashReport, NoReportAndLongReports) {
  EXPECT_TRUE(crashDetailsFromLog("plain output\n").Lines.empty());
  std::string Long = "Stack dump:\n";
  for (int I = 0; I < 200; ++I)
    Long += " #" + std::to_string(I) + " 0x1 f\n";
  EXPECT_EQ(crashDetailsFromLog(Long).Lines.size(), MaxCrashLines);
  EXPECT_FALSE(isStackFrame("#"));
  EXPECT_FALSE(isStackFrame("#12"));
  EXPECT_FALSE(isStackFrame("#x 0x1"));
}

// --- fix-it ranges ------------------------------------------------------------------

// wholeLines(offset 9, offset 14) in Code: (is a token range, begin, end offsets).
static std::tuple<bool, unsigned, unsigned> wholeLinesIn(llvm::StringRef Code) {
  std::unique_ptr<clang::ASTUnit> AST = clang::tooling::buildASTFromCode(Code);
  const clang::SourceManager &SM = AST->getSourceManager();
  clang::SourceLocation Start = SM.getLocForStartOfFile(SM.getMainFileID());
  clang::CharSourceRange R =
      tensor::wholeLines(Start.getLocWithOffset(9), Start.getLocWithOffset(14), SM);
  return {R.isTokenRange(), SM.getFileOffset(R.getBegin()), SM.getFileOffset(R.getEnd())};
}

// A statement on the last line of a file without a final newline (a
// truncated file): the removal range once ran 4 GiB past the end of the file.
TEST(AstHelpers, WholeLinesStaysInsideAFileWithoutFinalNewline) {
  EXPECT_EQ(wholeLinesIn("int a;\n  int b;"), std::make_tuple(true, 9u, 14u));
  // With the newline, the whole line goes (a char range over "  int b;\n").
  EXPECT_EQ(wholeLinesIn("int a;\n  int b;\n"), std::make_tuple(false, 7u, 16u));
}
