// Reporting with data_ptr and operator<<: a centring step writes through a
// handle copy of the scores; the printed table and tensor show the change.
#include <tt/tt.h>

#include <cstdio>
#include <iostream>

int main() {
  tt::manual_seed(8);
  tt::Tensor scores = tt::rand({3, 4}).mul(10.0);
  tt::Tensor centred = scores; // meant as a copy
  centred -= scores.mean();
  const float *p = scores.data_ptr<float>();
  for (int i = 0; i < 4; ++i)
    std::printf("score[%d] = %.3f\n", i, p[i]);
  std::cout << "row sums\n" << scores.sum({1}) << "\n";
  std::printf("centred mean %.3f\n", centred.mean().item<float>());
  return 0;
}
