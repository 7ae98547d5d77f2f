// A bag-of-words text classifier whose padding row is kept at zero.
#include <torch/torch.h>

struct BagClassifier : torch::nn::Module {
  BagClassifier(int64_t vocab, int64_t dim, int64_t classes, int64_t pad) : pad_(pad) {
    emb = register_module("emb", torch::nn::Embedding(vocab, dim));
    out = register_module("out", torch::nn::Linear(dim, classes));
    // FACT: e = torch.nn.Embedding(5, 3); assert raises(lambda: e.weight[0].zero_(), "a view of a leaf Variable")
    emb->weight[pad].zero_(); // EXPECT: tensor-inplace-on-leaf
  }
  torch::Tensor forward(torch::Tensor tokens) {
    auto e = emb(tokens);
    auto mask = tokens.ne(pad_).unsqueeze(-1).to(e.dtype());
    auto pooled = (e * mask).sum(1) / mask.sum(1).clamp_min(1.0);
    return out(pooled);
  }
  void reset_padding() {
    torch::NoGradGuard no_grad;
    emb->weight[pad_].zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  void scale_embeddings(double s) {
    // FACT: e = torch.nn.Embedding(5, 3); assert raises(lambda: e.weight.mul_(2), "leaf Variable that requires grad")
    emb->weight.mul_(s); // EXPECT: tensor-inplace-on-leaf
  }
  int64_t pad_;
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear out{nullptr};
};

int main() {
  BagClassifier model(100, 16, 3, 0);
  auto tokens = torch::randint(0, 100, {4, 12});
  auto logits = model.forward(tokens);
  auto loss = torch::nn::functional::cross_entropy(logits, torch::randint(0, 3, {4}));
  loss.backward();
  model.reset_padding();
}
