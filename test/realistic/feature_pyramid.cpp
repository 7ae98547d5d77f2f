// Feature pyramid network: top-down pathway over backbone levels, then flattened tokens.
#include <torch/torch.h>
#include <vector>

std::vector<torch::Tensor> top_down(const std::vector<torch::Tensor> &laterals) {
  std::vector<torch::Tensor> out(laterals.size());
  out.back() = laterals.back();
  for (int i = static_cast<int>(laterals.size()) - 2; i >= 0; --i) {
    auto up = torch::nn::functional::interpolate(
        out[i + 1], torch::nn::functional::InterpolateFuncOptions()
                        .size(std::vector<int64_t>{laterals[i].size(2), laterals[i].size(3)})
                        .mode(torch::kNearest));
    auto merged = laterals[i];
    // FACT: lat = [torch.zeros(1, 2, 4, 4)]; m = lat[0]; m.add_(1); assert lat[0].sum() == 32
    merged.add_(up); // EXPECT: tensor-alias-then-mutate
    out[i] = merged;
  }
  return out;
}

torch::Tensor level_tokens(const std::vector<torch::Tensor> &levels) {
  std::vector<torch::Tensor> toks;
  for (const auto &f : levels) {
    // FACT: f = torch.randn(2, 3, 4, 5); assert is_view_of(f.flatten(2), f)
    toks.push_back(f.flatten(2).transpose(1, 2)); // LOOKALIKE: tensor-reshape-non-contiguous -- flatten comes before the transpose
  }
  return torch::cat(toks, 1);
}
