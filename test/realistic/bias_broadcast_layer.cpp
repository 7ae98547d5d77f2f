// A hand-written affine layer with a per-feature bias and a learnable shift.
#include <torch/torch.h>

struct AffineImpl : torch::nn::Module {
  AffineImpl(int64_t in, int64_t out) {
    weight = register_parameter("weight", torch::randn({out, in}) * 0.02);
    bias = register_parameter("bias", torch::zeros({out}));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto y = torch::matmul(x, weight.t());
    auto b = bias.expand_as(y);
    // FACT: b = torch.zeros(3).expand(2, 3); assert raises(lambda: b.add_(1.0), "more than one element of the written-to tensor")
    // FACT: p = torch.zeros(3, requires_grad=True); assert raises(lambda: p.expand(2, 3).add_(1.0), "a view of a leaf Variable that requires grad")
    b.add_(shift_); // EXPECT: tensor-inplace-on-expanded, tensor-inplace-on-leaf
    return y + b;
  }

  torch::Tensor forward_fixed(const torch::Tensor &x) {
    auto y = torch::matmul(x, weight.t());
    // FACT: y = torch.randn(2, 3); assert not raises(lambda: y.add_(torch.zeros(3).expand(2, 3)))
    y.add_(bias.expand_as(y)); // LOOKALIKE: tensor-inplace-on-expanded -- the output is written, the expanded bias only read
    return y;
  }

  torch::Tensor forward_accumulate(const torch::Tensor &x, const torch::Tensor &extra) {
    auto y = torch::matmul(x, weight.t());
    auto b = bias.unsqueeze(0).expand({x.size(0), -1});
    // FACT: b = torch.zeros(3).unsqueeze(0).expand(2, -1); assert raises(lambda: b.add_(torch.ones(2, 3)), "more than one element of the written-to tensor")
    // FACT: p = torch.zeros(3, requires_grad=True); assert raises(lambda: p.expand(2, 3).add_(1.0), "a view of a leaf Variable that requires grad")
    b += extra; // EXPECT: tensor-inplace-on-expanded, tensor-inplace-on-leaf
    return y + b;
  }

  torch::Tensor weight, bias;
  double shift_ = 0.1;
};
TORCH_MODULE(Affine);
