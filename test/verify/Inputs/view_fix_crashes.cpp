#include <tt/tt.h>
#include <cstdio>
#include <cstdlib>
int main() {
  tt::Tensor x = tt::ones({4, 4});
  tt::Tensor y = x.t().view({-1});
  if (y.numel() == 16) // only reached once the view works
    std::abort();
  return 0;
}
