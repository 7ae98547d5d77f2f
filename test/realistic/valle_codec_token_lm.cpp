// VALL-E style codec language model. An autoregressive decoder predicts the first codebook of a
// neural codec from phonemes plus a few seconds of prompt audio; a non-autoregressive decoder then
// fills the remaining codebooks one level at a time, conditioned on every level below it.
#include <torch/torch.h>

#include <cmath>
#include <deque>
#include <iostream>
#include <random>
#include <string>
#include <vector>

struct ValleConfig {
  int64_t n_phonemes = 512, codebook_size = 1024, n_codebooks = 8;
  int64_t d_model = 512, n_heads = 8, n_layers = 12, max_len = 3000;
  double dropout = 0.1, lr = 5e-4, temperature = 1.0;
  int64_t top_k = 50, steps = 200000, log_every = 200;
  int64_t phoneme_pad = 0;
  int64_t eos() const { return codebook_size; }
  int64_t bos() const { return codebook_size + 1; }
  int64_t ignore_index() const { return -100; }
};

struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(int64_t d, int64_t heads, double p) : heads_(heads), head_dim_(d / heads) {
    qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj_ = register_module("proj", torch::nn::Linear(d, d));
    drop_ = register_module("drop", torch::nn::Dropout(p));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& bias, const torch::Tensor& query_pad) {
    const auto B = x.size(0), S = x.size(1);
    // FACT: y=torch.nn.Linear(16,48)(torch.randn(2,5,16)); assert is_view_of(y.view(2,5,3,4,4), y)
    auto qkv = qkv_(x).view({B, S, 3, heads_, head_dim_});  // LOOKALIKE: tensor-view-non-contiguous -- Linear output is contiguous
    auto q = qkv.select(2, 0).transpose(1, 2);
    auto k = qkv.select(2, 1).transpose(1, 2);
    auto v = qkv.select(2, 2).transpose(1, 2);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    auto attn = torch::softmax(scores + bias.unsqueeze(1), -1);
    // FACT: s=torch.randn(2,4,requires_grad=True); a=torch.softmax(s,-1); a.masked_fill_(torch.tensor([False,True,False,False]),0.); assert backward_fails(lambda: a.sum().backward())
    attn.masked_fill_(query_pad.view({B, 1, S, 1}), 0.0);  // EXPECT: tensor-inplace-on-saved
    auto ctx = torch::matmul(drop_(attn), v);
    // FACT: c=torch.randn(2,4,6,8).transpose(1,2); assert is_copy_of(c.reshape(2,6,32), c)
    return proj_(ctx.transpose(1, 2).reshape({B, S, heads_ * head_dim_}));  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t heads_, head_dim_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(SelfAttention);

struct DecoderLayerImpl : torch::nn::Module {
  DecoderLayerImpl(int64_t d, int64_t heads, double p)
      : norm1_(torch::nn::LayerNormOptions({d})), norm2_(torch::nn::LayerNormOptions({d})) {
    register_module("norm1", norm1_);
    register_module("norm2", norm2_);
    attn_ = register_module("attn", SelfAttention(d, heads, p));
    ff_ = register_module("ff", torch::nn::Sequential(torch::nn::Linear(d, 4 * d), torch::nn::GELU(),
                                                      torch::nn::Dropout(p), torch::nn::Linear(4 * d, d)));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& bias, const torch::Tensor& query_pad) {
    x = x + attn_->forward(norm1_(x), bias, query_pad);
    return x + ff_->forward(norm2_(x));
  }

  torch::nn::LayerNorm norm1_, norm2_;
  SelfAttention attn_{nullptr};
  torch::nn::Sequential ff_{nullptr};
};
TORCH_MODULE(DecoderLayer);

torch::Tensor sinusoid_table(int64_t n, int64_t d) {
  auto pos = torch::arange(n, torch::kFloat).unsqueeze(1);
  auto freq = torch::exp(torch::arange(0, d, 2, torch::kFloat) * (-std::log(10000.0) / d));
  return torch::cat({torch::sin(pos * freq), torch::cos(pos * freq)}, 1);
}

// Text may see all text; audio sees all text and the audio before it.
torch::Tensor prefix_causal_bias(int64_t L, int64_t T, const torch::TensorOptions& opts) {
  auto bias = torch::zeros({L + T, L + T}, opts);
  bias.narrow(0, 0, L).narrow(1, L, T).fill_(-INFINITY);
  bias.narrow(0, L, T).narrow(1, L, T).copy_(torch::full({T, T}, -INFINITY, opts).triu(1));
  return bias;
}

struct CodecLMImpl : torch::nn::Module {
  CodecLMImpl(const ValleConfig& c, bool autoregressive) : cfg_(c), ar_(autoregressive) {
    text_emb_ = register_module("text_emb", torch::nn::Embedding(c.n_phonemes, c.d_model));
    text_emb_->weight[c.phoneme_pad].zero_();  // EXPECT: tensor-inplace-on-leaf
    const int64_t tables = ar_ ? 1 : c.n_codebooks;
    for (int64_t k = 0; k < tables; ++k) {
      audio_embs_.push_back(register_module("audio_emb" + std::to_string(k), torch::nn::Embedding(c.codebook_size + 2, c.d_model)));
      torch::nn::init::normal_(audio_embs_.back()->weight, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under NoGradGuard
    }
    if (!ar_) level_emb_ = register_module("level_emb", torch::nn::Embedding(c.n_codebooks, c.d_model));
    for (int64_t i = 0; i < c.n_layers; ++i)
      layers_.push_back(register_module("layer" + std::to_string(i), DecoderLayer(c.d_model, c.n_heads, c.dropout)));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    head_ = register_module("head", torch::nn::Linear(c.d_model, c.codebook_size + 1));
    pos_ = register_buffer("pos", sinusoid_table(c.max_len, c.d_model));
  }

  torch::Tensor embed_levels(const torch::Tensor& codes, int64_t upto) {
    auto x = audio_embs_[0](codes.select(1, 0));
    for (int64_t k = 1; k < upto; ++k) x = x + audio_embs_[k](codes.select(1, k));
    return x;
  }

  torch::Tensor run(torch::Tensor x, const torch::Tensor& bias, const torch::Tensor& query_pad) {
    x = x + pos_.narrow(0, 0, x.size(1));
    for (auto& layer : layers_) x = layer->forward(x, bias, query_pad);
    return x;
  }

  torch::Tensor key_pad_bias(const torch::Tensor& text_pad, int64_t S) {
    auto pad_bias = torch::zeros({text_pad.size(0), 1, S}, pos_.options());
    pad_bias.narrow(2, 0, text_pad.size(1)).masked_fill_(text_pad.unsqueeze(1), -INFINITY);
    return pad_bias;
  }

  // First codebook, teacher forced. Returns logits for the audio positions only.
  torch::Tensor forward_ar(const torch::Tensor& phonemes, const torch::Tensor& text_pad, const torch::Tensor& codes) {
    const auto B = phonemes.size(0), L = phonemes.size(1), T = codes.size(1);
    auto x = torch::cat({text_emb_(phonemes), audio_embs_[0](codes)}, 1);
    // FACT: m=torch.zeros(5,5).unsqueeze(0).expand(2,5,5); assert raises(lambda: m.add_(torch.zeros(2,1,5)), "more than one element")
    auto bias = prefix_causal_bias(L, T, pos_.options()).unsqueeze(0).expand({B, L + T, L + T});
    bias.add_(key_pad_bias(text_pad, L + T));  // EXPECT: tensor-inplace-on-expanded
    auto query_pad = torch::cat({text_pad, torch::zeros({B, T}, text_pad.options())}, 1);
    return head_(norm_(run(x, bias, query_pad).narrow(1, L, T)));
  }

  // Level `level` of the target frames; the prompt contributes all its levels.
  torch::Tensor forward_nar(const torch::Tensor& phonemes, const torch::Tensor& text_pad, const torch::Tensor& codes,
                            int64_t level, int64_t prompt_len) {
    const auto B = phonemes.size(0), L = phonemes.size(1), T = codes.size(2), S = L + T;
    auto prompt = embed_levels(codes.narrow(2, 0, prompt_len), cfg_.n_codebooks);
    auto target = embed_levels(codes.narrow(2, prompt_len, T - prompt_len), level);
    auto lvl = torch::full({1}, level, torch::TensorOptions().dtype(torch::kLong).device(phonemes.device()));
    auto x = torch::cat({text_emb_(phonemes), prompt, target}, 1) + level_emb_(lvl);
    // FACT: b=torch.zeros(5,5).unsqueeze(0).expand(2,5,5); c=b.contiguous(); assert is_copy_of(c, b) and c.stride(0) == 25
    auto bias = torch::zeros({S, S}, pos_.options()).unsqueeze(0).expand({B, S, S}).contiguous();
    bias.add_(key_pad_bias(text_pad, S));  // LOOKALIKE: tensor-inplace-on-expanded -- contiguous() materialised the expanded mask
    auto query_pad = torch::cat({text_pad, torch::zeros({B, T}, text_pad.options())}, 1);
    return head_(norm_(run(x, bias, query_pad).narrow(1, L + prompt_len, T - prompt_len)));
  }

  ValleConfig cfg_;
  bool ar_;
  torch::nn::Embedding text_emb_{nullptr}, level_emb_{nullptr};
  std::vector<torch::nn::Embedding> audio_embs_;
  std::vector<DecoderLayer> layers_;
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::Tensor pos_;
};
TORCH_MODULE(CodecLM);

// Inputs are BOS + codes, targets are codes + EOS; frames past each length are ignored.
std::pair<torch::Tensor, torch::Tensor> shift_for_ar(const torch::Tensor& codes, const torch::Tensor& lengths,
                                                     const ValleConfig& cfg) {
  const auto B = codes.size(0), T = codes.size(1);
  auto inputs = torch::full({B, T + 1}, cfg.bos(), codes.options());
  // FACT: c=torch.arange(12).view(2,6); i=torch.full((2,7),0); assert not shares_storage(i.narrow(1,1,6), c)
  inputs.narrow(1, 1, T).copy_(codes);  // LOOKALIKE: tensor-inplace-overlap -- source and destination are different buffers
  auto targets = torch::full({B, T + 1}, cfg.ignore_index(), codes.options());
  targets.narrow(1, 0, T).copy_(codes);
  auto frame = torch::arange(T + 1, codes.options()).unsqueeze(0);
  targets.masked_fill_(frame > lengths.unsqueeze(1), cfg.ignore_index());
  targets.scatter_(1, lengths.unsqueeze(1), cfg.eos());
  return {inputs, targets};
}

torch::Tensor generate_ar(CodecLM& ar, const torch::Tensor& phonemes, const torch::Tensor& prompt,
                          const ValleConfig& cfg, torch::Device device, double& logprob) {
  torch::NoGradGuard no_grad;
  auto ph = phonemes.to(device).unsqueeze(0);
  auto text_pad = torch::zeros_like(ph, torch::kBool);
  auto bos = torch::full({1}, cfg.bos(), torch::TensorOptions().dtype(torch::kLong).device(device));
  auto generated = torch::empty({0}, bos.options());
  std::vector<torch::Tensor> step_logprobs;
  for (int64_t step = 0; step < cfg.max_len - ph.size(1) - prompt.size(0) - 1; ++step) {
    auto prompt_dev = prompt.to(device);  // EXPECT: tensor-clone-in-loop
    auto codes = torch::cat({bos, prompt_dev, generated}).unsqueeze(0);
    auto logits = ar->forward_ar(ph, text_pad, codes).select(1, -1).squeeze(0);
    // FACT: l=torch.randn(8); s=l.div(0.8); assert is_copy_of(s, l)
    auto scaled = logits.div(cfg.temperature);
    if (step < 10) scaled[cfg.eos()].fill_(-INFINITY);  // LOOKALIKE: tensor-alias-then-mutate -- div() returned a new tensor, logits is untouched
    auto kth = std::get<0>(scaled.topk(cfg.top_k)).select(0, cfg.top_k - 1);
    // FACT: a=torch.randn(8); b=a; b.masked_fill_(a < 0, -1e9); assert shares_storage(a, b) and bool((a >= 0).logical_or(a == -1e9).all())
    auto filtered = scaled;
    filtered.masked_fill_(scaled < kth, -INFINITY);  // EXPECT: tensor-alias-then-mutate
    auto next = torch::multinomial(torch::softmax(filtered, -1), 1);
    const int64_t token = next.item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the sampled token decides whether decoding stops
    step_logprobs.push_back(torch::log_softmax(scaled, -1)[token]);  // LOOKALIKE: tensor-graph-kept-across-iterations -- decoding runs under NoGradGuard, no graph is attached
    if (token == cfg.eos()) break;
    generated = torch::cat({generated, next});
  }
  logprob = torch::stack(step_logprobs).sum().item<double>();
  return generated;
}

torch::Tensor generate_nar(CodecLM& nar, const torch::Tensor& phonemes, const torch::Tensor& prompt_codes,
                           const torch::Tensor& first_level, const ValleConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  const auto Tp = prompt_codes.size(1), T = first_level.size(0);
  auto ph = phonemes.to(device).unsqueeze(0);
  auto text_pad = torch::zeros_like(ph, torch::kBool);
  auto codes = torch::zeros({1, cfg.n_codebooks, Tp + T}, torch::TensorOptions().dtype(torch::kLong).device(device));
  codes.narrow(2, 0, Tp).copy_(prompt_codes.unsqueeze(0));  // LOOKALIKE: tensor-device-mismatch -- copy_ accepts a source on another device
  codes.select(1, 0).narrow(1, Tp, T).copy_(first_level);
  for (int64_t k = 1; k < cfg.n_codebooks; ++k) {
    auto logits = nar->forward_nar(ph, text_pad, codes, k, Tp);
    codes.select(1, k).narrow(1, Tp, T).copy_(logits.narrow(-1, 0, cfg.codebook_size).argmax(-1).squeeze(0));
  }
  auto out_codes = torch::empty({cfg.n_codebooks, T}, torch::kInt);  // the codec decoder takes int32 codes
  out_codes.copy_(codes.squeeze(0).narrow(1, Tp, T));  // EXPECT: tensor-copy-narrowing
  return out_codes;
}

// Long-form synthesis keeps the tail of what it generated as the acoustic prompt for the next sentence.
void roll_prompt(torch::Tensor& window, const torch::Tensor& new_codes) {
  const auto W = window.size(1), n = std::min(new_codes.size(1), W);
  // FACT: p=torch.arange(24).view(3,8); d=p.narrow(1,0,6); s=p.narrow(1,2,6); assert shares_storage(d, s) and (s.data_ptr() - d.data_ptr()) // 8 < d.size(1)
  window.narrow(1, 0, W - n).copy_(window.narrow(1, n, W - n));  // EXPECT: tensor-inplace-overlap
  window.narrow(1, W - n, n).copy_(new_codes.narrow(1, new_codes.size(1) - n, n));
}

struct ValleBatch { torch::Tensor phonemes, text_pad, codes, lengths; int64_t prompt_len; };

ValleBatch synthetic_batch(const ValleConfig& cfg, std::mt19937& rng, int64_t B) {
  std::uniform_int_distribution<int64_t> text_len(20, 80), audio_len(150, 600);
  const int64_t L = text_len(rng), T = audio_len(rng);
  auto phonemes = torch::randint(1, cfg.n_phonemes, {B, L});
  auto text_pad = torch::zeros({B, L}, torch::kBool);
  text_pad.narrow(1, L - 5, 5).fill_(true);
  phonemes.masked_fill_(text_pad, cfg.phoneme_pad);
  auto lengths = torch::randint(T / 2, T, {B});
  return {phonemes, text_pad, torch::randint(0, cfg.codebook_size, {B, cfg.n_codebooks, T}), lengths, T / 4};
}

int main() {
  torch::manual_seed(0);
  ValleConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  std::mt19937 rng(3);
  CodecLM ar(cfg, true), nar(cfg, false);
  ar->to(device);
  nar->to(device);
  auto params = ar->parameters();
  for (auto& p : nar->parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(cfg.lr).betas({0.9, 0.95}).weight_decay(0.01));
  std::uniform_int_distribution<int64_t> level_dist(1, cfg.n_codebooks - 1);
  namespace F = torch::nn::functional;

  std::deque<torch::Tensor> recent_losses;
  double acc_sum = 0.0;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto batch = synthetic_batch(cfg, rng, 8);
    auto codes = batch.codes.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    auto phonemes = batch.phonemes.to(device), text_pad = batch.text_pad.to(device);
    auto [ar_in, ar_tgt] = shift_for_ar(codes.select(1, 0), batch.lengths.to(device), cfg);
    auto ar_logits = ar->forward_ar(phonemes, text_pad, ar_in);
    // FACT: x=torch.randn(2,9,8)[:,2:]; y=torch.nn.Linear(8,5)(torch.nn.LayerNorm(8)(x)); assert is_view_of(y.reshape(-1,5), y)
    auto ar_loss = F::cross_entropy(ar_logits.reshape({-1, ar_logits.size(-1)}), ar_tgt.reshape({-1}),  // LOOKALIKE: tensor-reshape-non-contiguous -- the head's output and the fresh target buffer are contiguous
                                    F::CrossEntropyFuncOptions().ignore_index(cfg.ignore_index()));
    const int64_t level = level_dist(rng);
    auto nar_logits = nar->forward_nar(phonemes, text_pad, codes, level, batch.prompt_len);
    auto nar_tgt = codes.select(1, level).narrow(1, batch.prompt_len, codes.size(2) - batch.prompt_len);
    auto nar_loss = F::cross_entropy(nar_logits.transpose(1, 2), nar_tgt);
    auto loss = ar_loss + nar_loss;
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    opt.step();

    recent_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (recent_losses.size() > 100) recent_losses.pop_front();
    auto valid = ar_tgt.ne(cfg.ignore_index());
    acc_sum += ((ar_logits.argmax(-1) == ar_tgt) & valid).sum().item<double>() / valid.sum().item<double>();  // EXPECT: tensor-sync-in-loop
    if (step % cfg.log_every == 0) {
      auto smoothed = torch::stack(std::vector<torch::Tensor>(recent_losses.begin(), recent_losses.end())).mean();
      std::cout << "step " << step << " loss " << smoothed.item<double>() << " ar acc " << acc_sum / cfg.log_every << std::endl;
      acc_sum = 0.0;
    }
  }

  ar->eval();
  nar->eval();
  auto window = torch::randint(0, cfg.codebook_size, {cfg.n_codebooks, 225});
  for (int sentence = 0; sentence < 3; ++sentence) {
    double logprob = 0.0;
    auto phonemes = torch::randint(1, cfg.n_phonemes, {40});
    auto first = generate_ar(ar, phonemes, window.select(0, 0).contiguous(), cfg, device, logprob);
    auto all_levels = generate_nar(nar, phonemes, window, first, cfg, device);
    roll_prompt(window, all_levels.to(torch::kLong));
    std::cout << "sentence " << sentence << ": " << all_levels.size(1) << " frames, AR log-prob " << logprob << "\n";
  }
  return 0;
}
