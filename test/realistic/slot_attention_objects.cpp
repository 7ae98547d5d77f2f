// Slot Attention (Locatello et al. 2020) for unsupervised object discovery on CLEVR-style scenes.
// A CNN encoder with a soft position embedding turns the image into N = H * W feature vectors;
// K slots are sampled from a learned Gaussian and refined for a few rounds in which the slots
// compete for pixels (softmax over the slots), then updated by a GRU and a residual MLP. A spatial
// broadcast decoder renders every slot to RGB + an alpha logit; the alphas are normalised over
// the slots and the mixture is trained to reconstruct the image. Evaluation reports the ARI of
// the slot masks against the ground-truth object ids and how many pixels each slot takes.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

struct SlotConfig {
  int64_t resolution = 64, in_channels = 3, hidden = 64, slot_dim = 64, num_slots = 7, iters = 3;
  int64_t mlp_hidden = 128, decoder_init = 8, max_objects = 11;
  int64_t batch_size = 32, epochs = 200, warmup_steps = 10000, decay_steps = 100000, log_every = 100;
  double lr = 4e-4, decay_rate = 0.5, eps = 1e-8, grad_clip = 1.0;
};

// [H, W, 4] grid of (y, x, 1 - y, 1 - x) in [0, 1], as in the reference implementation.
torch::Tensor build_grid(int64_t h, int64_t w) {
  auto mesh = torch::meshgrid({torch::linspace(0, 1, h), torch::linspace(0, 1, w)}, "ij");
  auto grid = torch::stack({mesh[0], mesh[1]}, -1);
  return torch::cat({grid, 1 - grid}, -1);
}

struct SoftPositionEmbedImpl : torch::nn::Module {
  SoftPositionEmbedImpl(int64_t hidden, int64_t h, int64_t w) {
    proj_ = register_module("proj", torch::nn::Linear(4, hidden));
    grid_ = register_buffer("grid", build_grid(h, w));
  }
  // x: [B, H, W, C], channels last.
  torch::Tensor forward(const torch::Tensor &x) { return x + proj_(grid_); }
  // [C, H, W] for channels-first feature maps.
  torch::Tensor channels_first() { return proj_(grid_).permute({2, 0, 1}); }

  torch::nn::Linear proj_{nullptr};
  torch::Tensor grid_;
};
TORCH_MODULE(SoftPositionEmbed);

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(const SlotConfig &cfg) {
    namespace nn = torch::nn;
    const auto C = cfg.hidden;
    convs_ = register_module("convs", nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(cfg.in_channels, C, 5).padding(2)), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(C, C, 5).padding(2)), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(C, C, 5).padding(2)), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(C, C, 5).padding(2)), nn::ReLU()));
    pos_ = register_module("pos", SoftPositionEmbed(C, cfg.resolution, cfg.resolution));
    norm_ = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({C})));
    mlp_ = register_module("mlp", nn::Sequential(nn::Linear(C, C), nn::ReLU(), nn::Linear(C, C)));
  }

  // [B, 3, H, W] -> [B, H * W, C]
  torch::Tensor forward(const torch::Tensor &img) {
    auto h = convs_->forward(img);
    auto x = pos_(h.permute({0, 2, 3, 1}));
    // FACT: h = torch.randn(2, 5, 4, 3); x = h.permute(0, 2, 3, 1) + torch.randn(4, 3, 5); assert not is_contiguous(x) and is_view_of(x.flatten(1, 2), x)
    x = x.flatten(1, 2); // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent after the permute: flatten is a view
    return mlp_->forward(norm_(x));
  }

  torch::nn::Sequential convs_{nullptr}, mlp_{nullptr};
  SoftPositionEmbed pos_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
};
TORCH_MODULE(Encoder);

struct SlotState {
  torch::Tensor slots; // [B, K, D]
  torch::Tensor attn;  // [B, K, N], the last round's attention
};

struct SlotAttentionImpl : torch::nn::Module {
  explicit SlotAttentionImpl(const SlotConfig &cfg)
      : iters_(cfg.iters), eps_(cfg.eps), scale_(1.0 / std::sqrt(static_cast<double>(cfg.slot_dim))) {
    namespace nn = torch::nn;
    const auto D = cfg.slot_dim;
    mu_ = register_parameter("slots_mu", torch::empty({1, 1, D}));
    log_sigma_ = register_parameter("slots_log_sigma", torch::empty({1, 1, D}));
    // FACT: p = torch.nn.Parameter(torch.empty(1, 1, 8)); torch.nn.init.xavier_uniform_(p); assert p.is_leaf and p.requires_grad
    nn::init::xavier_uniform_(mu_); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    nn::init::xavier_uniform_(log_sigma_);
    norm_in_ = register_module("norm_in", nn::LayerNorm(nn::LayerNormOptions({cfg.hidden})));
    norm_slots_ = register_module("norm_slots", nn::LayerNorm(nn::LayerNormOptions({D})));
    norm_mlp_ = register_module("norm_mlp", nn::LayerNorm(nn::LayerNormOptions({D})));
    q_ = register_module("q", nn::Linear(nn::LinearOptions(D, D).bias(false)));
    k_ = register_module("k", nn::Linear(nn::LinearOptions(cfg.hidden, D).bias(false)));
    v_ = register_module("v", nn::Linear(nn::LinearOptions(cfg.hidden, D).bias(false)));
    gru_ = register_module("gru", nn::GRUCell(nn::GRUCellOptions(D, D)));
    mlp_ = register_module("mlp", nn::Sequential(nn::Linear(D, cfg.mlp_hidden), nn::ReLU(),
                                                 nn::Linear(cfg.mlp_hidden, D)));
  }

  // inputs [B, N, C] -> slots [B, K, D]; K may differ from training (more objects at test time).
  SlotState forward(const torch::Tensor &inputs, int64_t num_slots) {
    const auto B = inputs.size(0), D = mu_.size(2);
    auto x = norm_in_(inputs);
    auto k = k_(x), v = v_(x);
    auto slots = torch::randn({B, num_slots, D}, inputs.options());
    // FACT: mu = torch.nn.Parameter(torch.randn(1, 1, 4)); ls = torch.nn.Parameter(torch.zeros(1, 1, 4)); n = torch.randn(2, 3, 4); n.mul_(ls.exp()).add_(mu); n.sum().backward(); assert mu.grad is not None and n.shape == (2, 3, 4)
    slots.mul_(log_sigma_.exp()).add_(mu_); // LOOKALIKE: tensor-inplace-on-expanded, tensor-inplace-on-leaf -- fresh noise of its own memory; mu and sigma only broadcast into it
    torch::Tensor attn;
    for (int64_t it = 0; it < iters_; ++it) {
      auto slots_prev = slots;
      auto q = q_(norm_slots_(slots));
      auto logits = torch::matmul(q, k.transpose(1, 2)) * scale_; // [B, K, N]
      attn = torch::softmax(logits, 1);                            // the slots compete for each pixel
      // FACT: q = torch.nn.Linear(4, 4)(torch.randn(2, 3, 4)); a = torch.softmax(q @ torch.randn(2, 4, 6), 1); a.add_(1e-8); assert backward_fails(lambda: a.sum().backward())
      attn.add_(eps_); // EXPECT: tensor-inplace-on-saved -- softmax saved its output for backward; the reconstruction loss cannot backpropagate
      auto weights = attn / attn.sum(-1, true); // weighted mean over the pixels
      auto updates = torch::matmul(weights, v);  // [B, K, D]
      // FACT: w = torch.softmax(torch.randn(2, 3, 6), 1); u = torch.matmul(w, torch.randn(2, 6, 4)); assert is_view_of(u.view(-1, 4), u)
      slots = gru_(updates.view({-1, D}), slots_prev.view({-1, D})); // LOOKALIKE: tensor-view-non-contiguous -- a batched matmul's result is contiguous
      slots = slots.view({B, num_slots, D});
      slots = slots + mlp_->forward(norm_mlp_(slots));
    }
    return {slots, attn};
  }

  int64_t iters_;
  double eps_, scale_;
  torch::Tensor mu_, log_sigma_;
  torch::nn::LayerNorm norm_in_{nullptr}, norm_slots_{nullptr}, norm_mlp_{nullptr};
  torch::nn::Linear q_{nullptr}, k_{nullptr}, v_{nullptr};
  torch::nn::GRUCell gru_{nullptr};
  torch::nn::Sequential mlp_{nullptr};
};
TORCH_MODULE(SlotAttention);

struct DecoderImpl : torch::nn::Module {
  explicit DecoderImpl(const SlotConfig &cfg) : init_(cfg.decoder_init) {
    namespace nn = torch::nn;
    const auto D = cfg.slot_dim, C = cfg.hidden;
    pos_ = register_module("pos", SoftPositionEmbed(D, init_, init_));
    auto up = [](int64_t in, int64_t out) {
      return nn::ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, 5).stride(2).padding(2).output_padding(1));
    };
    net_ = register_module("net", nn::Sequential(up(D, C), nn::ReLU(), up(C, C), nn::ReLU(), up(C, C), nn::ReLU(),
                                                 nn::Conv2d(nn::Conv2dOptions(C, C, 5).padding(2)), nn::ReLU(),
                                                 nn::Conv2d(nn::Conv2dOptions(C, 4, 3).padding(1))));
  }

  // slots [B, K, D] -> [B, K, 4, R, R]: RGB and an alpha logit per slot.
  torch::Tensor forward(const torch::Tensor &slots) {
    const auto B = slots.size(0), K = slots.size(1), D = slots.size(2);
    // FACT: s = torch.randn(2, 3, 4) + torch.randn(2, 3, 4); assert is_view_of(s.reshape(6, 4, 1, 1), s)
    auto z = slots.reshape({B * K, D, 1, 1}).expand({-1, -1, init_, init_}); // LOOKALIKE: tensor-reshape-non-contiguous -- the slots are contiguous: reshape is a view
    // FACT: s = torch.nn.Linear(4, 4)(torch.randn(6, 4)); z = s.reshape(6, 4, 1, 1).expand(-1, -1, 5, 5); assert raises(lambda: z.add_(torch.randn(4, 5, 5)), "more than one element of the written-to tensor refers to a single memory location")
    z.add_(pos_->channels_first()); // EXPECT: tensor-inplace-on-expanded -- every pixel of the broadcast grid is the same memory: PyTorch refuses the write
    auto out = net_->forward(z);
    // FACT: o = torch.nn.ConvTranspose2d(3, 4, 5, stride=2, padding=2, output_padding=1)(torch.randn(6, 3, 4, 4)); assert is_view_of(o.view(2, 3, 4, 8, 8), o)
    return out.view({B, K, 4, out.size(2), out.size(3)}); // LOOKALIKE: tensor-view-non-contiguous -- a convolution's output is contiguous
  }

  int64_t init_;
  SoftPositionEmbed pos_{nullptr};
  torch::nn::Sequential net_{nullptr};
};
TORCH_MODULE(Decoder);

struct SlotOutput {
  torch::Tensor recon; // [B, 3, H, W]
  torch::Tensor rgb;   // [B, K, 3, H, W]
  torch::Tensor masks; // [B, K, H, W], sums to one over K
  torch::Tensor attn;  // [B, K, N]
};

struct SlotAutoEncoderImpl : torch::nn::Module {
  explicit SlotAutoEncoderImpl(const SlotConfig &cfg) : num_slots_(cfg.num_slots) {
    encoder_ = register_module("encoder", Encoder(cfg));
    slot_attn_ = register_module("slot_attn", SlotAttention(cfg));
    decoder_ = register_module("decoder", Decoder(cfg));
  }
  SlotOutput forward(const torch::Tensor &img) {
    auto state = slot_attn_->forward(encoder_(img), num_slots_);
    auto dec = decoder_(state.slots);
    auto rgb = dec.narrow(2, 0, 3);
    auto masks = torch::softmax(dec.narrow(2, 3, 1), 1);
    auto recon = (rgb * masks).sum(1);
    return {recon, rgb, masks.squeeze(2), state.attn};
  }
  int64_t num_slots_;
  Encoder encoder_{nullptr};
  SlotAttention slot_attn_{nullptr};
  Decoder decoder_{nullptr};
};
TORCH_MODULE(SlotAutoEncoder);

// Rendered scenes kept in memory as uint8, with per-pixel object ids (0 = background).
struct SceneDataset : torch::data::datasets::Dataset<SceneDataset> {
  SceneDataset(torch::Tensor images, torch::Tensor ids) : images_(std::move(images)), ids_(std::move(ids)) {
    TORCH_CHECK(images_.scalar_type() == torch::kByte, "scenes are stored as uint8");
  }
  torch::data::Example<> get(size_t i) override {
    auto img = images_[i].to(torch::kFloat);
    // FACT: s = torch.randint(0, 255, (4, 3, 8, 8), dtype=torch.uint8); img = s[1].to(torch.float); img.div_(255); assert is_copy_of(img, s)
    img.div_(255); // LOOKALIKE: tensor-alias-then-mutate -- the scenes are uint8: to(kFloat) made a copy
    return {img, ids_[i]};
  }
  torch::optional<size_t> size() const override { return images_.size(0); }
  torch::Tensor images_, ids_;
};

// Adjusted Rand index per image between the argmax slot and the ground-truth object of each pixel.
torch::Tensor adjusted_rand_index(const torch::Tensor &true_ids, const torch::Tensor &masks, int64_t n_true) {
  const auto B = masks.size(0), K = masks.size(1);
  // FACT: m = torch.softmax(torch.randn(2, 3, 4, 4, 5).narrow(2, 3, 1), 1).squeeze(2); assert is_view_of(m.permute(0, 2, 3, 1).view(2, -1, 3), m)
  auto pred = masks.permute({0, 2, 3, 1}).view({B, -1, K}).argmax(-1); // LOOKALIKE: tensor-view-non-contiguous -- H and W stay adjacent after the permute: only they are merged
  auto t = torch::one_hot(true_ids.view({B, -1}), n_true).to(torch::kFloat); // [B, N, T]
  auto p = torch::one_hot(pred, K).to(torch::kFloat);                        // [B, N, K]
  auto nij = torch::bmm(t.transpose(1, 2), p);
  auto a = nij.sum(2), b = nij.sum(1);
  auto n = t.sum({1, 2});
  auto rindex = (nij * (nij - 1)).sum({1, 2});
  auto aindex = (a * (a - 1)).sum(1), bindex = (b * (b - 1)).sum(1);
  auto expected = aindex * bindex / (n * (n - 1)).clamp_min(1);
  auto max_index = (aindex + bindex) / 2;
  return (rindex - expected) / (max_index - expected).clamp_min(1e-8);
}

// Pixels owned by each slot over a batch: a slot that never wins a pixel is a dead slot.
torch::Tensor slot_usage(const torch::Tensor &masks) {
  const auto K = masks.size(1);
  // FACT: m = torch.softmax(torch.randn(2, 3, 4, 4, 5).narrow(2, 3, 1), 1).squeeze(2); assert raises(lambda: m.permute(0, 2, 3, 1).view(-1, 3), "view size is not compatible")
  auto owner = masks.permute({0, 2, 3, 1}).view({-1, K}).argmax(1); // EXPECT: tensor-view-non-contiguous -- batch and pixels are not adjacent after the permute: view throws
  return torch::bincount(owner, {}, K);
}

// One row per image: the K masks side by side, [B * H, K * W] grey levels for the log.
torch::Tensor mask_strip(const torch::Tensor &masks) {
  const auto B = masks.size(0), K = masks.size(1), H = masks.size(2), W = masks.size(3);
  // FACT: m = torch.softmax(torch.randn(2, 3, 4, 4, 5).narrow(2, 3, 1), 1).squeeze(2); assert is_copy_of(m.permute(0, 2, 1, 3).reshape(8, 15), m)
  auto strip = masks.permute({0, 2, 1, 3}).reshape({B * H, K * W}); // EXPECT: tensor-reshape-non-contiguous -- B and H are not adjacent after the permute: every mask is copied
  return strip.mul(255).round().to(torch::kUInt8);
}

double lr_at(const SlotConfig &cfg, int64_t step) {
  const double warm = std::min(1.0, static_cast<double>(step) / cfg.warmup_steps);
  return cfg.lr * warm * std::pow(cfg.decay_rate, static_cast<double>(step) / cfg.decay_steps);
}

double evaluate(SlotAutoEncoder &model, SceneDataset val, const SlotConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(val).map(torch::data::transforms::Stack<>()), cfg.batch_size);
  auto ari_total = torch::zeros({}, device);
  auto usage = torch::zeros({cfg.num_slots}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t n_images = 0;
  for (auto &batch : *loader) {
    auto out = model->forward(batch.data.to(device).mul(2).sub(1));
    auto ari = adjusted_rand_index(batch.target.to(device), out.masks, cfg.max_objects);
    ari_total += ari.sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph is recorded
    usage += slot_usage(out.masks);
    // FACT: m = torch.softmax(torch.nn.Linear(3, 3)(torch.randn(2, 3)), 1); exec('with torch.no_grad():\n y = torch.softmax(torch.nn.Linear(3, 3)(torch.randn(2, 3)), 1)\ny.mul_(255)'); assert m.requires_grad and not y.requires_grad
    out.masks.mul_(255); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard the softmax saved nothing
    if (n_images == 0)
      std::cout << "masks of the first batch: " << mask_strip(out.masks.div(255)).sizes() << "\n";
    n_images += batch.data.size(0);
  }
  std::cout << "pixels per slot: " << usage << "\n";
  return ari_total.item<double>() / std::max<int64_t>(n_images, 1);
}

void train(SlotAutoEncoder &model, SceneDataset train_set, SceneDataset val_set, const SlotConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto loader = torch::data::make_data_loader(std::move(train_set).map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions(cfg.batch_size).workers(4));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto epoch_recon = torch::zeros({}, device);
    int64_t n_batches = 0;
    for (auto &batch : *loader) {
      auto img = batch.data.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      // FACT: i = torch.rand(2, 3, 4, 4); x = i.clone(); x.mul_(2).sub_(1); assert torch.equal(x, i.mul(2).sub_(1)) and is_copy_of(x, i)
      auto x = img.clone(); // EXPECT: tensor-unnecessary-clone -- rescaled in place at once: img.mul(2) makes the same tensor in one pass
      x.mul_(2).sub_(1);
      for (auto &group : opt.param_groups())
        static_cast<torch::optim::AdamOptions &>(group.options()).lr(lr_at(cfg, step));
      auto out = model->forward(x);
      auto loss = torch::mse_loss(out.recon, x);
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.grad_clip);
      opt.step();
      // FACT: l = torch.nn.Linear(3, 3); s = torch.zeros(()); exec('for _ in range(3):\n loss = (l(torch.randn(2, 3)) ** 2).mean(); loss.backward(); s += loss'); assert s.requires_grad and kept_nodes(s) >= 3 * 3
      epoch_recon += loss; // EXPECT: tensor-graph-kept-across-iterations -- the epoch total holds every step's graph until the epoch ends
      ++n_batches;
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " recon " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    std::cout << "epoch " << epoch << " recon " << (epoch_recon / std::max<int64_t>(n_batches, 1)).item<double>() // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the loop of steps
              << " val ARI " << evaluate(model, val_set, cfg, device) << "\n";
  }
}
