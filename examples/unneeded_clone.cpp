// Batch standardisation that copies each batch before rewriting it.
//
// `out = batch.clone(); out.sub_(mean);` makes a full copy of the batch and
// then rewrites all of it in place: two passes over the data and the same
// allocation that the out-of-place `batch.sub(mean)` makes in one pass.
#include <tt/tt.h>

#include <cstdio>
#include <vector>

tt::Tensor centred(const tt::Tensor &batch, const tt::Tensor &mean) {
  tt::Tensor out = batch.clone();
  out.sub_(mean);
  return out;
}

int main() {
  tt::manual_seed(7);
  std::vector<tt::Tensor> batches;
  for (int i = 0; i < 40; ++i)
    batches.push_back(tt::randn({64, 32}));
  tt::Tensor mean = tt::randn({32}).mul(0.1);
  double total = 0;
  for (const auto &b : batches)
    total += centred(b, mean).abs().mean().item<float>();
  std::printf("mean |centred| over 40 batches: %.5f\n", total / 40);
  return 0;
}
