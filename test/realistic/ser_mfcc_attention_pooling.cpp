// Speech emotion recognition: MFCC(+delta) -> small CNN -> BiLSTM ->
// additive attention pooling -> emotion classes (IEMOCAP-style 4-way).
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

namespace ser {

struct SerConfig {
  int64_t n_mfcc = 40;
  int64_t conv_channels = 32;
  int64_t hidden = 128;
  int64_t attn_dim = 128;
  int64_t num_classes = 4;
  double preemph = 0.97;
  double logit_tau = 1.0;  // logit adjustment strength
  double max_norm = 3.0;
  double lr = 5e-4;
  int64_t batch_size = 32;
  int64_t epochs = 40;
  int64_t log_every = 100;
};

struct Utterance {
  torch::Tensor mfcc;  // features-major, as the extractor writes them
  int64_t label = 0;
};

struct SerBatch {
  torch::Tensor feats;
  torch::Tensor lengths;
  torch::Tensor labels;
};

// Provided by the audio frontend library.
std::vector<std::pair<torch::Tensor, int64_t>> read_wav_list(const std::string& list);
torch::Tensor compute_mfcc(const torch::Tensor& wav, int64_t n_mfcc);
void save_embeddings(const std::string& path, const std::vector<torch::Tensor>& embs);

void preemphasis_(torch::Tensor& wav, double coef) {
  const int64_t n = wav.size(0);
  // FACT: is_copy_of(0.97 * (w:=torch.randn(100)).narrow(0,0,99), w)
  wav.narrow(0, 1, n - 1).sub_(coef * wav.narrow(0, 0, n - 1));  // LOOKALIKE: tensor-inplace-overlap -- coef * x is evaluated into a temporary first
}

// Stacks first-order deltas under the static coefficients; d[0] = 0.
torch::Tensor with_deltas(const torch::Tensor& mfcc) {
  const int64_t T = mfcc.size(1);
  auto delta = torch::cat({mfcc.narrow(1, 0, 1), mfcc}, 1);
  // FACT: (x:=torch.arange(12.).view(2,6)).narrow(1,1,5).sub_(x.narrow(1,0,5)) is not None and x[0].tolist() != [0.,1.,1.,1.,1.,1.]
  delta.narrow(1, 1, T).sub_(delta.narrow(1, 0, T));  // EXPECT: tensor-inplace-overlap
  return torch::cat({mfcc, delta.narrow(1, 1, T)}, 0);
}

struct Cmvn {
  torch::Tensor mean;
  torch::Tensor std;

  void fit(const std::vector<Utterance>& utts) {
    const int64_t dim = utts.front().mfcc.size(0);
    mean = torch::zeros({dim, 1});
    std = torch::ones({dim, 1});
    auto sum = torch::zeros({dim}, torch::kDouble);
    auto sq = torch::zeros({dim}, torch::kDouble);
    int64_t frames = 0;
    for (const auto& u : utts) {
      auto d = u.mfcc.to(torch::kDouble);
      sum += d.sum(1);
      sq += d.pow(2).sum(1);
      frames += d.size(1);
    }
    auto m = sum / double(frames);
    mean.copy_(m.unsqueeze(1));  // EXPECT: tensor-copy-narrowing
    auto sd = (sq / double(frames) - m * m).clamp_min(1e-10).sqrt();
    std.copy_(sd.unsqueeze(1).to(std.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the double->float conversion is spelled out
  }

  torch::Tensor apply(const torch::Tensor& mfcc) const {
    auto x = mfcc.to(torch::kFloat);
    // FACT: (x:=torch.randn(3)).to(torch.float32).data_ptr() == x.data_ptr()
    x.sub_(mean).div_(std);  // EXPECT: tensor-alias-then-mutate
    return x;
  }
};

std::vector<Utterance> load_corpus(const std::string& list, const SerConfig& cfg) {
  std::vector<Utterance> out;
  for (auto& item : read_wav_list(list)) {
    preemphasis_(item.first, cfg.preemph);
    out.push_back({with_deltas(compute_mfcc(item.first, cfg.n_mfcc)), item.second});
  }
  return out;
}

SerBatch collate(const std::vector<Utterance>& utts, const std::vector<size_t>& idx, const Cmvn& cmvn) {
  int64_t T = 0;
  for (auto i : idx) T = std::max<int64_t>(T, utts[i].mfcc.size(1));
  const int64_t B = idx.size(), D = utts[idx[0]].mfcc.size(0);
  SerBatch b{torch::zeros({B, D, T}), torch::empty({B}, torch::kLong), torch::empty({B}, torch::kLong)};
  for (int64_t k = 0; k < B; ++k) {
    const auto& u = utts[idx[k]];
    b.feats[k].narrow(1, 0, u.mfcc.size(1)).copy_(cmvn.apply(u.mfcc));
    b.lengths[k] = u.mfcc.size(1);
    b.labels[k] = u.label;
  }
  return b;
}

class AttentionPoolImpl : public torch::nn::Module {
 public:
  AttentionPoolImpl(int64_t dim, int64_t attn_dim)
      : proj_(register_module("proj", torch::nn::Linear(dim, attn_dim))),
        score_(register_module("score", torch::nn::Linear(attn_dim, 1))) {}

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& h, const torch::Tensor& mask) {
    auto scores = score_(torch::tanh(proj_(h))).squeeze(-1);
    // FACT: not backward_fails(lambda: (s:=torch.nn.Linear(4,1)(torch.randn(2,5,4)).squeeze(-1)).masked_fill_(torch.rand(2,5)>0.5, -1e4).softmax(1).sum().backward())
    scores.masked_fill_(mask.logical_not(), -1e4);  // LOOKALIKE: tensor-inplace-on-saved -- addmm saves its inputs, not this output
    auto weights = torch::softmax(scores, 1);
    // FACT: backward_fails(lambda: ((w:=torch.randn(2,5,requires_grad=True).softmax(1)).mul_(torch.ones(2,5)) * torch.randn(2,5)).sum().backward())
    weights.mul_(mask);  // EXPECT: tensor-inplace-on-saved
    auto pooled = torch::bmm(weights.unsqueeze(1), h).squeeze(1);
    return {pooled, weights};
  }

 private:
  torch::nn::Linear proj_, score_;
};
TORCH_MODULE(AttentionPool);

struct SerOutput {
  torch::Tensor logits;
  torch::Tensor pooled;
  torch::Tensor weights;
};

class SerNetImpl : public torch::nn::Module {
 public:
  explicit SerNetImpl(const SerConfig& cfg) : hidden_(cfg.hidden) {
    const int64_t c = cfg.conv_channels, in_dim = 2 * cfg.n_mfcc;
    conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, c, 3).padding(1)));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(c));
    conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).stride({1, 2}).padding(1)));
    bn2_ = register_module("bn2", torch::nn::BatchNorm2d(c));
    lstm_ = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(c * ((in_dim + 1) / 2), cfg.hidden)
                                                        .batch_first(true)
                                                        .bidirectional(true)));
    pool_ = register_module("pool", AttentionPool(cfg.hidden, cfg.attn_dim));
    head_ = register_module("head", torch::nn::Linear(cfg.hidden, cfg.num_classes));
  }

  SerOutput forward(const torch::Tensor& feats, const torch::Tensor& lengths) {
    const int64_t B = feats.size(0), D = feats.size(1), T = feats.size(2);
    // FACT: not raises(lambda: torch.randn(2,13,7).transpose(1,2).view(2,1,7,13))
    auto x = feats.transpose(1, 2).view({B, 1, T, D});  // LOOKALIKE: tensor-view-non-contiguous -- only a size-1 dim is inserted
    x = torch::relu(bn1_(conv1_(x)));
    x = torch::relu(bn2_(conv2_(x)));
    // FACT: is_copy_of((y:=torch.randn(2,8,7,5).permute(0,2,1,3)).reshape(2,7,-1), y)
    x = x.permute({0, 2, 1, 3}).reshape({B, T, -1});  // EXPECT: tensor-reshape-non-contiguous
    auto h = std::get<0>(lstm_->forward(x));
    // FACT: is_view_of((h:=torch.randn(7,2,16).transpose(0,1)).reshape(2,7,2,8), h)
    h = h.reshape({B, T, 2, hidden_}).sum(2);  // LOOKALIKE: tensor-reshape-non-contiguous -- only the last dim is split, always a view
    auto mask = torch::arange(T, lengths.options()).unsqueeze(0) < lengths.unsqueeze(1);
    auto pooled = pool_(h, mask);
    return {head_(pooled.first), pooled.first, pooled.second};
  }

  void init_bias_from_prior(const torch::Tensor& class_counts) {
    auto prior = class_counts.to(torch::kFloat) / class_counts.sum();
    // FACT: raises(lambda: torch.nn.Linear(3,4).bias.copy_(torch.zeros(4)), "leaf Variable")
    head_->bias.copy_(prior.log());  // EXPECT: tensor-inplace-on-leaf
  }

  // Max-norm constraint on the classifier rows, applied after each step.
  void apply_max_norm(double max_norm) {
    head_->weight.data().renorm_(2, 0, max_norm);  // LOOKALIKE: tensor-inplace-on-detached, tensor-inplace-on-leaf -- rewriting the weights is the point, after step() and outside any graph
  }

 private:
  int64_t hidden_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::LSTM lstm_{nullptr};
  AttentionPool pool_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(SerNet);

double unweighted_recall(const torch::Tensor& pred, const torch::Tensor& target, int64_t num_classes) {
  double sum = 0.0;
  int64_t present = 0;
  for (int64_t c = 0; c < num_classes; ++c) {
    auto is_c = target.eq(c);
    const int64_t n = is_c.sum().item<int64_t>();
    if (n == 0) continue;
    sum += double(pred.eq(c).logical_and(is_c).sum().item<int64_t>()) / n;  // LOOKALIKE: tensor-sync-in-loop -- callers pass CPU tensors, moved once after the loop
    ++present;
  }
  return present ? sum / present : 0.0;
}

void train(const SerConfig& cfg, const std::string& train_list, const std::string& val_list) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto train_utts = load_corpus(train_list, cfg);
  auto val_utts = load_corpus(val_list, cfg);
  Cmvn cmvn;
  cmvn.fit(train_utts);

  auto counts = torch::zeros({cfg.num_classes}, torch::kLong);
  for (const auto& u : train_utts) counts[u.label] += 1;
  SerNet model(cfg);
  model->init_bias_from_prior(counts);
  model->to(device);

  auto log_prior = (counts.to(torch::kFloat) / counts.sum()).log();
  auto class_w = (counts.sum().to(torch::kFloat) / (cfg.num_classes * counts.to(torch::kFloat))).to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));

  std::vector<size_t> order(train_utts.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(17);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::shuffle(order.begin(), order.end(), rng);
    int64_t correct = 0, seen = 0;
    auto running_loss = torch::zeros({}, device);
    std::vector<torch::Tensor> embedding_log;
    for (size_t start = 0; start + cfg.batch_size <= order.size(); start += cfg.batch_size) {
      std::vector<size_t> idx(order.begin() + start, order.begin() + start + cfg.batch_size);
      auto batch = collate(train_utts, idx, cmvn);
      auto feats = batch.feats.to(device);
      auto lengths = batch.lengths.to(device);
      auto labels = batch.labels.to(device);

      auto out = model->forward(feats, lengths);
      auto adjusted = out.logits + cfg.logit_tau * log_prior;  // EXPECT: tensor-device-mismatch
      auto loss = F::cross_entropy(adjusted, labels, F::CrossEntropyFuncOptions().weight(class_w));  // LOOKALIKE: tensor-device-mismatch -- class_w was moved to the device before the loop

      if (step % cfg.log_every == 0) {
        auto emb = out.pooled.detach();
        // FACT: backward_fails(lambda: (lambda p, l: (l(p), p.detach().div_(2))[0].sum().backward())(torch.randn(2,4,requires_grad=True)*1, torch.nn.Linear(4,3)))
        emb.div_(emb.norm(2, -1, true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-detached
        embedding_log.push_back(emb.cpu());
      }

      opt.zero_grad();
      loss.backward();
      opt.step();
      model->apply_max_norm(cfg.max_norm);

      running_loss += loss.detach();
      correct += out.logits.argmax(1).eq(labels).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
      seen += labels.size(0);
      ++step;
    }
    save_embeddings("emb_epoch" + std::to_string(epoch) + ".pt", embedding_log);

    model->eval();
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> val_logits, val_labels;
    auto correct_dev = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    std::vector<size_t> vidx(val_utts.size());
    std::iota(vidx.begin(), vidx.end(), 0);
    for (size_t start = 0; start < vidx.size(); start += cfg.batch_size) {
      std::vector<size_t> idx(vidx.begin() + start, vidx.begin() + std::min(vidx.size(), start + cfg.batch_size));
      auto batch = collate(val_utts, idx, cmvn);
      auto labels = batch.labels.to(device);
      auto out = model->forward(batch.feats.to(device), batch.lengths.to(device));
      auto adjusted = out.logits + cfg.logit_tau * log_prior.to(device);  // EXPECT: tensor-clone-in-loop
      val_logits.push_back(adjusted);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard no graph is recorded
      val_labels.push_back(labels);
      correct_dev += adjusted.argmax(1).eq(labels).sum();  // LOOKALIKE: tensor-sync-in-loop -- accumulated on the device, read once below
    }
    const auto preds = torch::cat(val_logits).argmax(1).cpu();
    const auto targets = torch::cat(val_labels).cpu();
    std::cout << "epoch " << epoch << " loss " << running_loss.item<double>() / std::max<int64_t>(1, seen / cfg.batch_size)
              << " train_acc " << double(correct) / std::max<int64_t>(1, seen)
              << " val_wa " << double(correct_dev.item<int64_t>()) / std::max<size_t>(1, val_utts.size())
              << " val_ua " << unweighted_recall(preds, targets, cfg.num_classes) << std::endl;
  }
  torch::save(model, "ser_attnpool.pt");
}

}  // namespace ser

int main(int argc, char** argv) {
  ser::SerConfig cfg;
  if (argc < 3) {
    std::cerr << "usage: ser_train train.lst val.lst" << std::endl;
    return 1;
  }
  ser::train(cfg, argv[1], argv[2]);
  return 0;
}
