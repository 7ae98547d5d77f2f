// Per-step host-to-device transfer of data that never changes.
//
// Class weights are computed once, on the host, in double precision; the loop
// converts and moves them to the training device every step. On a GPU that is
// a synchronising host-to-device copy per step; on a CPU-only machine
// (cuda::is_available() is false, so the device is the CPU) the float64 ->
// float32 conversion still copies every step, so the hazard is real on both.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(6);
  const tt::Device device = tt::cuda::is_available() ? tt::Device(tt::kCUDA) : tt::Device(tt::kCPU);
  const std::int64_t classes = 1000;
  tt::Tensor counts = tt::arange(1, classes + 1, tt::kDouble).pow(-1.1).mul(1e6); // long-tailed label counts
  tt::Tensor class_weights = counts.sum().div(counts).div(double(classes)); // inverse frequency, on the host

  double total = 0;
  for (int step = 0; step < 100; ++step) {
    tt::Tensor probs = tt::rand({64, classes}, device);
    tt::Tensor w = class_weights.to(device, tt::kFloat); // every step: convert and transfer
    total += probs.mul(w).sum().item<float>();
  }
  std::printf("device %s, weighted mass per step %.4f\n", device.is_cuda() ? "cuda" : "cpu", total / 100);
  return 0;
}
