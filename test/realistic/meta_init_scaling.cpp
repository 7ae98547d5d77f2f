// Initialises a transformer-style feed-forward block by hand.
#include <torch/torch.h>
#include <cmath>

struct FeedForward : torch::nn::Module {
  FeedForward(int64_t d, int64_t hidden) {
    up = register_module("up", torch::nn::Linear(d, hidden));
    down = register_module("down", torch::nn::Linear(hidden, d));
    gain = register_parameter("gain", torch::ones({d}));
  }
  torch::Tensor forward(torch::Tensor x) { return down(torch::gelu(up(x))) * gain; }
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::Tensor gain;
};

void init_block(FeedForward &ff, int layers) {
  torch::nn::init::normal_(ff.up->weight, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
  torch::nn::init::normal_(ff.down->weight, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
  // FACT: l = torch.nn.Linear(2, 2); assert raises(lambda: l.weight.div_(2.0), "leaf Variable that requires grad")
  ff.down->weight.div_(std::sqrt(2.0 * layers)); // EXPECT: tensor-inplace-on-leaf
  {
    torch::NoGradGuard ng;
    ff.up->bias.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  // FACT: l = torch.nn.Linear(2, 2); assert raises(lambda: l.bias.fill_(0.0), "leaf Variable that requires grad")
  ff.down->bias.fill_(0.0); // EXPECT: tensor-inplace-on-leaf
  // FACT: g = torch.nn.Parameter(torch.ones(2)); g.detach().fill_(1.0)
  ff.gain.detach().fill_(1.0); // LOOKALIKE: tensor-inplace-on-leaf -- detach() is not the leaf
}

int main() {
  FeedForward ff(32, 128);
  init_block(ff, 12);
  auto y = ff.forward(torch::randn({4, 32}));
  y.pow(2).mean().backward();
}
