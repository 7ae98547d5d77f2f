// Embedding lookups against a GPU-resident table with host-side statistics.
#include <torch/torch.h>

class FeatureStore {
public:
  explicit FeatureStore(int64_t n, int64_t d) : table_(torch::randn({n, d})) {}

  torch::Tensor centered(const torch::Tensor &ids) {
    auto gpu_table = table_.cuda();
    auto mean = torch::zeros({table_.size(1)});
    for (int64_t i = 0; i < 8; ++i)
      mean += torch::randn({table_.size(1)}) / 8;
    // FACT: assert raises(lambda: torch.randn(2, 4, device='meta') - torch.zeros(4), 'same device')
    return gpu_table - mean; // EXPECT: tensor-device-mismatch
  }

  torch::Tensor projected(int64_t k) {
    auto gpu_table = table_.cuda();
    auto proj = torch::randn({table_.size(1), k});
    // FACT: assert raises(lambda: torch.randn(2, 4, device='meta').sub(torch.randn(2, 4)), 'same device')
    return torch::mm(gpu_table, proj); // EXPECT: tensor-device-mismatch
  }

  torch::Tensor host_copy() {
    auto gpu_table = table_.cuda();
    auto out = torch::empty_like(table_);
    out.copy_(gpu_table); // LOOKALIKE: tensor-device-mismatch -- copy_ moves data across devices
    return out;
  }

  torch::Tensor scaled(const torch::Tensor &w) {
    auto gpu_table = table_.cuda();
    return gpu_table * w; // LOOKALIKE: tensor-device-mismatch -- w's device not shown
  }

private:
  torch::Tensor table_;
};
