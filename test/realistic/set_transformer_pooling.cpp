// Set Transformer (Lee et al. 2019) for point-set classification on ModelNet-style clouds of varying size.
// Sets are zero-padded to the largest in the batch and carry a validity mask built from their lengths.
// The encoder stacks induced set attention blocks (ISAB: m learned inducing points attend to the set,
// then the set attends to them), the decoder pools by multihead attention over learned seed vectors
// (PMA). A Deep Sets model with masked mean pooling is the baseline. Training uses AdamW with label
// smoothing and anisotropic scaling; evaluation adds test-time rotations about the up axis.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct SetConfig {
  int64_t in_dim = 3, dim = 128, heads = 4, inducing = 32, seeds = 1, blocks = 2, num_classes = 40;
  int64_t epochs = 200, log_every = 50, tta_rotations = 4;
  double lr = 1e-3, weight_decay = 1e-4, label_smoothing = 0.1, clip = 1.0;
  double scale_lo = 0.8, scale_hi = 1.25, jitter = 0.01;
};

struct SetBatch {
  torch::Tensor points;  // [B, N, 3], zero-padded after each set's last point
  torch::Tensor lengths; // [B] int64
  torch::Tensor labels;  // [B] int64
};

// [B, N] bool, true at real points.
torch::Tensor make_mask(const torch::Tensor &lengths, int64_t max_n) {
  return torch::arange(max_n, lengths.options()).unsqueeze(0) < lengths.unsqueeze(1); // LOOKALIKE: tensor-device-mismatch -- arange is made on the lengths' device
}

// Multihead attention block: MAB(X, Y) = LN(H + rFF(H)), H = LN(X + Multihead(X, Y, Y)).
struct MabImpl : nn::Module {
  MabImpl(int64_t dim, int64_t heads) : heads_(heads) {
    q = register_module("q", nn::Linear(dim, dim));
    k = register_module("k", nn::Linear(dim, dim));
    v = register_module("v", nn::Linear(dim, dim));
    o = register_module("o", nn::Linear(dim, dim));
    ln1 = register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({dim})));
    ln2 = register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({dim})));
    ff = register_module("ff", nn::Sequential(nn::Linear(dim, 4 * dim), nn::ReLU(), nn::Linear(4 * dim, dim)));
  }

  // [B, n, D] -> [B, H, n, D / H]
  torch::Tensor split_heads(const torch::Tensor &t) const {
    // FACT: t = torch.nn.Linear(8, 8)(torch.randn(2, 5, 8)); assert is_view_of(t.view(2, 5, 4, -1), t)
    return t.view({t.size(0), t.size(1), heads_, -1}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- the projection's output is contiguous
  }

  // Scaled dot-product attention of x over y; key_mask [B, m] is true at real elements of y.
  torch::Tensor attend(const torch::Tensor &x, const torch::Tensor &y, const torch::Tensor &key_mask) {
    auto qh = split_heads(q(x)), kh = split_heads(k(y)), vh = split_heads(v(y));
    auto scores = torch::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(qh.size(-1)));
    if (key_mask.defined()) {
      // FACT: n = (torch.rand(2, 6) > 0.3).logical_not(); assert is_contiguous(n) and is_view_of(n.view(2, 1, 1, -1), n)
      scores = scores.masked_fill(key_mask.logical_not().view({key_mask.size(0), 1, 1, -1}), -1e9); // LOOKALIKE: tensor-view-non-contiguous -- logical_not makes a contiguous tensor
    }
    return torch::matmul(torch::softmax(scores, -1), vh).transpose(1, 2); // [B, n, H, D / H]
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &y, const torch::Tensor &key_mask = {}) {
    auto ctx = attend(x, y, key_mask);
    // FACT: c = torch.matmul(torch.rand(2, 4, 5, 6).softmax(-1), torch.rand(2, 4, 6, 8)).transpose(1, 2); assert raises(lambda: c.view(2, 5, 32), "view size is not compatible")
    auto h = ln1(x + o(ctx.view({x.size(0), x.size(1), -1}))); // EXPECT: tensor-view-non-contiguous -- the heads were transposed back: merging them needs a copy, this view throws for every query count > 1
    return ln2(h + ff->forward(h));
  }

  int64_t heads_;
  nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  nn::Sequential ff{nullptr};
};
TORCH_MODULE(Mab);

// ISAB(X) = MAB(X, MAB(I, X)) with m learned inducing points I.
struct IsabImpl : nn::Module {
  IsabImpl(int64_t dim, int64_t heads, int64_t m) {
    inducing = register_parameter("inducing", torch::empty({1, m, dim}));
    nn::init::xavier_uniform_(inducing); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    mab0 = register_module("mab0", Mab(dim, heads));
    mab1 = register_module("mab1", Mab(dim, heads));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &mask) {
    auto I = inducing.expand({x.size(0), -1, -1});
    // FACT: i = torch.randn(1, 4, 8); e = i.expand(3, -1, -1); o = e + torch.randn(3, 4, 8); assert is_copy_of(o, i)
    auto h = mab0(I, x, mask); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded inducing points are only read (X + attention is out of place)
    return mab1(x, h);         // every element, padding included, attends to the m summaries
  }
  torch::Tensor inducing;
  Mab mab0{nullptr}, mab1{nullptr};
};
TORCH_MODULE(Isab);

// PMA_k(Z) = MAB(S, rFF(Z)) with k learned seeds S.
struct PmaImpl : nn::Module {
  PmaImpl(int64_t dim, int64_t heads, int64_t k) {
    seeds = register_parameter("seeds", torch::empty({1, k, dim}));
    // FACT: s = torch.nn.Parameter(torch.empty(1, 2, 8)); assert raises(lambda: s.normal_(0.0, 0.02), "a leaf Variable that requires grad")
    seeds.normal_(0.0, 0.02); // EXPECT: tensor-inplace-on-leaf -- seeds was just registered as a parameter: the init must run under no-grad, PyTorch refuses it
    mab = register_module("mab", Mab(dim, heads));
    ff = register_module("ff", nn::Linear(dim, dim));
  }
  torch::Tensor forward(const torch::Tensor &z, const torch::Tensor &mask) {
    return mab(seeds.expand({z.size(0), -1, -1}), torch::relu(ff(z)), mask); // [B, k, D]
  }
  torch::Tensor seeds;
  Mab mab{nullptr};
  nn::Linear ff{nullptr};
};
TORCH_MODULE(Pma);

struct SetTransformerImpl : nn::Module {
  explicit SetTransformerImpl(const SetConfig &cfg) {
    embed = register_module("embed", nn::Linear(cfg.in_dim, cfg.dim));
    encoder = register_module("encoder", nn::ModuleList());
    for (int64_t i = 0; i < cfg.blocks; ++i)
      encoder->push_back(Isab(cfg.dim, cfg.heads, cfg.inducing));
    pma = register_module("pma", Pma(cfg.dim, cfg.heads, cfg.seeds));
    head = register_module("head", nn::Linear(cfg.seeds * cfg.dim, cfg.num_classes));
  }
  torch::Tensor forward(const torch::Tensor &points, const torch::Tensor &mask) {
    auto h = embed(points);
    auto pad = mask.logical_not().unsqueeze(-1);
    for (const auto &blk : *encoder) {
      h = blk->as<IsabImpl>()->forward(h, mask);
      // FACT: ln = torch.nn.LayerNorm(8); x = torch.randn(2, 5, 8, requires_grad=True); h = ln(x * 2.0); h.masked_fill_(torch.rand(2, 5, 1) > 0.5, 0.0); h.sum().backward(); assert x.grad is not None
      h.masked_fill_(pad, 0.0); // LOOKALIKE: tensor-inplace-on-saved -- LayerNorm saves its input and statistics, not its output
    }
    auto pooled = pma(h, mask);
    // FACT: ln = torch.nn.LayerNorm(8); p = ln(torch.randn(3, 2, 8)); assert is_view_of(p.flatten(1), p)
    return head(pooled.flatten(1)); // LOOKALIKE: tensor-reshape-non-contiguous -- the block's LayerNorm output is contiguous: flatten is a view
  }
  nn::Linear embed{nullptr}, head{nullptr};
  nn::ModuleList encoder{nullptr};
  Pma pma{nullptr};
};
TORCH_MODULE(SetTransformer);

// Deep Sets (Zaheer et al. 2017): rho(mean over the real points of phi(x)).
struct DeepSetsImpl : nn::Module {
  explicit DeepSetsImpl(const SetConfig &cfg) {
    phi = register_module("phi", nn::Sequential(nn::Linear(cfg.in_dim, cfg.dim), nn::ReLU(), nn::Linear(cfg.dim, cfg.dim), nn::ReLU()));
    rho = register_module("rho", nn::Sequential(nn::Linear(cfg.dim, cfg.dim), nn::ReLU(), nn::Linear(cfg.dim, cfg.num_classes)));
  }
  torch::Tensor forward(const torch::Tensor &points, const torch::Tensor &mask) {
    auto h = phi->forward(points); // [B, N, D]
    auto w = mask.to(h.dtype()).unsqueeze(-1).expand_as(h);
    // FACT: m = (torch.rand(2, 5) > 0.3).float().unsqueeze(-1).expand(2, 5, 8); assert raises(lambda: m.div_(m.sum(1, keepdim=True).clamp_min(1.0)), "single memory location")
    w /= w.sum(1, /*keepdim=*/true).clamp_min(1.0); // EXPECT: tensor-inplace-on-expanded -- w repeats one mask value along D (stride 0): the in-place division throws
    return rho->forward((h * w).sum(1));
  }
  nn::Sequential phi{nullptr}, rho{nullptr};
};
TORCH_MODULE(DeepSets);

// Random anisotropic scaling and jitter, the usual ModelNet augmentation.
torch::Tensor augment(const torch::Tensor &points, const SetConfig &cfg) {
  auto scale = torch::empty({points.size(0), 1, points.size(2)});
  scale.uniform_(cfg.scale_lo, cfg.scale_hi); // LOOKALIKE: tensor-inplace-on-leaf -- a plain factory result: it does not require grad
  torch::Tensor out = points;
  // FACT: p = torch.rand(2, 5, 3); before = p.clone(); o = p; o *= torch.empty(2, 1, 3).uniform_(0.8, 1.25); assert shares_storage(o, p) and not torch.equal(p, before)
  out *= scale; // EXPECT: tensor-alias-then-mutate -- out is the caller's points: the stored batches are rescaled again every epoch and drift in size
  return out + cfg.jitter * torch::randn_like(out);
}

class SetTrainer {
public:
  SetTrainer(SetTransformer model, const SetConfig &cfg)
      : model_(std::move(model)), cfg_(cfg), device_(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU),
        opt_(model_->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay)) {
    model_->to(device_);
    loss_sum_ = torch::zeros({}, torch::TensorOptions().device(device_));
  }

  void train_epoch(const std::vector<SetBatch> &loader) {
    model_->train();
    for (const auto &batch : loader) {
      auto x = augment(batch.points, cfg_).to(device_); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto mask = make_mask(batch.lengths.to(device_), x.size(1));
      auto y = batch.labels.to(device_);
      auto loss = F::cross_entropy(model_->forward(x, mask), y, F::CrossEntropyFuncOptions().label_smoothing(cfg_.label_smoothing));
      opt_.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model_->parameters(), cfg_.clip);
      opt_.step();
      loss_sum_ += loss; // EXPECT: tensor-graph-kept-across-iterations -- the member sums the losses with their graphs until end_epoch resets it
      if (++steps_ % cfg_.log_every == 0)
        std::cout << "step " << steps_ << " loss " << loss.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
  }

  double end_epoch(int64_t batches) {
    const double mean = loss_sum_.item<double>() / static_cast<double>(batches);
    loss_sum_ = torch::zeros({}, torch::TensorOptions().device(device_));
    return mean;
  }

  SetTransformer &model() { return model_; }
  torch::Device device() const { return device_; }

private:
  SetTransformer model_;
  SetConfig cfg_;
  torch::Device device_;
  torch::optim::AdamW opt_;
  torch::Tensor loss_sum_;
  int64_t steps_ = 0;
};

// Test-time augmentation: class probabilities averaged over rotations about the up (y) axis.
torch::Tensor predict_tta(SetTransformer &model, const SetBatch &batch, const SetConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto x = batch.points.to(device);
  auto probs = torch::zeros({x.size(0), cfg.num_classes}, x.options());
  for (int64_t r = 0; r < cfg.tta_rotations; ++r) {
    const double a = 2.0 * M_PI * static_cast<double>(r) / static_cast<double>(cfg.tta_rotations);
    const double c = std::cos(a), s = std::sin(a);
    auto rot = torch::tensor({c, 0.0, -s, 0.0, 1.0, 0.0, s, 0.0, c}, x.options()).view({3, 3});
    auto lengths = batch.lengths.to(device); // EXPECT: tensor-clone-in-loop -- the set sizes do not change with the rotation: the same lengths are copied to the device every time
    probs += torch::softmax(model->forward(torch::matmul(x, rot), make_mask(lengths, x.size(1))), 1); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
  }
  return probs / static_cast<double>(cfg.tta_rotations);
}

void evaluate_checkpoint(const std::string &path, const std::vector<SetBatch> &test, const SetConfig &cfg) {
  torch::Device device(torch::kCUDA);
  SetTransformer model(cfg);
  torch::load(model, path);
  model->to(device);
  model->eval();
  torch::NoGradGuard no_grad;
  int64_t correct = 0, total = 0;
  auto tta_correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (const auto &batch : test) {
    auto x = batch.points.to(device); // LOOKALIKE: tensor-clone-in-loop -- each batch is moved once
    auto lengths = batch.lengths.to(device);
    auto y = batch.labels.to(device);
    auto mask = torch::arange(x.size(1)).unsqueeze(0) < lengths.unsqueeze(1); // EXPECT: tensor-device-mismatch -- arange was made on the host and is [1, N], not a CPU scalar: the comparison with the GPU lengths throws
    auto logits = model->forward(x, mask);
    correct += (logits.argmax(1) == y).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every batch only to add up the hits
    tta_correct += (predict_tta(model, batch, cfg, device).argmax(1) == y).sum(); // LOOKALIKE: tensor-sync-in-loop -- summed on the device, read once below
    total += x.size(0);
  }
  std::cout << "accuracy " << static_cast<double>(correct) / static_cast<double>(total) << ", with "
            << cfg.tta_rotations << " rotations " << tta_correct.item<double>() / static_cast<double>(total) << "\n";
}

void train_set_transformer(const std::vector<SetBatch> &train, const std::vector<SetBatch> &test, const SetConfig &cfg) {
  SetTrainer trainer(SetTransformer(cfg), cfg);
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    trainer.train_epoch(train);
    std::cout << "epoch " << epoch << " mean loss " << trainer.end_epoch(static_cast<int64_t>(train.size())) << "\n";
  }
  torch::save(trainer.model(), "set_transformer.pt");
  evaluate_checkpoint("set_transformer.pt", test, cfg);
}
