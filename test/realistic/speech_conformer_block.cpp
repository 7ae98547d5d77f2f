// Conformer encoder for CTC speech recognition (Gulati et al. 2020): convolutional subsampling,
// then blocks of half-step (macaron) feed-forward modules, multi-head self-attention with
// Transformer-XL relative positions (learned biases u and v), and a convolution module that works
// on [B, C, T] (pointwise conv + GLU, depthwise conv, BatchNorm, Swish) inside a [B, T, C] block.
#include <torch/torch.h>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

struct ConformerConfig {
  int64_t n_mels = 80, d_model = 256, n_head = 4, ff_mult = 4, conv_kernel = 31, n_layers = 12, vocab = 500;
  double dropout = 0.1;
};

// Two kernel-3, stride-2 convolutions: [B, T, F] -> [B, T', d_model] with T' ~ T / 4.
struct ConvSubsamplingImpl : torch::nn::Module {
  explicit ConvSubsamplingImpl(const ConformerConfig &cfg) {
    namespace nn = torch::nn;
    conv_ = register_module("conv", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, cfg.d_model, 3).stride(2)), nn::ReLU(),
                                                   nn::Conv2d(nn::Conv2dOptions(cfg.d_model, cfg.d_model, 3).stride(2)),
                                                   nn::ReLU()));
    const int64_t f = ((cfg.n_mels - 1) / 2 - 1) / 2;
    out_ = register_module("out", nn::Linear(cfg.d_model * f, cfg.d_model));
  }
  torch::Tensor forward(const torch::Tensor &feats) {
    auto x = conv_->forward(feats.unsqueeze(1)); // [B, C, T', F']
    const auto B = x.size(0), C = x.size(1), T = x.size(2), F = x.size(3);
    // FACT: x = torch.randn(2, 4, 5, 3); assert raises(lambda: x.transpose(1, 2).view(2, 5, 12), "view size is not compatible")
    return out_(x.transpose(1, 2).view({B, T, C * F})); // EXPECT: tensor-view-non-contiguous -- time and frequency are not adjacent after the transpose
  }
  // Frames left after the two convolutions, per utterance.
  torch::Tensor output_lengths(const torch::Tensor &lengths) const {
    auto lens = lengths.contiguous();
    // FACT: l = torch.tensor([100, 73]); c = l.contiguous(); c.sub_(1).div_(2, rounding_mode='floor').sub_(1).div_(2, rounding_mode='floor'); assert shares_storage(c, l) and l.tolist() == [24, 17]
    lens.sub_(1).div_(2, "floor").sub_(1).div_(2, "floor"); // EXPECT: tensor-alias-then-mutate -- contiguous() returned the caller's lengths, which shrink too
    return lens;
  }
  torch::nn::Sequential conv_{nullptr};
  torch::nn::Linear out_{nullptr};
};
TORCH_MODULE(ConvSubsampling);

struct FeedForwardImpl : torch::nn::Module {
  explicit FeedForwardImpl(const ConformerConfig &cfg) {
    namespace nn = torch::nn;
    const auto D = cfg.d_model, H = cfg.ff_mult * cfg.d_model;
    net_ = register_module("net", nn::Sequential(nn::LayerNorm(nn::LayerNormOptions({D})), nn::Linear(D, H), nn::SiLU(),
                                                 nn::Dropout(cfg.dropout), nn::Linear(H, D), nn::Dropout(cfg.dropout)));
  }
  torch::Tensor forward(const torch::Tensor &x) { return net_->forward(x); }
  torch::nn::Sequential net_{nullptr};
};
TORCH_MODULE(FeedForward);

// Sinusoidal embeddings of the relative positions T-1, ..., -(T-1): [2T-1, d_model].
torch::Tensor rel_positions(int64_t T, int64_t d_model, const torch::TensorOptions &opts) {
  auto pos = torch::arange(T - 1, -T, -1, opts).unsqueeze(1);
  auto div = torch::exp(torch::arange(0, d_model, 2, opts) * (-std::log(10000.0) / d_model));
  auto pe = torch::zeros({2 * T - 1, d_model}, opts);
  pe.slice(1, 0, d_model, 2).copy_(torch::sin(pos * div));
  pe.slice(1, 1, d_model, 2).copy_(torch::cos(pos * div));
  return pe;
}

struct RelPositionMHSAImpl : torch::nn::Module {
  explicit RelPositionMHSAImpl(const ConformerConfig &cfg) : n_head_(cfg.n_head), d_k_(cfg.d_model / cfg.n_head) {
    namespace nn = torch::nn;
    ln_ = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})));
    q_ = register_module("q", nn::Linear(cfg.d_model, cfg.d_model));
    k_ = register_module("k", nn::Linear(cfg.d_model, cfg.d_model));
    v_ = register_module("v", nn::Linear(cfg.d_model, cfg.d_model));
    pos_ = register_module("pos", nn::Linear(nn::LinearOptions(cfg.d_model, cfg.d_model).bias(false)));
    out_ = register_module("out", nn::Linear(cfg.d_model, cfg.d_model));
    drop_ = register_module("drop", nn::Dropout(cfg.dropout));
    pos_bias_u_ = register_parameter("pos_bias_u", torch::empty({n_head_, d_k_}));
    pos_bias_v_ = register_parameter("pos_bias_v", torch::empty({n_head_, d_k_}));
    reset_parameters();
  }
  void reset_parameters() {
    const double bound = std::sqrt(6.0 / double(n_head_ + d_k_));
    // FACT: p = torch.nn.Parameter(torch.empty(4, 16)); torch.nn.init.uniform_(p, -0.1, 0.1); assert p.is_leaf and p.requires_grad
    torch::nn::init::uniform_(pos_bias_u_, -bound, bound); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    // FACT: p = torch.nn.Parameter(torch.empty(4, 16)); assert raises(lambda: p.uniform_(-0.1, 0.1), "a leaf Variable that requires grad")
    pos_bias_v_.uniform_(-bound, bound); // EXPECT: tensor-inplace-on-leaf -- a registered parameter written with grad mode on
  }

  // Transformer-XL relative shift: [B, H, T, 2T-1] -> [B, H, T, T], entry (i, j) for offset i - j.
  static torch::Tensor rel_shift(const torch::Tensor &x) {
    const auto B = x.size(0), H = x.size(1), T = x.size(2), P = x.size(3);
    auto zero_pad = torch::zeros({B, H, T, 1}, x.options()); // LOOKALIKE: tensor-device-mismatch -- made with the scores' options
    auto padded = torch::cat({zero_pad, x}, -1).view({B, H, P + 1, T});
    // FACT: x = torch.randn(2, 3, 4, 7); p = torch.cat([torch.zeros(2, 3, 4, 1), x], -1).view(2, 3, 8, 4); s = p.narrow(2, 1, 7); assert not is_contiguous(s) and is_view_of(s.view(2, 3, 4, 7), p)
    return padded.narrow(2, 1, P).view({B, H, T, P}).narrow(-1, 0, P / 2 + 1); // LOOKALIKE: tensor-view-non-contiguous -- dropping the first row leaves the rest one block: the split is a view
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &pad_mask) {
    const auto B = x.size(0), T = x.size(1);
    auto h = ln_(x);
    // FACT: y = torch.nn.Linear(8, 8)(torch.randn(2, 5, 8)); assert is_view_of(y.view(2, 5, 2, 4), y)
    auto q = q_(h).view({B, T, n_head_, d_k_}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto k = k_(h).view({B, T, n_head_, d_k_}).transpose(1, 2);
    auto v = v_(h).view({B, T, n_head_, d_k_}).transpose(1, 2);
    auto p = pos_(rel_positions(T, n_head_ * d_k_, x.options())).view({1, 2 * T - 1, n_head_, d_k_}).transpose(1, 2);
    auto q_u = (q + pos_bias_u_).transpose(1, 2); // [B, H, T, d_k]
    auto q_v = (q + pos_bias_v_).transpose(1, 2);
    auto ac = torch::matmul(q_u, k.transpose(-2, -1));
    auto bd = rel_shift(torch::matmul(q_v, p.transpose(-2, -1)));
    auto scores = (ac + bd) / std::sqrt(double(d_k_));
    scores = scores.masked_fill(pad_mask.unsqueeze(1).unsqueeze(2), -1e4);
    auto attn = drop_(torch::softmax(scores, -1));
    auto ctx = torch::matmul(attn, v); // [B, H, T, d_k]
    // FACT: c = torch.randn(2, 4, 5, 3); assert is_copy_of(c.transpose(1, 2).reshape(2, 5, 12), c)
    return out_(ctx.transpose(1, 2).reshape({B, T, n_head_ * d_k_})); // EXPECT: tensor-reshape-non-contiguous -- the head merge copies the context in every layer
  }

  int64_t n_head_, d_k_;
  torch::nn::LayerNorm ln_{nullptr};
  torch::nn::Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, pos_{nullptr}, out_{nullptr};
  torch::nn::Dropout drop_{nullptr};
  torch::Tensor pos_bias_u_, pos_bias_v_;
};
TORCH_MODULE(RelPositionMHSA);

struct ConvModuleImpl : torch::nn::Module {
  explicit ConvModuleImpl(const ConformerConfig &cfg) {
    namespace nn = torch::nn;
    const auto C = cfg.d_model, K = cfg.conv_kernel;
    ln_ = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({C})));
    pw1_ = register_module("pw1", nn::Conv1d(nn::Conv1dOptions(C, 2 * C, 1)));
    dw_ = register_module("dw", nn::Conv1d(nn::Conv1dOptions(C, C, K).padding((K - 1) / 2).groups(C)));
    bn_ = register_module("bn", nn::BatchNorm1d(C));
    pw2_ = register_module("pw2", nn::Conv1d(nn::Conv1dOptions(C, C, 1)));
    drop_ = register_module("drop", nn::Dropout(cfg.dropout));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &pad_mask) {
    auto y = ln_(x).transpose(1, 2); // [B, C, T]
    y = torch::glu(pw1_(y), 1);
    // Padded frames must not leak into the depthwise convolution's receptive field.
    // FACT: c = torch.nn.Conv1d(4, 8, 1); y = torch.nn.functional.glu(c(torch.randn(2, 4, 5)), 1); m = torch.zeros(2, 1, 5, dtype=torch.bool); m[:, :, 3:] = True; y.masked_fill_(m, 0.0); y.sum().backward(); assert c.weight.grad is not None
    y.masked_fill_(pad_mask.unsqueeze(1), 0.0); // LOOKALIKE: tensor-inplace-on-saved -- glu saves its input, not its output
    y = torch::silu(bn_(dw_(y)));
    y = drop_(pw2_(y));
    return y.transpose(1, 2); // [B, T, C]
  }
  torch::nn::LayerNorm ln_{nullptr};
  torch::nn::Conv1d pw1_{nullptr}, dw_{nullptr}, pw2_{nullptr};
  torch::nn::BatchNorm1d bn_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(ConvModule);

struct ConformerBlockImpl : torch::nn::Module {
  explicit ConformerBlockImpl(const ConformerConfig &cfg) {
    ff1_ = register_module("ff1", FeedForward(cfg));
    mhsa_ = register_module("mhsa", RelPositionMHSA(cfg));
    conv_ = register_module("conv", ConvModule(cfg));
    ff2_ = register_module("ff2", FeedForward(cfg));
    ln_out_ = register_module("ln_out", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &pad_mask) {
    auto h = x + 0.5 * ff1_(x);
    h = h + mhsa_(h, pad_mask);
    h = h + conv_(h, pad_mask);
    h = h + 0.5 * ff2_(h);
    return ln_out_(h);
  }
  FeedForward ff1_{nullptr}, ff2_{nullptr};
  RelPositionMHSA mhsa_{nullptr};
  ConvModule conv_{nullptr};
  torch::nn::LayerNorm ln_out_{nullptr};
};
TORCH_MODULE(ConformerBlock);

struct ConformerEncoderImpl : torch::nn::Module {
  explicit ConformerEncoderImpl(const ConformerConfig &cfg) : xscale_(std::sqrt(double(cfg.d_model))) {
    subsample_ = register_module("subsample", ConvSubsampling(cfg));
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      blocks_.push_back(register_module("block" + std::to_string(i), ConformerBlock(cfg)));
    ctc_ = register_module("ctc", torch::nn::Linear(cfg.d_model, cfg.vocab));
  }
  // feats [B, T, n_mels], lengths [B] -> CTC log-probs [B, T', vocab] and T' per utterance.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &feats, const torch::Tensor &lengths) {
    auto x = subsample_->forward(feats);
    auto out_lens = subsample_->output_lengths(lengths);
    const auto T = x.size(1);
    auto pad_mask = torch::arange(T, out_lens.options()).unsqueeze(0) >= out_lens.unsqueeze(1); // [B, T']
    // FACT: x = torch.rand(2, 3); h = x.clone(); h.mul_(16.0); assert torch.equal(h, x.mul(16.0)) and is_copy_of(x.mul(16.0), x)
    auto h = x.clone(); // EXPECT: tensor-unnecessary-clone -- x * xscale_ makes the scaled copy in one pass
    h.mul_(xscale_);
    for (auto &blk : blocks_) h = blk->forward(h, pad_mask);
    return {torch::log_softmax(ctc_(h), -1), out_lens};
  }
  double xscale_;
  ConvSubsampling subsample_{nullptr};
  std::vector<ConformerBlock> blocks_;
  torch::nn::Linear ctc_{nullptr};
};
TORCH_MODULE(ConformerEncoder);

// Greedy CTC decoding of one utterance on the GPU; frames come from the host feature frontend.
std::vector<int64_t> transcribe(ConformerEncoder &enc, const std::vector<float> &frames, int64_t n_mels) {
  torch::NoGradGuard no_grad;
  enc->eval();
  enc->to(torch::kCUDA);
  // FACT: f = torch.tensor([0.5] * 24); assert is_view_of(f.view(1, -1, 8), f)
  auto feats = torch::tensor(frames).view({1, -1, n_mels}); // LOOKALIKE: tensor-view-non-contiguous -- torch::tensor of a vector is contiguous
  auto lens = torch::full({1}, feats.size(1), torch::kLong);
  auto [logp, out_lens] = enc->forward(feats, lens); // EXPECT: tensor-device-mismatch -- the features stay on the CPU, the encoder moved to the GPU
  auto best = logp.squeeze(0).argmax(-1).cpu();
  std::vector<int64_t> tokens;
  int64_t prev = 0;
  for (int64_t t = 0; t < best.size(0); ++t) {
    const auto k = best[t].item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- 'best' is on the host, and the id steers the decoding
    if (k != 0 && k != prev) tokens.push_back(k);
    prev = k;
  }
  return tokens;
}
