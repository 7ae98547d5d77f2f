// Variant: the display copy is scaled after the loss saved the logits for
// backward: backward() raises in the original; the fix lets it run.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(4);
  tt::Tensor x = tt::randn({8, 4});
  tt::Tensor w = tt::randn({4, 3}).requires_grad_();
  tt::Tensor logits = x.matmul(w);
  tt::Tensor loss = (logits * logits).sum();
  tt::Tensor shown = logits.detach();
  shown.mul_(10.0); // logits were saved by the multiplication above
  std::printf("shown max %.3f logits max %.3f\n", shown.max().item<float>(), logits.max().item<float>());
  loss.backward();
  std::printf("grad norm %.3f\n", w.grad().pow(2).sum().item<float>());
  return 0;
}
