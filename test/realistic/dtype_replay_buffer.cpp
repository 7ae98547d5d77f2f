// Fixed-size replay buffer for a DQN agent: tensors preallocated, written per step.
#include <torch/torch.h>

class ReplayBuffer {
public:
  ReplayBuffer(int64_t capacity, int64_t obs_dim)
      : obs_(torch::zeros({capacity, obs_dim})),
        actions_(torch::zeros({capacity}, torch::kLong)),
        rewards_(torch::zeros({capacity})),
        done_(torch::zeros({capacity}, torch::kBool)), capacity_(capacity) {}

  void push(const torch::Tensor &obs, const torch::Tensor &action, double reward, bool done) {
    obs_[pos_] = obs;              // LOOKALIKE: tensor-copy-narrowing -- obs dtype not shown (float32 buffers, float32 env)
    actions_[pos_] = action;       // LOOKALIKE: tensor-copy-narrowing -- action is an int64 index
    rewards_[pos_] = reward;
    done_[pos_] = done;
    pos_ = (pos_ + 1) % capacity_;
  }

  void push_batch(int64_t start, int64_t n, const torch::Tensor &q_values) {
    auto greedy = torch::zeros({n}, torch::kLong);
    // FACT: a = torch.zeros(2, dtype=torch.long); a.copy_(torch.tensor([[0.1, 0.9], [0.7, 0.2]]).argmax(1)); assert a.tolist() == [1, 0]
    greedy.copy_(q_values.argmax(1)); // LOOKALIKE: tensor-copy-narrowing -- argmax is int64
    actions_.narrow(0, start, n).copy_(greedy);
    auto noisy = torch::zeros({n}, torch::kLong);
    auto logits = q_values + 0.1 * torch::randn_like(q_values);
    // FACT: a = torch.zeros(2, dtype=torch.long); a.copy_(torch.softmax(torch.tensor([[0.1, 0.9], [0.7, 0.2]]), 1)[:, 1] * 2); assert a.tolist() == [1, 0]
    noisy.copy_(torch::softmax(logits, 1).select(1, 0).mul(2)); // EXPECT: tensor-copy-narrowing
    actions_.narrow(0, start, n).copy_(noisy);
  }

private:
  torch::Tensor obs_, actions_, rewards_, done_;
  int64_t capacity_, pos_ = 0;
};

void store_returns(int64_t T) {
  auto returns64 = torch::zeros({T}, torch::kFloat64);
  double g = 0;
  for (int64_t t = T - 1; t >= 0; --t) {
    g = 1.0 + 0.99 * g;
    returns64[t] = g;
  }
  auto returns = torch::empty({T});
  // FACT: r = torch.empty(1); r.copy_(torch.tensor([1.0000000001], dtype=torch.float64)); assert r.item() == 1.0
  returns.copy_(returns64); // EXPECT: tensor-copy-narrowing
}
