// Graph transformer for molecular property classification on dense, padded batches. Nodes get
// Laplacian eigenvector positional encodings (Dwivedi & Bresson 2020: the k smallest non-trivial
// eigenvectors of the normalised Laplacian, with a random sign flip per graph and eigenvector in
// training) and every head gets an attention bias learned per shortest-path distance
// (Graphormer, Ying et al. 2021). eigh and Floyd-Warshall are too slow per step, so both
// encodings are computed once per molecule, in chunks, and cached.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct GtConfig {
  int64_t n_atom_types = 119, d_model = 128, heads = 8, layers = 6, ffn = 256;
  int64_t pe_dim = 8, max_dist = 6, n_classes = 2, epochs = 60, batch_size = 64, chunk = 256;
  double lr = 2e-4, weight_decay = 0.01, dropout = 0.1, clip = 1.0;
  std::string ckpt = "graph_transformer.pt";
};

struct Molecule {
  torch::Tensor atoms; // [n] atomic numbers
  torch::Tensor bonds; // [E, 2] atom pairs, each bond once with i < j
  int64_t label = 0;
  torch::Tensor pe;    // [n, k] cached eigenvector encodings
  torch::Tensor spd;   // [n, n] cached hop counts
};

// Dense [B, N, N] adjacency and [B, N] node mask, N = the largest molecule (at least min_nodes).
std::pair<torch::Tensor, torch::Tensor> dense_adjacency(const std::vector<Molecule> &mols, int64_t min_nodes) {
  const int64_t B = static_cast<int64_t>(mols.size());
  int64_t N = min_nodes;
  for (const auto &m : mols)
    N = std::max(N, m.atoms.size(0));
  auto adj = torch::zeros({B, N, N});
  auto mask = torch::zeros({B, N}, torch::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const auto &m = mols[b];
    mask[b].narrow(0, 0, m.atoms.size(0)).fill_(true);
    if (m.bonds.size(0) > 0)
      adj[b].index_put_({m.bonds.select(1, 0), m.bonds.select(1, 1)}, 1.0);
  }
  // FACT: a = torch.rand(3, 5, 5).triu(1); assert raises(lambda: a.add_(a.transpose(1, 2)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
  adj.add_(adj.transpose(1, 2)); // EXPECT: tensor-inplace-overlap -- the transpose reads the buffer being written: mirror the bonds out of place
  return {adj, mask};
}

// k smallest non-trivial eigenvectors of I - D^-1/2 A D^-1/2 per graph. Padding nodes get 2 on
// the diagonal: isolated, their eigenvalue 2 stays at the top of the spectrum.
torch::Tensor laplacian_pe(const torch::Tensor &adj, const torch::Tensor &node_mask, int64_t k) {
  auto dinv = adj.sum(-1).clamp_min(1.0).rsqrt(); // [B, N]
  auto diag = torch::diag_embed(torch::where(node_mask, 1.0, 2.0));
  auto lap = adj.contiguous(); // eigh wants a contiguous batch
  // FACT: a = torch.rand(2, 5, 5); a0 = a.clone(); l = a.contiguous(); d = torch.rand(2, 5); l.mul_(d.unsqueeze(-1)).mul_(d.unsqueeze(-2)).neg_().add_(torch.eye(5)); assert shares_storage(l, a) and not torch.equal(a, a0)
  lap.mul_(dinv.unsqueeze(-1)).mul_(dinv.unsqueeze(-2)).neg_().add_(diag); // EXPECT: tensor-alias-then-mutate -- the adjacency is contiguous: contiguous() returned it, and the caller's adjacency becomes the Laplacian
  auto evecs = std::get<1>(torch::linalg::eigh(lap, "L")); // columns, ascending eigenvalues
  return evecs.narrow(2, 1, k);                             // the first one is trivial
}

// Hop counts by Floyd-Warshall on the dense batch; unreachable pairs and padding get max_dist.
torch::Tensor shortest_paths(const torch::Tensor &adj, int64_t max_dist) {
  const int64_t N = adj.size(1);
  auto dist = torch::full_like(adj, std::numeric_limits<float>::infinity());
  dist.masked_fill_(adj > 0, 1.0);
  dist.diagonal(0, 1, 2).fill_(0.0);
  for (int64_t k = 0; k < N; ++k)
    dist = torch::minimum(dist, dist.narrow(2, k, 1) + dist.narrow(1, k, 1));
  auto hops = torch::empty(adj.sizes(), torch::kLong);
  // FACT: d = torch.tensor([0., 1., 3., float('inf')]).clamp_max(6); t = torch.empty(4, dtype=torch.long); t.copy_(d); assert torch.equal(t.double(), d.double())
  hops.copy_(dist.clamp_max(static_cast<double>(max_dist))); // LOOKALIKE: tensor-copy-narrowing -- hop counts are whole numbers: the conversion is exact
  return hops;
}

void precompute_encodings(std::vector<Molecule> &mols, const GtConfig &cfg) {
  for (size_t start = 0; start < mols.size(); start += static_cast<size_t>(cfg.chunk)) {
    const size_t end = std::min(mols.size(), start + static_cast<size_t>(cfg.chunk));
    std::vector<Molecule> part(mols.begin() + start, mols.begin() + end);
    auto [adj, mask] = dense_adjacency(part, cfg.pe_dim + 1);
    auto pe = laplacian_pe(adj, mask, cfg.pe_dim); // [B, N, k]
    auto spd = shortest_paths(adj, cfg.max_dist);  // [B, N, N]
    // FACT: m = torch.rand(3, 5) > 0.5; assert is_view_of(m.view(-1), m)
    auto real = mask.view(-1).nonzero().squeeze(1); // LOOKALIKE: tensor-view-non-contiguous -- the mask is a fresh contiguous tensor
    // FACT: L = torch.randn(2, 5, 5); L = L + L.transpose(1, 2); v = torch.linalg.eigh(L)[1]; assert not is_contiguous(v) and raises(lambda: v.narrow(2, 1, 3).view(-1, 3), "view size is not compatible")
    auto flat = pe.view({-1, cfg.pe_dim}).index_select(0, real); // EXPECT: tensor-view-non-contiguous -- eigh returns column-major eigenvector matrices: graphs and nodes cannot be merged
    std::vector<int64_t> counts;
    for (const auto &m : part)
      counts.push_back(m.atoms.size(0));
    auto per_mol = flat.split_with_sizes(counts);
    for (size_t i = 0; i < part.size(); ++i) {
      const int64_t n = counts[i];
      mols[start + i].pe = per_mol[i];
      mols[start + i].spd = spd[i].narrow(0, 0, n).narrow(1, 0, n).clone(); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- each molecule's own block, kept compact instead of pinning the chunk
    }
  }
}

struct GraphBatch {
  torch::Tensor atoms, pe, spd, node_mask, labels;
};

GraphBatch collate(const std::vector<Molecule> &mols, size_t begin, size_t end, const GtConfig &cfg) {
  const int64_t B = static_cast<int64_t>(end - begin);
  int64_t N = 1;
  for (size_t i = begin; i < end; ++i)
    N = std::max(N, mols[i].atoms.size(0));
  GraphBatch g;
  g.atoms = torch::zeros({B, N}, torch::kLong); // 0 = padding
  g.pe = torch::zeros({B, N, cfg.pe_dim});
  g.spd = torch::full({B, N, N}, cfg.max_dist, torch::kLong);
  g.node_mask = torch::zeros({B, N}, torch::kBool);
  g.labels = torch::empty({B}, torch::kLong);
  for (int64_t i = 0; i < B; ++i) {
    const auto &m = mols[begin + i];
    const int64_t n = m.atoms.size(0);
    g.atoms[i].narrow(0, 0, n).copy_(m.atoms); // LOOKALIKE: tensor-copy-narrowing -- atomic numbers are int64 already
    g.pe[i].narrow(0, 0, n).copy_(m.pe);
    g.spd[i].narrow(0, 0, n).narrow(1, 0, n).copy_(m.spd);
    g.node_mask[i].narrow(0, 0, n).fill_(true);
    g.labels[i] = m.label;
  }
  return g;
}

struct BiasedAttentionImpl : torch::nn::Module {
  BiasedAttentionImpl(int64_t d_model, int64_t heads, double dropout) : heads_(heads), dh_(d_model / heads) {
    qkv_ = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    proj_ = register_module("proj", torch::nn::Linear(d_model, d_model));
    drop_ = register_module("drop", torch::nn::Dropout(dropout));
  }

  // h: [B, N, d]; bias: [B, H, N, N], added to the scores (-inf on padding keys).
  torch::Tensor forward(const torch::Tensor &h, const torch::Tensor &bias) {
    const int64_t B = h.size(0), N = h.size(1);
    // FACT: y = torch.randn(2, 7, 48); assert is_view_of(y.view(2, 7, 3, 4, 4), y)
    auto qkv = qkv_(h).view({B, N, 3, heads_, dh_}).permute({2, 0, 3, 1, 4}); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous; the permute comes after
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(dh_)) + bias;
    auto ctx = torch::matmul(drop_(torch::softmax(scores, -1)), v); // [B, H, N, dh]
    // FACT: c = torch.randn(2, 4, 7, 8); assert is_copy_of(c.transpose(1, 2).reshape(2, 7, -1), c)
    return proj_(ctx.transpose(1, 2).reshape({B, N, -1})); // EXPECT: tensor-reshape-non-contiguous -- merging the heads back copies the context every layer
  }

  int64_t heads_, dh_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(BiasedAttention);

struct GtLayerImpl : torch::nn::Module {
  explicit GtLayerImpl(const GtConfig &cfg) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    attn_ = register_module("attn", BiasedAttention(cfg.d_model, cfg.heads, cfg.dropout));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    ffn_ = register_module("ffn", torch::nn::Sequential(torch::nn::Linear(cfg.d_model, cfg.ffn), torch::nn::GELU(),
                                                        torch::nn::Dropout(cfg.dropout), torch::nn::Linear(cfg.ffn, cfg.d_model)));
    drop_ = register_module("drop", torch::nn::Dropout(cfg.dropout));
  }
  torch::Tensor forward(torch::Tensor h, const torch::Tensor &bias) {
    h = h + drop_(attn_(ln1_(h), bias));
    return h + drop_(ffn_->forward(ln2_(h)));
  }
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  BiasedAttention attn_{nullptr};
  torch::nn::Sequential ffn_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(GtLayer);

struct GraphTransformerImpl : torch::nn::Module {
  explicit GraphTransformerImpl(const GtConfig &cfg) : heads_(cfg.heads) {
    atom_embed_ = register_module(
        "atom_embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(cfg.n_atom_types + 1, cfg.d_model).padding_idx(0)));
    pe_lin_ = register_module("pe_lin", torch::nn::Linear(cfg.pe_dim, cfg.d_model));
    spd_embed_ = register_module("spd_embed", torch::nn::Embedding(cfg.max_dist + 1, cfg.heads));
    layers_ = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.layers; ++i)
      layers_->push_back(GtLayer(cfg));
    ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    head_ = register_module("head", torch::nn::Linear(cfg.d_model, cfg.n_classes));
  }

  torch::Tensor forward(const torch::Tensor &atoms, const torch::Tensor &pe, const torch::Tensor &spd,
                        const torch::Tensor &node_mask) {
    const int64_t B = atoms.size(0), N = atoms.size(1);
    auto h = atom_embed_(atoms);
    // FACT: e = torch.nn.Embedding(5, 3); l = torch.nn.Linear(2, 3); h = e(torch.tensor([[1, 2]])); h.add_(l(torch.randn(1, 2, 2))); h.sum().backward(); assert e.weight.grad is not None
    h.add_(pe_lin_(pe)); // LOOKALIKE: tensor-inplace-on-saved -- an embedding saves its indices, not its output
    // Padding keys are masked for every head and query; each head adds its distance bias.
    auto pad = torch::zeros({B, 1, 1, N}, h.options()) // LOOKALIKE: tensor-device-mismatch -- made with h's options
                   .masked_fill_(node_mask.logical_not().view({B, 1, 1, N}), -std::numeric_limits<float>::infinity());
    auto bias = pad.expand({B, heads_, N, N});
    // FACT: p = torch.zeros(2, 1, 1, 5); e = torch.randn(2, 5, 5, 4); assert raises(lambda: p.expand(2, 4, 5, 5).add_(e.permute(0, 3, 1, 2)), "more than one element of the written-to tensor refers to a single memory location")
    bias.add_(spd_embed_(spd).permute({0, 3, 1, 2})); // EXPECT: tensor-inplace-on-expanded -- the padding bias is broadcast over heads and queries: one memory location per key
    for (const auto &layer : *layers_)
      h = layer->as<GtLayer>()->forward(h, bias);
    auto m = node_mask.unsqueeze(-1).to(h.dtype());
    auto pooled = (ln_(h) * m).sum(1) / m.sum(1).clamp_min(1.0);
    return head_(pooled);
  }

  int64_t heads_;
  torch::nn::Embedding atom_embed_{nullptr}, spd_embed_{nullptr};
  torch::nn::Linear pe_lin_{nullptr}, head_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  torch::nn::LayerNorm ln_{nullptr};
};
TORCH_MODULE(GraphTransformer);

double evaluate(GraphTransformer &model, const std::vector<GraphBatch> &batches, torch::Device device,
                const torch::Tensor &class_w) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto w = class_w.to(device);
  std::vector<torch::Tensor> losses;
  int64_t graphs = 0;
  for (const auto &b : batches) {
    auto logits = model->forward(b.atoms.to(device), b.pe.to(device), b.spd.to(device), b.node_mask.to(device));
    losses.push_back(F::cross_entropy(logits, b.labels.to(device), F::CrossEntropyFuncOptions().weight(w).reduction(torch::kSum))); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    graphs += b.labels.size(0);
  }
  return torch::stack(losses).sum().item<double>() / static_cast<double>(std::max<int64_t>(graphs, 1));
}

void train(GraphTransformer &model, const std::vector<GraphBatch> &train_batches, const std::vector<GraphBatch> &val_batches,
           const GtConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  // Inverse-frequency class weights: actives are rare.
  auto counts = torch::zeros({cfg.n_classes});
  for (const auto &b : train_batches)
    counts += torch::bincount(b.labels, {}, cfg.n_classes);
  auto class_w = counts.sum() / (counts.clamp_min(1.0) * static_cast<double>(cfg.n_classes));

  double best = std::numeric_limits<double>::infinity();
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto epoch_loss = torch::zeros({}, device);
    for (const auto &b : train_batches) {
      auto atoms = b.atoms.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto spd = b.spd.to(device), mask = b.node_mask.to(device), y = b.labels.to(device);
      // Eigenvectors are only defined up to sign: flip each one at random, per graph.
      auto pe = b.pe.clone(); // EXPECT: tensor-unnecessary-clone -- the cached encodings are only read: the flip below is out of place
      auto sign = torch::randint(0, 2, {pe.size(0), 1, pe.size(2)}, pe.options()) * 2 - 1; // LOOKALIKE: tensor-device-mismatch -- made with pe's options, moved together
      auto logits = model->forward(atoms, (pe * sign).to(device), spd, mask);
      auto loss = F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().weight(class_w.to(device))); // EXPECT: tensor-clone-in-loop -- the same class weights are uploaded at every step
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      epoch_loss += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
    }
    const double val = evaluate(model, val_batches, device, class_w);
    std::cout << "epoch " << epoch << " train " << epoch_loss.item<double>() / static_cast<double>(train_batches.size()) << " val " << val << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, beside the loop of steps
    if (val < best) {
      best = val;
      torch::save(model, cfg.ckpt);
    }
  }
}

int main() {
  GtConfig cfg;
  std::vector<Molecule> mols;
  for (int64_t i = 0; i < 2000; ++i) {
    const int64_t n = 10 + i % 20;
    Molecule m;
    m.atoms = torch::randint(1, 10, {n});
    auto src = torch::arange(n - 1);
    m.bonds = torch::stack({src, src + 1}, 1); // a chain
    m.label = i % 7 == 0 ? 1 : 0;
    mols.push_back(std::move(m));
  }
  precompute_encodings(mols, cfg);
  std::vector<GraphBatch> train_batches, val_batches;
  const size_t n_train = 1800;
  for (size_t s = 0; s < mols.size(); s += static_cast<size_t>(cfg.batch_size)) {
    const size_t e = std::min(mols.size(), s + static_cast<size_t>(cfg.batch_size));
    (s < n_train ? train_batches : val_batches).push_back(collate(mols, s, e, cfg));
  }
  GraphTransformer model(cfg);
  train(model, train_batches, val_batches, cfg);
  return 0;
}
