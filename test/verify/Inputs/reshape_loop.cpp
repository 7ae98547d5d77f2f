#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor x = tt::ones({8, 16});
  double total = 0;
  for (int i = 0; i < 5; ++i) {
    tt::Tensor flat = x.t().reshape({-1}); // an implicit copy every iteration
    total += flat.sum().item<float>();
  }
  std::printf("%.1f\n", total);
  return 0;
}
