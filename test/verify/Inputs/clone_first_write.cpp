#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Tensor x = tt::ones({16, 16});
  float s = 0;
  for (int i = 0; i < 5; ++i) {
    tt::Tensor b = x.mul(i);
    tt::Tensor y = b.clone();
    y.add_(1);
    tt::Tensor z = b.clone();
    s += y.sum().item<float>() + z.mean().item<float>();
  }
  std::printf("%.1f\n", s);
  return 0;
}
