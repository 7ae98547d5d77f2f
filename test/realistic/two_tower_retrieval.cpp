// Two-tower candidate retrieval: a user tower (features + attention over the click
// history) and an item tower, trained with in-batch softmax, a temperature and logQ
// correction; items are embedded in chunks into a half-precision index for top-k search.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct TwoTowerConfig {
  int64_t user_feat_dim = 64;
  int64_t item_feat_dim = 48;
  int64_t num_items = 200000;
  int64_t hist_len = 20;
  int64_t hidden = 256;
  int64_t embed_dim = 64;
  int64_t heads = 4;
  double temperature = 0.05;
  double lr = 1e-3;
  int64_t batch_size = 1024;
  int64_t steps = 20000;
  int64_t index_chunk = 8192;
  int64_t query_chunk = 512;
  int64_t top_k = 100;
};

// Item tower: MLP with a projected skip connection, L2-normalised output.
class ItemTowerImpl : public nn::Module {
 public:
  ItemTowerImpl(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", nn::Linear(in, hidden));
    fc2 = register_module("fc2", nn::Linear(hidden, hidden));
    skip = register_module("skip", nn::Linear(in, hidden));
    proj = register_module("proj", nn::Linear(hidden, out));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc2(torch::relu(fc1(x))));
    // FACT: x = torch.randn(4, 3, requires_grad=True); h = torch.relu(x * 2); h += x; assert backward_fails(lambda: h.sum().backward())
    h += skip(x);  // EXPECT: tensor-inplace-on-saved
    return F::normalize(proj(h), F::NormalizeFuncOptions().dim(-1));
  }

  nn::Linear fc1{nullptr}, fc2{nullptr}, skip{nullptr}, proj{nullptr};
};
TORCH_MODULE(ItemTower);

// User tower: dense features plus multi-head self-attention over recent clicks (0 = pad).
class UserTowerImpl : public nn::Module {
 public:
  explicit UserTowerImpl(const TwoTowerConfig& cfg) : heads_(cfg.heads) {
    hist_emb = register_module("hist_emb", nn::Embedding(cfg.num_items, cfg.embed_dim));
    qkv = register_module("qkv", nn::Linear(cfg.embed_dim, 3 * cfg.embed_dim));
    feat = register_module("feat", nn::Linear(cfg.user_feat_dim, cfg.hidden));
    mix = register_module("mix", nn::Linear(cfg.embed_dim, cfg.hidden));
    out = register_module("out", nn::Linear(cfg.hidden, cfg.embed_dim));
  }

  torch::Tensor forward(const torch::Tensor& feats, const torch::Tensor& history) {
    const auto B = history.size(0);
    const auto L = history.size(1);
    auto e = hist_emb(history);  // [B, L, D]
    const auto D = e.size(2);
    const auto Dh = D / heads_;
    auto parts = qkv(e).chunk(3, -1);
    // FACT: x = torch.randn(2, 5, 24); q = x.chunk(3, -1)[0]; assert not is_contiguous(q) and is_view_of(q.view(2, 5, 4, 2), x)
    auto q = parts[0].view({B, L, heads_, Dh}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- only splits the last dim of the chunk, which is dense
    auto k = parts[1].view({B, L, heads_, Dh}).transpose(1, 2);
    auto v = parts[2].view({B, L, heads_, Dh}).transpose(1, 2);
    auto pad = (history == 0).view({B, 1, 1, L});
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(Dh));
    att = att.masked_fill(pad, -1e9).softmax(-1);
    auto ctx = torch::matmul(att, v);  // [B, H, L, Dh]
    // FACT: c = torch.randn(2, 3, 4, 5); assert is_copy_of(c.transpose(1, 2).reshape(2, 4, 15), c)
    auto merged = ctx.transpose(1, 2).reshape({B, L, D});  // EXPECT: tensor-reshape-non-contiguous
    auto valid = (history != 0).unsqueeze(-1).to(merged.scalar_type());
    auto pooled = (merged * valid).sum(1) / valid.sum(1).clamp_min(1.0);

    auto h = feat(feats);
    h += mix(pooled);  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    h = torch::relu(h);
    return F::normalize(out(h), F::NormalizeFuncOptions().dim(-1));
  }

  nn::Embedding hist_emb{nullptr};
  nn::Linear qkv{nullptr}, feat{nullptr}, mix{nullptr}, out{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(UserTower);

class TwoTowerImpl : public nn::Module {
 public:
  explicit TwoTowerImpl(const TwoTowerConfig& cfg) : embed_dim(cfg.embed_dim) {
    user = register_module("user", UserTower(cfg));
    item = register_module("item", ItemTower(cfg.item_feat_dim, cfg.hidden, cfg.embed_dim));
  }
  UserTower user{nullptr};
  ItemTower item{nullptr};
  int64_t embed_dim;
};
TORCH_MODULE(TwoTower);

struct Batch {
  torch::Tensor user_feats, history, item_feats, item_ids;
};

// Streaming estimate of each item's sampling probability (Yi et al., RecSys 2019):
// p(item) ~ 1 / (average number of steps between two occurrences), hashed buckets.
class StreamingFrequency {
 public:
  StreamingFrequency(int64_t buckets, double alpha)
      : last_(torch::zeros({buckets}, torch::kLong)), delta_(torch::full({buckets}, 100.0)), alpha_(alpha) {}

  torch::Tensor log_q(const torch::Tensor& item_ids, int64_t step) {
    auto h = item_ids.remainder(last_.size(0));
    auto since = (step - last_.index_select(0, h)).to(torch::kFloat);
    auto est = (1.0 - alpha_) * delta_.index_select(0, h) + alpha_ * since;
    delta_.index_copy_(0, h, est);
    last_.index_fill_(0, h, step);
    return -torch::log(est.clamp_min(1.0));
  }

 private:
  torch::Tensor last_, delta_;
  double alpha_;
};

// Item embeddings in half precision, built chunk by chunk; exact top-k by inner product.
class ItemIndex {
 public:
  ItemIndex(torch::Device device, double temperature) : device_(device), scale_(1.0 / temperature) {}

  void build(TwoTower& model, const torch::Tensor& item_feats, int64_t chunk) {
    torch::NoGradGuard no_grad;
    model->eval();
    const auto N = item_feats.size(0);
    emb_ = torch::empty({N, model->embed_dim}, torch::TensorOptions().dtype(torch::kHalf).device(device_));
    for (int64_t off = 0; off < N; off += chunk) {
      const auto n = std::min(chunk, N - off);
      auto e = model->item(item_feats.narrow(0, off, n).to(device_)).to(torch::kFloat);
      // FACT: t = torch.randn(4, 2); e = t.to(torch.float32); e.mul_(2.0); assert shares_storage(e, t)
      e.mul_(scale_);  // LOOKALIKE: tensor-alias-then-mutate -- to() of a temporary: no other handle sees the write
      emb_.narrow(0, off, n).copy_(e);  // LOOKALIKE: tensor-copy-narrowing -- float32 into a float16 index is the intended storage format
    }
  }

  // queries [Q, D] -> (scores [Q, k], item ids [Q, k])
  std::tuple<torch::Tensor, torch::Tensor> search(const torch::Tensor& queries, int64_t k, int64_t chunk) const {
    auto q_all = queries.contiguous();
    // FACT: x = torch.randn(4, 3); q = x.contiguous(); q.div_(q.norm(2, -1, True)); assert shares_storage(q, x)
    q_all.div_(q_all.norm(2, -1, true).clamp_min(1e-12));  // EXPECT: tensor-alias-then-mutate
    std::vector<torch::Tensor> scores, ids;
    for (int64_t off = 0; off < q_all.size(0); off += chunk) {
      const auto n = std::min(chunk, q_all.size(0) - off);
      auto table = emb_.to(torch::kFloat);  // EXPECT: tensor-clone-in-loop
      auto s = torch::matmul(q_all.narrow(0, off, n), table.t());
      auto top = s.topk(k, 1);
      scores.push_back(std::get<0>(top));
      ids.push_back(std::get<1>(top));
    }
    return {torch::cat(scores), torch::cat(ids)};
  }

  int64_t size() const { return emb_.defined() ? emb_.size(0) : 0; }

 private:
  torch::Device device_;
  torch::Tensor emb_;
  double scale_;  // scores come out in training-logit units
};

template <typename Source>
void train(TwoTower& model, Source& data, const TwoTowerConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  StreamingFrequency freq(1 << 20, 0.05);
  const double neg_inf = -std::numeric_limits<double>::infinity();

  for (int64_t step = 0; step < cfg.steps; ++step) {
    Batch b = data.next(cfg.batch_size);
    const auto B = b.item_ids.size(0);
    auto ids = b.item_ids.to(device);
    auto log_q = freq.log_q(b.item_ids, step).to(device);  // LOOKALIKE: tensor-clone-in-loop -- recomputed from each batch
    auto u = model->user(b.user_feats.to(device), b.history.to(device));
    auto v = model->item(b.item_feats.to(device));

    auto logits = torch::matmul(u, v.t());
    logits.div_(cfg.temperature);  // LOOKALIKE: tensor-inplace-on-saved -- matmul saved u and v, not its result
    logits -= log_q.unsqueeze(0);  // logQ correction of the sampled negatives
    auto collide = ids.unsqueeze(0) == ids.unsqueeze(1);
    collide.fill_diagonal_(false);
    logits.masked_fill_(collide, neg_inf);

    // Monitoring: margin between each positive and its hardest in-batch negative.
    auto sim = logits.detach();
    sim.fill_diagonal_(neg_inf);  // EXPECT: tensor-inplace-on-detached
    auto margin = logits.diagonal().detach() - std::get<0>(sim.max(1));

    auto labels = torch::arange(B, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto loss = F::cross_entropy(logits, labels);  // LOOKALIKE: tensor-device-mismatch -- labels are created on the device
    opt.zero_grad();
    loss.backward();
    opt.step();
    std::cout << "step " << step << " loss " << loss.item<float>() << " margin " << margin.mean().item<float>() << "\n";  // EXPECT: tensor-sync-in-loop
  }
}

struct EvalSet {
  torch::Tensor user_feats, history;
  std::vector<int64_t> next_item;
};

double recall_at_k(TwoTower& model, const ItemIndex& index, const EvalSet& ev, const TwoTowerConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  torch::Device device(torch::kCUDA);
  auto u = model->user(ev.user_feats.to(device), ev.history.to(device));
  auto ids = std::get<1>(index.search(u, cfg.top_k, cfg.query_chunk));
  auto truth = torch::tensor(ev.next_item, torch::kLong);
  auto hit = (ids == truth.unsqueeze(1)).any(1);  // EXPECT: tensor-device-mismatch
  return hit.to(torch::kDouble).mean().item<double>();
}

struct RandomClicks {
  TwoTowerConfig cfg;
  Batch next(int64_t n) {
    Batch b;
    b.user_feats = torch::randn({n, cfg.user_feat_dim});
    b.history = torch::randint(cfg.num_items, {n, cfg.hist_len}, torch::kLong);
    b.item_ids = torch::randint(1, cfg.num_items, {n}, torch::kLong);
    b.item_feats = torch::randn({n, cfg.item_feat_dim});
    return b;
  }
};

int main() {
  TwoTowerConfig cfg;
  cfg.num_items = 5000;
  cfg.steps = 50;
  cfg.batch_size = 256;
  TwoTower model(cfg);
  RandomClicks clicks{cfg};
  train(model, clicks, cfg);

  ItemIndex index(torch::kCUDA, cfg.temperature);
  index.build(model, torch::randn({cfg.num_items, cfg.item_feat_dim}), cfg.index_chunk);

  EvalSet ev;
  ev.user_feats = torch::randn({1000, cfg.user_feat_dim});
  ev.history = torch::randint(cfg.num_items, {1000, cfg.hist_len}, torch::kLong);
  for (int i = 0; i < 1000; ++i) ev.next_item.push_back(1 + i % (cfg.num_items - 1));
  std::cout << "recall@" << cfg.top_k << " = " << recall_at_k(model, index, ev, cfg) << " over " << index.size()
            << " items\n";
  return 0;
}
