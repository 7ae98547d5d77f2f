// Retrieval model: embeddings are normalised and cached for nearest-neighbour search.
#include <torch/torch.h>
#include <vector>

struct EmbedderImpl : torch::nn::Module {
  EmbedderImpl(int64_t in, int64_t dim) { fc_ = register_module("fc", torch::nn::Linear(in, dim)); }
  torch::Tensor forward(const torch::Tensor &x) { return fc_(x); }
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(Embedder);

class FeatureCache {
public:
  // Returns the embeddings for the training loss and caches a normalised copy.
  torch::Tensor embed_and_cache(Embedder &model, const torch::Tensor &x) {
    auto emb = model->forward(x);
    auto cached = emb.detach();
    // FACT: e = torch.randn(2, 3, requires_grad=True) * 1; c = e.detach(); c.div_(2); assert shares_storage(c, e)
    cached.div_(cached.norm(2, -1, true)); // EXPECT: tensor-inplace-on-detached
    bank_.push_back(cached);
    return emb;
  }

  torch::Tensor embed_and_cache_ok(Embedder &model, const torch::Tensor &x) {
    auto emb = model->forward(x);
    auto cached = emb.detach().clone();
    cached.div_(cached.norm(2, -1, true)); // LOOKALIKE: tensor-inplace-on-detached -- an owned copy
    bank_.push_back(cached);
    return emb;
  }

  torch::Tensor nearest(const torch::Tensor &q) const {
    auto bank = torch::cat(bank_);
    return torch::matmul(q, bank.t()).argmax(1);
  }

private:
  std::vector<torch::Tensor> bank_;
};
