// A custom SGD with momentum and weight decay over a module's parameters.
#include <torch/torch.h>
#include <vector>

class MomentumSgd {
public:
  MomentumSgd(std::vector<torch::Tensor> params, double lr, double momentum, double wd)
      : params_(std::move(params)), lr_(lr), momentum_(momentum), wd_(wd) {
    for (const auto &p : params_)
      bufs_.push_back(torch::zeros_like(p));
  }

  void step() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto &p = params_[i];
      if (!p.grad().defined())
        continue;
      auto d_p = p.grad();
      if (wd_ != 0)
        d_p = d_p.add(p, wd_);
      // FACT: p = torch.randn(3); b = torch.zeros_like(p); b.mul_(0.9).add_(1); assert is_copy_of(b, p)
      bufs_[i].mul_(momentum_).add_(d_p); // LOOKALIKE: tensor-alias-then-mutate -- the momentum buffer is meant to be updated
      p.add_(bufs_[i], -lr_);
    }
  }

  // Applies the momentum step to one tensor and reports how far it moved.
  double apply_and_measure(size_t i) {
    torch::NoGradGuard no_grad;
    auto &p = params_[i];
    auto before = p;
    // FACT: p = torch.randn(3); b = p; p.add_(1); assert shares_storage(p, b) and (p - b).abs().sum() == 0
    p.add_(bufs_[i], -lr_); // EXPECT: tensor-alias-then-mutate
    return (p - before).norm().item<double>();
  }

  void zero_grad() {
    for (auto &p : params_)
      if (p.grad().defined())
        p.grad().zero_(); // LOOKALIKE: tensor-inplace-on-detached -- zeroing gradients in place is the API
  }

private:
  std::vector<torch::Tensor> params_, bufs_;
  double lr_, momentum_, wd_;
};
