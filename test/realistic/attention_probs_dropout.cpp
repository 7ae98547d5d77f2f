// Single-head self-attention with a padding mask and attention dropout.
#include <torch/torch.h>
#include <cmath>

struct SelfAttention : torch::nn::Module {
  SelfAttention(int64_t d) : d_(d) {
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    out = register_module("out", torch::nn::Linear(d, d));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &pad_mask) {
    auto parts = qkv(x).chunk(3, -1);
    auto scores = parts[0].matmul(parts[1].transpose(-2, -1)) / std::sqrt(double(d_));
    scores.masked_fill_(pad_mask, -1e9); // LOOKALIKE: tensor-inplace-on-saved -- division by a number saves no tensor
    auto attn = torch::softmax(scores, -1);
    // FACT: s = torch.randn(2, 3, 3, requires_grad=True) * 1; assert backward_fails(lambda: (lambda a: (a.masked_fill_(torch.zeros(3, dtype=torch.bool), 0.0), a.sum().backward()))(torch.softmax(s, -1)))
    attn.masked_fill_(pad_mask, 0.0); // EXPECT: tensor-inplace-on-saved
    auto dropped = torch::dropout(attn, 0.1, is_training());
    return out(dropped.matmul(parts[2]));
  }
  int64_t d_;
  torch::nn::Linear qkv{nullptr}, out{nullptr};
};

int main() {
  SelfAttention att(16);
  auto x = torch::randn({2, 5, 16});
  auto mask = torch::zeros({2, 5, 5}, torch::kBool);
  auto y = att.forward(x, mask);
  y.pow(2).mean().backward();
}
