// Histogram-style quantisation of model confidences for a calibration report.
#include <torch/torch.h>

#include <vector>

struct CalibrationReport {
  torch::Tensor bin_ids;   // int64 [N]
  torch::Tensor bin_count; // int64 [B]
};

CalibrationReport bucketize_confidence(const torch::Tensor &logits, int64_t num_bins) {
  auto probs = torch::softmax(logits, /*dim=*/1);
  auto conf = std::get<0>(probs.max(1));
  CalibrationReport r;
  r.bin_ids = torch::zeros({logits.size(0)}, torch::kLong);
  // FACT: ids = torch.zeros(3, dtype=torch.long); ids.copy_(torch.tensor([0.2, 0.95, 0.5]) * 10); assert ids.tolist() == [2, 9, 5]
  r.bin_ids.copy_(torch::softmax(logits, 1).amax(1) * num_bins); // EXPECT: tensor-copy-narrowing
  r.bin_count = torch::zeros({num_bins}, torch::kLong);
  auto idx = torch::arange(logits.size(0));
  // FACT: b = torch.zeros(4, dtype=torch.long); i = torch.tensor([0, 1]); b[0:2].copy_(i); assert b.tolist() == [0, 1, 0, 0]
  r.bin_count.narrow(0, 0, 2).copy_(idx.narrow(0, 0, 2)); // LOOKALIKE: tensor-copy-narrowing -- int64 into int64
  return r;
}

torch::Tensor percent_scores(const torch::Tensor &scores) {
  auto pct = torch::empty(scores.sizes(), torch::kInt32);
  auto scaled = scores.to(torch::kFloat64).mul(100.0);
  // FACT: p = torch.empty(2, dtype=torch.int32); p.copy_(torch.tensor([12.9, 99.99], dtype=torch.float64)); assert p.tolist() == [12, 99]
  pct.copy_(scaled); // EXPECT: tensor-copy-narrowing
  return pct;
}

torch::Tensor class_histogram(const torch::Tensor &labels, int64_t num_classes) {
  auto hist = torch::zeros({num_classes}, torch::kLong);
  auto ones = torch::ones({labels.size(0)}, torch::kLong);
  hist.index_add_(0, labels, ones);
  auto out = torch::zeros({num_classes}, torch::kLong);
  // FACT: o = torch.zeros(3, dtype=torch.long); o.copy_(torch.tensor([1, 2, 3])); assert o.tolist() == [1, 2, 3]
  out.copy_(labels.bincount(torch::Tensor(), num_classes)); // LOOKALIKE: tensor-copy-narrowing -- bincount of int64 labels is int64
  return out;
}
