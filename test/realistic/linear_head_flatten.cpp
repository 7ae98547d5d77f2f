// Prototype-network head: class scores against learned prototypes, flattened for a ranking loss.
#include <torch/torch.h>

struct ProtoHeadImpl : torch::nn::Module {
  ProtoHeadImpl(int64_t dim, int64_t n_protos) {
    embed_ = register_module("embed", torch::nn::Linear(dim, dim));
    protos_ = register_parameter("protos", torch::randn({n_protos, dim}));
  }

  // scores: [n_protos, B], one row per prototype, flattened prototype-major
  torch::Tensor forward(const torch::Tensor &x) {
    auto z = embed_(x);                         // [B, dim]
    auto scores = torch::matmul(z, protos_.t()); // [B, n_protos]
    // FACT: s = torch.randn(2, 3); assert raises(lambda: s.t().view(-1), "view size is not compatible")
    return scores.t().view({-1}); // EXPECT: tensor-view-non-contiguous
  }

  torch::nn::Linear embed_{nullptr};
  torch::Tensor protos_;
};
TORCH_MODULE(ProtoHead);

// Same flattening done safely for the contrastive loss.
torch::Tensor flat_scores(ProtoHead &head, const torch::Tensor &x) {
  auto s = torch::matmul(head->embed_(x), head->protos_.t());
  // FACT: s = torch.randn(2, 3); assert not raises(lambda: s.t().reshape(-1))
  return s.t().contiguous().view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- explicit contiguous() before the view
}
