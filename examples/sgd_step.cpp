// A hand-written SGD step on leaf weights.
//
// `w -= lr * grad` writes a leaf that requires grad while grad mode is on;
// autograd refuses: "a leaf Variable that requires grad is being used in an
// in-place operation." Fix: the update under a NoGradGuard.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(0);
  tt::Tensor w = tt::randn({4, 2}, tt::requires_grad());
  const double lr = 0.1;

  for (int step = 0; step < 3; ++step) {
    tt::Tensor x = tt::randn({8, 4});
    tt::Tensor y = tt::randn({8, 2});
    tt::Tensor loss = (x.mm(w) - y).pow(2).mean();
    loss.backward();
    w -= w.grad() * lr;
    std::printf("step %d loss %.5f\n", step, loss.item<float>());
    w.mutable_grad().zero_();
  }
  return 0;
}
