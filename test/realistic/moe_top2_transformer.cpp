// Sparse mixture-of-experts transformer language model (GShard / Switch style):
// top-2 gating with a capacity factor, the auxiliary load-balancing loss, and an
// optional auxiliary-loss-free router bias that is nudged towards uniform load.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;

struct MoEConfig {
  int64_t vocab = 32000, d_model = 512, d_ff = 2048, heads = 8, layers = 4, experts = 8;
  int64_t max_len = 1024, batch = 8, seq_len = 256, log_every = 50;
  double capacity_factor = 1.25, eval_capacity_factor = 2.0;
  double aux_weight = 1e-2, jitter_eps = 1e-2, dropout = 0.1;
  bool bias_balancing = false;
  double bias_rate = 1e-3;
};

struct Routing {
  torch::Tensor combine, aux_loss, index1, index2, entropy;
};

// Fraction of routed tokens per expert, used for logging and bias balancing.
torch::Tensor normalized_load(torch::Tensor counts) {
  // FACT: c=torch.tensor([3.,1.,0.,4.]); assert shares_storage(c.to(torch.float32), c)
  auto load = counts.to(torch::kFloat);
  load.div_(load.sum().clamp_min(1.0));  // EXPECT: tensor-alias-then-mutate
  return load;
}

// Expert assignments in the int32 layout the all-to-all dispatch kernel reads.
torch::Tensor pack_assignments(const Routing& r) {
  auto packed = torch::empty({r.index1.size(0), 2}, r.index1.options().dtype(torch::kInt32));
  packed.select(1, 0).copy_(r.index1);  // EXPECT: tensor-copy-narrowing
  packed.select(1, 1).copy_(r.index2.to(packed.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the int64 -> int32 conversion is spelled out before the copy
  return packed;
}

Routing top2_gating(const torch::Tensor& logits, double capacity_factor,
                    const torch::Tensor& router_bias) {
  const int64_t num_tokens = logits.size(0);
  const int64_t num_experts = logits.size(1);
  const int64_t capacity = std::max<int64_t>(
      4, static_cast<int64_t>(std::ceil(2.0 * num_tokens / num_experts * capacity_factor)));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  auto gates = torch::softmax(logits, /*dim=*/1);

  // Expert choice may be biased towards under-used experts; gate values never are.
  torch::Tensor selection = logits.detach();
  if (router_bias.defined()) {
    // FACT: b=torch.zeros(4).unsqueeze(0).expand(6,4); assert raises(lambda: b.add_(torch.randn(6,4)), "more than one element")
    selection = router_bias.unsqueeze(0).expand_as(logits);
    selection.add_(logits.detach());  // EXPECT: tensor-inplace-on-expanded
  }
  auto index1 = selection.argmax(1);
  auto mask1 = torch::one_hot(index1, num_experts).to(gates.scalar_type());

  auto masked = selection.clone();  // EXPECT: tensor-unnecessary-clone
  masked.masked_fill_(mask1.to(torch::kBool), neg_inf);
  auto index2 = masked.argmax(1);
  auto mask2 = torch::one_hot(index2, num_experts).to(gates.scalar_type());

  // Load-balancing loss: mean gate probability times fraction of first choices.
  auto me = gates.mean(0);
  auto ce = mask1.mean(0);
  auto aux_loss = (me * ce).sum() * static_cast<double>(num_experts);

  auto p = gates.detach();
  auto entropy = -(p * p.clamp_min(1e-9).log()).sum(1).mean();  // LOOKALIKE: tensor-inplace-on-detached -- clamp_min is out of place, gates is never written

  // Position of each token in its expert's buffer; second choices queue behind
  // every first choice.
  auto locations1 = torch::cumsum(mask1, 0).sub_(1);
  auto locations2 = torch::cumsum(mask2, 0).sub_(1);
  // FACT: m=torch.eye(4)[torch.tensor([0,1,1,2,0])]; b=m.sum(0,keepdim=True).expand(5,4); c=torch.cumsum(m,0).sub_(1); c.add_(b); assert c.stride() == (4, 1)
  locations2.add_(mask1.sum(0, /*keepdim=*/true).expand_as(locations2));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read; the destination is a fresh cumsum

  mask1 = mask1 * locations1.lt(capacity);
  mask2 = mask2 * locations2.lt(capacity);
  auto pos1 = (locations1 * mask1).sum(1).to(torch::kLong);
  auto pos2 = (locations2 * mask2).sum(1).to(torch::kLong);

  auto gate1 = (gates * mask1).sum(1);
  auto gate2 = (gates * mask2).sum(1);
  auto denom = (gate1 + gate2).clamp_min(std::numeric_limits<float>::epsilon());
  gate1 = gate1 / denom;
  gate2 = gate2 / denom;

  auto slot1 = torch::one_hot(pos1, capacity).to(gates.scalar_type());
  auto slot2 = torch::one_hot(pos2, capacity).to(gates.scalar_type());
  auto combine = gate1.view({-1, 1, 1}) * mask1.unsqueeze(2) * slot1.unsqueeze(1) +
                 gate2.view({-1, 1, 1}) * mask2.unsqueeze(2) * slot2.unsqueeze(1);
  return {combine, aux_loss, index1, index2, entropy};
}

struct ExpertImpl : torch::nn::Module {
  ExpertImpl(int64_t d_model, int64_t d_ff, double dropout, int64_t num_layers)
      : dropout_p(dropout) {
    fc_in = register_module("fc_in", torch::nn::Linear(d_model, d_ff));
    fc_out = register_module("fc_out", torch::nn::Linear(d_ff, d_model));
    // GPT-2 style scaling of the residual projection.
    fc_out->weight.mul_(1.0 / std::sqrt(2.0 * num_layers));  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::gelu(fc_in(x));
    // FACT: x=torch.randn(3,4,requires_grad=True); h=torch.nn.functional.gelu(x); torch.nn.functional.dropout(h,0.5,True,inplace=True); h.sum().backward(); assert x.grad is not None
    F::dropout(h, F::DropoutFuncOptions().p(dropout_p).training(is_training()).inplace(true));  // LOOKALIKE: tensor-inplace-on-saved -- gelu saves its input, not its output
    return fc_out(h);
  }

  torch::nn::Linear fc_in{nullptr}, fc_out{nullptr};
  double dropout_p;
};
TORCH_MODULE(Expert);

struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(int64_t d_model, int64_t heads, double dropout)
      : heads(heads), head_dim(d_model / heads) {
    qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    out = register_module("out", torch::nn::Linear(d_model, d_model));
    attn_drop = register_module("attn_drop", torch::nn::Dropout(dropout));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& pad) {
    const auto B = x.size(0), S = x.size(1);
    // FACT: y=torch.nn.Linear(8,24)(torch.randn(2,3,8)); assert is_view_of(y.view(2,3,3,2,4), y)
    auto proj = qkv(x).view({B, S, 3, heads, head_dim});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto q = proj.select(2, 0).transpose(1, 2);
    auto k = proj.select(2, 1).transpose(1, 2);
    auto v = proj.select(2, 2).transpose(1, 2);

    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    scores = scores.masked_fill(pad.view({B, 1, 1, S}), -1e4);
    auto attn = torch::softmax(scores, -1);
    // Padded query rows attend to nothing.
    // FACT: s=torch.randn(2,3,3,requires_grad=True); a=torch.softmax(s,-1); a.masked_fill_(torch.tensor([False,True,False]).view(1,3,1), 0.); assert backward_fails(lambda: a.sum().backward())
    attn.masked_fill_(pad.view({B, 1, S, 1}), 0.0);  // EXPECT: tensor-inplace-on-saved
    auto ctx = torch::matmul(attn_drop(attn), v);
    // FACT: c=torch.randn(2,4,3,8); assert is_copy_of(c.transpose(1,2).reshape(2,3,32), c)
    return out(ctx.transpose(1, 2).reshape({B, S, heads * head_dim}));  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t heads, head_dim;
  torch::nn::Linear qkv{nullptr}, out{nullptr};
  torch::nn::Dropout attn_drop{nullptr};
};
TORCH_MODULE(SelfAttention);

struct MoELayerImpl : torch::nn::Module {
  MoELayerImpl(const MoEConfig& cfg) : cfg(cfg) {
    router = register_module(
        "router", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.experts).bias(false)));
    torch::nn::init::normal_(router->weight, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under NoGradGuard
    experts = register_module("experts", torch::nn::ModuleList());
    for (int64_t e = 0; e < cfg.experts; ++e) {
      experts->push_back(Expert(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.layers));
    }
    router_bias = register_buffer("router_bias", torch::zeros({cfg.experts}));
    expert_counts = register_buffer("expert_counts", torch::zeros({cfg.experts}));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    const auto B = x.size(0), S = x.size(1), D = x.size(2);
    // FACT: x=torch.nn.LayerNorm(8)(torch.randn(2,3,8)); assert is_view_of(x.reshape(6,8), x)
    auto tokens = x.reshape({B * S, D});  // LOOKALIKE: tensor-reshape-non-contiguous -- x comes straight out of a LayerNorm, so this is a view
    auto router_in = tokens;
    if (is_training() && cfg.jitter_eps > 0) {
      auto noise = torch::empty({B * S, D}).uniform_(1.0 - cfg.jitter_eps, 1.0 + cfg.jitter_eps);
      router_in = tokens * noise;  // EXPECT: tensor-device-mismatch
    }
    auto logits = router(router_in);
    const double cf = is_training() ? cfg.capacity_factor : cfg.eval_capacity_factor;
    auto r = top2_gating(logits, cf, cfg.bias_balancing ? router_bias : torch::Tensor());

    auto dispatch = r.combine.gt(0).to(tokens.scalar_type());
    auto expert_in = torch::einsum("tec,td->ecd", {dispatch, tokens});
    std::vector<torch::Tensor> outs;
    outs.reserve(experts->size());
    for (size_t e = 0; e < experts->size(); ++e) {
      outs.push_back(experts->at<ExpertImpl>(e).forward(expert_in[e]));
    }
    auto y = torch::einsum("tec,ecd->td", {r.combine, torch::stack(outs, 0)});

    if (is_training()) {
      torch::NoGradGuard no_grad;
      expert_counts.add_(dispatch.sum(2).sum(0));
      if (record_routing) routing_trace.push_back(pack_assignments(r));
    }
    last_entropy = r.entropy;
    return {y.reshape({B, S, D}), r.aux_loss};
  }

  MoEConfig cfg;
  torch::nn::Linear router{nullptr};
  torch::nn::ModuleList experts{nullptr};
  torch::Tensor router_bias, expert_counts, last_entropy;
  bool record_routing = false;
  std::vector<torch::Tensor> routing_trace;
};
TORCH_MODULE(MoELayer);

struct MoEBlockImpl : torch::nn::Module {
  MoEBlockImpl(const MoEConfig& cfg) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    attn = register_module("attn", SelfAttention(cfg.d_model, cfg.heads, cfg.dropout));
    moe = register_module("moe", MoELayer(cfg));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& pad) {
    auto h = x + attn(ln1(x), pad);
    auto [y, aux] = moe(ln2(h));
    return {h + y, aux};
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  SelfAttention attn{nullptr};
  MoELayer moe{nullptr};
};
TORCH_MODULE(MoEBlock);

struct MoELMImpl : torch::nn::Module {
  MoELMImpl(const MoEConfig& cfg) {
    embed = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    for (int64_t i = 0; i < cfg.layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), MoEBlock(cfg)));
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& ids, const torch::Tensor& pos,
                                                  const torch::Tensor& pad) {
    auto h = embed(ids) + pos;
    torch::Tensor aux = torch::zeros({}, h.options());
    for (auto& block : blocks) {
      auto [out, layer_aux] = block(h, pad);
      h = out;
      aux = aux + layer_aux;
    }
    return {head(ln_f(h)), aux / static_cast<double>(blocks.size())};
  }

  torch::nn::Embedding embed{nullptr};
  std::vector<MoEBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(MoELM);

torch::Tensor sinusoidal_table(int64_t max_len, int64_t dim) {
  auto pos = torch::arange(max_len, torch::kFloat).unsqueeze(1);
  auto freq = torch::exp(torch::arange(0, dim, 2, torch::kFloat) * (-std::log(10000.0) / dim));
  auto table = torch::zeros({max_len, dim});
  table.slice(1, 0, dim, 2).copy_(torch::sin(pos * freq));
  table.slice(1, 1, dim, 2).copy_(torch::cos(pos * freq));
  return table;
}

void update_router_bias(MoELayerImpl& moe, double rate) {
  torch::NoGradGuard no_grad;
  auto load = normalized_load(moe.expert_counts);
  const double target = 1.0 / static_cast<double>(load.numel());
  moe.router_bias.add_((target - load).sign(), rate);
}

void train(const MoEConfig& cfg, int64_t steps) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  MoELM model(cfg);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4).weight_decay(0.01));
  auto pos_table = sinusoidal_table(cfg.max_len, cfg.d_model);
  double running_loss = 0.0;
  auto aux_sum = torch::zeros({}, torch::TensorOptions().device(device));
  model->train();
  for (int64_t step = 1; step <= steps; ++step) {
    auto batch = torch::randint(1, cfg.vocab, {cfg.batch, cfg.seq_len + 1}, torch::kLong);
    auto lengths = torch::randint(cfg.seq_len / 2, cfg.seq_len + 1, {cfg.batch, 1}, torch::kLong);
    auto ids = batch.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch arrives every step
    auto inputs = ids.narrow(1, 0, cfg.seq_len);
    auto targets = ids.narrow(1, 1, cfg.seq_len);
    auto pad = torch::arange(cfg.seq_len, ids.options()).unsqueeze(0) >= lengths.to(device);
    targets = targets.masked_fill(pad, -100);
    auto pos = pos_table.narrow(0, 0, cfg.seq_len).to(device);  // EXPECT: tensor-clone-in-loop
    auto [logits, aux] = model(inputs, pos, pad);
    auto ce = F::cross_entropy(logits.transpose(1, 2), targets,
                               F::CrossEntropyFuncOptions().ignore_index(-100));
    auto loss = ce + cfg.aux_weight * aux;
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    running_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop
    aux_sum += aux.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, and summed on the device
    if (step % cfg.log_every == 0) {
      auto mean_aux = (aux_sum / cfg.log_every).item<double>();  // LOOKALIKE: tensor-sync-in-loop -- read once per logging interval, not every step
      std::cout << "step " << step << " loss " << running_loss / cfg.log_every << " aux "
                << mean_aux << std::endl;
      running_loss = 0.0;
      aux_sum.zero_();
      if (cfg.bias_balancing) {
        for (auto& block : model->blocks) update_router_bias(*block->moe, cfg.bias_rate);
      }
    }
  }
}

int main() {
  MoEConfig cfg;
  cfg.layers = 2;
  cfg.seq_len = 128;
  train(cfg, 200);
}
