// Speaker-verification d-vectors trained with the generalized end-to-end loss (GE2E, Wan et al.
// 2018): a 3-layer LSTM over 40-band log-mel frames, a projection to 256 dims, L2-normalised.
// A batch holds N speakers x M partial utterances; each utterance is scored against every
// speaker centroid, its own speaker's centroid computed without it (the exclusive centroid), and
// the cosine matrix is scaled by a learnable w > 0 and shifted by b. Softmax or contrast loss.
// Verification: utterance embeddings average overlapping 160-frame windows; speakers are enrolled
// from a few utterances and trials are scored by cosine against the enrolled centroids.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

struct Ge2eConfig {
  int64_t n_mels = 40, hidden = 768, proj = 256, layers = 3;
  int64_t speakers_per_batch = 64, utterances_per_speaker = 10, partial_frames = 160;
  int64_t steps = 300000, log_every = 100;
  double lr = 1e-4, grad_clip = 3.0, init_w = 10.0, init_b = -5.0;
  bool contrast_loss = false, reset_scale = false;
  std::string pretrained;
};

struct SpeakerEncoderImpl : torch::nn::Module {
  explicit SpeakerEncoderImpl(const Ge2eConfig &cfg) {
    lstm_ = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(cfg.n_mels, cfg.hidden)
                                                        .num_layers(cfg.layers)
                                                        .batch_first(true)));
    proj_ = register_module("proj", torch::nn::Linear(cfg.hidden, cfg.proj));
  }

  // mels [B, T, n_mels] -> unit-norm embeddings [B, proj]
  torch::Tensor forward(const torch::Tensor &mels) {
    auto out = lstm_->forward(mels);
    auto h_last = std::get<0>(std::get<1>(out))[-1]; // final hidden state of the top layer
    auto e = torch::relu(proj_(h_last));
    return e / (e.norm(2, 1, true) + 1e-5);
  }

  torch::nn::LSTM lstm_{nullptr};
  torch::nn::Linear proj_{nullptr};
};
TORCH_MODULE(SpeakerEncoder);

struct Ge2eOutput {
  torch::Tensor loss;
  double positive_sim = 0, hardest_negative = 0; // batch statistics for the log
};

struct Ge2eLossImpl : torch::nn::Module {
  explicit Ge2eLossImpl(const Ge2eConfig &cfg) : contrast_(cfg.contrast_loss) {
    w_ = register_parameter("w", torch::full({1}, cfg.init_w));
    b_ = register_parameter("b", torch::full({1}, cfg.init_b));
  }

  // Fresh similarity scale when a pretrained encoder is fine-tuned on new data; b is kept.
  void reset_scale(double w) {
    // FACT: w = torch.nn.Parameter(torch.full((1,), 10.0)); assert raises(lambda: w.fill_(5.0), "a leaf Variable that requires grad")
    w_.fill_(w); // EXPECT: tensor-inplace-on-leaf -- w is a parameter and grad mode is on
  }

  // e [N, M, D] unit-norm embeddings -> scaled cosine similarity [N, M, N]
  torch::Tensor similarity(const torch::Tensor &e) {
    const auto N = e.size(0), M = e.size(1);
    auto centroids = e.mean(1);
    centroids = centroids / (centroids.norm(2, 1, true) + 1e-5);
    // FACT: e = torch.randn(3, 4, 5, requires_grad=True); x = e.sum(1, keepdim=True) - e; x /= 3; (e * x).sum().backward(); assert x.stride() == (20, 5, 1) and e.grad is not None
    auto excl = e.sum(1, true) - e;
    excl /= (M - 1); // LOOKALIKE: tensor-inplace-on-saved, tensor-inplace-on-expanded -- a subtraction saves nothing, and its broadcast result has memory of its own
    excl = excl / (excl.norm(2, 2, true) + 1e-5);

    auto cos_all = torch::matmul(e, centroids.t());                                  // [N, M, N]
    auto cos_self = (e * excl).sum(2, true);                                          // [N, M, 1]
    auto own = torch::eye(N, e.options().dtype(torch::kBool)).unsqueeze(1);          // [N, 1, N]
    auto cos = torch::where(own, cos_self, cos_all);
    return torch::clamp_min(w_, 1e-6) * cos + b_;
  }

  // Contrast loss: 1 - sigmoid(own speaker) + the hardest sigmoid(other speaker), per utterance.
  torch::Tensor contrast(const torch::Tensor &sim, const torch::Tensor &own) {
    auto sig = torch::sigmoid(sim);
    // FACT: s = torch.sigmoid(torch.randn(3, 4, 3)); d = torch.eye(3, dtype=torch.bool).unsqueeze(1).expand(3, 4, 3); p = s.masked_select(d); assert p.is_contiguous() and is_copy_of(p, s) and p.view(3, 4).shape == (3, 4)
    auto positive = sig.masked_select(own).view({sim.size(0), sim.size(1)}); // LOOKALIKE: tensor-view-non-contiguous -- masked_select returns a new 1-D contiguous tensor
    // FACT: x = torch.randn(3, 4, 3, requires_grad=True); d = torch.eye(3, dtype=torch.bool).unsqueeze(1).expand(3, 4, 3); s = torch.sigmoid(x); p = s.masked_select(d).view(3, 4); s.masked_fill_(d, 0); l = (1 - p + s.max(2)[0]).sum(); assert backward_fails(lambda: l.backward())
    sig.masked_fill_(own, 0); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its result for backward
    auto hardest = std::get<0>(sig.max(2));
    return (1 - positive + hardest).sum();
  }

  Ge2eOutput forward(const torch::Tensor &embeds) {
    const auto N = embeds.size(0), M = embeds.size(1);
    auto sim = similarity(embeds);
    auto own = torch::eye(N, sim.options().dtype(torch::kBool)).unsqueeze(1).expand({N, M, N});
    Ge2eOutput out;
    {
      auto s = sim.detach();
      out.positive_sim = s.masked_select(own).mean().item<double>();
      // FACT: w = torch.tensor([10.0], requires_grad=True); sim = w * torch.randn(3, 4, 3) - 5; d = torch.eye(3, dtype=torch.bool).unsqueeze(1).expand(3, 4, 3); s = sim.detach(); s.masked_fill_(d, -1e4); assert bool((sim.masked_select(d) == -1e4).all())
      s.masked_fill_(own, -1e4); // EXPECT: tensor-inplace-on-detached -- the positives of sim itself are overwritten before the loss reads them
      out.hardest_negative = s.amax(2).mean().item<double>();
    }
    if (contrast_) {
      out.loss = contrast(sim, own);
    } else {
      auto target = torch::arange(N, sim.options().dtype(torch::kLong)).repeat_interleave(M);
      // FACT: e = torch.randn(3, 4, 5); c = torch.randn(3, 5); d = torch.eye(3, dtype=torch.bool).unsqueeze(1); s = torch.clamp_min(torch.tensor([10.0]), 1e-6) * torch.where(d, (e * e).sum(2, keepdim=True), torch.matmul(e, c.t())) - 5; assert is_view_of(s.view(12, 3), s)
      out.loss = torch::nn::functional::cross_entropy(sim.view({N * M, N}), target); // LOOKALIKE: tensor-view-non-contiguous, tensor-device-mismatch -- the scaled matrix is contiguous; the targets are made on sim's device
    }
    return out;
  }

  bool contrast_;
  torch::Tensor w_, b_;
};
TORCH_MODULE(Ge2eLoss);

// Speaker-balanced batches: N speakers, M random 160-frame crops each, speaker-major.
struct SpeakerSampler {
  std::vector<std::vector<torch::Tensor>> utterances; // per speaker, log-mels [T, n_mels] on the host
  torch::Tensor sample(int64_t n_speakers, int64_t n_utts, int64_t frames) const {
    auto spk = torch::randperm(static_cast<int64_t>(utterances.size())).narrow(0, 0, n_speakers);
    std::vector<torch::Tensor> crops;
    for (int64_t i = 0; i < n_speakers; ++i) {
      const auto &pool = utterances[spk[i].item<int64_t>()];
      for (int64_t j = 0; j < n_utts; ++j) {
        const auto &mel = pool[torch::randint(static_cast<int64_t>(pool.size()), {1}).item<int64_t>()];
        const auto start = torch::randint(mel.size(0) - frames + 1, {1}).item<int64_t>();
        crops.push_back(mel.narrow(0, start, frames));
      }
    }
    return torch::stack(crops);
  }
};

void load_pretrained(SpeakerEncoder &encoder, const Ge2eConfig &cfg) {
  SpeakerEncoder src(cfg);
  torch::load(src, cfg.pretrained);
  torch::NoGradGuard no_grad;
  auto dst = encoder->parameters();
  auto from = src->parameters();
  // FACT: p = torch.nn.Linear(3, 2).weight; exec('with torch.no_grad(): p.copy_(torch.ones(2, 3))'); assert p.is_leaf and p.requires_grad
  for (size_t i = 0; i < dst.size(); ++i)
    dst[i].copy_(from[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

void train(SpeakerEncoder &encoder, Ge2eLoss &criterion, const SpeakerSampler &sampler, const Ge2eConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  if (!cfg.pretrained.empty())
    load_pretrained(encoder, cfg);
  if (cfg.reset_scale)
    criterion->reset_scale(cfg.init_w);
  encoder->to(device);
  criterion->to(device);
  encoder->train();

  std::vector<torch::Tensor> params = encoder->parameters();
  for (auto &p : criterion->parameters())
    params.push_back(p);
  torch::optim::Adam opt(params, torch::optim::AdamOptions(cfg.lr));

  const auto N = cfg.speakers_per_batch, M = cfg.utterances_per_speaker;
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto mels = sampler.sample(N, M, cfg.partial_frames).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    // FACT: p = torch.nn.Linear(6, 4)(torch.randn(12, 6)); e = p / (p.norm(2, 1, keepdim=True) + 1e-5); assert is_view_of(e.view(3, 4, -1), e)
    auto embeds = encoder->forward(mels).view({N, M, -1}); // LOOKALIKE: tensor-view-non-contiguous -- the normalised projection is contiguous
    auto out = criterion->forward(embeds);
    opt.zero_grad();
    out.loss.backward();
    // The paper scales the gradients of w and b by 0.01.
    // FACT: w = torch.nn.Parameter(torch.tensor([10.0])); (w * 2).sum().backward(); w.grad.mul_(0.01); assert w.is_leaf and abs(w.grad.item() - 0.02) < 1e-6
    criterion->w_.grad().mul_(0.01); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient, not the parameter
    criterion->b_.grad().mul_(0.01);
    torch::nn::utils::clip_grad_norm_(encoder->parameters(), cfg.grad_clip);
    opt.step();
    if (step % cfg.log_every == 0)
      std::cout << "step " << step << " loss " << out.loss.item<float>() << " pos " << out.positive_sim // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
                << " neg " << out.hardest_negative << " w " << criterion->w_.item<float>() << "\n";
  }
}

// Overlapping partial windows of a whole utterance [T, n_mels] -> [W, frames, n_mels].
torch::Tensor partial_windows(const torch::Tensor &mel, const Ge2eConfig &cfg) {
  return mel.unfold(0, cfg.partial_frames, cfg.partial_frames / 2).transpose(1, 2);
}

// Utterance d-vector: the mean of its partial embeddings, renormalised.
torch::Tensor embed_utterance(SpeakerEncoder &encoder, const torch::Tensor &mel, const Ge2eConfig &cfg) {
  auto partials = encoder->forward(partial_windows(mel, cfg));
  auto e = partials.mean(0);
  // FACT: e = torch.randn(6); u = e.clone(); u.div_(u.norm() + 1e-5); assert torch.allclose(u, e / (e.norm() + 1e-5))
  auto unit = e.clone(); // EXPECT: tensor-unnecessary-clone -- overwritten by div_ at once: e / (e.norm() + eps) makes it in one pass
  unit.div_(unit.norm() + 1e-5);
  return unit;
}

// Speaker centroid from a few enrollment utterances (raw mean, normalised when scoring).
torch::Tensor enroll(SpeakerEncoder &encoder, const std::vector<torch::Tensor> &utterances, const Ge2eConfig &cfg) {
  encoder->eval();
  std::vector<torch::Tensor> embeds;
  for (const auto &mel : utterances) {
    // FACT: l = torch.nn.Linear(4, 3); es = [l(torch.randn(5, 4)).mean(0) for _ in range(3)]; assert all(e.requires_grad for e in es) and kept_nodes(es) >= 3 * 2
    embeds.push_back(encoder->forward(partial_windows(mel, cfg)).mean(0)); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every utterance's LSTM graph stays alive
  }
  return torch::stack(embeds).mean(0);
}

// Leave-one-out consistency of an enrollment set: each utterance against the mean of the others.
torch::Tensor enrollment_consistency(const torch::Tensor &enr) {
  const auto M = enr.size(0);
  auto loo = enr.mean(0, true).expand_as(enr);
  // FACT: enr = torch.randn(5, 8); loo = enr.mean(0, keepdim=True).expand_as(enr); assert raises(lambda: loo.mul_(5), "more than one element of the written-to tensor refers to a single memory location")
  loo.mul_(M).sub_(enr).div_(M - 1); // EXPECT: tensor-inplace-on-expanded -- every row of loo is the same memory
  return torch::cosine_similarity(enr, loo, 1);
}

// Cosine scores of trial embeddings [T, D] against enrolled centroids [S, D].
torch::Tensor score_trials(const torch::Tensor &enrolled, const torch::Tensor &trials) {
  auto enr = enrolled.to(torch::kFloat);
  // FACT: e = torch.randn(3, 4); e0 = e.clone(); u = e.to(torch.float); u.div_(u.norm(2, 1, keepdim=True) + 1e-5); assert shares_storage(u, e) and not torch.equal(e, e0)
  enr.div_(enr.norm(2, 1, true) + 1e-5); // EXPECT: tensor-alias-then-mutate -- the centroids are float32 already: the caller's speaker database is normalised in place
  auto tst = trials.to(torch::kFloat);
  // FACT: t = torch.randn(3, 4); t0 = t.clone(); u = t.to(torch.float); u = u / u.norm(2, 1, keepdim=True); assert torch.equal(t, t0)
  tst = tst / (tst.norm(2, 1, true) + 1e-5); // LOOKALIKE: tensor-alias-then-mutate -- rebound to a new tensor, the caller's trials untouched
  return torch::matmul(tst, enr.t());
}

// A copy of the database with one speaker's centroid replaced; the argument is left as it is.
torch::Tensor with_speaker(const torch::Tensor &db, int64_t spk, const torch::Tensor &centroid) {
  // FACT: db = torch.randn(4, 3); db0 = db.clone(); u = db.clone(); u[1] = torch.ones(3); assert torch.equal(db, db0) and not torch.equal(u, db0)
  auto updated = db.clone(); // LOOKALIKE: tensor-unnecessary-clone -- the copy is written and returned: without it the function would write its caller's tensor
  updated[spk] = centroid;
  return updated;
}

// Equal error rate from target and impostor scores (host tensors).
double equal_error_rate(const torch::Tensor &target, const torch::Tensor &impostor) {
  auto thresholds = torch::linspace(-1.0, 1.0, 401);
  double best_gap = 2.0, eer = 1.0;
  for (int64_t i = 0; i < thresholds.size(0); ++i) {
    auto th = thresholds[i];
    const double frr = (target < th).to(torch::kDouble).mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- host tensors, and the rate is compared below
    const double far = (impostor >= th).to(torch::kDouble).mean().item<double>();
    if (std::abs(frr - far) < best_gap) {
      best_gap = std::abs(frr - far);
      eer = (frr + far) / 2.0;
    }
  }
  return eer;
}

struct Trial {
  int64_t speaker;  // claimed identity
  torch::Tensor mel; // test utterance [T, n_mels]
  bool genuine;
};

double run_verification(SpeakerEncoder &encoder, const std::vector<std::vector<torch::Tensor>> &enrollment,
                        const std::vector<Trial> &trials, const Ge2eConfig &cfg) {
  encoder->to(torch::kCPU); // verification runs on the host, next to the audio front end
  std::vector<torch::Tensor> centroids;
  for (const auto &utts : enrollment)
    centroids.push_back(enroll(encoder, utts, cfg)); // EXPECT: tensor-graph-kept-across-iterations -- each centroid carries its speaker's graph, and the database is never differentiated
  auto db = torch::stack(centroids);

  torch::NoGradGuard no_grad;
  for (size_t s = 0; s < enrollment.size(); ++s) {
    std::vector<torch::Tensor> per_utt;
    for (const auto &mel : enrollment[s])
      per_utt.push_back(embed_utterance(encoder, mel, cfg));
    std::cout << "speaker " << s << " enrollment consistency "
              << enrollment_consistency(torch::stack(per_utt)).mean().item<float>() << "\n";
  }
  std::vector<torch::Tensor> test_embeds;
  for (const auto &t : trials)
    test_embeds.push_back(embed_utterance(encoder, t.mel, cfg)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
  auto scores = score_trials(db, torch::stack(test_embeds));

  std::vector<float> genuine, impostor;
  for (size_t i = 0; i < trials.size(); ++i) {
    const float s = scores[static_cast<int64_t>(i)][trials[i].speaker].item<float>();
    (trials[i].genuine ? genuine : impostor).push_back(s);
  }
  // Accepted genuine trials refine their speaker's centroid (running mean over utterances).
  for (size_t i = 0; i < trials.size(); ++i) {
    if (!trials[i].genuine)
      continue;
    const auto spk = trials[i].speaker;
    const auto n = static_cast<double>(enrollment[spk].size());
    db = with_speaker(db, spk, (db[spk] * n + test_embeds[i]) / (n + 1.0));
  }
  std::cout << "database norm after refinement " << db.norm().item<float>() << "\n";
  return equal_error_rate(torch::tensor(genuine), torch::tensor(impostor));
}
