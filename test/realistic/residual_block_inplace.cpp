// ResNet basic block written with in-place activations to save memory.
#include <torch/torch.h>

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    c1_ = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    b1_ = register_module("b1", torch::nn::BatchNorm2d(out));
    c2_ = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    b2_ = register_module("b2", torch::nn::BatchNorm2d(out));
    if (stride != 1 || in != out)
      down_ = register_module("down", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto identity = x;
    auto out = b1_(c1_(x));
    // FACT: x = torch.randn(2, 3, 4, 4); o = torch.nn.BatchNorm2d(3)(x); assert is_copy_of(o, x)
    out.relu_(); // LOOKALIKE: tensor-alias-then-mutate -- batch norm output is a fresh tensor
    out = b2_(c2_(out));
    if (down_)
      identity = down_(x);
    // FACT: x = torch.randn(2, 3); i = x; o = x * 2; o += i; assert is_copy_of(o, x)
    out += identity; // LOOKALIKE: tensor-alias-then-mutate -- writes out, not the identity alias
    return out.relu_();
  }

  torch::nn::Conv2d c1_{nullptr}, c2_{nullptr}, down_{nullptr};
  torch::nn::BatchNorm2d b1_{nullptr}, b2_{nullptr};
};
TORCH_MODULE(BasicBlock);

// Pre-activation variant: the skip path keeps the block input.
torch::Tensor preact_block(BasicBlock &blk, const torch::Tensor &x) {
  auto h = x.flatten(2);
  // FACT: x = torch.randn(2, 3, 4, 5); h = x.flatten(2); h.relu_(); assert shares_storage(h, x) and x.min() >= 0
  h.relu_(); // EXPECT: tensor-alias-then-mutate
  return blk->forward(h.view_as(x)) + x;
}
