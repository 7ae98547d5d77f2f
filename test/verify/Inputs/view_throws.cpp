#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor x = tt::arange(12, tt::kFloat).reshape({3, 4});
  tt::Tensor y = x.t().view({-1});
  std::printf("sum %.1f\n", y.sum().item<float>());
  return 0;
}
