// Registers the tensor-* checks with clang-tidy's module registry: used by the
// tensor-tidy driver and by stock clang-tidy through --load.
#include "ClangTidyModule.h"
#include "ClangTidyModuleRegistry.h"

#include "AliasThenMutateCheck.h"
#include "CloneInLoopCheck.h"
#include "CopyNarrowingCheck.h"
#include "DeviceMismatchCheck.h"
#include "InplaceOnDetachedCheck.h"
#include "ReshapeNonContiguousCheck.h"
#include "ViewNonContiguousCheck.h"
#include "InplaceOnExpandedCheck.h"
#include "InplaceOverlapCheck.h"
#include "InplaceOnLeafCheck.h"
#include "InplaceOnSavedCheck.h"
#include "GraphKeptAcrossIterationsCheck.h"
#include "UnnecessaryCloneCheck.h"
#include "SyncInLoopCheck.h"

namespace clang::tidy::tensor {

class TensorTidyModule : public ClangTidyModule {
public:
  void addCheckFactories(ClangTidyCheckFactories &Factories) override {
    Factories.registerCheck<ViewNonContiguousCheck>("tensor-view-non-contiguous");
    Factories.registerCheck<AliasThenMutateCheck>("tensor-alias-then-mutate");
    Factories.registerCheck<InplaceOnDetachedCheck>("tensor-inplace-on-detached");
    Factories.registerCheck<ReshapeNonContiguousCheck>("tensor-reshape-non-contiguous");
    Factories.registerCheck<CloneInLoopCheck>("tensor-clone-in-loop");
    Factories.registerCheck<InplaceOnExpandedCheck>("tensor-inplace-on-expanded");
    Factories.registerCheck<InplaceOverlapCheck>("tensor-inplace-overlap");
    Factories.registerCheck<CopyNarrowingCheck>("tensor-copy-narrowing");
    Factories.registerCheck<DeviceMismatchCheck>("tensor-device-mismatch");
    Factories.registerCheck<InplaceOnLeafCheck>("tensor-inplace-on-leaf");
    Factories.registerCheck<InplaceOnSavedCheck>("tensor-inplace-on-saved");
    Factories.registerCheck<GraphKeptAcrossIterationsCheck>("tensor-graph-kept-across-iterations");
    Factories.registerCheck<UnnecessaryCloneCheck>("tensor-unnecessary-clone");
    Factories.registerCheck<SyncInLoopCheck>("tensor-sync-in-loop");
  }
};

} // namespace clang::tidy::tensor

namespace clang::tidy {
static ClangTidyModuleRegistry::Add<tensor::TensorTidyModule>
    X("tensor-module", "Checks for aliasing, copy and layout hazards in tensor code.");

// Referenced by the driver so the linker keeps this object (and the registration).
volatile int TensorTidyModuleAnchorSource = 0;
} // namespace clang::tidy
