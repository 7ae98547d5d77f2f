// A hand-written CPU kernel: row-wise top-k mask with accessors, used by a sparse attention layer.
#include <torch/torch.h>
#include <algorithm>
#include <vector>

torch::Tensor topk_mask(const torch::Tensor &scores, int64_t k) {
  TORCH_CHECK(scores.dim() == 2, "scores must be 2-D");
  auto s = scores.contiguous();
  auto mask = torch::zeros_like(s, torch::kBool);
  auto sa = s.accessor<float, 2>();
  auto ma = mask.accessor<bool, 2>();
  std::vector<std::pair<float, int64_t>> row(s.size(1));
  for (int64_t i = 0; i < s.size(0); ++i) {
    for (int64_t j = 0; j < s.size(1); ++j)
      row[j] = {sa[i][j], j};
    std::partial_sort(row.begin(), row.begin() + k, row.end(), std::greater<>());
    for (int64_t j = 0; j < k; ++j)
      ma[i][row[j].second] = true;
  }
  return mask;
}

// Scaling kernel that writes its own output buffer; the input is made contiguous for the raw loop.
torch::Tensor scale_rows(const torch::Tensor &x, const torch::Tensor &row_scale) {
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  auto sc = row_scale.accessor<float, 1>();
  auto in = xc.data_ptr<float>();
  auto dst = out.data_ptr<float>();
  for (int64_t i = 0; i < xc.size(0); ++i)
    for (int64_t j = 0; j < xc.size(1); ++j)
      dst[i * xc.size(1) + j] = in[i * xc.size(1) + j] * sc[i];
  return out;
}

torch::Tensor scale_rows_v2(const torch::Tensor &x, const torch::Tensor &row_scale) {
  auto xc = x.contiguous();
  // FACT: x = torch.randn(3, 4); c = x.contiguous(); c.mul_(2); assert c is x
  xc.mul_(row_scale.unsqueeze(1)); // EXPECT: tensor-alias-then-mutate
  return xc;
}
