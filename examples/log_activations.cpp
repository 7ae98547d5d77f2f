// Logging detached activations, normalised in place for the histogram.
//
// `logged = hidden.detach()` shares storage with `hidden`; dividing it in
// place for the activation log also rescales `hidden`, and the classifier's
// logits are computed from the rescaled activations. Nothing requires grad in
// this evaluation pass, so no error is raised: the predictions are silently
// wrong.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(3);
  tt::Tensor w1 = tt::randn({32, 64}).mul(0.2);
  tt::Tensor w2 = tt::randn({64, 5}).mul(0.2);
  tt::Tensor batch = tt::randn({16, 32});

  tt::Tensor hidden = batch.mm(w1).relu();
  tt::Tensor logged = hidden.detach(); // for the activation histogram
  logged.div_(logged.max());           // scale to [0, 1] for the log
  std::printf("activation histogram: mean %.4f of max\n", logged.mean().item<float>());

  tt::Tensor logits = hidden.mm(w2);
  std::printf("logit scale %.4f\n", logits.abs().mean().item<float>());
  std::printf("top class of sample 0: %ld\n", (long)logits[0].argmax().item<std::int64_t>());
  return 0;
}
