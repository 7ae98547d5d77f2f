// The program of issue 12, as a new user wrote it: a per-channel normalize
// helper that writes through a handle copy of its parameter, then a detached
// "display copy" of the logits scaled in place before backward.
#include <tt/tt.h>

#include <cstdio>

tt::Tensor normalize(tt::Tensor batch) {
  tt::Tensor out = batch; // a handle copy: the writes below change the caller's tensor
  tt::Tensor mean = batch.mean({0}, /*keepdim=*/true);
  tt::Tensor stdev = (batch - mean).pow(2).mean({0}, true).sqrt().add(1e-5);
  out -= mean;
  out /= stdev;
  return out;
}

int main() {
  tt::manual_seed(0);
  tt::Tensor raw = tt::randn({16, 4}).mul(3.0).add(2.0);
  std::printf("batch sum before %.3f\n", raw.sum().item<float>());
  tt::Tensor x = normalize(raw);
  std::printf("batch sum after %.3f\n", raw.sum().item<float>());

  tt::Tensor w = tt::randn({4, 3}).requires_grad_();
  tt::Tensor logits = x.matmul(w);
  tt::Tensor shown = logits.detach();
  shown.mul_(10.0); // the display copy: scales logits in place
  std::printf("shown max %.3f\n", shown.max().item<float>());
  tt::Tensor loss = (logits * logits).sum();
  loss.backward();
  std::printf("grad norm %.3f\n", w.grad().pow(2).sum().item<float>());
  return 0;
}
