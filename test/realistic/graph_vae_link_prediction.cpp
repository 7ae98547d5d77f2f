// Variational graph autoencoder (Kipf & Welling, 2016) for link prediction on a citation graph.
// A two-layer GCN over the dense, symmetrically normalised adjacency D^-1/2 (A + I) D^-1/2 encodes
// every node into a diagonal Gaussian; codes drawn with the reparameterisation trick are decoded by
// inner products. Part of the edges is masked out of the training graph for validation and test,
// each with as many sampled non-edges; training contrasts the observed edges with fresh negatives
// every epoch, and held-out pairs are scored with ROC AUC and average precision.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct VgaeConfig {
  int64_t hidden = 32, latent = 16, epochs = 400, eval_every = 10, patience = 100, feature_samples = 4;
  double lr = 0.01, val_frac = 0.05, test_frac = 0.10;
};

// As loaded: bag-of-words counts [N, F] float, citation matrix [N, N] float 0/1 (directed).
struct Graph {
  torch::Tensor features, adj;
};

struct EdgeSplit {
  torch::Tensor train_adj;          // [N, N], symmetric, held-out edges removed
  torch::Tensor val_pos, val_neg;   // [2, E_val] int64 node pairs
  torch::Tensor test_pos, test_neg; // [2, E_test]
};

struct Posterior {
  torch::Tensor mu, logstd; // [N, L]
};

struct VgaeLoss {
  torch::Tensor total, recon, kl;
};

// The autoencoder models the undirected graph: a citation in either direction is an edge.
void symmetrize_(torch::Tensor &adj) {
  // FACT: a = (torch.rand(6, 6) > 0.7).float(); assert raises(lambda: a.add_(a.t()), "some elements of the input tensor and the written-to tensor refer to a single memory location")
  adj.add_(adj.t()); // EXPECT: tensor-inplace-overlap
  adj.clamp_max_(1.0);
  adj.fill_diagonal_(0.0);
}

// Bag-of-words rows scaled to sum 1 (empty rows stay zero).
torch::Tensor row_normalize(const torch::Tensor &x) {
  auto rowsum = x.sum(1, /*keepdim=*/true).expand_as(x);
  // FACT: x = torch.rand(4, 6); r = x.sum(1, keepdim=True).expand_as(x); assert raises(lambda: r.clamp_min_(1.0), "single memory location")
  rowsum.clamp_min_(1.0); // EXPECT: tensor-inplace-on-expanded
  return x / rowsum;
}

// GCN propagation matrix D^-1/2 (A + I) D^-1/2, dense.
torch::Tensor normalize_adjacency(const torch::Tensor &adj) {
  // FACT: a = torch.rand(5, 5); c = a.clone(); c += torch.eye(5); assert torch.equal(c, a + torch.eye(5))
  auto a_hat = adj.clone(); // EXPECT: tensor-unnecessary-clone
  a_hat += torch::eye(adj.size(0), adj.options());
  auto d_inv_sqrt = a_hat.sum(1).pow(-0.5);
  return d_inv_sqrt.unsqueeze(1) * a_hat * d_inv_sqrt.unsqueeze(0);
}

// `count` uniform node pairs i < j where `forbidden` is zero: [2, count] int64.
torch::Tensor sample_non_edges(const torch::Tensor &forbidden, int64_t count) {
  const auto N = forbidden.size(0);
  std::vector<torch::Tensor> found;
  int64_t have = 0;
  while (have < count) {
    auto cand = torch::randint(0, N, {2, 2 * count});
    auto i = torch::minimum(cand[0], cand[1]), j = torch::maximum(cand[0], cand[1]);
    auto keep = (forbidden.index({i, j}) == 0) & (i != j);
    auto pairs = torch::stack({i.masked_select(keep), j.masked_select(keep)});
    have += pairs.size(1);
    found.push_back(pairs); // LOOKALIKE: tensor-graph-kept-across-iterations -- integer node ids: nothing requires grad
  }
  return torch::cat(found, 1).narrow(1, 0, count);
}

// Hold out validation and test edges (each undirected edge once, from the upper triangle) and draw
// as many non-edges of the full graph for each.
EdgeSplit split_edges(const torch::Tensor &adj, const VgaeConfig &cfg) {
  auto upper = torch::nonzero(torch::triu(adj, 1)).t(); // [2, E]
  const auto E = upper.size(1);
  const auto n_val = static_cast<int64_t>(cfg.val_frac * static_cast<double>(E));
  const auto n_test = static_cast<int64_t>(cfg.test_frac * static_cast<double>(E));
  auto held = upper.index_select(1, torch::randperm(E).narrow(0, 0, n_val + n_test));
  EdgeSplit s;
  s.val_pos = held.narrow(1, 0, n_val);
  s.test_pos = held.narrow(1, n_val, n_test);
  // The encoder must not see the held-out edges, in either direction.
  auto train_adj = adj.to(torch::kFloat);
  // FACT: a = (torch.rand(6, 6) > 0.5).float(); t = a.to(torch.float32); t.index_put_((torch.tensor([0, 1]), torch.tensor([2, 3])), torch.tensor(0.0)); assert shares_storage(t, a)
  train_adj.index_put_({torch::cat({held[0], held[1]}), torch::cat({held[1], held[0]})}, 0.0); // EXPECT: tensor-alias-then-mutate
  s.train_adj = train_adj;
  auto forbidden = adj.clone(); // LOOKALIKE: tensor-unnecessary-clone -- written below while adj, the caller's graph, stays as it is
  s.val_neg = sample_non_edges(forbidden, n_val);
  forbidden.index_put_({s.val_neg[0], s.val_neg[1]}, 1.0); // test negatives differ from the validation ones
  s.test_neg = sample_non_edges(forbidden, n_test);
  return s;
}

struct VgaeImpl : nn::Module {
  VgaeImpl(int64_t in_features, const VgaeConfig &cfg) : latent(cfg.latent) {
    w0 = register_parameter("w0", torch::empty({in_features, cfg.hidden}));
    b0 = register_parameter("b0", torch::zeros({cfg.hidden}));
    w_stats = register_parameter("w_stats", torch::empty({cfg.hidden, 2 * cfg.latent}));
    nn::init::xavier_uniform_(w0); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    nn::init::xavier_uniform_(w_stats);
  }

  // Two GCN layers; the second emits means and log-stds side by side.
  Posterior encode(const torch::Tensor &x, const torch::Tensor &a_norm) {
    auto h = torch::mm(a_norm, torch::mm(x, w0));
    // FACT: w = torch.randn(3, 5, requires_grad=True); b = torch.zeros(5, requires_grad=True); h = torch.mm(torch.rand(4, 4), torch.mm(torch.rand(4, 3), w)); e = b.expand_as(h); h.add_(e); h.relu().sum().backward(); assert e.stride(0) == 0 and w.grad is not None and b.grad is not None
    h.add_(b0.expand_as(h)); // LOOKALIKE: tensor-inplace-on-saved, tensor-inplace-on-expanded -- mm saves its inputs, not its result; the expanded bias is only read
    h = torch::relu(h);
    const auto N = x.size(0);
    // FACT: s = torch.mm(torch.rand(5, 5), torch.randn(5, 8)); assert is_view_of(s.view(5, 2, 4), s)
    auto stats = torch::mm(a_norm, torch::mm(h, w_stats)).view({N, 2, latent}); // LOOKALIKE: tensor-view-non-contiguous -- mm's output is contiguous
    return {stats.select(1, 0), stats.select(1, 1)};
  }

  // Training draws one code per node; evaluation uses the posterior means.
  torch::Tensor reparameterize(const Posterior &post) {
    if (!is_training())
      return post.mu;
    return post.mu + torch::randn_like(post.mu) * post.logstd.exp();
  }

  // K codes per node: [K, N, L].
  torch::Tensor draw(const Posterior &post, int64_t K) {
    auto eps = torch::randn({K, post.mu.size(0), latent}, post.mu.options()); // LOOKALIKE: tensor-device-mismatch -- made with mu's options, on mu's device
    return post.mu.unsqueeze(0) + post.logstd.exp().unsqueeze(0) * eps;
  }

  // Inner-product decoder: one logit per node pair of pairs [2, E].
  torch::Tensor decode(const torch::Tensor &z, const torch::Tensor &pairs) {
    return (z.index_select(0, pairs[0]) * z.index_select(0, pairs[1])).sum(1);
  }

  // Node features for the downstream classifier: K posterior draws side by side, [N, K * L].
  torch::Tensor sampled_features(const torch::Tensor &x, const torch::Tensor &a_norm, int64_t K) {
    torch::NoGradGuard no_grad;
    auto z = draw(encode(x, a_norm), K);
    // FACT: z = torch.randn(4, 5, 3); assert raises(lambda: z.transpose(0, 1).view(5, -1), "view size is not compatible")
    return z.transpose(0, 1).view({x.size(0), -1}); // EXPECT: tensor-view-non-contiguous
  }

  int64_t latent;
  torch::Tensor w0, b0, w_stats;
};
TORCH_MODULE(Vgae);

// Reconstruction over observed edges and sampled non-edges, plus the KL divergence of the
// posterior from N(0, I) averaged over the nodes.
VgaeLoss vgae_loss(const torch::Tensor &pos_logits, const torch::Tensor &neg_logits, const Posterior &post, int64_t num_nodes) {
  auto recon = F::binary_cross_entropy_with_logits(pos_logits, torch::ones_like(pos_logits)) +
               F::binary_cross_entropy_with_logits(neg_logits, torch::zeros_like(neg_logits));
  auto kl = -0.5 / static_cast<double>(num_nodes) *
            (1 + 2 * post.logstd - post.mu.pow(2) - (2 * post.logstd).exp()).sum(1).mean();
  return {recon + kl, recon, kl};
}

// ROC AUC as the chance that a held-out edge outscores a non-edge (ties count half), and the
// average precision of the ranking of all pairs. The scores are brought to the host once.
std::pair<double, double> auc_ap(const torch::Tensor &pos_logits, const torch::Tensor &neg_logits) {
  auto p = pos_logits.detach().cpu(), n = neg_logits.detach().cpu();
  auto diff = p.unsqueeze(1) - n.unsqueeze(0);
  const double auc = ((diff > 0).to(torch::kDouble).mean() + 0.5 * (diff == 0).to(torch::kDouble).mean()).item<double>();
  auto scores = torch::cat({p, n});
  auto labels = torch::cat({torch::ones_like(p), torch::zeros_like(n)});
  auto hits = labels.index_select(0, scores.argsort(0, /*descending=*/true));
  auto precision = hits.cumsum(0);
  // FACT: h = torch.tensor([1., 0., 1., 1.]); c = h.cumsum(0); c.div_(torch.arange(1, 5)); assert is_copy_of(c, h)
  precision.div_(torch::arange(1, hits.size(0) + 1, hits.options())); // LOOKALIKE: tensor-alias-then-mutate -- cumsum made a new tensor
  const double ap = (precision * hits).sum().item<double>() / static_cast<double>(p.size(0));
  return {auc, ap};
}

class VgaeTrainer {
public:
  VgaeTrainer(Graph graph, const VgaeConfig &cfg) : graph_(std::move(graph)), cfg_(cfg) {}

  // Trains with early stopping on validation AUC; returns node features for the downstream task.
  torch::Tensor run() {
    torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
    symmetrize_(graph_.adj);
    auto split = split_edges(graph_.adj, cfg_);
    auto x = row_normalize(graph_.features).to(device);
    auto a_norm = normalize_adjacency(split.train_adj).to(device);
    auto train_pos = torch::nonzero(torch::triu(split.train_adj, 1)).t();
    auto val_pos = split.val_pos.to(device), val_neg = split.val_neg.to(device);
    const auto N = x.size(0), E = train_pos.size(1);
    Vgae model(x.size(1), cfg_);
    model->to(device);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg_.lr));
    auto smoothed = torch::zeros({}, x.options());
    double loss_sum = 0, best_auc = 0;
    int64_t since_best = 0, epochs_run = 0;
    std::vector<torch::Tensor> best_state;
    for (int64_t epoch = 1; epoch <= cfg_.epochs; ++epoch, ++epochs_run) {
      model->train();
      auto pos = train_pos.to(device); // EXPECT: tensor-clone-in-loop
      auto neg = sample_non_edges(split.train_adj, E).to(device); // LOOKALIKE: tensor-clone-in-loop -- fresh negatives every epoch
      auto post = model->encode(x, a_norm);
      auto z = model->reparameterize(post);
      auto loss = vgae_loss(model->decode(z, pos), model->decode(z, neg), post, N);
      // Monitor: mean cosine similarity of the posterior means across training edges.
      auto codes = post.mu.detach();
      // FACT: s = torch.mm(torch.rand(5, 5), torch.randn(5, 6, requires_grad=True)).view(5, 2, 3); mu = s.select(1, 0); kl = mu.pow(2).sum(); c = mu.detach(); c.div_(c.norm(2, 1, keepdim=True)); assert shares_storage(c, s) and backward_fails(lambda: kl.backward())
      codes.div_(codes.norm(2, 1, /*keepdim=*/true).clamp_min(1e-8)); // EXPECT: tensor-inplace-on-detached
      auto edge_cos = model->decode(codes, pos).mean();
      opt.zero_grad();
      loss.total.backward();
      opt.step();
      smoothed = 0.95 * smoothed + 0.05 * loss.recon.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- the detached loss carries no graph
      loss_sum += loss.total.item<double>(); // EXPECT: tensor-sync-in-loop
      if (epoch % cfg_.eval_every == 0) {
        model->eval();
        auto vpost = model->encode(x, a_norm);
        auto vp = model->decode(vpost.mu, val_pos), vn = model->decode(vpost.mu, val_neg);
        val_recon_.push_back(vgae_loss(vp, vn, vpost, N).recon); // EXPECT: tensor-graph-kept-across-iterations
        const auto [auc, ap] = auc_ap(vp, vn);
        std::cout << "epoch " << epoch << " recon " << smoothed.item<double>() << " edge cos " << edge_cos.item<double>()
                  << " val auc " << auc << " ap " << ap << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every eval_every epochs
        if (auc > best_auc) {
          best_auc = auc;
          since_best = 0;
          best_state.clear();
          for (const auto &p : model->parameters())
            best_state.push_back(p.detach().clone()); // LOOKALIKE: tensor-clone-in-loop, tensor-graph-kept-across-iterations -- every snapshot is kept; detached copies carry no graph
        } else if ((since_best += cfg_.eval_every) >= cfg_.patience) {
          break;
        }
      }
    }
    {
      torch::NoGradGuard no_grad;
      auto params = model->parameters();
      for (size_t i = 0; i < best_state.size(); ++i)
        params[i].copy_(best_state[i]); // LOOKALIKE: tensor-inplace-on-leaf -- the best weights are restored under NoGradGuard
    }
    model->eval();
    torch::NoGradGuard no_grad;
    auto tpost = model->encode(x, a_norm);
    const auto [auc, ap] = auc_ap(model->decode(tpost.mu, split.test_pos.to(device)), model->decode(tpost.mu, split.test_neg.to(device)));
    std::cout << "test auc " << auc << " ap " << ap << " (best val auc " << best_auc << ", mean train loss "
              << loss_sum / static_cast<double>(std::max<int64_t>(epochs_run, 1)) << ")\n";
    return model->sampled_features(x, a_norm, cfg_.feature_samples).cpu();
  }

  void report() const {
    if (!val_recon_.empty())
      std::cout << "validation reconstruction per evaluation:\n" << torch::stack(val_recon_).cpu() << "\n";
  }

private:
  Graph graph_;
  VgaeConfig cfg_;
  std::vector<torch::Tensor> val_recon_;
};

torch::Tensor train_link_predictor(Graph graph, const VgaeConfig &cfg) {
  VgaeTrainer trainer(std::move(graph), cfg);
  auto features = trainer.run();
  trainer.report();
  return features;
}
