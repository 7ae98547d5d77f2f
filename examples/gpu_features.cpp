// Mixing host and device tensors in a feature transform.
//
// The projection matrix is moved to the GPU once; the per-batch features are
// made on the host and multiplied with it directly. PyTorch (and the tt
// runtime on a CUDA build) throws "Expected all tensors to be on the same
// device, but found at least two devices, cuda:0 and cpu!". Without a GPU the
// program cannot run at all: --verify reports the finding as not exercised.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(7);
  tt::Tensor proj = tt::randn({64, 16}).cuda();
  double total = 0;
  for (int step = 0; step < 4; ++step) {
    tt::Tensor feats = tt::randn({32, 64});
    tt::Tensor z = feats.matmul(proj); // feats is on the host
    total += z.sum().item<float>();
  }
  std::printf("projected sum %.4f\n", total);
  return 0;
}
