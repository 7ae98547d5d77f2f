// Sparse mixture-of-experts feed-forward layer (GShard / Switch style) in a small text
// classifier: top-2 gating with a capacity limit per expert, token dispatch by index_select and
// combine by index_add_, per-expert MLPs, the load-balancing loss and the router z-loss.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

struct MoEConfig {
  int64_t vocab = 30000, max_len = 256, d_model = 512, d_ff = 2048, n_experts = 8, n_classes = 4;
  double capacity_factor = 1.25, aux_coef = 1e-2, z_coef = 1e-3, router_noise = 1e-2, lr = 3e-4;
};

struct ExpertImpl : torch::nn::Module {
  ExpertImpl(int64_t d_model, int64_t d_ff) {
    fc1_ = register_module("fc1", torch::nn::Linear(d_model, d_ff));
    fc2_ = register_module("fc2", torch::nn::Linear(d_ff, d_model));
  }
  torch::Tensor forward(const torch::Tensor &x) { return fc2_(torch::gelu(fc1_(x))); }
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(Expert);

struct MoEOutput {
  torch::Tensor y;        // [B, T, D]
  torch::Tensor aux_loss; // load balancing, scalar
  torch::Tensor z_loss;   // router logit size, scalar
};

struct MoELayerImpl : torch::nn::Module {
  explicit MoELayerImpl(const MoEConfig &cfg) : cfg_(cfg) {
    router_ = register_module("router", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.n_experts).bias(false)));
    for (int64_t e = 0; e < cfg.n_experts; ++e)
      experts_.push_back(register_module("expert" + std::to_string(e), Expert(cfg.d_model, cfg.d_ff)));
    // A small router init keeps the first routing decisions close to uniform.
    torch::NoGradGuard no_grad;
    // FACT: w = torch.nn.Linear(8, 4, bias=False).weight; exec('with torch.no_grad(): w.normal_(0.0, 0.02)'); assert w.is_leaf and w.requires_grad
    router_->weight.normal_(0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  MoEOutput forward(const torch::Tensor &x) {
    const auto B = x.size(0), T = x.size(1), D = x.size(2);
    const auto N = B * T, E = cfg_.n_experts;
    // FACT: x = torch.randn(2, 3, 4); assert is_view_of(x.reshape(6, 4), x)
    auto tokens = x.reshape({N, D}); // LOOKALIKE: tensor-reshape-non-contiguous -- the block's input is contiguous: a view
    auto logits = router_(tokens); // [N, E]
    // Router z-loss (ST-MoE) on the clean logits.
    auto lse = torch::logsumexp(logits, -1);
    auto z_loss = (lse * lse).mean();
    if (is_training() && cfg_.router_noise > 0) {
      // FACT: l = torch.nn.Linear(4, 3)(torch.randn(5, 4)); z = torch.logsumexp(l, -1); l.add_(torch.randn(5, 3) * 0.01); assert backward_fails(lambda: (z * z).mean().backward())
      logits.add_(torch::randn_like(logits) * cfg_.router_noise); // EXPECT: tensor-inplace-on-saved -- logsumexp saved the logits for the z-loss's backward
    }
    auto probs = torch::softmax(logits, -1);

    // Top-2: the best expert, then the best of the others.
    auto first = probs.argmax(-1);
    auto mask1 = torch::one_hot(first, E).to(torch::kBool);
    auto gate1 = (probs * mask1).sum(-1);
    auto rest = probs.detach(); // the second argmax needs no gradient
    // FACT: p = torch.softmax(torch.nn.Linear(4, 3)(torch.randn(5, 4)), -1); m = torch.nn.functional.one_hot(p.argmax(-1), 3).bool(); g1 = (p * m).sum(-1); r = p.detach(); r.masked_fill_(m, 0.0); assert shares_storage(r, p) and backward_fails(lambda: g1.sum().backward())
    rest.masked_fill_(mask1, 0.0); // EXPECT: tensor-inplace-on-detached -- zeroes the first choice inside 'probs', which softmax saved: backward raises
    auto second = rest.argmax(-1);
    auto gate2 = probs.gather(1, second.unsqueeze(1)).squeeze(1);
    auto gates = torch::stack({gate1, gate2}, 1); // [N, 2]
    gates = gates / gates.sum(1, /*keepdim=*/true).clamp_min(1e-9);

    // Capacity: all first choices are queued before any second choice.
    const auto capacity = static_cast<int64_t>(std::ceil(cfg_.capacity_factor * 2.0 * N / E));
    auto choice = torch::stack({first, second}); // [2, N]
    // FACT: c = torch.stack([torch.randint(0, 8, (6,)), torch.randint(0, 8, (6,))]); assert is_view_of(c.view(-1), c)
    auto flat_expert = choice.view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- stacked along a new first dim: contiguous, choice-major
    // FACT: g = torch.rand(6, 2); assert not is_contiguous(g.t()) and is_copy_of(g.t().reshape(-1), g)
    auto flat_gate = gates.t().reshape({-1}); // EXPECT: tensor-reshape-non-contiguous -- the transposed [N, 2] gates are copied to flatten them choice-major
    auto flat_token = torch::arange(N, first.options()).repeat({2});
    auto onehot = torch::one_hot(flat_expert, E); // [2N, E]
    auto slot = ((onehot.cumsum(0) - 1) * onehot).sum(1); // place in the expert's queue
    auto keep = slot < capacity;

    // The experts read a private copy of the tokens.
    // FACT: t = torch.randn(6, 4); c = t.clone(); assert torch.equal(c.index_select(0, torch.tensor([1, 3])), t.index_select(0, torch.tensor([1, 3])))
    auto inputs = tokens.clone(); // EXPECT: tensor-unnecessary-clone -- neither 'tokens' nor the copy is ever written
    auto out = torch::zeros_like(tokens);
    auto counts = torch::bincount(flat_expert.masked_select(keep), {}, E);
    for (int64_t e = 0; e < E; ++e) {
      if (counts[e].item<int64_t>() == 0) // LOOKALIKE: tensor-sync-in-loop -- the count decides whether the expert runs
        continue;
      auto sel = ((flat_expert == e) & keep).nonzero().squeeze(1);
      auto tok = flat_token.index_select(0, sel);
      auto h = experts_[e]->forward(inputs.index_select(0, tok));
      // FACT: h = torch.nn.Linear(4, 3)(torch.randn(5, 4)); g = torch.rand(5, requires_grad=True); h.mul_(g.unsqueeze(1)); h.sum().backward(); assert g.grad is not None
      h.mul_(flat_gate.index_select(0, sel).unsqueeze(1)); // LOOKALIKE: tensor-inplace-on-saved -- the expert ends in a Linear, which does not save its output
      out.index_add_(0, tok, h);
    }

    // Switch load-balancing loss: E * sum_e f_e * P_e (f: first-choice fraction, P: mean probability).
    auto frac = mask1.to(torch::kFloat).mean(0);
    MoEOutput res;
    res.aux_loss = E * (frac * probs.mean(0)).sum();
    res.z_loss = z_loss;
    // FACT: o = torch.zeros(6, 4); o.index_add_(0, torch.tensor([0, 2]), torch.ones(2, 4)); assert is_view_of(o.view(2, 3, 4), o)
    res.y = out.view({B, T, D}); // LOOKALIKE: tensor-view-non-contiguous -- zeros_like(tokens) is contiguous and index_add_ keeps its layout
    return res;
  }

  MoEConfig cfg_;
  torch::nn::Linear router_{nullptr};
  std::vector<Expert> experts_;
};
TORCH_MODULE(MoELayer);

struct ClassifierOutput {
  torch::Tensor logits, aux_loss, z_loss;
};

struct MoEClassifierImpl : torch::nn::Module {
  explicit MoEClassifierImpl(const MoEConfig &cfg) {
    embed_ = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    pos_ = register_module("pos", torch::nn::Embedding(cfg.max_len, cfg.d_model));
    ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    moe_ = register_module("moe", MoELayer(cfg));
    head_ = register_module("head", torch::nn::Linear(cfg.d_model, cfg.n_classes));
  }
  ClassifierOutput forward(const torch::Tensor &ids) {
    auto pos = torch::arange(ids.size(1), ids.options());
    auto h = embed_(ids) + pos_(pos);
    auto m = moe_->forward(ln_(h));
    h = h + m.y;
    return {head_(h.mean(1)), m.aux_loss, m.z_loss};
  }
  torch::nn::Embedding embed_{nullptr}, pos_{nullptr};
  torch::nn::LayerNorm ln_{nullptr};
  MoELayer moe_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(MoEClassifier);

struct TextBatch {
  torch::Tensor ids;           // [B, T] int64, from the tokenizer
  std::vector<int64_t> labels; // one class per text
};

void train(MoEClassifier &model, const std::vector<TextBatch> &batches, const MoEConfig &cfg, int epochs) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    torch::Tensor ce_total = torch::zeros({}, device), aux_total = torch::zeros({}, device);
    for (const auto &b : batches) {
      auto ids = b.ids.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto labels = torch::tensor(b.labels, torch::kLong);
      auto out = model->forward(ids);
      auto ce = torch::nn::functional::cross_entropy(out.logits, labels); // EXPECT: tensor-device-mismatch -- the labels are built on the host
      auto loss = ce + cfg.aux_coef * out.aux_loss + cfg.z_coef * out.z_loss;
      opt.zero_grad();
      loss.backward();
      opt.step();
      ce_total += ce.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph kept
      // FACT: m = torch.nn.Linear(3, 2); ls = [m(torch.randn(4, 3)).pow(2).mean() for _ in range(3)]; [l.backward() for l in ls]; s = torch.zeros(()); [s.add_(l) for l in ls]; assert s.requires_grad and kept_nodes(s) > 2 * kept_nodes(ls[0])
      aux_total += out.aux_loss; // EXPECT: tensor-graph-kept-across-iterations -- only read with item() for the log
    }
    const auto n = static_cast<double>(batches.size());
    std::cout << "epoch " << epoch << " ce " << ce_total.item<double>() / n << " aux " << aux_total.item<double>() / n << "\n";
  }
}
