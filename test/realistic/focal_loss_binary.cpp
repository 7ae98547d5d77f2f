// Binary focal loss for a detector's objectness head.
#include <torch/torch.h>

torch::Tensor focal_loss(const torch::Tensor &logits, const torch::Tensor &targets, double gamma) {
  auto p = torch::sigmoid(logits);
  auto pt = p * targets + (1 - p) * (1 - targets);
  auto w = (1 - pt).pow(gamma);
  return (-w * torch::log(pt.clamp_min(1e-6))).mean();
}

struct Objectness : torch::nn::Module {
  Objectness() { conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 1, 1))); }
  torch::Tensor forward(torch::Tensor f) { return conv(f).flatten(1); }
  torch::nn::Conv2d conv{nullptr};
};

int main() {
  Objectness head;
  torch::optim::SGD opt(head.parameters(), 0.01);
  for (int it = 0; it < 5; ++it) {
    auto feats = torch::randn({2, 8, 10, 10});
    auto targets = (torch::rand({2, 100}) > 0.9).to(torch::kFloat);
    auto logits = head.forward(feats);
    auto probs = torch::sigmoid(logits);
    // FACT: x = torch.randn(5, requires_grad=True) * 1; assert backward_fails(lambda: (lambda p: (p.clamp_(1e-4, 1 - 1e-4), p.sum().backward()))(torch.sigmoid(x)))
    probs.clamp_(1e-4, 1.0 - 1e-4); // EXPECT: tensor-inplace-on-saved
    auto loss = torch::binary_cross_entropy(probs, targets);
    loss = loss + focal_loss(logits, targets, 2.0);
    opt.zero_grad();
    loss.backward();
    opt.step();
    targets.mul_(0.9); // LOOKALIKE: tensor-inplace-on-saved -- written after backward, a new graph each step
  }
}
