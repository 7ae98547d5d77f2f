// A gated feature extractor for audio frames.
#include <torch/torch.h>

struct GatedFeatures : torch::nn::Module {
  GatedFeatures(int64_t in, int64_t hidden) {
    value = register_module("value", torch::nn::Linear(in, hidden));
    gate = register_module("gate", torch::nn::Linear(in, hidden));
    proj = register_module("proj", torch::nn::Linear(hidden, 4));
  }
  torch::Tensor forward(torch::Tensor frames) {
    auto v = value(frames);
    auto g = torch::sigmoid(gate(frames));
    auto h = v * g;
    // FACT: v = torch.randn(3, requires_grad=True) * 1; g = torch.sigmoid(torch.randn(3, requires_grad=True)); h = v * g; g.mul_(2); assert backward_fails(lambda: h.sum().backward())
    g.mul_(2.0); // EXPECT: tensor-inplace-on-saved
    auto t = torch::tanh(proj(h));
    return t;
  }
  torch::nn::Linear value{nullptr}, gate{nullptr}, proj{nullptr};
};

torch::Tensor scaled_output(GatedFeatures &model, const torch::Tensor &frames) {
  auto t = model.forward(frames);
  // FACT: x = torch.randn(3, requires_grad=True) * 1; assert backward_fails(lambda: (lambda t: (t.mul_(0.5), t.sum().backward()))(torch.tanh(x)))
  t.mul_(0.5); // EXPECT: tensor-inplace-on-saved
  return t;
}

int main() {
  GatedFeatures model(40, 32);
  auto frames = torch::randn({10, 40});
  auto y = scaled_output(model, frames);
  auto feats = model.forward(frames).detach();
  feats.mul_(0.5); // LOOKALIKE: tensor-inplace-on-saved -- a detached result is not what tanh saved for a later backward
  y.sum().backward();
}
