// Cutout / random erasing for a batch of images [B, C, H, W].
#include <torch/torch.h>

torch::Tensor cutout(const torch::Tensor &batch, int64_t size) {
  auto H = batch.size(2), W = batch.size(3);
  auto out = batch.clone();
  for (int64_t i = 0; i < out.size(0); ++i) {
    auto y = torch::randint(0, H - size, {1}).item<int64_t>();
    auto x = torch::randint(0, W - size, {1}).item<int64_t>();
    // FACT: b = torch.rand(2, 3, 6, 6); o = b.clone(); o[0].narrow(1, 1, 2).narrow(2, 1, 2).zero_(); assert is_copy_of(o, b) and b.min() > 0
    out[i].narrow(1, y, size).narrow(2, x, size).zero_(); // LOOKALIKE: tensor-alias-then-mutate -- writes through explicit views of the clone
  }
  return out;
}

// In-place variant used by the data loader worker, which owns its batch.
void cutout_(torch::Tensor batch, int64_t size) {
  auto H = batch.size(2), W = batch.size(3);
  auto y = torch::randint(0, H - size, {1}).item<int64_t>();
  auto x = torch::randint(0, W - size, {1}).item<int64_t>();
  using torch::indexing::Slice;
  batch.index_put_({Slice(), Slice(), Slice(y, y + size), Slice(x, x + size)}, 0.0);
}

torch::Tensor erase_patch(const torch::Tensor &batch, int64_t size) {
  torch::Tensor work = batch;
  // FACT: b = torch.rand(2, 3, 6, 6); w = b; w[:, :, 0:2, 0:2] = 0; assert shares_storage(w, b) and b.min() == 0
  cutout_(work, size); // EXPECT: tensor-alias-then-mutate
  return torch::cat({batch, work});
}
