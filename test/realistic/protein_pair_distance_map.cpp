// Distogram prediction for single protein chains (a trRosetta-style pair network): residue
// embeddings from the amino-acid type, an outer product of two projections of them as the initial
// pair representation plus a clipped relative-position embedding, a dilated 2-D ResNet over the
// L x L map, and a head that classifies each residue pair's C-beta distance into bins. The loss
// is a cross-entropy over the valid pairs only (both residues resolved, at least min_separation
// apart in sequence), long-range pairs weighted up. Chains are cropped and padded into batches.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <random>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct DistogramConfig {
  int64_t n_aatype = 21, max_rel = 32, seq_dim = 64, outer_dim = 16, pair_dim = 64, n_blocks = 8;
  int64_t n_bins = 64, min_separation = 6, long_range = 24, crop_size = 256, batch_size = 4;
  int64_t epochs = 30, log_every = 50;
  double min_dist = 2.0, max_dist = 22.0, contact_cutoff = 8.0, long_range_weight = 2.0, lr = 1e-3, clip = 1.0;
};

struct ProteinExample {
  torch::Tensor aatype;        // [L] int64 residue types, 20 = unknown
  torch::Tensor residue_index; // [L] int64 PDB residue numbers (gaps where residues are missing)
  torch::Tensor coords;        // [L, 3] C-beta (C-alpha for glycine) in Angstrom
  torch::Tensor resolved;      // [L] 1 where the residue has coordinates
};

struct ProteinBatch {
  torch::Tensor aatype, relpos, coords, mask; // [B, L], [B, L, L] int8, [B, L, 3], [B, L]
  std::vector<int64_t> lengths;
};

// Sequence offsets j - i clipped to [-max_rel, max_rel]; int8 keeps the L x L feature small.
torch::Tensor relative_offsets(const torch::Tensor &residue_index, int64_t max_rel) {
  const auto L = residue_index.size(0);
  auto rel = torch::empty({L, L}, torch::kChar);
  // FACT: ri = torch.arange(300); rel = torch.empty(300, 300, dtype=torch.int8); rel.copy_(ri.unsqueeze(0) - ri.unsqueeze(1)); rel.clamp_(-32, 32); assert rel[200, 0].item() == 32 and rel[0, 200].item() == -32
  rel.copy_(residue_index.unsqueeze(0) - residue_index.unsqueeze(1)); // EXPECT: tensor-copy-narrowing -- int64 offsets wrap in int8 before the clamp: an offset of -200 becomes +56, then +32
  rel.clamp_(-max_rel, max_rel);
  return rel;
}

// C-beta distance map [B, L, L] from coordinates [B, L, 3].
torch::Tensor distance_map(const torch::Tensor &coords) {
  auto d = coords.unsqueeze(2) - coords.unsqueeze(1);
  return d.pow(2).sum(-1).add(1e-8).sqrt();
}

// Pairs that count: both residues resolved and at least min_sep apart in sequence.
torch::Tensor valid_pairs(const torch::Tensor &mask, const torch::Tensor &relpos, int64_t min_sep) {
  auto m = mask.unsqueeze(2) * mask.unsqueeze(1);
  return m * (relpos.abs() >= min_sep).to(m.scalar_type());
}

struct PairFeaturesImpl : nn::Module {
  explicit PairFeaturesImpl(const DistogramConfig &cfg) : max_rel_(cfg.max_rel) {
    aa_embed_ = register_module("aa_embed", nn::Embedding(cfg.n_aatype, cfg.seq_dim));
    norm_ = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({cfg.seq_dim})));
    left_ = register_module("left", nn::Linear(cfg.seq_dim, cfg.outer_dim));
    right_ = register_module("right", nn::Linear(cfg.seq_dim, cfg.outer_dim));
    outer_proj_ = register_module("outer_proj", nn::Linear(cfg.outer_dim * cfg.outer_dim, cfg.pair_dim));
    rel_embed_ = register_module("rel_embed", nn::Embedding(2 * cfg.max_rel + 1, cfg.pair_dim));
  }

  // aatype [B, L], relpos [B, L, L] -> pair [B, L, L, pair_dim]
  torch::Tensor forward(const torch::Tensor &aatype, const torch::Tensor &relpos) {
    auto s = norm_(aa_embed_(aatype));
    const auto B = s.size(0), L = s.size(1);
    auto a = left_(s), b = right_(s);
    auto outer = a.unsqueeze(2).unsqueeze(-1) * b.unsqueeze(1).unsqueeze(-2); // [B, L, L, c, c]
    // FACT: a = torch.randn(2, 5, 3); b = torch.randn(2, 5, 3); o = a.unsqueeze(2).unsqueeze(-1) * b.unsqueeze(1).unsqueeze(-2); assert is_view_of(o.reshape(2, 5, 5, -1), o)
    auto pair = outer_proj_(outer.reshape({B, L, L, -1})); // LOOKALIKE: tensor-reshape-non-contiguous -- the broadcast product is a fresh contiguous tensor: a view
    return pair + rel_embed_(relpos.to(torch::kLong) + max_rel_);
  }

  int64_t max_rel_;
  nn::Embedding aa_embed_{nullptr}, rel_embed_{nullptr};
  nn::LayerNorm norm_{nullptr};
  nn::Linear left_{nullptr}, right_{nullptr}, outer_proj_{nullptr};
};
TORCH_MODULE(PairFeatures);

struct DilatedBlockImpl : nn::Module {
  DilatedBlockImpl(int64_t ch, int64_t dilation) {
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(dilation).dilation(dilation)));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(dilation).dilation(dilation)));
    in1_ = register_module("in1", nn::InstanceNorm2d(nn::InstanceNorm2dOptions(ch).affine(true)));
    in2_ = register_module("in2", nn::InstanceNorm2d(nn::InstanceNorm2dOptions(ch).affine(true)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::elu(in1_(conv1_(x)));
    h = in2_(conv2_(h));
    // FACT: n = torch.nn.InstanceNorm2d(3, affine=True); x = torch.randn(2, 3, 4, 4, requires_grad=True); h = n(x); h += x; h.sum().backward(); assert x.grad is not None
    h += x; // LOOKALIKE: tensor-inplace-on-saved -- instance norm saves its input, not its output
    return torch::elu(h);
  }
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::InstanceNorm2d in1_{nullptr}, in2_{nullptr};
};
TORCH_MODULE(DilatedBlock);

struct DistogramNetImpl : nn::Module {
  explicit DistogramNetImpl(const DistogramConfig &cfg) {
    features_ = register_module("features", PairFeatures(cfg));
    trunk_ = register_module("trunk", nn::Sequential());
    const int64_t dilations[] = {1, 2, 4, 8};
    for (int64_t i = 0; i < cfg.n_blocks; ++i)
      trunk_->push_back(DilatedBlock(cfg.pair_dim, dilations[i % 4]));
    head_ = register_module("head", nn::Linear(cfg.pair_dim, cfg.n_bins));
  }

  // -> distogram logits [B, L, L, n_bins], symmetric in i and j
  torch::Tensor forward(const torch::Tensor &aatype, const torch::Tensor &relpos) {
    auto pair = features_(aatype, relpos);
    auto h = trunk_->forward(pair.permute({0, 3, 1, 2}).contiguous()); // [B, C, L, L]
    const auto B = h.size(0), C = h.size(1), L = h.size(2);
    // FACT: c = torch.nn.Conv2d(4, 4, 3, padding=1); h = c(torch.randn(2, 5, 5, 4).permute(0, 3, 1, 2).contiguous()); assert is_contiguous(h) and is_copy_of(h.permute(0, 2, 3, 1).reshape(-1, 4), h)
    auto flat = h.permute({0, 2, 3, 1}).reshape({-1, C}); // EXPECT: tensor-reshape-non-contiguous -- channels-last rows of a contiguous conv output: the whole pair map is copied
    // FACT: y = torch.nn.Linear(4, 7)(torch.randn(50, 4)); assert is_view_of(y.view(2, 5, 5, -1), y)
    auto logits = head_(flat).view({B, L, L, -1}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    // FACT: y = torch.nn.Linear(4, 7)(torch.randn(50, 4)).view(2, 5, 5, 7); assert raises(lambda: y.add_(y.transpose(1, 2)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    logits.add_(logits.transpose(1, 2)).mul_(0.5); // EXPECT: tensor-inplace-overlap -- the transpose reads the map being written: PyTorch refuses the partial overlap
    return logits;
  }

  PairFeatures features_{nullptr};
  nn::Sequential trunk_{nullptr};
  nn::Linear head_{nullptr};
};
TORCH_MODULE(DistogramNet);

// Weighted cross-entropy over valid pairs; long-range pairs count long_range_weight times.
torch::Tensor distogram_loss(const torch::Tensor &logits, const torch::Tensor &target_bins, const torch::Tensor &pair_mask,
                             const torch::Tensor &relpos, int64_t long_range, double long_range_weight) {
  const auto n_bins = logits.size(-1);
  auto w = pair_mask.to(torch::kFloat);
  // FACT: m = torch.ones(4, 4); w = m.to(torch.float32); w.mul_(torch.full((4, 4), 2.0)); assert shares_storage(w, m) and m.sum().item() == 32
  w.mul_((relpos.abs() >= long_range).to(w.scalar_type()) * (long_range_weight - 1.0) + 1.0); // EXPECT: tensor-alias-then-mutate -- the float mask comes back from to(kFloat) as itself: the caller's pair mask is reweighted
  // FACT: l = torch.randn(2, 5, 5, 7); assert is_view_of(l.reshape(-1, 7), l)
  auto ce = F::cross_entropy(logits.reshape({-1, n_bins}), target_bins.reshape({-1}), // LOOKALIKE: tensor-reshape-non-contiguous -- the symmetrised logits are contiguous: a view
                             F::CrossEntropyFuncOptions().reduction(torch::kNone));
  auto wf = w.reshape({-1});
  return (ce * wf).sum() / wf.sum().clamp_min(1.0);
}

ProteinBatch collate(const std::vector<ProteinExample> &chains, const DistogramConfig &cfg, std::mt19937 &rng) {
  int64_t L = 0;
  for (const auto &c : chains)
    L = std::max(L, std::min(c.aatype.size(0), cfg.crop_size));
  const auto B = static_cast<int64_t>(chains.size());
  ProteinBatch out;
  out.aatype = torch::full({B, L}, cfg.n_aatype - 1, torch::kLong);
  out.relpos = torch::zeros({B, L, L}, torch::kChar);
  out.coords = torch::zeros({B, L, 3});
  out.mask = torch::zeros({B, L});
  for (int64_t i = 0; i < B; ++i) {
    const auto &c = chains[i];
    const auto len = c.aatype.size(0), n = std::min(len, cfg.crop_size);
    const auto start = std::uniform_int_distribution<int64_t>(0, len - n)(rng);
    // FACT: e = torch.nn.Embedding(5, 3); assert raises(lambda: e(torch.tensor([1.0, 2.0])), "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int")
    out.aatype[i].narrow(0, 0, n).copy_(c.aatype.narrow(0, start, n)); // LOOKALIKE: tensor-copy-narrowing -- residue types are integer ids (the embedding rejects float indices): nothing is converted
    out.relpos[i].narrow(0, 0, n).narrow(1, 0, n).copy_(relative_offsets(c.residue_index.narrow(0, start, n), cfg.max_rel));
    out.coords[i].narrow(0, 0, n).copy_(c.coords.narrow(0, start, n));
    out.mask[i].narrow(0, 0, n).copy_(c.resolved.narrow(0, start, n));
    out.lengths.push_back(n);
  }
  return out;
}

// Precision of the top L/5 long-range contacts, scored with P(d <= contact_cutoff).
double contact_precision(DistogramNet &model, const std::vector<ProteinBatch> &val, const DistogramConfig &cfg,
                         torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto edges = torch::linspace(cfg.min_dist, cfg.max_dist, cfg.n_bins - 1).to(device);
  const auto n_close = (edges <= cfg.contact_cutoff).sum().item<int64_t>();
  auto hits = torch::zeros({}, edges.options());
  int64_t total = 0;
  for (const auto &b : val) {
    auto relpos = b.relpos.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
    auto logits = model->forward(b.aatype.to(device), relpos);
    auto p_close = torch::softmax(logits, -1).narrow(-1, 0, n_close).sum(-1);
    auto bins = (distance_map(b.coords.to(device)).unsqueeze(-1) > edges).sum(-1); // LOOKALIKE: tensor-device-mismatch -- the edges were moved to the device before the loop
    auto valid = valid_pairs(b.mask.to(device), relpos, cfg.long_range);
    for (int64_t i = 0; i < static_cast<int64_t>(b.lengths.size()); ++i) {
      const auto k = std::max<int64_t>(b.lengths[i] / 5, 1);
      // FACT: p = torch.softmax(torch.randn(2, 5, 5, 7), -1).narrow(-1, 0, 3).sum(-1); v = torch.rand(2, 5, 5); s = p[1] * v[1]; assert is_view_of(s.flatten(), s)
      auto scores = (p_close[i] * valid[i]).flatten(); // LOOKALIKE: tensor-reshape-non-contiguous -- a fresh product: flatten is a view
      auto top = std::get<1>(scores.topk(k));
      hits += (bins[i].flatten().index_select(0, top) < n_close).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, integer counts
      total += k;
    }
  }
  model->train();
  return hits.item<double>() / static_cast<double>(std::max<int64_t>(total, 1)); // LOOKALIKE: tensor-sync-in-loop -- once, after the loop
}

void train(DistogramNet &model, const std::vector<ProteinExample> &train_set, const std::vector<ProteinBatch> &val,
           const DistogramConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto edges = torch::linspace(cfg.min_dist, cfg.max_dist, cfg.n_bins - 1);
  std::mt19937 rng(17);
  std::vector<size_t> order(train_set.size());
  std::iota(order.begin(), order.end(), size_t{0});

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    model->train();
    double running = 0;
    int64_t steps = 0;
    for (size_t s = 0; s + cfg.batch_size <= order.size(); s += cfg.batch_size) {
      std::vector<ProteinExample> chains;
      for (int64_t k = 0; k < cfg.batch_size; ++k)
        chains.push_back(train_set[order[s + k]]);
      auto batch = collate(chains, cfg, rng);
      auto aatype = batch.aatype.to(device), relpos = batch.relpos.to(device), mask = batch.mask.to(device);
      auto dist = distance_map(batch.coords.to(device));
      auto target = (dist.unsqueeze(-1) > edges).sum(-1); // EXPECT: tensor-device-mismatch -- the bin edges are still on the host, the distances on the GPU
      auto pair_mask = valid_pairs(mask, relpos, cfg.min_separation);
      auto logits = model->forward(aatype, relpos);
      auto loss = distogram_loss(logits, target, pair_mask, relpos, cfg.long_range, cfg.long_range_weight);
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step only to sum the loss
      if (++steps % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << steps << " loss " << running / steps << " pairs " << pair_mask.sum().item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps
    }
    std::cout << "epoch " << epoch << " loss " << running / std::max<int64_t>(steps, 1) << " top-L/5 long-range precision "
              << contact_precision(model, val, cfg, device) << "\n";
  }
}
