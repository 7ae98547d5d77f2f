// Target-network (EMA) update through a detached handle.
//
// `target = online.detach()` shares storage and the version counter with the
// online weights; it is not a snapshot. The EMA update `target.mul_(...)`
// therefore rewrites `online` between the forward pass and backward(), and
// autograd refuses: "one of the variables needed for gradient computation has
// been modified by an inplace operation". Fix: online.detach().clone().
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(2);
  tt::Tensor online = tt::randn({16, 4}).mul(0.1).requires_grad_();
  tt::Tensor target = online.detach(); // meant as the target network's own weights
  const double decay = 0.99;

  for (int step = 0; step < 5; ++step) {
    tt::Tensor x = tt::randn({8, 16});
    tt::Tensor q = x.mm(online);
    tt::Tensor q_target = x.mm(target);
    tt::Tensor decay_term = online.pow(2).sum().mul(1e-3); // weight decay: pow saves `online`
    tt::Tensor loss = (q - q_target).pow(2).mean() + decay_term;

    target.mul_(decay); // EMA: target = decay * target + (1 - decay) * online
    target.add_(online.detach(), 1.0 - decay);

    loss.backward();
    std::printf("step %d loss %.5f grad norm %.5f\n", step, loss.item<float>(),
                online.grad().pow(2).sum().sqrt().item<float>());
    online.mutable_grad().zero_();
  }
  return 0;
}
