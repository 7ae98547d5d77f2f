// A module's forward pass with a helper: the activation helper clamps
// through a handle copy, so the residual branch sees the clamped values.
#include <tt/tt.h>

#include <cstdio>

tt::Tensor activate(tt::Tensor pre) {
  tt::Tensor act = pre; // meant as a copy
  act.relu_();
  return act;
}

struct Block {
  tt::Tensor w, b;
  Block() : w(tt::randn({6, 6}).mul(0.3).requires_grad_()), b(tt::zeros({6}).requires_grad_()) {}
  tt::Tensor forward(const tt::Tensor &x) const {
    tt::Tensor pre = x.matmul(w) + b;
    tt::Tensor h = activate(pre);
    return h + pre; // residual over the pre-activation
  }
};

int main() {
  tt::manual_seed(7);
  Block block;
  tt::Tensor x = tt::randn({5, 6});
  tt::Tensor y = block.forward(x);
  tt::Tensor loss = y.pow(2).mean();
  loss.backward();
  std::printf("out mean %.4f\n", y.mean().item<float>());
  std::printf("w grad %.4f b grad %.4f\n", block.w.grad().abs().sum().item<float>(),
              block.b.grad().abs().sum().item<float>());
  return 0;
}
