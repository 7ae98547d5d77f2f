// Speech recognition with CTC: conv front-end + BiLSTM over padded log-mel batches, greedy decoding on the dev set.
#include <torch/torch.h>
#include <iostream>
#include <vector>

struct Utterance {
  torch::Tensor feats;  // [T, n_mels] log-mel frames
  torch::Tensor labels; // [L] token ids, no blanks
};

struct AcousticModelImpl : torch::nn::Module {
  AcousticModelImpl(int64_t n_mels, int64_t hidden, int64_t vocab) {
    conv = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(n_mels, hidden, 3).stride(2).padding(1)));
    rnn = register_module("rnn", torch::nn::LSTM(torch::nn::LSTMOptions(hidden, hidden).num_layers(2).bidirectional(true).batch_first(true)));
    out = register_module("out", torch::nn::Linear(2 * hidden, vocab));
  }
  // [B, T, n_mels] -> logits [B, T', vocab] with T' = (T - 1) / 2 + 1
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::relu(conv(x.transpose(1, 2))).transpose(1, 2); // Conv1d wants [B, C, T]
    return out(std::get<0>(rnn(h)));
  }
  torch::nn::Conv1d conv{nullptr};
  torch::nn::LSTM rnn{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(AcousticModel);

int64_t frames_after_conv(int64_t t) { return (t - 1) / 2 + 1; }

// Global CMVN with the training set's statistics.
torch::Tensor normalize(const Utterance &u, const torch::Tensor &mean, const torch::Tensor &stdev) {
  torch::Tensor x = u.feats;
  // FACT: f = torch.randn(50, 8) * 3 + 1; x = f; x -= f.mean(0); assert shares_storage(x, f) and f.mean(0).abs().max() < 1e-5
  x -= mean; // EXPECT: tensor-alias-then-mutate -- 'x' is the dataset's tensor: every epoch normalises it once more
  x /= stdev; // EXPECT: tensor-alias-then-mutate
  return x;
}

struct Batch {
  torch::Tensor feats, targets, input_lengths, target_lengths;
};

Batch collate(const std::vector<Utterance> &data, const std::vector<size_t> &idx, const torch::Tensor &mean,
              const torch::Tensor &stdev) {
  std::vector<torch::Tensor> feats, labels;
  std::vector<int64_t> in_lens, tgt_lens;
  for (auto i : idx) {
    feats.push_back(normalize(data[i], mean, stdev));
    labels.push_back(data[i].labels);
    in_lens.push_back(frames_after_conv(data[i].feats.size(0)));
    tgt_lens.push_back(data[i].labels.size(0));
  }
  return {torch::nn::utils::rnn::pad_sequence(feats, /*batch_first=*/true), torch::cat(labels),
          torch::tensor(in_lens, torch::kLong), torch::tensor(tgt_lens, torch::kLong)};
}

double train_epoch(AcousticModel &model, torch::optim::Adam &opt, const std::vector<Utterance> &data,
                   const std::vector<std::vector<size_t>> &batches, const torch::Tensor &mean,
                   const torch::Tensor &stdev, int64_t blank, double clip) {
  model->train();
  torch::Tensor smooth = torch::zeros({});
  std::vector<torch::Tensor> history;
  int64_t step = 0;
  for (const auto &idx : batches) {
    auto batch = collate(data, idx, mean, stdev);
    auto log_probs = torch::log_softmax(model->forward(batch.feats), 2); // [B, T', V]
    auto pad = torch::arange(log_probs.size(1)).unsqueeze(0) >= batch.input_lengths.unsqueeze(1);
    // FACT: m = torch.nn.Linear(3, 5); lp = torch.log_softmax(m(torch.randn(2, 4, 3)), 2); lp.masked_fill_(torch.tensor([[False, False, True, True], [False] * 4]).unsqueeze(2), 0.0); assert backward_fails(lambda: lp.sum().backward())
    log_probs.masked_fill_(pad.unsqueeze(2), 0.0); // EXPECT: tensor-inplace-on-saved -- log_softmax saved its result; backward() below raises
    auto tm = log_probs.transpose(0, 1); // CTC wants [T', B, V]
    auto loss = torch::ctc_loss(tm, batch.targets, batch.input_lengths, batch.target_lengths, blank,
                                at::Reduction::Mean, /*zero_infinity=*/true);
    opt.zero_grad();
    loss.backward();
    for (auto &p : model->parameters())
      if (p.grad().defined())
        p.grad().clamp_(-clip, clip); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient, not the parameter
    opt.step();
    // FACT: m = torch.nn.Linear(3, 1); ls = [m(torch.randn(4, 3)).pow(2).mean() for _ in range(3)]; [l.backward() for l in ls]; s = 0.98 * (0.98 * (0.98 * torch.zeros(()) + 0.02 * ls[0]) + 0.02 * ls[1]) + 0.02 * ls[2]; assert kept_nodes(s) > 2 * kept_nodes(ls[0])
    smooth = 0.98 * smooth + 0.02 * loss; // EXPECT: tensor-graph-kept-across-iterations -- only printed, never differentiated
    history.push_back(loss.detach()); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
    // Share of frames predicted blank: CTC models collapse to all-blank early on.
    // FACT: lp = torch.randn(2, 5, 7).log_softmax(2).transpose(0, 1); assert raises(lambda: lp.view(-1, 7), "view size is not compatible")
    auto blank_rate = (tm.view({-1, tm.size(2)}).argmax(1) == blank).to(torch::kFloat).mean(); // EXPECT: tensor-view-non-contiguous -- tm is [T', B, V] transposed
    if (++step % 50 == 0)
      std::cout << "step " << step << " loss " << smooth.item<double>() << " blank " << blank_rate.item<double>() << "\n";
  }
  return torch::stack(history).mean().item<double>();
}

// Greedy CTC decoding; returns token errors (edit distance) over the dev set.
int64_t edit_distance(const std::vector<int64_t> &a, const std::vector<int64_t> &b) {
  std::vector<int64_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    int64_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      int64_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::pair<double, int64_t> evaluate(AcousticModel &model, const std::vector<Utterance> &dev, const torch::Tensor &mean,
                                    const torch::Tensor &stdev, int64_t blank) {
  torch::NoGradGuard no_grad;
  model->eval();
  torch::Device device(torch::kCUDA);
  model->to(device);
  double total_loss = 0;
  int64_t errors = 0;
  for (const auto &u : dev) {
    auto x = ((u.feats - mean) / stdev).unsqueeze(0).to(device);
    auto lp = torch::log_softmax(model->forward(x), 2); // [1, T', V]
    auto T = lp.size(1), L = u.labels.size(0);
    auto loss = torch::ctc_loss(lp.transpose(0, 1), u.labels.unsqueeze(0).to(device), at::IntArrayRef({T}),
                                at::IntArrayRef({L}), blank);
    total_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    // FACT: l = torch.randn(1, 6, 5).log_softmax(2); assert is_view_of(l.view(-1, 5), l)
    auto frames = lp.view({-1, lp.size(2)}); // LOOKALIKE: tensor-view-non-contiguous -- log_softmax of a Linear output is contiguous
    auto best = frames.argmax(1).cpu(); // LOOKALIKE: tensor-sync-in-loop -- one copy per utterance, the host tensor is decoded
    std::vector<int64_t> hyp, ref(u.labels.data_ptr<int64_t>(), u.labels.data_ptr<int64_t>() + L);
    int64_t prev = blank;
    for (int64_t t = 0; t < T; ++t) {
      int64_t k = best[t].item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- 'best' is already on the host
      if (k != prev && k != blank)
        hyp.push_back(k);
      prev = k;
    }
    errors += edit_distance(hyp, ref);
  }
  return {total_loss / dev.size(), errors};
}
