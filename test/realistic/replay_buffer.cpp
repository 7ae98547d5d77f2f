// Replay buffer of an Atari agent: uint8 frames stored once, converted when sampled.
#include <torch/torch.h>
#include <random>
#include <vector>

class ReplayBuffer {
public:
  explicit ReplayBuffer(size_t capacity) : capacity_(capacity) {}

  void push(const torch::Tensor &obs, int64_t action, float reward) {
    if (frames_.size() == capacity_) {
      frames_.erase(frames_.begin());
      actions_.erase(actions_.begin());
      rewards_.erase(rewards_.begin());
    }
    frames_.push_back(obs);
    actions_.push_back(action);
    rewards_.push_back(reward);
  }

  // One float observation in [0, 1]; the stored frames are already float32 here.
  torch::Tensor sample_one(std::mt19937 &rng) {
    auto i = std::uniform_int_distribution<size_t>(0, frames_.size() - 1)(rng);
    auto obs = frames_[i];
    // FACT: store = [torch.rand(4, 84, 84)]; o = store[0]; o.div_(255); assert shares_storage(o, store[0]) and store[0].max() < 0.01
    obs.div_(255.0); // EXPECT: tensor-alias-then-mutate
    return obs;
  }

  torch::Tensor sample_batch(const torch::Tensor &stacked, int64_t batch, std::mt19937 &rng) {
    auto idx = torch::randint(0, stacked.size(0), {batch}, torch::kLong);
    auto obs = stacked.index_select(0, idx);
    // FACT: s = torch.rand(6, 4, 8); o = s.index_select(0, torch.tensor([0, 2])); assert is_copy_of(o, s)
    obs.div_(255.0); // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into new storage
    (void)rng;
    return obs;
  }

private:
  size_t capacity_;
  std::vector<torch::Tensor> frames_;
  std::vector<int64_t> actions_;
  std::vector<float> rewards_;
};
