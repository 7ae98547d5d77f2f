// BERT4Rec: bidirectional transformer over item sequences trained with the cloze
// objective, evaluated leave-one-out with HR@k / NDCG@k, plus a small online session.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

struct Bert4RecConfig {
  int64_t num_items = 3000;
  int64_t max_len = 50;
  int64_t hidden = 64;
  int64_t heads = 2;
  int64_t layers = 2;
  double dropout = 0.1;
  double mask_prob = 0.2;
  double label_smoothing = 0.1;
  double pop_beta = 0.1;
  double lr = 1e-3;
  int64_t batch_size = 128;
  int64_t epochs = 20;
  int64_t topk = 10;
  int64_t log_every = 50;
};

class SequenceStore {
 public:
  SequenceStore(const std::vector<std::vector<int64_t>>& users, int64_t max_len, int64_t num_items)
      : max_len_(max_len) {
    const int64_t num_users = static_cast<int64_t>(users.size());
    seqs_ = torch::zeros({num_users, max_len + 1}, torch::kInt);
    counts_ = torch::zeros({num_items + 2}, torch::kDouble);
    for (int64_t u = 0; u < num_users; ++u) {
      const auto& s = users[u];
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(s.size()), max_len + 1);
      std::vector<int64_t> tail(s.end() - n, s.end());
      auto ids = torch::tensor(tail);
      // FACT: a = torch.zeros(3, dtype=torch.int32); a.copy_(torch.tensor([1, 2, 2**40])); assert a[2].item() != 2**40
      seqs_.select(0, u).narrow(0, max_len + 1 - n, n).copy_(ids);  // EXPECT: tensor-copy-narrowing
      counts_.index_add_(0, ids, torch::ones({n}, torch::kDouble));
    }
  }

  int64_t num_users() const { return seqs_.size(0); }
  torch::Tensor train_rows(const torch::Tensor& idx) const {
    return seqs_.index_select(0, idx).narrow(1, 0, max_len_);
  }
  torch::Tensor rows(int64_t start, int64_t n) const { return seqs_.narrow(0, start, n); }
  torch::Tensor log_popularity() const { return torch::log1p(counts_).to(torch::kFloat); }

 private:
  int64_t max_len_;
  torch::Tensor seqs_, counts_;
};

struct ClozeBatch {
  torch::Tensor input, labels;
};

ClozeBatch cloze_mask(const torch::Tensor& rows, double p, int64_t mask_token, int64_t num_items) {
  // FACT: r = torch.zeros(2, 5, dtype=torch.int32); assert is_copy_of(r.to(torch.long), r)
  auto seq = rows.to(torch::kLong);
  seq.masked_fill_(seq.gt(num_items), 0);  // LOOKALIKE: tensor-alias-then-mutate -- the store rows are int32, to(kLong) converts into a new tensor
  auto valid = seq.ne(0);
  auto masked = torch::rand(seq.sizes()).lt(p).logical_and(valid);
  masked.select(1, -1).logical_or_(valid.select(1, -1));
  auto input = seq.clone();  // EXPECT: tensor-unnecessary-clone
  input.masked_fill_(masked, mask_token);
  auto labels = seq.masked_fill(masked.logical_not(), 0);
  return {input, labels};
}

class Bert4RecImpl : public torch::nn::Module {
 public:
  explicit Bert4RecImpl(const Bert4RecConfig& cfg) : mask_token_(cfg.num_items + 1) {
    const int64_t vocab = cfg.num_items + 2;
    item_emb = register_module(
        "item_emb", torch::nn::Embedding(torch::nn::EmbeddingOptions(vocab, cfg.hidden).padding_idx(0)));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(cfg.max_len, cfg.hidden));
    emb_norm = register_module("emb_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    emb_drop = register_module("emb_drop", torch::nn::Dropout(cfg.dropout));
    auto layer = torch::nn::TransformerEncoderLayer(
        torch::nn::TransformerEncoderLayerOptions(cfg.hidden, cfg.heads)
            .dim_feedforward(4 * cfg.hidden)
            .dropout(cfg.dropout)
            .activation(torch::kGELU));
    encoder = register_module("encoder",
                              torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(layer, cfg.layers)));
    proj = register_module("proj", torch::nn::Linear(cfg.hidden, cfg.hidden));
    out_norm = register_module("out_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    out_bias = register_parameter("out_bias", torch::zeros({vocab}));

    torch::nn::init::normal_(item_emb->weight, 0.0, 0.02);
    torch::nn::init::normal_(pos_emb->weight, 0.0, 0.02);
    {
      torch::NoGradGuard no_grad;
      item_emb->weight[0].zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- padding row reset under NoGradGuard
    }
  }

  torch::Tensor encode(const torch::Tensor& input) {
    auto positions = torch::arange(input.size(1), input.options());
    auto x = emb_drop(emb_norm(item_emb(input) + pos_emb(positions)));
    auto out = encoder->forward(x.transpose(0, 1), /*src_mask=*/torch::Tensor(),
                                /*src_key_padding_mask=*/input.eq(0));
    return out.transpose(0, 1);
  }

  torch::Tensor head(const torch::Tensor& h) {
    auto logits = torch::matmul(out_norm(torch::gelu(proj(h))), item_emb->weight.t());
    // FACT: w = torch.randn(6, 4, requires_grad=True); b = torch.zeros(6, requires_grad=True); l = torch.randn(3, 4).matmul(w.t()); l.add_(b); assert not raises(lambda: torch.log_softmax(l, -1).sum().backward())
    logits.add_(out_bias);  // LOOKALIKE: tensor-inplace-on-saved -- matmul keeps its operands for backward, not its result
    return logits;
  }

  int64_t mask_token() const { return mask_token_; }

  torch::nn::Embedding item_emb{nullptr}, pos_emb{nullptr};
  torch::nn::LayerNorm emb_norm{nullptr}, out_norm{nullptr};
  torch::nn::Dropout emb_drop{nullptr};
  torch::nn::TransformerEncoder encoder{nullptr};
  torch::nn::Linear proj{nullptr};
  torch::Tensor out_bias;

 private:
  int64_t mask_token_;
};
TORCH_MODULE(Bert4Rec);

// Cross-entropy with label smoothing spread over real items only.
torch::Tensor smoothed_ce(const torch::Tensor& logits, const torch::Tensor& target, double eps) {
  auto logp = torch::log_softmax(logits, -1);
  // FACT: l = torch.randn(3, 6, requires_grad=True); assert backward_fails(lambda: (lambda lp: (lp.select(1, 0).zero_(), (-lp.mean()).backward()))(torch.log_softmax(l, -1)))
  logp.select(1, 0).zero_();  // EXPECT: tensor-inplace-on-saved
  auto nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1);
  auto smooth = -logp.sum(1) / static_cast<double>(logits.size(1) - 1);
  return ((1.0 - eps) * nll + eps * smooth).mean();
}

struct RankMetrics {
  double hr = 0.0, ndcg = 0.0;
};

RankMetrics evaluate(Bert4Rec& model, const SequenceStore& store, const Bert4RecConfig& cfg,
                     torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t L = cfg.max_len;
  auto log_pop = store.log_popularity();
  auto discounts = 1.0 / torch::log2(torch::arange(2, cfg.topk + 2, torch::dtype(torch::kFloat).device(device)));
  auto ndcg_sum = torch::zeros({}, device);
  double hits = 0.0;
  for (int64_t start = 0; start < store.num_users(); start += cfg.batch_size) {
    const int64_t n = std::min(cfg.batch_size, store.num_users() - start);
    auto full = store.rows(start, n).to(device).to(torch::kLong);
    auto target = full.select(1, L);
    auto input = full.narrow(1, 1, L);
    // FACT: f = torch.arange(12).view(2, 6); t = f.select(1, 5); f.narrow(1, 1, 5).select(1, 4).fill_(-1); assert bool((t == -1).all())
    input.select(1, L - 1).fill_(model->mask_token());  // EXPECT: tensor-alias-then-mutate

    auto scores = model->head(model->encode(input).select(1, L - 1));
    scores = scores - cfg.pop_beta * log_pop;  // EXPECT: tensor-device-mismatch
    scores.narrow(1, 0, 1).fill_(-1e9);
    scores.narrow(1, model->mask_token(), 1).fill_(-1e9);

    auto topk = std::get<1>(scores.topk(cfg.topk, 1));
    auto match = topk.eq(target.unsqueeze(1));
    hits += match.any(1).sum().item<double>();  // EXPECT: tensor-sync-in-loop
    ndcg_sum += (match.to(torch::kFloat) * discounts).sum();  // LOOKALIKE: tensor-sync-in-loop -- accumulated on the device, read once after the loop
  }
  const double users = static_cast<double>(store.num_users());
  return {hits / users, ndcg_sum.item<double>() / users};
}

void train(Bert4Rec& model, const SequenceStore& store, const Bert4RecConfig& cfg, torch::Device device) {
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(0.01));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> step_losses;
    auto running = torch::zeros({}, device);
    auto perm = torch::randperm(store.num_users());
    int64_t step = 0;
    for (int64_t start = 0; start < store.num_users(); start += cfg.batch_size, ++step) {
      auto idx = perm.narrow(0, start, std::min(cfg.batch_size, store.num_users() - start));
      auto batch = cloze_mask(store.train_rows(idx), cfg.mask_prob, model->mask_token(), cfg.num_items);
      auto input = batch.input.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a freshly masked batch each step
      auto labels = batch.labels.to(device);

      opt.zero_grad();
      auto h = model->encode(input);
      // FACT: assert raises(lambda: torch.randn(7, 3, 8).transpose(0, 1).view(-1, 8), "view size is not compatible")
      auto flat_h = h.view({-1, cfg.hidden});  // EXPECT: tensor-view-non-contiguous
      // FACT: l = torch.arange(12).view(3, 4).masked_fill(torch.rand(3, 4) > 0.5, 0); assert is_view_of(l.view(-1), l)
      auto flat_labels = labels.view({-1});  // LOOKALIKE: tensor-view-non-contiguous -- labels come from masked_fill and are contiguous
      auto pos = flat_labels.nonzero().squeeze(1);
      auto sel = flat_h.index_select(0, pos);
      auto loss = smoothed_ce(model->head(sel), flat_labels.index_select(0, pos), cfg.label_smoothing);

      // Watch for representation collapse: mean pairwise cosine of the masked states.
      auto unit = sel.detach();
      unit.div_(unit.norm(2, 1, true).clamp_min(1e-8));  // EXPECT: tensor-inplace-on-detached
      auto mean_cos = unit.matmul(unit.t()).mean();

      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 5.0);
      opt.step();

      step_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      running = running + loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, the graph is freed
      if (step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step << " loss " << running.item<double>() / (step + 1)
                  << " cos " << mean_cos.item<double>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      }
    }
    auto epoch_loss = torch::stack(step_losses).mean().item<double>();
    auto m = evaluate(model, store, cfg, device);
    std::cout << "epoch " << epoch << " loss " << epoch_loss << " HR@" << cfg.topk << " " << m.hr
              << " NDCG@" << cfg.topk << " " << m.ndcg << std::endl;
  }
}

class OnlineSession {
 public:
  OnlineSession(Bert4Rec model, const std::vector<int64_t>& history, int64_t max_len, torch::Device device)
      : model_(std::move(model)),
        window_(torch::zeros({1, max_len}, torch::dtype(torch::kLong).device(device))) {
    model_->eval();
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(history.size()), max_len);
    std::vector<int64_t> tail(history.end() - n, history.end());
    window_.narrow(1, max_len - n, n).copy_(torch::tensor(tail).unsqueeze(0));  // LOOKALIKE: tensor-device-mismatch -- copy_ moves host data to the window's device itself
  }

  std::vector<int64_t> observe(int64_t item, int64_t k) {
    torch::NoGradGuard no_grad;
    const int64_t L = window_.size(1);
    // FACT: x = torch.arange(8).view(1, 8); assert raises(lambda: x.narrow(1, 0, 7).copy_(x.narrow(1, 1, 7)), "single memory location")
    window_.narrow(1, 0, L - 1).copy_(window_.narrow(1, 1, L - 1));  // EXPECT: tensor-inplace-overlap
    window_.select(1, L - 1).fill_(item);
    auto probe = torch::cat({window_.narrow(1, 1, L - 1),
                             torch::full({1, 1}, model_->mask_token(), window_.options())}, 1);
    auto scores = model_->head(model_->encode(probe).select(1, L - 1));
    scores.narrow(1, 0, 1).fill_(-1e9);
    scores.narrow(1, model_->mask_token(), 1).fill_(-1e9);
    auto top = std::get<1>(scores.topk(k, 1)).squeeze(0).cpu();
    return std::vector<int64_t>(top.data_ptr<int64_t>(), top.data_ptr<int64_t>() + top.numel());
  }

 private:
  Bert4Rec model_;
  torch::Tensor window_;
};

static std::vector<std::vector<int64_t>> synthetic_users(int64_t num_users, int64_t num_items, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> item(1, num_items);
  std::uniform_int_distribution<int64_t> len(8, 80);
  std::uniform_int_distribution<int64_t> step(1, 7);
  std::vector<std::vector<int64_t>> users(num_users);
  for (auto& seq : users) {
    int64_t cur = item(rng);
    for (int64_t t = 0, n = len(rng); t < n; ++t) {
      seq.push_back(cur);
      cur = (rng() % 4 == 0) ? item(rng) : (cur + step(rng) - 1) % num_items + 1;
    }
  }
  return users;
}

int main() {
  torch::manual_seed(3);
  Bert4RecConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto users = synthetic_users(4000, cfg.num_items, 11);
  SequenceStore store(users, cfg.max_len, cfg.num_items);

  Bert4Rec model(cfg);
  model->to(device);
  train(model, store, cfg, device);

  OnlineSession session(model, users.front(), cfg.max_len, device);
  for (int64_t item : {17, 18, 19}) {
    auto recs = session.observe(item, cfg.topk);
    std::cout << "after " << item << ": top-1 " << recs.front() << "\n";
  }
  return 0;
}
