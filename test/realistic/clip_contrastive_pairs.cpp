// CLIP-style contrastive pre-training on image/caption pairs (Radford et al. 2021). A small
// residual conv tower with attention pooling encodes images, a causal transformer over BPE tokens
// encodes captions (pooled at the end-of-text token, which has the largest id); both are projected
// into one embedding space. The symmetric InfoNCE loss over the in-batch similarity matrix is
// scaled by a learnable temperature, logit_scale = log(1 / T), initialised to log(1 / 0.07) and
// kept below log(100). Evaluation: image->text recall@K on a held-out split, zero-shot
// classification from prompt ensembles, and an export of unit-length image features for search.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct ClipConfig {
  int64_t embed_dim = 512, width = 256, blocks = 3;
  int64_t vocab = 49408, context = 77, text_width = 384, text_layers = 6, text_heads = 6;
  int64_t epochs = 30, batch_size = 256, log_every = 100;
  double lr = 5e-4, weight_decay = 0.2, init_temperature = 0.07, max_logit_scale = 100.0;
};

// One image and its caption tokens ([context] int64, zero-padded).
struct CaptionPairs : torch::data::datasets::Dataset<CaptionPairs> {
  CaptionPairs(std::vector<torch::Tensor> images, std::vector<torch::Tensor> tokens)
      : images_(std::move(images)), tokens_(std::move(tokens)) {}
  torch::data::Example<> get(size_t i) override { return {images_[i], tokens_[i]}; }
  torch::optional<size_t> size() const override { return images_.size(); }
  std::vector<torch::Tensor> images_, tokens_;
};

struct ResBlockImpl : nn::Module {
  explicit ResBlockImpl(int64_t c) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", nn::BatchNorm2d(c));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", nn::BatchNorm2d(c));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    // FACT: c = torch.nn.Conv2d(3, 3, 3, padding=1); bn = torch.nn.BatchNorm2d(3); x = torch.randn(2, 3, 5, 5); o = bn(c(x)); o += x; torch.relu(o).sum().backward(); assert c.weight.grad is not None
    out += x; // LOOKALIKE: tensor-inplace-on-saved -- BatchNorm's backward needs its input, not its output
    return torch::relu(out);
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(ResBlock);

struct ImageTowerImpl : nn::Module {
  explicit ImageTowerImpl(const ClipConfig &cfg) {
    stem_ = register_module("stem", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, cfg.width, 4).stride(4).bias(false)),
                                                   nn::BatchNorm2d(cfg.width), nn::ReLU()));
    blocks_ = register_module("blocks", nn::Sequential());
    for (int64_t i = 0; i < cfg.blocks; ++i)
      blocks_->push_back(ResBlock(cfg.width));
    score_ = register_module("score", nn::Linear(cfg.width, 1));
    proj_ = register_module("proj", nn::Linear(cfg.width, cfg.embed_dim));
  }

  // Attention pooling over the feature grid: one learned score per cell.
  torch::Tensor forward(const torch::Tensor &images) {
    auto fmap = blocks_->forward(stem_->forward(images)); // [B, C, h, w]
    const auto B = fmap.size(0), C = fmap.size(1);
    // FACT: f = torch.randn(2, 8, 3, 5); c = f.permute(0, 2, 3, 1).reshape(-1, 8); assert is_copy_of(c, f) and c.shape == (30, 8)
    auto cells = fmap.permute({0, 2, 3, 1}).reshape({-1, C}); // EXPECT: tensor-reshape-non-contiguous -- batch and grid dims are not adjacent after the permute: the feature map is copied every forward
    // FACT: l = torch.nn.Linear(8, 1)(torch.randn(30, 8)); assert is_view_of(l.view(2, -1), l)
    auto attn = torch::softmax(score_(cells).view({B, -1}), 1); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    // FACT: f = torch.randn(2, 8, 3, 5); assert is_view_of(f.permute(0, 2, 3, 1).view(2, -1, 8), f)
    auto grid = fmap.permute({0, 2, 3, 1}).view({B, -1, C}); // LOOKALIKE: tensor-view-non-contiguous -- h and w stay adjacent in memory after the permute: a view
    auto pooled = (attn.unsqueeze(-1) * grid).sum(1);
    return proj_(pooled);
  }

  nn::Sequential stem_{nullptr}, blocks_{nullptr};
  nn::Linear score_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(ImageTower);

struct TextTowerImpl : nn::Module {
  explicit TextTowerImpl(const ClipConfig &cfg) {
    tok_ = register_module("tok", nn::Embedding(cfg.vocab, cfg.text_width));
    pos_ = register_parameter("pos", torch::randn({cfg.context, cfg.text_width}) * 0.01);
    auto layer = nn::TransformerEncoderLayerOptions(cfg.text_width, cfg.text_heads)
                     .dim_feedforward(4 * cfg.text_width)
                     .dropout(0.0)
                     .activation(torch::kGELU);
    encoder_ = register_module("encoder", nn::TransformerEncoder(nn::TransformerEncoderOptions(layer, cfg.text_layers)));
    ln_ = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({cfg.text_width})));
    proj_ = register_module("proj", nn::Linear(nn::LinearOptions(cfg.text_width, cfg.embed_dim).bias(false)));
    causal_ = register_buffer("causal", torch::full({cfg.context, cfg.context}, -INFINITY).triu(1));
  }

  torch::Tensor forward(const torch::Tensor &tokens) {
    const auto B = tokens.size(0), L = tokens.size(1);
    auto x = tok_(tokens) + pos_.narrow(0, 0, L);
    auto mask = causal_.narrow(0, 0, L).narrow(1, 0, L);
    x = encoder_(x.transpose(0, 1), mask).transpose(0, 1); // the encoder is sequence-first
    x = ln_(x);
    auto eot = tokens.argmax(-1);
    auto pooled = x.index({torch::arange(B, eot.options()), eot});
    return proj_(pooled);
  }

  nn::Embedding tok_{nullptr};
  nn::TransformerEncoder encoder_{nullptr};
  nn::LayerNorm ln_{nullptr};
  nn::Linear proj_{nullptr};
  torch::Tensor pos_, causal_;
};
TORCH_MODULE(TextTower);

struct ClipOutput {
  torch::Tensor image, text; // unit-length embeddings [B, D]
  torch::Tensor scale;       // exp(logit_scale), 0-dim
};

struct ClipModelImpl : nn::Module {
  explicit ClipModelImpl(const ClipConfig &cfg) {
    image_ = register_module("image", ImageTower(cfg));
    text_ = register_module("text", TextTower(cfg));
    logit_scale_ = register_parameter("logit_scale", torch::full({}, std::log(1.0 / cfg.init_temperature)));
  }

  torch::Tensor encode_image(const torch::Tensor &images) {
    return F::normalize(image_(images), F::NormalizeFuncOptions().dim(-1));
  }
  torch::Tensor encode_text(const torch::Tensor &tokens) {
    return F::normalize(text_(tokens), F::NormalizeFuncOptions().dim(-1));
  }
  ClipOutput forward(const torch::Tensor &images, const torch::Tensor &tokens) {
    return {encode_image(images), encode_text(tokens), logit_scale_.exp()};
  }

  // Called after every optimizer step: the temperature must not drop below 1/100.
  void clamp_logit_scale(double max_scale) {
    // FACT: s = torch.nn.Parameter(torch.tensor(4.7)); assert raises(lambda: s.clamp_(0.0, 4.6), "a leaf Variable that requires grad")
    logit_scale_.clamp_(0.0, std::log(max_scale)); // EXPECT: tensor-inplace-on-leaf -- logit_scale is a trainable parameter and grad mode is on
  }

  // Fine-tuning from a checkpoint may restart from a fixed temperature.
  void reset_temperature(double t) {
    torch::NoGradGuard no_grad;
    logit_scale_.fill_(std::log(1.0 / t)); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  ImageTower image_{nullptr};
  TextTower text_{nullptr};
  torch::Tensor logit_scale_;
};
TORCH_MODULE(ClipModel);

struct ContrastiveStep {
  torch::Tensor loss, logits;
};

// Symmetric InfoNCE: the i-th image belongs with the i-th caption.
ContrastiveStep contrastive_loss(const ClipOutput &out) {
  auto logits = out.scale * out.image.matmul(out.text.t()); // [B, B], images x captions
  auto labels = torch::arange(logits.size(0), torch::TensorOptions().dtype(torch::kLong).device(logits.device()));
  auto loss = (F::cross_entropy(logits, labels) + F::cross_entropy(logits.t(), labels)) / 2; // LOOKALIKE: tensor-device-mismatch -- the labels are made on the logits' device
  return {loss, logits};
}

void train_clip(ClipModel &model, CaptionPairs data, const ClipConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  const auto n_pairs = static_cast<double>(*data.size());
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(data).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(cfg.batch_size).drop_last(true).workers(4));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));

  auto smoothed = torch::zeros({}, device);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    double epoch_loss = 0;
    int64_t seen = 0;
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    for (auto &batch : *loader) {
      auto images = batch.data.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto tokens = batch.target.to(device);
      auto out = model->forward(images, tokens);
      auto res = contrastive_loss(out);

      opt.zero_grad();
      res.loss.backward();
      opt.step();
      model->clamp_logit_scale(cfg.max_logit_scale);

      epoch_loss += res.loss.item<double>() * images.size(0); // EXPECT: tensor-sync-in-loop -- waits for the GPU at every step only to add up the loss
      // FACT: w = torch.randn(3, requires_grad=True); s = torch.zeros(()); exec('for _ in range(3):\n l = (w * 2).sum(); l.backward(); s = 0.98 * s + 0.02 * l'); assert s.requires_grad and kept_nodes(s) >= 9
      smoothed = 0.98 * smoothed + 0.02 * res.loss; // EXPECT: tensor-graph-kept-across-iterations -- the running average links every step's graph to the next
      auto labels = torch::arange(images.size(0), torch::TensorOptions().dtype(torch::kLong).device(device));
      // FACT: w = torch.randn(4, 4, requires_grad=True); h = (w.argmax(1) == torch.arange(4)).sum(); assert not h.requires_grad and h.grad_fn is None
      correct += (res.logits.argmax(1) == labels).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- a count of comparisons has no graph
      seen += images.size(0);
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << smoothed.item<float>() << " T " << 1.0 / out.scale.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    std::cout << "epoch " << epoch << " loss " << epoch_loss / n_pairs << " i->t top1 "
              << correct.item<double>() / std::max<int64_t>(seen, 1) << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the batches
  }
}

struct HeldOutPair {
  torch::Tensor images, tokens; // [n, 3, H, W], [n, context]
};

// Image->text recall@K: the i-th caption must be among the K most similar to the i-th image.
std::vector<double> retrieval_recall(ClipModel &model, const std::vector<HeldOutPair> &split, const std::vector<int64_t> &ks) {
  torch::NoGradGuard no_grad;
  const torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  std::vector<torch::Tensor> img_chunks, txt_chunks;
  for (const auto &b : split) {
    img_chunks.push_back(model->encode_image(b.images.to(device))); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    txt_chunks.push_back(model->encode_text(b.tokens.to(device)));
  }
  auto img = torch::cat(img_chunks), txt = torch::cat(txt_chunks);
  const auto n = img.size(0);
  const auto max_k = *std::max_element(ks.begin(), ks.end());
  auto ranked = std::get<1>(img.matmul(txt.t()).topk(max_k, 1)); // [n, max_k] caption indices
  auto truth = torch::arange(n).unsqueeze(1);
  std::vector<double> recall;
  for (auto k : ks) {
    auto hit = (ranked.narrow(1, 0, k) == truth).any(1); // EXPECT: tensor-device-mismatch -- the ranking is on the GPU, the [n, 1] ground truth on the host
    recall.push_back(hit.to(torch::kFloat).mean().item<double>()); // LOOKALIKE: tensor-sync-in-loop -- one value per K, kept as the result
  }
  return recall;
}

// Class prototypes from prompt ensembles ("a photo of a {}.", ...): the mean caption embedding.
torch::Tensor class_prototypes(ClipModel &model, const std::vector<torch::Tensor> &prompts_per_class, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> protos;
  for (const auto &prompts : prompts_per_class) { // [n_templates, context]
    auto p = model->encode_text(prompts.to(device)).mean(0);
    // FACT: e = torch.randn(5, 8); p = e.mean(0); p /= p.norm(); assert is_copy_of(p, e)
    p /= p.norm(); // LOOKALIKE: tensor-alias-then-mutate -- mean() made a tensor of its own
    protos.push_back(p);
  }
  return torch::stack(protos);
}

double zero_shot_accuracy(ClipModel &model, const torch::Tensor &protos, const std::vector<torch::data::Example<>> &test) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto device = protos.device();
  auto hits = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t total = 0;
  for (const auto &ex : test) {
    auto pred = model->encode_image(ex.data.to(device)).matmul(protos.t()).argmax(1);
    hits += pred.eq(ex.target.to(device)).sum();
    total += ex.target.size(0);
  }
  return hits.item<double>() / static_cast<double>(std::max<int64_t>(total, 1));
}

// Rows scaled to unit length, as the nearest-neighbour index expects.
torch::Tensor unit_rows(const torch::Tensor &emb) {
  torch::Tensor z = emb;
  // FACT: e = torch.randn(4, 8); z = e; z /= z.norm(2, -1, keepdim=True).clamp_min(1e-12); assert shares_storage(z, e) and torch.allclose(e.norm(dim=-1), torch.ones(4))
  z /= z.norm(2, -1, true).clamp_min(1e-12); // EXPECT: tensor-alias-then-mutate -- z is the caller's tensor: the raw features are normalised too
  return z;
}

// Search index: unit-length image features plus their raw norms (low norms flag poor crops).
void export_image_index(ClipModel &model, const std::vector<torch::Tensor> &images, const std::string &path) {
  torch::NoGradGuard no_grad;
  const torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  std::vector<torch::Tensor> raw;
  for (const auto &im : images)
    raw.push_back(model->image_(im.to(device)).cpu()); // LOOKALIKE: tensor-clone-in-loop, tensor-sync-in-loop -- a new chunk each time, each host copy kept
  auto feats = torch::cat(raw);
  auto unit = unit_rows(feats);
  auto norms = feats.norm(2, -1);
  std::cout << "indexed " << feats.size(0) << " images, mean feature norm " << norms.mean().item<float>() << "\n";
  torch::save(std::vector<torch::Tensor>{unit, norms}, path);
}

void run(const ClipConfig &cfg, CaptionPairs train, const std::vector<HeldOutPair> &val,
         const std::vector<torch::Tensor> &class_prompts, const std::vector<torch::data::Example<>> &test,
         bool restart_temperature) {
  ClipModel model(cfg);
  if (restart_temperature)
    model->reset_temperature(cfg.init_temperature);
  train_clip(model, std::move(train), cfg);
  auto recall = retrieval_recall(model, val, {1, 5, 10});
  std::cout << "R@1 " << recall[0] << " R@5 " << recall[1] << " R@10 " << recall[2] << "\n";
  auto protos = class_prototypes(model, class_prompts, torch::Device(torch::kCUDA));
  std::cout << "zero-shot accuracy " << zero_shot_accuracy(model, protos, test) << "\n";
}
