// Variant: the display copy is scaled before the rest of the forward pass
// reads the hidden activations; the gradient is computed from the write.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(3);
  tt::Tensor x = tt::randn({8, 4});
  tt::Tensor w1 = tt::randn({4, 6}).requires_grad_();
  tt::Tensor w2 = tt::randn({6, 2}).requires_grad_();
  tt::Tensor hidden = x.matmul(w1);
  tt::Tensor shown = hidden.detach();
  shown.mul_(0.5); // scales hidden before it is used below
  tt::Tensor logits = hidden.relu().matmul(w2);
  tt::Tensor loss = logits.pow(2).mean();
  loss.backward();
  std::printf("loss %.4f\n", loss.item<float>());
  std::printf("w1 grad %.4f\n", w1.grad().abs().sum().item<float>());
  std::printf("w2 grad %.4f\n", w2.grad().abs().sum().item<float>());
  return 0;
}
