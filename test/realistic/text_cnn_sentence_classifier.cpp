// Convolutional sentence classifier after Kim (2014): word2vec-initialised embeddings (words
// without a pretrained vector drawn from U[-a, a] and the only rows fine-tuned), Conv1d filters
// of widths 3/4/5 with max-over-time pooling, dropout 0.5 and an l2 max-norm of 3 on the rows of
// the output layer. Sentences are padded to the longest in the corpus; windows that start on
// padding are masked out of the max. Evaluation keeps every prediction and its confidence for
// the error analysis and prints a confusion matrix with per-class recall.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

struct TextCnnConfig {
  int64_t vocab_size = 18000, embed_dim = 300, num_filters = 100, n_classes = 5, max_len = 56;
  std::vector<int64_t> widths{3, 4, 5};
  int64_t pad_id = 0, unk_id = 1, batch_size = 50, epochs = 25, log_every = 100;
  double dropout = 0.5, lr = 1e-3, max_norm = 3.0;
};

struct Vocab {
  std::unordered_map<std::string, int64_t> index;
  int64_t unk_id = 1;
  std::vector<int64_t> encode(const std::string &sentence) const {
    std::vector<int64_t> ids;
    std::istringstream in(sentence);
    for (std::string w; in >> w;) {
      auto it = index.find(w);
      ids.push_back(it == index.end() ? unk_id : it->second);
    }
    return ids;
  }
};

// [B, L] int64, L = the longest sentence (at least the widest filter, at most max_len).
torch::Tensor pad_batch(const std::vector<std::vector<int64_t>> &seqs, int64_t pad_id, int64_t min_len, int64_t max_len) {
  int64_t L = min_len;
  for (const auto &s : seqs)
    L = std::max<int64_t>(L, static_cast<int64_t>(s.size()));
  L = std::min(L, max_len);
  auto out = torch::full({static_cast<int64_t>(seqs.size()), L}, pad_id, torch::kLong);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto n = std::min<int64_t>(static_cast<int64_t>(seqs[i].size()), L);
    std::vector<int64_t> head(seqs[i].begin(), seqs[i].begin() + n);
    // FACT: out = torch.full((2, 5), 0, dtype=torch.long); src = torch.tensor([7, 40000, 3]); out[0].narrow(0, 0, 3).copy_(src); assert src.dtype == torch.long and out[0, :3].tolist() == [7, 40000, 3]
    out[i].narrow(0, 0, n).copy_(torch::tensor(head)); // LOOKALIKE: tensor-copy-narrowing -- int64 ids into an int64 row
  }
  return out;
}

struct TextCnnImpl : torch::nn::Module {
  explicit TextCnnImpl(const TextCnnConfig &cfg) : pad_id_(cfg.pad_id) {
    namespace nn = torch::nn;
    embedding = register_module("embedding",
                                nn::Embedding(nn::EmbeddingOptions(cfg.vocab_size, cfg.embed_dim).padding_idx(cfg.pad_id)));
    convs = register_module("convs", nn::ModuleList());
    for (auto w : cfg.widths)
      convs->push_back(nn::Conv1d(nn::Conv1dOptions(cfg.embed_dim, cfg.num_filters, w)));
    dropout = register_module("dropout", nn::Dropout(cfg.dropout));
    fc = register_module("fc", nn::Linear(cfg.num_filters * static_cast<int64_t>(cfg.widths.size()), cfg.n_classes));
  }

  // tokens [B, L] -> logits [B, n_classes]
  torch::Tensor forward(const torch::Tensor &tokens) {
    auto x = embedding(tokens).transpose(1, 2); // [B, E, L]: the embedding is Conv1d's channels
    auto pad = tokens.eq(pad_id_).unsqueeze(1);  // [B, 1, L]
    std::vector<torch::Tensor> pooled;
    for (const auto &m : *convs) {
      auto h = m->as<torch::nn::Conv1d>()->forward(x); // [B, F, L - w + 1]
      // FACT: conv = torch.nn.Conv1d(4, 6, 3); x = torch.randn(2, 4, 8, requires_grad=True); h = conv(x); h.masked_fill_(torch.arange(6).view(1, 1, 6) >= 4, -1e4); torch.relu(h).max(2)[0].sum().backward(); assert x.grad is not None
      h.masked_fill_(pad.narrow(2, 0, h.size(2)), -1e4); // LOOKALIKE: tensor-inplace-on-saved -- a convolution does not save its output; the relu comes after the write
      h = torch::relu(h);
      pooled.push_back(std::get<0>(h.max(2))); // LOOKALIKE: tensor-graph-kept-across-iterations -- max over time; the pooled features are the forward's output, which the loss differentiates
    }
    return fc(dropout(torch::cat(pooled, 1)));
  }

  int64_t pad_id_;
  torch::nn::Embedding embedding{nullptr};
  torch::nn::ModuleList convs{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TextCnn);

// Rows of the word2vec matrix (zeros where the word has no vector) into the embedding.
void load_word2vec(TextCnn &model, const torch::Tensor &vectors, int64_t pad_id) {
  torch::NoGradGuard no_grad;
  auto w = model->embedding->weight;
  // FACT: w = torch.nn.Embedding(5, 3).weight; exec('with torch.no_grad():\n w.copy_(torch.ones(5, 3))\n w[0].zero_()'); assert w.is_leaf and w.requires_grad and w[0].abs().sum().item() == 0
  w.copy_(vectors); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  w[pad_id].zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

// Kim: words word2vec does not have start from U[-a, a], a chosen so that their variance matches
// the pretrained vectors'.
void init_unknown_rows(TextCnn &model, const torch::Tensor &has_vector, int64_t pad_id) {
  auto w = model->embedding->weight;
  const double a = std::sqrt(3.0) * w.index({has_vector}).std().item<double>();
  auto missing = (~has_vector).nonzero().squeeze(1);
  auto ids = missing.accessor<int64_t, 1>();
  for (int64_t i = 0; i < missing.size(0); ++i)
    if (ids[i] != pad_id)
      // FACT: w = torch.nn.Embedding(5, 3).weight; assert raises(lambda: w[2].uniform_(-0.25, 0.25), "a view of a leaf Variable that requires grad")
      w[ids[i]].uniform_(-a, a); // EXPECT: tensor-inplace-on-leaf -- a row of the trainable embedding, written with grad mode on
}

struct SentenceDataset : torch::data::datasets::Dataset<SentenceDataset> {
  SentenceDataset(const std::vector<std::vector<int64_t>> &seqs, const std::vector<int64_t> &labels, const TextCnnConfig &cfg)
      : tokens_(pad_batch(seqs, cfg.pad_id, *std::max_element(cfg.widths.begin(), cfg.widths.end()), cfg.max_len)),
        labels_(torch::tensor(labels)) {}
  torch::data::Example<> get(size_t i) override { return {tokens_[i], labels_[i]}; }
  torch::optional<size_t> size() const override { return tokens_.size(0); }
  torch::Tensor tokens_, labels_;
};

// Confusion counts, rows = true class, columns = predicted class.
torch::Tensor confusion_matrix(const torch::Tensor &labels, const torch::Tensor &preds, int64_t n_classes) {
  auto cm = torch::zeros({n_classes, n_classes});
  cm.index_put_({labels, preds}, torch::ones({labels.size(0)}), /*accumulate=*/true);
  return cm;
}

struct EvalReport {
  double accuracy = 0;
  torch::Tensor confusion, predictions, confidences, labels;
};

EvalReport evaluate(TextCnn &model, SentenceDataset data, const TextCnnConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t N = static_cast<int64_t>(*data.size()), C = cfg.n_classes;
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(data).map(torch::data::transforms::Stack<>()), cfg.batch_size);
  auto labels_all = torch::empty({N}, torch::kLong);
  auto preds_all = torch::empty_like(labels_all);
  auto conf_all = torch::empty_like(labels_all);
  int64_t off = 0;
  for (auto &batch : *loader) {
    auto y = batch.target.to(device);
    auto probs = torch::softmax(model->forward(batch.data.to(device)), 1);
    auto top = probs.max(1);
    const auto b = y.size(0);
    // FACT: dst = torch.empty(4, dtype=torch.long); dst.narrow(0, 1, 2).copy_(torch.tensor([3, 1])); assert dst[1:3].tolist() == [3, 1]
    preds_all.narrow(0, off, b).copy_(std::get<1>(top)); // LOOKALIKE: tensor-copy-narrowing -- argmax indices are int64, like the buffer
    // FACT: conf = torch.empty_like(torch.empty(3, dtype=torch.long)); conf.copy_(torch.softmax(torch.randn(3, 5), 1).max(1)[0]); assert conf.dtype == torch.long and conf.tolist() == [0, 0, 0]
    conf_all.narrow(0, off, b).copy_(std::get<0>(top)); // EXPECT: tensor-copy-narrowing -- empty_like(labels_all) is int64: every confidence below 1 is stored as 0
    labels_all.narrow(0, off, b).copy_(y); // LOOKALIKE: tensor-device-mismatch -- copy_ moves data across devices
    off += b;
  }
  EvalReport report;
  auto cm = confusion_matrix(labels_all, preds_all, C);
  auto recall = cm.to(torch::kFloat);
  // FACT: cm = torch.zeros(3, 3); cm.index_put_((torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2])), torch.ones(3), accumulate=True); r = cm.to(torch.float); r.div_(r.sum(1, keepdim=True).clamp_min(1)); assert shares_storage(r, cm) and abs((cm.diag().sum() / cm.sum()).item() - 2 / 3) > 0.05
  recall.div_(recall.sum(1, true).clamp_min(1)); // EXPECT: tensor-alias-then-mutate -- the counts are float32 already: to() returned cm, whose accuracy is read below
  report.accuracy = (cm.diag().sum() / cm.sum()).item<double>();
  auto support = torch::bincount(labels_all, {}, C);
  auto freq = support.to(torch::kFloat);
  // FACT: s = torch.bincount(torch.tensor([0, 1, 1, 2])); f = s.to(torch.float); f.div_(4); assert s.dtype == torch.long and is_copy_of(f, s) and s.tolist() == [1, 2, 1]
  freq.div_(N); // LOOKALIKE: tensor-alias-then-mutate -- bincount gives int64 counts: to(kFloat) copied them
  for (int64_t c = 0; c < C; ++c)
    std::cout << "class " << c << ": support " << support[c].item<int64_t>() << " (" << freq[c].item<double>() * 100
              << "%), recall " << recall[c][c].item<double>() << "\n";
  report.confusion = cm;
  report.predictions = preds_all;
  report.confidences = conf_all;
  report.labels = labels_all;
  return report;
}

void train(TextCnn &model, SentenceDataset train_set, SentenceDataset dev_set, const torch::Tensor &has_vector,
           const TextCnnConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto loader = torch::data::make_data_loader(std::move(train_set).map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions(cfg.batch_size).workers(2));
  // Only the rows of words without a pretrained vector are fine-tuned.
  auto tune_rows = (~has_vector).to(torch::kFloat).unsqueeze(1);
  double best_acc = -1;
  std::unordered_map<std::string, torch::Tensor> best_state;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto loss_sum = torch::zeros({}, device);
    int64_t correct = 0, seen = 0;
    for (auto &batch : *loader) {
      auto tokens = batch.data.to(device), y = batch.target.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto logits = model->forward(tokens); // LOOKALIKE: tensor-device-mismatch -- the tokens are moved to the model's device
      auto loss = torch::nn::functional::cross_entropy(logits, y);
      opt.zero_grad();
      loss.backward();
      auto row_mask = tune_rows.to(device); // EXPECT: tensor-clone-in-loop -- the same [V, 1] mask is sent to the GPU at every step
      // FACT: e = torch.nn.Embedding(4, 2); e(torch.tensor([1, 2])).sum().backward(); e.weight.grad.mul_(torch.tensor([[0.], [1.], [0.], [1.]])); assert e.weight.is_leaf and e.weight.grad[2].abs().sum().item() == 0
      model->embedding->weight.grad().mul_(row_mask); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient is written, not the weight
      opt.step();
      {
        torch::NoGradGuard no_grad;
        model->fc->weight.renorm_(2, 0, cfg.max_norm); // LOOKALIKE: tensor-inplace-on-leaf -- Kim's max-norm constraint, under NoGradGuard
      }
      loss_sum += loss.detach() * y.size(0); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
      correct += logits.argmax(1).eq(y).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU at every step only to add up a count
      seen += y.size(0);
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    auto report = evaluate(model, dev_set, cfg, device);
    std::cout << "epoch " << epoch << " train loss " << loss_sum.item<double>() / seen << " acc " // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the loop of steps
              << static_cast<double>(correct) / seen << " dev acc " << report.accuracy << "\n";
    if (report.accuracy > best_acc) {
      best_acc = report.accuracy;
      for (const auto &p : model->named_parameters())
        best_state[p.key()] = p.value().detach().clone(); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- a different parameter each time, kept while training goes on
    }
  }
  torch::NoGradGuard no_grad;
  for (auto &p : model->named_parameters())
    p.value().copy_(best_state.at(p.key())); // LOOKALIKE: tensor-inplace-on-leaf -- the best weights restored under NoGradGuard
}

// Raw sentences through the deployed model, on the GPU.
std::vector<int64_t> predict(TextCnn &model, const Vocab &vocab, const std::vector<std::string> &sentences,
                             const TextCnnConfig &cfg) {
  torch::NoGradGuard no_grad;
  model->to(torch::kCUDA);
  model->eval();
  std::vector<std::vector<int64_t>> seqs;
  for (const auto &s : sentences)
    seqs.push_back(vocab.encode(s));
  auto ids = pad_batch(seqs, cfg.pad_id, *std::max_element(cfg.widths.begin(), cfg.widths.end()), cfg.max_len);
  auto logits = model->forward(ids); // EXPECT: tensor-device-mismatch -- the padded ids stay on the CPU while the embedding is on the GPU
  auto pred = logits.argmax(1).cpu();
  return std::vector<int64_t>(pred.data_ptr<int64_t>(), pred.data_ptr<int64_t>() + pred.numel());
}

int main() {
  TextCnnConfig cfg;
  TextCnn model(cfg);
  auto vectors = torch::randn({cfg.vocab_size, cfg.embed_dim}) * 0.25;
  auto has_vector = torch::rand({cfg.vocab_size}) < 0.8;
  load_word2vec(model, vectors * has_vector.unsqueeze(1), cfg.pad_id);
  init_unknown_rows(model, has_vector, cfg.pad_id);
  std::vector<std::vector<int64_t>> seqs{{5, 9, 2, 7}, {3, 8, 8, 4, 11, 6}};
  std::vector<int64_t> labels{1, 3};
  SentenceDataset train_set(seqs, labels, cfg), dev_set(seqs, labels, cfg);
  train(model, train_set, dev_set, has_vector, cfg);
  Vocab vocab;
  for (auto p : predict(model, vocab, {"a fine film", "dull"}, cfg))
    std::cout << p << "\n";
}
