// TabNet (Arik & Pfister, 2021) for tabular classification (forest cover type). Every decision
// step has an attentive transformer that picks features with a sparsemax mask, scaled by a prior
// that shrinks for features already used (prior *= gamma - M), and a feature transformer of GLU
// blocks (shared across steps plus step-specific) whose first n_d outputs are summed into the
// decision. Batch norm runs on virtual ("ghost") batches. Training adds the mask entropy as a
// sparsity penalty; feature importances are the masks weighted by each step's contribution.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct TabNetConfig {
  int64_t n_features = 54, n_classes = 7, n_d = 16, n_a = 16, n_steps = 5;
  int64_t n_shared = 2, n_independent = 2, virtual_batch = 128, epochs = 100, log_every = 50, decay_every = 10;
  double gamma = 1.5, lambda_sparse = 1e-3, bn_momentum = 0.02, lr = 2e-2, lr_decay = 0.9, clip = 1.0, eps = 1e-15;
};

struct TabBatch {
  torch::Tensor x, y; // [B, n_features] float, NaN where a value is missing; [B] int64
};

// Batch norm over virtual batches of virtual_batch rows (statistics per chunk, as in the paper).
struct GhostBatchNormImpl : nn::Module {
  GhostBatchNormImpl(int64_t dim, int64_t virtual_batch, double momentum) : vbs(virtual_batch) {
    bn = register_module("bn", nn::BatchNorm1d(nn::BatchNorm1dOptions(dim).momentum(momentum)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    if (!is_training()) return bn(x);
    const int64_t chunks = (x.size(0) + vbs - 1) / vbs;
    std::vector<torch::Tensor> outs;
    for (const auto &c : x.chunk(chunks, 0))
      outs.push_back(bn(c)); // LOOKALIKE: tensor-graph-kept-across-iterations -- the chunks are concatenated into this forward's result
    return torch::cat(outs, 0);
  }
  nn::BatchNorm1d bn{nullptr};
  int64_t vbs;
};
TORCH_MODULE(GhostBatchNorm);

// The reference initialisation of GLU layers: xavier normal with gain sqrt((in + out) / sqrt(in)).
inline double glu_gain(int64_t in, int64_t out) { return std::sqrt(static_cast<double>(in + out) / std::sqrt(static_cast<double>(in))); }

// Linear -> ghost BN -> gated linear unit: the first half of the channels gated by the second.
struct GLULayerImpl : nn::Module {
  GLULayerImpl(int64_t in, int64_t out, const TabNetConfig &cfg) : out_dim(out) {
    fc = register_module("fc", nn::Linear(nn::LinearOptions(in, 2 * out).bias(false)));
    gbn = register_module("gbn", GhostBatchNorm(2 * out, cfg.virtual_batch, cfg.bn_momentum));
    nn::init::xavier_normal_(fc->weight); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    // FACT: fc = torch.nn.Linear(4, 6, bias=False); torch.nn.init.xavier_normal_(fc.weight); assert raises(lambda: fc.weight.mul_(1.3), "a leaf Variable that requires grad")
    fc->weight.mul_(glu_gain(in, 2 * out)); // EXPECT: tensor-inplace-on-leaf -- the weight requires grad and grad mode is on: PyTorch refuses the write
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = gbn(fc(x));
    return h.narrow(1, 0, out_dim) * torch::sigmoid(h.narrow(1, out_dim, out_dim));
  }
  nn::Linear fc{nullptr};
  GhostBatchNorm gbn{nullptr};
  int64_t out_dim;
};
TORCH_MODULE(GLULayer);

// Shared GLU layers (owned and registered by the encoder) followed by this step's own layers;
// every layer after the first is residual, scaled by sqrt(0.5) to keep the variance.
struct FeatTransformerImpl : nn::Module {
  FeatTransformerImpl(const std::vector<GLULayer> &shared, const TabNetConfig &cfg) : layers(shared) {
    const int64_t width = cfg.n_d + cfg.n_a;
    for (int64_t i = 0; i < cfg.n_independent; ++i)
      layers.push_back(register_module("glu" + std::to_string(i), GLULayer(width, width, cfg)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = layers.front()->forward(x);
    for (size_t i = 1; i < layers.size(); ++i) {
      auto s = h + layers[i]->forward(h);
      // FACT: l = torch.nn.Linear(4, 4); h = torch.randn(3, 4); s = h + torch.sigmoid(l(h)); s.mul_(0.7071); s.sum().backward(); assert l.weight.grad is not None
      s.mul_(scale); // LOOKALIKE: tensor-inplace-on-saved -- add saves neither operand: the fresh sum may be scaled in place
      h = s;
    }
    return h;
  }
  std::vector<GLULayer> layers;
  double scale = std::sqrt(0.5);
};
TORCH_MODULE(FeatTransformer);

// Sparsemax (Martins & Astudillo, 2016) over the last dimension: the Euclidean projection onto
// the simplex, so most features get exactly zero weight.
torch::Tensor sparsemax(const torch::Tensor &logits) {
  auto z = logits - std::get<0>(logits.max(-1, /*keepdim=*/true));
  auto z_sorted = std::get<0>(z.sort(-1, /*descending=*/true));
  // FACT: k = torch.arange(1, 7, dtype=torch.float32); assert is_view_of(k.view(1, -1), k)
  auto ks = torch::arange(1, z.size(-1) + 1, z.options()).view({1, -1}); // LOOKALIKE: tensor-view-non-contiguous -- arange is contiguous
  auto cum = z_sorted.cumsum(-1) - 1.0;
  auto k = (ks * z_sorted > cum).to(z.scalar_type()).sum(-1, /*keepdim=*/true);
  auto tau = cum.gather(-1, k.to(torch::kLong) - 1) / k;
  return torch::clamp_min(z - tau, 0.0);
}

struct AttentiveTransformerImpl : nn::Module {
  explicit AttentiveTransformerImpl(const TabNetConfig &cfg) {
    fc = register_module("fc", nn::Linear(nn::LinearOptions(cfg.n_a, cfg.n_features).bias(false)));
    gbn = register_module("gbn", GhostBatchNorm(cfg.n_features, cfg.virtual_batch, cfg.bn_momentum));
    torch::NoGradGuard no_grad;
    nn::init::xavier_normal_(fc->weight);
    fc->weight.mul_(glu_gain(cfg.n_a, cfg.n_features)); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  torch::Tensor forward(const torch::Tensor &prior, const torch::Tensor &processed) {
    return sparsemax(gbn(fc(processed)) * prior);
  }
  nn::Linear fc{nullptr};
  GhostBatchNorm gbn{nullptr};
};
TORCH_MODULE(AttentiveTransformer);

struct EncoderOutput {
  torch::Tensor decision;            // [B, n_d]
  torch::Tensor m_loss;              // mean mask entropy per step
  std::vector<torch::Tensor> masks;  // per step [B, n_features], weighted by the step's contribution
};

struct TabNetEncoderImpl : nn::Module {
  explicit TabNetEncoderImpl(const TabNetConfig &cfg) : cfg_(cfg) {
    initial_bn = register_module("initial_bn", nn::BatchNorm1d(nn::BatchNorm1dOptions(cfg.n_features).momentum(0.01)));
    const int64_t width = cfg.n_d + cfg.n_a;
    std::vector<GLULayer> shared;
    for (int64_t i = 0; i < cfg.n_shared; ++i)
      shared.push_back(register_module("shared" + std::to_string(i), GLULayer(i == 0 ? cfg.n_features : width, width, cfg)));
    initial_split = register_module("initial_split", FeatTransformer(shared, cfg));
    for (int64_t s = 0; s < cfg.n_steps; ++s) {
      steps.push_back(register_module("step" + std::to_string(s), FeatTransformer(shared, cfg)));
      attention.push_back(register_module("att" + std::to_string(s), AttentiveTransformer(cfg)));
    }
    prior_init_ = register_buffer("prior_init", torch::ones({1, cfg.n_features}));
  }

  EncoderOutput forward(const torch::Tensor &x_raw) {
    const auto B = x_raw.size(0);
    auto missing = torch::isnan(x_raw);
    auto x = initial_bn(torch::nan_to_num(x_raw));
    auto prior = prior_init_.expand({B, -1});
    if (missing.any().item<bool>()) { // a missing value must not be selected: its prior starts at zero
      // FACT: p = torch.ones(1, 4).expand(3, -1); m = torch.rand(3, 4) > 0.5; assert raises(lambda: p.mul_(1.0 - m.float()), "single memory location")
      prior.mul_(1.0 - missing.to(torch::kFloat)); // EXPECT: tensor-inplace-on-expanded -- every row of the prior is the one buffer row: the write raises
    }
    auto att = initial_split->forward(x).narrow(1, cfg_.n_d, cfg_.n_a);
    auto decision = torch::zeros({B, cfg_.n_d}, x.options());
    auto m_loss = torch::zeros({}, x.options());
    std::vector<torch::Tensor> masks;
    for (int64_t s = 0; s < cfg_.n_steps; ++s) {
      auto M = attention[s]->forward(prior, att);
      m_loss = m_loss + (-M * torch::log(M + cfg_.eps)).sum(1).mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- the penalty is part of the loss the caller differentiates
      // FACT: p = torch.ones(1, 4).expand(3, -1); m = torch.rand(3, 4); q = p * (1.5 - m); assert is_contiguous(q) and is_copy_of(q, p)
      prior = prior * (cfg_.gamma - M); // LOOKALIKE: tensor-inplace-on-expanded, tensor-device-mismatch -- out of place; the buffer moved with the module
      auto out = steps[s]->forward(M * x);
      auto d = torch::relu(out.narrow(1, 0, cfg_.n_d));
      decision += d; // LOOKALIKE: tensor-graph-kept-across-iterations -- the decision sum is this forward's result, differentiated by the caller
      att = out.narrow(1, cfg_.n_d, cfg_.n_a);
      // FACT: x = torch.nn.BatchNorm1d(4)(torch.randn(3, 4)); M = torch.clamp_min(torch.randn(3, 4, requires_grad=True) - 0.3, 0); y = M * x; d = torch.relu(torch.randn(3, 2, requires_grad=True)); M.mul_(d.sum(1, keepdim=True)); assert backward_fails(lambda: y.sum().backward())
      M.mul_(d.sum(1, /*keepdim=*/true)); // EXPECT: tensor-inplace-on-saved -- M * x saved M for the gradient of x: backward raises
      masks.push_back(M);
    }
    return {decision, m_loss / static_cast<double>(cfg_.n_steps), masks};
  }

  TabNetConfig cfg_;
  nn::BatchNorm1d initial_bn{nullptr};
  FeatTransformer initial_split{nullptr};
  std::vector<FeatTransformer> steps;
  std::vector<AttentiveTransformer> attention;
  torch::Tensor prior_init_;
};
TORCH_MODULE(TabNetEncoder);

struct TabNetOutput {
  torch::Tensor logits, m_loss;
  std::vector<torch::Tensor> masks;
};

struct TabNetImpl : nn::Module {
  explicit TabNetImpl(const TabNetConfig &cfg) : n_features(cfg.n_features) {
    encoder = register_module("encoder", TabNetEncoder(cfg));
    head = register_module("head", nn::Linear(cfg.n_d, cfg.n_classes));
  }
  TabNetOutput forward(const torch::Tensor &x) {
    auto enc = encoder->forward(x);
    return {head(enc.decision), enc.m_loss, enc.masks};
  }
  // Per-sample, per-step masks [B, n_steps, n_features] for the local explanations.
  torch::Tensor explain(const torch::Tensor &x) {
    torch::NoGradGuard no_grad;
    return torch::stack(encoder->forward(x).masks, 0).transpose(0, 1);
  }
  int64_t n_features;
  TabNetEncoder encoder{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(TabNet);

double evaluate(TabNet &model, const std::vector<TabBatch> &data, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t n = 0;
  for (const auto &batch : data) {
    auto logits = model->forward(batch.x.to(device)).logits;
    correct += (logits.argmax(1) == batch.y.to(device)).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- a count under NoGradGuard
    n += batch.y.size(0);
  }
  model->train();
  return correct.item<double>() / static_cast<double>(n);
}

void train_tabnet(TabNet &model, const std::vector<TabBatch> &train, const std::vector<TabBatch> &valid, const TabNetConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    for (auto &group : opt.param_groups()) // step decay of the learning rate
      static_cast<torch::optim::AdamOptions &>(group.options()).lr(cfg.lr * std::pow(cfg.lr_decay, epoch / cfg.decay_every));
    model->train();
    double running = 0;
    auto epoch_entropy = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto &batch : train) {
      auto x = batch.x.to(device), y = batch.y.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto out = model->forward(x);
      auto loss = F::cross_entropy(out.logits, y) + cfg.lambda_sparse * out.m_loss;
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- on a GPU every step waits only to sum the loss
      epoch_entropy += out.m_loss; // EXPECT: tensor-graph-kept-across-iterations -- the penalty carries its graph: the epoch total keeps every step's graph
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    const auto nb = static_cast<double>(train.size());
    std::cout << "epoch " << epoch << " loss " << running / nb << " mask entropy " << epoch_entropy.item<double>() / nb
              << " valid acc " << evaluate(model, valid, device) << "\n";
  }
}

// Global importance: step-weighted masks summed over the data and mapped back from model columns
// to the original features by reducing_matrix [n_features, n_original] (one-hot groups sum up).
struct Importance { torch::Tensor raw, normalized; }; // [n_original]
Importance feature_importance(TabNet &model, const std::vector<TabBatch> &data, const torch::Tensor &reducing_matrix,
                              torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto total = torch::zeros({reducing_matrix.size(1)}, torch::TensorOptions().device(device));
  for (const auto &batch : data) {
    auto out = model->forward(batch.x.to(device));
    auto explain = torch::stack(out.masks, 0).sum(0); // [B, n_features]
    auto per_feature = explain.matmul(reducing_matrix.to(device)); // EXPECT: tensor-clone-in-loop -- the same matrix is copied to the device for every batch
    total.add_(per_feature.sum(0)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph
  }
  auto raw = total.cpu();
  auto normalized = raw;
  // FACT: r = torch.rand(5); n = r; n /= n.sum(); assert shares_storage(n, r) and abs(r.sum().item() - 1) < 1e-5
  normalized /= normalized.sum(); // EXPECT: tensor-alias-then-mutate -- normalized is raw: the "raw" importances come back normalised too
  return {raw, normalized};
}

// How often each feature carries the largest weight of a step, over the data set.
torch::Tensor dominant_feature_counts(TabNet &model, const std::vector<TabBatch> &data, torch::Device device) {
  model->eval();
  auto counts = torch::zeros({model->n_features}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (const auto &batch : data) {
    auto m = model->explain(batch.x.to(device)); // LOOKALIKE: tensor-clone-in-loop -- each batch is moved once
    // FACT: m = torch.stack([torch.rand(4, 6) for _ in range(3)], 0).transpose(0, 1); f = m.reshape(-1, 6); assert is_copy_of(f, m)
    auto per_step = m.reshape({-1, m.size(2)}); // EXPECT: tensor-reshape-non-contiguous -- explain() swapped steps and samples: a copy of all masks per batch
    counts += torch::bincount(per_step.argmax(1), {}, model->n_features);
  }
  return counts.cpu();
}

// Local explanations as CSV: one row per sample, every step's mask side by side.
void write_step_masks(TabNet &model, const TabBatch &batch, const std::vector<std::string> &names, std::ostream &os,
                      torch::Device device) {
  model->eval();
  auto m = model->explain(batch.x.to(device)).cpu(); // [B, n_steps, n_features]
  const auto B = m.size(0), S = m.size(1), Fn = m.size(2);
  os << "sample";
  for (int64_t s = 0; s < S * Fn; ++s)
    os << ",step" << s / Fn << "_" << names[s % Fn];
  os << "\n";
  // FACT: m = torch.stack([torch.rand(4, 6) for _ in range(3)], 0).transpose(0, 1).cpu(); assert raises(lambda: m.view(4, -1), "view size is not compatible")
  auto rows = m.view({B, S * Fn}); // EXPECT: tensor-view-non-contiguous -- explain() returns a transpose: the view throws
  auto acc = rows.accessor<float, 2>();
  for (int64_t b = 0; b < B; ++b) {
    os << b;
    for (int64_t j = 0; j < S * Fn; ++j)
      os << "," << acc[b][j];
    os << "\n";
  }
}
