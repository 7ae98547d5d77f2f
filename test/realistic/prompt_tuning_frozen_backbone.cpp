// Soft prompt tuning (Lester et al. 2021) of a frozen, pre-trained transformer encoder for
// sequence classification. Only the prompt embeddings, a small residual reparameterisation of
// them and the classification head are trained; every backbone parameter has requires_grad off.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct PromptTuningConfig {
  int64_t vocab_size = 30522;
  int64_t d_model = 256;
  int64_t n_heads = 8;
  int64_t n_layers = 6;
  int64_t ffn_dim = 1024;
  int64_t max_positions = 512;
  int64_t max_len = 128;
  int64_t n_prompt_tokens = 20;
  int64_t n_classes = 3;
  int64_t pad_id = 0;
  double prompt_clip = 1.0;
  double prompt_max_norm = 4.0;
  double lr = 3e-2;
  double weight_decay = 1e-5;
  int epochs = 10;
  int64_t batch_size = 32;
  std::vector<double> class_prior = {0.5, 0.3, 0.2};
  std::vector<int64_t> init_vocab_ids;  // initialise the prompt from these token embeddings
};

class FrozenEncoderImpl : public nn::Module {
 public:
  explicit FrozenEncoderImpl(const PromptTuningConfig& cfg)
      : embed_scale_(std::sqrt(static_cast<double>(cfg.d_model))) {
    tok = register_module("tok", nn::Embedding(nn::EmbeddingOptions(cfg.vocab_size, cfg.d_model).padding_idx(cfg.pad_id)));
    pos_ = register_module("pos", nn::Embedding(cfg.max_positions, cfg.d_model));
    nn::TransformerEncoderLayer layer(
        nn::TransformerEncoderLayerOptions(cfg.d_model, cfg.n_heads).dim_feedforward(cfg.ffn_dim).dropout(0.1));
    encoder_ = register_module("encoder", nn::TransformerEncoder(nn::TransformerEncoderOptions(layer, cfg.n_layers)));
    norm_ = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})));
  }

  // token embeddings, scaled the way the backbone was pre-trained: [B, T, D]
  torch::Tensor embed_tokens(const torch::Tensor& ids) {
    auto x = tok->forward(ids).clone(); // EXPECT: tensor-unnecessary-clone
    x.mul_(embed_scale_);
    return x;
  }

  // embeds: [B, L, D] (prompt already prepended); key_padding: [B, L], true at padding.
  // Returns the sequence-first hidden states [L, B, D], as the encoder produces them.
  torch::Tensor encode(const torch::Tensor& embeds, const torch::Tensor& key_padding) {
    const auto L = embeds.size(1);
    auto positions = torch::arange(L, torch::TensorOptions().dtype(torch::kLong).device(embeds.device()));
    auto x = embeds + pos_(positions).unsqueeze(0);
    auto h = encoder_->forward(x.transpose(0, 1), /*src_mask=*/torch::Tensor(), key_padding);
    return norm_(h);
  }

  double embed_scale() const { return embed_scale_; }

  nn::Embedding tok{nullptr};

 private:
  double embed_scale_;
  nn::Embedding pos_{nullptr};
  nn::TransformerEncoder encoder_{nullptr};
  nn::LayerNorm norm_{nullptr};
};
TORCH_MODULE(FrozenEncoder);

class PromptClassifierImpl : public nn::Module {
 public:
  PromptClassifierImpl(FrozenEncoder backbone, const PromptTuningConfig& cfg) : n_prompt_(cfg.n_prompt_tokens) {
    backbone_ = register_module("backbone", std::move(backbone));
    for (auto& p : backbone_->parameters()) p.set_requires_grad(false);
    const auto D = cfg.d_model;
    prompt = register_parameter("prompt", torch::randn({cfg.n_prompt_tokens, D}) * 0.5);
    reparam = register_module("reparam", nn::Sequential(nn::Linear(D, D), nn::Tanh(), nn::Linear(D, D)));
    head = register_module("head", nn::Linear(cfg.n_prompt_tokens * D, cfg.n_classes));
  }

  // ids, attention_mask: [B, T] int64 (mask 1 on real tokens)
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& attention_mask) {
    const auto B = ids.size(0);
    const auto D = prompt.size(1);
    auto tokens = backbone_->embed_tokens(ids);       // [B, T, D]
    auto p = reparam->forward(prompt) + prompt;        // [P, D]
    // FACT: p = torch.randn(5, 4); pb = p.unsqueeze(0).expand(3, 5, 4); assert raises(lambda: pb.mul_(2.0), "more than one element of the written-to tensor")
    auto prompt_batch = p.unsqueeze(0).expand({B, n_prompt_, D});
    prompt_batch.mul_(backbone_->embed_scale()); // EXPECT: tensor-inplace-on-expanded
    auto inputs = torch::cat({prompt_batch, tokens}, 1);

    // key padding mask over [prompt | tokens]: prompt positions are never padding
    // FACT: m = torch.ones(2, 6, dtype=torch.long); pad = m.to(torch.bool); pad.logical_not_(); assert is_copy_of(pad, m) and m.sum().item() == 12
    auto pad = attention_mask.to(torch::kBool);
    pad.logical_not_(); // LOOKALIKE: tensor-alias-then-mutate -- the attention mask is int64: to(kBool) makes a new tensor
    // FACT: z = torch.zeros(1, 5, dtype=torch.bool).expand(3, 5); c = torch.cat([z, torch.ones(3, 2, dtype=torch.bool)], 1); assert is_copy_of(c, z)
    auto prompt_pad = torch::zeros({1, n_prompt_}, pad.options()).expand({B, n_prompt_}); // LOOKALIKE: tensor-inplace-on-expanded -- only read by cat, never written
    auto key_padding = torch::cat({prompt_pad, pad}, 1); // LOOKALIKE: tensor-device-mismatch -- prompt_pad is made with pad.options(): same device

    auto hidden = backbone_->encode(inputs, key_padding);  // [P + T, B, D]
    // FACT: h = torch.randn(9, 3, 4); assert raises(lambda: h.narrow(0, 0, 5).transpose(0, 1).view(3, 20), "view size is not compatible")
    auto prompt_states = hidden.narrow(0, 0, n_prompt_).transpose(0, 1).view({B, n_prompt_ * D}); // EXPECT: tensor-view-non-contiguous
    return head(prompt_states);
  }

  FrozenEncoder backbone() { return backbone_; }

  torch::Tensor prompt;
  nn::Sequential reparam{nullptr};
  nn::Linear head{nullptr};

 private:
  int64_t n_prompt_;
  FrozenEncoder backbone_{nullptr};
};
TORCH_MODULE(PromptClassifier);

struct Example {
  std::vector<int64_t> tokens;
  int64_t label = 0;
};

struct Batch {
  torch::Tensor ids;             // [n, T] int64
  torch::Tensor attention_mask;  // [n, T] int64
  torch::Tensor labels;          // [n] int64
};

Batch collate(const std::vector<Example>& data, size_t begin, size_t end, int64_t pad_id, int64_t max_len) {
  const auto n = static_cast<int64_t>(end - begin);
  int64_t T = 1;
  for (size_t i = begin; i < end; ++i) T = std::max<int64_t>(T, std::min<int64_t>(data[i].tokens.size(), max_len));
  Batch b;
  b.ids = torch::full({n, T}, pad_id, torch::kLong);
  b.attention_mask = torch::zeros({n, T}, torch::kLong);
  b.labels = torch::empty({n}, torch::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const auto& ex = data[begin + i];
    const auto len = std::min<int64_t>(ex.tokens.size(), T);
    auto row = torch::tensor(at::ArrayRef<int64_t>(ex.tokens.data(), len), torch::kLong);
    b.ids[i].narrow(0, 0, len).copy_(row); // LOOKALIKE: tensor-copy-narrowing -- int64 tokens into an int64 buffer
    b.attention_mask[i].narrow(0, 0, len).fill_(1);
    b.labels[i] = ex.label;
  }
  return b;
}

// Start the prompt from the embeddings of real vocabulary items (class names, frequent words).
void init_prompt_from_vocab(PromptClassifier& model, const PromptTuningConfig& cfg) {
  if (cfg.init_vocab_ids.empty()) return;
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(cfg.init_vocab_ids, torch::kLong);
  ids = ids.index_select(0, torch::arange(cfg.n_prompt_tokens, torch::kLong).remainder(ids.size(0)));
  auto rows = model->backbone()->tok->weight.index_select(0, ids.to(model->prompt.device()));
  model->prompt.copy_(rows / model->backbone()->embed_scale()); // LOOKALIKE: tensor-inplace-on-leaf -- initialisation under NoGradGuard
}

// Keeps every prompt vector inside a ball of radius max_norm.
void renorm_prompt(PromptClassifier& model, double max_norm) {
  torch::NoGradGuard no_grad;
  auto w = model->prompt.data();
  auto norms = w.norm(2, {1}, true).clamp_min(1e-6);
  w.mul_((max_norm / norms).clamp_max(1.0)); // LOOKALIKE: tensor-inplace-on-detached -- under NoGradGuard, changing the parameter is the point
}

void train_prompt(PromptClassifier& model, const std::vector<Example>& train, const PromptTuningConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  init_prompt_from_vocab(model, cfg);

  std::vector<torch::Tensor> trainable{model->prompt};
  for (auto& p : model->reparam->parameters()) trainable.push_back(p); // LOOKALIKE: tensor-graph-kept-across-iterations -- parameters are leaves, no graph
  for (auto& p : model->head->parameters()) trainable.push_back(p);
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));

  auto prompt_before = model->prompt.detach().clone(); // LOOKALIKE: tensor-unnecessary-clone -- a snapshot: opt.step() changes the prompt afterwards
  torch::Tensor running = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    model->backbone()->eval();  // frozen: no dropout in the backbone either
    for (size_t b = 0; b < train.size(); b += cfg.batch_size) {
      const auto e = std::min(train.size(), b + static_cast<size_t>(cfg.batch_size));
      auto batch = collate(train, b, e, cfg.pad_id, cfg.max_len);
      auto ids = batch.ids.to(device);
      auto mask = batch.attention_mask.to(device);
      auto labels = batch.labels.to(device);

      auto logits = model->forward(ids, mask);
      auto loss = F::cross_entropy(logits, labels);
      opt.zero_grad();
      loss.backward();
      opt.step();
      model->prompt.clamp_(-cfg.prompt_clip, cfg.prompt_clip); // EXPECT: tensor-inplace-on-leaf

      running = 0.98 * running + 0.02 * loss; // EXPECT: tensor-graph-kept-across-iterations
      if (++step % 50 == 0) std::cout << "step " << step << " loss " << running.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every 50 steps
    }
    renorm_prompt(model, cfg.prompt_max_norm);
  }
  auto drift = (model->prompt.detach() - prompt_before).norm().item<double>();
  std::cout << "prompt moved by " << drift << " (L2)\n";
}

double evaluate(PromptClassifier& model, const std::vector<Example>& dev, const PromptTuningConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  torch::NoGradGuard no_grad;

  // post-hoc logit adjustment for the skewed label distribution, plus temperature calibration
  auto log_prior = torch::tensor(cfg.class_prior).log();
  auto temperature = torch::tensor(1.3);
  int64_t correct = 0, total = 0;
  for (size_t b = 0; b < dev.size(); b += cfg.batch_size) {
    const auto e = std::min(dev.size(), b + static_cast<size_t>(cfg.batch_size));
    auto batch = collate(dev, b, e, cfg.pad_id, cfg.max_len);
    auto labels = batch.labels.to(device);
    auto logits = model->forward(batch.ids.to(device), batch.attention_mask.to(device));
    auto calibrated = logits / temperature; // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may join a CUDA op
    auto adjusted = calibrated - log_prior; // EXPECT: tensor-device-mismatch
    correct += adjusted.argmax(1).eq(labels).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop
    total += labels.size(0);
  }
  return total > 0 ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}
