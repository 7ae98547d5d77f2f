#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor x = tt::ones({4, 4});
  volatile bool spin = true;
  while (spin) { // never ends
  }
  tt::Tensor y = x.t().view({-1});
  std::printf("%ld\n", (long)y.numel());
  return 0;
}
