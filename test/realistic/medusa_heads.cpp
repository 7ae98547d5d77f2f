// Medusa heads on a frozen decoder: head k guesses the token k+2 ahead; the guesses form a
// static candidate tree that the base model verifies in one pass with a tree attention mask.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;

struct BaseConfig {
  int64_t vocab_size = 32000, d_model = 512, n_head = 8, n_layer = 8;
  double rope_theta = 10000.0;
};

struct TrainOpts {
  int64_t steps = 3000, batch = 8, seq_len = 512, log_every = 100;
  double lr = 1e-3, decay = 0.8;  // head k's loss is weighted decay^k
  std::vector<int64_t> special_ids = {0, 1, 2};
};

const float kNegInf = -std::numeric_limits<float>::infinity();

torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& pos, double theta) {
  const auto D = x.size(-1);
  auto inv = torch::pow(theta, torch::arange(0, D, 2, pos.options().dtype(torch::kFloat)) / -static_cast<double>(D));
  auto ang = pos.to(torch::kFloat).unsqueeze(-1) * inv;
  auto cos = ang.cos(), sin = ang.sin();
  // FACT: q = torch.randn(1, 5, 4, 8).transpose(1, 2); assert not is_contiguous(q) and is_view_of(q.reshape(1, 4, 5, 4, 2), q)
  auto pairs = x.reshape({x.size(0), x.size(1), x.size(2), D / 2, 2}); // LOOKALIKE: tensor-reshape-non-contiguous -- splitting the last dim of a transposed view is still a view
  auto x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
  return torch::stack({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1).flatten(-2);
}

torch::Tensor causal_bias(int64_t T, int64_t past, const torch::TensorOptions& opts) {
  return torch::full({T, past + T}, kNegInf, opts).triu(past + 1);
}

struct KVCache {
  std::vector<torch::Tensor> kv;  // per layer, keys and values stacked in front
  int64_t len = 0;
  KVCache(const BaseConfig& cfg, int64_t capacity, const torch::TensorOptions& opts) {
    for (int64_t i = 0; i < cfg.n_layer; ++i)
      kv.push_back(torch::zeros({2, 1, cfg.n_head, capacity, cfg.d_model / cfg.n_head}, opts));
  }
};

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const BaseConfig& cfg)
      : n_head_(cfg.n_head), head_dim_(cfg.d_model / cfg.n_head), theta_(cfg.rope_theta) {
    auto linear = [&](const char* name, int64_t in, int64_t out) {
      return register_module(name, torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
    };
    wq = linear("wq", cfg.d_model, cfg.d_model);
    wk = linear("wk", cfg.d_model, cfg.d_model);
    wv = linear("wv", cfg.d_model, cfg.d_model);
    wo = linear("wo", cfg.d_model, cfg.d_model);
    up = linear("up", cfg.d_model, 4 * cfg.d_model);
    down = linear("down", 4 * cfg.d_model, cfg.d_model);
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& pos, const torch::Tensor& bias, KVCache* cache, int64_t layer) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto h = ln1(x);
    auto split = [&](const torch::Tensor& t) { return t.view({B, T, n_head_, head_dim_}).transpose(1, 2); };
    auto q = rope(split(wq(h)), pos, theta_);
    auto k = rope(split(wk(h)), pos, theta_);
    auto v = split(wv(h));
    if (cache != nullptr) {
      auto& t = cache->kv[layer];
      t.narrow(3, cache->len, T).copy_(torch::stack({k, v}));
      auto all = t.narrow(3, 0, cache->len + T);
      k = all[0];
      v = all[1];
    }
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_)) + bias;
    auto att = torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).contiguous().view({B, T, C});
    auto y = x + wo(att);
    return y + down(torch::silu(up(ln2(y))));
  }
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr}, up{nullptr}, down{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};

 private:
  int64_t n_head_, head_dim_;
  double theta_;
};
TORCH_MODULE(DecoderLayer);

class BaseLMImpl : public torch::nn::Module {
 public:
  explicit BaseLMImpl(const BaseConfig& cfg) : cfg(cfg) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layer; ++i) layers->push_back(DecoderLayer(cfg));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab_size).bias(false)));
  }

  // Final hidden states; appends to the cache when one is given.
  torch::Tensor hidden(const torch::Tensor& ids, const torch::Tensor& pos, const torch::Tensor& bias, KVCache* cache) {
    auto x = tok_emb(ids);
    for (size_t i = 0; i < layers->size(); ++i)
      x = layers[i]->as<DecoderLayer>()->forward(x, pos, bias, cache, static_cast<int64_t>(i));
    if (cache != nullptr) cache->len += ids.size(1);
    return norm(x);
  }
  BaseConfig cfg;  // kept for cache allocation
  torch::nn::Embedding tok_emb{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(BaseLM);

// One Medusa head: a residual SiLU block, then a projection to the vocabulary.
class MedusaHeadImpl : public torch::nn::Module {
 public:
  MedusaHeadImpl(int64_t d, int64_t vocab) {
    fc = register_module("fc", torch::nn::Linear(d, d));
    proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(d, vocab).bias(false)));
    fc->weight.detach().zero_(); // LOOKALIKE: tensor-inplace-on-detached -- meant to write the parameter: the block starts as the identity, nothing computed from it yet
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::silu(fc(x));
    // FACT: lin = torch.nn.Linear(4, 4); x = torch.randn(2, 3, 4); h = torch.nn.functional.silu(lin(x)); x.add_(h); assert backward_fails(lambda: x.sum().backward())
    return proj(x.add_(h)); // EXPECT: tensor-inplace-on-saved
  }
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(MedusaHead);

class MedusaHeadsImpl : public torch::nn::Module {
 public:
  MedusaHeadsImpl(int64_t n_heads, const torch::Tensor& base_lm_head) {
    heads = register_module("heads", torch::nn::ModuleList());
    for (int64_t k = 0; k < n_heads; ++k) {
      MedusaHead head(base_lm_head.size(1), base_lm_head.size(0));
      head->proj->weight.copy_(base_lm_head); // EXPECT: tensor-inplace-on-leaf
      heads->push_back(head);
    }
  }
  std::vector<torch::Tensor> forward(const torch::Tensor& hidden) {
    std::vector<torch::Tensor> out;
    for (auto& h : *heads) out.push_back(h->as<MedusaHead>()->forward(hidden)); // LOOKALIKE: tensor-graph-kept-across-iterations -- one entry per head for this step's loss; the vector dies with the step
    return out;
  }
  torch::nn::ModuleList heads{nullptr};
};
TORCH_MODULE(MedusaHeads);

// Static candidate tree, paths listed by depth as in the Medusa configs.
// A path {i, j} is: top-i guess of head 0, then top-j guess of head 1.
struct MedusaBuffers {
  int64_t n_nodes = 0, depth = 0, top_k = 0;
  torch::Tensor bias;      // additive tree attention mask between the nodes
  torch::Tensor indices;   // node -> slot in [root, head 0 top-k, head 1 top-k, ...]
  torch::Tensor depths;    // node depth, root = 0
  torch::Tensor retrieve;  // one row per leaf: node ids along its path, -1 padded

  MedusaBuffers(const std::vector<std::vector<int64_t>>& paths, int64_t k) : top_k(k) {
    n_nodes = static_cast<int64_t>(paths.size()) + 1;
    depth = static_cast<int64_t>(paths.back().size());
    auto node_of = [&](const std::vector<int64_t>& p, size_t len) {  // node id of p's first len choices
      return std::find(paths.begin(), paths.end(), std::vector<int64_t>(p.begin(), p.begin() + len)) - paths.begin() + 1; };
    auto visible = torch::eye(n_nodes, torch::kBool);
    std::vector<int64_t> idx{0}, dep{0};
    std::vector<torch::Tensor> rows;
    for (size_t i = 0; i < paths.size(); ++i) {
      const auto& p = paths[i];
      idx.push_back(1 + (static_cast<int64_t>(p.size()) - 1) * top_k + p.back());
      dep.push_back(static_cast<int64_t>(p.size()));
      std::vector<int64_t> row(depth + 1, -1);
      for (size_t a = 0; a <= p.size(); ++a) {
        row[a] = a == 0 ? 0 : node_of(p, a);
        visible[static_cast<int64_t>(i) + 1][row[a]] = true;
      }
      const bool leaf = std::none_of(paths.begin(), paths.end(), [&](const auto& q) {
        return q.size() == p.size() + 1 && std::equal(p.begin(), p.end(), q.begin()); });
      if (leaf) rows.push_back(torch::tensor(row));
    }
    bias = torch::zeros({n_nodes, n_nodes}).masked_fill_(visible.logical_not(), kNegInf);
    indices = torch::tensor(idx);
    depths = torch::tensor(dep);
    retrieve = torch::stack(rows);
  }
};

// Prefix part sees everything already verified; the node part follows the tree.
torch::Tensor tree_bias(const MedusaBuffers& buf, int64_t past, const torch::TensorOptions& opts) {
  return torch::cat({torch::zeros({buf.n_nodes, past}, opts), buf.bias}, 1); // EXPECT: tensor-device-mismatch
}

void finetune_heads(BaseLM& base, MedusaHeads& medusa, const torch::Tensor& corpus, const TrainOpts& opt, torch::Device device) {
  for (auto& p : base->parameters()) p.requires_grad_(false); // LOOKALIKE: tensor-inplace-on-leaf -- requires_grad_ flips a flag and writes no data
  base->eval();
  medusa->train();
  torch::optim::AdamW optim(medusa->parameters(), torch::optim::AdamWOptions(opt.lr).weight_decay(0.0));
  const auto K = medusa->heads->size();
  const auto T = opt.seq_len;
  const auto dev = torch::TensorOptions().device(device);
  auto pos = torch::arange(T, dev.dtype(torch::kLong));
  auto bias = causal_bias(T, 0, dev);
  auto special = torch::tensor(opt.special_ids, torch::kLong).to(device);
  double weight_sum = 0.0;
  for (size_t k = 0; k < K; ++k) weight_sum += std::pow(opt.decay, static_cast<double>(k));
  auto running = torch::zeros({}, dev);
  auto correct = torch::zeros({}, dev.dtype(torch::kLong));
  std::vector<torch::Tensor> head_loss_sum;
  for (size_t k = 0; k < K; ++k) head_loss_sum.push_back(torch::zeros({}, dev));

  for (int64_t step = 1; step <= opt.steps; ++step) {
    auto starts = torch::randint(corpus.size(0) - T, {opt.batch, 1}, torch::kLong);
    auto ids = corpus.index({starts + torch::arange(T, torch::kLong)}).to(device, /*non_blocking=*/true); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    auto hidden = [&] { torch::NoGradGuard no_grad; return base->hidden(ids, pos, bias, nullptr); }();
    auto logits = medusa->forward(hidden);
    auto loss = torch::zeros({}, dev);
    for (size_t k = 0; k < K; ++k) {
      const auto shift = static_cast<int64_t>(k) + 2;  // head k guesses the token k+2 ahead
      const auto V = logits[k].size(-1);
      // FACT: l = torch.randn(2, 8, 11); assert is_copy_of(l[:, :5].reshape(-1, 11), l)
      auto pred = logits[k].narrow(1, 0, T - shift).reshape({-1, V}); // EXPECT: tensor-reshape-non-contiguous
      // FACT: t = torch.randint(0, 9, (2, 8)); assert not is_contiguous(t[:, 3:]) and is_copy_of(t[:, 3:].reshape(-1), t)
      auto target = ids.narrow(1, shift, T - shift).reshape({-1}); // EXPECT: tensor-reshape-non-contiguous
      auto lp = torch::log_softmax(pred, -1);
      auto loss_k = F::nll_loss(lp, target);
      loss = loss + std::pow(opt.decay, static_cast<double>(k)) * loss_k;
      head_loss_sum[k] += loss_k; // EXPECT: tensor-graph-kept-across-iterations
      auto metric = lp.detach();  // accuracy only, no graph needed
      // FACT: x = torch.randn(3, 5, requires_grad=True); lp = torch.log_softmax(x, -1); d = lp.detach(); d.index_fill_(-1, torch.tensor([1]), -1e4); assert backward_fails(lambda: torch.nn.functional.nll_loss(lp, torch.tensor([0, 2, 4])).backward())
      metric.index_fill_(-1, special, -1e4); // EXPECT: tensor-inplace-on-detached
      correct += metric.argmax(-1).eq(target).sum();
    }
    // FACT: a = torch.randn(3, requires_grad=True); l = torch.zeros(()) + 0.8 * torch.log_softmax(a, -1)[0]; l.div_(1.8); l.backward()
    loss.div_(weight_sum); // LOOKALIKE: tensor-inplace-on-saved -- add and scalar mul save nothing that this write could invalidate
    optim.zero_grad();
    loss.backward();
    optim.step();
    running += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
    if (step % opt.log_every == 0) {
      auto stats = torch::cat({torch::stack({running, correct.to(torch::kFloat)}), torch::stack(head_loss_sum)}).cpu(); // LOOKALIKE: tensor-sync-in-loop -- one read per logging interval
      std::cout << "step " << step << " loss, top-1 hits, per-head loss: " << stats / opt.log_every << std::endl;
      running.zero_();
      correct.zero_();
      for (auto& t : head_loss_sum) t = torch::zeros({}, dev);
    }
  }
}

// Greedy Medusa decoding of one prompt; returns prompt + new tokens.
torch::Tensor medusa_generate(BaseLM& base, MedusaHeads& medusa, const MedusaBuffers& buf, const torch::Tensor& prompt, int64_t max_new, torch::Device device) {
  torch::NoGradGuard no_grad;
  base->eval();
  medusa->eval();
  const auto opts = base->lm_head->weight.options();
  const auto iopts = torch::TensorOptions().dtype(torch::kLong).device(device);
  const auto P = prompt.size(0);
  KVCache cache(base->cfg, P + max_new + buf.n_nodes + buf.depth + 1, opts);
  auto tokens = prompt.to(device);
  auto hidden = base->hidden(tokens.unsqueeze(0), torch::arange(P, iopts), causal_bias(P, 0, opts), &cache);
  auto last = hidden.narrow(1, P - 1, 1);
  auto tree_idx = buf.indices.to(device);
  auto tree_depths = buf.depths.to(device);
  int64_t produced = 0;
  while (produced < max_new) {
    auto base_logits = base->lm_head(last).view({-1});
    auto head_logits = torch::stack(medusa->forward(last)).view({-1, base_logits.size(0)});
    auto root = base_logits.argmax(-1, /*keepdim=*/true);
    auto flat = torch::cat({root, std::get<1>(head_logits.topk(buf.top_k, -1)).view({-1})});
    auto tree_tokens = flat.index_select(0, tree_idx);
    auto retrieve = buf.retrieve.to(device); // EXPECT: tensor-clone-in-loop
    // verify every node in one pass of the base model
    const auto past = cache.len;
    auto tree_hidden = base->hidden(tree_tokens.unsqueeze(0), tree_depths + past, tree_bias(buf, past, opts), &cache);
    auto tree_logits = base->lm_head(tree_hidden).squeeze(0);
    auto ext = torch::cat({tree_tokens, torch::zeros({1}, iopts)});  // -1 in retrieve picks this padding slot
    auto cand = ext.index({retrieve});
    auto path_logits = tree_logits.index({retrieve}).clone(); // EXPECT: tensor-unnecessary-clone
    auto pred = path_logits.argmax(-1);
    auto match = cand.narrow(1, 1, buf.depth).eq(pred.narrow(1, 0, buf.depth)).to(torch::kLong).cumprod(1);
    auto acc_len = match.sum(1);
    auto best = acc_len.argmax();
    auto sel_cpu = torch::stack({best, acc_len.index({best})}).cpu(); // LOOKALIKE: tensor-sync-in-loop -- one read per step: the accepted length drives the cache and output bookkeeping
    auto sel = sel_cpu.accessor<int64_t, 1>();
    const int64_t b = sel[0], n_acc = sel[1];
    // keep the accepted nodes' keys/values right after the verified prefix
    auto nodes = retrieve[b].narrow(0, 0, n_acc + 1);
    // FACT: k = torch.randn(2, 1, 2, 12, 4); s = k.index_select(3, torch.tensor([8, 9, 11])); assert is_copy_of(s, k)
    for (auto& t : cache.kv) t.narrow(3, past, n_acc + 1).copy_(t.index_select(3, nodes + past)); // LOOKALIKE: tensor-inplace-overlap -- index_select gathers the rows into a new tensor before the copy
    cache.len = past + n_acc + 1;
    tokens = torch::cat({tokens, cand[b].narrow(0, 0, n_acc + 1)});
    produced += n_acc + 1;
    last = tree_hidden.index_select(1, nodes.narrow(0, n_acc, 1));
  }
  return tokens.cpu();
}

int main(int argc, char** argv) {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  BaseConfig cfg;
  BaseLM base(cfg);
  if (argc > 1) torch::load(base, argv[1]);
  base->to(device);
  MedusaHeads medusa(4, base->lm_head->weight);
  medusa->to(device);
  auto corpus = torch::randint(3, cfg.vocab_size, {1 << 20}, torch::kLong);
  finetune_heads(base, medusa, corpus, TrainOpts{}, device);
  torch::save(medusa, "medusa_heads.pt");

  MedusaBuffers buf({{0}, {1}, {2}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}, {0, 1, 0}, {0, 0, 0, 0}}, /*top_k=*/10);
  auto out = medusa_generate(base, medusa, buf, corpus.narrow(0, 0, 24), 96, device);
  std::cout << out << std::endl;
  return 0;
}
