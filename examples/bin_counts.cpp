// Bucketing scores into integer bins with copy_.
//
// The scores are computed in float64 and scaled to bin numbers; copy_ into
// the int64 bin buffer converts them silently, truncating toward zero, so a
// score of 2.97 lands in bin 2. PyTorch does the same conversion and says
// nothing.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(3);
  tt::Tensor scores = tt::rand({1000}, tt::kDouble).mul(10.0);
  tt::Tensor bins = tt::zeros({1000}, tt::kLong);
  bins.copy_(scores); // float64 -> int64: fractions dropped
  std::printf("sum of scores %.3f, sum of bins %lld\n", scores.sum().item<double>(),
              static_cast<long long>(bins.sum().item<std::int64_t>()));
  return 0;
}
