// Text classifier: embedding + bidirectional LSTM over padded batches, masked mean/max pooling, macro-F1 evaluation.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <string>
#include <unordered_map>
#include <vector>

using Vocab = std::unordered_map<std::string, int64_t>;

// Ids 0 and 1 are <pad> and <unk>; words seen fewer than min_count times map to <unk>.
Vocab build_vocab(const std::vector<std::vector<std::string>> &docs, int min_count) {
  std::unordered_map<std::string, int> freq;
  for (const auto &d : docs)
    for (const auto &w : d)
      ++freq[w];
  Vocab vocab{{"<pad>", 0}, {"<unk>", 1}};
  for (const auto &[w, n] : freq)
    if (n >= min_count)
      vocab.emplace(w, static_cast<int64_t>(vocab.size()));
  return vocab;
}

struct Batch {
  torch::Tensor ids, lengths, labels; // [B, T] int64 padded with 0, [B], [B]
};

struct TextClassifierImpl : torch::nn::Module {
  TextClassifierImpl(int64_t vocab, int64_t emb, int64_t hidden, int64_t layers, int64_t classes)
      : hidden_(hidden), layers_(layers) {
    embed_ = register_module("embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(vocab, emb).padding_idx(0)));
    lstm_ = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(emb, hidden).num_layers(layers).batch_first(true).bidirectional(true)));
    head_ = register_module("head", torch::nn::Linear(6 * hidden, classes));
  }

  torch::Tensor forward(const torch::Tensor &ids, const torch::Tensor &lengths) {
    auto B = ids.size(0);
    auto [out, state] = lstm_->forward(embed_(ids)); // out [B, T, 2H]
    auto h_n = std::get<0>(state);                  // [layers * 2, B, H]
    auto mask = torch::arange(ids.size(1), ids.options()).unsqueeze(0) < lengths.unsqueeze(1); // [B, T]
    auto w = mask.to(out.dtype());
    // FACT: m = torch.arange(4).unsqueeze(0) < torch.tensor([2, 4]).unsqueeze(1); w = m.to(torch.float32); w.div_(torch.tensor([2, 4]).unsqueeze(1)); assert is_copy_of(w, m) and m.dtype == torch.bool
    w.div_(lengths.unsqueeze(1)); // LOOKALIKE: tensor-alias-then-mutate -- the mask is bool: to(float) made a new tensor
    auto mean = (out * w.unsqueeze(-1)).sum(1);
    auto max = out.masked_fill(~mask.unsqueeze(-1), -1e4).amax(1);
    // FACT: l = torch.nn.LSTM(3, 5, num_layers=2, batch_first=True, bidirectional=True); _, (h, c) = l(torch.randn(4, 6, 3)); assert is_contiguous(h) and is_view_of(h.view(2, 2, 4, 5), h)
    auto top = h_n.view({layers_, 2, B, hidden_}).select(0, layers_ - 1); // LOOKALIKE: tensor-view-non-contiguous -- the final states are contiguous
    // FACT: h = torch.randn(4, 3, 5); assert raises(lambda: h.view(2, 2, 3, 5).select(0, 1).transpose(0, 1).view(3, 10), "view size is not compatible")
    auto last = top.transpose(0, 1).view({B, 2 * hidden_}); // EXPECT: tensor-view-non-contiguous -- [2, B, H] -> [B, 2, H] cannot merge its last two dims
    return head_(torch::cat({mean, max, last}, 1));
  }

  int64_t hidden_, layers_;
  torch::nn::Embedding embed_{nullptr};
  torch::nn::LSTM lstm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(TextClassifier);

// Pretrained vectors for the rows of words found in the vocabulary; <pad> must stay zero.
void load_pretrained(TextClassifier &model, const torch::Tensor &rows, const torch::Tensor &vectors) {
  {
    torch::NoGradGuard no_grad;
    // FACT: e = torch.nn.Embedding(5, 3); exec('with torch.no_grad(): e.weight.index_copy_(0, torch.tensor([1, 3]), torch.ones(2, 3))'); assert e.weight[3].sum() == 3
    model->embed_->weight.index_copy_(0, rows, vectors); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  // FACT: e = torch.nn.Embedding(5, 3); assert raises(lambda: e.weight[0].zero_(), "a view of a leaf Variable that requires grad")
  model->embed_->weight[0].zero_(); // EXPECT: tensor-inplace-on-leaf -- the guard's block has ended
}

void train(TextClassifier &model, const std::vector<Batch> &batches, const torch::Tensor &class_weight, int epochs,
           double clip) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  model->to(device);
  auto cw = class_weight.to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  for (int e = 0; e < epochs; ++e) {
    model->train();
    double epoch_loss = 0;
    std::vector<torch::Tensor> epoch_logits, epoch_labels;
    for (const auto &b : batches) {
      auto ids = b.ids.to(device), lengths = b.lengths.to(device), labels = b.labels.to(device);
      auto logits = model->forward(ids, lengths);
      auto probs = torch::softmax(logits, 1);
      // FACT: m = torch.nn.Linear(3, 4); p = torch.softmax(m(torch.randn(2, 3)), 1); p.clamp_min_(1e-6); l = torch.nn.functional.nll_loss(p.log(), torch.tensor([0, 1])); assert backward_fails(lambda: l.backward())
      probs.clamp_min_(1e-6); // EXPECT: tensor-inplace-on-saved -- softmax saved its result for the backward below
      auto loss = torch::nll_loss(probs.log(), labels, cw);
      opt.zero_grad();
      loss.backward();
      // FACT: m = torch.nn.Linear(3, 2); m(torch.randn(4, 3)).sum().backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1); assert m.weight.grad.norm() <= 0.1001
      torch::nn::utils::clip_grad_norm_(model->parameters(), clip); // LOOKALIKE: tensor-inplace-on-leaf -- rescales the gradients, not the parameters
      opt.step();
      epoch_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- only summed, waited for every batch
      // FACT: m = torch.nn.Linear(4, 2); ls = [m(torch.randn(3, 4)) for _ in range(3)]; assert kept_nodes(ls) >= 3
      epoch_logits.push_back(logits); // EXPECT: tensor-graph-kept-across-iterations -- only read for the accuracy below
      epoch_labels.push_back(labels);
    }
    auto acc = torch::cat(epoch_logits).argmax(1).eq(torch::cat(epoch_labels)).to(torch::kFloat).mean();
    std::cout << "epoch " << e << " loss " << epoch_loss / batches.size() << " train acc " << acc.item<double>() << "\n";
  }
}

// Macro F1; the per-class counts are kept on the host.
double evaluate(TextClassifier &model, const std::vector<Batch> &batches, int64_t classes,
                std::vector<int64_t> &predictions) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  model->eval();
  auto tp = torch::zeros({classes}, torch::kDouble), pred_n = torch::zeros_like(tp), gold_n = torch::zeros_like(tp);
  auto tp_a = tp.accessor<double, 1>(), pn_a = pred_n.accessor<double, 1>(), gn_a = gold_n.accessor<double, 1>();
  for (const auto &b : batches) {
    auto pred = model->forward(b.ids.to(device), b.lengths.to(device)).argmax(1).cpu(); // LOOKALIKE: tensor-sync-in-loop -- the predictions are data: written out and counted
    auto p = pred.accessor<int64_t, 1>();
    auto g = b.labels.accessor<int64_t, 1>();
    for (int64_t i = 0; i < pred.size(0); ++i) {
      predictions.push_back(p[i]);
      pn_a[p[i]] += 1;
      gn_a[g[i]] += 1;
      tp_a[p[i]] += p[i] == g[i];
    }
  }
  auto precision = tp.to(torch::kDouble);
  // FACT: tp = torch.tensor([2., 0.], dtype=torch.double); p = tp.to(torch.double); p.div_(torch.tensor([4., 1.])); assert shares_storage(p, tp) and tp[0] == 0.5
  precision.div_(pred_n.clamp_min(1)); // EXPECT: tensor-alias-then-mutate -- tp is already double: to() returned it, and recall reads it below
  auto recall = tp / gold_n.clamp_min(1);
  auto f1 = 2 * precision * recall / (precision + recall).clamp_min(1e-12);
  return f1.mean().item<double>();
}
