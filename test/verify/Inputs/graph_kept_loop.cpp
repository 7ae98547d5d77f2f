#include <tt/tt.h>
#include <cstdio>
#include <vector>
int main() {
  tt::manual_seed(3);
  tt::Tensor w = tt::randn({32, 4}, tt::requires_grad());
  std::vector<tt::Tensor> losses;
  for (int i = 0; i < 8; ++i) {
    tt::Tensor loss = tt::randn({16, 32}).matmul(w).tanh().pow(2).mean();
    loss.backward();
    losses.push_back(loss);
  }
  std::printf("%zu losses, first %.4f\n", losses.size(), losses[0].item<float>());
  return 0;
}
