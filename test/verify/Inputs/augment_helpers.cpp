// Data augmentation helpers that take a batch by value and write through
// a handle copy: flip-free jitter and brightness, each changing the
// caller's clean batch; the clean statistics printed afterwards are wrong.
#include <tt/tt.h>

#include <cstdio>

tt::Tensor jitter(tt::Tensor batch, double amount) {
  tt::Tensor out = batch;
  out.add_(amount);
  return out;
}

tt::Tensor brighten(tt::Tensor batch, double factor) {
  tt::Tensor out = batch;
  out.mul_(factor);
  return out;
}

int main() {
  tt::manual_seed(11);
  tt::Tensor clean = tt::rand({4, 8});
  tt::Tensor a = jitter(clean, 0.1);
  std::printf("jittered mean %.4f\n", a.mean().item<float>());
  tt::Tensor b = brighten(clean, 1.5);
  std::printf("brightened mean %.4f\n", b.mean().item<float>());
  std::printf("clean mean %.4f\n", clean.mean().item<float>());
  return 0;
}
