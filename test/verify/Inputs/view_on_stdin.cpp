#include <tt/tt.h>
#include <cstdio>
#include <iostream>
#include <string>
int main() {
  std::string mode;
  std::cin >> mode; // the flagged line runs only when stdin says so
  tt::Tensor x = tt::ones({2, 3});
  if (mode == "flat")
    x = x.t().view({-1});
  std::printf("numel %ld\n", (long)x.numel());
  return 0;
}
