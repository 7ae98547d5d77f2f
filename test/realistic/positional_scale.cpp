// Sinusoidal positions shared across the batch, scaled per call.
#include <torch/torch.h>

torch::Tensor sinusoid(int64_t T, int64_t d) {
  auto pos = torch::arange(T).unsqueeze(1).to(torch::kFloat);
  auto div = torch::exp(torch::arange(0, d, 2).to(torch::kFloat) * (-std::log(10000.0) / d));
  auto pe = torch::zeros({T, d});
  pe.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, torch::indexing::None, 2)}, torch::sin(pos * div));
  pe.index_put_({torch::indexing::Slice(), torch::indexing::Slice(1, torch::indexing::None, 2)}, torch::cos(pos * div));
  return pe;
}

torch::Tensor batch_positions(const torch::Tensor &pe, int64_t B, double scale) {
  auto pos = pe.unsqueeze(0).expand({B, -1, -1});
  // FACT: p = torch.randn(5, 4).unsqueeze(0).expand(3, -1, -1); assert raises(lambda: p.mul_(0.5), "more than one element of the written-to tensor")
  pos.mul_(scale); // EXPECT: tensor-inplace-on-expanded
  return pos;
}

torch::Tensor batch_positions_ok(const torch::Tensor &pe, int64_t B, double scale) {
  // FACT: p = torch.randn(5, 4).unsqueeze(0).expand(3, -1, -1); assert not raises(lambda: p.mul(0.5))
  return pe.unsqueeze(0).expand({B, -1, -1}).mul(scale); // LOOKALIKE: tensor-inplace-on-expanded -- out of place
}

torch::Tensor learned_positions(const torch::Tensor &table, int64_t n, double scale) {
  auto out = table.expand({n, -1}).clone(); // EXPECT: tensor-unnecessary-clone
  // FACT: t = torch.randn(6); o = t.expand(3, -1).clone(); assert not raises(lambda: o.mul_(0.5))
  out.mul_(scale); // LOOKALIKE: tensor-inplace-on-expanded -- cloned
  return out;
}

void reset_positions(const torch::Tensor &table, int64_t n) {
  auto view = table.expand({n, -1});
  // FACT: t = torch.randn(6); assert not raises(lambda: t.expand(3, -1).zero_())
  view.zero_(); // LOOKALIKE: tensor-inplace-on-expanded -- zero_ is accepted on expanded tensors
}

torch::Tensor jitter_positions(const torch::Tensor &pos, int64_t n, double sigma) {
  // FACT: p = torch.randn(6); assert raises(lambda: p.expand(3, -1).add_(torch.randn(3, 6)), "more than one element of the written-to tensor")
  return pos.expand({n, -1}).add_(torch::randn({n, pos.size(0)}) * sigma); // EXPECT: tensor-inplace-on-expanded
}
