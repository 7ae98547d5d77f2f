// A hand-rolled batch norm used inside a custom fused block (training and eval paths).
#include <torch/torch.h>

struct ManualBnImpl : torch::nn::Module {
  explicit ManualBnImpl(int64_t ch, double momentum = 0.1) : momentum_(momentum) {
    gamma_ = register_parameter("gamma", torch::ones({ch}));
    beta_ = register_parameter("beta", torch::zeros({ch}));
    running_mean_ = register_buffer("running_mean", torch::zeros({ch}));
    running_var_ = register_buffer("running_var", torch::ones({ch}));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    torch::Tensor mean, var;
    if (is_training()) {
      mean = x.mean({0, 2, 3});
      var = x.var({0, 2, 3}, false);
      torch::NoGradGuard no_grad;
      running_mean_.mul_(1 - momentum_).add_(mean, momentum_);
      running_var_.mul_(1 - momentum_).add_(var, momentum_);
    } else {
      mean = running_mean_;
      var = running_var_;
    }
    auto inv = (var + 1e-5).rsqrt();
    auto y = x - mean.view({1, -1, 1, 1});
    // FACT: x = torch.randn(2, 3, 4, 4); y = x - x.mean((0, 2, 3)).view(1, -1, 1, 1); assert is_copy_of(y, x)
    y.mul_((inv * gamma_).view({1, -1, 1, 1})); // LOOKALIKE: tensor-alias-then-mutate -- x - mean is a new tensor
    return y + beta_.view({1, -1, 1, 1});
  }

  // Folds the statistics into an exported scale; eval path only.
  torch::Tensor export_scale() {
    auto scale = running_var_;
    // FACT: rv = torch.ones(4); s = rv; s.add_(1e-5); assert shares_storage(s, rv) and rv[0] > 1
    scale.add_(1e-5).rsqrt_(); // EXPECT: tensor-alias-then-mutate
    return scale * gamma_.detach();
  }

  double momentum_;
  torch::Tensor gamma_, beta_, running_mean_, running_var_;
};
TORCH_MODULE(ManualBn);
