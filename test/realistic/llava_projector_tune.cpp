// Instruction tuning of a LLaVA-style model: a frozen ViT-ish vision tower, a two-layer
// MLP projector, and a small causal LM whose <image> placeholder tokens are replaced by the
// projected patch features.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

namespace F = torch::nn::functional;

struct LlavaConfig {
  int64_t image_size = 112;
  int64_t patch = 14;
  int64_t vision_dim = 256;
  int64_t hidden = 512;
  int64_t n_heads = 8;
  int64_t n_layers = 4;
  int64_t vocab = 32000;
  int64_t max_len = 256;
  int64_t image_token_id = 31999;
  int64_t eos_id = 2;
  int64_t pad_id = 0;
  int64_t ignore_index = -100;
  int64_t batch_size = 8;
  int64_t epochs = 3;
  int64_t log_every = 25;
  double lr = 2e-5;
  int64_t n_image_tokens() const { return (image_size / patch) * (image_size / patch); }
};

// CLIP preprocessing. Callers hand in float images in [0, 1].
torch::Tensor clip_normalize(const torch::Tensor& images) {
  static const auto mean = torch::tensor({0.48145466, 0.4578275, 0.40821073}).view({1, 3, 1, 1});
  static const auto stdv = torch::tensor({0.26862954, 0.26130258, 0.27577711}).view({1, 3, 1, 1});
  torch::Tensor x = images.to(torch::kFloat);
  // FACT: x = torch.rand(2, 3, 8, 8); assert shares_storage(x.to(torch.float32), x)
  x.sub_(mean).div_(stdv);  // EXPECT: tensor-alias-then-mutate
  return x;
}

struct VisionTowerImpl : torch::nn::Module {
  explicit VisionTowerImpl(const LlavaConfig& cfg)
      : stem(torch::nn::Conv2dOptions(3, cfg.vision_dim, cfg.patch).stride(cfg.patch)),
        norm(torch::nn::LayerNormOptions({cfg.vision_dim})),
        mlp(torch::nn::Linear(cfg.vision_dim, cfg.vision_dim * 4), torch::nn::GELU(),
            torch::nn::Linear(cfg.vision_dim * 4, cfg.vision_dim)) {
    cls = register_parameter("cls", torch::zeros({1, 1, cfg.vision_dim}));
    register_module("stem", stem);
    register_module("norm", norm);
    register_module("mlp", mlp);
  }

  torch::Tensor forward(const torch::Tensor& pixels) {
    auto fm = stem(pixels);
    // FACT: fm = torch.rand(2, 16, 4, 4); assert is_view_of(fm.permute(0, 2, 3, 1).reshape(2, 16, 16), fm)
    auto tokens = fm.permute({0, 2, 3, 1}).reshape({fm.size(0), -1, fm.size(1)});  // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent after the permute, so this is a view
    tokens = torch::cat({cls.expand({fm.size(0), 1, fm.size(1)}), tokens}, 1);
    tokens = tokens + mlp->forward(norm(tokens));
    return norm(tokens);
  }

  torch::Tensor cls;
  torch::nn::Conv2d stem;
  torch::nn::LayerNorm norm;
  torch::nn::Sequential mlp;
};
TORCH_MODULE(VisionTower);

struct ProjectorImpl : torch::nn::Module {
  ProjectorImpl(int64_t in, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, out))),
        fc2(register_module("fc2", torch::nn::Linear(out, out))) {
    torch::NoGradGuard no_grad;
    for (auto& lin : {fc1, fc2}) {
      lin->weight.normal_(0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- initialised under NoGradGuard
      lin->bias.zero_();
    }
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Projector);

struct DecoderBlockImpl : torch::nn::Module {
  DecoderBlockImpl(int64_t hidden, int64_t heads, int64_t max_len)
      : nh(heads), hd(hidden / heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        qkv(register_module("qkv", torch::nn::Linear(hidden, 3 * hidden))),
        out(register_module("out", torch::nn::Linear(hidden, hidden))),
        mlp(register_module("mlp", torch::nn::Sequential(torch::nn::Linear(hidden, 4 * hidden),
                                                          torch::nn::GELU(),
                                                          torch::nn::Linear(4 * hidden, hidden)))) {
    causal = register_buffer("causal", torch::ones({max_len, max_len}, torch::kBool).triu(1));
    scale = torch::tensor(1.0 / std::sqrt(static_cast<double>(hd)));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& keep) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto parts = qkv(ln1(x)).chunk(3, -1);
    // FACT: q = torch.rand(2, 5, 24).chunk(3, -1)[0]; assert not is_contiguous(q) and is_view_of(q.view(2, 5, 4, 2), q)
    auto q = parts[0].view({B, T, nh, hd}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- only the last dim of the chunk is split
    auto k = parts[1].view({B, T, nh, hd}).transpose(1, 2);
    auto v = parts[2].view({B, T, nh, hd}).transpose(1, 2);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;  // LOOKALIKE: tensor-device-mismatch -- scale is a 0-dim CPU tensor, allowed with CUDA operands
    scores = scores.masked_fill(causal.slice(0, 0, T).slice(1, 0, T), -1e4);
    auto pad = keep.logical_not();
    scores = scores.masked_fill(pad.view({B, 1, 1, T}), -1e4);
    auto attn = torch::softmax(scores, -1);
    // FACT: s = torch.rand(2, 3, requires_grad=True); a = torch.softmax(s, -1); a.masked_fill_(torch.tensor([[False], [True]]), 0.0); assert backward_fails(lambda: a.sum().backward())
    attn.masked_fill_(pad.view({B, 1, T, 1}), 0.0);  // EXPECT: tensor-inplace-on-saved
    auto ctx = torch::matmul(attn, v).transpose(1, 2);
    x = x + out(ctx.contiguous().view({B, T, C}));
    return x + mlp->forward(ln2(x));
  }

  int64_t nh, hd;
  torch::nn::LayerNorm ln1, ln2;
  torch::nn::Linear qkv, out;
  torch::nn::Sequential mlp;
  torch::Tensor causal, scale;
};
TORCH_MODULE(DecoderBlock);

struct LlavaModelImpl : torch::nn::Module {
  explicit LlavaModelImpl(const LlavaConfig& c)
      : cfg(c),
        vision(register_module("vision", VisionTower(c))),
        projector(register_module("projector", Projector(c.vision_dim, c.hidden))),
        tok_emb(register_module("tok_emb", torch::nn::Embedding(c.vocab, c.hidden))),
        pos_emb(register_module("pos_emb", torch::nn::Embedding(c.max_len, c.hidden))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})))),
        head(register_module("head", torch::nn::Linear(c.hidden, c.vocab))) {
    for (int64_t i = 0; i < c.n_layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i),
                                       DecoderBlock(c.hidden, c.n_heads, c.max_len)));
    for (auto& p : vision->parameters()) p.set_requires_grad(false);
  }

  torch::Tensor encode_images(const torch::Tensor& pixels) {
    torch::Tensor feats;
    {
      torch::NoGradGuard no_grad;
      feats = vision(pixels);
    }
    auto patches = feats.slice(1, 1);  // drop CLS
    // FACT: p = torch.rand(2, 65, 8)[:, 1:]; assert is_copy_of(p.reshape(-1, 8), p)
    auto flat = patches.reshape({-1, patches.size(-1)});  // EXPECT: tensor-reshape-non-contiguous
    auto image_embeds = projector(flat);
    if (track_stats) {
      auto e = image_embeds.detach();
      // FACT: w = torch.rand(4, 4, requires_grad=True); y = torch.rand(3, 4) @ w; e = y.detach(); e.div_(2.0); assert shares_storage(e, y) and y._version == e._version == 1
      e.div_(e.norm(2, -1, true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-detached
      token_similarity = e.matmul(e.t()).mean();
    }
    return image_embeds;
  }

  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& pixels) {
    auto text = tok_emb(input_ids);
    auto image_embeds = encode_images(pixels);
    auto slots = (input_ids == cfg.image_token_id).unsqueeze(-1).expand_as(text);
    auto h = text.masked_scatter(slots, image_embeds.to(text.dtype()));
    auto keep = input_ids != cfg.pad_id;
    auto pos = torch::arange(h.size(1), torch::kLong);
    h = h + pos_emb(pos);  // EXPECT: tensor-device-mismatch
    for (auto& blk : blocks) h = blk->forward(h, keep);
    return head(ln_f(h));
  }

  LlavaConfig cfg;
  VisionTower vision;
  Projector projector;
  torch::nn::Embedding tok_emb, pos_emb;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
  std::vector<DecoderBlock> blocks;
  bool track_stats = false;
  torch::Tensor token_similarity;
};
TORCH_MODULE(LlavaModel);

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& labels, int64_t ignore) {
  const auto V = logits.size(-1);
  auto shift_logits = logits.slice(1, 0, -1);
  auto shift_labels = labels.slice(1, 1).contiguous();
  auto opts = F::CrossEntropyFuncOptions().ignore_index(ignore);
  // FACT: l = torch.rand(2, 5, 7)[:, :-1, :]; assert raises(lambda: l.view(-1, 7), "view size is not compatible")
  auto flat_logits = shift_logits.view({-1, V});  // EXPECT: tensor-view-non-contiguous
  return F::cross_entropy(flat_logits, shift_labels.view({-1}), opts);
}

struct Sample {
  torch::Tensor image;  // uint8, CHW
  torch::Tensor ids;
  int64_t prompt_len;
};

struct Batch {
  torch::Tensor images, input_ids, labels;
};

Batch collate(const std::vector<Sample>& samples, const LlavaConfig& cfg) {
  const auto B = static_cast<int64_t>(samples.size());
  const auto S = cfg.image_size;
  Batch b;
  b.images = torch::empty({B, 3, S, S}, torch::kFloat);
  b.input_ids = torch::full({B, cfg.max_len}, cfg.pad_id, torch::kInt);  // int32 keeps the cache small
  b.labels = torch::full({B, cfg.max_len}, cfg.ignore_index, torch::kLong);
  for (int64_t i = 0; i < B; ++i) {
    const auto& s = samples[i];
    const auto n = std::min(s.ids.size(0), cfg.max_len);
    b.images[i].copy_(s.image);  // LOOKALIKE: tensor-copy-narrowing -- uint8 into float widens
    b.input_ids[i].narrow(0, 0, n).copy_(s.ids.narrow(0, 0, n));  // EXPECT: tensor-copy-narrowing
    b.labels[i].narrow(0, 0, n).copy_(s.ids.narrow(0, 0, n));
    b.labels[i].narrow(0, 0, std::min(s.prompt_len, n)).fill_(cfg.ignore_index);
  }
  b.images.div_(255.0);
  return b;
}

std::vector<Sample> synthetic_samples(const LlavaConfig& cfg, int64_t count) {
  std::vector<Sample> out;
  std::mt19937 rng(0);
  std::uniform_int_distribution<int64_t> len_dist(16, 96);
  for (int64_t i = 0; i < count; ++i) {
    auto prompt = torch::randint(3, cfg.vocab - 1, {len_dist(rng)}, torch::kLong);
    auto answer = torch::randint(3, cfg.vocab - 1, {len_dist(rng)}, torch::kLong);
    auto image_slots = torch::full({cfg.n_image_tokens()}, cfg.image_token_id, torch::kLong);
    auto ids = torch::cat({torch::ones({1}, torch::kLong), image_slots, prompt, answer,
                           torch::full({1}, cfg.eos_id, torch::kLong)});
    auto img = torch::randint(0, 256, {3, cfg.image_size, cfg.image_size}, torch::kByte);
    out.push_back({img, ids, 1 + cfg.n_image_tokens() + prompt.size(0)});
  }
  return out;
}

std::vector<int64_t> generate(LlavaModel& model, const torch::Tensor& raw_image,
                              std::vector<int64_t> tokens, const LlavaConfig& cfg,
                              torch::Device device, int64_t max_new = 64, double temperature = 0.7) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto x = raw_image.unsqueeze(0).to(torch::kFloat);
  // FACT: r = torch.randint(0, 255, (3, 8, 8), dtype=torch.uint8); assert is_copy_of(r.unsqueeze(0).to(torch.float32), r)
  x.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 -> float allocates a new tensor
  auto pixels = clip_normalize(x);
  for (int64_t t = 0; t < max_new; ++t) {
    auto ids = torch::tensor(tokens, torch::kLong).unsqueeze(0).to(device);  // LOOKALIKE: tensor-clone-in-loop -- the prompt grows every step
    auto logits = model->forward(ids, pixels.to(device));  // EXPECT: tensor-clone-in-loop
    auto last = logits.select(1, -1).squeeze(0);
    auto scaled = last.clone();  // EXPECT: tensor-unnecessary-clone
    scaled.div_(temperature);
    auto probs = torch::softmax(scaled, -1);
    const int64_t next = torch::multinomial(probs, 1).item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the sampled token drives the next step
    if (next == cfg.eos_id) break;
    tokens.push_back(next);
  }
  return tokens;
}

int main() {
  LlavaConfig cfg;
  torch::manual_seed(0);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  auto samples = synthetic_samples(cfg, 512);
  std::vector<Batch> batches;
  for (size_t i = 0; i + cfg.batch_size <= samples.size(); i += cfg.batch_size)
    batches.push_back(collate(std::vector<Sample>(samples.begin() + i, samples.begin() + i + cfg.batch_size), cfg));

  LlavaModel model(cfg);
  model->to(device);
  model->track_stats = true;

  std::vector<torch::Tensor> trainable;
  for (auto& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(cfg.lr).weight_decay(0.0));
  auto w0 = model->projector->fc1->weight.detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- opt.step() rewrites the parameter in place

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    model->vision->eval();
    torch::Tensor epoch_loss = torch::zeros({}, device);
    for (size_t step = 0; step < batches.size(); ++step) {
      auto& batch = batches[step];
      auto pixels = clip_normalize(batch.images).to(device);
      auto ids = batch.input_ids.to(device);
      auto labels = batch.labels.to(device);
      auto logits = model->forward(ids, pixels);
      auto loss = lm_loss(logits, labels, cfg.ignore_index);
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(trainable, 1.0);
      opt.step();
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      if (step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step
                  << " loss " << loss.item<float>()  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
                  << " img-sim " << model->token_similarity.item<float>() << "\n";
      }
    }
    auto drift = (model->projector->fc1->weight.detach() - w0).norm().item<double>();
    std::cout << "epoch " << epoch << " mean loss "
              << epoch_loss.item<double>() / static_cast<double>(batches.size())
              << " projector drift " << drift << "\n";
  }

  std::vector<int64_t> prompt{1};
  prompt.insert(prompt.end(), cfg.n_image_tokens(), cfg.image_token_id);
  auto out = generate(model, samples.front().image, prompt, cfg, device);
  std::cout << "generated " << out.size() << " tokens\n";
  return 0;
}
