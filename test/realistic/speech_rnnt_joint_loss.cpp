// RNN-Transducer: LSTM encoder, LSTM prediction network, additive joint network,
// a reference (alpha recursion) transducer loss, greedy decoding and a training loop.
#include <torch/torch.h>

#include <iostream>
#include <vector>

namespace nn = torch::nn;

struct RnntConfig {
  int64_t feat_dim = 80;
  int64_t enc_hidden = 256;
  int64_t pred_hidden = 256;
  int64_t joint_dim = 320;
  int64_t vocab = 128;  // index 0 is blank
  int64_t blank = 0;
  double joint_dropout = 0.1;
  double logit_temperature = 1.0;
  int64_t max_symbols_per_step = 5;
  double lr = 5e-4;
  int64_t epochs = 10;
};

// Per-utterance mean/variance normalisation over time.
torch::Tensor normalize_features(const torch::Tensor& feats) {
  auto x = feats.contiguous();
  auto stdv = x.std(1, /*unbiased=*/true, /*keepdim=*/true).clamp_min(1e-5);
  // FACT: f = torch.randn(2, 5, 3); assert shares_storage(f.contiguous(), f)
  x.sub_(x.mean(1, /*keepdim=*/true)); // EXPECT: tensor-alias-then-mutate
  return x / stdv;
}

// SpecAugment-style time masking on a copy of the batch.
torch::Tensor time_mask(const torch::Tensor& feats, int64_t num_masks, int64_t max_width) {
  const auto T = feats.size(1);
  auto masked = feats.clone(); // LOOKALIKE: tensor-unnecessary-clone -- the copy is written through views below
  for (int64_t i = 0; i < num_masks; ++i) {
    const auto w = torch::randint(1, max_width + 1, {1}).item<int64_t>();
    const auto t0 = torch::randint(0, std::max<int64_t>(T - w, 1), {1}).item<int64_t>();
    // FACT: f = torch.randn(2, 10, 4); m = f.clone(); m.narrow(1, 2, 3).zero_(); assert is_copy_of(m, f) and f.narrow(1, 2, 3).abs().sum() > 0
    masked.narrow(1, t0, w).zero_(); // LOOKALIKE: tensor-alias-then-mutate -- masked is a clone, the caller's features stay intact
  }
  return masked;
}

struct EncoderImpl : nn::Module {
  nn::LSTM lstm{nullptr};
  nn::Linear out{nullptr};
  int64_t hidden;

  explicit EncoderImpl(const RnntConfig& c) : hidden(c.enc_hidden) {
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(2 * c.feat_dim, c.enc_hidden).num_layers(3).batch_first(true)));
    out = register_module("out", nn::Linear(c.enc_hidden, c.joint_dim));
  }

  torch::Tensor forward(const torch::Tensor& feats) {
    const auto B = feats.size(0), T2 = feats.size(1) / 2, F = feats.size(2);
    // stack pairs of frames: 2x time subsampling
    // FACT: x = torch.randn(2, 9, 4); y = x.narrow(1, 0, 8); assert is_view_of(y.reshape(2, 4, 8), x)
    auto stacked = feats.narrow(1, 0, 2 * T2).reshape({B, T2, 2 * F}); // LOOKALIKE: tensor-reshape-non-contiguous -- narrowing time keeps each frame pair adjacent: a view
    auto h = std::get<0>(lstm->forward(stacked));
    // FACT: lstm = torch.nn.LSTM(4, 8, batch_first=True); out, _ = lstm(torch.randn(3, 5, 4)); assert raises(lambda: out.view(-1, 8), "view size is not compatible")
    auto flat = h.view({-1, hidden}); // EXPECT: tensor-view-non-contiguous
    return out(flat).view({B, T2, -1});
  }
};
TORCH_MODULE(Encoder);

struct PredictorImpl : nn::Module {
  nn::Embedding embed{nullptr};
  nn::LSTM lstm{nullptr};
  nn::Linear out{nullptr};
  int64_t hidden;

  explicit PredictorImpl(const RnntConfig& c) : hidden(c.pred_hidden) {
    embed = register_module("embed", nn::Embedding(c.vocab, c.pred_hidden));
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(c.pred_hidden, c.pred_hidden).batch_first(true)));
    out = register_module("out", nn::Linear(c.pred_hidden, c.joint_dim));
    torch::NoGradGuard no_grad;
    embed->weight[c.blank].zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- blank row cleared under NoGradGuard
  }

  std::tuple<torch::Tensor, std::tuple<torch::Tensor, torch::Tensor>> step(
      const torch::Tensor& tokens, torch::optional<std::tuple<torch::Tensor, torch::Tensor>> state) {
    auto r = lstm->forward(embed(tokens), state);
    return {out(std::get<0>(r)), std::get<1>(r)};
  }

  torch::Tensor forward(const torch::Tensor& targets, int64_t blank) {
    const auto B = targets.size(0), U = targets.size(1);
    auto start = torch::full({B, 1}, blank, targets.options());
    auto h = std::get<0>(lstm->forward(embed(torch::cat({start, targets}, 1))));
    // FACT: lstm = torch.nn.LSTM(4, 8, batch_first=True); out, _ = lstm(torch.randn(3, 5, 4)); assert is_copy_of(out.flatten(0, 1), out)
    auto rows = h.flatten(0, 1); // EXPECT: tensor-reshape-non-contiguous
    return out(rows).view({B, U + 1, -1});
  }
};
TORCH_MODULE(Predictor);

struct JointImpl : nn::Module {
  nn::Linear proj{nullptr};
  double dropout, temperature;

  JointImpl(const RnntConfig& c) : dropout(c.joint_dropout), temperature(c.logit_temperature) {
    proj = register_module("proj", nn::Linear(c.joint_dim, c.vocab));
    nn::init::xavier_uniform_(proj->weight); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init works under no-grad
  }

  // f: [B, T, J], g: [B, U+1, J] -> logits [B, T, U+1, V]
  torch::Tensor forward(const torch::Tensor& f, const torch::Tensor& g) {
    auto z = torch::tanh(f.unsqueeze(2) + g.unsqueeze(1));
    if (is_training() && dropout > 0) {
      const double keep = 1.0 - dropout;
      z.mul_(torch::bernoulli(torch::full_like(z, keep)).div_(keep)); // EXPECT: tensor-inplace-on-saved
    }
    auto logits = proj(z);
    if (temperature != 1.0) logits.div_(temperature); // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    return logits;
  }
};
TORCH_MODULE(Joint);

// Reference transducer loss (no length masking): -log P(y | x) averaged over the batch.
torch::Tensor rnnt_loss(const torch::Tensor& logits, const torch::Tensor& targets, int64_t blank) {
  const auto B = logits.size(0), T = logits.size(1), U1 = logits.size(2);
  auto log_probs = torch::log_softmax(logits, -1);
  auto blank_lp = log_probs.select(3, blank);  // [B, T, U+1]
  auto idx = targets.view({B, 1, U1 - 1, 1}).expand({B, T, U1 - 1, 1});
  auto emit_lp = log_probs.narrow(2, 0, U1 - 1).gather(3, idx).squeeze(3);  // [B, T, U]

  std::vector<std::vector<torch::Tensor>> alpha(T, std::vector<torch::Tensor>(U1));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t u = 0; u < U1; ++u) {
      if (t == 0 && u == 0) {
        alpha[t][u] = torch::zeros({B}, log_probs.options());
        continue;
      }
      std::vector<torch::Tensor> paths;
      if (t > 0) paths.push_back(alpha[t - 1][u] + blank_lp.select(1, t - 1).select(1, u));
      if (u > 0) paths.push_back(alpha[t][u - 1] + emit_lp.select(1, t).select(1, u - 1));
      alpha[t][u] = torch::logsumexp(torch::stack(paths), 0);
    }
  }
  auto ll = alpha[T - 1][U1 - 1] + blank_lp.select(1, T - 1).select(1, U1 - 1);
  return -ll.mean();
}

struct Transducer {
  Encoder enc;
  Predictor pred;
  Joint joint;
  explicit Transducer(const RnntConfig& c) : enc(c), pred(c), joint(c) {}
  std::vector<torch::Tensor> parameters() {
    auto p = enc->parameters();
    for (auto& t : pred->parameters()) p.push_back(t);
    for (auto& t : joint->parameters()) p.push_back(t);
    return p;
  }
};

// Greedy decoding, one utterance at a time; enc_lens are frame counts before subsampling.
std::vector<std::vector<int64_t>> greedy_decode(Transducer& m, const torch::Tensor& feats,
                                                const torch::Tensor& enc_lens, const RnntConfig& c) {
  torch::NoGradGuard no_grad;
  const auto B = feats.size(0);
  auto f_all = m.enc->forward(normalize_features(feats));
  auto sub_lens = torch::empty({B}, torch::kLong);
  sub_lens.copy_(enc_lens.to(torch::kFloat) / 2.0); // EXPECT: tensor-copy-narrowing
  const auto T_max = std::min(sub_lens.max().item<int64_t>(), f_all.size(1));
  auto best = torch::full({B, f_all.size(1) * c.max_symbols_per_step}, c.blank, torch::kLong);
  std::vector<std::vector<int64_t>> hyps(B);
  for (int64_t b = 0; b < B; ++b) {
    const auto Tb = std::min(enc_lens.to(torch::kLong)[b].item<int64_t>() / 2, T_max); // EXPECT: tensor-clone-in-loop
    auto token = torch::full({1, 1}, c.blank, torch::kLong);
    auto [g, state] = m.pred->step(token, torch::nullopt);
    int64_t n_out = 0;
    for (int64_t t = 0; t < Tb; ++t) {
      auto f_t = f_all.select(0, b).select(0, t).view({1, 1, -1});
      for (int64_t s = 0; s < c.max_symbols_per_step; ++s) {
        auto k = m.joint->forward(f_t, g).argmax(-1).view({1, 1});
        const auto kid = k.item<int64_t>();
        if (kid == c.blank) break;
        best[b][n_out++] = k.squeeze(); // LOOKALIKE: tensor-copy-narrowing -- argmax is int64, same as the buffer
        hyps[b].push_back(kid);
        std::tie(g, state) = m.pred->step(k, state);
      }
    }
  }
  return hyps;
}

void train_rnnt(const RnntConfig& c, const std::vector<std::pair<torch::Tensor, torch::Tensor>>& batches) {
  Transducer model(c);
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(c.lr));
  torch::Tensor last_loss;
  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    model.enc->train();
    model.joint->train();
    std::vector<torch::Tensor> epoch_losses;
    for (const auto& [feats, targets] : batches) {
      auto x = time_mask(normalize_features(feats), 2, 20);
      auto f = model.enc->forward(x);
      auto g = model.pred->forward(targets, c.blank);
      auto loss = rnnt_loss(model.joint->forward(f, g), targets, c.blank);
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model.parameters(), 5.0);
      opt.step();
      epoch_losses.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations
      last_loss = loss; // LOOKALIKE: tensor-graph-kept-across-iterations -- one handle overwritten: one graph at a time
    }
    auto mean = torch::stack(epoch_losses).mean().item<double>();
    std::cout << "epoch " << epoch << " loss " << mean << " last " << last_loss.item<double>() << "\n";
    model.enc->eval();
    model.joint->eval();
    const auto& probe = batches.front().first;
    auto lens = torch::full({probe.size(0)}, probe.size(1), torch::kInt);
    auto hyps = greedy_decode(model, batches.front().first, lens, c);
    std::cout << "  sample hyp length " << hyps.front().size() << "\n";
  }
}
