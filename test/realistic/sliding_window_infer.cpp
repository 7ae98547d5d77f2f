// Sliding-window inference for large images: tiles are run through the model and blended.
#include <torch/torch.h>

torch::Tensor sliding_window(torch::nn::Sequential &model, const torch::Tensor &image, int64_t tile,
                             int64_t stride, int64_t out_ch) {
  torch::NoGradGuard no_grad;
  auto H = image.size(1), W = image.size(2);
  auto out = torch::zeros({out_ch, H, W});
  auto weight = torch::zeros({1, H, W});
  auto window = torch::hann_window(tile).outer(torch::hann_window(tile)) + 1e-3;
  for (int64_t y = 0; y + tile <= H; y += stride) {
    for (int64_t x = 0; x + tile <= W; x += stride) {
      auto crop = image.narrow(1, y, tile).narrow(2, x, tile).contiguous(); // LOOKALIKE: tensor-clone-in-loop -- the crop moves with y and x
      auto pred = model->forward(crop.unsqueeze(0)).squeeze(0);
      auto w = window.clone(); // EXPECT: tensor-clone-in-loop
      out.narrow(1, y, tile).narrow(2, x, tile).add_(pred * w);
      weight.narrow(1, y, tile).narrow(2, x, tile).add_(w);
    }
  }
  return out / weight.clamp_min(1e-6);
}
