// End-to-end neural diarization (EEND, self-attention variant).
// Spliced log-mel frames -> transformer encoder -> one sigmoid output per speaker,
// trained with a permutation-invariant BCE loss over all speaker orderings.
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <vector>

namespace eend {

struct Config {
  int64_t n_mels = 23;
  int64_t context = 7;
  int64_t subsample = 10;
  int64_t d_model = 256;
  int64_t n_heads = 4;
  int64_t n_layers = 4;
  int64_t n_speakers = 2;
  double dropout = 0.1;
  double lr = 1e-3;
  double label_smoothing = 0.05;
  double overlap_boost = 0.5;
  double threshold = 0.5;
  int64_t epochs = 30;
  int64_t log_every = 50;
  torch::Device device = torch::kCPU;
};

struct Batch { torch::Tensor feats, labels, lengths; };

struct CMVNStats { torch::Tensor mean, istd; };

// Pads variable-length utterances into one batch.
Batch collate(const std::vector<torch::Tensor>& feats, const std::vector<torch::Tensor>& labels,
              int64_t n_mels, int64_t n_speakers) {
  int64_t max_t = 0;
  for (const auto& f : feats) max_t = std::max(max_t, f.size(0));
  const auto B = static_cast<int64_t>(feats.size());
  Batch b;
  b.feats = torch::zeros({B, max_t, n_mels});
  b.labels = torch::zeros({B, max_t, n_speakers});
  b.lengths = torch::empty({B}, torch::kLong);
  for (int64_t i = 0; i < B; ++i) {
    const auto T = feats[i].size(0);
    // FACT: s=torch.tensor([0.1,1e-9+1.0],dtype=torch.float64); d=torch.zeros(2); d.copy_(s); assert d.dtype==torch.float32 and not torch.equal(d.double(), s)
    b.feats[i].narrow(0, 0, T).copy_(feats[i]);  // EXPECT: tensor-copy-narrowing
    b.labels[i].narrow(0, 0, T).copy_(labels[i].to(torch::kFloat));  // LOOKALIKE: tensor-copy-narrowing -- 0/1 labels converted explicitly first
    b.lengths[i] = T;
  }
  return b;
}

CMVNStats compute_cmvn(const std::vector<Batch>& data) {
  std::vector<torch::Tensor> frames;
  for (const auto& b : data) {
    for (int64_t i = 0; i < b.feats.size(0); ++i) {
      const auto len = b.lengths[i].item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- lengths live on the CPU, nothing to wait for
      frames.push_back(b.feats[i].narrow(0, 0, len));
    }
  }
  auto all = torch::cat(frames, 0);
  return {all.mean(0), all.std(0).clamp_min(1e-5).reciprocal()};
}

torch::Tensor apply_cmvn(torch::Tensor feats, const torch::Tensor& mean, const torch::Tensor& istd) {
  auto x = feats.contiguous();
  // FACT: f=torch.randn(2,12,23); x=f.contiguous(); x.sub_(f.mean(0)); assert shares_storage(x,f)
  x.sub_(mean).mul_(istd);  // EXPECT: tensor-alias-then-mutate
  return x;
}

// Stack +-context neighbouring frames, then keep every subsample-th one.
torch::Tensor splice_frames(const torch::Tensor& feats, int64_t context, int64_t subsample) {
  const auto B = feats.size(0), T = feats.size(1);
  auto padded = torch::constant_pad_nd(feats, {0, 0, context, context});
  auto windows = padded.unfold(1, 2 * context + 1, 1);
  // FACT: f=torch.randn(2,20,23); p=torch.nn.functional.pad(f,(0,0,7,7)); assert is_view_of(p.unfold(1,15,1).transpose(2,3).reshape(2,20,-1), p)
  auto spliced = windows.transpose(2, 3).reshape({B, T, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- windows step one frame, so frame and mel dims merge as a view
  return spliced.slice(1, 0, T, subsample);
}

// True on padded frames, the convention of MultiheadAttention's key_padding_mask.
torch::Tensor make_pad_mask(const torch::Tensor& lengths, int64_t max_len) {
  auto steps = torch::arange(max_len).unsqueeze(0);
  return steps >= lengths.unsqueeze(1);  // EXPECT: tensor-device-mismatch
}

struct EncoderBlockImpl : torch::nn::Module {
  EncoderBlockImpl(int64_t d, int64_t heads, double p)
      : attn(register_module("attn", torch::nn::MultiheadAttention(
            torch::nn::MultiheadAttentionOptions(d, heads).dropout(p)))),
        norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        ff1(register_module("ff1", torch::nn::Linear(d, 4 * d))),
        ff2(register_module("ff2", torch::nn::Linear(4 * d, d))),
        drop(register_module("drop", torch::nn::Dropout(p))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& pad_mask) {
    auto a = std::get<0>(attn->forward(x, x, x, pad_mask, /*need_weights=*/false));
    auto h = norm1(x + drop(a));
    return norm2(h + drop(ff2(drop(torch::relu(ff1(h))))));
  }

  torch::nn::MultiheadAttention attn;
  torch::nn::LayerNorm norm1, norm2;
  torch::nn::Linear ff1, ff2;
  torch::nn::Dropout drop;
};
TORCH_MODULE(EncoderBlock);

struct EENDImpl : torch::nn::Module {
  explicit EENDImpl(const Config& cfg)
      : cfg_(cfg),
        in_proj(cfg.n_mels * (2 * cfg.context + 1), cfg.d_model),
        in_norm(torch::nn::LayerNormOptions({cfg.d_model})),
        out(cfg.d_model, cfg.n_speakers) {
    register_module("in_proj", in_proj);
    register_module("in_norm", in_norm);
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      blocks->push_back(EncoderBlock(cfg.d_model, cfg.n_heads, cfg.dropout));
    register_module("blocks", blocks);
    register_module("out", out);
    {
      torch::NoGradGuard no_grad;
      out->weight.normal_(0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- initialised under NoGradGuard
    }
    // Speakers are silent most of the time: start the outputs biased towards inactive.
    activity_bias = register_parameter("activity_bias", torch::zeros({cfg.n_speakers}));
    // FACT: b=torch.nn.Parameter(torch.zeros(2)); assert raises(lambda: b.fill_(-2.0), "leaf Variable")
    activity_bias.fill_(-2.0);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& pad_mask) {
    const auto B = x.size(0);
    auto h = in_norm(in_proj(x)).transpose(0, 1);
    for (const auto& m : *blocks) h = m->as<EncoderBlockImpl>()->forward(h, pad_mask);
    // FACT: h=torch.randn(30,2,16); assert is_copy_of(h.transpose(0,1).reshape(-1,16), h)
    auto frames = h.transpose(0, 1).reshape({-1, cfg_.d_model});  // EXPECT: tensor-reshape-non-contiguous
    // FACT: lin=torch.nn.Linear(16,2); y=lin(torch.randn(30,2,16).transpose(0,1).reshape(-1,16)); assert is_contiguous(y) and is_view_of(y.view(2,-1,2), y)
    auto logits = out(frames).view({B, -1, cfg_.n_speakers});  // LOOKALIKE: tensor-view-non-contiguous -- Linear writes a fresh contiguous output
    return logits + activity_bias;
  }

  Config cfg_;
  torch::nn::Linear in_proj;
  torch::nn::LayerNorm in_norm;
  torch::nn::ModuleList blocks;
  torch::nn::Linear out;
  torch::Tensor activity_bias;
};
TORCH_MODULE(EEND);

std::vector<std::vector<int64_t>> speaker_orders(int64_t n) {
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<std::vector<int64_t>> orders;
  do {
    orders.push_back(idx);
  } while (std::next_permutation(idx.begin(), idx.end()));
  return orders;
}

torch::Tensor speaker_order_table(int64_t n) {
  std::vector<int64_t> flat;
  for (const auto& o : speaker_orders(n)) flat.insert(flat.end(), o.begin(), o.end());
  return torch::tensor(flat).view({-1, n});
}

struct PITOutput { torch::Tensor loss, best_order; };

PITOutput pit_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                   const torch::Tensor& frame_mask, const Config& cfg) {
  const double ls = cfg.label_smoothing;
  auto target = labels.clone().mul_(1.0 - 2.0 * ls).add_(ls);  // EXPECT: tensor-unnecessary-clone
  auto weight = frame_mask.unsqueeze(-1).expand_as(logits);
  if (cfg.overlap_boost > 0) {
    // Overlapped speech is where diarization errors concentrate: weight it up.
    auto overlapped = (labels.sum(-1, /*keepdim=*/true) > 1).to(weight.scalar_type());
    // FACT: m=torch.ones(2,30); w=m.unsqueeze(-1).expand(2,30,2); assert raises(lambda: w.mul_(1.0+0.5*torch.rand(2,30,1)), "more than one element")
    weight.mul_(1.0 + cfg.overlap_boost * overlapped);  // EXPECT: tensor-inplace-on-expanded
  }
  std::vector<torch::Tensor> per_order;
  for (const auto& order : speaker_orders(labels.size(-1))) {
    auto idx = torch::tensor(order);
    auto permuted = target.index({torch::indexing::Ellipsis, idx});  // LOOKALIKE: tensor-device-mismatch -- CPU index tensors are accepted when indexing a CUDA tensor
    auto bce = torch::binary_cross_entropy_with_logits(logits, permuted, {}, {}, at::Reduction::None);
    per_order.push_back((bce * weight).sum({1, 2}) / weight.sum({1, 2}).clamp_min(1.0));
  }
  auto [best_loss, best_order] = torch::stack(per_order, 1).min(1);
  return {best_loss.mean(), best_order};
}

struct DERStats {
  explicit DERStats(torch::Device device)
      : totals(torch::zeros({4}, torch::TensorOptions().dtype(torch::kDouble).device(device))) {}

  void update(const torch::Tensor& decisions, const torch::Tensor& ref, const torch::Tensor& valid) {
    auto sys = decisions.to(ref.scalar_type()) * valid.unsqueeze(-1);
    auto gt = ref * valid.unsqueeze(-1);
    auto n_sys = sys.sum(-1);
    auto n_ref = gt.sum(-1);
    auto n_hit = (sys * gt).sum(-1);
    auto miss = (n_ref - n_sys).clamp_min(0).sum();
    auto fa = (n_sys - n_ref).clamp_min(0).sum();
    auto conf = (torch::minimum(n_ref, n_sys) - n_hit).sum();
    totals += torch::stack({miss, fa, conf, n_ref.sum()}).to(torch::kDouble);
  }

  double report() const {
    auto t = totals.to(torch::kCPU);
    auto a = t.accessor<double, 1>();
    return (a[0] + a[1] + a[2]) / std::max(a[3], 1.0);
  }

  torch::Tensor totals;
};

void train(EEND& model, std::vector<Batch>& train_set, const CMVNStats& cmvn, const Config& cfg) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  const auto order_table = speaker_order_table(cfg.n_speakers).to(cfg.device);
  std::vector<torch::Tensor> activity;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    DERStats der(cfg.device);
    auto running = torch::zeros({}, torch::TensorOptions().device(cfg.device));
    int64_t step = 0;
    for (auto& batch : train_set) {
      auto feats = apply_cmvn(batch.feats, cmvn.mean, cmvn.istd);
      auto x = splice_frames(feats, cfg.context, cfg.subsample).to(cfg.device);
      auto labels = batch.labels.slice(1, 0, batch.labels.size(1), cfg.subsample).to(cfg.device);
      auto lengths = torch::div(batch.lengths + (cfg.subsample - 1), cfg.subsample, "floor").to(cfg.device);
      auto pad_mask = make_pad_mask(lengths, x.size(1));
      auto valid = (~pad_mask).to(torch::kFloat);

      auto logits = model->forward(x, pad_mask);
      auto out = pit_loss(logits, labels, valid, cfg);
      activity.push_back(torch::sigmoid(logits).flatten(0, 1).mean(0));  // EXPECT: tensor-graph-kept-across-iterations

      auto scores = logits.detach();
      // FACT: x=torch.randn(2,5,2,requires_grad=True); lg=x*2; l=torch.nn.functional.binary_cross_entropy_with_logits(lg,torch.rand(2,5,2)); d=lg.detach(); d.sigmoid_(); assert backward_fails(lambda: l.backward())
      scores.sigmoid_();  // EXPECT: tensor-inplace-on-detached
      auto perm = order_table.index_select(0, out.best_order);
      auto aligned = labels.gather(2, perm.unsqueeze(1).expand({-1, labels.size(1), -1}));
      der.update(scores > cfg.threshold, aligned, valid);

      opt.zero_grad();
      out.loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 5.0);
      opt.step();

      running += out.loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
      if (++step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step << " pit-bce "
                  << running.item<double>() / cfg.log_every << "\n";  // LOOKALIKE: tensor-sync-in-loop -- one read per logging interval
        running.zero_();
      }
    }
    std::cout << "epoch " << epoch << " DER " << std::fixed << std::setprecision(4) << der.report() << "\n";
  }
  auto mean_activity = torch::stack(activity).mean(0);
  std::cout << "mean speaker activity " << mean_activity << "\n";
}

// Block-wise inference over one long recording.
torch::Tensor diarize(EEND& model, const torch::Tensor& feats, const CMVNStats& cmvn,
                      const Config& cfg, int64_t chunk) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> outs;
  const auto T = feats.size(0);
  for (int64_t s = 0; s < T; s += chunk) {
    auto seg = feats.narrow(0, s, std::min(chunk, T - s)).unsqueeze(0).to(cfg.device);  // LOOKALIKE: tensor-clone-in-loop -- each chunk is different data
    auto norm = torch::stack({cmvn.mean, cmvn.istd}).to(cfg.device);  // EXPECT: tensor-clone-in-loop
    auto x = splice_frames((seg - norm[0]) * norm[1], cfg.context, cfg.subsample);
    auto pad_mask = torch::zeros({1, x.size(1)}, torch::TensorOptions().dtype(torch::kBool).device(cfg.device));
    auto probs = model->forward(x, pad_mask);
    probs.sigmoid_();  // LOOKALIKE: tensor-inplace-on-saved -- NoGradGuard: nothing was saved
    outs.push_back(probs.squeeze(0));
  }
  return torch::cat(outs, 0);
}

std::vector<Batch> make_toy_set(int64_t n_batches, int64_t batch_size, const Config& cfg) {
  std::vector<Batch> set;
  for (int64_t n = 0; n < n_batches; ++n) {
    std::vector<torch::Tensor> feats, labels;
    for (int64_t i = 0; i < batch_size; ++i) {
      const auto T = 500 + 100 * ((n + i) % 5);
      feats.push_back(torch::randn({T, cfg.n_mels}, torch::kDouble));
      labels.push_back((torch::rand({T, cfg.n_speakers}) > 0.6).to(torch::kUInt8));
    }
    set.push_back(collate(feats, labels, cfg.n_mels, cfg.n_speakers));
  }
  return set;
}

}  // namespace eend

int main() {
  torch::manual_seed(0);
  eend::Config cfg;
  cfg.epochs = 2;
  cfg.device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  auto train_set = eend::make_toy_set(8, 4, cfg);
  auto cmvn = eend::compute_cmvn(train_set);
  eend::EEND model(cfg);
  model->to(cfg.device);
  eend::train(model, train_set, cmvn, cfg);
  auto recording = torch::randn({3000, cfg.n_mels});
  auto probs = eend::diarize(model, recording, cmvn, cfg, 1000);
  std::cout << "speech ratio per speaker " << (probs > cfg.threshold).to(torch::kFloat).mean(0) << "\n";
  return 0;
}
