// MNIST-style training loop; the model is moved to the GPU, the batches are not.
#include <torch/torch.h>

struct MLP : torch::nn::Module {
  MLP() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2->forward(torch::relu(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

void train_synthetic(int epochs) {
  auto model = std::make_shared<MLP>();
  model->to(torch::kCUDA);
  torch::optim::SGD opt(model->parameters(), 0.01);
  for (int e = 0; e < epochs; ++e) {
    auto images = torch::randn({64, 784});
    auto labels = torch::randint(0, 10, {64});
    opt.zero_grad();
    // FACT: assert raises(lambda: torch.randn(2, 3, device='meta') + torch.randn(2, 3), 'same device')
    auto logits = model->forward(images); // EXPECT: tensor-device-mismatch
    auto loss = torch::nll_loss(torch::log_softmax(logits, 1), labels);
    loss.backward();
    opt.step();
  }
}

void train_portable(int epochs) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto model = std::make_shared<MLP>();
  model->to(device);
  for (int e = 0; e < epochs; ++e) {
    auto images = torch::randn({64, 784});
    auto logits = model->forward(images); // EXPECT: tensor-device-mismatch -- is_available() ? kCUDA : kCPU: throws on every machine with a GPU (was a look-alike before the twenty-fifth session)
    (void)logits;
  }
}

void train_moved_inputs(int epochs) {
  auto model = std::make_shared<MLP>();
  model->to(torch::kCUDA);
  for (int e = 0; e < epochs; ++e) {
    auto images = torch::randn({64, 784}).to(torch::kCUDA);
    auto logits = model->forward(images); // LOOKALIKE: tensor-device-mismatch -- inputs moved to the same device
    (void)logits;
  }
}
