// Additive attention masks for a small transformer: padding and causal masks
// broadcast over heads before they are added to the scores.
#include <torch/torch.h>

struct MaskBuilder {
  int64_t n_heads;

  // key_pad: [B, T] bool, true where padded -> additive mask [B, nh, T, T]
  torch::Tensor additive(const torch::Tensor &key_pad) {
    auto B = key_pad.size(0), T = key_pad.size(1);
    auto keep = key_pad.logical_not().to(torch::kFloat);
    auto mask = keep.unsqueeze(1).unsqueeze(2).expand({B, n_heads, T, T});
    // FACT: m = torch.zeros(2, 5).unsqueeze(1).unsqueeze(2).expand(2, 4, 5, 5); assert raises(lambda: m.sub_(1.0), "more than one element of the written-to tensor")
    mask.sub_(1.0).mul_(1e9); // EXPECT: tensor-inplace-on-expanded
    return mask;
  }

  torch::Tensor additive_ok(const torch::Tensor &key_pad) {
    auto B = key_pad.size(0), T = key_pad.size(1);
    auto keep = key_pad.logical_not().to(torch::kFloat);
    auto mask = keep.unsqueeze(1).unsqueeze(2).expand({B, n_heads, T, T}).clone();  // EXPECT: tensor-unnecessary-clone -- rewritten in place at once (sub_ then mul_): the expand's sub(1.0) makes the same tensor in one pass
    // FACT: m = torch.zeros(2, 5).unsqueeze(1).unsqueeze(2).expand(2, 4, 5, 5).clone(); assert not raises(lambda: m.sub_(1.0))
    mask.sub_(1.0).mul_(1e9); // LOOKALIKE: tensor-inplace-on-expanded -- cloned: memory of its own
    return mask;
  }

  // Causal mask filled where the padding says so (masked_fill_ on an expanded mask only warns).
  torch::Tensor causal(const torch::Tensor &scores, const torch::Tensor &pad) {
    auto T = scores.size(-1);
    auto causal = torch::ones({T, T}, torch::kBool).triu(1);
    auto m = causal.unsqueeze(0).expand({scores.size(0), T, T});
    // FACT: m = torch.ones(3, 3, dtype=torch.bool).triu(1).unsqueeze(0).expand(2, 3, 3); assert not raises(lambda: m.masked_fill_(torch.zeros(2, 3, 3, dtype=torch.bool), True))
    m.masked_fill_(pad.unsqueeze(1), true); // LOOKALIKE: tensor-inplace-on-expanded -- masked_fill_ on an expanded tensor only warns
    return scores.masked_fill(m, -1e9);
  }

  torch::Tensor scaled(const torch::Tensor &scores, const torch::Tensor &head_scale) {
    // head_scale: [nh] -> [B, nh, T, T]
    auto s = head_scale.view({1, -1, 1, 1}).expand_as(scores);
    // FACT: s = torch.randn(4).view(1, -1, 1, 1).expand(2, 4, 3, 3); sc = torch.randn(2, 4, 3, 3); assert not raises(lambda: sc.mul_(s))
    return scores.mul_(s); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read
  }
};
