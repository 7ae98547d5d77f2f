// Training-time augmentation of [C, H, W] images: random flip, brightness and contrast jitter.
#include <torch/torch.h>

struct JitterConfig {
  double brightness = 0.2;
  double contrast = 0.2;
  bool hflip = true;
};

torch::Tensor random_flip(const torch::Tensor &img, bool do_flip) {
  return do_flip ? img.flip({2}) : img;
}

torch::Tensor color_jitter(const torch::Tensor &img, const JitterConfig &cfg) {
  auto b = 1.0 + (torch::rand({1}).item<double>() * 2 - 1) * cfg.brightness;
  auto c = 1.0 + (torch::rand({1}).item<double>() * 2 - 1) * cfg.contrast;
  auto out = img.mul(b);
  auto mean = out.mean();
  // FACT: img = torch.rand(3, 4, 5); out = img.mul(1.1); out.sub_(0.5); assert is_copy_of(out, img)
  out.sub_(mean).mul_(c).add_(mean); // LOOKALIKE: tensor-alias-then-mutate -- mul() allocated a new tensor
  return out.clamp_(0, 1);
}

torch::Tensor augment(const torch::Tensor &img, const JitterConfig &cfg) {
  torch::Tensor out = img;
  if (cfg.hflip && torch::rand({1}).item<double>() < 0.5)
    out = out.flip({2});
  // FACT: img = torch.rand(3, 4, 5); out = img; out.mul_(2); assert shares_storage(out, img) and img.max() > 1
  out.mul_(torch::rand({1}) * 0.4 + 0.8); // EXPECT: tensor-alias-then-mutate
  return out;
}
