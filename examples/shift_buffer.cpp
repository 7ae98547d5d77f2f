// A history buffer of the last k observations, oldest first.
//
// Shifting the rows up by one with copy_ between two overlapping slices of
// the same buffer: PyTorch (and the runtime) reject it ("some elements of the
// input tensor and the written-to tensor refer to a single memory location").
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(5);
  const std::int64_t k = 4, d = 3;
  tt::Tensor history = tt::zeros({k, d});
  for (int step = 0; step < 6; ++step) {
    tt::Tensor obs = tt::randn({d});
    std::int64_t n = history.size(0);
    history.narrow(0, 0, n - 1).copy_(history.narrow(0, 1, n - 1));
    history[n - 1].copy_(obs);
  }
  std::printf("history mean %.5f\n", history.mean().item<float>());
  return 0;
}
