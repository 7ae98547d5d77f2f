// ESIM (Enhanced Sequential Inference Model) for SNLI-style natural language inference:
// BiLSTM input encoding, soft alignment, local inference enhancement, BiLSTM composition,
// masked average/max pooling and an MLP classifier.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace F = torch::nn::functional;

struct EsimConfig {
  int64_t vocab_size = 0;
  int64_t embed_dim = 300;
  int64_t hidden = 300;
  int64_t num_classes = 3;
  int64_t pad_idx = 0;
  double dropout = 0.5;
  double lr = 4e-4;
  size_t batch_size = 32;
  int64_t epochs = 10;
  double max_grad_norm = 10.0;
};

struct NliExample {
  std::vector<int64_t> premise, hypothesis;
  int64_t label;
};

struct Batch {
  torch::Tensor premise, hypothesis;
  std::vector<int64_t> labels;
};

using Vocab = std::unordered_map<std::string, int64_t>;

std::vector<int64_t> encode(const std::string& text, Vocab& vocab, bool grow) {
  std::istringstream ss(text);
  std::vector<int64_t> ids;
  for (std::string tok; ss >> tok;) {
    auto it = vocab.find(tok);
    if (it != vocab.end()) {
      ids.push_back(it->second);
    } else if (grow) {
      const int64_t id = static_cast<int64_t>(vocab.size());
      vocab.emplace(tok, id);
      ids.push_back(id);
    } else {
      ids.push_back(1);  // <unk>
    }
  }
  if (ids.empty()) ids.push_back(1);
  return ids;
}

// One example per line: "label<TAB>premise<TAB>hypothesis", tokens separated by spaces.
std::vector<NliExample> read_split(const std::string& path, Vocab& vocab, bool grow) {
  static const std::map<std::string, int64_t> labels{{"entailment", 0}, {"neutral", 1}, {"contradiction", 2}};
  std::vector<NliExample> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::string label, premise, hypothesis;
    std::getline(ss, label, '\t');
    std::getline(ss, premise, '\t');
    std::getline(ss, hypothesis, '\t');
    auto it = labels.find(label);
    if (it == labels.end()) continue;
    out.push_back({encode(premise, vocab, grow), encode(hypothesis, vocab, grow), it->second});
  }
  return out;
}

torch::Tensor pad(const std::vector<const std::vector<int64_t>*>& seqs, int64_t pad_idx) {
  size_t len = 0;
  for (auto* s : seqs) len = std::max(len, s->size());
  auto out = torch::full({static_cast<int64_t>(seqs.size()), static_cast<int64_t>(len)}, pad_idx, torch::kLong);
  auto acc = out.accessor<int64_t, 2>();
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t j = 0; j < seqs[i]->size(); ++j) acc[i][j] = (*seqs[i])[j];
  return out;
}

Batch make_batch(const std::vector<NliExample>& data, const std::vector<size_t>& order, size_t begin,
                 size_t size, int64_t pad_idx) {
  std::vector<const std::vector<int64_t>*> prem, hyp;
  Batch b;
  for (size_t k = begin; k < std::min(begin + size, order.size()); ++k) {
    prem.push_back(&data[order[k]].premise);
    hyp.push_back(&data[order[k]].hypothesis);
    b.labels.push_back(data[order[k]].label);
  }
  b.premise = pad(prem, pad_idx);
  b.hypothesis = pad(hyp, pad_idx);
  return b;
}

// GloVe text format; words missing from the file keep a small random vector.
torch::Tensor load_glove(const std::string& path, const Vocab& vocab, int64_t dim) {
  auto table = torch::empty({static_cast<int64_t>(vocab.size()), dim}, torch::kDouble).normal_(0.0, 0.1);
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::string word;
    ss >> word;
    auto it = vocab.find(word);
    if (it == vocab.end()) continue;
    auto vec = table[it->second];
    auto row = vec.accessor<double, 1>();
    for (int64_t j = 0; j < dim && ss; ++j) ss >> row[j];
  }
  return table;
}

struct SeqEncoderImpl : torch::nn::Module {
  SeqEncoderImpl(int64_t input, int64_t hidden) {
    lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(input, hidden).bidirectional(true)));
    for (auto& p : lstm->named_parameters()) {
      if (p.key().find("weight_ih") != std::string::npos) {
        torch::nn::init::xavier_uniform_(p.value());
      } else if (p.key().find("weight_hh") != std::string::npos) {
        torch::nn::init::orthogonal_(p.value());
      } else {
        p.value().detach().zero_();  // LOOKALIKE: tensor-inplace-on-detached -- initialisation of the bias itself, no graph has been built yet
        // FACT: p = torch.zeros(8, requires_grad=True); p.detach().narrow(0, 2, 2).fill_(1.0); assert p[2] == 1.0 and p.requires_grad
        if (p.key().find("bias_hh") != std::string::npos) p.value().detach().narrow(0, hidden, hidden).fill_(1.0);  // LOOKALIKE: tensor-inplace-on-detached -- sets the forget-gate bias on purpose, before any graph exists
      }
    }
  }

  // The LSTM runs time-major; callers get batch-first states back.
  torch::Tensor forward(const torch::Tensor& x) {
    auto out = std::get<0>(lstm->forward(x.transpose(0, 1)));
    return out.transpose(0, 1);
  }

  torch::nn::LSTM lstm{nullptr};
};
TORCH_MODULE(SeqEncoder);

// Softmax over keys, zeroed on padding and renormalised.
torch::Tensor masked_softmax(const torch::Tensor& scores, const torch::Tensor& mask) {
  auto attn = torch::softmax(scores, -1);
  // FACT: p = torch.softmax(torch.randn(2, 3, 4, requires_grad=True), -1); assert backward_fails(lambda: (p.mul_(torch.ones(2, 3, 4, dtype=torch.bool)), p.sum().backward()))
  attn.mul_(mask);  // EXPECT: tensor-inplace-on-saved
  return attn / (attn.sum(-1, true) + 1e-13);
}

// [x; x~; x - x~; x * x~]
torch::Tensor enhance(const torch::Tensor& x, const torch::Tensor& x_tilde) {
  auto diff = x;
  // FACT: x = torch.randn(2, 5, 6); d = x; d -= torch.randn(2, 5, 6); assert shares_storage(d, x)
  diff -= x_tilde;  // EXPECT: tensor-alias-then-mutate, tensor-inplace-on-saved
  return torch::cat({x, x_tilde, diff, x * x_tilde}, -1);
}

torch::Tensor masked_mean(const torch::Tensor& v, const torch::Tensor& mask) {
  auto w = mask.to(torch::kFloat);
  // FACT: m = torch.ones(2, 5, dtype=torch.bool); assert is_copy_of(m.to(torch.float), m)
  w.div_(w.sum(1, true).clamp_min(1.0));  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of a bool mask allocates, the mask is untouched
  return torch::bmm(w.unsqueeze(1), v).squeeze(1);
}

torch::Tensor masked_max(const torch::Tensor& v, const torch::Tensor& mask) {
  return std::get<0>(v.clone().masked_fill_(~mask.unsqueeze(-1), -1e7).max(1));  // EXPECT: tensor-unnecessary-clone
}

struct EsimImpl : torch::nn::Module {
  explicit EsimImpl(const EsimConfig& cfg) : cfg_(cfg) {
    const int64_t H = cfg.hidden;
    embed = register_module("embed", torch::nn::Embedding(cfg.vocab_size, cfg.embed_dim));
    // FACT: w = torch.randn(5, 3, requires_grad=True); assert raises(lambda: w[0].zero_(), "view of a leaf Variable")
    embed->weight[cfg.pad_idx].zero_();  // EXPECT: tensor-inplace-on-leaf
    encoder = register_module("encoder", SeqEncoder(cfg.embed_dim, H));
    projection = register_module("projection", torch::nn::Linear(8 * H, H));
    composer = register_module("composer", SeqEncoder(H, H));
    classifier = register_module("classifier", torch::nn::Sequential(
        torch::nn::Dropout(cfg.dropout), torch::nn::Linear(8 * H, H), torch::nn::Tanh(),
        torch::nn::Dropout(cfg.dropout), torch::nn::Linear(H, cfg.num_classes)));
    dropout = register_module("dropout", torch::nn::Dropout(cfg.dropout));
  }

  torch::Tensor forward(const torch::Tensor& premise, const torch::Tensor& hypothesis) {
    const int64_t B = premise.size(0), La = premise.size(1), Lb = hypothesis.size(1);
    auto a_mask = premise.ne(cfg_.pad_idx), b_mask = hypothesis.ne(cfg_.pad_idx);
    auto a = encoder(dropout(embed(premise)));
    auto b = encoder(dropout(embed(hypothesis)));

    // FACT: m = torch.ones(2, 5, dtype=torch.bool); assert raises(lambda: m.unsqueeze(2).expand(2, 5, 4).mul_(torch.ones(2, 1, 4, dtype=torch.bool)), "more than one element")
    auto pair = a_mask.unsqueeze(2).expand({B, La, Lb});
    pair.mul_(b_mask.unsqueeze(1));  // EXPECT: tensor-inplace-on-expanded
    auto sim = torch::bmm(a, b.transpose(1, 2));
    sim.masked_fill_(pair.logical_not(), -1e7);  // LOOKALIKE: tensor-inplace-on-saved -- bmm saves its operands, not its result
    auto a_tilde = torch::bmm(masked_softmax(sim, pair), b);
    auto b_tilde = torch::bmm(masked_softmax(sim.transpose(1, 2), pair.transpose(1, 2)), a);

    auto compose = [&](const torch::Tensor& x, const torch::Tensor& x_tilde, int64_t L) {
      auto m = enhance(x, x_tilde);
      // FACT: a = torch.randn(3, 2, 4).transpose(0, 1); m = torch.cat([a, a, a - a, a * a], -1); assert is_contiguous(m) and is_view_of(m.view(-1, 16), m)
      auto projected = torch::relu(projection(m.view({-1, m.size(-1)}))).view({B, L, -1});  // LOOKALIKE: tensor-view-non-contiguous -- cat wrote a fresh contiguous tensor though x is a transposed view
      return composer(dropout(projected));
    };
    auto v_a = compose(a, a_tilde, La), v_b = compose(b, b_tilde, Lb);

    auto stacked = torch::stack({masked_mean(v_a, a_mask), masked_max(v_a, a_mask),
                                 masked_mean(v_b, b_mask), masked_max(v_b, b_mask)});
    // FACT: s = torch.randn(4, 3, 10); assert is_copy_of(s.transpose(0, 1).reshape(3, -1), s)
    auto pooled = stacked.transpose(0, 1).reshape({B, -1});  // EXPECT: tensor-reshape-non-contiguous
    return classifier->forward(pooled);
  }

  EsimConfig cfg_;
  torch::nn::Embedding embed{nullptr};
  SeqEncoder encoder{nullptr}, composer{nullptr};
  torch::nn::Linear projection{nullptr};
  torch::nn::Sequential classifier{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(Esim);

double evaluate(Esim& model, const std::vector<NliExample>& data, const EsimConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<size_t> order(data.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  int64_t correct = 0;
  auto class_hits = torch::zeros({cfg.num_classes}, torch::kLong);
  auto class_total = torch::zeros({cfg.num_classes}, torch::kLong);
  for (size_t i = 0; i < order.size(); i += cfg.batch_size) {
    auto batch = make_batch(data, order, i, cfg.batch_size, cfg.pad_idx);
    auto logits = model(batch.premise.to(device), batch.hypothesis.to(device));
    auto labels = torch::tensor(batch.labels).to(device);
    auto hits = logits.argmax(-1).eq(labels);
    correct += hits.sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    class_hits += torch::bincount(labels.masked_select(hits), {}, cfg.num_classes);  // EXPECT: tensor-device-mismatch
    class_total += torch::bincount(torch::tensor(batch.labels), {}, cfg.num_classes);
  }
  std::cout << "per-class accuracy " << class_hits.to(torch::kDouble) / class_total.clamp_min(1) << std::endl;
  model->train();
  return static_cast<double>(correct) / static_cast<double>(data.size());
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "data/snli";
  torch::manual_seed(7);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  Vocab vocab{{"<pad>", 0}, {"<unk>", 1}};
  auto train = read_split(dir + "/train.tsv", vocab, /*grow=*/true);
  auto dev = read_split(dir + "/dev.tsv", vocab, /*grow=*/false);
  EsimConfig cfg;
  cfg.vocab_size = static_cast<int64_t>(vocab.size());

  Esim model(cfg);
  auto glove = load_glove(dir + "/glove.840B.300d.txt", vocab, cfg.embed_dim);
  {
    torch::NoGradGuard no_grad;
    model->embed->weight.copy_(glove);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard
  }
  model->to(device);
  torch::optim::Adam optim(model->parameters(), torch::optim::AdamOptions(cfg.lr));

  std::vector<size_t> order(train.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(7);
  double best_acc = 0.0;
  std::unordered_map<std::string, torch::Tensor> best_state;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    auto epoch_loss = torch::zeros({}, device);
    auto train_correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    for (size_t i = 0; i < order.size(); i += cfg.batch_size) {
      auto batch = make_batch(train, order, i, cfg.batch_size, cfg.pad_idx);
      auto labels = torch::tensor(batch.labels).to(device);  // LOOKALIKE: tensor-device-mismatch -- labels are moved before they meet the logits
      auto logits = model(batch.premise.to(device), batch.hypothesis.to(device));
      auto loss = F::cross_entropy(logits, labels);
      optim.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.max_grad_norm);
      optim.step();
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      train_correct += logits.argmax(-1).eq(labels).sum();  // LOOKALIKE: tensor-graph-kept-across-iterations -- argmax/eq carry no graph; the count stays on the device
    }
    const double steps = std::ceil(static_cast<double>(train.size()) / cfg.batch_size);
    const double dev_acc = evaluate(model, dev, cfg, device);
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / steps << " train acc "
              << train_correct.item<double>() / train.size() << " dev acc " << dev_acc << std::endl;
    if (dev_acc > best_acc) {
      best_acc = dev_acc;
      for (auto& kv : model->named_parameters()) {
        best_state[kv.key()] = kv.value().detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- the snapshot must not follow later optimizer steps
      }
    }
  }

  torch::NoGradGuard no_grad;
  for (auto& kv : model->named_parameters()) {
    kv.value().copy_(best_state.at(kv.key()));  // LOOKALIKE: tensor-inplace-on-leaf -- restoring the best weights under NoGradGuard
  }
  torch::save(model, "esim_best.pt");
  std::cout << "best dev accuracy " << best_acc << std::endl;
  return 0;
}
