// VQ-VAE (van den Oord et al. 2017) whose codebook is learned by exponential moving averages of
// the encoder outputs assigned to each code, not by a codebook loss (the EMA variant of the
// paper's appendix). Encoder outputs are snapped to their nearest code, the decoder receives the
// codes through a straight-through estimator, codes that nobody picks for a while are restarted
// on encoder outputs of the current batch, and the code usage is logged once per epoch. A second
// path extracts the code maps of a dataset for training the autoregressive prior.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

struct VQConfig {
  int64_t in_channels = 3, hidden = 128, embed_dim = 64, n_codes = 512;
  double decay = 0.99, eps = 1e-5, commitment = 0.25, lr = 2e-4;
  double dead_threshold = 1.0; // EMA count under which a code counts as dead
  int64_t restart_every = 200; // forward calls between two restarts
  int64_t epochs = 40, batch_size = 128, log_every = 100;
};

struct ResBlockImpl : torch::nn::Module {
  explicit ResBlockImpl(int64_t ch) {
    conv3_ = register_module("conv3", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, ch / 2, 3).padding(1)));
    conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch / 2, ch, 1)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto out = conv1_(torch::relu(conv3_(torch::relu(x))));
    // FACT: c = torch.nn.Conv2d(2, 2, 3, padding=1); x = torch.randn(1, 2, 4, 4, requires_grad=True); o = c(torch.relu(x)); o += x; o.sum().backward(); assert x.grad is not None
    out += x; // LOOKALIKE: tensor-inplace-on-saved -- a convolution saves its input and weight, not its output
    return out;
  }
  torch::nn::Conv2d conv3_{nullptr}, conv1_{nullptr};
};
TORCH_MODULE(ResBlock);

struct VQOutput {
  torch::Tensor quantized;   // [B, D, H, W], gradients pass straight through to the encoder
  torch::Tensor commit_loss; // beta * |z_e - sg(q)|^2
  torch::Tensor codes;       // [B, H, W] int64
  torch::Tensor perplexity;  // exp(entropy) of the batch's code histogram
};

struct VectorQuantizerEMAImpl : torch::nn::Module {
  explicit VectorQuantizerEMAImpl(const VQConfig &cfg)
      : K_(cfg.n_codes), D_(cfg.embed_dim), decay_(cfg.decay), eps_(cfg.eps), beta_(cfg.commitment),
        dead_threshold_(cfg.dead_threshold), restart_every_(cfg.restart_every) {
    embed_ = register_buffer("embed", torch::randn({K_, D_}));
    cluster_size_ = register_buffer("cluster_size", torch::ones({K_}));
    embed_sum_ = register_buffer("embed_sum", embed_.clone()); // LOOKALIKE: tensor-unnecessary-clone -- both buffers are rewritten in place by every EMA update: they must not share storage
  }

  VQOutput forward(const torch::Tensor &z_e) {
    const auto B = z_e.size(0), H = z_e.size(2), W = z_e.size(3);
    auto z = z_e.permute({0, 2, 3, 1}).contiguous();
    // FACT: z = torch.randn(2, 4, 3, 3); zz = z.permute(0, 2, 3, 1).contiguous(); assert is_view_of(zz.view(-1, 4), zz)
    auto flat = z.view({-1, D_}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() made the channels-last copy first
    // |z|^2 - 2 z.e + |e|^2 for every (vector, code) pair
    auto dist = flat.pow(2).sum(1, true) - 2 * flat.matmul(embed_.t()) + embed_.pow(2).sum(1).unsqueeze(0);
    auto idx = dist.argmin(1);
    auto q = embed_.index_select(0, idx);
    auto commit = torch::mse_loss(flat, q.detach());
    auto onehot = torch::one_hot(idx, K_).to(flat.scalar_type());
    if (is_training()) {
      update_codebook(flat.detach(), onehot);
      if (++calls_ % restart_every_ == 0)
        restarted_ += restart_dead(flat);
    }
    auto q_st = flat + (q - flat).detach();
    auto avg = onehot.mean(0);
    auto perplexity = torch::exp(-(avg * torch::log(avg + 1e-10)).sum());
    // FACT: i = torch.randn(24, 7).argmin(1); assert is_view_of(i.view(2, 3, 4), i)
    auto codes = idx.view({B, H, W}); // LOOKALIKE: tensor-view-non-contiguous -- argmin returns a fresh contiguous tensor
    auto quantized = q_st.view({B, H, W, D_}).permute({0, 3, 1, 2});
    return {quantized, beta_ * commit, codes, perplexity};
  }

  // N_k <- g N_k + (1 - g) n_k,  m_k <- g m_k + (1 - g) sum z,  e_k = m_k / N_k (Laplace-smoothed)
  void update_codebook(const torch::Tensor &flat, const torch::Tensor &onehot) {
    torch::NoGradGuard no_grad;
    auto counts = onehot.sum(0);
    auto sums = onehot.t().matmul(flat);
    cluster_size_.mul_(decay_).add_(counts, 1 - decay_); // LOOKALIKE: tensor-inplace-on-leaf -- a registered buffer, updated under NoGradGuard
    embed_sum_.mul_(decay_).add_(sums, 1 - decay_);
    const auto n = cluster_size_.sum();
    auto smoothed = (cluster_size_ + eps_) / (n + K_ * eps_) * n;
    auto denom = smoothed.unsqueeze(1).expand_as(embed_sum_);
    embed_.copy_(embed_sum_);
    // FACT: e = torch.randn(5, 3); s = torch.rand(5) + 0.5; d = s.unsqueeze(1).expand_as(e); e.div_(d); assert d.stride(1) == 0 and e.stride(1) == 1
    embed_.div_(denom); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded counts are only read; the codebook has memory of its own
  }

  // Codes whose EMA count fell under the threshold take a random encoder output of the batch.
  int64_t restart_dead(const torch::Tensor &flat) {
    auto dead = (cluster_size_ < dead_threshold_).nonzero().squeeze(1);
    const auto n_dead = dead.size(0);
    if (n_dead == 0)
      return 0;
    auto pool = flat.detach();
    // a little jitter, so that two codes restarted on the same vector drift apart
    // FACT: w = torch.randn(6, 4, requires_grad=True); z = w * 2; l = torch.nn.functional.mse_loss(z, torch.randn(6, 4)); d = z.detach(); d.add_(torch.randn_like(d) * 0.01); assert backward_fails(lambda: l.backward())
    pool.add_(torch::randn_like(pool) * 0.01); // EXPECT: tensor-inplace-on-detached -- pool shares flat's storage and version counter: the commitment loss saved flat, so backward() fails
    auto pick = torch::randint(pool.size(0), {n_dead}, torch::TensorOptions().dtype(torch::kLong).device(pool.device()));
    auto samples = pool.index_select(0, pick);
    torch::NoGradGuard no_grad;
    embed_.index_copy_(0, dead, samples);
    embed_sum_.index_copy_(0, dead, samples);
    cluster_size_.index_fill_(0, dead, 1.0); // LOOKALIKE: tensor-inplace-on-leaf -- a buffer, and grad mode is off
    return n_dead;
  }

  int64_t K_, D_;
  double decay_, eps_, beta_, dead_threshold_;
  int64_t restart_every_, calls_ = 0, restarted_ = 0;
  torch::Tensor embed_, cluster_size_, embed_sum_;
};
TORCH_MODULE(VectorQuantizerEMA);

// Exact nearest codes by broadcasting: no |z|^2 - 2ze + |e|^2 cancellation in the prior's data.
torch::Tensor nearest_codes(const torch::Tensor &flat, const torch::Tensor &embed) {
  const auto N = flat.size(0), K = embed.size(0), D = flat.size(1);
  auto diff = flat.unsqueeze(1).expand({N, K, D});
  // FACT: f = torch.randn(6, 4); e = torch.randn(5, 4); d = f.unsqueeze(1).expand(6, 5, 4); assert raises(lambda: d.sub_(e.unsqueeze(0)), "more than one element of the written-to tensor refers to a single memory location")
  diff.sub_(embed.unsqueeze(0)); // EXPECT: tensor-inplace-on-expanded -- each vector is broadcast over the K codes without memory of its own
  return diff.pow(2).sum(-1).argmin(1);
}

// Normalised code histogram of the EMA counts, for the usage log.
torch::Tensor usage_distribution(const torch::Tensor &cluster_size) {
  auto p = cluster_size;
  // FACT: c = torch.rand(5) * 10; c0 = c.clone(); p = c; p /= p.sum(); assert shares_storage(p, c) and not torch.equal(c, c0)
  p /= p.sum().clamp_min(1e-8); // EXPECT: tensor-alias-then-mutate -- p is the quantizer's cluster_size buffer: the EMA counts become a distribution
  return p;
}

struct VQVAEOutput {
  torch::Tensor recon, commit_loss, perplexity;
};

struct VQVAEImpl : torch::nn::Module {
  explicit VQVAEImpl(const VQConfig &cfg) {
    namespace nn = torch::nn;
    const auto h = cfg.hidden;
    encoder_ = register_module("encoder", nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(cfg.in_channels, h / 2, 4).stride(2).padding(1)), nn::ReLU(),
        nn::Conv2d(nn::Conv2dOptions(h / 2, h, 4).stride(2).padding(1)), nn::ReLU(),
        ResBlock(h), ResBlock(h), nn::Conv2d(nn::Conv2dOptions(h, cfg.embed_dim, 1))));
    vq_ = register_module("vq", VectorQuantizerEMA(cfg));
    decoder_ = register_module("decoder", nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(cfg.embed_dim, h, 3).padding(1)), ResBlock(h), ResBlock(h), nn::ReLU(),
        nn::ConvTranspose2d(nn::ConvTranspose2dOptions(h, h / 2, 4).stride(2).padding(1)), nn::ReLU(),
        nn::ConvTranspose2d(nn::ConvTranspose2dOptions(h / 2, cfg.in_channels, 4).stride(2).padding(1))));
  }

  VQVAEOutput forward(const torch::Tensor &x) {
    auto vq = vq_->forward(encoder_->forward(x));
    return {decoder_->forward(vq.quantized), vq.commit_loss, vq.perplexity};
  }

  // [B, H, W] code maps of a batch of images, for the prior's training set.
  torch::Tensor encode_codes(const torch::Tensor &images) {
    torch::NoGradGuard no_grad;
    auto z_e = encoder_->forward(images);
    const auto B = z_e.size(0), D = z_e.size(1), H = z_e.size(2), W = z_e.size(3);
    // FACT: z = torch.nn.Conv2d(3, 4, 1)(torch.randn(2, 3, 5, 5)); assert raises(lambda: z.permute(0, 2, 3, 1).view(-1, 4), "view size is not compatible")
    auto flat = z_e.permute({0, 2, 3, 1}).view({-1, D}); // EXPECT: tensor-view-non-contiguous -- channels-last is a permutation of the conv output: B, H, W cannot merge without a copy
    return nearest_codes(flat, vq_->embed_).view({B, H, W});
  }

  torch::nn::Sequential encoder_{nullptr}, decoder_{nullptr};
  VectorQuantizerEMA vq_{nullptr};
};
TORCH_MODULE(VQVAE);

// uint8 images [N, C, H, W], scaled to [0, 1] one at a time.
struct ImageTensors : torch::data::datasets::Dataset<ImageTensors> {
  explicit ImageTensors(torch::Tensor images) : images_(std::move(images)) {
    TORCH_CHECK(images_.scalar_type() == torch::kByte, "expected uint8 pixels");
  }
  torch::data::Example<> get(size_t i) override {
    auto x = images_[i].to(torch::kFloat);
    // FACT: im = torch.randint(0, 255, (4, 3, 8, 8), dtype=torch.uint8); x = im[1].to(torch.float); x.div_(255); assert is_copy_of(x, im)
    x.div_(255); // LOOKALIKE: tensor-alias-then-mutate -- the pixels are uint8: to(kFloat) made a copy
    return {x, torch::zeros({})};
  }
  torch::optional<size_t> size() const override { return images_.size(0); }
  torch::Tensor images_;
};

void train(VQVAE &model, const torch::Tensor &images, const VQConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  auto loader = torch::data::make_data_loader(ImageTensors(images).map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions(cfg.batch_size).workers(2));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto codebook_start = model->vq_->embed_.clone(); // LOOKALIKE: tensor-clone-in-loop, tensor-unnecessary-clone -- a snapshot: every training forward moves the codebook
    double epoch_recon = 0;
    int64_t n_batches = 0;
    for (auto &batch : *loader) {
      auto x = batch.data.to(device);
      // FACT: b = torch.rand(2, 3, 4, 4); x = b.to("cpu"); x.mul_(2).sub_(1); assert shares_storage(x, b)
      x.mul_(2).sub_(1); // LOOKALIKE: tensor-alias-then-mutate -- on a CPU run this is the loader's own batch, which nothing reads again
      auto out = model->forward(x);
      auto recon = torch::mse_loss(out.recon, x);
      auto loss = recon + out.commit_loss;
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_recon += recon.item<double>(); // EXPECT: tensor-sync-in-loop -- the reconstruction loss is read back from the GPU after every step
      ++n_batches;
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " perplexity " << out.perplexity.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }

    torch::NoGradGuard no_grad;
    auto p = usage_distribution(model->vq_->cluster_size_);
    auto used = (p > 1.0 / (10.0 * cfg.n_codes)).sum().item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the pass over the data
    auto code_ppl = torch::exp(-(p * p.clamp_min(1e-10).log()).sum()).item<double>();
    auto drift = (model->vq_->embed_ - codebook_start).norm(2, 1).mean().item<double>();
    std::cout << "epoch " << epoch << " recon " << epoch_recon / std::max<int64_t>(n_batches, 1) << " codes used "
              << used << "/" << cfg.n_codes << " usage perplexity " << code_ppl << " drift " << drift
              << " restarted " << model->vq_->restarted_ << "\n";
  }
}

// Reconstructions of a fixed batch, mapped back to [0, 1] for the image grid.
torch::Tensor reconstruction_grid(VQVAE &model, const torch::Tensor &images) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto out = model->forward(images.mul(2).sub(1));
  auto shown = out.recon.clone(); // EXPECT: tensor-unnecessary-clone -- rewritten in place at once: out.recon.add(1) makes it in one pass
  shown.add_(1).div_(2).clamp_(0, 1);
  return torch::cat({images, shown}, 0);
}

// Code maps of the whole dataset, for the PixelCNN prior.
torch::Tensor extract_codes(VQVAE &model, const torch::Tensor &images, int64_t batch_size) {
  model->eval();
  std::vector<torch::Tensor> maps;
  for (int64_t i = 0; i < images.size(0); i += batch_size) {
    auto chunk = images.narrow(0, i, std::min(batch_size, images.size(0) - i)).to(torch::kFloat).div(255);
    maps.push_back(model->encode_codes(chunk.mul(2).sub(1)).cpu()); // LOOKALIKE: tensor-sync-in-loop -- the host copy is the data kept, not a value summed or logged
  }
  return torch::cat(maps, 0);
}
