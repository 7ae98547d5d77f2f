// wav2vec 2.0 (Baevski et al. 2020) self-supervised pretraining on raw 16 kHz audio.
// A 7-layer conv feature encoder turns the waveform into 50 Hz frames; spans of frames are masked
// with a learned embedding before a transformer context network, while the unmasked frames are
// discretised by a product quantizer (G codebooks of V entries, straight-through Gumbel softmax).
// The contrastive loss picks each masked frame's quantized target among K distractors drawn from
// other frames of the same utterance; a diversity term keeps the codebooks in use. The trained
// quantizer also exports discrete units for a second-stage model.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct W2vConfig {
  std::vector<int64_t> conv_dims{512, 512, 512, 512, 512, 512, 512};
  std::vector<int64_t> kernels{10, 3, 3, 3, 3, 2, 2};
  std::vector<int64_t> strides{5, 2, 2, 2, 2, 2, 2};
  int64_t dim = 768, layers = 12, heads = 12, ffn = 3072, code_dim = 256, groups = 2, entries = 320;
  int64_t num_negatives = 100, mask_length = 10, batch = 8, crop = 250000, steps = 400000, log_every = 200;
  int64_t pos_conv_kernel = 128, pos_conv_groups = 16;
  double mask_prob = 0.65, logit_temp = 0.1, max_temp = 2.0, min_temp = 0.5, temp_decay = 0.999995;
  double diversity_weight = 0.1, feature_pen_weight = 10.0, lr = 5e-4;
};

// [B, L] waveform -> [B, C, T] frames (stride 320, receptive field 400 samples).
struct FeatureEncoderImpl : nn::Module {
  explicit FeatureEncoderImpl(const W2vConfig &cfg) {
    int64_t in = 1;
    for (size_t i = 0; i < cfg.conv_dims.size(); ++i) {
      nn::Sequential layer(nn::Conv1d(nn::Conv1dOptions(in, cfg.conv_dims[i], cfg.kernels[i]).stride(cfg.strides[i]).bias(false)));
      if (i == 0)
        layer->push_back(nn::GroupNorm(nn::GroupNormOptions(cfg.conv_dims[i], cfg.conv_dims[i])));
      layer->push_back(nn::GELU());
      convs.push_back(register_module("conv" + std::to_string(i), layer));
      in = cfg.conv_dims[i];
    }
  }
  torch::Tensor forward(const torch::Tensor &wav) {
    auto x = wav.unsqueeze(1);
    for (auto &layer : convs)
      x = layer->forward(x);
    return x;
  }
  std::vector<nn::Sequential> convs;
};
TORCH_MODULE(FeatureEncoder);

struct QuantizerOutput {
  torch::Tensor quantized, prob_perplexity, code_perplexity;
};

// Product quantizer: G groups of V codevectors, one picked per group by a hard Gumbel softmax.
struct GumbelQuantizerImpl : nn::Module {
  GumbelQuantizerImpl(int64_t in_dim, const W2vConfig &cfg) : G_(cfg.groups), V_(cfg.entries) {
    codevectors = register_parameter("codevectors", torch::rand({1, G_ * V_, cfg.code_dim / G_}));
    weight_proj = register_module("weight_proj", nn::Linear(in_dim, G_ * V_));
    nn::init::normal_(weight_proj->weight, 0.0, 1.0); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own NoGradGuard
    // FACT: l = torch.nn.Linear(4, 6); assert raises(lambda: l.bias.zero_(), "a leaf Variable that requires grad")
    weight_proj->bias.zero_(); // EXPECT: tensor-inplace-on-leaf -- the bias requires grad and no guard is active: the constructor throws
  }

  QuantizerOutput forward(const torch::Tensor &x, double tau) {
    const auto B = x.size(0), T = x.size(1);
    // FACT: y = torch.nn.Linear(4, 6)(torch.randn(2, 5, 4)); assert is_view_of(y.view(30, 2), y)
    auto logits = weight_proj(x).view({B * T * G_, V_}); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous
    auto codes = std::get<1>(logits.max(-1));
    auto hard = torch::zeros_like(logits).scatter_(1, codes.unsqueeze(1), 1.0).view({B * T, G_, V_});
    auto hard_probs = hard.mean(0);
    auto code_ppl = torch::exp(-(hard_probs * torch::log(hard_probs + 1e-7)).sum(-1)).sum();
    auto avg_probs = torch::softmax(logits.view({B * T, G_, V_}), -1).mean(0);
    auto prob_ppl = torch::exp(-(avg_probs * torch::log(avg_probs + 1e-7)).sum(-1)).sum();
    auto onehot = is_training() ? F::gumbel_softmax(logits, F::GumbelSoftmaxFuncOptions().tau(tau).hard(true).dim(-1))
                                : hard.view({B * T * G_, V_});
    auto q = (onehot.view({B * T, G_ * V_, 1}) * codevectors).view({B * T, G_, V_, -1}).sum(-2);
    return {q.view({B, T, -1}), prob_ppl, code_ppl};
  }

  int64_t G_, V_;
  torch::Tensor codevectors;
  nn::Linear weight_proj{nullptr};
};
TORCH_MODULE(GumbelQuantizer);

// Convolutional relative position embedding plus a sequence-first transformer encoder.
struct ContextNetworkImpl : nn::Module {
  explicit ContextNetworkImpl(const W2vConfig &cfg) {
    pos_conv = register_module("pos_conv", nn::Conv1d(nn::Conv1dOptions(cfg.dim, cfg.dim, cfg.pos_conv_kernel)
                                                          .padding(cfg.pos_conv_kernel / 2)
                                                          .groups(cfg.pos_conv_groups)));
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({cfg.dim})));
    auto layer = nn::TransformerEncoderLayerOptions(cfg.dim, cfg.heads).dim_feedforward(cfg.ffn).dropout(0.1).activation(torch::kGELU);
    encoder = register_module("encoder", nn::TransformerEncoder(nn::TransformerEncoderOptions(layer, cfg.layers)));
  }
  // [B, T, D] -> [B, T, D]
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &pad) {
    auto pos = F::gelu(pos_conv(x.transpose(1, 2))); // [B, D, T + 1]: the even kernel adds a frame
    auto h = norm(x + pos.narrow(2, 0, x.size(1)).transpose(1, 2));
    return encoder->forward(h.transpose(0, 1), {}, pad).transpose(0, 1);
  }
  nn::Conv1d pos_conv{nullptr};
  nn::LayerNorm norm{nullptr};
  nn::TransformerEncoder encoder{nullptr};
};
TORCH_MODULE(ContextNetwork);

// Spans of mask_length frames, each frame starting one with probability mask_prob / mask_length;
// padding frames are never masked.
torch::Tensor span_mask(const torch::Tensor &pad, const W2vConfig &cfg) {
  const auto L = cfg.mask_length;
  auto starts = (torch::rand(pad.sizes(), torch::TensorOptions().device(pad.device())) < cfg.mask_prob / static_cast<double>(L)).to(torch::kFloat);
  auto covered = F::max_pool1d(F::pad(starts.unsqueeze(1), F::PadFuncOptions({L - 1, 0})), F::MaxPool1dFuncOptions(L).stride(1)).squeeze(1);
  return (covered > 0) & pad.logical_not();
}

// Replaces the masked frames of x by the learned embedding, in place.
void apply_mask(torch::Tensor x, const torch::Tensor &mask, const torch::Tensor &emb) { x.index_put_({mask}, emb); }

// K distractors per frame, drawn uniformly from the other valid frames of the same utterance: [K, B, T, C].
torch::Tensor sample_negatives(const torch::Tensor &y, const torch::Tensor &pad, int64_t K) {
  const auto B = y.size(0), T = y.size(1), C = y.size(2);
  torch::Tensor idx;
  {
    torch::NoGradGuard no_grad;
    auto valid_len = pad.logical_not().sum(1); // [B]
    auto high = valid_len.unsqueeze(1).expand({B, T * K});
    // FACT: v = torch.tensor([5, 7]); h = v.unsqueeze(1).expand(2, 12); assert raises(lambda: h.sub_(1), "single memory location")
    high.sub_(1); // EXPECT: tensor-inplace-on-expanded -- the T*K columns are one length per utterance in memory: sub_ raises
    idx = (torch::rand({B, T * K}, y.options()) * high).floor().to(torch::kLong);
    auto anchor = torch::div(torch::arange(T * K, idx.options()), K, "floor").unsqueeze(0);
    // FACT: f = (torch.rand(2, 6) * 4).floor(); i = f.to(torch.long); i += (i >= torch.arange(6) // 2).long(); assert is_copy_of(i, f)
    idx += (idx >= anchor).to(torch::kLong); // LOOKALIKE: tensor-alias-then-mutate -- idx is floor().to(kLong) of fresh values: a tensor of its own
    idx += (torch::arange(B, idx.options()) * T).unsqueeze(1);
  }
  // FACT: y = torch.nn.Linear(4, 3)(torch.randn(2, 5, 4)); assert is_view_of(y.view(10, 3), y)
  auto negs = y.view({B * T, C}).index_select(0, idx.view(-1)); // LOOKALIKE: tensor-view-non-contiguous -- the projected targets are a contiguous Linear output
  return negs.view({B, T, K, C}).permute({2, 0, 1, 3});
}

struct W2vOutput {
  torch::Tensor contrastive, prob_perplexity, code_perplexity, features_pen;
};

struct Wav2Vec2Impl : nn::Module {
  explicit Wav2Vec2Impl(const W2vConfig &cfg) : cfg_(cfg) {
    features = register_module("features", FeatureEncoder(cfg));
    layer_norm = register_module("layer_norm", nn::LayerNorm(nn::LayerNormOptions({cfg.conv_dims.back()})));
    post_proj = register_module("post_proj", nn::Linear(cfg.conv_dims.back(), cfg.dim));
    quantizer = register_module("quantizer", GumbelQuantizer(cfg.dim, cfg));
    project_q = register_module("project_q", nn::Linear(cfg.code_dim, cfg.code_dim));
    context = register_module("context", ContextNetwork(cfg));
    final_proj = register_module("final_proj", nn::Linear(cfg.dim, cfg.code_dim));
    mask_emb = register_parameter("mask_emb", torch::rand({cfg.dim}));
  }

  W2vOutput forward(const torch::Tensor &wav, const torch::Tensor &wav_pad, double tau) {
    auto conv = features->forward(wav); // [B, C, T]
    auto features_pen = conv.pow(2).mean();
    auto x = post_proj(layer_norm(conv.transpose(1, 2))); // [B, T, D]
    const auto B = x.size(0), T = x.size(1), K = cfg_.num_negatives;
    // A frame is padding when every sample it covers is.
    auto pad = wav_pad;
    const auto extra = pad.size(1) % T;
    if (extra > 0)
      pad = pad.narrow(1, 0, pad.size(1) - extra);
    // FACT: p = torch.zeros(2, 103, dtype=torch.bool); q = p[:, :100]; assert not is_contiguous(q) and is_view_of(q.view(2, 10, -1), p)
    pad = pad.view({B, T, -1}).all(-1); // LOOKALIKE: tensor-view-non-contiguous -- splitting the last dim of a row slice is always a view
    auto mask = span_mask(pad, cfg_);
    auto unmasked = x; // the quantizer targets are the frames before masking
    // FACT: f = torch.nn.Linear(4, 4)(torch.randn(2, 5, 4)); f0 = f.detach().clone(); u = f; m = torch.zeros(2, 5, dtype=torch.bool); m[0, 1] = True; f.index_put_((m,), torch.zeros(4)); assert shares_storage(u, f) and not torch.equal(u.detach(), f0)
    apply_mask(x, mask, mask_emb); // EXPECT: tensor-alias-then-mutate -- unmasked is x: the masked frames' targets become the mask embedding
    auto c = context->forward(x, pad); // [B, T, D]
    auto qo = quantizer->forward(unmasked, tau);
    // FACT: q = (torch.rand(6, 4, 1) * torch.randn(1, 4, 2)).view(6, 2, 2, -1).sum(-2).view(2, 3, -1); assert is_view_of(q.view(6, -1), q)
    auto y = project_q(qo.quantized.view({B * T, -1})).view({B, T, -1}); // LOOKALIKE: tensor-view-non-contiguous -- the quantizer returns a view of a fresh sum: contiguous
    // FACT: s = torch.randn(5, 2, 8).transpose(0, 1); assert raises(lambda: s.view(10, 8), "view size is not compatible")
    auto c_flat = c.view({B * T, -1}); // EXPECT: tensor-view-non-contiguous -- the encoder runs sequence-first: c is its [T, B, D] output transposed, view throws
    auto c_p = final_proj(c_flat).view({B, T, -1});

    auto negs = sample_negatives(y, pad, K);                      // [K, B, T, C]
    auto targets = torch::cat({y.unsqueeze(0), negs}, 0);          // [K + 1, B, T, C]
    auto logits = F::cosine_similarity(c_p.unsqueeze(0), targets, F::CosineSimilarityFuncOptions().dim(-1)) / cfg_.logit_temp;
    auto neg_is_pos = (negs == y.unsqueeze(0)).all(-1);           // identical codes are no distractors
    // FACT: a = torch.randn(3, 2, 4, requires_grad=True); l = torch.nn.functional.cosine_similarity(a[:1], a, dim=-1) / 0.1; l[1:].masked_fill_(torch.rand(2, 2) < 0.5, float('-inf')); l.logsumexp(0).sum().backward(); assert a.grad is not None
    logits.narrow(0, 1, K).masked_fill_(neg_is_pos, -std::numeric_limits<double>::infinity()); // LOOKALIKE: tensor-inplace-on-saved -- division by a number saves no tensor
    // FACT: l = torch.randn(11, 2, 7); assert is_copy_of(l.transpose(0, 2).reshape(-1, 11), l)
    auto lg = logits.transpose(0, 2).reshape({-1, K + 1}); // EXPECT: tensor-reshape-non-contiguous -- [T, B, K+1] with B outer-strided: the (K+1) B T logits are copied every step
    auto zeros = torch::zeros({lg.size(0)}, torch::TensorOptions().dtype(torch::kLong).device(lg.device())); // LOOKALIKE: tensor-device-mismatch -- made on the logits' device
    auto per_frame = F::cross_entropy(lg, zeros, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    // FACT: m = torch.rand(3, 7) < 0.5; assert not raises(lambda: m.transpose(0, 1).contiguous().view(-1))
    auto w = mask.transpose(0, 1).contiguous().view(-1).to(per_frame.dtype()); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first, in the logits' (T, B) order
    auto contrastive = (per_frame * w).sum() / w.sum().clamp_min(1.0);
    return {contrastive, qo.prob_perplexity, qo.code_perplexity, features_pen};
  }

  W2vConfig cfg_;
  FeatureEncoder features{nullptr};
  nn::LayerNorm layer_norm{nullptr};
  nn::Linear post_proj{nullptr}, project_q{nullptr}, final_proj{nullptr};
  GumbelQuantizer quantizer{nullptr};
  ContextNetwork context{nullptr};
  torch::Tensor mask_emb;
};
TORCH_MODULE(Wav2Vec2);

// Random fixed-length crops of the (already normalised) training waveforms.
class CropLoader {
public:
  CropLoader(std::vector<torch::Tensor> waves, int64_t batch, int64_t crop) : waves_(std::move(waves)), batch_(batch), crop_(crop) {}
  torch::Tensor next() {
    std::vector<torch::Tensor> crops;
    while (static_cast<int64_t>(crops.size()) < batch_) {
      const auto &w = waves_[torch::randint(static_cast<int64_t>(waves_.size()), {1}).item<int64_t>()]; // LOOKALIKE: tensor-sync-in-loop -- a host tensor, used as an index
      if (w.size(0) < crop_)
        continue;
      const auto start = torch::randint(w.size(0) - crop_ + 1, {1}).item<int64_t>();
      crops.push_back(w.narrow(0, start, crop_));
    }
    return torch::stack(crops);
  }

private:
  std::vector<torch::Tensor> waves_;
  int64_t batch_, crop_;
};

void pretrain(Wav2Vec2 &model, CropLoader &loader, const W2vConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).betas({0.9, 0.98}).eps(1e-6).weight_decay(0.01));
  const double n_codes = static_cast<double>(cfg.groups * cfg.entries);
  auto no_pad = torch::zeros({cfg.batch, cfg.crop}, torch::kBool); // every crop is full length
  std::vector<torch::Tensor> ppl_window;
  double running = 0;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto wav = loader.next().to(device); // LOOKALIKE: tensor-clone-in-loop -- new crops every step
    auto pad = no_pad.to(device); // EXPECT: tensor-clone-in-loop -- the same all-false mask is copied to the device at every step
    const double tau = std::max(cfg.max_temp * std::pow(cfg.temp_decay, static_cast<double>(step)), cfg.min_temp);
    auto out = model->forward(wav, pad, tau);
    auto diversity = (n_codes - out.prob_perplexity) / n_codes;
    auto loss = out.contrastive + cfg.diversity_weight * diversity + cfg.feature_pen_weight * out.features_pen;
    opt.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), 10.0);
    opt.step();
    ppl_window.push_back(out.prob_perplexity); // EXPECT: tensor-graph-kept-across-iterations -- the perplexity still holds its graph back into the encoder for up to log_every steps
    running += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- a GPU wait every step only to average the loss
    if (step % cfg.log_every == 0) {
      const auto ppl = torch::stack(ppl_window).mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
      std::cout << "step " << step << " loss " << running / static_cast<double>(cfg.log_every) << " prob ppl " << ppl << " code ppl "
                << out.code_perplexity.item<double>() << " tau " << tau << "\n"; // LOOKALIKE: tensor-sync-in-loop -- inside the log_every branch
      ppl_window.clear();
      running = 0;
    }
  }
}

// Discrete units (one code per group and frame) for a HuBERT-style second stage, stored as bytes.
torch::Tensor export_units(Wav2Vec2 &model, const torch::Tensor &wav, const W2vConfig &cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto frames = model->post_proj(model->layer_norm(model->features->forward(wav.unsqueeze(0)).transpose(1, 2))).squeeze(0);
  auto codes = model->quantizer->weight_proj(frames).view({frames.size(0), cfg.groups, cfg.entries}).argmax(-1); // [T, G] int64
  auto packed = torch::empty({frames.size(0), cfg.groups}, torch::kByte);
  // FACT: u = torch.empty(3, dtype=torch.uint8); u.copy_(torch.tensor([5, 300, 319])); assert u.tolist() == [5, 44, 63]
  packed.copy_(codes); // EXPECT: tensor-copy-narrowing -- 320 entries per codebook do not fit a byte: codes 256..319 wrap to 0..63
  return packed;
}
