// Deep Interest Network (Zhou et al. 2018) for click-through prediction: the candidate
// item attends over the user's behaviour sequence through an activation unit, Dice
// activations keep running statistics, mini-batch aware L2 on the item embeddings,
// AUC over the whole validation set.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct DinConfig {
  int64_t n_items = 200000;
  int64_t n_cates = 1500;
  int64_t item_dim = 32;
  int64_t cate_dim = 32;
  std::vector<int64_t> att_hidden{80, 40};
  int64_t mlp1 = 200, mlp2 = 80;
  bool softmax_attention = true;  // normalised weights: steadier on long histories
  double dice_momentum = 0.99;
  double l2 = 1e-5;               // mini-batch aware regularisation strength
  double lr = 1e-3;
  int64_t epochs = 3;
};

struct ClickExample {
  std::vector<int64_t> hist_items, hist_cates;
  int64_t item = 0, cate = 0;
  float label = 0.f;
};

struct DinBatch {
  torch::Tensor hist_items, hist_cates;  // [B, T], 0 = padding
  torch::Tensor lengths;                 // [B]
  torch::Tensor item, cate;              // [B]
  torch::Tensor label;                   // [B] float 0/1
  torch::Tensor batch_items;             // unique item ids touched by the batch
};

DinBatch collate(const std::vector<ClickExample>& xs, int64_t n_items) {
  std::vector<torch::Tensor> items, cates;
  std::vector<int64_t> lens, cand, cand_cate;
  std::vector<float> labels;
  for (const auto& e : xs) {
    items.push_back(torch::tensor(e.hist_items, torch::kLong));
    cates.push_back(torch::tensor(e.hist_cates, torch::kLong));
    lens.push_back(static_cast<int64_t>(e.hist_items.size()));
    cand.push_back(e.item);
    cand_cate.push_back(e.cate);
    labels.push_back(e.label);
  }
  DinBatch b;
  // FACT: p = torch.zeros(5, 3, dtype=torch.long); h = p.t().contiguous(); h.masked_fill_(h >= 2, 0); assert is_copy_of(h, p)
  auto hist = nn::utils::rnn::pad_sequence(items).t().contiguous();  // [B, T]
  hist.masked_fill_(hist >= n_items, 0);  // LOOKALIKE: tensor-alias-then-mutate -- contiguous() of a transpose is a new tensor
  b.hist_items = hist;
  b.hist_cates = nn::utils::rnn::pad_sequence(cates).t();
  b.lengths = torch::tensor(lens, torch::kLong);
  b.item = torch::tensor(cand, torch::kLong);
  b.cate = torch::tensor(cand_cate, torch::kLong);
  b.label = torch::tensor(labels, torch::kFloat);
  // FACT: h = torch.zeros(3, 5, dtype=torch.long); assert is_view_of(h.view(-1), h)
  auto touched = torch::cat({b.hist_items.view({-1}), b.item});  // LOOKALIKE: tensor-view-non-contiguous -- hist_items was made contiguous above
  b.batch_items = std::get<0>(torch::_unique(touched));
  // FACT: p = torch.nn.utils.rnn.pad_sequence([torch.arange(5), torch.arange(3), torch.arange(4)]); assert raises(lambda: p.t().view(-1), "view size is not compatible")
  auto cate_ids = b.hist_cates.view({-1});  // EXPECT: tensor-view-non-contiguous
  std::cout << "batch: " << xs.size() << " rows, " << b.batch_items.size(0) << " items, "
            << std::get<0>(torch::_unique(cate_ids)).size(0) << " categories\n";
  return b;
}

// Same users and histories; the candidate replaced by a uniformly drawn item (label 0).
DinBatch with_random_negatives(const DinBatch& pos, const torch::Tensor& item_to_cate, int64_t n_items) {
  DinBatch neg = pos;
  // FACT: a = torch.arange(1, 7); b = a; b.random_(1, 100); assert shares_storage(a, b)
  neg.item.random_(1, n_items);  // EXPECT: tensor-alias-then-mutate
  neg.cate = item_to_cate.index_select(0, neg.item);
  neg.label = torch::zeros_like(pos.label);
  return neg;
}

// Dice: p(x) * x + (1 - p(x)) * alpha * x, p = sigmoid of the batch-normalised input.
struct DiceImpl : nn::Module {
  DiceImpl(int64_t dim, double momentum) : momentum_(momentum) {
    alpha_ = register_parameter("alpha", torch::zeros({dim}));
    running_mean_ = register_buffer("running_mean", torch::zeros({dim}));
    running_var_ = register_buffer("running_var", torch::ones({dim}));
  }

  torch::Tensor forward(const torch::Tensor& x) {  // [N, dim]
    torch::Tensor mean, var;
    if (is_training()) {
      mean = x.mean(0);
      var = x.var({0}, /*unbiased=*/false);
      torch::NoGradGuard no_grad;
      running_mean_.mul_(momentum_).add_(mean, 1.0 - momentum_);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard the buffer records no graph
      running_var_.mul_(momentum_).add_(var, 1.0 - momentum_);  // LOOKALIKE: tensor-inplace-on-leaf -- a buffer, not a parameter
    } else {
      mean = running_mean_;
      var = running_var_;
    }
    auto p = torch::sigmoid((x - mean) / torch::sqrt(var + 1e-8));
    return p * x + (1.0 - p) * alpha_ * x;
  }

  double momentum_;
  torch::Tensor alpha_, running_mean_, running_var_;
};
TORCH_MODULE(Dice);

struct ActivationUnitImpl : nn::Module {
  ActivationUnitImpl(int64_t emb, const DinConfig& c) {
    int64_t in = 4 * emb;
    for (size_t i = 0; i < c.att_hidden.size(); ++i) {
      fcs_.push_back(register_module("fc" + std::to_string(i), nn::Linear(in, c.att_hidden[i])));
      dices_.push_back(register_module("dice" + std::to_string(i), Dice(c.att_hidden[i], c.dice_momentum)));
      in = c.att_hidden[i];
    }
    out_ = register_module("out", nn::Linear(in, 1));
  }

  // query [B, E], keys [B, T, E] -> unnormalised scores [B, T]
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& keys) {
    const int64_t B = keys.size(0), T = keys.size(1), E = keys.size(2);
    auto q = query.unsqueeze(1).expand({B, T, E});
    // FACT: q = torch.randn(2, 1, 4).expand(2, 3, 4); k = torch.randn(2, 3, 4); c = torch.cat([q, k, q - k, q * k], -1); assert is_view_of(c.view(6, 16), c)
    auto h = torch::cat({q, keys, q - keys, q * keys}, -1).view({B * T, 4 * E});  // LOOKALIKE: tensor-view-non-contiguous -- cat returns a contiguous tensor
    for (size_t i = 0; i < fcs_.size(); ++i) h = dices_[i]->forward(fcs_[i]->forward(h));
    return out_->forward(h).view({B, T});
  }

  std::vector<nn::Linear> fcs_;
  std::vector<Dice> dices_;
  nn::Linear out_{nullptr};
};
TORCH_MODULE(ActivationUnit);

struct DinImpl : nn::Module {
  explicit DinImpl(const DinConfig& c) : cfg_(c) {
    const int64_t E = c.item_dim + c.cate_dim;
    item_emb_ = register_module("item_emb", nn::Embedding(c.n_items, c.item_dim));
    cate_emb_ = register_module("cate_emb", nn::Embedding(nn::EmbeddingOptions(c.n_cates, c.cate_dim).padding_idx(0)));
    nn::init::normal_(item_emb_->weight, 0.0, 0.01);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no_grad
    item_emb_->weight[0].zero_();  // EXPECT: tensor-inplace-on-leaf
    att_ = register_module("att", ActivationUnit(E, c));
    fc1_ = register_module("fc1", nn::Linear(3 * E, c.mlp1));
    dice1_ = register_module("dice1", Dice(c.mlp1, c.dice_momentum));
    fc2_ = register_module("fc2", nn::Linear(c.mlp1, c.mlp2));
    dice2_ = register_module("dice2", Dice(c.mlp2, c.dice_momentum));
    logit_ = register_module("logit", nn::Linear(c.mlp2, 1));
  }

  void load_item_vectors(const torch::Tensor& vectors) {  // [n, item_dim] from a pretrained item2vec
    torch::NoGradGuard no_grad;
    item_emb_->weight.narrow(0, 1, vectors.size(0)).copy_(vectors);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  // mask [B, T] bool, true on real behaviours. Returns logits [B].
  torch::Tensor forward(const DinBatch& b, const torch::Tensor& mask) {
    auto keys = torch::cat({item_emb_(b.hist_items), cate_emb_(b.hist_cates)}, -1);  // [B, T, E]
    auto query = torch::cat({item_emb_(b.item), cate_emb_(b.cate)}, -1);             // [B, E]
    auto scores = att_->forward(query, keys);

    torch::Tensor w;
    if (cfg_.softmax_attention) {
      w = torch::softmax(scores.masked_fill(mask.logical_not(), -1e9), 1);
      w.mul_(mask.to(w.scalar_type()));  // EXPECT: tensor-inplace-on-saved
    } else {
      scores.masked_fill_(mask.logical_not(), 0.0);  // LOOKALIKE: tensor-inplace-on-saved -- a Linear output, nothing saved it
      w = scores;
    }
    auto interest = torch::bmm(w.unsqueeze(1), keys).squeeze(1);                      // [B, E]
    auto sum_pool = (keys * mask.unsqueeze(-1).to(keys.scalar_type())).sum(1);      // [B, E]
    auto h = dice1_(fc1_(torch::cat({sum_pool, interest, query}, -1)));
    h = dice2_(fc2_(h));
    return logit_(h).squeeze(-1);
  }

  DinConfig cfg_;
  nn::Embedding item_emb_{nullptr}, cate_emb_{nullptr};
  ActivationUnit att_{nullptr};
  nn::Linear fc1_{nullptr}, fc2_{nullptr}, logit_{nullptr};
  Dice dice1_{nullptr}, dice2_{nullptr};
};
TORCH_MODULE(Din);

// Scores of every validation row, gathered across batches, then the rank-sum AUC.
double evaluate_auc(Din& model, const std::vector<DinBatch>& data, torch::Device device) {
  model->eval();
  std::vector<torch::Tensor> scores, labels;
  for (const auto& cpu_batch : data) {
    DinBatch b = cpu_batch;
    b.hist_items = cpu_batch.hist_items.to(device);
    b.hist_cates = cpu_batch.hist_cates.to(device);
    b.item = cpu_batch.item.to(device);
    b.cate = cpu_batch.cate.to(device);
    b.lengths = cpu_batch.lengths.to(device);
    const int64_t T = b.hist_items.size(1);
    auto mask = torch::arange(T, torch::TensorOptions().device(device)).unsqueeze(0) < b.lengths.unsqueeze(1);  // LOOKALIKE: tensor-device-mismatch -- arange made on the batch's device
    auto p = torch::sigmoid(model->forward(b, mask));
    scores.push_back(p);  // EXPECT: tensor-graph-kept-across-iterations
    labels.push_back(cpu_batch.label);  // LOOKALIKE: tensor-graph-kept-across-iterations -- labels carry no graph
  }
  auto all_scores = torch::cat(scores).cpu();
  auto all_labels = torch::cat(labels);
  const int64_t n = all_scores.size(0);

  auto ranked = all_scores.clone();  // EXPECT: tensor-unnecessary-clone
  auto order = std::get<1>(ranked.sort());
  auto ranks = torch::empty({n}, torch::kDouble);
  ranks.index_put_({order}, torch::arange(1, n + 1, torch::kDouble));
  auto is_pos = all_labels > 0.5;
  const double n_pos = is_pos.sum().item<double>();
  const double n_neg = static_cast<double>(n) - n_pos;
  if (n_pos == 0 || n_neg == 0) return 0.5;
  const double rank_sum = ranks.masked_select(is_pos).sum().item<double>();
  return (rank_sum - n_pos * (n_pos + 1.0) / 2.0) / (n_pos * n_neg);
}

void train_din(Din& model, const std::vector<DinBatch>& train, const std::vector<DinBatch>& valid,
               const torch::Tensor& item_to_cate, const DinConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  auto cate_of = item_to_cate.to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));

  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    for (const auto& cpu_batch : train) {
      DinBatch b;
      b.hist_items = cpu_batch.hist_items.to(device);
      b.hist_cates = cpu_batch.hist_cates.to(device);
      b.lengths = cpu_batch.lengths.to(device);
      b.item = cpu_batch.item.to(device);
      b.cate = cpu_batch.cate.to(device);
      b.label = cpu_batch.label.to(device);
      b.batch_items = cpu_batch.batch_items.to(device);
      const int64_t T = b.hist_items.size(1);
      auto mask = torch::arange(T).unsqueeze(0) < b.lengths.unsqueeze(1);  // EXPECT: tensor-device-mismatch

      auto neg = with_random_negatives(b, cate_of, cfg.n_items);
      auto logits = torch::cat({model->forward(b, mask), model->forward(neg, mask)});
      auto targets = torch::cat({b.label, neg.label});
      auto loss = F::binary_cross_entropy_with_logits(logits, targets);
      // mini-batch aware L2: only the embedding rows this batch touched
      auto reg = model->item_emb_->weight.index_select(0, b.batch_items).pow(2).sum();
      auto total = loss + cfg.l2 * reg;

      opt.zero_grad();
      total.backward();
      opt.step();
      ++step;
      std::cout << "epoch " << epoch << " step " << step << " bce " << loss.item<float>() << "\n";  // EXPECT: tensor-sync-in-loop
    }
    std::cout << "epoch " << epoch << " valid AUC " << evaluate_auc(model, valid, device) << "\n";
  }
}
