// TS2Vec (Yue et al., 2022): universal time-series representations learned by
// contrasting two overlapping random crops of each series, at every scale of a
// max-pooling hierarchy, both across instances and across timestamps.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <vector>

namespace F = torch::nn::functional;

struct TS2VecConfig {
  int64_t input_dims = 1;
  int64_t hidden_dims = 64;
  int64_t output_dims = 320;
  int64_t depth = 10;
  int64_t kernel_size = 3;
  int64_t temporal_unit = 0;
  int64_t batch_size = 16;
  int64_t epochs = 40;
  double mask_keep_prob = 0.5;
  double alpha = 0.5;
  double lr = 1e-3;
  double jitter_std = 0.0;
  double temperature = 1.0;
  bool use_projection = false;
};

// Per-channel mean and std over every timestamp of a [N, C, T] dataset (UCR layout).
std::pair<torch::Tensor, torch::Tensor> channel_stats(const torch::Tensor& series) {
  // FACT: s = torch.randn(5, 3, 11); assert is_copy_of(s.transpose(1, 2).reshape(-1, 3), s)
  auto flat = series.transpose(1, 2).reshape({-1, series.size(1)});  // EXPECT: tensor-reshape-non-contiguous
  return {flat.mean(0), flat.std(0).clamp_min(1e-8)};
}

torch::Tensor normalize_series(const torch::Tensor& series, double clip) {
  auto stats = channel_stats(series);
  const int64_t c = series.size(1);
  // FACT: m = torch.randn(5, 3, 11).mean((0, 2)); assert is_view_of(m.view(1, 3, 1), m)
  auto mean = stats.first.view({1, c, 1});  // LOOKALIKE: tensor-view-non-contiguous -- a reduction result is contiguous
  auto stdev = stats.second.view({1, c, 1});
  auto normed = (series - mean) / stdev;
  // FACT: s = torch.randn(4, 3, 9); n = (s - s.mean()) / s.std(); assert is_copy_of(n, s)
  normed.clamp_(-clip, clip);  // LOOKALIKE: tensor-alias-then-mutate -- normed is a fresh result, series is untouched
  return normed.transpose(1, 2).contiguous();  // [N, T, C] for the encoder
}

class SamePadConvImpl : public torch::nn::Module {
 public:
  SamePadConvImpl(int64_t in_ch, int64_t out_ch, int64_t kernel, int64_t dilation) {
    const int64_t receptive = (kernel - 1) * dilation + 1;
    remove_ = receptive % 2 == 0 ? 1 : 0;
    conv_ = register_module(
        "conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(in_ch, out_ch, kernel)
                                      .padding(receptive / 2)
                                      .dilation(dilation)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto out = conv_(x);
    if (remove_ > 0) out = out.narrow(2, 0, out.size(2) - remove_);
    return out;
  }

 private:
  int64_t remove_ = 0;
  torch::nn::Conv1d conv_{nullptr};
};
TORCH_MODULE(SamePadConv);

class ConvBlockImpl : public torch::nn::Module {
 public:
  ConvBlockImpl(int64_t in_ch, int64_t out_ch, int64_t kernel, int64_t dilation, bool final) {
    conv1_ = register_module("conv1", SamePadConv(in_ch, out_ch, kernel, dilation));
    conv2_ = register_module("conv2", SamePadConv(out_ch, out_ch, kernel, dilation));
    if (in_ch != out_ch || final)
      projector_ = register_module("projector", torch::nn::Conv1d(in_ch, out_ch, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto residual = projector_ ? projector_(x) : x;
    auto h = conv1_(F::gelu(x));
    h = conv2_(F::gelu(h));
    return h + residual;
  }

 private:
  SamePadConv conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Conv1d projector_{nullptr};
};
TORCH_MODULE(ConvBlock);

class TSEncoderImpl : public torch::nn::Module {
 public:
  explicit TSEncoderImpl(const TS2VecConfig& cfg) : cfg_(cfg) {
    input_fc_ = register_module("input_fc", torch::nn::Linear(cfg.input_dims, cfg.hidden_dims));
    blocks_ = register_module("blocks", torch::nn::Sequential());
    for (int64_t i = 0; i <= cfg.depth; ++i) {
      const bool last = i == cfg.depth;
      blocks_->push_back(ConvBlock(cfg.hidden_dims, last ? cfg.output_dims : cfg.hidden_dims,
                                   cfg.kernel_size, int64_t{1} << i, last));
    }
    repr_dropout_ = register_module("repr_dropout", torch::nn::Dropout(0.1));
    if (cfg.use_projection)
      proj_ = register_module("proj", torch::nn::Linear(cfg.output_dims, cfg.output_dims));
  }

  // x: [B, T, C_in] -> [B, T, C_out]. Timestamp masking only while training.
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1);
    auto nan_mask = ~x.isnan().any(-1);
    auto h = input_fc_(x.nan_to_num());
    auto mask = torch::bernoulli(torch::full({b, t}, is_training() ? cfg_.mask_keep_prob : 1.0,
                                             h.options())).to(torch::kBool);
    mask = mask & nan_mask;
    auto masked = h.clone();  // EXPECT: tensor-unnecessary-clone
    masked.masked_fill_(~mask.unsqueeze(-1), 0.0);
    auto conv_out = blocks_->forward(masked.transpose(1, 2));  // [B, C_out, T]
    auto out = repr_dropout_(conv_out).transpose(1, 2);
    if (proj_) {
      const int64_t co = out.size(2);
      // FACT: h = torch.randn(4, 6, 9); assert raises(lambda: h.transpose(1, 2).view(-1, 6), "view size is not compatible")
      out = proj_(out.view({-1, co})).view({b, t, -1});  // EXPECT: tensor-view-non-contiguous
    }
    return out;
  }

 private:
  TS2VecConfig cfg_;
  torch::nn::Linear input_fc_{nullptr}, proj_{nullptr};
  torch::nn::Sequential blocks_{nullptr};
  torch::nn::Dropout repr_dropout_{nullptr};
};
TORCH_MODULE(TSEncoder);

torch::Tensor instance_contrastive_loss(const torch::Tensor& z1, const torch::Tensor& z2) {
  const int64_t b = z1.size(0);
  if (b == 1) return torch::zeros({}, z1.options());
  auto z = torch::cat({z1, z2}, 0).transpose(0, 1);  // [T, 2B, C]
  auto sim = torch::matmul(z, z.transpose(1, 2));     // [T, 2B, 2B]
  auto logits = torch::cat({torch::tril(sim, -1).narrow(2, 0, 2 * b - 1),
                            torch::triu(sim, 1).narrow(2, 1, 2 * b - 1)}, 2);
  logits = torch::log_softmax(logits, -1);
  logits.neg_();  // EXPECT: tensor-inplace-on-saved
  auto i = torch::arange(b, z1.options().dtype(torch::kLong));
  auto pos_a = logits.index({torch::indexing::Slice(), i, b + i - 1});
  auto pos_b = logits.index({torch::indexing::Slice(), b + i, i});
  return (pos_a.mean() + pos_b.mean()) / 2;
}

torch::Tensor temporal_contrastive_loss(const torch::Tensor& z1, const torch::Tensor& z2,
                                        double temperature) {
  const int64_t t = z1.size(1);
  if (t == 1) return torch::zeros({}, z1.options());
  auto z = torch::cat({z1, z2}, 1);                   // [B, 2T, C]
  auto sim = torch::matmul(z, z.transpose(1, 2));     // [B, 2T, 2T]
  sim.div_(temperature);  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
  auto logits = torch::cat({torch::tril(sim, -1).narrow(2, 0, 2 * t - 1),
                            torch::triu(sim, 1).narrow(2, 1, 2 * t - 1)}, 2);
  logits = -torch::log_softmax(logits, -1);
  auto i = torch::arange(t, z1.options().dtype(torch::kLong));
  auto pos_a = logits.index({torch::indexing::Slice(), i, t + i - 1});
  auto pos_b = logits.index({torch::indexing::Slice(), t + i, i});
  return (pos_a.mean() + pos_b.mean()) / 2;
}

torch::Tensor hierarchical_contrastive_loss(torch::Tensor z1, torch::Tensor z2, double alpha,
                                            int64_t temporal_unit, double temperature) {
  auto loss = torch::zeros({}, z1.options());
  int64_t depth = 0;
  while (z1.size(1) > 1) {
    if (alpha != 0) loss = loss + alpha * instance_contrastive_loss(z1, z2);
    if (depth >= temporal_unit && 1 - alpha != 0)
      loss = loss + (1 - alpha) * temporal_contrastive_loss(z1, z2, temperature);
    ++depth;
    z1 = F::max_pool1d(z1.transpose(1, 2), F::MaxPool1dFuncOptions(2)).transpose(1, 2);
    z2 = F::max_pool1d(z2.transpose(1, 2), F::MaxPool1dFuncOptions(2)).transpose(1, 2);
  }
  if (z1.size(1) == 1 && alpha != 0) {
    loss = loss + alpha * instance_contrastive_loss(z1, z2);
    ++depth;
  }
  return loss / depth;
}

// A[i, offsets[i] : offsets[i] + len] for every row i.
torch::Tensor take_per_row(const torch::Tensor& a, const torch::Tensor& offsets, int64_t len) {
  auto cols = offsets.unsqueeze(1) + torch::arange(len, offsets.options());
  auto rows = torch::arange(a.size(0), offsets.options()).unsqueeze(1);
  return a.index({rows, cols});  // LOOKALIKE: tensor-device-mismatch -- CPU index tensors may index a CUDA tensor
}

// Whole-series representation: max over all timestamps.
torch::Tensor encode_instances(TSEncoder& model, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto out = model->forward(x);  // [B, T, C]
  auto pooled = F::max_pool1d(out.transpose(1, 2), F::MaxPool1dFuncOptions(out.size(1)));
  // FACT: o = torch.nn.functional.max_pool1d(torch.randn(3, 8, 10), kernel_size=10); assert is_view_of(o.transpose(1, 2).view(3, -1), o)
  return pooled.transpose(1, 2).view({x.size(0), -1});  // LOOKALIKE: tensor-view-non-contiguous -- the pooled time axis has size 1, so the transpose merges nothing
}

void train_ts2vec(TSEncoder& model, const torch::Tensor& train_data, const TS2VecConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr));
  std::mt19937 rng(1234);
  const int64_t n = train_data.size(0), ts_l = train_data.size(1);

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(n);
    std::vector<torch::Tensor> step_losses;
    for (int64_t start = 0; start < n; start += cfg.batch_size) {
      auto idx = perm.narrow(0, start, std::min(cfg.batch_size, n - start));
      auto x = train_data.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      const int64_t b = x.size(0);
      if (cfg.jitter_std > 0)
        x = x + cfg.jitter_std * torch::randn({b, ts_l, x.size(2)});  // EXPECT: tensor-device-mismatch

      const int64_t min_crop = int64_t{1} << (cfg.temporal_unit + 1);
      const int64_t crop_l = std::uniform_int_distribution<int64_t>(min_crop, ts_l)(rng);
      const int64_t crop_left = std::uniform_int_distribution<int64_t>(0, ts_l - crop_l)(rng);
      const int64_t crop_right = crop_left + crop_l;
      const int64_t crop_eleft = std::uniform_int_distribution<int64_t>(0, crop_left)(rng);
      const int64_t crop_eright = std::uniform_int_distribution<int64_t>(crop_right, ts_l)(rng);
      auto crop_offset = torch::randint(-crop_eleft, ts_l - crop_eright + 1, {b});

      opt.zero_grad();
      auto out1 = model->forward(take_per_row(x, crop_offset + crop_eleft, crop_right - crop_eleft));
      out1 = out1.narrow(1, crop_left - crop_eleft, crop_l);
      auto out2 = model->forward(take_per_row(x, crop_offset + crop_left, crop_eright - crop_left));
      out2 = out2.narrow(1, 0, crop_l);
      auto loss = hierarchical_contrastive_loss(out1, out2, cfg.alpha, cfg.temporal_unit,
                                                cfg.temperature);
      loss.backward();
      opt.step();
      step_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    }
    const double epoch_loss = torch::stack(step_losses).mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- read once per epoch, after the batch loop
    std::cout << "epoch #" << epoch << ": loss=" << epoch_loss << '\n';
  }
}

// Online encoder over a sliding window of the most recent observations.
class StreamingEncoder {
 public:
  StreamingEncoder(TSEncoder model, int64_t window, int64_t channels)
      : model_(std::move(model)),
        window_(torch::zeros({window, channels},
                             torch::TensorOptions().device(model_->parameters().front().device()))) {}

  torch::Tensor push(const torch::Tensor& obs) {  // obs: [C]
    const int64_t len = window_.size(0);
    // FACT: w = torch.randn(6, 3); assert raises(lambda: w.narrow(0, 0, 5).copy_(w.narrow(0, 1, 5)), "refer to a single memory location")
    window_.narrow(0, 0, len - 1).copy_(window_.narrow(0, 1, len - 1));  // EXPECT: tensor-inplace-overlap
    // FACT: w = torch.randn(6, 3); o = torch.randn(3); w.narrow(0, 5, 1).copy_(o.unsqueeze(0)); assert torch.equal(w[5], o)
    window_.narrow(0, len - 1, 1).copy_(obs.unsqueeze(0));  // LOOKALIKE: tensor-inplace-overlap -- the source is the new observation, another tensor
    return encode_instances(model_, window_.unsqueeze(0)).squeeze(0);
  }

 private:
  TSEncoder model_;
  torch::Tensor window_;
};
