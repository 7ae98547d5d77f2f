// Multi-head attention as users write it: heads merged with reshape after a
// transpose (an implicit copy), a scratch mask cloned every step, and the
// scores scaled through a handle copy before the softmax reads them.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(9);
  const int64_t B = 2, T = 4, H = 2, D = 3;
  tt::Tensor x = tt::randn({B, T, H * D});
  tt::Tensor wq = tt::randn({H * D, H * D}).mul(0.2).requires_grad_();
  tt::Tensor mask = tt::ones({T, T}).mul(0.5);
  float total = 0;
  for (int step = 0; step < 3; ++step) {
    tt::Tensor m = mask.clone(); // the same mask every step
    tt::Tensor q = x.matmul(wq).view({B, T, H, D}).transpose(1, 2);
    tt::Tensor scores = q.matmul(q.transpose(2, 3));
    tt::Tensor scaled = scores; // meant as a copy
    scaled.mul_(0.5);
    tt::Tensor att = scores.exp().mul(m);
    tt::Tensor merged = att.matmul(q).transpose(1, 2).reshape({B, T, H * D});
    tt::Tensor loss = merged.pow(2).mean();
    loss.backward();
    total += loss.item<float>();
  }
  std::printf("total loss %.4f grad %.4f\n", total, wq.grad().abs().sum().item<float>());
  return 0;
}
