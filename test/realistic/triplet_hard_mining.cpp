// Metric learning: attention-pooled image embeddings trained with a batch-hard triplet loss
// (P classes x K images per batch); recall@1 on a held-out gallery.
#include <torch/torch.h>
#include <iostream>
#include <limits>
#include <utility>
#include <vector>

struct TripletConfig {
  int64_t width = 64, emb_dim = 128;
  double margin = 0.2, lr = 3e-4;
};

struct EmbeddingNetImpl : torch::nn::Module {
  explicit EmbeddingNetImpl(const TripletConfig &cfg) {
    namespace nn = torch::nn;
    backbone_ = register_module(
        "backbone", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, cfg.width, 3).stride(2).padding(1)),
                                   nn::BatchNorm2d(cfg.width), nn::ReLU(),
                                   nn::Conv2d(nn::Conv2dOptions(cfg.width, 2 * cfg.width, 3).stride(2).padding(1)),
                                   nn::BatchNorm2d(2 * cfg.width), nn::ReLU()));
    attn_ = register_module("attn", nn::Linear(2 * cfg.width, 1));
    proj_ = register_module("proj", nn::Linear(2 * cfg.width, cfg.emb_dim));
  }

  // Spatial positions as tokens: [B, H*W, C].
  torch::Tensor tokens(const torch::Tensor &x) {
    auto feat = backbone_->forward(x);
    const auto B = feat.size(0), C = feat.size(1);
    // FACT: f = torch.randn(2, 3, 4, 5); t = f.permute(0, 2, 3, 1); assert not is_contiguous(t) and is_view_of(t.view(2, 20, 3), f)
    return feat.permute({0, 2, 3, 1}).view({B, -1, C}); // LOOKALIKE: tensor-view-non-contiguous -- H and W stay adjacent after the permute
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto t = tokens(x);
    auto w = torch::softmax(attn_(t), 1); // [B, H*W, 1]
    return torch::nn::functional::normalize(proj_((w * t).sum(1)), torch::nn::functional::NormalizeFuncOptions().dim(1));
  }

  // One descriptor per spatial position, for local re-ranking of the top matches.
  torch::Tensor local_descriptors(const torch::Tensor &x) {
    auto t = tokens(x);
    // FACT: t = torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1).view(2, 20, 3); assert raises(lambda: t.view(-1, 3), "view size is not compatible")
    return t.view({-1, t.size(2)}); // EXPECT: tensor-view-non-contiguous -- the positions have stride 1, the channels stride H*W
  }

  torch::nn::Sequential backbone_{nullptr};
  torch::nn::Linear attn_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(EmbeddingNet);

// Euclidean distances between all rows of emb, as in the usual batch-hard implementations.
torch::Tensor pairwise_distances(const torch::Tensor &emb, bool squared) {
  auto dot = torch::matmul(emb, emb.t());
  auto sq = dot.diagonal();
  auto dist = sq.unsqueeze(0) - 2.0 * dot + sq.unsqueeze(1);
  // FACT: e = torch.randn(4, 3, requires_grad=True); g = e @ e.t(); s = g.diagonal(); d = s.unsqueeze(0) - 2.0 * g + s.unsqueeze(1); d.clamp_min_(0.0); d.sum().backward(); assert e.grad is not None
  dist.clamp_min_(0.0); // LOOKALIKE: tensor-inplace-on-saved -- sums and differences save nothing for backward
  if (squared)
    return dist;
  // sqrt has an infinite gradient at 0: nudge the zeros, then put them back.
  auto zeros = (dist == 0).to(torch::kFloat);
  dist = torch::sqrt(dist + zeros * 1e-16);
  // FACT: d = torch.sqrt(torch.rand(3, 3, requires_grad=True) + 1e-16); d.mul_(torch.ones(3, 3)); assert backward_fails(lambda: d.sum().backward())
  dist.mul_(1.0 - zeros); // EXPECT: tensor-inplace-on-saved -- sqrt saved its result; the triplet loss's backward raises
  return dist;
}

// Batch-hard mining: for each anchor the farthest positive and the closest negative.
torch::Tensor batch_hard_triplet_loss(const torch::Tensor &labels, const torch::Tensor &emb, double margin) {
  auto dist = pairwise_distances(emb, /*squared=*/false);
  auto same = labels.unsqueeze(0) == labels.unsqueeze(1); // [B, B]
  auto pos_mask = same;
  // FACT: y = torch.tensor([0, 1, 0]); s = y.unsqueeze(0) == y.unsqueeze(1); p = s; p.fill_diagonal_(False); assert shares_storage(p, s) and not s[0, 0]
  pos_mask.fill_diagonal_(false); // EXPECT: tensor-alias-then-mutate -- clears the diagonal of 'same' too: each anchor becomes its own negative
  auto hardest_pos = (dist * pos_mask).amax(1);
  // Positives get the row's largest distance added so they never win the min.
  auto row_max = dist.detach().amax(1, /*keepdim=*/true);
  auto push = row_max.expand_as(dist);
  // FACT: d = torch.rand(4, 4); p = d.amax(1, keepdim=True).expand_as(d); assert raises(lambda: p.mul_(d > 0.5), "more than one element of the written-to tensor")
  push.mul_(same); // EXPECT: tensor-inplace-on-expanded
  auto hardest_neg = (dist + push).amin(1);
  return torch::relu(hardest_pos - hardest_neg + margin).mean();
}

void train(EmbeddingNet &net, const std::vector<std::pair<torch::Tensor, torch::Tensor>> &batches,
           const TripletConfig &cfg, int epochs) {
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    net->train();
    double total = 0;
    for (const auto &[images, labels] : batches) {
      auto loss = batch_hard_triplet_loss(labels, net->forward(images), cfg.margin);
      opt.zero_grad();
      loss.backward();
      opt.step();
      total += loss.item<double>();
    }
    std::cout << "epoch " << epoch << " triplet loss " << total / batches.size() << "\n";
  }
}

// Recall@1 over a gallery: the nearest other image must share the query's label.
double recall_at_1(EmbeddingNet &net, const torch::Tensor &images, const torch::Tensor &labels) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto dist = pairwise_distances(net->forward(images), /*squared=*/true);
  auto ranked = dist.clone(); // LOOKALIKE: tensor-unnecessary-clone -- the copy is overwritten below and 'dist' is read after
  // FACT: d = torch.rand(3, 3); r = d.clone(); r.fill_diagonal_(float('inf')); assert is_copy_of(r, d) and torch.isfinite(d).all()
  ranked.fill_diagonal_(std::numeric_limits<float>::infinity()); // LOOKALIKE: tensor-alias-then-mutate -- a clone: 'dist' keeps its zero diagonal for the spread below
  auto nearest = ranked.argmin(1);
  auto hits = (labels.index_select(0, nearest) == labels).to(torch::kFloat);
  std::cout << "mean squared distance " << dist.mean().item<float>() << "\n";
  return hits.mean().item<double>();
}
