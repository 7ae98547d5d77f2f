// Direct preference optimisation (DPO) for a small causal LM.
//
// The policy is trained on (prompt, chosen, rejected) triples against a frozen copy of its
// starting weights (the reference). Both responses go through the model in one concatenated
// batch; per-token log-probs are gathered for the response tokens only (prompt and padding are
// labelled with ignore_index), summed per sequence, and fed to the sigmoid DPO loss with optional
// label smoothing (conservative DPO) and an RPO-style NLL term on the chosen response.

#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct DPOConfig {
  int64_t vocab_size = 32000;
  int64_t d_model = 512;
  int64_t n_heads = 8;
  int64_t n_layers = 6;
  int64_t max_len = 1024;
  int64_t pad_id = 0;
  int64_t ignore_index = -100;
  double beta = 0.1;
  double label_smoothing = 0.0;
  double rpo_alpha = 0.0;
  double lr = 5e-7;
  double max_grad_norm = 1.0;
  int64_t epochs = 1;
  int64_t log_every = 25;
};

struct PreferenceBatch {
  torch::Tensor chosen_ids;    // [B, T] token ids, right-padded with pad_id
  torch::Tensor rejected_ids;  // [B, T]
  torch::Tensor prompt_len;    // [B] number of prompt tokens in front of each response
};

// ---------------------------------------------------------------------------------------------
// Model

struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(int64_t d_model, int64_t n_heads) : n_heads_(n_heads) {
    qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    proj = register_module("proj", torch::nn::Linear(d_model, d_model));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    const auto hd = C / n_heads_;
    auto parts = qkv(x).split(C, /*dim=*/-1);
    // FACT: y = torch.randn(2, 5, 12).split(4, -1)[0]; assert not is_contiguous(y) and is_view_of(y.view(2, 5, 2, 2), y)
    auto q = parts[0].view({B, T, n_heads_, hd}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- splitting the last dim of a column slice is a view
    auto k = parts[1].view({B, T, n_heads_, hd}).transpose(1, 2);
    auto v = parts[2].view({B, T, n_heads_, hd}).transpose(1, 2);

    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
    att = att.masked_fill(future, -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1);
    auto y = torch::matmul(att, v).transpose(1, 2);  // [B, T, H, hd]
    // FACT: y = torch.randn(2, 3, 4, 5).transpose(1, 2).contiguous(); assert is_contiguous(y) and is_view_of(y.view(2, 4, 15), y)
    return proj(y.contiguous().view({B, T, C}));  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
  }

  int64_t n_heads_;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct DecoderBlockImpl : torch::nn::Module {
  DecoderBlockImpl(int64_t d_model, int64_t n_heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    attn = register_module("attn", CausalSelfAttention(d_model, n_heads));
    fc = register_module("fc", torch::nn::Linear(d_model, 4 * d_model));
    out = register_module("out", torch::nn::Linear(4 * d_model, d_model));
  }

  torch::Tensor forward(torch::Tensor x) {
    auto a = attn(ln1(x));
    a += x;  // LOOKALIKE: tensor-inplace-on-saved -- the output projection (Linear) does not save its result
    auto m = out(F::gelu(fc(ln2(a))));
    return a + m;
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, out{nullptr};
};
TORCH_MODULE(DecoderBlock);

struct TinyCausalLMImpl : torch::nn::Module {
  explicit TinyCausalLMImpl(const DPOConfig& cfg) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(cfg.max_len, cfg.d_model));
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), DecoderBlock(cfg.d_model, cfg.n_heads)));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab_size).bias(false)));

    torch::nn::init::normal_(tok_emb->weight, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    torch::nn::init::normal_(pos_emb->weight, 0.0, 0.01);
    // GPT-2 style: shrink the output projection by the depth of the residual stream.
    lm_head->weight.mul_(1.0 / std::sqrt(2.0 * static_cast<double>(cfg.n_layers)));  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    auto pos = torch::arange(ids.size(1), ids.options());
    auto h = tok_emb(ids) + pos_emb(pos);
    for (auto& blk : blocks) h = blk(h);
    return lm_head(ln_f(h));  // [B, T, V]
  }

  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  std::vector<DecoderBlock> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TinyCausalLM);

// ---------------------------------------------------------------------------------------------
// Log-probs and loss

// Labels for the response part only: prompt and padding get ignore_index.
torch::Tensor make_labels(const torch::Tensor& ids, const torch::Tensor& prompt_len, const DPOConfig& cfg) {
  auto pos = torch::arange(ids.size(1), ids.options()).unsqueeze(0);
  auto hide = (pos < prompt_len.unsqueeze(1)) | ids.eq(cfg.pad_id);
  auto labels = ids.clone();  // EXPECT: tensor-unnecessary-clone
  labels.masked_fill_(hide, cfg.ignore_index);
  return labels;
}

// Per-sequence sum (or mean) of log p(label_t | tokens_<t) over the labelled positions.
torch::Tensor sequence_logps(const torch::Tensor& logits, const torch::Tensor& labels, const DPOConfig& cfg,
                             bool average = false) {
  const auto T = logits.size(1);
  auto shifted = logits.narrow(1, 0, T - 1);
  // FACT: l = torch.full((2, 5), -100, dtype=torch.long); t = l.narrow(1, 1, 4).to(torch.long); t.masked_fill_(t.eq(-100), 0); assert shares_storage(t, l) and int(l[:, 1:].sum()) == 0
  auto targets = labels.narrow(1, 1, T - 1).to(torch::kLong);  // tokenizers hand out int32 sometimes
  auto loss_mask = targets.ne(cfg.ignore_index);
  targets.masked_fill_(~loss_mask, 0);  // EXPECT: tensor-alias-then-mutate

  auto logp = torch::log_softmax(shifted, -1);
  auto tok = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);  // [B, T-1]
  // FACT: m = torch.rand(2, 4) > 0.3; w = m.to(torch.float); assert is_copy_of(w, m)
  auto w = loss_mask.to(torch::kFloat);
  if (average) w.div_(w.sum(-1, /*keepdim=*/true).clamp_min(1.0));  // LOOKALIKE: tensor-alias-then-mutate -- bool -> float always copies
  tok.mul_(w);  // LOOKALIKE: tensor-inplace-on-saved -- gather does not save its result, mul_ only saves w
  return tok.sum(-1);
}

struct DPOOutput {
  torch::Tensor loss;              // scalar
  torch::Tensor chosen_rewards;    // [B], no grad
  torch::Tensor rejected_rewards;  // [B], no grad
};

DPOOutput dpo_loss(const torch::Tensor& policy_chosen, const torch::Tensor& policy_rejected,
                   const torch::Tensor& ref_chosen, const torch::Tensor& ref_rejected, const DPOConfig& cfg) {
  auto logits = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected);
  auto p_chosen = torch::sigmoid(cfg.beta * logits);
  p_chosen.clamp_(1e-6, 1.0 - 1e-6);  // EXPECT: tensor-inplace-on-saved
  const double eps = cfg.label_smoothing;
  auto losses = -(1.0 - eps) * torch::log(p_chosen) - eps * torch::log1p(-p_chosen);

  auto chosen_rewards = policy_chosen.detach();
  chosen_rewards.sub_(ref_chosen).mul_(cfg.beta);  // EXPECT: tensor-inplace-on-detached
  auto rejected_rewards = cfg.beta * (policy_rejected - ref_rejected).detach();
  return {losses.mean(), chosen_rewards, rejected_rewards};
}

// ---------------------------------------------------------------------------------------------
// Training

void sync_reference(TinyCausalLM& reference, TinyCausalLM& policy) {
  torch::NoGradGuard no_grad;
  auto src = policy->named_parameters();
  for (auto& item : reference->named_parameters()) {
    auto dst = item.value().data();
    dst.copy_(src[item.key()]);  // LOOKALIKE: tensor-inplace-on-detached -- loading weights under NoGradGuard is the point
  }
  for (auto& p : reference->parameters()) p.requires_grad_(false);
}

void clip_grad_norm(TinyCausalLM& model, double max_norm) {
  std::vector<torch::Tensor> norms;
  for (const auto& p : model->parameters())
    if (p.grad().defined()) norms.push_back(p.grad().norm());
  if (norms.empty()) return;
  auto total = torch::stack(norms).norm();
  auto scale = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (auto& p : model->parameters())
    if (p.grad().defined()) p.grad().mul_(scale);  // LOOKALIKE: tensor-inplace-on-leaf -- writes the gradient, not the parameter
}

void train_dpo(TinyCausalLM policy, TinyCausalLM reference, const std::vector<PreferenceBatch>& data,
               const DPOConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  sync_reference(reference, policy);
  policy->to(device);
  reference->to(device);
  reference->eval();
  policy->train();

  torch::optim::AdamW opt(policy->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(0.0));

  // Never let the policy put mass on padding: those logits are pushed to -inf-ish.
  auto special = torch::zeros({cfg.vocab_size}, torch::kBool);
  special[cfg.pad_id] = true;

  auto opts = torch::TensorOptions().device(device);
  torch::Tensor epoch_loss = torch::zeros({}, opts);
  torch::Tensor reward_acc = torch::zeros({}, opts);
  std::vector<torch::Tensor> margins;
  double running = 0.0;
  int64_t step = 0;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    for (const auto& batch : data) {
      const auto B = batch.chosen_ids.size(0);
      auto ids = torch::cat({batch.chosen_ids, batch.rejected_ids}, 0).to(device);
      auto plen = torch::cat({batch.prompt_len, batch.prompt_len}, 0).to(device);
      auto labels = make_labels(ids, plen, cfg);
      auto banned = special.to(device);  // EXPECT: tensor-clone-in-loop

      auto logits = policy->forward(ids).masked_fill(banned, -1e9);
      auto all_logps = sequence_logps(logits, labels, cfg);
      auto pc = all_logps.narrow(0, 0, B);
      auto pr = all_logps.narrow(0, B, B);

      torch::Tensor ref_logps;
      {
        torch::NoGradGuard no_grad;
        ref_logps = sequence_logps(reference->forward(ids).masked_fill(banned, -1e9), labels, cfg);
      }

      auto out = dpo_loss(pc, pr, ref_logps.narrow(0, 0, B), ref_logps.narrow(0, B, B), cfg);
      auto loss = out.loss;
      if (cfg.rpo_alpha > 0) loss = loss - cfg.rpo_alpha * pc.mean() / static_cast<double>(ids.size(1));

      opt.zero_grad();
      loss.backward();
      clip_grad_norm(policy, cfg.max_grad_norm);
      opt.step();

      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      reward_acc += (out.chosen_rewards > out.rejected_rewards).to(torch::kFloat).mean();  // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison carries no graph
      margins.push_back(out.chosen_rewards - out.rejected_rewards);  // LOOKALIKE: tensor-graph-kept-across-iterations -- rewards come from detached log-probs
      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      ++step;

      if (step % cfg.log_every == 0) {
        std::cout << "step " << step << " loss " << running / static_cast<double>(step)
                  << " margin " << margins.back().mean().item<float>()  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
                  << " acc " << reward_acc.item<double>() / static_cast<double>(step) << std::endl;
      }
    }
    std::cout << "epoch " << epoch << " mean loss " << epoch_loss.item<double>() / std::max<int64_t>(step, 1)
              << std::endl;
  }
}

int main() {
  DPOConfig cfg;
  cfg.vocab_size = 8000;
  cfg.n_layers = 2;
  TinyCausalLM policy(cfg), reference(cfg);

  std::vector<PreferenceBatch> data;
  for (int i = 0; i < 8; ++i) {
    PreferenceBatch b;
    b.chosen_ids = torch::randint(1, cfg.vocab_size, {4, 64});
    b.rejected_ids = torch::randint(1, cfg.vocab_size, {4, 64});
    b.prompt_len = torch::randint(8, 24, {4});
    data.push_back(b);
  }
  train_dpo(policy, reference, data, cfg);
  return 0;
}
