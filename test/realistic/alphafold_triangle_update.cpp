// Evoformer pair-stack blocks (AlphaFold 2 supplement, Algorithms 11-15) with
// the recycling loop around them. Pair tensors are [B, N, N, C] throughout;
// pair masks are [B, N, N] with 1 for pairs of real residues.

#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct PairConfig {
  int64_t c_z = 128;
  int64_t c_hidden_mul = 128;
  int64_t c_hidden_att = 32;
  int64_t n_heads = 4;
  int64_t transition_factor = 4;
  int64_t n_dist_bins = 64;
  double dropout = 0.25;
  double inf = 1e9;
};

// Dropout whose mask is shared along `shared_dim` (suppl. 1.11.6): rows for the
// starting-node updates, columns for the ending-node ones.
torch::Tensor shared_dropout(const torch::Tensor& x, double p, int64_t shared_dim, bool training) {
  if (!training || p == 0.0) return x;
  auto shape = x.sizes().vec();
  shape[shared_dim] = 1;
  auto keep = torch::empty(shape, x.options()).bernoulli_(1.0 - p);
  return x * keep / (1.0 - p);
}

// Algorithms 11 (outgoing edges) and 12 (incoming edges).
class TriangleMultiplicationImpl : public nn::Module {
 public:
  TriangleMultiplicationImpl(const PairConfig& cfg, bool outgoing)
      : outgoing_(outgoing),
        c_(cfg.c_hidden_mul),
        ln_in(nn::LayerNormOptions({cfg.c_z})),
        ln_out(nn::LayerNormOptions({cfg.c_hidden_mul})),
        proj_a(cfg.c_z, cfg.c_hidden_mul),
        gate_a(cfg.c_z, cfg.c_hidden_mul),
        proj_b(cfg.c_z, cfg.c_hidden_mul),
        gate_b(cfg.c_z, cfg.c_hidden_mul),
        gate_out(cfg.c_z, cfg.c_z),
        proj_out(cfg.c_hidden_mul, cfg.c_z) {
    register_module("ln_in", ln_in);
    register_module("ln_out", ln_out);
    register_module("proj_a", proj_a);
    register_module("gate_a", gate_a);
    register_module("proj_b", proj_b);
    register_module("gate_b", gate_b);
    register_module("gate_out", gate_out);
    register_module("proj_out", proj_out);
    // "gating" and "final" init: gates start open, the update starts at zero.
    nn::init::zeros_(gate_out->weight);
    gate_out->bias.fill_(1.0);  // EXPECT: tensor-inplace-on-leaf
    nn::init::zeros_(proj_out->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& z, const torch::Tensor& pair_mask) {
    const int64_t B = z.size(0);
    const int64_t N = z.size(1);
    auto zn = ln_in(z);
    auto m = pair_mask.unsqueeze(-1);
    auto a = torch::sigmoid(gate_a(zn)) * proj_a(zn) * m;  // [B, N, N, c]
    auto b = torch::sigmoid(gate_b(zn)) * proj_b(zn) * m;
    torch::Tensor x;
    if (outgoing_) {
      // x_ij = sum_k a_ik * b_jk
      x = torch::einsum("bikc,bjkc->bijc", {a, b});
    } else {
      // x_ij = sum_k a_ki * b_kj, as one bmm over the (batch, channel) pairs
      // FACT: a = torch.randn(2, 5, 5, 3); assert raises(lambda: a.permute(0, 3, 1, 2).view(6, 5, 5), "view size is not compatible")
      auto a_bc = a.permute({0, 3, 2, 1}).contiguous().view({B * c_, N, N});
      auto b_bc = b.permute({0, 3, 1, 2}).view({B * c_, N, N});  // EXPECT: tensor-view-non-contiguous
      // FACT: p = torch.bmm(torch.randn(6, 5, 5), torch.randn(6, 5, 5)); assert is_view_of(p.view(2, 3, 5, 5), p)
      x = torch::bmm(a_bc, b_bc).view({B, c_, N, N}).permute({0, 2, 3, 1});  // LOOKALIKE: tensor-view-non-contiguous -- bmm returns a contiguous [B*c, N, N]
    }
    auto g = torch::sigmoid(gate_out(zn));
    g.mul_(m);  // EXPECT: tensor-inplace-on-saved
    return proj_out(ln_out(x)) * g;
  }

 private:
  bool outgoing_;
  int64_t c_;
  nn::LayerNorm ln_in{nullptr}, ln_out{nullptr};
  nn::Linear proj_a{nullptr}, gate_a{nullptr}, proj_b{nullptr}, gate_b{nullptr};
  nn::Linear gate_out{nullptr}, proj_out{nullptr};
};
TORCH_MODULE(TriangleMultiplication);

// Algorithms 13 (around the starting node) and 14 (around the ending node).
class TriangleAttentionImpl : public nn::Module {
 public:
  TriangleAttentionImpl(const PairConfig& cfg, bool starting)
      : starting_(starting),
        H_(cfg.n_heads),
        D_(cfg.c_hidden_att),
        inf_(cfg.inf),
        ln(nn::LayerNormOptions({cfg.c_z})),
        q_proj(nn::LinearOptions(cfg.c_z, cfg.n_heads * cfg.c_hidden_att).bias(false)),
        k_proj(nn::LinearOptions(cfg.c_z, cfg.n_heads * cfg.c_hidden_att).bias(false)),
        v_proj(nn::LinearOptions(cfg.c_z, cfg.n_heads * cfg.c_hidden_att).bias(false)),
        bias_proj(nn::LinearOptions(cfg.c_z, cfg.n_heads).bias(false)),
        gate_proj(cfg.c_z, cfg.n_heads * cfg.c_hidden_att),
        out_proj(cfg.n_heads * cfg.c_hidden_att, cfg.c_z) {
    register_module("ln", ln);
    register_module("q_proj", q_proj);
    register_module("k_proj", k_proj);
    register_module("v_proj", v_proj);
    register_module("bias_proj", bias_proj);
    register_module("gate_proj", gate_proj);
    register_module("out_proj", out_proj);
    torch::NoGradGuard no_grad;
    gate_proj->weight.zero_();
    gate_proj->bias.fill_(1.0);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    out_proj->weight.zero_();
  }

  torch::Tensor forward(const torch::Tensor& z_in, const torch::Tensor& mask_in) {
    // The ending-node variant is the starting-node one on the transposed pair.
    auto z = starting_ ? z_in : z_in.transpose(1, 2);
    auto pair_mask = starting_ ? mask_in : mask_in.transpose(1, 2);
    const int64_t B = z.size(0);
    const int64_t N = z.size(1);
    auto zn = ln(z);
    // FACT: z = torch.randn(2, 5, 5, 8).transpose(1, 2); q = torch.nn.Linear(8, 6)(torch.nn.LayerNorm(8)(z)); assert is_view_of(q.view(2, 5, 5, 2, 3), q)
    auto q = q_proj(zn).view({B, N, N, H_, D_}).permute({0, 1, 3, 2, 4});  // LOOKALIKE: tensor-view-non-contiguous -- LayerNorm + Linear give a contiguous result even for the transposed pair
    auto k = k_proj(zn).view({B, N, N, H_, D_}).permute({0, 1, 3, 2, 4});
    auto v = v_proj(zn).view({B, N, N, H_, D_}).permute({0, 1, 3, 2, 4});  // [B, I, H, J, D]

    // FACT: m = torch.ones(2, 5, 5).transpose(1, 2); assert is_view_of(m.view(2, 5, 1, 1, 5), m)
    auto mask_bias = (pair_mask.view({B, N, 1, 1, N}) - 1.0) * inf_;  // LOOKALIKE: tensor-view-non-contiguous -- only inserts size-1 dims, which any strides allow
    // FACT: t = torch.randn(2, 4, 5, 5).unsqueeze(1); e = t.expand(-1, 5, -1, -1, -1); assert raises(lambda: e.add_(torch.randn(2, 5, 1, 1, 5)), "more than one element")
    auto tri_bias = bias_proj(zn).permute({0, 3, 1, 2}).unsqueeze(1);  // [B, 1, H, J, K]
    auto bias = tri_bias.expand({-1, N, -1, -1, -1});                   // shared by every row i
    bias.add_(mask_bias);  // EXPECT: tensor-inplace-on-expanded

    auto logits = torch::matmul(q, k.transpose(-1, -2));  // [B, I, H, J, K]
    logits.mul_(1.0 / std::sqrt(static_cast<double>(D_)));  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves q and k, not its result
    // FACT: l = torch.randn(2, 5, 4, 5, 5); e = torch.randn(2, 1, 4, 5, 5).expand(-1, 5, -1, -1, -1); l += e; assert e.stride(1) == 0
    logits += bias;  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded bias is only read
    auto attn = torch::softmax(logits, -1);
    auto o = torch::matmul(attn, v);  // [B, I, H, J, D]
    // FACT: o = torch.randn(2, 5, 3, 5, 4); assert is_copy_of(o.permute(0, 1, 3, 2, 4).reshape(2, 5, 5, 12), o)
    auto merged = o.permute({0, 1, 3, 2, 4}).reshape({B, N, N, H_ * D_});  // EXPECT: tensor-reshape-non-contiguous
    auto out = out_proj(torch::sigmoid(gate_proj(zn)) * merged);
    return starting_ ? out : out.transpose(1, 2);
  }

 private:
  bool starting_;
  int64_t H_, D_;
  double inf_;
  nn::LayerNorm ln{nullptr};
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, bias_proj{nullptr};
  nn::Linear gate_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(TriangleAttention);

// Algorithm 15.
struct PairTransitionImpl : nn::Module {
  PairTransitionImpl(int64_t c_z, int64_t factor)
      : ln(nn::LayerNormOptions({c_z})), up(c_z, factor * c_z), down(factor * c_z, c_z) {
    register_module("ln", ln);
    register_module("up", up);
    register_module("down", down);
  }
  torch::Tensor forward(const torch::Tensor& z, const torch::Tensor& pair_mask) {
    return down(torch::relu(up(ln(z)))) * pair_mask.unsqueeze(-1);
  }
  nn::LayerNorm ln{nullptr};
  nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(PairTransition);

class PairStackBlockImpl : public nn::Module {
 public:
  explicit PairStackBlockImpl(const PairConfig& cfg)
      : tri_mul_out(cfg, true),
        tri_mul_in(cfg, false),
        tri_att_start(cfg, true),
        tri_att_end(cfg, false),
        transition(cfg.c_z, cfg.transition_factor),
        p_(cfg.dropout) {
    register_module("tri_mul_out", tri_mul_out);
    register_module("tri_mul_in", tri_mul_in);
    register_module("tri_att_start", tri_att_start);
    register_module("tri_att_end", tri_att_end);
    register_module("transition", transition);
  }

  torch::Tensor forward(const torch::Tensor& pair, const torch::Tensor& pair_mask) {
    const bool train = is_training();
    torch::Tensor z = pair;
    // FACT: p = torch.randn(2, 3, 3, 4); z = p; z = z + 1.0; assert is_copy_of(z, p)
    z = z + shared_dropout(tri_mul_out(z, pair_mask), p_, 1, train);  // LOOKALIKE: tensor-alias-then-mutate -- rebinds 'z' to a new sum, 'pair' is never written
    z = z + shared_dropout(tri_mul_in(z, pair_mask), p_, 1, train);
    z = z + shared_dropout(tri_att_start(z, pair_mask), p_, 1, train);
    z = z + shared_dropout(tri_att_end(z, pair_mask), p_, 2, train);
    return z + transition(z, pair_mask);
  }

 private:
  TriangleMultiplication tri_mul_out{nullptr}, tri_mul_in{nullptr};
  TriangleAttention tri_att_start{nullptr}, tri_att_end{nullptr};
  PairTransition transition{nullptr};
  double p_;
};
TORCH_MODULE(PairStackBlock);

struct DistogramHeadImpl : nn::Module {
  DistogramHeadImpl(int64_t c_z, int64_t n_bins) : proj(c_z, n_bins) { register_module("proj", proj); }
  // Distances are symmetric, so are the logits.
  torch::Tensor forward(const torch::Tensor& z) {
    auto logits = proj(z);  // [B, N, N, bins]
    // FACT: l = torch.randn(2, 5, 5, 3); assert raises(lambda: l.add_(l.transpose(1, 2)), "some elements")
    logits.add_(logits.transpose(1, 2));  // EXPECT: tensor-inplace-overlap
    return logits;
  }
  nn::Linear proj{nullptr};
};
TORCH_MODULE(DistogramHead);

// Algorithm 32 (pair part): the previous cycle's pair representation, normalised.
struct RecyclingEmbedderImpl : nn::Module {
  explicit RecyclingEmbedderImpl(int64_t c_z) : ln(nn::LayerNormOptions({c_z})) { register_module("ln", ln); }
  torch::Tensor forward(const torch::Tensor& z_prev) { return ln(z_prev); }
  nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(RecyclingEmbedder);

torch::Tensor add_recycled(const torch::Tensor& z_init, const torch::Tensor& z_prev, RecyclingEmbedder& rec) {
  torch::Tensor z = z_init;
  // FACT: a = torch.zeros(2, 3, 3, 4); z = a; z += torch.ones(2, 3, 3, 4); assert shares_storage(z, a) and a.sum() == 72
  z += rec->forward(z_prev);  // EXPECT: tensor-alias-then-mutate
  return z;
}

// Per-channel mean / std of the pair representation over valid pairs (training logs).
std::pair<torch::Tensor, torch::Tensor> pair_channel_stats(const torch::Tensor& z, const torch::Tensor& pair_mask) {
  torch::NoGradGuard no_grad;
  // FACT: z = torch.randn(2, 5, 5, 3); assert is_view_of(z.permute(0, 3, 1, 2).flatten(2), z)
  auto per_channel = z.permute({0, 3, 1, 2}).flatten(2);  // LOOKALIKE: tensor-reshape-non-contiguous -- the two residue dims stay adjacent and in order: a view
  auto w = pair_mask.flatten(1).unsqueeze(1);              // [B, 1, N*N]
  auto count = w.sum(-1).clamp_min(1.0);
  auto mean = (per_channel * w).sum(-1) / count;
  auto var = ((per_channel - mean.unsqueeze(-1)).pow(2) * w).sum(-1) / count;
  return {mean, var.sqrt()};
}

// Runs the pair stack n_cycles times, feeding each cycle's output back in.
// Only the last cycle is differentiated (suppl. 1.10).
torch::Tensor run_recycling(std::vector<PairStackBlock>& blocks, RecyclingEmbedder& rec, DistogramHead& head,
                            const torch::Tensor& z_init, const torch::Tensor& pair_mask, int64_t n_cycles) {
  auto z_masked = z_init.clone();  // EXPECT: tensor-unnecessary-clone
  z_masked.mul_(pair_mask.unsqueeze(-1));
  auto z_prev = torch::zeros_like(z_masked);
  torch::Tensor logits;
  for (int64_t cycle = 0; cycle < n_cycles; ++cycle) {
    const bool last = cycle + 1 == n_cycles;
    torch::AutoGradMode grad_mode(last && blocks.front()->is_training());
    auto z = add_recycled(z_masked, z_prev, rec);
    for (auto& blk : blocks) z = blk->forward(z, pair_mask);
    z_prev = z.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, and one handle overwritten per cycle
    if (last) {
      logits = head->forward(z);
      auto stats = pair_channel_stats(z, pair_mask);
      std::cout << "pair channel std (mean over channels): " << stats.second.mean().item<float>() << '\n';
    }
  }
  return logits;
}

// Distogram loss over valid pairs; dist_bins holds each pair's bin index (int64).
double train_step(std::vector<PairStackBlock>& blocks, RecyclingEmbedder& rec, DistogramHead& head,
                  torch::optim::Optimizer& opt, const torch::Tensor& z_init, const torch::Tensor& pair_mask,
                  const torch::Tensor& dist_bins, int64_t n_cycles) {
  auto logits = run_recycling(blocks, rec, head, z_init, pair_mask, n_cycles);
  auto nll = F::cross_entropy(logits.flatten(0, 2), dist_bins.flatten(),
                              F::CrossEntropyFuncOptions().reduction(torch::kNone));
  auto mask = pair_mask.flatten();
  auto loss = (nll * mask).sum() / mask.sum().clamp_min(1.0);
  opt.zero_grad();
  loss.backward();
  opt.step();
  return loss.item<double>();
}
