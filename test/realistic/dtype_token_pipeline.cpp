// Text pipeline: token ids and attention masks packed into fixed-size batches.
#include <torch/torch.h>

#include <vector>

torch::Tensor pack_ids(const std::vector<torch::Tensor> &seqs, int64_t max_len) {
  auto batch = torch::zeros({(int64_t)seqs.size(), max_len}, torch::kLong);
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto n = std::min<int64_t>(seqs[i].size(0), max_len);
    batch[i].narrow(0, 0, n).copy_(seqs[i].narrow(0, 0, n)); // LOOKALIKE: tensor-copy-narrowing -- token ids are int64
  }
  return batch;
}

torch::Tensor positions_int32(int64_t len) {
  auto pos = torch::empty({len}, torch::kInt);
  // FACT: p = torch.empty(2, dtype=torch.int32); p.copy_(torch.arange(2)); assert p.tolist() == [0, 1]
  pos.copy_(torch::arange(len)); // EXPECT: tensor-copy-narrowing
  return pos;
}

torch::Tensor soft_lengths(const torch::Tensor &mask_probs, const torch::Tensor &token_ids) {
  auto lens = torch::zeros({mask_probs.size(0)}, torch::kLong);
  // FACT: l = torch.zeros(2, dtype=torch.long); l.copy_(torch.tensor([[0.9, 0.8], [0.6, 0.1]]).sum(1)); assert l.tolist() == [1, 0]
  lens.copy_(mask_probs.sigmoid().sum(1)); // EXPECT: tensor-copy-narrowing
  auto ids = torch::zeros_like(lens);
  ids.copy_(token_ids.select(1, 0)); // LOOKALIKE: tensor-copy-narrowing -- ids of unknown dtype with an integer name
  return lens + ids;
}

torch::Tensor attention_mask(const torch::Tensor &lengths, int64_t max_len) {
  auto mask = torch::zeros({lengths.size(0), max_len}, torch::kBool);
  auto ar = torch::arange(max_len).unsqueeze(0);
  mask.copy_(ar < lengths.unsqueeze(1)); // LOOKALIKE: tensor-copy-narrowing -- comparison result is bool
  return mask;
}
