// Mixture-of-Depths block: a learned router picks the top-k tokens of every sequence to run
// through attention + MLP; all other tokens skip the block on the residual stream.
// The router also gets an auxiliary BCE loss so that at inference a causal predictor can
// decide per token without looking at the whole sequence.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct MoDConfig {
  int64_t d_model = 512;
  int64_t n_heads = 8;
  int64_t d_ff = 2048;
  int64_t n_layers = 12;        // depth of the full model, for the init scale
  double capacity = 0.125;      // fraction of tokens routed through the block
  double router_noise = 0.0;    // exploration noise on router logits while training
  double gate_scale = 1.0;
  double aux_weight = 0.01;
  double lr = 3e-4;
  int64_t epochs = 4;
  int64_t log_every = 50;
};

struct MoDOutput {
  torch::Tensor hidden;    // [B, T, C] residual stream after the block
  torch::Tensor aux_loss;  // scalar router loss
  torch::Tensor routed;    // [B, k] indices of the tokens that went through the block
};

struct TokenBatch {
  torch::Tensor x;  // [B, T, C] embeddings
  torch::Tensor y;  // [B, T, C] regression targets (distillation from a dense teacher)
};

// Centre the router logits of each sequence so top-k is not driven by a global offset.
torch::Tensor center_logits(const torch::Tensor& logits) {
  torch::Tensor s = logits;
  // FACT: a = torch.randn(2, 6); s = a; s -= a.mean(-1, keepdim=True); assert shares_storage(s, a) and abs(a.mean().item()) < 1e-5
  s -= logits.mean(-1, /*keepdim=*/true);  // EXPECT: tensor-alias-then-mutate
  return s;
}

class MoDBlockImpl : public nn::Module {
 public:
  explicit MoDBlockImpl(const MoDConfig& cfg)
      : cfg_(cfg),
        router(register_module("router", nn::Linear(cfg.d_model, 1))),
        ln1(register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})))),
        ln2(register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({cfg.d_model})))),
        qkv(register_module("qkv", nn::Linear(cfg.d_model, 3 * cfg.d_model))),
        proj(register_module("proj", nn::Linear(cfg.d_model, cfg.d_model))),
        fc1(register_module("fc1", nn::Linear(cfg.d_model, cfg.d_ff))),
        fc2(register_module("fc2", nn::Linear(cfg.d_ff, cfg.d_model))) {
    TORCH_CHECK(cfg.d_model % cfg.n_heads == 0, "d_model must be divisible by n_heads");
    // start with a neutral router: every token equally likely to be picked
    router->bias.zero_();  // EXPECT: tensor-inplace-on-leaf
    {
      torch::NoGradGuard no_grad;
      router->weight.normal_(0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- inside a NoGradGuard block
      proj->weight.mul_(1.0 / std::sqrt(2.0 * cfg.n_layers));
      fc2->weight.mul_(1.0 / std::sqrt(2.0 * cfg.n_layers));
    }
  }

  MoDOutput forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(T * cfg_.capacity));

    auto logits = router(x).squeeze(-1);  // [B, T]
    auto centered = center_logits(logits);

    torch::Tensor scores = centered;
    if (is_training() && cfg_.router_noise > 0) {
      scores = scores + cfg_.router_noise * torch::randn_like(scores);
      // FACT: a = torch.randn(2, 6); s = a; s = s + 0.1 * torch.randn_like(s); s.clamp_(-10, 10); assert is_copy_of(s, a)
      scores.clamp_(-10.0, 10.0);  // LOOKALIKE: tensor-alias-then-mutate -- scores was rebound to a fresh sum before the write
    }

    // top-k tokens, then back into sequence order so the causal mask stays meaningful
    auto top_idx = std::get<1>(scores.topk(k, /*dim=*/1));
    auto idx = std::get<0>(top_idx.sort(/*dim=*/1));  // [B, k]
    auto w = logits.gather(1, idx);                   // router logits of the picked tokens

    // FACT: i = torch.randint(0, 6, (2, 3)); e = i.unsqueeze(-1).expand(2, 3, 4); x = torch.randn(2, 6, 4); assert x.gather(1, e).shape == (2, 3, 4) and e.stride(2) == 0
    auto idx_exp = idx.unsqueeze(-1).expand({B, k, C});  // LOOKALIKE: tensor-inplace-on-expanded -- only read by gather/scatter_add, never written
    auto sel = x.gather(1, idx_exp);                      // [B, k, C]

    auto h = attend(ln1(sel));
    h.mul_(residual_scale_);  // LOOKALIKE: tensor-inplace-on-saved -- proj is a Linear, which does not save its output
    auto delta = h + mlp(ln2(sel + h));

    // the router weight multiplies the update so the router receives gradient
    auto gate = torch::sigmoid(w);
    gate.mul_(cfg_.gate_scale);  // EXPECT: tensor-inplace-on-saved
    auto update = delta * gate.unsqueeze(-1);
    auto out = x.scatter_add(1, idx_exp, update);

    // auxiliary target: 1 for tokens the top-k picked, 0 for the rest
    auto picked = torch::zeros_like(logits).scatter_(1, idx, 1.0);
    auto aux = F::binary_cross_entropy_with_logits(logits, picked);
    return {out, aux, idx};
  }

  double residual_scale_ = 1.0;

 private:
  torch::Tensor attend(const torch::Tensor& h) {
    const int64_t B = h.size(0), L = h.size(1), C = h.size(2);
    const int64_t H = cfg_.n_heads, D = C / H;
    auto parts = qkv(h).chunk(3, /*dim=*/-1);
    // FACT: qkv = torch.randn(2, 5, 24); q = qkv.chunk(3, -1)[0]; assert not is_contiguous(q) and is_view_of(q.view(2, 5, 2, 4), qkv)
    auto q = parts[0].view({B, L, H, D}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- a chunk of the last dim, splitting that dim is a view
    auto kk = parts[1].view({B, L, H, D}).transpose(1, 2);
    auto v = parts[2].view({B, L, H, D}).transpose(1, 2);

    auto att = torch::matmul(q, kk.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
    auto causal = torch::ones({L, L}, h.options().dtype(torch::kBool)).tril();
    att = att.masked_fill(causal.logical_not(), -1e9);
    auto y = torch::matmul(F::softmax(att, F::SoftmaxFuncOptions(-1)), v);  // [B, H, L, D]
    // FACT: y = torch.randn(2, 4, 5, 3); assert is_copy_of(y.transpose(1, 2).reshape(2, 5, 12), y)
    return proj(y.transpose(1, 2).reshape({B, L, C}));  // EXPECT: tensor-reshape-non-contiguous
  }

  torch::Tensor mlp(const torch::Tensor& h) { return fc2(F::gelu(fc1(h))); }

  MoDConfig cfg_;

 public:
  nn::Linear router;
  nn::LayerNorm ln1, ln2;
  nn::Linear qkv, proj, fc1, fc2;
};
TORCH_MODULE(MoDBlock);

// How far one optimizer step moves the router: a cheap proxy for routing churn.
double router_step_size(MoDBlock& block, torch::optim::Optimizer& opt) {
  auto before = block->router->weight.detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- a snapshot: opt.step() below changes the weight
  opt.step();
  torch::NoGradGuard no_grad;
  return (block->router->weight - before).norm().item<double>();
}

// Fraction of positions of each sequence that the block touched, for the capacity plot.
torch::Tensor routing_histogram(const torch::Tensor& routed, int64_t T) {
  auto counts = torch::zeros({T}, torch::kLong);
  counts.index_add_(0, routed.flatten(), torch::ones({routed.numel()}, torch::kLong));
  return counts.to(torch::kFloat) / routed.size(0);
}

void train_mod(MoDBlock block, nn::Linear head, const std::vector<TokenBatch>& data,
               const MoDConfig& cfg) {
  torch::Device device(torch::kCUDA);
  block->to(device);
  head->to(device);
  block->train();

  std::vector<torch::Tensor> params = block->parameters();
  for (const auto& p : head->parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(cfg.lr).weight_decay(0.1));

  std::vector<torch::Tensor> loss_history;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    torch::Tensor epoch_aux = torch::zeros({}, torch::TensorOptions().device(device));
    double running = 0.0;
    for (const auto& batch : data) {
      auto x = batch.x.to(device);
      auto y = batch.y.to(device);
      const int64_t T = x.size(1);

      auto out = block->forward(x);
      auto pred = head(out.hidden);
      // later positions have more context: weight their error less
      auto pos_w = torch::linspace(1.0, 0.5, T);
      auto per_tok = F::mse_loss(pred, y, F::MSELossFuncOptions().reduction(torch::kNone)).mean(-1);
      auto task = (per_tok * pos_w).mean();  // EXPECT: tensor-device-mismatch
      auto loss = task + cfg.aux_weight * out.aux_loss;

      opt.zero_grad();
      loss.backward();
      ++step;
      if (step % cfg.log_every == 0) {
        const double drift = router_step_size(block, opt);
        std::cout << "step " << step << " loss " << loss.item<float>()  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
                  << " router drift " << drift << std::endl;
        auto hist = routing_histogram(out.routed.cpu(), T);
        std::cout << "  routed share of last position: " << hist[T - 1].item<float>() << std::endl;
      } else {
        opt.step();
      }

      epoch_aux += out.aux_loss;  // EXPECT: tensor-graph-kept-across-iterations
      loss_history.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph kept
      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
    }
    std::cout << "epoch " << epoch << " mean loss " << running / data.size() << " mean aux "
              << epoch_aux.item<double>() / data.size() << std::endl;
  }
}
