// A training loop that clones a constant mask every step.
//
// The dropout-style keep mask is fixed for the whole run, yet each step makes
// a fresh clone of it before use: one allocation and one full copy per step,
// for data that never changes.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(5);
  tt::Tensor keep = tt::rand({128, 128}).gt(0.1).to(tt::kFloat); // fixed keep mask
  tt::Tensor w = tt::randn({128, 128}).mul(0.05);
  double acc = 0;
  for (int step = 0; step < 200; ++step) {
    tt::Tensor x = tt::randn({128, 128});
    tt::Tensor m = keep.clone(); // same values every step
    tt::Tensor y = x.mul(m).mm(w);
    acc += y.mean().item<float>();
  }
  std::printf("mean output over 200 steps: %.6f\n", acc / 200);
  return 0;
}
