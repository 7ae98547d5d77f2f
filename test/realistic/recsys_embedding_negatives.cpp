// Two-tower recommender: sampled-softmax training with random negatives, a hand-written sparse SGD step, hit-rate evaluation.
#include <torch/torch.h>
#include <iostream>

struct TwoTowerImpl : torch::nn::Module {
  TwoTowerImpl(int64_t n_users, int64_t n_items, int64_t dim) {
    users = register_module("users", torch::nn::Embedding(n_users, dim));
    items = register_module("items", torch::nn::Embedding(n_items, dim));
  }
  // [B] users, [B] positives, [B, S] negatives -> [B, 1 + S] scores, the positive first
  torch::Tensor forward(const torch::Tensor &u, const torch::Tensor &pos, const torch::Tensor &neg) {
    auto uv = users(u).unsqueeze(2);                          // [B, D, 1]
    auto cand = items(torch::cat({pos.unsqueeze(1), neg}, 1)); // [B, 1 + S, D]
    return torch::bmm(cand, uv).squeeze(2);
  }
  torch::nn::Embedding users{nullptr}, items{nullptr};
};
TORCH_MODULE(TwoTower);

// Only the rows a batch touched have a gradient: update those rows, leave the rest of the table alone.
void sparse_sgd(TwoTower &model, const torch::Tensor &user_rows, const torch::Tensor &pos, const torch::Tensor &neg,
                double lr) {
  {
    torch::NoGradGuard no_grad;
    auto ru = std::get<0>(at::_unique(user_rows));
    auto &w = model->users->weight;
    w.index_add_(0, ru, w.grad().index_select(0, ru), -lr); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  // Item rows: added later, outside the guard.
  auto ri = std::get<0>(at::_unique(torch::cat({pos, neg.flatten()}))); // EXPECT: tensor-device-mismatch -- every call passes GPU positives and host-sampled negatives
  // FACT: e = torch.nn.Embedding(5, 3); assert raises(lambda: e.weight.index_add_(0, torch.tensor([1]), torch.ones(1, 3), alpha=-0.1), "leaf Variable that requires grad")
  model->items->weight.index_add_(0, ri, model->items->weight.grad().index_select(0, ri), -lr); // EXPECT: tensor-inplace-on-leaf
  model->items->weight.grad().index_fill_(0, ri, 0); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient, not the weight
  model->users->weight.grad().zero_();
}

struct RecTrainer {
  TwoTower model;
  int64_t n_items;
  torch::Tensor user_cache; // [n_users, D] unit vectors served by the nearest-neighbour index

  double train_epoch(const torch::Tensor &interactions, int64_t batch_size, int64_t n_neg, double lr) {
    model->to(torch::kCUDA);
    auto perm = torch::randperm(interactions.size(0));
    auto total = torch::zeros({}, torch::kCUDA);
    int64_t steps = 0;
    for (int64_t s = 0; s + batch_size <= perm.size(0); s += batch_size) {
      auto batch = interactions.index_select(0, perm.narrow(0, s, batch_size)).to(torch::kCUDA);
      auto users = batch.select(1, 0), pos = batch.select(1, 1);
      auto neg = torch::randint(0, n_items, {batch_size, n_neg});
      // FACT: assert raises(lambda: torch.randint(0, 9, (4, 3)) == torch.randint(0, 9, (4, 1), device='meta'), 'same device')
      auto accidental = neg == pos.unsqueeze(1); // EXPECT: tensor-device-mismatch -- negatives sampled on the CPU, positives on the GPU
      auto scores = model->forward(users, pos, neg); // EXPECT: tensor-device-mismatch -- the item table was moved with the model
      scores.narrow(1, 1, n_neg).masked_fill_(accidental, -1e9);
      auto uv = model->users(users);
      auto snap = uv.detach();
      // FACT: e = torch.nn.Embedding(5, 3); uv = e(torch.tensor([1, 2])); d = uv.detach(); d.div_(d.norm(2, 1, True)); assert torch.allclose(uv.norm(2, 1), torch.ones(2))
      snap.div_(snap.norm(2, 1, true).clamp_min(1e-6)); // EXPECT: tensor-inplace-on-detached -- rescales 'uv', read below by the L2 term
      user_cache.index_copy_(0, users, snap);
      auto target = torch::zeros({batch_size}, torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA));
      auto loss = torch::nn::functional::cross_entropy(scores, target) + 1e-4 * uv.pow(2).sum() / batch_size; // LOOKALIKE: tensor-device-mismatch -- the target is made on the GPU
      loss.backward();
      sparse_sgd(model, users, pos, neg, lr);
      total += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph kept
      ++steps;
    }
    return total.item<double>() / steps;
  }

  // Refreshes the whole serving cache from the table.
  void refresh_cache() {
    auto ids = torch::arange(user_cache.size(0), user_cache.options().dtype(torch::kLong));
    auto vecs = model->users(ids).detach();
    // FACT: e = torch.nn.Embedding(5, 3); w0 = e.weight.detach().clone(); v = e(torch.arange(5)).detach(); v.div_(2); assert torch.equal(e.weight.detach(), w0)
    vecs.div_(vecs.norm(2, 1, true).clamp_min(1e-6)); // LOOKALIKE: tensor-inplace-on-detached -- the lookup result is a fresh tensor nobody else holds
    user_cache = vecs;
  }
};

// Hit rate at k over held-out (user, item) pairs, with a popularity penalty.
double hit_rate(TwoTower &model, const torch::Tensor &test_users, const torch::Tensor &test_items,
                const torch::Tensor &log_pop, double beta, int64_t k, int64_t batch_size) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  model->to(device);
  int64_t hits = 0;
  for (int64_t s = 0; s < test_users.size(0); s += batch_size) {
    auto n = std::min(batch_size, test_users.size(0) - s);
    auto u = test_users.narrow(0, s, n).to(device);
    auto scores = torch::matmul(model->users(u), model->items->weight.t()); // [n, n_items]
    scores = scores - beta * log_pop.to(device); // EXPECT: tensor-clone-in-loop -- the same penalty copied to the GPU every batch
    auto top = std::get<1>(scores.topk(k, 1));
    auto target = test_items.narrow(0, s, n).to(device).unsqueeze(1);
    hits += (top == target).any(1).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop
    if (s / batch_size % 100 == 0)
      std::cout << "batch " << s / batch_size << " best score " << scores.max().item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every hundredth batch
  }
  return static_cast<double>(hits) / test_users.size(0);
}
