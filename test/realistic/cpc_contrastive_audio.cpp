// Contrastive predictive coding (van den Oord et al. 2018) on raw 16 kHz audio: a five-layer
// strided conv encoder (total stride 160, one frame per 10 ms), a GRU over the frames, and an
// InfoNCE loss in which the context at t scores the true frame t + k (k = 1..K) against
// negatives drawn from the whole batch. A speaker probe trains alongside on detached context;
// phone probes and a streaming novelty scorer use the trained model.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

struct CpcConfig {
  int64_t channels = 512, hidden = 256, k_steps = 12, n_negatives = 10;
  int64_t window = 20480, batch_size = 8, epochs = 200, log_every = 100;
  int64_t n_speakers = 251, n_phones = 41;
  double lr = 2e-4, probe_lr = 1e-3, temperature = 1.0;
};

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(int64_t channels) {
    // (kernel, stride, padding) as in the paper: 20480 samples -> 128 frames
    const std::vector<std::tuple<int64_t, int64_t, int64_t>> layers = {{10, 5, 3}, {8, 4, 2}, {4, 2, 1}, {4, 2, 1}, {4, 2, 1}};
    int64_t in = 1;
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto [k, s, p] = layers[i];
      convs_.push_back(register_module("conv" + std::to_string(i),
                                       torch::nn::Conv1d(torch::nn::Conv1dOptions(in, channels, k).stride(s).padding(p))));
      norms_.push_back(register_module("norm" + std::to_string(i), torch::nn::BatchNorm1d(channels)));
      in = channels;
    }
  }

  torch::Tensor forward(torch::Tensor x) { // [B, 1, L] -> [B, C, L / 160]
    for (size_t i = 0; i < convs_.size(); ++i)
      x = torch::relu(norms_[i](convs_[i](x)));
    return x;
  }

  std::vector<torch::nn::Conv1d> convs_;
  std::vector<torch::nn::BatchNorm1d> norms_;
};
TORCH_MODULE(Encoder);

struct CpcModelImpl : torch::nn::Module {
  explicit CpcModelImpl(const CpcConfig &cfg) {
    enc_ = register_module("enc", Encoder(cfg.channels));
    gru_ = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(cfg.channels, cfg.hidden).batch_first(true)));
    for (auto &p : gru_->named_parameters())
      if (p.key().find("weight_hh") != std::string::npos)
        torch::nn::init::orthogonal_(p.value()); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    for (int64_t k = 0; k < cfg.k_steps; ++k)
      predictors_.push_back(register_module("W" + std::to_string(k + 1), torch::nn::Linear(cfg.hidden, cfg.channels)));
  }

  // wave [B, L] -> z [B, T, C] (encoded frames), c [B, T, H] (context)
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &wave) {
    auto z = enc_(wave.unsqueeze(1)).transpose(1, 2);
    auto c = std::get<0>(gru_(z));
    return {z, c};
  }

  Encoder enc_{nullptr};
  torch::nn::GRU gru_{nullptr};
  std::vector<torch::nn::Linear> predictors_;
};
TORCH_MODULE(CpcModel);

// InfoNCE over K future steps; the negatives for every (b, t) are frames of any utterance of the batch.
torch::Tensor info_nce(CpcModel &model, const torch::Tensor &z, const torch::Tensor &c, const CpcConfig &cfg) {
  const auto B = z.size(0), T = z.size(1), C = z.size(2);
  const auto N = cfg.n_negatives;
  // FACT: e = torch.randn(2, 6, 5); z = e.transpose(1, 2); p = z.reshape(2 * 5, 6); assert is_copy_of(p, e) and not z.is_contiguous()
  auto pool = z.reshape({B * T, C}); // EXPECT: tensor-reshape-non-contiguous -- z is the transposed conv output: every frame of the batch is copied
  auto neg_idx = torch::randint(B * T, {B * T * N});
  auto negatives = pool.index_select(0, neg_idx).view({B, T, N, C}); // EXPECT: tensor-device-mismatch -- the model trains on CUDA but the sampled indices are a host tensor: index_select rejects them

  auto total = torch::zeros({}, z.options());
  for (int64_t k = 1; k <= cfg.k_steps; ++k) {
    const auto L = T - k;
    auto pred = model->predictors_[k - 1](c.narrow(1, 0, L)); // [B, L, C]
    auto cand = z.narrow(1, k, L).unsqueeze(2).expand({B, L, N + 1, C});
    // FACT: p = torch.randn(2, 3, 1, 4); c = p.expand(2, 3, 6, 4); assert raises(lambda: c.narrow(2, 1, 5).copy_(torch.randn(2, 3, 5, 4)), "more than one element of the written-to tensor refers to a single memory location")
    cand.narrow(2, 1, N).copy_(negatives.narrow(1, k, L)); // EXPECT: tensor-inplace-on-expanded -- the N + 1 candidate slots are one positive frame in memory: copy_ raises
    // FACT: p = torch.randn(2, 3, 1, 4); q = torch.randn(2, 3, 4); s = (p.expand(2, 3, 6, 4) * q.unsqueeze(2)).sum(-1); assert s.shape == (2, 3, 6) and is_copy_of(s, p)
    auto scores = (cand * pred.unsqueeze(2)).sum(-1); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded candidates are only read
    // FACT: w = torch.randn(3, 4, requires_grad=True); s = (torch.randn(2, 3) @ w).sum(-1); s.div_(0.5); s.exp().sum().backward(); assert w.grad is not None
    scores.div_(cfg.temperature); // LOOKALIKE: tensor-inplace-on-saved -- a sum saves no tensor: its output is free to change
    auto e = torch::exp(scores - std::get<0>(scores.max(-1, true)));
    // FACT: w = torch.randn(3, 4, requires_grad=True); e = torch.exp(torch.randn(2, 3) @ w); e.div_(e.sum(-1, keepdim=True)); assert backward_fails(lambda: e[:, 0].log().sum().backward())
    e.div_(e.sum(-1, true)); // EXPECT: tensor-inplace-on-saved -- exp saved its result for backward: the normalisation in place makes backward() fail
    total = total - torch::log(e.select(-1, 0) + 1e-8).mean(); // LOOKALIKE: tensor-device-mismatch -- total was made with z's options, on z's device
  }
  return total / cfg.k_steps;
}

// Fixed-length windows cut at random from whole utterances, with the speaker id as target.
struct AudioWindows : torch::data::datasets::Dataset<AudioWindows> {
  AudioWindows(std::vector<torch::Tensor> utts, std::vector<int64_t> speakers, int64_t window)
      : utts_(std::move(utts)), speakers_(std::move(speakers)), window_(window) {}

  torch::data::Example<> get(size_t i) override {
    const auto &u = utts_[i];
    const auto start = torch::randint(u.size(0) - window_ + 1, {1}).item<int64_t>();
    return {u.narrow(0, start, window_), torch::tensor(speakers_[i])};
  }
  torch::optional<size_t> size() const override { return utts_.size(); }

  std::vector<torch::Tensor> utts_;
  std::vector<int64_t> speakers_;
  int64_t window_;
};

void train_cpc(CpcModel &model, torch::nn::Linear &spk_probe, AudioWindows data, const CpcConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  spk_probe->to(device);
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(data).map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(cfg.batch_size).drop_last(true));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  torch::optim::Adam probe_opt(spk_probe->parameters(), torch::optim::AdamOptions(cfg.probe_lr));

  torch::Tensor smoothed;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    for (auto &batch : *loader) {
      auto wave = batch.data.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto spk = batch.target.to(device);
      auto zc = model->forward(wave);
      auto nce = info_nce(model, zc.first, zc.second, cfg);

      // The probe sees the encoder frames but must not shape them.
      auto feats = zc.first.detach();
      // FACT: conv = torch.nn.Conv1d(1, 4, 3); z = torch.relu(conv(torch.randn(2, 1, 9))).transpose(1, 2); loss = (z * torch.randn(2, 7, 4)).sum(); f = z.detach(); f.div_(f.norm(2, -1, keepdim=True).clamp_min(1e-6)); assert backward_fails(lambda: loss.backward())
      feats.div_(feats.norm(2, -1, true).clamp_min(1e-6)); // EXPECT: tensor-inplace-on-detached -- detach shares z's storage and version: relu saved it, so backward() below fails
      auto spk_loss = torch::nn::functional::cross_entropy(spk_probe(feats.mean(1)), spk);

      opt.zero_grad();
      probe_opt.zero_grad();
      (nce + spk_loss).backward();
      opt.step();
      probe_opt.step();

      smoothed = smoothed.defined() ? 0.98 * smoothed + 0.02 * nce.detach() : nce.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- only detached values are kept
      if (++step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " nce " << smoothed.item<float>() // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
                  << " spk " << spk_loss.item<float>() << "\n";
    }
  }
}

// Phone labels are aligned to the 10 ms frames: wave [B, L], phones [B, L / 160] int64.
using PhoneBatch = std::pair<torch::Tensor, torch::Tensor>;

void fit_phone_probe(CpcModel &model, torch::nn::Linear &probe, const std::vector<PhoneBatch> &train, torch::Device device,
                     int64_t epochs) {
  model->eval();
  probe->to(device);
  torch::optim::SGD opt(probe->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    for (const auto &b : train) {
      torch::Tensor c;
      {
        torch::NoGradGuard no_grad;
        c = model->forward(b.first.to(device)).second;
      }
      // FACT: g = torch.nn.GRU(3, 4, batch_first=True); c, _ = g(torch.randn(2, 5, 3)); f = c.contiguous().view(-1, 4); assert f.shape == (10, 4)
      auto frames = c.contiguous().view({-1, c.size(-1)}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
      auto loss = torch::nn::functional::cross_entropy(probe(frames), b.second.to(device).view({-1}));
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
  }
}

double phone_probe_accuracy(CpcModel &model, torch::nn::Linear &probe, const std::vector<PhoneBatch> &val, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t total = 0;
  for (const auto &b : val) {
    auto c = model->forward(b.first.to(device)).second;
    // FACT: g = torch.nn.GRU(3, 4, batch_first=True); c, _ = g(torch.randn(2, 5, 3)); assert not c.is_contiguous() and raises(lambda: c.view(-1, 4), "view size is not compatible")
    auto frames = c.view({-1, c.size(-1)}); // EXPECT: tensor-view-non-contiguous -- a batch_first GRU returns its [T, B, H] output transposed: view throws
    correct += (probe(frames).argmax(-1) == b.second.to(device).view({-1})).sum();
    total += b.second.numel();
  }
  return static_cast<double>(correct.item<int64_t>()) / static_cast<double>(total); // LOOKALIKE: tensor-sync-in-loop -- one read after the loop
}

// Utterance embeddings for the speaker-verification export: mean context, unit length.
torch::Tensor utterance_embedding(CpcModel &model, const torch::Tensor &wave) {
  auto c = model->forward(wave).second;
  auto emb = c.mean(1).detach();
  // FACT: c = torch.randn(2, 5, 3, requires_grad=True) * 2; m = c.mean(1); e = m.detach(); e.div_(e.norm(2, -1, keepdim=True)); assert shares_storage(e, m) and not shares_storage(e, c)
  emb.div_(emb.norm(2, -1, true)); // LOOKALIKE: tensor-inplace-on-detached -- detach of a fresh mean that no other handle reads
  return emb;
}

// Live use on the CPU: 10 ms hops of a stream come in; the encoder runs on the last second of
// audio and the score says how well the context predicted the newest frame (novelty for a VAD).
class StreamingScorer {
public:
  StreamingScorer(CpcModel model, const CpcConfig &cfg)
      : model_(std::move(model)), window_(torch::zeros({16000})), frames_(torch::zeros({cfg.k_steps + 1, cfg.channels})) {
    model_->eval();
  }

  float push(const torch::Tensor &hop) {
    torch::NoGradGuard no_grad;
    const auto W = window_.size(0), n = hop.size(0);
    // FACT: w = torch.arange(10.); w.narrow(0, 0, 7).copy_(w.narrow(0, 3, 7).clone()); assert torch.equal(w[:7], torch.arange(3., 10.))
    window_.narrow(0, 0, W - n).copy_(window_.narrow(0, n, W - n).clone()); // LOOKALIKE: tensor-inplace-overlap -- the shifted source is cloned first
    window_.narrow(0, W - n, n).copy_(hop);
    // FACT: w = torch.zeros(16000); assert is_view_of(w.view(1, 1, -1), w)
    auto z = model_->enc_(window_.view({1, 1, -1})); // LOOKALIKE: tensor-view-non-contiguous -- the window is a contiguous 1-D buffer
    auto z_new = z.select(2, z.size(2) - 1).squeeze(0);

    const auto K = frames_.size(0);
    // FACT: f = torch.randn(5, 3); assert raises(lambda: f.narrow(0, 0, 4).copy_(f.narrow(0, 1, 4)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    frames_.narrow(0, 0, K - 1).copy_(frames_.narrow(0, 1, K - 1)); // EXPECT: tensor-inplace-overlap -- rows 0..K-2 and 1..K-1 of one buffer overlap: copy_ raises
    // FACT: f = torch.randn(5, 3); z = torch.randn(3); f[4].copy_(z); assert torch.equal(f[4], z)
    frames_[K - 1].copy_(z_new); // LOOKALIKE: tensor-inplace-overlap -- the newest row comes from the encoder output
    auto c = std::get<0>(model_->gru_(frames_.narrow(0, 0, K - 1).unsqueeze(0)));
    auto pred = model_->predictors_[0](c.select(1, K - 2));
    return torch::cosine_similarity(pred, z_new.unsqueeze(0)).item<float>();
  }

private:
  CpcModel model_;
  torch::Tensor window_, frames_;
};

int main(int argc, char **argv) {
  CpcConfig cfg;
  const std::string mode = argc > 1 ? argv[1] : "train";
  CpcModel model(cfg);
  if (mode == "stream") {
    torch::load(model, "cpc.pt");
    StreamingScorer scorer(model, cfg);
    torch::Tensor hops;
    torch::load(hops, argc > 2 ? argv[2] : "stream.pt"); // [n_hops, 160]
    for (int64_t i = 0; i < hops.size(0); ++i)
      std::cout << i << " " << scorer.push(hops[i]) << "\n";
    return 0;
  }
  std::vector<torch::Tensor> utts;
  std::vector<int64_t> speakers;
  torch::load(utts, "train_utts.pt");
  torch::Tensor spk_t;
  torch::load(spk_t, "train_speakers.pt");
  for (int64_t i = 0; i < spk_t.size(0); ++i)
    speakers.push_back(spk_t[i].item<int64_t>());
  torch::nn::Linear spk_probe(cfg.channels, cfg.n_speakers);
  train_cpc(model, spk_probe, AudioWindows(utts, speakers, cfg.window), cfg);
  torch::save(model, "cpc.pt");
  return 0;
}
