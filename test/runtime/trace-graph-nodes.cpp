// The trace counts the live autograd graph on every op event: accumulating a
// loss that requires grad into a tensor that outlives the iteration keeps
// every iteration's nodes and saved tensors (they grow per iteration);
// accumulating its detach() keeps none (they stay flat). As in PyTorch, where
// `total += loss` gives `total` a grad_fn reaching every iteration's graph.
// REQUIRES: tt-trace
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.exe
// RUN: env TT_TRACE=%t.jsonl %t.exe
// RUN: %python %s.py %t.jsonl
#include <tt/tt.h>

#include <vector>

int main() {
  tt::manual_seed(0);
  tt::Tensor w = tt::randn({32, 8}, tt::requires_grad());
  tt::Tensor kept = tt::zeros({}), flat = tt::zeros({});
  for (int i = 0; i < 6; ++i) {
    tt::Tensor loss = tt::randn({4, 32}).matmul(w).tanh().mean(); // KEPT
    kept += loss;
  }
  kept = tt::Tensor(); // frees the kept graph
  for (int i = 0; i < 6; ++i) {
    tt::Tensor loss = tt::randn({4, 32}).matmul(w).tanh().mean(); // FLAT
    flat += loss.detach();
  }
  std::vector<tt::Tensor> history;
  for (int i = 0; i < 6; ++i) {
    tt::Tensor out = tt::randn({4, 32}).matmul(w); // BACKWARD
    out.sum().backward();
    history.push_back(out); // nodes stay, saved tensors were freed by backward()
  }
  return 0;
}
