// HuBERT-style masked prediction pretraining: frame features from a teacher
// conv encoder are clustered with k-means, and the student predicts the cluster
// of every masked frame through a transformer encoder.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct HubertConfig {
  int64_t conv_dim = 256;
  int64_t embed_dim = 384;
  int64_t ffn_dim = 1536;
  int64_t heads = 6;
  int64_t layers = 4;
  int64_t final_dim = 128;
  int64_t num_clusters = 100;
  double mask_prob = 0.08;
  int64_t mask_length = 10;
  double mask_channel_prob = 0.05;
  int64_t mask_channel_length = 16;
  double logit_temp = 0.1;
  int64_t kmeans_iters = 25;
  double kmeans_tol = 1e-4;
};

struct FeatureExtractorImpl : torch::nn::Module {
  explicit FeatureExtractorImpl(int64_t dim) : norm(torch::nn::GroupNormOptions(dim, dim)) {
    const std::vector<std::pair<int64_t, int64_t>> spec = {{10, 5}, {3, 2}, {3, 2}, {3, 2},
                                                           {3, 2},  {2, 2}, {2, 2}};
    int64_t in = 1;
    for (const auto& [k, s] : spec) {
      convs->push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(in, dim, k).stride(s).bias(false)));
      in = dim;
    }
    register_module("convs", convs);
    register_module("norm", norm);
  }

  torch::Tensor forward(torch::Tensor x) {
    bool first = true;
    for (const auto& m : *convs) {
      x = m->as<torch::nn::Conv1d>()->forward(x);
      if (first) x = norm(x);
      x = torch::gelu(x);
      first = false;
    }
    return x;
  }

  torch::nn::ModuleList convs;
  torch::nn::GroupNorm norm;
};
TORCH_MODULE(FeatureExtractor);

// Frame-level features of a batch of waveforms, one row per frame.
torch::Tensor frame_features(FeatureExtractor& fx, const torch::Tensor& wav) {
  torch::NoGradGuard no_grad;
  auto f = fx(wav.unsqueeze(1));
  // FACT: assert raises(lambda: torch.randn(2, 8, 5).transpose(1, 2).view(-1, 8), 'view size is not compatible')
  return f.transpose(1, 2).view({-1, f.size(1)});  // EXPECT: tensor-view-non-contiguous
}

struct KMeans {
  torch::Tensor centroids, mean, stddev;

  void fit(const torch::Tensor& bank, int64_t k, int64_t iters, double tol) {
    // FACT: b = torch.randn(6, 4); assert shares_storage(b.to(torch.float32), b)
    auto x = bank.to(torch::kFloat);
    mean = x.mean(0, true);
    stddev = x.std(0, /*unbiased=*/true, /*keepdim=*/true) + 1e-5;
    x.sub_(mean).div_(stddev);  // EXPECT: tensor-alias-then-mutate
    centroids = x.index_select(0, torch::randperm(x.size(0)).slice(0, 0, k));
    for (int64_t it = 0; it < iters; ++it) {
      auto prev = centroids.clone();  // LOOKALIKE: tensor-unnecessary-clone -- snapshot for the shift test; centroids are overwritten in place below
      auto assign = nearest_normalized(x);
      auto counts = torch::bincount(assign, {}, k);
      auto sums = torch::zeros_like(centroids).index_add_(0, assign, x);
      auto keep = counts > 0;
      centroids.index_put_({keep}, sums.index({keep}) / counts.index({keep}).unsqueeze(1).to(torch::kFloat));
      const double shift = (centroids - prev).norm().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- CPU tensors, and the value decides whether to stop
      if (shift < tol) break;
    }
  }

  torch::Tensor nearest_normalized(const torch::Tensor& z) const {
    auto z2 = z.pow(2).sum(1, /*keepdim=*/true);
    auto c2 = centroids.pow(2).sum(1).unsqueeze(0);
    // FACT: x2 = torch.randn(6, 1); assert raises(lambda: x2.expand(6, 4).add_(torch.randn(1, 4)), 'more than one element')
    auto d = z2.expand({z.size(0), centroids.size(0)});
    d.add_(c2).sub_(2.0 * torch::matmul(z, centroids.t()));  // EXPECT: tensor-inplace-on-expanded
    return d.argmin(1);
  }

  torch::Tensor nearest(const torch::Tensor& feats) const {
    // FACT: x = torch.randn(4, 3); z = x - x.mean(0); assert is_copy_of(z, x)
    auto z = feats - mean;
    z.div_(stddev);  // LOOKALIKE: tensor-alias-then-mutate -- feats - mean is a new tensor
    return nearest_normalized(z);
  }

  double inertia(const torch::Tensor& feats) const {
    auto z = (feats - mean) / stddev;
    return (z - centroids.index_select(0, nearest_normalized(z))).pow(2).sum(1).mean().item<double>();
  }
};

torch::Tensor compute_time_mask(int64_t batch, int64_t frames, const HubertConfig& cfg) {
  auto mask = torch::rand({batch, frames}) < cfg.mask_prob / cfg.mask_length;
  for (int64_t k = 1; k < cfg.mask_length; ++k) {
    // FACT: m = torch.zeros(2, 8, dtype=torch.bool); m[:, 2] = True; m[:, 1:].logical_or_(m[:, :-1]); assert m[0].sum() > 2
    mask.slice(1, 1).logical_or_(mask.slice(1, 0, frames - 1));  // EXPECT: tensor-inplace-overlap
  }
  return mask;
}

torch::Tensor compute_channel_mask(int64_t batch, int64_t channels, const HubertConfig& cfg) {
  auto starts = torch::rand({batch, channels}) < cfg.mask_channel_prob;
  auto mask = torch::zeros_like(starts);
  for (int64_t k = 0; k < cfg.mask_channel_length && k < channels; ++k) {
    // FACT: s = torch.rand(2, 16) < 0.3; m = torch.zeros_like(s); m[:, 2:].logical_or_(s[:, :14]); assert not shares_storage(m, s)
    mask.slice(1, k).logical_or_(starts.slice(1, 0, channels - k));  // LOOKALIKE: tensor-inplace-overlap -- source is the separate starts tensor
  }
  return mask;
}

struct HubertImpl : torch::nn::Module {
  explicit HubertImpl(const HubertConfig& cfg)
      : fx(cfg.conv_dim),
        layer_norm(torch::nn::LayerNormOptions({cfg.conv_dim})),
        post_proj(cfg.conv_dim, cfg.embed_dim),
        encoder(torch::nn::TransformerEncoderOptions(
            torch::nn::TransformerEncoderLayerOptions(cfg.embed_dim, cfg.heads)
                .dim_feedforward(cfg.ffn_dim)
                .dropout(0.1),
            cfg.layers)),
        final_proj(cfg.embed_dim, cfg.final_dim),
        cfg_(cfg) {
    register_module("fx", fx);
    register_module("layer_norm", layer_norm);
    register_module("post_proj", post_proj);
    register_module("encoder", encoder);
    register_module("final_proj", final_proj);
    mask_emb = register_parameter("mask_emb", torch::empty({cfg.embed_dim}));
    torch::nn::init::uniform_(mask_emb);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init fills under its own NoGradGuard
    label_embs = register_parameter("label_embs", torch::randn({cfg.num_clusters, cfg.final_dim}) * 0.02);
  }

  // Returns {logits over clusters per frame, time mask used}.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& wav) {
    auto f = fx(wav.unsqueeze(1));
    const int64_t b = f.size(0), t = f.size(2);
    if (is_training()) {
      auto cmask = compute_channel_mask(b, f.size(1), cfg_).to(f.device());
      f = f.masked_fill(cmask.unsqueeze(-1), 0.0);
    }
    auto x = post_proj(layer_norm(f.transpose(1, 2)));

    torch::Tensor tmask;
    if (is_training()) {
      tmask = compute_time_mask(b, t, cfg_);
      // FACT: x = torch.randn(2, 3, 4); e = torch.zeros(4); y = torch.where(torch.rand(2, 3, 1) < 0.5, e.expand_as(x), x); assert is_copy_of(y, e)
      x = torch::where(tmask.unsqueeze(-1), mask_emb.expand_as(x), x);  // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-inplace-on-expanded -- the expanded embedding is only read
    }
    auto h = encoder(x.transpose(0, 1)).transpose(0, 1);
    // FACT: h = torch.randn(5, 2, 8); assert is_copy_of(h.transpose(0, 1).reshape(-1, 8), h)
    auto proj = final_proj(h.reshape({-1, h.size(2)}));  // EXPECT: tensor-reshape-non-contiguous
    // FACT: lin = torch.nn.Linear(4, 3); p = lin(torch.randn(5, 4)); assert backward_fails(lambda: p.div_(p.norm(2, -1, True).clamp_min(1e-6)).sum().backward())
    proj.div_(proj.norm(2, -1, true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-saved
    auto logits = torch::matmul(proj, F::normalize(label_embs, F::NormalizeFuncOptions().dim(-1)).t());
    logits.div_(cfg_.logit_temp);  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
    return {logits.view({b, t, -1}), tmask};
  }

  FeatureExtractor fx;
  torch::nn::LayerNorm layer_norm;
  torch::nn::Linear post_proj;
  torch::nn::TransformerEncoder encoder;
  torch::nn::Linear final_proj;
  torch::Tensor mask_emb, label_embs;
  HubertConfig cfg_;
};
TORCH_MODULE(Hubert);

// Cluster ids of every frame of the corpus, kept compact between epochs.
torch::Tensor build_label_cache(FeatureExtractor& teacher, const KMeans& km,
                                const torch::Tensor& corpus, int64_t chunk) {
  torch::NoGradGuard no_grad;
  torch::Tensor cache;
  for (int64_t i = 0; i < corpus.size(0); i += chunk) {
    auto wav = corpus.slice(0, i, i + chunk);
    auto f = teacher(wav.unsqueeze(1)).transpose(1, 2).contiguous();
    if (!cache.defined()) cache = torch::empty({corpus.size(0), f.size(1)}, torch::kInt);
    // FACT: f = torch.randn(2, 8, 5).transpose(1, 2).contiguous(); assert is_view_of(f.view(-1, 8), f)
    auto ids = km.nearest(f.view({-1, f.size(2)}));  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() was taken first
    cache.slice(0, i, i + wav.size(0)).copy_(ids.view({wav.size(0), -1}));  // EXPECT: tensor-copy-narrowing
  }
  return cache;
}

void init_from_teacher(Hubert& student, FeatureExtractor& teacher) {
  auto dst = student->fx->parameters();
  auto src = teacher->parameters();
  for (size_t i = 0; i < dst.size(); ++i) {
    dst[i].copy_(src[i]);  // EXPECT: tensor-inplace-on-leaf
  }
}

void pretrain(Hubert& model, const torch::Tensor& corpus, const torch::Tensor& labels,
              torch::Device device, int64_t steps, int64_t batch) {
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(5e-4).weight_decay(0.01));
  int64_t correct = 0, masked = 0;
  torch::Tensor smoothed;
  for (int64_t step = 0; step < steps; ++step) {
    auto ids = torch::randint(0, corpus.size(0), {batch}, torch::kLong);
    auto wav = corpus.index_select(0, ids).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
    auto targets = labels.index_select(0, ids).to(device, torch::kLong);

    auto [logits, tmask] = model(wav);
    auto sel = tmask.to(device);
    auto masked_logits = logits.index({sel});
    auto masked_targets = targets.index({sel});
    auto loss = F::cross_entropy(masked_logits, masked_targets);

    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 10.0);
    opt.step();

    auto d = loss.detach();
    smoothed = smoothed.defined() ? smoothed * 0.98 + d * 0.02 : d;  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached first, no graph is carried
    correct += (masked_logits.argmax(-1) == masked_targets).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    masked += masked_targets.numel();
    if (step % 100 == 0) {
      std::cout << "step " << step << " loss " << smoothed.item<double>() << " acc "
                << static_cast<double>(correct) / std::max<int64_t>(masked, 1) << "\n";
    }
  }
}

int main() {
  torch::manual_seed(0);
  HubertConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto corpus = torch::randn({256, 16000});

  FeatureExtractor teacher(cfg.conv_dim);
  teacher->eval();
  std::vector<torch::Tensor> chunks;
  for (int64_t i = 0; i < corpus.size(0); i += 32) chunks.push_back(frame_features(teacher, corpus.slice(0, i, i + 32)));
  auto bank = torch::cat(chunks, 0);

  KMeans km;
  km.fit(bank, cfg.num_clusters, cfg.kmeans_iters, cfg.kmeans_tol);
  std::cout << "k-means inertia " << km.inertia(bank) << "\n";
  auto labels = build_label_cache(teacher, km, corpus, 32);

  Hubert model(cfg);
  init_from_teacher(model, teacher);
  model->to(device);
  pretrain(model, corpus, labels, device, 2000, 8);
  torch::save(model, "hubert_iter1.pt");
  return 0;
}
