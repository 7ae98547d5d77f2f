// Manual mixed-precision update: fp32 master weights, fp16 model copy.
#include <torch/torch.h>

#include <vector>

struct MasterParams {
  std::vector<torch::Tensor> master; // float32
  std::vector<torch::Tensor> model;  // float16
};

void sync_to_model(MasterParams &p) {
  torch::NoGradGuard ng;
  for (size_t i = 0; i < p.master.size(); ++i)
    p.model[i].copy_(p.master[i]); // LOOKALIKE: tensor-copy-narrowing -- dtypes not shown; fp32 -> fp16 is intended here
}

void init_half_buffer(int64_t n) {
  auto half_buf = torch::zeros({n}, torch::kHalf);
  auto init = torch::randn({n}) * 0.02;
  // FACT: h = torch.zeros(2, dtype=torch.half); h.copy_(torch.tensor([0.5, 0.25])); assert h.tolist() == [0.5, 0.25]
  half_buf.copy_(init); // LOOKALIKE: tensor-copy-narrowing -- float32 -> float16 is how mixed precision fills its copies
}

void accumulate_grad_stats(int64_t n) {
  auto stats64 = torch::zeros({n}, torch::kDouble);
  for (int step = 0; step < 10; ++step)
    stats64.add_(torch::rand({n}, torch::kDouble));
  auto stats16 = torch::empty({n}, torch::kBFloat16);
  // FACT: s = torch.empty(1, dtype=torch.bfloat16); s.copy_(torch.tensor([1.001], dtype=torch.float64)); assert s.item() == 1.0
  stats16.copy_(stats64); // EXPECT: tensor-copy-narrowing
  auto widened = torch::empty({n}, torch::kDouble);
  // FACT: w = torch.empty(1, dtype=torch.float64); w.copy_(torch.tensor([0.5])); assert w.item() == 0.5
  widened.copy_(torch::rand({n})); // LOOKALIKE: tensor-copy-narrowing -- float32 -> float64 widens
}
