// tensor-tidy --verify. The flow per program (a TU with main):
//   findings + fix-its ─► scratch copies + VFS overlay ─► compile/link original and fixed
//   ─► run both with TT_TRACE ─► events by source line ─► one verdict per finding.
#include "Verify.h"
#include "Trace.h"

#include "clang/Tooling/Core/Diagnostic.h"
#include "clang/Tooling/Core/Replacement.h"
#include "llvm/ADT/STLExtras.h"
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
#include "llvm/ADT/ScopeExit.h"

#include <chrono>
#include <csignal>
#include <map>
#include <thread>
#include <set>

extern char **environ;

using namespace llvm;
namespace cl = llvm::cl;
using clang::tidy::ClangTidyError;
using clang::tooling::Diagnostic;
using clang::tooling::Replacement;
using clang::tooling::Replacements;

namespace tensor_tidy::verify {

static cl::opt<bool> Verify("verify",
                            cl::desc("Prove each finding and its fix: compile and run the original and "
                                     "the fixed program against the runtime with TT_TRACE on "
                                     "(docs/verify.md)"));
static cl::opt<unsigned> Timeout("verify-timeout", cl::desc("Seconds each program run may take (default 20)"),
                                 cl::init(20));
static cl::opt<unsigned> MemoryMB("verify-memory", cl::desc("Memory limit of each program run in MiB (default 4096)"),
                                  cl::init(4096));
static cl::list<std::string> ProgramArgs("verify-arg", cl::desc("An argument passed to both programs (repeatable)"),
                                         cl::value_desc("arg"));
static cl::opt<std::string> StdinFile("verify-stdin",
                                      cl::desc("File fed to both programs' stdin ('-': tensor-tidy's own stdin; "
                                               "default: empty)"),
                                      cl::value_desc("file"), cl::init(""));
static cl::opt<std::string> Cxx("verify-cxx", cl::desc("C++ compiler used to build the programs (default clang++-19)"),
                                cl::init(""));
static cl::opt<std::string> KeepDir("verify-keep",
                                    cl::desc("Keep the scratch copies, binaries and traces in this directory"),
                                    cl::value_desc("dir"), cl::init(""));

void registerOptions(cl::OptionCategory &Category) {
  cl::Option *Opts[] = {&Verify, &Timeout, &MemoryMB, std::addressof(ProgramArgs), &StdinFile, &Cxx, &KeepDir};
  for (cl::Option *O : Opts)
    O->addCategory(Category);
}

bool enabled() { return Verify; }

namespace {

// ---------------------------------------------------------------- helpers --

std::string absolute(StringRef Path, StringRef Dir) {
  SmallString<256> P(Path);
  if (!sys::path::is_absolute(P)) {
    SmallString<256> D(Dir);
    if (D.empty())
      sys::fs::current_path(D);
    sys::path::append(D, P);
    P = D;
  }
  sys::path::remove_dots(P, /*remove_dot_dot=*/true);
  return std::string(P);
}

std::string readFile(StringRef Path) {
  auto Buf = MemoryBuffer::getFile(Path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  return Buf ? (*Buf)->getBuffer().str() : std::string();
}

bool writeFile(StringRef Path, StringRef Text) {
  std::error_code EC;
  raw_fd_ostream OS(Path, EC, sys::fs::OF_None);
  if (EC)
    return false;
  OS << Text;
  return true;
}

// Line starts of a text, for offset <-> line.
struct Lines {
  std::vector<unsigned> Starts{0};
  explicit Lines(StringRef Text) {
    for (unsigned I = 0; I < Text.size(); ++I)
      if (Text[I] == '\n')
        Starts.push_back(I + 1);
  }
  unsigned lineOf(unsigned Offset) const {
    return std::upper_bound(Starts.begin(), Starts.end(), Offset) - Starts.begin();
  }
};

std::string baseName(StringRef Path) { return sys::path::filename(Path).str(); }

std::string mib(double Bytes) {
  if (std::abs(Bytes) >= 1024.0 * 1024.0)
    return formatv("{0:F1} MiB", Bytes / (1024.0 * 1024.0)).str();
  if (std::abs(Bytes) >= 1024.0)
    return formatv("{0:F1} KiB", Bytes / 1024.0).str();
  return formatv("{0} B", (int64_t)Bytes).str();
}

std::string num(double V) {
  char Buf[32];
  std::snprintf(Buf, sizeof Buf, "%.6g", V);
  return Buf;
}

// The first identifier quoted in a diagnostic ('images' or `images`).
std::string quotedName(StringRef Msg) {
  for (char Q : {'\'', '`'}) {
    size_t B = Msg.find(Q);
    while (B != StringRef::npos) {
      size_t E = Msg.find(Q, B + 1);
      if (E == StringRef::npos)
        break;
      StringRef Name = Msg.slice(B + 1, E);
      if (!Name.empty() && all_of(Name, [](char C) { return isAlnum(C) || C == '_'; }) && !isDigit(Name[0]))
        return Name.str();
      B = Msg.find(Q, E + 1);
    }
  }
  return "";
}

// --------------------------------------------------------- running things --

struct RunResult {
  int RC = 0;
  bool Started = true, TimedOut = false, Signalled = false;
  std::string Signal, Stdout, Stderr;
};

// Runs Args[0] (a path) with optional working directory, environment and stdin.
RunResult execute(ArrayRef<std::string> Args, StringRef Cwd, std::optional<ArrayRef<StringRef>> Env,
                  StringRef Stdin, StringRef Scratch, StringRef Tag, unsigned Seconds, unsigned MemMB) {
  std::vector<std::string> Full;
  if (!Cwd.empty()) // ExecuteAndWait has no working-directory parameter.
    Full = {"/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", Cwd.str()};
  Full.insert(Full.end(), Args.begin(), Args.end());
  std::vector<StringRef> Refs(Full.begin(), Full.end());
  std::string Out = (Scratch + "/" + Tag + ".stdout").str(), Err = (Scratch + "/" + Tag + ".stderr").str();
  std::string In = Stdin.empty() ? std::string("/dev/null") : Stdin.str();
  std::optional<StringRef> Redirects[] = {StringRef(In), StringRef(Out), StringRef(Err)};
  std::string ErrMsg;
  bool Failed = false;
  RunResult R;
  // ExecuteAndWait's timeout is alarm()-based, which is not safe with several
  // waits on threads: poll instead, and kill at the deadline.
  sys::ProcessInfo PI = sys::ExecuteNoWait(Refs[0], Refs, Env, Redirects, MemMB, &ErrMsg, &Failed);
  if (!Failed) {
    auto Deadline = std::chrono::steady_clock::now() + std::chrono::seconds(Seconds);
    sys::ProcessInfo W;
    while ((W = sys::Wait(PI, /*SecondsToWait=*/0, &ErrMsg, nullptr, /*Polling=*/true)).Pid == 0) {
      if (std::chrono::steady_clock::now() > Deadline) {
        ::kill(PI.Pid, SIGKILL);
        sys::Wait(PI, std::nullopt);
        ErrMsg = "Child timed out";
        W.ReturnCode = -2;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    R.RC = W.ReturnCode;
  }
  R.Stdout = readFile(Out);
  R.Stderr = readFile(Err);
  if (Failed) {
    R.Started = false;
    R.Stderr = ErrMsg;
  } else if (R.RC == -2) {
    if (StringRef(ErrMsg).contains("timed out"))
      R.TimedOut = true;
    else {
      R.Signalled = true;
      R.Signal = ErrMsg;
    }
  } else if (R.RC == -1) {
    R.Started = false;
    R.Stderr = ErrMsg;
  }
  return R;
}

// The message of an uncaught exception, from libstdc++'s terminate handler.
std::string uncaughtWhat(StringRef Stderr) {
  size_t P = Stderr.find("what():");
  if (P == StringRef::npos)
    return "";
  return Stderr.substr(P + 7).trim().split('\n').first.str();
}

// First error line of a compiler's output, for the report.
std::string firstError(StringRef Out) {
  SmallVector<StringRef> L;
  Out.split(L, '\n');
  for (StringRef S : L)
    if ((S.contains("error:") && !S.contains("linker command failed")) || S.contains("undefined reference"))
      return S.trim().str();
  return Out.trim().split('\n').first.str();
}

// ------------------------------------------------------------- the model --

struct Finding {
  const Diagnostic *E;
  size_t Index; // in the driver's report
  std::string File; // absolute
  unsigned Line = 0, Col = 0;
  std::string Check, Message;
  std::string AliasName, AliasWhere; // from the message or its first note
  bool HasFix = false, FixApplied = false;
  std::string FixConflict;
  std::set<unsigned> FixedLines; // lines of the fixed file the fix touched
  unsigned FixedLine = 0;        // the finding's line in the fixed file
  // Verdict.
  std::string Hazard;   // confirmed | not exercised | unconfirmed
  std::string Fix;      // verified | changed behaviour | does not compile | crashed | timed out | none | not exercised
  std::vector<std::string> HazardEv, FixEv;
  json::Object Figures;
  bool failed() const {
    return Fix == "changed behaviour" || Fix == "does not compile" || Fix == "crashed" || Fix == "timed out" ||
           Fix == "not verified";
  }
};

struct Program {
  std::string File, Dir; // the TU and its compile directory
  std::string Name;      // for scratch files: the TU's stem, made unique
  std::vector<std::string> Flags;
  std::vector<Finding *> Findings;
  std::map<std::string, std::string> Original, Fixed; // path -> text, for files with fixes
  std::map<std::string, Replacements> Reps;
  std::map<std::string, std::vector<unsigned>> LineMaps; // original line -> fixed line
  std::set<size_t> Tainted; // original-run events computed from a confirmed hazard's write
  std::string Status; // "" ok, else why the program could not be verified
  std::string OrigBuild, FixedBuild;
  RunResult OrigRun, FixedRun;
  Trace OrigTrace, FixedTrace;
  bool OrigBuilt = false, FixedBuilt = false;
};

// Compile flags of File from the database, minus what would make it not link.
std::vector<std::string> flagsFor(const std::vector<clang::tooling::CompileCommand> &Cmds, std::string &Dir) {
  std::vector<std::string> Flags;
  if (Cmds.empty())
    return Flags;
  const auto &C = Cmds.front();
  Dir = C.Directory;
  std::string AbsFile = absolute(C.Filename, C.Directory);
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
    if (!A.starts_with("-") && absolute(A, C.Directory) == AbsFile)
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
  SmallString<256> Lib(Prefix);
  sys::path::append(Lib, "lib");
  for (StringRef Sub : {"", "x86_64-linux-gnu"}) {
    SmallString<256> L(Lib);
    if (!Sub.empty())
      sys::path::append(L, Sub);
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
  for (StringRef N : {"clang++-19"})
    if (auto P = sys::findProgramByName(N))
      return *P;
  return "/usr/lib/llvm-19/bin/clang++";
}

// Where each line of the original lands in the fixed file.
std::vector<unsigned> mapLines(StringRef Orig, StringRef FixedText, const Replacements &R) {
  Lines LO(Orig), LF(FixedText);
  std::vector<unsigned> M(LO.Starts.size() + 1, 0);
  for (unsigned L = 1; L <= LO.Starts.size(); ++L)
    M[L] = LF.lineOf(R.getShiftedCodePosition(LO.Starts[L - 1]));
  return M;
}

} // namespace

// ------------------------------------------------------------ the verdicts --

namespace {

struct Verifier {
  Runtime RT;
  std::string Compiler, Scratch, StdinPath;
  std::vector<std::unique_ptr<Program>> Programs;
  std::vector<std::unique_ptr<Finding>> Findings;
  OutputFormat Format = OutputFormat::Text;
  std::string Summary;
  unsigned Jobs = 0; // parallel builds and runs; 0: one per core

  int verifyAll(ArrayRef<ClangTidyError> Errors, const clang::tooling::CompilationDatabase &DB,
                ArrayRef<std::string> Files, std::string &Report);
  bool build(Program &P, bool Fixed, std::string &Log, std::string &Exe);
  void runProgram(Program &P, bool Fixed, const std::string &Exe);
  void judge(Program &P, Finding &F);
  void compare(Program &P, Finding &F);
};

bool Verifier::build(Program &P, bool Fixed, std::string &Log, std::string &Exe) {
  std::string Tag = P.Name + (Fixed ? ".fixed" : ".orig");
  Exe = Scratch + "/" + Tag;
  std::vector<std::string> Args = {Compiler};
  Args.insert(Args.end(), P.Flags.begin(), P.Flags.end());
  if (Fixed) {
    json::Array Roots;
    for (auto &[Path, Text] : P.Fixed) {
      std::string Copy = Scratch + "/" + P.Name + ".fixed." + baseName(Path);
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
    Args.push_back("-ivfsoverlay");
    Args.push_back(OverlayPath);
  }
  if (!RT.Include.empty())
    Args.push_back("-I" + RT.Include);
  Args.push_back(P.File);
  Args.push_back("-o");
  Args.push_back(Exe);
  if (!RT.LibDir.empty()) {
    Args.push_back("-L" + RT.LibDir);
    Args.push_back("-Wl,-rpath," + RT.LibDir);
  }
  Args.push_back("-ltt_runtime");
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
  RunResult R = execute(Args, "", ArrayRef<StringRef>(Env), StdinPath, Scratch, Tag, Timeout, MemoryMB);
  Trace T = Trace::load(TracePath, P.Dir);
  (Fixed ? P.FixedRun : P.OrigRun) = std::move(R);
  (Fixed ? P.FixedTrace : P.OrigTrace) = std::move(T);
}

// Allocations and copies among some events.
struct Counts {
  unsigned Allocs = 0, Copies = 0, Implicit = 0;
  uint64_t AllocBytes = 0, CopyBytes = 0, ImplicitBytes = 0, LargestImplicit = 0;
  std::string AllocOp, ImplicitOp;
};

Counts count(ArrayRef<const Event *> Evs) {
  Counts C;
  for (const Event *E : Evs) {
    if (E->Kind == "alloc") {
      ++C.Allocs;
      C.AllocBytes += E->Bytes;
      if (C.AllocOp.empty())
        C.AllocOp = E->Op;
    } else if (E->isCopy()) {
      ++C.Copies;
      C.CopyBytes += E->Bytes;
      if (E->Implicit) {
        ++C.Implicit;
        C.ImplicitBytes += E->Bytes;
        C.LargestImplicit = std::max(C.LargestImplicit, E->Bytes);
        C.ImplicitOp = E->Op;
      }
    }
  }
  return C;
}

bool isWriteCheck(StringRef C) { return C == "tensor-alias-then-mutate" || C == "tensor-inplace-on-detached"; }

// The first line where two outputs differ, for the report.
std::string outputDiff(StringRef A, StringRef B) {
  SmallVector<StringRef> LA, LB;
  A.split(LA, '\n');
  B.split(LB, '\n');
  for (size_t I = 0; I < std::max(LA.size(), LB.size()); ++I) {
    StringRef X = I < LA.size() ? LA[I] : "", Y = I < LB.size() ? LB[I] : "";
    auto Squeeze = [](StringRef L) {
      SmallVector<StringRef> W;
      L.split(W, ' ', -1, false);
      return join(W, " ");
    };
    if (X != Y)
      return "\"" + Squeeze(X) + "\" became \"" + Squeeze(Y) + "\"";
  }
  return "";
}

// What the original run says about the hazard at F's line.
void Verifier::judge(Program &P, Finding &F) {
  const Trace &T = P.OrigTrace;
  std::string Where = baseName(F.File) + ":" + std::to_string(F.Line);
  std::vector<const Event *> At = T.at(F.File, F.Line);
  const Event *Err = T.errorAt(F.File, F.Line);
  if (At.empty() && !Err) {
    F.Hazard = "not exercised";
    F.HazardEv.push_back("line " + Where + " never ran in the original program" +
                         (P.OrigRun.RC != 0 || P.OrigRun.Signalled ? " (it stopped early)" : ""));
    return;
  }
  StringRef C = F.Check;
  Counts N = count(At);
  if (C == "tensor-view-non-contiguous") {
    F.Hazard = Err ? "confirmed" : "unconfirmed";
    F.HazardEv.push_back(Err ? formatv("{0} at {1} threw \"{2}\"", Err->Op.empty() ? "view" : Err->Op, Where,
                                       Err->Message).str()
                             : "view at " + Where + " ran without error");
    return;
  }
  if (C == "tensor-reshape-non-contiguous") {
    F.Figures["implicit_copies"] = N.Implicit;
    F.Figures["implicit_copy_bytes"] = (int64_t)N.ImplicitBytes;
    F.Hazard = N.Implicit ? "confirmed" : "unconfirmed";
    F.HazardEv.push_back(N.Implicit ? formatv("{0} at {1} copied {2} implicitly, {3} time{4}", N.ImplicitOp, Where,
                                              mib(N.LargestImplicit), N.Implicit, N.Implicit == 1 ? "" : "s")
                                          .str()
                                    : "the reshape at " + Where + " ran as a view (no implicit copy)");
    return;
  }
  if (C == "tensor-clone-in-loop") {
    F.Figures["allocations"] = N.Allocs;
    F.Figures["allocated_bytes"] = (int64_t)N.AllocBytes;
    F.Figures["copies"] = N.Copies;
    F.Hazard = N.Allocs > 1 || N.Copies > 1 ? "confirmed" : "unconfirmed";
    if (N.Allocs > 1)
      F.HazardEv.push_back(formatv("{0} at {1} allocated {2} times, {3} in all", N.AllocOp, Where, N.Allocs,
                                   mib(N.AllocBytes)).str());
    else
      F.HazardEv.push_back(formatv("the copy at {0} ran {1} time{2}", Where, N.Copies, N.Copies == 1 ? "" : "s")
                               .str());
    return;
  }
  // Writes (alias-then-mutate, inplace-on-detached, and any other check that flags one).
  const Event *W = nullptr;
  for (const Event *E : At)
    if (E->Kind == "inplace" && (!W || E->Handles > W->Handles))
      W = E;
  if (!W) {
    F.Hazard = "unconfirmed";
    F.HazardEv.push_back("no in-place write at " + Where + " in the trace");
    return;
  }
  F.Figures["written_storage"] = W->Out;
  std::string Name = F.AliasName.empty() ? std::string("another handle") : "`" + F.AliasName + "`";
  std::string Holder = Name + (F.AliasWhere.empty() ? "" : " (aliased at " + F.AliasWhere + ")");
  if (W->Handles > 1) {
    F.Hazard = "confirmed";
    std::string S = formatv("{0} at {1} wrote storage #{2} while {3} still held it", W->Op, Where, W->Out, Holder)
                        .str();
    if (W->SumBefore && W->SumAfter && *W->SumBefore != *W->SumAfter)
      S += formatv("; {0} changed from sum {1} to {2}", F.AliasName.empty() ? "its data" : Name, num(*W->SumBefore),
                   num(*W->SumAfter)).str();
    F.HazardEv.push_back(S);
  } else {
    F.Hazard = "unconfirmed";
    F.HazardEv.push_back(formatv("{0} at {1} wrote storage #{2}, which no other handle held", W->Op, Where, W->Out)
                             .str());
  }
  // backward() through a saved tensor this write changed.
  for (const Event &E : T.Events)
    if (E.Kind == "error" && E.Index > W->Index && StringRef(E.Message).contains("modified by an inplace")) {
      F.Hazard = "confirmed";
      F.HazardEv.push_back("backward() failed: a saved tensor was modified in place at " + Where);
      break;
    }
}

// What the fixed run says: the hazard's events are gone, and everything else
// is unchanged or explained by the hazard's writes.
void Verifier::compare(Program &P, Finding &F) {
  const Finding *By = &F; // whose fix-it this finding is judged by
  if (!F.HasFix) {
    // One fix-it may cover several findings (a clone where the alias is made).
    By = nullptr;
    for (Finding *G : P.Findings)
      if (G->FixApplied && G->File == F.File && G->Check == F.Check && G->Line <= F.Line)
        By = G;
    if (!By || F.Hazard != "confirmed" || !P.FixedBuilt) {
      F.Fix = "none";
      return;
    }
  } else if (!F.FixApplied) {
    F.Fix = "not verified";
    F.FixEv.push_back("the fix was not applied: " + F.FixConflict);
    return;
  }
  if (!P.FixedBuilt) {
    F.Fix = "does not compile";
    F.FixEv.push_back("fixed program: " + firstError(P.FixedBuild));
    return;
  }
  const RunResult &O = P.OrigRun, &X = P.FixedRun;
  if (X.TimedOut) {
    F.Fix = "timed out";
    F.FixEv.push_back(formatv("the fixed program ran past {0} s", Timeout.getValue()).str());
    return;
  }
  bool OrigFailed = O.Signalled || O.RC != 0;
  if (X.Signalled || X.RC != 0) {
    std::string W = uncaughtWhat(X.Stderr);
    F.Fix = "crashed";
    F.FixEv.push_back("the fixed program failed (" + (X.Signalled ? X.Signal : "exit code " + std::to_string(X.RC)) +
                      ")" + (W.empty() ? "" : ": \"" + W + "\""));
    return;
  }
  if (F.Hazard == "not exercised") {
    F.Fix = "not exercised";
    return;
  }
  if (!P.FixedTrace.Loaded) { // no events would look like no hazard
    F.Fix = "not verified";
    F.FixEv.push_back("the fixed program wrote no trace");
    return;
  }
  const Trace &TF = P.FixedTrace;
  std::string FWhere = baseName(F.File) + ":" + std::to_string(F.FixedLine);
  std::set<unsigned> Lines = By->FixedLines;
  Lines.insert(F.FixedLine);
  std::vector<const Event *> AtFix;
  for (unsigned L : Lines)
    for (const Event *E : TF.at(F.File, L))
      AtFix.push_back(E);
  Counts N = count(AtFix);
  StringRef C = F.Check;
  std::string Gone, Remains;
  if (C == "tensor-view-non-contiguous") {
    if (TF.errorAt(F.File, F.FixedLine))
      Remains = "the fixed program still throws at " + FWhere;
    else
      Gone = "no error at " + FWhere +
             (N.Copies ? formatv(" (it copies {0} instead, {1} time{2})", mib(N.CopyBytes / N.Copies), N.Copies,
                                 N.Copies == 1 ? "" : "s").str()
                       : std::string(""));
  } else if (C == "tensor-reshape-non-contiguous") {
    F.Figures["implicit_copies_after"] = N.Implicit;
    F.Figures["explicit_copies_after"] = N.Copies - N.Implicit;
    if (N.Implicit)
      Remains = formatv("{0} implicit copies remain at {1}", N.Implicit, FWhere).str();
    else
      Gone = formatv("implicit copies {0} -> 0 (the copy is explicit now: {1})",
                     F.Figures.getInteger("implicit_copies").value_or(0), N.Copies).str();
  } else if (C == "tensor-clone-in-loop") {
    int64_t Before = F.Figures.getInteger("allocations").value_or(0);
    F.Figures["allocations_after"] = N.Allocs;
    F.Figures["copies_after"] = N.Copies;
    if (Before > 1 && N.Allocs >= Before) {
      Remains = formatv("allocations {0} -> {1}: no fewer", Before, N.Allocs).str();
    } else {
      Gone = formatv("allocations {0} -> {1}", Before, N.Allocs).str();
      int64_t CopiesBefore = F.Figures.getInteger("copies").value_or(0);
      if (CopiesBefore != N.Copies)
        Gone += formatv(", copies {0} -> {1}", CopiesBefore, N.Copies).str();
      if (P.OrigTrace.PeakBytes && TF.PeakBytes && P.OrigTrace.PeakBytes != TF.PeakBytes) {
        int64_t D = (int64_t)TF.PeakBytes - (int64_t)P.OrigTrace.PeakBytes;
        F.Figures["peak_bytes_before"] = (int64_t)P.OrigTrace.PeakBytes;
        F.Figures["peak_bytes_after"] = (int64_t)TF.PeakBytes;
        Gone += ", peak memory " + std::string(D < 0 ? "-" : "+") + mib(std::abs((double)D));
      }
    }
  } else {
    const Event *Shared = nullptr;
    for (const Event *E : AtFix)
      if (E->Kind == "inplace" && E->Handles > 1)
        Shared = E;
    if (Shared)
      Remains = formatv("{0} at {1} still writes a storage another handle holds", Shared->Op, FWhere).str();
    else
      Gone = "no shared storage is written at " + FWhere + " any more";
  }
  if (!Remains.empty()) {
    // A fix that leaves the hazard in place fails; a finding without its own fix-it just stays.
    F.Fix = By == &F ? "not verified" : "none";
    if (By == &F)
      F.FixEv.push_back(Remains);
    return;
  }
  if (By != &F)
    Gone += formatv(" (by the fix-it of the finding at {0}:{1})", baseName(By->File), By->Line).str();

  // Everything the fix should not change: values at the trace points both runs
  // share, unless they were computed from a hazard's write (P.Tainted).
  std::vector<std::string> Unexplained, Explained;
  unsigned Compared = 0;
  for (const auto &Pair : P.OrigTrace.pairWith(TF, [&](StringRef File, unsigned L) -> unsigned {
         auto M = P.LineMaps.find(File.str());
         return M != P.LineMaps.end() && L < M->second.size() ? M->second[L] : L;
       })) {
    const Event *A = Pair.first, *B = Pair.second;
    ++Compared;
    if (std::abs(*A->Sum - *B->Sum) <= 1e-5 * std::max(1.0, std::abs(*A->Sum)))
      continue;
    std::string D = formatv("{0} at {1}:{2} (sum {3} -> {4})", A->Op, baseName(A->File), A->Line, num(*A->Sum),
                            num(*B->Sum)).str();
    (P.Tainted.count(A->Index) ? Explained : Unexplained).push_back(D);
  }
  F.Figures["values_compared"] = (int64_t)Compared;
  F.Figures["values_differing_explained"] = (int64_t)Explained.size();
  std::string Diff = outputDiff(O.Stdout, X.Stdout);
  bool OutputDiffers = O.Stdout != X.Stdout;
  if (!Unexplained.empty() || (OutputDiffers && Explained.empty() && !OrigFailed)) {
    F.Fix = "changed behaviour";
    F.FixEv.push_back(Gone);
    for (size_t I = 0; I < Unexplained.size() && I < 3; ++I)
      F.FixEv.push_back("differs, not computed from the hazard's write: " + Unexplained[I]);
    if (OutputDiffers)
      F.FixEv.push_back("program output differs: " + Diff);
    return;
  }
  F.Fix = "verified";
  F.FixEv.push_back(Gone);
  if (OrigFailed)
    F.FixEv.push_back("the original failed, the fixed program exits 0");
  else if (OutputDiffers)
    F.FixEv.push_back("program output differs only where computed from the hazard's write: " + Diff);
  else
    F.FixEv.push_back("program output unchanged");
  if (Compared)
    F.FixEv.push_back(formatv("{0} of {1} values at shared trace points unchanged", Compared - Explained.size(),
                              Compared).str());
  if (!Explained.empty())
    F.FixEv.push_back(formatv("{0} differ{1} downstream of the write, e.g. {2}", Explained.size(),
                              Explained.size() == 1 ? "s" : "", Explained.front()).str());
}

} // namespace

// -------------------------------------------------------------- the driver --

namespace {
int fail(const Twine &Msg, int Code = ExitUsage) {
  errs() << "tensor-tidy: error: " << Msg << "\n";
  return Code;
}

std::string relativeToCwd(StringRef Path) {
  SmallString<256> Cwd;
  sys::fs::current_path(Cwd);
  StringRef P(Path);
  if (P.consume_front(Cwd) && P.consume_front("/"))
    return P.str();
  return Path.str();
}

json::Object toJSON(const Finding &F) {
  return json::Object{{"hazard", F.Hazard},
                      {"fix", F.Fix},
                      {"hazard_evidence", json::Array(F.HazardEv)},
                      {"fix_evidence", json::Array(F.FixEv)},
                      {"figures", json::Object(F.Figures)}};
}
} // namespace

int runVerify(DriverOptions &Opts, const char *Argv0) {
  Verifier V;
  V.RT = findRuntime(Argv0);
  V.Compiler = findCompiler();
  if (V.RT.LibDir.empty() || V.RT.Include.empty())
    return fail(Twine("--verify cannot find the runtime (libtt_runtime.so and tt/tt.h) next to ") + Argv0);
  SmallString<128> Tmp;
  if (!KeepDir.empty()) {
    sys::fs::create_directories(KeepDir);
    Tmp = absolute(KeepDir, "");
  } else if (auto EC = sys::fs::createUniqueDirectory("tensor-tidy-verify", Tmp)) {
    return fail("cannot create a scratch directory: " + EC.message());
  }
  V.Scratch = std::string(Tmp);
  auto Cleanup = make_scope_exit([&] {
    if (KeepDir.empty())
      sys::fs::remove_directories(V.Scratch);
  });
  if (StdinFile == "-") {
    V.StdinPath = V.Scratch + "/stdin";
    auto In = MemoryBuffer::getSTDIN();
    writeFile(V.StdinPath, In ? (*In)->getBuffer() : "");
  } else if (!StdinFile.empty()) {
    V.StdinPath = absolute(StdinFile, "");
    if (!sys::fs::exists(V.StdinPath))
      return fail("--verify-stdin: no such file '" + StdinFile + "'");
  }

  // JSON and SARIF get the verdicts as properties of each result: the driver
  // writes to a scratch file, read back below.
  std::string UserOutput = Opts.Output;
  if (Opts.Format != OutputFormat::Text)
    Opts.Output = V.Scratch + "/report.json";
  V.Format = Opts.Format;
  V.Jobs = Opts.Jobs;
  // Text goes after the diagnostics: on stdout through the driver, or
  // appended to --output once the driver has written it.
  std::string TextToFile;
  Opts.AfterAnalysis = [&](ArrayRef<ClangTidyError> Errors, const clang::tooling::CompilationDatabase &DB,
                           ArrayRef<std::string> Files, std::string &Report) {
    int RC = V.verifyAll(Errors, DB, Files, Report);
    if (Opts.Format == OutputFormat::Text && !UserOutput.empty())
      std::swap(Report, TextToFile);
    return RC;
  };
  int RC = runDriver(Opts);
  if (!TextToFile.empty()) {
    std::error_code EC;
    raw_fd_ostream Out(UserOutput, EC, sys::fs::OF_Append);
    if (EC)
      return fail("cannot write '" + UserOutput + "': " + EC.message());
    Out << TextToFile;
  }
  if (Opts.Format == OutputFormat::Text || !sys::fs::exists(Opts.Output))
    return RC;
  std::string Report;
  raw_string_ostream OS(Report);
  auto Parsed = json::parse(readFile(Opts.Output));
  if (!Parsed)
    return fail("cannot read the driver's report back: " + toString(Parsed.takeError()));
  json::Object *Root = Parsed->getAsObject();
  json::Array *Results = nullptr;
  json::Object *Run = nullptr;
  if (Opts.Format == OutputFormat::Json) {
    Results = Root ? Root->getArray("diagnostics") : nullptr;
  } else if (json::Array *Runs = Root ? Root->getArray("runs") : nullptr) {
    if (!Runs->empty() && (Run = (*Runs)[0].getAsObject()))
      Results = Run->getArray("results");
  }
  auto Properties = [](json::Object &O) -> json::Object & {
    if (!O.getObject("properties"))
      O["properties"] = json::Object{};
    return *O.getObject("properties");
  };
  // Results are in the order of the findings the hook was given.
  for (auto &F : V.Findings) {
    json::Object *R = Results && F->Index < Results->size() ? (*Results)[F->Index].getAsObject() : nullptr;
    if (!R)
      continue;
    if (Opts.Format == OutputFormat::Json)
      (*R)["verify"] = toJSON(*F);
    else
      Properties(*R)["tensorTidyVerify"] = toJSON(*F);
  }
  json::Object Summary{{"summary", V.Summary}, {"exit_code", RC}};
  if (Opts.Format == OutputFormat::Json && Root)
    (*Root)["verify"] = std::move(Summary);
  else if (Run)
    Properties(*Run)["tensorTidyVerify"] = std::move(Summary);
  OS << formatv("{0:2}", json::Value(std::move(*Parsed))) << "\n";
  OS.flush();
  if (UserOutput.empty()) {
    outs() << Report;
    outs().flush();
  } else if (!writeFile(UserOutput, Report)) {
    return fail("cannot write '" + UserOutput + "'");
  }
  return RC;
}

int Verifier::verifyAll(ArrayRef<ClangTidyError> Errors, const clang::tooling::CompilationDatabase &DB,
                        ArrayRef<std::string> Files, std::string &Report) {
  Verifier &V = *this;
  // Programs: one per input TU.
  std::set<std::string> TUs;
  for (const std::string &F : Files) {
    auto P = std::make_unique<Program>();
    P->Flags = flagsFor(DB.getCompileCommands(F), P->Dir);
    P->File = F;
    TUs.insert(P->File);
    V.Programs.push_back(std::move(P));
  }
  // Findings, with their lines and fixes; a finding in a header belongs to every program.
  std::map<std::string, std::string> Text;
  for (size_t I = 0; I < Errors.size(); ++I) {
    const Diagnostic &E = Errors[I];
    if (StringRef(E.DiagnosticName).starts_with("clang-diagnostic") || E.Message.FilePath.empty())
      continue;
    auto F = std::make_unique<Finding>();
    F->E = &E;
    F->Index = I;
    F->File = absolute(E.Message.FilePath, E.BuildDirectory);
    if (!Text.count(F->File))
      Text[F->File] = readFile(F->File);
    Lines L(Text[F->File]);
    F->Line = L.lineOf(E.Message.FileOffset);
    F->Col = E.Message.FileOffset - L.Starts[F->Line - 1] + 1;
    F->Check = E.DiagnosticName;
    F->Message = E.Message.Message;
    // "... also changes 'images', ...": the other handle.
    StringRef Msg = E.Message.Message;
    for (StringRef Key : {"changes '", "change '"})
      if (size_t P = Msg.find(Key); P != StringRef::npos && F->AliasName.empty())
        F->AliasName = quotedName(Msg.substr(P + Key.size() - 1));
    for (const auto &N : E.Notes) {
      if (F->AliasName.empty())
        F->AliasName = quotedName(N.Message);
      if (F->AliasWhere.empty() && !N.FilePath.empty()) {
        std::string NF = absolute(N.FilePath, E.BuildDirectory);
        if (!Text.count(NF))
          Text[NF] = readFile(NF);
        F->AliasWhere = baseName(NF) + ":" + std::to_string(Lines(Text[NF]).lineOf(N.FileOffset));
      }
    }
    const llvm::StringMap<Replacements> *Fix = clang::tooling::selectFirstFix(E);
    F->HasFix = Fix && !Fix->empty();
    for (auto &P : V.Programs) {
      if (F->File != P->File && TUs.count(F->File))
        continue;
      P->Findings.push_back(F.get());
      if (!F->HasFix)
        continue;
      // All of a finding's replacements go in, or none.
      std::map<std::string, Replacements> Tentative = P->Reps;
      bool OK = true;
      for (const auto &[Path, Reps] : *Fix)
        for (const Replacement &R : Reps) {
          std::string Abs = absolute(R.getFilePath(), E.BuildDirectory);
          Replacement RA(Abs, R.getOffset(), R.getLength(), R.getReplacementText());
          if (auto Err = Tentative[Abs].add(RA)) {
            F->FixConflict = toString(std::move(Err));
            OK = false;
          }
        }
      if (OK) {
        P->Reps = std::move(Tentative);
        F->FixApplied = true;
      }
    }
    V.Findings.push_back(std::move(F));
  }

  for (auto &PP : V.Programs) {
    Program &P = *PP;
    for (auto &[Path, Reps] : P.Reps) {
      if (!Text.count(Path))
        Text[Path] = readFile(Path);
      P.Original[Path] = Text[Path];
      auto Fixed = clang::tooling::applyAllReplacements(Text[Path], Reps);
      if (!Fixed) {
        P.Status = "cannot apply the fixes to " + Path + ": " + toString(Fixed.takeError());
        continue;
      }
      P.Fixed[Path] = *Fixed;
      P.LineMaps[Path] = mapLines(P.Original[Path], *Fixed, Reps);
    }
    for (Finding *F : P.Findings) {
      F->FixedLine = F->Line;
      auto R = P.Reps.find(F->File);
      if (R == P.Reps.end() || !P.Fixed.count(F->File))
        continue;
      const auto &M = P.LineMaps[F->File];
      F->FixedLine = F->Line < M.size() ? M[F->Line] : F->Line;
      if (!F->FixApplied)
        continue;
      Lines LF(P.Fixed[F->File]);
      const auto *Fix = clang::tooling::selectFirstFix(*F->E);
      for (const auto &[Path, Reps] : *Fix)
        for (const Replacement &Rep : Reps) {
          if (absolute(Rep.getFilePath(), F->E->BuildDirectory) != F->File)
            continue;
          // The lines the fix wrote code on (a deletion writes none).
          StringRef Text = Rep.getReplacementText();
          if (Text.trim().empty())
            continue;
          // An insertion's own offset is shifted past its text: step back over it.
          unsigned B = R->second.getShiftedCodePosition(Rep.getOffset()) - (Rep.getLength() ? 0 : Text.size()) +
                       (Text.size() - Text.ltrim().size());
          unsigned E = B + Text.trim().size();
          for (unsigned L = LF.lineOf(B); L <= LF.lineOf(E - 1); ++L)
            F->FixedLines.insert(L);
        }
    }
  }

  // Build and run, the original and the fixed program of each in parallel.
  // Programs without findings are skipped: nothing to prove.
  {
    std::map<std::string, unsigned> Stems;
    for (auto &PP : V.Programs) {
      std::string Stem = sys::path::stem(PP->File).str();
      unsigned N = Stems[Stem]++;
      PP->Name = N ? Stem + "-" + std::to_string(N) : Stem;
    }
    DefaultThreadPool Pool(hardware_concurrency(Jobs));
    for (auto &PP : V.Programs) {
      Program &P = *PP;
      if (P.Findings.empty() || !P.Status.empty())
        continue;
      Pool.async([&V, &P] {
        std::string Exe;
        if ((P.OrigBuilt = V.build(P, false, P.OrigBuild, Exe)))
          V.runProgram(P, false, Exe);
      });
      if (any_of(P.Findings, [](Finding *F) { return F->FixApplied; }))
        Pool.async([&V, &P] {
          std::string Exe;
          if ((P.FixedBuilt = V.build(P, true, P.FixedBuild, Exe)))
            V.runProgram(P, true, Exe);
        });
    }
    Pool.wait();
  }
  for (auto &PP : V.Programs) {
    Program &P = *PP;
    if (P.Findings.empty() || !P.Status.empty())
      continue;
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

  // Verdicts.
  int RC = 0;
  for (auto &PP : V.Programs) {
    Program &P = *PP;
    for (Finding *F : P.Findings) {
      if (!P.Status.empty()) {
        F->Hazard = P.OrigRun.TimedOut ? "timed out" : "not verified";
        F->Fix = "not verified";
        F->HazardEv.push_back(P.Status);
        continue;
      }
      V.judge(P, *F);
    }
    // Values computed from any confirmed hazard's write may differ in the fixed run.
    for (Finding *F : P.Findings)
      if (F->Hazard == "confirmed" && isWriteCheck(F->Check))
        if (auto S = F->Figures.getInteger("written_storage")) {
          auto D = P.OrigTrace.downstreamOf(*S, F->File, F->Line);
          P.Tainted.insert(D.begin(), D.end());
        }
    for (Finding *F : P.Findings) {
      if (F->Hazard == "not verified" || F->Hazard == "timed out")
        continue;
      if (F->Hazard != "confirmed" && (P.OrigRun.Signalled || P.OrigRun.RC != 0)) {
        std::string W = uncaughtWhat(P.OrigRun.Stderr);
        F->HazardEv.push_back("the original program failed (" +
                              (P.OrigRun.Signalled ? P.OrigRun.Signal : "exit code " + std::to_string(P.OrigRun.RC)) +
                              ")" + (W.empty() ? "" : ": \"" + W + "\""));
      }
      V.compare(P, *F);
    }
  }
  for (auto &F : V.Findings)
    if (F->failed() || F->Hazard == "not verified" || F->Hazard == "timed out")
      RC = 4;

  // Report: text after the diagnostics; json/sarif: see runVerify.
  raw_string_ostream OS(Report);
  unsigned Conf = 0, Ver = 0, NotEx = 0, Failed = 0, Total = 0;
  for (auto &F : V.Findings) {
    ++Total;
    Conf += F->Hazard == "confirmed";
    Ver += F->Fix == "verified";
    NotEx += F->Hazard == "not exercised";
    Failed += F->failed();
  }
  std::string Summary =
      formatv("{0} finding{1}: {2} hazard{3} confirmed, {4} fix{5} verified, {6} not exercised, {7} failed "
              "verification",
              Total, Total == 1 ? "" : "s", Conf, Conf == 1 ? "" : "s", Ver, Ver == 1 ? "" : "es", NotEx, Failed)
          .str();
  V.Summary = Summary;
  if (Format != OutputFormat::Text)
    return RC;
  OS << "\n";
  for (auto &PP : V.Programs) {
    if (PP->Findings.empty())
      continue;
    OS << "verify " << relativeToCwd(PP->File) << "\n";
    for (Finding *F : PP->Findings) {
      OS << relativeToCwd(F->File) << ":" << F->Line << ":" << F->Col << ": [" << F->Check << "]\n";
      // The verdict with its first piece of evidence, then one line per further piece.
      auto Verdict = [&](StringRef What, StringRef V, ArrayRef<std::string> Ev) {
        OS << "  " << What << " " << V << (Ev.empty() ? "" : ": ") << (Ev.empty() ? "" : Ev.front()) << "\n";
        for (size_t I = 1; I < Ev.size(); ++I)
          OS << "      " << Ev[I] << "\n";
      };
      Verdict("hazard", F->Hazard, F->HazardEv);
      Verdict("fix", F->Fix == "none" ? "none offered" : F->Fix, F->FixEv);
    }
  }
  OS << "verify: " << Summary << "\n";
  return RC;
}

} // namespace tensor_tidy::verify
