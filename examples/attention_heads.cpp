// Merging attention heads with view after transpose.
//
// Attention output is [batch, heads, tokens, dim]; merging the heads needs
// [batch, tokens, heads * dim]. After transpose(1, 2) the tensor is not
// contiguous and view() cannot express the merge: it throws at run time.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(8);
  const std::int64_t B = 2, Hd = 4, T = 6, D = 8;
  tt::Tensor ctx = tt::randn({B, Hd, T, D});
  tt::Tensor w_out = tt::randn({Hd * D, Hd * D}).mul(0.1);

  tt::Tensor merged = ctx.transpose(1, 2).view({B, T, Hd * D});
  tt::Tensor out = merged.matmul(w_out);
  std::printf("output mean %.5f\n", out.mean().item<float>());
  return 0;
}
