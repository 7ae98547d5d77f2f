// Beam search over a decoder step function; the encoder memory is tiled per beam.
#include <torch/torch.h>
#include <functional>
#include <vector>

using StepFn = std::function<torch::Tensor(const torch::Tensor &tokens, const torch::Tensor &memory)>;

std::vector<int64_t> beam_search(const StepFn &step, const torch::Tensor &memory, int64_t beam,
                                 int64_t max_len, int64_t bos, int64_t eos) {
  auto tokens = torch::full({beam, 1}, bos, torch::kLong);
  auto scores = torch::zeros({beam});
  auto S = memory.size(1), D = memory.size(2);
  for (int64_t t = 0; t < max_len; ++t) {
    auto mem = memory.expand({beam, S, D}).clone(); // EXPECT: tensor-clone-in-loop
    auto logp = torch::log_softmax(step(tokens, mem), -1); // [beam, V]
    auto V = logp.size(1);
    // FACT: c = torch.zeros(3).unsqueeze(1) + torch.randn(3, 5); assert is_view_of(c.view(-1), c)
    auto cand = (scores.unsqueeze(1) + logp).view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- a fresh sum is contiguous
    auto top = cand.topk(beam);
    scores = std::get<0>(top);
    auto idx = std::get<1>(top);
    auto from = idx.div(V, "floor");
    tokens = torch::cat({tokens.index_select(0, from), idx.remainder(V).unsqueeze(1)}, 1);
    if (tokens[0][-1].item<int64_t>() == eos)
      break;
  }
  auto best = tokens[0];
  return std::vector<int64_t>(best.data_ptr<int64_t>(), best.data_ptr<int64_t>() + best.numel());
}
