// Masked-language-model pretraining for a small BERT on pre-tokenised shards. Masking is dynamic:
// every access to a row draws a new mask (15% of the non-special positions; of those 80% become
// [MASK], 10% a random token, 10% stay). The encoder is nn::TransformerEncoder (sequence-first),
// the MLM head is tied to the word embeddings and only the masked rows go through the vocabulary
// projection. Also: vocabulary growth for domain tokens and a fill-mask probe for the eval log.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

struct MlmConfig {
  int64_t vocab_size = 30522, hidden = 256, layers = 4, heads = 4, ffn = 1024, max_len = 128;
  int64_t pad_id = 0, cls_id = 101, sep_id = 102, mask_id = 103, ignore_index = -100;
  double mask_prob = 0.15, dropout = 0.1, init_std = 0.02, lr = 1e-4, weight_decay = 0.01;
  int64_t batch_size = 32, total_steps = 100000, warmup_steps = 10000, log_every = 200;
};

struct BertEmbeddingsImpl : torch::nn::Module {
  explicit BertEmbeddingsImpl(const MlmConfig &cfg) {
    word = register_module("word", torch::nn::Embedding(cfg.vocab_size, cfg.hidden));
    position = register_module("position", torch::nn::Embedding(cfg.max_len, cfg.hidden));
    token_type = register_module("token_type", torch::nn::Embedding(2, cfg.hidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden}).eps(1e-12)));
    drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
  }

  torch::Tensor forward(const torch::Tensor &ids, const torch::Tensor &types) {
    auto pos = torch::arange(ids.size(1), ids.options()).unsqueeze(0);
    auto e = word(ids) + position(pos) + token_type(types); // LOOKALIKE: tensor-device-mismatch -- the position ids are made with the token ids' options, on their device
    return drop(norm(e));
  }

  torch::nn::Embedding word{nullptr}, position{nullptr}, token_type{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(BertEmbeddings);

struct BertEncoderImpl : torch::nn::Module {
  explicit BertEncoderImpl(const MlmConfig &cfg) : pad_id_(cfg.pad_id) {
    emb = register_module("emb", BertEmbeddings(cfg));
    auto layer = torch::nn::TransformerEncoderLayerOptions(cfg.hidden, cfg.heads)
                     .dim_feedforward(cfg.ffn)
                     .dropout(cfg.dropout)
                     .activation(torch::kGELU);
    encoder = register_module("encoder", torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(layer, cfg.layers)));
  }

  // ids, types [B, L] -> hidden states [L, B, H]: nn::TransformerEncoder works sequence-first.
  torch::Tensor forward(const torch::Tensor &ids, const torch::Tensor &types) {
    auto x = emb(ids, types).transpose(0, 1);
    return encoder->forward(x, torch::Tensor(), ids.eq(pad_id_));
  }

  int64_t pad_id_;
  BertEmbeddings emb{nullptr};
  torch::nn::TransformerEncoder encoder{nullptr};
};
TORCH_MODULE(BertEncoder);

struct MlmHeadImpl : torch::nn::Module {
  explicit MlmHeadImpl(const MlmConfig &cfg) {
    dense = register_module("dense", torch::nn::Linear(cfg.hidden, cfg.hidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden}).eps(1e-12)));
    bias = register_parameter("bias", torch::zeros({cfg.vocab_size}));
  }
  // rows [M, H] -> logits [M, V]; the decoder matrix is the word embedding table.
  torch::Tensor forward(const torch::Tensor &rows, const torch::Tensor &word_weight) {
    auto h = norm(torch::gelu(dense(rows)));
    return torch::nn::functional::linear(h, word_weight, bias);
  }
  torch::nn::Linear dense{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::Tensor bias;
};
TORCH_MODULE(MlmHead);

struct BertForMaskedLMImpl : torch::nn::Module {
  explicit BertForMaskedLMImpl(const MlmConfig &cfg) : cfg_(cfg) {
    bert = register_module("bert", BertEncoder(cfg));
    head = register_module("head", MlmHead(cfg));
    init_weights();
  }

  // BERT's init: N(0, 0.02) for matrices, zero biases, LayerNorms as constructed, [PAD] row zero.
  void init_weights() {
    torch::NoGradGuard no_grad;
    for (auto &kv : named_parameters()) {
      if (kv.key().find("norm") != std::string::npos)
        continue;
      auto &p = kv.value();
      if (p.dim() > 1)
        p.normal_(0.0, cfg_.init_std); // LOOKALIKE: tensor-inplace-on-leaf -- the whole loop runs under NoGradGuard
      else
        p.zero_();
    }
    // FACT: e = torch.nn.Embedding(10, 4); exec('with torch.no_grad(): e.weight[0].zero_()'); assert e.weight.is_leaf and bool((e.weight[0] == 0).all())
    bert->emb->word->weight[cfg_.pad_id].zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- still inside the guard's block
  }

  // ids, types [B, L]; masked_pos [M]: flat indices (b * L + t) of the positions to predict.
  torch::Tensor forward(const torch::Tensor &ids, const torch::Tensor &types, const torch::Tensor &masked_pos) {
    auto states = bert(ids, types); // [L, B, H]
    auto seq = states.transpose(0, 1); // back to [B, L, H], the layout of the labels
    // FACT: enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16), 1); s = enc(torch.randn(6, 4, 8)); assert raises(lambda: s.transpose(0, 1).view(-1, 8), "view size is not compatible")
    auto rows = seq.view({-1, seq.size(2)}).index_select(0, masked_pos); // EXPECT: tensor-view-non-contiguous -- batch and time are swapped in memory: merging them cannot be a view
    return head(rows, bert->emb->word->weight);
  }

  // Appends domain tokens: the old rows are kept, the new ones start from a small random init.
  void resize_token_embeddings(int64_t new_vocab) {
    auto old_w = bert->emb->word->weight;
    const auto n_old = old_w.size(0), dim = old_w.size(1);
    auto grown = torch::nn::Embedding(new_vocab, dim);
    grown->to(old_w.device());
    torch::nn::init::normal_(grown->weight, 0.0, cfg_.init_std); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    // FACT: e = torch.nn.Embedding(12, 4); o = torch.nn.Embedding(10, 4); assert raises(lambda: e.weight.narrow(0, 0, 10).copy_(o.weight), "a view of a leaf Variable that requires grad")
    grown->weight.narrow(0, 0, n_old).copy_(old_w); // EXPECT: tensor-inplace-on-leaf -- the new table is a parameter that requires grad and grad mode is on
    auto b = torch::zeros({new_vocab}, head->bias.options());
    // FACT: p = torch.nn.Parameter(torch.randn(5)); b = torch.zeros(7); b.narrow(0, 0, 5).copy_(p.detach()); assert not b.requires_grad and torch.equal(b[:5], p.detach())
    b.narrow(0, 0, n_old).copy_(head->bias.detach()); // LOOKALIKE: tensor-inplace-on-leaf -- b is a plain zero tensor, the bias only a detached source
    head->bias.set_data(b);
    bert->emb->word = bert->emb->replace_module("word", grown);
    cfg_.vocab_size = new_vocab;
  }

  MlmConfig cfg_;
  BertEncoder bert{nullptr};
  MlmHead head{nullptr};
};
TORCH_MODULE(BertForMaskedLM);

struct MaskedExample {
  torch::Tensor input_ids, token_types, labels; // labels: the original id where masked, ignore_index elsewhere
};

// BERT's 80/10/10 recipe on one row (or a batch) of token ids.
MaskedExample mask_tokens(const torch::Tensor &ids, const torch::Tensor &types, const MlmConfig &cfg) {
  auto special = ids.eq(cfg.pad_id).logical_or(ids.eq(cfg.cls_id)).logical_or(ids.eq(cfg.sep_id));
  auto prob = torch::full(ids.sizes(), cfg.mask_prob);
  prob.masked_fill_(special, 0.0);
  auto chosen = torch::bernoulli(prob).to(torch::kBool);
  auto labels = ids.masked_fill(chosen.logical_not(), cfg.ignore_index);

  auto to_mask = torch::bernoulli(torch::full(ids.sizes(), 0.8)).to(torch::kBool).logical_and(chosen);
  auto coin = torch::bernoulli(torch::full(ids.sizes(), 0.5)).to(torch::kBool);
  auto to_random = coin.logical_and(chosen).logical_and(to_mask.logical_not());
  auto inputs = ids.contiguous(); // packed shards can hand over strided rows
  // FACT: shard = torch.randint(200, 1000, (4, 16)); x = shard[1].contiguous(); x.masked_fill_(torch.arange(16) % 3 == 0, 103); assert shares_storage(x, shard) and bool((shard[1][::3] == 103).all())
  inputs.masked_fill_(to_mask, cfg.mask_id); // EXPECT: tensor-alias-then-mutate -- contiguous() of a contiguous row is the row itself: [MASK] is written into the shard, and later epochs mask it again
  auto random_words = torch::randint(cfg.vocab_size, ids.sizes(), ids.options());
  inputs = torch::where(to_random, random_words, inputs);
  return {inputs, types, labels};
}

// One shard: [N, L] token ids and segment ids; masking runs per access.
class MlmShardDataset : public torch::data::datasets::Dataset<MlmShardDataset, MaskedExample> {
public:
  MlmShardDataset(torch::Tensor ids, torch::Tensor types, const MlmConfig &cfg)
      : ids_(std::move(ids)), types_(std::move(types)), cfg_(cfg) {}
  MaskedExample get(size_t i) override {
    const auto row = static_cast<int64_t>(i);
    return mask_tokens(ids_[row], types_[row], cfg_);
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(ids_.size(0)); }

private:
  torch::Tensor ids_, types_;
  MlmConfig cfg_;
};

MaskedExample collate(const std::vector<MaskedExample> &items) {
  std::vector<torch::Tensor> ids, types, labels;
  for (const auto &it : items) {
    ids.push_back(it.input_ids);
    types.push_back(it.token_types);
    labels.push_back(it.labels);
  }
  return {torch::stack(ids), torch::stack(types), torch::stack(labels)};
}

double lr_at(int64_t step, const MlmConfig &cfg) {
  if (step < cfg.warmup_steps)
    return cfg.lr * static_cast<double>(step + 1) / static_cast<double>(cfg.warmup_steps);
  const double left = static_cast<double>(cfg.total_steps - step) / static_cast<double>(cfg.total_steps - cfg.warmup_steps);
  return cfg.lr * std::max(0.0, left);
}

void pretrain(BertForMaskedLM &model, MlmShardDataset shard, const MlmConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  auto loader = torch::data::make_data_loader(std::move(shard),
                                              torch::data::DataLoaderOptions(cfg.batch_size).workers(2).drop_last(true));

  auto smoothed = torch::zeros({}, device);
  auto hits = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  double running = 0;
  int64_t step = 0, predicted = 0;
  while (step < cfg.total_steps) {
    for (auto &items : *loader) {
      auto mb = collate(items);
      auto ids = mb.input_ids.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto types = mb.token_types.to(device);
      // FACT: l = torch.stack([torch.randint(0, 9, (16,)) for _ in range(4)]); assert is_view_of(l.view(-1), l)
      auto flat_labels = mb.labels.to(device).view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- stacked labels are contiguous
      auto masked_pos = flat_labels.ne(cfg.ignore_index).nonzero().squeeze(1);
      auto targets = flat_labels.index_select(0, masked_pos);

      auto logits = model->forward(ids, types, masked_pos);
      auto loss = torch::nn::functional::cross_entropy(logits, targets);
      for (auto &group : opt.param_groups())
        static_cast<torch::optim::AdamWOptions &>(group.options()).lr(lr_at(step, cfg));
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();

      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- the loss is on the GPU: every step waits for it just to add it up
      // FACT: m = torch.nn.Linear(3, 2); s = torch.zeros(()); exec('for _ in range(3):\n l = m(torch.randn(4, 3)).pow(2).mean(); l.backward(); s = s * 0.98 + l * 0.02'); assert s.requires_grad and kept_nodes(s) >= 3 * 4
      smoothed = smoothed * 0.98 + loss * 0.02; // EXPECT: tensor-graph-kept-across-iterations -- the moving average chains every step's graph to the next
      hits += logits.argmax(-1).eq(targets).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- argmax and eq are not differentiable
      predicted += targets.size(0);
      if (++step % cfg.log_every == 0) {
        std::cout << "step " << step << " loss " << smoothed.item<float>() << " mean " << running / cfg.log_every // LOOKALIKE: tensor-sync-in-loop -- once every log_every steps
                  << " acc " << static_cast<double>(hits.item<int64_t>()) / std::max<int64_t>(predicted, 1) << "\n";
        running = 0;
      }
      if (step >= cfg.total_steps)
        break;
    }
  }
}

// Eval log: the top prediction for each [MASK] of a few probe sentences, special tokens excluded.
std::vector<torch::Tensor> fill_mask(BertForMaskedLM &model, const std::vector<torch::Tensor> &probes,
                                     const torch::Tensor &special_vocab, const MlmConfig &cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> filled_all;
  for (const auto &ids : probes) { // each [1, L]
    auto types = torch::zeros_like(ids);
    auto pos = ids.view({-1}).eq(cfg.mask_id).nonzero().squeeze(1);
    auto logits = model->forward(ids, types, pos);
    // FACT: lg = torch.randn(3, 10); sp = torch.arange(10) < 3; s = lg.clone(); s.masked_fill_(sp, -1e9); assert torch.equal(s, lg.masked_fill(sp, -1e9)) and is_copy_of(s, lg)
    auto scores = logits.clone(); // EXPECT: tensor-unnecessary-clone -- masked in place right after: logits.masked_fill(...) is the same tensor in one pass
    scores.masked_fill_(special_vocab, -1e9);
    auto best = scores.argmax(-1);
    // FACT: ids = torch.randint(200, 900, (1, 8)); ids0 = ids.clone(); f = ids.clone(); f.view(-1).index_put_((torch.tensor([2, 5]),), torch.tensor([7, 9])); assert is_copy_of(f, ids) and torch.equal(ids, ids0)
    auto filled = ids.clone(); // LOOKALIKE: tensor-unnecessary-clone, tensor-alias-then-mutate -- written through a view below while the probe itself is printed next to it
    filled.view({-1}).index_put_({pos}, best);
    std::cout << "probe " << ids.view({-1}).slice(0, 0, 12) << "\n-> " << filled.view({-1}).slice(0, 0, 12) << "\n";
    filled_all.push_back(filled);
  }
  return filled_all;
}

int main() {
  MlmConfig cfg;
  torch::Tensor ids, types;
  torch::load(ids, "shard_000.ids.pt");
  torch::load(types, "shard_000.types.pt");
  BertForMaskedLM model(cfg);
  model->resize_token_embeddings(cfg.vocab_size + 512); // clinical vocabulary extension
  pretrain(model, MlmShardDataset(ids, types, model->cfg_), model->cfg_);

  auto special_vocab = torch::zeros({model->cfg_.vocab_size}, torch::kBool);
  for (auto id : {cfg.pad_id, cfg.cls_id, cfg.sep_id, cfg.mask_id})
    special_vocab[id] = true;
  std::vector<torch::Tensor> probes;
  torch::load(probes, "probes.pt");
  torch::Device device(torch::kCUDA);
  for (auto &p : probes)
    p = p.to(device);
  fill_mask(model, probes, special_vocab.to(device), model->cfg_);
  torch::save(model, "bert_mlm.pt");
}
