// A small training loop: a helper scales its batch through a handle copy, so
// the dataset shrinks every epoch; an SGD step under no-grad updates the
// weights from .grad(). Every later loss, gradient and weight is computed
// from the write: the fix's differences are all explained by it.
#include <tt/tt.h>

#include <cstdio>

tt::Tensor scaled(tt::Tensor batch) {
  tt::Tensor s = batch; // meant as a copy
  s.mul_(0.5);
  return s;
}

int main() {
  tt::manual_seed(6);
  tt::Tensor data = tt::randn({32, 4});
  tt::Tensor target = data.sum({1}, /*keepdim=*/true);
  tt::Tensor w = tt::zeros({4, 1}).requires_grad_();
  const double lr = 0.05;
  for (int epoch = 0; epoch < 4; ++epoch) {
    tt::Tensor x = scaled(data);
    tt::Tensor loss = (x.matmul(w) - target).pow(2).mean();
    loss.backward();
    {
      tt::NoGradGuard no_grad;
      w.sub_(w.grad().mul(lr));
      w.mutable_grad().zero_();
    }
    std::printf("epoch %d loss %.5f\n", epoch, loss.item<float>());
  }
  std::printf("data energy %.4f\n", data.pow(2).sum().item<float>());
  return 0;
}
