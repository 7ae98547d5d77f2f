// Training loop of an image classifier with class-balanced cross entropy.
#include <torch/torch.h>
#include <vector>

struct Batch {
  torch::Tensor images, labels;
};

double train_epoch(torch::nn::Sequential &model, torch::optim::Optimizer &opt,
                   const std::vector<Batch> &loader, const torch::Tensor &class_weights,
                   torch::Device device) {
  model->train();
  double total = 0;
  for (const auto &batch : loader) {
    auto images = batch.images.to(device); // LOOKALIKE: tensor-clone-in-loop -- the range-for variable changes every iteration
    auto labels = batch.labels.to(device);
    auto weights = class_weights.to(device); // EXPECT: tensor-clone-in-loop
    auto logits = model->forward(images);
    auto loss = torch::nn::functional::cross_entropy(
        logits, labels, torch::nn::functional::CrossEntropyFuncOptions().weight(weights));
    opt.zero_grad();
    loss.backward();
    opt.step();
    total += loss.item<double>();
  }
  return total / loader.size();
}
