#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor w = tt::ones({3}).requires_grad_();
  tt::Tensor snapshot = w.detach();
  tt::Tensor loss = w.pow(2).sum(); // pow saves w for backward
  snapshot.mul_(0.5);               // also halves w
  loss.backward();
  std::printf("grad %.1f\n", w.grad().sum().item<float>());
  return 0;
}
