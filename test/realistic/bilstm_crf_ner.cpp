// Named-entity tagging (CoNLL-2003, BIOES tags) after Lample et al. 2016 / Ma & Hovy 2016:
// pretrained word embeddings (fine-tuned, with word dropout) concatenated with a character CNN,
// a two-layer BiLSTM, and a linear-chain CRF with start/end/transition scores. Training minimises
// the CRF negative log-likelihood (forward algorithm in log space); decoding is Viterbi with
// backpointers; the dev set is scored by exact-match span F1.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

struct NerConfig {
  int64_t word_vocab = 400000, char_vocab = 96, word_dim = 100, char_dim = 30, char_filters = 50, char_kernel = 3;
  int64_t hidden = 200;
  double dropout = 0.5, word_dropout = 0.05, lr = 0.015, momentum = 0.9, decay = 0.05, clip = 5.0;
  int epochs = 50;
};

struct Batch {
  torch::Tensor words, chars, tags, mask; // [B, T] int64, [B, T, W] int64, [B, T] int64, [B, T] bool; 0 = padding
};

// BIOES: inside a span only I-X / E-X of the same type may follow; after O, E-X or S-X no I/E.
torch::Tensor allowed_transitions(const std::vector<std::string> &names) {
  const auto K = static_cast<int64_t>(names.size());
  auto allowed = torch::ones({K, K}, torch::kBool);
  auto acc = allowed.accessor<bool, 2>();
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) {
      const char a = names[i][0], b = names[j][0];
      const auto ta = names[i].size() > 2 ? names[i].substr(2) : "", tb = names[j].size() > 2 ? names[j].substr(2) : "";
      const bool open = a == 'B' || a == 'I', cont = b == 'I' || b == 'E';
      acc[i][j] = open ? (cont && ta == tb) : !cont;
    }
  return allowed;
}

struct CharCNNImpl : torch::nn::Module {
  explicit CharCNNImpl(const NerConfig &cfg) {
    namespace nn = torch::nn;
    emb_ = register_module("emb", nn::Embedding(nn::EmbeddingOptions(cfg.char_vocab, cfg.char_dim).padding_idx(0)));
    conv_ = register_module("conv", nn::Conv1d(nn::Conv1dOptions(cfg.char_dim, cfg.char_filters, cfg.char_kernel)
                                                   .padding(cfg.char_kernel / 2)));
  }

  // chars [B, T, W] -> one vector per word [B, T, F], max-pooled over the characters
  torch::Tensor forward(const torch::Tensor &chars) {
    const auto B = chars.size(0), T = chars.size(1), W = chars.size(2);
    // FACT: e = torch.randn(2, 3, 5, 6); assert is_view_of(e.permute(0, 1, 3, 2).reshape(6, 6, 5), e)
    auto e = emb_(chars).permute({0, 1, 3, 2}).reshape({B * T, -1, W}); // LOOKALIKE: tensor-reshape-non-contiguous -- B and T stay adjacent and in order: a view
    auto h = torch::tanh(conv_(e));                                      // [B * T, F, W]
    // FACT: c = torch.randint(0, 9, (2, 3, 5)); p = (c == 0); assert is_contiguous(p) and is_view_of(p.view(6, 1, 5), p)
    auto pad = (chars == 0).view({B * T, 1, W}); // LOOKALIKE: tensor-view-non-contiguous -- a comparison result is contiguous
    // FACT: conv = torch.nn.Conv1d(6, 4, 3, padding=1); h = torch.tanh(conv(torch.randn(6, 6, 5))); h.masked_fill_(torch.rand(6, 1, 5) < 0.3, -1e4); assert backward_fails(lambda: h.max(2)[0].sum().backward())
    h.masked_fill_(pad, -1e4); // EXPECT: tensor-inplace-on-saved -- tanh saved its output for backward
    // FACT: h = torch.randn(6, 4, 5); m = h.max(2)[0]; assert is_view_of(m.view(2, 3, -1), m)
    return std::get<0>(h.max(2)).view({B, T, -1}); // LOOKALIKE: tensor-view-non-contiguous -- the max over the last dim is a fresh contiguous tensor
  }

  torch::nn::Embedding emb_{nullptr};
  torch::nn::Conv1d conv_{nullptr};
};
TORCH_MODULE(CharCNN);

struct BiLstmCrfImpl : torch::nn::Module {
  BiLstmCrfImpl(const NerConfig &cfg, const std::vector<std::string> &tag_names) : word_dropout_(cfg.word_dropout) {
    namespace nn = torch::nn;
    const auto K = static_cast<int64_t>(tag_names.size());
    word_emb_ = register_module("word_emb", nn::Embedding(nn::EmbeddingOptions(cfg.word_vocab, cfg.word_dim).padding_idx(0)));
    char_cnn_ = register_module("char_cnn", CharCNN(cfg));
    lstm_ = register_module("lstm", nn::LSTM(nn::LSTMOptions(cfg.word_dim + cfg.char_filters, cfg.hidden)
                                                 .num_layers(2).bidirectional(true).batch_first(true).dropout(cfg.dropout)));
    dropout_ = register_module("dropout", nn::Dropout(cfg.dropout));
    hidden2tag_ = register_module("hidden2tag", nn::Linear(2 * cfg.hidden, K));
    transitions_ = register_parameter("transitions", torch::empty({K, K})); // [from, to]
    start_ = register_parameter("start_transitions", torch::empty({K}));
    end_ = register_parameter("end_transitions", torch::empty({K}));
    allowed_ = register_buffer("allowed", allowed_transitions(tag_names));
    // FACT: t = torch.nn.Parameter(torch.empty(4, 4)); torch.nn.init.uniform_(t, -0.1, 0.1); assert t.is_leaf and t.requires_grad and t.abs().max() <= 0.1
    nn::init::uniform_(transitions_, -0.1, 0.1); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    nn::init::uniform_(start_, -0.1, 0.1);
    nn::init::uniform_(end_, -0.1, 0.1);
    // FACT: t = torch.nn.Parameter(torch.randn(4, 4)); assert raises(lambda: t.masked_fill_(torch.eye(4) > 0, -1e4), "a leaf Variable that requires grad")
    transitions_.masked_fill_(allowed_.logical_not(), -1e4); // EXPECT: tensor-inplace-on-leaf -- the transition matrix is a parameter and grad mode is on
  }

  // GloVe rows for the in-vocabulary words (float32, same order as the vocabulary).
  void load_pretrained(const torch::Tensor &vectors) {
    torch::NoGradGuard no_grad;
    word_emb_->weight.narrow(0, 0, vectors.size(0)).copy_(vectors); // LOOKALIKE: tensor-inplace-on-leaf, tensor-copy-narrowing -- under NoGradGuard; float32 rows into float32 weights
  }

  // words [B, T], chars [B, T, W] -> emissions [B, T, K]
  torch::Tensor emissions(const torch::Tensor &words, const torch::Tensor &chars) {
    const auto B = words.size(0), T = words.size(1);
    auto w = word_emb_(words);
    if (is_training() && word_dropout_ > 0) {
      auto drop = torch::rand({B, T, 1}, w.options()) < word_dropout_;
      // FACT: emb = torch.nn.Embedding(10, 3); w = emb(torch.tensor([[1, 2, 3]])); w.masked_fill_(torch.tensor([[[True], [False], [False]]]), 0); w.sum().backward(); assert emb.weight.grad[1].abs().sum() == 0 and emb.weight.grad[2].abs().sum() == 3
      w.masked_fill_(drop, 0); // LOOKALIKE: tensor-inplace-on-saved -- an embedding saves its indices and weight, not its output
    }
    auto x = dropout_(torch::cat({w, char_cnn_(chars)}, -1));
    auto h = std::get<0>(lstm_->forward(x)); // [B, T, 2H]
    // FACT: o, _ = torch.nn.LSTM(6, 5, batch_first=True, bidirectional=True)(torch.randn(2, 4, 6)); assert is_copy_of(o.reshape(8, -1), o)
    auto em = hidden2tag_(dropout_(h.reshape({B * T, -1}))); // EXPECT: tensor-reshape-non-contiguous -- the batch_first LSTM output is transposed: the whole [B, T, 2H] is copied
    // FACT: e = torch.nn.Linear(10, 5)(torch.randn(8, 10)); assert is_view_of(e.view(2, 4, -1), e)
    return em.view({B, T, -1}); // LOOKALIKE: tensor-view-non-contiguous -- the Linear's output is contiguous
  }

  // log Z per sentence by the forward algorithm; the first token of every sentence is real.
  torch::Tensor log_partition(const torch::Tensor &em, const torch::Tensor &mask) {
    auto alpha = start_ + em.select(1, 0); // [B, K]
    for (int64_t t = 1; t < em.size(1); ++t) {
      auto next = torch::logsumexp(alpha.unsqueeze(2) + transitions_ + em.select(1, t).unsqueeze(1), 1);
      auto m = mask.select(1, t).unsqueeze(1).to(em.dtype());
      alpha = next * m + alpha * (1 - m); // LOOKALIKE: tensor-graph-kept-across-iterations -- the recursion is the computation: log Z is differentiated
    }
    return torch::logsumexp(alpha + end_, 1);
  }

  torch::Tensor gold_score(const torch::Tensor &em, const torch::Tensor &tags, const torch::Tensor &mask) {
    const auto T = em.size(1);
    auto m = mask.to(em.dtype());
    auto emit = em.gather(2, tags.unsqueeze(2)).squeeze(2);
    auto trans = transitions_.index({tags.narrow(1, 0, T - 1), tags.narrow(1, 1, T - 1)});
    auto last = tags.gather(1, (mask.sum(1) - 1).unsqueeze(1)).squeeze(1);
    return start_.index({tags.select(1, 0)}) + (emit * m).sum(1) + (trans * m.narrow(1, 1, T - 1)).sum(1) + end_.index({last});
  }

  torch::Tensor nll(const torch::Tensor &em, const torch::Tensor &tags, const torch::Tensor &mask) {
    return (log_partition(em, mask) - gold_score(em, tags, mask)).mean();
  }

  // Best tag sequence per sentence (host vectors, true lengths).
  std::vector<std::vector<int64_t>> decode(const torch::Tensor &emissions, const torch::Tensor &mask) {
    auto em = emissions.detach();
    // FACT: em = torch.nn.Linear(4, 5)(torch.randn(2, 6, 4)); g = em.gather(2, torch.randint(0, 5, (2, 6, 1))); d = em.detach(); d.masked_fill_(torch.rand(2, 6, 1) < 0.5, 0); assert shares_storage(d, em) and backward_fails(lambda: g.sum().backward())
    em.masked_fill_(mask.logical_not().unsqueeze(2), 0); // EXPECT: tensor-inplace-on-detached -- detach shares storage and version with the caller's emissions, which gather saved for the loss
    torch::NoGradGuard no_grad;
    auto score = start_ + em.select(1, 0);
    std::vector<torch::Tensor> backpointers;
    for (int64_t t = 1; t < em.size(1); ++t) {
      auto [best, idx] = (score.unsqueeze(2) + transitions_).max(1); // best previous tag for every tag
      score = torch::where(mask.select(1, t).unsqueeze(1), best + em.select(1, t), score);
      backpointers.push_back(idx); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, integer indices
    }
    auto last = std::get<1>((score + end_).max(1)).cpu();
    auto lengths = mask.sum(1).cpu();
    auto bp = torch::stack(backpointers, 1).cpu(); // [B, T - 1, K]
    std::vector<std::vector<int64_t>> paths;
    for (int64_t b = 0; b < em.size(0); ++b) {
      std::vector<int64_t> path{last[b].item<int64_t>()};
      for (int64_t t = lengths[b].item<int64_t>() - 1; t > 0; --t)
        path.push_back(bp[b][t - 1][path.back()].item<int64_t>()); // LOOKALIKE: tensor-sync-in-loop -- a host tensor, and the value is the next index
      std::reverse(path.begin(), path.end());
      paths.push_back(std::move(path));
    }
    return paths;
  }

  double word_dropout_;
  torch::nn::Embedding word_emb_{nullptr};
  CharCNN char_cnn_{nullptr};
  torch::nn::LSTM lstm_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear hidden2tag_{nullptr};
  torch::Tensor transitions_, start_, end_, allowed_;
};
TORCH_MODULE(BiLstmCrf);

using Span = std::tuple<int64_t, int64_t, std::string>;

std::set<Span> spans(const std::vector<int64_t> &tags, const std::vector<std::string> &names) {
  std::set<Span> out;
  int64_t start = -1;
  for (int64_t i = 0; i < static_cast<int64_t>(tags.size()); ++i) {
    const auto &n = names[tags[i]];
    const auto type = n.size() > 2 ? n.substr(2) : "";
    if (n[0] == 'S')
      out.emplace(i, i, type), start = -1;
    else if (n[0] == 'B')
      start = i;
    else if (n[0] == 'E' && start >= 0 && names[tags[start]].substr(2) == type)
      out.emplace(start, i, type), start = -1;
    else if (n[0] == 'O')
      start = -1;
  }
  return out;
}

double span_f1(BiLstmCrf &model, const std::vector<Batch> &data, const std::vector<std::string> &names, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t tp = 0, n_pred = 0, n_gold = 0;
  for (const auto &b : data) {
    auto pred = model->decode(model->emissions(b.words.to(device), b.chars.to(device)), b.mask.to(device));
    auto gold = b.tags.accessor<int64_t, 2>();
    for (size_t i = 0; i < pred.size(); ++i) {
      std::vector<int64_t> g(pred[i].size());
      for (size_t t = 0; t < g.size(); ++t)
        g[t] = gold[static_cast<int64_t>(i)][static_cast<int64_t>(t)];
      auto ps = spans(pred[i], names), gs = spans(g, names);
      for (const auto &s : ps)
        tp += static_cast<int64_t>(gs.count(s));
      n_pred += static_cast<int64_t>(ps.size());
      n_gold += static_cast<int64_t>(gs.size());
    }
  }
  const double p = n_pred ? double(tp) / n_pred : 0.0, r = n_gold ? double(tp) / n_gold : 0.0;
  return p + r > 0 ? 2 * p * r / (p + r) : 0.0;
}

void train(BiLstmCrf &model, const std::vector<Batch> &train_set, const std::vector<Batch> &dev_set,
           const std::vector<std::string> &names, const NerConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum));
  double best_f1 = 0;
  int64_t step = 0;
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto epoch_nll = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t train_tokens = 0, train_correct = 0;
    for (const auto &b : train_set) {
      auto words = b.words.to(device), chars = b.chars.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto tags = b.tags.to(device), mask = b.mask.to(device);
      auto em = model->emissions(words, chars);
      auto loss = model->nll(em, tags, mask);
      auto pred = model->decode(em, mask); // token accuracy on the training batch, for the log
      auto gold = b.tags.accessor<int64_t, 2>();
      for (size_t i = 0; i < pred.size(); ++i)
        for (size_t t = 0; t < pred[i].size(); ++t, ++train_tokens)
          train_correct += pred[i][t] == gold[static_cast<int64_t>(i)][static_cast<int64_t>(t)];
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      // FACT: l = torch.nn.Linear(3, 2); s = torch.zeros(()); exec('for _ in range(3):\n n = l(torch.randn(4, 3)).logsumexp(1).mean(); n.backward(); s += n'); assert s.requires_grad and kept_nodes(s) >= 3 * 3
      epoch_nll += loss; // EXPECT: tensor-graph-kept-across-iterations -- the epoch total holds every step's graph
      std::cout << "step " << ++step << " nll " << loss.item<float>() << "\n"; // EXPECT: tensor-sync-in-loop -- a log line that waits for the GPU every step
    }
    for (auto &group : opt.param_groups())
      static_cast<torch::optim::SGDOptions &>(group.options()).lr(cfg.lr / (1 + cfg.decay * (epoch + 1)));
    const double f1 = span_f1(model, dev_set, names, device);
    std::cout << "epoch " << epoch << " nll " << epoch_nll.item<double>() / train_set.size() << " train acc "
              << double(train_correct) / std::max<int64_t>(train_tokens, 1) << " dev F1 " << f1 << "\n";
    if (f1 > best_f1) {
      best_f1 = f1;
      torch::save(model, "ner_best.pt");
    }
  }
}
