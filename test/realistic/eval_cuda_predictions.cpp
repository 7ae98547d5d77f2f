// Validation pass of an image classifier trained on the GPU; labels come from the host.
#include <torch/torch.h>

struct Classifier : torch::nn::Module {
  Classifier() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(8, 10));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::relu(conv->forward(x));
    return fc->forward(h.mean({2, 3}));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};

double validate(Classifier &model, int64_t batches, int64_t bs) {
  model.to(torch::kCUDA);
  model.eval();
  torch::NoGradGuard no_grad;
  int64_t correct = 0, seen = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto images = torch::rand({bs, 3, 32, 32}).cuda();
    auto labels = torch::randint(0, 10, {bs});
    auto logits = model.forward(images);
    // FACT: assert raises(lambda: torch.zeros(4, 10, device='meta').argmax(1).eq(torch.zeros(4, dtype=torch.long)), 'same device')
    auto hits = logits.argmax(1).eq(labels);              // EXPECT: tensor-device-mismatch
    correct += hits.sum().item<int64_t>();                // EXPECT: tensor-sync-in-loop
    seen += bs;
  }
  return double(correct) / double(seen);
}

double validate_on_host(Classifier &model, int64_t bs) {
  model.to(torch::kCUDA);
  auto images = torch::rand({bs, 3, 32, 32}).cuda();
  auto labels = torch::randint(0, 10, {bs});
  auto pred = model.forward(images).argmax(1).cpu();
  return pred.eq(labels).sum().item<double>() / bs;      // LOOKALIKE: tensor-device-mismatch -- predictions copied back to the host first
}

torch::Tensor confusion(torch::nn::Linear &head, const torch::Tensor &features, int64_t k) {
  head->to(torch::kCUDA);
  auto scores = head(features.cuda());
  auto truth = torch::randint(0, k, {features.size(0)}).cuda();
  return torch::one_hot(scores.argmax(1) * k + truth, k * k).sum(0); // LOOKALIKE: tensor-device-mismatch -- the labels were moved to the GPU too
}
