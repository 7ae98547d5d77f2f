// Autoregressive sampling from a decoder-only model on the GPU.
#include <torch/torch.h>
#include <vector>

struct DecoderImpl : torch::nn::Module {
  DecoderImpl(int64_t vocab, int64_t dim) {
    emb_ = register_module("emb", torch::nn::Embedding(vocab, dim));
    head_ = register_module("head", torch::nn::Linear(dim, vocab));
  }
  torch::Tensor forward(const torch::Tensor &tokens, const torch::Tensor &mask) {
    auto h = emb_(tokens);
    auto T = tokens.size(1);
    auto att = torch::softmax(torch::matmul(h, h.transpose(1, 2)).masked_fill(mask.narrow(0, 0, T).narrow(1, 0, T) == 0, -1e9), -1);
    return head_(torch::matmul(att, h));
  }
  torch::nn::Embedding emb_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Decoder);

std::vector<int64_t> generate(Decoder &model, std::vector<int64_t> prompt, int64_t max_new, int64_t ctx) {
  torch::NoGradGuard no_grad;
  auto causal = torch::ones({ctx, ctx}).tril();
  for (int64_t i = 0; i < max_new; ++i) {
    auto tokens = torch::tensor(prompt, torch::kLong).unsqueeze(0).to(torch::kCUDA); // LOOKALIKE: tensor-clone-in-loop -- the prompt grows every step
    auto mask = causal.to(torch::kCUDA); // EXPECT: tensor-clone-in-loop
    auto logits = model->forward(tokens, mask);
    auto next = logits.select(1, -1).argmax(-1).item<int64_t>();
    prompt.push_back(next);
  }
  return prompt;
}
