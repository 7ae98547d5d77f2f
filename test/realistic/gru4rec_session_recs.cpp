// GRU4Rec-style session-based recommendation: one GRU step per click,
// session-parallel mini-batches, TOP1/BPR over in-batch negatives, Recall@K/MRR@K.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct GRU4RecConfig {
  int64_t num_items = 37484;  // id 0 is padding
  int64_t embed_dim = 64;
  int64_t hidden = 100;
  int64_t lanes = 32;  // sessions processed in parallel
  double dropout = 0.25;
  double lr = 0.05;
  int64_t epochs = 5;
  int64_t top_k = 20;
  int64_t history = 16;  // recent clicks per lane excluded at eval
  bool use_top1 = true;
};

class GRU4RecImpl : public nn::Module {
 public:
  explicit GRU4RecImpl(const GRU4RecConfig& cfg) : cfg_(cfg) {
    item_emb = register_module(
        "item_emb", nn::Embedding(nn::EmbeddingOptions(cfg.num_items, cfg.embed_dim).padding_idx(0)));
    gru = register_module("gru", nn::GRU(nn::GRUOptions(cfg.embed_dim, cfg.hidden).batch_first(true)));
    drop = register_module("drop", nn::Dropout(cfg.dropout));
    out_emb = register_module("out_emb", nn::Embedding(cfg.num_items, cfg.hidden));
    out_bias = register_module("out_bias", nn::Embedding(cfg.num_items, 1));
  }

  // One click for every lane: items [B], hidden [1, B, H] -> (session state [B, H], h_n).
  std::tuple<torch::Tensor, torch::Tensor> step(const torch::Tensor& items, const torch::Tensor& hidden) {
    auto x = drop(item_emb(items)).unsqueeze(1);  // [B, 1, E]
    auto [out, h_n] = gru(x, hidden);
    // FACT: g = torch.nn.GRU(4, 6, batch_first=True); o, h = g(torch.randn(3, 1, 4)); assert o.stride() == (6, 18, 1) and is_view_of(o.view(-1, 6), o)
    auto state = out.view({-1, cfg_.hidden});  // LOOKALIKE: tensor-view-non-contiguous -- one time step: the transposed dim has size 1
    return {state, h_n};
  }

  // Output of the last real click of padded sessions [B, T] (for session-to-session search).
  torch::Tensor encode_last(const torch::Tensor& seqs, const torch::Tensor& lengths) {
    const auto B = seqs.size(0);
    const auto T = seqs.size(1);
    auto [out, h_n] = gru(item_emb(seqs));
    // FACT: g = torch.nn.GRU(4, 6, batch_first=True); o, h = g(torch.randn(3, 5, 4)); assert raises(lambda: o.view(-1, 6), "view size is not compatible")
    auto flat = out.view({-1, cfg_.hidden});  // EXPECT: tensor-view-non-contiguous
    auto last = torch::arange(B, torch::kLong) * T + (lengths - 1);
    return flat.index_select(0, last);
  }

  // Scores of every lane against a set of candidate items: [B, H] x [C] -> [B, C].
  torch::Tensor score(const torch::Tensor& state, const torch::Tensor& candidates) {
    auto w = out_emb(candidates);
    auto b = out_bias(candidates).squeeze(1);
    return state.mm(w.t()) + b;
  }

  nn::Embedding item_emb{nullptr}, out_emb{nullptr}, out_bias{nullptr};
  nn::GRU gru{nullptr};
  nn::Dropout drop{nullptr};

 private:
  GRU4RecConfig cfg_;
};
TORCH_MODULE(GRU4Rec);

// TOP1 (Hidasi et al., 2016): logits [B, B], the positive of row i on the diagonal.
torch::Tensor top1_loss(const torch::Tensor& logits) {
  auto pos = logits.diagonal().unsqueeze(1);
  auto top1 = torch::sigmoid(logits - pos);
  // FACT: x = torch.randn(4, 4, requires_grad=True); t = torch.sigmoid(x - x.diagonal().unsqueeze(1)); t += torch.sigmoid(x.pow(2)); assert backward_fails(lambda: t.mean().backward())
  top1 += torch::sigmoid(logits.pow(2));  // EXPECT: tensor-inplace-on-saved
  return top1.mean();
}

// BPR over in-batch negatives; the self-pair on the diagonal is dropped.
torch::Tensor bpr_loss(const torch::Tensor& logits) {
  const auto B = logits.size(0);
  auto pos = logits.diagonal().unsqueeze(1);
  auto nll = -F::logsigmoid(pos - logits);
  // FACT: x = torch.randn(4, 4, requires_grad=True); n = -torch.nn.functional.logsigmoid(x.diagonal().unsqueeze(1) - x); n.diagonal().zero_(); n.sum().backward(); assert x.grad is not None
  nll.diagonal().zero_();  // LOOKALIKE: tensor-inplace-on-saved -- the negation saves nothing; logsigmoid saved its input, not this
  return nll.sum() / static_cast<double>(B * (B - 1));
}

// Session-parallel mini-batches: lane i walks one session click by click; when the
// session runs out the lane takes the next unused session and is listed in `reset`.
class SessionParallelLoader {
 public:
  struct Step {
    torch::Tensor inputs;   // [lanes] current click
    torch::Tensor targets;  // [lanes] next click
    torch::Tensor reset;    // lanes whose session starts at this step
  };

  SessionParallelLoader(const torch::Tensor& item_ids, const torch::Tensor& offsets, int64_t lanes)
      : items_(item_ids.contiguous()), lanes_(lanes) {
    TORCH_CHECK(items_.scalar_type() == torch::kLong, "item ids must be int64");
    auto off = offsets.contiguous();
    starts_.assign(off.data_ptr<int64_t>(), off.data_ptr<int64_t>() + off.numel());
    num_sessions_ = static_cast<int64_t>(starts_.size()) - 1;
    TORCH_CHECK(num_sessions_ >= lanes, "fewer sessions than lanes");
    for (int64_t i = 0; i < lanes; ++i) {
      session_.push_back(i);
      pos_.push_back(starts_[i]);
      fresh_.push_back(i);
    }
    next_session_ = lanes;
    cur_ = items_.index_select(0, torch::tensor(pos_, torch::kLong));
  }

  bool next(Step& out) {
    if (exhausted_) return false;
    const int64_t* ids = items_.data_ptr<int64_t>();
    std::vector<int64_t> tgt(lanes_);
    for (int64_t i = 0; i < lanes_; ++i) tgt[i] = ids[pos_[i] + 1];
    out.inputs = cur_;
    out.targets = torch::tensor(tgt, torch::kLong);
    out.reset = torch::tensor(fresh_, torch::kLong);
    fresh_.clear();

    std::vector<int64_t> first_items;
    for (int64_t i = 0; i < lanes_; ++i) {
      pos_[i] += 1;
      if (pos_[i] + 1 < starts_[session_[i] + 1]) continue;
      if (next_session_ >= num_sessions_) {
        exhausted_ = true;
        break;
      }
      session_[i] = next_session_++;
      pos_[i] = starts_[session_[i]];
      fresh_.push_back(i);
      first_items.push_back(ids[pos_[i]]);
    }
    // FACT: c = torch.arange(4); i = c; c.copy_(torch.arange(4) + 10); assert shares_storage(i, c) and int(i[0]) == 10
    cur_.copy_(out.targets);  // EXPECT: tensor-alias-then-mutate
    if (!fresh_.empty()) {
      cur_.index_copy_(0, torch::tensor(fresh_, torch::kLong), torch::tensor(first_items, torch::kLong));  // EXPECT: tensor-alias-then-mutate
    }
    return true;
  }

 private:
  torch::Tensor items_, cur_;
  int64_t lanes_;
  int64_t num_sessions_ = 0, next_session_ = 0;
  std::vector<int64_t> starts_, session_, pos_, fresh_;
  bool exhausted_ = false;
};

// The last `history` clicks of every lane, time-major [history, lanes].
class SeenItems {
 public:
  SeenItems(int64_t history, int64_t lanes) : recent_(torch::zeros({history, lanes}, torch::kLong)) {}

  void reset_lanes(const torch::Tensor& lanes) { recent_.index_fill_(1, lanes, 0); }

  void push(const torch::Tensor& item_ids) {
    const auto L = recent_.size(0);
    // FACT: h = torch.zeros(5, 3, dtype=torch.long); assert raises(lambda: h.narrow(0, 0, 4).copy_(h.narrow(0, 1, 4)), "single memory location")
    recent_.narrow(0, 0, L - 1).copy_(recent_.narrow(0, 1, L - 1));  // EXPECT: tensor-inplace-overlap
    recent_[L - 1].copy_(item_ids);  // LOOKALIKE: tensor-copy-narrowing -- item ids are int64, like the buffer
  }

  torch::Tensor mask(int64_t num_items) const {
    auto m = torch::zeros({recent_.size(1), num_items}, torch::kBool);
    m.scatter_(1, recent_.t(), true);
    m.select(1, 0).fill_(false);
    return m;
  }

 private:
  torch::Tensor recent_;
};

void train(GRU4Rec& model, const torch::Tensor& items, const torch::Tensor& offsets, const GRU4RecConfig& cfg) {
  model->train();
  torch::optim::Adagrad opt(model->parameters(), torch::optim::AdagradOptions(cfg.lr));
  std::vector<torch::Tensor> step_losses;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    SessionParallelLoader loader(items, offsets, cfg.lanes);
    SessionParallelLoader::Step s;
    auto hidden = torch::zeros({1, cfg.lanes, cfg.hidden});
    auto epoch_total = torch::zeros({});
    int64_t steps = 0;
    while (loader.next(s)) {
      if (s.reset.numel() > 0) {
        hidden.index_fill_(1, s.reset, 0.0);  // LOOKALIKE: tensor-inplace-on-detached -- last step's graph was consumed by backward and its h_n is gone
      }
      auto [state, h_n] = model->step(s.inputs, hidden);
      auto logits = model->score(state, s.targets);  // in-batch negatives: [B, B]
      auto loss = cfg.use_top1 ? top1_loss(logits) : bpr_loss(logits);
      opt.zero_grad();
      loss.backward();
      opt.step();
      hidden = h_n.detach();

      step_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      epoch_total += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no history
      ++steps;
    }
    const auto window = std::min<int64_t>(static_cast<int64_t>(step_losses.size()), 500);
    auto recent = torch::stack(step_losses).narrow(0, static_cast<int64_t>(step_losses.size()) - window, window);
    std::cout << "epoch " << epoch << " mean loss " << epoch_total.item<double>() / std::max<int64_t>(steps, 1)
              << " (last " << window << " steps: " << recent.mean().item<double>() << ")\n";
  }
}

struct RecallMetrics {
  double recall = 0.0;
  double mrr = 0.0;
  int64_t events = 0;
};

RecallMetrics evaluate(GRU4Rec& model, const torch::Tensor& items, const torch::Tensor& offsets,
                       const GRU4RecConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  SessionParallelLoader loader(items, offsets, cfg.lanes);
  SessionParallelLoader::Step s;
  SeenItems seen(cfg.history, cfg.lanes);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const int64_t cap = items.size(0);
  auto hit_log = torch::zeros({cap}, torch::kLong);
  auto rr_log = torch::zeros({cap}, torch::kLong);
  auto all_items = torch::arange(cfg.num_items, torch::kLong);
  auto hidden = torch::zeros({1, cfg.lanes, cfg.hidden});
  int64_t n_ev = 0;

  while (n_ev + cfg.lanes <= cap && loader.next(s)) {
    if (s.reset.numel() > 0) {
      hidden.index_fill_(1, s.reset, 0.0);
      seen.reset_lanes(s.reset);
    }
    seen.push(s.inputs);
    auto [state, h_n] = model->step(s.inputs, hidden);
    hidden = h_n;
    auto logits = model->score(state, all_items);  // [B, num_items]
    auto masked = logits.clone();  // EXPECT: tensor-unnecessary-clone
    masked.masked_fill_(seen.mask(cfg.num_items), neg_inf);
    auto top = std::get<1>(masked.topk(cfg.top_k, 1));
    auto match = top == s.targets.unsqueeze(1);
    auto hit = match.any(1);
    auto rank = match.to(torch::kLong).argmax(1) + 1;
    auto rr = hit.to(torch::kFloat) / rank.to(torch::kFloat);
    hit_log.narrow(0, n_ev, cfg.lanes).copy_(hit);  // LOOKALIKE: tensor-copy-narrowing -- bool into int64 widens
    rr_log.narrow(0, n_ev, cfg.lanes).copy_(rr);  // EXPECT: tensor-copy-narrowing
    n_ev += cfg.lanes;
  }

  RecallMetrics m;
  m.events = n_ev;
  if (n_ev > 0) {
    m.recall = hit_log.narrow(0, 0, n_ev).to(torch::kDouble).mean().item<double>();
    m.mrr = rr_log.narrow(0, 0, n_ev).to(torch::kDouble).mean().item<double>();
  }
  return m;
}

int main() {
  GRU4RecConfig cfg;
  cfg.num_items = 1000;
  cfg.lanes = 16;
  cfg.epochs = 1;
  const int64_t n_sessions = 400;
  auto lengths = torch::randint(2, 12, {n_sessions}, torch::kLong);
  auto offsets = torch::cat({torch::zeros({1}, torch::kLong), lengths.cumsum(0)});
  auto items = torch::randint(1, cfg.num_items, {offsets[-1].item<int64_t>()}, torch::kLong);

  GRU4Rec model(cfg);
  train(model, items, offsets, cfg);
  auto m = evaluate(model, items, offsets, cfg);
  std::cout << "Recall@" << cfg.top_k << " " << m.recall << " MRR@" << cfg.top_k << " " << m.mrr << " over "
            << m.events << " events\n";
  return 0;
}
