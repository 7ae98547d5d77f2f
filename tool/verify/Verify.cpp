// tensor-tidy --verify. The flow per program (a TU with main):
//   collect findings ─► apply fix-its to scratch copies (VFS overlay) ─► build and run the
//   original and the fixed program with TT_TRACE ─► judge each finding from the traces
//   (Rules.cpp, one row per check) ─► annotate the driver's report.
#include "Verify.h"

#include "../Paths.h"
#include "Compare.h"
#include "LineMap.h"
#include "Process.h"
#include "Rules.h"
#include "Trace.h"
#include "Verdict.h"

#include "clang/Tooling/Core/Diagnostic.h"
#include "clang/Tooling/Core/Replacement.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/ThreadPool.h"
#include "llvm/Support/Threading.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <set>

extern char **environ;

using namespace llvm;
namespace cl = llvm::cl;
using clang::tidy::ClangTidyError;
using clang::tooling::Replacement;
using clang::tooling::Replacements;
using TypedFinding = clang::tidy::tensor::Finding;

namespace tensor_tidy::verify {

static cl::opt<bool> Verify("verify",
                            cl::desc("Prove each finding and its fix: compile and run the "
                                     "original and the fixed program against the runtime with "
                                     "TT_TRACE on (docs/verify.md)"));
static cl::opt<unsigned> Timeout("verify-timeout",
                                 cl::desc("Seconds each program run may take (default 20)"),
                                 cl::init(20));
static cl::opt<unsigned>
    MemoryMB("verify-memory", cl::desc("Memory limit of each program run in MiB (default 4096)"),
             cl::init(4096));
static cl::list<std::string>
    ProgramArgs("verify-arg", cl::desc("An argument passed to both programs (repeatable)"),
                cl::value_desc("arg"));
static cl::opt<std::string>
    StdinFile("verify-stdin",
              cl::desc("File fed to both programs' stdin ('-': tensor-tidy's own stdin; "
                       "default: empty)"),
              cl::value_desc("file"), cl::init(""));
static cl::opt<std::string>
    Cxx("verify-cxx", cl::desc("C++ compiler used to build the programs (default clang++-19)"),
        cl::init(""));
static cl::opt<std::string>
    KeepDir("verify-keep",
            cl::desc("Keep the scratch copies, binaries and traces in this directory"),
            cl::value_desc("dir"), cl::init(""));

void registerOptions(cl::OptionCategory &Category) {
  cl::Option *Opts[] = {&Verify,    &Timeout, &MemoryMB, std::addressof(ProgramArgs),
                        &StdinFile, &Cxx,     &KeepDir};
  for (cl::Option *O : Opts)
    O->addCategory(Category);
}

bool enabled() { return Verify; }

namespace {

// ------------------------------------------------------------- the model --

struct Variant;

/// One finding of the driver's report, as --verify follows it.
struct Checked {
  const ClangTidyError *E;
  const TypedFinding *Typed; // null when the check emitted none
  size_t Index;              // in the driver's report
  std::string File;          // absolute
  unsigned Line = 0, Col = 0;
  std::string Check;
  const CheckRule *Rule = nullptr;
  bool HasFix = false, FixApplied = false;
  std::string FixConflict;
  const Checked *By = nullptr;   // whose fix-it it is judged by (itself, or a shared one)
  Variant *Run = nullptr;        // the fixed program with By's fix-it alone
  std::set<unsigned> FixedLines; // lines of Run's fixed file By's fix touched
  unsigned FixedLine = 0;        // the finding's line in Run's fixed file
  HazardVerdict Hazard = HazardVerdict::NotVerified;
  FixVerdict Fix = FixVerdict::NotVerified;
  std::vector<std::string> HazardEv, FixEv;
  json::Object Figures;
  std::string where() const { return sys::path::filename(File).str() + ":" + std::to_string(Line); }
};

/// A fixed program: one finding's fix-it (and the findings it also covers),
/// or all applied fix-its together.
struct Variant {
  std::string Tag;               // scratch-file prefix: <name>.fixed, <name>.fix2, ...
  std::vector<Checked *> Judged; // the findings whose verdict comes from this run
  std::map<std::string, Replacements> Reps;
  std::map<std::string, std::string> Texts;              // path -> fixed text
  std::map<std::string, std::vector<unsigned>> LineMaps; // original line -> fixed line
  std::string BuildLog;
  bool Built = false;
  RunResult Run;
  Trace T;
  std::set<size_t> Tainted; // original-run events computed from its findings' writes
  unsigned mappedLine(StringRef File, unsigned L) const {
    auto M = LineMaps.find(File.str());
    return M != LineMaps.end() && L < M->second.size() ? M->second[L] : L;
  }
};

struct Program {
  std::string File, Dir; // the TU and its compile directory
  std::string Name;      // for scratch files: the TU's stem, made unique
  std::vector<std::string> Flags;
  std::vector<Checked *> Findings;
  std::map<std::string, std::string> Original; // path -> text, for files with fixes
  std::map<std::string, Replacements> Reps;    // every applied fix-it
  std::vector<std::unique_ptr<Variant>> Own;   // one per applied fix-it
  std::unique_ptr<Variant> All;                // all together, when more than one
  std::string Status;                          // "" ok, else why the program could not be verified
  std::string OrigBuild;
  RunResult OrigRun;
  Trace OrigTrace;
  bool OrigBuilt = false;
  std::vector<std::string> CombinedEv; // the all-fixes run's verdict, for the report
  bool CombinedFailed = false;
  std::vector<Variant *> variants() const {
    std::vector<Variant *> V;
    for (auto &O : Own)
      V.push_back(O.get());
    if (All)
      V.push_back(All.get());
    return V;
  }
};

// Compile flags of a file from the database, minus what would make it not link.
std::vector<std::string> flagsFor(const std::vector<clang::tooling::CompileCommand> &Cmds,
                                  std::string &Dir) {
  std::vector<std::string> Flags;
  if (Cmds.empty())
    return Flags;
  const auto &C = Cmds.front();
  Dir = C.Directory;
  std::string AbsFile = absolutePath(C.Filename, C.Directory);
  for (size_t I = 1; I < C.CommandLine.size(); ++I) {
    StringRef A = C.CommandLine[I];
    if (A == "-c" || A == "-fsyntax-only" || A == "-MD" || A == "-MMD" || A == "--")
      continue;
    if (A == "-o" || A == "-MF" || A == "-MT" || A == "-MQ") {
      ++I;
      continue;
    }
    if ((A.starts_with("-o") && A.size() > 2) || A.starts_with("-MF") || A.starts_with("-MT"))
      continue;
    if (!A.starts_with("-") && absolutePath(A, C.Directory) == AbsFile)
      continue;
    Flags.push_back(A.str());
  }
  return Flags;
}

struct Runtime {
  std::string Include, LibDir;
};

Runtime findRuntime(const char *Argv0) {
  static int Anchor;
  std::string Exe = sys::fs::getMainExecutable(Argv0, &Anchor);
  SmallString<256> Prefix(sys::path::parent_path(sys::path::parent_path(Exe)));
  Runtime R;
  for (StringRef Sub : {"", "x86_64-linux-gnu"}) {
    SmallString<256> L(Prefix);
    sys::path::append(L, "lib", Sub);
    SmallString<256> So(L);
    sys::path::append(So, "libtt_runtime.so");
    if (sys::fs::exists(So)) {
      R.LibDir = std::string(L);
      break;
    }
  }
  SmallString<256> Inc(Prefix);
  sys::path::append(Inc, "include");
  SmallString<256> Hdr(Inc);
  sys::path::append(Hdr, "tt", "tt.h");
  if (sys::fs::exists(Hdr))
    R.Include = std::string(Inc); // install prefix
#ifdef TT_SOURCE_INCLUDE_DIR
  else if (sys::fs::exists(TT_SOURCE_INCLUDE_DIR "/tt/tt.h"))
    R.Include = TT_SOURCE_INCLUDE_DIR; // build tree
#endif
  return R;
}

std::string findCompiler() {
  if (!Cxx.empty())
    return Cxx;
  if (auto P = sys::findProgramByName("clang++-19"))
    return *P;
  return "/usr/lib/llvm-19/bin/clang++";
}

json::Object toJSON(const Checked &F) {
  return json::Object{{"hazard", name(F.Hazard)},
                      {"fix", name(F.Fix)},
                      {"hazard_evidence", json::Array(F.HazardEv)},
                      {"fix_evidence", json::Array(F.FixEv)},
                      {"figures", json::Object(F.Figures)}};
}

// ------------------------------------------------------------ the stages --

class Verifier {
public:
  Runtime RT;
  std::string Compiler, Scratch, StdinPath;
  OutputFormat Format = OutputFormat::Text;
  unsigned Jobs = 0; // parallel builds and runs; 0: one per core

  /// The AfterAnalysis hook: every stage, then the verdicts into the report.
  void run(RunReport &Report, const clang::tooling::CompilationDatabase &DB,
           ArrayRef<std::string> Files);

private:
  std::vector<std::unique_ptr<Program>> Programs;
  std::vector<std::unique_ptr<Checked>> Findings;
  std::map<std::string, std::string> Texts; // source files read, by absolute path

  const std::string &text(const std::string &Path) {
    auto It = Texts.find(Path);
    if (It == Texts.end())
      It = Texts.emplace(Path, readFile(Path)).first;
    return It->second;
  }
  void collect(const RunReport &Report, const clang::tooling::CompilationDatabase &DB,
               ArrayRef<std::string> Files);
  std::map<std::string, Replacements> absoluteFix(const Checked &F);
  void assignFix(Checked &F, Program &P);
  void group(Program &P);
  void applyFixes(Program &P);
  void applyFixes(Program &P, Variant &V);
  void markFixedLines(Variant &V, Checked &F);
  void buildAndRun();
  bool build(Program &P, const Variant *V, std::string &Log, std::string &Exe);
  void runProgram(Program &P, Variant *V, const std::string &Exe);
  void explainUnverifiable(Program &P);
  void judge(Program &P);
  void taint(Program &P);
  void judgeHazard(Program &P, Checked &F);
  void judgeFix(Program &P, Checked &F);
  bool judgeFixedRun(Checked &F, const Variant &V);
  void judgeSideEffects(Program &P, Checked &F, const Variant &V, std::string Gone);
  void judgeCombined(Program &P);
  void report(RunReport &Report);
  void textReport(raw_ostream &OS);
};

void Verifier::run(RunReport &Report, const clang::tooling::CompilationDatabase &DB,
                   ArrayRef<std::string> Files) {
  collect(Report, DB, Files);
  for (auto &P : Programs) {
    group(*P);
    applyFixes(*P);
  }
  buildAndRun();
  for (auto &P : Programs)
    judge(*P);
  report(Report);
}

// Programs: one per input TU. Findings, with their lines and fixes; a
// finding in a header belongs to every program.
void Verifier::collect(const RunReport &Report, const clang::tooling::CompilationDatabase &DB,
                       ArrayRef<std::string> Files) {
  std::set<std::string> TUs;
  for (const std::string &F : Files) {
    auto P = std::make_unique<Program>();
    P->Flags = flagsFor(DB.getCompileCommands(F), P->Dir);
    P->File = F;
    TUs.insert(P->File);
    Programs.push_back(std::move(P));
  }
  for (size_t I = 0; I < Report.Errors.size(); ++I) {
    const ClangTidyError &E = Report.Errors[I];
    if (StringRef(E.DiagnosticName).starts_with("clang-diagnostic") || E.Message.FilePath.empty())
      continue;
    auto F = std::make_unique<Checked>();
    F->E = &E;
    F->Typed = I < Report.Typed.size() && Report.Typed[I] ? &*Report.Typed[I] : nullptr;
    F->Index = I;
    F->File = absolutePath(E.Message.FilePath, E.BuildDirectory);
    Lines L(text(F->File));
    F->Line = L.lineOf(E.Message.FileOffset);
    F->Col = L.columnOf(E.Message.FileOffset);
    F->Check = E.DiagnosticName;
    F->Rule = &ruleFor(F->Check, F->Typed);
    const StringMap<Replacements> *Fix = clang::tooling::selectFirstFix(E);
    F->HasFix = Fix && !Fix->empty();
    for (auto &P : Programs) {
      if (F->File != P->File && TUs.count(F->File))
        continue;
      P->Findings.push_back(F.get());
      if (F->HasFix)
        assignFix(*F, *P);
    }
    Findings.push_back(std::move(F));
  }
}

// F's fix-it with absolute paths; F.FixConflict when it overlaps itself.
std::map<std::string, Replacements> Verifier::absoluteFix(const Checked &F) {
  std::map<std::string, Replacements> Mine;
  for (const auto &[Path, Reps] : *clang::tooling::selectFirstFix(*F.E))
    for (const Replacement &R : Reps) {
      std::string Abs = absolutePath(R.getFilePath(), F.E->BuildDirectory);
      consumeError(
          Mine[Abs].add(Replacement(Abs, R.getOffset(), R.getLength(), R.getReplacementText())));
    }
  return Mine;
}

// Into the program's set of fixes (all of them together): all of a finding's
// replacements go in, or none.
void Verifier::assignFix(Checked &F, Program &P) {
  std::map<std::string, Replacements> Tentative = P.Reps;
  bool OK = true;
  for (const auto &[Abs, Reps] : absoluteFix(F))
    for (const Replacement &R : Reps)
      if (auto Err = Tentative[Abs].add(R)) {
        F.FixConflict = toString(std::move(Err));
        OK = false;
      }
  if (OK) {
    P.Reps = std::move(Tentative);
    F.FixApplied = true;
  }
}

bool sameFix(const std::map<std::string, Replacements> &A,
             const std::map<std::string, Replacements> &B) {
  return std::equal(A.begin(), A.end(), B.begin(), B.end(), [](const auto &X, const auto &Y) {
    return X.first == Y.first &&
           std::equal(X.second.begin(), X.second.end(), Y.second.begin(), Y.second.end());
  });
}

// One fixed program per applied fix-it (findings that offer the same edit share one), judging its
// finding and the findings without a fix-it of their own it also covers: the last applied fix-it of
// the same check before them in the file (one clone where an alias is made covers several writes).
// With more than one, a program with all of them too.
void Verifier::group(Program &P) {
  for (Checked *F : P.Findings) {
    if (!F->FixApplied)
      continue;
    F->By = F;
    std::map<std::string, Replacements> Mine = absoluteFix(*F);
    for (auto &V : P.Own)
      if (sameFix(V->Reps, Mine)) // several findings offering one edit: one program
        F->Run = V.get();
    if (!F->Run) {
      P.Own.push_back(std::make_unique<Variant>());
      F->Run = P.Own.back().get();
      F->Run->Reps = std::move(Mine);
    }
    F->Run->Judged.push_back(F);
  }
  for (Checked *F : P.Findings) {
    if (F->HasFix)
      continue;
    for (Checked *G : P.Findings)
      if (G->FixApplied && G->File == F->File && G->Check == F->Check && G->Line <= F->Line)
        F->By = G;
    if (F->By) {
      F->Run = F->By->Run;
      F->Run->Judged.push_back(F);
    }
  }
  if (P.Own.size() > 1) {
    P.All = std::make_unique<Variant>();
    P.All->Reps = P.Reps;
  }
}

void Verifier::applyFixes(Program &P) {
  for (auto &[Path, Reps] : P.Reps)
    P.Original[Path] = text(Path);
  for (Variant *V : P.variants())
    applyFixes(P, *V);
  for (Checked *F : P.Findings) {
    F->FixedLine = F->Run ? F->Run->mappedLine(F->File, F->Line) : F->Line;
    if (F->FixApplied && F->Run->Texts.count(F->File))
      markFixedLines(*F->Run, *F);
  }
}

void Verifier::applyFixes(Program &P, Variant &V) {
  for (auto &[Path, Reps] : V.Reps) {
    auto Fixed = clang::tooling::applyAllReplacements(text(Path), Reps);
    if (!Fixed) {
      P.Status = "cannot apply the fixes to " + Path + ": " + toString(Fixed.takeError());
      continue;
    }
    V.Texts[Path] = *Fixed;
    V.LineMaps[Path] = mapLines(text(Path), *Fixed, Reps);
  }
}

// The lines of V's fixed file F's fix wrote code on (a deletion writes none).
void Verifier::markFixedLines(Variant &V, Checked &F) {
  Lines LF(V.Texts[F.File]);
  const Replacements &All = V.Reps[F.File];
  std::map<std::string, Replacements> Mine = absoluteFix(F);
  for (const Replacement &Rep : Mine[F.File]) {
    StringRef Text = Rep.getReplacementText();
    if (Text.trim().empty())
      continue;
    // An insertion's own offset is shifted past its text: step back over it.
    unsigned B = All.getShiftedCodePosition(Rep.getOffset()) - (Rep.getLength() ? 0 : Text.size()) +
                 (Text.size() - Text.ltrim().size());
    unsigned E = B + Text.trim().size();
    for (unsigned L = LF.lineOf(B); L <= LF.lineOf(E - 1); ++L)
      F.FixedLines.insert(L);
  }
}

// Build and run the original and every fixed program, all in parallel.
// Programs without findings are skipped: nothing to prove.
void Verifier::buildAndRun() {
  std::map<std::string, unsigned> Stems;
  for (auto &PP : Programs) {
    std::string Stem = sys::path::stem(PP->File).str();
    unsigned N = Stems[Stem]++;
    PP->Name = N ? Stem + "-" + std::to_string(N) : Stem;
    for (size_t I = 0; I < PP->Own.size(); ++I)
      PP->Own[I]->Tag = PP->Name + (PP->All ? ".fix" + std::to_string(I + 1) : ".fixed");
    if (PP->All)
      PP->All->Tag = PP->Name + ".fixed";
  }
  DefaultThreadPool Pool(hardware_concurrency(Jobs));
  for (auto &PP : Programs) {
    Program &P = *PP;
    if (P.Findings.empty() || !P.Status.empty())
      continue;
    Pool.async([this, &P] {
      std::string Exe;
      if ((P.OrigBuilt = build(P, nullptr, P.OrigBuild, Exe)))
        runProgram(P, nullptr, Exe);
    });
    for (Variant *V : P.variants())
      Pool.async([this, &P, V] {
        std::string Exe;
        if ((V->Built = build(P, V, V->BuildLog, Exe)))
          runProgram(P, V, Exe);
      });
  }
  Pool.wait();
  for (auto &PP : Programs)
    explainUnverifiable(*PP);
}

// The original (V null) or a fixed program, its fixed files seen through a VFS overlay.
bool Verifier::build(Program &P, const Variant *V, std::string &Log, std::string &Exe) {
  std::string Tag = V ? V->Tag : P.Name + ".orig";
  Exe = Scratch + "/" + Tag;
  std::vector<std::string> Args = {Compiler};
  Args.insert(Args.end(), P.Flags.begin(), P.Flags.end());
  if (V) {
    json::Array Roots;
    for (auto &[Path, Text] : V->Texts) {
      std::string Copy = Scratch + "/" + Tag + "." + sys::path::filename(Path).str();
      if (!writeFile(Copy, Text)) {
        Log = "cannot write the scratch copy " + Copy;
        return false;
      }
      Roots.push_back(json::Object{{"name", Path}, {"type", "file"}, {"external-contents", Copy}});
    }
    json::Object Overlay{{"version", 0},
                         {"case-sensitive", "true"},
                         {"use-external-names", false},
                         {"roots", std::move(Roots)}};
    std::string OverlayPath = Scratch + "/" + Tag + ".overlay.yaml";
    writeFile(OverlayPath, formatv("{0:2}", json::Value(std::move(Overlay))).str());
    Args.insert(Args.end(), {"-ivfsoverlay", OverlayPath});
  }
  if (!RT.Include.empty())
    Args.push_back("-I" + RT.Include);
  Args.insert(Args.end(), {P.File, "-o", Exe});
  if (!RT.LibDir.empty())
    Args.insert(Args.end(), {"-L" + RT.LibDir, "-Wl,-rpath," + RT.LibDir});
  Args.push_back("-ltt_runtime");
#ifdef TT_VERIFY_SANITIZE
  // This tensor-tidy and its runtime are built with ASan+UBSan (TT_SANITIZE).
  Args.push_back("-fsanitize=address,undefined");
#endif
  RunResult R = execute(Args, P.Dir, std::nullopt, "", Scratch, Tag + ".build", 300, 0);
  Log = R.Stderr + R.Stdout;
  return R.Started && R.RC == 0;
}

void Verifier::runProgram(Program &P, Variant *V, const std::string &Exe) {
  std::string Tag = V ? V->Tag : P.Name + ".orig";
  std::string TracePath = Scratch + "/" + Tag + ".trace.jsonl";
  sys::fs::remove(TracePath);
  std::vector<std::string> EnvStore;
  for (char **E = environ; *E; ++E)
    if (!StringRef(*E).starts_with("TT_TRACE="))
      EnvStore.push_back(*E);
  EnvStore.push_back("TT_TRACE=" + TracePath);
  std::vector<StringRef> Env(EnvStore.begin(), EnvStore.end());
  std::vector<std::string> Args = {Exe};
  Args.insert(Args.end(), ProgramArgs.begin(), ProgramArgs.end());
#ifdef TT_VERIFY_SANITIZE
  // ASan reserves terabytes of address space for its shadow memory: a limit
  // on it (--verify-memory) stops a sanitized program before main.
  unsigned Limit = 0;
#else
  unsigned Limit = MemoryMB;
#endif
  RunResult R =
      execute(Args, "", ArrayRef<StringRef>(Env), StdinPath, Scratch, Tag, Timeout, Limit);
  Trace T = Trace::load(TracePath, P.Dir);
  (V ? V->Run : P.OrigRun) = std::move(R);
  (V ? V->T : P.OrigTrace) = std::move(T);
}

void Verifier::explainUnverifiable(Program &P) {
  if (P.Findings.empty() || !P.Status.empty())
    return;
  if (!P.OrigBuilt)
    P.Status = StringRef(P.OrigBuild).contains("undefined reference to `main'")
                   ? "not a program: it defines no main() (--verify runs TUs that define main)"
                   : "the original does not build: " + firstError(P.OrigBuild);
  else if (P.OrigRun.TimedOut)
    P.Status = formatv("the original program timed out after {0} s", Timeout.getValue()).str();
  else if (!P.OrigRun.Started)
    P.Status = "the original program could not be started: " + P.OrigRun.Stderr;
  else if (!P.OrigTrace.Loaded)
    P.Status = "the original program wrote no trace (is the runtime built with TT_TRACE=ON?)";
}

// ------------------------------------------------------------ the verdicts --

void Verifier::judge(Program &P) {
  for (Checked *F : P.Findings) {
    if (!P.Status.empty()) {
      F->Hazard = P.OrigRun.TimedOut ? HazardVerdict::TimedOut : HazardVerdict::NotVerified;
      F->Fix = FixVerdict::NotVerified;
      F->HazardEv.push_back(P.Status);
      continue;
    }
    judgeHazard(P, *F);
  }
  if (!P.Status.empty())
    return;
  taint(P);
  for (Checked *F : P.Findings) {
    if (F->Hazard != HazardVerdict::Confirmed && P.OrigRun.failed())
      F->HazardEv.push_back("the original program failed " + P.OrigRun.failure());
    judgeFix(P, *F);
  }
  judgeCombined(P);
}

// Values computed from a confirmed hazard's write may differ in a fixed run
// that removes it: per fixed program, those of the findings it judges (all,
// for the program with every fix).
void Verifier::taint(Program &P) {
  for (Checked *F : P.Findings) {
    auto S = F->Figures.getInteger("written_storage");
    if (F->Hazard != HazardVerdict::Confirmed || !F->Rule->Writes || !S || !F->Run)
      continue;
    auto D = P.OrigTrace.downstreamOf(*S, F->File, F->Line);
    F->Run->Tainted.insert(D.begin(), D.end());
    if (P.All)
      P.All->Tainted.insert(D.begin(), D.end());
  }
}

// The run could not use a CUDA device (no driver, no GPU, a runtime built
// without CUDA): the reason, from its failure; "" otherwise.
static std::string noCudaReason(const RunResult &Run) {
  if (!Run.failed())
    return "";
  std::string Why = uncaughtWhat(Run.Stderr);
  for (StringRef Sign :
       {"NVIDIA driver", "not compiled with CUDA", "CUDA driver", "no CUDA-capable device"})
    if (StringRef(Why).contains_insensitive(Sign))
      return Why;
  return "";
}

// What the original run says about the hazard at F's line.
void Verifier::judgeHazard(Program &P, Checked &F) {
  HazardInput In{P.OrigTrace, F.where(), P.OrigTrace.at(F.File, F.Line),
                 P.OrigTrace.errorAt(F.File, F.Line), F.Typed};
  if (F.Rule->NeedsCuda && !P.OrigTrace.UsedCuda) {
    std::string Why = noCudaReason(P.OrigRun);
    F.Hazard = HazardVerdict::NotExercised;
    F.HazardEv.push_back(
        "(no CUDA device): " +
        (Why.empty() ? "the program ran on the CPU only, where " + In.Where + " waits for no device"
                     : Why));
    return;
  }
  if (In.At.empty() && !In.Err && !F.Rule->QuietLine) {
    F.Hazard = HazardVerdict::NotExercised;
    F.HazardEv.push_back("line " + In.Where + " never ran in the original program" +
                         (P.OrigRun.failed() ? " (it stopped early)" : ""));
    return;
  }
  HazardJudgement J = F.Rule->JudgeHazard(In, F.Figures);
  F.Hazard = J.Verdict;
  F.HazardEv = std::move(J.Evidence);
}

// What F's own fixed run says (the program with only the fix-it F is judged
// by): the hazard's events are gone, and everything else is unchanged or
// explained by the writes of the hazards that fix-it removes.
void Verifier::judgeFix(Program &P, Checked &F) {
  if (F.HasFix && !F.FixApplied) {
    F.Fix = FixVerdict::NotVerified;
    F.FixEv.push_back("the fix was not applied: " + F.FixConflict);
    return;
  }
  // A finding without a fix-it of its own is judged only when another's ran and removed it.
  bool Shared = F.By && F.By != &F;
  if (!F.By || (Shared && (F.Hazard != HazardVerdict::Confirmed || !F.Run->Built))) {
    F.Fix = FixVerdict::None;
    return;
  }
  const Variant &V = *F.Run;
  if (!judgeFixedRun(F, V))
    return;
  std::set<unsigned> FixLines = F.By->FixedLines;
  FixLines.insert(F.FixedLine);
  FixInput In{P.OrigTrace,
              V.T,
              F.File,
              F.FixedLine,
              sys::path::filename(F.File).str() + ":" + std::to_string(F.FixedLine),
              {}};
  for (unsigned L : FixLines)
    for (const Event *E : V.T.at(F.File, L))
      In.AtFix.push_back(E);
  FixJudgement J = F.Rule->JudgeFix(In, F.Figures);
  if (!J.Remains.empty()) {
    // A fix that leaves the hazard in place fails; a finding without its own fix-it just stays.
    F.Fix = Shared ? FixVerdict::None : FixVerdict::NotVerified;
    if (!Shared)
      F.FixEv.push_back(J.Remains);
    return;
  }
  if (Shared)
    J.Gone += formatv(" (by the fix-it of the finding at {0}:{1})", sys::path::filename(F.By->File),
                      F.By->Line)
                  .str();
  judgeSideEffects(P, F, V, std::move(J.Gone));
}

// The fixed program built, ran to the end and wrote a trace; else F's verdict.
bool Verifier::judgeFixedRun(Checked &F, const Variant &V) {
  const RunResult &X = V.Run;
  if (!V.Built) {
    F.Fix = FixVerdict::DoesNotCompile;
    F.FixEv.push_back("fixed program: " + firstError(V.BuildLog));
  } else if (X.TimedOut) {
    F.Fix = FixVerdict::TimedOut;
    F.FixEv.push_back(formatv("the fixed program ran past {0} s", Timeout.getValue()).str());
  } else if (F.Hazard == HazardVerdict::NotExercised && F.Rule->NeedsCuda &&
             !noCudaReason(X).empty()) {
    F.Fix = FixVerdict::NotExercised; // needs the same device the original lacked
    F.FixEv.push_back("(no CUDA device)");
  } else if (X.failed()) {
    F.Fix = FixVerdict::Crashed;
    F.FixEv.push_back("the fixed program failed " + X.failure());
  } else if (F.Hazard == HazardVerdict::NotExercised) {
    F.Fix = FixVerdict::NotExercised;
  } else if (!V.T.Loaded) { // no events would look like no hazard
    F.Fix = FixVerdict::NotVerified;
    F.FixEv.push_back("the fixed program wrote no trace");
  } else {
    return true;
  }
  return false;
}

/// "the finding at a.cpp:9", "the findings at a.cpp:9, a.cpp:12".
std::string findingsAt(ArrayRef<Checked *> Fs) {
  std::vector<std::string> W;
  for (const Checked *F : Fs)
    W.push_back(F->where());
  return std::string(Fs.size() == 1 ? "the finding at " : "the findings at ") + join(W, ", ");
}

/// The evidence lines of a comparison with the original run; false when a
/// difference is not explained by the hazards' writes.
bool describe(const Comparison &C, bool OrigFailed, std::vector<std::string> &Ev) {
  bool Output = !OrigFailed && !C.OutputUnexplained.empty();
  if (!C.Unexplained.empty() || Output) {
    for (size_t I = 0; I < C.Unexplained.size() && I < 3; ++I)
      Ev.push_back("differs, not computed from the hazard's write: " + C.Unexplained[I]);
    if (Output)
      Ev.push_back("program output differs: " + C.OutputUnexplained.front() +
                   " (no value read to print it was computed from the hazard's write)");
    return false;
  }
  size_t Lines = C.OutputExplained.size();
  if (OrigFailed)
    Ev.push_back("the original failed, the fixed program exits 0");
  else if (Lines)
    Ev.push_back("program output differs only where computed from the hazard's write: " +
                 C.OutputExplained.front() +
                 (Lines > 1
                      ? formatv(" (and {0} more line{1})", Lines - 1, Lines > 2 ? "s" : "").str()
                      : std::string()));
  else
    Ev.push_back("program output unchanged");
  if (C.Compared)
    Ev.push_back(formatv("{0} of {1} values at shared trace points unchanged",
                         C.Compared - C.Explained.size(), C.Compared)
                     .str());
  if (!C.Explained.empty())
    Ev.push_back(formatv("{0} differ{1} downstream of the write, e.g. {2}", C.Explained.size(),
                         C.Explained.size() == 1 ? "s" : "", C.Explained.front())
                     .str());
  return true;
}

Comparison compareWith(const Program &P, const Variant &V) {
  auto Map = [&V](StringRef File, unsigned L) { return V.mappedLine(File, L); };
  return compareRuns(P.OrigTrace, V.T, P.OrigRun.Stdout, V.Run.Stdout, V.Tainted, Map);
}

// Everything the fix should not change: values at the trace points both runs
// share and the program's output, unless computed from the writes of the
// hazards this fixed program removes (V.Tainted).
void Verifier::judgeSideEffects(Program &P, Checked &F, const Variant &V, std::string Gone) {
  Comparison C = compareWith(P, V);
  F.Figures["values_compared"] = static_cast<int64_t>(C.Compared);
  F.Figures["values_differing_explained"] = static_cast<int64_t>(C.Explained.size());
  F.Figures["output_lines_explained"] = static_cast<int64_t>(C.OutputExplained.size());
  F.FixEv.push_back(Gone);
  F.Fix = describe(C, P.OrigRun.failed(), F.FixEv) ? FixVerdict::Verified
                                                   : FixVerdict::ChangedBehaviour;
  if (V.Judged.size() > 1)
    F.FixEv.push_back("one fix-it for " + findingsAt(V.Judged) + ": judged together");
  if (P.All)
    F.FixEv.push_back(
        formatv("judged on the program with this fix-it alone ({0} fix-its in the program)",
                P.Own.size())
            .str());
}

// All applied fix-its together must not change more than their hazards explain.
void Verifier::judgeCombined(Program &P) {
  if (!P.All)
    return;
  const Variant &V = *P.All;
  std::vector<std::string> &Ev = P.CombinedEv;
  P.CombinedFailed = true;
  if (!V.Built)
    Ev.push_back("does not compile: " + firstError(V.BuildLog));
  else if (V.Run.TimedOut)
    Ev.push_back("timed out");
  else if (V.Run.failed())
    Ev.push_back("crashed: the program failed " + V.Run.failure());
  else {
    Comparison C = compareWith(P, V);
    P.CombinedFailed = !describe(C, P.OrigRun.failed(), Ev);
    Ev.insert(Ev.begin(), P.CombinedFailed ? "changed behaviour" : "verified");
    return;
  }
  Ev.insert(Ev.begin(), "failed");
}

// ------------------------------------------------------------- the report --

// The verdicts into the driver's report: per finding (json/sarif), the
// summary, the text (after the diagnostics), and whether verification failed.
void Verifier::report(RunReport &Report) {
  unsigned Conf = 0, Ver = 0, NotEx = 0, Failed = 0, Total = Findings.size();
  Report.Verdicts.assign(Report.Errors.size(), nullptr);
  for (auto &F : Findings) {
    Conf += F->Hazard == HazardVerdict::Confirmed;
    Ver += F->Fix == FixVerdict::Verified;
    NotEx += F->Hazard == HazardVerdict::NotExercised;
    Failed += fixFailed(F->Fix);
    Report.VerificationFailed |= failsVerification(F->Hazard, F->Fix);
    Report.Verdicts[F->Index] = toJSON(*F);
  }
  json::Array Combined;
  for (auto &P : Programs)
    if (!P->CombinedEv.empty()) {
      Report.VerificationFailed |= P->CombinedFailed;
      Combined.push_back(
          json::Object{{"program", relativeToCwd(P->File)},
                       {"fixes", static_cast<int64_t>(P->Own.size())},
                       {"verdict", P->CombinedEv.front()},
                       {"evidence", json::Array(ArrayRef(P->CombinedEv).drop_front())}});
    }
  std::string Summary =
      formatv("{0} finding{1}: {2} hazard{3} confirmed, {4} fix{5} verified, {6} not exercised, "
              "{7} failed verification",
              Total, Total == 1 ? "" : "s", Conf, Conf == 1 ? "" : "s", Ver, Ver == 1 ? "" : "es",
              NotEx, Failed)
          .str();
  Report.VerifySummary = json::Object{{"summary", Summary}, {"combined", std::move(Combined)}};
  if (Format != OutputFormat::Text)
    return;
  raw_string_ostream OS(Report.VerifyText);
  OS << "\n";
  textReport(OS);
  OS << "verify: " << Summary << "\n";
}

// Per program its findings, each verdict with its first piece of evidence,
// then one line per further piece; then the run with all fix-its together.
void Verifier::textReport(raw_ostream &OS) {
  auto Verdict = [&](StringRef What, StringRef V, ArrayRef<std::string> Ev) {
    // Evidence that opens with "(" qualifies the verdict: "not exercised (no CUDA device)".
    StringRef Sep = Ev.empty() ? "" : StringRef(Ev.front()).starts_with("(") ? " " : ": ";
    OS << "  " << What << " " << V << Sep << (Ev.empty() ? "" : Ev.front()) << "\n";
    for (size_t I = 1; I < Ev.size(); ++I)
      OS << "      " << Ev[I] << "\n";
  };
  for (auto &PP : Programs) {
    if (PP->Findings.empty())
      continue;
    OS << "verify " << relativeToCwd(PP->File) << "\n";
    for (Checked *F : PP->Findings) {
      OS << relativeToCwd(F->File) << ":" << F->Line << ":" << F->Col << ": [" << F->Check << "]\n";
      Verdict("hazard", name(F->Hazard), F->HazardEv);
      Verdict("fix", F->Fix == FixVerdict::None ? "none offered" : name(F->Fix), F->FixEv);
    }
    if (!PP->CombinedEv.empty())
      Verdict(formatv("all {0} fix-its together:", PP->Own.size()).str(), PP->CombinedEv.front(),
              ArrayRef(PP->CombinedEv).drop_front());
  }
}

/// The scratch directory: --verify-keep's, or a fresh one removed at exit.
std::optional<std::string> makeScratch(std::string &Dir) {
  SmallString<128> Tmp;
  if (!KeepDir.empty()) {
    sys::fs::create_directories(KeepDir);
    Tmp = absolutePath(KeepDir);
  } else if (auto EC = sys::fs::createUniqueDirectory("tensor-tidy-verify", Tmp)) {
    return "cannot create a scratch directory: " + EC.message();
  }
  Dir = std::string(Tmp);
  return std::nullopt;
}

/// --verify-stdin: a file, or tensor-tidy's own stdin copied to the scratch directory.
std::optional<std::string> prepareStdin(Verifier &V) {
  if (StdinFile == "-") {
    V.StdinPath = V.Scratch + "/stdin";
    auto In = MemoryBuffer::getSTDIN();
    writeFile(V.StdinPath, In ? (*In)->getBuffer() : "");
  } else if (!StdinFile.empty()) {
    V.StdinPath = absolutePath(StdinFile);
    if (!sys::fs::exists(V.StdinPath))
      return "--verify-stdin: no such file '" + StdinFile + "'";
  }
  return std::nullopt;
}

} // namespace

int runVerify(DriverOptions &Opts, const char *Argv0) {
  Verifier V;
  V.RT = findRuntime(Argv0);
  V.Compiler = findCompiler();
  auto Fail = [](const Twine &Msg) {
    reportError(Msg);
    return exitCodeFor({/*UsageError=*/true});
  };
  if (V.RT.LibDir.empty() || V.RT.Include.empty())
    return Fail(Twine("--verify cannot find the runtime (libtt_runtime.so and tt/tt.h) next to ") +
                Argv0);
  if (auto Error = makeScratch(V.Scratch))
    return Fail(*Error);
  auto Cleanup = make_scope_exit([&] {
    if (KeepDir.empty())
      sys::fs::remove_directories(V.Scratch);
  });
  if (auto Error = prepareStdin(V))
    return Fail(*Error);
  V.Format = Opts.Format;
  V.Jobs = Opts.Jobs;
  Opts.AfterAnalysis = [&V](RunReport &Report, const clang::tooling::CompilationDatabase &DB,
                            ArrayRef<std::string> Files) { V.run(Report, DB, Files); };
  return runDriver(Opts).Exit;
}

} // namespace tensor_tidy::verify
