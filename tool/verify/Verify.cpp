// tensor-tidy --verify. The flow per program (a TU with main):
//   collect findings ─► apply fix-its to scratch copies (VFS overlay) ─► build and run the
//   original and the fixed program with TT_TRACE ─► judge each finding from the traces
//   (Rules.cpp, one row per check) ─► annotate the driver's report.
#include "Verify.h"

#include "../Paths.h"
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
  std::set<unsigned> FixedLines; // lines of the fixed file the fix touched
  unsigned FixedLine = 0;        // the finding's line in the fixed file
  HazardVerdict Hazard = HazardVerdict::NotVerified;
  FixVerdict Fix = FixVerdict::NotVerified;
  std::vector<std::string> HazardEv, FixEv;
  json::Object Figures;
  std::string where() const { return sys::path::filename(File).str() + ":" + std::to_string(Line); }
};

struct Program {
  std::string File, Dir; // the TU and its compile directory
  std::string Name;      // for scratch files: the TU's stem, made unique
  std::vector<std::string> Flags;
  std::vector<Checked *> Findings;
  std::map<std::string, std::string> Original, Fixed; // path -> text, for files with fixes
  std::map<std::string, Replacements> Reps;
  std::map<std::string, std::vector<unsigned>> LineMaps; // original line -> fixed line
  std::set<size_t> Tainted; // original-run events computed from a confirmed hazard's write
  std::string Status;       // "" ok, else why the program could not be verified
  std::string OrigBuild, FixedBuild;
  RunResult OrigRun, FixedRun;
  Trace OrigTrace, FixedTrace;
  bool OrigBuilt = false, FixedBuilt = false;
  unsigned mappedLine(StringRef File, unsigned L) const {
    auto M = LineMaps.find(File.str());
    return M != LineMaps.end() && L < M->second.size() ? M->second[L] : L;
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

// The first line where two outputs differ, for the report.
std::string outputDiff(StringRef A, StringRef B) {
  SmallVector<StringRef> LA, LB;
  A.split(LA, '\n');
  B.split(LB, '\n');
  auto Squeeze = [](StringRef L) {
    SmallVector<StringRef> W;
    L.split(W, ' ', -1, false);
    return join(W, " ");
  };
  for (size_t I = 0; I < std::max(LA.size(), LB.size()); ++I) {
    StringRef X = I < LA.size() ? LA[I] : "", Y = I < LB.size() ? LB[I] : "";
    if (X != Y)
      return "\"" + Squeeze(X) + "\" became \"" + Squeeze(Y) + "\"";
  }
  return "";
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
  void assignFix(Checked &F, Program &P, const StringMap<Replacements> &Fix);
  void applyFixes(Program &P);
  void markFixedLines(Program &P, Checked &F);
  void buildAndRun();
  bool build(Program &P, bool Fixed, std::string &Log, std::string &Exe);
  void runProgram(Program &P, bool Fixed, const std::string &Exe);
  void explainUnverifiable(Program &P);
  void judge(Program &P);
  void judgeHazard(Program &P, Checked &F);
  void judgeFix(Program &P, Checked &F);
  const Checked *fixedBy(Program &P, Checked &F);
  bool judgeFixedRun(Program &P, Checked &F, const Checked &By);
  void judgeSideEffects(Program &P, Checked &F, std::string Gone);
  void report(RunReport &Report);
};

void Verifier::run(RunReport &Report, const clang::tooling::CompilationDatabase &DB,
                   ArrayRef<std::string> Files) {
  collect(Report, DB, Files);
  for (auto &P : Programs)
    applyFixes(*P);
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
        assignFix(*F, *P, *Fix);
    }
    Findings.push_back(std::move(F));
  }
}

// All of a finding's replacements go in, or none.
void Verifier::assignFix(Checked &F, Program &P, const StringMap<Replacements> &Fix) {
  std::map<std::string, Replacements> Tentative = P.Reps;
  bool OK = true;
  for (const auto &[Path, Reps] : Fix)
    for (const Replacement &R : Reps) {
      std::string Abs = absolutePath(R.getFilePath(), F.E->BuildDirectory);
      Replacement RA(Abs, R.getOffset(), R.getLength(), R.getReplacementText());
      if (auto Err = Tentative[Abs].add(RA)) {
        F.FixConflict = toString(std::move(Err));
        OK = false;
      }
    }
  if (OK) {
    P.Reps = std::move(Tentative);
    F.FixApplied = true;
  }
}

void Verifier::applyFixes(Program &P) {
  for (auto &[Path, Reps] : P.Reps) {
    P.Original[Path] = text(Path);
    auto Fixed = clang::tooling::applyAllReplacements(text(Path), Reps);
    if (!Fixed) {
      P.Status = "cannot apply the fixes to " + Path + ": " + toString(Fixed.takeError());
      continue;
    }
    P.Fixed[Path] = *Fixed;
    P.LineMaps[Path] = mapLines(P.Original[Path], *Fixed, Reps);
  }
  for (Checked *F : P.Findings) {
    F->FixedLine = F->Line;
    if (!P.Reps.count(F->File) || !P.Fixed.count(F->File))
      continue;
    F->FixedLine = P.mappedLine(F->File, F->Line);
    if (F->FixApplied)
      markFixedLines(P, *F);
  }
}

// The lines of the fixed file F's fix wrote code on (a deletion writes none).
void Verifier::markFixedLines(Program &P, Checked &F) {
  Lines LF(P.Fixed[F.File]);
  const Replacements &All = P.Reps[F.File];
  for (const auto &[Path, Reps] : *clang::tooling::selectFirstFix(*F.E))
    for (const Replacement &Rep : Reps) {
      if (absolutePath(Rep.getFilePath(), F.E->BuildDirectory) != F.File)
        continue;
      StringRef Text = Rep.getReplacementText();
      if (Text.trim().empty())
        continue;
      // An insertion's own offset is shifted past its text: step back over it.
      unsigned B = All.getShiftedCodePosition(Rep.getOffset()) -
                   (Rep.getLength() ? 0 : Text.size()) + (Text.size() - Text.ltrim().size());
      unsigned E = B + Text.trim().size();
      for (unsigned L = LF.lineOf(B); L <= LF.lineOf(E - 1); ++L)
        F.FixedLines.insert(L);
    }
}

// Build and run, the original and the fixed program of each in parallel.
// Programs without findings are skipped: nothing to prove.
void Verifier::buildAndRun() {
  std::map<std::string, unsigned> Stems;
  for (auto &PP : Programs) {
    std::string Stem = sys::path::stem(PP->File).str();
    unsigned N = Stems[Stem]++;
    PP->Name = N ? Stem + "-" + std::to_string(N) : Stem;
  }
  DefaultThreadPool Pool(hardware_concurrency(Jobs));
  for (auto &PP : Programs) {
    Program &P = *PP;
    if (P.Findings.empty() || !P.Status.empty())
      continue;
    Pool.async([this, &P] {
      std::string Exe;
      if ((P.OrigBuilt = build(P, false, P.OrigBuild, Exe)))
        runProgram(P, false, Exe);
    });
    if (any_of(P.Findings, [](Checked *F) { return F->FixApplied; }))
      Pool.async([this, &P] {
        std::string Exe;
        if ((P.FixedBuilt = build(P, true, P.FixedBuild, Exe)))
          runProgram(P, true, Exe);
      });
  }
  Pool.wait();
  for (auto &PP : Programs)
    explainUnverifiable(*PP);
}

bool Verifier::build(Program &P, bool Fixed, std::string &Log, std::string &Exe) {
  std::string Tag = P.Name + (Fixed ? ".fixed" : ".orig");
  Exe = Scratch + "/" + Tag;
  std::vector<std::string> Args = {Compiler};
  Args.insert(Args.end(), P.Flags.begin(), P.Flags.end());
  if (Fixed) {
    json::Array Roots;
    for (auto &[Path, Text] : P.Fixed) {
      std::string Copy = Scratch + "/" + P.Name + ".fixed." + sys::path::filename(Path).str();
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

void Verifier::runProgram(Program &P, bool Fixed, const std::string &Exe) {
  std::string Tag = P.Name + (Fixed ? ".fixed" : ".orig");
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
  RunResult R = execute(Args, "", ArrayRef<StringRef>(Env), StdinPath, Scratch, Tag, Timeout, Limit);
  Trace T = Trace::load(TracePath, P.Dir);
  (Fixed ? P.FixedRun : P.OrigRun) = std::move(R);
  (Fixed ? P.FixedTrace : P.OrigTrace) = std::move(T);
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
  // Values computed from any confirmed hazard's write may differ in the fixed run.
  for (Checked *F : P.Findings)
    if (F->Hazard == HazardVerdict::Confirmed && F->Rule->Writes)
      if (auto S = F->Figures.getInteger("written_storage")) {
        auto D = P.OrigTrace.downstreamOf(*S, F->File, F->Line);
        P.Tainted.insert(D.begin(), D.end());
      }
  for (Checked *F : P.Findings) {
    if (F->Hazard != HazardVerdict::Confirmed && P.OrigRun.failed())
      F->HazardEv.push_back("the original program failed " + P.OrigRun.failure());
    judgeFix(P, *F);
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
    F.HazardEv.push_back("(no CUDA device): " +
                         (Why.empty() ? "the program ran on the CPU only, where " + In.Where +
                                            " waits for no device"
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

// Whose fix-it F is judged by: its own, or (without one) the last applied
// fix-it of the same check before it in the file (one clone where an alias is
// made covers several writes). Null: no fix to judge.
const Checked *Verifier::fixedBy(Program &P, Checked &F) {
  if (F.HasFix)
    return &F;
  const Checked *By = nullptr;
  for (Checked *G : P.Findings)
    if (G->FixApplied && G->File == F.File && G->Check == F.Check && G->Line <= F.Line)
      By = G;
  return By && F.Hazard == HazardVerdict::Confirmed && P.FixedBuilt ? By : nullptr;
}

// What the fixed run says: the hazard's events are gone, and everything else
// is unchanged or explained by the hazard's writes.
void Verifier::judgeFix(Program &P, Checked &F) {
  const Checked *By = fixedBy(P, F);
  if (!By) {
    F.Fix = FixVerdict::None;
    return;
  }
  if (!By->FixApplied) {
    F.Fix = FixVerdict::NotVerified;
    F.FixEv.push_back("the fix was not applied: " + F.FixConflict);
    return;
  }
  if (!judgeFixedRun(P, F, *By))
    return;
  std::set<unsigned> FixLines = By->FixedLines;
  FixLines.insert(F.FixedLine);
  FixInput In{P.OrigTrace,
              P.FixedTrace,
              F.File,
              F.FixedLine,
              sys::path::filename(F.File).str() + ":" + std::to_string(F.FixedLine),
              {}};
  for (unsigned L : FixLines)
    for (const Event *E : P.FixedTrace.at(F.File, L))
      In.AtFix.push_back(E);
  FixJudgement J = F.Rule->JudgeFix(In, F.Figures);
  if (!J.Remains.empty()) {
    // A fix that leaves the hazard in place fails; a finding without its own fix-it just stays.
    F.Fix = By == &F ? FixVerdict::NotVerified : FixVerdict::None;
    if (By == &F)
      F.FixEv.push_back(J.Remains);
    return;
  }
  if (By != &F)
    J.Gone += formatv(" (by the fix-it of the finding at {0}:{1})", sys::path::filename(By->File),
                      By->Line)
                  .str();
  judgeSideEffects(P, F, std::move(J.Gone));
}

// The fixed program built, ran to the end and wrote a trace; else F's verdict.
bool Verifier::judgeFixedRun(Program &P, Checked &F, const Checked &By) {
  const RunResult &X = P.FixedRun;
  if (!P.FixedBuilt) {
    F.Fix = FixVerdict::DoesNotCompile;
    F.FixEv.push_back("fixed program: " + firstError(P.FixedBuild));
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
  } else if (!P.FixedTrace.Loaded) { // no events would look like no hazard
    F.Fix = FixVerdict::NotVerified;
    F.FixEv.push_back("the fixed program wrote no trace");
  } else {
    return true;
  }
  return false;
}

// Everything the fix should not change: values at the trace points both runs
// share, unless they were computed from a hazard's write (P.Tainted), and the
// program's output.
void Verifier::judgeSideEffects(Program &P, Checked &F, std::string Gone) {
  const RunResult &O = P.OrigRun, &X = P.FixedRun;
  std::vector<std::string> Unexplained, Explained;
  unsigned Compared = 0;
  auto Map = [&P](StringRef File, unsigned L) { return P.mappedLine(File, L); };
  for (const auto &[A, B] : P.OrigTrace.pairWith(P.FixedTrace, Map)) {
    ++Compared;
    if (std::abs(*A->Sum - *B->Sum) <= 1e-5 * std::max(1.0, std::abs(*A->Sum)))
      continue;
    std::string D = formatv("{0} at {1}:{2} (sum {3} -> {4})", A->Op, sys::path::filename(A->File),
                            A->Line, formatNumber(*A->Sum), formatNumber(*B->Sum))
                        .str();
    (P.Tainted.count(A->Index) ? Explained : Unexplained).push_back(D);
  }
  F.Figures["values_compared"] = static_cast<int64_t>(Compared);
  F.Figures["values_differing_explained"] = static_cast<int64_t>(Explained.size());
  std::string Diff = outputDiff(O.Stdout, X.Stdout);
  bool OutputDiffers = O.Stdout != X.Stdout;
  F.FixEv.push_back(Gone);
  if (!Unexplained.empty() || (OutputDiffers && Explained.empty() && !O.failed())) {
    F.Fix = FixVerdict::ChangedBehaviour;
    for (size_t I = 0; I < Unexplained.size() && I < 3; ++I)
      F.FixEv.push_back("differs, not computed from the hazard's write: " + Unexplained[I]);
    if (OutputDiffers)
      F.FixEv.push_back("program output differs: " + Diff);
    return;
  }
  F.Fix = FixVerdict::Verified;
  if (O.failed())
    F.FixEv.push_back("the original failed, the fixed program exits 0");
  else if (OutputDiffers)
    F.FixEv.push_back("program output differs only where computed from the hazard's write: " +
                      Diff);
  else
    F.FixEv.push_back("program output unchanged");
  if (Compared)
    F.FixEv.push_back(formatv("{0} of {1} values at shared trace points unchanged",
                              Compared - Explained.size(), Compared)
                          .str());
  if (!Explained.empty())
    F.FixEv.push_back(formatv("{0} differ{1} downstream of the write, e.g. {2}", Explained.size(),
                              Explained.size() == 1 ? "s" : "", Explained.front())
                          .str());
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
  std::string Summary =
      formatv("{0} finding{1}: {2} hazard{3} confirmed, {4} fix{5} verified, {6} not exercised, "
              "{7} failed verification",
              Total, Total == 1 ? "" : "s", Conf, Conf == 1 ? "" : "s", Ver, Ver == 1 ? "" : "es",
              NotEx, Failed)
          .str();
  Report.VerifySummary = json::Object{{"summary", Summary}};
  if (Format != OutputFormat::Text)
    return;
  raw_string_ostream OS(Report.VerifyText);
  OS << "\n";
  // The verdict with its first piece of evidence, then one line per further piece.
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
  }
  OS << "verify: " << Summary << "\n";
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
