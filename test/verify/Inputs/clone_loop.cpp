#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor mask = tt::ones({16, 16});
  tt::Tensor x = tt::full({16, 16}, 2.0);
  double acc = 0;
  for (int i = 0; i < 10; ++i) {
    tt::Tensor m = mask.clone(); // the same copy every iteration
    acc += x.mul(m).sum().item<float>();
  }
  std::printf("%.1f\n", acc);
  return 0;
}
