// Zero-shot image classification with a CLIP-style dual encoder: prompt-ensembled class
// embeddings, a cache of the class weights, a batched top-k evaluation and a few-shot
// linear probe initialised from the zero-shot head.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace F = torch::nn::functional;

struct ClipConfig {
  int64_t embed_dim = 256, heads = 4;
  int64_t image_size = 96, patch = 16, vision_width = 256, vision_layers = 4;
  int64_t vocab = 49408, context = 32, text_width = 256, text_layers = 4;
};

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t dim, int64_t heads)
      : heads_(heads), qkv(register_module("qkv", torch::nn::Linear(dim, 3 * dim))),
        proj(register_module("proj", torch::nn::Linear(dim, dim))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const auto b = x.size(0), n = x.size(1), d = x.size(2), hd = d / heads_;
    auto parts = qkv(x).reshape({b, n, 3, heads_, hd}).permute({2, 0, 3, 1, 4}).unbind(0);
    auto attn = parts[0].matmul(parts[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    if (mask.defined()) attn = attn + mask;  // EXPECT: tensor-device-mismatch
    auto out = attn.softmax(-1).matmul(parts[2]);
    // FACT: o = torch.randn(2, 4, 5, 8); assert is_copy_of(o.transpose(1, 2).reshape(2, 5, 32), o)
    return proj(out.transpose(1, 2).reshape({b, n, d}));  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t heads_;
  torch::nn::Linear qkv, proj;
};
TORCH_MODULE(Attention);

struct ResidualBlockImpl : torch::nn::Module {
  ResidualBlockImpl(int64_t dim, int64_t heads)
      : ln_1(register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        attn(register_module("attn", Attention(dim, heads))),
        ln_2(register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        c_fc(register_module("c_fc", torch::nn::Linear(dim, 4 * dim))),
        c_proj(register_module("c_proj", torch::nn::Linear(4 * dim, dim))) {}

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    x = x + attn(ln_1(x), mask);
    auto h = c_fc(ln_2(x));
    return x + c_proj(h * torch::sigmoid(1.702 * h));  // QuickGELU, as in the released weights
  }

  torch::nn::LayerNorm ln_1;
  Attention attn;
  torch::nn::LayerNorm ln_2;
  torch::nn::Linear c_fc, c_proj;
};
TORCH_MODULE(ResidualBlock);

struct TransformerImpl : torch::nn::Module {
  TransformerImpl(int64_t width, int64_t layers, int64_t heads) {
    for (int64_t i = 0; i < layers; ++i)
      blocks.push_back(register_module("resblock" + std::to_string(i), ResidualBlock(width, heads)));
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    for (auto& blk : blocks) x = blk(x, mask);
    return x;
  }
  std::vector<ResidualBlock> blocks;
};
TORCH_MODULE(Transformer);

struct VisionEncoderImpl : torch::nn::Module {
  explicit VisionEncoderImpl(const ClipConfig& c)
      : width_(c.vision_width),
        conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, c.vision_width, c.patch).stride(c.patch).bias(false)))),
        ln_pre(register_module("ln_pre", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.vision_width})))),
        transformer(register_module("transformer", Transformer(c.vision_width, c.vision_layers, c.heads))),
        ln_post(register_module("ln_post", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.vision_width})))) {
    const auto grid = c.image_size / c.patch;
    class_embedding = register_parameter("class_embedding", torch::randn({c.vision_width}) * 0.02);
    positional_embedding = register_parameter("positional_embedding", torch::randn({grid * grid + 1, c.vision_width}) * 0.02);
    proj = register_parameter("proj", torch::randn({c.vision_width, c.embed_dim}) * 0.02);
    pixel_mean = register_buffer("pixel_mean", torch::tensor({0.4815, 0.4578, 0.4082}).view({1, 3, 1, 1}));
    pixel_std = register_buffer("pixel_std", torch::tensor({0.2686, 0.2613, 0.2758}).view({1, 3, 1, 1}));
  }

  torch::Tensor forward(const torch::Tensor& images) {
    const auto b = images.size(0);
    auto x = conv1((images - pixel_mean) / pixel_std);  // LOOKALIKE: tensor-device-mismatch -- registered buffers follow model->to(device)
    // FACT: x = torch.randn(2, 8, 4, 4); assert is_view_of(x.permute(0, 2, 3, 1).reshape(2, 16, 8), x)
    x = x.permute({0, 2, 3, 1}).reshape({b, -1, width_});  // LOOKALIKE: tensor-reshape-non-contiguous -- the two grid dims stay adjacent, so this is a view
    x = torch::cat({class_embedding.expand({b, 1, width_}), x}, 1) + positional_embedding;
    x = transformer(ln_pre(x), torch::Tensor());
    return ln_post(x.select(1, 0)).matmul(proj);
  }

  int64_t width_;
  torch::nn::Conv2d conv1;
  torch::nn::LayerNorm ln_pre;
  Transformer transformer;
  torch::nn::LayerNorm ln_post;
  torch::Tensor class_embedding, positional_embedding, proj, pixel_mean, pixel_std;
};
TORCH_MODULE(VisionEncoder);

struct TextEncoderImpl : torch::nn::Module {
  explicit TextEncoderImpl(const ClipConfig& c)
      : token_embedding(register_module("token_embedding", torch::nn::Embedding(c.vocab, c.text_width))),
        transformer(register_module("transformer", Transformer(c.text_width, c.text_layers, c.heads))),
        ln_final(register_module("ln_final", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.text_width})))) {
    positional_embedding = register_parameter("positional_embedding", torch::randn({c.context, c.text_width}) * 0.01);
    text_projection = register_parameter("text_projection", torch::randn({c.text_width, c.embed_dim}) * 0.02);
    causal_mask_ = torch::full({c.context, c.context}, -std::numeric_limits<float>::infinity()).triu(1);
  }

  torch::Tensor forward(const torch::Tensor& tokens) {
    const auto n = tokens.size(1);
    auto x = token_embedding(tokens) + positional_embedding.narrow(0, 0, n);
    x = ln_final(transformer(x, causal_mask_.narrow(0, 0, n).narrow(1, 0, n)));
    auto eot = tokens.argmax(-1);  // the end-of-text id is the largest in the vocabulary
    return x.index({torch::arange(x.size(0), eot.options()), eot}).matmul(text_projection);
  }

  torch::nn::Embedding token_embedding;
  Transformer transformer;
  torch::nn::LayerNorm ln_final;
  torch::Tensor positional_embedding, text_projection, causal_mask_;
};
TORCH_MODULE(TextEncoder);

struct ClipModelImpl : torch::nn::Module {
  explicit ClipModelImpl(const ClipConfig& c)
      : visual(register_module("visual", VisionEncoder(c))), text(register_module("text", TextEncoder(c))) {
    logit_scale = register_parameter("logit_scale", torch::full({}, std::log(1 / 0.07)));
  }
  torch::Tensor encode_image(const torch::Tensor& images) { return visual(images); }
  torch::Tensor encode_text(const torch::Tensor& tokens) { return text(tokens); }

  VisionEncoder visual;
  TextEncoder text;
  torch::Tensor logit_scale;
};
TORCH_MODULE(ClipModel);

// Stand-in for the BPE tokenizer: words hashed into the vocabulary, SOT/EOT around them.
torch::Tensor tokenize(const std::vector<std::string>& texts, const ClipConfig& c) {
  const int64_t sot = c.vocab - 2, eot = c.vocab - 1;
  auto out = torch::zeros({static_cast<int64_t>(texts.size()), c.context}, torch::kLong);
  auto acc = out.accessor<int64_t, 2>();
  for (size_t i = 0; i < texts.size(); ++i) {
    std::istringstream words(texts[i]);
    int64_t pos = 0;
    acc[i][pos++] = sot;
    for (std::string w; words >> w && pos < c.context - 1;) acc[i][pos++] = std::hash<std::string>{}(w) % (c.vocab - 2);
    acc[i][pos] = eot;
  }
  return out;
}

const std::vector<std::string> kTemplates = {
    "a photo of a {}.", "a blurry photo of a {}.", "a close-up photo of the {}.", "a bright photo of a {}.",
    "a sculpture of a {}.", "a photo of the small {}.", "a photo of the large {}.", "art of the {}."};

class ZeroShotHead {
 public:
  ZeroShotHead(ClipModel model, ClipConfig cfg) : model_(std::move(model)), cfg_(std::move(cfg)) {}

  // Normalised class embeddings, one column per class, cached per class list.
  torch::Tensor weights(const std::vector<std::string>& classnames) {
    std::string key;
    for (const auto& name : classnames) key += name + "|";
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    torch::NoGradGuard no_grad;
    const auto device = model_->logit_scale.device();
    std::vector<torch::Tensor> per_class;
    for (const auto& name : classnames) {
      std::vector<std::string> prompts;
      for (const auto& t : kTemplates) prompts.push_back(t.substr(0, t.find("{}")) + name + t.substr(t.find("{}") + 2));
      auto tokens = tokenize(prompts, cfg_);
      const auto len = (tokens != 0).sum(1).max().item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- tokens are still on the host, nothing to wait for
      auto emb = model_->encode_text(tokens.narrow(1, 0, len).to(device));
      emb = emb / emb.norm(2, -1, true);
      // FACT: e = torch.randn(5, 8); m = e.mean(0); m /= m.norm(); assert is_copy_of(m, e)
      auto class_emb = emb.mean(0);
      class_emb /= class_emb.norm();  // LOOKALIKE: tensor-alias-then-mutate -- mean() returns a fresh tensor
      per_class.push_back(class_emb);
    }
    auto w = torch::stack(per_class, 1).cpu();
    cache_[key] = w;
    return w;
  }

  void save(const std::string& path) const {
    for (const auto& kv : cache_) torch::save(kv.second, path + "." + std::to_string(std::hash<std::string>{}(kv.first)));
  }

 private:
  ClipModel model_;
  ClipConfig cfg_;
  std::unordered_map<std::string, torch::Tensor> cache_;
};

using Batch = std::pair<torch::Tensor, torch::Tensor>;

struct EvalResult {
  double top1 = 0, top5 = 0;
  torch::Tensor preds, targets;
};

EvalResult evaluate(ClipModel model, ZeroShotHead& head, const std::vector<std::string>& classnames,
                    const std::vector<Batch>& loader, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  model->eval();
  // FACT: cache = {"k": torch.randn(8, 3)}; w = cache["k"]; w.mul_(100.0); assert shares_storage(w, cache["k"])
  auto weights = head.weights(classnames);
  weights.mul_(model->logit_scale.exp().item<double>());  // EXPECT: tensor-alias-then-mutate
  int64_t total = 0, seen = 0, top1 = 0;
  for (const auto& b : loader) total += b.first.size(0);
  auto top5 = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto all_preds = torch::empty({total}, torch::kInt32);
  auto all_targets = torch::empty({total}, torch::kLong);
  for (const auto& [images, labels] : loader) {
    const auto bs = images.size(0);
    auto feats = model->encode_image(images.to(device));  // LOOKALIKE: tensor-clone-in-loop -- every step brings a new batch
    feats = feats / feats.norm(2, -1, true);
    auto logits = feats.matmul(weights.to(device));  // EXPECT: tensor-clone-in-loop
    auto pred = std::get<1>(logits.topk(5, 1)).t();
    auto correct = pred.eq(labels.to(device).view({1, -1}).expand_as(pred));
    // FACT: p = torch.randn(8, 10).topk(5, 1).indices.t(); c = p.eq(torch.randint(0, 10, (8,)).view(1, -1).expand_as(p)); assert not is_contiguous(c) and not raises(lambda: c[:1].view(-1))
    top1 += correct.narrow(0, 0, 1).view({-1}).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-view-non-contiguous -- a size-1 leading dim never blocks view
    // FACT: p = torch.randn(8, 10).topk(5, 1).indices.t(); c = p.eq(torch.randint(0, 10, (8,)).view(1, -1).expand_as(p)); assert raises(lambda: c[:5].view(-1), "view size is not compatible")
    top5 += correct.narrow(0, 0, 5).view({-1}).sum();  // EXPECT: tensor-view-non-contiguous
    all_preds.narrow(0, seen, bs).copy_(pred.select(0, 0));  // EXPECT: tensor-copy-narrowing
    all_targets.narrow(0, seen, bs).copy_(labels);  // LOOKALIKE: tensor-copy-narrowing -- int64 into int64
    seen += bs;
  }
  return {static_cast<double>(top1) / seen, top5.item<double>() / seen, all_preds, all_targets};
}

torch::nn::Linear init_probe(const torch::Tensor& zs_weights) {
  torch::nn::Linear probe(zs_weights.size(0), zs_weights.size(1));
  {
    torch::NoGradGuard no_grad;
    probe->weight.copy_(zs_weights.t());  // LOOKALIKE: tensor-inplace-on-leaf -- inside NoGradGuard
  }
  probe->bias.zero_();  // EXPECT: tensor-inplace-on-leaf
  return probe;
}

// Few-shot adaptation: frozen image features, a linear head started from the zero-shot
// weights and a learnable temperature.
void train_probe(ClipModel model, const torch::Tensor& zs_weights, const std::vector<Batch>& shots, const torch::Device& device) {
  torch::Tensor feats, labels;
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> fs, ls;
    for (const auto& [images, y] : shots) {
      fs.push_back(model->encode_image(images.to(device)));
      ls.push_back(y.to(device));
    }
    feats = torch::cat(fs);
    feats = feats / feats.norm(2, -1, true);
    labels = torch::cat(ls);
  }
  auto probe = init_probe(zs_weights);
  probe->to(device);
  auto log_scale = torch::full({}, std::log(100.0), torch::TensorOptions().device(device).requires_grad(true));
  auto params = probe->parameters();
  params.push_back(log_scale);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.0));
  std::vector<torch::Tensor> history;
  auto running = torch::zeros({}, device);
  const int steps = 200;
  for (int step = 0; step < steps; ++step) {
    auto idx = torch::randperm(feats.size(0), labels.options()).narrow(0, 0, std::min<int64_t>(64, feats.size(0)));
    auto scale = log_scale.exp();
    // FACT: s = torch.tensor(4.6, requires_grad=True); e = s.exp(); e.clamp_max_(50.0); assert backward_fails(lambda: (e * torch.randn(3)).sum().backward())
    scale.clamp_max_(100.0);  // EXPECT: tensor-inplace-on-saved
    auto logits = scale * probe(feats.index({idx}));
    auto loss = F::cross_entropy(logits, labels.index({idx}), F::CrossEntropyFuncOptions().label_smoothing(0.1));
    opt.zero_grad();
    loss.backward();
    opt.step();
    log_scale.data().clamp_(0, std::log(100.0));  // LOOKALIKE: tensor-inplace-on-detached -- writes the parameter on purpose after the step, as CLIP's own training does
    history.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    running += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph held
  }
  std::cout << "probe loss " << running.item<double>() / steps << " last " << history.back().item<double>() << "\n";
}

int main() {
  torch::manual_seed(0);
  const torch::Device device(torch::kCUDA);
  ClipConfig cfg;
  ClipModel model(cfg);
  model->to(device);
  const std::vector<std::string> classes = {"cat", "dog", "car", "truck", "bird", "horse", "ship", "airplane", "frog", "deer"};
  ZeroShotHead head(model, cfg);
  std::vector<Batch> loader;
  for (int i = 0; i < 10; ++i)
    loader.emplace_back(torch::rand({32, 3, cfg.image_size, cfg.image_size}), torch::randint(0, static_cast<int64_t>(classes.size()), {32}));
  auto result = evaluate(model, head, classes, loader, device);
  std::cout << "zero-shot top1 " << result.top1 << " top5 " << result.top5 << "\n";
  head.save("zeroshot_weights.pt");
  train_probe(model, head.weights(classes), std::vector<Batch>(loader.begin(), loader.begin() + 2), device);
  return 0;
}
