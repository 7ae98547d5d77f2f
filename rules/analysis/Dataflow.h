// The one forward dataflow engine of the analyses, in the shape of clang's
// dataflow framework (clang/Analysis/FlowSensitive/DataflowAnalysis.h): a
// domain gives the state, the transfer of one CFG statement, the join, and
// the widening applied to a block visited too often; the engine runs the
// worklist to a fixpoint and then replays every reached block from its entry
// state, so a domain can record what the checks ask about at the fixpoint.
//
// A Domain provides:
//   using State = ...;                             // copyable
//   void transfer(const Stmt *S, State &St);       // one CFGStmt element
//   bool join(State &Into, const State &From);     // true when Into changed
//   void widen(State &St);                         // after MaxVisits visits
#pragma once

#include "clang/Analysis/CFG.h"
#include "llvm/ADT/BitVector.h"

#include <deque>
#include <optional>
#include <vector>

namespace clang::tidy::tensor {

struct DataflowLimits {
  unsigned MaxVisitsPerBlock = 12; // then the block's entry state is widened
  unsigned MaxStepsPerBlock = 50;  // total budget: steps <= this * #blocks + 100
};

template <typename Domain> class ForwardDataflow {
public:
  using State = typename Domain::State;

  ForwardDataflow(const CFG &G, Domain &D) : G(G), D(D), In(G.getNumBlockIDs()) {}

  /// Runs to a fixpoint from Entry; false when the step budget ran out (the
  /// states are then unusable: say nothing).
  bool solve(State Entry, DataflowLimits L = {}) {
    unsigned N = G.getNumBlockIDs();
    std::vector<unsigned> Visits(N, 0);
    llvm::BitVector Queued(N);
    std::deque<const CFGBlock *> Work;
    In[G.getEntry().getBlockID()] = std::move(Entry);
    Work.push_back(&G.getEntry());
    unsigned Steps = 0, Budget = L.MaxStepsPerBlock * N + 100;
    while (!Work.empty()) {
      const CFGBlock *B = Work.front();
      Work.pop_front();
      Queued.reset(B->getBlockID());
      if (++Steps > Budget)
        return false;
      State S = *In[B->getBlockID()];
      if (++Visits[B->getBlockID()] > L.MaxVisitsPerBlock)
        D.widen(S);
      transferBlock(*B, S);
      for (const CFGBlock *Succ : B->succs())
        if (Succ && mergeInto(Succ->getBlockID(), S) && !Queued.test(Succ->getBlockID())) {
          Queued.set(Succ->getBlockID());
          Work.push_back(Succ);
        }
    }
    return true;
  }

  /// Calls Before(Block, Index, Stmt, State) ahead of the transfer of every
  /// statement element of every reached block, with the fixpoint state.
  template <typename Fn> void replay(Fn Before) const {
    for (const CFGBlock *B : G) {
      if (!In[B->getBlockID()])
        continue;
      State S = *In[B->getBlockID()];
      for (unsigned I = 0; I < B->size(); ++I)
        if (auto CS = (*B)[I].template getAs<CFGStmt>()) {
          Before(*B, I, CS->getStmt(), S);
          D.transfer(CS->getStmt(), S);
        }
    }
  }

  bool reached(const CFGBlock &B) const { return In[B.getBlockID()].has_value(); }

private:
  void transferBlock(const CFGBlock &B, State &S) {
    for (const CFGElement &El : B)
      if (auto CS = El.getAs<CFGStmt>())
        D.transfer(CS->getStmt(), S);
  }
  bool mergeInto(unsigned Id, const State &S) {
    if (!In[Id]) {
      In[Id] = S;
      return true;
    }
    return D.join(*In[Id], S);
  }

  const CFG &G;
  Domain &D;
  std::vector<std::optional<State>> In;
};

} // namespace clang::tidy::tensor
