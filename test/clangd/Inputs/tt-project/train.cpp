#include "tt/tt.h"

using tt::Tensor;

float use(const Tensor &t) { return t.sum().item<float>(); }

float total(const Tensor &mask, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) {
    auto m = mask.clone();
    s += use(m);
  }
  return s;
}

float flat() {
  auto c = tt::zeros({2, 3, 4}).transpose(0, 2).view({24});
  return use(c);
}
