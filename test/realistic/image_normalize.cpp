// Image pre-processing helpers shared by the training and serving binaries.
#include <torch/torch.h>
#include <vector>

// Per-channel normalisation of a [C, H, W] float image.
torch::Tensor normalize_image(const torch::Tensor &image, const std::vector<double> &mean,
                              const std::vector<double> &stdev) {
  auto m = torch::tensor(mean).view({-1, 1, 1}).to(torch::kFloat);
  auto s = torch::tensor(stdev).view({-1, 1, 1}).to(torch::kFloat);
  torch::Tensor out = image;
  // FACT: img = torch.rand(3, 4, 5); out = img; out -= 0.5; assert shares_storage(out, img) and img.max() < 0.5
  out -= m; // EXPECT: tensor-alias-then-mutate
  out /= s; // EXPECT: tensor-alias-then-mutate
  return out;
}

// The same, written without the hazard.
torch::Tensor normalize_image_copy(const torch::Tensor &image, const torch::Tensor &m,
                                   const torch::Tensor &s) {
  auto out = image.clone(); // EXPECT: tensor-unnecessary-clone
  // FACT: img = torch.rand(3, 4, 5); out = img.clone(); out -= 0.5; assert is_copy_of(out, img) and img.min() >= 0
  out.sub_(m); // LOOKALIKE: tensor-alias-then-mutate -- clone() made an independent copy
  out.div_(s);
  return out;
}

// uint8 HWC frame from the camera -> float CHW in [0, 1].
torch::Tensor frame_to_input(const torch::Tensor &frame_u8) {
  TORCH_CHECK(frame_u8.scalar_type() == torch::kByte, "expected a uint8 frame");
  auto f = frame_u8.permute({2, 0, 1}).to(torch::kFloat);
  // FACT: fr = torch.zeros(4, 5, 3, dtype=torch.uint8); assert is_copy_of(fr.permute(2, 0, 1).to(torch.float32), fr)
  f.div_(255.0); // LOOKALIKE: tensor-alias-then-mutate -- uint8 -> float32 is a real conversion
  return f;
}
