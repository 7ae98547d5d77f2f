// A training-style loop that reads the loss back to the host every step.
//
// The loss lives on the GPU (when there is one); `loss.item<double>()` copies
// it to the host and waits for every queued kernel, every step, only to add it
// to a running total that is printed once at the end. Summing on the device
// and reading once after the loop lets the GPU run ahead.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(3);
  tt::Device device = tt::cuda::is_available() ? tt::kCUDA : tt::kCPU;
  tt::Tensor w = tt::randn({64, 64}).mul(0.1).to(device);
  double running = 0;
  for (int step = 0; step < 100; ++step) {
    tt::Tensor x = tt::randn({32, 64}).to(device);
    tt::Tensor loss = x.mm(w).pow(2).mean();
    running += loss.item<double>(); // a device-to-host wait per step
  }
  std::printf("mean loss over 100 steps: %.5f\n", running / 100);
  return 0;
}
