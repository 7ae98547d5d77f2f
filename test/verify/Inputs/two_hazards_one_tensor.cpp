// Variant: two hazards on one tensor, each through its own handle copy, each
// with its own fix: each fix is judged on a program with that fix alone.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(5);
  tt::Tensor w = tt::randn({4, 4}).requires_grad_();
  tt::Tensor base = tt::randn({4, 4});
  tt::Tensor a = base; // handle copy: meant as a copy to shift
  a.add_(1.0);
  tt::Tensor b = base; // handle copy: meant as a copy to double
  b.mul_(2.0);
  std::printf("a %.4f b %.4f base %.4f\n", a.sum().item<float>(), b.sum().item<float>(),
              base.sum().item<float>());
  tt::Tensor loss = (a.matmul(w) + b.matmul(w)).pow(2).mean();
  loss.backward();
  std::printf("grad %.4f\n", w.grad().abs().sum().item<float>());
  return 0;
}
