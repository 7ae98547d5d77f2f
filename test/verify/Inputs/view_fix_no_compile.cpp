#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor x = tt::ones({4, 4});
  // view(dtype) has no reshape counterpart: the fix-it cannot compile.
  tt::Tensor y = x.t().view(tt::kFloat);
  std::printf("%ld\n", (long)y.numel());
  return 0;
}
