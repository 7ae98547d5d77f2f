// A prefetching loader that moves batches to the GPU ahead of use.
#include <torch/torch.h>

#include <deque>

class Prefetcher {
public:
  explicit Prefetcher(int64_t dim) : dim_(dim) {}

  void fill(int n) {
    for (int i = 0; i < n; ++i)
      queue_.push_back(torch::randn({32, dim_}).to(torch::kCUDA, /*non_blocking=*/true));
  }

  torch::Tensor next_normalized() {
    auto batch = queue_.front();
    queue_.pop_front();
    return batch.sub(batch.mean(0)); // LOOKALIKE: tensor-device-mismatch -- both on the batch's device
  }

  torch::Tensor with_noise() {
    auto batch = torch::randn({32, dim_}).to(torch::kCUDA, /*non_blocking=*/true);
    auto noise = torch::randn({32, dim_}) * 0.01;
    // FACT: assert raises(lambda: torch.randn(2, 3, device='meta').add(torch.randn(2, 3)), 'same device')
    return batch.add(noise); // EXPECT: tensor-device-mismatch
  }

  torch::Tensor with_noise_fixed() {
    auto batch = torch::randn({32, dim_}).to(torch::kCUDA, /*non_blocking=*/true);
    auto noise = torch::randn({32, dim_}, batch.options()) * 0.01;
    return batch.add(noise); // LOOKALIKE: tensor-device-mismatch -- noise made with the batch's options
  }

private:
  int64_t dim_;
  std::deque<torch::Tensor> queue_;
};
