#include <tt/tt.h>
#include <iostream>

int main() {
  tt::Tensor t = tt::full({2, 2}, 1.5);
  std::cout << "numel=" << t.numel() << " first=" << t.data_ptr<float>()[0] << "\n";
  return 0;
}
