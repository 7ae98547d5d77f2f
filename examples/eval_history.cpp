// Validation losses kept for a report, in a loop without NoGradGuard.
//
// Every `loss` requires grad (it is computed from the weights), so keeping it
// in `val_losses` keeps its whole autograd graph: the nodes and the
// activations they saved for backward, for every batch, until the report is
// printed. Nothing differentiates the kept losses: keep `loss.detach()`.
#include <tt/tt.h>

#include <cstdio>
#include <vector>

int main() {
  tt::manual_seed(11);
  tt::Tensor w1 = tt::randn({64, 128}, tt::requires_grad());
  tt::Tensor w2 = tt::randn({128, 10}, tt::requires_grad());
  std::vector<tt::Tensor> val_losses;
  for (int batch = 0; batch < 20; ++batch) {
    tt::Tensor x = tt::randn({32, 64});
    tt::Tensor target = tt::randn({32, 10});
    tt::Tensor pred = x.matmul(w1).relu().matmul(w2);
    tt::Tensor loss = (pred - target).pow(2).mean();
    val_losses.push_back(loss);
  }
  float sum = 0;
  for (const tt::Tensor &l : val_losses)
    sum += l.item<float>();
  std::printf("mean validation loss %.3f over %zu batches\n", sum / val_losses.size(), val_losses.size());
  return 0;
}
