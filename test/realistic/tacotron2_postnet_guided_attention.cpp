// Tacotron2 decoder tail: teacher-forced attention decoder, convolutional
// postnet, stop-token head, trained with L1/L2 mel loss + guided attention.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace tts {

struct TacoConfig {
  int64_t n_mels = 80;
  int64_t enc_dim = 512;
  int64_t prenet_dim = 256;
  int64_t postnet_dim = 512;
  int64_t postnet_kernel = 5;
  int64_t postnet_layers = 5;
  double postnet_dropout = 0.5;
  double guide_sigma = 0.2;
  double guide_weight = 10.0;
  int64_t guide_decay_steps = 20000;
  int64_t max_out_frames = 1000;
  int64_t max_in_tokens = 200;
  double lr = 1e-3;
  int64_t epochs = 100;
  int64_t log_every = 200;
};

struct TtsBatch {
  torch::Tensor memory;  // text encoder outputs (frozen, precomputed)
  torch::Tensor mel;
  torch::Tensor stop;
  torch::Tensor in_lens;
  torch::Tensor out_lens;
};

struct MelStats {
  torch::Tensor mean;
  torch::Tensor std;
};

// Defined in data.cpp.
std::vector<TtsBatch> load_tts_batches(const std::string& manifest, int64_t batch_size);
MelStats load_mel_stats(const std::string& path);
void write_png(const std::string& path, const float* data, int64_t h, int64_t w);

torch::Tensor make_pad_mask(const torch::Tensor& lengths, int64_t max_len) {
  auto ids = torch::arange(max_len).unsqueeze(0);
  return ids < lengths.unsqueeze(1);  // EXPECT: tensor-device-mismatch
}

// Diagonal prior W[n][t] = 1 - exp(-(n/N - t/T)^2 / 2g^2), computed once for
// the longest pair and sliced per batch.
class GuideCache {
 public:
  GuideCache(int64_t max_out, int64_t max_in, double sigma, torch::Device device) {
    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
    auto n = torch::arange(max_out, opts).div(max_out).unsqueeze(1);
    auto t = torch::arange(max_in, opts).div(max_in).unsqueeze(0);
    full_ = 1.0 - torch::exp(-(n - t).pow(2) / (2.0 * sigma * sigma));
  }

  torch::Tensor get(int64_t batch, int64_t out_len, int64_t in_len) const {
    return full_.narrow(0, 0, out_len).narrow(1, 0, in_len).unsqueeze(0).expand({batch, out_len, in_len});
  }

 private:
  torch::Tensor full_;
};

torch::Tensor guided_attention_loss(const torch::Tensor& align, const torch::Tensor& in_lens,
                                    const torch::Tensor& out_lens, const GuideCache& cache) {
  const int64_t B = align.size(0), To = align.size(1), Ti = align.size(2);
  auto valid = make_pad_mask(out_lens, To).unsqueeze(2) & make_pad_mask(in_lens, Ti).unsqueeze(1);
  auto W = cache.get(B, To, Ti);
  // FACT: raises(lambda: torch.rand(1,6,5).expand(3,6,5).mul_(torch.ones(3,6,5,dtype=torch.bool)), "more than one element")
  W.mul_(valid);  // EXPECT: tensor-inplace-on-expanded
  auto att = align.clone();  // EXPECT: tensor-unnecessary-clone
  att.mul_(W);
  return att.sum() / valid.sum();
}

// Share of attention mass that falls close to the diagonal (validation only).
torch::Tensor diagonal_focus(const torch::Tensor& align, const torch::Tensor& in_lens,
                      const torch::Tensor& out_lens, const GuideCache& cache) {
  const int64_t B = align.size(0), To = align.size(1), Ti = align.size(2);
  auto valid = make_pad_mask(out_lens, To).unsqueeze(2) & make_pad_mask(in_lens, Ti).unsqueeze(1);
  auto near = cache.get(B, To, Ti).lt(0.05);
  // FACT: not raises(lambda: torch.rand(1,6,5).expand(3,6,5).lt(0.05).logical_and_(torch.ones(3,6,5,dtype=torch.bool)))
  near.logical_and_(valid);  // LOOKALIKE: tensor-inplace-on-expanded -- lt() wrote a freshly allocated dense result
  return (align * near).sum() / out_lens.sum();
}

class PostnetImpl : public torch::nn::Module {
 public:
  explicit PostnetImpl(const TacoConfig& cfg) : dropout_(cfg.postnet_dropout) {
    const int64_t pad = (cfg.postnet_kernel - 1) / 2;
    for (int64_t i = 0; i < cfg.postnet_layers; ++i) {
      const bool last = i + 1 == cfg.postnet_layers;
      const int64_t in_ch = i == 0 ? cfg.n_mels : cfg.postnet_dim;
      const int64_t out_ch = last ? cfg.n_mels : cfg.postnet_dim;
      auto conv = torch::nn::Conv1d(
          torch::nn::Conv1dOptions(in_ch, out_ch, cfg.postnet_kernel).padding(pad).bias(false));
      auto gain = last ? torch::nn::init::calculate_gain(torch::kLinear)
                       : torch::nn::init::calculate_gain(torch::kTanh);
      torch::nn::init::xavier_uniform_(conv->weight, gain);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under its own NoGradGuard
      convs_.push_back(register_module("conv" + std::to_string(i), conv));
      norms_.push_back(register_module("bn" + std::to_string(i), torch::nn::BatchNorm1d(out_ch)));
    }
  }

  // Takes frames-major mel, returns the residual channels-first like the convs.
  torch::Tensor forward(const torch::Tensor& mel) {
    auto x = mel.transpose(1, 2);
    for (size_t i = 0; i < convs_.size(); ++i) {
      x = norms_[i]->forward(convs_[i]->forward(x));
      if (i + 1 < convs_.size()) x = torch::tanh(x);
      x = torch::dropout(x, dropout_, is_training());
    }
    return x;
  }

 private:
  std::vector<torch::nn::Conv1d> convs_;
  std::vector<torch::nn::BatchNorm1d> norms_;
  double dropout_;
};
TORCH_MODULE(Postnet);

struct TailOutput {
  torch::Tensor mel;
  torch::Tensor mel_post;
  torch::Tensor stop_logits;
  torch::Tensor align;
};

class TacotronTailImpl : public torch::nn::Module {
 public:
  explicit TacotronTailImpl(const TacoConfig& cfg)
      : prenet_(register_module("prenet", torch::nn::Linear(cfg.n_mels, cfg.prenet_dim))),
        query_(register_module("query", torch::nn::Linear(cfg.prenet_dim, cfg.enc_dim))),
        mel_proj_(register_module("mel_proj", torch::nn::Linear(cfg.prenet_dim + cfg.enc_dim, cfg.n_mels))),
        stop_proj_(register_module("stop_proj", torch::nn::Linear(cfg.prenet_dim + cfg.enc_dim, 1))),
        postnet_(register_module("postnet", Postnet(cfg))) {}

  TailOutput forward(const torch::Tensor& memory, const torch::Tensor& memory_mask, const torch::Tensor& mel) {
    const int64_t T = mel.size(1);
    auto prev = torch::zeros_like(mel);
    // FACT: not shares_storage(torch.zeros_like(m:=torch.randn(2,6,80)), m)
    prev.narrow(1, 1, T - 1).copy_(mel.narrow(1, 0, T - 1));  // LOOKALIKE: tensor-inplace-overlap -- destination is a separate zeros_like buffer
    // Prenet dropout stays on at inference, as in the paper.
    auto h = torch::dropout(torch::relu(prenet_(prev)), 0.5, /*train=*/true);
    auto scores = torch::bmm(query_(h), memory.transpose(1, 2)) / std::sqrt(double(memory.size(2)));
    scores = scores.masked_fill(memory_mask.unsqueeze(1).logical_not(), -1e9);
    auto align = torch::softmax(scores, -1);
    auto hc = torch::cat({h, torch::bmm(align, memory)}, -1);

    TailOutput out;
    out.mel = mel_proj_(hc);
    out.mel_post = out.mel + postnet_(out.mel).transpose(1, 2);
    out.stop_logits = stop_proj_(hc).squeeze(-1);
    out.align = align;
    return out;
  }

 private:
  torch::nn::Linear prenet_, query_, mel_proj_, stop_proj_;
  Postnet postnet_;
};
TORCH_MODULE(TacotronTail);

torch::Tensor normalise_targets(torch::Tensor mel, const torch::Tensor& mean, const torch::Tensor& std) {
  // FACT: (lambda a: (lambda b: b.sub_(1))(a) is not None and bool(a.eq(-1).all()))(torch.zeros(3))
  mel.sub_(mean).div_(std);  // EXPECT: tensor-alias-then-mutate
  return mel;
}

torch::Tensor masked_mel_loss(const TailOutput& out, const torch::Tensor& target, const torch::Tensor& frame_mask,
                              int64_t n_mels) {
  auto m = frame_mask.reshape({-1});
  // FACT: is_view_of((y:=torch.nn.Linear(8,80)(torch.randn(2,7,8))).view(-1,80), y)
  auto pred = out.mel.view({-1, n_mels}).index({m});  // LOOKALIKE: tensor-view-non-contiguous -- linear output is contiguous
  auto tgt = target.reshape({-1, n_mels}).index({m});
  // FACT: is_view_of((y:=torch.randn(2,7,80)+torch.randn(2,80,7).transpose(1,2)).reshape(-1,80), y)
  auto post = out.mel_post.reshape({-1, n_mels}).index({m});  // LOOKALIKE: tensor-reshape-non-contiguous -- the add takes mel's dense layout, reshape is a view
  return torch::mse_loss(pred, tgt) + torch::mse_loss(post, tgt) + torch::l1_loss(post, tgt);
}

torch::Tensor stop_token_loss(const torch::Tensor& stop_logits, const torch::Tensor& stop, const torch::Tensor& frame_mask) {
  auto probs = torch::sigmoid(stop_logits);
  // FACT: backward_fails(lambda: (p:=torch.randn(4,requires_grad=True).sigmoid()).clamp_(1e-5,1-1e-5).sum().backward())
  probs.clamp_(1e-5, 1.0 - 1e-5);  // EXPECT: tensor-inplace-on-saved
  auto bce = torch::binary_cross_entropy(probs, stop, {}, at::Reduction::None);
  return (bce * frame_mask).sum() / frame_mask.sum();
}

void dump_alignment(const torch::Tensor& align, int64_t step) {
  // Encoder steps on the vertical axis, like the usual Tacotron plots.
  // FACT: raises(lambda: torch.rand(6,5).t().view(-1), "view size is not compatible")
  auto img = align.t().view({-1}).to(torch::kCPU);  // EXPECT: tensor-view-non-contiguous
  write_png("align_" + std::to_string(step) + ".png", img.data_ptr<float>(), align.size(1), align.size(0));
}

void train(const TacoConfig& cfg, const std::string& manifest) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  TacotronTail model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(1e-6));

  const auto stats = load_mel_stats(manifest + ".stats");
  auto train_batches = load_tts_batches(manifest + ".train", 32);
  auto val_batches = load_tts_batches(manifest + ".val", 32);
  GuideCache guide(cfg.max_out_frames, cfg.max_in_tokens, cfg.guide_sigma, device);
  // The training tail set fits on one GPU: keep it there between epochs.
  for (auto& b : train_batches) {
    b.memory = b.memory.to(device);
    b.mel = b.mel.to(device);
    b.stop = b.stop.to(device);
  }

  std::map<std::string, torch::Tensor> best;
  double best_val = 1e30;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto epoch_loss = torch::zeros({}, device);
    double stop_acc = 0.0;
    for (const auto& raw : train_batches) {
      auto memory = raw.memory.to(device);
      auto mel = raw.mel.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto stop = raw.stop.to(device);
      auto in_lens = raw.in_lens.to(device);
      auto out_lens = raw.out_lens.to(device);
      auto mel_mean = stats.mean.to(device);  // EXPECT: tensor-clone-in-loop
      auto mel_std = stats.std.to(device);

      auto out = model->forward(memory, make_pad_mask(in_lens, memory.size(1)), mel);
      auto frame_mask = make_pad_mask(out_lens, mel.size(1));
      auto target = normalise_targets(mel, mel_mean, mel_std);

      if (step % cfg.log_every == 0) {
        auto align_vis = out.align.detach();
        align_vis.div_(align_vis.amax({-1}, true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-detached
        dump_alignment(align_vis[0], step);
      }

      const double ga_w = cfg.guide_weight * std::max(0.0, 1.0 - double(step) / cfg.guide_decay_steps);
      auto loss = masked_mel_loss(out, target, frame_mask, cfg.n_mels) +
                  stop_token_loss(out.stop_logits, stop, frame_mask.to(torch::kFloat)) +
                  torch::scalar_tensor(ga_w) * guided_attention_loss(out.align, in_lens, out_lens, guide);  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may meet CUDA operands

      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();

      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      auto hits = (out.stop_logits > 0).eq(stop > 0.5).logical_and(frame_mask);
      stop_acc += hits.sum().item<double>() / frame_mask.sum().item<double>();  // EXPECT: tensor-sync-in-loop
      ++step;
    }

    model->eval();
    torch::NoGradGuard no_grad;
    auto val_loss = torch::zeros({}, device);
    auto focus = torch::zeros({}, device);
    const auto mean_d = stats.mean.to(device), std_d = stats.std.to(device);
    for (const auto& raw : val_batches) {
      auto memory = raw.memory.to(device);
      auto mel = raw.mel.to(device);
      auto in_lens = raw.in_lens.to(device);
      auto out_lens = raw.out_lens.to(device);
      auto out = model->forward(memory, make_pad_mask(in_lens, memory.size(1)), mel);
      auto frame_mask = make_pad_mask(out_lens, mel.size(1));
      auto target = (mel - mean_d) / std_d;
      auto loss = masked_mel_loss(out, target, frame_mask, cfg.n_mels);
      val_loss += loss;  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard nothing is recorded
      focus += diagonal_focus(out.align, in_lens, out_lens, guide);
    }
    if (!val_batches.empty()) {
      const auto& b = val_batches.front();
      auto out = model->forward(b.memory.to(device), make_pad_mask(b.in_lens.to(device), b.memory.size(1)),
                                b.mel.to(device));
      auto vis = out.align.detach().clone();
      vis.div_(vis.amax({-1}, true).clamp_min(1e-6));  // LOOKALIKE: tensor-inplace-on-detached -- detach().clone() owns its storage
      dump_alignment(vis[0], -epoch);
    }

    const double v = val_loss.item<double>() / std::max<size_t>(1, val_batches.size());
    std::cout << "epoch " << epoch << " train " << epoch_loss.item<double>() / train_batches.size()
              << " stop_acc " << stop_acc / train_batches.size() << " val " << v << " diag "
              << focus.item<double>() / std::max<size_t>(1, val_batches.size()) << std::endl;
    if (v < best_val) {
      best_val = v;
      for (const auto& item : model->named_parameters()) {
        best[item.key()] = item.value().detach().clone();  // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- a different parameter each pass; the snapshot must survive later optimizer steps
      }
    }
  }
  torch::save(model, "tacotron_tail.pt");
}

}  // namespace tts

int main(int argc, char** argv) {
  tts::TacoConfig cfg;
  if (argc > 2) cfg.epochs = std::stoll(argv[2]);
  tts::train(cfg, argc > 1 ? argv[1] : "data/ljspeech");
  return 0;
}
