// Standardising features with statistics computed once over the training set.
#include <torch/torch.h>

struct Standardizer {
  torch::Tensor mean_, std_; // [F]

  void fit(const torch::Tensor &x) {
    mean_ = x.mean(0);
    std_ = x.std(0);
  }

  torch::Tensor transform(torch::Tensor x) {
    // FACT: x = torch.randn(4, 3); m = torch.randn(3); assert not raises(lambda: x.sub_(m.expand_as(x)))
    x.sub_(mean_.expand_as(x)); // LOOKALIKE: tensor-inplace-on-expanded -- x is written, the expanded mean read
    x.div_(std_.expand_as(x)); // LOOKALIKE: tensor-inplace-on-expanded -- x is written, the expanded std read
    return x;
  }

  torch::Tensor safe_std(const torch::Tensor &x) {
    auto s = std_.expand_as(x);
    // FACT: s = torch.rand(3).expand(4, 3); assert raises(lambda: s.clamp_min_(1e-5), "more than one element of the written-to tensor")
    s.clamp_min_(1e-5); // EXPECT: tensor-inplace-on-expanded
    return s;
  }

  torch::Tensor centered(const torch::Tensor &x) {
    auto m = mean_.broadcast_to(x.sizes());
    // FACT: m = torch.rand(3).broadcast_to((4, 3)); assert raises(lambda: m.neg_(), "more than one element of the written-to tensor")
    m.neg_(); // EXPECT: tensor-inplace-on-expanded
    return x + m;
  }
};
