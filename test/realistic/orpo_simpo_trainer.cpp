// Reference-free preference optimisation for a small causal LM.
// Supports ORPO (NLL on chosen + odds-ratio term) and SimPO (length-normalised
// reward margin with a target gap). Chosen rows come first in every batch,
// rejected rows after them, right-padded to the longest sequence.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace pref {

enum class Objective { kORPO, kSimPO };

struct TrainConfig {
  int64_t vocab = 8192;
  int64_t d_model = 384;
  int64_t n_heads = 6;
  int64_t n_layers = 4;
  int64_t max_len = 256;
  int64_t pairs_per_batch = 8;
  int64_t steps = 2000;
  int64_t log_every = 50;
  double lr = 8e-6;
  double weight_decay = 0.0;
  double orpo_lambda = 0.1;
  double simpo_beta = 2.0;
  double simpo_gamma = 0.5;
  Objective objective = Objective::kSimPO;
  int64_t pad_id = 0;
};

struct PairBatch {
  torch::Tensor ids;
  torch::Tensor attn_mask;
  torch::Tensor prompt_len;
  int64_t n_pairs = 0;
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(int64_t d_model, int64_t n_heads)
      : n_heads_(n_heads), head_dim_(d_model / n_heads) {
    qkv_ = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    proj_ = register_module("proj", torch::nn::Linear(d_model, d_model));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& causal) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto qkv = qkv_(x).view({B, T, 3, n_heads_, head_dim_}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    att = att.masked_fill(causal.narrow(0, 0, T).narrow(1, 0, T), -1e9);
    att = torch::softmax(att, -1);
    auto y = torch::matmul(att, v);
    // FACT: assert raises(lambda: torch.randn(2,3,5,4).transpose(1,2).view(2,5,12), "view size is not compatible")
    y = y.transpose(1, 2).view({B, T, C});  // EXPECT: tensor-view-non-contiguous
    return proj_(y);
  }

  int64_t n_heads_, head_dim_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d_model, int64_t n_heads) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    attn_ = register_module("attn", CausalSelfAttention(d_model, n_heads));
    fc_ = register_module("fc", torch::nn::Linear(d_model, 4 * d_model));
    out_ = register_module("out", torch::nn::Linear(4 * d_model, d_model));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& causal) {
    x = x + attn_(ln1_(x), causal);
    return x + out_(torch::gelu(fc_(ln2_(x))));
  }

  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  torch::nn::Linear fc_{nullptr}, out_{nullptr};
};
TORCH_MODULE(Block);

struct TinyLMImpl : torch::nn::Module {
  explicit TinyLMImpl(const TrainConfig& cfg) {
    tok_ = register_module("tok", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    pos_ = register_parameter("pos", torch::zeros({cfg.max_len, cfg.d_model}));
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      blocks_.push_back(register_module("block" + std::to_string(i), Block(cfg.d_model, cfg.n_heads)));
    }
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    head_ = register_module("head",
                            torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));
    causal_ = register_buffer("causal", torch::ones({cfg.max_len, cfg.max_len}, torch::kBool).triu(1));
    reset_parameters();
  }

  void reset_parameters() {
    pos_.normal_(0.0, 0.02);  // EXPECT: tensor-inplace-on-leaf
    torch::nn::init::normal_(head_->weight, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs the fill under a NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& ids) {
    const auto T = ids.size(1);
    auto h = tok_(ids) + pos_.narrow(0, 0, T);
    for (auto& blk : blocks_) {
      h = blk(h, causal_.to(h.device()));  // LOOKALIKE: tensor-clone-in-loop -- causal_ is a registered buffer that model->to(device) already moved, so to() hands it back as is
    }
    return head_(ln_f_(h));
  }

  torch::nn::Embedding tok_{nullptr};
  torch::Tensor pos_;
  std::vector<Block> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::Tensor causal_;
};
TORCH_MODULE(TinyLM);

// Synthetic pairs: a shared prompt with two different continuations.
class PairCollator {
 public:
  PairCollator(const TrainConfig& cfg, torch::Device device) : cfg_(cfg), device_(device), rng_(1234) {
    staging_ = torch::full({2 * cfg.pairs_per_batch, cfg.max_len}, cfg.pad_id, torch::kInt32);
  }

  PairBatch next() {
    staging_.fill_(cfg_.pad_id);
    std::uniform_int_distribution<int64_t> tok(1, cfg_.vocab - 1), plen(8, 48), rlen(8, 96);
    const int64_t P = cfg_.pairs_per_batch;
    std::vector<int64_t> prompt_lens(2 * P);
    int64_t longest = 0;
    for (int64_t i = 0; i < P; ++i) {
      std::vector<int64_t> prompt(plen(rng_));
      for (auto& t : prompt) t = tok(rng_);
      for (int64_t side = 0; side < 2; ++side) {
        std::vector<int64_t> seq(prompt);
        for (int64_t k = 0, n = rlen(rng_); k < n; ++k) seq.push_back(tok(rng_));
        const int64_t len = std::min<int64_t>(static_cast<int64_t>(seq.size()), cfg_.max_len);
        const int64_t row = side * P + i;
        auto tokens = torch::tensor(std::vector<int64_t>(seq.begin(), seq.begin() + len));
        staging_[row].narrow(0, 0, len).copy_(tokens);  // EXPECT: tensor-copy-narrowing
        prompt_lens[row] = static_cast<int64_t>(prompt.size());
        longest = std::max(longest, len);
      }
    }
    PairBatch b;
    b.ids = staging_.narrow(1, 0, longest).to(device_, torch::kLong);
    b.attn_mask = b.ids.ne(cfg_.pad_id).to(torch::kLong);
    b.prompt_len = torch::tensor(prompt_lens);
    b.n_pairs = P;
    return b;
  }

 private:
  TrainConfig cfg_;
  torch::Device device_;
  std::mt19937_64 rng_;
  torch::Tensor staging_;
};

torch::Tensor response_mask(const PairBatch& b) {
  const auto T = b.ids.size(1);
  auto pos = torch::arange(T, b.ids.options());  // LOOKALIKE: tensor-device-mismatch -- arange takes the ids' options, so it is made on their device
  auto is_response = pos.unsqueeze(0).ge(b.prompt_len.unsqueeze(1));  // EXPECT: tensor-device-mismatch
  return is_response.logical_and(b.attn_mask.to(torch::kBool));
}

struct SeqStats {
  torch::Tensor logp_sum;
  torch::Tensor n_tokens;
  torch::Tensor entropy;
};

SeqStats sequence_logps(const torch::Tensor& logits, const torch::Tensor& ids, const torch::Tensor& mask) {
  const auto T = ids.size(1);
  auto logp = torch::log_softmax(logits.narrow(1, 0, T - 1), -1);
  auto tok_logp = logp.gather(-1, ids.narrow(1, 1, T - 1).unsqueeze(-1)).squeeze(-1);
  auto m = mask.narrow(1, 1, T - 1).to(tok_logp.scalar_type());
  SeqStats out{(tok_logp * m).sum(1), m.sum(1), torch::Tensor()};
  {
    // policy entropy on response tokens, for the dashboard only
    auto probs = logp.detach();
    // FACT: assert backward_fails(lambda: [y := torch.randn(2,5,requires_grad=True).log_softmax(-1), y.detach().exp_(), y.sum().backward()])
    probs.exp_();  // EXPECT: tensor-inplace-on-detached
    auto ent = -(probs * probs.clamp_min(1e-12).log()).sum(-1);
    out.entropy = (ent * m).sum() / m.sum().clamp_min(1.0);
  }
  return out;
}

torch::Tensor log_odds(const torch::Tensor& avg_logp) {
  auto p = avg_logp.exp();
  // FACT: assert backward_fails(lambda: [x := torch.full((3,), -0.5, requires_grad=True), p := x.exp(), p.clamp_max_(0.9), (x - torch.log1p(-p)).sum().backward()])
  p.clamp_max_(1.0 - 1e-6);  // EXPECT: tensor-inplace-on-saved
  return avg_logp - torch::log1p(-p);
}

torch::Tensor chosen_nll(const torch::Tensor& logits, const torch::Tensor& ids, const torch::Tensor& mask) {
  const auto T = ids.size(1), V = logits.size(2);
  auto labels = ids.clone();  // LOOKALIKE: tensor-unnecessary-clone -- ids is a view of the batch that gather already saved; labels needs its own storage
  labels.masked_fill_(mask.logical_not(), -100);
  // FACT: l = torch.zeros(2,6,dtype=torch.long); assert is_contiguous(l[:,1:].contiguous()) and l[:,1:].contiguous().view(-1).numel() == 10
  auto shift_labels = labels.narrow(1, 1, T - 1).contiguous();
  auto shift_logits = logits.narrow(1, 0, T - 1);
  // FACT: x = torch.randn(4,6,10); assert is_copy_of(x[:2].narrow(1,0,5).reshape(-1,10), x)
  return torch::nn::functional::cross_entropy(
      shift_logits.reshape({-1, V}),  // EXPECT: tensor-reshape-non-contiguous
      shift_labels.view({-1}),  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() on the line above made the labels dense
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

torch::Tensor simpo_loss(const torch::Tensor& sums, const torch::Tensor& counts, const TrainConfig& cfg) {
  auto avg = sums / counts.clamp_min(1.0);
  auto margin = (avg[0] - avg[1]).mul(cfg.simpo_beta);
  // FACT: assert not backward_fails(lambda: [x := torch.randn(3, requires_grad=True), m := (x / 2.0 - x.detach() / 3.0).mul(2.0), m.sub_(0.5), (-torch.nn.functional.logsigmoid(m)).mean().backward()])
  margin.sub_(cfg.simpo_gamma);  // LOOKALIKE: tensor-inplace-on-saved -- mul by a scalar saves nothing, and log_sigmoid reads margin after the write
  return -torch::log_sigmoid(margin).mean();
}

void train(const TrainConfig& cfg, torch::Device device) {
  TinyLM model(cfg);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  PairCollator collator(cfg, device);

  auto running_loss = torch::zeros({}, torch::TensorOptions().device(device));
  double reward_acc = 0.0;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto batch = collator.next();
    const int64_t P = batch.n_pairs;
    auto logits = model(batch.ids);
    auto mask = response_mask(batch);
    auto stats = sequence_logps(logits, batch.ids, mask);
    // FACT: s = torch.randn(8,5).sum(1); assert is_view_of(s.reshape(2,4), s)
    auto sums = stats.logp_sum.reshape({2, P});  // LOOKALIKE: tensor-reshape-non-contiguous -- sum(1) returns a dense vector, splitting it is a view
    auto counts = stats.n_tokens.reshape({2, P});

    torch::Tensor loss;
    if (cfg.objective == Objective::kORPO) {
      auto avg = sums;
      // FACT: s = torch.randn(8); a = s.reshape(2,4); b = a; b.div_(2.0); assert shares_storage(b, s) and torch.equal(a, b)
      avg.div_(counts.clamp_min(1.0));  // EXPECT: tensor-alias-then-mutate
      auto ratio = log_odds(avg[0]) - log_odds(avg[1]);
      auto nll = chosen_nll(logits.narrow(0, 0, P), batch.ids.narrow(0, 0, P), mask.narrow(0, 0, P));
      loss = nll - cfg.orpo_lambda * torch::log_sigmoid(ratio).mean();
    } else {
      loss = simpo_loss(sums, counts, cfg);
    }

    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();

    running_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
    auto chosen_reward = sums[0].detach() / counts[0].clamp_min(1.0);
    chosen_reward.mul_(cfg.simpo_beta);  // LOOKALIKE: tensor-inplace-on-detached -- the division already made a fresh tensor; the detached handle itself is not written
    auto rejected_reward = cfg.simpo_beta * sums[1].detach() / counts[1].clamp_min(1.0);
    reward_acc += (chosen_reward > rejected_reward).to(torch::kFloat).mean().item<double>();  // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison carries no graph and item() hands back a plain double

    if (step % cfg.log_every == 0) {
      const double mean_loss = running_loss.item<double>() / cfg.log_every;  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps, not every step
      std::cout << "step " << step << " loss " << std::fixed << std::setprecision(4) << mean_loss
                << " reward_acc " << reward_acc / cfg.log_every
                << " entropy " << stats.entropy.item<double>() << std::endl;
      running_loss.zero_();
      reward_acc = 0.0;
    }
  }
}

}  // namespace pref

int main(int argc, char** argv) {
  pref::TrainConfig cfg;
  if (argc > 1 && std::string(argv[1]) == "orpo") cfg.objective = pref::Objective::kORPO;
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  pref::train(cfg, device);
  return 0;
}
