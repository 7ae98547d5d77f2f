// Collation of variable-length token sequences into a padded batch plus attention mask.
#include <torch/torch.h>
#include <vector>

struct PaddedBatch {
  torch::Tensor ids, mask;
};

PaddedBatch collate(const std::vector<torch::Tensor> &seqs, int64_t pad_id) {
  int64_t max_len = 0;
  for (const auto &s : seqs)
    max_len = std::max<int64_t>(max_len, s.size(0));
  auto B = static_cast<int64_t>(seqs.size());
  auto ids = torch::full({B, max_len}, pad_id, torch::kLong);
  auto mask = torch::zeros({B, max_len}, torch::kBool);
  for (int64_t i = 0; i < B; ++i) {
    auto n = seqs[i].size(0);
    // FACT: ids = torch.zeros(2, 4); s = torch.ones(3); ids[0].narrow(0, 0, 3).copy_(s); assert ids.sum() == 3 and is_copy_of(ids, s)
    ids[i].narrow(0, 0, n).copy_(seqs[i]); // LOOKALIKE: tensor-alias-then-mutate -- writing a row of the new batch through a view
    mask[i].narrow(0, 0, n).fill_(true);
  }
  return {ids, mask};
}

// Truncates and adds BOS/EOS; the caller's sequence must stay as it was.
torch::Tensor add_special(const torch::Tensor &seq, int64_t bos, int64_t eos, int64_t max_len) {
  auto body = seq.narrow(0, 0, std::min<int64_t>(seq.size(0), max_len - 2));
  return torch::cat({torch::tensor({bos}), body, torch::tensor({eos})});
}

// Random masking for masked-language-model pre-training.
torch::Tensor mlm_mask(const torch::Tensor &ids, int64_t mask_id, double prob) {
  auto labels = ids;
  auto chosen = torch::rand(ids.sizes()) < prob;
  auto inputs = ids.clone(); // EXPECT: tensor-unnecessary-clone
  // FACT: ids = torch.arange(6); i = ids.clone(); i.masked_fill_(ids > 2, 0); assert is_copy_of(i, ids)
  inputs.masked_fill_(chosen, mask_id); // LOOKALIKE: tensor-alias-then-mutate -- inputs is a clone
  // FACT: ids = torch.arange(6); l = ids; l.masked_fill_(ids > 2, -100); assert shares_storage(l, ids) and ids.min() == -100
  labels.masked_fill_(~chosen, -100); // EXPECT: tensor-alias-then-mutate
  return torch::stack({inputs, labels, ids});
}
