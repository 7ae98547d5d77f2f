#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor a = tt::ones({4});
  tt::Tensor b = a;
  b.add_(1);
  std::printf("%.1f\n", a.sum().item<float>());
  return 0;
}
