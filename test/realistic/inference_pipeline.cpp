// Batch inference service: images in, top-1 labels out; normalisation constants kept on the device.
#include <torch/torch.h>
#include <vector>

class Classifier {
public:
  Classifier(torch::nn::Sequential net, torch::Device device)
      : net_(std::move(net)), device_(device) {
    net_->to(device_);
    net_->eval();
    mean_ = torch::tensor({0.485, 0.456, 0.406}, torch::kFloat).view({1, 3, 1, 1});
    std_ = torch::tensor({0.229, 0.224, 0.225}, torch::kFloat).view({1, 3, 1, 1});
  }

  std::vector<int64_t> predict(const std::vector<torch::Tensor> &images) {
    torch::InferenceMode guard;
    std::vector<int64_t> labels;
    for (const auto &img : images) {
      auto x = img.unsqueeze(0).to(device_);
      auto m = mean_.to(device_); // EXPECT: tensor-clone-in-loop
      auto s = std_.to(device_); // EXPECT: tensor-clone-in-loop
      auto logits = net_->forward((x - m) / s);
      labels.push_back(logits.argmax(1).item<int64_t>());
    }
    return labels;
  }

private:
  torch::nn::Sequential net_;
  torch::Device device_;
  torch::Tensor mean_, std_;
};
