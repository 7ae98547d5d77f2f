// permute + flatten before a linear layer: a hidden copy every step.
//
// Channels-last head: NCHW features are permuted to NHWC and flattened for
// the classifier. After permute the tensor is not contiguous, so flatten
// cannot be a view: it silently copies the whole feature map, every step.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(4);
  const std::int64_t N = 16, C = 32, H = 8, W = 8;
  tt::Tensor head = tt::randn({H * W * C, 10}).mul(0.01);
  double total = 0;
  for (int step = 0; step < 20; ++step) {
    tt::Tensor feats = tt::randn({N, C, H, W}); // stand-in for the backbone's output
    tt::Tensor nhwc = feats.permute({0, 2, 3, 1});
    tt::Tensor flat = nhwc.flatten(1); // [N, H*W*C]
    tt::Tensor logits = flat.mm(head);
    total += logits.abs().mean().item<float>();
  }
  std::printf("mean |logit| over 20 steps: %.5f\n", total / 20);
  return 0;
}
