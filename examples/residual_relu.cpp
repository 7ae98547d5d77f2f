// A residual connection added in place after the activation.
//
// relu saves its result for backward; `out += x` then changes that saved
// tensor, and backward() refuses: "one of the variables needed for gradient
// computation has been modified by an inplace operation". Fix: the
// out-of-place sum (`out = out + x`), or the skip added before the relu.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(1);
  tt::Tensor w1 = tt::randn({8, 8}).mul(0.1).requires_grad_();
  tt::Tensor w2 = tt::randn({8, 2}).mul(0.1).requires_grad_();
  tt::Tensor x = tt::randn({4, 8});

  for (int step = 0; step < 3; ++step) {
    tt::Tensor out = tt::relu(x.mm(w1));
    out += x; // the skip connection
    tt::Tensor loss = out.mm(w2).pow(2).mean();
    loss.backward();
    std::printf("step %d loss %.5f grad %.5f\n", step, loss.item<float>(),
                w1.grad().abs().sum().item<float>());
    w1.mutable_grad().zero_();
    w2.mutable_grad().zero_();
  }
  return 0;
}
