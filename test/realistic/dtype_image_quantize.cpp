// Exporting images: float images in [0, 1] written into uint8-like int buffers.
#include <torch/torch.h>

torch::Tensor to_pixels(const torch::Tensor &img) {
  auto px = torch::empty(img.sizes(), torch::kInt32);
  auto scaled = img.clamp(0, 1).mul(255.0);
  px.copy_(scaled); // EXPECT: tensor-copy-narrowing
  return px;
}

torch::Tensor to_pixels_rounded(const torch::Tensor &img) {
  auto px = torch::empty(img.sizes(), torch::kInt32);
  px.copy_(img.clamp(0, 1).mul(255.0).round().to(torch::kInt32)); // LOOKALIKE: tensor-copy-narrowing -- explicit conversion after rounding
  return px;
}

void write_tile(torch::Tensor &canvas, const torch::Tensor &tile, int64_t y, int64_t x) {
  using torch::indexing::Slice;
  canvas.index_put_({Slice(), Slice(y, y + tile.size(1)), Slice(x, x + tile.size(2))}, tile); // LOOKALIKE: tensor-copy-narrowing -- canvas dtype not shown
}

torch::Tensor depth_to_mm(int64_t h, int64_t w) {
  auto depth_m = torch::rand({h, w}, torch::kFloat64).mul(10.0);
  auto depth_mm = torch::zeros({h, w}, torch::kInt16);
  // FACT: d = torch.zeros(1, dtype=torch.int16); d.copy_(torch.tensor([1.2345], dtype=torch.float64) * 1000); assert d.item() == 1234
  depth_mm.copy_(depth_m * 1000.0); // EXPECT: tensor-copy-narrowing
  return depth_mm;
}
