// Contrastive head with a learnable temperature, clamped after each step.
#include <torch/torch.h>
#include <cmath>

struct ContrastiveHead : torch::nn::Module {
  ContrastiveHead(int64_t dim) {
    proj = register_module("proj", torch::nn::Linear(dim, 32));
    logit_scale = register_parameter("logit_scale", torch::full({1}, std::log(1 / 0.07)));
  }
  torch::Tensor forward(const torch::Tensor &a, const torch::Tensor &b) {
    auto za = torch::nn::functional::normalize(proj(a), torch::nn::functional::NormalizeFuncOptions().dim(1));
    auto zb = torch::nn::functional::normalize(proj(b), torch::nn::functional::NormalizeFuncOptions().dim(1));
    return logit_scale.exp() * za.matmul(zb.t());
  }
  void clamp_scale() {
    // FACT: s = torch.nn.Parameter(torch.ones(1)); assert raises(lambda: s.clamp_(0, 4.6), "leaf Variable that requires grad")
    logit_scale.clamp_(0, 4.6052); // EXPECT: tensor-inplace-on-leaf
  }
  void clamp_scale_safely() {
    torch::NoGradGuard no_grad;
    logit_scale.clamp_(0, 4.6052); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  torch::nn::Linear proj{nullptr};
  torch::Tensor logit_scale;
};

int main() {
  ContrastiveHead head(64);
  torch::optim::SGD opt(head.parameters(), 0.1);
  auto w0 = torch::randn({64, 64}, torch::requires_grad());
  // FACT: w = torch.randn(3, requires_grad=True); assert raises(lambda: w.mul_(0.01), "leaf Variable that requires grad")
  w0.mul_(0.01); // EXPECT: tensor-inplace-on-leaf
  for (int step = 0; step < 5; ++step) {
    auto a = torch::randn({8, 64}).matmul(w0);
    auto b = torch::randn({8, 64});
    auto logits = head.forward(a, b);
    auto loss = torch::nn::functional::cross_entropy(logits, torch::arange(8));
    opt.zero_grad();
    loss.backward();
    opt.step();
    head.clamp_scale_safely();
  }
  auto fresh = torch::zeros({4});
  fresh.add_(1); // LOOKALIKE: tensor-inplace-on-leaf -- does not require grad
}
