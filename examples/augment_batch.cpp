// Batch augmentation that mutates the original batch.
//
// A contrastive-learning step wants two versions of each batch: the clean
// images and an augmented copy. `tt::Tensor augmented = images;` copies the
// handle, not the pixels, so the brightness jitter also darkens `images`, and
// the "clean" loss is computed on augmented data.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(0);
  tt::Tensor images = tt::rand({32, 3, 16, 16}); // one batch, values in [0, 1)
  tt::Tensor w = tt::randn({3 * 16 * 16, 10}).mul(0.01);

  tt::Tensor augmented = images; // meant as a copy for the augmented branch
  augmented.mul_(0.5);           // brightness jitter
  augmented.add_(0.25);          // re-centre

  tt::Tensor clean_logits = images.reshape({32, -1}).mm(w);
  tt::Tensor aug_logits = augmented.reshape({32, -1}).mm(w);
  std::printf("clean pixel mean     %.4f\n", images.mean().item<float>());
  std::printf("augmented pixel mean %.4f\n", augmented.mean().item<float>());
  std::printf("logit gap            %.4f\n", (clean_logits - aug_logits).abs().mean().item<float>());
  return 0;
}
