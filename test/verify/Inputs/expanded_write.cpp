#include <tt/tt.h>
int main() {
  tt::Tensor x = tt::ones({4, 3});
  auto bias = tt::zeros({3}).expand_as(x);
  bias.add_(1);
  return (x + bias).sum().item<float>() == 24 ? 0 : 1;
}
