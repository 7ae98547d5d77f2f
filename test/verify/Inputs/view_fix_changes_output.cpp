#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor x = tt::ones({4, 4});
  tt::Tensor y;
  try {
    y = x.t().view({-1});
    std::printf("fast path\n");
  } catch (const std::exception &) {
    std::printf("fallback path\n"); // the program relies on the throw
    y = x.t().contiguous().view({-1});
  }
  std::printf("numel %ld\n", (long)y.numel());
  return 0;
}
