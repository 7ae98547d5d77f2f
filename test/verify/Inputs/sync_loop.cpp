#include <tt/tt.h>
#include <cstdio>
int main() {
  tt::Device device = tt::cuda::is_available() ? tt::kCUDA : tt::kCPU;
  tt::Tensor w = tt::ones({8, 8}).to(device);
  double running = 0;
  for (int step = 0; step < 10; ++step) {
    tt::Tensor loss = tt::randn({4, 8}).to(device).mm(w).mean();
    running += loss.item<double>();
  }
  std::printf("%.3f\n", running);
  return 0;
}
