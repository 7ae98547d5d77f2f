// OCR line recogniser at inference time: a VGG-style CNN turns [B, 1, 32, W] text-line crops
// into column features, a batch-first BiLSTM reads them, and the per-column class scores are
// decoded greedily under CTC (best class per column, repeats collapsed, blanks dropped). The
// decoding stays on the GPU; the strings are assembled on the CPU once every batch has run.
#include <torch/torch.h>
#include <cctype>
#include <iostream>
#include <string>
#include <vector>

struct OcrConfig {
  std::string charset = "0123456789abcdefghijklmnopqrstuvwxyz-./"; // class 0 is the CTC blank
  int64_t img_h = 32, channels = 256, hidden = 256;
  double review_below = 0.6; // lines less confident than this are saved for review
  bool digits_only = false;  // amount and date fields
};

struct RecognizerImpl : torch::nn::Module {
  explicit RecognizerImpl(const OcrConfig &cfg) : num_classes_(int64_t(cfg.charset.size()) + 1) {
    namespace nn = torch::nn;
    cnn_ = register_module("cnn", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 64, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                                                 nn::Conv2d(nn::Conv2dOptions(64, 128, 3).padding(1)), nn::ReLU(), nn::MaxPool2d(2),
                                                 nn::Conv2d(nn::Conv2dOptions(128, cfg.channels, 3).padding(1)),
                                                 nn::BatchNorm2d(cfg.channels), nn::ReLU(),
                                                 nn::MaxPool2d(nn::MaxPool2dOptions({2, 1}).stride({2, 1}))));
    rnn_ = register_module("rnn", nn::LSTM(nn::LSTMOptions(cfg.channels * (cfg.img_h / 8), cfg.hidden).bidirectional(true).batch_first(true)));
    fc_ = register_module("fc", nn::Linear(2 * cfg.hidden, num_classes_));
  }

  // images [B, 1, H, W] -> log-probabilities [T, B, K], time-major as CTC wants them.
  torch::Tensor forward(const torch::Tensor &images) {
    auto f = cnn_->forward(images); // [B, C, H / 8, W / 4]
    const auto B = f.size(0), C = f.size(1), Hp = f.size(2), T = f.size(3);
    // FACT: f = torch.randn(2, 3, 4, 5); p = f.permute(0, 3, 1, 2); assert not is_contiguous(p) and is_view_of(p.view(2, 5, 12), f)
    auto seq = f.permute({0, 3, 1, 2}).view({B, T, C * Hp}); // LOOKALIKE: tensor-view-non-contiguous -- C and H' stay adjacent and in order
    auto out = std::get<0>(rnn_->forward(seq)); // [B, T, 2 * hidden]
    // FACT: l = torch.nn.LSTM(4, 3, batch_first=True, bidirectional=True); o = l(torch.randn(2, 5, 4))[0]; assert raises(lambda: o.view(10, 6), "view size is not compatible")
    auto logits = fc_(out.view({B * T, -1})); // EXPECT: tensor-view-non-contiguous -- a batch_first LSTM returns its [T, B, 2H] result transposed
    return logits.view({B, T, -1}).transpose(0, 1).log_softmax(2);
  }

  int64_t num_classes_;
  torch::nn::Sequential cnn_{nullptr};
  torch::nn::LSTM rnn_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(Recognizer);

// Per-line contrast normalisation: zero mean and unit variance over each crop.
torch::Tensor preprocess(const torch::Tensor &images) {
  const auto B = images.size(0);
  auto x = images.reshape({B, -1});
  // FACT: im = torch.rand(2, 1, 4, 6); x = im.reshape(2, -1); x.sub_(x.mean(1, keepdim=True)).div_(x.std(1, keepdim=True) + 1e-5); assert shares_storage(x, im) and abs(im.mean().item()) < 1e-5
  x.sub_(x.mean(1, /*keepdim=*/true)).div_(x.std(1, /*unbiased=*/true, /*keepdim=*/true) + 1e-5); // EXPECT: tensor-alias-then-mutate -- reshape of the contiguous batch is a view: the caller's crops are normalised in place
  // FACT: im = torch.rand(2, 1, 4, 6); x = im.reshape(2, -1); assert is_view_of(x.view_as(im), im)
  return x.view_as(images); // LOOKALIKE: tensor-view-non-contiguous -- x is a plain reshape of a contiguous batch
}

struct GreedyResult {
  torch::Tensor ids, keep; // [B, T] best class per column, and which columns emit a character
  torch::Tensor summary;   // [B, 2]: characters emitted, confidence
};

GreedyResult ctc_greedy(const torch::Tensor &log_probs) {
  const auto T = log_probs.size(0), B = log_probs.size(1);
  // FACT: lp = torch.randn(5, 2, 7).log_softmax(2); assert is_copy_of(lp.transpose(0, 1).flatten(0, 1), lp)
  auto flat = log_probs.transpose(0, 1).flatten(0, 1); // EXPECT: tensor-reshape-non-contiguous -- every score of the batch is copied batch-major
  auto [best_lp, best] = flat.max(1);
  auto ids = best.view({B, T});
  auto prev = torch::full_like(ids, -1); // prev[:, t] = ids[:, t - 1]
  // FACT: i = torch.randint(0, 5, (2, 6)); p = torch.full_like(i, -1); p.narrow(1, 1, 5).copy_(i.narrow(1, 0, 5)); assert is_copy_of(p, i) and torch.equal(p[:, 1:], i[:, :-1])
  prev.narrow(1, 1, T - 1).copy_(ids.narrow(1, 0, T - 1)); // LOOKALIKE: tensor-inplace-overlap -- prev is a buffer of its own
  auto keep = (ids != 0) & (ids != prev);

  // One [B, 2] table, so the host needs a single transfer per batch.
  auto summary = torch::empty({B, 2}, ids.options());
  // FACT: i = torch.tensor([[1, 0], [2, 2]]); s = torch.empty(2, 2, dtype=i.dtype); s[:, 0].copy_((i != 0).sum(1)); assert s[:, 0].tolist() == [1, 2]
  summary.select(1, 0).copy_(keep.sum(1)); // LOOKALIKE: tensor-copy-narrowing -- a count of a bool mask is int64 already
  // FACT: s = torch.zeros(2, 2, dtype=torch.long); s[:, 1].copy_(torch.tensor([0.93, 0.41])); assert s[:, 1].tolist() == [0, 0]
  summary.select(1, 1).copy_((best_lp.view({B, T}) * keep).sum(1).exp()); // EXPECT: tensor-copy-narrowing -- the table has the ids' dtype: every confidence below 1 becomes 0
  return {ids, keep, summary};
}

std::string to_text(const torch::TensorAccessor<int64_t, 1> &ids, const torch::TensorAccessor<bool, 1> &keep,
                    const std::string &charset) {
  std::string s;
  for (int64_t t = 0; t < ids.size(0); ++t)
    if (keep[t])
      s += charset[ids[t] - 1];
  return s;
}

std::vector<std::string> recognize(Recognizer &model, const std::vector<torch::Tensor> &batches, const OcrConfig &cfg,
                                   std::vector<torch::Tensor> &review) {
  torch::NoGradGuard no_grad;
  model->eval();
  torch::Device device(torch::kCUDA);
  model->to(device);
  auto digit_bias = torch::zeros({int64_t(cfg.charset.size()) + 1});
  for (size_t i = 0; i < cfg.charset.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(cfg.charset[i])))
      digit_bias[i + 1] = -1e4;

  std::vector<GreedyResult> results;
  double conf_sum = 0;
  for (const auto &images : batches) {
    auto log_probs = model->forward(preprocess(images).to(device)); // LOOKALIKE: tensor-device-mismatch -- the crops are moved with the model
    if (cfg.digits_only)
      log_probs = log_probs + digit_bias; // EXPECT: tensor-device-mismatch -- the bias was built on the CPU
    auto r = ctc_greedy(log_probs);
    results.push_back(r); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, ids and masks only
    conf_sum += r.summary.select(1, 1).to(torch::kFloat).mean().item<double>(); // EXPECT: tensor-sync-in-loop -- stalls the GPU every batch for a number only averaged
  }
  std::cout << "mean line confidence " << conf_sum / double(batches.size()) << "\n";

  // Postprocessing on the CPU, after the last batch was queued.
  std::vector<std::string> texts;
  for (size_t i = 0; i < results.size(); ++i) {
    auto ids = results[i].ids.cpu(); // LOOKALIKE: tensor-sync-in-loop -- the ids are needed on the host to build the strings
    auto keep = results[i].keep.cpu();
    auto summary = results[i].summary.cpu();
    auto ia = ids.accessor<int64_t, 2>();
    auto ka = keep.accessor<bool, 2>();
    auto sa = summary.accessor<int64_t, 2>();
    for (int64_t b = 0; b < ids.size(0); ++b) {
      texts.push_back(to_text(ia[b], ka[b], cfg.charset));
      if (sa[b][1] < cfg.review_below)
        review.push_back(batches[i][b].clone()); // LOOKALIKE: tensor-clone-in-loop -- each crop copied is kept for the review queue
    }
  }
  return texts;
}
