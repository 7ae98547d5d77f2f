// Reward model for preference data: a small transformer scores a response and
// is trained with the Bradley-Terry pairwise loss on chosen/rejected pairs.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

constexpr int64_t kPadId = 0;
constexpr int64_t kNumSpecial = 4;     // pad, bos, eos, sep come before the tokenizer's ids
constexpr int64_t kTokenizerUnk = 0;

struct RmConfig {
  int64_t vocab = 32000 + kNumSpecial, d_model = 256, heads = 4, layers = 4, max_len = 256;
  int64_t batch_size = 16, epochs = 3, log_every = 50;
  double lr = 1e-5, weight_decay = 0.01, temperature = 1.0, reward_l2 = 1e-3, dropout = 0.1;
  double corrupt_prob = 0.15;
};

struct PairExample {
  torch::Tensor chosen;  // raw tokenizer ids, kept as int32
  torch::Tensor rejected;
  float margin = 0.f;    // annotator confidence, 0 when unknown
};

struct PairBatch {
  torch::Tensor tokens;  // chosen rows first, then the rejected ones
  torch::Tensor pad_mask;
  torch::Tensor margin;
};

class RewardModelImpl : public torch::nn::Module {
 public:
  explicit RewardModelImpl(const RmConfig& cfg) : emb_scale_(std::sqrt(static_cast<double>(cfg.d_model))) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(cfg.max_len, cfg.d_model));
    torch::nn::TransformerEncoderLayer layer(torch::nn::TransformerEncoderLayerOptions(cfg.d_model, cfg.heads)
                                                 .dim_feedforward(4 * cfg.d_model)
                                                 .dropout(cfg.dropout)
                                                 .activation(torch::kGELU));
    encoder = register_module("encoder", torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(layer, cfg.layers)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    value_head = register_module("value_head", torch::nn::Linear(cfg.d_model, 1));
    torch::nn::init::normal_(value_head->weight, 0.0, 1.0 / std::sqrt(cfg.d_model + 1.0));  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under NoGradGuard
    torch::nn::init::zeros_(value_head->bias);
  }

  // One scalar per sequence, read at its last non-pad token.
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& pad_mask) {
    const auto B = tokens.size(0), S = tokens.size(1);
    auto pos = torch::arange(S, tokens.options().dtype(torch::kLong));
    auto x = tok_emb(tokens) + pos_emb(pos).unsqueeze(0);
    // FACT: w = torch.rand(5, 3, requires_grad=True); x = torch.nn.functional.embedding(torch.tensor([[1, 2]]), w) + torch.rand(2, 3); x.mul_(4.0); x.sum().backward(); assert w.grad is not None
    x.mul_(emb_scale_);  // LOOKALIKE: tensor-inplace-on-saved -- add saved nothing and a scalar mul_ needs no input
    auto h = encoder->forward(x.transpose(0, 1), {}, pad_mask).transpose(0, 1);
    // FACT: assert raises(lambda: torch.rand(5, 2, 4).transpose(0, 1).view(-1, 4), "view size is not compatible")
    auto flat = h.view({-1, h.size(-1)});  // EXPECT: tensor-view-non-contiguous
    // FACT: r = torch.nn.functional.linear(torch.rand(10, 4), torch.rand(1, 4)); assert is_view_of(r.view(2, 5), r)
    auto token_rewards = value_head(norm(flat)).view({B, S});  // LOOKALIKE: tensor-view-non-contiguous -- the head's output is contiguous
    auto last = pad_mask.logical_not().sum(1).sub(1).clamp_min(0);
    return token_rewards.gather(1, last.unsqueeze(1)).squeeze(1);
  }

  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::TransformerEncoder encoder{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear value_head{nullptr};

 private:
  double emb_scale_;
};
TORCH_MODULE(RewardModel);

torch::Tensor prepare_ids(const torch::Tensor& raw, int64_t max_len) {
  auto ids = raw.to(torch::kLong);
  // FACT: raw = torch.randint(0, 100, (12,), dtype=torch.int32); assert is_copy_of(raw.to(torch.int64), raw)
  ids.add_(kNumSpecial);  // LOOKALIKE: tensor-alias-then-mutate -- the int32 to int64 conversion makes a new tensor
  if (ids.size(0) > max_len) ids = ids.narrow(0, ids.size(0) - max_len, max_len);  // keep the end of the response
  return ids;
}

PairBatch collate(const std::vector<PairExample>& data, const std::vector<size_t>& order, size_t begin, size_t end,
                  int64_t max_len, torch::Device device) {
  std::vector<torch::Tensor> rows;
  std::vector<float> margins;
  for (size_t i = begin; i < end; ++i) rows.push_back(prepare_ids(data[order[i]].chosen, max_len));
  for (size_t i = begin; i < end; ++i) {
    rows.push_back(prepare_ids(data[order[i]].rejected, max_len));
    margins.push_back(data[order[i]].margin);
  }
  int64_t longest = 1;
  for (const auto& r : rows) longest = std::max(longest, r.size(0));

  // Ids fit in 32 bits: build the batch in int32 to halve the host-to-device copy.
  auto tokens = torch::full({static_cast<int64_t>(rows.size()), longest}, kPadId, torch::kInt);
  for (size_t i = 0; i < rows.size(); ++i)
    tokens[i].narrow(0, 0, rows[i].size(0)).copy_(rows[i]);  // EXPECT: tensor-copy-narrowing

  PairBatch batch;
  batch.tokens = tokens.to(device, torch::kLong);
  batch.pad_mask = batch.tokens.eq(kPadId);
  batch.margin = torch::tensor(margins);
  return batch;
}

// Cheap extra negatives: the chosen response with some tokens knocked out.
PairExample corrupt_pair(const PairExample& ex, double prob) {
  auto corrupted = ex.chosen;
  auto mask = torch::rand({corrupted.size(0)}) < prob;
  // FACT: a = torch.arange(8, dtype=torch.int32); b = a; b.masked_fill_(torch.arange(8) < 3, 0); assert shares_storage(a, b) and a[1].item() == 0
  corrupted.masked_fill_(mask, kTokenizerUnk);  // EXPECT: tensor-alias-then-mutate
  return {ex.chosen, corrupted, 1.0f};
}

double evaluate(RewardModel& model, const std::vector<PairExample>& data, const RmConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<size_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (size_t b = 0; b < data.size(); b += cfg.batch_size) {
    auto batch = collate(data, order, b, std::min(b + cfg.batch_size, data.size()), cfg.max_len, device);
    auto r = model->forward(batch.tokens, batch.pad_mask).view({2, -1});
    correct += (r[0] > r[1]).sum();
  }
  model->train();
  return correct.item<double>() / static_cast<double>(data.size());  // LOOKALIKE: tensor-sync-in-loop -- counted on the device, read once after the loop
}

std::vector<torch::Tensor> snapshot(const RewardModel& model) {
  std::vector<torch::Tensor> saved;
  for (const auto& p : model->parameters())
    saved.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone -- the optimizer keeps rewriting the parameters
  return saved;
}

void restore(RewardModel& model, const std::vector<torch::Tensor>& saved) {
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);
}

// PPO reads the rewards raw: shift the head so the training set scores around zero.
std::pair<double, double> center_rewards(RewardModel& model, const std::vector<PairExample>& data, const RmConfig& cfg,
                                         torch::Device device) {
  std::vector<size_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  auto sum = torch::zeros({}, device);
  auto sum_sq = torch::zeros({}, device);
  {
    torch::NoGradGuard no_grad;
    model->eval();
    for (size_t b = 0; b < data.size(); b += cfg.batch_size) {
      auto batch = collate(data, order, b, std::min(b + cfg.batch_size, data.size()), cfg.max_len, device);
      auto r = model->forward(batch.tokens, batch.pad_mask);
      sum += r.sum();
      sum_sq += r.pow(2).sum();
    }
    model->train();
  }
  const double n = 2.0 * static_cast<double>(data.size());
  const double mean = sum.item<double>() / n;
  const double var = sum_sq.item<double>() / n - mean * mean;
  model->value_head->bias.sub_(mean);  // EXPECT: tensor-inplace-on-leaf
  return {mean, std::sqrt(std::max(var, 1e-12))};
}

torch::Tensor normalised_scores(RewardModel& model, const PairBatch& batch, double scale) {
  torch::NoGradGuard no_grad;
  auto raw = model->forward(batch.tokens, batch.pad_mask);
  auto scores = raw.clone();  // EXPECT: tensor-unnecessary-clone
  scores.div_(scale).clamp_(-5.0, 5.0);
  return scores;
}

void train(RewardModel& model, std::vector<PairExample> train_set, const std::vector<PairExample>& val_set,
           const RmConfig& cfg, torch::Device device) {
  const size_t n_real = train_set.size();
  for (size_t i = 0; i < n_real; i += 4) train_set.push_back(corrupt_pair(train_set[i], cfg.corrupt_prob));

  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  auto temperature = torch::tensor(cfg.temperature);
  std::vector<size_t> order(train_set.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(1234);
  double best_acc = -1.0;
  std::vector<torch::Tensor> best;
  int64_t step = 0;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<torch::Tensor> step_losses;
    auto running = torch::zeros({}, device);
    double acc_sum = 0.0;
    int64_t n_steps = 0;
    for (size_t b = 0; b + cfg.batch_size <= order.size(); b += cfg.batch_size, ++step, ++n_steps) {
      auto batch = collate(train_set, order, b, b + cfg.batch_size, cfg.max_len, device);
      auto rewards = model->forward(batch.tokens, batch.pad_mask);
      // FACT: r = torch.rand(8, 5).gather(1, torch.zeros(8, 1, dtype=torch.long)).squeeze(1); assert is_view_of(r.view(2, -1), r)
      auto pair = rewards.view({2, -1});  // LOOKALIKE: tensor-view-non-contiguous -- gather's output is contiguous
      auto r_chosen = pair[0];
      auto r_rejected = pair[1];

      auto margin = r_chosen - r_rejected - batch.margin;  // EXPECT: tensor-device-mismatch
      auto p = torch::sigmoid(margin / temperature);  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may meet CUDA tensors
      p.clamp_(1e-6, 1.0);  // EXPECT: tensor-inplace-on-saved
      auto loss = -torch::log(p).mean() + cfg.reward_l2 * (r_chosen.pow(2) + r_rejected.pow(2)).mean();

      if (step % cfg.log_every == 0) {
        auto gap = r_chosen.detach();
        gap.sub_(r_rejected.detach());  // EXPECT: tensor-inplace-on-detached
        std::cout << "step " << step << " loss " << (running / std::max<int64_t>(n_steps, 1)).item<double>()  // LOOKALIKE: tensor-sync-in-loop -- read only every log_every steps
                  << " mean gap " << gap.mean().item<double>() << "\n";
      }

      opt.zero_grad();
      loss.backward();
      opt.step();

      step_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      running += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
      auto acc = (r_chosen > r_rejected).to(torch::kFloat).mean();
      acc_sum += acc.item<double>();  // EXPECT: tensor-sync-in-loop
    }
    const double median_loss = torch::stack(step_losses).median().item<double>();
    const double val_acc = evaluate(model, val_set, cfg, device);
    std::cout << "epoch " << epoch << " median loss " << median_loss << " train acc "
              << acc_sum / std::max<int64_t>(n_steps, 1) << " val acc " << val_acc << "\n";
    if (val_acc > best_acc) {
      best_acc = val_acc;
      best = snapshot(model);
    }
  }
  if (!best.empty()) restore(model, best);
}

std::vector<PairExample> synthetic_split(const RmConfig& cfg, int64_t n) {
  std::vector<PairExample> out;
  const auto raw_vocab = cfg.vocab - kNumSpecial;
  for (int64_t i = 0; i < n; ++i) {
    const auto lc = torch::randint(8, cfg.max_len + 32, {1}).item<int64_t>();
    const auto lr = torch::randint(8, cfg.max_len + 32, {1}).item<int64_t>();
    out.push_back({torch::randint(1, raw_vocab, {lc}, torch::kInt), torch::randint(1, raw_vocab, {lr}, torch::kInt),
                   0.5f * static_cast<float>(i % 3)});
  }
  return out;
}

int main() {
  RmConfig cfg;
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  RewardModel model(cfg);
  model->to(device);
  auto train_set = synthetic_split(cfg, 2048);
  auto val_set = synthetic_split(cfg, 256);
  train(model, train_set, val_set, cfg, device);

  const auto stats = center_rewards(model, train_set, cfg, device);
  std::vector<size_t> order(val_set.size());
  std::iota(order.begin(), order.end(), 0);
  auto batch = collate(val_set, order, 0, cfg.batch_size, cfg.max_len, device);
  std::cout << "reward mean " << stats.first << " std " << stats.second << "\n"
            << normalised_scores(model, batch, stats.second).cpu() << "\n";
  torch::save(model, "reward_model.pt");
  return 0;
}
