// A fixed-size key/value cache for incremental decoding with a sliding window.
#include <torch/torch.h>

struct KVCache {
  torch::Tensor k_, v_; // [B, heads, L, d]
  int64_t filled_ = 0;

  void append(const torch::Tensor &k, const torch::Tensor &v) {
    auto L = k_.size(2);
    if (filled_ < L) {
      k_.select(2, filled_).copy_(k.squeeze(2));
      v_.select(2, filled_).copy_(v.squeeze(2));
      ++filled_;
      return;
    }
    // Slide the window left by one step along the sequence dimension.
    // FACT: c = torch.rand(2, 3, 5, 4); assert not raises(lambda: c.narrow(2, 0, 4).copy_(c.narrow(2, 1, 4)))
    k_.narrow(2, 0, L - 1).copy_(k_.narrow(2, 1, L - 1)); // EXPECT: tensor-inplace-overlap
    v_.narrow(2, 0, L - 1).copy_(v_.narrow(2, 1, L - 1)); // EXPECT: tensor-inplace-overlap
    k_.select(2, L - 1).copy_(k.squeeze(2));
    v_.select(2, L - 1).copy_(v.squeeze(2));
  }

  void append_cat(const torch::Tensor &k, const torch::Tensor &v) {
    auto L = k_.size(2);
    // FACT: c = torch.rand(2, 3, 5, 4); n = torch.cat([c.narrow(2, 1, 4), torch.rand(2, 3, 1, 4)], 2); assert is_copy_of(n, c)
    k_ = torch::cat({k_.narrow(2, 1, L - 1), k}, 2);
    v_ = torch::cat({v_.narrow(2, 1, L - 1), v}, 2);
  }
};
