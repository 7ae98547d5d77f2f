// Curriculum learning: per-sample difficulty weights drive a multinomial sampler.
#include <torch/torch.h>
#include <vector>

class CurriculumSampler {
public:
  explicit CurriculumSampler(int64_t n) : difficulty_(torch::ones({n})) {}

  std::vector<torch::Tensor> epoch_indices(int64_t batches, int64_t batch_size, double temperature) {
    auto probs = torch::softmax(-difficulty_ / temperature, 0);
    std::vector<torch::Tensor> out;
    for (int64_t b = 0; b < batches; ++b) {
      // FACT: p = torch.softmax(torch.randn(5), 0); assert p.contiguous() is p
      auto p = probs.contiguous(); // LOOKALIKE: tensor-clone-in-loop -- softmax output is contiguous: a no-op
      out.push_back(p.multinomial(batch_size, false));
    }
    return out;
  }

  // Snapshots of the difficulty per epoch, each one adjusted and kept.
  std::vector<torch::Tensor> history(const std::vector<torch::Tensor> &losses) {
    std::vector<torch::Tensor> snaps;
    for (const auto &l : losses) {
      auto d = difficulty_.clone(); // LOOKALIKE: tensor-clone-in-loop -- written and kept: each snapshot needs its own copy
      d.mul_(0.9).add_(l, 0.1);
      snaps.push_back(d);
    }
    return snaps;
  }

  void update(const torch::Tensor &idx, const torch::Tensor &loss) {
    difficulty_.index_put_({idx}, loss.detach());
  }

private:
  torch::Tensor difficulty_;
};
