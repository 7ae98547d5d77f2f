#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor h = tt::arange(12).to(tt::kFloat).view({3, 4});
  h.narrow(1, 1, 3).copy_(h.narrow(1, 0, 3));
  std::printf("%g\n", h.sum().item<float>());
  return 0;
}
