#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// Flags an op that combines tensors on two known, different devices (a CPU
/// tensor with one moved to CUDA), including a module moved to CUDA in the
/// same function and called on a CPU tensor: PyTorch throws.
/// Docs: docs/checks/tensor-device-mismatch.md
class DeviceMismatchCheck : public TensorCheck {
public:
  DeviceMismatchCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    AnalysisManager::release();
    Reported.clear();
  }

  /// One operand of a call: its expression and fact.
  struct Operand {
    const Expr *E;
    const TensorFact *F;
  };
  /// What a finding says: the call, the CPU operand and the device it meets.
  struct Mismatch {
    const Expr *Call;
    SourceLocation Loc;
    std::string Op;
    const Expr *Cpu;
    std::string Device; // text of the CUDA side's device ("a.device()", "torch::kCUDA")
    std::string Other;  // the CUDA side, for the message
    bool Module = false;
    DeviceKnown CudaKind = DeviceKnown::CUDA; // how the CUDA side's device is CUDA
    bool LeftBehind = false;                  // Cpu is a module's member its to() does not move
  };

  /// The first CPU operand (not a CPU scalar the op accepts) and a CUDA one.
  struct Sides {
    const Expr *Cpu = nullptr, *Cuda = nullptr;
    DeviceKnown CudaKind = DeviceKnown::CUDA; // how the CUDA side's device is CUDA
    bool LeftBehind = false;                  // Cpu: DeviceFacts::hostMember
  };

private:
  static Sides sidesOf(llvm::ArrayRef<const Expr *> Es, const LayoutAnalysis &LA,
                       DeviceFacts *Devices, StringRef Op);
  void checkOp(const CallExpr *Call, const ast_matchers::MatchFinder::MatchResult &Result);
  void checkForward(const CallExpr *Call, const Expr *ModuleE, const Expr *Input,
                    const ast_matchers::MatchFinder::MatchResult &Result);
  void report(const Mismatch &M, const ast_matchers::MatchFinder::MatchResult &Result);
  ReportedOnce Reported;
};

} // namespace clang::tidy::tensor
