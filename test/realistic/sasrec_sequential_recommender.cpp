// SASRec (Kang & McAuley, ICDM 2018): next-item recommendation with a causal
// self-attention encoder over item + position embeddings. Trained with one
// sampled negative per position; evaluated by ranking the held-out item among
// sampled negatives (HR@k / NDCG@k).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct SASRecConfig {
  int64_t num_items = 3416;  // ids 1..num_items; 0 is padding
  int64_t max_len = 200;
  int64_t dim = 64;
  int64_t heads = 2;
  int64_t blocks = 2;
  double dropout = 0.2;
  double lr = 1e-3;
  int64_t epochs = 200;
  int64_t batch_size = 128;
  int64_t eval_negatives = 100;
  int64_t top_k = 10;
  int64_t log_every = 50;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(int64_t dim, int64_t heads, double p) : dim_(dim), heads_(heads) {
    qkv = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    proj = register_module("proj", torch::nn::Linear(dim, dim));
    drop = register_module("drop", torch::nn::Dropout(p));
  }

  // x: [B, L, D]; causal: [max_len, max_len] bool (true = blocked); pad: [B, L] bool
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& causal,
                        const torch::Tensor& pad) {
    const int64_t B = x.size(0), L = x.size(1);
    const int64_t hd = dim_ / heads_;
    auto parts = qkv(x).chunk(3, -1);
    // FACT: c = torch.randn(2, 5, 12).chunk(3, -1)[0]; assert not is_contiguous(c) and is_view_of(c.view(2, 5, 2, 2), c)
    auto q = parts[0].view({B, L, heads_, hd}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- a chunk keeps its last dim contiguous; splitting it is a view
    auto k = parts[1].view({B, L, heads_, hd}).transpose(1, 2);
    auto v = parts[2].view({B, L, heads_, hd}).transpose(1, 2);

    auto att = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    att = att.masked_fill(causal.narrow(0, 0, L).narrow(1, 0, L), -1e9);
    att = torch::softmax(att, -1);
    // Padding queries should not mix anything in: zero their rows.
    att.masked_fill_(pad.view({B, 1, L, 1}), 0.0);  // EXPECT: tensor-inplace-on-saved
    att = drop(att);
    // FACT: o = torch.randn(2, 3, 5, 4).transpose(1, 2); assert is_copy_of(o.reshape(2, 5, 12), o)
    auto out = att.matmul(v).transpose(1, 2).reshape({B, L, dim_});  // EXPECT: tensor-reshape-non-contiguous
    return proj(out);
  }

  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::nn::Dropout drop{nullptr};

 private:
  int64_t dim_, heads_;
};
TORCH_MODULE(CausalSelfAttention);

class SASBlockImpl : public torch::nn::Module {
 public:
  SASBlockImpl(int64_t dim, int64_t heads, double p) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    attn = register_module("attn", CausalSelfAttention(dim, heads, p));
    ff1 = register_module("ff1", torch::nn::Linear(dim, dim));
    ff2 = register_module("ff2", torch::nn::Linear(dim, dim));
    drop = register_module("drop", torch::nn::Dropout(p));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& causal, const torch::Tensor& pad) {
    auto h = ln1(x);
    x = h + attn(h, causal, pad);  // as in the reference: queries from the normalised input
    auto z = drop(ff2(drop(torch::relu(ff1(ln2(x))))));
    z += x;  // LOOKALIKE: tensor-inplace-on-saved -- dropout and Linear save nothing of their output
    return z.masked_fill(pad.unsqueeze(-1), 0.0);
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear ff1{nullptr}, ff2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(SASBlock);

class SASRecImpl : public torch::nn::Module {
 public:
  explicit SASRecImpl(const SASRecConfig& cfg) : cfg_(cfg) {
    item_emb = register_module(
        "item_emb",
        torch::nn::Embedding(torch::nn::EmbeddingOptions(cfg.num_items + 1, cfg.dim).padding_idx(0)));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(cfg.max_len + 1, cfg.dim));
    emb_drop = register_module("emb_drop", torch::nn::Dropout(cfg.dropout));
    final_ln = register_module("final_ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    for (int64_t i = 0; i < cfg.blocks; ++i)
      blocks_.push_back(register_module("block" + std::to_string(i), SASBlock(cfg.dim, cfg.heads, cfg.dropout)));
    causal_ = register_buffer("causal", torch::ones({cfg.max_len, cfg.max_len}, torch::kBool).triu(1));
  }

  // Hidden state at every position: [B, L, D].
  torch::Tensor forward(const torch::Tensor& seq) {
    const int64_t B = seq.size(0), L = seq.size(1);
    auto nonpad = seq.ne(0);
    auto x = item_emb(seq) * std::sqrt(static_cast<double>(cfg_.dim));
    // Positions 1..L, and 0 on padding, like the reference implementation.
    // FACT: p = torch.arange(1, 6).unsqueeze(0).expand(3, 5); assert raises(lambda: p.mul_(torch.ones(3, 5, dtype=torch.bool)), "single memory location")
    auto positions = torch::arange(1, L + 1, seq.options()).unsqueeze(0).expand({B, L});
    positions.mul_(nonpad);  // EXPECT: tensor-inplace-on-expanded
    x = emb_drop(x + pos_emb(positions));
    // FACT: x = torch.randn(3, 5, 4); m = torch.rand(3, 5) > 0.5; assert not raises(lambda: x.mul_(m.unsqueeze(-1).expand_as(x)))
    x.mul_(nonpad.unsqueeze(-1).expand_as(x));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded mask is only read
    auto pad = nonpad.logical_not();
    for (auto& blk : blocks_) x = blk->forward(x, causal_, pad);
    return final_ln(x);
  }

  // -log sigma(<h_t, e_pos>) - log(1 - sigma(<h_t, e_neg>)) over non-padding positions.
  torch::Tensor loss(const torch::Tensor& seq, const torch::Tensor& pos, const torch::Tensor& neg) {
    auto h = forward(seq);
    auto pos_logits = (h * item_emb(pos)).sum(-1);
    auto neg_logits = (h * item_emb(neg)).sum(-1);
    auto per_pos = -(F::logsigmoid(pos_logits) + F::logsigmoid(-neg_logits));
    return per_pos.masked_select(pos.ne(0)).mean();
  }

  // Scores of candidate items at the last position: [B, C].
  torch::Tensor predict(const torch::Tensor& seq, const torch::Tensor& candidates) {
    auto h = forward(seq).select(1, -1);
    return item_emb(candidates).matmul(h.unsqueeze(-1)).squeeze(-1);
  }

  torch::nn::Embedding item_emb{nullptr}, pos_emb{nullptr};
  torch::nn::Dropout emb_drop{nullptr};
  torch::nn::LayerNorm final_ln{nullptr};

 private:
  SASRecConfig cfg_;
  std::vector<SASBlock> blocks_;
  torch::Tensor causal_;
};
TORCH_MODULE(SASRec);

struct UserBatch {
  torch::Tensor seq, pos, neg;  // [B, L] int64, left-padded with 0
};

UserBatch make_batch(const std::vector<std::vector<int64_t>>& hist, const std::vector<int64_t>& users,
                     int64_t L, int64_t num_items) {
  const int64_t B = static_cast<int64_t>(users.size());
  auto seq = torch::zeros({B, L}, torch::kLong);
  auto pos = torch::zeros({B, L}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const auto& h = hist[users[b]];
    const int64_t n = std::min<int64_t>(L, static_cast<int64_t>(h.size()) - 1);
    if (n <= 0) continue;
    std::vector<int64_t> tail(h.end() - n - 1, h.end());
    auto items = torch::tensor(tail, torch::kLong);
    seq[b].narrow(0, L - n, n).copy_(items.narrow(0, 0, n));  // LOOKALIKE: tensor-copy-narrowing -- int64 ids into an int64 buffer
    pos[b].narrow(0, L - n, n).copy_(items.narrow(0, 1, n));
  }
  auto neg = torch::randint(1, num_items + 1, {B, L}, torch::kLong);
  neg.masked_fill_(pos.eq(0), 0);
  return {seq, pos, neg};
}

// Cosine scores against the whole catalogue: [B, num_items + 1].
torch::Tensor score_catalogue(SASRec& model, const torch::Tensor& seq) {
  auto h = model->forward(seq).select(1, -1);
  h = h / h.norm(2, -1, true).clamp_min(1e-8);
  auto table = model->item_emb->weight.detach();
  table.div_(table.norm(2, 1, true).clamp_min(1e-8));  // EXPECT: tensor-inplace-on-detached
  return h.matmul(table.t());
}

// Top-k unseen items for serving.
torch::Tensor recommend(SASRec& model, const torch::Tensor& seq, int64_t k) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto seen = seq.clone();  // EXPECT: tensor-unnecessary-clone
  auto scores = score_catalogue(model, seq);
  scores.scatter_(1, seen, -1e9);  // nothing the user already has, and never the padding id
  return std::get<1>(scores.topk(k, 1));
}

struct RankMetrics {
  double hit = 0, ndcg = 0;
  int64_t users = 0;
};

RankMetrics evaluate(SASRec& model, const std::vector<std::vector<int64_t>>& hist,
                     const std::vector<int64_t>& users, const SASRecConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->to(torch::kCPU);  // offline evaluation runs on the serving target
  RankMetrics m;
  std::vector<torch::Tensor> all_scores;
  for (size_t start = 0; start < users.size(); start += cfg.batch_size) {
    std::vector<int64_t> chunk(users.begin() + start,
                               users.begin() + std::min(users.size(), start + cfg.batch_size));
    auto batch = make_batch(hist, chunk, cfg.max_len, cfg.num_items);
    auto target = batch.pos.select(1, -1).unsqueeze(1);
    auto negs = torch::randint(1, cfg.num_items + 1, {target.size(0), cfg.eval_negatives}, torch::kLong);
    auto scores = model->predict(batch.seq, torch::cat({target, negs}, 1));
    all_scores.push_back(scores);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph is recorded
    // Rank of the held-out item (column 0) among the candidates.
    auto rank = (scores > scores.select(1, 0).unsqueeze(1)).sum(1);
    auto hit = rank < cfg.top_k;
    m.hit += hit.sum().item<double>();
    m.ndcg += (hit.to(torch::kFloat) / torch::log2(rank.to(torch::kFloat) + 2.0)).sum().item<double>();
    m.users += target.size(0);
  }
  auto s = torch::cat(all_scores);
  std::cout << "score gap (pos - mean neg): "
            << (s.select(1, 0) - s.narrow(1, 1, s.size(1) - 1).mean(1)).mean().item<double>() << "\n";
  m.hit /= std::max<int64_t>(m.users, 1);
  m.ndcg /= std::max<int64_t>(m.users, 1);
  return m;
}

void train(SASRec& model, const std::vector<std::vector<int64_t>>& hist, const SASRecConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.9, 0.98}));
  std::vector<int64_t> users(hist.size());
  std::iota(users.begin(), users.end(), 0);
  std::mt19937 rng(42);
  torch::Tensor smoothed = torch::zeros({}, torch::TensorOptions().device(device));

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::shuffle(users.begin(), users.end(), rng);
    double epoch_loss = 0.0;
    int64_t step = 0;
    for (size_t start = 0; start < users.size(); start += cfg.batch_size) {
      std::vector<int64_t> chunk(users.begin() + start,
                                 users.begin() + std::min(users.size(), start + cfg.batch_size));
      auto batch = make_batch(hist, chunk, cfg.max_len, cfg.num_items);
      auto loss = model->loss(batch.seq.to(device), batch.pos.to(device), batch.neg.to(device));
      opt.zero_grad();
      loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        model->item_emb->weight[0].zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard; keeps the padding row at zero
      }
      epoch_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      smoothed = 0.98 * smoothed + 0.02 * loss;  // EXPECT: tensor-graph-kept-across-iterations
      if (++step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    std::cout << "epoch " << epoch << " mean loss " << epoch_loss / std::max<int64_t>(step, 1)
              << " smoothed " << smoothed.item<double>() << "\n";
  }
}
