// A residual MLP block for tabular data, trained with Adam.
#include <torch/torch.h>

struct ResidualBlock : torch::nn::Module {
  ResidualBlock(int64_t d) {
    fc1 = register_module("fc1", torch::nn::Linear(d, d));
    fc2 = register_module("fc2", torch::nn::Linear(d, d));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto identity = x;
    auto out = torch::relu(fc1(norm(x)));
    out = fc2(out);
    out += identity; // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    return out;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

struct GatedBlock : torch::nn::Module {
  GatedBlock(int64_t d) {
    fc = register_module("fc", torch::nn::Linear(d, d));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(fc(x));
    // FACT: fc = torch.nn.Linear(3, 3); x = torch.randn(2, 3); assert backward_fails(lambda: (lambda h: (h.add_(x), h.sum().backward()))(torch.relu(fc(x))))
    h += x; // EXPECT: tensor-inplace-on-saved
    return h;
  }
  torch::nn::Linear fc{nullptr};
};

int main() {
  ResidualBlock block(16);
  GatedBlock gated(16);
  torch::optim::Adam opt(block.parameters(), 1e-3);
  for (int step = 0; step < 10; ++step) {
    auto x = torch::randn({32, 16});
    auto y = torch::randn({32, 16});
    auto loss = torch::mse_loss(block.forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  auto z = gated.forward(torch::randn({4, 16}));
  (void)z;
}
