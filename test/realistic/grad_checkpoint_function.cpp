// Activation checkpointing for a GPT-style stack with a hand-written
// torch::autograd::Function. Forward runs the block without recording a graph
// and keeps only the block input; backward re-runs the block with grad enabled
// and backpropagates through the recomputed graph (like PyTorch's reentrant
// torch.utils.checkpoint).
#include <torch/torch.h>

#include <cmath>
#include <deque>
#include <iostream>
#include <string>
#include <vector>

struct TrainConfig {
  int64_t vocab = 8192;
  int64_t d_model = 384;
  int64_t n_heads = 6;
  int64_t n_kv_heads = 2;
  int64_t n_layers = 8;
  int64_t seq_len = 256;
  int64_t micro_batch = 8;
  int64_t accum_steps = 4;
  int64_t steps = 2000;
  int64_t log_every = 50;
  int64_t pad_id = 0;
  int64_t unk_id = 1;
  double lr = 3e-4;
  double weight_decay = 0.1;
  double ema_decay = 0.999;
  double token_dropout = 0.1;
  bool checkpoint = true;
  bool bf16_checkpoints = true;  // store checkpointed block inputs in bf16
};

torch::Tensor build_alibi(int64_t n_heads, int64_t max_len) {
  auto slopes = torch::pow(2.0, -8.0 * torch::arange(1, n_heads + 1, torch::kFloat) / n_heads);
  auto pos = torch::arange(max_len, torch::kFloat);
  auto dist = (pos.view({1, -1}) - pos.view({-1, 1})).clamp_max(0);
  auto bias = slopes.view({-1, 1, 1}) * dist;
  auto causal = torch::ones({max_len, max_len}, torch::kBool).triu(1);
  return bias.masked_fill(causal, -1e9).unsqueeze(0);
}

// Grouped-query attention with ALiBi.
struct SelfAttentionImpl : torch::nn::Module {
  explicit SelfAttentionImpl(const TrainConfig& cfg)
      : h_(cfg.n_heads), kv_h_(cfg.n_kv_heads), d_(cfg.d_model / cfg.n_heads) {
    qkv = register_module("qkv", torch::nn::Linear(cfg.d_model, (h_ + 2 * kv_h_) * d_));
    proj = register_module("proj", torch::nn::Linear(cfg.d_model, cfg.d_model));
    alibi_ = register_buffer("alibi", build_alibi(h_, cfg.seq_len));
    scale_ = 1.0 / std::sqrt(static_cast<double>(d_));
  }

  // FACT: y = torch.randn(2, 5, 640); assert is_view_of(y.narrow(-1, 0, 384).view(2, 5, 6, 64), y)
  // FACT: q = torch.randn(2, 5, 640).narrow(-1, 0, 384).view(2, 5, 6, 64).transpose(1, 2); assert is_view_of(q.reshape(2, 2, 3, 5, 64), q)
  // FACT: q = torch.randn(2, 2, 3, 5, 4, requires_grad=True); k = torch.randn(2, 2, 1, 4, 5, requires_grad=True); s = torch.matmul(q, k); s.mul_(0.5); s.softmax(-1).sum().backward(); assert q.grad is not None
  // FACT: a = torch.zeros(1, 6, 16, 16); b = a[:, :, :8, :8].expand(4, -1, -1, -1); assert raises(lambda: b.add_(torch.zeros(4, 1, 1, 8)), "more than one element")
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& pad_bias) {
    const int64_t B = x.size(0), T = x.size(1), G = h_ / kv_h_;
    auto fused = qkv->forward(x);
    auto q = fused.narrow(-1, 0, h_ * d_).view({B, T, h_, d_}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- view only splits the last dim of the narrowed block
    auto kv = fused.narrow(-1, h_ * d_, 2 * kv_h_ * d_).view({B, T, 2, kv_h_, d_}).permute({2, 0, 3, 1, 4});
    auto k = kv[0].unsqueeze(2), v = kv[1].unsqueeze(2);

    auto qg = q.reshape({B, kv_h_, G, T, d_});  // LOOKALIKE: tensor-reshape-non-contiguous -- only the head dim is split, still a view
    auto scores = torch::matmul(qg, k.transpose(-2, -1));
    scores.mul_(scale_);  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result

    auto bias = alibi_.slice(2, 0, T).slice(3, 0, T).expand({B, -1, -1, -1});
    bias.add_(pad_bias);  // EXPECT: tensor-inplace-on-expanded
    auto attn = torch::softmax(scores.view({B, h_, T, T}) + bias, -1);

    if (monitor_entropy) {
      auto p = attn.detach();
      p.clamp_min_(1e-9);  // EXPECT: tensor-inplace-on-detached
      last_entropy = -(p * p.log()).sum(-1).mean();
    }
    auto out = torch::matmul(attn.view({B, kv_h_, G, T, T}), v);
    // FACT: o = torch.randn(2, 2, 3, 5, 64); assert is_copy_of(o.view(2, 6, 5, 64).transpose(1, 2).reshape(2, 5, 384), o)
    return proj->forward(out.view({B, h_, T, d_}).transpose(1, 2).reshape({B, T, -1}));  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t h_, kv_h_, d_;
  double scale_;
  bool monitor_entropy = false;
  torch::Tensor last_entropy;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor alibi_;
};
TORCH_MODULE(SelfAttention);

// GLU feed-forward with a sigmoid gate.
struct GatedMLPImpl : torch::nn::Module {
  explicit GatedMLPImpl(int64_t d, int64_t hidden) {
    w_gate = register_module("w_gate", torch::nn::Linear(d, hidden));
    w_up = register_module("w_up", torch::nn::Linear(d, hidden));
    w_down = register_module("w_down", torch::nn::Linear(hidden, d));
  }
  // FACT: x = torch.randn(3, 4, requires_grad=True); g = torch.sigmoid(x); g.mul_(torch.randn(3, 4)); assert backward_fails(lambda: g.sum().backward())
  torch::Tensor forward(const torch::Tensor& x) {
    auto gate = torch::sigmoid(w_gate->forward(x));
    gate.mul_(w_up->forward(x));  // EXPECT: tensor-inplace-on-saved
    return w_down->forward(gate);
  }
  torch::nn::Linear w_gate{nullptr}, w_up{nullptr}, w_down{nullptr};
};
TORCH_MODULE(GatedMLP);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const TrainConfig& cfg) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    attn = register_module("attn", SelfAttention(cfg));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    mlp = register_module("mlp", GatedMLP(cfg.d_model, 4 * cfg.d_model));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& pad_bias) {
    auto h = x + attn->forward(ln1->forward(x), pad_bias);
    return h + mlp->forward(ln2->forward(h));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  SelfAttention attn{nullptr};
  GatedMLP mlp{nullptr};
};
TORCH_MODULE(Block);

struct CheckpointBlock : public torch::autograd::Function<CheckpointBlock> {
  // FACT: x = torch.tensor([1.0 + 2 ** -10]); p = torch.empty(1, dtype=torch.bfloat16); p.copy_(x); assert p.float().item() == 1.0
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               torch::Tensor pad_bias, BlockImpl* block, bool bf16,
                               torch::TensorList params) {
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    ctx->saved_data["n_params"] = static_cast<int64_t>(params.size());
    if (bf16) {
      auto packed = torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16));
      packed.copy_(x);  // EXPECT: tensor-copy-narrowing
      ctx->save_for_backward({packed, pad_bias});
    } else {
      ctx->save_for_backward({x, pad_bias});
    }
    return block->forward(x, pad_bias);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto* block = reinterpret_cast<BlockImpl*>(ctx->saved_data["block"].toInt());
    auto x = saved[0].to(torch::kFloat).detach();
    x.requires_grad_(true);  // LOOKALIKE: tensor-inplace-on-detached -- only flags the recompute leaf, no data is written

    torch::Tensor y;
    {
      torch::AutoGradMode enable_grad(true);
      y = block->forward(x, saved[1]);
    }
    std::vector<torch::Tensor> inputs{x};
    auto params = block->parameters();
    TORCH_CHECK(static_cast<int64_t>(params.size()) == ctx->saved_data["n_params"].toInt());
    inputs.insert(inputs.end(), params.begin(), params.end());
    auto grads = torch::autograd::grad({y}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                                       /*create_graph=*/false, /*allow_unused=*/true);

    // one slot per forward argument: x, pad_bias, block, bf16, params...
    torch::autograd::variable_list result{grads[0], torch::Tensor(), torch::Tensor(), torch::Tensor()};
    result.insert(result.end(), grads.begin() + 1, grads.end());
    return result;
  }
};

struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(const TrainConfig& cfg) : cfg_(cfg) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      blocks.push_back(register_module("h" + std::to_string(i), Block(cfg)));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));

    // GPT-2 init: shrink the residual projections by depth
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      const auto& name = item.key();
      if (name.find("proj.weight") != std::string::npos || name.find("w_down.weight") != std::string::npos)
        item.value().mul_(1.0 / std::sqrt(2.0 * cfg.n_layers));  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
  }

  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& pad_bias) {
    auto h = tok_emb->forward(ids);
    for (auto& block : blocks) {
      if (cfg_.checkpoint && is_training()) {
        auto params = block->parameters();
        h = CheckpointBlock::apply(h, pad_bias, block.get(), cfg_.bf16_checkpoints, torch::TensorList(params));
      } else {
        h = block->forward(h, pad_bias);
      }
    }
    return head->forward(ln_f->forward(h));
  }

  TrainConfig cfg_;
  torch::nn::Embedding tok_emb{nullptr};
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(GPT);

torch::Tensor sample_batch(const TrainConfig& cfg) {
  auto tokens = torch::randint(2, cfg.vocab, {cfg.micro_batch, cfg.seq_len + 1});
  auto lengths = torch::randint(cfg.seq_len / 2, cfg.seq_len + 2, {cfg.micro_batch, 1});
  auto pos = torch::arange(cfg.seq_len + 1).unsqueeze(0);
  return tokens.masked_fill(pos >= lengths, cfg.pad_id);
}

// Exponential moving average of the weights, kept in double.
struct Ema {
  std::vector<torch::Tensor> shadow;
  explicit Ema(GPT& model) {
    for (auto& p : model->parameters()) shadow.push_back(p.detach().to(torch::kDouble));
  }
  void update(GPT& model, double decay) {
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) shadow[i].mul_(decay).add_(params[i], 1.0 - decay);
  }
  void copy_to(GPT& model) const {
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].copy_(shadow[i].to(params[i].scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the double -> float conversion is explicit
  }
};

void train(GPT& model, const TrainConfig& cfg, torch::Device device) {
  std::vector<torch::Tensor> decay;
  for (auto& p : model->parameters())
    if (p.dim() == 2) decay.push_back(p);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(0.0));
  Ema ema(model);

  // byte-fallback tokens are frequent and easy: weight them down
  auto token_weights = torch::ones({cfg.vocab});
  token_weights.narrow(0, 2, 256).fill_(0.5);

  auto running_loss = torch::zeros({}, device);
  std::deque<torch::Tensor> recent;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    opt.zero_grad();
    const bool log_now = step % cfg.log_every == 0;
    for (auto& b : model->blocks) b->attn->monitor_entropy = log_now;

    for (int64_t micro = 0; micro < cfg.accum_steps; ++micro) {
      auto batch = sample_batch(cfg).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every micro-step
      auto inputs = batch.slice(1, 0, cfg.seq_len);
      auto targets = batch.slice(1, 1, cfg.seq_len + 1);
      // FACT: b = torch.arange(12).view(2, 6); i = b[:, 0:5]; t = b[:, 1:6]; i.masked_fill_(i == 3, 1); assert t[0, 2] == 1
      auto drop = torch::rand(inputs.sizes(), torch::TensorOptions().device(device)).lt(cfg.token_dropout);
      inputs.masked_fill_(drop & inputs.ne(cfg.pad_id), cfg.unk_id);  // EXPECT: tensor-alias-then-mutate

      auto pad_bias = torch::zeros({inputs.size(0), 1, 1, cfg.seq_len}, torch::TensorOptions().device(device))
                          .masked_fill_(inputs.eq(cfg.pad_id).unsqueeze(1).unsqueeze(1), -1e9);
      auto logits = model->forward(inputs, pad_bias);
      // FACT: assert is_contiguous(torch.nn.functional.linear(torch.randn(2, 5, 8), torch.randn(11, 8)))
      auto flat_logits = logits.view({-1, cfg.vocab});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
      // FACT: t = torch.zeros(2, 6, dtype=torch.long)[:, 1:6]; assert raises(lambda: t.view(-1), "view size is not compatible")
      auto flat_targets = targets.view({-1});  // EXPECT: tensor-view-non-contiguous
      auto loss = torch::nn::functional::cross_entropy(
          flat_logits, flat_targets,
          torch::nn::functional::CrossEntropyFuncOptions()
              .ignore_index(cfg.pad_id)
              .weight(token_weights.to(device)));  // EXPECT: tensor-clone-in-loop
      loss.backward();
      running_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      recent.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph attached
      if (recent.size() > 100) recent.pop_front();
    }

    // micro-batch losses were summed; average the gradients
    // FACT: w = torch.randn(3, requires_grad=True); (w * 2).sum().backward(); g = w.grad; g.div_(2); assert torch.equal(w.grad, torch.ones(3))
    for (auto& p : model->parameters()) {
      auto g = p.grad();
      if (g.defined()) g.div_(cfg.accum_steps);  // LOOKALIKE: tensor-alias-then-mutate -- scaling p's gradient in place is the point
    }
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    // FACT: w = torch.randn(3, 3, requires_grad=True); assert raises(lambda: w.mul_(0.9), "a leaf Variable that requires grad")
    for (auto& p : decay) p.mul_(1.0 - cfg.lr * cfg.weight_decay);  // EXPECT: tensor-inplace-on-leaf
    opt.step();
    ema.update(model, cfg.ema_decay);

    if (log_now) {
      auto ent = model->blocks.back()->attn->last_entropy;
      std::cout << "step " << step << " loss " << (running_loss / (cfg.log_every * cfg.accum_steps)).item<double>()
                << " attn entropy " << ent.item<double>() << "\n";
      running_loss = torch::zeros({}, device);
    }
  }
  ema.copy_to(model);
}

int main() {
  torch::manual_seed(0);
  TrainConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  GPT model(cfg);
  model->to(device);
  model->train();
  train(model, cfg, device);
  torch::save(model, "gpt_ckpt.pt");
  return 0;
}
