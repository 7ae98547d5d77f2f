#include <tt/tt.h>
#include <cstdio>
// This code base bans contiguous() (say, by review rule): a fix-it that introduces it
// cannot compile here.
#pragma GCC poison contiguous
int main() {
  tt::Tensor x = tt::arange(12, tt::kFloat).view({3, 4});
  tt::Tensor y = x.t().view({-1});
  std::printf("sum %.1f\n", y.sum().item<float>());
  return 0;
}
