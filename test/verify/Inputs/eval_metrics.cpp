// An evaluation pass: predictions kept for display are a detached handle
// rounded in place; per-batch accuracy read with item() and printed.
#include <tt/tt.h>

#include <cstdio>

tt::Tensor predict(const tt::Tensor &x, const tt::Tensor &w) { return x.matmul(w).sigmoid(); }

int main() {
  tt::manual_seed(10);
  tt::Tensor w = tt::randn({5, 1}).requires_grad_();
  for (int batch = 0; batch < 3; ++batch) {
    tt::Tensor x = tt::randn({16, 5});
    tt::Tensor y = (x.sum({1}, true) > 0).to(tt::kFloat);
    tt::Tensor p = predict(x, w);
    tt::Tensor shown = p.detach();
    shown.mul_(100.0); // for display only: as a percentage
    tt::Tensor loss = (p - y).pow(2).mean();
    loss.backward();
    float acc = (shown > 50.0).to(tt::kFloat).eq(y).to(tt::kFloat).mean().item<float>();
    std::printf("batch %d loss %.4f acc %.3f\n", batch, loss.item<float>(), acc);
  }
  std::printf("grad %.4f\n", w.grad().abs().sum().item<float>());
  return 0;
}
