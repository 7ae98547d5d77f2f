// Validation pass: accuracy and a confusion matrix accumulated on the host.
#include <torch/torch.h>
#include <vector>

struct EvalResult {
  double accuracy;
  torch::Tensor confusion;
};

EvalResult evaluate(torch::nn::Sequential &model, const std::vector<std::pair<torch::Tensor, torch::Tensor>> &data,
                    int64_t num_classes, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto confusion = torch::zeros({num_classes, num_classes}, torch::kLong);
  int64_t correct = 0, seen = 0;
  for (const auto &[x, y] : data) {
    auto pred = model->forward(x.to(device)).argmax(1);
    auto pred_host = pred.cpu(); // LOOKALIKE: tensor-clone-in-loop -- a new prediction every batch
    auto idx = y * num_classes + pred_host;
    confusion.view({-1}).index_add_(0, idx, torch::ones_like(idx));
    correct += pred_host.eq(y).sum().item<int64_t>();
    seen += y.size(0);
  }
  return {double(correct) / std::max<int64_t>(seen, 1), confusion};
}
