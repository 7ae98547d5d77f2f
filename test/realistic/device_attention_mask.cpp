// Causal self-attention scores on the GPU with a mask built on the host.
#include <torch/torch.h>

#include <cmath>

torch::Tensor causal_scores(int64_t T, int64_t d) {
  auto q = torch::randn({T, d}, torch::device(torch::kCUDA));
  auto k = torch::randn({T, d}, torch::device(torch::kCUDA));
  auto scores = q.matmul(k.t()) / std::sqrt((double)d);
  auto mask = torch::ones({T, T}).triu(1).mul(-1e9);
  // FACT: assert raises(lambda: torch.randn(3, 3, device='meta') + torch.ones(3, 3), 'same device')
  return scores + mask; // EXPECT: tensor-device-mismatch
}

torch::Tensor scaled_scores(int64_t T, int64_t d) {
  auto q = torch::randn({T, d}).cuda();
  auto scale = torch::tensor(1.0 / std::sqrt((double)d));
  // FACT: assert (torch.randn(3, 3, device='meta') * torch.tensor(0.5)).shape == (3, 3)
  return q * scale; // LOOKALIKE: tensor-device-mismatch -- 0-dim CPU tensor is a CPU scalar, allowed
}

torch::Tensor masked_scores(int64_t T, int64_t d) {
  auto q = torch::randn({T, d}).cuda();
  auto mask = torch::ones({T, T}).triu(1).to(q.device());
  return q.matmul(q.t()).masked_fill(mask.to(torch::kBool), -1e9); // LOOKALIKE: tensor-device-mismatch -- mask moved to q's device
}

torch::Tensor position_bias(int64_t T) {
  auto pos = torch::arange(T).to(torch::kCUDA);
  auto rel = pos.unsqueeze(0) - pos.unsqueeze(1);
  auto decay = torch::linspace(0, 1, T);
  // FACT: assert raises(lambda: torch.arange(3, device='meta') * torch.linspace(0, 1, 3), 'same device')
  return rel.to(torch::kFloat) * decay; // EXPECT: tensor-device-mismatch
}
