// Neural collaborative filtering (He et al. 2017) on implicit feedback from MovieLens-style ratings.
// NeuMF fuses a GMF tower (element-wise product of user and item embeddings) with an MLP tower over
// their concatenation; both towers are pretrained separately and copied into NeuMF. Training draws
// k negatives per positive among the items the user never rated and minimises BPR (or the paper's
// pointwise log loss). Evaluation follows the leave-one-out protocol: each user's latest item is
// ranked against 99 sampled negatives, and HR@k and NDCG@k are averaged over users.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <unordered_set>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct NcfConfig {
  int64_t dim = 16, batch = 1024, negatives = 4, eval_negatives = 99, top_k = 10, epochs = 30, patience = 5;
  int64_t eval_chunk = 2048, log_every = 200;
  std::vector<int64_t> mlp_layers{64, 32, 16};
  double lr = 1e-3, l2 = 1e-6, alpha = 0.5, threshold = 4.0, margin_clip = 10.0;
  bool pointwise = false;
  uint64_t seed = 42;
};

struct Interactions {
  torch::Tensor users, items; // [n] int64
  torch::Tensor ratings;      // [n] float32, 1..5 stars
  torch::Tensor timestamps;   // [n] float32, Unix seconds
};

Interactions load_interactions(const std::vector<int64_t> &u, const std::vector<int64_t> &i, const std::vector<float> &r,
                               std::vector<double> &ts) {
  const auto n = static_cast<int64_t>(u.size());
  Interactions data;
  data.users = torch::tensor(u);
  data.items = torch::tensor(i);
  data.ratings = torch::tensor(r);
  data.timestamps = torch::empty({n}, torch::kFloat);
  // FACT: t = torch.empty(2, dtype=torch.float32); t.copy_(torch.tensor([978300760.0, 978300761.0], dtype=torch.float64)); assert t[0] == t[1]
  data.timestamps.copy_(torch::from_blob(ts.data(), {n}, torch::kDouble)); // EXPECT: tensor-copy-narrowing -- Unix seconds need 31 bits and float32 keeps 24: ratings a minute apart get one timestamp and the "latest" item is a tie
  return data;
}

// Implicit feedback: a rating of at least `threshold` stars counts as an interaction.
torch::Tensor implicit_mask(const Interactions &data, double threshold) {
  torch::Tensor positive = data.ratings;
  // FACT: r = torch.tensor([5.0, 3.0, 4.0]); p = r; p.ge_(4.0); assert shares_storage(p, r) and r.tolist() == [1.0, 0.0, 1.0]
  positive.ge_(threshold); // EXPECT: tensor-alias-then-mutate -- writes 0/1 into the caller's ratings: the rating statistics printed later read the binarised values
  return positive.to(torch::kBool);
}

struct Split {
  torch::Tensor train_users, train_items, test_items; // test_items [U]: each user's latest item
  std::vector<std::unordered_set<int64_t>> seen;
};

Split leave_one_out(const Interactions &data, const torch::Tensor &positive, int64_t n_users) {
  auto users = data.users.masked_select(positive), items = data.items.masked_select(positive);
  auto ts = data.timestamps.masked_select(positive);
  auto u = users.accessor<int64_t, 1>();
  auto it = items.accessor<int64_t, 1>();
  auto t = ts.accessor<float, 1>();
  std::vector<int64_t> last(n_users, -1);
  Split split;
  split.seen.resize(n_users);
  for (int64_t j = 0; j < users.size(0); ++j) {
    split.seen[u[j]].insert(it[j]);
    if (last[u[j]] < 0 || t[j] >= t[last[u[j]]])
      last[u[j]] = j;
  }
  auto keep = torch::ones({users.size(0)}, torch::kBool);
  std::vector<int64_t> test(n_users, 0);
  for (int64_t v = 0; v < n_users; ++v)
    if (last[v] >= 0) {
      keep[last[v]] = false;
      test[v] = it[last[v]];
    }
  split.train_users = users.masked_select(keep);
  split.train_items = items.masked_select(keep);
  split.test_items = torch::empty({n_users}, torch::kLong);
  split.test_items.copy_(torch::tensor(test)); // LOOKALIKE: tensor-copy-narrowing -- int64 item ids into an int64 tensor
  return split;
}

// Uniform negatives among the items a user never interacted with, by rejection.
class NegativeSampler {
public:
  NegativeSampler(const std::vector<std::unordered_set<int64_t>> &seen, int64_t n_items, uint64_t seed)
      : seen_(seen), n_items_(n_items), rng_(seed) {}

  torch::Tensor sample(const torch::Tensor &users, int64_t k) {
    auto neg = torch::empty({users.size(0), k}, torch::kLong);
    auto acc = neg.accessor<int64_t, 2>();
    auto u = users.accessor<int64_t, 1>();
    std::uniform_int_distribution<int64_t> pick(0, n_items_ - 1);
    for (int64_t b = 0; b < neg.size(0); ++b)
      for (int64_t j = 0; j < k; ++j) {
        int64_t item = pick(rng_);
        while (seen_[u[b]].count(item) != 0)
          item = pick(rng_);
        acc[b][j] = item;
      }
    return neg;
  }

private:
  const std::vector<std::unordered_set<int64_t>> &seen_;
  int64_t n_items_;
  std::mt19937_64 rng_;
};

struct GmfImpl : nn::Module {
  GmfImpl(int64_t n_users, int64_t n_items, int64_t dim) {
    user = register_module("user", nn::Embedding(n_users, dim));
    item = register_module("item", nn::Embedding(n_items, dim));
    out = register_module("out", nn::Linear(dim, 1));
    nn::init::normal_(user->weight, 0.0, 0.01); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    nn::init::normal_(item->weight, 0.0, 0.01);
  }
  torch::Tensor features(const torch::Tensor &u, const torch::Tensor &i) { return user(u) * item(i); }
  torch::Tensor forward(const torch::Tensor &u, const torch::Tensor &i) { return out(features(u, i)).squeeze(-1); }
  nn::Embedding user{nullptr}, item{nullptr};
  nn::Linear out{nullptr};
};
TORCH_MODULE(Gmf);

struct MlpImpl : nn::Module {
  MlpImpl(int64_t n_users, int64_t n_items, const std::vector<int64_t> &layers) {
    user = register_module("user", nn::Embedding(n_users, layers.front() / 2));
    item = register_module("item", nn::Embedding(n_items, layers.front() / 2));
    tower = register_module("tower", nn::Sequential());
    for (size_t l = 0; l + 1 < layers.size(); ++l) {
      tower->push_back(nn::Linear(layers[l], layers[l + 1]));
      tower->push_back(nn::ReLU());
    }
    out = register_module("out", nn::Linear(layers.back(), 1));
  }
  torch::Tensor features(const torch::Tensor &u, const torch::Tensor &i) { return tower->forward(torch::cat({user(u), item(i)}, -1)); }
  torch::Tensor forward(const torch::Tensor &u, const torch::Tensor &i) { return out(features(u, i)).squeeze(-1); }
  nn::Embedding user{nullptr}, item{nullptr};
  nn::Sequential tower{nullptr};
  nn::Linear out{nullptr};
};
TORCH_MODULE(Mlp);

struct NeuMFImpl : nn::Module {
  NeuMFImpl(int64_t n_users, int64_t n_items, const NcfConfig &cfg) {
    gmf = register_module("gmf", Gmf(n_users, n_items, cfg.dim));
    mlp = register_module("mlp", Mlp(n_users, n_items, cfg.mlp_layers));
    out = register_module("out", nn::Linear(cfg.dim + cfg.mlp_layers.back(), 1));
  }
  // Scores for user/item id tensors of one shape ([B] or [B, k]).
  torch::Tensor forward(const torch::Tensor &u, const torch::Tensor &i) {
    return out(torch::cat({gmf->features(u, i), mlp->features(u, i)}, -1)).squeeze(-1);
  }
  Gmf gmf{nullptr};
  Mlp mlp{nullptr};
  nn::Linear out{nullptr};
};
TORCH_MODULE(NeuMF);

// NeuMF starts from the pretrained towers (He et al., section 3.4.1).
void load_pretrained(NeuMF &neumf, Gmf &gmf, Mlp &mlp, double alpha) {
  {
    torch::NoGradGuard no_grad;
    neumf->gmf->user->weight.copy_(gmf->user->weight); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    neumf->gmf->item->weight.copy_(gmf->item->weight);
    auto src = mlp->parameters(), dst = neumf->mlp->parameters();
    for (size_t j = 0; j + 2 < src.size(); ++j) // the tower; its own output layer is folded in below
      dst[j].copy_(src[j]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  // Prediction layer: [alpha * h_gmf, (1 - alpha) * h_mlp].
  auto h = torch::cat({alpha * gmf->out->weight, (1.0 - alpha) * mlp->out->weight}, 1);
  // FACT: fc = torch.nn.Linear(6, 1); h = torch.cat([0.5 * torch.nn.Linear(4, 1).weight, 0.5 * torch.nn.Linear(2, 1).weight], 1); assert raises(lambda: fc.weight.copy_(h), "a leaf Variable that requires grad")
  neumf->out->weight.copy_(h); // EXPECT: tensor-inplace-on-leaf -- the guard's block has ended: the output weight is written with grad mode on and PyTorch refuses
  neumf->out->bias.set_data(alpha * gmf->out->bias.detach() + (1.0 - alpha) * mlp->out->bias.detach());
}

// Pointwise log loss (the paper's objective): the positive labelled 1, its k negatives 0.
torch::Tensor pointwise_loss(NeuMF &model, const torch::Tensor &users, const torch::Tensor &pos, const torch::Tensor &neg) {
  auto logits = torch::cat({model->forward(users, pos).unsqueeze(1), model->forward(users.unsqueeze(1).expand_as(neg), neg)}, 1);
  auto labels = torch::zeros_like(logits);
  labels.select(1, 0).fill_(1.0);
  auto p = torch::sigmoid(logits);
  // FACT: z = torch.randn(4, 3, requires_grad=True); p = torch.sigmoid(z); p.clamp_(1e-7, 1 - 1e-7); l = torch.nn.functional.binary_cross_entropy(p, torch.rand(4, 3)); assert backward_fails(lambda: l.backward())
  p.clamp_(1e-7, 1.0 - 1e-7); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its result: backward through it raises
  return F::binary_cross_entropy(p, labels);
}

// Leave-one-out HR@k and NDCG@k: the held-out item (column 0) among the user's sampled negatives.
std::pair<double, double> evaluate(NeuMF &model, const torch::Tensor &test_items, const torch::Tensor &test_negatives, const NcfConfig &cfg,
                                   torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto U = test_items.size(0), k = cfg.top_k;
  auto discount = 1.0 / torch::log2(torch::arange(2, k + 2, torch::kFloat)); // [k]
  auto hits = torch::zeros({}, torch::TensorOptions().device(device)), ndcg = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t s = 0; s < U; s += cfg.eval_chunk) {
    const auto b = std::min(cfg.eval_chunk, U - s);
    auto users = torch::arange(s, s + b, torch::kLong).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different chunk of users every iteration
    auto cand = torch::cat({test_items.narrow(0, s, b).unsqueeze(1), test_negatives.narrow(0, s, b)}, 1).to(device); // LOOKALIKE: tensor-clone-in-loop -- new candidates per chunk
    // FACT: u = torch.arange(4); e = u.unsqueeze(1).expand(4, 6); o = torch.nn.Embedding(8, 3)(e); assert is_copy_of(o, u) and o.shape == (4, 6, 3)
    auto scores = model->forward(users.unsqueeze(1).expand_as(cand), cand); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded user ids are only read by the embedding lookup
    auto at = std::get<1>(scores.topk(k, 1)) == 0; // [b, k]: where the held-out item landed
    auto disc = discount.to(device); // EXPECT: tensor-clone-in-loop -- the same discount vector is copied to the device for every chunk
    hits += at.any(1).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, and a comparison has no gradient
    ndcg += (at.to(torch::kFloat) * disc).sum();
  }
  return {hits.item<double>() / static_cast<double>(U), ndcg.item<double>() / static_cast<double>(U)}; // LOOKALIKE: tensor-sync-in-loop -- read once, after the loop
}

// Top-n unseen items for one user, for the demo endpoint.
torch::Tensor recommend(NeuMF &model, int64_t user, const std::unordered_set<int64_t> &seen, int64_t n_items, int64_t n,
                        torch::Device device) {
  torch::NoGradGuard no_grad;
  auto items = torch::arange(n_items, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto scores = model->forward(torch::full({n_items}, user, items.options()), items);
  auto probs = scores.clone(); // EXPECT: tensor-unnecessary-clone -- overwritten at once by sigmoid_: scores.sigmoid() gives the same tensor in one pass
  probs.sigmoid_();
  std::vector<int64_t> seen_ids(seen.begin(), seen.end());
  probs.index_fill_(0, torch::tensor(seen_ids, items.options()), 0.0);
  return std::get<1>(probs.topk(n)).cpu();
}

void fit(const Interactions &data, int64_t n_users, int64_t n_items, Gmf &gmf, Mlp &mlp, const NcfConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto positive = implicit_mask(data, cfg.threshold);
  auto split = leave_one_out(data, positive, n_users);
  NegativeSampler sampler(split.seen, n_items, cfg.seed);
  auto test_negatives = sampler.sample(torch::arange(n_users), cfg.eval_negatives);
  std::cout << "interactions " << data.ratings.size(0) << ", mean rating " << data.ratings.mean().item<double>() << "\n";

  NeuMF model(n_users, n_items, cfg);
  load_pretrained(model, gmf, mlp, cfg.alpha);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto window = torch::zeros({cfg.patience}, torch::kDouble); // HR@k of the last `patience` epochs
  std::vector<torch::Tensor> reg_log;
  const auto n = split.train_users.size(0);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto perm = torch::randperm(n);
    double epoch_loss = 0;
    for (int64_t s = 0; s < n; s += cfg.batch) {
      auto idx = perm.narrow(0, s, std::min(cfg.batch, n - s));
      auto users_cpu = split.train_users.index_select(0, idx);
      auto neg = sampler.sample(users_cpu, cfg.negatives).to(device);
      auto users = users_cpu.to(device), pos = split.train_items.index_select(0, idx).to(device); // LOOKALIKE: tensor-clone-in-loop -- new rows every step
      torch::Tensor loss;
      if (cfg.pointwise) {
        loss = pointwise_loss(model, users, pos, neg);
      } else {
        auto diff = model->forward(users, pos).unsqueeze(1) - model->forward(users.unsqueeze(1).expand_as(neg), neg);
        loss = -F::logsigmoid(diff).mean();
        auto margin = diff.detach();
        // FACT: x = torch.randn(4, 3, requires_grad=True); d = x * 2.0; l = -torch.nn.functional.logsigmoid(d).mean(); m = d.detach(); m.clamp_(-10.0, 10.0); assert shares_storage(m, d) and backward_fails(lambda: l.backward())
        margin.clamp_(-cfg.margin_clip, cfg.margin_clip); // EXPECT: tensor-inplace-on-detached -- margin is diff, which logsigmoid saved: the backward below raises
        if (step % cfg.log_every == 0)
          std::cout << "step " << step << " mean margin " << margin.mean().item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      }
      auto reg = cfg.l2 * (model->gmf->user->weight.pow(2).sum() + model->gmf->item->weight.pow(2).sum());
      opt.zero_grad();
      (loss + reg).backward();
      opt.step();
      reg_log.push_back(reg.detach()); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
      epoch_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- on a GPU every step waits here only to sum the loss
      ++step;
    }
    auto [hr, ndcg] = evaluate(model, split.test_items, test_negatives, cfg, device);
    std::cout << "epoch " << epoch << " loss " << epoch_loss / std::ceil(static_cast<double>(n) / cfg.batch) << " HR@" << cfg.top_k
              << " " << hr << " NDCG " << ndcg << "\n";
    // FACT: w = torch.zeros(5, dtype=torch.float64); assert raises(lambda: w.narrow(0, 0, 4).copy_(w.narrow(0, 1, 4)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    window.narrow(0, 0, cfg.patience - 1).copy_(window.narrow(0, 1, cfg.patience - 1)); // EXPECT: tensor-inplace-overlap -- the shifted halves of one buffer overlap: PyTorch refuses the copy
    window[cfg.patience - 1] = hr;
    if (epoch >= cfg.patience && hr < window.max().item<double>() - 1e-4) // LOOKALIKE: tensor-sync-in-loop -- a host tensor, and the value steers the loop
      break;
  }
  std::cout << "mean L2 term " << torch::stack(reg_log).mean().item<double>() << "\n";
  auto top = recommend(model, 0, split.seen[0], n_items, cfg.top_k, device);
  std::cout << "recommendations for user 0: " << top << "\n";
}
