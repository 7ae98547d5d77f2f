// Candidate retrieval for a video feed with a two-tower model (Yi et al. 2019): a query tower (user
// id + GRU over the watch history) and an item tower (item id + category) map into one unit-norm
// space. Training uses in-batch negatives with the logQ correction, the item frequencies coming
// from a streaming estimator over hashed ids; repeated items in a batch are masked out as negatives.
// For serving, every item vector is precomputed into an embedding cache that is scored with a
// popularity prior, exported as int8 for the ANN index, and refreshed when the catalogue grows.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct RetrievalConfig {
  int64_t n_users = 2000000, n_items = 500000, n_cats = 400, emb = 64, gru_hidden = 128, hidden = 256, out_dim = 64;
  int64_t epochs = 5, hash_buckets = 1 << 22, refresh_chunk = 8192, topk = 100;
  double lr = 1e-3, temperature = 0.05, freq_alpha = 0.01, pop_alpha = 0.1, pop_decay = 0.9;
};

struct InteractionBatch {
  torch::Tensor user_ids, history, hist_len, item_ids; // [B], [B, L] right-padded, [B], [B]: the watched item
};

// Unit-norm rows, written in place to spare a [B, D] buffer.
torch::Tensor unit_norm(torch::Tensor x) {
  auto n = x.norm(2, -1, /*keepdim=*/true).clamp_min(1e-6);
  // FACT: x = torch.nn.Linear(4, 3)(torch.randn(2, 4)); n = x.norm(2, -1, True).clamp_min(1e-6); x.div_(n); assert backward_fails(lambda: x.sum().backward())
  x.div_(n); // EXPECT: tensor-inplace-on-saved -- norm saved x for its backward: every training step's backward() raises
  return x;
}

struct TwoTowerImpl : nn::Module {
  explicit TwoTowerImpl(const RetrievalConfig &cfg) {
    const auto E = cfg.emb;
    user_emb = register_module("user_emb", nn::Embedding(cfg.n_users, E));
    item_emb = register_module("item_emb", nn::Embedding(cfg.n_items, E)); // shared by the history encoder
    cat_emb = register_module("cat_emb", nn::Embedding(cfg.n_cats, E));
    gru = register_module("gru", nn::GRU(nn::GRUOptions(E, cfg.gru_hidden).batch_first(true)));
    user_mlp = register_module("user_mlp", nn::Sequential(nn::Linear(E + cfg.gru_hidden, cfg.hidden), nn::ReLU(), nn::Linear(cfg.hidden, cfg.out_dim)));
    item_mlp = register_module("item_mlp", nn::Sequential(nn::Linear(2 * E, cfg.hidden), nn::ReLU(), nn::Linear(cfg.hidden, cfg.out_dim)));
  }

  torch::Tensor query(const torch::Tensor &users, const torch::Tensor &history, const torch::Tensor &lens) {
    const auto B = history.size(0), L = history.size(1);
    auto out = std::get<0>(gru(item_emb(history))); // [B, L, H]
    const auto H = out.size(2);
    auto last = lens.clamp_min(1) - 1 + torch::arange(B, lens.options()) * L; // the last real step of each row
    // FACT: g = torch.nn.GRU(4, 8, batch_first=True); out, _ = g(torch.randn(3, 5, 4)); assert not is_contiguous(out) and is_copy_of(out.reshape(15, 8), out)
    auto h = out.reshape({B * L, H}).index_select(0, last); // EXPECT: tensor-reshape-non-contiguous -- a batch_first GRU returns its time-major output transposed: the whole sequence output is copied to pick B rows
    return unit_norm(user_mlp->forward(torch::cat({user_emb(users), h}, 1)));
  }

  torch::Tensor candidate(const torch::Tensor &items, const torch::Tensor &cats) {
    return unit_norm(item_mlp->forward(torch::cat({item_emb(items), cat_emb(cats)}, 1)));
  }

  nn::Embedding user_emb{nullptr}, item_emb{nullptr}, cat_emb{nullptr};
  nn::GRU gru{nullptr};
  nn::Sequential user_mlp{nullptr}, item_mlp{nullptr};
};
TORCH_MODULE(TwoTower);

// Streaming frequency estimation: per hash bucket, the last step an item was seen and a moving
// average of the gap between sightings; p(item) ~ 1 / gap.
class StreamingFrequency {
public:
  StreamingFrequency(int64_t buckets, double alpha, torch::Device device)
      : buckets_(buckets), alpha_(alpha), last_(torch::zeros({buckets}, torch::TensorOptions().device(device))),
        gap_(torch::full({buckets}, 1.0 / alpha, torch::TensorOptions().device(device))) {}

  // log q of every item of the batch, after folding in this step's sightings.
  torch::Tensor log_q(const torch::Tensor &items, int64_t step) {
    auto h = items.remainder(buckets_);
    auto gap = (1.0 - alpha_) * gap_.index_select(0, h) + alpha_ * (static_cast<double>(step) - last_.index_select(0, h));
    gap_.index_copy_(0, h, gap); // LOOKALIKE: tensor-copy-narrowing -- float32 into float32
    last_.index_fill_(0, h, static_cast<double>(step));
    return -torch::log(gap);
  }

private:
  int64_t buckets_;
  double alpha_;
  torch::Tensor last_, gap_;
};

class EmbeddingCache {
public:
  EmbeddingCache(int64_t n_items, torch::Device device)
      : device_(device), counts_(torch::zeros({n_items}, torch::TensorOptions().dtype(torch::kLong).device(device))) {}

  void refresh(TwoTower &model, const torch::Tensor &item_category, const RetrievalConfig &cfg) {
    torch::NoGradGuard no_grad;
    model->eval();
    const auto N = item_category.size(0);
    const auto cats = item_category.to(device_); // LOOKALIKE: tensor-clone-in-loop -- moved once, before the loop
    std::vector<torch::Tensor> parts;
    for (int64_t s = 0; s < N; s += cfg.refresh_chunk) {
      auto ids = torch::arange(s, std::min(N, s + cfg.refresh_chunk), torch::TensorOptions().dtype(torch::kLong).device(device_));
      parts.push_back(model->candidate(ids, cats.index_select(0, ids))); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    }
    vecs_ = torch::cat(parts);
    prior_ = cfg.pop_alpha * torch::log1p(counts_.to(torch::kFloat));
    model->train();
  }

  void record_clicks(const torch::Tensor &items) {
    auto ids = items.to(device_);
    counts_.index_add_(0, ids, torch::ones_like(ids)); // LOOKALIKE: tensor-device-mismatch -- ones_like is made on the ids' device
  }

  // Daily decay, so that the prior follows what is popular now.
  void decay(double factor) {
    // FACT: c = torch.full((4,), 3, dtype=torch.long); c.copy_(c * 0.9); assert c.dtype == torch.long and c.tolist() == [2, 2, 2, 2]
    counts_.copy_(counts_ * factor); // EXPECT: tensor-copy-narrowing -- the decayed counts are floating-point and are truncated into the int64 buffer: every count of 1 becomes 0
  }

  // Top-k item ids per query [Q, D]: dot product plus the popularity prior.
  torch::Tensor retrieve(const torch::Tensor &q, int64_t k) const {
    torch::NoGradGuard no_grad;
    auto scores = prior_.unsqueeze(0).expand({q.size(0), -1});
    // FACT: p = torch.randn(6); s = p.unsqueeze(0).expand(3, -1); assert raises(lambda: s.add_(torch.randn(3, 6)), "single memory location")
    scores += torch::mm(q, vecs_.t()); // EXPECT: tensor-inplace-on-expanded -- every query row is the same prior row in memory: PyTorch refuses the write
    return std::get<1>(scores.topk(k, 1));
  }

  // Symmetric int8 codes for the ANN index, with one scale for the whole table.
  std::pair<torch::Tensor, double> export_int8() const {
    const double scale = vecs_.abs().max().item<double>() / 127.0;
    auto codes = vecs_.contiguous();
    // FACT: v = torch.cat([torch.randn(5, 4), torch.randn(5, 4)]); c = v.contiguous(); c.div_(0.01).round_(); assert shares_storage(c, v)
    codes.div_(scale).round_(); // EXPECT: tensor-alias-then-mutate -- the cache is contiguous: contiguous() returns it, and serving goes on with rounded codes instead of vectors
    return {codes.to(torch::kChar).cpu(), scale}; // LOOKALIKE: tensor-copy-narrowing -- an explicit conversion
  }

private:
  torch::Device device_;
  torch::Tensor counts_, vecs_, prior_;
};

// New catalogue items start from the mean embedding of the existing items of their category.
void warm_start_items(TwoTower &model, const torch::Tensor &item_category, int64_t n_old, int64_t n_cats) {
  auto table = model->item_emb->weight; // [N, E]
  const auto N = table.size(0);
  auto cats = item_category.to(table.device());
  auto sums = torch::zeros({n_cats, table.size(1)}, table.options()); // LOOKALIKE: tensor-device-mismatch -- made with the table's options
  sums.index_add_(0, cats.narrow(0, 0, n_old), table.narrow(0, 0, n_old)); // LOOKALIKE: tensor-inplace-on-leaf -- a fresh zeros tensor, not the parameter
  auto per_cat = torch::bincount(cats.narrow(0, 0, n_old), {}, n_cats).clamp_min(1).unsqueeze(1);
  auto centroids = sums / per_cat;
  auto new_ids = torch::arange(n_old, N, cats.options());
  // FACT: w = torch.nn.Embedding(6, 3).weight; assert raises(lambda: w.index_copy_(0, torch.tensor([4, 5]), torch.randn(2, 3)), "a leaf Variable that requires grad")
  table.index_copy_(0, new_ids, centroids.index_select(0, cats.narrow(0, n_old, N - n_old))); // EXPECT: tensor-inplace-on-leaf -- the embedding table is a parameter and grad mode is on: PyTorch refuses
}

void train_retrieval(TwoTower &model, EmbeddingCache &cache, const std::vector<InteractionBatch> &data, const torch::Tensor &item_category,
                     const RetrievalConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  StreamingFrequency freq(cfg.hash_buckets, cfg.freq_alpha, device);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto loss_sum = torch::zeros({}, torch::TensorOptions().device(device)), pos_cos = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto &b : data) {
      auto users = b.user_ids.to(device), hist = b.history.to(device), lens = b.hist_len.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto items = b.item_ids.to(device);
      auto cats = item_category.to(device).index_select(0, items); // EXPECT: tensor-clone-in-loop -- the whole item-to-category table is copied to the device at every step
      const auto B = items.size(0);
      auto logits = torch::mm(model->query(users, hist, lens), model->candidate(items, cats).t()) / cfg.temperature;
      auto sims = logits.detach();
      sims.mul_(cfg.temperature); // EXPECT: tensor-inplace-on-detached -- detach() shares storage: the logits trained on below lose their temperature
      pos_cos += sims.diagonal().mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- computed from detached logits: no graph
      auto log_q = freq.log_q(items, ++step);
      // FACT: l = torch.randn(3, 3); q = torch.randn(3); e = q.unsqueeze(0).expand_as(l); out = l - e; assert is_copy_of(out, q) and is_copy_of(out, l)
      logits = logits - log_q.unsqueeze(0).expand_as(logits); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded row is only read
      // FACT: i = torch.tensor([3, 7, 3]); assert is_view_of(i.view(-1, 1), i) and is_view_of(i.view(1, -1), i)
      auto dup = (items.view({-1, 1}) == items.view({1, -1})) & ~torch::eye(B, torch::TensorOptions().dtype(torch::kBool).device(device)); // LOOKALIKE: tensor-view-non-contiguous -- the ids are a contiguous vector
      logits.masked_fill_(dup, -1e9); // LOOKALIKE: tensor-inplace-on-saved -- a subtraction saves nothing for backward
      auto loss = F::cross_entropy(logits, torch::arange(B, items.options()));
      opt.zero_grad();
      loss.backward();
      opt.step();
      loss_sum += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
      cache.record_clicks(items);
    }
    const auto n = static_cast<double>(data.size());
    std::cout << "epoch " << epoch << " loss " << loss_sum.item<double>() / n << " positive cosine " << pos_cos.item<double>() / n << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch
    cache.decay(cfg.pop_decay);
    cache.refresh(model, item_category, cfg);
  }
}

// Recall@k of the cached retrieval on held-out interactions.
double recall_at_k(TwoTower &model, const EmbeddingCache &cache, const std::vector<InteractionBatch> &val, int64_t k, torch::Device device) {
  model->eval();
  std::vector<torch::Tensor> hits, user_vecs;
  for (const auto &b : val) {
    auto q = model->query(b.user_ids.to(device), b.history.to(device), b.hist_len.to(device));
    auto top = cache.retrieve(q, k);
    hits.push_back((top == b.item_ids.to(device).unsqueeze(1)).any(1)); // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison carries no graph
    user_vecs.push_back(q); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every batch's GRU and MLP graph is kept until the loop ends
  }
  auto spread = torch::cat(user_vecs).std(0).mean().item<double>();
  const double recall = torch::cat(hits).to(torch::kDouble).mean().item<double>();
  std::cout << "recall@" << k << " " << recall << ", query spread " << spread << "\n";
  model->train();
  return recall;
}
