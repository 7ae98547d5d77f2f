// A per-feature bias broadcast over the batch, adjusted in place.
//
// expand_as gives every row of the batch the same memory for the bias: the
// adjustment `bias.add_(...)` would write one element through many rows, and
// PyTorch (and the runtime) reject it: "more than one element of the
// written-to tensor refers to a single memory location".
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(3);
  tt::Tensor x = tt::randn({8, 16});
  tt::Tensor b = tt::zeros({16});

  auto bias = b.expand_as(x);
  bias.add_(0.5);
  tt::Tensor y = (x + bias).relu();
  std::printf("output mean %.5f\n", y.mean().item<float>());
  return 0;
}
