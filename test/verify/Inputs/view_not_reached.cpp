#include <tt/tt.h>
#include <cstdio>
tt::Tensor flattenT(const tt::Tensor &x) { return x.t().view({-1}); }
int main(int argc, char **) {
  tt::Tensor x = tt::ones({2, 3});
  if (argc > 1) // only with an argument
    x = flattenT(x);
  std::printf("numel %ld\n", (long)x.numel());
  return 0;
}
