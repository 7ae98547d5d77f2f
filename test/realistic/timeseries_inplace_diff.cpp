// Preprocessing for a forecasting model: first differences and lag features.
#include <torch/torch.h>

torch::Tensor diff_inplace(torch::Tensor x) {
  // x: [T, F]; x[t] -= x[t-1], computed in place to save memory
  // FACT: x = torch.rand(6, 2); assert raises(lambda: x[1:].sub_(x[:-1]), "some elements of the input tensor and the written-to tensor")
  x.slice(0, 1).sub_(x.slice(0, 0, -1)); // EXPECT: tensor-inplace-overlap
  return x.slice(0, 1);
}

torch::Tensor diff(const torch::Tensor &x) {
  // FACT: x = torch.rand(6, 2); assert not raises(lambda: x[1:] - x[:-1])
  return x.slice(0, 1) - x.slice(0, 0, -1);
}

torch::Tensor lag_features(const torch::Tensor &series, int64_t lags) {
  auto T = series.size(0);
  auto out = torch::zeros({T, lags});
  for (int64_t l = 0; l < lags; ++l)
    out.select(1, l).narrow(0, l + 1, T - l - 1).copy_(series.narrow(0, 0, T - l - 1)); // LOOKALIKE: tensor-inplace-overlap -- out and series are different tensors
  return out;
}

void smooth_channels(torch::Tensor frames) {
  // frames: [B, T, C]; each step averaged with the previous one, along time
  auto T = frames.size(1);
  // FACT: f = torch.rand(2, 5, 3); assert not raises(lambda: f.narrow(1, 1, 4).add_(f.narrow(1, 0, 4)))
  frames.narrow(1, 1, T - 1).add_(frames.narrow(1, 0, T - 1)).mul_(0.5); // EXPECT: tensor-inplace-overlap
}

void halves(torch::Tensor buf) {
  auto n = buf.size(0);
  // FACT: b = torch.rand(8); assert not raises(lambda: b.narrow(0, 0, 4).add_(b.narrow(0, 4, 4)))
  buf.narrow(0, 0, n / 2).add_(buf.narrow(0, n / 2, n / 2)); // LOOKALIKE: tensor-inplace-overlap -- the halves are disjoint
}
