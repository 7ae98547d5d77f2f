// A custom loss that keeps a "copy" of the predictions for its metrics.
//
// `kept = probs.contiguous()` returns `probs` itself when it is already
// contiguous, so clamping `probs` in place for a numerically safe log also
// clamps the predictions kept for the calibration metric.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(7);
  tt::Tensor logits = tt::randn({512}).mul(6.0);
  tt::Tensor labels = tt::rand({512}).gt(0.5).to(tt::kFloat);

  tt::Tensor probs = logits.sigmoid();
  tt::Tensor kept = probs.contiguous(); // predictions for the calibration metric
  probs.clamp_(0.05, 0.95);             // keep log() finite
  tt::Tensor bce = (labels * probs.log() + (1.0 - labels) * (1.0 - probs).log()).mean().neg();

  std::printf("loss %.4f\n", bce.item<float>());
  std::printf("calibration: mean confidence %.4f, max %.4f\n", kept.mean().item<float>(),
              kept.max().item<float>());
  return 0;
}
