#include <tt/tt.h>
#include <cstdio>
tt::Tensor flatTransposed() {
  tt::Tensor x = tt::ones({2, 3});
  return x.t().view({-1});
}
int main(int argc, char **) {
  long n = 6;
  if (argc > 1) // only with an argument
    n = flatTransposed().numel();
  std::printf("numel %ld\n", n);
  return 0;
}
