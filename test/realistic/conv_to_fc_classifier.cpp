// Small CNN whose classifier was ported from a channels-last TensorFlow model.
#include <torch/torch.h>

struct TfPortNetImpl : torch::nn::Module {
  TfPortNetImpl(int64_t classes, int64_t h, int64_t w) {
    conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).padding(1)));
    conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
    fc_ = register_module("fc", torch::nn::Linear(64 * (h / 4) * (w / 4), classes));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1_(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2_(x)), 2);
    // the TF weights expect the flatten order of NHWC
    auto nhwc = x.permute({0, 2, 3, 1});
    // FACT: x = torch.randn(2, 3, 4, 5); assert raises(lambda: x.permute(0, 2, 3, 1).view(2, -1), "view size is not compatible")
    return fc_(nhwc.view({x.size(0), -1})); // EXPECT: tensor-view-non-contiguous
  }

  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(TfPortNet);

struct PlainNetImpl : torch::nn::Module {
  PlainNetImpl(int64_t classes, int64_t h, int64_t w) {
    conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)));
    fc_ = register_module("fc", torch::nn::Linear(16 * (h / 2) * (w / 2), classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv_(x)), 2);
    // FACT: x = torch.randn(2, 3, 4, 5); assert is_view_of(x.view(2, -1), x)
    return fc_(x.view({x.size(0), -1})); // LOOKALIKE: tensor-view-non-contiguous -- pooled NCHW output is contiguous
  }
  torch::nn::Conv2d conv_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(PlainNet);
