#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor a = tt::ones({4});
  const tt::Tensor b = a; // a const handle: the out-of-place fix cannot assign to it
  b.add_(1);
  std::printf("%.1f\n", a.sum().item<float>());
  return 0;
}
