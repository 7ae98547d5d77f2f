// Feature normalisation with -= and /= through a handle copy.
//
// `normed` starts as a handle copy of `features`, so the in-place `-=` and
// `/=` standardise `features` too. The raw-range report printed afterwards
// then describes normalised data, and any later use of the raw features
// (here: the un-normalised baseline) is silently wrong.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(1);
  tt::Tensor features = tt::randn({256, 16}).mul(3.0).add(5.0); // raw sensor features
  tt::Tensor mean = features.mean({0}, /*keepdim=*/true);
  tt::Tensor stdev = (features - mean).pow(2).mean({0}, true).sqrt().add(1e-6);

  tt::Tensor normed = features;
  normed -= mean;
  normed /= stdev;

  std::printf("raw range        [%.3f, %.3f]\n", features.min().item<float>(), features.max().item<float>());
  std::printf("normalised mean  %.4f\n", normed.mean().item<float>());
  std::printf("baseline energy  %.3f\n", features.pow(2).mean().item<float>());
  return 0;
}
