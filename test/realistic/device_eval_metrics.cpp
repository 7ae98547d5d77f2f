// Evaluation: predictions on the GPU compared with labels kept on the host.
#include <torch/torch.h>

double accuracy_gpu(torch::nn::Linear &clf, int64_t n) {
  clf->to(torch::kCUDA);
  auto x = torch::randn({n, 16}).cuda();
  auto pred = clf->forward(x).argmax(1);
  auto labels = torch::randint(0, 4, {n});
  // FACT: assert raises(lambda: torch.zeros(3, device='meta') == torch.zeros(3), 'same device')
  auto correct = pred.eq(labels); // EXPECT: tensor-device-mismatch
  return correct.sum().item<double>() / n;
}

double accuracy_host(torch::nn::Linear &clf, int64_t n) {
  clf->to(torch::kCUDA);
  auto x = torch::randn({n, 16}).cuda();
  auto pred = clf->forward(x).argmax(1).cpu();
  auto labels = torch::randint(0, 4, {n});
  auto correct = pred.eq(labels); // LOOKALIKE: tensor-device-mismatch -- predictions brought back to the host
  return correct.sum().item<double>() / n;
}

double mse_gpu(int64_t n) {
  auto pred = torch::randn({n}).to(torch::kCUDA);
  auto target = torch::randn({n});
  // FACT: assert raises(lambda: torch.nn.functional.mse_loss(torch.randn(3, device='meta'), torch.randn(3)), 'same device')
  return torch::mse_loss(pred, target).item<double>(); // EXPECT: tensor-device-mismatch
}
