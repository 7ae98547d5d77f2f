// Neural style transfer: Gram matrices of VGG feature maps, the target fixed for the whole run.
#include <torch/torch.h>
#include <vector>

torch::Tensor gram(const torch::Tensor &feat) {
  auto B = feat.size(0), C = feat.size(1);
  // FACT: f = torch.randn(2, 3, 4, 5); assert is_view_of(f.view(2, 3, -1), f)
  auto f = feat.view({B, C, -1}); // LOOKALIKE: tensor-view-non-contiguous -- conv features are contiguous
  return torch::bmm(f, f.transpose(1, 2)) / f.size(2);
}

torch::Tensor optimise(torch::nn::Sequential &vgg, const torch::Tensor &content, const torch::Tensor &style, int steps) {
  auto img = content.clone().set_requires_grad(true);
  torch::optim::LBFGS opt({img}, torch::optim::LBFGSOptions(1.0));
  torch::Tensor style_gram;
  {
    torch::NoGradGuard no_grad;
    style_gram = gram(vgg->forward(style));
  }
  for (int i = 0; i < steps; ++i) {
    auto closure = [&] {
      opt.zero_grad();
      auto target = style_gram.detach().clone(); // EXPECT: tensor-clone-in-loop
      auto loss = torch::mse_loss(gram(vgg->forward(img)), target);
      loss.backward();
      return loss;
    };
    opt.step(closure);
    {
      torch::NoGradGuard no_grad;
      img.clamp_(0, 1);
    }
  }
  return img.detach();
}
